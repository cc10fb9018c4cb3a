//! What a refused identity and a busy namespace cost the node: a definite refusal of the
//! identity domain or the proxymux is remembered per namespace and service account (one
//! TokenRequest, one key and one exchange however many mounts), a failure of theirs is not,
//! the refused exchange's key serves the next one, and each namespace's exchanges keep to
//! its pace without slowing another's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oci_csi_auth::{ErrorKind, IdentityRequest, PrincipalKind};
use testkit::{Endpoint, Fault};

use crate::federation::{STORM_USER, mount, seed, subject, upst_fixture, upst_fixture_from};
use crate::principals::{
    Fixture, NS, NowForTest as _, SA, base_seed, get_by_id, request, start, with_token,
};

/// A service account of `NS` no rule of the identity domain's trust maps.
const UNMAPPED: &str = "unmapped";
/// Attempts of one exchange when the identity domain fails or cannot be reached.
const ATTEMPTS: usize = 3;
/// A namespace besides `NS`.
const OTHER_NS: &str = "other";

/// A mount of `service_account` in `namespace`, by TokenRequest.
fn request_in(namespace: &str, service_account: &str) -> IdentityRequest {
    IdentityRequest {
        namespace: Some(namespace.into()),
        ..request(PrincipalKind::Workload, service_account)
    }
}

/// The exchanges that reached the identity domain or the proxymux, TokenRequests, and
/// session keys taken (generated ahead or waited for).
fn costs(fx: &Fixture, endpoint: Endpoint) -> (u64, u64, u64) {
    let stats = fx.emu.stats();
    let guards = fx.principals.exchange_guards();
    (
        stats.arrived(endpoint),
        stats.total_token_requests(),
        guards.keys_ready + guards.keys_waited,
    )
}

#[tokio::test]
async fn five_mounts_of_a_refused_service_account_make_one_exchange() {
    let fx = upst_fixture_from(seed().service_account(NS, UNMAPPED)).await;
    let mut messages = Vec::new();
    for _ in 0..5 {
        let error = fx
            .principals
            .establish(&request(PrincipalKind::Workload, UNMAPPED))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
        messages.push(error.to_string());
    }
    let (exchanges, token_requests, keys) = costs(&fx, Endpoint::IdentityDomain);
    eprintln!(
        "measured: 5 mounts of a refused service account: {exchanges} exchange(s), \
         {token_requests} TokenRequest(s), {keys} session key(s) taken"
    );
    assert_eq!((exchanges, token_requests, keys), (1, 1, 1));
    assert_eq!(fx.emu.stats().token_exchange_refusals("invalid_grant"), 1);
    // Every mount is told what the domain said, that it is remembered, and for how long.
    for message in &messages {
        assert!(message.contains("no impersonation rule"), "{message}");
        assert!(message.contains("this refusal is remembered"), "{message}");
        assert!(
            message.contains("auth.workload.refusal_memory_seconds"),
            "{message}"
        );
        for leak in ["eyJ", crate::federation::SECRET, "ST$"] {
            assert!(!message.contains(leak), "{leak} in {message}");
        }
    }
    assert!(
        messages[0].contains("tried again in 60s"),
        "{}",
        messages[0]
    );
    let guards = fx.principals.exchange_guards();
    assert_eq!((guards.refusals_remembered, guards.refusals_served), (1, 4));
    // The refused exchange's key was bound to nothing: it went back for another exchange.
    let established = fx.principals.establish(&mount(&fx, "sa-1")).await.unwrap();
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    assert_eq!(fx.principals.exchange_guards().keys_reused, 1);
}

#[tokio::test]
async fn a_refusal_is_tried_again_after_it_expires() {
    let fx = upst_fixture().await;
    let t0 = fx.clock.now_for_test();
    fx.emu
        .script(Endpoint::IdentityDomain, [Fault::invalid_grant()]);
    let error = fx
        .principals
        .establish(&mount(&fx, "sa-1"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("invalid_grant"), "{error}");
    fx.clock.set(t0 + Duration::from_secs(59));
    let error = fx
        .principals
        .establish(&mount(&fx, "sa-1"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("tried again in 1s"), "{error}");
    assert_eq!(fx.emu.stats().arrived(Endpoint::IdentityDomain), 1);
    // The trust was fixed meanwhile (the script is spent): a minute on, it is asked again.
    fx.clock.set(t0 + Duration::from_secs(60));
    let established = fx.principals.establish(&mount(&fx, "sa-1")).await.unwrap();
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    let stats = fx.emu.stats();
    assert_eq!(stats.arrived(Endpoint::IdentityDomain), 2);
    assert_eq!(stats.token_exchanges(NS, "sa-1"), 1);
}

#[tokio::test]
async fn a_transient_domain_error_is_not_remembered() {
    let fx = upst_fixture().await;
    for (sa, faults, expected) in [
        (
            "sa-1",
            vec![Fault::Status(503); ATTEMPTS],
            "failed on every attempt",
        ),
        (
            "sa-2",
            vec![
                Fault::TooManyRequests {
                    retry_after_secs: 0
                };
                ATTEMPTS
            ],
            "throttled",
        ),
        (
            "sa-3",
            vec![Fault::DropMidResponse; ATTEMPTS],
            "cannot reach",
        ),
        // The node's client authentication, not the subject: read again at each exchange.
        ("sa-4", vec![Fault::invalid_client()], "invalid_client"),
    ] {
        let before = fx.emu.stats().arrived(Endpoint::IdentityDomain);
        fx.emu.script(Endpoint::IdentityDomain, faults.clone());
        let error = fx.principals.establish(&mount(&fx, sa)).await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains(expected), "{sa}: {message}");
        assert!(!message.contains("remembered"), "{sa}: {message}");
        // At once, the next mount is exchanged.
        let established = fx.principals.establish(&mount(&fx, sa)).await.unwrap();
        assert_eq!(get_by_id(&fx, &established).await.status(), 200);
        let arrived = fx.emu.stats().arrived(Endpoint::IdentityDomain) - before;
        assert_eq!(arrived, faults.len() as u64 + 1, "{sa}");
    }
    assert_eq!(fx.principals.exchange_guards().refusals_remembered, 0);
}

#[tokio::test]
async fn a_refusal_of_one_service_account_does_not_touch_another() {
    let mut seed = seed().service_account(OTHER_NS, "sa-1");
    seed.identity_domain = seed.identity_domain.rule(
        &format!("sub eq system:serviceaccount:{OTHER_NS}:sa-1"),
        STORM_USER,
    );
    let fx = upst_fixture_from(seed).await;
    fx.emu
        .script(Endpoint::IdentityDomain, [Fault::invalid_grant()]);
    let refused = request_in(NS, "sa-1");
    fx.principals.establish(&refused).await.unwrap_err();
    // The same name in another namespace, and another name in the same namespace, are
    // exchanged; the refused identity is answered from memory.
    fx.principals
        .establish(&request_in(OTHER_NS, "sa-1"))
        .await
        .unwrap();
    fx.principals
        .establish(&request_in(NS, "sa-2"))
        .await
        .unwrap();
    let error = fx
        .principals
        .establish(&request_in(NS, "sa-1"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("remembered"), "{error}");
    assert!(error.to_string().contains(&subject("sa-1")), "{error}");
    let stats = fx.emu.stats();
    assert_eq!(stats.arrived(Endpoint::IdentityDomain), 3);
    assert_eq!(stats.token_exchanges(OTHER_NS, "sa-1"), 1);
    assert_eq!(stats.token_exchanges(NS, "sa-2"), 1);
}

#[tokio::test]
async fn five_mounts_of_a_service_account_the_proxymux_refuses_make_one_exchange() {
    let fx = start(base_seed(), |_, _| {}).await;
    fx.emu
        .set_fault(Endpoint::Proxymux, Some(Fault::Status(403)));
    for _ in 0..5 {
        let error = fx
            .principals
            .establish(&request(PrincipalKind::Workload, SA))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::PermissionDenied, "{error}");
        assert!(
            error.to_string().contains("the proxymux answered http 403"),
            "{error}"
        );
    }
    let (exchanges, token_requests, keys) = costs(&fx, Endpoint::Proxymux);
    eprintln!(
        "measured: 5 mounts the proxymux refuses: {exchanges} exchange(s), {token_requests} \
         TokenRequest(s), {keys} session key(s) taken"
    );
    assert_eq!((exchanges, token_requests, keys), (1, 1, 1));
    // Another identity is exchanged at once; the refused exchange's key went back.
    fx.emu.clear_faults(Endpoint::Proxymux);
    let established = fx
        .principals
        .establish(&request(PrincipalKind::Workload, "sa-1"))
        .await
        .unwrap();
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    assert_eq!(fx.principals.exchange_guards().keys_reused, 1);
    // The refused one stays refused, from memory, until the refusal expires.
    let error = fx
        .principals
        .establish(&request(PrincipalKind::Workload, SA))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("remembered"), "{error}");
    assert_eq!(fx.emu.stats().arrived(Endpoint::Proxymux), 2);
}

#[tokio::test]
async fn a_proxymux_failure_is_not_remembered_and_its_refusal_is_tried_again_after_it_expires() {
    let fx = start(base_seed().service_account(OTHER_NS, SA), |_, _| {}).await;
    fx.emu.script(Endpoint::Proxymux, [Fault::Status(503)]);
    let error = fx
        .principals
        .establish(&request(PrincipalKind::Workload, "sa-1"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    fx.principals
        .establish(&request(PrincipalKind::Workload, "sa-1"))
        .await
        .unwrap();

    let t0 = fx.clock.now_for_test();
    fx.emu.script(Endpoint::Proxymux, [Fault::Status(401)]);
    let token = fx
        .emu
        .issue_service_account_token(NS, SA, Duration::from_secs(3600), Some(("pod", "pod-uid")))
        .unwrap();
    let supplied = || with_token(request(PrincipalKind::Workload, SA), token.clone());
    let error = fx.principals.establish(&supplied()).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    // Not served to the same name in another namespace.
    fx.principals
        .establish(&request_in(OTHER_NS, SA))
        .await
        .unwrap();
    fx.clock.set(t0 + Duration::from_secs(59));
    let error = fx.principals.establish(&supplied()).await.unwrap_err();
    assert!(error.to_string().contains("tried again in 1s"), "{error}");
    fx.clock.set(t0 + Duration::from_secs(60));
    fx.principals.establish(&supplied()).await.unwrap();
    let stats = fx.emu.stats();
    assert_eq!(stats.arrived(Endpoint::Proxymux), 5);
    assert_eq!(stats.proxymux_exchanges(NS, SA), 1);
}

#[tokio::test]
async fn a_namespace_past_its_pace_fails_at_once_and_another_namespace_does_not_wait() {
    let fx = start(base_seed().service_account(OTHER_NS, SA), |c, _| {
        c.namespace_exchanges_per_minute = 1;
        c.namespace_exchange_burst = 1;
    })
    .await;
    fx.principals
        .establish(&request_in(NS, "sa-1"))
        .await
        .unwrap();
    // The namespace's next turn is a minute away, past the mount's 30 s deadline.
    let started = Instant::now();
    let error = fx
        .principals
        .establish(&request_in(NS, "sa-2"))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "at once");
    assert_eq!(error.kind(), ErrorKind::ResourceExhausted, "{error}");
    let message = error.to_string();
    assert!(message.contains(&format!("namespace {NS:?}")), "{message}");
    assert!(
        message.contains("auth.workload.namespace_exchanges_per_minute"),
        "{message}"
    );
    assert_eq!(fx.emu.stats().total_token_requests(), 1, "none for sa-2");
    // Another namespace has its own pace.
    let started = Instant::now();
    fx.principals
        .establish(&request_in(OTHER_NS, SA))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let stats = fx.emu.stats();
    assert_eq!(stats.total_proxymux_exchanges(), 2);
    assert_eq!(fx.principals.exchange_guards().paced_refused, 1);
}

#[tokio::test]
async fn mounts_within_their_deadline_wait_for_their_namespaces_pace() {
    // One exchange every 100 ms.
    let fx = Arc::new(
        start(base_seed(), |c, _| {
            c.namespace_exchanges_per_minute = 600;
            c.namespace_exchange_burst = 1;
        })
        .await,
    );
    let started = Instant::now();
    let tasks: Vec<_> = (1..=3)
        .map(|i| {
            let fx = fx.clone();
            tokio::spawn(async move {
                fx.principals
                    .establish(&request_in(NS, &format!("sa-{i}")))
                    .await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(fx.emu.stats().total_proxymux_exchanges(), 3);
    assert_eq!(fx.principals.exchange_guards().paced_waited, 2);
}

#[tokio::test]
async fn a_refresh_past_its_namespaces_pace_keeps_the_valid_session() {
    let fx = start(seed(), |c, emu| {
        c.workload_audience = crate::federation::AUDIENCE.into();
        c.workload_mechanism = crate::federation::federation(
            emu,
            crate::federation::basic_from_file(emu),
            oci_csi_auth::TokenType::Upst,
        );
        c.namespace_exchanges_per_minute = 1;
        c.namespace_exchange_burst = 1;
    })
    .await;
    let t0 = fx.clock.now_for_test();
    fx.principals.establish(&mount(&fx, "sa-1")).await.unwrap();
    // Half the UPST's hour: due for a refresh, valid for half an hour more, and the
    // namespace's next turn is a minute away, past the refresh's deadline. The mount is
    // served the valid session at once; the refresh ahead, refused a turn, is tried again
    // later.
    fx.clock.set(t0 + Duration::from_secs(1800));
    let started = Instant::now();
    let established = fx.principals.establish(&mount(&fx, "sa-1")).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "at once");
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    for _ in 0..500 {
        if fx.principals.exchange_guards().paced_refused >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let guards = fx.principals.exchange_guards();
    assert_eq!(guards.paced_waited, 0);
    assert!(guards.paced_refused >= 1, "{guards:?}");
    assert_eq!(fx.emu.stats().token_exchanges(NS, "sa-1"), 1);
    // A new identity of the namespace has no session to keep: it waits for the turn.
    let error = fx
        .principals
        .establish(&mount(&fx, "sa-2"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ResourceExhausted, "{error}");
}
