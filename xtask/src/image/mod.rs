//! `cargo xtask image`: the provider's OCI image, written here without a container engine:
//! a base layer from Debian packages (checked against `xtask/image/debian-<arch>.lock`) and
//! an app layer with the release binary and LICENSE, as an OCI image layout and an
//! oci-archive.
//! Reproducible: the same commit, binary and lock give the same digest.
//!
//! `--run-test` then checks it as a runtime would use it (`runtime.rs`).

mod debian;
mod layout;
mod runtime;
mod tar;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::{Value, json};

pub(crate) use debian::{LockMode, Package};

use crate::artefacts::{self, BINARY};
use crate::procs::root;

/// Where the chart and the sync-controller block pull the image from.
pub(crate) const REPOSITORY: &str = "ghcr.io/oci-vault-csi/oci-secrets-store-csi-driver-provider";
/// The lock of the base layer's Debian packages for an architecture (`amd64`, `arm64`).
pub(crate) fn lock_path(root: &Path, arch: &str) -> PathBuf {
    root.join(format!("xtask/image/debian-{arch}.lock"))
}
/// Root, for the socket in the hostPath directory (the chart drops every capability and
/// makes the root filesystem read-only).
const USER: &str = "0:0";

const USAGE: &str =
    "usage: cargo xtask image [--binary PATH] [--out DIR] [--update-lock] [--reproduce] [--run-test]

Writes the provider's OCI image for this machine's architecture into DIR (default
target/image): layout/ (an OCI image layout, tagged with the workspace version) and
oci-secrets-store-csi-driver-provider-<version>.oci.tar (the same as an oci-archive).
  --binary PATH   the release binary to package (default: `cargo build --release --locked`)
  --update-lock   take the archive's current Debian packages and rewrite
                  xtask/image/debian-<arch>.lock
  --reproduce     build the commit again in a fresh `git worktree` elsewhere, with a target
                  directory of its own, and check that the image has the same digest (the
                  build paths are remapped: nothing of where it was built is in the binary)
  --run-test      build twice (one digest), check with skopeo, umoci and the image-spec
                  schemas, then run it under runc (as root): --version, /healthz, /readyz, a
                  Mount through the socket against the emulator, SIGTERM

Every mtime is SOURCE_DATE_EPOCH, or the commit time of HEAD. Push with
  skopeo copy oci-archive:target/image/<archive> docker://<registry>/<name>:<tag>";

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let root = root();
    let mut binary = None;
    let mut out = None;
    let mut mode = LockMode::Warn;
    let mut run_test = false;
    let mut reproduce = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--binary" => {
                binary = Some(PathBuf::from(args.next().context("--binary needs a path")?))
            }
            "--out" => {
                out = Some(PathBuf::from(
                    args.next().context("--out needs a directory")?,
                ))
            }
            "--update-lock" => mode = LockMode::Update,
            "--run-test" => run_test = true,
            "--reproduce" => reproduce = true,
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let binary = match binary {
        Some(binary) => binary,
        None => build_release(&root, &target_dir)?,
    };
    let out = out.unwrap_or_else(|| target_dir.join("image"));
    let options = Options {
        root: root.clone(),
        binary,
        out,
        cache: target_dir.join("image-debs"),
        version: artefacts::workspace_version(&root)?,
        mode,
    };
    let built = build(&options)?;
    built.print();
    if reproduce {
        reproduce_elsewhere(&options, &built.digest)?;
    }
    if run_test {
        let again = build(&Options {
            mode: if mode == LockMode::Update {
                LockMode::Warn
            } else {
                mode
            },
            out: options.out.join("again"),
            ..options.clone()
        })?;
        println!("image: built again: {}", again.digest);
        if again.digest != built.digest {
            bail!(
                "two builds gave two digests: {} and {}",
                built.digest,
                again.digest
            );
        }
        runtime::test(&root, &built)?;
    }
    Ok(())
}

/// The image of this commit built again from a fresh `git worktree` in another directory
/// with a target directory of its own: an independent rebuild must give `digest`.
fn reproduce_elsewhere(options: &Options, digest: &str) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("oci-provider-rebuild-{}", std::process::id()));
    let git = |args: &[&str]| -> anyhow::Result<()> {
        let status = Command::new("git")
            .current_dir(&options.root)
            .args(args)
            .status()
            .context("cannot run git")?;
        if !status.success() {
            bail!("git {} failed", args.join(" "));
        }
        Ok(())
    };
    let path = dir.to_string_lossy().into_owned();
    git(&["worktree", "add", "--detach", &path, "HEAD"])?;
    let rebuilt = (|| {
        let target_dir = dir.join("target");
        let binary = build_release(&dir, &target_dir)?;
        build(&Options {
            root: dir.clone(),
            binary,
            out: target_dir.join("image"),
            // The Debian packages are the lock's, checked by hash: the cache is shared.
            ..options.clone()
        })
    })();
    git(&["worktree", "remove", "--force", &path])?;
    let rebuilt = rebuilt?;
    println!("image: rebuilt in {}: {}", dir.display(), rebuilt.digest);
    if rebuilt.digest != digest {
        bail!(
            "the same commit built in two directories gave two digests: {digest} here, {} in \
             {}: compare the binaries (strings | grep the build paths)",
            rebuilt.digest,
            dir.display()
        );
    }
    Ok(())
}

/// `cargo build --release --locked` of the provider, its build paths remapped; its path.
fn build_release(root: &Path, target_dir: &Path) -> anyhow::Result<PathBuf> {
    let mut command = Command::new(artefacts::cargo());
    command
        .current_dir(root)
        .args(["build", "--release", "--locked", "-p", BINARY]);
    crate::reproducible::remap(&mut command, root, target_dir);
    let status = command.status()?;
    if !status.success() {
        bail!("cargo build --release failed");
    }
    Ok(target_dir.join("release").join(BINARY))
}

/// What an image build needs.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// The repository: LICENSE, the lock, the commit.
    pub(crate) root: PathBuf,
    pub(crate) binary: PathBuf,
    pub(crate) out: PathBuf,
    /// Where downloaded and unpacked `.deb`s are kept between builds.
    pub(crate) cache: PathBuf,
    pub(crate) version: String,
    pub(crate) mode: LockMode,
}

/// A built image.
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) digest: String,
    pub(crate) tag: String,
    pub(crate) layout: PathBuf,
    pub(crate) archive: PathBuf,
    pub(crate) packages: Vec<Package>,
    pub(crate) compressed_bytes: u64,
    pub(crate) unpacked_bytes: u64,
    pub(crate) revision: String,
}

impl Built {
    /// `repository:tag@digest`, what the chart pins.
    pub(crate) fn reference(&self) -> String {
        format!("{REPOSITORY}:{}@{}", self.tag, self.digest)
    }

    fn print(&self) {
        println!(
            "image: {}\n  layout   {}\n  archive  {}\n  {:.1} MB compressed, {:.1} MB unpacked; base: {}\n  push: skopeo copy oci-archive:{} docker://{REPOSITORY}:{}",
            self.reference(),
            self.layout.display(),
            self.archive.display(),
            self.compressed_bytes as f64 / 1e6,
            self.unpacked_bytes as f64 / 1e6,
            self.packages
                .iter()
                .map(|p| format!("{} {}", p.locked.name, p.locked.version))
                .collect::<Vec<_>>()
                .join(", "),
            self.archive.display(),
            self.tag,
        );
    }
}

/// Builds the image of `options.binary` into `options.out`.
pub(crate) fn build(options: &Options) -> anyhow::Result<Built> {
    let root = &options.root;
    let (revision, epoch) = commit(root)?;
    let created = rfc3339(epoch);
    let arch = architecture()?;
    let base = debian::base(
        &options.binary,
        &options.cache,
        &lock_path(root, arch),
        options.mode,
    )?;
    for warning in &base.warnings {
        eprintln!("image: warning: stale lock: {warning}");
    }
    let mut app = tar::Tree::default();
    app.add(tar::Entry::file(
        BINARY,
        0o755,
        std::fs::read(&options.binary)
            .with_context(|| format!("cannot read {}", options.binary.display()))?,
    ))?;
    app.add(tar::Entry::file(
        "LICENSE",
        0o644,
        std::fs::read(root.join("LICENSE"))?,
    ))?;
    let layers = vec![
        layout::Layer::new(base.tree, epoch)?,
        layout::Layer::new(app, epoch)?,
    ];
    let labels = json!({
        "org.opencontainers.image.title": BINARY,
        "org.opencontainers.image.description": "OCI Vault provider for the Kubernetes Secrets Store CSI driver",
        "org.opencontainers.image.source": repository_url(root)?,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.version": options.version,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.created": created,
    });
    let history = |what: &str| json!({ "created": created, "created_by": format!("cargo xtask image: {what}") });
    let packages: Vec<String> = base
        .packages
        .iter()
        .map(|p| format!("{} {}", p.locked.name, p.locked.version))
        .collect();
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "created": created,
        "config": {
            "Entrypoint": [format!("/{BINARY}")],
            "User": USER,
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
            ],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "history": [
            history(&format!("base layer from Debian packages ({})", packages.join(", "))),
            history(&format!("/{BINARY} and /LICENSE")),
        ],
    });
    let image = layout::Image::new(
        layers,
        config,
        &labels,
        &options.version,
        &json!({ "architecture": arch, "os": "linux" }),
    )?;
    std::fs::create_dir_all(&options.out)?;
    let layout_dir = options.out.join("layout");
    image.write_layout(&layout_dir)?;
    let archive = options
        .out
        .join(format!("{BINARY}-{}.oci.tar", options.version));
    std::fs::write(&archive, image.archive(epoch)?)?;
    Ok(Built {
        digest: image.digest(),
        tag: options.version.clone(),
        layout: layout_dir,
        archive,
        packages: base.packages,
        compressed_bytes: image.compressed_bytes(),
        unpacked_bytes: image.unpacked_bytes(),
        revision,
    })
}

/// HEAD's hash (with `-dirty` when tracked files differ from it) and the build time:
/// `SOURCE_DATE_EPOCH` when set, else HEAD's commit time.
fn commit(root: &Path) -> anyhow::Result<(String, u64)> {
    let git = |args: &[&str]| -> anyhow::Result<String> {
        let output = Command::new("git").current_dir(root).args(args).output()?;
        if !output.status.success() {
            bail!("git {} failed", args.join(" "));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let mut revision = git(&["rev-parse", "HEAD"])?;
    if !git(&[
        "--no-optional-locks",
        "status",
        "--porcelain",
        "--untracked-files=no",
    ])?
    .is_empty()
    {
        eprintln!(
            "image: warning: the tree has uncommitted changes; the revision label says -dirty"
        );
        revision.push_str("-dirty");
    }
    let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(value) => value
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH {value:?} is not a number"))?,
        Err(_) => git(&["log", "-1", "--format=%ct"])?.parse()?,
    };
    Ok((revision, epoch))
}

/// `[workspace.package] repository` of the workspace.
fn repository_url(root: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml"))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("repository = "))
        .map(|v| v.trim_matches('"').to_owned())
        .context("Cargo.toml names no repository")
}

/// The OCI architecture of this machine's binaries.
fn architecture() -> anyhow::Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => bail!("no OCI architecture known for {other}"),
    }
}

/// `2024-05-01T12:00:00Z` for seconds since the epoch (UTC; days to civil dates after
/// Howard Hinnant's `civil_from_days`).
fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let seconds = epoch % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// The Debian packages as CycloneDX components (for the release's SBOM), with package
/// URLs as scanners match them: `pkg:deb/debian/<name>@<version>?arch=..&distro=debian-12`.
pub(crate) fn sbom_components(packages: &[Package]) -> Vec<Value> {
    let distro = packages
        .iter()
        .find_map(Package::os_version_id)
        .map(|v| format!("&distro=debian-{v}"))
        .unwrap_or_default();
    packages
        .iter()
        .map(|p| {
            let l = &p.locked;
            let purl = format!(
                "pkg:deb/debian/{}@{}?arch={}{distro}",
                l.name,
                purl_escape(&l.version),
                l.arch
            );
            let mut properties = vec![json!({ "name": "oci:image:layer", "value": "base" })];
            if let Some(source) = &p.source {
                properties.push(json!({ "name": "deb:source", "value": source }));
            }
            json!({
                "type": "library",
                "bom-ref": purl,
                "name": l.name,
                "version": l.version,
                "purl": purl,
                "hashes": [{ "alg": "SHA-256", "content": l.sha256 }],
                "properties": properties,
            })
        })
        .collect()
}

/// A purl component percent-encoded (`+` and `:` of Debian versions).
fn purl_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sbom_lists_the_base_layers_debian_packages() {
        let packages = [
            Package::for_tests("libc6", "2.36-9+deb12u14", Some("glibc")),
            Package::for_tests("libgcc-s1", "1:12.2.0-14", None),
        ];
        let host = artefacts::host_target().unwrap();
        let bom =
            artefacts::sbom_json(&root(), &host, "9.9.9", sbom_components(&packages)).unwrap();
        let bom: Value = serde_json::from_str(&bom).unwrap();
        let find = |name: &str| {
            bom["components"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
                .unwrap_or_else(|| panic!("{name} missing"))
                .clone()
        };
        let libc = find("libc6");
        assert_eq!(
            libc["purl"],
            "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64"
        );
        assert_eq!(libc["version"], "2.36-9+deb12u14");
        assert_eq!(libc["hashes"][0]["content"], "ab".repeat(32));
        assert_eq!(libc["properties"][1]["value"], "glibc");
        assert_eq!(
            find("libgcc-s1")["purl"],
            "pkg:deb/debian/libgcc-s1@1%3A12.2.0-14?arch=amd64"
        );
        // The crates stay listed beside them.
        find("tonic");
    }

    #[test]
    fn times_are_written_as_rfc3339_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn the_chart_and_the_sync_controller_block_pull_from_our_repository() {
        let root = root();
        let values = std::fs::read_to_string(
            root.join("deploy/helm/oci-secrets-store-csi-driver-provider/values.yaml"),
        )
        .unwrap();
        assert!(
            values.contains(&format!("repository: {REPOSITORY}\n")),
            "{values}"
        );
        let sidecar =
            std::fs::read_to_string(root.join("deploy/sync-controller/values.yaml")).unwrap();
        assert!(
            sidecar.contains(&format!("image: {REPOSITORY}:")),
            "{sidecar}"
        );
    }

    #[test]
    fn the_lock_names_the_packages_of_the_base_layer() {
        let path = lock_path(&root(), "amd64");
        let lock = debian::read_lock(&path).unwrap();
        for name in [
            "base-files",
            "ca-certificates",
            "libc6",
            "libgcc-s1",
            "gcc-12-base",
        ] {
            assert!(
                lock.contains_key(name),
                "{name} missing from {}",
                path.display()
            );
        }
    }
}
