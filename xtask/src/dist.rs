//! `cargo xtask dist`: release tarballs of the provider binary for the Rust targets installed
//! here, the OCI image of this machine's target (`cargo xtask image`, from the same build), a
//! CycloneDX software bill of materials, and `SHA256SUMS` over all of them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::artefacts::{BINARY, cargo, host_target, sbom_json, sha256_hex, workspace_version};
use crate::image::{self, LockMode};
use crate::procs::root;

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

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::BTreeSet;

    use crate::artefacts::{lock_checksums, sbom_json};

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
