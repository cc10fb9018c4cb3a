//! Workload identity federation end to end against the emulator's identity domain: the
//! exchange as the spec describes it (UPST and RPST, Basic and instance-principal client
//! authentication), one exchange per identity, refresh at half-life, renewal after a 401,
//! and each refusal of the domain turned into a message saying what to fix.

use std::sync::Arc;
use std::time::Duration;

use oci_csi_auth::{
    ClientAuth, ClientSecret, ErrorKind, FederationConfig, Identity, PrincipalKind,
    PrincipalsConfig, TokenType, WorkloadMechanism,
};
use testkit::{
    Emulator, Endpoint, Fault, IdentityDomainSeed, KubeSecretSeed, Principal, Seed, Signer,
    TokenSpec, TrustKeys,
};

use crate::principals::{
    Fixture, NS, NowForTest as _, SA, WAIT, auth_error, base_seed, get_by_id, get_by_name,
    refuse_next, request, start, sync_request,
};

const CLIENT: &str = "k8s-csi-runtime";
pub(crate) const SECRET: &str = "runtime-client-secret";
pub(crate) const AUDIENCE: &str = "oci-workload-federation";
/// The service user app/app-sa is mapped to; the twenty `sa-N` share another.
const USER: &str = "svc-app";
pub(crate) const STORM_USER: &str = "svc-storm";

pub(crate) fn subject(sa: &str) -> String {
    format!("system:serviceaccount:{NS}:{sa}")
}

/// The base seed with an identity domain trusting the emulator's cluster for `AUDIENCE`:
/// app-sa impersonates `USER`, the `sa-N` `STORM_USER`; the secret allows both service
/// users and every subject (for RPSTs).
pub(crate) fn seed() -> Seed {
    let mut seed = base_seed();
    seed.identity_domain = IdentityDomainSeed::new(CLIENT, SECRET, AUDIENCE)
        .rule(&format!("sub eq {}", subject(SA)), USER)
        .rule(&format!("sub eq '{}'", subject("sa-*")), STORM_USER);
    seed.identity_domain.trusts[0]
        .instance_tenancies
        .push(seed.instance.tenancy.clone());
    let mut secret = seed.secrets.remove(0).allow_federated(USER);
    secret = secret
        .allow_federated(STORM_USER)
        .allow_federated(subject(SA));
    for i in 0..20 {
        secret = secret.allow_federated(subject(&format!("sa-{i}")));
    }
    seed.secret(secret)
}

pub(crate) fn federation(
    emu: &Emulator,
    client: ClientAuth,
    token_type: TokenType,
) -> WorkloadMechanism {
    WorkloadMechanism::Federation(FederationConfig {
        domain_url: emu.url(Endpoint::IdentityDomain),
        client,
        token_type,
    })
}

pub(crate) fn basic_from_file(emu: &Emulator) -> ClientAuth {
    ClientAuth::Secret {
        client_id: CLIENT.into(),
        secret: ClientSecret::File(emu.files().client_secret.clone()),
    }
}

fn rpst() -> TokenType {
    TokenType::Rpst {
        resource_type: "k8sworkload".into(),
    }
}

/// The emulator with `seed`, the principals federating as `client` for `token_type`.
async fn fixture_with(
    seed: Seed,
    client: impl FnOnce(&Emulator) -> ClientAuth,
    token_type: TokenType,
) -> Fixture {
    start(seed, |c: &mut PrincipalsConfig, emu: &Emulator| {
        c.workload_audience = AUDIENCE.into();
        c.workload_mechanism = federation(emu, client(emu), token_type);
    })
    .await
}

pub(crate) async fn upst_fixture() -> Fixture {
    fixture_with(seed(), basic_from_file, TokenType::Upst).await
}

/// A driver token of `sa` for the audience, bound to the mounts' pod.
fn driver_token(fx: &Fixture, sa: &str) -> String {
    fx.emu
        .mint_service_account_token(
            &TokenSpec::new(NS, sa)
                .bound_to("pod", "pod-uid")
                .audiences(&[AUDIENCE]),
        )
        .unwrap()
}

pub(crate) fn mount(fx: &Fixture, sa: &str) -> oci_csi_auth::IdentityRequest {
    let mut mount = request(PrincipalKind::Workload, sa);
    mount
        .service_account_tokens
        .insert(AUDIENCE.into(), driver_token(fx, sa).into());
    mount
}

/// Who the Secrets API saw the last call as.
fn last_caller(fx: &Fixture) -> Principal {
    fx.emu
        .secrets_calls()
        .last()
        .and_then(|c| c.identity.clone())
        .expect("an authenticated call")
}

#[tokio::test]
async fn a_driver_token_and_a_token_request_are_exchanged_for_upsts_that_sign_verified_calls() {
    let fx = upst_fixture().await;
    let established = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    assert!(matches!(
        established.identity(),
        Identity::Workload { ref service_account, service_account_uid: Some(_), .. }
            if service_account == SA
    ));
    assert_eq!(get_by_name(&fx, &established).await.unwrap().status(), 200);
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    assert_eq!(
        last_caller(&fx),
        Principal::Federated {
            namespace: NS.into(),
            service_account: SA.into(),
            token_type: "upst".into(),
            name: USER.into(),
            client: CLIENT.into(),
        }
    );
    let stats = fx.emu.stats();
    assert_eq!(stats.token_exchanges(NS, SA), 1);
    assert_eq!(stats.total_token_requests(), 0);
    assert_eq!(stats.total_proxymux_exchanges(), 0, "no OKE here");

    // No driver token: a TokenRequest bound to the pod, for the trust's audience.
    let other = fx
        .principals
        .establish(&request(PrincipalKind::Workload, "sa-3"))
        .await
        .unwrap();
    assert_eq!(get_by_name(&fx, &other).await.unwrap().status(), 200);
    assert!(
        matches!(last_caller(&fx), Principal::Federated { ref name, .. } if name == STORM_USER)
    );
    let stats = fx.emu.stats();
    assert_eq!(
        (
            stats.total_token_requests(),
            stats.token_exchanges(NS, "sa-3")
        ),
        (1, 1)
    );
    let kinds: Vec<_> = fx
        .principals
        .credential_fetches()
        .into_iter()
        .map(|((kind, op, result), n)| (kind, op, result, n))
        .collect();
    assert_eq!(kinds, [("upst", "exchange", "ok", 2)]);
}

#[tokio::test]
async fn an_rpst_exchange_signed_by_the_instance_principal_reads_as_the_service_account() {
    let fx = fixture_with(seed(), |_| ClientAuth::InstancePrincipal, rpst()).await;
    let established = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    assert_eq!(get_by_name(&fx, &established).await.unwrap().status(), 200);
    let Principal::Federated {
        token_type,
        name,
        client,
        ..
    } = last_caller(&fx)
    else {
        panic!("not federated");
    };
    assert_eq!((token_type.as_str(), name), ("rpst", subject(SA)));
    assert!(client.starts_with("instance:ocid1.instance."), "{client}");
    let stats = fx.emu.stats();
    assert_eq!((stats.federations, stats.token_exchanges(NS, SA)), (1, 1));
    // The instance session is the node's: a second identity's exchange federates no more.
    let other = fx.principals.establish(&mount(&fx, "sa-1")).await.unwrap();
    assert_eq!(get_by_id(&fx, &other).await.status(), 200);
    assert_eq!(fx.emu.stats().federations, 1);
}

#[tokio::test]
async fn the_client_secret_is_read_from_a_secret_of_the_providers_namespace_at_each_exchange() {
    let provider_ns = Seed::default().provider_service_account.namespace;
    let seed = seed().kube_secret(
        KubeSecretSeed::new(&provider_ns, "oci-federation").data("client-secret", SECRET),
    );
    let secret_ns = provider_ns.clone();
    let fx = fixture_with(
        seed,
        move |_| ClientAuth::Secret {
            client_id: CLIENT.into(),
            secret: ClientSecret::KubernetesSecret {
                namespace: secret_ns,
                name: "oci-federation".into(),
                key: "client-secret".into(),
            },
        },
        TokenType::Upst,
    )
    .await;
    let established = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    assert_eq!(get_by_name(&fx, &established).await.unwrap().status(), 200);
    // A rotated secret the domain no longer takes: the next exchange reads the new one, and
    // the old one is refused as invalid_client.
    fx.emu.put_kube_secret(
        KubeSecretSeed::new(&provider_ns, "oci-federation").data("client-secret", "stale"),
    );
    let error = fx
        .principals
        .establish(&mount(&fx, "sa-1"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    let message = error.to_string();
    assert!(message.contains("invalid_client"), "{message}");
    assert!(
        message.contains("client_id and its client secret"),
        "{message}"
    );
    assert!(!message.contains("stale"), "{message}");
    assert_eq!(fx.emu.stats().token_exchange_refusals("invalid_client"), 1);
}

#[tokio::test]
async fn two_hundred_concurrent_mounts_of_one_identity_make_one_token_exchange() {
    let fx = Arc::new(upst_fixture().await);
    fx.emu.close_gate(Endpoint::IdentityDomain);
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let fx = fx.clone();
            let mount = mount(&fx, SA);
            tokio::spawn(async move { fx.principals.establish(&mount).await })
        })
        .collect();
    fx.emu
        .wait_for(WAIT, |s| s.held(Endpoint::IdentityDomain) >= 1)
        .await
        .unwrap();
    fx.emu.open_gate(Endpoint::IdentityDomain);
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let stats = fx.emu.stats();
    assert_eq!(stats.arrived(Endpoint::IdentityDomain), 1);
    assert_eq!(stats.token_exchanges(NS, SA), 1);
}

#[tokio::test]
async fn twenty_identities_make_twenty_token_exchanges_whatever_the_mounts() {
    let fx = Arc::new(upst_fixture().await);
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let fx = fx.clone();
            let mount = mount(&fx, &format!("sa-{}", i % 20));
            tokio::spawn(async move { fx.principals.establish(&mount).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let stats = fx.emu.stats();
    assert_eq!(stats.total_token_exchanges(), 20);
    for i in 0..20 {
        assert_eq!(stats.token_exchanges(NS, &format!("sa-{i}")), 1, "sa-{i}");
    }
    assert_eq!(stats.arrived(Endpoint::IdentityDomain), 20);
}

#[tokio::test]
async fn a_upst_is_refreshed_in_the_background_from_half_its_life_with_a_new_session_key() {
    let fx = upst_fixture().await;
    let t0 = fx.clock.now_for_test();
    let first = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    let key = |e: &oci_csi_auth::Established| e.session.key().key().public_key_pem();
    // The emulator's session tokens live an hour: half-life at 30 minutes (before the
    // five minutes before expiry).
    fx.clock.set(t0 + Duration::from_secs(1799));
    fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    // Due: this mount is served the valid session, and its refresh starts.
    fx.clock.set(t0 + Duration::from_secs(1800));
    let due = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    assert_eq!(key(&due), key(&first));
    fx.emu
        .wait_for(WAIT, |s| s.token_exchanges(NS, SA) == 2)
        .await
        .unwrap();
    let mut second = due;
    for _ in 0..1000 {
        second = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
        if key(&second) != key(&first) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_ne!(key(&first), key(&second), "a new key pair");
    assert_eq!(get_by_name(&fx, &second).await.unwrap().status(), 200);
    let ops: Vec<_> = fx
        .principals
        .credential_fetches()
        .into_iter()
        .filter(|((kind, _, _), _)| *kind == "upst")
        .map(|((_, op, result), n)| (op, result, n))
        .collect();
    assert_eq!(ops, [("ahead", "ok", 1), ("exchange", "ok", 1)]);
}

#[tokio::test]
async fn a_refused_upst_is_renewed_once_within_the_request_then_is_unauthenticated() {
    let fx = upst_fixture().await;
    let established = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    refuse_next(&fx, 1);
    assert_eq!(get_by_name(&fx, &established).await.unwrap().status(), 200);
    assert_eq!(fx.emu.stats().token_exchanges(NS, SA), 2, "renewed once");
    // The next mount gets the renewed session; refused again and again, it is renewed once
    // more and the request fails.
    let established = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    assert_eq!(fx.emu.stats().token_exchanges(NS, SA), 2);
    refuse_next(&fx, 2);
    let error = auth_error(get_by_name(&fx, &established).await.unwrap_err());
    assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    let stats = fx.emu.stats();
    assert_eq!(stats.token_exchanges(NS, SA), 3);
    assert_eq!(stats.responses(Endpoint::Secrets, 401), 3);
}

#[tokio::test]
async fn the_sync_controllers_unbound_token_is_exchanged_as_the_service_account() {
    let fx = upst_fixture().await;
    let token = fx
        .emu
        .mint_service_account_token(&TokenSpec::new(NS, SA).audiences(&[AUDIENCE]))
        .unwrap();
    let mut mount = sync_request(PrincipalKind::Workload, SA);
    mount
        .service_account_tokens
        .insert(AUDIENCE.into(), token.into());
    let established = fx.principals.establish(&mount).await.unwrap();
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    assert!(matches!(last_caller(&fx), Principal::Federated { ref name, .. } if name == USER));
    let stats = fx.emu.stats();
    assert_eq!(
        (stats.token_exchanges(NS, SA), stats.total_token_requests()),
        (1, 0)
    );
}

/// Establishes `sa` (by TokenRequest, which the provider does not verify: the domain does)
/// expecting a refusal; its message, checked to hold neither a token nor the secret.
async fn refused_by_the_domain(fx: &Fixture, sa: &str) -> (ErrorKind, String) {
    let error = fx
        .principals
        .establish(&request(PrincipalKind::Workload, sa))
        .await
        .unwrap_err();
    let message = error.to_string();
    for leak in ["eyJ", SECRET, "ST$"] {
        assert!(!message.contains(leak), "{leak} in {message}");
    }
    (error.kind(), message)
}

#[tokio::test]
async fn each_refusal_of_the_identity_domain_names_the_check_and_what_to_fix() {
    type Change = fn(&mut Seed);
    let cases: [(&str, Change, &str, &str); 4] = [
        (
            "another issuer",
            |s| s.identity_domain.trusts[0].issuer = "https://elsewhere".into(),
            "issuer: the subject token's iss",
            "its issuer the cluster's service-account issuer",
        ),
        (
            "another audience",
            |s| s.identity_domain.trusts[0].client_claim_values = vec!["sts.amazonaws.com".into()],
            "audience: the subject token's aud",
            "clientClaimValues hold auth.workload_audience",
        ),
        (
            "no rule for the subject",
            |s| {
                s.identity_domain.trusts[0]
                    .impersonation_service_users
                    .clear()
            },
            "no impersonation rule",
            "impersonation rule match sub system:serviceaccount:app:sa-2",
        ),
        (
            "an inactive trust",
            |s| s.identity_domain.trusts[0].active = false,
            "no active identity propagation trust",
            "client_id and its client secret",
        ),
    ];
    for (what, change, check, advice) in cases {
        let mut seed = seed();
        change(&mut seed);
        let fx = upst_fixture_from(seed).await;
        let (kind, message) = refused_by_the_domain(&fx, "sa-2").await;
        assert_eq!(kind, ErrorKind::Unauthenticated, "{what}: {message}");
        assert!(message.contains(check), "{what}: {message}");
        assert!(message.contains(advice), "{what}: {message}");
        assert_eq!(
            fx.emu.stats().arrived(Endpoint::IdentityDomain),
            1,
            "{what}: not retried"
        );
    }
}

pub(crate) async fn upst_fixture_from(seed: Seed) -> Fixture {
    fixture_with(seed, basic_from_file, TokenType::Upst).await
}

#[tokio::test]
async fn a_key_rotation_a_pinned_trust_does_not_know_and_an_expired_token_are_named() {
    let mut pinned = seed();
    pinned.identity_domain.trusts[0].public_keys = TrustKeys::Pinned;
    let fx = upst_fixture_from(pinned).await;
    fx.emu.rotate_issuer_key().unwrap();
    let (_, message) = refused_by_the_domain(&fx, "sa-4").await;
    assert!(
        message.contains("signature: the subject token does not verify"),
        "{message}"
    );
    assert!(
        message.contains("copy a publicCertificate again"),
        "{message}"
    );

    // The domain's clock an hour ahead of the node's: a driver token the provider finds
    // valid for an hour has expired there.
    let fx = upst_fixture().await;
    let token = mount(&fx, "sa-5");
    fx.emu.advance_time(Duration::from_secs(3601));
    let error = fx.principals.establish(&token).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    assert!(
        error
            .to_string()
            .contains("expired: the subject token's exp"),
        "{error}"
    );
}

#[tokio::test]
async fn forged_or_foreign_driver_tokens_are_refused_before_any_exchange() {
    let fx = upst_fixture().await;
    let now = fx.clock.now_for_test();
    let forged = |spec: TokenSpec| fx.emu.mint_service_account_token(&spec).unwrap();
    let base = || TokenSpec::new(NS, SA).bound_to("pod", "pod-uid");
    for (token, check) in [
        (
            forged(
                base()
                    .audiences(&[AUDIENCE])
                    .signed_by(Signer::OtherKeySameKid),
            ),
            "signature does not verify",
        ),
        (forged(base()), "audience (aud)"),
        (
            forged(
                base()
                    .audiences(&[AUDIENCE])
                    .issued_at(now - Duration::from_secs(7200)),
            ),
            "expired",
        ),
        (
            forged(
                base()
                    .audiences(&[AUDIENCE])
                    .issuer("https://other.example"),
            ),
            "issuer (iss)",
        ),
    ] {
        let mut mount = request(PrincipalKind::Workload, SA);
        mount
            .service_account_tokens
            .insert(AUDIENCE.into(), token.clone().into());
        let error = fx.principals.establish(&mount).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
        assert!(error.to_string().contains(check), "{check}: {error}");
        assert!(!error.to_string().contains(&token));
    }
    assert_eq!(fx.emu.stats().arrived(Endpoint::IdentityDomain), 0);
}

#[tokio::test]
async fn a_failing_identity_domain_is_tried_three_times_within_the_deadline() {
    let fx = upst_fixture().await;
    fx.emu.script(
        Endpoint::IdentityDomain,
        [Fault::Status(503), Fault::Status(502)],
    );
    fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    assert_eq!(fx.emu.stats().arrived(Endpoint::IdentityDomain), 3);

    fx.emu
        .set_fault(Endpoint::IdentityDomain, Some(Fault::Status(500)));
    let error = fx
        .principals
        .establish(&mount(&fx, "sa-1"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(
        error.to_string().contains("failed on every attempt"),
        "{error}"
    );
    assert_eq!(fx.emu.stats().arrived(Endpoint::IdentityDomain), 6);

    // Refusals are not retried: they would be refused again.
    fx.emu.clear_faults(Endpoint::IdentityDomain);
    fx.emu
        .script(Endpoint::IdentityDomain, [Fault::invalid_grant()]);
    let error = fx
        .principals
        .establish(&mount(&fx, "sa-2"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("invalid_grant"), "{error}");
    assert_eq!(fx.emu.stats().arrived(Endpoint::IdentityDomain), 7);

    // A domain that does not answer ends the mount at its deadline.
    fx.emu
        .set_fault(Endpoint::IdentityDomain, Some(Fault::StallBeforeHeaders));
    let mut slow = mount(&fx, "sa-3");
    slow.deadline = tokio::time::Instant::now() + Duration::from_millis(800);
    let error = fx.principals.establish(&slow).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::DeadlineExceeded, "{error}");
    fx.emu.release_stalls();
}

#[tokio::test]
async fn an_instance_session_the_domain_refuses_is_federated_again_for_the_next_exchange() {
    let fx = fixture_with(seed(), |_| ClientAuth::InstancePrincipal, rpst()).await;
    fx.emu
        .script(Endpoint::IdentityDomain, [Fault::invalid_client()]);
    let error = fx.principals.establish(&mount(&fx, SA)).await.unwrap_err();
    assert!(error.to_string().contains("invalid_client"), "{error}");
    assert_eq!(fx.emu.stats().federations, 1);
    // The refused instance session is dropped: the next exchange signs with a new one.
    let established = fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    let stats = fx.emu.stats();
    assert_eq!((stats.federations, stats.token_exchanges(NS, SA)), (2, 1));
}

#[tokio::test]
async fn a_401_about_the_subject_keeps_the_instance_session() {
    let fx = fixture_with(seed(), |_| ClientAuth::InstancePrincipal, rpst()).await;
    fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    assert_eq!(fx.emu.stats().federations, 1);
    // 401s that do not say `invalid_client`: the subject's token, an OCI error body, no
    // JSON at all. Each identity is exchanged once (their refusals are remembered).
    for (sa, fault) in [
        (
            "sa-1",
            Fault::OAuth {
                status: 401,
                error: "invalid_grant".into(),
            },
        ),
        ("sa-2", Fault::Status(401)),
        ("sa-3", Fault::NonJsonError(401)),
    ] {
        fx.emu.script(Endpoint::IdentityDomain, [fault]);
        let error = fx.principals.establish(&mount(&fx, sa)).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{sa}: {error}");
        assert!(error.to_string().contains("http 401"), "{sa}: {error}");
    }
    // The node's instance session still signs the next exchange: no federation.
    let established = fx.principals.establish(&mount(&fx, "sa-4")).await.unwrap();
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    let stats = fx.emu.stats();
    assert_eq!(stats.federations, 1);
    assert_eq!(stats.arrived(Endpoint::IdentityDomain), 5);
}

#[tokio::test]
async fn a_401_invalid_client_drops_the_instance_session_once() {
    let fx = fixture_with(seed(), |_| ClientAuth::InstancePrincipal, rpst()).await;
    fx.principals.establish(&mount(&fx, SA)).await.unwrap();
    fx.emu.script(
        Endpoint::IdentityDomain,
        [Fault::invalid_client(), Fault::invalid_client()],
    );
    // The first drops the session: the next exchange signs with a new one, which the domain
    // refuses too, within the cool-down: it is kept.
    for sa in ["sa-1", "sa-2"] {
        let error = fx.principals.establish(&mount(&fx, sa)).await.unwrap_err();
        assert!(error.to_string().contains("invalid_client"), "{error}");
    }
    assert_eq!(fx.emu.stats().federations, 2);
    // `invalid_client` is the node's, not the subject's: sa-1 is tried again at once.
    let established = fx.principals.establish(&mount(&fx, "sa-1")).await.unwrap();
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    let stats = fx.emu.stats();
    assert_eq!(
        (stats.federations, stats.token_exchanges(NS, "sa-1")),
        (2, 1)
    );
    assert_eq!(fx.principals.exchange_guards().refusals_remembered, 0);
}
