//! Readiness as the driver sees it: `Version` called over the provider's own socket, with
//! HTTP/2 and gRPC framing written here (a few lines over hyper's client connection), so
//! the binary carries no gRPC client crate. The answer is cached for about a second, so a
//! probe storm makes at most one call a second.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;

/// How long a check's answer is reused.
const CACHE_FOR: Duration = Duration::from_secs(1);
/// How long one check may take.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the provider serves its socket, checked by calling it.
#[derive(Debug)]
pub(crate) struct Readiness {
    endpoint: csi_grpc::Endpoint,
    /// Set once the socket is bound, cleared at shutdown.
    serving: AtomicBool,
    last: tokio::sync::Mutex<()>,
    cached: Mutex<Option<(Instant, Result<(), String>)>>,
}

impl Readiness {
    pub(crate) fn new(endpoint: csi_grpc::Endpoint) -> Self {
        Self {
            endpoint,
            serving: AtomicBool::new(false),
            last: tokio::sync::Mutex::new(()),
            cached: Mutex::new(None),
        }
    }

    pub(crate) fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::SeqCst);
    }

    /// `Ok` when the socket answers `Version` as the driver would call it.
    pub(crate) async fn check(&self) -> Result<(), String> {
        if !self.serving.load(Ordering::SeqCst) {
            return Err("not serving the provider socket".to_owned());
        }
        // One check at a time; the others reuse its answer.
        let _one = self.last.lock().await;
        if let Some((at, answer)) = self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            && at.elapsed() < CACHE_FOR
        {
            return answer.clone();
        }
        let answer = match tokio::time::timeout(TIMEOUT, self.version()).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("Version did not answer within {TIMEOUT:?}")),
        };
        *self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((Instant::now(), answer.clone()));
        answer
    }

    async fn version(&self) -> Result<(), String> {
        let io_error = |e: std::io::Error| format!("cannot connect to {}: {e}", self.endpoint);
        match &self.endpoint {
            csi_grpc::Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(io_error)?;
                call_version(stream).await
            }
            csi_grpc::Endpoint::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(io_error)?;
                call_version(stream).await
            }
        }
    }
}

/// One `Version` call on a fresh HTTP/2 connection; the connection closes when it returns.
async fn call_version<IO>(stream: IO) -> Result<(), String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Not an upstream client (invariant 1, one transport per process, is about those): plaintext HTTP/2 to the
    // provider's own socket, one request, closed at once; xtask names this file.
    #[allow(clippy::disallowed_methods)] // reason: readiness dials our own socket
    let handshake =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream));
    let (mut sender, connection) = handshake
        .await
        .map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
    // Ends when `sender` is dropped (end of this function) or the server goes away.
    let driver = tokio::spawn(connection);
    let message = csi_grpc::proto::VersionRequest {
        version: "v1alpha1".to_owned(),
    }
    .encode_to_vec();
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    frame.put_slice(&message);
    let request = http::Request::post("http://localhost/v1alpha1.CSIDriverProvider/Version")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(Full::new(frame.freeze()))
        .map_err(|e| e.to_string())?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("Version failed: {e}"))?;
        if response.status() != http::StatusCode::OK {
            return Err(format!("Version answered HTTP {}", response.status()));
        }
        let header_status = grpc_status(response.headers());
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("Version's answer broke off: {e}"))?;
        let status = body
            .trailers()
            .and_then(grpc_status)
            .or(header_status)
            .ok_or("Version's answer has no grpc-status")?;
        if status != "0" {
            return Err(format!("Version answered grpc-status {status}"));
        }
        let data: Bytes = body.to_bytes();
        let reply = data
            .get(5..)
            .and_then(|m| csi_grpc::proto::VersionResponse::decode(m).ok())
            .ok_or("Version's answer is not a VersionResponse")?;
        if reply.runtime_name.is_empty() {
            return Err("Version's answer has no runtime name".to_owned());
        }
        Ok(())
    }
    .await;
    drop(sender);
    let _ = driver.await;
    result
}

fn grpc_status(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}
