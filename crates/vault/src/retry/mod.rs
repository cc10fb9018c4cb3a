//! Retries of the Secrets and Certificates calls as a layer: [`RetryLayer`] makes
//! [`Retry`], which sends each request to the client below as numbered [`Attempt`]s until
//! one succeeds, a failure is permanent, the attempts run out or the next wait would pass
//! the request's deadline.

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt as _};

use crate::client::{Attempt, Call, subject};
use crate::error::{Stopped, VaultError};

mod counts;
mod policy;

pub use counts::{Retries, RetryReason};
pub use policy::RetryPolicy;
pub(crate) use policy::unit_random;

/// Retries transient failures (see [`VaultError::is_retryable`]) with the backoff of a
/// [`RetryPolicy`], honouring `Retry-After` and never sleeping past the request's deadline.
/// While a retry waits, the [`crate::BackoffHook`] the request carries ([`Call::backoff`],
/// if one is set) is told, and may stop the retries ([`VaultError::BudgetFull`]). A call
/// that fails after retrying is [`VaultError::Exhausted`], annotating the last failure.
/// Every service this layer makes counts into the same [`Retries`].
#[derive(Clone, Debug)]
pub struct RetryLayer {
    policy: RetryPolicy,
    retries: Arc<Retries>,
}

impl RetryLayer {
    /// Retries by `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            retries: Arc::default(),
        }
    }

    /// The retries and give-ups of every service of this layer, by reason (for metrics).
    pub fn retries(&self) -> Arc<Retries> {
        Arc::clone(&self.retries)
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry {
            inner,
            policy: self.policy.clone(),
            retries: self.retries(),
        }
    }
}

/// The service of [`RetryLayer`]: a request `R` in, its answer out, each attempt an
/// [`Attempt<R>`] to the service below (a [`crate::VaultClient`]).
#[derive(Clone, Debug)]
pub struct Retry<S> {
    inner: S,
    policy: RetryPolicy,
    retries: Arc<Retries>,
}

impl<S> Retry<S> {
    /// The retries and give-ups counted so far, by reason.
    pub fn retries(&self) -> Arc<Retries> {
        Arc::clone(&self.retries)
    }
}

impl<S, R> Service<R> for Retry<S>
where
    R: Call,
    S: Service<Attempt<R>, Response = R::Answer, Error = VaultError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = R::Answer;
    type Error = VaultError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<R::Answer, VaultError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), VaultError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        // The first attempt goes to the service made ready above; later ones drive it to
        // readiness again.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let retrying = Retrying {
            policy: self.policy.clone(),
            retries: self.retries(),
            request: Arc::new(request),
        };
        Box::pin(retrying.run(ready))
    }
}

/// One call in progress.
struct Retrying<R> {
    policy: RetryPolicy,
    retries: Arc<Retries>,
    request: Arc<R>,
}

impl<R: Call> Retrying<R> {
    async fn run<S>(self, mut service: S) -> Result<R::Answer, VaultError>
    where
        S: Service<Attempt<R>, Response = R::Answer, Error = VaultError>,
    {
        let deadline = self.request.deadline();
        let max_attempts = self.policy.max_attempts.max(1);
        let mut attempts = 0u32;
        loop {
            if Instant::now() >= deadline {
                return Err(VaultError::DeadlineExceeded {
                    subject: subject(&*self.request),
                    attempts,
                });
            }
            attempts += 1;
            let attempt = Attempt {
                request: Arc::clone(&self.request),
                number: attempts,
                retries: max_attempts > 1,
            };
            let answer = match service.ready().await {
                Ok(ready) => ready.call(attempt).await,
                Err(error) => Err(error),
            };
            let error = match answer {
                Ok(answer) => return Ok(answer),
                Err(error) => error,
            };
            let now = Instant::now();
            if !error.is_retryable() || (now >= deadline && attempts == 1) {
                return Err(error);
            }
            if attempts >= max_attempts {
                return Err(self.give_up(attempts, Stopped::MaxAttempts, error));
            }
            let retry_after = error.retry_after_secs().map(std::time::Duration::from_secs);
            let delay = self.policy.delay(attempts, retry_after, unit_random());
            // A Retry-After near u64::MAX seconds cannot be added to a clock: it is past
            // any deadline.
            if now.checked_add(delay).is_none_or(|at| at >= deadline) {
                return Err(self.give_up(attempts, Stopped::Deadline, error));
            }
            tracing::debug!(
                secret = %self.request.describe(),
                principal = %self.request.identity(),
                attempt = attempts,
                error = %crate::ErrorChain(&error),
                delay_ms = delay.as_millis() as u64,
                api = R::API,
                "retrying OCI call"
            );
            self.retries.count(RetryReason::of(&error));
            // No answer is held while sleeping: the caller's reservation goes back meanwhile.
            let backoff = self.request.backoff();
            backoff.pausing();
            tokio::time::sleep(delay).await;
            if !backoff.resuming() {
                return Err(VaultError::BudgetFull {
                    subject: subject(&*self.request),
                    last: Box::new(error),
                });
            }
        }
    }

    fn give_up(&self, attempts: u32, stopped: Stopped, last: VaultError) -> VaultError {
        self.retries.count_gave_up(RetryReason::of(&last));
        tracing::debug!(
            secret = %self.request.describe(),
            principal = %self.request.identity(),
            attempts,
            ?stopped,
            api = R::API,
            "giving up on OCI call"
        );
        VaultError::Exhausted {
            attempts,
            stopped,
            last: Box::new(last),
        }
    }
}
