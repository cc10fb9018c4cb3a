use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::*;
use clock::{Clock as _, ManualClock, SharedClock};

/// A value that counts how many of its clones are alive, so tests can see eviction drop it.
#[derive(Clone, Debug)]
struct Value {
    id: u32,
    bytes: usize,
    _alive: Arc<()>,
}

impl Value {
    fn new(id: u32, bytes: usize, alive: &Arc<()>) -> Self {
        Self {
            id,
            bytes,
            _alive: Arc::clone(alive),
        }
    }
}

impl CacheValue for Value {
    fn bytes(&self) -> usize {
        self.bytes
    }
}

#[derive(Debug, PartialEq, Eq)]
enum TestError {
    NotFound,
    Deadline,
    Waited,
    Shared(String),
}

impl JoinError for TestError {
    fn from_shared(shared: Arc<Self>) -> Self {
        TestError::Shared(format!("{shared:?}"))
    }
    fn waited_too_long(_: &'static str) -> Self {
        TestError::Waited
    }
    fn is_leaders_own(&self) -> bool {
        matches!(self, TestError::Deadline)
    }
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(
        UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    ))
}

fn cache(ttl: Option<Duration>, clock: &Arc<ManualClock>) -> Cache<u32, Value> {
    Cache::new(
        CacheConfig {
            ttl,
            ..CacheConfig::new("test")
        },
        clock.clone() as SharedClock,
    )
}

/// Waits until `alive` has `expected` strong references. moka frees removed entries through
/// crossbeam-epoch, whose reclamation is process-wide: with other tests running on other
/// threads of the same process (`cargo test`), a dropped entry is freed a little later, when
/// the epoch advances. Each round pins the epoch again (a cache operation) so it does; the
/// wait is bounded, and the assertion after it is exact.
async fn settle(cache: &Cache<u32, Value>, alive: &Arc<()>, expected: usize) {
    for _ in 0..2000 {
        if Arc::strong_count(alive) == expected {
            return;
        }
        cache.sync().await;
        let _ = cache.get(&u32::MAX).await;
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn later(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}

#[tokio::test(flavor = "current_thread")]
async fn a_thousand_concurrent_misses_make_one_fetch() {
    let clock = clock();
    let cache = cache(Some(Duration::from_secs(30)), &clock);
    let alive = Arc::new(());
    let fetches = Arc::new(AtomicUsize::new(0));
    let (release, released) = oneshot::channel::<()>();
    let released = Arc::new(Mutex::new(Some(released)));
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let (cache, fetches, released, alive) = (
            cache.clone(),
            fetches.clone(),
            released.clone(),
            alive.clone(),
        );
        tasks.push(tokio::spawn(async move {
            cache
                .get_or_fetch(
                    &1,
                    later(60),
                    |_| true,
                    |_| {
                        let (fetches, released, alive) =
                            (fetches.clone(), released.clone(), alive.clone());
                        async move {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            let gate = released.lock().unwrap().take();
                            if let Some(gate) = gate {
                                let _ = gate.await;
                            }
                            Ok::<_, TestError>(Value::new(7, 10, &alive))
                        }
                    },
                )
                .await
        }));
    }
    // On this single-threaded runtime every task runs until it waits on the flight.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    release.send(()).unwrap();
    let mut lookups = std::collections::HashMap::new();
    for task in tasks {
        let (value, lookup) = task.await.unwrap().unwrap();
        assert_eq!(value.id, 7);
        *lookups.entry(lookup).or_insert(0) += 1;
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert_eq!(lookups[&Lookup::Fetched], 1);
    assert_eq!(lookups[&Lookup::Joined], 999, "{lookups:?}");
    let stats = cache.stats();
    assert_eq!((stats.misses, stats.joined), (1, 999));
}

/// A fetch that blocks until `gate` is notified (or forever), counting its calls.
fn gated(
    fetches: &Arc<AtomicUsize>,
    gate: &Arc<Notify>,
    alive: &Arc<()>,
    id: u32,
) -> impl FnMut(Option<Value>) -> futures_util::future::BoxFuture<'static, Result<Value, TestError>>
+ Send
+ 'static {
    let (fetches, gate, alive) = (fetches.clone(), gate.clone(), alive.clone());
    move |_| {
        let (fetches, gate, alive) = (fetches.clone(), gate.clone(), alive.clone());
        Box::pin(async move {
            let n = fetches.fetch_add(1, Ordering::SeqCst);
            if n == 0 {
                gate.notified().await;
            }
            Ok(Value::new(id, 1, &alive))
        })
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_cancelled_leader_does_not_fail_its_waiters() {
    let clock = clock();
    let cache = cache(Some(Duration::from_secs(30)), &clock);
    let (fetches, gate, alive) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(Notify::new()),
        Arc::new(()),
    );
    let leader = {
        let cache = cache.clone();
        let fetch = gated(&fetches, &gate, &alive, 1);
        tokio::spawn(async move { cache.get_or_fetch(&1, later(60), |_| true, fetch).await })
    };
    tokio::task::yield_now().await;
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let cache = cache.clone();
            let fetch = gated(&fetches, &gate, &alive, 2);
            tokio::spawn(async move { cache.get_or_fetch(&1, later(60), |_| true, fetch).await })
        })
        .collect();
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    leader.abort();
    for waiter in waiters {
        let (value, _) = waiter.await.unwrap().unwrap();
        assert_eq!(value.id, 2);
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "one more fetch at most");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_leader_with_an_earlier_deadline_does_not_pass_it_on() {
    let clock = clock();
    let cache = cache(Some(Duration::from_secs(30)), &clock);
    let fetches = Arc::new(AtomicUsize::new(0));
    let stall = Arc::new(Notify::new());
    // The leader's fetch ends with its own deadline (as vault's does), after 1 s.
    let leader = {
        let (cache, fetches, stall) = (cache.clone(), fetches.clone(), stall.clone());
        tokio::spawn(async move {
            let deadline = later(1);
            cache
                .get_or_fetch(
                    &1,
                    deadline,
                    |_| true,
                    |_| {
                        let (fetches, stall) = (fetches.clone(), stall.clone());
                        async move {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            let _ = tokio::time::timeout_at(deadline, stall.notified()).await;
                            Err::<Value, _>(TestError::Deadline)
                        }
                    },
                )
                .await
        })
    };
    tokio::task::yield_now().await;
    let alive = Arc::new(());
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let (cache, fetches, alive) = (cache.clone(), fetches.clone(), alive.clone());
            tokio::spawn(async move {
                cache
                    .get_or_fetch(
                        &1,
                        later(60),
                        |_| true,
                        |_| {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            std::future::ready(Ok::<_, TestError>(Value::new(3, 1, &alive)))
                        },
                    )
                    .await
            })
        })
        .collect();
    // The leader's own error comes back through `from_shared` too (the engine keeps a
    // clone of it for its waiters).
    assert_eq!(
        leader.await.unwrap().unwrap_err(),
        TestError::Shared("Deadline".into())
    );
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().unwrap().0.id, 3);
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiter_gives_up_at_its_own_deadline() {
    let clock = clock();
    let cache = cache(None, &clock);
    let (fetches, gate, alive) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(Notify::new()),
        Arc::new(()),
    );
    let leader = {
        let cache = cache.clone();
        let fetch = gated(&fetches, &gate, &alive, 1);
        tokio::spawn(async move { cache.get_or_fetch(&1, later(60), |_| true, fetch).await })
    };
    tokio::task::yield_now().await;
    let fetch = gated(&fetches, &gate, &alive, 2);
    let waited = cache.get_or_fetch(&1, later(1), |_| true, fetch).await;
    assert_eq!(waited.unwrap_err(), TestError::Waited);
    gate.notify_one();
    assert_eq!(leader.await.unwrap().unwrap().0.id, 1);
}

#[tokio::test(flavor = "current_thread")]
async fn errors_are_shared_with_joined_waiters_but_never_stored() {
    let clock = clock();
    let cache = cache(Some(Duration::from_secs(30)), &clock);
    let fetches = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let failing = || {
        let (fetches, gate) = (fetches.clone(), gate.clone());
        move |_: Option<Value>| {
            let (fetches, gate) = (fetches.clone(), gate.clone());
            async move {
                if fetches.fetch_add(1, Ordering::SeqCst) == 0 {
                    gate.notified().await;
                }
                Err::<Value, _>(TestError::NotFound)
            }
        }
    };
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let cache = cache.clone();
            let fetch = failing();
            tokio::spawn(async move { cache.get_or_fetch(&1, later(60), |_| true, fetch).await })
        })
        .collect();
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    let mut errors: Vec<_> = Vec::new();
    for task in tasks {
        errors.push(task.await.unwrap().unwrap_err());
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert!(
        errors
            .iter()
            .all(|e| *e == TestError::Shared("NotFound".into())),
        "{errors:?}"
    );
    assert_eq!((cache.stats().misses, cache.stats().joined), (1, 4));
    // Not stored: the next call asks again.
    let _ = cache.get_or_fetch(&1, later(60), |_| true, failing()).await;
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn values_expire_by_the_injected_clock() {
    let clock = clock();
    let cache = cache(Some(Duration::from_secs(30)), &clock);
    let alive = Arc::new(());
    let n = AtomicUsize::new(0);
    let fetch = |_| {
        let id = n.fetch_add(1, Ordering::SeqCst) as u32;
        std::future::ready(Ok::<_, TestError>(Value::new(id, 1, &alive)))
    };
    let first = cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    assert_eq!((first.0.id, first.1), (0, Lookup::Fetched));
    clock.advance(Duration::from_secs(29));
    let hit = cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    assert_eq!((hit.0.id, hit.1), (0, Lookup::Hit));
    clock.advance(Duration::from_secs(1));
    let refetched = cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    assert_eq!((refetched.0.id, refetched.1), (1, Lookup::Fetched));
    // An unusable value (e.g. invalidated) is fetched again too.
    let unusable = cache
        .get_or_fetch(&1, later(5), |v| v.id != 1, fetch)
        .await
        .unwrap();
    assert_eq!((unusable.0.id, unusable.1), (2, Lookup::Fetched));
}

#[derive(Clone, Debug)]
struct Expiring(std::time::SystemTime);

impl CacheValue for Expiring {
    fn bytes(&self) -> usize {
        1
    }
    fn expires(&self) -> Option<std::time::SystemTime> {
        Some(self.0)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_value_expiring_before_the_ttl_expires_first() {
    let clock = clock();
    let cache: Cache<u32, Expiring> = Cache::new(
        CacheConfig {
            ttl: Some(Duration::from_secs(3600)),
            ..CacheConfig::new("test")
        },
        clock.clone() as SharedClock,
    );
    let end = clock.now() + Duration::from_secs(10);
    let fetch = |_| std::future::ready(Ok::<_, TestError>(Expiring(end)));
    cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    assert!(cache.get(&1).await.is_some());
    clock.advance(Duration::from_secs(10));
    assert!(cache.get(&1).await.is_none());
}

#[tokio::test(flavor = "current_thread")]
async fn a_zero_ttl_keeps_nothing() {
    let clock = clock();
    let cache = cache(Some(Duration::ZERO), &clock);
    let alive = Arc::new(());
    let fetches = AtomicUsize::new(0);
    let fetch = |_| {
        fetches.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, TestError>(Value::new(1, 1, &alive)))
    };
    for _ in 0..3 {
        let (_, lookup) = cache
            .get_or_fetch(&1, later(5), |_| true, fetch)
            .await
            .unwrap();
        assert_eq!(lookup, Lookup::Fetched);
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    cache.sync().await;
    assert_eq!(cache.stats().entries, 0);
    settle(&cache, &alive, 1).await;
    assert_eq!(Arc::strong_count(&alive), 1, "no clone kept");
}

#[tokio::test(flavor = "current_thread")]
async fn purging_drops_expired_values_without_waiting_for_a_read() {
    let clock = clock();
    let cache = cache(Some(Duration::from_secs(30)), &clock);
    let alive = Arc::new(());
    for key in 0..10 {
        let fetch = |_| std::future::ready(Ok::<_, TestError>(Value::new(key, 100, &alive)));
        cache
            .get_or_fetch(&key, later(5), |_| true, fetch)
            .await
            .unwrap();
    }
    cache.sync().await;
    assert_eq!(cache.stats().entries, 10);
    assert_eq!(cache.stats().bytes, 1000);
    settle(&cache, &alive, 11).await;
    assert_eq!(Arc::strong_count(&alive), 11);
    assert_eq!(cache.purge_expired().await, 0);
    clock.advance(Duration::from_secs(30));
    assert_eq!(cache.purge_expired().await, 10);
    let stats = cache.stats();
    assert_eq!(
        (stats.entries, stats.bytes, stats.evicted_expired),
        (0, 0, 10)
    );
    settle(&cache, &alive, 1).await;
    assert_eq!(Arc::strong_count(&alive), 1, "every value was dropped");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_purger_runs_on_a_timer_and_stops_with_the_cache() {
    let clock = clock();
    let cache = cache(Some(Duration::from_secs(30)), &clock);
    let alive = Arc::new(());
    let fetch = |_| std::future::ready(Ok::<_, TestError>(Value::new(1, 1, &alive)));
    cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    let purger = cache.spawn_purger(Duration::from_secs(10));
    clock.advance(Duration::from_secs(31));
    tokio::time::sleep(Duration::from_secs(11)).await;
    settle(&cache, &alive, 1).await;
    assert_eq!(Arc::strong_count(&alive), 1);
    drop(cache);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(purger.is_finished());
}

#[tokio::test(flavor = "current_thread")]
async fn the_byte_bound_evicts_and_counts_secret_bytes() {
    let clock = clock();
    let cache: Cache<u32, Value> = Cache::new(
        CacheConfig {
            ttl: Some(Duration::from_secs(30)),
            max_entries: 1000,
            max_bytes: 10_000,
            kind: "test",
            idle: None,
        },
        clock.clone() as SharedClock,
    );
    let alive = Arc::new(());
    for key in 0..50 {
        let fetch = |_| std::future::ready(Ok::<_, TestError>(Value::new(key, 1000, &alive)));
        cache
            .get_or_fetch(&key, later(5), |_| true, fetch)
            .await
            .unwrap();
        cache.sync().await;
    }
    cache.sync().await;
    let stats = cache.stats();
    assert!(stats.bytes <= 10_000, "{stats:?}");
    assert!(stats.entries <= 10, "{stats:?}");
    assert!(stats.evicted_size >= 40, "{stats:?}");
    settle(&cache, &alive, stats.entries as usize + 1).await;
    assert_eq!(Arc::strong_count(&alive) as u64, stats.entries + 1);
}

#[tokio::test(flavor = "current_thread")]
async fn the_entry_bound_holds_for_small_values() {
    let clock = clock();
    let cache: Cache<u32, Value> = Cache::new(
        CacheConfig {
            ttl: None,
            max_entries: 20,
            max_bytes: 1_000_000,
            kind: "test",
            idle: None,
        },
        clock.clone() as SharedClock,
    );
    let alive = Arc::new(());
    for key in 0..200 {
        let fetch = |_| std::future::ready(Ok::<_, TestError>(Value::new(key, 1, &alive)));
        cache
            .get_or_fetch(&key, later(5), |_| true, fetch)
            .await
            .unwrap();
        cache.sync().await;
    }
    let stats = cache.stats();
    assert!(stats.entries <= 20, "{stats:?}");
    assert!(stats.evicted_size >= 180, "{stats:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn invalidation_removes_only_the_value_it_names() {
    let clock = clock();
    let cache = cache(None, &clock);
    let alive = Arc::new(());
    let fetch = |_| std::future::ready(Ok::<_, TestError>(Value::new(5, 1, &alive)));
    cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    assert!(!cache.invalidate_if(&1, |v| v.id == 4).await);
    assert!(cache.get(&1).await.is_some());
    assert!(cache.invalidate_if(&1, |v| v.id == 5).await);
    assert!(cache.get(&1).await.is_none());
    assert_eq!(cache.stats().evicted_invalidated, 1);
}

#[tokio::test(flavor = "current_thread")]
async fn the_stale_value_is_handed_to_the_fetch() {
    let clock = clock();
    let cache = cache(Some(Duration::from_secs(1)), &clock);
    let alive = Arc::new(());
    let seen = Mutex::new(Vec::new());
    let fetch = |stale: Option<Value>| {
        seen.lock().unwrap().push(stale.map(|v| v.id));
        std::future::ready(Ok::<_, TestError>(Value::new(9, 1, &alive)))
    };
    cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(1));
    cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![None, Some(9)]);
}

mod layer {
    use super::*;
    use tower::{Layer as _, ServiceExt as _};

    #[derive(Clone, Debug)]
    struct Req {
        key: u32,
        deadline: Instant,
    }

    impl CacheKey for Req {
        type Key = u32;
        fn cache_key(&self) -> u32 {
            self.key
        }
        fn deadline(&self) -> Instant {
            self.deadline
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_layer_answers_repeated_requests_from_the_cache() {
        let clock = clock();
        let alive = Arc::new(());
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = {
            let (calls, alive) = (calls.clone(), alive.clone());
            tower::service_fn(move |req: Req| {
                calls.fetch_add(1, Ordering::SeqCst);
                let value = if req.key == 0 {
                    Err(TestError::NotFound)
                } else {
                    Ok(Value::new(req.key, 1, &alive))
                };
                std::future::ready(value)
            })
        };
        let service = CacheLayer::new(cache(Some(Duration::from_secs(30)), &clock)).layer(inner);
        let req = |key| Req {
            key,
            deadline: later(5),
        };
        let first = service.clone().oneshot(req(1)).await.unwrap();
        assert_eq!((first.value.id, first.lookup), (1, Lookup::Fetched));
        let second = service.clone().oneshot(req(1)).await.unwrap();
        assert_eq!(second.lookup, Lookup::Hit);
        let other = service.clone().oneshot(req(2)).await.unwrap();
        assert_eq!((other.value.id, other.lookup), (2, Lookup::Fetched));
        let not_found = TestError::Shared("NotFound".into());
        assert_eq!(
            service.clone().oneshot(req(0)).await.unwrap_err(),
            not_found
        );
        assert_eq!(
            service.clone().oneshot(req(0)).await.unwrap_err(),
            not_found
        );
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!(service.cache().stats().hits, 1);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiter_never_gets_a_value_it_refused() {
    // Another caller keeps fetching key 1 (TTL zero: every call leads a flight), one flight
    // at a time as the test releases them; a caller that cannot use those values (another
    // service-account uid under one name) joins each flight and, after MAX_ATTEMPTS, gets
    // an error, counted, never such a value. On one thread the other caller starts its
    // next flight before the refusing one wakes, so the refusing one never leads.
    let clock = clock();
    let cache = cache(Some(Duration::ZERO), &clock);
    let alive = Arc::new(());
    let release = Arc::new(Notify::new());
    let other = {
        let (cache, alive, release) = (cache.clone(), alive.clone(), release.clone());
        tokio::spawn(async move {
            loop {
                let fetch = |_| {
                    let (value, release) = (Value::new(7, 1, &alive), release.clone());
                    async move {
                        release.notified().await;
                        Ok::<_, TestError>(value)
                    }
                };
                let _ = cache.get_or_fetch(&1, later(5), |_| true, fetch).await;
            }
        })
    };
    while cache.stats().in_flight == 0 {
        tokio::task::yield_now().await;
    }
    let refusing = {
        let (cache, alive) = (cache.clone(), alive.clone());
        tokio::spawn(async move {
            let own = |_| std::future::ready(Ok::<_, TestError>(Value::new(1, 1, &alive)));
            cache
                .get_or_fetch(&1, later(5), |v: &Value| v.id != 7, own)
                .await
        })
    };
    let mut released = 0;
    while !refusing.is_finished() && released < 4 * MAX_ATTEMPTS {
        // Let the refusing caller join the flight in progress, then end it.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        release.notify_one();
        released += 1;
    }
    let answer = refusing.await.unwrap();
    other.abort();
    match answer {
        Ok((value, lookup)) => panic!("handed {lookup:?} value {} it refused", value.id),
        Err(error) => assert_eq!(error, TestError::Waited),
    }
    assert_eq!(cache.stats().unusable, 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_replacement_takes_only_the_place_of_the_value_it_names() {
    let clock = clock();
    let cache = cache(None, &clock);
    let alive = Arc::new(());
    // Nothing stored: nothing replaced.
    assert!(
        !cache
            .replace_if(&1, Value::new(2, 1, &alive), |_| true)
            .await
    );
    assert!(cache.get(&1).await.is_none());
    let fetch = |_| std::future::ready(Ok::<_, TestError>(Value::new(1, 1, &alive)));
    cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    assert!(
        !cache
            .replace_if(&1, Value::new(3, 1, &alive), |v| v.id == 7)
            .await
    );
    assert_eq!(cache.get(&1).await.map(|v| v.id), Some(1));
    assert!(
        cache
            .replace_if(&1, Value::new(3, 1, &alive), |v| v.id == 1)
            .await
    );
    let (value, lookup) = cache
        .get_or_fetch(&1, later(5), |_| true, fetch)
        .await
        .unwrap();
    assert_eq!((value.id, lookup), (3, Lookup::Hit));
    let stats = cache.stats();
    assert_eq!((stats.misses, stats.entries), (1, 1));
}
