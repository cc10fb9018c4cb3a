//! The failover region as a layer: an entry whose primary region fails in a way that fails
//! over (a connection error, 5xx, 429 after retries, a timeout; never 400, 401, 403 or
//! 404) is read from the failover region the class names.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use tower::{Layer, Service, ServiceExt as _};

use crate::layers::budget::Refused;

/// An entry's request to its primary region and, when the class and the entry name one,
/// to its failover region (`id`, the region's id for logs).
#[derive(Debug)]
pub struct WithFailover<R> {
    /// The primary region's request.
    pub primary: R,
    /// The failover region's id and request.
    pub failover: Option<(String, R)>,
}

/// Which region answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServedBy {
    /// The primary region.
    Primary,
    /// The failover region, after the primary failed over.
    Failover,
}

impl ServedBy {
    /// The span and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ServedBy::Primary => "primary",
            ServedBy::Failover => "failover",
        }
    }
}

/// Entries served by the primary and by the failover region, since start.
#[derive(Debug, Default)]
pub struct RegionStats {
    /// Served by the primary region.
    pub primary: AtomicU64,
    /// Served by the failover region.
    pub failover: AtomicU64,
}

/// Whether a failure of the primary region sends the entry to the failover region.
pub(crate) fn fails_over(err: &vault::VaultError) -> bool {
    matches!(
        err.kind(),
        auth::ErrorKind::Unavailable
            | auth::ErrorKind::ResourceExhausted
            | auth::ErrorKind::DeadlineExceeded
    )
}

/// Reads the failover region when the primary fails over, counting which region served
/// into `stats` and recording it as `region` on the caller's span. A refusal of the byte
/// budget or of the mount's size never fails over.
#[derive(Clone, Debug, Default)]
pub struct FailoverLayer {
    stats: Arc<RegionStats>,
}

impl FailoverLayer {
    /// Counts into `stats`.
    pub fn new(stats: Arc<RegionStats>) -> Self {
        Self { stats }
    }
}

impl<S> Layer<S> for FailoverLayer {
    type Service = Failover<S>;

    fn layer(&self, inner: S) -> Failover<S> {
        Failover {
            inner,
            stats: self.stats.clone(),
        }
    }
}

/// The service of [`FailoverLayer`].
#[derive(Clone, Debug)]
pub struct Failover<S> {
    inner: S,
    stats: Arc<RegionStats>,
}

impl<S, R, T> Service<WithFailover<R>> for Failover<S>
where
    S: Service<R, Response = T, Error = Refused<vault::VaultError>> + Clone + Send + 'static,
    S::Future: Send,
    R: Send + 'static,
    T: Send + 'static,
{
    type Response = (T, ServedBy);
    type Error = Refused<vault::VaultError>;
    type Future = BoxFuture<'static, Result<(T, ServedBy), Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: WithFailover<R>) -> Self::Future {
        // The service for the failover region only when the entry has one.
        let second = request.failover.as_ref().map(|_| self.inner.clone());
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let stats = self.stats.clone();
        Box::pin(async move {
            let WithFailover { primary, failover } = request;
            let (answer, served) = match (ready.call(primary).await, failover.zip(second)) {
                (Err(Refused::Failed(err)), Some(((region, again), clone))) if fails_over(&err) => {
                    tracing::warn!(
                        %region,
                        error = %crate::failure::chain(&err),
                        "the primary region failed; reading the failover region"
                    );
                    let answer = clone.oneshot(again).await;
                    if answer.is_ok() {
                        tracing::info!(%region, "served by the failover region");
                    }
                    (answer, ServedBy::Failover)
                }
                (answer, _) => (answer, ServedBy::Primary),
            };
            // The caller's span (an entry's fetch) says which region was read last.
            tracing::Span::current().record("region", served.as_str());
            let value = answer?;
            let counter = match served {
                ServedBy::Primary => &stats.primary,
                ServedBy::Failover => &stats.failover,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            Ok((value, served))
        })
    }
}
