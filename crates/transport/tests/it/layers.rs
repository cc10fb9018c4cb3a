//! Each layer of the transport alone, over a `tower_test` mock of the service below it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use oci_csi_transport::{
    Deadline, ErrorKind, ExchangeObserver, HostLimitLayer, ObserveLayer, Outcome, TimeoutLayer,
    TransportError,
};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_test::mock;

type Mock = tower::util::MapErr<
    mock::Mock<Request<Bytes>, Response<Bytes>>,
    fn(tower::BoxError) -> TransportError,
>;

/// A mock of the service below a layer, failing as the transport fails.
fn below() -> (Mock, mock::Handle<Request<Bytes>, Response<Bytes>>) {
    let (service, handle) = mock::pair();
    let to_transport: fn(tower::BoxError) -> TransportError = |source| TransportError::Http {
        authority: "mock:443".into(),
        source,
    };
    (service.map_err(to_transport), handle)
}

fn get(url: &str) -> Request<Bytes> {
    Request::get(url).body(Bytes::new()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_timeout_is_the_request_timeout_or_the_requests_earlier_deadline() {
    let (inner, mut handle) = below();
    let service = TimeoutLayer::new(Duration::from_secs(30)).layer(inner);

    // No deadline: the request timeout.
    let started = Instant::now();
    let call = tokio::spawn(service.clone().oneshot(get("https://secrets.example/a")));
    let (_request, _unanswered) = handle.next_request().await.unwrap();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(
        matches!(&err, TransportError::Timeout { authority, after }
            if authority == "secrets.example:443" && *after == Duration::from_secs(30)),
        "{err:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(30));

    // A deadline in 2 s: it, not the 30 s.
    let started = Instant::now();
    let mut request = get("https://secrets.example/b");
    request
        .extensions_mut()
        .insert(Deadline(started + Duration::from_secs(2)));
    let call = tokio::spawn(service.clone().oneshot(request));
    let (_request, _unanswered) = handle.next_request().await.unwrap();
    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(&err, TransportError::Timeout { after, .. } if *after == Duration::from_secs(2)),
        "{err:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(2));

    // A later deadline does not extend the request timeout; an answer in time passes.
    let mut request = get("https://secrets.example/c");
    request
        .extensions_mut()
        .insert(Deadline(Instant::now() + Duration::from_secs(600)));
    let call = tokio::spawn(service.oneshot(request));
    let (_request, answer) = handle.next_request().await.unwrap();
    answer.send_response(Response::new(Bytes::from_static(b"ok")));
    assert_eq!(call.await.unwrap().unwrap().body(), "ok");
}

#[tokio::test]
async fn the_timeout_layer_delegates_readiness() {
    let (inner, mut handle) = below();
    let mut service = mock::Spawn::new(TimeoutLayer::new(Duration::from_secs(1)).layer(inner));
    handle.allow(0);
    assert!(service.poll_ready().is_pending());
    handle.allow(1);
    assert!(service.is_woken());
    assert!(service.poll_ready().is_ready());
}

#[tokio::test]
async fn requests_past_the_per_host_bound_wait_for_a_permit_and_other_hosts_do_not() {
    let (inner, mut handle) = below();
    let service = HostLimitLayer::new(2).layer(inner);
    let calls: Vec<_> = ["a", "a", "a", "b"]
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let request = get(&format!("https://{host}.example/{i}"));
            tokio::spawn(service.clone().oneshot(request))
        })
        .collect();
    // Two requests to a and the one to b reach the service below; the third to a waits.
    let mut arrived = Vec::new();
    for _ in 0..3 {
        arrived.push(handle.next_request().await.unwrap());
    }
    let hosts = |arrived: &[(Request<Bytes>, _)]| {
        let mut hosts: Vec<String> = arrived
            .iter()
            .map(|(r, _)| r.uri().host().unwrap().to_owned())
            .collect();
        hosts.sort();
        hosts
    };
    assert_eq!(hosts(&arrived), ["a.example", "a.example", "b.example"]);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), handle.next_request())
            .await
            .is_err(),
        "a third request to a.example must wait for a permit"
    );
    // Answering one of a's frees its permit: the waiting request goes through.
    let index = arrived
        .iter()
        .position(|(r, _)| r.uri().host() == Some("a.example"))
        .unwrap();
    let (_, answer) = arrived.remove(index);
    answer.send_response(Response::new(Bytes::new()));
    let (request, answer) = handle.next_request().await.unwrap();
    assert_eq!(request.uri().host(), Some("a.example"));
    answer.send_response(Response::new(Bytes::new()));
    for (_, answer) in arrived {
        answer.send_response(Response::new(Bytes::new()));
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn the_host_limit_refuses_a_request_without_a_host_before_the_service_below() {
    let (inner, mut handle) = below();
    handle.allow(0);
    let err = HostLimitLayer::new(1)
        .layer(inner)
        .oneshot(get("/relative"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Request, "{err:?}");
}

#[derive(Debug, Default)]
struct Seen(Mutex<Vec<(String, Outcome)>>);

impl ExchangeObserver for Seen {
    fn exchanged(&self, authority: &str, outcome: Outcome, _elapsed: Duration) {
        self.0.lock().unwrap().push((authority.to_owned(), outcome));
    }
}

#[tokio::test]
async fn each_exchange_is_told_to_the_observer_once_with_its_outcome() {
    let seen = Arc::new(Seen::default());
    let (inner, mut handle) = below();
    let service = ObserveLayer::new(Some(seen.clone() as Arc<dyn ExchangeObserver>)).layer(inner);

    let call = tokio::spawn(service.clone().oneshot(get("https://secrets.example/a")));
    let (_, answer) = handle.next_request().await.unwrap();
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    answer.send_response(response);
    call.await.unwrap().unwrap();

    let call = tokio::spawn(service.clone().oneshot(get("http://169.254.0.1/b")));
    let (_, answer) = handle.next_request().await.unwrap();
    answer.send_error("broken pipe");
    call.await.unwrap().unwrap_err();

    // Refused before the service below: nothing was exchanged, nothing is reported.
    service.oneshot(get("no-scheme")).await.unwrap_err();

    assert_eq!(
        *seen.0.lock().unwrap(),
        [
            ("secrets.example:443".to_owned(), Outcome::Status(429)),
            ("169.254.0.1:80".to_owned(), Outcome::Failed(ErrorKind::Io)),
        ]
    );
}

#[tokio::test]
async fn the_observe_layer_delegates_readiness() {
    let (inner, mut handle) = below();
    let mut service = mock::Spawn::new(ObserveLayer::new(None).layer(inner));
    handle.allow(0);
    assert!(service.poll_ready().is_pending());
    handle.allow(1);
    assert!(service.is_woken());
    assert!(service.poll_ready().is_ready());
}
