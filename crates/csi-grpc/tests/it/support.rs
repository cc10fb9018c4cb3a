use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrets_store_csi_grpc::client::{Client, connect_unix};
use secrets_store_csi_grpc::{
    AdmissionLayer, CatchPanicLayer, CsiProvider, DeadlineLayer, Endpoint, Listener, MountLimits,
    MountService, RequestBytesLayer, ServerInfo, serve,
};
use tokio::sync::oneshot;

/// Connects like the driver does.
pub async fn connect(path: &Path) -> Client {
    connect_unix(path).await.unwrap()
}

pub fn info() -> ServerInfo {
    ServerInfo {
        runtime_name: "test-provider".into(),
        runtime_version: "1.2.3".into(),
    }
}

/// A server running in the background, stopped by `stop`.
pub struct Running {
    pub path: PathBuf,
    dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops the server and hands back its directory, so the caller can look at what is left.
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.done)
            .await
            .expect("server stops")
            .unwrap();
        self.dir
    }

    pub fn trigger_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub fn start<S>(inner: S, limits: MountLimits, grace: Duration) -> Running
where
    S: MountService,
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("provider.sock");
    let (stop, done) = start_at(&path, info(), inner, limits, grace);
    Running {
        path,
        dir,
        stop: Some(stop),
        done,
    }
}

/// A server on `path` answering `Version` with `info`, stopped by sending on the sender.
pub fn start_at<S>(
    path: &Path,
    info: ServerInfo,
    inner: S,
    limits: MountLimits,
    grace: Duration,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>)
where
    S: MountService,
{
    let listener = Listener::bind(&Endpoint::Unix(path.to_owned()), 0o600).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    // The layers every mount passes, as the binary composes them.
    let request_bytes = RequestBytesLayer::new(&limits);
    let decoding = request_bytes.decoding();
    let edge = tower::ServiceBuilder::new()
        .layer(request_bytes)
        .layer(AdmissionLayer::new(&limits))
        .layer(DeadlineLayer)
        .layer(CatchPanicLayer)
        .service(inner);
    let provider = CsiProvider::new(edge, info, limits).with_decoding(decoding);
    let done = tokio::spawn(async move {
        serve(
            listener,
            provider,
            async move {
                let _ = stopped.await;
            },
            grace,
        )
        .await
        .unwrap();
    });
    (stop, done)
}

/// A mount request the way the driver builds one.
pub fn driver_request(
    attributes: serde_json::Value,
) -> secrets_store_csi_grpc::proto::MountRequest {
    secrets_store_csi_grpc::proto::MountRequest {
        attributes: attributes.to_string(),
        secrets: "{}".into(),
        target_path: "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/v/mount".into(),
        permission: "420".into(),
        current_object_version: vec![],
    }
}

/// Log lines captured from a tracing subscriber at trace level.
#[derive(Clone, Default)]
pub struct LogCapture(pub Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
