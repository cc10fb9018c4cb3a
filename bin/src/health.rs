//! The plain-HTTP health and metrics servers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;

/// What a server answers.
#[derive(Clone, Debug)]
pub(crate) enum Routes {
    /// `/health` and `/healthz` (alive), `/readyz` (serving the socket).
    Health(Arc<AtomicBool>),
    /// `/metrics`.
    Metrics(Arc<Metrics>),
}

pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

fn answer(routes: &Routes, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (routes, request.method(), request.uri().path()) {
        (_, m, _) if m != Method::GET && m != Method::HEAD => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n".to_owned(),
        ),
        (Routes::Health(_), _, "/health" | "/healthz") => {
            (StatusCode::OK, "text/plain", "ok\n".to_owned())
        }
        (Routes::Health(ready), _, "/readyz") => {
            if ready.load(Ordering::SeqCst) {
                (StatusCode::OK, "text/plain", "ready\n".to_owned())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "not serving the provider socket\n".to_owned(),
                )
            }
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
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = http::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    response
}

/// Serves `routes` until `stop` turns true.
pub(crate) async fn serve(listener: TcpListener, routes: Routes, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let (stream, _) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::debug!(error = %err, "health server accept failed");
                continue;
            }
        };
        let routes = routes.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let response = answer(&routes, &request);
            async move { Ok::<_, Infallible>(response) }
        });
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                _ = stop.wait_for(|stop| *stop) => {}
            }
        });
    }
}
