//! The retry layer alone, over a `tower_test` mock of the client below it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use oci_csi_vault::{
    Attempt, Backoff, BackoffHook, ErrorKind, OciError, RetryLayer, RetryPolicy, SecretBundle,
    SecretContent, SecretRef, SecretRequest, Selector, Stage, Stopped, Subject, VaultError,
    WithBackoff as _,
};
use tokio::time::Instant;
use tower::{Layer as _, ServiceExt as _};
use tower_test::mock;

type Below = tower::util::MapErr<
    mock::Mock<Attempt<SecretRequest>, SecretBundle>,
    fn(tower::BoxError) -> VaultError,
>;

/// A mock of the client below the layer; the errors it is told to send are `VaultError`s.
fn below() -> (Below, mock::Handle<Attempt<SecretRequest>, SecretBundle>) {
    let (service, handle) = mock::pair();
    let unbox: fn(tower::BoxError) -> VaultError = |error| match error.downcast::<VaultError>() {
        Ok(error) => *error,
        Err(other) => panic!("the mock sent {other}"),
    };
    (service.map_err(unbox), handle)
}

fn request(timeout: Duration) -> SecretRequest {
    SecretRequest {
        base_url: "https://secrets.example".into(),
        session: auth::Session::for_tests(auth::Credential::Instance {
            tenancy: "ocid1.tenancy.oc1..t".into(),
            instance: "ocid1.instance.oc1..i".into(),
        }),
        secret: SecretRef::ByName {
            vault_id: "ocid1.vault.oc1..v".into(),
            name: "db".into(),
        },
        selector: Selector::Stage(Stage::Current),
        deadline: Instant::now() + timeout,
        backoff: Backoff::none(),
    }
}

fn subject(request: &SecretRequest) -> Box<Subject> {
    Box::new(Subject {
        object: "secret db".into(),
        principal: request.identity(),
        grant: Subject::SECRETS_GRANT,
    })
}

/// A 503 answer, which is retried.
fn unavailable(request: &SecretRequest) -> VaultError {
    VaultError::Status {
        subject: subject(request),
        oci: OciError {
            status: 503,
            code: "ServiceUnavailable".into(),
            message: "busy".into(),
        },
        opc_request_id: None,
        retry_after_secs: None,
    }
}

fn bundle() -> SecretBundle {
    SecretBundle {
        secret_id: "ocid1.vaultsecret.oc1..s".into(),
        version_number: 1,
        version_name: None,
        stages: vec![Stage::Current],
        content: SecretContent::new(zeroize::Zeroizing::new(b"v".to_vec())),
        opc_request_id: None,
    }
}

fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        jitter: false,
        ..RetryPolicy::default()
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_are_numbered_and_waited_for_until_one_succeeds() {
    let (inner, mut handle) = below();
    let layer = RetryLayer::new(policy(5));
    let call = tokio::spawn(layer.layer(inner).oneshot(request(Duration::from_secs(60))));
    let mut arrivals = Vec::new();
    for succeeds in [false, false, true] {
        let (attempt, reply) = handle.next_request().await.unwrap();
        arrivals.push((attempt.number, attempt.retries, Instant::now()));
        match succeeds {
            false => reply.send_error(unavailable(&attempt.request)),
            true => reply.send_response(bundle()),
        }
    }
    assert_eq!(call.await.unwrap().unwrap().version_number, 1);
    let numbers: Vec<_> = arrivals.iter().map(|(n, r, _)| (*n, *r)).collect();
    assert_eq!(numbers, [(1, true), (2, true), (3, true)]);
    // The policy's waits between them: 200 ms, then 400 ms (no jitter).
    let waits: Vec<_> = arrivals.windows(2).map(|w| w[1].2 - w[0].2).collect();
    assert_eq!(
        waits,
        [Duration::from_millis(200), Duration::from_millis(400)]
    );
    let retries: Vec<_> = layer
        .retries()
        .snapshot()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(reason, n)| (reason.as_str(), n))
        .collect();
    assert_eq!(retries, [("server_error", 2)]);
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_ends_the_call_after_one_attempt_unchanged() {
    let (inner, mut handle) = below();
    let call = tokio::spawn(
        RetryLayer::new(policy(5))
            .layer(inner)
            .oneshot(request(Duration::from_secs(60))),
    );
    let (attempt, reply) = handle.next_request().await.unwrap();
    reply.send_error(VaultError::InvalidArgument {
        subject: subject(&attempt.request),
        oci: OciError {
            status: 400,
            code: "InvalidParameter".into(),
            message: "bad".into(),
        },
        opc_request_id: None,
    });
    let err = call.await.unwrap().unwrap_err();
    assert!(matches!(err, VaultError::InvalidArgument { .. }), "{err:?}");
    // The call is over and its service dropped: a second attempt would have come before.
    assert!(handle.next_request().await.is_none(), "no second attempt");
}

#[tokio::test(start_paused = true)]
async fn the_last_failure_is_annotated_when_the_attempts_run_out() {
    let (inner, mut handle) = below();
    let call = tokio::spawn(
        RetryLayer::new(policy(2))
            .layer(inner)
            .oneshot(request(Duration::from_secs(60))),
    );
    for _ in 0..2 {
        let (attempt, reply) = handle.next_request().await.unwrap();
        reply.send_error(unavailable(&attempt.request));
    }
    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(
            &err,
            VaultError::Exhausted {
                attempts: 2,
                stopped: Stopped::MaxAttempts,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::Unavailable);
}

#[tokio::test(start_paused = true)]
async fn one_attempt_only_says_so_to_the_client() {
    let (inner, mut handle) = below();
    let call = tokio::spawn(
        RetryLayer::new(RetryPolicy::none())
            .layer(inner)
            .oneshot(request(Duration::from_secs(60))),
    );
    let (attempt, reply) = handle.next_request().await.unwrap();
    assert_eq!((attempt.number, attempt.retries), (1, false));
    reply.send_error(unavailable(&attempt.request));
    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(&err, VaultError::Exhausted { attempts: 1, .. }),
        "{err:?}"
    );
}

/// Counts what the retries told it; always lets them go on.
#[derive(Default)]
struct Counting {
    pausing: AtomicUsize,
    resuming: AtomicUsize,
}

impl Counting {
    fn counts(&self) -> (usize, usize) {
        (
            self.pausing.load(Ordering::SeqCst),
            self.resuming.load(Ordering::SeqCst),
        )
    }
}

impl BackoffHook for Counting {
    fn pausing(&self) {
        self.pausing.fetch_add(1, Ordering::SeqCst);
    }
    fn resuming(&self) -> bool {
        self.resuming.fetch_add(1, Ordering::SeqCst);
        true
    }
}

/// Fails the first `failures` attempts of a call with a retryable 503, then answers; what
/// the hook (if any) had been told when each attempt arrived.
async fn fail_then_answer(
    handle: &mut mock::Handle<Attempt<SecretRequest>, SecretBundle>,
    failures: usize,
    hook: &Counting,
) -> Vec<(u32, bool, (usize, usize))> {
    let mut arrivals = Vec::new();
    for n in 0..=failures {
        let (attempt, reply) = handle.next_request().await.unwrap();
        arrivals.push((
            attempt.number,
            attempt.request.backoff.is_set(),
            hook.counts(),
        ));
        if n < failures {
            reply.send_error(unavailable(&attempt.request));
        } else {
            reply.send_response(bundle());
        }
    }
    arrivals
}

#[tokio::test(start_paused = true)]
async fn the_backoff_hook_travels_in_the_request_and_is_told_of_each_wait() {
    let (inner, mut handle) = below();
    let hook = Arc::new(Counting::default());
    let request = request(Duration::from_secs(60)).with_backoff(Backoff::new(hook.clone()));
    // The retries run in a task of their own: only the request can bring them the hook.
    let call = tokio::spawn(RetryLayer::new(policy(5)).layer(inner).oneshot(request));
    let arrivals = fail_then_answer(&mut handle, 2, &hook).await;
    assert_eq!(call.await.unwrap().unwrap().version_number, 1);
    assert_eq!(
        arrivals,
        [(1, true, (0, 0)), (2, true, (1, 1)), (3, true, (2, 2))],
        "told before and after each of the two waits, in the request of every attempt"
    );
    assert_eq!(hook.counts(), (2, 2), "nothing after the answer");
}

#[tokio::test(start_paused = true)]
async fn a_request_without_a_backoff_hook_retries_as_before() {
    let (inner, mut handle) = below();
    let request = request(Duration::from_secs(60));
    assert!(!request.backoff.is_set());
    let start = Instant::now();
    let call = tokio::spawn(RetryLayer::new(policy(5)).layer(inner).oneshot(request));
    let unused = Counting::default();
    let arrivals = fail_then_answer(&mut handle, 2, &unused).await;
    assert_eq!(call.await.unwrap().unwrap().version_number, 1);
    assert_eq!(
        arrivals,
        [(1, false, (0, 0)), (2, false, (0, 0)), (3, false, (0, 0))]
    );
    // The policy's waits, 200 then 400 ms, slept in full (no hook to stop them).
    assert_eq!(Instant::now() - start, Duration::from_millis(600));
}

#[tokio::test]
async fn the_retry_layer_delegates_readiness() {
    let (inner, mut handle) = below();
    let mut service = mock::Spawn::new(RetryLayer::new(policy(3)).layer(inner));
    handle.allow(0);
    assert!(
        tower::Service::<SecretRequest>::poll_ready(service.get_mut(), &mut noop()).is_pending()
    );
    handle.allow(1);
    assert!(tower::Service::<SecretRequest>::poll_ready(service.get_mut(), &mut noop()).is_ready());
}

fn noop() -> std::task::Context<'static> {
    std::task::Context::from_waker(std::task::Waker::noop())
}
