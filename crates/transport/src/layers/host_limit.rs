use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower::{Layer, Service, ServiceExt as _};

use super::BoxResponse;
use crate::connector::Permits;
use crate::error::TransportError;
use crate::exchange::authority;

/// Bounds the requests in flight to each host (`host:port`), so a storm waits here for a
/// permit instead of queueing connects in the pool. With the pool's bound on connections
/// per host (a permit each connection holds for its life, in the connector), no number of
/// mounts, identities or failures opens more sockets to a host than configured.
///
/// The permits are shared by every service this layer makes (and their clones): build the
/// layer once per process.
#[derive(Clone, Debug)]
pub struct HostLimitLayer {
    permits: Permits,
}

impl HostLimitLayer {
    /// At most `per_host` requests in flight to any one host (at least 1).
    pub fn new(per_host: usize) -> Self {
        Self {
            permits: Permits::new(per_host),
        }
    }
}

impl<S> Layer<S> for HostLimitLayer {
    type Service = HostLimit<S>;

    fn layer(&self, inner: S) -> HostLimit<S> {
        HostLimit {
            inner,
            permits: self.permits.clone(),
        }
    }
}

/// The service of [`HostLimitLayer`].
#[derive(Clone, Debug)]
pub struct HostLimit<S> {
    inner: S,
    permits: Permits,
}

impl<S> Service<Request<Bytes>> for HostLimit<S>
where
    S: Service<Request<Bytes>, Response = Response<Bytes>, Error = TransportError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Bytes>;
    type Error = TransportError;
    type Future = BoxResponse;

    // Readiness is per request: which host's permit a request needs is in its URI, so the
    // service is always ready and each call waits for its host's permit (then for the
    // inner service) in its own future.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), TransportError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Bytes>) -> BoxResponse {
        let authority = match authority(&request) {
            Ok(authority) => authority,
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let host = self.permits.of(&authority);
        let inner = self.inner.clone();
        Box::pin(async move {
            let _permit = host
                .acquire_owned()
                .await
                .map_err(|e| TransportError::Http {
                    authority,
                    source: Box::new(e),
                })?;
            inner.oneshot(request).await
        })
    }
}
