//! The plain-HTTP health and metrics servers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::metrics::Metrics;

/// What a server answers.
#[derive(Clone, Debug)]
pub(crate) enum Routes {
    /// `/health` and `/healthz` (alive), `/readyz` (`Version` answers on the socket).
    Health(Arc<crate::ready::Readiness>),
    /// `/metrics`.
    Metrics(Arc<Metrics>),
    /// `/debug/pprof/*` and `/debug/stats` (`--enable-pprof`).
    Debug(Arc<crate::debug::Debug>),
}

impl Routes {
    /// How long an answer may take.
    fn answer_timeout(&self) -> Duration {
        match self {
            Routes::Debug(debug) => debug.answer_timeout(),
            Routes::Health(_) | Routes::Metrics(_) => ANSWER_TIMEOUT,
        }
    }
}

pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// What the health and metrics servers allow each client, so that a neighbour pod cannot
/// hold them open against the kubelet's probes or Prometheus.
#[derive(Clone, Debug)]
pub(crate) struct HttpLimits {
    /// Connections open at once, from all clients.
    pub(crate) max_connections: usize,
    /// Connections open at once from one source address.
    pub(crate) max_connections_per_address: usize,
    /// How long a connection may take to send a request's headers, and stay idle
    /// between requests (hyper's header-read timeout restarts for every request).
    pub(crate) header_read_timeout: Duration,
}

/// Largest request head hyper buffers (hyper's minimum is 8 KiB).
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Longest an answer may take (readiness has its own 2 s; a scrape encodes in memory).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request body accepted; these servers only answer GET.
const MAX_BODY_BYTES: usize = 1024;

/// Open connections, in all and per source address.
#[derive(Debug, Default)]
struct Connections {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// One admitted connection; counted until dropped.
struct Admitted {
    table: Arc<Mutex<Connections>>,
    address: IpAddr,
}

fn admit(
    table: &Arc<Mutex<Connections>>,
    address: IpAddr,
    limits: &HttpLimits,
) -> Option<Admitted> {
    let mut connections = table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let from_address = connections.per_address.get(&address).copied().unwrap_or(0);
    if connections.total >= limits.max_connections
        || from_address >= limits.max_connections_per_address
    {
        return None;
    }
    connections.total += 1;
    connections.per_address.insert(address, from_address + 1);
    Some(Admitted {
        table: table.clone(),
        address,
    })
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut connections = self
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        connections.total = connections.total.saturating_sub(1);
        if let Some(count) = connections.per_address.get_mut(&self.address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                connections.per_address.remove(&self.address);
            }
        }
    }
}

fn answer<B>(routes: &Routes, request: &Request<B>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (routes, request.method(), request.uri().path()) {
        (_, m, _) if m != Method::GET && m != Method::HEAD => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n".to_owned(),
        ),
        (Routes::Health(_), _, "/health" | "/healthz") => {
            (StatusCode::OK, "text/plain", "ok\n".to_owned())
        }
        (Routes::Metrics(metrics), _, "/metrics") => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    };
    respond(status, content_type, body)
}

fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if let Ok(value) = http::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    response
}

/// `/readyz`: 200 when `Version` answers on the provider's own socket (cached ~1 s).
async fn readyz(ready: &crate::ready::Readiness) -> Response<Full<Bytes>> {
    match ready.check().await {
        Ok(()) => respond(StatusCode::OK, "text/plain", "ready\n".to_owned()),
        Err(why) => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("not ready: {why}\n"),
        ),
    }
}

/// Serves `routes` until `stop` turns true, within `limits`: a connection beyond the
/// caps is closed at once, one that is slow to send its headers or idle for longer than
/// the header-read timeout is closed by hyper, and request heads and bodies are bounded.
pub(crate) async fn serve(
    listener: TcpListener,
    routes: Routes,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
) {
    let table = Arc::new(Mutex::new(Connections::default()));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::debug!(error = %err, "health server accept failed");
                continue;
            }
        };
        let Some(admitted) = admit(&table, peer.ip(), &limits) else {
            tracing::debug!(peer = %peer.ip(), "health server connection over the limits; closed");
            drop(stream);
            continue;
        };
        let routes = routes.clone();
        let answer_timeout = routes.answer_timeout();
        // A debug span per request (method, URI, status, latency; never headers), a bound
        // on each answer's time, and on the body.
        let service = ServiceBuilder::new()
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(
                        tower_http::trace::DefaultMakeSpan::new().include_headers(false),
                    )
                    // A 503 from /readyz during start is expected, not an error.
                    .on_failure(
                        tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
                    ),
            )
            .layer(TimeoutLayer::with_status_code(
                StatusCode::SERVICE_UNAVAILABLE,
                answer_timeout,
            ))
            .layer(RequestBodyLimitLayer::new(MAX_BODY_BYTES))
            .service_fn(move |request: Request<_>| {
                let routes = routes.clone();
                async move {
                    let response = match (&routes, request.uri().path()) {
                        (Routes::Health(ready), "/readyz")
                            if request.method() == Method::GET
                                || request.method() == Method::HEAD =>
                        {
                            readyz(ready).await
                        }
                        (Routes::Debug(debug), path) if request.method() == Method::GET => {
                            let (status, content_type, body) =
                                debug.answer(path, request.uri().query()).await;
                            respond(status, content_type, body)
                        }
                        _ => answer(&routes, &request),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
        let mut stop = stop.clone();
        let header_read_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let _admitted = admitted;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            tokio::select! {
                _ = connection => {}
                _ = stop.wait_for(|stop| *stop) => {}
            }
        });
    }
}
