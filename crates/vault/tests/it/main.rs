//! The client against the testkit emulator over real TLS, signing with a real user API key.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // reason: test code

use std::sync::Arc;
use std::time::Duration;

use auth::{KeyId, PrivateKey, Session, Signing, SigningKey, SigningLayer};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clock::SystemClock;
use oci_csi_vault::{
    Backoff, CertificateRef, CertificateRequest, ErrorKind, MalformedBundle, Retry, RetryLayer,
    RetryPolicy, SecretBundle, SecretRef, SecretRequest, Selector, Stage, TlsFiles, VaultClient,
    VaultError,
};
use testkit::{
    CaSeed, CertificateSeed, Emulator, Endpoint, Fault, KeyKind, Principal, SecretSeed, Seed,
    UserSeed,
};
use tokio::time::Instant;
use tower::{Layer as _, ServiceExt as _};
use transport::{HttpService, Transport, TransportConfig};

mod retry;

const TENANCY: &str = "ocid1.tenancy.oc1..aaaaaaaatesttenancy";
const USER: &str = "ocid1.user.oc1..aaaaaaaatestuser";
const VAULT: &str = "ocid1.vault.oc1.iad.testvault";
const SECRET: &str = "ocid1.vaultsecret.oc1.iad.dbpassword";
const FORBIDDEN: &str = "ocid1.vaultsecret.oc1.iad.forbidden";
const NAME: &str = "db-password";
const CERT: &str = "ocid1.certificate.oc1.iad.web";
const CERT_NO_KEY: &str = "ocid1.certificate.oc1.iad.nokey";
const CERT_FORBIDDEN: &str = "ocid1.certificate.oc1.iad.forbidden";
const CA_BUNDLE: &str = "ocid1.cabundle.oc1.iad.roots";
const CA: &str = "ocid1.certificateauthority.oc1.iad.issuing";

fn access_for_user() -> testkit::Access {
    testkit::Access {
        users: vec![USER.into()],
        ..testkit::Access::default()
    }
}
/// Version 2 (CURRENT, LATEST): binary, with bytes that are not UTF-8.
const BINARY: &[u8] = b"\x00s3cr3t-\xff\xfe-binary\n";
/// Version 1 (PREVIOUS).
const OLD: &[u8] = b"old-password-value";
/// Version 3 (PENDING, named "next").
const NEXT: &[u8] = b"next-password-value";

fn user_credential() -> auth::Credential {
    auth::Credential::User {
        namespace: "team".into(),
        secret_name: "oci-user".into(),
        resource_version: "1".into(),
        key_fingerprint: "00".into(),
        user: USER.into(),
        tenancy: TENANCY.into(),
    }
}

type Client = Retry<VaultClient<Signing<HttpService>>>;

struct Fixture {
    emu: Emulator,
    transport: Transport,
    client: Client,
    /// The user's session: a key registered with the emulator.
    session: Session,
    /// A session signing with a key the emulator does not know.
    unknown_key: Session,
}

fn client(transport: &Transport, retry: RetryPolicy) -> Client {
    let signed = SigningLayer::new(Arc::new(SystemClock)).layer(transport.service());
    RetryLayer::new(retry).layer(VaultClient::new(signed))
}

fn user_session(key: Arc<PrivateKey>, fingerprint: &str) -> Session {
    Session::fixed(
        user_credential(),
        SigningKey::new(KeyId::new(format!("{TENANCY}/{USER}/{fingerprint}")), key),
    )
}

async fn fixture() -> Fixture {
    let key = Arc::new(PrivateKey::generate_rsa_2048().unwrap());
    let seed = Seed::default()
        .vault(VAULT)
        .user(UserSeed {
            tenancy: TENANCY.into(),
            user: USER.into(),
            public_key_pem: key.public_key_pem(),
        })
        .secret(
            SecretSeed::new(SECRET, VAULT, NAME)
                .version(1, OLD, &["PREVIOUS"])
                .version(2, BINARY, &["CURRENT", "LATEST"])
                .allow_user(USER),
        )
        .secret(SecretSeed::new(FORBIDDEN, VAULT, "forbidden").version(1, OLD, &["CURRENT"]))
        .certificate(CertificateSeed {
            id: CERT.into(),
            name: "web".into(),
            dns_names: vec!["web.example.com".into()],
            key: KeyKind::EcdsaP256,
            passphrase: Some("emulator passphrase".into()),
            access: access_for_user(),
            ..CertificateSeed::default()
        })
        .certificate(CertificateSeed {
            id: CERT_NO_KEY.into(),
            name: "csr-issued".into(),
            dns_names: vec!["api.example.com".into()],
            key: KeyKind::Rsa,
            no_private_key: true,
            access: access_for_user(),
            ..CertificateSeed::default()
        })
        .certificate(CertificateSeed {
            id: CERT_FORBIDDEN.into(),
            name: "other-team".into(),
            dns_names: vec!["other.example.com".into()],
            ..CertificateSeed::default()
        })
        .ca_bundle(CaSeed {
            id: CA_BUNDLE.into(),
            name: "roots".into(),
            access: access_for_user(),
        })
        .certificate_authority(CaSeed {
            id: CA.into(),
            name: "issuing".into(),
            access: access_for_user(),
        });
    let emu = Emulator::start(seed, Arc::new(SystemClock)).await.unwrap();
    let version = emu
        .add_secret_version(SECRET, NEXT, Some("next"), &["PENDING"])
        .unwrap();
    assert_eq!(version, 3);
    let transport = Transport::new(TransportConfig {
        ssl_cert_file: Some(emu.files().ca.clone()),
        ..TransportConfig::default()
    })
    .unwrap();
    // Short backoff keeps the fault tests quick; the policy itself is unit-tested.
    let retry = RetryPolicy {
        base_delay: Duration::from_millis(50),
        ..RetryPolicy::default()
    };
    let fingerprint = key.fingerprint();
    let other = Arc::new(PrivateKey::generate_rsa_2048().unwrap());
    Fixture {
        client: client(&transport, retry),
        session: user_session(key, &fingerprint),
        unknown_key: user_session(other.clone(), &other.fingerprint()),
        transport,
        emu,
    }
}

impl Fixture {
    fn request(&self, secret: SecretRef, selector: Selector, deadline: Duration) -> SecretRequest {
        SecretRequest {
            base_url: self.emu.url(Endpoint::Secrets),
            session: self.session.clone(),
            secret,
            selector,
            deadline: Instant::now() + deadline,
            backoff: Backoff::none(),
        }
    }

    async fn fetch(
        &self,
        secret: SecretRef,
        selector: Selector,
    ) -> Result<SecretBundle, VaultError> {
        self.fetch_within(secret, selector, Duration::from_secs(30))
            .await
    }

    async fn fetch_within(
        &self,
        secret: SecretRef,
        selector: Selector,
        deadline: Duration,
    ) -> Result<SecretBundle, VaultError> {
        self.client
            .clone()
            .oneshot(self.request(secret, selector, deadline))
            .await
    }

    /// Secrets calls the emulator answered.
    fn calls(&self) -> u64 {
        self.emu.stats().total_responses(Endpoint::Secrets)
    }
}

fn by_name(name: &str) -> SecretRef {
    SecretRef::ByName {
        vault_id: VAULT.into(),
        name: name.into(),
    }
}

fn by_id(id: &str) -> SecretRef {
    SecretRef::ById {
        secret_id: id.into(),
    }
}

fn current() -> Selector {
    Selector::Stage(Stage::Current)
}

/// Asserts that neither the secret bytes nor their base64 appear in `text`.
fn assert_no_secret(text: &str) {
    for secret in [BINARY, OLD, NEXT] {
        let lossy = String::from_utf8_lossy(secret);
        assert!(!text.contains(lossy.trim()), "secret bytes in {text}");
        assert!(
            !text.contains(&STANDARD.encode(secret)),
            "secret base64 in {text}"
        );
    }
}

// --- fetching --------------------------------------------------------------------------

#[tokio::test]
async fn fetches_by_name_with_every_selector() {
    let f = fixture().await;
    // Selector, then the expected version number, content, name and stages.
    type Case = (
        Selector,
        u64,
        &'static [u8],
        Option<&'static str>,
        &'static [Stage],
    );
    let cases: [Case; 6] = [
        (current(), 2, BINARY, None, &[Stage::Current, Stage::Latest]),
        (
            Selector::Stage(Stage::Latest),
            2,
            BINARY,
            None,
            &[Stage::Current, Stage::Latest],
        ),
        (
            Selector::Stage(Stage::Previous),
            1,
            OLD,
            None,
            &[Stage::Previous],
        ),
        (Selector::VersionNumber(1), 1, OLD, None, &[Stage::Previous]),
        (
            Selector::VersionName("next".into()),
            3,
            NEXT,
            Some("next"),
            &[Stage::Pending],
        ),
        (
            Selector::Stage(Stage::Pending),
            3,
            NEXT,
            Some("next"),
            &[Stage::Pending],
        ),
    ];
    for (selector, number, content, name, stages) in cases {
        let bundle = f.fetch(by_name(NAME), selector.clone()).await.unwrap();
        assert_eq!(bundle.secret_id, SECRET, "{selector}");
        assert_eq!(bundle.version_number, number, "{selector}");
        assert_eq!(bundle.content.expose(), content, "{selector}");
        assert_eq!(bundle.version_name.as_deref(), name, "{selector}");
        assert_eq!(bundle.stages, stages, "{selector}");
        let rid = bundle.opc_request_id.as_deref().unwrap();
        assert_eq!(rid.len(), 32, "{rid}");
    }
    let calls = f.emu.secrets_calls();
    assert_eq!(calls.len(), 6);
    for call in &calls {
        assert_eq!(call.method, "POST");
        assert_eq!(call.status, 200);
        assert_eq!(
            call.identity,
            Some(Principal::User {
                tenancy: TENANCY.into(),
                user: USER.into()
            })
        );
    }
    assert_eq!(
        calls[0].target,
        format!(
            "/20190301/secretbundles/actions/getByName?secretName={NAME}&stage=CURRENT&vaultId={VAULT}"
        )
    );
    assert_eq!(
        calls[4].target,
        format!(
            "/20190301/secretbundles/actions/getByName?secretName={NAME}&secretVersionName=next&vaultId={VAULT}"
        )
    );
}

#[tokio::test]
async fn fetches_by_id_with_every_selector() {
    let f = fixture().await;
    let cases = [
        (current(), 2, BINARY),
        (Selector::Stage(Stage::Previous), 1, OLD),
        (Selector::VersionNumber(3), 3, NEXT),
        (Selector::VersionName("next".into()), 3, NEXT),
    ];
    for (selector, number, content) in cases {
        let bundle = f.fetch(by_id(SECRET), selector.clone()).await.unwrap();
        assert_eq!(bundle.secret_id, SECRET, "{selector}");
        assert_eq!(bundle.version_number, number, "{selector}");
        assert_eq!(bundle.content.expose(), content, "{selector}");
    }
    let calls = f.emu.secrets_calls();
    assert!(calls.iter().all(|c| c.method == "GET" && c.status == 200));
    assert_eq!(
        calls[2].target,
        format!("/20190301/secretbundles/{SECRET}?versionNumber=3")
    );
}

#[tokio::test]
async fn binary_content_round_trips_and_never_shows_in_debug() {
    let f = fixture().await;
    let bytes: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
    let number = f.emu.rotate_secret(SECRET, bytes.clone()).unwrap();
    let bundle = f.fetch(by_id(SECRET), current()).await.unwrap();
    assert_eq!(bundle.version_number, u64::try_from(number).unwrap());
    assert_eq!(bundle.content.expose(), bytes.as_slice());
    let debug = format!("{bundle:?}");
    assert!(debug.contains("512 bytes redacted"), "{debug}");
    assert!(!debug.contains(&STANDARD.encode(&bytes)), "{debug}");
    let binary = f
        .fetch(by_id(SECRET), Selector::Stage(Stage::Previous))
        .await
        .unwrap();
    assert_eq!(binary.content.expose(), BINARY);
    assert_no_secret(&format!("{binary:?}"));
}

// --- errors ----------------------------------------------------------------------------

#[tokio::test]
async fn not_found_names_secret_vault_principal_request_id_and_the_iam_hint() {
    let f = fixture().await;
    let error = f
        .fetch(by_name("no-such-secret"), current())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound);
    assert!(!error.is_retryable());
    let message = oci_csi_vault::ErrorChain(&error).to_string();
    let rid = error.opc_request_id().unwrap().to_owned();
    for needle in [
        "\"no-such-secret\"",
        VAULT,
        "user principal from secret team/oci-user",
        rid.as_str(),
        "not found, or the principal may not read it: check the IAM policy grants \"read secret-bundles\" on the vault's compartment",
        "NotAuthorizedOrNotFound",
    ] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from {message}"
        );
    }
    assert_eq!(f.emu.secrets_calls().last().unwrap().request_id, rid);
    assert_eq!(f.calls(), 1);

    // A secret the user may not read looks the same, by OCID.
    let error = f.fetch(by_id(FORBIDDEN), current()).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound);
    assert!(
        oci_csi_vault::ErrorChain(&error)
            .to_string()
            .contains(FORBIDDEN),
        "{error}"
    );
    // So does a version that does not exist.
    let error = f
        .fetch(by_name(NAME), Selector::VersionNumber(99))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound);
    assert!(
        oci_csi_vault::ErrorChain(&error)
            .to_string()
            .contains("version 99"),
        "{error}"
    );
    assert_eq!(f.calls(), 3);
}

#[tokio::test]
async fn bad_request_is_invalid_argument_with_ocis_code_and_message() {
    let f = fixture().await;
    let error = f
        .fetch(
            SecretRef::ByName {
                vault_id: String::new(),
                name: NAME.into(),
            },
            current(),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    let message = oci_csi_vault::ErrorChain(&error).to_string();
    assert!(
        message.contains("HTTP 400 InvalidParameter: invalid parameter vaultId"),
        "{message}"
    );
    assert!(
        message.contains(error.opc_request_id().unwrap()),
        "{message}"
    );
    assert_eq!(f.calls(), 1);
}

#[tokio::test]
async fn unknown_key_is_unauthenticated_with_ocis_message() {
    let f = fixture().await;
    let mut request = f.request(by_name(NAME), current(), Duration::from_secs(30));
    request.session = f.unknown_key.clone();
    let error = f.client.clone().oneshot(request).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated);
    let message = oci_csi_vault::ErrorChain(&error).to_string();
    // The code is in the message whether the 401 reaches us as a response or as the
    // signing layer's refusal.
    assert!(message.contains("NotAuthenticated"), "{message}");
    assert!(
        message.contains("user principal from secret team/oci-user"),
        "{message}"
    );
    assert_eq!(f.calls(), 1);
}

#[tokio::test]
async fn forbidden_is_permission_denied() {
    let f = fixture().await;
    f.emu.script(Endpoint::Secrets, [Fault::Status(403)]);
    let error = f.fetch(by_name(NAME), current()).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::PermissionDenied);
    assert!(
        oci_csi_vault::ErrorChain(&error)
            .to_string()
            .contains("NotAuthorized"),
        "{error}"
    );
    assert_eq!(f.calls(), 1);
}

#[tokio::test]
async fn a_session_that_cannot_sign_fails_without_a_request() {
    let f = fixture().await;
    let mut request = f.request(by_name(NAME), current(), Duration::from_secs(30));
    // A key id that cannot go in a header: the signature cannot be written.
    request.session = Session::fixed(
        user_credential(),
        SigningKey::new(KeyId::new("bad\nkey id"), f.session.key().key().clone()),
    );
    let error = f.client.clone().oneshot(request).await.unwrap_err();
    let message = oci_csi_vault::ErrorChain(&error).to_string();
    assert!(
        message.contains("secret \"db-password\"")
            && message.contains("is not a valid header value"),
        "{message}"
    );
    assert_eq!(f.emu.stats().arrived(Endpoint::Secrets), 0);
}

#[tokio::test]
async fn non_json_error_bodies_are_bad_error_responses() {
    let f = fixture().await;
    f.emu.script(Endpoint::Secrets, [Fault::NonJsonError(400)]);
    let error = f.fetch(by_name(NAME), current()).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert_eq!(error.oci_error().unwrap().code, "BadErrorResponse");
    assert!(
        !oci_csi_vault::ErrorChain(&error)
            .to_string()
            .contains("<html>"),
        "{error}"
    );
}

// --- scripted faults -------------------------------------------------------------------

#[tokio::test]
async fn two_503s_then_success_takes_exactly_three_attempts() {
    let f = fixture().await;
    f.emu
        .script(Endpoint::Secrets, [Fault::Status(503), Fault::Status(503)]);
    let bundle = f.fetch(by_name(NAME), current()).await.unwrap();
    assert_eq!(bundle.content.expose(), BINARY);
    let stats = f.emu.stats();
    assert_eq!(stats.responses(Endpoint::Secrets, 503), 2);
    assert_eq!(stats.responses(Endpoint::Secrets, 200), 1);
    assert_eq!(stats.total_responses(Endpoint::Secrets), 3);
    // Faulted attempts never reach the handler, so only the success is recorded; the
    // bundle carries its request id.
    let calls = f.emu.secrets_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        bundle.opc_request_id.as_deref(),
        Some(calls[0].request_id.as_str())
    );
}

#[tokio::test]
async fn retryable_statuses_are_retried_until_success() {
    let f = fixture().await;
    f.emu
        .script(Endpoint::Secrets, [500, 502, 504, 409].map(Fault::Status));
    f.fetch(by_name(NAME), current()).await.unwrap();
    assert_eq!(f.calls(), 5);
}

#[tokio::test]
async fn persistent_503_gives_up_after_max_attempts_as_unavailable() {
    let f = fixture().await;
    f.emu.set_fault(Endpoint::Secrets, Some(Fault::Status(503)));
    let error = f.fetch(by_name(NAME), current()).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    assert!(
        matches!(error, VaultError::Exhausted { attempts: 5, .. }),
        "{error:?}"
    );
    assert!(
        oci_csi_vault::ErrorChain(&error)
            .to_string()
            .contains("ServiceUnavailable"),
        "{error}"
    );
    assert_eq!(f.calls(), 5);
}

#[tokio::test]
async fn too_many_requests_waits_for_retry_after_then_succeeds() {
    let f = fixture().await;
    f.emu.script(
        Endpoint::Secrets,
        [Fault::TooManyRequests {
            retry_after_secs: 1,
        }],
    );
    let start = Instant::now();
    f.fetch(by_name(NAME), current()).await.unwrap();
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
    let stats = f.emu.stats();
    assert_eq!(stats.responses(Endpoint::Secrets, 429), 1);
    assert_eq!(stats.responses(Endpoint::Secrets, 200), 1);
    assert_eq!(stats.total_responses(Endpoint::Secrets), 2);
}

#[tokio::test]
async fn retry_after_beyond_the_deadline_ends_in_resource_exhausted_at_once() {
    let f = fixture().await;
    f.emu.set_fault(
        Endpoint::Secrets,
        Some(Fault::TooManyRequests {
            retry_after_secs: 60,
        }),
    );
    let error = f
        .fetch_within(by_name(NAME), current(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ResourceExhausted);
    assert!(
        error
            .to_string()
            .contains("the next attempt would start after the deadline"),
        "{error}"
    );
    assert_eq!(f.calls(), 1);
}

async fn assert_stall_ends_at_the_deadline(fault: Fault) {
    let f = fixture().await;
    f.emu.set_fault(Endpoint::Secrets, Some(fault.clone()));
    let budget = Duration::from_millis(300);
    let request = f.request(by_name(NAME), current(), budget);
    let deadline = request.deadline;
    let error = f.client.clone().oneshot(request).await.unwrap_err();
    assert!(
        Instant::now() >= deadline,
        "{fault:?} returned before the deadline"
    );
    assert_eq!(
        error.kind(),
        ErrorKind::DeadlineExceeded,
        "{fault:?}: {error}"
    );
    assert!(
        oci_csi_vault::ErrorChain(&error)
            .to_string()
            .contains("did not complete within"),
        "{error}"
    );
    // One attempt, never retried past the deadline.
    assert_eq!(f.emu.stats().arrived(Endpoint::Secrets), 1, "{fault:?}");
    f.emu.release_stalls();
}

#[tokio::test]
async fn stall_before_headers_ends_in_deadline_exceeded_at_the_deadline() {
    assert_stall_ends_at_the_deadline(Fault::StallBeforeHeaders).await;
}

#[tokio::test]
async fn stall_after_headers_ends_in_deadline_exceeded_at_the_deadline() {
    assert_stall_ends_at_the_deadline(Fault::StallAfterHeaders).await;
}

#[tokio::test]
async fn a_connection_dropped_mid_response_is_retried() {
    let f = fixture().await;
    f.emu.set_http1_only(Endpoint::Secrets, true);
    f.emu.script(Endpoint::Secrets, [Fault::DropMidResponse]);
    let bundle = f.fetch(by_name(NAME), current()).await.unwrap();
    assert_eq!(bundle.content.expose(), BINARY);
    let stats = f.emu.stats();
    // Both attempts were answered 200; the first one's body was cut.
    assert_eq!(stats.responses(Endpoint::Secrets, 200), 2);
    assert_eq!(stats.total_responses(Endpoint::Secrets), 2);
    let listener = stats.listener(Endpoint::Secrets);
    assert_eq!(listener.accepted, 2, "{listener:?}");
    assert_eq!(listener.http2_connections, 0, "{listener:?}");
    assert!(f.transport.open_connections() <= 1);
}

#[tokio::test]
async fn method_not_implemented_is_not_retried() {
    let f = fixture().await;
    f.emu.set_fault(Endpoint::Secrets, Some(Fault::Status(501)));
    let error = f.fetch(by_name(NAME), current()).await.unwrap_err();
    assert!(!error.is_retryable());
    assert!(
        oci_csi_vault::ErrorChain(&error)
            .to_string()
            .contains("MethodNotImplemented"),
        "{error}"
    );
    assert_eq!(f.calls(), 1);
}

#[tokio::test]
async fn malformed_bundles_get_specific_errors_without_secret_bytes() {
    let f = fixture().await;
    let cases = [
        (Fault::MissingSecretId, MalformedBundle::MissingSecretId),
        (
            Fault::MissingVersionNumber,
            MalformedBundle::MissingVersionNumber,
        ),
        (
            Fault::UnknownContentType,
            MalformedBundle::UnknownContentType("SOMETHING_ELSE".into()),
        ),
        (
            Fault::Body("not json".into()),
            MalformedBundle::Json {
                category: "syntax",
                line: 1,
                column: 2,
            },
        ),
    ];
    for (fault, expected) in cases {
        f.emu.script(Endpoint::Secrets, [fault.clone()]);
        let before = f.calls();
        let error = f.fetch(by_name(NAME), current()).await.unwrap_err();
        assert_eq!(f.calls(), before + 1, "{fault:?} must not be retried");
        assert_eq!(error.kind(), ErrorKind::Internal, "{fault:?}");
        match &error {
            VaultError::Malformed { reason, .. } => assert_eq!(reason, &expected),
            other => panic!("{fault:?}: {other:?}"),
        }
        let message = oci_csi_vault::ErrorChain(&error).to_string();
        assert!(
            message.starts_with("malformed response from OCI"),
            "{message}"
        );
        assert!(
            message.contains(error.opc_request_id().unwrap()),
            "{message}"
        );
        assert_no_secret(&message);
        assert_no_secret(&format!("{error:?}"));
    }
}

#[tokio::test]
async fn refused_connections_are_retried_then_unavailable() {
    let f = fixture().await;
    // A loopback port with nothing listening: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut request = f.request(by_name(NAME), current(), Duration::from_secs(30));
    request.base_url = format!("https://127.0.0.1:{port}");
    let error = f.client.clone().oneshot(request).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    assert!(error.is_retryable());
    assert!(
        matches!(error, VaultError::Exhausted { attempts: 5, .. }),
        "{error:?}"
    );
    assert!(
        oci_csi_vault::ErrorChain(&error)
            .to_string()
            .contains("cannot connect to 127.0.0.1"),
        "{error}"
    );
}

impl Fixture {
    fn certificate_request(
        &self,
        target: CertificateRef,
        selector: Selector,
        key: bool,
    ) -> CertificateRequest {
        CertificateRequest {
            base_url: self.emu.url(Endpoint::Certificates),
            session: self.session.clone(),
            target,
            selector,
            private_key: key,
            deadline: Instant::now() + Duration::from_secs(30),
            backoff: Backoff::none(),
        }
    }
}

#[tokio::test]
async fn certificates_come_signed_from_the_emulator_and_make_tls_files() {
    let f = fixture().await;
    let cert = CertificateRef::Certificate(CERT.into());
    // With the key: encrypted in OCI, written decrypted, matching the leaf.
    let bundle = f
        .client
        .clone()
        .oneshot(f.certificate_request(cert.clone(), current(), true))
        .await
        .unwrap();
    assert_eq!(bundle.version_number, Some(1));
    assert!(bundle.private_key_passphrase.is_some());
    let key = bundle.private_key_pem.as_ref().unwrap().expose();
    assert!(key.starts_with(b"-----BEGIN ENCRYPTED PRIVATE KEY-----"));
    let decoded = auth::TenantKeys::new(1, Duration::from_secs(5))
        .certificate_key(
            "tenant",
            tokio::time::Instant::now() + Duration::from_secs(5),
            zeroize::Zeroizing::new(key.to_vec()),
            bundle
                .private_key_passphrase
                .as_ref()
                .map(|p| zeroize::Zeroizing::new(p.expose().to_vec())),
        )
        .await
        .unwrap()
        .unwrap();
    let files = TlsFiles::new(
        &bundle.certificate_pem,
        bundle.chain_pem.as_deref(),
        Some(&decoded),
    )
    .unwrap();
    assert!(
        files
            .tls_key
            .as_ref()
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----")
    );
    assert_eq!(
        files.tls_crt.matches("BEGIN CERTIFICATE").count(),
        2,
        "leaf + issuing CA"
    );
    assert_eq!(
        files.ca_crt.matches("BEGIN CERTIFICATE").count(),
        2,
        "issuing CA + root"
    );
    assert!(
        files.ca_crt.ends_with(&f.emu.certificates_root_pem()),
        "the root last"
    );

    // Without the key: none asked for, none sent.
    let public = f
        .client
        .clone()
        .oneshot(f.certificate_request(cert.clone(), current(), false))
        .await
        .unwrap();
    assert!(public.private_key_pem.is_none());
    let types: Vec<Option<String>> = f
        .emu
        .certificate_calls()
        .into_iter()
        .map(|c| c.bundle_type)
        .collect();
    assert_eq!(
        types,
        [
            Some("CERTIFICATE_CONTENT_WITH_PRIVATE_KEY".to_owned()),
            Some("CERTIFICATE_CONTENT_PUBLIC_ONLY".to_owned())
        ]
    );

    // A certificate whose key OCI does not hold answers without one.
    let no_key = f
        .client
        .clone()
        .oneshot(f.certificate_request(
            CertificateRef::Certificate(CERT_NO_KEY.into()),
            current(),
            true,
        ))
        .await
        .unwrap();
    assert!(no_key.private_key_pem.is_none());

    // Renewal: a new version; the old one stays readable by number.
    assert_eq!(f.emu.renew_certificate(CERT).unwrap(), 2);
    let renewed = f
        .client
        .clone()
        .oneshot(f.certificate_request(cert.clone(), current(), false))
        .await
        .unwrap();
    assert_eq!(renewed.version_number, Some(2));
    assert_ne!(renewed.certificate_pem, public.certificate_pem);
    let old = f
        .client
        .clone()
        .oneshot(f.certificate_request(cert.clone(), Selector::VersionNumber(1), false))
        .await
        .unwrap();
    assert_eq!(old.stages, ["PREVIOUS"]);
    f.emu
        .revoke_certificate_version(CERT, 1, "KEY_COMPROMISE")
        .unwrap();
    let revoked = f
        .client
        .clone()
        .oneshot(f.certificate_request(cert.clone(), Selector::VersionNumber(1), false))
        .await
        .unwrap();
    assert_eq!(revoked.revoked.as_deref(), Some("KEY_COMPROMISE"));

    // CA bundle and CA.
    let roots = f
        .client
        .clone()
        .oneshot(f.certificate_request(
            CertificateRef::CaBundle(CA_BUNDLE.into()),
            current(),
            false,
        ))
        .await
        .unwrap();
    let (ca_crt, _) = TlsFiles::ca_only(&roots.certificate_pem, "caBundlePem").unwrap();
    assert_eq!(ca_crt.matches("BEGIN CERTIFICATE").count(), 2);
    let ca = f
        .client
        .clone()
        .oneshot(f.certificate_request(
            CertificateRef::CertificateAuthority(CA.into()),
            current(),
            false,
        ))
        .await
        .unwrap();
    assert_eq!(ca.version_number, Some(1));

    // Someone else's certificate is NotFound; a key the emulator does not know is refused.
    let err = f
        .client
        .clone()
        .oneshot(f.certificate_request(
            CertificateRef::Certificate(CERT_FORBIDDEN.into()),
            current(),
            true,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let mut request = f.certificate_request(cert, current(), true);
    request.session = f.unknown_key.clone();
    let err = f.client.clone().oneshot(request).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");
}
