//! Building and running the emulator and the provider as processes, as a node would.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// The workspace root (xtask lives one level below it).
pub(crate) fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// Builds the provider and the emulator; returns the directory of the binaries.
pub(crate) fn build(release: bool) -> anyhow::Result<PathBuf> {
    build_with(release, &[])
}

/// [`build`] with cargo features of the provider (`jemalloc`).
pub(crate) fn build_with(release: bool, features: &[&str]) -> anyhow::Result<PathBuf> {
    cargo_build(
        release,
        &[
            "--bin",
            PROVIDER_BIN,
            "--bin",
            "oci-emulator",
            "-p",
            "oci-secrets-store-csi-driver-provider",
            "-p",
            "oci-csi-testkit",
        ],
        features,
    )
}

/// Builds the emulator alone (the provider is given); returns the directory of the binary.
pub(crate) fn build_emulator(release: bool) -> anyhow::Result<PathBuf> {
    cargo_build(
        release,
        &["--bin", "oci-emulator", "-p", "oci-csi-testkit"],
        &[],
    )
}

fn cargo_build(release: bool, what: &[&str], features: &[&str]) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = std::process::Command::new(cargo);
    command.current_dir(root()).arg("build").args(what);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    if release {
        command.arg("--release");
        // As every release build here: one set of flags, one build of the dependencies.
        crate::reproducible::remap(&mut command, &root(), &target);
    }
    if !features.is_empty() {
        command.arg("--features").arg(
            features
                .iter()
                .map(|f| format!("oci-secrets-store-csi-driver-provider/{f}"))
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    let status = command.status().context("cannot run cargo build")?;
    if !status.success() {
        bail!("cargo build failed");
    }
    Ok(target.join(if release { "release" } else { "debug" }))
}

/// A free loopback port.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The emulator, running in its own process.
pub(crate) struct Emulator {
    child: Child,
    pub(crate) config: PathBuf,
}

impl Emulator {
    pub(crate) async fn start(bin: &Path, seed: &Path, dir: &Path) -> anyhow::Result<Self> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        let mut child = Command::new(bin.join("oci-emulator"))
            .arg("--seed")
            .arg(seed)
            .arg("--out-dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start oci-emulator")?;
        let config = dir.join("provider.toml");
        wait_until(
            Duration::from_secs(30),
            "the emulator writes provider.toml",
            || {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(anyhow::anyhow!("the emulator exited: {status}"));
                }
                Ok(config.exists()
                    && std::fs::metadata(&config)
                        .map(|m| m.len() > 0)
                        .unwrap_or(false))
            },
        )
        .await?;
        Ok(Self { child, config })
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The provider binary's name in a build's directory.
pub(crate) const PROVIDER_BIN: &str = "oci-secrets-store-csi-driver-provider";

/// The provider binary, running as the DaemonSet would.
pub(crate) struct Provider {
    child: Child,
    pub(crate) socket: PathBuf,
    pub(crate) metrics_port: u16,
}

impl Provider {
    /// The provider of the build in `bin`.
    pub(crate) async fn start(
        bin: &Path,
        config: &Path,
        dir: &Path,
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::start_binary(&bin.join(PROVIDER_BIN), config, dir, extra_env).await
    }

    /// The provider `binary` (any build, an older one too: only flags and settings every
    /// release accepts are used), with the emulator's `config`, its socket in `dir`.
    pub(crate) async fn start_binary(
        binary: &Path,
        config: &Path,
        dir: &Path,
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::start_wrapped(&[], binary, config, dir, extra_env, Duration::from_secs(30)).await
    }

    /// [`Provider::start_binary`] run by `wrapper` (`valgrind --tool=callgrind ...`), ready
    /// within `ready`.
    pub(crate) async fn start_wrapped(
        wrapper: &[String],
        binary: &Path,
        config: &Path,
        dir: &Path,
        extra_env: &[(&str, &str)],
        ready: Duration,
    ) -> anyhow::Result<Self> {
        let socket = dir.join("oci.sock");
        // A socket left by a run that was killed would pass for this provider's readiness.
        let _ = std::fs::remove_file(&socket);
        let (healthz_port, metrics_port) = (free_port()?, free_port()?);
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let mut child = command
            .arg("--config")
            .arg(config)
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--healthz-port={healthz_port}"))
            .arg(format!("--metrics-port={metrics_port}"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("OCI_PROVIDER_SERVER__BIND_ADDRESS", "127.0.0.1")
            .envs(extra_env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start the provider {}", binary.display()))?;
        wait_until(ready, "the provider is ready", || {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(anyhow::anyhow!("the provider exited: {status}"));
            }
            Ok(socket.exists())
        })
        .await?;
        Ok(Self {
            child,
            socket,
            metrics_port,
        })
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The Prometheus text of /metrics.
    pub(crate) async fn metrics(&self) -> anyhow::Result<String> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok(response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default())
    }

    /// The Prometheus text of /metrics once it counts `mounts` mounts answered. The
    /// provider renders /metrics at most once a second, so a scrape right after a short
    /// run can show the rendering from before it; after 10 s the last scrape is returned
    /// with a warning (a mount the provider never answered is not counted).
    pub(crate) async fn metrics_counting(&self, mounts: usize) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.metrics().await?;
            let counted = metric_sum(&text, "oci_provider_mounts_total");
            if counted >= mounts as f64 {
                return Ok(text);
            }
            if tokio::time::Instant::now() > deadline {
                eprintln!("warning: /metrics counts {counted} mounts, not {mounts}, after 10 s");
                return Ok(text);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Sends SIGTERM and waits for the exit.
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.stop_within(Duration::from_secs(30)).await
    }

    /// Sends SIGTERM and waits `within` for the exit.
    pub(crate) async fn stop_within(mut self, within: Duration) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
        }
        let status = tokio::time::timeout(within, self.child.wait()).await??;
        if !status.success() {
            bail!("the provider exited with {status}");
        }
        Ok(())
    }
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`); 0 when unreadable.
pub(crate) fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Sums the samples of the Prometheus metric `name` (all label sets).
pub(crate) fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn wait_until(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if done()? {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A mount request as the driver builds it.
pub(crate) fn mount_request(attributes: serde_json::Value) -> csi_grpc::proto::MountRequest {
    csi_grpc::proto::MountRequest {
        attributes: attributes.to_string(),
        secrets: "{}".into(),
        target_path: "/var/lib/kubelet/pods/demo/volumes/kubernetes.io~csi/secrets/mount".into(),
        permission: "420".into(),
        current_object_version: vec![],
    }
}
