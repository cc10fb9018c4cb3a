//! The pace of workload exchanges per namespace: a burst, then a steady rate (GCRA: one
//! instant per namespace, when its bucket would be empty again). The identity domain or the
//! proxymux is shared by every tenant of the node, and throttling there fails every
//! tenant's new sessions; a namespace asking for many identities at once is served at its
//! own pace instead.
//!
//! An exchange over the pace waits for its turn when that comes before its mount's
//! deadline: a rollout of many service accounts in one namespace is served in full, paced,
//! rather than pushed onto the kubelet's growing retry backoff. When the turn would come
//! after the deadline, the mount fails at once `ResourceExhausted` (waiting would only hold
//! its slot) and the driver retries. The map of namespaces is bounded: a namespace whose
//! bucket is full again carries nothing and is dropped first, then the one nearest to it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::refusals::MAX_NAME_BYTES;
use crate::error::AuthError;

/// The most namespaces tracked at once.
pub(super) const MAX_NAMESPACES: usize = 4096;

/// Exchanges per namespace: `burst` at once, then one every `60 s / per_minute`.
pub(super) struct ExchangePace {
    per_minute: u32,
    burst: u32,
    interval: Duration,
    /// How far ahead of now a namespace's due instant may be and still pass at once.
    tolerance: Duration,
    /// Per namespace, the instant from which its bucket is full again.
    due: std::sync::Mutex<HashMap<String, Instant>>,
    waited: AtomicU64,
    refused: AtomicU64,
}

/// Exchanges that waited for their turn, and mounts refused because it came too late.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct PaceCounts {
    pub(super) waited: u64,
    pub(super) refused: u64,
}

impl ExchangePace {
    /// At least one a minute, bursts of at least one.
    pub(super) fn new(per_minute: u32, burst: u32) -> Self {
        let (per_minute, burst) = (per_minute.max(1), burst.max(1));
        let interval = Duration::from_secs(60) / per_minute;
        Self {
            per_minute,
            burst,
            interval,
            tolerance: interval * (burst - 1),
            due: std::sync::Mutex::new(HashMap::new()),
            waited: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Waits for the namespace's turn, or fails at once if it comes after `deadline`.
    pub(super) async fn admit(
        &self,
        namespace: &str,
        deadline: tokio::time::Instant,
    ) -> Result<(), AuthError> {
        let now = Instant::now();
        let turn = self.reserve(namespace, now, deadline)?;
        if turn > now {
            self.waited.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(wait = ?(turn - now), "a token exchange waits for its namespace's pace");
            tokio::time::sleep_until(turn).await;
        }
        Ok(())
    }

    /// The namespace's next turn, taken, unless it comes after `deadline`.
    fn reserve(
        &self,
        namespace: &str,
        now: Instant,
        deadline: Instant,
    ) -> Result<Instant, AuthError> {
        // No namespace has a longer name: such requests share one bucket.
        let key = if namespace.len() > MAX_NAME_BYTES {
            ""
        } else {
            namespace
        };
        let mut due = super::lock(&self.due);
        let full_at = due.get(key).copied().filter(|at| *at > now).unwrap_or(now);
        let turn = full_at
            .checked_sub(self.tolerance)
            .map_or(now, |at| at.max(now));
        if turn > deadline {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(AuthError::ExchangesPaced {
                namespace: key.to_owned(),
                wait: turn - now,
                per_minute: self.per_minute,
                burst: self.burst,
            });
        }
        if !due.contains_key(key) && due.len() >= MAX_NAMESPACES {
            due.retain(|_, at| *at > now);
            let nearest = due
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone());
            if let (true, Some(nearest)) = (due.len() >= MAX_NAMESPACES, nearest) {
                due.remove(&nearest);
            }
        }
        due.insert(key.to_owned(), full_at + self.interval);
        Ok(turn)
    }

    pub(super) fn counts(&self) -> PaceCounts {
        PaceCounts {
            waited: self.waited.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_passes_then_the_rest_wait_their_turn_and_other_namespaces_do_not() {
        // Two at once, then one a second.
        let pace = ExchangePace::new(60, 2);
        let start = Instant::now();
        let deadline = start + Duration::from_secs(10);
        for expected in [0, 0, 1, 2, 3] {
            pace.admit("a", deadline).await.unwrap();
            assert_eq!((Instant::now() - start).as_secs(), expected);
        }
        let before = Instant::now();
        pace.admit("b", deadline).await.unwrap();
        assert_eq!(Instant::now(), before, "another namespace's burst");
        assert_eq!(
            pace.counts(),
            PaceCounts {
                waited: 3,
                refused: 0
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_after_the_deadline_fails_at_once_and_takes_no_turn() {
        let pace = ExchangePace::new(1, 1);
        let start = Instant::now();
        pace.admit("a", start + Duration::from_secs(5))
            .await
            .unwrap();
        let error = pace
            .admit("a", start + Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(Instant::now(), start, "no wait");
        assert_eq!(error.kind(), crate::ErrorKind::ResourceExhausted);
        let message = error.to_string();
        assert!(message.contains("namespace \"a\""), "{message}");
        assert!(message.contains("1 a minute"), "{message}");
        assert!(
            message.contains("auth.workload.namespace_exchanges_per_minute"),
            "{message}"
        );
        // The refused mount took no turn: the next is due a minute after the first.
        tokio::time::advance(Duration::from_secs(60)).await;
        pace.admit("a", Instant::now()).await.unwrap();
        assert_eq!(pace.counts().refused, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_namespaces_tracked_are_bounded() {
        let pace = ExchangePace::new(1, 1);
        let far = Instant::now() + Duration::from_secs(3600);
        for i in 0..MAX_NAMESPACES + 10 {
            pace.admit(&format!("ns-{i}"), far).await.unwrap();
        }
        assert_eq!(super::super::lock(&pace.due).len(), MAX_NAMESPACES);
        // A name no namespace can have shares the bucket of all such names.
        let long = "n".repeat(MAX_NAME_BYTES + 1);
        pace.admit(&long, far).await.unwrap();
        let error = pace
            .admit(&"m".repeat(MAX_NAME_BYTES + 1), Instant::now())
            .await
            .unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::ResourceExhausted);
    }
}
