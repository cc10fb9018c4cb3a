//! No mount waits for a session key or a refresh: keys are generated ahead in a bounded pool,
//! and a session due for its refresh is refreshed in the background while it serves on; only
//! a session past serving makes mounts wait, for the one exchange in flight.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use oci_csi_auth::{
    ErrorKind, Established, IdentityRequest, PrincipalKind, Principals, SESSION_KEYS_AHEAD,
};
use testkit::{Endpoint, Fault};

use crate::federation::{mount, upst_fixture};
use crate::principals::{
    Fixture, NS, NowForTest as _, SA, base_seed, get_by_id, get_by_name, request, start, with_token,
};

/// Mounts that should not wait are given this long (an exchange held at a gate is never
/// answered within it).
const AT_ONCE: Duration = Duration::from_secs(5);

/// Credential fetches of `kind` counted under `op` with `result`.
fn fetches(principals: &Principals, kind: &str, op: &str, result: &str) -> u64 {
    principals
        .credential_fetches()
        .into_iter()
        .filter(|((k, o, r), _)| (*k, *o, *r) == (kind, op, result))
        .map(|(_, n)| n)
        .sum()
}

/// Waits (real time, the background works on the runtime) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

/// The id of the key `established` signs with (its session token).
fn key_id(established: &Established) -> String {
    established
        .session
        .key()
        .key_id()
        .expose_secret()
        .to_owned()
}

/// Establishes `mount` until it is no longer served the session of `old` (the refresh
/// ahead has replaced it), and answers the new one.
async fn refreshed<F: Future<Output = Established>>(
    old: &Established,
    mut mount: impl FnMut() -> F,
) -> Established {
    for _ in 0..3000 {
        let established = mount().await;
        if key_id(&established) != key_id(old) {
            return established;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the session was never refreshed");
}

/// A mount that must not wait: it completes within [`AT_ONCE`].
async fn at_once(fx: &Fixture, request: &IdentityRequest) -> Established {
    tokio::time::timeout(AT_ONCE, fx.principals.establish(request))
        .await
        .expect("the mount waited")
        .unwrap()
}

#[tokio::test]
async fn the_first_mount_of_a_new_identity_after_the_pool_filled_waits_for_no_key() {
    let fx = start(base_seed(), |_, _| {}).await;
    fx.principals
        .establish(&request(PrincipalKind::Workload, "sa-1"))
        .await
        .unwrap();
    // The first exchange of the process found the pool empty and waited for a key; taking
    // it started the refill, which fills the pool to its bound in the background.
    let guards = fx.principals.exchange_guards();
    assert_eq!((guards.keys_waited, guards.keys_ready), (1, 0));
    let filled = 1 + SESSION_KEYS_AHEAD as u64;
    until("the pool filled", || {
        fx.principals.exchange_guards().keys_generated == filled
    })
    .await;
    let established = fx
        .principals
        .establish(&request(PrincipalKind::Workload, "sa-2"))
        .await
        .unwrap();
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    let guards = fx.principals.exchange_guards();
    assert_eq!(
        (guards.keys_waited, guards.keys_ready),
        (1, 1),
        "taken ready"
    );
    assert!(guards.keys_most_held <= SESSION_KEYS_AHEAD as u64);
}

#[tokio::test]
async fn a_storm_of_new_identities_makes_at_most_a_key_each_and_the_pools() {
    let fx = Arc::new(start(base_seed(), |_, _| {}).await);
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let fx = fx.clone();
            tokio::spawn(async move {
                let sa = format!("sa-{}", i % 20);
                fx.principals
                    .establish(&request(PrincipalKind::Workload, &sa))
                    .await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let guards = fx.principals.exchange_guards();
    assert_eq!(
        guards.keys_ready + guards.keys_waited,
        20,
        "a key per identity"
    );
    // Once the refill has filled the pool again, and no more: twenty and the pool's bound.
    let bound = 20 + SESSION_KEYS_AHEAD as u64;
    until("the pool refilled", || {
        fx.principals.exchange_guards().keys_generated == bound
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let guards = fx.principals.exchange_guards();
    assert_eq!(guards.keys_generated, bound, "{guards:?}");
    assert!(guards.keys_most_held <= SESSION_KEYS_AHEAD as u64);
    eprintln!(
        "measured: 20 new identities: {} keys generated, {} taken ready, {} waited for",
        guards.keys_generated, guards.keys_ready, guards.keys_waited
    );
}

#[tokio::test]
async fn a_mount_during_a_refresh_is_served_from_the_valid_session_without_waiting() {
    let fx = upst_fixture().await;
    let t0 = fx.clock.now_for_test();
    let first = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    // The emulator's UPSTs live an hour: due at half-life, serving until five minutes
    // before expiry. The identity domain holds every exchange from now on.
    fx.emu.close_gate(Endpoint::IdentityDomain);
    fx.clock.set(t0 + Duration::from_secs(1800));
    let due = at_once(&fx, &mount(&fx, SA)).await;
    assert_eq!(key_id(&due), key_id(&first));
    fx.emu
        .wait_for(AT_ONCE, |s| s.held(Endpoint::IdentityDomain) == 1)
        .await
        .unwrap();
    // The refresh hangs; mounts are served the valid session at once, and it signs.
    fx.clock.set(t0 + Duration::from_secs(3299));
    for _ in 0..3 {
        let during = at_once(&fx, &mount(&fx, SA)).await;
        assert_eq!(key_id(&during), key_id(&first));
    }
    assert_eq!(get_by_name(&fx, &due).await.unwrap().status(), 200);
    assert_eq!(
        fx.emu.stats().held(Endpoint::IdentityDomain),
        1,
        "one refresh"
    );
    fx.emu.open_gate(Endpoint::IdentityDomain);
    let second = refreshed(&first, || async {
        fx.principals.establish(&mount(&fx, SA)).await.unwrap()
    })
    .await;
    assert_eq!(get_by_name(&fx, &second).await.unwrap().status(), 200);
    assert_eq!(fx.emu.stats().token_exchanges(NS, SA), 2);
    let principals = &fx.principals;
    assert_eq!(fetches(principals, "upst", "ahead", "ok"), 1);
    assert_eq!(
        fetches(principals, "upst", "refresh", "ok"),
        0,
        "no mount waited"
    );
    let [_, (_, upst), _] = principals.cache_stats();
    assert_eq!((upst.misses, upst.joined), (1, 0));
}

#[tokio::test]
async fn a_mount_past_the_sessions_end_joins_the_refresh_in_flight_and_makes_no_second_exchange() {
    let fx = Arc::new(upst_fixture().await);
    let t0 = fx.clock.now_for_test();
    let first = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    fx.emu.close_gate(Endpoint::IdentityDomain);
    fx.clock.set(t0 + Duration::from_secs(1800));
    at_once(&fx, &mount(&fx, SA)).await;
    fx.emu
        .wait_for(AT_ONCE, |s| s.held(Endpoint::IdentityDomain) == 1)
        .await
        .unwrap();
    // Past serving: the mount waits, for the refresh in flight.
    fx.clock.set(t0 + Duration::from_secs(3300));
    let waiting = {
        let fx = fx.clone();
        let request = mount(&fx, SA);
        tokio::spawn(async move { fx.principals.establish(&request).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    assert_eq!(fx.emu.stats().held(Endpoint::IdentityDomain), 1);
    fx.emu.open_gate(Endpoint::IdentityDomain);
    let second = waiting.await.unwrap().unwrap();
    assert_ne!(key_id(&second), key_id(&first));
    assert_eq!(get_by_name(&fx, &second).await.unwrap().status(), 200);
    assert_eq!(fx.emu.stats().token_exchanges(NS, SA), 2);
    assert_eq!(fetches(&fx.principals, "upst", "ahead", "ok"), 1);
}

#[tokio::test]
async fn a_failed_refresh_is_retried_and_counted_and_the_session_serves_until_it_expires() {
    let fx = start(base_seed(), |c, _| {
        c.refresh_retry = Duration::from_millis(20);
    })
    .await;
    let token = fx
        .emu
        .issue_service_account_token(
            NS,
            SA,
            Duration::from_secs(3 * 3600),
            Some(("pod", "pod-uid")),
        )
        .unwrap();
    let supplied = || with_token(request(PrincipalKind::Workload, SA), token.clone());
    let t0 = fx.clock.now_for_test();
    let first = fx.principals.establish(&supplied()).await.unwrap();
    let principals = &fx.principals;
    // The emulator's RPSTs live 1200 s: due at 600, serving until 900. The proxymux fails
    // twice: the refresh is tried again, and the mounts meanwhile do not wait.
    fx.emu
        .script(Endpoint::Proxymux, [Fault::Status(503), Fault::Status(503)]);
    fx.clock.set(t0 + Duration::from_secs(600));
    assert_eq!(key_id(&at_once(&fx, &supplied()).await), key_id(&first));
    until("the refresh succeeded", || {
        fetches(principals, "rpst", "ahead", "ok") == 1
    })
    .await;
    assert_eq!(fetches(principals, "rpst", "ahead", "error"), 2);
    let second = refreshed(&first, || async {
        fx.principals.establish(&supplied()).await.unwrap()
    })
    .await;
    assert_eq!(get_by_name(&fx, &second).await.unwrap().status(), 200);

    // The second session (issued at 600) is due at 1200 and serves until 1500; now the
    // proxymux fails every refresh.
    fx.emu
        .set_fault(Endpoint::Proxymux, Some(Fault::Status(503)));
    fx.clock.set(t0 + Duration::from_secs(1200));
    assert_eq!(key_id(&at_once(&fx, &supplied()).await), key_id(&second));
    until("refreshes failed again", || {
        fetches(principals, "rpst", "ahead", "error") >= 5
    })
    .await;
    fx.clock.set(t0 + Duration::from_secs(1499));
    let serving = at_once(&fx, &supplied()).await;
    assert_eq!(key_id(&serving), key_id(&second));
    assert_eq!(get_by_name(&fx, &serving).await.unwrap().status(), 200);
    // Past serving, the mount waits for an exchange of its own, and is told why it failed.
    fx.clock.set(t0 + Duration::from_secs(1500));
    let error = fx.principals.establish(&supplied()).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    fx.emu.clear_faults(Endpoint::Proxymux);
    let third = fx.principals.establish(&supplied()).await.unwrap();
    assert_ne!(key_id(&third), key_id(&second));
    assert_eq!(get_by_name(&fx, &third).await.unwrap().status(), 200);
    eprintln!(
        "measured: {} refresh attempts failed in the background, {} succeeded",
        fetches(principals, "rpst", "ahead", "error"),
        fetches(principals, "rpst", "ahead", "ok")
    );
}

#[tokio::test]
async fn the_instance_session_is_refreshed_in_the_background_while_it_serves() {
    let fx = start(base_seed(), |_, _| {}).await;
    let instance = || request(PrincipalKind::Instance, SA);
    let t0 = fx.clock.now_for_test();
    let first = fx.principals.establish(&instance()).await.unwrap();
    // Instance tokens live 1200 s here: due at 600.
    fx.emu.close_gate(Endpoint::Auth);
    fx.clock.set(t0 + Duration::from_secs(600));
    let due = at_once(&fx, &instance()).await;
    assert_eq!(key_id(&due), key_id(&first));
    fx.emu
        .wait_for(AT_ONCE, |s| s.held(Endpoint::Auth) == 1)
        .await
        .unwrap();
    assert_eq!(get_by_id(&fx, &due).await.status(), 200);
    fx.emu.open_gate(Endpoint::Auth);
    let second = refreshed(&first, || async {
        fx.principals.establish(&instance()).await.unwrap()
    })
    .await;
    assert_eq!(get_by_id(&fx, &second).await.status(), 200);
    assert_eq!(fx.emu.stats().federations, 2);
    assert_eq!(fetches(&fx.principals, "instance", "ahead", "ok"), 1);
}
