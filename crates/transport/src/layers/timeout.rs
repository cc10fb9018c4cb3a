use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service};

use super::BoxResponse;
use crate::error::TransportError;
use crate::exchange::authority;

/// A request extension: the exchange must be over by then (e.g. the mount's deadline).
/// The earlier of this and the configured request timeout applies.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub Instant);

/// Bounds every exchange (the wait for a request permit, connecting, sending and reading
/// the whole body) by `request_timeout`, or by the request's [`Deadline`] when earlier.
#[derive(Clone, Copy, Debug)]
pub struct TimeoutLayer {
    request_timeout: Duration,
}

impl TimeoutLayer {
    /// Exchanges end with [`TransportError::Timeout`] after `request_timeout`.
    pub fn new(request_timeout: Duration) -> Self {
        Self { request_timeout }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout {
            inner,
            request_timeout: self.request_timeout,
        }
    }
}

/// The service of [`TimeoutLayer`].
#[derive(Clone, Debug)]
pub struct Timeout<S> {
    inner: S,
    request_timeout: Duration,
}

impl<S> Service<Request<Bytes>> for Timeout<S>
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
        let now = Instant::now();
        let mut deadline = now + self.request_timeout;
        if let Some(Deadline(requested)) = request.extensions().get::<Deadline>() {
            deadline = deadline.min(*requested);
        }
        let after = deadline.saturating_duration_since(now);
        let exchange = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout_at(deadline, exchange).await {
                Ok(result) => result,
                Err(_) => Err(TransportError::Timeout { authority, after }),
            }
        })
    }
}
