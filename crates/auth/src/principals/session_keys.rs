//! Session keys, generated ahead of the mounts that need them. Every workload exchange and
//! every federation of the instance principal sends the public half of a fresh RSA-2048 key,
//! about 100 ms of one core to generate. `PrincipalsConfig::session_keys_ahead` keys are kept
//! ready ([`SESSION_KEYS_AHEAD`] by default; the DaemonSet fills its pool at start): a mount
//! takes one at once, and each take starts a refill in the background unless one runs: one
//! thread at a time, at the lowest CPU priority (nice 19: a mount's work goes first on a busy
//! or CPU-limited node), generating until the pool is full again, then ending. A mount that
//! finds the pool empty waits for the key being generated and never starts a generation of
//! its own, so however many identities arrive at once session keys take at most one core,
//! and N new identities make at most N + the pool's size generations. A pool of size zero
//! keeps nothing: each take generates its own key.
//!
//! A key is bound to a session only when an exchange answers with a token for it: the key of
//! an exchange the endpoint answered with an error status (a refusal, a failure of the
//! domain) was bound to nothing and goes back to the pool, if it has room. The private halves
//! live in aws-lc, whose `OPENSSL_free` cleanses the memory it frees, so a key dropped from
//! the pool (or never taken) is wiped. The refill holds only a weak reference to the pool and
//! ends when the principals are dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use tokio::sync::{Notify, watch};

use crate::PrivateKey;
use crate::error::{AuthError, Endpoint};

/// The session keys kept ready. A Deployment rolling onto a node brings a few new service
/// accounts at once: that many exchanges start without waiting for a key, for about 10 KiB
/// held and 400 ms of one core spent once the principals first need a key.
pub const SESSION_KEYS_AHEAD: usize = 4;

pub(super) struct SessionKeys {
    /// The keys kept ready.
    ahead: usize,
    state: std::sync::Mutex<State>,
    /// Told each time a key is added.
    added: Notify,
    /// Closed when the principals are dropped.
    open: watch::Receiver<()>,
    generated: AtomicU64,
    ready: AtomicU64,
    waited: AtomicU64,
    returned: AtomicU64,
}

#[derive(Default)]
struct State {
    keys: Vec<PrivateKey>,
    /// Whether a refill task runs.
    refilling: bool,
    /// Generations that failed; a waiter that sees this change gets the last failure.
    failures: u64,
    last_failure: Option<Arc<AuthError>>,
    most_held: usize,
}

/// What became of session keys so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct KeyCounts {
    /// Keys generated (all in the background).
    pub(super) generated: u64,
    /// Keys taken at once from the pool.
    pub(super) ready: u64,
    /// Takes that found the pool empty and waited for the key being generated.
    pub(super) waited: u64,
    /// Keys of exchanges answered without a token, back in the pool.
    pub(super) returned: u64,
    /// The most keys the pool held at once (never more than its size).
    pub(super) most_held: u64,
    /// The keys held now.
    pub(super) held: u64,
}

impl SessionKeys {
    /// An empty pool of `ahead` keys; its refills end when `open`'s sender is dropped.
    pub(super) fn new(open: watch::Receiver<()>, ahead: usize) -> Self {
        Self {
            ahead,
            state: std::sync::Mutex::new(State::default()),
            added: Notify::new(),
            open,
            generated: AtomicU64::new(0),
            ready: AtomicU64::new(0),
            waited: AtomicU64::new(0),
            returned: AtomicU64::new(0),
        }
    }

    /// A key bound to no token: from the pool, or the one being generated.
    pub(super) async fn take(self: &Arc<Self>) -> Result<Arc<PrivateKey>, AuthError> {
        let mut waited = false;
        let mut failures = None;
        loop {
            // Registered before the pool is looked at, so a key added in between wakes it.
            let mut added = std::pin::pin!(self.added.notified());
            added.as_mut().enable();
            {
                let mut state = super::lock(&self.state);
                if let Some(key) = state.keys.pop() {
                    self.refill(&mut state);
                    let counter = if waited { &self.waited } else { &self.ready };
                    counter.fetch_add(1, Ordering::Relaxed);
                    return Ok(Arc::new(key));
                }
                if failures.is_some_and(|seen| seen != state.failures) {
                    return Err(state.last_failure.clone().map_or(
                        AuthError::Internal("the session key generation failed"),
                        AuthError::Shared,
                    ));
                }
                failures = Some(state.failures);
                self.refill(&mut state);
            }
            if self.ahead == 0 || self.open.has_changed().is_err() {
                // No pool, or the principals are gone and nothing refills (a renewal in
                // flight as the process stops): this key is generated for this take alone.
                self.generated.fetch_add(1, Ordering::Relaxed);
                self.waited.fetch_add(1, Ordering::Relaxed);
                return generate().await.map(Arc::new);
            }
            waited = true;
            added.await;
        }
    }

    /// Keeps the key of an exchange that `error` ended, if the endpoint answered other than
    /// with a token (so no session is bound to it), nothing else holds it and the pool has
    /// room.
    pub(super) fn give_back(&self, key: Arc<PrivateKey>, error: &AuthError) {
        if !answered_without_a_token(error) {
            return;
        }
        let Some(key) = Arc::into_inner(key) else {
            return;
        };
        let mut state = super::lock(&self.state);
        if state.keys.len() < self.ahead {
            state.keys.push(key);
            state.most_held = state.most_held.max(state.keys.len());
            self.returned.fetch_add(1, Ordering::Relaxed);
            self.added.notify_one();
        }
    }

    pub(super) fn counts(&self) -> KeyCounts {
        let (most_held, held) = {
            let state = super::lock(&self.state);
            (state.most_held, state.keys.len())
        };
        KeyCounts {
            held: held as u64,
            generated: self.generated.load(Ordering::Relaxed),
            ready: self.ready.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            returned: self.returned.load(Ordering::Relaxed),
            most_held: most_held as u64,
        }
    }

    /// Fills the pool in the background, ahead of the first exchange (the DaemonSet does at
    /// start: the first pods of a node then wait for no key).
    pub(super) fn fill(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err() {
            // No runtime to refill on: the first take starts it.
            return;
        }
        let mut state = super::lock(&self.state);
        self.refill(&mut state);
    }

    /// Starts the refill, unless one runs, the pool is full or the principals are gone.
    fn refill(self: &Arc<Self>, state: &mut State) {
        if state.refilling || state.keys.len() >= self.ahead {
            return;
        }
        state.refilling = super::spawn_until_closed(&self.open, refill(Arc::downgrade(self)));
    }
}

/// Generates keys one after another until the pool is full (or a generation fails), holding
/// the pool only between generations.
async fn refill(pool: Weak<SessionKeys>) {
    loop {
        let generated = generate_behind_mounts().await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let mut state = super::lock(&pool.state);
        match generated {
            Ok(key) => {
                pool.generated.fetch_add(1, Ordering::Relaxed);
                // Full only if keys came back meanwhile: this one is dropped (and wiped).
                if state.keys.len() < pool.ahead {
                    state.keys.push(key);
                    state.most_held = state.most_held.max(state.keys.len());
                    pool.added.notify_one();
                }
            }
            Err(error) => {
                tracing::warn!(%error, "generating a session key failed");
                state.failures += 1;
                state.last_failure = Some(Arc::new(error));
                state.refilling = false;
                pool.added.notify_waiters();
                return;
            }
        }
        if state.keys.len() >= pool.ahead {
            state.refilling = false;
            return;
        }
    }
}

/// One RSA-2048 key for the pool, on a thread of its own at the lowest CPU priority (nice
/// 19: the threads serving mounts run first when the node's CPU, or the container's
/// quota, is short). The thread's priority stays its own; the blocking pool's threads,
/// shared with other work, are not lowered.
async fn generate_behind_mounts() -> Result<PrivateKey, AuthError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("session-keys".into())
        .spawn(move || {
            // Best effort: a seccomp profile may refuse it, and the key is needed anyway.
            let _ = rustix::process::setpriority_process(None, 19);
            let _ = tx.send(PrivateKey::generate_rsa_2048());
        })
        .map_err(|_| AuthError::Internal("the session key thread could not start"))?;
    rx.await
        .map_err(|_| AuthError::Internal("the key generation thread failed"))?
        .map_err(AuthError::SessionKey)
}

/// One RSA-2048 key, on the blocking pool, for a take that found no pool to take from.
async fn generate() -> Result<PrivateKey, AuthError> {
    tokio::task::spawn_blocking(PrivateKey::generate_rsa_2048)
        .await
        .map_err(|_| AuthError::Internal("the key generation task failed"))?
        .map_err(AuthError::SessionKey)
}

/// Whether the identity domain, the proxymux or the instance principal's federation
/// answered with an error status: it issued nothing. A broken connection or a timeout may
/// have lost a token bound to the key, and an unusable 200 may hold one; those keys are
/// dropped.
fn answered_without_a_token(error: &AuthError) -> bool {
    match error {
        AuthError::TokenExchange { .. }
        | AuthError::Status {
            endpoint: Endpoint::Proxymux | Endpoint::Federation,
            ..
        } => true,
        AuthError::Shared(shared) => answered_without_a_token(shared),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn refusal() -> AuthError {
        AuthError::TokenExchange {
            namespace: "a".into(),
            service_account: "b".into(),
            status: 400,
            error: Some("invalid_grant".into()),
            description: None,
        }
    }

    fn pool() -> (Arc<SessionKeys>, watch::Sender<()>) {
        let (open, closed) = watch::channel(());
        (Arc::new(SessionKeys::new(closed, SESSION_KEYS_AHEAD)), open)
    }

    /// Waits (real time: keys take real CPU) until the pool's counts satisfy `done`.
    async fn until(keys: &SessionKeys, done: impl Fn(&KeyCounts) -> bool) -> KeyCounts {
        for _ in 0..6000 {
            let counts = keys.counts();
            if done(&counts) {
                return counts;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the pool never got there: {:?}", keys.counts());
    }

    #[tokio::test]
    async fn a_taken_key_is_replaced_in_the_background_and_the_next_takes_wait_for_none() {
        let (keys, _open) = pool();
        // The first take finds the pool empty: it waits for the first key generated.
        keys.take().await.unwrap();
        let full = SESSION_KEYS_AHEAD as u64 + 1;
        until(&keys, |c| c.generated == full).await;
        for _ in 0..SESSION_KEYS_AHEAD {
            keys.take().await.unwrap();
        }
        let counts = keys.counts();
        assert_eq!(
            (counts.waited, counts.ready),
            (1, SESSION_KEYS_AHEAD as u64)
        );
        // Each take started the refill again: the pool fills up to its bound, no more.
        let counts = until(&keys, |c| c.generated == full + SESSION_KEYS_AHEAD as u64).await;
        assert_eq!(counts.most_held, SESSION_KEYS_AHEAD as u64);
        assert_eq!(
            super::super::lock(&keys.state).keys.len(),
            SESSION_KEYS_AHEAD
        );
    }

    #[tokio::test]
    async fn a_storm_of_takes_makes_at_most_one_generation_each_and_the_pool_size() {
        let (keys, _open) = pool();
        let takes: Vec<_> = (0..12)
            .map(|_| {
                let keys = keys.clone();
                tokio::spawn(
                    async move { keys.take().await.unwrap().public_key_spki_der().to_vec() },
                )
            })
            .collect();
        let mut distinct = std::collections::BTreeSet::new();
        for take in takes {
            distinct.insert(take.await.unwrap());
        }
        assert_eq!(distinct.len(), 12, "every take its own key");
        let counts = until(&keys, |c| {
            !super::super::lock(&keys.state).refilling && c.generated >= 12
        })
        .await;
        assert!(
            counts.generated <= 12 + SESSION_KEYS_AHEAD as u64,
            "{counts:?}"
        );
        assert!(counts.most_held <= SESSION_KEYS_AHEAD as u64, "{counts:?}");
    }

    #[tokio::test]
    async fn a_refused_exchanges_key_goes_back_to_the_pool_and_a_lost_ones_does_not() {
        let (keys, _open) = pool();
        let first = keys.take().await.unwrap();
        let spki = first.public_key_spki_der().to_vec();
        // Taken at once from now on: the pool is full.
        until(&keys, |c| c.generated == SESSION_KEYS_AHEAD as u64 + 1).await;
        let taken: Vec<_> = (0..SESSION_KEYS_AHEAD).map(|_| keys.take()).collect();
        let mut held = Vec::new();
        for take in taken {
            held.push(take.await.unwrap());
        }
        keys.give_back(first, &refusal());
        let again = keys.take().await.unwrap();
        assert_eq!(again.public_key_spki_der(), spki.as_slice());
        // Held elsewhere (bound to a session), or lost with the connection: not returned.
        keys.give_back(Arc::clone(&again), &refusal());
        keys.give_back(again, &AuthError::DeadlineExceeded("exchanging"));
        assert_eq!(keys.counts().returned, 1);
    }

    #[tokio::test]
    async fn a_filled_pool_serves_its_first_takes_at_once_and_a_pool_of_none_generates_each() {
        let (keys, _open) = pool();
        keys.fill();
        let counts = until(&keys, |c| c.held == SESSION_KEYS_AHEAD as u64).await;
        assert_eq!(counts.generated, SESSION_KEYS_AHEAD as u64);
        for _ in 0..SESSION_KEYS_AHEAD {
            keys.take().await.unwrap();
        }
        assert_eq!(
            (keys.counts().ready, keys.counts().waited),
            (SESSION_KEYS_AHEAD as u64, 0)
        );
        let (open, closed) = watch::channel(());
        let none = Arc::new(SessionKeys::new(closed, 0));
        none.fill();
        for _ in 0..2 {
            none.take().await.unwrap();
        }
        let counts = none.counts();
        assert_eq!((counts.generated, counts.waited, counts.held), (2, 2, 0));
        assert!(!super::super::lock(&none.state).refilling);
        drop(open);
    }

    #[tokio::test]
    async fn the_refill_ends_with_the_principals() {
        let (keys, open) = pool();
        keys.take().await.unwrap();
        drop(open);
        let at_close = keys.counts().generated;
        // Longer than a generation: the one in flight when the principals went is dropped
        // (wiped), and no other starts.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(keys.counts().generated, at_close);
        // A take after the end is still served: generated for it alone once the pool is
        // empty.
        let held = super::super::lock(&keys.state).keys.len();
        for _ in 0..=held {
            keys.take().await.unwrap();
        }
        assert_eq!(keys.counts().generated, at_close + 1);
    }
}
