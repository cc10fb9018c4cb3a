//! A bounded, single-flight cache for credentials and secret values, and a tower layer
//! over it.
//!
//! [`Cache`] keeps values by a typed key for as long as they are fresh, within a bound on
//! entries and on bytes, and makes concurrent misses for one key share one upstream call
//! (single flight). [`CacheLayer`] puts it in front of any tower service whose requests
//! say their own key ([`CacheKey`]).
//!
//! - **Freshness is decided by the caller's [`Clock`](clock::Clock)**, not by the cache engine's own
//!   timer: each stored value carries its expiry (a TTL from the configuration, or the
//!   value's own end of life, whichever comes first), so tests move a [`ManualClock`](clock::ManualClock)
//!   instead of sleeping. Expired values are dropped by [`Cache::purge_expired`], which
//!   [`Cache::spawn_purger`] runs on a timer, so a secret does not stay in memory until the
//!   next insertion happens to evict it.
//! - **Errors are never stored.** Callers that join a flight which fails get the leader's
//!   error ([`JoinError::from_shared`]), except when that error is the leader's own
//!   deadline ([`JoinError::is_leaders_own`]) or the leader was cancelled: then the waiter
//!   tries again with its own deadline, and never inherits another caller's cancellation.
//! - **Values are dropped, not copied, on eviction**: the cache holds one `Arc` of each;
//!   zeroizing value types wipe their bytes when the last clone goes.
//!
//! Underneath is [moka](https://docs.rs/moka)'s `future::Cache`: its `try_get_with` is the
//! single flight (and it already retries the waiters of a leader whose future was dropped),
//! its weigher and eviction listener give the byte bound and the eviction counts.
//!
//! See the README for an example (compiled as a doc test).

mod layer;

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use moka::notification::RemovalCause;
use moka::ops::compute::Op;

use clock::SharedClock;
pub use layer::{CacheKey, CacheLayer, CacheService, Cached};

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// What a cache holds: cheap to clone (an `Arc` or a small struct), and able to say how
/// many bytes of secret material it keeps alive.
pub trait CacheValue: Clone + Send + Sync + 'static {
    /// The bytes this value holds (what the byte bound counts).
    fn bytes(&self) -> usize;

    /// When this value stops being usable by itself (a token's expiry), if it does.
    fn expires(&self) -> Option<SystemTime> {
        None
    }
}

/// How an upstream error is handed to the callers that joined the failed flight.
pub trait JoinError: Sized + Send + Sync + 'static {
    /// The error of a flight, shared by the caller that led it and those that joined it.
    fn from_shared(shared: Arc<Self>) -> Self;

    /// The caller's own deadline passed while it waited for another caller's fetch.
    fn waited_too_long(what: &'static str) -> Self;

    /// Whether this error belongs to the caller that led the flight rather than to the
    /// key (its own deadline ran out): a waiter with time left tries again instead.
    fn is_leaders_own(&self) -> bool;
}

/// Where a value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lookup {
    /// From memory: no upstream call.
    Hit,
    /// This caller made the upstream call.
    Fetched,
    /// Another caller's upstream call, in flight when this one asked.
    Joined,
}

impl Lookup {
    /// `hit`, `fetched` or `joined`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Lookup::Hit => "hit",
            Lookup::Fetched => "fetched",
            Lookup::Joined => "joined",
        }
    }

    /// Whether no upstream call was made for this caller (a hit or a joined flight).
    pub fn is_shared(self) -> bool {
        !matches!(self, Lookup::Fetched)
    }
}

/// The bounds and lifetime of one cache.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// What the cache holds, as metrics label it (`bundle`, `rpst`, ...).
    pub kind: &'static str,
    /// How long a value is served after it was fetched; `None`: until its own
    /// [`CacheValue::expires`] or until the caller finds it unusable. `Some(ZERO)` keeps
    /// nothing, but concurrent identical fetches are still joined.
    pub ttl: Option<Duration>,
    /// The most entries kept.
    pub max_entries: u64,
    /// The most bytes kept ([`CacheValue::bytes`] summed).
    pub max_bytes: u64,
    /// Drop an entry nobody asked for in this long (measured by the engine's own clock:
    /// it bounds memory, it never decides freshness); `None`: keep it until it expires or
    /// the bounds evict it.
    pub idle: Option<Duration>,
}

impl CacheConfig {
    /// No TTL, 10,000 entries, 64 MiB.
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            ttl: None,
            max_entries: 10_000,
            max_bytes: 64 * 1024 * 1024,
            idle: None,
        }
    }

    /// The weight every entry counts at least, so that one capacity in weight bounds both
    /// the bytes (each entry weighs at least its bytes) and the entries (each weighs at
    /// least `max_bytes / max_entries`).
    fn floor_weight(&self) -> u64 {
        (self.max_bytes / self.max_entries.max(1)).max(1)
    }
}

/// Counters of one cache, since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Answered from memory.
    pub hits: u64,
    /// Led an upstream call.
    pub misses: u64,
    /// Waited for another caller's upstream call.
    pub joined: u64,
    /// Removed to stay within `max_entries` / `max_bytes`.
    pub evicted_size: u64,
    /// Removed because they expired (purge, or found stale by a caller).
    pub evicted_expired: u64,
    /// Removed because a caller said so ([`Cache::invalidate_if`]).
    pub evicted_invalidated: u64,
    /// Callers that gave up after [`MAX_ATTEMPTS`] flights in a row fetched values they
    /// could not use (another caller's): they got an error, never such a value.
    pub unusable: u64,
    /// Callers in a flight now: leading an upstream call or waiting for one.
    pub in_flight: u64,
    /// Entries held now.
    pub entries: u64,
    /// Bytes held now ([`CacheValue::bytes`] summed).
    pub bytes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    joined: AtomicU64,
    evicted_size: AtomicU64,
    evicted_expired: AtomicU64,
    evicted_invalidated: AtomicU64,
    unusable: AtomicU64,
    in_flight: AtomicU64,
}

/// Counts a caller in a flight while it lives.
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One stored value: the value, its expiry and a generation to tell it from a successor.
struct Stored<V> {
    value: V,
    expires: Option<SystemTime>,
    generation: u64,
}

/// One caller's part in a flight: whether it led the fetch, its attempt, its deadline.
#[derive(Clone, Copy)]
struct Flight {
    led: bool,
    attempts: usize,
    deadline: tokio::time::Instant,
}

/// How many times a waiter starts over after a flight it did not lead ended with the
/// leader's own deadline, or with a value it cannot use, before it gives up.
pub const MAX_ATTEMPTS: usize = 8;

/// A bounded single-flight cache from `K` to `V`. Clones share the entries.
pub struct Cache<K, V> {
    inner: Arc<Inner<K, V>>,
}

struct Inner<K, V> {
    map: moka::future::Cache<K, Arc<Stored<V>>>,
    config: CacheConfig,
    clock: SharedClock,
    counters: Arc<Counters>,
    generation: AtomicU64,
}

impl<K, V> Clone for Cache<K, V> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, V> fmt::Debug for Cache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("config", &self.inner.config)
            .field("entries", &self.inner.map.entry_count())
            .finish_non_exhaustive()
    }
}

impl<K, V> Cache<K, V>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: CacheValue,
{
    /// An empty cache.
    pub fn new(config: CacheConfig, clock: SharedClock) -> Self {
        let counters = Arc::new(Counters::default());
        let floor = config.floor_weight();
        let listener_counters = Arc::clone(&counters);
        let mut builder = moka::future::Cache::builder();
        if let Some(idle) = config.idle {
            builder = builder.time_to_idle(idle);
        }
        let map = builder
            .max_capacity(config.max_bytes.max(floor))
            .weigher(move |_key: &K, stored: &Arc<Stored<V>>| {
                let weight = (stored.value.bytes() as u64).max(floor);
                u32::try_from(weight).unwrap_or(u32::MAX)
            })
            .eviction_listener(move |_key, _stored, cause| {
                if cause == RemovalCause::Size {
                    listener_counters
                        .evicted_size
                        .fetch_add(1, Ordering::Relaxed);
                }
            })
            .build();
        Self {
            inner: Arc::new(Inner {
                map,
                config,
                clock,
                counters,
                generation: AtomicU64::new(0),
            }),
        }
    }

    /// The configuration this cache was built with.
    pub fn config(&self) -> &CacheConfig {
        &self.inner.config
    }

    /// The value for `key`: the stored one while it is fresh and `usable` says so, else
    /// the result of `fetch`, which is called with the stale value (if any) and is run by
    /// one caller at a time per key; callers arriving meanwhile wait for its result.
    ///
    /// `deadline` bounds the whole call, waiting included. A stale value is dropped
    /// before the fetch starts; the fetched one is stored unless the TTL is zero.
    pub async fn get_or_fetch<F, Fut, E>(
        &self,
        key: &K,
        deadline: tokio::time::Instant,
        usable: impl Fn(&V) -> bool,
        fetch: F,
    ) -> Result<(V, Lookup), E>
    where
        F: FnMut(Option<V>) -> Fut,
        Fut: Future<Output = Result<V, E>>,
        E: JoinError,
    {
        let stale = match self.stored(key, &usable).await {
            Ok(hit) => return Ok((hit, Lookup::Hit)),
            Err(stale) => stale,
        };
        // The miss in a box of its own: a hit, what almost every call is, then makes and
        // moves a future of a few words, not one holding the fetch's (kilobytes for an
        // exchange or a signed request, copied on every call).
        Box::pin(self.fetch_after_miss(key, deadline, usable, fetch, stale)).await
    }

    /// [`Cache::get_or_fetch`] after a miss (`stale`: what was stored, if anything).
    async fn fetch_after_miss<F, Fut, E>(
        &self,
        key: &K,
        deadline: tokio::time::Instant,
        usable: impl Fn(&V) -> bool,
        mut fetch: F,
        mut stale: Option<V>,
    ) -> Result<(V, Lookup), E>
    where
        F: FnMut(Option<V>) -> Fut,
        Fut: Future<Output = Result<V, E>>,
        E: JoinError,
    {
        let inner = &self.inner;
        let counters = &inner.counters;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let led = AtomicBool::new(false);
            let init = async {
                led.store(true, Ordering::Relaxed);
                let value = fetch(stale).await?;
                Ok(Arc::new(self.store(value)))
            };
            let in_flight = InFlight::enter(&counters.in_flight);
            let joined =
                tokio::time::timeout_at(deadline, inner.map.try_get_with(key.clone(), init))
                    .await
                    .map_err(|_| {
                        E::waited_too_long("waiting for the same fetch by another mount")
                    })?;
            drop(in_flight);
            let flight = Flight {
                led: led.load(Ordering::Relaxed),
                attempts,
                deadline,
            };
            if let Some(answer) = self.settle(key, joined, flight, &usable).await {
                return answer;
            }
            stale = match self.stored(key, &usable).await {
                Ok(hit) => return Ok((hit, Lookup::Hit)),
                Err(stale) => stale,
            };
        }
    }

    /// The value stored for `key` if it is fresh and `usable` (a hit); otherwise what was
    /// stored (a stale value the fetch may use), removed.
    async fn stored(&self, key: &K, usable: &impl Fn(&V) -> bool) -> Result<V, Option<V>> {
        let counters = &self.inner.counters;
        match self.inner.map.get(key).await {
            Some(stored) if self.fresh(&stored) && usable(&stored.value) => {
                counters.hits.fetch_add(1, Ordering::Relaxed);
                Ok(stored.value.clone())
            }
            Some(stored) => {
                let expired = !self.fresh(&stored);
                if self.remove_generation(key, stored.generation).await && expired {
                    counters.evicted_expired.fetch_add(1, Ordering::Relaxed);
                }
                Err(Some(stored.value.clone()))
            }
            None => Err(None),
        }
    }

    /// What a finished flight means for this caller: its answer, or `None` to start over
    /// (another caller's value this one cannot use, or a leader that ran out of its own,
    /// earlier deadline while this caller has time left).
    async fn settle<E: JoinError>(
        &self,
        key: &K,
        joined: Result<Arc<Stored<V>>, Arc<E>>,
        flight: Flight,
        usable: &impl Fn(&V) -> bool,
    ) -> Option<Result<(V, Lookup), E>> {
        let counters = &self.inner.counters;
        match joined {
            Ok(stored) if flight.led => {
                counters.misses.fetch_add(1, Ordering::Relaxed);
                if self.inner.config.ttl == Some(Duration::ZERO) {
                    self.remove_generation(key, stored.generation).await;
                }
                Some(Ok((stored.value.clone(), Lookup::Fetched)))
            }
            Ok(stored) if usable(&stored.value) => {
                counters.joined.fetch_add(1, Ordering::Relaxed);
                Some(Ok((stored.value.clone(), Lookup::Joined)))
            }
            // Never hand a caller a value it refused.
            Ok(_) if flight.attempts >= MAX_ATTEMPTS => {
                counters.unusable.fetch_add(1, Ordering::Relaxed);
                Some(Err(E::waited_too_long(
                    "waiting for a value this caller can use: the fetches it joined kept \
                     bringing another caller's",
                )))
            }
            // Another caller's value this one cannot use (e.g. another service account
            // uid under one name): start over.
            Ok(_) => None,
            Err(shared) if flight.led => {
                counters.misses.fetch_add(1, Ordering::Relaxed);
                // The engine keeps a clone for the waiters, so the leader's own error
                // comes back shared as well.
                Some(Err(E::from_shared(shared)))
            }
            Err(shared) => {
                let time_left = tokio::time::Instant::now() < flight.deadline;
                if shared.is_leaders_own() && time_left && flight.attempts < MAX_ATTEMPTS {
                    // The leader ran out of its own (earlier) deadline: try with ours.
                    return None;
                }
                counters.joined.fetch_add(1, Ordering::Relaxed);
                Some(Err(E::from_shared(shared)))
            }
        }
    }

    /// The fresh value stored for `key`, without fetching.
    pub async fn get(&self, key: &K) -> Option<V> {
        self.inner
            .map
            .get(key)
            .await
            .filter(|stored| self.fresh(stored))
            .map(|stored| stored.value.clone())
    }

    /// Removes the value of `key` if `predicate` holds for it (a credential OCI just
    /// rejected). Says whether it removed one.
    pub async fn invalidate_if(&self, key: &K, predicate: impl FnOnce(&V) -> bool) -> bool {
        let Some(stored) = self.inner.map.get(key).await else {
            return false;
        };
        if !predicate(&stored.value) {
            return false;
        }
        let removed = self.remove_generation(key, stored.generation).await;
        if removed {
            self.inner
                .counters
                .evicted_invalidated
                .fetch_add(1, Ordering::Relaxed);
        }
        removed
    }

    /// Stores `value` for `key` in place of the value stored now, if `replaces` holds for
    /// that one (a credential refreshed in the background replaces the one it refreshed, not
    /// a successor another caller stored meanwhile). Nothing is stored where nothing is: a
    /// key being fetched gets the fetch's value. Says whether it replaced.
    pub async fn replace_if(&self, key: &K, value: V, replaces: impl FnOnce(&V) -> bool) -> bool {
        let stored = Arc::new(self.store(value));
        let result = self
            .inner
            .map
            .entry_by_ref(key)
            .and_compute_with(|entry| {
                let replace = entry.is_some_and(|e| replaces(&e.value().value));
                std::future::ready(if replace { Op::Put(stored) } else { Op::Nop })
            })
            .await;
        matches!(result, moka::ops::compute::CompResult::ReplacedWith(_))
    }

    /// Drops every expired value now; returns how many.
    pub async fn purge_expired(&self) -> usize {
        let expired: Vec<(K, u64)> = self
            .inner
            .map
            .iter()
            .filter(|(_, stored)| !self.fresh(stored))
            .map(|(key, stored)| ((*key).clone(), stored.generation))
            .collect();
        let mut removed = 0;
        for (key, generation) in expired {
            if self.remove_generation(&key, generation).await {
                removed += 1;
            }
        }
        self.inner
            .counters
            .evicted_expired
            .fetch_add(removed as u64, Ordering::Relaxed);
        self.inner.map.run_pending_tasks().await;
        removed
    }

    /// Runs [`Cache::purge_expired`] every `every` until the last clone of the cache is
    /// dropped (the task holds no strong reference to it).
    pub fn spawn_purger(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner<K, V>> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every.max(Duration::from_millis(10)));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Cache { inner }.purge_expired().await;
            }
        })
    }

    /// Applies pending evictions, so that [`Cache::stats`] is exact (tests; the engine
    /// otherwise does this in the background of reads and writes).
    pub async fn sync(&self) {
        self.inner.map.run_pending_tasks().await;
    }

    /// The counters, and the entries and bytes held now.
    pub fn stats(&self) -> CacheStats {
        let c = &self.inner.counters;
        let (entries, bytes) = self
            .inner
            .map
            .iter()
            .fold((0u64, 0u64), |(n, b), (_, stored)| {
                (n + 1, b + stored.value.bytes() as u64)
            });
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            joined: c.joined.load(Ordering::Relaxed),
            evicted_size: c.evicted_size.load(Ordering::Relaxed),
            evicted_expired: c.evicted_expired.load(Ordering::Relaxed),
            evicted_invalidated: c.evicted_invalidated.load(Ordering::Relaxed),
            unusable: c.unusable.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
            entries,
            bytes,
        }
    }

    fn store(&self, value: V) -> Stored<V> {
        let ttl_end = self
            .inner
            .config
            .ttl
            .map(|ttl| self.inner.clock.now() + ttl);
        let expires = match (ttl_end, value.expires()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Stored {
            value,
            expires,
            generation: self.inner.generation.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn fresh(&self, stored: &Stored<V>) -> bool {
        stored
            .expires
            .is_none_or(|expires| self.inner.clock.now() < expires)
    }

    /// Removes `key` only if it still holds the value of `generation` (not a successor
    /// another caller stored meanwhile).
    async fn remove_generation(&self, key: &K, generation: u64) -> bool {
        let result = self
            .inner
            .map
            .entry_by_ref(key)
            .and_compute_with(|entry| {
                let same = entry.is_some_and(|e| e.value().generation == generation);
                std::future::ready(if same { Op::Remove } else { Op::Nop })
            })
            .await;
        matches!(result, moka::ops::compute::CompResult::Removed(_))
    }
}

#[cfg(test)]
mod tests;
