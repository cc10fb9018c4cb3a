use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service};
use tracing::Instrument as _;

use super::BoxResponse;
use crate::error::TransportError;
use crate::exchange::authority;
use crate::stats::{ExchangeObserver, Outcome};

/// Put in a request's extensions to send it without a trace span (the trace exporter's
/// own requests).
#[derive(Clone, Copy, Debug, Default)]
pub struct Untraced;

/// A client span per exchange (method, host, status or error kind; never a header or a
/// body) and each exchange's outcome and duration to an [`ExchangeObserver`] (the metrics).
#[derive(Clone, Debug, Default)]
pub struct ObserveLayer {
    observer: Option<Arc<dyn ExchangeObserver>>,
}

impl ObserveLayer {
    /// Spans, and every outcome told to `observer` when there is one.
    pub fn new(observer: Option<Arc<dyn ExchangeObserver>>) -> Self {
        Self { observer }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            observer: self.observer.clone(),
        }
    }
}

/// The service of [`ObserveLayer`].
#[derive(Clone, Debug)]
pub struct Observe<S> {
    inner: S,
    observer: Option<Arc<dyn ExchangeObserver>>,
}

impl<S> Service<Request<Bytes>> for Observe<S>
where
    S: Service<Request<Bytes>, Response = Response<Bytes>, Error = TransportError>,
    S::Future: Send + 'static,
{
    type Response = Response<Bytes>;
    type Error = TransportError;
    type Future = BoxResponse;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), TransportError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Bytes>) -> BoxResponse {
        let authority = match authority(&request) {
            Ok(authority) => authority,
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let untraced = request.extensions().get::<Untraced>().is_some();
        let span = exchange_span(untraced, request.method(), &authority);
        let observer = self.observer.clone();
        let started = Instant::now();
        let exchange = span.in_scope(|| self.inner.call(request));
        Box::pin(async move {
            let result = exchange.instrument(span.clone()).await;
            report(&span, observer.as_deref(), &authority, &result, started);
            result
        })
    }
}

/// A client span per exchange, except for the trace exporter's own requests, which would
/// otherwise trace themselves.
fn exchange_span(untraced: bool, method: &http::Method, authority: &str) -> tracing::Span {
    if untraced {
        return tracing::Span::none();
    }
    tracing::info_span!(
        "upstream request",
        otel.kind = "client",
        http.request.method = %method,
        server.address = %authority,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    )
}

/// An exchange's outcome, on its span and to the observer.
fn report(
    span: &tracing::Span,
    observer: Option<&dyn ExchangeObserver>,
    authority: &str,
    result: &Result<Response<Bytes>, TransportError>,
    started: Instant,
) {
    let outcome = match result {
        Ok(response) => {
            span.record("http.response.status_code", response.status().as_u16());
            Outcome::Status(response.status().as_u16())
        }
        Err(err) => {
            span.record("error.type", format!("{:?}", err.kind()).as_str());
            Outcome::Failed(err.kind())
        }
    };
    if let Some(observer) = observer {
        observer.exchanged(authority, outcome, started.elapsed());
    }
}
