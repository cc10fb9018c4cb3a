//! Loading tenants' private keys without letting one tenant stall the node.
//!
//! A user principal's key comes from a Secret the namespace controls: an encrypted key
//! costs a key derivation (PBKDF2 or scrypt, bounded in `key.rs`), paid even with a wrong
//! passphrase. So key loads run at most `max_concurrent_key_loads` at a time process-wide,
//! on the blocking pool, handed out in arrival order with at most one waiter per namespace
//! in that queue (the others of the namespace wait on their namespace's turn), and each
//! waits at most `key_load_wait` before giving up with `Unavailable`. A load that failed
//! is remembered per Secret and `resourceVersion` for the user-secret TTL: the same broken
//! Secret is not decrypted again on every mount, and a changed Secret is tried at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;

use crate::error::AuthError;
use crate::key::KeyError;

/// The process-wide gate of key loads.
pub(crate) struct KeyGate {
    permits: Arc<Semaphore>,
    loads: AtomicU64,
    namespaces: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    wait: Duration,
}

impl KeyGate {
    pub(crate) fn new(max_concurrent: usize, wait: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max_concurrent.max(1))),
            loads: AtomicU64::new(0),
            namespaces: Mutex::new(HashMap::new()),
            wait,
        }
    }

    fn namespace_turn(&self, namespace: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self
            .namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Entries nobody holds or waits for are dropped, so the map is bounded by the
        // namespaces loading a key right now.
        map.retain(|_, turn| Arc::strong_count(turn) > 1);
        map.entry(namespace.to_owned()).or_default().clone()
    }

    /// Runs `load` on the blocking pool when it is `namespace`'s turn and a permit is free,
    /// waiting at most the configured time (and never past `deadline`).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        namespace: &str,
        deadline: tokio::time::Instant,
        load: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, AuthError> {
        let until = deadline.min(tokio::time::Instant::now() + self.wait);
        let busy = || AuthError::KeyLoadsBusy {
            namespace: namespace.to_owned(),
            waited: self.wait,
        };
        let turn = self.namespace_turn(namespace);
        let _turn = tokio::time::timeout_at(until, turn.lock_owned())
            .await
            .map_err(|_| busy())?;
        let _permit = tokio::time::timeout_at(until, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| busy())?
            .map_err(|_| AuthError::Internal("the key load gate is closed"))?;
        self.loads.fetch_add(1, Ordering::Relaxed);
        tokio::task::spawn_blocking(load)
            .await
            .map_err(|_| AuthError::Internal("the key loading task failed"))
    }

    /// Key loads run so far.
    pub(crate) fn loads(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }
}

/// A key that failed to load, for the Secret version it came from.
#[derive(Clone, Debug)]
struct Failure {
    resource_version: String,
    at: SystemTime,
    error: Arc<KeyError>,
}

/// Most failures remembered; past it the oldest is forgotten (a tenant with many broken
/// Secrets only loses the shortcut, never memory).
const MAX_FAILURES: usize = 1024;

/// Failed key loads per (namespace, Secret name).
#[derive(Default)]
pub(crate) struct FailedLoads {
    map: Mutex<HashMap<(String, String), Failure>>,
}

impl FailedLoads {
    /// The remembered failure of this Secret at this version, if younger than `ttl`.
    pub(crate) fn get(
        &self,
        key: &(String, String),
        resource_version: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Option<Arc<KeyError>> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(key)
            .filter(|f| f.resource_version == resource_version && now < f.at + ttl)
            .map(|f| f.error.clone())
    }

    pub(crate) fn insert(
        &self,
        key: (String, String),
        resource_version: String,
        now: SystemTime,
        ttl: Duration,
        error: Arc<KeyError>,
    ) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, f| now < f.at + ttl);
        if map.len() >= MAX_FAILURES
            && let Some(oldest) = map.iter().min_by_key(|(_, f)| f.at).map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            key,
            Failure {
                resource_version,
                at: now,
                error,
            },
        );
    }

    pub(crate) fn remove(&self, key: &(String, String)) {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn turns_go_round_the_namespaces_and_waits_are_bounded() {
        let gate = Arc::new(KeyGate::new(1, Duration::from_secs(30)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        // Namespace a's first load holds the only permit until released.
        let first = {
            let (gate, order) = (gate.clone(), order.clone());
            tokio::spawn(async move {
                gate.run("a", far(), move || {
                    blocked.recv().unwrap();
                    order.lock().unwrap().push("a1");
                })
                .await
            })
        };
        while gate.permits.available_permits() == 1 {
            tokio::task::yield_now().await;
        }
        // Then four more of namespace a, and one of namespace b.
        let mut later = Vec::new();
        for name in ["a2", "a3", "a4", "a5"] {
            let (gate, order) = (gate.clone(), order.clone());
            later.push(tokio::spawn(async move {
                gate.run("a", far(), move || order.lock().unwrap().push(name))
                    .await
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let b = {
            let (gate, order) = (gate.clone(), order.clone());
            tokio::spawn(async move {
                gate.run("b", far(), move || order.lock().unwrap().push("b1"))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        for task in later {
            task.await.unwrap().unwrap();
        }
        let order = order.lock().unwrap().clone();
        // b came after four loads of a, and is served right after the one running.
        assert_eq!(order[..2], ["a1", "b1"], "{order:?}");
        assert_eq!(gate.loads(), 6);
        // Namespaces nobody waits for are swept at the next load.
        gate.run("c", far(), || ()).await.unwrap();
        assert_eq!(gate.namespaces.lock().unwrap().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_load_that_cannot_get_a_turn_in_time_is_unavailable() {
        let gate = Arc::new(KeyGate::new(1, Duration::from_millis(100)));
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let holder = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.run("a", far(), move || blocked.recv().unwrap()).await })
        };
        while gate.permits.available_permits() == 1 {
            tokio::task::yield_now().await;
        }
        let error = gate.run("b", far(), || ()).await.unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Unavailable);
        assert!(error.to_string().contains("namespace b waited"), "{error}");
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        // With the permit back, b gets its turn.
        gate.run("b", far(), || ()).await.unwrap();
    }
}
