//! The signing layer, driven with `tower_test::mock` and checked by an independent
//! verifier written here from spec 1.6, not from the crate's code.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use aws_lc_rs::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use clock::ManualClock;
use http::{Method, Request};
use oci_csi_auth::signature::SignatureProfile;
use oci_csi_auth::{
    AuthError, Credential, KeyId, PrivateKey, Session, SignedResponse, SigningKey, SigningLayer,
};
use tower_test::mock;

use crate::{SPEC_KEY, spec_date};

/// What the mock upstream answers: `Answer("401")` is a 401.
#[derive(Debug, PartialEq, Eq)]
struct Answer(&'static str);

impl SignedResponse for Answer {
    fn is_unauthorized(&self) -> bool {
        self.0 == "401"
    }
}

fn workload(name: &str) -> Credential {
    Credential::Workload {
        namespace: "team".into(),
        service_account: name.into(),
        service_account_uid: None,
    }
}

const TOKEN_A: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnLWE";
const TOKEN_B: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJiIn0.c2lnLWI";

struct Fixture {
    layer: SigningLayer,
    clock: Arc<ManualClock>,
    key_a: Arc<PrivateKey>,
    key_b: Arc<PrivateKey>,
    a: Session,
    b: Session,
}

fn fixture() -> Fixture {
    let key_a = Arc::new(PrivateKey::from_pem(SPEC_KEY.as_bytes(), None).unwrap());
    let key_b = Arc::new(PrivateKey::generate_rsa_2048().unwrap());
    let a = Session::fixed(
        workload("a"),
        SigningKey::new(KeyId::security_token(TOKEN_A), key_a.clone()),
    );
    let b = Session::fixed(
        workload("b"),
        SigningKey::new(KeyId::security_token(TOKEN_B), key_b.clone()),
    );
    let clock = Arc::new(ManualClock::new(spec_date()));
    let layer = SigningLayer::new(clock.clone());
    Fixture {
        layer,
        clock,
        key_a,
        key_b,
        a,
        b,
    }
}

fn request(
    method: Method,
    uri: &str,
    body: &'static [u8],
    session: Option<Session>,
) -> Request<Bytes> {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Bytes::from_static(body))
        .unwrap();
    if let Some(session) = session {
        request.extensions_mut().insert(session);
    }
    request
}

/// What the verifier learnt from a request it accepted.
#[derive(Debug)]
struct Verified {
    key_id: String,
    headers: String,
}

/// Verifies a signed request the way an emulator would (spec 1.6), resolving the keyId
/// to a public key with `keys`.
fn verify(request: &Request<Bytes>, keys: &HashMap<String, Vec<u8>>) -> Result<Verified, String> {
    let header = request
        .headers()
        .get("authorization")
        .ok_or("no authorization header")?
        .to_str()
        .map_err(|err| err.to_string())?;
    let params = header
        .strip_prefix("Signature ")
        .ok_or("not a Signature header")?;
    let mut fields = HashMap::new();
    for part in params.split(',') {
        let (name, value) = part.split_once('=').ok_or("parameter without =")?;
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .ok_or("unquoted parameter")?;
        fields.insert(name.trim(), value);
    }
    if fields.get("version") != Some(&"1") || fields.get("algorithm") != Some(&"rsa-sha256") {
        return Err("wrong version or algorithm".into());
    }
    let names = fields.get("headers").ok_or("no headers")?;
    let body_method = matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH
    );
    let required = if body_method {
        "date (request-target) host content-length content-type x-content-sha256"
    } else {
        "date (request-target) host"
    };
    if !names.starts_with(required) {
        return Err(format!("headers {names:?} lack {required:?}"));
    }
    if body_method {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, request.body());
        if request.headers()["x-content-sha256"] != STANDARD.encode(digest.as_ref()).as_str() {
            return Err("body hash mismatch".into());
        }
        if request.headers()["content-length"] != request.body().len().to_string().as_str() {
            return Err("content-length mismatch".into());
        }
    }
    let mut lines = Vec::new();
    for name in names.split(' ') {
        let value = match name {
            "(request-target)" => format!(
                "{} {}",
                request.method().as_str().to_lowercase(),
                request.uri().path_and_query().unwrap()
            ),
            // There is no Host header here; the client would send the URI authority.
            "host" => request.uri().authority().unwrap().to_string(),
            other => request
                .headers()
                .get(other)
                .ok_or(format!("signed header {other} missing"))?
                .to_str()
                .unwrap()
                .to_owned(),
        };
        lines.push(format!("{name}: {value}"));
    }
    let key_id = fields.get("keyId").ok_or("no keyId")?;
    let public_key = keys.get(*key_id).ok_or("unknown keyId")?;
    let signature = STANDARD
        .decode(fields.get("signature").ok_or("no signature")?)
        .map_err(|err| err.to_string())?;
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public_key)
        .verify(lines.join("\n").as_bytes(), &signature)
        .map_err(|_| "bad signature".to_owned())?;
    Ok(Verified {
        key_id: (*key_id).to_owned(),
        headers: (*names).to_owned(),
    })
}

fn registry(fixture: &Fixture) -> HashMap<String, Vec<u8>> {
    HashMap::from([
        (
            format!("ST${TOKEN_A}"),
            fixture.key_a.public_key_spki_der().to_vec(),
        ),
        (
            format!("ST${TOKEN_B}"),
            fixture.key_b.public_key_spki_der().to_vec(),
        ),
    ])
}

#[tokio::test]
async fn layer_signs_each_request_with_its_identitys_key() {
    let fixture = fixture();
    let keys = registry(&fixture);
    let (mut service, mut handle) =
        mock::spawn_layer::<Request<Bytes>, Answer, _>(fixture.layer.clone());

    for (session, token, method, body) in [
        (&fixture.a, TOKEN_A, Method::POST, &b""[..]),
        (&fixture.b, TOKEN_B, Method::GET, &b""[..]),
        (&fixture.a, TOKEN_A, Method::PUT, &br#"{"k":"v"}"#[..]),
        (&fixture.b, TOKEN_B, Method::DELETE, &b""[..]),
    ] {
        handle.allow(1);
        assert!(matches!(service.poll_ready(), Poll::Ready(Ok(()))));
        let response = tokio::spawn(service.call(request(
            method.clone(),
            "https://secrets.vaults.eu-frankfurt-1.oci.oraclecloud.com:8443/20190301/secretbundles/x?stage=CURRENT",
            body,
            Some(session.clone()),
        )));
        let (sent, reply) = handle.next_request().await.unwrap();
        let verified = verify(&sent, &keys).unwrap_or_else(|err| panic!("{method}: {err}"));
        assert_eq!(verified.key_id, format!("ST${token}"));
        let body_headers = matches!(method, Method::POST | Method::PUT);
        assert_eq!(verified.headers.contains("x-content-sha256"), body_headers);
        assert_eq!(sent.headers()["date"], "Thu, 05 Jan 2023 21:31:40 GMT");
        reply.send_response(Answer("ok"));
        assert_eq!(response.await.unwrap().unwrap(), Answer("ok"));
    }
}

#[tokio::test]
async fn a_key_from_another_identity_does_not_verify() {
    let fixture = fixture();
    // The verifier maps token A to key B: the signature must not check out.
    let keys = HashMap::from([(
        format!("ST${TOKEN_A}"),
        fixture.key_b.public_key_spki_der().to_vec(),
    )]);
    let (mut service, mut handle) =
        mock::spawn_layer::<Request<Bytes>, Answer, _>(fixture.layer.clone());
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let _response = tokio::spawn(service.call(request(
        Method::GET,
        "https://h.example/x",
        b"",
        Some(fixture.a.clone()),
    )));
    let (sent, _reply) = handle.next_request().await.unwrap();
    assert_eq!(verify(&sent, &keys).unwrap_err(), "bad signature");
}

#[tokio::test]
async fn date_comes_from_the_clock_at_signing_time() {
    let fixture = fixture();
    let (mut service, mut handle) =
        mock::spawn_layer::<Request<Bytes>, Answer, _>(fixture.layer.clone());
    fixture.clock.advance(Duration::from_secs(3600));
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let _response = tokio::spawn(service.call(request(
        Method::GET,
        "https://h.example/x",
        b"",
        Some(fixture.b.clone()),
    )));
    let (sent, _reply) = handle.next_request().await.unwrap();
    assert_eq!(sent.headers()["date"], "Thu, 05 Jan 2023 22:31:40 GMT");
    verify(&sent, &registry(&fixture)).unwrap();
}

#[tokio::test]
async fn request_without_a_session_is_an_error_and_never_reaches_the_inner_service() {
    let fixture = fixture();
    let (mut service, mut handle) =
        mock::spawn_layer::<Request<Bytes>, Answer, _>(fixture.layer.clone());
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let err = service
        .call(request(Method::GET, "https://h.example/x", b"", None))
        .await
        .unwrap_err();
    let err = err.downcast::<AuthError>().unwrap();
    assert!(matches!(*err, AuthError::MissingSession), "{err:?}");
    assert_eq!(
        err.to_string(),
        "the request carries no established session to sign it with"
    );
    // Nothing was forwarded.
    assert!(handle.poll_request().is_pending());
}

/// A session that cannot renew (a fixed key) is refused after one attempt, even with a
/// security token and time left: the error names the identity, the token is not in it.
#[tokio::test]
async fn a_refused_fixed_session_is_not_retried_and_names_the_identity() {
    let fixture = fixture();
    let (mut service, mut handle) =
        mock::spawn_layer::<Request<Bytes>, Answer, _>(fixture.layer.clone());
    handle.allow(2);
    assert!(service.poll_ready().is_ready());
    let mut refused = request(
        Method::GET,
        "https://h.example/x",
        b"",
        Some(fixture.a.clone()),
    );
    refused.extensions_mut().insert(transport::Deadline(
        tokio::time::Instant::now() + Duration::from_secs(30),
    ));
    let response = tokio::spawn(service.call(refused));
    let (_sent, reply) = handle.next_request().await.unwrap();
    reply.send_response(Answer("401"));
    let err = response
        .await
        .unwrap()
        .unwrap_err()
        .downcast::<AuthError>()
        .unwrap();
    assert!(matches!(*err, AuthError::Unauthorized { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("workload identity of service account team/a"),
        "{err}"
    );
    assert!(!err.to_string().contains(TOKEN_A));
    // One attempt only.
    assert!(handle.poll_request().is_pending());
}

#[tokio::test]
async fn poll_ready_delegates_to_the_inner_service() {
    let fixture = fixture();
    let (mut service, mut handle) =
        mock::spawn_layer::<Request<Bytes>, Answer, _>(fixture.layer.clone());
    handle.allow(0);
    assert!(service.poll_ready().is_pending());
    handle.allow(1);
    assert!(service.is_woken());
    assert!(service.poll_ready().is_ready());

    let (mut broken, mut broken_handle) =
        mock::spawn_layer::<Request<Bytes>, Answer, _>(fixture.layer.clone());
    broken_handle.send_error("inner is broken");
    // The inner error comes out of poll_ready unchanged (boxed).
    match broken.poll_ready() {
        Poll::Ready(Err(err)) => assert_eq!(err.to_string(), "inner is broken"),
        other => panic!("expected the inner error, got {other:?}"),
    }
}

#[tokio::test]
async fn security_token_is_hidden_from_debug_of_the_signed_request() {
    let fixture = fixture();
    let (mut service, mut handle) =
        mock::spawn_layer::<Request<Bytes>, Answer, _>(fixture.layer.clone());
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let _response = tokio::spawn(service.call(request(
        Method::GET,
        "https://h.example/x",
        b"",
        Some(fixture.a.clone()),
    )));
    let (sent, _reply) = handle.next_request().await.unwrap();
    assert!(sent.headers()["authorization"].is_sensitive());
    let debug = format!("{sent:?} {:?} {:?}", fixture.layer, service.get_ref());
    assert!(!debug.contains(TOKEN_A), "{debug}");
    assert!(!debug.contains("eyJ"), "{debug}");
}

#[tokio::test]
async fn signature_profile_in_the_extensions_selects_the_federation_headers() {
    let fixture = fixture();
    let (mut service, mut handle) =
        mock::spawn_layer::<Request<Bytes>, Answer, _>(fixture.layer.clone());
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let mut federation = request(
        Method::POST,
        "https://auth.us-ashburn-1.oraclecloud.com/v1/x509",
        b"{}",
        Some(fixture.a.clone()),
    );
    federation
        .extensions_mut()
        .insert(SignatureProfile::Federation);
    let _response = tokio::spawn(service.call(federation));
    let (sent, _reply) = handle.next_request().await.unwrap();
    let authorization = sent.headers()["authorization"].to_str().unwrap();
    assert!(
        authorization.contains(
            "headers=\"date (request-target) content-length content-type x-content-sha256\""
        ),
        "{authorization}"
    );
}
