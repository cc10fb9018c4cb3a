//! The three principals end to end against the emulator: real TLS, the one transport,
//! signatures verified by the emulator, the shared manual clock, no sleeps.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clock::{ManualClock, SharedClock};
use http::{Method, Request, Response};
use oci_csi_auth::{
    AuthError, BoxError, ErrorKind, Established, Identity, IdentityRequest, PrincipalKind,
    Principals, PrincipalsConfig, PrivateKey, SigningLayer,
};
use secrecy::SecretString;
use testkit::{
    Emulator, Endpoint, Fault, KubeSecretSeed, Principal, SecretSeed, Seed, Signer, TokenSpec,
    UserSeed,
};
use tower::{Layer as _, ServiceExt as _};
use transport::{Deadline, HttpService, Transport, TransportConfig};

use crate::{PASSPHRASE, SPEC_KEY, fixture};

const VAULT: &str = "ocid1.vault.oc1..v";
const SECRET: &str = "db-password";
const TENANCY: &str = "ocid1.tenancy.oc1..aaaaaaaausertenancy";
const USER: &str = "ocid1.user.oc1..aaaaaaaauser";
pub(crate) const NS: &str = "app";
pub(crate) const SA: &str = "app-sa";
pub(crate) const WAIT: Duration = Duration::from_secs(30);

pub(crate) struct Fixture {
    pub(crate) emu: Emulator,
    pub(crate) clock: Arc<ManualClock>,
    pub(crate) http: HttpService,
    pub(crate) principals: Principals,
}

/// A clock on a whole second, so token `exp` claims (whole seconds) line up exactly.
pub(crate) fn clock() -> Arc<ManualClock> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    Arc::new(ManualClock::new(UNIX_EPOCH + Duration::from_secs(now)))
}

pub(crate) fn base_seed() -> Seed {
    let mut seed = Seed::default().vault(VAULT).service_account(NS, SA);
    let mut secret = SecretSeed::new("ocid1.vaultsecret.oc1..s", VAULT, SECRET)
        .version(1, "hunter2", &["CURRENT", "LATEST"])
        .allow_user(USER)
        .allow_workload(NS, SA)
        .allow_instance_tenancy(seed.instance.tenancy.clone());
    for i in 0..20 {
        let sa = format!("sa-{i}");
        seed = seed.service_account(NS, &sa);
        secret = secret.allow_workload(NS, &sa);
    }
    seed.secret(secret)
}

pub(crate) async fn start(
    seed: Seed,
    tweak: impl FnOnce(&mut PrincipalsConfig, &Emulator),
) -> Fixture {
    let clock = clock();
    let shared: SharedClock = clock.clone();
    let emu = Emulator::start(seed, shared.clone()).await.unwrap();
    let ca = emu.files().ca.clone();
    let mut config = PrincipalsConfig {
        region: Some("us-ashburn-1".into()),
        federation_endpoint: Some(emu.url(Endpoint::Auth)),
        instance_metadata: emu.url(Endpoint::Imds),
        proxymux: Some(emu.url(Endpoint::Proxymux)),
        kubernetes_api: Some(emu.url(Endpoint::Kube)),
        service_account_token_file: emu.files().provider_token.clone(),
        ..PrincipalsConfig::default()
    };
    tweak(&mut config, &emu);
    let authority = |url: &str| {
        url.parse::<http::Uri>()
            .unwrap()
            .authority()
            .unwrap()
            .to_string()
    };
    let transport = TransportConfig {
        oci_ca_files: vec![ca.clone()],
        ..TransportConfig::default()
    }
    .trust_only(authority(config.proxymux.as_deref().unwrap()), ca.clone())
    .trust_only(emu.addr(Endpoint::Kube).to_string(), ca)
    .allow_plain_http(authority(&config.instance_metadata));
    let http = Transport::new(transport).unwrap().service();
    let principals = Principals::new(config, http.clone(), shared).unwrap();
    Fixture {
        emu,
        clock,
        http,
        principals,
    }
}

pub(crate) fn deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + WAIT
}

pub(crate) fn request(kind: PrincipalKind, service_account: &str) -> IdentityRequest {
    IdentityRequest {
        kind,
        namespace: Some(NS.into()),
        pod_name: Some("pod".into()),
        pod_uid: Some("pod-uid".into()),
        service_account: Some(service_account.into()),
        service_account_tokens: BTreeMap::new(),
        deadline: deadline(),
        caller: oci_csi_auth::Caller::Driver,
    }
}

pub(crate) fn with_token(mut request: IdentityRequest, token: String) -> IdentityRequest {
    request
        .service_account_tokens
        .insert(String::new(), SecretString::from(token));
    request
}

/// A signed GetSecretBundleByName (spec 2.2) through the signing layer over the transport,
/// carrying the mount's session.
pub(crate) async fn get_by_name(
    fx: &Fixture,
    established: &Established,
) -> Result<Response<Bytes>, BoxError> {
    get_by_name_by(fx, established, deadline()).await
}

pub(crate) async fn get_by_name_by(
    fx: &Fixture,
    established: &Established,
    by: tokio::time::Instant,
) -> Result<Response<Bytes>, BoxError> {
    let service = SigningLayer::new(fx.clock.clone()).layer(fx.http.clone());
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!(
            "{}/20190301/secretbundles/actions/getByName?secretName={SECRET}&stage=CURRENT&vaultId={VAULT}",
            fx.emu.url(Endpoint::Secrets)
        ))
        .body(Bytes::new())
        .unwrap();
    request.extensions_mut().insert(established.session.clone());
    request.extensions_mut().insert(Deadline(by));
    service.oneshot(request).await
}

/// A signed GetSecretBundle (GET).
pub(crate) async fn get_by_id(fx: &Fixture, established: &Established) -> Response<Bytes> {
    let service = SigningLayer::new(fx.clock.clone()).layer(fx.http.clone());
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(format!(
            "{}/20190301/secretbundles/ocid1.vaultsecret.oc1..s?stage=CURRENT",
            fx.emu.url(Endpoint::Secrets)
        ))
        .body(Bytes::new())
        .unwrap();
    request.extensions_mut().insert(established.session.clone());
    service.oneshot(request).await.unwrap()
}

/// OCI refuses the next `n` Secrets calls with a 401 (a revoked token or a rotated key).
pub(crate) fn refuse_next(fx: &Fixture, n: usize) {
    fx.emu.script(
        Endpoint::Secrets,
        std::iter::repeat_n(Fault::Status(401), n),
    );
}

pub(crate) fn auth_error(error: BoxError) -> AuthError {
    *error.downcast::<AuthError>().expect("an AuthError")
}

fn principal_of(identity: &Identity) -> Principal {
    match identity {
        Identity::Workload {
            namespace,
            service_account,
            service_account_uid,
        } => Principal::Workload {
            namespace: namespace.clone(),
            service_account: service_account.clone(),
            service_account_uid: service_account_uid.clone().unwrap(),
            tenancy: Seed::default().workload_tenancy,
        },
        other => panic!("not a workload: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// user principal

fn user_key() -> PrivateKey {
    PrivateKey::from_pem(&fixture("rsa-pkcs1.pem"), None).unwrap()
}

fn user_seed(config: &str, private_key: &[u8]) -> Seed {
    base_seed()
        .user(UserSeed {
            tenancy: TENANCY.into(),
            user: USER.into(),
            public_key_pem: user_key().public_key_pem(),
        })
        .kube_secret(
            KubeSecretSeed::new(NS, "oci-config")
                .data("config", config)
                .data("private-key", private_key.to_vec()),
        )
}

fn user_config(fingerprint: &str) -> String {
    format!(
        "auth:\n  region: iad\n  tenancy: {TENANCY}\n  user: {USER}\n  fingerprint: {fingerprint}\n"
    )
}

fn user_request() -> IdentityRequest {
    request(
        PrincipalKind::User {
            secret_name: "oci-config".into(),
        },
        SA,
    )
}

/// The emulator with a valid user principal Secret `oci-config` in `NS`.
async fn user_fixture() -> Fixture {
    start(
        user_seed(
            &user_config(&user_key().fingerprint()),
            &fixture("rsa-pkcs1.pem"),
        ),
        |_, _| {},
    )
    .await
}

#[tokio::test]
async fn user_principal_end_to_end_signs_verified_post_and_get() {
    let fx = user_fixture().await;
    let established = fx.principals.establish(&user_request()).await.unwrap();
    assert_eq!(
        established.identity(),
        Identity::User {
            namespace: NS.into(),
            secret_name: "oci-config".into()
        }
    );
    let response = get_by_name(&fx, &established).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    let calls = fx.emu.secrets_calls();
    assert_eq!(calls.len(), 2);
    for call in calls {
        assert_eq!(
            call.identity,
            Some(Principal::User {
                tenancy: TENANCY.into(),
                user: USER.into()
            })
        );
    }
    // Cached for the TTL: a second mount reads the Secret no more.
    let reads = fx.emu.stats().arrived(Endpoint::Kube);
    fx.principals.establish(&user_request()).await.unwrap();
    assert_eq!(fx.emu.stats().arrived(Endpoint::Kube), reads);
    fx.clock.advance(Duration::from_secs(61));
    fx.principals.establish(&user_request()).await.unwrap();
    assert_eq!(fx.emu.stats().arrived(Endpoint::Kube), reads + 1);
}

#[tokio::test]
async fn a_cached_user_key_is_weighed_by_what_it_holds_and_other_members_are_not_kept() {
    // A Secret with a 300 KB member the provider does not read: it is skipped, not kept.
    let seed = base_seed()
        .user(UserSeed {
            tenancy: TENANCY.into(),
            user: USER.into(),
            public_key_pem: user_key().public_key_pem(),
        })
        .kube_secret(
            KubeSecretSeed::new(NS, "oci-config")
                .data("config", user_config(&user_key().fingerprint()))
                .data("private-key", fixture("rsa-pkcs1.pem"))
                .data("junk", vec![b'j'; 300_000]),
        );
    let fx = start(seed, |_, _| {}).await;
    fx.principals.establish(&user_request()).await.unwrap();
    let [(kind, stats), ..] = fx.principals.cache_stats();
    assert_eq!(kind, "user");
    assert_eq!(stats.entries, 1);
    // The key (counted at 4 KiB) and the strings kept beside it: names, OCIDs, the
    // fingerprint, the key id, the region; a few hundred bytes, not a flat figure.
    let strings = NS.len() + "oci-config".len() + 2 * (TENANCY.len() + USER.len()) + 2 * 47;
    assert!(
        stats.bytes >= (4096 + strings) as u64 && stats.bytes < 4096 + 1024,
        "{}",
        stats.bytes
    );
}

#[tokio::test]
async fn user_principal_with_wrong_key_is_unauthenticated_names_both_fingerprints_and_rereads() {
    let configured = user_key().fingerprint();
    let wrong = PrivateKey::from_pem(SPEC_KEY.as_bytes(), None).unwrap();
    let fx = start(
        user_seed(&user_config(&configured), SPEC_KEY.as_bytes()),
        |_, _| {},
    )
    .await;
    let established = fx.principals.establish(&user_request()).await.unwrap();
    let error = auth_error(get_by_name(&fx, &established).await.unwrap_err());
    assert_eq!(error.kind(), ErrorKind::Unauthenticated);
    let message = error.to_string();
    assert!(message.contains("user principal"), "{message}");
    assert!(message.contains(&configured), "{message}");
    assert!(message.contains(&wrong.fingerprint()), "{message}");
    // No retry for a user key, and the Secret is read again by the next mount.
    assert_eq!(fx.emu.stats().responses(Endpoint::Secrets, 401), 1);
    let reads = fx.emu.stats().arrived(Endpoint::Kube);
    fx.principals.establish(&user_request()).await.unwrap();
    assert_eq!(fx.emu.stats().arrived(Endpoint::Kube), reads + 1);
}

/// A mount signs with the key it established, even if it outlives the TTL; the next mount
/// past the TTL reads the Secret again.
#[tokio::test]
async fn a_user_key_past_its_ttl_is_read_again_by_the_next_mount() {
    let fx = user_fixture().await;
    let established = fx.principals.establish(&user_request()).await.unwrap();
    let reads = fx.emu.stats().arrived(Endpoint::Kube);
    fx.clock.advance(Duration::from_secs(61));
    let response = get_by_name(&fx, &established).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(fx.emu.stats().arrived(Endpoint::Kube), reads);
    let next = fx.principals.establish(&user_request()).await.unwrap();
    assert_eq!(fx.emu.stats().arrived(Endpoint::Kube), reads + 1);
    assert_eq!(get_by_name(&fx, &next).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_401_drops_the_cached_user_key_without_failing_mounts_already_established() {
    let fx = user_fixture().await;
    let first = fx.principals.establish(&user_request()).await.unwrap();
    let second = fx.principals.establish(&user_request()).await.unwrap();
    // The first mount's request is refused (a key rotated in OCI, say): no retry, and the
    // cached key is dropped. The second mount, already past establish, signs with its own
    // session; the next mount reads the Secret again.
    refuse_next(&fx, 1);
    let error = auth_error(get_by_name(&fx, &first).await.unwrap_err());
    assert_eq!(error.kind(), ErrorKind::Unauthenticated);
    assert_eq!(fx.emu.stats().responses(Endpoint::Secrets, 401), 1);
    let reads = fx.emu.stats().arrived(Endpoint::Kube);
    let response = get_by_name(&fx, &second).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(fx.emu.stats().arrived(Endpoint::Kube), reads);
    fx.principals.establish(&user_request()).await.unwrap();
    assert_eq!(fx.emu.stats().arrived(Endpoint::Kube), reads + 1);
}

#[tokio::test]
async fn a_key_that_failed_to_load_is_not_decrypted_again_until_the_secret_changes() {
    let fp = user_key().fingerprint();
    let encrypted = fixture("rsa-pkcs8-encrypted.pem");
    let wrong = format!("{}  passphrase: not-it\n", user_config(&fp));
    let fx = start(user_seed(&wrong, &encrypted), |_, _| {}).await;
    for _ in 0..5 {
        let error = fx.principals.establish(&user_request()).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
    }
    assert_eq!(
        fx.principals.key_loads(),
        1,
        "one decryption for five mounts"
    );
    // The TTL over, the same Secret is tried once more.
    fx.clock.advance(Duration::from_secs(61));
    fx.principals.establish(&user_request()).await.unwrap_err();
    assert_eq!(fx.principals.key_loads(), 2);
    // The tenant fixes the passphrase: a new resourceVersion is loaded at once.
    let right = format!(
        "{}  passphrase: {}\n",
        user_config(&fp),
        std::str::from_utf8(PASSPHRASE).unwrap()
    );
    fx.emu.put_kube_secret(
        KubeSecretSeed::new(NS, "oci-config")
            .data("config", right)
            .data("private-key", encrypted),
    );
    fx.principals.establish(&user_request()).await.unwrap();
    assert_eq!(fx.principals.key_loads(), 3);
}

#[tokio::test]
async fn user_secret_missing_is_not_found() {
    let fx = start(base_seed(), |_, _| {}).await;
    let error = fx.principals.establish(&user_request()).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound);
    assert!(
        error
            .to_string()
            .contains("error retrieving secret: oci-config"),
        "{error}"
    );
}

#[tokio::test]
async fn malformed_user_secrets_are_specific_invalid_arguments() {
    let fp = user_key().fingerprint();
    let pem = fixture("rsa-pkcs1.pem");
    let encrypted = fixture("rsa-pkcs8-encrypted.pem");
    let cases: Vec<(String, Vec<u8>, &str)> = vec![
        (
            "region: iad\n".into(),
            pem.clone(),
            "there is no auth mapping",
        ),
        (
            "auth: [1, 2]\n".into(),
            pem.clone(),
            "invalid auth config data",
        ),
        (
            "auth:\n  region:\n    nested: x\n".into(),
            pem.clone(),
            "invalid auth config data",
        ),
        (
            "auth:\n  region: iad\n  user: u\n".into(),
            pem.clone(),
            "missing auth config data: [Auth.Tenancy: Required value: Tenancy is required for user principal, Auth.Fingerprint: Required value: Fingerprint is required for user principal]",
        ),
        (
            format!(
                "auth:\n  region: \"us ashburn\"\n  tenancy: {TENANCY}\n  user: {USER}\n  fingerprint: {fp}\n"
            ),
            pem.clone(),
            "region can not be empty or have spaces",
        ),
        // A tenant cannot point the provider at a host of its choosing.
        (
            format!(
                "auth:\n  region: \"a@127.0.0.1:9\"\n  tenancy: {TENANCY}\n  user: {USER}\n  fingerprint: {fp}\n"
            ),
            pem.clone(),
            "region \"a@127.0.0.1:9\" is not a region this provider knows",
        ),
        (
            format!(
                "auth:\n  region: evil.example.com\n  tenancy: {TENANCY}\n  user: {USER}\n  fingerprint: {fp}\n"
            ),
            pem.clone(),
            "is not a region this provider knows",
        ),
        (
            format!(
                "auth:\n  region: xx-nowhere-9\n  tenancy: {TENANCY}\n  user: {USER}\n  fingerprint: {fp}\n"
            ),
            pem.clone(),
            "OCI_REGION_METADATA or a regions-config.json",
        ),
        (
            user_config(&fp),
            Vec::new(),
            "invalid user auth config data",
        ),
        (
            format!("{}  passphrase: not-it\n", user_config(&fp)),
            encrypted.clone(),
            "cannot load the private key",
        ),
        (String::new(), pem.clone(), "auth config data is empty"),
        // Members kept in the credential and the key id are held to their form as they are
        // read: an OCID, a fingerprint. Their values are not echoed.
        (
            format!("auth:\n  region: iad\n  tenancy: t\n  user: {USER}\n  fingerprint: {fp}\n"),
            pem.clone(),
            "auth.tenancy is not an OCID (ocid1.",
        ),
        (
            format!(
                "auth:\n  region: iad\n  tenancy: {TENANCY}\n  user: ocid1.{}\n  fingerprint: {fp}\n",
                "u".repeat(300)
            ),
            pem.clone(),
            "auth.user is not an OCID",
        ),
        (
            format!(
                "auth:\n  region: iad\n  tenancy: {TENANCY}\n  user: {USER}\n  fingerprint: not-it\n"
            ),
            pem.clone(),
            "auth.fingerprint is not an API key fingerprint",
        ),
        (
            format!(
                "auth:\n  region: iad\n  tenancy: {TENANCY}\n  user: {USER}\n  fingerprint: {}\n",
                "a".repeat(2000)
            ),
            pem.clone(),
            "a value of 2000 bytes, longer than the 1024 a member takes",
        ),
        // One string aliased across the members is refused by the parse budget.
        (
            format!(
                "x: &x {}\nauth:\n  region: *x\n  tenancy: *x\n  user: *x\n  fingerprint: *x\n  passphrase: *x\n  a: *x\n  b: *x\n  c: *x\n",
                "ocid1".repeat(200)
            ),
            pem.clone(),
            "refused by the parse budget",
        ),
    ];
    for (config, key, expected) in cases {
        let fx = start(user_seed(&config, &key), |_, _| {}).await;
        let error = fx.principals.establish(&user_request()).await.unwrap_err();
        assert_eq!(
            error.kind(),
            ErrorKind::InvalidArgument,
            "{config}: {error}"
        );
        let chain = format!(
            "{error}: {}",
            std::error::Error::source(&error)
                .map(|s| s.to_string())
                .unwrap_or_default()
        );
        assert!(chain.contains(expected), "{config}: {chain}");
        assert!(!chain.contains("not-it"), "passphrase echoed: {chain}");
        assert!(!chain.contains("uuuuuuuu"), "value echoed: {chain}");
        assert!(chain.len() < 1024, "{chain}");
    }
    // The right passphrase loads the encrypted key.
    let config = format!(
        "{}  passphrase: {}\n",
        user_config(&fp),
        std::str::from_utf8(PASSPHRASE).unwrap()
    );
    let fx = start(user_seed(&config, &encrypted), |_, _| {}).await;
    fx.principals.establish(&user_request()).await.unwrap();
}

// ---------------------------------------------------------------------------------------
// workload identity

fn sa_token(fx: &Fixture, sa: &str, lifetime: Duration) -> String {
    fx.emu
        .issue_service_account_token(NS, sa, lifetime, Some(("pod", "pod-uid")))
        .unwrap()
}

/// A token of `SA` bound to the mounts' pod, as `spec` changes it.
fn minted(fx: &Fixture, spec: impl FnOnce(TokenSpec) -> TokenSpec) -> String {
    fx.emu
        .mint_service_account_token(&spec(TokenSpec::new(NS, SA).bound_to("pod", "pod-uid")))
        .unwrap()
}

/// Token verifications so far with this result (`ok`, `refused`, `unavailable`).
fn verifications(fx: &Fixture, result: &str) -> u64 {
    verified(fx, result, None)
}

/// Token verifications so far with this result and, if given, this reason.
fn verified(fx: &Fixture, result: &str, reason: Option<&str>) -> u64 {
    fx.principals
        .token_verifications()
        .into_iter()
        .filter(|((r, why), _)| *r == result && reason.is_none_or(|w| w == *why))
        .map(|(_, n)| n)
        .sum()
}

fn workload_mount(token: &str) -> IdentityRequest {
    with_token(request(PrincipalKind::Workload, SA), token.to_owned())
}

/// Establishes with `token`, expecting a refusal: its message, checked to hold no token.
async fn refused(fx: &Fixture, token: &str) -> String {
    let error = fx
        .principals
        .establish(&workload_mount(token))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    let message = error.to_string();
    assert!(!message.contains(token), "token echoed: {message}");
    for part in token.split('.') {
        assert!(part.len() < 8 || !message.contains(part), "{message}");
    }
    message
}

#[tokio::test]
async fn workload_identity_end_to_end_with_driver_token_and_with_token_request() {
    let fx = start(base_seed(), |_, _| {}).await;
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    let established = fx
        .principals
        .establish(&with_token(request(PrincipalKind::Workload, SA), token))
        .await
        .unwrap();
    let Identity::Workload {
        service_account_uid: Some(_),
        ..
    } = &established.identity()
    else {
        panic!("no uid: {:?}", established.identity());
    };
    assert_eq!(get_by_name(&fx, &established).await.unwrap().status(), 200);
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    let stats = fx.emu.stats();
    assert_eq!(stats.proxymux_exchanges(NS, SA), 1);
    assert_eq!(stats.total_token_requests(), 0);

    // Without a driver token: one TokenRequest bound to the pod, for another identity.
    let other = fx
        .principals
        .establish(&request(PrincipalKind::Workload, "sa-1"))
        .await
        .unwrap();
    assert_eq!(get_by_name(&fx, &other).await.unwrap().status(), 200);
    let stats = fx.emu.stats();
    assert_eq!(stats.total_token_requests(), 1);
    assert_eq!(stats.proxymux_exchanges(NS, "sa-1"), 1);
    for call in fx.emu.secrets_calls() {
        assert!(matches!(call.identity, Some(Principal::Workload { .. })));
    }
}

#[tokio::test]
async fn a_refused_workload_token_is_renewed_once_then_is_unauthenticated() {
    let fx = start(base_seed(), |_, _| {}).await;
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    let established = fx
        .principals
        .establish(&with_token(request(PrincipalKind::Workload, SA), token))
        .await
        .unwrap();
    refuse_next(&fx, 2);
    let error = auth_error(get_by_name(&fx, &established).await.unwrap_err());
    assert_eq!(error.kind(), ErrorKind::Unauthenticated);
    assert!(error.to_string().contains("workload identity"), "{error}");
    let stats = fx.emu.stats();
    assert_eq!(stats.responses(Endpoint::Secrets, 401), 2, "one retry");
    assert_eq!(
        stats.proxymux_exchanges(NS, SA),
        2,
        "a fresh token for the retry"
    );
}

/// The renewal after a 401 runs within the request's own deadline: a proxymux that never
/// answers ends the request at its deadline, not after a budget of the principal's.
#[tokio::test]
async fn the_renewal_after_a_401_ends_at_the_requests_deadline() {
    let fx = start(base_seed(), |_, _| {}).await;
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    let established = fx
        .principals
        .establish(&with_token(request(PrincipalKind::Workload, SA), token))
        .await
        .unwrap();
    refuse_next(&fx, 1);
    fx.emu.close_gate(Endpoint::Proxymux);
    let by = tokio::time::Instant::now() + Duration::from_millis(1500);
    let error = auth_error(get_by_name_by(&fx, &established, by).await.unwrap_err());
    assert_eq!(error.kind(), ErrorKind::DeadlineExceeded, "{error}");
    assert!(tokio::time::Instant::now() >= by);
    assert_eq!(fx.emu.stats().responses(Endpoint::Secrets, 401), 1);
    fx.emu.open_gate(Endpoint::Proxymux);
}

#[tokio::test]
async fn a_late_401_for_a_replaced_token_does_not_discard_the_renewed_one() {
    let fx = start(base_seed(), |_, _| {}).await;
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    let established = fx
        .principals
        .establish(&with_token(request(PrincipalKind::Workload, SA), token))
        .await
        .unwrap();
    let session = &established.session;
    let first = session.key().clone();
    // The first refused request renews the token...
    session.invalidate(first.key_id()).await;
    let second = session.renew(deadline()).await.unwrap().unwrap();
    assert_ne!(
        second.key_id().expose_secret(),
        first.key_id().expose_secret()
    );
    assert_eq!(fx.emu.stats().proxymux_exchanges(NS, SA), 2);
    // ...and a second request, signed with the old token and refused a moment later, must
    // not throw the new one away.
    session.invalidate(first.key_id()).await;
    let third = session.renew(deadline()).await.unwrap().unwrap();
    assert_eq!(
        third.key_id().expose_secret(),
        second.key_id().expose_secret()
    );
    assert_eq!(fx.emu.stats().proxymux_exchanges(NS, SA), 2);
    // A new mount gets the renewed token too.
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    let again = fx
        .principals
        .establish(&with_token(request(PrincipalKind::Workload, SA), token))
        .await
        .unwrap();
    assert_eq!(
        again.session.key().key_id().expose_secret(),
        second.key_id().expose_secret()
    );
    let response = get_by_name(&fx, &again).await.unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn two_hundred_concurrent_mounts_of_one_identity_make_one_exchange() {
    let fx = Arc::new(start(base_seed(), |_, _| {}).await);
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    fx.emu.close_gate(Endpoint::Proxymux);
    let started = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let fx = fx.clone();
            let token = token.clone();
            let started = started.clone();
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                fx.principals
                    .establish(&with_token(request(PrincipalKind::Workload, SA), token))
                    .await
            })
        })
        .collect();
    fx.emu
        .wait_for(WAIT, |s| s.held(Endpoint::Proxymux) >= 1)
        .await
        .unwrap();
    // Let every task reach the single-flight lock (current-thread runtime: each yield
    // polls every ready task once).
    while started.load(Ordering::SeqCst) < 200 {
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(fx.emu.stats().held(Endpoint::Proxymux), 1);
    fx.emu.open_gate(Endpoint::Proxymux);
    let mut established = Vec::new();
    for task in tasks {
        established.push(task.await.unwrap().unwrap());
    }
    let calls: Vec<_> = established
        .iter()
        .map(|e| {
            let fx = fx.clone();
            let e = e.clone();
            tokio::spawn(async move { get_by_name(&fx, &e).await.unwrap().status() })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    let stats = fx.emu.stats();
    assert_eq!(stats.proxymux_exchanges(NS, SA), 1);
    // Every mount's token verified, against keys read once for all of them.
    assert_eq!(
        (stats.issuer_discovery_requests, stats.jwks_requests),
        (1, 1)
    );
    assert_eq!(verifications(&fx, "refused"), 0);
    assert_eq!(verifications(&fx, "ok"), 200);
    assert_eq!(stats.responses(Endpoint::Secrets, 200), 200);
    let recorded = fx.emu.secrets_calls();
    assert_eq!(recorded.len(), 200);
    let expected = principal_of(&established[0].identity());
    assert!(
        recorded
            .iter()
            .all(|c| c.identity.as_ref() == Some(&expected))
    );
    eprintln!(
        "measured: {} exchange(s), {} token request(s) for 200 mounts of one identity",
        stats.total_proxymux_exchanges(),
        stats.total_token_requests()
    );
}

#[tokio::test]
async fn twenty_identities_make_twenty_exchanges_and_at_most_twenty_token_requests() {
    let fx = Arc::new(start(base_seed(), |_, _| {}).await);
    fx.emu.close_gate(Endpoint::Proxymux);
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let fx = fx.clone();
            let sa = format!("sa-{}", i % 20);
            tokio::spawn(async move {
                let established = fx
                    .principals
                    .establish(&request(PrincipalKind::Workload, &sa))
                    .await
                    .unwrap();
                (sa, established)
            })
        })
        .collect();
    fx.emu
        // The transport lets 4 requests per host in flight (its default bound), so 4
        // exchanges are held and 16 queue behind them, each after its one TokenRequest.
        .wait_for(WAIT, |s| {
            s.held(Endpoint::Proxymux) >= 4 && s.total_token_requests() == 20
        })
        .await
        .unwrap();
    fx.emu.open_gate(Endpoint::Proxymux);
    let mut mounts = Vec::new();
    for task in tasks {
        mounts.push(task.await.unwrap());
    }
    for (sa, established) in &mounts {
        let Identity::Workload {
            service_account, ..
        } = &established.identity()
        else {
            panic!()
        };
        assert_eq!(service_account, sa);
        let before = fx.emu.secrets_calls().len();
        assert_eq!(get_by_name(&fx, established).await.unwrap().status(), 200);
        let call = &fx.emu.secrets_calls()[before];
        assert_eq!(call.identity, Some(principal_of(&established.identity())));
    }
    let stats = fx.emu.stats();
    assert_eq!(stats.total_proxymux_exchanges(), 20);
    for i in 0..20 {
        assert_eq!(stats.proxymux_exchanges(NS, &format!("sa-{i}")), 1);
    }
    assert!(stats.total_token_requests() <= 20);
    // Tokens of the provider's own TokenRequests are proven by where they came from.
    assert_eq!(stats.jwks_requests, 0);
    eprintln!(
        "measured: {} exchanges, {} token requests for 100 mounts of 20 identities",
        stats.total_proxymux_exchanges(),
        stats.total_token_requests()
    );
}

#[tokio::test]
async fn an_rpst_is_refreshed_in_the_background_from_half_its_life_with_a_new_session_key() {
    let fx = start(base_seed(), |_, _| {}).await;
    let token = sa_token(&fx, SA, Duration::from_secs(3 * 3600));
    let mount = || with_token(request(PrincipalKind::Workload, SA), token.clone());
    let t0 = fx.clock.now_for_test();
    let established = fx.principals.establish(&mount()).await.unwrap();
    let first = established.session.key().clone();
    // The emulator's RPSTs live 1200 s: due at half-life, 600 s.
    fx.clock.set(t0 + Duration::from_secs(599));
    fx.principals.establish(&mount()).await.unwrap();
    fx.clock.set(t0 + Duration::from_secs(600));
    let due = fx.principals.establish(&mount()).await.unwrap();
    assert_eq!(
        due.session.key().key_id().expose_secret(),
        first.key_id().expose_secret(),
        "served the valid session"
    );
    fx.emu
        .wait_for(WAIT, |s| s.proxymux_exchanges(NS, SA) == 2)
        .await
        .unwrap();
    let mut again = due;
    for _ in 0..1000 {
        again = fx.principals.establish(&mount()).await.unwrap();
        if again.session.key().key_id().expose_secret() != first.key_id().expose_secret() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(again.identity(), established.identity());
    let second = again.session.key().clone();
    assert_ne!(
        first.key().public_key_pem(),
        second.key().public_key_pem(),
        "a new podKey"
    );
    assert_eq!(get_by_name(&fx, &again).await.unwrap().status(), 200);
}

#[tokio::test]
async fn an_unsigned_token_with_matching_claims_gets_no_warm_session_and_makes_no_exchange() {
    let fx = start(base_seed(), |_, _| {}).await;
    fx.principals
        .establish(&workload_mount(&sa_token(
            &fx,
            SA,
            Duration::from_secs(3600),
        )))
        .await
        .unwrap();
    assert_eq!(fx.emu.stats().proxymux_exchanges(NS, SA), 1);
    // The session of app/app-sa is warm; a token with its claims but no signature (the
    // issuer's kid, `AAAA` as the signature) is refused, and nothing is exchanged.
    let unsigned = minted(&fx, |t| t.signed_by(Signer::Unsigned));
    assert!(unsigned.ends_with(".AAAA"));
    let message = refused(&fx, &unsigned).await;
    assert!(message.contains("signature does not verify"), "{message}");
    // So is one whose header names no algorithm we verify.
    let none = {
        use base64::Engine as _;
        let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let payload = unsigned.split('.').nth(1).unwrap();
        format!("{}.{payload}.AAAA", b64(r#"{"alg":"none"}"#))
    };
    let message = refused(&fx, &none).await;
    assert!(message.contains("algorithm (alg)"), "{message}");
    let stats = fx.emu.stats();
    assert_eq!(stats.proxymux_exchanges(NS, SA), 1);
    assert_eq!(stats.arrived(Endpoint::Proxymux), 1);
    assert_eq!(verified(&fx, "refused", Some("signature")), 1);
    assert_eq!(verified(&fx, "refused", Some("algorithm")), 1);
}

#[tokio::test]
async fn tokens_of_another_key_audience_issuer_or_time_are_refused_naming_the_check() {
    let fx = start(base_seed(), |c, _| c.workload_audience = "oci".into()).await;
    let for_oci = |t: TokenSpec| t.audiences(&["oci"]);
    let now = fx.clock.now_for_test();
    type Change = Box<dyn FnOnce(TokenSpec) -> TokenSpec>;
    let cases: [(&str, Change, &str); 7] = [
        (
            "another key under the issuer's kid",
            Box::new(move |t| for_oci(t).signed_by(Signer::OtherKeySameKid)),
            "signature does not verify",
        ),
        (
            "another key with its own kid",
            Box::new(move |t| for_oci(t).signed_by(Signer::OtherKey)),
            "names no key the cluster's service-account issuer publishes",
        ),
        (
            "another audience",
            Box::new(|t| t.audiences(&["https://kubernetes.default.svc.cluster.local"])),
            "audience (aud) does not include the provider's",
        ),
        (
            "another issuer",
            Box::new(move |t| for_oci(t).issuer("https://kubernetes.default.svc")),
            "issuer (iss) is not the cluster's",
        ),
        (
            "expired",
            Box::new(move |t| for_oci(t).issued_at(now - Duration::from_secs(7200))),
            "expires within five minutes or has expired",
        ),
        (
            "not valid yet",
            Box::new(move |t| for_oci(t).issued_at(now + Duration::from_secs(600))),
            "not valid yet",
        ),
        (
            "no signature",
            Box::new(move |t| for_oci(t).signed_by(Signer::Unsigned)),
            "signature does not verify",
        ),
    ];
    for (what, spec, expected) in cases {
        let token = minted(&fx, spec);
        let mut mount = request(PrincipalKind::Workload, SA);
        mount
            .service_account_tokens
            .insert("oci".into(), SecretString::from(token.clone()));
        let error = fx.principals.establish(&mount).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{what}: {error}");
        let message = error.to_string();
        assert!(message.contains(expected), "{what}: {message}");
        assert!(!message.contains(&token), "{what}: token echoed");
    }
    assert_eq!(fx.emu.stats().arrived(Endpoint::Proxymux), 0);
    // The checks the metrics name: one refusal of each kind.
    for reason in [
        "signature",
        "unknown_key",
        "audience",
        "issuer",
        "expired",
        "not_yet_valid",
    ] {
        assert!(
            verified(&fx, "refused", Some(reason)) >= 1,
            "{reason}: {:?}",
            fx.principals.token_verifications()
        );
    }
    // A genuine token for the audience is served.
    let genuine = minted(&fx, for_oci);
    let mut mount = request(PrincipalKind::Workload, SA);
    mount
        .service_account_tokens
        .insert("oci".into(), SecretString::from(genuine));
    let established = fx.principals.establish(&mount).await.unwrap();
    assert_eq!(get_by_name(&fx, &established).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_forged_token_with_another_uid_does_not_evict_the_valid_session() {
    let fx = start(base_seed(), |_, _| {}).await;
    let first = fx
        .principals
        .establish(&workload_mount(&sa_token(
            &fx,
            SA,
            Duration::from_secs(3600),
        )))
        .await
        .unwrap();
    // What a recreated service account's token would claim, signed by someone else.
    for signer in [Signer::OtherKey, Signer::OtherKeySameKid, Signer::Unsigned] {
        let forged = minted(&fx, |t| t.uid("forged-uid").signed_by(signer));
        refused(&fx, &forged).await;
    }
    // The next genuine mount is served from the cache: no new exchange, the same key.
    let next = fx
        .principals
        .establish(&workload_mount(&sa_token(
            &fx,
            SA,
            Duration::from_secs(3600),
        )))
        .await
        .unwrap();
    assert_eq!(fx.emu.stats().proxymux_exchanges(NS, SA), 1);
    assert_eq!(
        next.session.key().key_id().expose_secret(),
        first.session.key().key_id().expose_secret()
    );
    assert_eq!(get_by_name(&fx, &next).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_flood_of_one_forgery_makes_one_verification_and_one_read_of_the_keys() {
    const FLOOD: usize = 200;
    let fx = Arc::new(start(base_seed(), |_, _| {}).await);
    let forged = minted(&fx, |t| t.signed_by(Signer::OtherKeySameKid));
    let tasks: Vec<_> = (0..FLOOD)
        .map(|_| {
            let fx = fx.clone();
            let forged = forged.clone();
            tokio::spawn(async move { fx.principals.establish(&workload_mount(&forged)).await })
        })
        .collect();
    for task in tasks {
        let error = task.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    }
    // Later ones, one after another, are answered from the kept verdict.
    for _ in 0..FLOOD {
        refused(&fx, &forged).await;
    }
    let stats = fx.emu.stats();
    assert_eq!(
        (stats.issuer_discovery_requests, stats.jwks_requests),
        (1, 1)
    );
    assert_eq!(stats.arrived(Endpoint::Proxymux), 0);
    assert_eq!(verified(&fx, "refused", Some("signature")), 1);
    assert_eq!(
        verified(&fx, "refused", Some("cached")),
        2 * FLOOD as u64 - 1
    );
    // The verdict is kept for a minute: then the forgery is checked once more, with the
    // keys still cached.
    fx.clock.advance(Duration::from_secs(61));
    refused(&fx, &forged).await;
    assert_eq!(verified(&fx, "refused", Some("signature")), 2);
    assert_eq!(fx.emu.stats().jwks_requests, 1);
}

#[tokio::test]
async fn an_unknown_key_id_reads_the_keys_again_at_most_once_per_cool_down() {
    let fx = start(base_seed(), |_, _| {}).await;
    fx.principals
        .establish(&workload_mount(&sa_token(
            &fx,
            SA,
            Duration::from_secs(3600),
        )))
        .await
        .unwrap();
    assert_eq!(fx.emu.stats().jwks_requests, 1);
    // Distinct forgeries naming unknown key ids, within the cool-down: no read.
    for _ in 0..3 {
        let message = refused(&fx, &minted(&fx, |t| t.signed_by(Signer::OtherKey))).await;
        assert!(message.contains("kid"), "{message}");
    }
    assert_eq!(fx.emu.stats().jwks_requests, 1);
    // After it, one read for the next unknown key id, then none again.
    fx.clock.advance(Duration::from_secs(31));
    for _ in 0..3 {
        refused(&fx, &minted(&fx, |t| t.signed_by(Signer::OtherKey))).await;
    }
    assert_eq!(fx.emu.stats().jwks_requests, 2);
    // The issuer rotates its key just after that read: a genuine token of the new key is
    // refused until the cool-down is over, then the keys are read again and it is served.
    fx.emu.rotate_issuer_key().unwrap();
    let rotated = sa_token(&fx, SA, Duration::from_secs(3600));
    refused(&fx, &rotated).await;
    assert_eq!(fx.emu.stats().jwks_requests, 2);
    fx.clock.advance(Duration::from_secs(31));
    fx.principals
        .establish(&workload_mount(&rotated))
        .await
        .unwrap();
    let stats = fx.emu.stats();
    assert_eq!(stats.jwks_requests, 3);
    assert_eq!(
        stats.proxymux_exchanges(NS, SA),
        1,
        "the warm session served it"
    );
}

#[tokio::test]
async fn a_failed_read_of_the_keys_keeps_the_keys_read_before() {
    let fx = start(base_seed(), |_, _| {}).await;
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    fx.principals
        .establish(&workload_mount(&token))
        .await
        .unwrap();
    fx.clock.advance(Duration::from_secs(31));
    fx.emu.set_issuer_fault(Some(Fault::Status(503)));
    // An unknown key id makes the keys be read again; the read fails; the keys stay, and
    // the cool-down restarts.
    let message = refused(&fx, &minted(&fx, |t| t.signed_by(Signer::OtherKey))).await;
    assert!(message.contains("kid"), "{message}");
    assert_eq!(fx.emu.stats().issuer_discovery_requests, 2);
    refused(&fx, &minted(&fx, |t| t.signed_by(Signer::OtherKey))).await;
    assert_eq!(fx.emu.stats().issuer_discovery_requests, 2);
    fx.clock.advance(Duration::from_secs(61));
    fx.principals
        .establish(&workload_mount(&sa_token(
            &fx,
            SA,
            Duration::from_secs(3600),
        )))
        .await
        .unwrap();
    // Past their hour the keys are not served any more: the mount is not either.
    fx.clock.advance(Duration::from_secs(3600));
    let fresh = sa_token(&fx, SA, Duration::from_secs(3600));
    let error = fx
        .principals
        .establish(&workload_mount(&fresh))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
}

#[tokio::test]
async fn when_the_issuer_keys_cannot_be_read_a_supplied_token_is_not_served() {
    let fx = start(base_seed(), |_, _| {}).await;
    for (status, kind, grant) in [
        (403, ErrorKind::PermissionDenied, true),
        (404, ErrorKind::Unavailable, true),
        (503, ErrorKind::Unavailable, false),
    ] {
        fx.emu.script_issuer([Fault::Status(status)]);
        let token = sa_token(&fx, SA, Duration::from_secs(3600));
        let error = fx
            .principals
            .establish(&workload_mount(&token))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), kind, "{status}: {error}");
        let chain = format!(
            "{error}: {}",
            std::error::Error::source(&error)
                .map(ToString::to_string)
                .unwrap_or_default()
        );
        assert!(
            chain.contains("/.well-known/openid-configuration")
                && chain.contains(&format!("http {status}")),
            "{chain}"
        );
        assert_eq!(
            chain.contains("system:service-account-issuer-discovery")
                && chain.contains("nonResourceURLs"),
            grant,
            "{chain}"
        );
        assert!(!chain.contains(&token), "token echoed");
    }
    assert_eq!(fx.emu.stats().arrived(Endpoint::Proxymux), 0);
    assert_eq!(verified(&fx, "unavailable", Some("issuer_keys")), 3);
    // A TokenRequest's token needs no keys.
    fx.emu.set_issuer_fault(Some(Fault::Status(403)));
    fx.principals
        .establish(&request(PrincipalKind::Workload, SA))
        .await
        .unwrap();
    // With the keys readable, a supplied token is served (from the warm session).
    fx.emu.set_issuer_fault(None);
    fx.principals
        .establish(&workload_mount(&sa_token(
            &fx,
            SA,
            Duration::from_secs(3600),
        )))
        .await
        .unwrap();
    assert_eq!(fx.emu.stats().proxymux_exchanges(NS, SA), 1);

    // The Kubernetes API down: Unavailable, naming it.
    let port = closed_port();
    let fx = start(base_seed(), |c, _| {
        c.kubernetes_api = Some(format!("https://{port}"))
    })
    .await;
    let error = fx
        .principals
        .establish(&workload_mount(&sa_token(
            &fx,
            SA,
            Duration::from_secs(3600),
        )))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    let source = std::error::Error::source(&error).unwrap().to_string();
    assert!(
        source.contains("cannot reach the kubernetes api"),
        "{source}"
    );
}

#[tokio::test]
async fn the_sync_controllers_tokens_are_verified_too() {
    let fx = start(base_seed(), |_, _| {}).await;
    let unbound = |signer| {
        fx.emu
            .mint_service_account_token(&TokenSpec::new(NS, SA).signed_by(signer))
            .unwrap()
    };
    fx.principals
        .establish(&with_token(
            sync_request(PrincipalKind::Workload, SA),
            unbound(Signer::Issuer),
        ))
        .await
        .unwrap();
    // The controller's service account is whoever writes the SecretSync: a forged token of
    // the warm identity gets nothing.
    for signer in [Signer::OtherKeySameKid, Signer::OtherKey, Signer::Unsigned] {
        let forged = unbound(signer);
        let error = fx
            .principals
            .establish(&with_token(
                sync_request(PrincipalKind::Workload, SA),
                forged.clone(),
            ))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
        assert!(!error.to_string().contains(&forged));
    }
    assert_eq!(fx.emu.stats().proxymux_exchanges(NS, SA), 1);
    assert_eq!(verified(&fx, "refused", None), 3);
}

pub(crate) trait NowForTest {
    fn now_for_test(&self) -> SystemTime;
}

impl NowForTest for ManualClock {
    fn now_for_test(&self) -> SystemTime {
        clock::Clock::now(self)
    }
}

#[tokio::test]
async fn a_locally_invalid_service_account_token_makes_no_proxymux_call() {
    let fx = start(base_seed(), |_, _| {}).await;
    let good = sa_token(&fx, SA, Duration::from_secs(3600));
    fx.principals
        .establish(&with_token(request(PrincipalKind::Workload, SA), good))
        .await
        .unwrap();
    let arrived = fx.emu.stats().arrived(Endpoint::Proxymux);
    let expiring = sa_token(&fx, SA, Duration::from_secs(299));
    let other_sa = sa_token(&fx, "sa-3", Duration::from_secs(3600));
    let other_pod = fx
        .emu
        .issue_service_account_token(NS, SA, Duration::from_secs(3600), Some(("pod-2", "uid-2")))
        .unwrap();
    // A legacy Secret-based token: the subject and expiry, no nested kubernetes.io claims.
    let legacy = {
        use base64::Engine as _;
        let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let claims = format!(
            r#"{{"iss":"kubernetes/serviceaccount","sub":"system:serviceaccount:{NS}:{SA}","exp":4102444800}}"#
        );
        format!("{}.{}.sig", b64(r#"{"alg":"RS256"}"#), b64(&claims))
    };
    for (token, reason) in [
        (
            legacy,
            "no kubernetes.io namespace and service-account claims",
        ),
        (other_pod, "bound to another pod"),
        ("not-a-jwt".to_owned(), "three parts"),
        ("a.b.c".to_owned(), "base64url json"),
        (expiring, "expires within five minutes"),
        (other_sa, "another service account"),
        // {"exp":1e300}: once an overflow of UNIX_EPOCH + Duration, now a specific error.
        (
            "eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjFlMzAwfQ.sig".to_owned(),
            "exp claim is out of range",
        ),
    ] {
        let error = fx
            .principals
            .establish(&with_token(
                request(PrincipalKind::Workload, SA),
                token.clone(),
            ))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
        let message = error.to_string();
        assert!(message.contains(reason), "{message}");
        assert!(!message.contains(&token), "token echoed");
    }
    assert_eq!(fx.emu.stats().arrived(Endpoint::Proxymux), arrived);
}

#[tokio::test]
async fn expired_token_at_the_proxymux_is_unauthenticated() {
    let fx = start(base_seed(), |_, _| {}).await;
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    fx.emu.expire_all_tokens();
    let error = fx
        .principals
        .establish(&with_token(request(PrincipalKind::Workload, SA), token))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    assert!(
        error.to_string().contains("the proxymux answered http 401"),
        "{error}"
    );
}

/// A loopback port nothing listens on.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr.to_string()
}

#[tokio::test]
async fn proxymux_down_is_unavailable() {
    let port = closed_port();
    let fx = start(base_seed(), |c, _| {
        c.proxymux = Some(format!("https://{port}"))
    })
    .await;
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    let error = fx
        .principals
        .establish(&with_token(request(PrincipalKind::Workload, SA), token))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(
        error.to_string().contains("cannot reach the proxymux"),
        "{error}"
    );
}

#[tokio::test]
async fn missing_driver_token_without_token_requests_is_unauthenticated() {
    let fx = start(base_seed(), |c, _| c.token_request = false).await;
    let error = fx
        .principals
        .establish(&request(PrincipalKind::Workload, SA))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated);
    assert!(
        error.to_string().contains("token requests are disabled"),
        "{error}"
    );
    assert_eq!(fx.emu.stats().total_token_requests(), 0);
}

#[tokio::test]
async fn a_driver_mount_naming_no_pod_gets_no_unbound_token_request() {
    let fx = start(base_seed(), |_, _| {}).await;
    let no_pod = IdentityRequest {
        pod_name: None,
        pod_uid: None,
        ..request(PrincipalKind::Workload, SA)
    };
    let error = fx.principals.establish(&no_pod).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated);
    assert!(error.to_string().contains("podInfoOnMount"), "{error}");
    assert_eq!(fx.emu.stats().total_token_requests(), 0);
}

/// A mount from the secrets-store-sync-controller: its own pod in its own namespace, the
/// SecretSync's namespace and service account.
pub(crate) fn sync_request(kind: PrincipalKind, service_account: &str) -> IdentityRequest {
    IdentityRequest {
        pod_name: Some("secrets-store-sync-controller-manager-5d4f".into()),
        pod_uid: Some("c0ffee00-0000-4000-8000-000000000001".into()),
        caller: oci_csi_auth::Caller::SyncController,
        ..request(kind, service_account)
    }
}

#[tokio::test]
async fn the_sync_controllers_unbound_token_is_the_service_accounts_identity() {
    let fx = start(base_seed(), |_, _| {}).await;
    // What the controller's TokenRequest returns: the service account's claims, no pod.
    let token = fx
        .emu
        .issue_service_account_token(NS, SA, Duration::from_secs(600), None)
        .unwrap();
    let established = fx
        .principals
        .establish(&with_token(
            sync_request(PrincipalKind::Workload, SA),
            token,
        ))
        .await
        .unwrap();
    assert!(matches!(
        established.identity(),
        Identity::Workload { ref namespace, ref service_account, .. }
            if namespace == NS && service_account == SA
    ));
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    assert_eq!(fx.emu.stats().total_token_requests(), 0);

    // A token bound to a pod must still be bound to the pod the request names.
    let bound = sa_token(&fx, SA, Duration::from_secs(600));
    let error = fx
        .principals
        .establish(&with_token(
            sync_request(PrincipalKind::Workload, SA),
            bound,
        ))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    assert!(
        error.to_string().contains("bound to another pod"),
        "{error}"
    );
}

#[tokio::test]
async fn without_a_token_the_sync_controller_is_told_its_flag_and_no_token_is_requested() {
    // TokenRequest is enabled: the driver's mounts would use it, the controller's may not.
    let fx = start(base_seed(), |c, _| c.workload_audience = "oci".into()).await;
    let mut asked = sync_request(PrincipalKind::Workload, SA);
    asked
        .service_account_tokens
        .insert("api://other".into(), SecretString::from("x.y.z"));
    let error = fx.principals.establish(&asked).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("--token-request-audience=oci")
            && message.contains("[\"api://other\"]")
            && !message.contains("x.y.z"),
        "{message}"
    );
    assert_eq!(fx.emu.stats().total_token_requests(), 0);
    assert_eq!(fx.emu.stats().arrived(Endpoint::Kube), 0);

    // With the API server's default audience ("") the controller has no flag to ask for it.
    let fx = start(base_seed(), |_, _| {}).await;
    let error = fx
        .principals
        .establish(&sync_request(PrincipalKind::Workload, SA))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("set auth.workload_audience of this sidecar"),
        "{error}"
    );
    assert_eq!(fx.emu.stats().total_token_requests(), 0);
}

#[tokio::test]
async fn a_forbidden_user_secret_names_whose_rbac_to_change() {
    let fx = user_fixture().await;
    for (request, fragment) in [
        (user_request(), "grant it get on Secrets in"),
        (
            sync_request(
                PrincipalKind::User {
                    secret_name: "oci-config".into(),
                },
                SA,
            ),
            "runs as the controller's service account",
        ),
    ] {
        fx.emu.script(Endpoint::Kube, [testkit::Fault::Status(403)]);
        let error = fx.principals.establish(&request).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::PermissionDenied, "{error}");
        let message = error.to_string();
        assert!(
            message.contains(&format!("Secret {NS}/oci-config")) && message.contains(fragment),
            "{message}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// instance principal

#[tokio::test]
async fn instance_principal_end_to_end_with_the_region_from_instance_metadata() {
    let fx = start(base_seed(), |c, _| c.region = None).await;
    let established = fx
        .principals
        .establish(&request(PrincipalKind::Instance, SA))
        .await
        .unwrap();
    assert_eq!(established.identity(), Identity::Instance);
    // The region instance metadata reported, resolved in its realm: where the mount's
    // calls go unless its class names another.
    let region = established.region.as_ref().unwrap();
    assert_eq!(
        (region.id(), region.domain()),
        ("us-ashburn-1", Some("oraclecloud.com"))
    );
    assert_eq!(get_by_name(&fx, &established).await.unwrap().status(), 200);
    assert_eq!(get_by_id(&fx, &established).await.status(), 200);
    // Process-wide and cached.
    fx.principals
        .establish(&request(PrincipalKind::Instance, SA))
        .await
        .unwrap();
    let stats = fx.emu.stats();
    assert_eq!(stats.federations, 1);
    assert!(matches!(
        fx.emu.secrets_calls()[0].identity,
        Some(Principal::Instance { .. })
    ));
}

#[tokio::test]
async fn instance_principal_retries_a_401_once_with_a_fresh_token() {
    let fx = start(base_seed(), |_, _| {}).await;
    let established = fx
        .principals
        .establish(&request(PrincipalKind::Instance, SA))
        .await
        .unwrap();
    fx.emu.expire_all_tokens();
    assert_eq!(get_by_name(&fx, &established).await.unwrap().status(), 200);
    let stats = fx.emu.stats();
    assert_eq!(stats.federations, 2);
    assert_eq!(stats.responses(Endpoint::Secrets, 401), 1);
}

#[tokio::test]
async fn a_refused_instance_token_is_renewed_once_then_is_unauthenticated() {
    let fx = start(base_seed(), |_, _| {}).await;
    let established = fx
        .principals
        .establish(&request(PrincipalKind::Instance, SA))
        .await
        .unwrap();
    refuse_next(&fx, 2);
    let error = auth_error(get_by_name(&fx, &established).await.unwrap_err());
    assert_eq!(error.kind(), ErrorKind::Unauthenticated);
    assert!(error.to_string().contains("instance principal"), "{error}");
    // Renewed once in between: a second federation. The renewed token, refused at once,
    // is kept: it was renewed moments ago (the cool-down), and the error says so.
    assert!(error.to_string().contains("renewed 0s ago"), "{error}");
    let stats = fx.emu.stats();
    assert_eq!(stats.responses(Endpoint::Secrets, 401), 2);
    assert_eq!(stats.federations, 2);
    assert_eq!(renewals(&fx, "instance", "renewed"), 1);
    assert_eq!(renewals(&fx, "instance", "cooling_down"), 1);
}

/// A signed GetSecretBundleByName to `base` with `session` (the region it goes to already
/// told), within the default deadline.
async fn get_by_name_at(
    fx: &Fixture,
    session: &oci_csi_auth::Session,
    base: &str,
) -> Result<Response<Bytes>, BoxError> {
    let service = SigningLayer::new(fx.clock.clone()).layer(fx.http.clone());
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!(
            "{base}/20190301/secretbundles/actions/getByName?secretName={SECRET}&stage=CURRENT&vaultId={VAULT}"
        ))
        .body(Bytes::new())
        .unwrap();
    request.extensions_mut().insert(session.clone());
    request.extensions_mut().insert(Deadline(deadline()));
    service.oneshot(request).await
}

/// The emulator's Secrets listener under another host name: how the tests reach "another
/// region" (`us-phoenix-1`), whose faults `script_host` and `set_host_fault` scope.
fn other_region_url(fx: &Fixture) -> String {
    format!(
        "https://localhost:{}",
        fx.emu.addr(Endpoint::Secrets).port()
    )
}

fn phoenix() -> regions::Region {
    regions::Regions::default().resolve("phx").unwrap()
}

fn renewals(fx: &Fixture, kind: &str, outcome: &str) -> u64 {
    fx.principals
        .credential_renewals()
        .into_iter()
        .find(|((k, o), _)| *k == kind && *o == outcome)
        .map_or(0, |(_, n)| n)
}

/// The issue's storm: a tenant names a region whose Secrets API refuses the node's token
/// (its tenancy is not subscribed there, say). Those requests fail; the node's session,
/// which every other instance mount shares, stays.
#[tokio::test]
async fn ten_401s_from_another_region_make_no_federation_and_keep_the_instance_session() {
    let fx = start(base_seed(), |_, _| {}).await;
    let established = fx
        .principals
        .establish(&request(PrincipalKind::Instance, SA))
        .await
        .unwrap();
    assert_eq!(fx.emu.stats().federations, 1);
    fx.emu
        .set_host_fault(Endpoint::Secrets, "localhost", Some(Fault::Status(401)));
    let abroad = established.session.toward(Some(&phoenix()));
    for _ in 0..10 {
        let error = auth_error(
            get_by_name_at(&fx, &abroad, &other_region_url(&fx))
                .await
                .unwrap_err(),
        );
        assert_eq!(error.kind(), ErrorKind::Unauthenticated);
        let message = error.to_string();
        assert!(
            message.contains("instance principal")
                && message.contains("in region us-phoenix-1")
                && message.contains("established in region us-ashburn-1"),
            "{message}"
        );
        assert!(!message.contains("ST$"), "{message}");
    }
    let stats = fx.emu.stats();
    assert_eq!(stats.responses(Endpoint::Secrets, 401), 10, "no retries");
    assert_eq!(
        stats.federations, 1,
        "no federation for another region's 401s"
    );
    assert_eq!(renewals(&fx, "instance", "other_region"), 10);
    // The next mount in the principal's own region is served from the same session.
    let again = fx
        .principals
        .establish(&request(PrincipalKind::Instance, SA))
        .await
        .unwrap();
    assert_eq!(again.session, established.session);
    assert_eq!(get_by_name(&fx, &again).await.unwrap().status(), 200);
    assert_eq!(fx.emu.stats().federations, 1);
    assert_eq!(renewals(&fx, "instance", "renewed"), 0);
}

/// A genuine revocation in the principal's own region: a burst of 401s renews the session
/// once (one federation, the other requests join it), a 401 within the cool-down renews
/// nothing and fails saying so, and after the cool-down a 401 renews again.
#[tokio::test]
async fn a_revoked_instance_token_is_renewed_once_per_cool_down_however_many_are_refused() {
    let fx = Arc::new(start(base_seed(), |_, _| {}).await);
    let established = fx
        .principals
        .establish(&request(PrincipalKind::Instance, SA))
        .await
        .unwrap();
    fx.emu.expire_all_tokens();
    // The federation waits at the gate until all ten requests have been refused.
    fx.emu.close_gate(Endpoint::Auth);
    let burst: Vec<_> = (0..10)
        .map(|_| {
            let fx = fx.clone();
            let established = established.clone();
            tokio::spawn(async move { get_by_name(&fx, &established).await.map(|r| r.status()) })
        })
        .collect();
    fx.emu
        .wait_for(WAIT, |s| {
            s.responses(Endpoint::Secrets, 401) == 10 && s.held(Endpoint::Auth) == 1
        })
        .await
        .unwrap();
    fx.emu.open_gate(Endpoint::Auth);
    for request in burst {
        assert_eq!(request.await.unwrap().unwrap(), 200);
    }
    let stats = fx.emu.stats();
    assert_eq!(stats.federations, 2, "one renewal for the burst");
    assert_eq!(stats.responses(Endpoint::Secrets, 200), 10);
    assert_eq!(renewals(&fx, "instance", "renewed"), 1);
    assert_eq!(renewals(&fx, "instance", "joined"), 9);

    // A later mount is refused again within the cool-down: no federation, the request
    // fails saying why.
    fx.emu.expire_all_tokens();
    fx.clock
        .advance(oci_csi_auth::INSTANCE_RENEWAL_COOL_DOWN - Duration::from_secs(1));
    let next = |fx: Arc<Fixture>| async move {
        let established = fx
            .principals
            .establish(&request(PrincipalKind::Instance, SA))
            .await
            .unwrap();
        get_by_name(&fx, &established).await
    };
    let error = auth_error(next(fx.clone()).await.unwrap_err());
    assert_eq!(error.kind(), ErrorKind::Unauthenticated);
    let message = error.to_string();
    assert!(
        message.contains("instance principal") && message.contains("renewed 29s ago"),
        "{message}"
    );
    assert!(!message.contains("ST$"), "{message}");
    assert_eq!(fx.emu.stats().federations, 2);
    assert_eq!(renewals(&fx, "instance", "cooling_down"), 1);

    // After the cool-down, the next 401 renews again, once.
    fx.clock.advance(Duration::from_secs(1));
    assert_eq!(next(fx.clone()).await.unwrap().status(), 200);
    assert_eq!(fx.emu.stats().federations, 3);
    assert_eq!(renewals(&fx, "instance", "renewed"), 2);
    assert_eq!(renewals(&fx, "instance", "cooling_down"), 1);
}

/// The same rule for workload identity: its session is the tenant's own, but a region the
/// class names still says nothing about the token, so it is neither dropped nor exchanged.
#[tokio::test]
async fn a_workload_401_in_another_region_keeps_its_session_and_makes_no_exchange() {
    let fx = start(base_seed(), |_, _| {}).await;
    let token = sa_token(&fx, SA, Duration::from_secs(3600));
    let established = fx
        .principals
        .establish(&with_token(request(PrincipalKind::Workload, SA), token))
        .await
        .unwrap();
    fx.emu
        .script_host(Endpoint::Secrets, "localhost", [Fault::Status(401)]);
    let abroad = established.session.toward(Some(&phoenix()));
    let error = auth_error(
        get_by_name_at(&fx, &abroad, &other_region_url(&fx))
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(error, AuthError::RefusedInRegion { .. }),
        "{error}"
    );
    assert_eq!(fx.emu.stats().proxymux_exchanges(NS, SA), 1);
    assert_eq!(renewals(&fx, "rpst", "other_region"), 1);
    // The host's script is spent: the same session is served there now, and at home.
    assert_eq!(
        get_by_name_at(&fx, &abroad, &other_region_url(&fx))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(get_by_name(&fx, &established).await.unwrap().status(), 200);
    assert_eq!(fx.emu.stats().proxymux_exchanges(NS, SA), 1);
}

#[tokio::test]
async fn instance_metadata_down_is_unavailable() {
    let port = closed_port();
    let fx = start(base_seed(), |c, _| {
        c.instance_metadata = format!("http://{port}/opc/v2");
        c.region = None;
    })
    .await;
    let error = fx
        .principals
        .establish(&request(PrincipalKind::Instance, SA))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(error.to_string().contains("instance metadata"), "{error}");
}

#[tokio::test]
async fn token_request_forbidden_is_permission_denied() {
    let fx = start(base_seed(), |_, _| {}).await;
    fx.emu.revoke(testkit::Revoke::ServiceAccount {
        namespace: NS.into(),
        name: SA.into(),
    });
    let error = fx
        .principals
        .establish(&request(PrincipalKind::Workload, SA))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::PermissionDenied, "{error}");
    assert_eq!(fx.emu.stats().arrived(Endpoint::Proxymux), 0);
}
