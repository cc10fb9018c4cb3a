//! What a fetch holds while it waits out a retry backoff.
//!
//! The caller of a fetch (the provider's byte budget) may hold memory on its behalf: what
//! the answer may take. A fetch sleeping between attempts holds no answer, so the client
//! tells the caller's [`Backoff`] hook, if the fetch runs inside [`with_backoff`], before
//! each sleep (`pausing`: give the reservation back) and after it (`resuming`: take it
//! again, or stop with [`crate::VaultError::BudgetFull`] when it cannot be had now).

use std::future::Future;
use std::sync::Arc;

/// Told of the sleeps between attempts of a fetch; must not block.
pub trait Backoff: Send + Sync {
    /// The fetch is about to sleep before its next attempt.
    fn pausing(&self);
    /// The fetch woke up for its next attempt; `false`: it may not go on now (the caller's
    /// budget is taken by others), and it fails with [`crate::VaultError::BudgetFull`].
    fn resuming(&self) -> bool;
}

tokio::task_local! {
    static HOOK: Arc<dyn Backoff>;
}

/// Runs `fetch` (a call of [`crate::VaultClient`], through any layers in between, such as
/// the cache) with `hook` told of its backoff sleeps.
pub async fn with_backoff<F: Future>(hook: Arc<dyn Backoff>, fetch: F) -> F::Output {
    HOOK.scope(hook, fetch).await
}

pub(crate) fn pausing() {
    let _ = HOOK.try_with(|hook| hook.pausing());
}

pub(crate) fn resuming() -> bool {
    HOOK.try_with(|hook| hook.resuming()).unwrap_or(true)
}
