//! `cargo xtask dist`: release tarballs of the provider binary for the Rust targets installed
//! here, the OCI image of this machine's target (`cargo xtask image`, from the same build), a
//! CycloneDX software bill of materials, and `SHA256SUMS` over all of them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::image::{self, LockMode};
use crate::procs::root;

pub(crate) const BINARY: &str = "oci-secrets-store-csi-driver-provider";

const USAGE: &str = "usage: cargo xtask dist [--target TRIPLE]... [--out DIR] [--no-image]

Builds the provider (release, --locked) for each target (default: every target `rustup
target list --installed` shows) and writes to DIR (default target/dist/v<version>/):
  oci-secrets-store-csi-driver-provider-<version>-<target>.tar.gz  (binary, LICENSE, README.md)
  oci-secrets-store-csi-driver-provider-<version>.oci.tar          (the OCI image of this
                                                                    machine's target, an
                                                                    oci-archive; not with
                                                                    --no-image)
  IMAGE                                                             (repository:tag@digest)
  oci-secrets-store-csi-driver-provider-<version>.cdx.json          (CycloneDX 1.5 SBOM: the
                                                                    crates and the image's
                                                                    Debian packages)
  SHA256SUMS                                                        (sha256sum -c reads it)";

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let mut targets = Vec::new();
    let mut out = None;
    let mut image = Some(LockMode::Warn);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--target" => targets.push(args.next().context("--target needs a triple")?.clone()),
            "--no-image" => image = None,
            "--out" => {
                out = Some(PathBuf::from(
                    args.next().context("--out needs a directory")?,
                ))
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    let root = root();
    let version = workspace_version(&root)?;
    let out = out.unwrap_or_else(|| root.join("target").join("dist").join(format!("v{version}")));
    if targets.is_empty() {
        targets = installed_targets()?;
    }
    let dist = build(&root, &version, &targets, &out, None, image)?;
    print_artefacts(&dist.artefacts)
}

/// What `build` made: the files, and the image when one was built.
#[derive(Debug)]
pub(crate) struct Dist {
    pub(crate) artefacts: Vec<PathBuf>,
    pub(crate) image: Option<image::Built>,
}

/// The host's target triple (`rustc -vV`).
pub(crate) fn host_target() -> anyhow::Result<String> {
    let output = Command::new("rustc").arg("-vV").output()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV names no host")
}

/// The targets rustup has installed (the host's alone without rustup).
pub(crate) fn installed_targets() -> anyhow::Result<Vec<String>> {
    if let Ok(output) = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        && output.status.success()
    {
        let list: Vec<String> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        if !list.is_empty() {
            return Ok(list);
        }
    }
    Ok(vec![host_target()?])
}

/// `[workspace.package] version` of the workspace at `root`.
pub(crate) fn workspace_version(root: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if in_package && let Some(value) = line.strip_prefix("version = ") {
            return Ok(value.trim_matches('"').to_owned());
        }
    }
    bail!(
        "no [workspace.package] version in {}",
        root.join("Cargo.toml").display()
    )
}

/// Builds every target's tarball, the image of the host's target (with `image`, the lock's
/// mode), the SBOM and the checksums into `out`; returns them.
pub(crate) fn build(
    root: &Path,
    version: &str,
    targets: &[String],
    out: &Path,
    target_dir: Option<&Path>,
    image: Option<LockMode>,
) -> anyhow::Result<Dist> {
    std::fs::create_dir_all(out)?;
    let target_dir = target_dir.map_or_else(|| root.join("target"), Path::to_path_buf);
    let mtime = commit_time(root)?;
    let mut artefacts = Vec::new();
    for target in targets {
        let mut command = Command::new(cargo());
        command
            .current_dir(root)
            .env("CARGO_TARGET_DIR", &target_dir)
            .args([
                "build",
                "--release",
                "--locked",
                "-p",
                BINARY,
                "--target",
                target,
            ]);
        crate::reproducible::remap(&mut command, root, &target_dir);
        let status = command.status()?;
        if !status.success() {
            bail!("cargo build --release --target {target} failed");
        }
        let name = format!("{BINARY}-{version}-{target}");
        let staging = out.join(".staging").join(&name);
        std::fs::create_dir_all(&staging)?;
        std::fs::copy(
            target_dir.join(target).join("release").join(BINARY),
            staging.join(BINARY),
        )?;
        for file in ["LICENSE", "README.md"] {
            std::fs::copy(root.join(file), staging.join(file))?;
        }
        let tarball = out.join(format!("{name}.tar.gz"));
        // Reproducible: sorted names, no owners, the commit's time, gzip without a name.
        let status = Command::new("sh")
            .arg("-c")
            .arg(
                "tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=\"@$1\" \
                 -C \"$2\" -cf - \"$3\" | gzip -n -9 > \"$4\"",
            )
            .args([
                "tar",
                &mtime,
                &path_str(&out.join(".staging"))?,
                &name,
                &path_str(&tarball)?,
            ])
            .status()?;
        if !status.success() {
            bail!("tar of {name} failed");
        }
        artefacts.push(tarball);
    }
    std::fs::remove_dir_all(out.join(".staging"))?;
    let host = host_target()?;
    let image = match image {
        Some(mode) if targets.contains(&host) => {
            let built = image::build(&image::Options {
                root: root.to_path_buf(),
                binary: target_dir.join(&host).join("release").join(BINARY),
                out: out.join(".image"),
                cache: target_dir.join("image-debs"),
                version: version.to_owned(),
                mode,
            })?;
            let archive = out.join(
                built
                    .archive
                    .file_name()
                    .context("the image archive has no name")?,
            );
            std::fs::rename(&built.archive, &archive)?;
            std::fs::remove_dir_all(out.join(".image"))?;
            let reference = out.join("IMAGE");
            std::fs::write(&reference, format!("{}\n", built.reference()))?;
            artefacts.extend([archive.clone(), reference]);
            Some(image::Built { archive, ..built })
        }
        Some(_) => {
            eprintln!("dist: no image: the host's target {host} is not among {targets:?}");
            None
        }
        None => None,
    };
    let sbom = out.join(format!("{BINARY}-{version}.cdx.json"));
    let sbom_target = if targets.contains(&host) {
        &host
    } else {
        targets.first().context("no target to build")?
    };
    let debian = image
        .as_ref()
        .map(|i| image::sbom_components(&i.packages))
        .unwrap_or_default();
    std::fs::write(&sbom, sbom_json(root, sbom_target, version, debian)?)?;
    artefacts.push(sbom);
    let sums = out.join("SHA256SUMS");
    let mut text = String::new();
    for file in &artefacts {
        let bytes = std::fs::read(file)?;
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        writeln!(text, "{}  {name}", sha256_hex(&bytes))?;
    }
    std::fs::write(&sums, text)?;
    artefacts.push(sums);
    Ok(Dist { artefacts, image })
}

pub(crate) fn print_artefacts(artefacts: &[PathBuf]) -> anyhow::Result<()> {
    for file in artefacts {
        let bytes = std::fs::read(file)?;
        println!(
            "  {:>10} bytes  sha256 {}  {}",
            bytes.len(),
            sha256_hex(&bytes),
            file.display()
        );
    }
    Ok(())
}

pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn path_str(path: &Path) -> anyhow::Result<String> {
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

fn commit_time(root: &Path) -> anyhow::Result<String> {
    let output = Command::new("git")
        .current_dir(root)
        .args(["log", "-1", "--format=%ct"])
        .output()?;
    if !output.status.success() {
        bail!("git log failed in {}", root.display());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    digest.as_ref().iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// A CycloneDX 1.5 JSON SBOM of what the provider binary is built from for `target`: the
/// packages reachable from it over normal dependencies in `cargo metadata`'s resolve graph
/// for that platform, with their licences, crates.io checksums (from Cargo.lock) and
/// package URLs; then `extra` components (the image's Debian packages). Deterministic: the
/// serial number is derived from the content.
pub(crate) fn sbom_json(
    root: &Path,
    target: &str,
    version: &str,
    extra: Vec<serde_json::Value>,
) -> anyhow::Result<String> {
    let output = Command::new(cargo())
        .current_dir(root)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--offline",
            "--filter-platform",
            target,
        ])
        .output()?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let meta: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let checksums = lock_checksums(&std::fs::read_to_string(root.join("Cargo.lock"))?);
    let packages: BTreeMap<&str, &serde_json::Value> = meta["packages"]
        .as_array()
        .context("cargo metadata: no packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &serde_json::Value> = meta["resolve"]["nodes"]
        .as_array()
        .context("cargo metadata: no resolve graph")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let top = packages
        .values()
        .find(|p| p["name"] == BINARY)
        .and_then(|p| p["id"].as_str())
        .context("the provider package is not in the workspace")?;
    // Normal (not dev, not build) dependencies only: what is linked into the binary.
    let normal = |dep: &serde_json::Value| {
        dep["dep_kinds"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()))
    };
    let mut seen = BTreeSet::new();
    let mut stack = vec![top];
    let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let deps: Vec<&str> = nodes
            .get(id)
            .and_then(|n| n["deps"].as_array())
            .map(|deps| {
                deps.iter()
                    .filter(|d| normal(d))
                    .filter_map(|d| d["pkg"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        stack.extend(deps.iter().copied());
        edges.insert(id, deps);
    }
    let purl = |p: &serde_json::Value| {
        format!(
            "pkg:cargo/{}@{}",
            p["name"].as_str().unwrap_or_default(),
            p["version"].as_str().unwrap_or_default()
        )
    };
    let component = |p: &serde_json::Value, kind: &str| {
        let name = p["name"].as_str().unwrap_or_default();
        let version = p["version"].as_str().unwrap_or_default();
        let mut c = serde_json::json!({
            "type": kind,
            "bom-ref": purl(p),
            "name": name,
            "version": version,
            "purl": purl(p),
        });
        if let Some(license) = p["license"].as_str() {
            c["licenses"] = serde_json::json!([{ "expression": license }]);
        }
        if let Some(sum) = checksums.get(&(name.to_owned(), version.to_owned())) {
            c["hashes"] = serde_json::json!([{ "alg": "SHA-256", "content": sum }]);
        }
        if let Some(repo) = p["repository"].as_str() {
            c["externalReferences"] = serde_json::json!([{ "type": "vcs", "url": repo }]);
        }
        c
    };
    let mut components: Vec<serde_json::Value> = seen
        .iter()
        .filter(|id| **id != top)
        .filter_map(|id| packages.get(id))
        .map(|p| component(p, "library"))
        .collect();
    components.extend(extra);
    let dependencies: Vec<serde_json::Value> = edges
        .iter()
        .filter_map(|(id, deps)| {
            let p = packages.get(id)?;
            let mut on: Vec<String> = deps
                .iter()
                .filter_map(|d| packages.get(d).map(|p| purl(p)))
                .collect();
            on.sort();
            Some(serde_json::json!({ "ref": purl(p), "dependsOn": on }))
        })
        .collect();
    let mut bom = serde_json::json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "component": component(packages[top], "application"),
            "tools": { "components": [{ "type": "application", "name": "cargo xtask dist" }] },
            "properties": [{ "name": "cargo:target", "value": target }],
        },
        "components": components,
        "dependencies": dependencies,
    });
    bom["metadata"]["component"]["version"] = serde_json::Value::from(version);
    let body = serde_json::to_string(&bom)?;
    let hash = sha256_hex(body.as_bytes());
    // A name-based (version 5 layout) UUID from the content.
    bom["serialNumber"] = serde_json::Value::from(format!(
        "urn:uuid:{}-{}-5{}-a{}-{}",
        &hash[0..8],
        &hash[8..12],
        &hash[13..16],
        &hash[17..20],
        &hash[20..32]
    ));
    Ok(serde_json::to_string_pretty(&bom)? + "\n")
}

/// (name, version) → checksum of every registry package in Cargo.lock.
fn lock_checksums(lock: &str) -> BTreeMap<(String, String), String> {
    let mut sums = BTreeMap::new();
    for block in lock.split("[[package]]") {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                l.strip_prefix(key)
                    .and_then(|v| v.strip_prefix(" = "))
                    .map(|v| v.trim_matches('"').to_owned())
            })
        };
        if let (Some(name), Some(version), Some(sum)) =
            (field("name"), field("version"), field("checksum"))
        {
            sums.insert((name, version), sum);
        }
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_checksums_are_read_per_package() {
        let lock = "version = 4\n\n[[package]]\nname = \"a\"\nversion = \"1.0.0\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\nchecksum = \"abc\"\n\n[[package]]\nname = \"local\"\nversion = \"0.1.0\"\n";
        let sums = lock_checksums(lock);
        assert_eq!(sums.len(), 1);
        assert_eq!(sums[&("a".to_owned(), "1.0.0".to_owned())], "abc");
    }

    #[test]
    fn the_sbom_lists_the_binarys_runtime_dependencies_only() {
        let root = root();
        let host = installed_targets().unwrap().remove(0);
        let bom: serde_json::Value =
            serde_json::from_str(&sbom_json(&root, &host, "9.9.9", Vec::new()).unwrap()).unwrap();
        assert_eq!(bom["bomFormat"], "CycloneDX");
        assert_eq!(bom["metadata"]["component"]["name"], BINARY);
        assert_eq!(bom["metadata"]["component"]["version"], "9.9.9");
        let names: BTreeSet<&str> = bom["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        for linked in [
            "tonic",
            "rustls",
            "aws-lc-rs",
            "oci-csi-auth",
            "h2-authority",
        ] {
            assert!(names.contains(linked), "{linked} missing");
        }
        // Dev-only and tool crates are not in the binary.
        for absent in ["oci-csi-testkit", "xtask", "proptest", "tonic-prost-build"] {
            assert!(!names.contains(absent), "{absent} is not linked");
        }
        let tonic = bom["components"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "tonic")
            .unwrap();
        assert_eq!(tonic["hashes"][0]["alg"], "SHA-256");
        assert_eq!(tonic["hashes"][0]["content"].as_str().unwrap().len(), 64);
        assert!(
            tonic["purl"]
                .as_str()
                .unwrap()
                .starts_with("pkg:cargo/tonic@")
        );
    }

    #[test]
    fn sha256_matches_the_known_vector() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
