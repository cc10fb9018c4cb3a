//! The innermost service of the transport: one exchange over the pool, its body read whole
//! under a cap.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use tower::Service;

use crate::connector::{Connector, authority_of};
use crate::error::TransportError;
use crate::stats::Stats;

/// A request extension: read at most this many bytes of the answer's body (less than the
/// configured `max_response_bytes`, for callers that know their answers are small and
/// account for the buffer, as the Secrets client does).
#[derive(Clone, Copy, Debug)]
pub struct MaxBodyBytes(pub usize);

/// One exchange over the process's pool: a pooled (or new, within the per-host connection
/// bound) connection, the request sent, the body read whole up to the smaller of
/// `max_response_bytes` and the request's [`MaxBodyBytes`]. No timeout, no request bound:
/// those are the layers above it ([`crate::TimeoutLayer`], [`crate::HostLimitLayer`]).
/// Clones share the pool.
#[derive(Clone, Debug)]
pub struct Exchange {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client<Connector, Full<Bytes>>,
    stats: Stats,
    max_response_bytes: usize,
}

impl Exchange {
    pub(crate) fn new(
        client: Client<Connector, Full<Bytes>>,
        stats: Stats,
        max_response_bytes: usize,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                stats,
                max_response_bytes,
            }),
        }
    }

    async fn send(self, request: Request<Bytes>) -> Result<Response<Bytes>, TransportError> {
        let authority = authority(&request)?;
        self.inner.stats.request(&authority);
        let limit = match request.extensions().get::<MaxBodyBytes>() {
            Some(MaxBodyBytes(requested)) => (*requested).min(self.inner.max_response_bytes),
            None => self.inner.max_response_bytes,
        };
        let response = self
            .inner
            .client
            .request(request.map(Full::new))
            .await
            .map_err(|e| classify(&authority, e))?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, limit).collect().await.map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                TransportError::TooLarge {
                    authority: authority.clone(),
                    limit,
                }
            } else {
                TransportError::Http {
                    authority: authority.clone(),
                    source: e,
                }
            }
        })?;
        Ok(Response::from_parts(parts, body.to_bytes()))
    }
}

impl Service<Request<Bytes>> for Exchange {
    type Response = Response<Bytes>;
    type Error = TransportError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Bytes>, TransportError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), TransportError>> {
        // The pool is always ready: a request waits for its connection in its own future,
        // where the per-host connection bound applies.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        Box::pin(self.clone().send(request))
    }
}

/// The request's `host:port`, the key of every per-host bound, counter and span; a request
/// without an absolute http(s) URI is refused before anything is sent.
pub(crate) fn authority<B>(request: &Request<B>) -> Result<String, TransportError> {
    let uri = request.uri();
    authority_of(uri).ok_or_else(|| TransportError::InvalidUri {
        uri: format!(
            "{}://{}{}",
            uri.scheme_str().unwrap_or(""),
            uri.authority().map(|a| a.as_str()).unwrap_or(""),
            uri.path()
        ),
        reason: "an absolute http or https URI is required",
    })
}

fn classify(authority: &str, error: hyper_util::client::legacy::Error) -> TransportError {
    let authority = authority.to_owned();
    if error.is_connect() {
        TransportError::Connect {
            authority,
            source: Box::new(error),
        }
    } else {
        TransportError::Http {
            authority,
            source: Box::new(error),
        }
    }
}
