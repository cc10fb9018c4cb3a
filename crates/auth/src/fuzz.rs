//! Property tests over every parser of tenant or upstream input in this crate: arbitrary
//! bytes and mutations of valid samples never panic and always end in a typed error or a
//! value. `cargo xtask fuzz` runs them longer (`PROPTEST_CASES`).

use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use proptest::prelude::*;

use crate::PrivateKey;
use crate::jwt;

fn data(file: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file);
    std::fs::read(path).unwrap()
}

fn jwt_of(payload: &str) -> String {
    format!(
        "{}.{}.sig",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","kid":"k"}"#),
        URL_SAFE_NO_PAD.encode(payload)
    )
}

/// Flips, inserts and removes bytes of `sample` as `edits` say.
fn mutate(sample: &[u8], edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    let mut out = sample.to_vec();
    for (at, value, op) in edits {
        if out.is_empty() {
            out.push(*value);
            continue;
        }
        let i = at.index(out.len());
        match op % 3 {
            0 => out[i] = *value,
            1 => out.insert(i, *value),
            _ => {
                out.remove(i);
            }
        }
    }
    out
}

fn edits() -> impl Strategy<Value = Vec<(prop::sample::Index, u8, u8)>> {
    proptest::collection::vec(
        (any::<prop::sample::Index>(), any::<u8>(), any::<u8>()),
        1..12,
    )
}

const SAMPLE_DISCOVERY: &str = r#"{"issuer":"https://kubernetes.default.svc","jwks_uri":"https://10.0.0.1:6443/openid/v1/jwks","response_types_supported":["id_token"]}"#;

/// A JWKS with one RSA key (a 2048-bit modulus) and one P-256 key.
const SAMPLE_JWKS: &str = r#"{"keys":[{"use":"sig","kty":"RSA","kid":"r","alg":"RS256","n":"0zQ34yYniTDGSEuhySc7Ujyg0X08y6TeX_LbKaFXEik57Ze8XQud3ONKuuGKZ_KU5ez7KIqV2LsjdEnVTfcnmFBdOiW3aGMI8tt0dWW2PXLocrbCcz7vePN6XwZvAstEv7UJ2mMRek6jQMrq2kUhj0lq1eVTZj1cQeICsLjtYUznKAZi56415PaQTL_c5pwdetBbiMhn9tK_pCig6PhT74hJUTyyYG7bqvPQ_H2jiRJi_pYa6tJNL37v4VFrFbU5bg1bIU2PtuvcQsHbx3HsjMTVZD0knQ94aW3x7TP1atwFSyorxCzNGeTJ7g3cNVabbuDZkSznCOW6GPIDQx8LtQ","e":"AQAB"},{"kty":"EC","crv":"P-256","kid":"e","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;

const SAMPLE_CLAIMS: &str = r#"{"exp":1700000000,"iat":1699990000,"kubernetes.io":{"namespace":"app","serviceaccount":{"name":"web","uid":"u-1"},"pod":{"name":"p","uid":"pu"}},"res_tenant":"t"}"#;

proptest! {
    #![proptest_config(ProptestConfig::default())] // 256 cases, or PROPTEST_CASES

    #[test]
    fn fuzz_jwt_claims_and_exp(text in ".{0,300}", edits in edits(), exp in any::<f64>()) {
        if let Ok(claims) = jwt::claims(&text) {
            let _ = jwt::exp(&claims);
        }
        let token = String::from_utf8_lossy(&mutate(jwt_of(SAMPLE_CLAIMS).as_bytes(), &edits)).into_owned();
        if let Ok(claims) = jwt::claims(&token) {
            let _ = jwt::exp(&claims);
            let _ = jwt::string_at(&claims, &["kubernetes.io", "serviceaccount", "uid"]);
        }
        let claims = jwt::claims(&jwt_of(&format!(r#"{{"exp":{exp:?}}}"#)));
        if let Ok(claims) = claims {
            let _ = jwt::exp(&claims);
        }
    }

    #[test]
    fn fuzz_the_mounts_service_account_token(edits in edits(), exp in any::<i64>()) {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let payload = SAMPLE_CLAIMS.replace("1700000000", &exp.to_string());
        for token in [jwt_of(&payload), String::from_utf8_lossy(&mutate(jwt_of(SAMPLE_CLAIMS).as_bytes(), &edits)).into_owned()] {
            let token = secrecy::SecretString::from(token);
            let _ = crate::principals::fuzz_check_token(&token, "app", "web", now);
        }
    }

    #[test]
    fn fuzz_the_proxymux_reply(body in proptest::collection::vec(any::<u8>(), 0..400), edits in edits()) {
        let _ = crate::principals::fuzz_proxymux_reply(&body);
        let valid = format!(
            "\"{}\"",
            STANDARD.encode(format!(r#"{{"token":"ST${}"}}"#, jwt_of(SAMPLE_CLAIMS)))
        );
        let _ = crate::principals::fuzz_proxymux_reply(&mutate(valid.as_bytes(), &edits));
    }

    #[test]
    fn fuzz_private_keys(bytes in proptest::collection::vec(any::<u8>(), 0..600), edits in edits(), which in 0..6usize) {
        let _ = PrivateKey::from_pem(&bytes, None);
        let sample = data(["rsa-pkcs1.pem", "rsa-pkcs8.pem", "rsa-pkcs8-encrypted.pem", "rsa-legacy-aes128.pem", "ec-p256-pkcs8.pem", "rsa-public.pem"][which]);
        let mutated = mutate(&sample, &edits);
        let _ = PrivateKey::from_pem(&mutated, None);
        let _ = PrivateKey::from_pem(&mutated, Some(b"wrong"));
        // Mutations inside the Base64 body reach the DER and PKCS#8 parsers.
        let text = String::from_utf8_lossy(&sample).into_owned();
        let body: String = text.lines().filter(|l| !l.starts_with("-----") && !l.contains(':')).collect();
        if let Ok(der) = STANDARD.decode(body) {
            let der = mutate(&der, &edits);
            let label = text.lines().next().unwrap_or("").trim_start_matches("-----BEGIN ").trim_end_matches("-----").to_owned();
            let pem = format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", STANDARD.encode(der));
            let _ = PrivateKey::from_pem(pem.as_bytes(), Some(b"wrong"));
        }
    }

    #[test]
    fn fuzz_certificate_keys(bytes in proptest::collection::vec(any::<u8>(), 0..600), edits in edits(), which in 0..5usize) {
        use crate::tenant_keys::CertificateKey;
        let _ = CertificateKey::decode(&bytes, None);
        let sample = data(["rsa-pkcs1.pem", "rsa-pkcs8.pem", "rsa-pkcs8-encrypted.pem", "ec-p256-pkcs8.pem", "rsa-legacy-aes128.pem"][which]);
        let mutated = mutate(&sample, &edits);
        let _ = CertificateKey::decode(&mutated, Some(b"wrong"));
        // Mutations of the DER reach the PKCS#8, SEC1 and PBES2 parsers (and the KDF limits).
        let text = String::from_utf8_lossy(&sample).into_owned();
        let body: String = text.lines().filter(|l| !l.starts_with("-----") && !l.contains(':')).collect();
        if let Ok(der) = STANDARD.decode(body) {
            let der = mutate(&der, &edits);
            for label in ["PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"] {
                let pem = format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", STANDARD.encode(&der));
                if let Err(e) = CertificateKey::decode(pem.as_bytes(), Some(b"a passphrase")) {
                    prop_assert!(!e.to_string().contains("a passphrase"));
                }
            }
        }
    }

    #[test]
    fn fuzz_the_issuers_documents(body in proptest::collection::vec(any::<u8>(), 0..400), edits in edits(), which in 0..2usize) {
        crate::issuer::fuzz_documents(&body);
        let sample = [SAMPLE_DISCOVERY, SAMPLE_JWKS][which];
        crate::issuer::fuzz_documents(&mutate(sample.as_bytes(), &edits));
    }

    #[test]
    fn fuzz_the_jws_header_and_signature(text in ".{0,300}", edits in edits()) {
        crate::issuer::fuzz_jws(&text);
        let token = String::from_utf8_lossy(&mutate(jwt_of(SAMPLE_CLAIMS).as_bytes(), &edits)).into_owned();
        crate::issuer::fuzz_jws(&token);
    }

    #[test]
    fn fuzz_the_identity_domains_answers(body in proptest::collection::vec(any::<u8>(), 0..400), edits in edits(), status in 100u16..600) {
        let now = UNIX_EPOCH + Duration::from_secs(1_699_990_000);
        let _ = crate::principals::fuzz_exchange_answer(&body, now);
        let answer = format!(r#"{{"token":"{}","expires_in":3600}}"#, jwt_of(SAMPLE_CLAIMS));
        let _ = crate::principals::fuzz_exchange_answer(&mutate(answer.as_bytes(), &edits), now);
        // However the domain words its refusal, nothing sent comes back in the message.
        let token = jwt_of(SAMPLE_CLAIMS);
        let sent = [token.as_str(), "client-s3cret"];
        for body in [body, mutate(refusal_echoing(&token).as_bytes(), &edits)] {
            let message = crate::principals::fuzz_exchange_refusal(status, &body, &sent);
            prop_assert!(!message.contains("client-s3cret"), "{message}");
            for part in token.split('.').filter(|p| p.len() >= 8) {
                prop_assert!(!message.contains(part), "{message}");
            }
        }
    }

    #[test]
    fn fuzz_the_instance_certificate_subject(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = crate::principals::fuzz_tenancy(&bytes);
    }
}

/// An OAuth error body whose description repeats the subject token and the client secret.
fn refusal_echoing(token: &str) -> String {
    format!(
        r#"{{"error":"invalid_grant","error_description":"bad token {token} for client-s3cret"}}"#
    )
}

#[test]
fn the_samples_are_valid_so_mutations_start_from_real_input() {
    let now = UNIX_EPOCH + Duration::from_secs(1_699_990_000);
    let answer = format!(
        r#"{{"token":"{}","expires_in":3600}}"#,
        jwt_of(SAMPLE_CLAIMS)
    );
    assert!(crate::principals::fuzz_exchange_answer(answer.as_bytes(), now).is_ok());
    let message = crate::principals::fuzz_exchange_refusal(
        400,
        br#"{"error":"invalid_grant","error_description":"audience: no match"}"#,
        &[],
    );
    assert!(
        message.contains("invalid_grant: \"audience: no match\""),
        "{message}"
    );
    let claims = jwt::claims(&jwt_of(SAMPLE_CLAIMS)).unwrap();
    assert!(jwt::exp(&claims).is_ok());
    let valid = format!(
        "\"{}\"",
        STANDARD.encode(format!(r#"{{"token":"ST${}"}}"#, jwt_of(SAMPLE_CLAIMS)))
    );
    assert!(crate::principals::fuzz_proxymux_reply(valid.as_bytes()).is_ok());
    assert!(PrivateKey::from_pem(&data("rsa-pkcs1.pem"), None).is_ok());
    assert!(crate::issuer::fuzz_documents_are_valid(
        SAMPLE_DISCOVERY.as_bytes(),
        SAMPLE_JWKS.as_bytes()
    ));
}
