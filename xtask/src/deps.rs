//! `cargo xtask check-deps`: one crypto backend and one TLS stack (DESIGN.md).

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, bail};

/// Crates that would bring a second crypto backend, TLS stack or HTTP client.
const FORBIDDEN: &[&str] = &[
    "ring",
    "openssl",
    "openssl-sys",
    "native-tls",
    "reqwest",
    "rsa",
];
/// Crates of which exactly one major version may be in the graph.
const SINGLE_VERSION: &[&str] = &[
    "tonic",
    "hyper",
    "rustls",
    "tower",
    "tower-http",
    "prost",
    "aws-lc-rs",
];

pub(crate) fn check() -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "tree",
            "--workspace",
            "--edges",
            "normal,build,dev",
            "--target",
            "all",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .context("cannot run cargo tree")?;
    if !output.status.success() {
        bail!(
            "cargo tree failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let tree = String::from_utf8(output.stdout).context("cargo tree printed non-UTF-8")?;
    let mut versions: BTreeMap<&str, std::collections::BTreeSet<String>> = BTreeMap::new();
    for line in tree.lines() {
        let mut parts = line.split_whitespace();
        let (Some(name), Some(version)) = (parts.next(), parts.next()) else {
            continue;
        };
        let version = version.trim_start_matches('v');
        let major = match version.split('.').collect::<Vec<_>>().as_slice() {
            ["0", minor, ..] => format!("0.{minor}"),
            [major, ..] => (*major).to_owned(),
            [] => continue,
        };
        versions.entry(name).or_default().insert(major);
    }
    let mut problems = Vec::new();
    for name in FORBIDDEN {
        if versions.contains_key(name) {
            problems.push(format!(
                "{name} is in the dependency graph (find who pulls it: cargo tree -i {name})"
            ));
        }
    }
    for name in SINGLE_VERSION {
        if let Some(majors) = versions.get(name).filter(|m| m.len() > 1) {
            problems.push(format!(
                "{name} appears in several major versions: {majors:?}"
            ));
        }
    }
    // The release binary must never contain the emulator (or any test-only crate).
    let packages = binary_tree(&["--edges", "normal", "--format", "{p}"])?;
    for test_only in ["oci-csi-testkit", "rcgen", "tower-test", "proptest"] {
        if packages
            .lines()
            .any(|l| l.split_whitespace().next() == Some(test_only))
        {
            problems.push(format!(
                "the provider binary depends on the test-only crate {test_only}"
            ));
        }
    }
    // Nor a gRPC client: csi-grpc's `client` feature is for tests and tools.
    let features = binary_tree(&[
        "--edges",
        "normal,features",
        "--invert",
        "secrets-store-csi-grpc",
    ])?;
    if features.contains("secrets-store-csi-grpc feature \"client\"") {
        problems.push(
            "the provider binary enables csi-grpc's client feature (a gRPC client in production)"
                .to_owned(),
        );
    }
    if !problems.is_empty() {
        bail!("dependency policy violated:\n  {}", problems.join("\n  "));
    }
    eprintln!(
        "dependency policy holds: {} crates, none of {FORBIDDEN:?}, one major version of each of {SINGLE_VERSION:?}, no test-only crate and no gRPC client in the binary",
        versions.len()
    );
    Ok(())
}

/// `cargo tree` of the provider binary's package with `args`, one package a line.
fn binary_tree(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args([
            "tree",
            "--package",
            "oci-secrets-store-csi-driver-provider",
            "--prefix",
            "none",
        ])
        .args(args)
        .output()
        .context("cannot run cargo tree for the binary")?;
    if !output.status.success() {
        bail!(
            "cargo tree failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::procs::root;

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if !path.ends_with("target") {
                    rust_files(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Invariant 1 (one transport per process) is enforced by clippy's
    /// `disallowed-methods`/`disallowed-types` with `-D warnings` in `.ci/run`. This test
    /// keeps that enforcement real: the configuration still names every client builder,
    /// and the only places allowed to build one are the transport and the testkit's tests.
    #[test]
    fn only_the_transport_builds_http_clients_or_tls_connectors() {
        let root = root();
        let clippy = std::fs::read_to_string(root.join("clippy.toml")).unwrap();
        for path in [
            "hyper_util::client::legacy::Client::builder",
            "hyper_util::client::legacy::Builder::build",
            "hyper::client::conn::http1::handshake",
            "hyper::client::conn::http2::handshake",
            "rustls::ClientConfig::builder",
            "rustls::ClientConfig::builder_with_provider",
            "tokio_rustls::TlsConnector",
        ] {
            assert!(
                clippy.contains(&format!("path = \"{path}\"")),
                "clippy.toml no longer disallows {path}"
            );
        }
        let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
        assert!(ci.contains("cargo clippy --workspace --all-targets --locked -- -D warnings"));

        let mut files = Vec::new();
        for dir in ["crates", "bin", "xtask"] {
            rust_files(&root.join(dir), &mut files);
        }
        assert!(
            files.len() > 50,
            "the source tree was read: {}",
            files.len()
        );
        let allowed = |path: &Path| {
            let path = path.strip_prefix(&root).unwrap_or(path);
            path.starts_with("crates/transport/src")
                || path.starts_with("crates/testkit/tests")
                // Readiness: one plaintext HTTP/2 call to our own socket, never upstream.
                || path == Path::new("bin/src/ready.rs")
        };
        let needles = [
            ["allow(clippy::", "disallowed_methods"].concat(),
            ["allow(clippy::", "disallowed_types"].concat(),
        ];
        let mut offenders = Vec::new();
        let mut in_transport = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if needles.iter().any(|n| text.contains(n.as_str())) {
                if allowed(file) {
                    in_transport += 1;
                } else {
                    offenders.push(file.display().to_string());
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "clients built outside the transport: {offenders:?}"
        );
        assert!(
            in_transport >= 3,
            "the transport's own reasoned allows were found"
        );
    }
}
