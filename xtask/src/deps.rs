//! `cargo xtask check-deps`: one crypto backend and one TLS stack (ARCHITECTURE.md, invariant 17).

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

/// The binary's feature sets whose graphs must each hold the policy.
const BUILDS: &[(&str, &[&str], &str)] = &[
    ("default", &[], "aws-lc-sys"),
    (
        "fips",
        &["--features", "oci-secrets-store-csi-driver-provider/fips"],
        "aws-lc-fips-sys",
    ),
];

/// `check-deps [--binary PATH [--fips]]`: the graph of each build; with `--binary`, also
/// the AWS-LC a built binary really links (exactly one: the FIPS module with `--fips`).
pub(crate) fn check(args: &[String]) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    let mut summary = Vec::new();
    for (build, features, sys) in BUILDS {
        let (crates, found) = graph_problems(features, sys)?;
        problems.extend(found.into_iter().map(|p| format!("{build} build: {p}")));
        summary.push(format!("{build}: {crates} crates"));
    }
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--binary" => {
                let path = args.next().context("--binary needs a path")?;
                let fips = args.as_slice().first().is_some_and(|a| a == "--fips");
                if fips {
                    args.next();
                }
                let bytes = std::fs::read(path).with_context(|| format!("cannot read {path}"))?;
                let modules = aws_lc_modules(&bytes);
                let expected = if fips { "aws_lc_fips_" } else { "aws_lc_0" };
                match modules.as_slice() {
                    [one] if one.starts_with(expected) => {
                        summary.push(format!("{path} links one AWS-LC: {one}"));
                    }
                    _ => problems.push(format!(
                        "{path} links AWS-LC {modules:?}; expected exactly one, {expected}*"
                    )),
                }
            }
            other => bail!("check-deps: unknown argument {other} (--binary PATH [--fips])"),
        }
    }
    if !problems.is_empty() {
        bail!("dependency policy violated:\n  {}", problems.join("\n  "));
    }
    eprintln!(
        "dependency policy holds ({}): none of {FORBIDDEN:?}, one major version of each of \
         {SINGLE_VERSION:?}, one AWS-LC -sys crate used by aws-lc-rs, no test-only crate and \
         no gRPC client in the binary",
        summary.join("; ")
    );
    Ok(())
}

/// The distinct AWS-LC symbol prefixes (`aws_lc_0_47_0`, `aws_lc_fips_0_14_4`) in a binary:
/// each AWS-LC build prefixes every symbol with its crate and version, so two prefixes are
/// two crypto modules linked.
fn aws_lc_modules(binary: &[u8]) -> Vec<String> {
    let mut found = std::collections::BTreeSet::new();
    let needle = b"aws_lc_";
    let mut at = 0;
    while let Some(offset) = binary[at..].windows(needle.len()).position(|w| w == needle) {
        let start = at + offset;
        let rest = &binary[start + needle.len()..];
        let fips = rest.starts_with(b"fips_");
        let digits = if fips { &rest[5..] } else { rest };
        // Three numbers joined by `_`, then `_` and the symbol: `0_47_0_`.
        let mut parts = 0;
        let mut len = 0;
        while parts < 3 {
            let n = digits[len..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if n == 0 || digits.get(len + n) != Some(&b'_') {
                break;
            }
            len += n + 1;
            parts += 1;
        }
        if parts == 3 {
            let prefix = &binary[start..start + needle.len() + usize::from(fips) * 5 + len - 1];
            found.insert(String::from_utf8_lossy(prefix).into_owned());
        }
        at = start + needle.len();
    }
    found.into_iter().collect()
}

/// The workspace graph with `features`: forbidden crates, duplicate majors, which AWS-LC -sys
/// crate aws-lc-rs uses (`sys`), test-only crates and the gRPC client in the binary.
fn graph_problems(features: &[&str], sys: &str) -> anyhow::Result<(usize, Vec<String>)> {
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
        .args(features)
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
    if sys == "aws-lc-sys" && versions.contains_key("aws-lc-fips-sys") {
        problems.push("aws-lc-fips-sys is in the graph without the fips feature".to_owned());
    }
    // aws-lc-rs on the -sys crate of this build (rustls' `aws_lc_rs` feature always builds
    // aws-lc-sys too; the FIPS build links only aws-lc-fips-sys, which `--binary` proves).
    let used = binary_tree(&[&["--edges", "normal", "--invert", sys], features].concat())?;
    if !used.lines().any(|l| l.starts_with("aws-lc-rs ")) {
        problems.push(format!("aws-lc-rs does not build on {sys}"));
    }
    // The release binary must never contain the emulator (or any test-only crate).
    let packages = binary_tree(&[&["--edges", "normal", "--format", "{p}"], features].concat())?;
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
    let client = binary_tree(
        &[
            &[
                "--edges",
                "normal,features",
                "--invert",
                "secrets-store-csi-grpc",
            ],
            features,
        ]
        .concat(),
    )?;
    if client.contains("secrets-store-csi-grpc feature \"client\"") {
        problems.push(
            "the provider binary enables csi-grpc's client feature (a gRPC client in production)"
                .to_owned(),
        );
    }
    Ok((versions.len(), problems))
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
    use std::path::Path;

    /// ARCHITECTURE.md stays a map: at most 300 lines, no issue numbers, and every test it
    /// cites as proof of an invariant exists.
    #[test]
    fn the_architecture_map_is_short_and_its_cited_tests_exist() {
        let root = root();
        let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
        assert!(map.lines().count() <= 300, "{} lines", map.lines().count());
        assert!(
            !map.to_lowercase().contains("issue "),
            "ARCHITECTURE.md mentions issues; git and CHANGELOG.md hold the history"
        );
        let mut sources = String::new();
        let mut files = Vec::new();
        for dir in ["crates", "bin", "xtask"] {
            rust_files(&root.join(dir), &mut files);
        }
        for file in &files {
            sources.push_str(&std::fs::read_to_string(file).unwrap_or_default());
        }
        let cited: Vec<&str> = map
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| {
                w.matches('_').count() >= 4
                    && w.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            })
            .collect();
        assert!(cited.len() >= 20, "{cited:?}");
        for test in cited {
            assert!(
                sources.contains(&format!("fn {test}(")),
                "ARCHITECTURE.md cites {test}, which no longer exists"
            );
        }
    }

    /// The README is read as a guide: its contents list and every link to one of its own
    /// sections land on a heading (GitHub's anchors: lower case, punctuation dropped, spaces
    /// as hyphens), and the two commands a newcomer needs come before anything else.
    #[test]
    fn the_readmes_own_links_land_on_its_headings() {
        let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
        let mut in_code = false;
        let mut anchors = Vec::new();
        for line in readme.lines() {
            if line.starts_with("```") {
                in_code = !in_code;
            } else if !in_code && line.starts_with('#') {
                let title = line.trim_start_matches('#').trim();
                let anchor: String = title
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect();
                anchors.push(anchor);
            }
        }
        let links: Vec<&str> = readme
            .split("](#")
            .skip(1)
            .map(|rest| &rest[..rest.find(')').unwrap()])
            .collect();
        assert!(links.len() >= 15, "{links:?}");
        for link in links {
            assert!(
                anchors.iter().any(|a| a == link),
                "README links to #{link}, which no heading makes"
            );
        }
        let commands = readme.find("cargo xtask demo").unwrap();
        assert!(commands < readme.find("## Install").unwrap());
        assert!(
            readme[commands..].starts_with(
                "cargo xtask demo\n\n# Run the tests\ncargo nextest run --workspace\n"
            )
        );
    }

    /// A test that needs a tool the machine may lack is `#[ignore = "needs ..."]`, so a run
    /// without the tool reports it skipped rather than passing a no-op; CI runs every
    /// ignored test (`--run-ignored all` on each test run of `.ci/run`), and no test skips
    /// itself by returning early.
    #[test]
    fn tests_that_need_a_tool_are_reported_skipped_and_ci_runs_them() {
        let root = root();
        let mut files = Vec::new();
        for dir in ["crates", "bin", "xtask"] {
            rust_files(&root.join(dir), &mut files);
        }
        let mut ignored = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.starts_with("#[ignore") {
                    ignored += 1;
                    assert!(
                        line.starts_with("#[ignore = \"needs "),
                        "{}:{}: an ignored test says which tool it needs: {line}",
                        file.display(),
                        n + 1
                    );
                }
                assert!(
                    !line.contains(&["SKIP", "PED"].concat()),
                    "{}:{}: a test that did nothing would pass: ignore it instead",
                    file.display(),
                    n + 1
                );
            }
        }
        assert!(ignored >= 10, "{ignored}");
        let ci = std::fs::read_to_string(root.join(".ci/run"))
            .unwrap()
            .replace("\\\n", " ");
        for line in ci.lines().filter(|l| l.contains("cargo nextest run")) {
            assert!(
                line.contains("--no-run") || line.contains("--run-ignored all"),
                ".ci/run skips the tests that need a tool: {line}"
            );
        }
    }

    #[test]
    fn the_aws_lc_symbol_prefixes_name_each_module_linked() {
        let one = b"\0aws_lc_0_47_0_SHA256_Init\0aws_lc_0_47_0_EVP_sha256\0aws_lc_rs\0";
        assert_eq!(super::aws_lc_modules(one), ["aws_lc_0_47_0"]);
        let two = b"aws_lc_fips_0_14_4_FIPS_mode\0xaws_lc_0_47_0_RSA_new\0aws_lc_1_2";
        assert_eq!(
            super::aws_lc_modules(two),
            ["aws_lc_0_47_0", "aws_lc_fips_0_14_4"]
        );
        assert!(super::aws_lc_modules(b"aws_lc_sys aws_lc_").is_empty());
    }

    use crate::procs::root;
    use crate::tidy::rust_files;

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
        // The same lint guards the parsers (invariant 18, every parser under an explicit budget):
        // an allow elsewhere is for them only,
        // and such a file names no client.
        let clients = [
            ["Client::", "builder"].concat(),
            ["Builder::", "build"].concat(),
            ["hand", "shake("].concat(),
            ["ClientConfig::", "builder"].concat(),
            ["Tls", "Connector"].concat(),
        ];
        let mut offenders = Vec::new();
        let mut in_transport = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if needles.iter().any(|n| text.contains(n.as_str())) {
                if allowed(file) {
                    in_transport += 1;
                } else if clients.iter().any(|c| text.contains(c.as_str())) {
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

    /// Invariant 18: every parser of tenant or upstream input runs under an explicit budget.
    /// clippy.toml refuses the parsers' entry points; only `crates/bounded` calls them (the
    /// emulator, xtask and tests parse their own input).
    #[test]
    fn only_the_bounded_crate_calls_the_yaml_and_json_parsers() {
        let root = root();
        let clippy = std::fs::read_to_string(root.join("clippy.toml")).unwrap();
        for path in [
            "serde_saphyr::from_str",
            "serde_saphyr::from_slice",
            "serde_saphyr::from_reader",
            "serde_saphyr::from_multiple",
            "serde_saphyr::with_deserializer_from_str",
            "serde_saphyr::with_deserializer_from_slice",
            "serde_json::from_str",
            "serde_json::from_slice",
            "serde_json::from_reader",
        ] {
            assert!(
                clippy.contains(&format!("path = \"{path}\"")),
                "clippy.toml no longer disallows {path}"
            );
        }
        let mut files = Vec::new();
        for dir in ["crates", "bin"] {
            rust_files(&root.join(dir), &mut files);
        }
        let library = |path: &Path| {
            let path = path.strip_prefix(&root).unwrap_or(path);
            let text = path.to_string_lossy();
            (text.contains("/src/") || text.starts_with("bin/src"))
                && !path.starts_with("crates/bounded")
                && !path.starts_with("crates/testkit")
        };
        let calls = [
            ["serde_saphyr::", "from_"].concat(),
            ["serde_saphyr::", "with_deserializer"].concat(),
            ["serde_json::", "from_s"].concat(),
            ["serde_json::", "from_reader"].concat(),
        ];
        let mut read = 0;
        let mut offenders = Vec::new();
        for file in files.iter().filter(|f| library(f)) {
            read += 1;
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if calls.iter().any(|c| text.contains(c.as_str())) {
                offenders.push(file.display().to_string());
            }
        }
        assert!(read > 50, "the library sources were read: {read}");
        assert!(offenders.is_empty(), "unbudgeted parses: {offenders:?}");
    }
}
