//! Integration tests of the emulator through real TLS connections.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]
// reason: test code
// The emulator's tests need their own independent HTTP/TLS client (not the transport under test).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // reason: independent test client

mod client;
mod listing;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::digest;
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::RsaKeyPair;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use clock::ManualClock;
use http::{Request, StatusCode};
use http_body_util::Full;
use oci_csi_testkit::{
    Emulator, EmulatorHandle, Endpoint, Fault, KubeSecretSeed, Principal, Revoke,
    SERVICE_ACCOUNT_ISSUER, SecretSeed, Seed, Signer, TokenSpec, UserSeed, api_key_fingerprint,
};

use client::{Unsigned, colon_hex, connect, pem, pem_der, send, spki_der};

const WAIT: Duration = Duration::from_secs(10);

// --- spec 1.5 material -------------------------------------------------------------------

const VECTOR_KEY: &str = "MIIEpAIBAAKCAQEA0zQ34yYniTDGSEuhySc7Ujyg0X08y6TeX/LbKaFXEik57Ze8
XQud3ONKuuGKZ/KU5ez7KIqV2LsjdEnVTfcnmFBdOiW3aGMI8tt0dWW2PXLocrbC
cz7vePN6XwZvAstEv7UJ2mMRek6jQMrq2kUhj0lq1eVTZj1cQeICsLjtYUznKAZi
56415PaQTL/c5pwdetBbiMhn9tK/pCig6PhT74hJUTyyYG7bqvPQ/H2jiRJi/pYa
6tJNL37v4VFrFbU5bg1bIU2PtuvcQsHbx3HsjMTVZD0knQ94aW3x7TP1atwFSyor
xCzNGeTJ7g3cNVabbuDZkSznCOW6GPIDQx8LtQIDAQABAoIBAAUqes94iHEHm2H7
T5q+9el+CCT3njwQ7UuFgizTgHC2R29zTa0s8pCLkrFdgOgn+9Jf6IjGUwH5GdXn
VGtSx0ondRBOCd1oxrhB++g/M6TvIZZkt/7fpDXeJrkaTC7ST/0sbXBFChFmyQF1
tSbfmAGMNyvCLzcJ+y61W4F9FHlTv9eghNG632xMh6CDf1AYjCxyd+dHYh03X8b4
/gM8KpaVMkqZsoACyr+94+7XPNw8lqDj7lkmHZ07TaNzz6wk0PWWd7cWBSmR0ee9
ONV3S2A+BxDWhKsUdveBKZgdOei8dWuGN36ktXWZ+vSK5HW5RlyjG9KQn6ulcBVB
1xXeaUECgYEA6bfWQK8Ml4GRbplM+rgZpcVF/LNb558+/h/iUquPDzH8bBLOsDD7
ovyDSPvD3K02GvDk9mD3tjjvC/VGXaM8OSR54pRNfriqKUWJUNqiAlFbkNt/GVtZ
HhrIJslAJNfREsve5F/diVJCRIMAnVr8e1t1BMhRx9K5ZUJeWfPGIXECgYEA51bl
zTiFU8fart6MTbmhkPFTYKF5sZgEqk4DZLir5FJDD5T9PnBmzZjHJBK+nZSP91QH
0nCMDgtWGXXz4EJTIrfcZ9p/TtzhzZHhu9fe87p36TT3S64gtLPgjCya25mIIKdG
9sPwERrtprZLh0IzJQpnIGAFZ6wssaxEtu5UbIUCgYAlhR6/KZry45kOUUv7X/y2
ERJoO/8AEx+Quluh++qufM7SJr7JqENtae5FlC1gSupJruyC5RQ/S6qMl+ag96ie
X821YyuBsXGXyJL/yOmDR75UZfhkgLawz4ncOCi1AXSN+O6iaQVumycKSqGZoVax
EwCZMPN4Ccs7h0kQVcMz8QKBgQDPLHgiQCLOs+U4w578oGh7iFM174YvMEfFSJYr
ZmKx16Ws162vdDPsnYyB1rOUJY6EXWGf6SDUFvzlUke0J1GSfvvImdl3A8LIOYPh
mGJW/UATvlZVFTy+93P5tJx+W1GYhJW9uh1NBEOeEBU1rWhmHJncWYGdpYhlGTR0
ap16jQKBgQCVvSVPgvKKHugf8mlur7n0UkV86aLlDH4e219hIPF2ct2O1oFP6yz3
SO11aqiEi7wpuLNn6uVlwdMCFZsyPptj5IefShFlKyZjU6xgtCRV2EMBMZ2OajoA
Izqt5jt6ORjOeYqbVHVmtHp0m1sVqs264smxU2cR8SxBjcgQv69cQA==";

const SIG_A: &str = "LU/yXy5gPkMHJl8REjEvusyWmVgp2UL3mjbXQaGcci/67sTNaatNuN2s17pcTEGYUguFAC7tfK+g51b9TdgGYyPpH+ft+FuPblJhcqYx0Wct8ZaYUOQivG60ava0p5OSrv7Vn2D1jeN7z4pn96XeWAdT6PkLI0Mlap6v8L+DkJECxXtA0iEqyAS/Z2tqHutx1bSqqpwGpuX0yRmx9G+YmWfTRxhgoDVTnSIdYtaif6G8juByzp4NGr+NVA4v5gWll/4B+1JjzLkExUEP/9Z6M+4bTLZsW1gMAjJUiQWXnsSSEOE68wZNq0UEk5mxIkBVsrt8d2h2CWajk3Bt3NIG3Q==";
const SIG_B: &str = "zTorEtpO99Jd90pNDOknHUf9iYkrdkkg72+5NWLGGdNbfZeoFw/oFoOpVXYzfW5ni73VrBM26lWvw2qQB+erOZRNzvCOWim/zgFQ19JU/aH7jmO1Gafm0suUHFTcy0e8zj/80X61jgRaTtiaXZhjc39ltfmTJZYzybNuLLhcmIZvr5bwQDZESOfIwhuIDz31XeHbC/oEZXAxa3WP3IhTZWn2rfVo9IcV+ifv+gjJx7zVdcEAmphzEHL7hxzpl+w/2ImduiPHWHMOIJUxsDYidbgU5c3LdkHK+zZ+YEldnbEi0wA3RQ28RxUY0oFayyMLRASXO+erryRfT1AhHuso5Q==";
const SIG_C: &str = "x/qB+doxzKyYhFMFSaQActjPLiEEX5uqgi6UAyZW7n7O7sZA/Xs4M3VCbKnSD9Y1aWqddFj9Mbq0Awyp9+DZVjoIDfmTu1E+Xl8uqwRzqXV3Z6FH+shqRliBO7Os/98MU8S7cU9XyRcC0a9y3zHfCEDMjDXy9hBskZy/sMPjBE2ZUV9V9LWr02RvCcmVPnWqjNvsSK+nCqSXqCiNCCg6OElM3k8dODEJrNuiITDWNsoBFUynjOm/onNKpSWMJsFOfKRArVJvQqLw5f3jUpYv+Sycdq6kcuJDW8bmzL1uxekpuGZrwT2nMPNb0M3+M5sjPtcsMWu17bimTRfsGJwUDw==";

const TENANCY: &str = "ocid1.tenancy.oc1..aaaaaaaaexampletenancy";
const USER: &str = "ocid1.user.oc1..aaaaaaaaexampleuser";
const FP: &str = "52:27:47:a7:f2:d3:5f:7f:1b:56:30:21:2a:7a:ef:8f";
const VAULT: &str = "ocid1.vault.oc1.iad.exampleuniqueid";
const SECRET: &str = "ocid1.vaultsecret.oc1.iad.exampleuniqueid";
const HOST: &str = "secrets.vaults.us-ashburn-1.oci.oraclecloud.com";
const TARGET_A: &str = "/20190301/secretbundles/actions/getByName?secretName=db-password&stage=CURRENT&vaultId=ocid1.vault.oc1.iad.exampleuniqueid";
const TARGET_B: &str =
    "/20190301/secretbundles/ocid1.vaultsecret.oc1.iad.exampleuniqueid?versionNumber=3";

fn vector_date() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_672_954_300)
}

fn vector_key() -> RsaKeyPair {
    let der = STANDARD
        .decode(VECTOR_KEY.replace('\n', ""))
        .expect("key base64");
    RsaKeyPair::from_der(&der).expect("pkcs1 key")
}

fn key_id() -> String {
    format!("{TENANCY}/{USER}/{FP}")
}

const BINARY: &[u8] = &[0, 159, 146, 150, 255, 10, 13];

fn base_seed() -> Seed {
    let key = vector_key();
    Seed::default()
        .vault(VAULT)
        .user(UserSeed {
            tenancy: TENANCY.into(),
            user: USER.into(),
            public_key_pem: pem("PUBLIC KEY", &spki_der(&key)),
        })
        .service_account("app", "app-sa")
        .service_account("other", "other-sa")
        .secret(
            SecretSeed::new(SECRET, VAULT, "db-password")
                .version(1, "old", &["PREVIOUS"])
                .version(2, "hunter2", &["CURRENT", "LATEST"])
                .version(3, BINARY, &[])
                .allow_user(USER)
                .allow_workload("app", "app-sa")
                .allow_instance_tenancy("ocid1.tenancy.oc1..aaaaaaaainstancetenancy"),
        )
        .secret(
            SecretSeed::new("ocid1.vaultsecret.oc1..private", VAULT, "private").version(
                1,
                "nope",
                &["CURRENT"],
            ),
        )
        .kube_secret(
            KubeSecretSeed::new("app", "oci-config")
                .data("config", "auth:\n  region: us-ashburn-1\n")
                .data("private-key", "-----BEGIN PRIVATE KEY-----\n"),
        )
}

async fn start_at(now: SystemTime) -> (Emulator, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(now));
    let emu = Emulator::start(base_seed(), clock.clone())
        .await
        .expect("start");
    (emu, clock)
}

fn vector_a() -> Unsigned {
    Unsigned::new("POST", TARGET_A, HOST, vector_date())
}

fn vector_b() -> Unsigned {
    Unsigned::new("GET", TARGET_B, HOST, vector_date())
}

// --- spec 1.5 vectors ----------------------------------------------------------------------

#[test]
fn independent_signer_reproduces_the_spec_vectors() {
    let key = vector_key();
    assert_eq!(api_key_fingerprint(&spki_der(&key)), FP);
    let a = vector_a();
    assert_eq!(client::rsa_sign(&key, a.signing_string().as_bytes()), SIG_A);
    let b = vector_b();
    assert_eq!(client::rsa_sign(&key, b.signing_string().as_bytes()), SIG_B);
    let mut c = Unsigned::new("POST", "/v1/x509", "", vector_date());
    c.body = br#"{"certificate":"MIIBfakeLeaf","intermediateCertificates":["MIIBfakeInter"],"publicKey":"MIIBfakeSessionKey"}"#.to_vec();
    c.headers = Some(vec![
        "date",
        "(request-target)",
        "content-length",
        "content-type",
        "x-content-sha256",
    ]);
    assert_eq!(client::rsa_sign(&key, c.signing_string().as_bytes()), SIG_C);
}

#[tokio::test]
async fn spec_vector_a_is_accepted_with_the_exact_spec_signature() {
    let (emu, _clock) = start_at(vector_date()).await;
    let a = vector_a();
    let resp = send(
        &emu,
        Endpoint::Secrets,
        a.build(&a.authorization(&key_id(), SIG_A)),
    )
    .await;
    assert_eq!(resp.status, StatusCode::OK, "{:?}", resp.body);
    let v = resp.json();
    assert_eq!(v["secretId"], SECRET);
    assert_eq!(v["versionNumber"], 2);
    assert_eq!(v["secretBundleContent"]["contentType"], "BASE64");
    assert_eq!(
        v["secretBundleContent"]["content"],
        STANDARD.encode("hunter2")
    );
    assert_eq!(v["stages"], serde_json::json!(["CURRENT", "LATEST"]));
    assert_eq!(
        resp.headers["opc-request-id"],
        "0123456789abcdef0123456789abcdef"
    );
    assert!(resp.headers.contains_key("etag"));
    let calls = emu.secrets_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].identity,
        Some(Principal::User {
            tenancy: TENANCY.into(),
            user: USER.into()
        })
    );
}

#[tokio::test]
async fn spec_vector_b_is_accepted_and_serves_binary_content() {
    let (emu, _clock) = start_at(vector_date()).await;
    let b = vector_b();
    let resp = send(
        &emu,
        Endpoint::Secrets,
        b.build(&b.authorization(&key_id(), SIG_B)),
    )
    .await;
    assert_eq!(resp.status, StatusCode::OK, "{:?}", resp.body);
    let v = resp.json();
    assert_eq!(v["versionNumber"], 3);
    let content = STANDARD
        .decode(v["secretBundleContent"]["content"].as_str().unwrap())
        .unwrap();
    assert_eq!(content, BINARY);
}

#[tokio::test]
async fn tampered_spec_vectors_are_refused() {
    let (emu, clock) = start_at(vector_date()).await;
    let key = vector_key();
    let a = vector_a();
    let auth_a = a.authorization(&key_id(), SIG_A);

    let mut cases: Vec<(&str, Request<client::Body>)> = Vec::new();
    // A different Host than the one signed.
    let mut r = a.build(&auth_a);
    r.headers_mut()
        .insert("host", "secrets.example.com".parse().unwrap());
    cases.push(("host header", r));
    // A different date than the one signed (still within the skew).
    let mut r = a.build(&auth_a);
    r.headers_mut().insert(
        "date",
        client::http_date(vector_date() + Duration::from_secs(1))
            .parse()
            .unwrap(),
    );
    cases.push(("date header", r));
    // A body the signature does not cover (x-content-sha256 recomputed for the body).
    let mut tampered = a.clone();
    tampered.body = b"{}".to_vec();
    cases.push(("body", tampered.build(&auth_a)));
    // A body that does not match x-content-sha256.
    let mut r = a.build(&auth_a);
    *r.body_mut() = Full::new(Bytes::from_static(b"{}"));
    r.headers_mut()
        .insert("content-length", "2".parse().unwrap());
    cases.push(("x-content-sha256", r));
    // Another query string.
    let mut q = a.clone();
    q.target = TARGET_A.replace("CURRENT", "PREVIOUS");
    cases.push(("query", q.build(&auth_a)));
    // Another key with the same keyId.
    let other = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    cases.push(("key", a.sign(&key_id(), &other)));
    // An unknown fingerprint.
    cases.push((
        "fingerprint",
        a.sign(
            &format!("{TENANCY}/{USER}/00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff"),
            &key,
        ),
    ));
    // A signed header list without x-content-sha256.
    let mut h = a.clone();
    h.headers = Some(vec![
        "date",
        "(request-target)",
        "host",
        "content-length",
        "content-type",
    ]);
    cases.push((
        "missing x-content-sha256 in headers",
        h.sign(&key_id(), &key),
    ));
    // A signed header that is absent from the request.
    let mut h = a.clone();
    h.headers = Some(vec![
        "date",
        "(request-target)",
        "host",
        "content-length",
        "content-type",
        "x-content-sha256",
        "opc-obo-token",
    ]);
    cases.push(("absent signed header", h.sign(&key_id(), &key)));
    // Bad algorithm.
    cases.push((
        "algorithm",
        a.build(&auth_a.replace("rsa-sha256", "hmac-sha256")),
    ));
    // GET vector with the POST signature.
    let b = vector_b();
    cases.push(("method", b.build(&b.authorization(&key_id(), SIG_A))));
    for (what, req) in cases {
        let resp = send(&emu, Endpoint::Secrets, req).await;
        assert_eq!(
            resp.status,
            StatusCode::UNAUTHORIZED,
            "{what}: {:?}",
            resp.body
        );
        assert_eq!(resp.code(), "NotAuthenticated", "{what}");
    }

    // The untampered vector still works, and stops working once the clock is 6 minutes off.
    let ok = send(&emu, Endpoint::Secrets, a.build(&auth_a)).await;
    assert_eq!(ok.status, StatusCode::OK);
    clock.advance(Duration::from_secs(301));
    let late = send(&emu, Endpoint::Secrets, a.build(&auth_a)).await;
    assert_eq!(late.status, StatusCode::UNAUTHORIZED);
    clock.set(vector_date() - Duration::from_secs(301));
    let early = send(&emu, Endpoint::Secrets, a.build(&auth_a)).await;
    assert_eq!(early.status, StatusCode::UNAUTHORIZED);
    emu.set_time(vector_date());
    let ok = send(&emu, Endpoint::Secrets, a.build(&auth_a)).await;
    assert_eq!(
        ok.status,
        StatusCode::OK,
        "set_time brings the emulator back"
    );
}

// --- Secrets API ---------------------------------------------------------------------------

async fn user_get(emu: &EmulatorHandle, method: &'static str, target: &str) -> client::Resp {
    let host = emu.addr(Endpoint::Secrets).to_string();
    let req = Unsigned::new(method, target, &host, emu.now()).sign(&key_id(), &vector_key());
    send(emu, Endpoint::Secrets, req).await
}

#[tokio::test]
async fn secrets_selects_versions_by_stage_number_and_name() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let by_name = |q: &str| {
        format!(
            "/20190301/secretbundles/actions/getByName?secretName=db-password&vaultId={VAULT}{q}"
        )
    };
    let r = user_get(&emu, "POST", &by_name("&stage=PREVIOUS")).await;
    assert_eq!(r.json()["versionNumber"], 1);
    let r = user_get(&emu, "POST", &by_name("")).await;
    assert_eq!(r.json()["versionNumber"], 2, "no selector means CURRENT");
    let r = user_get(&emu, "POST", &by_name("&versionNumber=1")).await;
    assert_eq!(r.json()["versionNumber"], 1);
    let r = user_get(&emu, "POST", &by_name("&versionNumber=9")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.code(), "NotAuthorizedOrNotFound");
    let r = user_get(&emu, "POST", &by_name("&stage=PENDING")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = user_get(&emu, "POST", &by_name("&stage=current")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = user_get(
        &emu,
        "POST",
        "/20190301/secretbundles/actions/getByName?secretName=db-password",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "MissingParameter");

    let v = emu
        .add_secret_version(SECRET, "named", Some("v-named"), &["PENDING"])
        .unwrap();
    let r = user_get(
        &emu,
        "GET",
        &format!("/20190301/secretbundles/{SECRET}?secretVersionName=v-named"),
    )
    .await;
    assert_eq!(r.json()["versionNumber"], v);
    let r = user_get(
        &emu,
        "GET",
        &format!("/20190301/secretbundles/{SECRET}?stage=PENDING"),
    )
    .await;
    assert_eq!(r.json()["versionName"], "v-named");

    // Rotation: the new version becomes CURRENT, the old CURRENT becomes PREVIOUS.
    let n = emu.rotate_secret(SECRET, "rotated").unwrap();
    let r = user_get(&emu, "GET", &format!("/20190301/secretbundles/{SECRET}")).await;
    assert_eq!(r.json()["versionNumber"], n);
    assert_eq!(
        r.json()["secretBundleContent"]["content"],
        STANDARD.encode("rotated")
    );
    let r = user_get(
        &emu,
        "GET",
        &format!("/20190301/secretbundles/{SECRET}?stage=PREVIOUS"),
    )
    .await;
    assert_eq!(r.json()["versionNumber"], 2);
}

#[tokio::test]
async fn secrets_hides_unauthorized_secrets_and_revoked_users() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let r = user_get(
        &emu,
        "GET",
        "/20190301/secretbundles/ocid1.vaultsecret.oc1..private",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.code(), "NotAuthorizedOrNotFound");
    emu.revoke(Revoke::User(USER.into()));
    let r = user_get(&emu, "GET", &format!("/20190301/secretbundles/{SECRET}")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    emu.restore(Revoke::User(USER.into()));
    let r = user_get(&emu, "GET", &format!("/20190301/secretbundles/{SECRET}")).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn secrets_faults_produce_each_error_status_then_recover() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let path = format!("/20190301/secretbundles/{SECRET}");
    emu.script(
        Endpoint::Secrets,
        [
            Fault::Status(400),
            Fault::Status(401),
            Fault::Status(404),
            Fault::Status(409),
            Fault::TooManyRequests {
                retry_after_secs: 7,
            },
            Fault::Status(500),
            Fault::Status(502),
            Fault::Status(503),
            Fault::Status(504),
            Fault::NonJsonError(502),
        ],
    );
    let expected = [
        (400, "InvalidParameter"),
        (401, "NotAuthenticated"),
        (404, "NotAuthorizedOrNotFound"),
        (409, "IncorrectState"),
        (429, "TooManyRequests"),
        (500, "InternalServerError"),
        (502, "InternalServerError"),
        (503, "ServiceUnavailable"),
        (504, "InternalServerError"),
    ];
    for (status, code) in expected {
        let r = user_get(&emu, "GET", &path).await;
        assert_eq!(r.status.as_u16(), status);
        assert_eq!(r.code(), code);
        assert!(r.headers.contains_key("opc-request-id"));
        if status == 429 {
            assert_eq!(r.headers["retry-after"], "7");
        }
    }
    let r = user_get(&emu, "GET", &path).await;
    assert_eq!(r.status.as_u16(), 502);
    assert!(serde_json::from_slice::<serde_json::Value>(&r.body).is_err());
    // Script exhausted: back to normal.
    let r = user_get(&emu, "GET", &path).await;
    assert_eq!(r.status, StatusCode::OK);

    // A status sequence: 503, 503, 200.
    emu.script(Endpoint::Secrets, [Fault::Status(503), Fault::Status(503)]);
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(user_get(&emu, "GET", &path).await.status.as_u16());
        }
        v
    };
    assert_eq!(statuses, [503, 503, 200]);
    let s = emu.stats();
    assert_eq!(s.responses(Endpoint::Secrets, 503), 3);
    assert_eq!(s.responses(Endpoint::Secrets, 200), 2);
}

#[tokio::test]
async fn secrets_malformed_bodies_can_be_injected() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let path = format!("/20190301/secretbundles/{SECRET}");
    emu.script(
        Endpoint::Secrets,
        [
            Fault::MissingSecretId,
            Fault::MissingVersionNumber,
            Fault::UnknownContentType,
            Fault::Body("{\"not\":\"a bundle\"".into()),
        ],
    );
    let r = user_get(&emu, "GET", &path).await.json();
    assert!(r.get("secretId").is_none() && r.get("versionNumber").is_some());
    let r = user_get(&emu, "GET", &path).await.json();
    assert!(r.get("versionNumber").is_none() && r.get("secretId").is_some());
    let r = user_get(&emu, "GET", &path).await.json();
    assert_eq!(r["secretBundleContent"]["contentType"], "SOMETHING_ELSE");
    let r = user_get(&emu, "GET", &path).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(&r.body[..], b"{\"not\":\"a bundle\"");
}

#[tokio::test]
async fn drop_mid_response_truncates_the_body() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    emu.script(Endpoint::Secrets, [Fault::DropMidResponse]);
    let host = emu.addr(Endpoint::Secrets).to_string();
    let req = Unsigned::new(
        "GET",
        &format!("/20190301/secretbundles/{SECRET}"),
        &host,
        emu.now(),
    )
    .sign(&key_id(), &vector_key());
    let mut conn = connect(&emu, Endpoint::Secrets, &[b"http/1.1"]).await;
    assert!(conn.send(req).await.is_err(), "body read must fail");
    emu.wait_for(WAIT, |s| s.listener(Endpoint::Secrets).open == 0)
        .await
        .unwrap();
}

#[tokio::test]
async fn stalls_hold_requests_until_released() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    emu.script(
        Endpoint::Secrets,
        [Fault::StallBeforeHeaders, Fault::StallAfterHeaders],
    );
    for _ in 0..2 {
        let handle = emu.handle();
        let task = tokio::spawn(async move {
            let host = handle.addr(Endpoint::Secrets).to_string();
            let req = Unsigned::new(
                "GET",
                &format!("/20190301/secretbundles/{SECRET}"),
                &host,
                handle.now(),
            )
            .sign(&key_id(), &vector_key());
            send(&handle, Endpoint::Secrets, req).await
        });
        emu.wait_for(WAIT, |s| s.held(Endpoint::Secrets) == 1)
            .await
            .unwrap();
        assert!(!task.is_finished());
        emu.release_stalls();
        let r = task.await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        emu.wait_for(WAIT, |s| s.held(Endpoint::Secrets) == 0)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn latency_delays_the_answer() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    emu.script(Endpoint::Imds, [Fault::Latency(Duration::from_millis(300))]);
    let started = std::time::Instant::now();
    let r = send(&emu, Endpoint::Imds, imds_get("/opc/v2/instance/region")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

// --- connections ---------------------------------------------------------------------------

#[tokio::test]
async fn connection_counters_follow_open_and_close_exactly() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let mut conns = Vec::new();
    for _ in 0..5 {
        conns.push(connect(&emu, Endpoint::Kube, &[b"h2", b"http/1.1"]).await);
    }
    let s = emu
        .wait_for(WAIT, |s| s.listener(Endpoint::Kube).tls_handshakes == 5)
        .await
        .unwrap();
    let l = s.listener(Endpoint::Kube);
    assert_eq!((l.accepted, l.open, l.high_water), (5, 5, 5));
    assert_eq!(l.http2_connections, 5);
    drop(conns.drain(..3));
    emu.wait_for(WAIT, |s| s.listener(Endpoint::Kube).open == 2)
        .await
        .unwrap();
    drop(conns);
    let s = emu
        .wait_for(WAIT, |s| s.listener(Endpoint::Kube).open == 0)
        .await
        .unwrap();
    let l = s.listener(Endpoint::Kube);
    assert_eq!((l.accepted, l.open, l.high_water), (5, 0, 5));
    assert_eq!(s.listener(Endpoint::Secrets).accepted, 0);
}

#[tokio::test]
async fn http1_only_mode_refuses_to_negotiate_h2() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let c = connect(&emu, Endpoint::Secrets, &[b"h2", b"http/1.1"]).await;
    assert!(c.is_h2());
    emu.set_http1_only(Endpoint::Secrets, true);
    let c = connect(&emu, Endpoint::Secrets, &[b"h2", b"http/1.1"]).await;
    assert!(!c.is_h2());
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_after_the_timeout() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    emu.set_idle_timeout(Endpoint::Imds, Some(Duration::from_millis(200)));
    let mut conn = connect(&emu, Endpoint::Imds, &[]).await;
    let r = conn
        .send(imds_get("/opc/v2/instance/region"))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    let s = emu
        .wait_for(WAIT, |s| s.listener(Endpoint::Imds).open == 0)
        .await
        .unwrap();
    assert_eq!(s.listener(Endpoint::Imds).idle_closed, 1);
}

// --- Kubernetes, proxymux, workload identity ----------------------------------------------

fn jwt_claims(jwt: &str) -> serde_json::Value {
    let payload = jwt.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

fn token_request(
    emu: &EmulatorHandle,
    ns: &str,
    sa: &str,
    bearer: Option<&str>,
) -> Request<client::Body> {
    let body = serde_json::json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": {
            "audiences": [],
            "expirationSeconds": 900,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "app-pod", "uid": "pod-uid-1"}
        },
        "status": {}
    });
    let mut b = Request::builder()
        .method("POST")
        .uri(format!(
            "/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"
        ))
        .header("host", emu.addr(Endpoint::Kube).to_string())
        .header("content-type", "application/json");
    if let Some(t) = bearer {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    b.body(Full::new(Bytes::from(body.to_string()))).unwrap()
}

#[tokio::test]
async fn kube_token_request_issues_bound_service_account_tokens() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let r = send(
        &emu,
        Endpoint::Kube,
        token_request(&emu, "app", "app-sa", None),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = send(
        &emu,
        Endpoint::Kube,
        token_request(&emu, "app", "app-sa", Some("garbage")),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = send(
        &emu,
        Endpoint::Kube,
        token_request(&emu, "app", "app-sa", Some(emu.provider_token())),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let v = r.json();
    let token = v["status"]["token"].as_str().unwrap();
    assert!(
        v["status"]["expirationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    let claims = jwt_claims(token);
    let now = emu.now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert_eq!(claims["exp"].as_u64().unwrap(), now + 900);
    assert_eq!(claims["sub"], "system:serviceaccount:app:app-sa");
    assert_eq!(claims["kubernetes.io"]["namespace"], "app");
    assert_eq!(claims["kubernetes.io"]["pod"]["name"], "app-pod");
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], "pod-uid-1");
    assert_eq!(claims["kubernetes.io"]["serviceaccount"]["name"], "app-sa");
    assert!(
        !claims["kubernetes.io"]["serviceaccount"]["uid"]
            .as_str()
            .unwrap()
            .is_empty()
    );
    let header: serde_json::Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(token.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["alg"], "RS256");
    let r = send(
        &emu,
        Endpoint::Kube,
        token_request(&emu, "app", "missing-sa", Some(emu.provider_token())),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["kind"], "Status");
    assert_eq!(emu.stats().total_token_requests(), 1);
    // The kubeconfig and provider config point at the emulator.
    let kubeconfig = std::fs::read_to_string(&emu.files().kubeconfig).unwrap();
    assert!(kubeconfig.contains(&emu.url(Endpoint::Kube)));
    let config: toml::Value =
        toml::from_str(&std::fs::read_to_string(&emu.files().provider_config).unwrap()).unwrap();
    assert_eq!(
        config["endpoints"]["secrets"].as_str().unwrap(),
        emu.url(Endpoint::Secrets)
    );
    assert_eq!(
        std::fs::read_to_string(&emu.files().ca).unwrap(),
        emu.ca_pem()
    );
}

#[tokio::test]
async fn kube_get_secret_returns_base64_data() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let get = |name: &str, token: &str| {
        Request::builder()
            .uri(format!("/api/v1/namespaces/app/secrets/{name}"))
            .header("host", emu.addr(Endpoint::Kube).to_string())
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let r = send(
        &emu,
        Endpoint::Kube,
        get("oci-config", emu.provider_token()),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let data = &r.json()["data"];
    assert_eq!(
        STANDARD.decode(data["config"].as_str().unwrap()).unwrap(),
        b"auth:\n  region: us-ashburn-1\n"
    );
    let r = send(&emu, Endpoint::Kube, get("nope", emu.provider_token())).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = send(&emu, Endpoint::Kube, get("oci-config", "bad")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

fn proxymux_req(emu: &EmulatorHandle, bearer: &str, body: &str) -> Request<client::Body> {
    Request::builder()
        .method("POST")
        .uri("/resourcePrincipalSessionTokens")
        .header("host", emu.addr(Endpoint::Proxymux).to_string())
        .header("authorization", format!("Bearer {bearer}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

fn pod_key_body(key: &RsaKeyPair) -> String {
    serde_json::json!({"podKey": pem("PUBLIC KEY", &spki_der(key))}).to_string()
}

/// Exchanges an SA token for an RPST, returning the raw RPST (without `ST$`).
async fn exchange(emu: &EmulatorHandle, sa_token: &str, session: &RsaKeyPair) -> String {
    let r = send(
        emu,
        Endpoint::Proxymux,
        proxymux_req(emu, sa_token, &pod_key_body(session)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let body = std::str::from_utf8(&r.body).unwrap();
    assert!(
        body.starts_with('"') && body.ends_with('"'),
        "quoted string: {body}"
    );
    let inner: serde_json::Value =
        serde_json::from_slice(&STANDARD.decode(&body[1..body.len() - 1]).unwrap()).unwrap();
    inner["token"]
        .as_str()
        .unwrap()
        .strip_prefix("ST$")
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn workload_identity_end_to_end() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let sa_token = emu
        .issue_service_account_token("app", "app-sa", Duration::from_secs(900), Some(("p", "u")))
        .unwrap();
    let session = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let rpst = exchange(&emu, &sa_token, &session).await;
    let claims = jwt_claims(&rpst);
    assert_eq!(
        claims["res_tenant"],
        "ocid1.tenancy.oc1..aaaaaaaaworkloadtenancy"
    );
    assert_eq!(claims["namespace"], "app");
    assert_eq!(claims["service_account"], "app-sa");
    assert!(claims["exp"].as_u64().unwrap() > claims["iat"].as_u64().unwrap());
    assert_eq!(emu.stats().proxymux_exchanges("app", "app-sa"), 1);

    let host = emu.addr(Endpoint::Secrets).to_string();
    let target = format!(
        "/20190301/secretbundles/actions/getByName?secretName=db-password&stage=CURRENT&vaultId={VAULT}"
    );
    let signed = |key: &RsaKeyPair, token: &str| {
        Unsigned::new("POST", &target, &host, emu.now()).sign(&format!("ST${token}"), key)
    };
    let r = send(&emu, Endpoint::Secrets, signed(&session, &rpst)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert!(matches!(
        emu.secrets_calls().last().unwrap().identity,
        Some(Principal::Workload { ref namespace, .. }) if namespace == "app"
    ));
    // The token is bound to the session key.
    let other = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let r = send(&emu, Endpoint::Secrets, signed(&other, &rpst)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // Another workload cannot read the secret.
    let other_sa = emu
        .issue_service_account_token("other", "other-sa", Duration::from_secs(900), None)
        .unwrap();
    let other_rpst = exchange(&emu, &other_sa, &session).await;
    let r = send(&emu, Endpoint::Secrets, signed(&session, &other_rpst)).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // Expired tokens are refused.
    emu.expire_all_tokens();
    let r = send(&emu, Endpoint::Secrets, signed(&session, &rpst)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = send(
        &emu,
        Endpoint::Proxymux,
        proxymux_req(&emu, &sa_token, &pod_key_body(&session)),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn rpst_expires_with_the_clock_and_revocation() {
    let (emu, clock) = start_at(SystemTime::now()).await;
    let sa_token = emu
        .issue_service_account_token("app", "app-sa", Duration::from_secs(3600), None)
        .unwrap();
    let session = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let rpst = exchange(&emu, &sa_token, &session).await;
    let host = emu.addr(Endpoint::Secrets).to_string();
    let path = format!("/20190301/secretbundles/{SECRET}");
    let req = |emu: &EmulatorHandle| {
        Unsigned::new("GET", &path, &host, emu.now()).sign(&format!("ST${rpst}"), &session)
    };
    clock.advance(Duration::from_secs(1199));
    assert_eq!(
        send(&emu, Endpoint::Secrets, req(&emu)).await.status,
        StatusCode::OK
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        send(&emu, Endpoint::Secrets, req(&emu)).await.status,
        StatusCode::UNAUTHORIZED
    );
    emu.revoke(Revoke::ServiceAccount {
        namespace: "app".into(),
        name: "app-sa".into(),
    });
    let r = send(
        &emu,
        Endpoint::Proxymux,
        proxymux_req(&emu, &sa_token, &pod_key_body(&session)),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn proxymux_rejects_bad_tokens_and_bodies() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let sa_token = emu
        .issue_service_account_token("app", "app-sa", Duration::from_secs(900), None)
        .unwrap();
    let session = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let cases = [
        ("not-a-jwt".to_owned(), pod_key_body(&session), 401),
        (sa_token.clone(), "{}".to_owned(), 400),
        (sa_token.clone(), "{\"podKey\":\"MIIB\"}".to_owned(), 400),
        (sa_token.clone(), "not json".to_owned(), 400),
    ];
    for (token, body, status) in cases {
        let r = send(&emu, Endpoint::Proxymux, proxymux_req(&emu, &token, &body)).await;
        assert_eq!(r.status.as_u16(), status, "{body}");
    }
    assert_eq!(emu.stats().total_proxymux_exchanges(), 0);
}

#[tokio::test]
async fn proxymux_gate_holds_replies_until_opened() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let sa_token = emu
        .issue_service_account_token("app", "app-sa", Duration::from_secs(900), None)
        .unwrap();
    emu.close_gate(Endpoint::Proxymux);
    let handle = emu.handle();
    let body = pod_key_body(&RsaKeyPair::generate(KeySize::Rsa2048).unwrap());
    let req = proxymux_req(&emu, &sa_token, &body);
    let task = tokio::spawn(async move { send(&handle, Endpoint::Proxymux, req).await });
    emu.wait_for(WAIT, |s| s.held(Endpoint::Proxymux) == 1)
        .await
        .unwrap();
    assert_eq!(emu.stats().total_proxymux_exchanges(), 0);
    emu.open_gate(Endpoint::Proxymux);
    assert_eq!(task.await.unwrap().status, StatusCode::OK);
    assert_eq!(emu.stats().total_proxymux_exchanges(), 1);
}

// --- instance principal --------------------------------------------------------------------

fn imds_get(path: &str) -> Request<client::Body> {
    Request::builder()
        .uri(path)
        .header("host", "169.254.169.254")
        .header("authorization", "Bearer Oracle")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test]
async fn imds_serves_region_and_identity_and_requires_the_oracle_header() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let r = send(&emu, Endpoint::Imds, imds_get("/opc/v2/instance/region")).await;
    assert_eq!(&r.body[..], b"us-ashburn-1");
    let r = send(
        &emu,
        Endpoint::Imds,
        imds_get("/opc/v2/instance/regionInfo"),
    )
    .await;
    assert_eq!(r.json()["regionIdentifier"], "us-ashburn-1");
    assert_eq!(r.json()["realmDomainComponent"], "oraclecloud.com");
    let cert = send(&emu, Endpoint::Imds, imds_get("/opc/v2/identity/cert.pem")).await;
    let cert = String::from_utf8(cert.body.to_vec()).unwrap();
    assert!(cert.starts_with("-----BEGIN CERTIFICATE-----\n") && !cert.contains('\r'));
    let der = pem_der(&cert);
    let needle = b"opc-tenant:ocid1.tenancy.oc1..aaaaaaaainstancetenancy";
    assert!(der.windows(needle.len()).any(|w| w == needle));
    let key = send(&emu, Endpoint::Imds, imds_get("/opc/v2/identity/key.pem")).await;
    assert!(RsaKeyPair::from_pkcs8(&pem_der(std::str::from_utf8(&key.body).unwrap())).is_ok());
    let inter = send(
        &emu,
        Endpoint::Imds,
        imds_get("/opc/v2/identity/intermediate.pem"),
    )
    .await;
    assert!(inter.body.starts_with(b"-----BEGIN CERTIFICATE-----"));
    let mut no_auth = imds_get("/opc/v2/instance/region");
    no_auth.headers_mut().remove("authorization");
    assert_eq!(
        send(&emu, Endpoint::Imds, no_auth).await.status,
        StatusCode::UNAUTHORIZED
    );
    let r = send(&emu, Endpoint::Imds, imds_get("/opc/v1/instance/region")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

fn strip_pem(pem: &str) -> String {
    pem.lines().filter(|l| !l.starts_with("-----")).collect()
}

fn federation_req(
    emu: &EmulatorHandle,
    form: &str,
    session: &RsaKeyPair,
    tamper: bool,
) -> Request<client::Body> {
    let cert_pem = emu.instance_cert_pem();
    let cert_der = pem_der(cert_pem);
    let fp = if form == "fed-x509" {
        colon_hex(digest::digest(&digest::SHA1_FOR_LEGACY_USE_ONLY, &cert_der).as_ref())
    } else {
        colon_hex(digest::digest(&digest::SHA256, &cert_der).as_ref())
    };
    let leaf = RsaKeyPair::from_pkcs8(&pem_der(emu.instance_key_pem())).unwrap();
    let body = serde_json::json!({
        "certificate": strip_pem(cert_pem),
        "intermediateCertificates": [strip_pem(cert_pem)],
        "publicKey": STANDARD.encode(spki_der(session)),
    });
    let mut u = Unsigned::new("POST", "/v1/x509", "", emu.now());
    u.body = body.to_string().into_bytes();
    u.headers = Some(vec![
        "date",
        "(request-target)",
        "content-length",
        "content-type",
        "x-content-sha256",
    ]);
    let key_id = format!("ocid1.tenancy.oc1..aaaaaaaainstancetenancy/{form}/{fp}");
    let signer = if tamper {
        RsaKeyPair::generate(KeySize::Rsa2048).unwrap()
    } else {
        leaf
    };
    let mut req = u.sign(&key_id, &signer);
    req.headers_mut().insert(
        "host",
        emu.addr(Endpoint::Auth).to_string().parse().unwrap(),
    );
    req
}

#[tokio::test]
async fn instance_principal_federation_end_to_end() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    for form in ["fed-x509", "fed-x509-sha256"] {
        let session = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
        let r = send(
            &emu,
            Endpoint::Auth,
            federation_req(&emu, form, &session, false),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{form}: {:?}", r.body);
        let token = r.json()["token"].as_str().unwrap().to_owned();
        let claims = jwt_claims(&token);
        assert!(claims["exp"].is_u64());
        let host = emu.addr(Endpoint::Secrets).to_string();
        let req = Unsigned::new(
            "GET",
            &format!("/20190301/secretbundles/{SECRET}"),
            &host,
            emu.now(),
        )
        .sign(&format!("ST${token}"), &session);
        let r = send(&emu, Endpoint::Secrets, req).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(matches!(
            emu.secrets_calls().last().unwrap().identity,
            Some(Principal::Instance { .. })
        ));
    }
    let session = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let r = send(
        &emu,
        Endpoint::Auth,
        federation_req(&emu, "fed-x509", &session, true),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let mut bad_fp = federation_req(&emu, "fed-x509", &session, false);
    let auth = bad_fp.headers()["authorization"]
        .to_str()
        .unwrap()
        .replace("fed-x509/", "fed-x509/00:");
    bad_fp
        .headers_mut()
        .insert("authorization", auth.parse().unwrap());
    assert_eq!(
        send(&emu, Endpoint::Auth, bad_fp).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(emu.stats().federations, 2);
    emu.revoke(Revoke::Instance(
        "ocid1.instance.oc1.iad.aaaaaaaaemulatedinstance".into(),
    ));
    let r = send(
        &emu,
        Endpoint::Auth,
        federation_req(&emu, "fed-x509", &session, false),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn emulator_shuts_down_its_listeners_on_drop() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let addr = emu.addr(Endpoint::Secrets);
    assert!(addr.ip().is_loopback());
    drop(emu);
    // The accept loop stops; new connections are refused once the runtime is gone.
    let mut refused = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused);
}

#[tokio::test]
async fn example_seed_file_parses_and_starts() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/seed.toml"))
        .unwrap();
    let seed: Seed = toml::from_str(&text).unwrap();
    assert_eq!(seed.secrets.len(), 2);
    assert_eq!(
        seed.secrets[1].versions[0].content.0,
        [0, 159, 146, 150, 240, 10, 255]
    );
    let emu = Emulator::start(seed, Arc::new(clock::SystemClock))
        .await
        .unwrap();
    let token = emu
        .issue_service_account_token("demo", "demo-app", Duration::from_secs(900), None)
        .unwrap();
    let session = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let rpst = exchange(&emu, &token, &session).await;
    let host = emu.addr(Endpoint::Secrets).to_string();
    let target = "/20190301/secretbundles/actions/getByName?secretName=tls-key&vaultId=ocid1.vault.oc1.iad.demo";
    let req = Unsigned::new("POST", target, &host, emu.now()).sign(&format!("ST${rpst}"), &session);
    let r = send(&emu, Endpoint::Secrets, req).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["secretBundleContent"]["content"], "AJ+SlvAK/w==");
}

#[tokio::test]
async fn secrets_over_http2_signs_the_authority_as_host() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let host = emu.addr(Endpoint::Secrets).to_string();
    let target =
        format!("/20190301/secretbundles/actions/getByName?secretName=db-password&vaultId={VAULT}");
    let mut conn = connect(&emu, Endpoint::Secrets, &[b"h2"]).await;
    assert!(conn.is_h2());
    // Over HTTP/2 the signed host comes from :authority.
    let u = Unsigned::new("POST", &format!("https://{host}{target}"), &host, emu.now());
    let mut signed = u.clone();
    signed.target = target.clone();
    let sig = client::rsa_sign(&vector_key(), signed.signing_string().as_bytes());
    let mut req = signed.build(&signed.authorization(&key_id(), &sig));
    *req.uri_mut() = format!("https://{host}{target}").parse().unwrap();
    req.headers_mut().remove("host");
    let r = conn.send(req).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
}

#[tokio::test]
async fn failed_tls_handshakes_are_counted_separately() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    // A client that trusts another CA aborts the handshake.
    let other = Emulator::start(Seed::default(), Arc::new(clock::SystemClock))
        .await
        .unwrap();
    let connector =
        tokio_rustls::TlsConnector::from(client::tls_config(other.ca_pem(), &[b"http/1.1"]));
    let tcp = tokio::net::TcpStream::connect(emu.addr(Endpoint::Auth))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    assert!(connector.connect(name, tcp).await.is_err());
    let s = emu
        .wait_for(WAIT, |s| {
            let l = s.listener(Endpoint::Auth);
            l.tls_handshake_failures == 1 && l.open == 0
        })
        .await
        .unwrap();
    assert_eq!(s.listener(Endpoint::Auth).tls_handshakes, 0);
    assert_eq!(s.listener(Endpoint::Auth).accepted, 1);
}

#[tokio::test]
async fn wait_for_times_out_with_the_last_counters() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let err = emu
        .wait_for(Duration::from_millis(50), |s| {
            s.arrived(Endpoint::Secrets) == 1
        })
        .await
        .unwrap_err();
    assert_eq!(err.1.arrived(Endpoint::Secrets), 0);
}

#[tokio::test]
async fn inconsistent_seeds_are_rejected() {
    let clock = Arc::new(clock::SystemClock);
    let bad_stage =
        Seed::default().secret(SecretSeed::new("s", "v", "n").version(1, "x", &["current"]));
    assert!(Emulator::start(bad_stage, clock.clone()).await.is_err());
    let duplicate = Seed::default().secret(
        SecretSeed::new("s", "v", "n")
            .version(1, "x", &["CURRENT"])
            .version(1, "y", &[]),
    );
    assert!(Emulator::start(duplicate, clock.clone()).await.is_err());
    let bad_key = Seed::default().user(UserSeed {
        tenancy: "t".into(),
        user: "u".into(),
        public_key_pem: "not a pem".into(),
    });
    assert!(Emulator::start(bad_key, clock).await.is_err());
}

// --- the service-account issuer -------------------------------------------------------------

fn issuer_get(emu: &EmulatorHandle, path: &str, bearer: Option<&str>) -> Request<client::Body> {
    let mut b = Request::builder()
        .uri(path)
        .header("host", emu.addr(Endpoint::Kube).to_string());
    if let Some(t) = bearer {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

fn jwt_header(jwt: &str) -> serde_json::Value {
    let header = jwt.split('.').next().unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap()
}

/// Whether `jwt`'s RS256 signature verifies with the key the JWKS publishes under its kid.
fn verifies_with(jwks: &serde_json::Value, jwt: &str) -> bool {
    let kid = jwt_header(jwt)["kid"].as_str().unwrap().to_owned();
    let Some(key) = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid.as_str())
    else {
        return false;
    };
    let part = |name: &str| URL_SAFE_NO_PAD.decode(key[name].as_str().unwrap()).unwrap();
    let (input, signature) = jwt.rsplit_once('.').unwrap();
    let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
        return false;
    };
    aws_lc_rs::signature::RsaPublicKeyComponents {
        n: part("n"),
        e: part("e"),
    }
    .verify(
        &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
        input.as_bytes(),
        &signature,
    )
    .is_ok()
}

async fn jwks_of(emu: &EmulatorHandle) -> serde_json::Value {
    let r = send(
        emu,
        Endpoint::Kube,
        issuer_get(emu, "/openid/v1/jwks", Some(emu.provider_token())),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    r.json()
}

#[tokio::test]
async fn the_kube_endpoint_serves_the_issuer_and_the_keys_that_verify_its_tokens() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    // Like every Kubernetes call: the provider's bearer token is required.
    for path in ["/.well-known/openid-configuration", "/openid/v1/jwks"] {
        let r = send(&emu, Endpoint::Kube, issuer_get(&emu, path, None)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    let r = send(
        &emu,
        Endpoint::Kube,
        issuer_get(
            &emu,
            "/.well-known/openid-configuration",
            Some(emu.provider_token()),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let discovery = r.json();
    // The issuer its tokens carry, which is not the URL the endpoint is served at.
    assert_eq!(discovery["issuer"], SERVICE_ACCOUNT_ISSUER);
    assert_ne!(discovery["issuer"], emu.url(Endpoint::Kube).as_str());
    let jwks = jwks_of(&emu).await;
    let token = emu
        .issue_service_account_token("app", "app-sa", Duration::from_secs(900), None)
        .unwrap();
    assert_eq!(jwt_claims(&token)["iss"], SERVICE_ACCOUNT_ISSUER);
    assert!(verifies_with(&jwks, &token));
    let stats = emu.stats();
    assert_eq!(
        (stats.issuer_discovery_requests, stats.jwks_requests),
        (2, 2)
    );
}

#[tokio::test]
async fn forged_tokens_are_minted_to_order_and_only_genuine_ones_pass_the_proxymux() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let jwks = jwks_of(&emu).await;
    let issuer_kid = jwks["keys"][0]["kid"].as_str().unwrap().to_owned();
    let spec = || TokenSpec::new("app", "app-sa").bound_to("p", "u");
    let genuine = emu.mint_service_account_token(&spec()).unwrap();
    assert!(verifies_with(&jwks, &genuine));
    let same_kid = emu
        .mint_service_account_token(&spec().signed_by(Signer::OtherKeySameKid))
        .unwrap();
    assert_eq!(jwt_header(&same_kid)["kid"], issuer_kid.as_str());
    assert!(!verifies_with(&jwks, &same_kid));
    let other_kid = emu
        .mint_service_account_token(&spec().signed_by(Signer::OtherKey))
        .unwrap();
    assert_ne!(jwt_header(&other_kid)["kid"], issuer_kid.as_str());
    let unsigned = emu
        .mint_service_account_token(&spec().signed_by(Signer::Unsigned))
        .unwrap();
    assert!(unsigned.ends_with(".AAAA") && !verifies_with(&jwks, &unsigned));
    let audience = emu
        .mint_service_account_token(&spec().audiences(&["other"]))
        .unwrap();
    assert_eq!(jwt_claims(&audience)["aud"], serde_json::json!(["other"]));
    let issuer = emu
        .mint_service_account_token(&spec().issuer("https://elsewhere"))
        .unwrap();
    assert_eq!(jwt_claims(&issuer)["iss"], "https://elsewhere");
    let hour_ago = emu.now() - Duration::from_secs(7200);
    let expired = emu
        .mint_service_account_token(&spec().issued_at(hour_ago))
        .unwrap();
    assert!(verifies_with(&jwks, &expired));
    let now = emu.now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert!(jwt_claims(&expired)["exp"].as_u64().unwrap() < now);
    let uid = emu
        .mint_service_account_token(&spec().signed_by(Signer::OtherKey).uid("another"))
        .unwrap();
    assert_eq!(
        jwt_claims(&uid)["kubernetes.io"]["serviceaccount"]["uid"],
        "another"
    );
    let session = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    exchange(&emu, &genuine, &session).await;
    for forged in [same_kid, other_kid, unsigned, expired, uid] {
        let r = send(
            &emu,
            Endpoint::Proxymux,
            proxymux_req(&emu, &forged, &pod_key_body(&session)),
        )
        .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
}

#[tokio::test]
async fn issuer_faults_and_key_rotation_apply_to_the_issuer_documents_alone() {
    let (emu, _c) = start_at(SystemTime::now()).await;
    let before = emu
        .issue_service_account_token("app", "app-sa", Duration::from_secs(900), None)
        .unwrap();
    emu.script_issuer([Fault::Status(403)]);
    emu.set_issuer_fault(Some(Fault::Status(404)));
    let r = send(
        &emu,
        Endpoint::Kube,
        issuer_get(&emu, "/openid/v1/jwks", Some(emu.provider_token())),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = send(
        &emu,
        Endpoint::Kube,
        issuer_get(
            &emu,
            "/.well-known/openid-configuration",
            Some(emu.provider_token()),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // The rest of the Kubernetes API is untouched.
    let r = send(
        &emu,
        Endpoint::Kube,
        token_request(&emu, "app", "app-sa", Some(emu.provider_token())),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    emu.set_issuer_fault(None);
    // A rotation: new tokens name the new key, and both keys are published.
    emu.rotate_issuer_key().unwrap();
    let after = emu
        .issue_service_account_token("app", "app-sa", Duration::from_secs(900), None)
        .unwrap();
    assert_ne!(jwt_header(&before)["kid"], jwt_header(&after)["kid"]);
    let jwks = jwks_of(&emu).await;
    assert_eq!(jwks["keys"].as_array().unwrap().len(), 2);
    assert!(verifies_with(&jwks, &before) && verifies_with(&jwks, &after));
    let session = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    exchange(&emu, &before, &session).await;
    exchange(&emu, &after, &session).await;
    let stats = emu.stats();
    assert_eq!(
        (stats.issuer_discovery_requests, stats.jwks_requests),
        (1, 2)
    );
}
