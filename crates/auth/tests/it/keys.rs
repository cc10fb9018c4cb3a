//! Private-key loading in every accepted PEM form, and what must never leak from a key.

use aws_lc_rs::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use oci_csi_auth::{KeyError, KeyId, PrivateKey, SigningKey};

use crate::{PASSPHRASE, SPEC_KEY, fixture};

/// DER of the fixtures' public key, as `openssl rsa -pubout` wrote it.
fn expected_spki() -> Vec<u8> {
    let pem = String::from_utf8(fixture("rsa-public.pem")).unwrap();
    let b64: String = pem
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    STANDARD.decode(b64).unwrap()
}

fn load(name: &str, passphrase: Option<&[u8]>) -> Result<PrivateKey, KeyError> {
    PrivateKey::from_pem(&fixture(name), passphrase)
}

const ENCRYPTED: [&str; 6] = [
    "rsa-pkcs8-encrypted.pem",
    "rsa-legacy-aes128.pem",
    "rsa-legacy-aes192.pem",
    "rsa-legacy-aes256.pem",
    "rsa-legacy-des3.pem",
    "rsa-legacy-des.pem",
];

#[test]
fn every_accepted_encoding_loads_the_same_key() {
    let plain = [("rsa-pkcs1.pem", None), ("rsa-pkcs8.pem", None)];
    let encrypted = ENCRYPTED.map(|name| (name, Some(PASSPHRASE)));
    let expected_fingerprint = String::from_utf8(fixture("rsa-fingerprint.txt")).unwrap();
    for (name, passphrase) in plain.into_iter().chain(encrypted) {
        let key = load(name, passphrase).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(key.public_key_spki_der(), expected_spki(), "{name}");
        assert_eq!(key.fingerprint(), expected_fingerprint.trim(), "{name}");
        assert_eq!(key.bits(), 2048, "{name}");
    }
}

#[test]
fn legacy_pem_headers_name_the_cipher_the_test_expects() {
    // Guards the fixtures: each legacy file really uses the cipher in its name.
    for (name, cipher) in [
        ("rsa-legacy-aes128.pem", "DEK-Info: AES-128-CBC,"),
        ("rsa-legacy-aes192.pem", "DEK-Info: AES-192-CBC,"),
        ("rsa-legacy-aes256.pem", "DEK-Info: AES-256-CBC,"),
        ("rsa-legacy-des3.pem", "DEK-Info: DES-EDE3-CBC,"),
        ("rsa-legacy-des.pem", "DEK-Info: DES-CBC,"),
    ] {
        let text = String::from_utf8(fixture(name)).unwrap();
        assert!(text.contains("Proc-Type: 4,ENCRYPTED"), "{name}");
        assert!(text.contains(cipher), "{name}");
    }
}

#[test]
fn wrong_passphrase_fails_clearly_for_every_encryption() {
    for name in ENCRYPTED {
        let err = load(name, Some(b"not the passphrase")).err();
        assert!(
            matches!(err, Some(KeyError::WrongPassphrase)),
            "{name}: {err:?}"
        );
        let message = err.map(|err| err.to_string()).unwrap_or_default();
        assert_eq!(
            message,
            "cannot decrypt the private key: wrong passphrase or corrupt key"
        );
    }
}

#[test]
fn encrypted_key_without_passphrase_asks_for_one() {
    for name in ENCRYPTED {
        for passphrase in [None, Some(&b""[..])] {
            let err = load(name, passphrase).err();
            assert!(
                matches!(err, Some(KeyError::PassphraseRequired)),
                "{name}: {err:?}"
            );
        }
    }
}

#[test]
fn passphrase_is_ignored_for_unencrypted_keys() {
    assert!(load("rsa-pkcs1.pem", Some(b"whatever")).is_ok());
}

#[test]
fn non_rsa_keys_are_rejected() {
    for (name, algorithm) in [
        ("ec-p256-pkcs8.pem", "EC"),
        ("ec-p256-sec1.pem", "EC"),
        ("ed25519.pem", "Ed25519"),
    ] {
        match load(name, None) {
            Err(KeyError::NotRsa(found)) => assert_eq!(found, algorithm, "{name}"),
            other => panic!("{name}: expected NotRsa, got {other:?}"),
        }
    }
    let message = load("ec-p256-pkcs8.pem", None).err().unwrap().to_string();
    assert_eq!(
        message,
        "unsupported key algorithm EC: only RSA keys can sign OCI requests"
    );
}

#[test]
fn only_the_first_pem_block_is_used() {
    // A key followed by anything else loads.
    let mut data = fixture("rsa-pkcs1.pem");
    data.extend_from_slice(&fixture("ec-p256-pkcs8.pem"));
    assert!(PrivateKey::from_pem(&data, None).is_ok());
    // Anything followed by a key does not: the key is never looked at.
    let mut data = fixture("rsa-public.pem");
    data.extend_from_slice(&fixture("rsa-pkcs1.pem"));
    match PrivateKey::from_pem(&data, None) {
        Err(KeyError::Unparseable { label }) => assert_eq!(label, "PUBLIC KEY"),
        other => panic!("expected Unparseable, got {other:?}"),
    }
}

#[test]
fn text_without_a_pem_block_is_reported() {
    let err = PrivateKey::from_pem(b"not a key", None).err().unwrap();
    assert!(matches!(err, KeyError::NoPem));
    assert_eq!(
        err.to_string(),
        "PEM data was not found in the private key data"
    );
}

#[test]
fn unknown_legacy_cipher_is_named_in_the_error() {
    let text = String::from_utf8(fixture("rsa-legacy-aes128.pem"))
        .unwrap()
        .replace("AES-128-CBC", "CAMELLIA-128-CBC");
    match PrivateKey::from_pem(text.as_bytes(), Some(PASSPHRASE)) {
        Err(KeyError::UnsupportedEncryption(name)) => assert_eq!(name, "CAMELLIA-128-CBC"),
        other => panic!("expected UnsupportedEncryption, got {other:?}"),
    }
}

#[test]
fn truncated_ciphertext_is_a_decryption_failure_not_a_panic() {
    let text = String::from_utf8(fixture("rsa-legacy-aes256.pem")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    // Drop one Base64 line from the middle: the length is no longer a block multiple
    // or the padding is wrong, either way a decryption failure.
    lines.remove(6);
    let cut = lines.join("\n");
    let err = PrivateKey::from_pem(cut.as_bytes(), Some(PASSPHRASE)).err();
    assert!(
        matches!(
            err,
            Some(KeyError::WrongPassphrase | KeyError::MalformedPem(_))
        ),
        "{err:?}"
    );
}

#[test]
fn errors_never_contain_the_passphrase_or_key_bytes() {
    let secret = b"hunter2-very-secret";
    let pem = fixture("rsa-legacy-aes256.pem");
    let body_line = String::from_utf8(pem.clone())
        .unwrap()
        .lines()
        .nth(4)
        .unwrap()
        .to_owned();
    let err = PrivateKey::from_pem(&pem, Some(secret)).err().unwrap();
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains(&body_line), "{text}");
    }
}

#[test]
fn public_key_pem_is_what_openssl_writes() {
    let key = load("rsa-pkcs1.pem", None).unwrap();
    let pem = key.public_key_pem();
    assert_eq!(pem.as_bytes(), fixture("rsa-public.pem"));
    assert!(pem.ends_with("-----END PUBLIC KEY-----\n"));
    assert!(pem.lines().all(|line| line.len() <= 64));
    assert_eq!(
        STANDARD.decode(key.public_key_base64()).unwrap(),
        key.public_key_spki_der()
    );
}

#[test]
fn generated_session_key_signs_verifiably() {
    let key = PrivateKey::generate_rsa_2048().unwrap();
    assert_eq!(key.bits(), 2048);
    let signature = key.sign_pkcs1_sha256(b"message").unwrap();
    assert_eq!(signature.len(), 256);
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, key.public_key_spki_der())
        .verify(b"message", &signature)
        .unwrap();
    // Another key's public half does not verify it.
    let other = PrivateKey::generate_rsa_2048().unwrap();
    assert!(
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, other.public_key_spki_der())
            .verify(b"message", &signature)
            .is_err()
    );
}

#[test]
fn debug_output_of_keys_holds_no_key_material() {
    let key = std::sync::Arc::new(PrivateKey::from_pem(SPEC_KEY.as_bytes(), None).unwrap());
    let token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzZWNyZXQifQ.c2lnbmF0dXJl";
    let signing_key = SigningKey::new(KeyId::security_token(token), key.clone());
    let debug = format!("{key:?} {signing_key:?} {signing_key:#?}");
    // No line of the private key's Base64, no part of the public modulus, no token.
    for line in SPEC_KEY.lines().filter(|line| !line.starts_with("-----")) {
        assert!(!debug.contains(line), "{debug}");
        assert!(!debug.contains(&line[..16]), "{debug}");
    }
    let spki_b64 = STANDARD.encode(key.public_key_spki_der());
    assert!(!debug.contains(&spki_b64[40..60]), "{debug}");
    assert!(!debug.contains(token), "{debug}");
    assert!(!debug.contains("eyJ"), "{debug}");
    assert!(debug.contains("52:27:47:a7:f2:d3:5f:7f:1b:56:30:21:2a:7a:ef:8f"));
    assert!(debug.contains("ST$<redacted>"));
}

#[test]
fn rsa_keys_below_2048_bits_are_rejected_with_a_reason() {
    match load("rsa-1024-pkcs1.pem", None) {
        Err(err @ KeyError::Rejected(_)) => {
            assert_eq!(err.to_string(), "the RSA private key was rejected");
            assert!(std::error::Error::source(&err).is_some());
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
}

#[test]
fn encrypted_pkcs8_with_excessive_kdf_cost_is_refused_before_deriving() {
    // 2 000 000 PBKDF2 rounds: refused without spending the CPU time.
    match load("rsa-pkcs8-encrypted-2m-iterations.pem", Some(PASSPHRASE)) {
        Err(KeyError::EncryptionTooExpensive(reason)) => {
            assert!(reason.contains("2000000"), "{reason}");
        }
        other => panic!("expected EncryptionTooExpensive, got {other:?}"),
    }
}
