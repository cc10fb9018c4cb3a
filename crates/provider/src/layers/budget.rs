//! The budget's layer: every fetch of a mount within the byte bounds of [`crate::budget`]
//! (the process-wide budget, the namespace's share, the mount's running total), its
//! reservation given back while it waits out a retry backoff. A fetch is a [`Metered`]
//! request (only the mount service makes one) and its answer is [`Held`] (only [`Budget`]
//! makes one: its fields are this module's), so every fetch kind goes through it or does
//! not compile.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use tower::{Layer, Service};

use crate::budget::{ByteBudget, Refusal, Reservation, Weigh};

/// One mount's share of the bounds: its namespace (whose share of the budget its fetches
/// take), its size limit, and the running total of the bytes its fetches brought.
#[derive(Debug)]
pub(crate) struct MountBytes {
    namespace: Arc<str>,
    limit: usize,
    total: AtomicUsize,
}

impl MountBytes {
    pub(crate) fn new(namespace: &str, limit: usize) -> Arc<Self> {
        Arc::new(Self {
            namespace: Arc::from(namespace),
            limit,
            total: AtomicUsize::new(0),
        })
    }

    /// Bytes the mount's answers took so far.
    pub(crate) fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// The mount's limit (`max_total_bytes`).
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    fn over(&self) -> bool {
        self.total() > self.limit
    }

    /// Counts an answer of `weight` bytes: whether the mount is past its limit now.
    fn add(&self, weight: usize) -> bool {
        let total = self.total.fetch_add(weight, Ordering::Relaxed) + weight;
        total > self.limit
    }
}

/// A fetch of one mount, as [`Budget`] takes it: the request and the mount whose bounds it
/// counts against. Only the mount service makes them.
#[derive(Debug)]
pub struct Metered<R> {
    request: R,
    mount: Arc<MountBytes>,
}

impl<R> Metered<R> {
    pub(crate) fn new(request: R, mount: &Arc<MountBytes>) -> Self {
        Self {
            request,
            mount: Arc::clone(mount),
        }
    }

    /// The request.
    pub(crate) fn request(&self) -> &R {
        &self.request
    }
}

/// A fetch that did not run or did not finish within the bounds.
#[derive(Debug)]
pub enum Refused<E> {
    /// No reservation could be had.
    Budget(Refusal),
    /// The mount passed its size limit already (another of its fetches did); this one was
    /// not started.
    MountOver,
    /// The fetch failed.
    Failed(E),
}

/// An answer and the bytes it holds in the budget (given back when dropped). Only
/// [`Budget`] makes one, so a service that answers with `Held` went through the budget.
///
/// ```compile_fail
/// // Outside the budget, nothing can claim an answer was budgeted.
/// let held = oci_csi_provider::Held { value: 1usize, reservation: None, over: false };
/// ```
#[derive(Debug)]
pub struct Held<T> {
    value: T,
    reservation: Option<Reservation>,
    /// This answer brought the mount past its size limit.
    over: bool,
}

impl<T> Held<T> {
    /// The answer.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The answer, its bytes in the budget, and whether it brought its mount past the
    /// mount's size limit.
    pub(crate) fn into_parts(self) -> (T, Option<Reservation>, bool) {
        (self.value, self.reservation, self.over)
    }
}

/// Every fetch of a mount within the byte bounds: refused when the mount is over its size
/// limit already or when no reservation of `reserve` bytes (its namespace's share
/// included) can be had; the reservation is given back while the fetch waits out a retry
/// backoff (the request carries the budget's hook to the retries: [`vault::WithBackoff`])
/// and shrunk to the answer's [`Weigh::weight`], which counts against the mount's running
/// total.
#[derive(Clone, Debug)]
pub struct BudgetLayer {
    budget: Option<ByteBudget>,
    reserve: usize,
}

impl BudgetLayer {
    /// Fetches reserve `reserve` bytes of `budget` before they start (`None`: no process
    /// budget; the mount's size limit still applies).
    pub fn new(budget: Option<ByteBudget>, reserve: usize) -> Self {
        Self { budget, reserve }
    }
}

impl<S> Layer<S> for BudgetLayer {
    type Service = Budget<S>;

    fn layer(&self, inner: S) -> Budget<S> {
        Budget {
            inner,
            budget: self.budget.clone(),
            reserve: self.reserve,
        }
    }
}

/// The service of [`BudgetLayer`].
#[derive(Clone, Debug)]
pub struct Budget<S> {
    inner: S,
    budget: Option<ByteBudget>,
    reserve: usize,
}

impl<S, R> Service<Metered<R>> for Budget<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Response: Weigh + Send,
    S::Future: Send,
    R: vault::WithBackoff + Send + 'static,
{
    type Response = Held<S::Response>;
    type Error = Refused<S::Error>;
    type Future = BoxFuture<'static, Result<Held<S::Response>, Refused<S::Error>>>;

    // The budget refuses a fetch past it rather than making it wait, so readiness is the
    // inner service's.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Refused::Failed)
    }

    fn call(&mut self, metered: Metered<R>) -> Self::Future {
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let Metered { request, mount } = metered;
        let slot = Slot {
            budget: self.budget.clone(),
            namespace: mount.namespace.clone(),
            reserve: self.reserve,
            reservation: Mutex::new(None),
        };
        Box::pin(fetch(ready, slot, request, mount))
    }
}

/// One fetch within the bounds (see [`BudgetLayer`]).
async fn fetch<S, R>(
    mut ready: S,
    slot: Slot,
    request: R,
    mount: Arc<MountBytes>,
) -> Result<Held<S::Response>, Refused<S::Error>>
where
    S: Service<R>,
    S::Response: Weigh,
    R: vault::WithBackoff,
{
    if mount.over() {
        return Err(Refused::MountOver);
    }
    *slot.lock() = slot.reserve().map_err(Refused::Budget)?;
    let slot = Arc::new(slot);
    // The hook goes with the request, whichever task the retries below run in (it replaces
    // any the request carried). It reaches the slot through a weak handle: the reservation
    // is this fetch's alone and goes back when the fetch ends or is dropped, whoever keeps a
    // clone of the request.
    let hook = Arc::new(SlotHook(Arc::downgrade(&slot)));
    let answer = ready
        .call(request.with_backoff(vault::Backoff::new(hook)))
        .await;
    let value = answer.map_err(Refused::Failed)?;
    let weight = value.weight();
    let mut reservation = slot.lock().take();
    if let Some(r) = &mut reservation {
        r.shrink_to(weight);
    }
    let over = mount.add(weight);
    Ok(Held {
        value,
        reservation,
        over,
    })
}

/// The reservation of one fetch, which its backoff hook ([`SlotHook`]) gives back and takes
/// again while the fetch lasts.
struct Slot {
    budget: Option<ByteBudget>,
    namespace: Arc<str>,
    reserve: usize,
    reservation: Mutex<Option<Reservation>>,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Reservation>> {
        self.reservation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn reserve(&self) -> Result<Option<Reservation>, Refusal> {
        self.budget
            .as_ref()
            .map(|b| b.try_reserve_for(&self.namespace, self.reserve))
            .transpose()
    }
}

/// The backoff hook a fetch's request carries: its [`Slot`], while the fetch lasts.
struct SlotHook(Weak<Slot>);

impl vault::BackoffHook for SlotHook {
    fn pausing(&self) {
        if let Some(slot) = self.0.upgrade() {
            drop(slot.lock().take());
        }
    }

    /// Past the end of its fetch a retry takes nothing, and stops.
    fn resuming(&self) -> bool {
        let Some(slot) = self.0.upgrade() else {
            return false;
        };
        match slot.reserve() {
            Ok(reservation) => {
                *slot.lock() = reservation;
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt as _;
    use tower_test::mock;

    /// An answer of the mock below the budget's layer, weighing what it says.
    #[derive(Debug)]
    struct Answer(usize);

    impl Weigh for Answer {
        fn weight(&self) -> usize {
            self.0
        }
    }

    /// A request of the mock below: its name, and the hook the budget put in.
    #[derive(Debug)]
    struct Ask(&'static str, vault::Backoff);

    impl vault::WithBackoff for Ask {
        fn with_backoff(self, backoff: vault::Backoff) -> Self {
            Ask(self.0, backoff)
        }
    }

    fn ask(name: &'static str) -> Ask {
        Ask(name, vault::Backoff::none())
    }

    type Below = mock::Mock<Ask, Answer>;

    fn budgeted(budget: &ByteBudget, reserve: usize) -> (Budget<Below>, mock::Handle<Ask, Answer>) {
        let (inner, handle) = mock::pair();
        (
            BudgetLayer::new(Some(budget.clone()), reserve).layer(inner),
            handle,
        )
    }

    #[tokio::test]
    async fn a_fetch_reserves_before_it_starts_and_keeps_only_what_its_answer_weighs() {
        let budget = ByteBudget::with_namespace_share(1000, 1000);
        let (service, mut handle) = budgeted(&budget, 300);
        let mount = MountBytes::new("app", 10_000);
        let call = tokio::spawn(service.oneshot(Metered::new(ask("a"), &mount)));
        let (request, reply) = handle.next_request().await.unwrap();
        assert_eq!(request.0, "a");
        assert!(
            request.1.is_set(),
            "the budget's hook travels in the request"
        );
        assert_eq!(
            (budget.used(), budget.used_by("app")),
            (300, 300),
            "reserved before the fetch started"
        );
        reply.send_response(Answer(42));
        let held = call.await.unwrap().unwrap();
        assert_eq!(held.value().0, 42);
        assert_eq!(budget.used(), 42, "shrunk to the answer's weight");
        assert_eq!(mount.total(), 42, "counted against the mount");
        let (_, reservation, over) = held.into_parts();
        assert!(!over);
        drop(reservation);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_fetch_without_room_in_the_budget_is_refused_before_the_service_below() {
        let budget = ByteBudget::new(500);
        let taken = budget.try_reserve(300).unwrap();
        let (service, mut handle) = budgeted(&budget, 300);
        let mount = MountBytes::new("app", 10_000);
        let refused = service
            .oneshot(Metered::new(ask("a"), &mount))
            .await
            .unwrap_err();
        assert!(
            matches!(refused, Refused::Budget(Refusal::Budget { capacity: 500 })),
            "{refused:?}"
        );
        assert!(handle.next_request().await.is_none(), "nothing was fetched");
        drop(taken);
    }

    type Attempts = mock::Handle<vault::Attempt<vault::SecretRequest>, vault::SecretBundle>;
    type Client = tower::util::MapErr<
        mock::Mock<vault::Attempt<vault::SecretRequest>, vault::SecretBundle>,
        fn(tower::BoxError) -> vault::VaultError,
    >;

    /// The budget over the vault crate's retries over a mock of the client.
    fn budgeted_retries(
        budget: &ByteBudget,
        reserve: usize,
    ) -> (Budget<vault::Retry<Client>>, Attempts) {
        let (client, attempts) = mock::pair();
        let unbox: fn(tower::BoxError) -> vault::VaultError =
            |error| *error.downcast::<vault::VaultError>().unwrap();
        let policy = vault::RetryPolicy {
            jitter: false,
            ..vault::RetryPolicy::default()
        };
        let retries = vault::RetryLayer::new(policy).layer(client.map_err(unbox));
        let service = BudgetLayer::new(Some(budget.clone()), reserve).layer(retries);
        (service, attempts)
    }

    fn secret_request() -> vault::SecretRequest {
        vault::SecretRequest {
            base_url: "https://secrets.example".into(),
            session: auth::Session::for_tests(auth::Credential::Instance {
                tenancy: "ocid1.tenancy.oc1..t".into(),
                instance: "ocid1.instance.oc1..i".into(),
            }),
            secret: vault::SecretRef::ById {
                secret_id: "ocid1.vaultsecret.oc1..s".into(),
            },
            selector: vault::Selector::default(),
            deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(60),
            backoff: vault::Backoff::none(),
        }
    }

    /// A 503 the retries wait out (200 ms, then 400 ms, without jitter).
    fn unavailable(request: &vault::SecretRequest) -> vault::VaultError {
        vault::VaultError::Status {
            subject: Box::new(vault::Subject {
                object: "secret s".into(),
                principal: request.identity(),
                grant: vault::Subject::SECRETS_GRANT,
            }),
            oci: vault::OciError {
                status: 503,
                code: "ServiceUnavailable".into(),
                message: "busy".into(),
            },
            opc_request_id: None,
            retry_after_secs: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_reservation_goes_back_during_each_retry_wait_through_the_request() {
        let budget = ByteBudget::new(1000);
        let (service, mut attempts) = budgeted_retries(&budget, 300);
        let mount = MountBytes::new("app", 10_000);
        // The fetch runs in a task of its own: the hook reaches the retries in the request.
        let call = tokio::spawn(service.oneshot(Metered::new(secret_request(), &mount)));
        let (attempt, reply) = attempts.next_request().await.unwrap();
        assert!(attempt.request.backoff.is_set());
        assert_eq!(budget.used(), 300);
        reply.send_error(unavailable(&attempt.request));
        // Halfway through the first wait (200 ms) nothing is held.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(budget.used(), 0, "given back while waiting");
        let (attempt, reply) = attempts.next_request().await.unwrap();
        assert_eq!((attempt.number, budget.used()), (2, 300), "taken again");
        reply.send_error(unavailable(&attempt.request));
        // Others take the budget during the second wait: the fetch may not go on.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let others = budget.try_reserve(1000).unwrap();
        let refused = call.await.unwrap().unwrap_err();
        assert!(
            matches!(
                refused,
                Refused::Failed(vault::VaultError::BudgetFull { .. })
            ),
            "{refused:?}"
        );
        drop(others);
        assert_eq!(budget.used(), 0, "nothing left held");
        assert!(attempts.next_request().await.is_none(), "no third attempt");
    }

    #[tokio::test]
    async fn a_dropped_fetch_gives_its_reservation_back_whoever_keeps_its_request() {
        let budget = ByteBudget::new(1000);
        let (service, mut handle) = budgeted(&budget, 300);
        let mount = MountBytes::new("app", 10_000);
        let call = tokio::spawn(service.oneshot(Metered::new(ask("a"), &mount)));
        // Below, the request is kept (as a recording fake keeps it) with the hook in it.
        let (kept, _reply) = handle.next_request().await.unwrap();
        assert_eq!(budget.used(), 300);
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        assert!(kept.1.is_set());
        assert_eq!(
            budget.used(),
            0,
            "the hook in a kept request holds no bytes"
        );
    }

    #[tokio::test]
    async fn a_mount_past_its_limit_starts_no_more_fetches() {
        let budget = ByteBudget::new(10_000);
        let (service, mut handle) = budgeted(&budget, 100);
        let mount = MountBytes::new("app", 50);
        let call = tokio::spawn(service.clone().oneshot(Metered::new(ask("a"), &mount)));
        let (_, reply) = handle.next_request().await.unwrap();
        reply.send_response(Answer(60));
        let (_, reservation, over) = call.await.unwrap().unwrap().into_parts();
        assert!(over, "60 bytes pass the mount's 50");
        let refused = service
            .oneshot(Metered::new(ask("b"), &mount))
            .await
            .unwrap_err();
        assert!(matches!(refused, Refused::MountOver), "{refused:?}");
        drop(reservation);
        assert!(handle.next_request().await.is_none(), "b was not fetched");
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn the_budget_layer_delegates_readiness() {
        let budget = ByteBudget::new(1000);
        let (service, mut handle) = budgeted(&budget, 100);
        let mut service = mock::Spawn::new(service);
        handle.allow(0);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let ready = |s: &mut mock::Spawn<Budget<Below>>, cx: &mut std::task::Context<'_>| {
            Service::<Metered<Ask>>::poll_ready(s.get_mut(), cx)
        };
        assert!(ready(&mut service, &mut cx).is_pending());
        handle.allow(1);
        assert!(ready(&mut service, &mut cx).is_ready());
    }
}
