//! The Secrets Store CSI driver's side of the provider socket, with the real grpc-go
//! library: `driver/driverclient.go`, built with Debian's `golang-go` and
//! `golang-google-grpc-dev` offline (GO111MODULE=off, GOPATH=/usr/share/gocode).
//!
//! It dials as a driver does (`socket-path`: the socket path as `:authority`, drivers v1.0
//! to v1.5.x; `localhost`: v1.6.0; `sync-controller`: the secrets-store-sync-controller,
//! with its service config, no deadline and no Version call), replays a JSON fixture of Mount requests on one
//! connection and prints a JSON summary (Version, each answer's files with size and FNV-1a
//! checksum, failures, latency p50/p99).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Where Debian installs Go libraries.
pub const GOPATH: &str = "/usr/share/gocode";

/// The built driver client.
#[derive(Debug, Clone)]
pub struct DriverClient {
    binary: PathBuf,
}

/// Why the client could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// Go or grpc-go is not installed.
    #[error(
        "the grpc-go driver client needs Debian's golang-go, golang-google-grpc-dev and \
         golang-google-protobuf-dev (go found: {go}, grpc-go found: {grpc})"
    )]
    Missing {
        /// Whether `go` runs.
        go: bool,
        /// Whether grpc-go is under [`GOPATH`].
        grpc: bool,
    },
    /// `go build` failed.
    #[error("go build of the driver client failed: {0}")]
    Build(String),
    /// The client could not be run or printed no summary.
    #[error("driver client: {0}")]
    Run(String),
}

impl DriverClient {
    /// Builds the client into `dir`.
    pub fn build_into(dir: &Path) -> Result<Self, DriverError> {
        let go = Command::new("go").arg("version").output().is_ok();
        let grpc = Path::new(GOPATH)
            .join("src/google.golang.org/grpc")
            .is_dir();
        if !go || !grpc {
            return Err(DriverError::Missing { go, grpc });
        }
        std::fs::create_dir_all(dir).map_err(|e| DriverError::Build(e.to_string()))?;
        let binary = dir.join("driverclient");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("driver/driverclient.go");
        let output = Command::new("go")
            .arg("build")
            .arg("-o")
            .arg(&binary)
            .arg(&source)
            .env("GO111MODULE", "off")
            .env("GOPATH", GOPATH)
            .env("GOCACHE", dir.join("go-cache"))
            .env("GOFLAGS", "")
            .output()
            .map_err(|e| DriverError::Build(e.to_string()))?;
        if !output.status.success() {
            return Err(DriverError::Build(
                String::from_utf8_lossy(&output.stderr).into_owned(),
            ));
        }
        Ok(Self { binary })
    }

    /// The client for tests, built once per test binary under `target_tmpdir` (pass
    /// `env!("CARGO_TARGET_TMPDIR")`). Tests that use it are `#[ignore = "needs Go and
    /// grpc-go ..."]`, so a run without the tools reports them skipped; run with
    /// `--run-ignored all` (as CI does), a missing tool fails them with what to install.
    pub fn for_tests(target_tmpdir: &str) -> Self {
        static BUILT: OnceLock<Result<DriverClient, String>> = OnceLock::new();
        BUILT
            .get_or_init(|| {
                Self::build_into(&Path::new(target_tmpdir).join("grpc-go"))
                    .map_err(|e| e.to_string())
            })
            .clone()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs the client on `socket` with the fixture at `fixture` and extra flags
    /// (`-repeat N`, `-dial socket-path|localhost|sync-controller`, `-keep N`, `-timeout 10s`,
    /// `-watchdog 60s`). Returns the
    /// summary and whether every call succeeded.
    pub async fn run(
        &self,
        socket: &Path,
        fixture: &Path,
        args: &[&str],
    ) -> Result<(serde_json::Value, bool), DriverError> {
        let output = tokio::process::Command::new(&self.binary)
            .arg("-socket")
            .arg(socket)
            .arg("-fixture")
            .arg(fixture)
            .args(args)
            // The sync controller's retry policy; on by default from grpc-go 1.40, Debian's
            // is 1.33.
            .env("GRPC_GO_RETRY", "on")
            .output()
            .await
            .map_err(|e| DriverError::Run(e.to_string()))?;
        let summary = serde_json::from_slice(&output.stdout).map_err(|e| {
            DriverError::Run(format!("{e}: {}", String::from_utf8_lossy(&output.stderr)))
        })?;
        Ok((summary, output.status.success()))
    }
}

/// FNV-1a of `bytes`, the checksum the client reports for each file.
pub fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(2_166_136_261u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(16_777_619)
    })
}
