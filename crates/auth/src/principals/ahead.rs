//! Sessions refreshed ahead of their expiry, in the background. A session is due from its
//! `refresh_at` (the earlier of half its life and five minutes before it expires) and serves
//! until five minutes before it expires. The first mount that finds it due starts one
//! refresh (one exchange, in a task of its own) and, like every mount after it, is served
//! from the valid session without waiting. A failed refresh is tried again after a wait that
//! doubles from `PrincipalsConfig::refresh_retry` up to [`MAX_RETRY_WAIT`], jittered, for as
//! long as the session still serves after the wait; each exchange it attempts is counted
//! (`op` `ahead`), and an attempt its namespace's pace has no turn for is tried again later.
//!
//! Only a session past serving makes mounts wait: their fetch (the cache's single flight)
//! joins the attempt in flight, or, between attempts, stops the refresh and exchanges itself,
//! so one identity never has two exchanges at once. Each refresh task ends when the
//! principals are dropped, and holds them only during an attempt.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::Identity;
use crate::error::AuthError;

/// The longest wait between two attempts of a failing refresh.
pub(super) const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// How long one attempt's exchange may take (its namespace's turn aside).
pub(super) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// One refresh of one session, as its principal does it.
pub(super) trait Refresh: Send + Sync + 'static {
    /// What the sessions are cached by.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;
    /// The session.
    type Session: Clone + Send + Sync + 'static;

    fn key(&self) -> &Self::Key;

    /// Who is refreshed (names only, for the log).
    fn identity(&self) -> Identity;

    /// The principals' clock.
    fn now(&self) -> SystemTime;

    /// Until when the session being refreshed serves: no attempt starts after.
    fn serves_until(&self) -> SystemTime;

    /// Whether the session being refreshed is still the one cached, and serves.
    fn serves(&self) -> impl Future<Output = bool> + Send;

    /// One attempt: one exchange, counted.
    fn attempt(&self) -> impl Future<Output = Result<Self::Session, AuthError>> + Send;

    /// Puts `session` in the place of the one refreshed, if that one is still cached.
    fn store(&self, session: &Self::Session) -> impl Future<Output = ()> + Send;
}

/// The refreshes of one kind of session running now, by key.
pub(super) struct Ahead<K, V> {
    flights: std::sync::Mutex<HashMap<K, Flight<V>>>,
    first_wait: Duration,
    /// Closed when the principals are dropped.
    open: watch::Receiver<()>,
}

/// Where one key's refresh is.
enum Flight<V> {
    /// An attempt is in flight; the receiver says how it ended.
    Attempting(watch::Receiver<Outcome<V>>),
    /// Waiting to try again.
    Waiting,
    /// A mount found the session past serving between attempts and exchanges itself: the
    /// refresh ends when its wait does.
    Stopped,
}

#[derive(Clone)]
enum Outcome<V> {
    Running,
    Failed,
    Refreshed(V),
}

impl<K, V> fmt::Debug for Ahead<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ahead")
            .field("running", &super::lock(&self.flights).len())
            .finish_non_exhaustive()
    }
}

impl<K, V> Ahead<K, V>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// No refresh running; `first_wait` before the second attempt; every task ends when
    /// `open`'s sender is dropped.
    pub(super) fn new(first_wait: Duration, open: watch::Receiver<()>) -> Self {
        Self {
            flights: std::sync::Mutex::new(HashMap::new()),
            first_wait,
            open,
        }
    }

    /// Starts `refresh` in the background, unless a refresh of its key runs.
    pub(super) fn start<R: Refresh<Key = K, Session = V>>(self: &Arc<Self>, refresh: R) {
        let (sender, receiver) = watch::channel(Outcome::Running);
        {
            let mut flights = super::lock(&self.flights);
            if flights.contains_key(refresh.key()) {
                return;
            }
            flights.insert(refresh.key().clone(), Flight::Attempting(receiver));
        }
        // Dropped with the task (ended, or cancelled by the principals' end) or, if none
        // could start, at once: either way the key is free again.
        let registered = Registered {
            ahead: Arc::clone(self),
            key: refresh.key().clone(),
        };
        super::spawn_until_closed(&self.open, async move {
            run(&registered, refresh, sender).await;
        });
    }

    /// For a mount whose session no longer serves: the session the attempt in flight
    /// brings, if one is in flight and succeeds. Between attempts the refresh is stopped
    /// (`None`: the caller exchanges itself, and no other attempt starts meanwhile).
    pub(super) async fn join(&self, key: &K) -> Option<V> {
        let mut receiver = {
            let mut flights = super::lock(&self.flights);
            match flights.get_mut(key) {
                Some(Flight::Attempting(receiver)) => receiver.clone(),
                Some(flight @ Flight::Waiting) => {
                    *flight = Flight::Stopped;
                    return None;
                }
                Some(Flight::Stopped) | None => return None,
            }
        };
        let outcome = receiver
            .wait_for(|o| !matches!(o, Outcome::Running))
            .await
            .ok()?
            .clone();
        match outcome {
            Outcome::Refreshed(session) => Some(session),
            Outcome::Running | Outcome::Failed => None,
        }
    }

    /// Refreshes running now (tests).
    #[cfg(test)]
    fn running(&self) -> usize {
        super::lock(&self.flights).len()
    }
}

/// A key's place in [`Ahead`], taken while its refresh task lives.
struct Registered<K: Hash + Eq, V> {
    ahead: Arc<Ahead<K, V>>,
    key: K,
}

impl<K: Hash + Eq, V> Drop for Registered<K, V> {
    fn drop(&mut self) {
        super::lock(&self.ahead.flights).remove(&self.key);
    }
}

/// Attempts until one succeeds, the session stops serving, or the next attempt would start
/// after it stopped.
async fn run<R: Refresh>(
    registered: &Registered<R::Key, R::Session>,
    refresh: R,
    mut sender: watch::Sender<Outcome<R::Session>>,
) {
    let ahead = &registered.ahead;
    let mut failed = 0;
    loop {
        // After the key was registered (or set attempting): a mount that removed the
        // session before finds the attempt and joins it, one that removes it after is seen
        // here.
        if !refresh.serves().await {
            sender.send_replace(Outcome::Failed);
            return;
        }
        let error = match refresh.attempt().await {
            Ok(session) => {
                refresh.store(&session).await;
                sender.send_replace(Outcome::Refreshed(session));
                return;
            }
            Err(error) => error,
        };
        sender.send_replace(Outcome::Failed);
        failed += 1;
        let wait = retry_wait(ahead.first_wait, failed, unit_random());
        let identity = refresh.identity();
        if refresh.now() + wait >= refresh.serves_until() {
            tracing::warn!(%identity, %error, attempts = failed,
                "refreshing a session ahead failed; it serves until it expires, then a mount \
                 exchanges again");
            return;
        }
        if let AuthError::ExchangesPaced { .. } = error {
            // Not a failure: its namespace had no turn for it yet.
            tracing::debug!(%identity, ?wait, "a refresh ahead waits for its namespace's pace");
        } else {
            tracing::warn!(%identity, %error, ?wait, "refreshing a session ahead failed; trying again");
        }
        let (next, receiver) = watch::channel(Outcome::Running);
        if let Some(flight) = super::lock(&ahead.flights).get_mut(refresh.key()) {
            *flight = Flight::Waiting;
        }
        tokio::time::sleep(wait).await;
        {
            let mut flights = super::lock(&ahead.flights);
            match flights.get_mut(refresh.key()) {
                Some(flight @ Flight::Waiting) => *flight = Flight::Attempting(receiver),
                _ => return,
            }
        }
        sender = next;
    }
}

/// The wait after `failed` failed attempts: `first` doubled each time up to
/// [`MAX_RETRY_WAIT`], then a uniform value between half of that and all of it (`random` in
/// [0, 1)), so the refreshes of many identities that failed together spread out.
fn retry_wait(first: Duration, failed: u32, random: f64) -> Duration {
    let exponent = failed.saturating_sub(1).min(31);
    let backoff = first
        .checked_mul(1 << exponent)
        .unwrap_or(MAX_RETRY_WAIT)
        .min(MAX_RETRY_WAIT);
    let half = backoff / 2;
    half + (backoff - half).mul_f64(random.clamp(0.0, 1.0))
}

/// A uniform value in [0, 1) from the system RNG; 1.0 (the longest wait) if it fails.
fn unit_random() -> f64 {
    let mut bytes = [0u8; 8];
    if aws_lc_rs::rand::fill(&mut bytes).is_err() {
        return 1.0;
    }
    // The top 53 bits fill an f64 mantissa exactly.
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::time::Instant;

    use super::*;

    /// A session refreshed by a script: each attempt takes the next result (`Err` a
    /// failure), and hangs once the script is spent. Its clock is tokio's (paused).
    struct Fake {
        started: Instant,
        serves_for: Duration,
        script: Arc<std::sync::Mutex<VecDeque<Result<u32, ()>>>>,
        attempts: Arc<AtomicUsize>,
        stored: Arc<std::sync::Mutex<Vec<u32>>>,
        _alive: Arc<()>,
    }

    impl Refresh for Fake {
        type Key = u32;
        type Session = u32;

        fn key(&self) -> &u32 {
            &1
        }

        fn identity(&self) -> Identity {
            Identity::Instance
        }

        fn now(&self) -> SystemTime {
            SystemTime::UNIX_EPOCH + (Instant::now() - self.started)
        }

        fn serves_until(&self) -> SystemTime {
            SystemTime::UNIX_EPOCH + self.serves_for
        }

        async fn serves(&self) -> bool {
            self.now() < self.serves_until()
        }

        async fn attempt(&self) -> Result<u32, AuthError> {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            let next = self.script.lock().unwrap().pop_front();
            match next {
                Some(Ok(session)) => Ok(session),
                Some(Err(())) => Err(AuthError::Internal("scripted")),
                None => std::future::pending().await,
            }
        }

        async fn store(&self, session: &u32) {
            self.stored.lock().unwrap().push(*session);
        }
    }

    struct Setup {
        ahead: Arc<Ahead<u32, u32>>,
        open: Option<watch::Sender<()>>,
        script: Arc<std::sync::Mutex<VecDeque<Result<u32, ()>>>>,
        attempts: Arc<AtomicUsize>,
        stored: Arc<std::sync::Mutex<Vec<u32>>>,
        alive: Arc<()>,
    }

    impl Setup {
        fn new(script: &[Result<u32, ()>]) -> Self {
            let (open, closed) = watch::channel(());
            Self {
                ahead: Arc::new(Ahead::new(Duration::from_secs(1), closed)),
                open: Some(open),
                script: Arc::new(std::sync::Mutex::new(script.iter().copied().collect())),
                attempts: Arc::default(),
                stored: Arc::default(),
                alive: Arc::new(()),
            }
        }

        fn refresh(&self, serves_for: Duration) -> Fake {
            Fake {
                started: Instant::now(),
                serves_for,
                script: self.script.clone(),
                attempts: self.attempts.clone(),
                stored: self.stored.clone(),
                _alive: self.alive.clone(),
            }
        }

        fn attempts(&self) -> usize {
            self.attempts.load(Ordering::SeqCst)
        }

        async fn until_ended(&self) {
            while self.ahead.running() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_refresh_runs_per_key_and_a_joining_mount_gets_its_session() {
        let setup = Setup::new(&[Ok(7)]);
        let ahead = &setup.ahead;
        ahead.start(setup.refresh(Duration::from_secs(60)));
        ahead.start(setup.refresh(Duration::from_secs(60)));
        assert_eq!(ahead.join(&1).await, Some(7));
        setup.until_ended().await;
        assert_eq!(setup.attempts(), 1);
        assert_eq!(*setup.stored.lock().unwrap(), [7]);
        // Nothing runs: a mount has nothing to join.
        assert_eq!(ahead.join(&1).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_refresh_is_tried_again_after_growing_jittered_waits() {
        let setup = Setup::new(&[Err(()), Err(()), Ok(9)]);
        let started = Instant::now();
        setup.ahead.start(setup.refresh(Duration::from_secs(60)));
        setup.until_ended().await;
        assert_eq!(setup.attempts(), 3);
        assert_eq!(*setup.stored.lock().unwrap(), [9]);
        // 1 s then 2 s, each between half and all of it.
        let waited = Instant::now() - started;
        assert!(waited >= Duration::from_millis(1500), "{waited:?}");
        assert!(waited <= Duration::from_millis(3100), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_that_keeps_failing_stops_before_the_session_stops_serving() {
        let setup = Setup::new(&[Err(()); 20]);
        let started = Instant::now();
        setup.ahead.start(setup.refresh(Duration::from_secs(10)));
        setup.until_ended().await;
        // Waits of 1, 2, 4 and 8 s at most: the attempt after the last would start past
        // the ten seconds the session serves.
        let attempts = setup.attempts();
        assert!((3..=5).contains(&attempts), "{attempts}");
        assert!(Instant::now() - started < Duration::from_secs(10));
        assert!(setup.stored.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_mount_between_attempts_stops_the_refresh_and_exchanges_itself() {
        let setup = Setup::new(&[Err(()), Ok(3)]);
        setup.ahead.start(setup.refresh(Duration::from_secs(60)));
        while setup.attempts() == 0 {
            tokio::task::yield_now().await;
        }
        tokio::task::yield_now().await;
        // Waiting to try again: the mount is told to exchange itself...
        assert_eq!(setup.ahead.join(&1).await, None);
        setup.until_ended().await;
        // ...and the refresh made no other attempt.
        assert_eq!(setup.attempts(), 1);
        assert!(setup.stored.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_ends_with_the_principals() {
        let mut setup = Setup::new(&[]);
        setup.ahead.start(setup.refresh(Duration::from_secs(60)));
        while setup.attempts() == 0 {
            tokio::task::yield_now().await;
        }
        // The attempt hangs, holding its refresh.
        assert_eq!(Arc::strong_count(&setup.alive), 2);
        drop(setup.open.take());
        setup.until_ended().await;
        assert_eq!(Arc::strong_count(&setup.alive), 1);
        // None starts after the end.
        setup.ahead.start(setup.refresh(Duration::from_secs(60)));
        assert_eq!(setup.ahead.running(), 0);
        assert_eq!(Arc::strong_count(&setup.alive), 1);
    }

    #[test]
    fn retry_waits_double_up_to_a_minute_and_keep_half() {
        let first = Duration::from_secs(1);
        let longest: Vec<_> = (1..=8)
            .map(|n| retry_wait(first, n, 1.0).as_secs())
            .collect();
        assert_eq!(longest, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(retry_wait(first, 3, 0.0), Duration::from_secs(2));
        assert_eq!(retry_wait(first, u32::MAX, 0.5), Duration::from_secs(45));
    }
}
