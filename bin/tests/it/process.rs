//! Starting and stopping the real binary.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use csi_grpc::client::{Client, connect_unix};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

const BINARY: &str = env!("CARGO_BIN_EXE_oci-secrets-store-csi-driver-provider");

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Output {
    pub status: std::process::ExitStatus,
    pub stderr: String,
    /// The provider's directory, kept so callers can look at what it left behind.
    pub _dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {:?}\n{}", self.status, self.stderr)
    }
}

pub struct Spawned {
    child: Child,
    /// Reads stderr as it comes, so a chatty provider never blocks on a full pipe.
    stderr: tokio::task::JoinHandle<String>,
}

impl Spawned {
    fn new(mut child: Child) -> Self {
        let mut pipe = child.stderr.take().unwrap();
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text).await;
            text
        });
        Spawned { child, stderr }
    }

    pub async fn wait_exit(mut self) -> Output {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the provider exits")
            .unwrap();
        let stderr = self.stderr.await.unwrap();
        Output {
            status,
            stderr,
            _dir: None,
        }
    }
}

pub struct Provider {
    pub socket: PathBuf,
    pub healthz_port: u16,
    pub metrics_port: u16,
    spawned: Spawned,
    _dir: tempfile::TempDir,
    /// When [`Provider::metrics`] last had its answer.
    last_scrape: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// The provider serves one rendering of `/metrics` for a second (`health.rs`'s
/// `RENDER_EVERY`); a scrape this long after the previous one gets a new rendering.
const RENDERED_AGAIN_AFTER: Duration = Duration::from_millis(1100);

impl Provider {
    /// Spawns the binary on `socket` with loopback health and metrics ports.
    pub fn spawn_at(socket: &Path, args: &[&str], vars: &[(&str, &str)]) -> Spawned {
        Self::spawn_with_ports(socket, args, vars, free_port(), free_port())
    }

    fn spawn_with_ports(
        socket: &Path,
        args: &[&str],
        vars: &[(&str, &str)],
        healthz: u16,
        metrics: u16,
    ) -> Spawned {
        let child = Command::new(BINARY)
            .arg(format!("-endpoint=unix://{}", socket.display()))
            .arg("--healthz-port")
            .arg(healthz.to_string())
            .arg(format!("--metrics-port={metrics}"))
            .args(args)
            .env_clear()
            .env("OCI_PROVIDER_SERVER__BIND_ADDRESS", "127.0.0.1")
            // A test's provider lives seconds and makes a few identities: the node's pool
            // of 32 keys made ahead would be CPU spent for nothing (a test may set its own).
            .env("OCI_PROVIDER_AUTH__SESSION_KEYS_AHEAD", "2")
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Spawned::new(child)
    }

    /// Starts the binary and waits until it reports ready.
    pub async fn start(args: &[&str], vars: &[(&str, &str)]) -> Provider {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("oci.sock");
        Self::start_on(socket, dir, args, vars).await
    }

    /// Starts another provider on this one's socket path (a rolling update's new pod) and
    /// waits until it reports ready.
    pub async fn start_successor(&self, args: &[&str], vars: &[(&str, &str)]) -> Provider {
        Self::start_on(
            self.socket.clone(),
            tempfile::tempdir().unwrap(),
            args,
            vars,
        )
        .await
    }

    async fn start_on(
        socket: PathBuf,
        dir: tempfile::TempDir,
        args: &[&str],
        vars: &[(&str, &str)],
    ) -> Provider {
        let (healthz_port, metrics_port) = (free_port(), free_port());
        let mut spawned = Self::spawn_with_ports(&socket, args, vars, healthz_port, metrics_port);
        // Wait for readiness: the process needs a moment to start; bounded, not a fixed sleep.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = spawned.child.try_wait() {
                panic!("the provider exited during start: {status:?}");
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", healthz_port))
                .await
                .is_ok()
                && http_get(healthz_port, "/readyz").await.0 == 200
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the provider became ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(socket.exists());
        Provider {
            socket,
            healthz_port,
            metrics_port,
            spawned,
            _dir: dir,
            last_scrape: std::sync::Mutex::new(None),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.spawned.child.id().unwrap()
    }

    /// How many file descriptors the process has open.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The text of /metrics, rendered after this call began. The provider serves a rendering
    /// again for a second, so a read within a second of this handle's previous one first
    /// waits that out: what a test did between two reads always shows in the second.
    pub async fn metrics(&self) -> String {
        let previous = *self.last_scrape.lock().unwrap();
        if let Some(at) = previous {
            tokio::time::sleep_until(at + RENDERED_AGAIN_AFTER).await;
        }
        let body = http_get(self.metrics_port, "/metrics").await.1;
        *self.last_scrape.lock().unwrap() = Some(tokio::time::Instant::now());
        body
    }

    pub async fn client(&self) -> Client {
        connect_unix(&self.socket).await.unwrap()
    }

    /// Sends SIGTERM and waits for the exit.
    pub async fn terminate(self) -> Output {
        let pid = self.spawned.child.id().unwrap();
        let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let mut output = self.spawned.wait_exit().await;
        output._dir = Some(self._dir);
        output
    }
}

/// A minimal HTTP/1.0 GET on loopback: (status, body).
pub async fn http_get(port: u16, path: &str) -> (u16, String) {
    let (status, body) = http_get_bytes(port, path).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// [`http_get`] with the body as bytes (profiles).
pub async fn http_get_bytes(port: u16, path: &str) -> (u16, Vec<u8>) {
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (0, Vec::new());
    };
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return (0, Vec::new());
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (0, Vec::new());
    };
    let head = String::from_utf8_lossy(&response[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response[split + 4..].to_vec())
}
