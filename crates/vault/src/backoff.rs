//! What a fetch holds while it waits out a retry backoff.
//!
//! The caller of a fetch (the provider's byte budget) may hold memory on its behalf: what
//! the answer may take. A fetch sleeping between attempts holds no answer, so the retry
//! layer tells the [`BackoffHook`] the request carries (its [`Backoff`] field) before each
//! sleep (`pausing`: give the reservation back) and after it (`resuming`: take it again, or
//! stop with [`crate::VaultError::BudgetFull`] when it cannot be had now).
//!
//! The hook travels in the request, not in the task that runs it, so it reaches the retries
//! whichever task drives them; a caller above the retries sets it with [`WithBackoff`].

use std::fmt;
use std::sync::Arc;

/// Told of the sleeps between attempts of a fetch; must not block. A request may be cloned
/// and kept past its fetch (by a cache's fetch, a test double), the hook with it: a hook
/// that holds something for the fetch should reach it weakly (the provider's budget does).
pub trait BackoffHook: Send + Sync {
    /// The fetch is about to sleep before its next attempt.
    fn pausing(&self);
    /// The fetch woke up for its next attempt; `false`: it may not go on now (the caller's
    /// budget is taken by others), and it fails with [`crate::VaultError::BudgetFull`].
    fn resuming(&self) -> bool;
}

/// The [`BackoffHook`] a request carries, if any ([`Backoff::none`], the default: the
/// retries sleep without telling anyone). Clones share the hook. Not part of any cache key:
/// it is the caller's budget, not what is asked.
#[derive(Clone, Default)]
pub struct Backoff(Option<Arc<dyn BackoffHook>>);

impl Backoff {
    /// No hook.
    pub const fn none() -> Self {
        Self(None)
    }

    /// `hook` told of the request's backoff sleeps.
    pub fn new(hook: Arc<dyn BackoffHook>) -> Self {
        Self(Some(hook))
    }

    /// Whether a hook is set.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Tells the hook, if any, that the fetch is about to sleep.
    pub(crate) fn pausing(&self) {
        if let Some(hook) = &self.0 {
            hook.pausing();
        }
    }

    /// Asks the hook, if any, whether the fetch may go on; without a hook it may.
    pub(crate) fn resuming(&self) -> bool {
        self.0.as_ref().is_none_or(|hook| hook.resuming())
    }
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_set() {
            "Backoff(set)"
        } else {
            "Backoff(none)"
        })
    }
}

/// A request that carries a [`Backoff`]: what a caller above the retries (the provider's
/// byte budget) uses to put its hook in the request it passes on.
pub trait WithBackoff {
    /// The request with `backoff` in place of the hook it carried.
    fn with_backoff(self, backoff: Backoff) -> Self;
}

impl WithBackoff for crate::SecretRequest {
    fn with_backoff(self, backoff: Backoff) -> Self {
        Self { backoff, ..self }
    }
}

impl WithBackoff for crate::CertificateRequest {
    fn with_backoff(self, backoff: Backoff) -> Self {
        Self { backoff, ..self }
    }
}

/// Each page of the listing carries the listing's hook ([`crate::PageRequest::list`]).
impl WithBackoff for crate::ListRequest {
    fn with_backoff(self, backoff: Backoff) -> Self {
        Self { backoff, ..self }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Counting(AtomicUsize);

    impl BackoffHook for Counting {
        fn pausing(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn resuming(&self) -> bool {
            false
        }
    }

    #[test]
    fn debug_says_only_whether_a_hook_is_set_and_none_lets_the_retries_go_on() {
        let none = Backoff::default();
        assert_eq!(format!("{none:?}"), "Backoff(none)");
        none.pausing();
        assert!(none.resuming(), "without a hook the fetch goes on");
        let hook = Arc::new(Counting(AtomicUsize::new(0)));
        let set = Backoff::new(hook.clone());
        assert_eq!(format!("{:?}", set.clone()), "Backoff(set)");
        set.pausing();
        assert!(!set.resuming());
        assert_eq!(hook.0.load(Ordering::Relaxed), 1);
    }
}
