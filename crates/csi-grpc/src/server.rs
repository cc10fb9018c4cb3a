use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use h2_authority::RewriteAuthority;
use prost::Message;
use tower::{Service, ServiceExt};
use tracing::Instrument;

use crate::error::{ErrorKind, MountError};
use crate::listener::{Listener, ListenerKind, remove_own_socket};
use crate::path::validate_file_set;
use crate::proto;
use crate::proto::csi_driver_provider_server::{CsiDriverProvider, CsiDriverProviderServer};
use crate::request::{Deadline, MountRequest};
use crate::response::MountResponse;

/// What the server needs of the inner mount service: a cloneable tower service from
/// [`MountRequest`] to [`MountResponse`] whose futures can move between threads. Every such
/// service implements it.
pub trait MountService:
    Service<
        MountRequest,
        Response = MountResponse,
        Error = MountError,
        Future = <Self as MountService>::MountFuture,
    > + Clone
    + Send
    + Sync
    + 'static
{
    /// The service's future.
    type MountFuture: Future<Output = Result<MountResponse, MountError>> + Send + 'static;
}

impl<S> MountService for S
where
    S: Service<MountRequest, Response = MountResponse, Error = MountError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    type MountFuture = S::Future;
}

/// What `Version` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// `runtime_name`, e.g. `oci-secrets-store-csi-driver-provider`.
    pub runtime_name: String,
    /// `runtime_version`, a semver version.
    pub runtime_version: String,
}

/// Bounds applied to every mount.
#[derive(Clone, Debug)]
pub struct MountLimits {
    /// Mounts served at once (the node's slots); beyond it a mount waits for a slot, so
    /// that a pod storm does not take the node over.
    pub max_in_flight: usize,
    /// Mounts of one namespace served at once while the other namespaces may need the
    /// slots: past it, a namespace takes a slot only while this many stay free, so one
    /// tenant whose mounts stall (an unreachable region, a slow key) never holds the
    /// slots every other namespace needs.
    pub max_in_flight_per_namespace: usize,
    /// Mounts waiting for a slot on the node at once (each holds its decoded request);
    /// beyond it a mount is refused with `ResourceExhausted` and the driver retries. 0:
    /// no mount waits.
    pub max_queued: usize,
    /// Mounts of one namespace waiting for a slot at once; beyond it the namespace's
    /// mounts are refused with `ResourceExhausted`. A quarter of `max_queued` by default:
    /// four stalled namespaces fill the places to wait, never one.
    pub max_queued_per_namespace: usize,
    /// Bytes the decoded requests of the mounts in flight and waiting may hold at once
    /// ([`crate::RequestBytesLayer`]); a mount past it is refused with `ResourceExhausted`.
    pub max_request_bytes: usize,
    /// A namespace's share of `max_request_bytes`: past it a namespace's requests hold more
    /// only while this many bytes stay free for the other namespaces.
    pub max_request_bytes_per_namespace: usize,
    /// Deadline when the driver sends no `grpc-timeout`.
    pub default_deadline: Duration,
    /// Upper bound of any deadline.
    pub max_deadline: Duration,
    /// Largest encoded response; the driver refuses messages above 4 MiB by default.
    pub max_response_bytes: usize,
}

impl Default for MountLimits {
    fn default() -> Self {
        Self {
            max_in_flight: 64,
            max_in_flight_per_namespace: 16,
            // A storm of one namespace as large as the node's slots is served in full: 48
            // at once (all but a share), the other 16 as slots free up.
            max_queued: 64,
            max_queued_per_namespace: 16,
            max_request_bytes: 8 * 1024 * 1024,
            max_request_bytes_per_namespace: 1024 * 1024,
            default_deadline: Duration::from_secs(60),
            max_deadline: Duration::from_secs(60),
            max_response_bytes: 4 * 1024 * 1024 - 64 * 1024,
        }
    }
}

/// Told of every mount's start and outcome (for metrics); must not block.
pub trait MountObserver: Send + Sync + std::fmt::Debug + 'static {
    /// A mount was received.
    fn mount_started(&self);
    /// A mount finished: `Ok` or the kind of its error, and how long it took.
    fn mount_finished(&self, outcome: Result<(), ErrorKind>, elapsed: Duration);
    /// A mount was refused because it could not take a slot and its queue was full
    /// (`MountLimits::max_queued`, `max_queued_per_namespace`); it is also reported as
    /// finished with ResourceExhausted.
    fn mount_shed(&self) {}
    /// A mount was refused because the requests held on the node, or by its namespace,
    /// would pass `MountLimits::max_request_bytes` or `max_request_bytes_per_namespace`
    /// with its own; it is also reported as finished with ResourceExhausted.
    fn mount_shed_for_request_bytes(&self) {}
    /// A mount started waiting for a slot.
    fn mount_queued(&self) {}
    /// A mount stopped waiting for a slot, after `waited`: admitted, or not.
    fn mount_dequeued(&self, outcome: WaitOutcome, waited: Duration) {
        let _ = (outcome, waited);
    }
}

/// How a mount's wait for a slot ended ([`MountObserver::mount_dequeued`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitOutcome {
    /// It took a slot.
    Admitted,
    /// Its deadline passed first (answered DeadlineExceeded).
    DeadlineExceeded,
    /// Its caller went away first.
    Cancelled,
}

impl WaitOutcome {
    /// `admitted`, `deadline_exceeded`, `cancelled`: for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The `CSIDriverProvider` gRPC service around an inner mount service `S`: the wire
/// request translated into a [`MountRequest`] with its [`crate::Deadline`], the answer
/// checked (paths the driver accepts, object versions, size) and encoded, every mount in a
/// span and told to the observer. The bounds of a mount are layers of `S`
/// ([`crate::RequestBytesLayer`], [`crate::AdmissionLayer`], [`crate::DeadlineLayer`],
/// [`crate::CatchPanicLayer`]).
///
/// ```no_run
/// use secrets_store_csi_grpc::{
///     AdmissionLayer, CatchPanicLayer, CsiProvider, DeadlineLayer, MountLimits, MountService,
///     RequestBytesLayer, ServerInfo,
/// };
///
/// fn provider<S: MountService>(mount: S, info: ServerInfo) -> CsiProvider<impl MountService> {
///     let limits = MountLimits::default();
///     let edge = tower::ServiceBuilder::new()
///         .layer(RequestBytesLayer::new(&limits))
///         .layer(AdmissionLayer::new(&limits))
///         .layer(DeadlineLayer)
///         .layer(CatchPanicLayer)
///         .service(mount);
///     CsiProvider::new(edge, info, limits)
/// }
/// ```
#[derive(Debug, Clone)]
pub struct CsiProvider<S> {
    inner: S,
    info: Arc<ServerInfo>,
    limits: Arc<MountLimits>,
    observer: Option<Arc<dyn MountObserver>>,
    decoding: crate::DecodingBytesLayer,
}

impl<S> CsiProvider<S> {
    /// Serves `inner` with `info` for `Version`, and the deadlines and response size of
    /// `limits` for every mount (its slots and queues are [`crate::AdmissionLayer`]'s).
    pub fn new(inner: S, info: ServerInfo, limits: MountLimits) -> Self {
        let decoding = crate::RequestBytesLayer::new(&limits).decoding();
        Self {
            inner,
            info: Arc::new(info),
            limits: Arc::new(limits),
            observer: None,
            decoding,
        }
    }

    /// Counts the bodies of requests being decoded with `layer` (made by the
    /// [`crate::RequestBytesLayer`] of the stack under this service, so one bound holds the
    /// requests being read and those decoded); by default a count of its own, within
    /// `max_request_bytes`.
    pub fn with_decoding(mut self, layer: crate::DecodingBytesLayer) -> Self {
        self.decoding = layer;
        self
    }

    /// Reports every mount to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn MountObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The tonic service to add to a server.
    pub fn into_service(self) -> CsiDriverProviderServer<Self>
    where
        S: MountService,
    {
        // The memory model counts each mount in flight or waiting at this much at most.
        CsiDriverProviderServer::new(self)
            .max_decoding_message_size(crate::request::MAX_REQUEST_BYTES)
    }
}

/// `parse_grpc_timeout` for the property tests in `crate::fuzz`.
#[cfg(test)]
pub(crate) fn fuzz_grpc_timeout(value: &str) -> Option<Duration> {
    parse_grpc_timeout(value)
}

/// Parses a `grpc-timeout` header value (`<1..8 digits><H|M|S|m|u|n>`).
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    // Splitting at the last byte needs ASCII (a header value is, but nothing here relies
    // on the caller for it: the property tests found the panic).
    if !value.is_ascii() {
        return None;
    }
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl<S> CsiProvider<S>
where
    S: MountService,
{
    /// The time the caller granted: its `grpc-timeout`, or the default, capped.
    fn deadline(&self, metadata: &tonic::metadata::MetadataMap) -> Deadline {
        let requested = metadata
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .unwrap_or(self.limits.default_deadline);
        Deadline::granted(requested.min(self.limits.max_deadline))
    }

    async fn mount(
        &self,
        request: Result<MountRequest, MountError>,
        span: &tracing::Span,
    ) -> Result<proto::MountResponse, MountError> {
        let response = self
            .inner
            .clone()
            .oneshot(request?)
            .instrument(span.clone())
            .await?;
        self.to_proto(response)
    }

    fn to_proto(&self, response: MountResponse) -> Result<proto::MountResponse, MountError> {
        validate_file_set(response.files.iter().map(|f| &f.path))
            .map_err(|e| MountError::invalid_argument(e.to_string()))?;
        if response.object_versions.is_empty() {
            return Err(MountError::internal(
                "internal error: the mount service returned no object versions, which the driver refuses",
            ));
        }
        let out = proto::MountResponse {
            object_version: response
                .object_versions
                .into_iter()
                .map(|v| proto::ObjectVersion {
                    id: v.id,
                    version: v.version,
                })
                .collect(),
            error: None,
            files: response
                .files
                .into_iter()
                .map(|f| proto::File {
                    path: f.path.as_str().to_owned(),
                    // At most 0o777 by construction of FileMode.
                    mode: i32::try_from(f.mode.get()).unwrap_or(0o444),
                    // Moved, not copied: the only copies left are prost's encoding of
                    // the message and hyper's write buffers.
                    contents: f.contents.into_vec(),
                })
                .collect(),
        };
        let size = out.encoded_len();
        if size > self.limits.max_response_bytes {
            return Err(MountError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "the mounted files take {size} bytes, more than the limit of {} bytes \
                     (the driver refuses responses above --max-call-recv-msg-size, 4 MiB by default)",
                    self.limits.max_response_bytes
                ),
            ));
        }
        if size > SYNC_WARNING_BYTES {
            // What the driver warns about too: a Kubernetes Secret synced from these files
            // (secretObjects) cannot hold more than 1 MiB.
            tracing::warn!(
                bytes = size,
                "the mounted files exceed 1 MiB; a Kubernetes Secret synced from them would exceed its size limit"
            );
        }
        Ok(out)
    }
}

/// Above this the driver logs a warning (Kubernetes Secrets hold at most 1 MiB).
const SYNC_WARNING_BYTES: usize = 1024 * 1024;

#[tonic::async_trait]
impl<S> CsiDriverProvider for CsiProvider<S>
where
    S: MountService,
{
    async fn version(
        &self,
        _request: tonic::Request<proto::VersionRequest>,
    ) -> Result<tonic::Response<proto::VersionResponse>, tonic::Status> {
        Ok(tonic::Response::new(proto::VersionResponse {
            version: crate::API_VERSION.to_owned(),
            runtime_name: self.info.runtime_name.clone(),
            runtime_version: self.info.runtime_version.clone(),
        }))
    }

    async fn mount(
        &self,
        request: tonic::Request<proto::MountRequest>,
    ) -> Result<tonic::Response<proto::MountResponse>, tonic::Status> {
        let started = std::time::Instant::now();
        if let Some(observer) = &self.observer {
            observer.mount_started();
        }
        let deadline = self.deadline(request.metadata());
        let request = MountRequest::from_proto(request.into_inner(), deadline);
        let translated = request.as_ref().ok();
        let pod = translated.map(|r| &r.pod);
        // One span per mount, its fields set once as it is made (a request that does not
        // translate has none of the pod's); the mount service records `upstream_calls` and
        // `served_without_oci` in it, and the line below is logged in it (pod, result code,
        // duration, files, upstream calls). OpenTelemetry RPC conventions (`rpc.*`);
        // exported as the root span of a mount.
        let span = tracing::info_span!(
            "mount",
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = "v1alpha1.CSIDriverProvider",
            rpc.method = "Mount",
            rpc.grpc.status_code = tracing::field::Empty,
            pod.namespace = pod.map(|p| p.namespace.as_deref().unwrap_or("")),
            pod.name = pod.map(|p| p.name.as_deref().unwrap_or("")),
            caller = translated.map(|r| r.caller.as_str()),
            spc = translated.map(|r| {
                r.attributes
                    .get("secretProviderClass")
                    .map_or("", String::as_str)
            }),
            files = tracing::field::Empty,
            upstream_calls = tracing::field::Empty,
            served_without_oci = tracing::field::Empty,
        );
        let result = CsiProvider::mount(self, request, &span).await;
        span.record(
            "rpc.grpc.status_code",
            match &result {
                Ok(_) => 0,
                Err(err) => err.kind().code() as i32,
            },
        );
        if let Ok(response) = &result {
            span.record("files", response.files.len());
        }
        let _entered = span.enter();
        if let Some(observer) = &self.observer {
            observer.mount_finished(
                result.as_ref().map(|_| ()).map_err(MountError::kind),
                started.elapsed(),
            );
        }
        match result {
            Ok(response) => {
                tracing::info!(
                    code = "ok",
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "mount succeeded"
                );
                Ok(tonic::Response::new(response))
            }
            Err(err) => {
                tracing::warn!(
                    code = %err.kind(),
                    error = %err,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "mount failed"
                );
                Err(err.into())
            }
        }
    }
}

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
#[error("gRPC server failed")]
pub struct ServeError(#[source] tonic::transport::Error);

/// Serves `provider` on `listener` until `shutdown` completes, then stops accepting, lets
/// in-flight mounts finish for up to `grace`, and removes the socket if it is still ours.
///
/// Every connection goes through [`h2_authority::RewriteAuthority`], so clients that send
/// the socket path (grpc-go without `WithAuthority`: every driver before v1.6.0), a
/// percent-encoded path (grpc-core) or no authority are served as if they had sent
/// `localhost`.
pub async fn serve<S, F>(
    listener: Listener,
    provider: CsiProvider<S>,
    shutdown: F,
    grace: Duration,
) -> Result<(), ServeError>
where
    S: MountService,
    F: Future<Output = ()> + Send + 'static,
{
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        let _ = started_tx.send(());
        let _ = stop_rx.await;
    };
    // The server stops accepting as soon as `signal` resolves; `stop_tx` is dropped (which
    // resolves `stop_rx`) right away so graceful draining starts immediately.
    drop(stop_tx);
    // Request bodies are counted as they arrive, before tonic decodes them.
    let decoding = provider.decoding.clone();
    let router = tonic::transport::Server::builder()
        .layer(decoding)
        .add_service(provider.into_service());
    let listener_uids = listener.allowed_peer_uids;
    let (result, socket) = match listener.kind {
        ListenerKind::Unix {
            listener,
            path,
            identity,
        } => {
            let allowed = listener_uids;
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener)
                .filter(move |stream| {
                    std::future::ready(match (stream, &allowed) {
                        (Ok(stream), Some(uids)) => peer_allowed(stream, uids),
                        _ => true,
                    })
                })
                .map(|stream| stream.map(RewriteAuthority::new));
            let server = router.serve_with_incoming_shutdown(incoming, signal);
            (
                drain(server, started_rx, grace).await,
                Some((path, identity)),
            )
        }
        ListenerKind::Tcp(listener) => {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener)
                .map(|stream| stream.map(RewriteAuthority::new));
            let server = router.serve_with_incoming_shutdown(incoming, signal);
            (drain(server, started_rx, grace).await, None)
        }
    };
    if let Some((path, identity)) = socket {
        remove_own_socket(&path, identity);
    }
    result
}

/// Whether the peer of an accepted Unix connection may be served: its uid, as the kernel
/// recorded it at `connect(2)`, is one of `uids`. A peer whose credentials cannot be read
/// is refused too.
fn peer_allowed(stream: &tokio::net::UnixStream, uids: &[u32]) -> bool {
    match stream.peer_cred() {
        Ok(cred) if uids.contains(&cred.uid()) => true,
        Ok(cred) => {
            tracing::warn!(
                uid = cred.uid(),
                pid = cred.pid(),
                allowed = ?uids,
                "refused a connection to the provider's socket from uid {}: not in \
                 server.allowed_peer_uids",
                cred.uid()
            );
            false
        }
        Err(err) => {
            tracing::warn!(error = %err, "refused a connection whose peer credentials cannot be read");
            false
        }
    }
}

async fn drain(
    server: impl Future<Output = Result<(), tonic::transport::Error>>,
    shutdown_started: tokio::sync::oneshot::Receiver<()>,
    grace: Duration,
) -> Result<(), ServeError> {
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => return result.map_err(ServeError),
        started = shutdown_started => {
            if started.is_err() {
                // The shutdown future was dropped without completing: serve until the end.
                return server.await.map_err(ServeError);
            }
        }
    }
    match tokio::time::timeout(grace, &mut server).await {
        Ok(result) => result.map_err(ServeError),
        Err(_) => {
            tracing::warn!(?grace, "grace period over; abandoning in-flight mounts");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            parse_grpc_timeout("1500m"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in [
            "",
            "S",
            "123456789S",
            "10x",
            "-1S",
            "1.5S",
            "1\u{f67be}",
            "\u{e9}",
        ] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad}");
        }
    }
}
