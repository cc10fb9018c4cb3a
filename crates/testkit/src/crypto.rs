//! Small cryptographic helpers: digests, fingerprints, PEM, RSA verification and JWTs.

use aws_lc_rs::digest;
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{self, KeyPair, RsaKeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use md5::Digest as _;

use crate::Error;

/// Standard padded Base64 of the SHA-256 digest of `body`.
pub(crate) fn sha256_b64(body: &[u8]) -> String {
    STANDARD.encode(digest::digest(&digest::SHA256, body))
}

/// Lower-case hex byte pairs joined by `:`.
pub(crate) fn colon_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The OCI API-key fingerprint: MD5 over the DER `SubjectPublicKeyInfo` (spec 1.4).
pub fn api_key_fingerprint(spki_der: &[u8]) -> String {
    colon_hex(&md5::Md5::digest(spki_der))
}

/// SHA-1 fingerprint of a certificate DER, as used by `fed-x509` key ids.
pub(crate) fn sha1_fingerprint(der: &[u8]) -> String {
    colon_hex(digest::digest(&digest::SHA1_FOR_LEGACY_USE_ONLY, der).as_ref())
}

/// SHA-256 fingerprint of a certificate DER, as used by `fed-x509-sha256` key ids.
pub(crate) fn sha256_fingerprint(der: &[u8]) -> String {
    colon_hex(digest::digest(&digest::SHA256, der).as_ref())
}

/// Verifies an RSA PKCS#1 v1.5 SHA-256 signature with a public key given as SPKI or PKCS#1 DER.
pub(crate) fn rsa_verify(public_key_der: &[u8], message: &[u8], sig: &[u8]) -> bool {
    signature::UnparsedPublicKey::new(&signature::RSA_PKCS1_2048_8192_SHA256, public_key_der)
        .verify(message, sig)
        .is_ok()
}

/// Whether `der` parses as an RSA public key (SPKI or PKCS#1).
pub(crate) fn is_rsa_public_key(der: &[u8]) -> bool {
    signature::ParsedPublicKey::new(&signature::RSA_PKCS1_2048_8192_SHA256, der).is_ok()
}

/// Decodes the first PEM block of `pem` with one of the given labels.
pub(crate) fn pem_decode(pem: &str, labels: &[&str]) -> Option<Vec<u8>> {
    for label in labels {
        let begin = format!("-----BEGIN {label}-----");
        let end = format!("-----END {label}-----");
        if let Some(start) = pem.find(&begin) {
            let rest = &pem[start + begin.len()..];
            let stop = rest.find(&end)?;
            let b64: String = rest[..stop]
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            return STANDARD.decode(b64).ok();
        }
    }
    None
}

/// PEM armour with 64-character lines, LF only, trailing newline.
pub(crate) fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Random lower-case hex string of `bytes` random bytes.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // SystemRandom only fails when the OS has no entropy source; fall back to zeros then,
    // which is harmless for identifiers in a test emulator.
    let _ = SystemRandom::new().fill(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// An RSA signing key for JWTs.
pub(crate) struct JwtSigner {
    key: RsaKeyPair,
    kid: String,
}

impl std::fmt::Debug for JwtSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSigner")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl JwtSigner {
    pub(crate) fn generate() -> Result<Self, Error> {
        let key = RsaKeyPair::generate(KeySize::Rsa2048)
            .map_err(|_| Error::Crypto("rsa key generation failed"))?;
        Ok(Self {
            key,
            kid: random_hex(8),
        })
    }

    /// SPKI DER of the verification key.
    pub(crate) fn public_key_der(&self) -> Vec<u8> {
        self.key
            .public_key()
            .as_der()
            .map(|d| d.as_ref().to_vec())
            .unwrap_or_default()
    }

    /// The key id its tokens name.
    pub(crate) fn kid(&self) -> &str {
        &self.kid
    }

    /// The verification key as a JWK, as the Kubernetes API serves it at `/openid/v1/jwks`.
    pub(crate) fn jwk(&self) -> serde_json::Value {
        let public = self.key.public_key();
        serde_json::json!({
            "use": "sig",
            "kty": "RSA",
            "kid": self.kid,
            "alg": "RS256",
            "n": URL_SAFE_NO_PAD.encode(public.modulus().big_endian_without_leading_zero()),
            "e": URL_SAFE_NO_PAD.encode(public.exponent().big_endian_without_leading_zero()),
        })
    }

    /// Signs `claims` as an RS256 JWT.
    pub(crate) fn sign(&self, claims: &serde_json::Value) -> Result<String, Error> {
        self.sign_as(&self.kid, claims)
    }

    /// Signs `claims` as an RS256 JWT whose header names `kid` (another key's, to forge).
    pub(crate) fn sign_as(&self, kid: &str, claims: &serde_json::Value) -> Result<String, Error> {
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": kid});
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut sig = vec![0u8; self.key.public_modulus_len()];
        self.key
            .sign(
                &signature::RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signing_input.as_bytes(),
                &mut sig,
            )
            .map_err(|_| Error::Crypto("jwt signing failed"))?;
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }

    /// Checks the signature of a JWT this signer produced.
    pub(crate) fn verify(&self, jwt: &str) -> bool {
        let Some((input, sig)) = jwt.rsplit_once('.') else {
            return false;
        };
        let Ok(sig) = URL_SAFE_NO_PAD.decode(sig) else {
            return false;
        };
        rsa_verify(&self.public_key_der(), input.as_bytes(), &sig)
    }
}

/// The modulus and public exponent (big-endian, no leading zero) of an RSA
/// SubjectPublicKeyInfo DER.
pub(crate) fn rsa_components(spki: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    use pkcs1::der::Decode as _;
    let info = pkcs8::SubjectPublicKeyInfoRef::from_der(spki).ok()?;
    let key = pkcs1::RsaPublicKeyRef::from_der(info.subject_public_key.as_bytes()?).ok()?;
    Some((
        key.modulus.as_bytes().to_vec(),
        key.public_exponent.as_bytes().to_vec(),
    ))
}

/// Verifies an RSA PKCS#1 v1.5 SHA-256 signature with a key given by its modulus and
/// exponent (a JWK's `n` and `e`).
pub(crate) fn rsa_verify_components(n: &[u8], e: &[u8], message: &[u8], sig: &[u8]) -> bool {
    signature::RsaPublicKeyComponents { n, e }
        .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
        .is_ok()
}

/// The JWK of an RSA public key (SPKI DER), as the identity domain puts the session key in
/// the `jwk` claim of its session tokens: a JSON object serialised into a string.
pub(crate) fn jwk_string(spki: &[u8]) -> Option<String> {
    let (n, e) = rsa_components(spki)?;
    let kid = STANDARD.encode(digest::digest(&digest::SHA256, spki));
    Some(
        serde_json::json!({
            "kty": "RSA",
            "alg": "RS256",
            "use": "sig",
            "kid": kid,
            "n": URL_SAFE_NO_PAD.encode(n),
            "e": URL_SAFE_NO_PAD.encode(e),
        })
        .to_string(),
    )
}

/// The header and claims of a JWT, without checking anything.
pub(crate) fn jwt_parts(token: &str) -> Option<(serde_json::Value, serde_json::Value)> {
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let decode = |part: &str| -> Option<serde_json::Value> {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part.trim_end_matches('=')).ok()?).ok()
    };
    Some((decode(header)?, decode(claims)?))
}
