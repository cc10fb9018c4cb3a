//! Property tests over the parsers of upstream input in this crate: SecretBundle bodies and
//! `Retry-After`-driven delays never panic and end in a typed result. `cargo xtask fuzz`
//! runs them longer (`PROPTEST_CASES`).

use std::time::Duration;

use proptest::prelude::*;

use crate::RetryPolicy;
use crate::bundle;

const SAMPLE: &str = r#"{"secretId":"ocid1.vaultsecret.oc1..a","versionNumber":3,"versionName":"v3","stages":["CURRENT","LATEST"],"timeCreated":"2026-01-01T00:00:00Z","secretBundleContent":{"contentType":"BASE64","content":"c2VjcmV0"}}"#;

proptest! {
    #![proptest_config(ProptestConfig::default())] // 256 cases, or PROPTEST_CASES

    #[test]
    fn fuzz_secret_bundles(body in proptest::collection::vec(any::<u8>(), 0..400),
                           edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..10)) {
        let _ = bundle::parse(&body, None);
        let mut mutated = SAMPLE.as_bytes().to_vec();
        for (at, value) in edits {
            let i = at.index(mutated.len());
            mutated[i] = value;
        }
        if let Err(e) = bundle::parse(&mutated, Some("rid".into())) {
            // The message never quotes the body (it may hold the secret).
            prop_assert!(!e.to_string().contains("c2VjcmV0"));
        }
    }

    #[test]
    fn fuzz_certificate_files(text in ".{0,400}", edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..10)) {
        let _ = crate::TlsFiles::new(&text, Some(&text), None);
        let _ = crate::TlsFiles::ca_only(&text, "caBundlePem");
        // Mutations of a real certificate's DER reach x509-cert's parser and the ordering.
        let (pem, der) = sample_certificate();
        let mut der = der.to_vec();
        for (at, value) in edits {
            let i = at.index(der.len());
            der[i] = value;
        }
        let mutated = pem_rfc7468::encode_string("CERTIFICATE", pem_rfc7468::LineEnding::LF, &der).unwrap_or_default();
        let chain = format!("{mutated}{pem}");
        let _ = crate::TlsFiles::new(&mutated, Some(&chain), None);
        let _ = crate::TlsFiles::new(pem, Some(&chain), None);
        let _ = crate::TlsFiles::ca_only(&chain, "caBundlePem");
    }

    #[test]
    fn fuzz_retry_delays(failed in any::<u32>(), retry_after in any::<u64>(), random in any::<f64>()) {
        let policy = RetryPolicy::default();
        let delay = policy.delay(failed, Some(Duration::from_secs(retry_after)), random);
        prop_assert!(delay >= Duration::from_secs(retry_after));
        let _ = policy.delay(failed, None, random);
    }
}

/// A self-signed certificate, PEM and DER, made once.
fn sample_certificate() -> (&'static str, &'static [u8]) {
    static SAMPLE: std::sync::OnceLock<(String, Vec<u8>)> = std::sync::OnceLock::new();
    let (pem, der) = SAMPLE.get_or_init(|| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["fuzz.example.com".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), cert.der().to_vec())
    });
    (pem, der)
}

#[test]
fn the_sample_certificate_is_valid() {
    let (pem, _) = sample_certificate();
    assert!(crate::TlsFiles::new(pem, None, None).is_ok());
}

#[test]
fn the_sample_bundle_is_valid() {
    assert!(bundle::parse(SAMPLE.as_bytes(), None).is_ok());
}
