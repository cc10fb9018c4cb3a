//! The issuer's discovery document and key set (RFC 7517) as the API server serves them.
//! Upstream input, read within bounds: the body is already limited by the transport (and
//! the issuer module's per-document limit); here the issuer's length, the number of keys,
//! the key id's length and the key sizes.

use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED, ParsedPublicKey, RSA_PKCS1_2048_8192_SHA256, RsaPublicKeyComponents,
};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

/// A signature algorithm this provider verifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Alg {
    /// RSASSA-PKCS1-v1_5 with SHA-256, keys of 2048 to 8192 bits.
    Rs256,
    /// ECDSA on P-256 with SHA-256, the signature as `r || s`.
    Es256,
}

/// The most keys a key set may list (Kubernetes publishes one per signing or verifying key
/// file; a handful).
pub(super) const MAX_KEYS: usize = 64;
/// What one parsed key is counted at by the cache's byte bound.
pub(super) const KEY_BYTES: usize = 1536;
const MAX_ISSUER_BYTES: usize = 1024;
const MAX_KID_BYTES: usize = 256;
/// RSA moduli from 2048 to 8192 bits, as RS256 verification accepts.
const RSA_MODULUS_BYTES: std::ops::RangeInclusive<usize> = 256..=1024;

/// A public key of the issuer.
#[derive(Clone)]
pub(crate) struct Key {
    kid: Option<String>,
    alg: Alg,
    public: ParsedPublicKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

impl Key {
    pub(super) fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    pub(super) fn alg(&self) -> Alg {
        self.alg
    }

    pub(super) fn public(&self) -> &ParsedPublicKey {
        &self.public
    }
}

/// The `issuer` of a discovery document.
pub(super) fn issuer(body: &[u8]) -> Result<String, String> {
    #[derive(Deserialize)]
    struct Discovery {
        issuer: String,
    }
    let parsed: Discovery = bounded::json::from_slice(body, &bounded::ParseBudget::new(body.len()))
        .map_err(position)?;
    if parsed.issuer.is_empty() || parsed.issuer.len() > MAX_ISSUER_BYTES {
        return Err(format!(
            "its issuer is empty or longer than {MAX_ISSUER_BYTES} bytes"
        ));
    }
    Ok(parsed.issuer)
}

#[derive(Deserialize)]
struct KeySet {
    keys: Vec<Jwk>,
}

/// The members of a JWK this reader uses; others are ignored.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

/// The RS256 and ES256 signing keys of a key set. Keys of other types, curves, sizes or
/// uses are skipped; a set with none left, or with more than [`MAX_KEYS`], is an error.
pub(super) fn keys(body: &[u8]) -> Result<Vec<Key>, String> {
    let set: KeySet = bounded::json::from_slice(body, &bounded::ParseBudget::new(body.len()))
        .map_err(position)?;
    if set.keys.len() > MAX_KEYS {
        return Err(format!(
            "it lists {} keys, more than {MAX_KEYS}",
            set.keys.len()
        ));
    }
    let keys: Vec<Key> = set.keys.iter().filter_map(key).collect();
    if keys.is_empty() {
        return Err("it lists no RS256 or ES256 signing key".into());
    }
    Ok(keys)
}

fn position(e: bounded::ParseError) -> String {
    match e.position() {
        Some((line, column)) => format!("not the expected json at line {line} column {column}"),
        None => format!("not the expected json: {e}"),
    }
}

/// One key, or `None` when this provider does not verify with it.
fn key(jwk: &Jwk) -> Option<Key> {
    if jwk.usage.as_deref().is_some_and(|u| u != "sig")
        || jwk.kid.as_ref().is_some_and(|k| k.len() > MAX_KID_BYTES)
    {
        return None;
    }
    let (alg, public) = match (jwk.kty.as_str(), jwk.alg.as_deref()) {
        ("RSA", None | Some("RS256")) => (Alg::Rs256, rsa(jwk)?),
        ("EC", None | Some("ES256")) => (Alg::Es256, p256(jwk)?),
        _ => return None,
    };
    Some(Key {
        kid: jwk.kid.clone(),
        alg,
        public,
    })
}

fn decode(value: Option<&String>) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(value?.trim_end_matches('=')).ok()
}

fn rsa(jwk: &Jwk) -> Option<ParsedPublicKey> {
    let n = decode(jwk.n.as_ref())?;
    let e = decode(jwk.e.as_ref())?;
    // Big-endian without leading zeros, as the key components must be.
    let n = &n[n.iter().position(|b| *b != 0)?..];
    let e = &e[e.iter().position(|b| *b != 0)?..];
    if !RSA_MODULUS_BYTES.contains(&n.len()) || e.len() > 8 {
        return None;
    }
    RsaPublicKeyComponents { n, e }
        .to_parsed_public_key(&RSA_PKCS1_2048_8192_SHA256)
        .ok()
}

fn p256(jwk: &Jwk) -> Option<ParsedPublicKey> {
    if jwk.crv.as_deref() != Some("P-256") {
        return None;
    }
    let x = decode(jwk.x.as_ref())?;
    let y = decode(jwk.y.as_ref())?;
    if x.len() != 32 || y.len() != 32 {
        return None;
    }
    let mut point = Vec::with_capacity(65);
    point.push(4);
    point.extend_from_slice(&x);
    point.extend_from_slice(&y);
    ParsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point).ok()
}

#[cfg(test)]
mod tests {
    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::rsa::KeySize;
    use aws_lc_rs::signature::{
        ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _, RsaKeyPair,
    };
    use serde_json::json;

    use super::*;

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn rsa_jwk(kid: &str, bits: KeySize) -> serde_json::Value {
        let key = RsaKeyPair::generate(bits).unwrap();
        let public = key.public_key();
        json!({
            "kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
            "n": b64(public.modulus().big_endian_without_leading_zero()),
            "e": b64(public.exponent().big_endian_without_leading_zero()),
        })
    }

    fn ec_jwk(kid: &str) -> serde_json::Value {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref()).unwrap();
        let point = key.public_key().as_ref();
        json!({"kty": "EC", "crv": "P-256", "kid": kid, "x": b64(&point[1..33]), "y": b64(&point[33..])})
    }

    #[test]
    fn rsa_and_p256_signing_keys_are_read_and_others_skipped() {
        let set = json!({"keys": [
            rsa_jwk("a", KeySize::Rsa2048),
            ec_jwk("b"),
            {"kty": "RSA", "use": "enc", "kid": "c", "n": "AQAB", "e": "AQAB"},
            {"kty": "oct", "kid": "d", "k": "c2VjcmV0"},
            {"kty": "EC", "crv": "P-384", "kid": "e", "x": "AA", "y": "AA"},
            {"kty": "RSA", "kid": "tiny", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "not-base64", "n": "*", "e": "AQAB"},
        ]});
        let keys = keys(set.to_string().as_bytes()).unwrap();
        let read: Vec<_> = keys.iter().map(|k| (k.kid(), k.alg())).collect();
        assert_eq!(read, [(Some("a"), Alg::Rs256), (Some("b"), Alg::Es256)]);
    }

    #[test]
    fn a_key_set_is_bounded_and_must_hold_a_usable_key() {
        let many: Vec<_> = (0..=MAX_KEYS)
            .map(|i| json!({"kty": "RSA", "kid": i.to_string(), "n": "AQAB", "e": "AQAB"}))
            .collect();
        let error = keys(json!({ "keys": many }).to_string().as_bytes()).unwrap_err();
        assert!(error.contains("more than 64"), "{error}");
        let error = keys(br#"{"keys":[]}"#).unwrap_err();
        assert!(error.contains("no RS256 or ES256"), "{error}");
        let error = keys(b"<html>").unwrap_err();
        assert!(error.contains("line 1 column 1"), "{error}");
        assert!(keys(br#"{"keys":[{"kty":1}]}"#).is_err());
    }

    #[test]
    fn the_issuer_is_read_and_bounded() {
        let doc = json!({"issuer": "https://kubernetes.default.svc", "jwks_uri": "https://x/openid/v1/jwks"});
        assert_eq!(
            issuer(doc.to_string().as_bytes()).unwrap(),
            "https://kubernetes.default.svc"
        );
        assert!(issuer(br#"{"issuer":""}"#).is_err());
        let long = json!({ "issuer": "x".repeat(MAX_ISSUER_BYTES + 1) });
        assert!(issuer(long.to_string().as_bytes()).is_err());
        assert!(issuer(b"{}").is_err());
    }
}
