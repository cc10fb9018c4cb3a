//! The failover layer alone, over a `tower_test` mock of the service below it (the byte
//! budget's layer has its own tests beside it, in `budget.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use oci_csi_provider::{FailoverLayer, Refusal, Refused, RegionStats, ServedBy, WithFailover};
use tower::{Layer as _, ServiceExt as _};
use tower_test::mock;

type Below = tower::util::MapErr<
    mock::Mock<&'static str, &'static str>,
    fn(tower::BoxError) -> Refused<vault::VaultError>,
>;

/// A mock of the service below the layer: requests are region names, answers strings, and
/// the errors it is told to send are `Refused<VaultError>`s.
fn below() -> (Below, mock::Handle<&'static str, &'static str>) {
    let (service, handle) = mock::pair();
    let unbox: fn(tower::BoxError) -> Refused<vault::VaultError> =
        |error| match error.downcast::<Failure>() {
            Ok(failure) => failure.0.into_refused(),
            Err(other) => panic!("the mock sent {other}"),
        };
    (service.map_err(unbox), handle)
}

/// A failure the mock sends (`Refused` is not an `Error`, so it travels wrapped).
#[derive(Debug)]
struct Failure(Kind);

#[derive(Debug, Clone, Copy)]
enum Kind {
    Status(u16),
    NotFound,
    BudgetFull,
}

impl Kind {
    fn into_refused(self) -> Refused<vault::VaultError> {
        let subject = Box::new(vault::Subject {
            object: "secret db".into(),
            principal: auth::Identity::Instance,
            grant: vault::Subject::SECRETS_GRANT,
        });
        let oci = |status: u16| vault::OciError {
            status,
            code: "Code".into(),
            message: "m".into(),
        };
        match self {
            Kind::Status(status) => Refused::Failed(vault::VaultError::Status {
                subject,
                oci: oci(status),
                opc_request_id: None,
                retry_after_secs: None,
            }),
            Kind::NotFound => Refused::Failed(vault::VaultError::NotFound {
                subject,
                oci: oci(404),
                opc_request_id: None,
            }),
            Kind::BudgetFull => Refused::Budget(Refusal::Budget { capacity: 1 }),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::error::Error for Failure {}

fn request(failover: bool) -> WithFailover<&'static str> {
    WithFailover {
        primary: "primary",
        failover: failover.then(|| ("us-phoenix-1".to_owned(), "failover")),
    }
}

/// Runs one request through the layer; the mock answers each region as `answers` says
/// (`None`: with the region's name). Returns the outcome and the regions asked, in order.
async fn run(
    failover: bool,
    answers: &[Option<Kind>],
    stats: &Arc<RegionStats>,
) -> (
    Result<(&'static str, ServedBy), Refused<vault::VaultError>>,
    Vec<&'static str>,
) {
    let (inner, mut handle) = below();
    let call = tokio::spawn(
        FailoverLayer::new(stats.clone())
            .layer(inner)
            .oneshot(request(failover)),
    );
    let mut asked = Vec::new();
    for answer in answers {
        let (region, reply) = handle.next_request().await.unwrap();
        asked.push(region);
        match answer {
            None => reply.send_response(region),
            Some(kind) => reply.send_error(Failure(*kind)),
        }
    }
    let outcome = call.await.unwrap();
    // Nothing more was asked than the answers scripted.
    assert!(handle.next_request().await.is_none());
    (outcome, asked)
}

#[tokio::test]
async fn the_primary_region_serves_when_it_answers() {
    let stats = Arc::new(RegionStats::default());
    let (outcome, asked) = run(true, &[None], &stats).await;
    assert_eq!(outcome.unwrap(), ("primary", ServedBy::Primary));
    assert_eq!(asked, ["primary"]);
    assert_eq!(stats.primary.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn an_unavailable_or_throttled_primary_fails_over() {
    for status in [503, 429] {
        let stats = Arc::new(RegionStats::default());
        let (outcome, asked) = run(true, &[Some(Kind::Status(status)), None], &stats).await;
        assert_eq!(outcome.unwrap(), ("failover", ServedBy::Failover));
        assert_eq!(asked, ["primary", "failover"]);
        assert_eq!(stats.failover.load(Ordering::Relaxed), 1);
        assert_eq!(stats.primary.load(Ordering::Relaxed), 0);
    }
}

#[tokio::test]
async fn a_not_found_a_refusal_of_the_budget_or_no_failover_region_does_not_fail_over() {
    let stats = Arc::new(RegionStats::default());
    let (outcome, asked) = run(true, &[Some(Kind::NotFound)], &stats).await;
    assert!(matches!(
        outcome,
        Err(Refused::Failed(vault::VaultError::NotFound { .. }))
    ));
    assert_eq!(asked, ["primary"]);

    let (outcome, asked) = run(true, &[Some(Kind::BudgetFull)], &stats).await;
    assert!(matches!(outcome, Err(Refused::Budget(_))));
    assert_eq!(asked, ["primary"]);

    let (outcome, asked) = run(false, &[Some(Kind::Status(503))], &stats).await;
    assert!(matches!(outcome, Err(Refused::Failed(_))));
    assert_eq!(asked, ["primary"]);
    assert_eq!(
        (
            stats.primary.load(Ordering::Relaxed),
            stats.failover.load(Ordering::Relaxed)
        ),
        (0, 0),
        "failures are not counted as served"
    );
}

#[tokio::test]
async fn the_failover_layer_delegates_readiness() {
    let (inner, mut handle) = below();
    let mut service = mock::Spawn::new(FailoverLayer::default().layer(inner));
    handle.allow(0);
    assert!(
        tower::Service::<WithFailover<&'static str>>::poll_ready(service.get_mut(), &mut noop())
            .is_pending()
    );
    handle.allow(1);
    assert!(
        tower::Service::<WithFailover<&'static str>>::poll_ready(service.get_mut(), &mut noop())
            .is_ready()
    );
}

fn noop() -> std::task::Context<'static> {
    std::task::Context::from_waker(std::task::Waker::noop())
}
