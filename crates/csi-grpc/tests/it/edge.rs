//! Each edge layer alone, over a `tower_test` mock of the mount service (the server tests
//! in `mount.rs` run them together over a real socket).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use secrets_store_csi_grpc::{
    CatchPanicLayer, Deadline, DeadlineLayer, ErrorKind, InFlightLimitLayer, MountError,
    MountLimits, MountObserver, MountRequest, MountResponse,
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

#[derive(Debug, Default)]
struct Shed(AtomicUsize);

impl MountObserver for Shed {
    fn mount_started(&self) {}
    fn mount_finished(&self, _: Result<(), ErrorKind>, _: Duration) {}
    fn mount_shed(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn mounts_past_the_bound_are_shed_at_once_and_told_to_the_observer() {
    let shed = Arc::new(Shed::default());
    let limits = MountLimits {
        max_in_flight: 2,
        max_in_flight_per_namespace: 2,
        ..MountLimits::default()
    };
    let (inner, mut handle) = below();
    let service = InFlightLimitLayer::new(&limits)
        .with_observer(shed.clone())
        .layer(inner);
    let first = tokio::spawn(
        service
            .clone()
            .oneshot(request("a", Duration::from_secs(9))),
    );
    let second = tokio::spawn(
        service
            .clone()
            .oneshot(request("b", Duration::from_secs(9))),
    );
    let (_, reply_first) = handle.next_request().await.unwrap();
    let (_, reply_second) = handle.next_request().await.unwrap();
    let err = service
        .clone()
        .oneshot(request("c", Duration::from_secs(9)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(err.message().contains("limit 2"), "{err}");
    assert_eq!(shed.0.load(Ordering::SeqCst), 1);
    // A finished mount gives its slot back.
    reply_first.send_response(answer());
    first.await.unwrap().unwrap();
    let third = tokio::spawn(service.oneshot(request("c", Duration::from_secs(9))));
    let (admitted, reply_third) = handle.next_request().await.unwrap();
    assert_eq!(admitted.pod.namespace.as_deref(), Some("c"));
    reply_second.send_response(answer());
    reply_third.send_response(answer());
    second.await.unwrap().unwrap();
    third.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_namespace_past_its_share_leaves_one_share_for_the_others() {
    // Four slots, a share of one: namespace a alone takes three, then is refused while one
    // stays free, which namespace b then takes.
    let limits = MountLimits {
        max_in_flight: 4,
        max_in_flight_per_namespace: 1,
        ..MountLimits::default()
    };
    let (inner, mut handle) = below();
    let service = InFlightLimitLayer::new(&limits).layer(inner);
    let held: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(
                service
                    .clone()
                    .oneshot(request("a", Duration::from_secs(9))),
            )
        })
        .collect();
    let mut replies = Vec::new();
    for _ in 0..3 {
        replies.push(handle.next_request().await.unwrap().1);
    }
    let err = service
        .clone()
        .oneshot(request("a", Duration::from_secs(9)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(err.message().contains("namespace \"a\""), "{err}");
    let other = tokio::spawn(service.oneshot(request("b", Duration::from_secs(9))));
    let (admitted, reply) = handle.next_request().await.unwrap();
    assert_eq!(admitted.pod.namespace.as_deref(), Some("b"));
    replies.push(reply);
    for reply in replies {
        reply.send_response(answer());
    }
    other.await.unwrap().unwrap();
    for mount in held {
        mount.await.unwrap().unwrap();
    }
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
    check(InFlightLimitLayer::new(&MountLimits::default())).await;
    check(DeadlineLayer).await;
    check(CatchPanicLayer).await;
}
