//! The cache as a tower layer: requests that name their own key are answered from the
//! cache or by the inner service, one inner call per key at a time.

use std::fmt;
use std::hash::Hash;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use tower::{Layer, Service, ServiceExt};

use crate::{Cache, CacheValue, JoinError, Lookup};

/// A request that can be answered from a cache: its key, and its deadline.
///
/// The key must contain everything the answer depends on, the credential the request is
/// made with included: two requests with one key get one answer.
pub trait CacheKey {
    /// The key type.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;

    /// This request's key.
    fn cache_key(&self) -> Self::Key;

    /// When the caller stops waiting.
    fn deadline(&self) -> tokio::time::Instant;
}

/// An answer of a [`CacheService`]: the inner service's response, and where it came from.
#[derive(Clone, Debug)]
pub struct Cached<V> {
    /// The response (a clone of the cached one on a hit).
    pub value: V,
    /// Whether it was a hit, this request's own call, or another request's call joined.
    pub lookup: Lookup,
}

/// Puts a [`Cache`] in front of a service.
pub struct CacheLayer<K, V> {
    cache: Cache<K, V>,
}

impl<K, V> CacheLayer<K, V> {
    /// A layer answering from `cache`.
    pub fn new(cache: Cache<K, V>) -> Self {
        Self { cache }
    }
}

impl<K, V> Clone for CacheLayer<K, V> {
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.clone(),
        }
    }
}

impl<K, V> fmt::Debug for CacheLayer<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheLayer").finish_non_exhaustive()
    }
}

impl<S, K, V> Layer<S> for CacheLayer<K, V> {
    type Service = CacheService<S, K, V>;

    fn layer(&self, inner: S) -> Self::Service {
        CacheService {
            inner: std::sync::Arc::new(inner),
            cache: self.cache.clone(),
        }
    }
}

/// The service [`CacheLayer`] builds. Always ready: the inner service is driven to
/// readiness by whichever request calls it.
pub struct CacheService<S, K, V> {
    // Shared: a hit never calls it, so a call copies it (a fetch stack of boxed services)
    // only when it misses.
    inner: std::sync::Arc<S>,
    cache: Cache<K, V>,
}

impl<S, K, V> Clone for CacheService<S, K, V> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            cache: self.cache.clone(),
        }
    }
}

impl<S, K, V> fmt::Debug for CacheService<S, K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheService").finish_non_exhaustive()
    }
}

impl<S, K, V> CacheService<S, K, V> {
    /// The cache behind this service.
    pub fn cache(&self) -> &Cache<K, V> {
        &self.cache
    }
}

impl<S, Req> Service<Req> for CacheService<S, Req::Key, S::Response>
where
    Req: CacheKey + Clone + Send + Sync + 'static,
    S: Service<Req> + Clone + Send + Sync + 'static,
    S::Response: CacheValue,
    S::Error: JoinError,
    S::Future: Send + 'static,
{
    type Response = Cached<S::Response>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let cache = self.cache.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            let key = request.cache_key();
            let deadline = request.deadline();
            let (value, lookup) = cache
                .get_or_fetch(
                    &key,
                    deadline,
                    |_| true,
                    |_stale| S::clone(&inner).oneshot(request.clone()),
                )
                .await?;
            Ok(Cached { value, lookup })
        })
    }
}
