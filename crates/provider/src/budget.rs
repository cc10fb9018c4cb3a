//! The process-wide budget of bytes held by mounts in flight, and the one way a mount
//! fetches anything from upstream.
//!
//! Every fetch reserves what its answer may take before it starts (bodies are buffered
//! whole, up to the client's body limit), and gives back what the answer did not use once
//! it arrives; the rest is held until the mount's answer is handed to the gRPC layer. A
//! fetch that finds the budget used up fails its mount with `ResourceExhausted` at once
//! (the driver retries), so memory stays bounded whatever the number of mounts. One
//! namespace holds at most its share of the budget, so a tenant whose fetches stall cannot
//! take the bytes every other namespace needs.
//!
//! [`crate::BudgetLayer`] (`layers/budget.rs`) is the one way a fetch is counted: its service
//! takes a [`Metered`] request (which only the mount service makes) and answers [`Held`]
//! (which only it makes),
//! and `OciMount` takes fetch services that answer `Held`. So every fetch kind (secrets,
//! certificates, listings, any future kind) goes through the reservation, the namespace's share and
//! the mount's running total, or does not compile. While a fetch waits out a retry backoff
//! its reservation goes back: the budget puts its `vault::BackoffHook` in the request it
//! passes on (`vault::WithBackoff`), and the retries below tell it of each wait.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A shared byte budget; clones share it.
#[derive(Clone)]
pub struct ByteBudget {
    inner: Arc<Inner>,
}

struct Inner {
    capacity: usize,
    per_namespace: usize,
    state: Mutex<State>,
    high_water: AtomicUsize,
    refused: AtomicUsize,
}

#[derive(Default)]
struct State {
    used: usize,
    /// Bytes held per namespace; a namespace holding nothing has no entry.
    namespaces: HashMap<Arc<str>, usize>,
}

impl fmt::Debug for ByteBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByteBudget")
            .field("capacity", &self.inner.capacity)
            .field("per_namespace", &self.inner.per_namespace)
            .field("used", &self.used())
            .field("high_water", &self.high_water())
            .finish()
    }
}

/// Why a reservation was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The whole budget is in use.
    Budget {
        /// `server.max_in_flight_bytes`.
        capacity: usize,
    },
    /// The namespace holds its share already.
    NamespaceShare {
        /// The namespace.
        namespace: Arc<str>,
        /// `server.max_in_flight_bytes_per_namespace`.
        share: usize,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Budget { capacity } => write!(
                f,
                "the provider is holding its budget of {capacity} bytes for mounts in flight \
                 (server.max_in_flight_bytes) for other mounts; the driver will retry this one"
            ),
            Refusal::NamespaceShare { namespace, share } => write!(
                f,
                "the mounts of namespace {namespace} in flight hold its share of {share} bytes \
                 (server.max_in_flight_bytes_per_namespace); the driver will retry this one"
            ),
        }
    }
}

impl ByteBudget {
    /// A budget of `capacity` bytes, any namespace may hold all of it.
    pub fn new(capacity: usize) -> Self {
        Self::with_namespace_share(capacity, capacity)
    }

    /// A budget of `capacity` bytes of which one namespace holds more than `per_namespace`
    /// only while `per_namespace` bytes stay free for the other namespaces.
    pub fn with_namespace_share(capacity: usize, per_namespace: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                capacity,
                per_namespace: per_namespace.min(capacity),
                state: Mutex::new(State::default()),
                high_water: AtomicUsize::new(0),
                refused: AtomicUsize::new(0),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves `bytes` with no namespace, or `None` if that would pass the capacity.
    pub fn try_reserve(&self, bytes: usize) -> Option<Reservation> {
        self.reserve(None, bytes).ok()
    }

    /// Reserves `bytes` for `namespace`: refused past the capacity or past the namespace's
    /// share.
    pub fn try_reserve_for(
        &self,
        namespace: &Arc<str>,
        bytes: usize,
    ) -> Result<Reservation, Refusal> {
        self.reserve(Some(namespace), bytes)
    }

    fn reserve(&self, namespace: Option<&Arc<str>>, bytes: usize) -> Result<Reservation, Refusal> {
        let mut state = self.state();
        let refuse = |refusal| {
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
            Err(refusal)
        };
        let Some(next) = state
            .used
            .checked_add(bytes)
            .filter(|n| *n <= self.inner.capacity)
        else {
            return refuse(Refusal::Budget {
                capacity: self.inner.capacity,
            });
        };
        if let Some(namespace) = namespace {
            let held = state.namespaces.get(namespace).copied().unwrap_or(0);
            // Past its share a namespace still reserves while one share stays free for the
            // others: the share binds only when another namespace may need the bytes.
            let past_share = held.saturating_add(bytes) > self.inner.per_namespace;
            let leaves_a_share =
                next.saturating_add(self.inner.per_namespace) <= self.inner.capacity;
            if past_share && !leaves_a_share {
                return refuse(Refusal::NamespaceShare {
                    namespace: namespace.clone(),
                    share: self.inner.per_namespace,
                });
            }
            *state.namespaces.entry(namespace.clone()).or_default() += bytes;
        }
        state.used = next;
        self.inner.high_water.fetch_max(next, Ordering::Relaxed);
        Ok(Reservation {
            budget: self.clone(),
            namespace: namespace.cloned(),
            bytes,
        })
    }

    fn release(&self, namespace: Option<&Arc<str>>, bytes: usize) {
        let mut state = self.state();
        state.used = state.used.saturating_sub(bytes);
        if let Some(namespace) = namespace
            && let Some(held) = state.namespaces.get_mut(namespace)
        {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                state.namespaces.remove(namespace);
            }
        }
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// The most one namespace holds.
    pub fn namespace_share(&self) -> usize {
        self.inner.per_namespace
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.state().used
    }

    /// Bytes `namespace` holds now.
    pub fn used_by(&self, namespace: &str) -> usize {
        self.state().namespaces.get(namespace).copied().unwrap_or(0)
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
    namespace: Option<Arc<str>>,
    bytes: usize,
}

impl Reservation {
    /// Keeps only `bytes` of the reservation (what the answer really took), giving the
    /// rest back; asking for more than is held keeps what is held.
    pub fn shrink_to(&mut self, bytes: usize) {
        let released = self.bytes.saturating_sub(bytes);
        self.budget.release(self.namespace.as_ref(), released);
        self.bytes -= released;
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.namespace.as_ref(), self.bytes);
    }
}

/// How many bytes an upstream answer holds once it has arrived.
pub trait Weigh {
    /// The bytes held (content, PEM text, keys).
    fn weight(&self) -> usize;
}

impl Weigh for vault::SecretBundle {
    fn weight(&self) -> usize {
        self.content.len()
    }
}

impl<T: Weigh> Weigh for cache::Cached<T> {
    fn weight(&self) -> usize {
        self.value.weight()
    }
}

impl Weigh for vault::Listing {
    /// The names and OCIDs a listing keeps (what the cache counts too).
    fn weight(&self) -> usize {
        cache::CacheValue::bytes(self)
    }
}

impl Weigh for vault::CertificateBundle {
    fn weight(&self) -> usize {
        let secret = |s: &Option<vault::SecretContent>| s.as_ref().map_or(0, |c| c.len());
        self.certificate_pem.len()
            + self.chain_pem.as_ref().map_or(0, String::len)
            + secret(&self.private_key_pem)
            + secret(&self.private_key_passphrase)
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

    #[test]
    fn one_namespace_past_its_share_leaves_a_share_for_the_others() {
        let budget = ByteBudget::with_namespace_share(100, 25);
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        // Alone, a goes past its share while one share stays free: 75 bytes.
        let held: Vec<_> = (0..15)
            .map(|_| budget.try_reserve_for(&a, 5).unwrap())
            .collect();
        let refusal = budget.try_reserve_for(&a, 1).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::NamespaceShare {
                namespace: a.clone(),
                share: 25
            }
        );
        assert!(refusal.to_string().contains("namespace a"), "{refusal}");
        assert!(
            refusal
                .to_string()
                .contains("server.max_in_flight_bytes_per_namespace")
        );
        // b finds its share free.
        let other = budget.try_reserve_for(&b, 25).unwrap();
        assert_eq!(
            (budget.used_by("a"), budget.used_by("b"), budget.used()),
            (75, 25, 100)
        );
        assert!(budget.try_reserve_for(&b, 1).is_err(), "the budget is full");
        drop(held);
        drop(other);
        assert_eq!(budget.used(), 0);
        assert_eq!(
            budget.state().namespaces.len(),
            0,
            "empty namespaces are forgotten"
        );
    }
}
