//! The process-wide budget of bytes held by mounts in flight.
//!
//! Every fetch reserves what its answer may take before it starts (bodies are buffered
//! whole, up to the Secrets client's body limit), and gives back what the secret did not
//! use once it arrives; the rest is held until the mount's answer is handed to the gRPC
//! layer. A fetch that finds the budget used up fails its mount with `ResourceExhausted`
//! at once (the driver retries), so memory stays bounded whatever the number of mounts.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A shared byte budget; clones share it.
#[derive(Clone)]
pub struct ByteBudget {
    inner: Arc<Inner>,
}

struct Inner {
    capacity: usize,
    used: AtomicUsize,
    high_water: AtomicUsize,
    refused: AtomicUsize,
}

impl fmt::Debug for ByteBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByteBudget")
            .field("capacity", &self.inner.capacity)
            .field("used", &self.used())
            .field("high_water", &self.high_water())
            .finish()
    }
}

impl ByteBudget {
    /// A budget of `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                capacity,
                used: AtomicUsize::new(0),
                high_water: AtomicUsize::new(0),
                refused: AtomicUsize::new(0),
            }),
        }
    }

    /// Reserves `bytes`, or `None` if that would pass the capacity.
    pub fn try_reserve(&self, bytes: usize) -> Option<Reservation> {
        let mut used = self.inner.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used
                .checked_add(bytes)
                .filter(|n| *n <= self.inner.capacity)
            else {
                self.inner.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            match self.inner.used.compare_exchange_weak(
                used,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.inner.high_water.fetch_max(next, Ordering::Relaxed);
                    return Some(Reservation {
                        budget: self.clone(),
                        bytes,
                    });
                }
                Err(actual) => used = actual,
            }
        }
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// The most bytes ever reserved at once.
    pub fn high_water(&self) -> usize {
        self.inner.high_water.load(Ordering::Relaxed)
    }

    /// Reservations refused since start (each fails its mount with ResourceExhausted).
    pub fn refused(&self) -> usize {
        self.inner.refused.load(Ordering::Relaxed)
    }
}

/// Bytes held from a [`ByteBudget`] until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: ByteBudget,
    bytes: usize,
}

impl Reservation {
    /// Keeps only `bytes` of the reservation (what the answer really took), giving the
    /// rest back; asking for more than is held keeps what is held.
    pub fn shrink_to(&mut self, bytes: usize) {
        let released = self.bytes.saturating_sub(bytes);
        self.budget.inner.used.fetch_sub(released, Ordering::AcqRel);
        self.bytes -= released;
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .inner
            .used
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_never_pass_the_capacity_and_give_back_what_they_do_not_use() {
        let budget = ByteBudget::new(100);
        let mut a = budget.try_reserve(60).unwrap();
        assert!(budget.try_reserve(41).is_none());
        let b = budget.try_reserve(40).unwrap();
        assert_eq!(budget.used(), 100);
        a.shrink_to(10);
        assert_eq!(budget.used(), 50);
        a.shrink_to(1000);
        assert_eq!(a.bytes(), 10);
        drop(b);
        drop(a);
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.high_water(), 100);
        assert!(budget.try_reserve(usize::MAX).is_none());
    }

    #[test]
    fn concurrent_reservations_stay_within_the_capacity() {
        let budget = ByteBudget::new(1000);
        std::thread::scope(|s| {
            for _ in 0..4 {
                let budget = budget.clone();
                s.spawn(move || {
                    for _ in 0..10_000 {
                        if let Some(mut r) = budget.try_reserve(300) {
                            r.shrink_to(7);
                        }
                    }
                });
            }
        });
        assert!(budget.high_water() <= 1000);
        assert_eq!(budget.used(), 0);
    }
}
