//! An injectable wall clock: [`SystemClock`] in production, [`ManualClock`] in tests, shared
//! as a [`SharedClock`] by the caches, the signing layer and the emulator.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

/// The source of wall-clock time for token expiry decisions and the signed `date` header.
///
/// Production code uses [`SystemClock`]; tests share one [`ManualClock`] between the
/// provider and the emulator so refresh boundaries can be tested without sleeping.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// A clock handle shared across layers.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use oci_csi_clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_672_954_300));
/// clock.advance(Duration::from_secs(60));
/// assert_eq!(clock.now(), UNIX_EPOCH + Duration::from_secs(1_672_954_360));
/// ```
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
}

impl ManualClock {
    /// A clock stopped at `now`.
    pub fn new(now: SystemTime) -> Self {
        Self {
            now: Mutex::new(now),
        }
    }

    /// Sets the time.
    pub fn set(&self, now: SystemTime) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = now;
    }

    /// Moves the time forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let clock = ManualClock::new(start);
        assert_eq!(clock.now(), start);
        assert_eq!(clock.now(), start, "reading does not move it");
        clock.advance(Duration::from_secs(30));
        assert_eq!(clock.now(), start + Duration::from_secs(30));
        clock.set(start);
        assert_eq!(clock.now(), start);
    }

    #[test]
    fn every_holder_of_a_shared_clock_reads_the_same_time() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let manual = Arc::new(ManualClock::new(start));
        let (a, b): (SharedClock, SharedClock) = (manual.clone(), manual.clone());
        manual.advance(Duration::from_secs(5));
        assert_eq!(a.now(), start + Duration::from_secs(5));
        assert_eq!(a.now(), b.now());
    }

    #[test]
    fn the_system_clock_reads_the_system_time() {
        let before = SystemTime::now();
        let read = SystemClock.now();
        let after = SystemTime::now();
        assert!(before <= read && read <= after, "{read:?}");
    }
}
