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
use tokio::sync::{oneshot, watch};
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
    /// `/metrics`, rendered at most once a second.
    Metrics(Arc<Metrics>, Arc<MetricsRender>),
    /// `/debug/pprof/*` and `/debug/stats` (`--enable-pprof`).
    Debug(Arc<crate::debug::Debug>),
}

impl Routes {
    /// How long an answer may take.
    fn answer_timeout(&self) -> Duration {
        match self {
            Routes::Debug(debug) => debug.answer_timeout(),
            Routes::Health(_) | Routes::Metrics(..) => ANSWER_TIMEOUT,
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

/// Open connections, in all and per source address, each with a way to close it.
#[derive(Debug, Default)]
struct Connections {
    total: usize,
    next_id: u64,
    per_address: HashMap<IpAddr, Vec<(u64, oneshot::Sender<()>)>>,
}

/// One admitted connection; counted until dropped or evicted.
struct Admitted {
    table: Arc<Mutex<Connections>>,
    address: IpAddr,
    id: u64,
}

/// Admits a connection from `address` within the caps. When all `max_connections` are
/// taken, an address holding fewer than the heaviest one still gets in: the heaviest
/// address's newest connection is closed for it. So neighbours that each hold their
/// per-address maximum (and keep them busy) can fill the server, but never keep out the
/// kubelet's probe or Prometheus, which hold one or two.
fn admit(
    table: &Arc<Mutex<Connections>>,
    address: IpAddr,
    limits: &HttpLimits,
) -> Option<(Admitted, oneshot::Receiver<()>)> {
    let mut connections = table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let from_address = connections.per_address.get(&address).map_or(0, Vec::len);
    if from_address >= limits.max_connections_per_address {
        return None;
    }
    if connections.total >= limits.max_connections {
        let heaviest = connections
            .per_address
            .iter()
            .max_by_key(|(_, held)| held.len())
            .map(|(a, held)| (*a, held.len()))?;
        if heaviest.1 <= from_address + 1 {
            return None;
        }
        let held = connections.per_address.get_mut(&heaviest.0)?;
        let (_, evict) = held.pop()?;
        let _ = evict.send(());
        connections.total -= 1;
        tracing::debug!(
            evicted = %heaviest.0,
            admitted = %address,
            "health server full: closed the newest connection of the busiest address"
        );
    }
    let id = connections.next_id;
    connections.next_id += 1;
    let (evict, evicted) = oneshot::channel();
    connections.total += 1;
    connections
        .per_address
        .entry(address)
        .or_default()
        .push((id, evict));
    Some((
        Admitted {
            table: table.clone(),
            address,
            id,
        },
        evicted,
    ))
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut connections = self
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(held) = connections.per_address.get_mut(&self.address) else {
            return;
        };
        // An evicted connection was uncounted when it was evicted.
        let before = held.len();
        held.retain(|(id, _)| *id != self.id);
        let removed = before - held.len();
        if held.is_empty() {
            connections.per_address.remove(&self.address);
        }
        connections.total = connections.total.saturating_sub(removed);
    }
}

/// `/metrics` rendered at most once per `RENDER_EVERY`: scrapes within it share the last
/// rendering, so a neighbour scraping in a loop costs one encoding a second, not one per
/// request (Prometheus scrapes every 15 s or more and never sees the difference).
#[derive(Debug, Default)]
pub(crate) struct MetricsRender {
    last: Mutex<Option<(tokio::time::Instant, Bytes)>>,
}

/// How long a rendering of `/metrics` is served again.
const RENDER_EVERY: Duration = Duration::from_secs(1);

impl MetricsRender {
    fn get(&self, render: impl FnOnce() -> String) -> Bytes {
        self.get_at(tokio::time::Instant::now(), render)
    }

    fn get_at(&self, now: tokio::time::Instant, render: impl FnOnce() -> String) -> Bytes {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, body)) = &*last
            && now.duration_since(*at) < RENDER_EVERY
        {
            return body.clone();
        }
        let body = Bytes::from(render());
        *last = Some((now, body.clone()));
        body
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
        (Routes::Metrics(metrics, render), _, "/metrics") => {
            return respond(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                render.get(|| metrics.encode()),
            );
        }
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

/// The answer to one request of a health, metrics or debug server.
async fn route<B>(
    routes: Routes,
    request: Request<B>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let response = match (&routes, request.uri().path()) {
        (Routes::Health(ready), "/readyz")
            if request.method() == Method::GET || request.method() == Method::HEAD =>
        {
            readyz(ready).await
        }
        (Routes::Debug(debug), path) if request.method() == Method::GET => {
            let (status, content_type, body) = debug.answer(path, request.uri().query()).await;
            respond(status, content_type, body)
        }
        _ => answer(&routes, &request),
    };
    Ok(response)
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
        let Some((admitted, evicted)) = admit(&table, peer.ip(), &limits) else {
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
            .service_fn(move |request: Request<_>| route(routes.clone(), request));
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
                _ = evicted => {}
                _ = stop.wait_for(|stop| *stop) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_rendered_at_most_once_a_second_however_often_scraped() {
        let render = MetricsRender::default();
        let renders = std::cell::Cell::new(0);
        let encode = |body: &str| {
            renders.set(renders.get() + 1);
            body.to_owned()
        };
        let start = tokio::time::Instant::now();
        for i in 0..1000 {
            let at = start + RENDER_EVERY * i / 1000;
            assert_eq!(render.get_at(at, || encode("a")), "a");
        }
        assert_eq!(renders.get(), 1);
        assert_eq!(render.get_at(start + RENDER_EVERY, || encode("b")), "b");
        assert_eq!(renders.get(), 2);
    }

    #[test]
    fn a_full_server_still_admits_an_address_lighter_than_the_busiest() {
        let table = Arc::new(Mutex::new(Connections::default()));
        let limits = HttpLimits {
            max_connections: 4,
            max_connections_per_address: 2,
            header_read_timeout: Duration::from_secs(5),
        };
        let neighbour = |i: u8| IpAddr::from([127, 0, 0, i]);
        let mut held = Vec::new();
        for i in [2, 2, 3, 3] {
            held.push(admit(&table, neighbour(i), &limits).unwrap());
        }
        // Full. A third from 127.0.0.2 is over its own cap; the kubelet, holding none, gets
        // in by evicting one connection of a busiest address (two connections).
        assert!(admit(&table, neighbour(2), &limits).is_none());
        let (kubelet, _) = admit(&table, neighbour(1), &limits).unwrap();
        let evicted = held
            .iter_mut()
            .filter_map(|(_, evicted)| evicted.try_recv().ok())
            .count();
        assert_eq!(evicted, 1, "one connection of a busiest address was closed");
        assert_eq!(table.lock().unwrap().total, 4, "the bound holds");
        // Two addresses of one connection each, and one of two: a second from the kubelet
        // would not be lighter than the busiest after it, so it is refused.
        assert!(admit(&table, neighbour(1), &limits).is_none());
        drop(kubelet);
        drop(held);
        assert_eq!(table.lock().unwrap().total, 0);
        assert!(table.lock().unwrap().per_address.is_empty());
    }
}
