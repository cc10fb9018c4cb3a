//! What the release commands share (`dist`, `image`, `release`): the binary's name, cargo,
//! the workspace's version, the host's target, SHA-256 in hex, and the CycloneDX SBOM of
//! what the binary is built from. A leaf: they import it, it imports none of them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// The provider binary's name.
pub(crate) const BINARY: &str = "oci-secrets-store-csi-driver-provider";

/// The host's target triple (`rustc -vV`).
pub(crate) fn host_target() -> anyhow::Result<String> {
    let output = Command::new("rustc").arg("-vV").output()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV names no host")
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

/// The cargo running this (`CARGO`), else `cargo`.
pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
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
pub(crate) fn lock_checksums(lock: &str) -> BTreeMap<(String, String), String> {
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
