//! Each edge layer alone, over a `tower_test` mock of the mount service (the server tests
//! in `mount.rs` run them together over a real socket). The admission layer decides at
//! `call`, so a test calls it in order and knows what was admitted, queued or shed before
//! any future runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrets_store_csi_grpc::{
    AdmissionLayer, CatchPanicLayer, Deadline, DeadlineLayer, ErrorKind, MountError, MountLimits,
    MountObserver, MountRequest, MountResponse, RequestBytes, RequestBytesLayer, WaitOutcome,
};
use serde_json::json;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_test::mock;

use crate::support::driver_request;

type Handle = mock::Handle<MountRequest, MountResponse>;

type Below =
    tower::util::MapErr<mock::Mock<MountRequest, MountResponse>, fn(tower::BoxError) -> MountError>;

/// A mock of the mount service below a layer.
fn below() -> (Below, Handle) {
    let (service, handle) = mock::pair();
    let to_mount: fn(tower::BoxError) -> MountError = |e| MountError::internal(e.to_string());
    (service.map_err(to_mount), handle)
}

/// A mount of a pod in `namespace`, granted `timeout`.
fn request(namespace: &str, timeout: Duration) -> MountRequest {
    let proto = driver_request(json!({ "csi.storage.k8s.io/pod.namespace": namespace }));
    MountRequest::from_proto(proto, Deadline::granted(timeout)).unwrap()
}

fn answer() -> MountResponse {
    MountResponse {
        files: Vec::new(),
        object_versions: Vec::new(),
    }
}

/// What the admission layer told its observer.
#[derive(Debug, Default)]
struct Seen {
    shed: AtomicUsize,
    shed_for_request_bytes: AtomicUsize,
    queued: AtomicUsize,
    dequeued: Mutex<Vec<(WaitOutcome, Duration)>>,
}

impl Seen {
    fn shed(&self) -> usize {
        self.shed.load(Ordering::SeqCst)
    }

    fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    fn outcomes(&self) -> Vec<WaitOutcome> {
        self.dequeued.lock().unwrap().iter().map(|d| d.0).collect()
    }
}

impl MountObserver for Seen {
    fn mount_started(&self) {}
    fn mount_finished(&self, _: Result<(), ErrorKind>, _: Duration) {}
    fn mount_shed(&self) {
        self.shed.fetch_add(1, Ordering::SeqCst);
    }
    fn mount_shed_for_request_bytes(&self) {
        self.shed_for_request_bytes.fetch_add(1, Ordering::SeqCst);
    }
    fn mount_queued(&self) {
        self.queued.fetch_add(1, Ordering::SeqCst);
    }
    fn mount_dequeued(&self, outcome: WaitOutcome, waited: Duration) {
        self.dequeued.lock().unwrap().push((outcome, waited));
    }
}

type Admitting = secrets_store_csi_grpc::Admission<Below>;
type Mount = <Admitting as Service<MountRequest>>::Future;

const NINE_S: Duration = Duration::from_secs(9);

fn limits(max: usize, share: usize, queued: usize, queued_per_namespace: usize) -> MountLimits {
    MountLimits {
        max_in_flight: max,
        max_in_flight_per_namespace: share,
        max_queued: queued,
        max_queued_per_namespace: queued_per_namespace,
        ..MountLimits::default()
    }
}

fn admission(limits: &MountLimits, seen: &Arc<Seen>) -> (Admitting, Handle) {
    let (inner, handle) = below();
    let service = AdmissionLayer::new(limits)
        .with_observer(seen.clone())
        .layer(inner);
    (service, handle)
}

/// Calls `service` with a mount of `namespace` granted `timeout`: by the time this returns
/// the mount is admitted (the mock has its request), queued or shed.
async fn call(service: &mut Admitting, namespace: &str, timeout: Duration) -> Mount {
    service
        .ready()
        .await
        .unwrap()
        .call(request(namespace, timeout))
}

/// The namespace of the next request the mount service receives, and its reply.
async fn next(handle: &mut Handle) -> (String, mock::SendResponse<MountResponse>) {
    let (request, reply) = handle.next_request().await.unwrap();
    (request.pod.namespace.unwrap_or_default(), reply)
}

#[tokio::test]
async fn a_64_mount_storm_is_served_in_full() {
    // The defaults: 64 slots, a share of 16, 64 places to wait.
    let seen = Arc::new(Seen::default());
    let (mut service, mut handle) = admission(&MountLimits::default(), &seen);
    let mut storm = Vec::new();
    for _ in 0..64 {
        storm.push(tokio::spawn(call(&mut service, "storm", NINE_S).await));
    }
    // All but one share take a slot at once; the other 16 wait rather than being shed.
    assert_eq!((seen.shed(), seen.queued()), (0, 16));
    // The mount service answers each mount it receives, and a freed slot admits a waiter.
    for _ in 0..64 {
        let (namespace, reply) = next(&mut handle).await;
        assert_eq!(namespace, "storm");
        reply.send_response(answer());
    }
    for mount in storm {
        mount.await.unwrap().unwrap();
    }
    assert_eq!(seen.shed(), 0);
    assert_eq!(seen.outcomes(), vec![WaitOutcome::Admitted; 16]);
}

#[tokio::test]
async fn namespaces_with_waiters_are_served_in_turn_not_in_order_of_arrival() {
    // Four slots, no share binding; c holds them all, then a queues ten mounts and b two.
    let seen = Arc::new(Seen::default());
    let (mut service, mut handle) = admission(&limits(4, 4, 64, 64), &seen);
    let mut mounts = Vec::new();
    for _ in 0..4 {
        mounts.push(tokio::spawn(call(&mut service, "c", NINE_S).await));
    }
    let mut replies = Vec::new();
    for _ in 0..4 {
        replies.push(next(&mut handle).await.1);
    }
    for namespace in ["a"; 10].into_iter().chain(["b"; 2]) {
        mounts.push(tokio::spawn(call(&mut service, namespace, NINE_S).await));
    }
    assert_eq!(seen.queued(), 12);
    // c's slots free one at a time: b's waiters are admitted among the first, in turn with
    // a's, not after all ten of a's.
    let mut order = Vec::new();
    while order.len() < 12 {
        replies.remove(0).send_response(answer());
        let (namespace, reply) = next(&mut handle).await;
        order.push(namespace);
        replies.push(reply);
    }
    assert_eq!(order[..4], ["a", "b", "a", "b"]);
    assert_eq!(order[4..], ["a"; 8]);
    for reply in replies {
        reply.send_response(answer());
    }
    for mount in mounts {
        mount.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn a_mount_past_a_full_queue_is_shed_at_once_and_told_to_the_observer() {
    // One slot; two places to wait on the node, one per namespace.
    let seen = Arc::new(Seen::default());
    let (mut service, mut handle) = admission(&limits(1, 1, 2, 1), &seen);
    let held = tokio::spawn(call(&mut service, "x", NINE_S).await);
    let (_, reply_held) = next(&mut handle).await;
    let first_of_a = tokio::spawn(call(&mut service, "a", NINE_S).await);
    let err = call(&mut service, "a", NINE_S).await.await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    for part in [
        "no place is left for namespace \"a\"",
        "server.max_queued_mounts_per_namespace: 1",
        "limit 1, server.max_in_flight_mounts",
    ] {
        assert!(err.message().contains(part), "{part}: {err}");
    }
    let first_of_b = tokio::spawn(call(&mut service, "b", NINE_S).await);
    let err = call(&mut service, "c", NINE_S).await.await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(
        err.message().contains("server.max_queued_mounts: 2"),
        "{err}"
    );
    assert_eq!((seen.shed(), seen.queued()), (2, 2));
    // The waiters are admitted as the slot frees, oldest first.
    reply_held.send_response(answer());
    for expected in ["a", "b"] {
        let (namespace, reply) = next(&mut handle).await;
        assert_eq!(namespace, expected);
        reply.send_response(answer());
    }
    for mount in [held, first_of_a, first_of_b] {
        mount.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_deadline_passes_is_deadline_exceeded_and_leaves_the_queue() {
    // One slot and one place to wait.
    let seen = Arc::new(Seen::default());
    let (mut service, mut handle) = admission(&limits(1, 1, 1, 1), &seen);
    let started = Instant::now();
    let held = tokio::spawn(call(&mut service, "x", Duration::from_secs(60)).await);
    let (_, reply_held) = next(&mut handle).await;
    let err = call(&mut service, "late", Duration::from_secs(10))
        .await
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded);
    for part in [
        "waited 9.5s for a slot",
        "deadline of 10s",
        "server.max_in_flight_mounts",
    ] {
        assert!(err.message().contains(part), "{part}: {err}");
    }
    assert_eq!(started.elapsed(), Duration::from_millis(9500));
    // Its place is free again (one more may wait, none is shed), and the slot goes to the
    // next waiter, not to the one gone.
    let next_waiter = tokio::spawn(call(&mut service, "next", NINE_S).await);
    assert_eq!((seen.shed(), seen.queued()), (0, 2));
    reply_held.send_response(answer());
    let (namespace, reply) = next(&mut handle).await;
    assert_eq!(namespace, "next");
    reply.send_response(answer());
    held.await.unwrap().unwrap();
    next_waiter.await.unwrap().unwrap();
    let dequeued = seen.dequeued.lock().unwrap().clone();
    assert_eq!(
        dequeued[0],
        (WaitOutcome::DeadlineExceeded, Duration::from_millis(9500))
    );
    assert_eq!(dequeued[1].0, WaitOutcome::Admitted);
}

#[tokio::test]
async fn a_cancelled_waiter_gives_back_nothing_it_did_not_hold_and_the_next_is_admitted() {
    let seen = Arc::new(Seen::default());
    let (mut service, mut handle) = admission(&limits(1, 1, 64, 64), &seen);
    let held = tokio::spawn(call(&mut service, "x", NINE_S).await);
    let (_, reply_held) = next(&mut handle).await;
    // b waits and its caller goes away before a slot frees: b held none and frees none, so
    // the next mount still waits.
    let cancelled = call(&mut service, "b", NINE_S).await;
    let c = tokio::spawn(call(&mut service, "c", NINE_S).await);
    drop(cancelled);
    let d = call(&mut service, "d", NINE_S).await;
    let e = tokio::spawn(call(&mut service, "e", NINE_S).await);
    assert_eq!(
        (seen.queued(), seen.outcomes()),
        (4, vec![WaitOutcome::Cancelled])
    );
    // The slot goes to c, not to the waiter gone.
    reply_held.send_response(answer());
    let (namespace, reply) = next(&mut handle).await;
    assert_eq!(namespace, "c");
    reply.send_response(answer());
    c.await.unwrap().unwrap();
    // c's slot is now granted to d, whose caller never reads it and goes away: the slot
    // comes back from d's receiver and goes on to e.
    drop(d);
    let (namespace, reply) = next(&mut handle).await;
    assert_eq!(namespace, "e");
    reply.send_response(answer());
    held.await.unwrap().unwrap();
    e.await.unwrap().unwrap();
    assert_eq!(
        seen.outcomes(),
        [
            WaitOutcome::Cancelled,
            WaitOutcome::Admitted,
            WaitOutcome::Cancelled,
            WaitOutcome::Admitted
        ]
    );
    // Nothing leaked and nothing was given back twice: the one slot is free, and taken at
    // once by the next mount while a second one waits.
    let now = tokio::spawn(call(&mut service, "f", NINE_S).await);
    let (namespace, reply) = next(&mut handle).await;
    assert_eq!(namespace, "f");
    let after = tokio::spawn(call(&mut service, "g", NINE_S).await);
    assert_eq!(seen.queued(), 5);
    reply.send_response(answer());
    let (namespace, reply) = next(&mut handle).await;
    assert_eq!(namespace, "g");
    reply.send_response(answer());
    now.await.unwrap().unwrap();
    after.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_stalled_namespace_with_its_queue_full_never_takes_the_slots_the_others_need() {
    // Eight slots, a share of two, two places to wait per namespace. Namespace a's mounts
    // hang: it takes six slots (all but one share), fills its queue, and is then shed.
    let seen = Arc::new(Seen::default());
    let (mut service, mut handle) = admission(&limits(8, 2, 64, 2), &seen);
    let mut mounts = Vec::new();
    for _ in 0..8 {
        mounts.push(tokio::spawn(call(&mut service, "a", NINE_S).await));
    }
    let mut stalled = Vec::new();
    for _ in 0..6 {
        let (namespace, reply) = next(&mut handle).await;
        assert_eq!(namespace, "a");
        stalled.push(reply);
    }
    let err = call(&mut service, "a", NINE_S).await.await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(
        err.message().contains("server.max_in_flight_per_namespace"),
        "{err}"
    );
    assert_eq!((seen.shed(), seen.queued()), (1, 2));
    // b takes the share left at once, twice over; its third mount waits, and when one of
    // b's mounts ends the freed slot goes to b's waiter: a has the first turn, but past its
    // share it may not take the slot.
    for _ in 0..3 {
        mounts.push(tokio::spawn(call(&mut service, "b", NINE_S).await));
    }
    let mut of_b = Vec::new();
    for _ in 0..2 {
        let (namespace, reply) = next(&mut handle).await;
        assert_eq!(namespace, "b");
        of_b.push(reply);
    }
    of_b.remove(0).send_response(answer());
    let (namespace, reply) = next(&mut handle).await;
    assert_eq!(namespace, "b");
    of_b.push(reply);
    for reply in of_b {
        reply.send_response(answer());
    }
    // Once a's mounts end, its waiters are admitted.
    for reply in stalled {
        reply.send_response(answer());
    }
    for _ in 0..2 {
        let (namespace, reply) = next(&mut handle).await;
        assert_eq!(namespace, "a");
        reply.send_response(answer());
    }
    for mount in mounts {
        mount.await.unwrap().unwrap();
    }
    assert_eq!(seen.outcomes(), vec![WaitOutcome::Admitted; 3]);
}

#[tokio::test]
async fn with_no_place_to_wait_mounts_past_the_bound_are_shed_at_once() {
    // `max_queued` 0: a mount that cannot take a slot is refused at once, as before queues.
    let seen = Arc::new(Seen::default());
    let (mut service, mut handle) = admission(&limits(2, 2, 0, 0), &seen);
    let first = tokio::spawn(call(&mut service, "a", NINE_S).await);
    let second = tokio::spawn(call(&mut service, "b", NINE_S).await);
    let (_, reply_first) = next(&mut handle).await;
    let (_, reply_second) = next(&mut handle).await;
    let err = call(&mut service, "c", NINE_S).await.await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(err.message().contains("limit 2"), "{err}");
    assert_eq!((seen.shed(), seen.queued()), (1, 0));
    // A finished mount gives its slot back.
    reply_first.send_response(answer());
    first.await.unwrap().unwrap();
    let third = tokio::spawn(call(&mut service, "c", NINE_S).await);
    let (namespace, reply_third) = next(&mut handle).await;
    assert_eq!(namespace, "c");
    reply_second.send_response(answer());
    reply_third.send_response(answer());
    second.await.unwrap().unwrap();
    third.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_namespace_past_its_share_waits_while_one_share_stays_free_for_the_others() {
    // Four slots, a share of one: namespace a alone takes three; its fourth waits while the
    // last slot stays free, which b then takes at once.
    let seen = Arc::new(Seen::default());
    let (mut service, mut handle) = admission(&limits(4, 1, 64, 64), &seen);
    let mut mounts = Vec::new();
    for _ in 0..4 {
        mounts.push(tokio::spawn(call(&mut service, "a", NINE_S).await));
    }
    let mut of_a = Vec::new();
    for _ in 0..3 {
        of_a.push(next(&mut handle).await.1);
    }
    assert_eq!(seen.queued(), 1);
    mounts.push(tokio::spawn(call(&mut service, "b", NINE_S).await));
    let (namespace, reply_b) = next(&mut handle).await;
    assert_eq!(namespace, "b");
    // When one of a's mounts ends, a is still past its share with no share left free
    // after it: the slot is not its waiter's, and c takes it at once.
    of_a.remove(0).send_response(answer());
    mounts.remove(0).await.unwrap().unwrap();
    mounts.push(tokio::spawn(call(&mut service, "c", NINE_S).await));
    assert_eq!(seen.queued(), 1);
    let (namespace, reply_c) = next(&mut handle).await;
    assert_eq!(namespace, "c");
    // Once b's and c's end, a share is free beside a's: its waiter is admitted.
    reply_b.send_response(answer());
    reply_c.send_response(answer());
    let (namespace, reply) = next(&mut handle).await;
    assert_eq!(namespace, "a");
    of_a.push(reply);
    for reply in of_a {
        reply.send_response(answer());
    }
    for mount in mounts {
        mount.await.unwrap().unwrap();
    }
    assert_eq!(seen.shed(), 0);
    assert_eq!(seen.outcomes(), [WaitOutcome::Admitted]);
}

#[tokio::test(start_paused = true)]
async fn a_mount_not_done_by_its_deadline_is_deadline_exceeded_naming_what_was_granted() {
    let (inner, mut handle) = below();
    let started = Instant::now();
    let call = tokio::spawn(
        DeadlineLayer
            .layer(inner)
            .oneshot(request("a", Duration::from_secs(10))),
    );
    let (_, _never_answered) = handle.next_request().await.unwrap();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded);
    assert!(err.message().contains("deadline of 10s"), "{err}");
    // Answered half a second before the caller's 10 s run out (a twentieth).
    assert_eq!(started.elapsed(), Duration::from_millis(9500));
}

#[tokio::test]
async fn a_panic_in_readiness_in_the_call_or_in_the_future_is_internal_for_that_mount() {
    let in_future = tower::service_fn(|_: MountRequest| async {
        if true {
            panic!("boom: secret-bytes");
        }
        Ok::<MountResponse, MountError>(answer())
    });
    let err = CatchPanicLayer
        .layer(in_future)
        .oneshot(request("a", Duration::from_secs(9)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(!err.message().contains("secret-bytes"), "{err}");

    /// Panics in its readiness or in its call, as told.
    #[derive(Clone)]
    struct Panics {
        in_ready: bool,
    }
    impl Service<MountRequest> for Panics {
        type Response = MountResponse;
        type Error = MountError;
        type Future = std::future::Ready<Result<MountResponse, MountError>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), MountError>> {
            assert!(!self.in_ready, "boom in poll_ready");
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: MountRequest) -> Self::Future {
            panic!("boom in call")
        }
    }
    for in_ready in [false, true] {
        let err = CatchPanicLayer
            .layer(Panics { in_ready })
            .oneshot(request("a", Duration::from_secs(9)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal, "in_ready {in_ready}");
    }
}

#[tokio::test]
async fn every_edge_layer_delegates_readiness() {
    async fn check<L: Layer<Below>>(layer: L)
    where
        L::Service: Service<MountRequest>,
    {
        let (inner, mut handle) = below();
        let mut service = layer.layer(inner);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        handle.allow(0);
        assert!(service.poll_ready(&mut cx).is_pending());
        handle.allow(1);
        assert!(service.poll_ready(&mut cx).is_ready());
    }
    check(AdmissionLayer::new(&MountLimits::default())).await;
    check(DeadlineLayer).await;
    check(CatchPanicLayer).await;
    check(RequestBytesLayer::new(&MountLimits::default())).await;
}

/// A mount of a pod in `namespace` whose request carries `pad` more bytes than a small one.
fn padded(namespace: &str, pad: usize) -> MountRequest {
    let proto = driver_request(json!({
        "csi.storage.k8s.io/pod.namespace": namespace,
        "pad": "x".repeat(pad),
    }));
    MountRequest::from_proto(proto, Deadline::granted(NINE_S)).unwrap()
}

type Holding = RequestBytes<Below>;

async fn call_holding(service: &mut Holding, namespace: &str) -> Mount {
    service
        .ready()
        .await
        .unwrap()
        .call(padded(namespace, 100_000))
}

#[tokio::test]
async fn requests_past_the_nodes_or_a_namespaces_held_bytes_are_shed_at_once_until_given_back() {
    let one = padded("a", 100_000).held_bytes();
    let limits = MountLimits {
        max_request_bytes: 3 * one,
        max_request_bytes_per_namespace: 2 * one,
        ..MountLimits::default()
    };
    let seen = Arc::new(Seen::default());
    let layer = RequestBytesLayer::new(&limits).with_observer(seen.clone());
    let (inner, mut handle) = below();
    let mut service = layer.layer(inner);
    let a1 = call_holding(&mut service, "a").await;
    let a2 = call_holding(&mut service, "a").await;
    let (_, reply_a1) = next(&mut handle).await;
    let _a2_at_the_mock = next(&mut handle).await;
    assert_eq!(layer.held(), 2 * one);
    // A third of namespace "a" would pass its share: refused at once, without a call below.
    let refused = call_holding(&mut service, "a").await.await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ResourceExhausted);
    for fragment in [
        format!("this mount's request holds {one} bytes"),
        format!(
            "namespace \"a\" in flight and waiting on this node hold {}",
            2 * one
        ),
        "(server.max_request_bytes_per_namespace)".to_owned(),
    ] {
        assert!(
            refused.message().contains(&fragment),
            "{fragment}: {refused:?}"
        );
    }
    // Another namespace takes the node's last room; a third namespace finds none.
    let b1 = call_holding(&mut service, "b").await;
    let _b1_at_the_mock = next(&mut handle).await;
    let refused = call_holding(&mut service, "c").await.await.unwrap_err();
    assert!(
        refused.message().contains(&format!(
            "hold {} of {} (server.max_request_bytes);",
            3 * one,
            3 * one
        )),
        "{refused:?}"
    );
    assert_eq!(seen.shed_for_request_bytes.load(Ordering::SeqCst), 2);
    assert_eq!(seen.shed(), 0, "the slots' shed count is another reason");
    // Bytes come back when a mount is answered, and when its caller goes away.
    reply_a1.send_response(answer());
    a1.await.unwrap();
    assert_eq!(layer.held(), 2 * one);
    drop(a2);
    assert_eq!(layer.held(), one);
    let _a3 = call_holding(&mut service, "a").await;
    let _a3_at_the_mock = next(&mut handle).await;
    assert_eq!(layer.held(), 2 * one);
    drop(b1);
}

#[test]
fn a_requests_held_bytes_count_its_attributes_tokens_secrets_and_object_versions() {
    let small = padded("a", 0).held_bytes();
    let big = "x".repeat(50_000);
    let mut with_versions = driver_request(json!({ "csi.storage.k8s.io/pod.namespace": "a" }));
    with_versions.current_object_version = (0..1000)
        .map(|i| secrets_store_csi_grpc::proto::ObjectVersion {
            id: format!("{i:045}"),
            version: "v".into(),
        })
        .collect();
    let mut with_secrets = driver_request(json!({ "csi.storage.k8s.io/pod.namespace": "a" }));
    with_secrets.secrets = json!({ "key": big }).to_string();
    let cases = [
        ("an attribute", padded("a", 50_000)),
        (
            "a token",
            MountRequest::from_proto(
                driver_request(json!({
                    "csi.storage.k8s.io/pod.namespace": "a",
                    "csi.storage.k8s.io/serviceAccount.tokens":
                        json!({ "vault": { "token": big, "expirationTimestamp": "x" } }).to_string(),
                })),
                Deadline::granted(NINE_S),
            )
            .unwrap(),
        ),
        (
            "a NodePublish secret",
            MountRequest::from_proto(with_secrets, Deadline::granted(NINE_S)).unwrap(),
        ),
        (
            "object versions",
            MountRequest::from_proto(with_versions, Deadline::granted(NINE_S)).unwrap(),
        ),
    ];
    for (what, request) in cases {
        let held = request.held_bytes();
        assert!(
            held >= small + 50_000,
            "{what}: {held} bytes, {small} without it"
        );
    }
}

#[tokio::test]
async fn a_refusal_quotes_a_long_namespace_escaped_and_cut() {
    let namespace = format!("ns\n{}", "x".repeat(650_000));
    // Admission: a share of one slot, and no place for the namespace to wait.
    let seen = Arc::new(Seen::default());
    let (mut service, mut handle) = admission(&limits(2, 1, 1, 0), &seen);
    let _held = call(&mut service, &namespace, NINE_S).await;
    let _at_the_mock = next(&mut handle).await;
    let shed = call(&mut service, &namespace, NINE_S)
        .await
        .await
        .unwrap_err();
    // The request bytes: a namespace's share smaller than the request (which holds the
    // namespace twice, as an attribute and as the pod's).
    let layer = RequestBytesLayer::new(&MountLimits {
        max_request_bytes: 2 << 20,
        max_request_bytes_per_namespace: 1 << 20,
        ..MountLimits::default()
    });
    let (inner, _handle) = below();
    let refused = layer
        .layer(inner)
        .call(request(&namespace, NINE_S))
        .await
        .unwrap_err();
    for error in [shed, refused] {
        assert_eq!(error.kind(), ErrorKind::ResourceExhausted);
        let message = error.message();
        assert!(
            message.len() < 1000,
            "{} bytes: {}",
            message.len(),
            &message[..200]
        );
        assert!(
            message.contains(r#""ns\nxxx"#) && message.contains("bytes)"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn a_namespace_past_its_request_bytes_share_leaves_a_share_for_the_others() {
    let one = padded("a", 100_000).held_bytes();
    let limits = MountLimits {
        max_request_bytes: 8 * one,
        max_request_bytes_per_namespace: 2 * one,
        ..MountLimits::default()
    };
    let layer = RequestBytesLayer::new(&limits);
    let (inner, mut handle) = below();
    let mut service = layer.layer(inner);
    // Namespace a goes past its share while a share stays free: six, not two (a hard cap)
    // nor eight (the whole node).
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(call_holding(&mut service, "a").await);
        let _at_the_mock = next(&mut handle).await;
    }
    assert_eq!(layer.held(), 6 * one);
    let refused = call_holding(&mut service, "a").await.await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ResourceExhausted);
    assert!(
        refused.message().contains(&format!(
            "past its share of {} (server.max_request_bytes_per_namespace), while other \
             namespaces may need the {} bytes left",
            2 * one,
            2 * one
        )),
        "{refused:?}"
    );
    // The share it left is another namespace's, up to that namespace's own share.
    for _ in 0..2 {
        held.push(call_holding(&mut service, "b").await);
        let _at_the_mock = next(&mut handle).await;
    }
    assert_eq!(layer.held(), 8 * one);
}
