//! Listeners, connection accounting, TLS, HTTP serving and fault application.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use crate::faults::{Fault, FaultPlan};
use crate::state::Shared;
use crate::stats::Endpoint;
use crate::{handlers, oci_error};

/// Largest request body the emulator reads.
const MAX_BODY: usize = 1 << 20;

/// A reply built by a handler, before faults that shape the wire are applied.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn json(status: StatusCode, value: &serde_json::Value) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: Bytes::from(value.to_string()),
        }
    }

    pub(crate) fn text(status: StatusCode, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers: vec![("content-type", "text/plain".into())],
            body: body.into(),
        }
    }

    pub(crate) fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

/// Per-connection activity, used to close idle keep-alive connections.
#[derive(Debug, Default)]
struct Activity {
    in_flight: AtomicUsize,
    changed: Notify,
}

struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(a: &Arc<Activity>) -> Self {
        a.in_flight.fetch_add(1, Ordering::SeqCst);
        a.changed.notify_waiters();
        Self(a.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// The response body: whole, or streamed from a task (for mid-response faults).
pub(crate) struct ReplyBody {
    kind: BodyKind,
    _in_flight: Option<InFlight>,
}

impl std::fmt::Debug for ReplyBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyBody")
    }
}

enum BodyKind {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Result<Bytes, std::io::Error>>),
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match &mut self.kind {
            BodyKind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            BodyKind::Channel(rx) => rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(&self.kind, BodyKind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            BodyKind::Full(None) => SizeHint::with_exact(0),
            BodyKind::Channel(_) => SizeHint::default(),
        }
    }
}

/// Resolves when the emulator shuts down.
async fn until_shutdown(shared: &Shared) {
    let mut rx = shared.shutdown.subscribe();
    let _ = rx.wait_for(|s| *s).await;
}

/// Binds 127.0.0.1 on an ephemeral port.
pub(crate) async fn bind() -> std::io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", 0)).await
}

/// Decrements the open-connection gauge when the connection task ends, even by panic.
struct OpenGuard {
    shared: Arc<Shared>,
    endpoint: Endpoint,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.shared
            .counters
            .listener(self.endpoint, |l| l.open = l.open.saturating_sub(1));
    }
}

/// Accepts connections until shutdown.
pub(crate) async fn serve(shared: Arc<Shared>, endpoint: Endpoint, listener: TcpListener) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _peer)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                shared.counters.listener(endpoint, |l| {
                    l.accepted += 1;
                    l.open += 1;
                    l.high_water = l.high_water.max(l.open);
                });
                let open = OpenGuard { shared: shared.clone(), endpoint };
                tokio::spawn(async move {
                    connection(open.shared.clone(), endpoint, tcp).await;
                    drop(open);
                });
            }
            _ = until_shutdown(&shared) => return,
        }
    }
}

async fn connection(shared: Arc<Shared>, endpoint: Endpoint, tcp: tokio::net::TcpStream) {
    let activity = Arc::new(Activity::default());
    if endpoint.is_tls() {
        let config = if shared.state().http1_only.contains(&endpoint) {
            shared.pki.tls_h1.clone()
        } else {
            shared.pki.tls_h2.clone()
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await;
        let tls = match handshake {
            Ok(Ok(tls)) => tls,
            _ => {
                shared
                    .counters
                    .listener(endpoint, |l| l.tls_handshake_failures += 1);
                return;
            }
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        shared.counters.listener(endpoint, |l| {
            l.tls_handshakes += 1;
            if h2 {
                l.http2_connections += 1;
            }
        });
        serve_http(shared, endpoint, TokioIo::new(tls), h2, activity).await;
    } else {
        serve_http(shared, endpoint, TokioIo::new(tcp), false, activity).await;
    }
}

async fn serve_http<I>(
    shared: Arc<Shared>,
    endpoint: Endpoint,
    io: I,
    h2: bool,
    activity: Arc<Activity>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = {
        let shared = shared.clone();
        let activity = activity.clone();
        service_fn(move |req| {
            let shared = shared.clone();
            let in_flight = InFlight::new(&activity);
            async move { Ok::<_, Infallible>(dispatch(shared, endpoint, req, in_flight).await) }
        })
    };
    if h2 {
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(io, svc);
        let mut conn = std::pin::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = idle(&shared, endpoint, &activity) => {
                shared.counters.listener(endpoint, |l| l.idle_closed += 1);
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            _ = until_shutdown(&shared) => {}
        }
    } else {
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .keep_alive(true)
            .serve_connection(io, svc);
        let mut conn = std::pin::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = idle(&shared, endpoint, &activity) => {
                shared.counters.listener(endpoint, |l| l.idle_closed += 1);
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            _ = until_shutdown(&shared) => {}
        }
    }
}

/// Resolves when the connection has had no request in flight for the endpoint's idle timeout.
async fn idle(shared: &Shared, endpoint: Endpoint, activity: &Activity) {
    let mut settings = shared.settings_changed.subscribe();
    let mut idle_since = Instant::now();
    loop {
        let changed = activity.changed.notified();
        let settings_changed = settings.changed();
        let timeout = shared.state().idle_timeout.get(&endpoint).copied();
        let busy = activity.in_flight.load(Ordering::SeqCst) > 0;
        if busy {
            idle_since = Instant::now();
        }
        match timeout {
            Some(t) if !busy => {
                tokio::select! {
                    _ = tokio::time::sleep_until(idle_since + t) => {
                        if activity.in_flight.load(Ordering::SeqCst) == 0 {
                            return;
                        }
                    }
                    _ = changed => { idle_since = Instant::now(); }
                    _ = settings_changed => {}
                }
            }
            _ => {
                tokio::select! {
                    _ = changed => { idle_since = Instant::now(); }
                    _ = settings_changed => {}
                }
            }
        }
    }
}

fn request_id(parts: &http::request::Parts) -> String {
    parts
        .headers
        .get("opc-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| crate::crypto::random_hex(16).to_ascii_uppercase())
}

/// Waits while `rx` holds `true`, counting the request as held.
async fn hold_while(shared: &Shared, endpoint: Endpoint, mut rx: watch::Receiver<bool>) {
    if !*rx.borrow() {
        return;
    }
    shared
        .counters
        .update(|s| *s.held.entry(endpoint).or_default() += 1);
    tokio::select! {
        _ = async { let _ = rx.wait_for(|closed| !*closed).await; } => {}
        _ = until_shutdown(shared) => {}
    }
    shared.counters.update(|s| {
        let h = s.held.entry(endpoint).or_default();
        *h = h.saturating_sub(1);
    });
}

/// Waits until the next `release_stalls`.
async fn stall(shared: &Shared, endpoint: Endpoint) {
    let mut rx = shared.stall_release.subscribe();
    rx.borrow_and_update();
    shared
        .counters
        .update(|s| *s.held.entry(endpoint).or_default() += 1);
    tokio::select! {
        _ = rx.changed() => {}
        _ = until_shutdown(shared) => {}
    }
    shared.counters.update(|s| {
        let h = s.held.entry(endpoint).or_default();
        *h = h.saturating_sub(1);
    });
}

async fn dispatch(
    shared: Arc<Shared>,
    endpoint: Endpoint,
    req: Request<Incoming>,
    in_flight: InFlight,
) -> Response<ReplyBody> {
    shared
        .counters
        .update(|s| *s.arrived.entry(endpoint).or_default() += 1);
    let (parts, body) = req.into_parts();
    let rid = request_id(&parts);
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            let reply = oci_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestTooLarge",
                "body too large",
            );
            return finish(&shared, endpoint, reply, &rid, Fault::Pass, in_flight);
        }
    };
    let document = issuer_document(endpoint, parts.uri.path());
    if let Some(document) = document {
        shared.counters.update(|s| match document {
            IssuerDocument::Discovery => s.issuer_discovery_requests += 1,
            IssuerDocument::Jwks => s.jwks_requests += 1,
        });
    }
    let fault = {
        let mut state = shared.state();
        let by_host = host(&parts).and_then(|host| {
            state
                .host_faults
                .get_mut(&(endpoint, host))
                .and_then(FaultPlan::scheduled)
        });
        match (document, by_host) {
            (Some(_), _) => state.issuer_faults.next(),
            (None, Some(fault)) => fault,
            (None, None) => state.faults.entry(endpoint).or_default().next(),
        }
    };

    if let Some(gate) = shared.gates.get(&endpoint) {
        hold_while(&shared, endpoint, gate.subscribe()).await;
    }
    match &fault {
        Fault::Latency(d) => tokio::time::sleep(*d).await,
        Fault::StallBeforeHeaders => stall(&shared, endpoint).await,
        _ => {}
    }
    let reply = match &fault {
        Fault::Status(s) => {
            let status = StatusCode::from_u16(*s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            oci_error(status, Fault::default_code(*s), "injected fault")
        }
        Fault::Error {
            status,
            code,
            message,
        } => oci_error(
            StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code,
            message,
        ),
        Fault::TooManyRequests { retry_after_secs } => oci_error(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "too many requests",
        )
        .header("retry-after", retry_after_secs.to_string()),
        Fault::NonJsonError(s) => Reply::text(
            StatusCode::from_u16(*s).unwrap_or(StatusCode::BAD_GATEWAY),
            "<html><body>upstream error</body></html>",
        )
        .header("content-type", "text/html"),
        Fault::Body(b) => {
            Reply::json(StatusCode::OK, &serde_json::Value::Null).with_body(b.clone())
        }
        Fault::OAuth { status, error } => Reply::json(
            StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST),
            &serde_json::json!({"error": error, "error_description": "injected fault"}),
        ),
        _ => handlers::handle(&shared, endpoint, &parts, &body, &rid).await,
    };
    let reply = match &fault {
        Fault::MissingSecretId => mutate(reply, |v| {
            if let Some(o) = v.as_object_mut() {
                o.remove("secretId");
            }
        }),
        Fault::MissingVersionNumber => mutate(reply, |v| {
            if let Some(o) = v.as_object_mut() {
                o.remove("versionNumber");
            }
        }),
        Fault::UnknownContentType => mutate(reply, |v| {
            if let Some(c) = v
                .get_mut("secretBundleContent")
                .and_then(|c| c.as_object_mut())
            {
                c.insert("contentType".into(), "SOMETHING_ELSE".into());
            }
        }),
        _ => reply,
    };
    finish(&shared, endpoint, reply, &rid, fault, in_flight)
}

/// The host name a request was sent to (HTTP/2's `:authority`, else `Host`), without the
/// port: which region's name of the listener the client used.
fn host(parts: &http::request::Parts) -> Option<String> {
    let authority = match parts.uri.authority() {
        Some(authority) => authority.clone(),
        None => parts
            .headers
            .get(http::header::HOST)?
            .to_str()
            .ok()?
            .parse()
            .ok()?,
    };
    Some(authority.host().to_owned())
}

/// One of the service-account issuer's documents the Kubernetes endpoint serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IssuerDocument {
    /// `/.well-known/openid-configuration`.
    Discovery,
    /// `/openid/v1/jwks`.
    Jwks,
}

/// Which issuer document a request is for, if any: these have their own counters and
/// faults.
pub(crate) fn issuer_document(endpoint: Endpoint, path: &str) -> Option<IssuerDocument> {
    match (endpoint, path) {
        (Endpoint::Kube, "/.well-known/openid-configuration") => Some(IssuerDocument::Discovery),
        (Endpoint::Kube, "/openid/v1/jwks") => Some(IssuerDocument::Jwks),
        _ => None,
    }
}

impl Reply {
    fn with_body(mut self, body: String) -> Self {
        self.body = Bytes::from(body);
        self
    }
}

fn mutate(reply: Reply, f: impl FnOnce(&mut serde_json::Value)) -> Reply {
    if !reply.status.is_success() {
        return reply;
    }
    match serde_json::from_slice::<serde_json::Value>(&reply.body) {
        Ok(mut v) => {
            f(&mut v);
            Reply {
                body: Bytes::from(v.to_string()),
                ..reply
            }
        }
        Err(_) => reply,
    }
}

fn finish(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    reply: Reply,
    rid: &str,
    fault: Fault,
    in_flight: InFlight,
) -> Response<ReplyBody> {
    shared.counters.update(|s| {
        *s.responses
            .entry(endpoint)
            .or_default()
            .entry(reply.status.as_u16())
            .or_default() += 1;
    });
    let len = reply.body.len();
    let kind = match fault {
        Fault::DropMidResponse => {
            let (tx, rx) = mpsc::channel(2);
            let half = reply.body.slice(..len / 2);
            tokio::spawn(async move {
                let _ = tx.send(Ok(half)).await;
                let _ = tx
                    .send(Err(std::io::Error::other("injected connection drop")))
                    .await;
            });
            BodyKind::Channel(rx)
        }
        Fault::StallAfterHeaders => {
            let (tx, rx) = mpsc::channel(1);
            let body = reply.body.clone();
            let shared = shared.clone();
            tokio::spawn(async move {
                stall(&shared, endpoint).await;
                let _ = tx.send(Ok(body)).await;
            });
            BodyKind::Channel(rx)
        }
        _ => BodyKind::Full(if len == 0 { None } else { Some(reply.body) }),
    };
    let streamed = matches!(&kind, BodyKind::Channel(_));
    let mut resp = Response::new(ReplyBody {
        kind,
        _in_flight: Some(in_flight),
    });
    *resp.status_mut() = reply.status;
    let h = resp.headers_mut();
    for (name, value) in reply.headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(rid) {
        h.insert("opc-request-id", v);
    }
    // Streamed bodies announce their full length so a client notices the truncation.
    if streamed {
        h.insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    resp
}
