//! A compact JWS (RFC 7515) as Kubernetes signs service-account tokens: its header read and
//! its signature checked with one of the issuer's keys. RS256 and ES256 only, the two
//! algorithms the API server signs with; anything else (`none` included) is refused.

use aws_lc_rs::signature::ParsedPublicKey;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::Value;

use super::Refusal;
use super::jwks::{Alg, Key};
use crate::jwt;

/// A token split and its header read; nothing is trusted yet.
#[derive(Debug)]
pub(crate) struct Jws<'a> {
    alg: Alg,
    kid: Option<String>,
    /// `header.payload`, what the signature covers.
    signing_input: &'a str,
    signature: Vec<u8>,
}

impl<'a> Jws<'a> {
    /// Splits `token` and reads its header. Errors are fixed strings: never the token, nor
    /// any value of it.
    pub(crate) fn parse(token: &'a str) -> Result<Self, Refusal> {
        let header = jwt::header(token).map_err(Refusal::Malformed)?;
        let Some((signing_input, signature)) = token.rsplit_once('.') else {
            return Err(Refusal::Malformed("it is not a jwt of three parts"));
        };
        // A critical extension this reader does not know must not be ignored (RFC 7515,
        // 4.1.11); Kubernetes sets none.
        if header.contains_key("crit") {
            return Err(Refusal::Malformed(
                "its header has critical parameters (crit) this provider does not read",
            ));
        }
        let alg = match header.get("alg").and_then(Value::as_str) {
            Some("RS256") => Alg::Rs256,
            Some("ES256") => Alg::Es256,
            _ => return Err(Refusal::Algorithm),
        };
        let kid = match header.get("kid") {
            None => None,
            Some(Value::String(kid)) => Some(kid.clone()),
            Some(_) => return Err(Refusal::Malformed("its key id (kid) is not a string")),
        };
        let signature = URL_SAFE_NO_PAD
            .decode(signature.trim_end_matches('='))
            .map_err(|_| Refusal::Malformed("its signature is not base64url"))?;
        Ok(Self {
            alg,
            kid,
            signing_input,
            signature,
        })
    }

    /// The algorithm the header names.
    pub(crate) fn alg(&self) -> Alg {
        self.alg
    }

    /// The key id the header names, if any.
    pub(crate) fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// Checks the signature with `key` (parsed for this token's algorithm).
    pub(crate) fn verify(&self, key: &Key) -> Result<(), Refusal> {
        verify_with(key.public(), self.signing_input, &self.signature)
    }
}

fn verify_with(key: &ParsedPublicKey, input: &str, signature: &[u8]) -> Result<(), Refusal> {
    key.verify_sig(input.as_bytes(), signature)
        .map_err(|_| Refusal::Signature)
}

#[cfg(test)]
mod tests {
    use aws_lc_rs::encoding::AsDer as _;
    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::rsa::KeySize;
    use aws_lc_rs::signature::{
        ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _,
        RSA_PKCS1_2048_8192_SHA256, RSA_PKCS1_SHA256, RsaKeyPair,
    };

    use super::*;

    fn b64(bytes: impl AsRef<[u8]>) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn input(header: &str) -> String {
        format!("{}.{}", b64(header), b64(r#"{"sub":"x"}"#))
    }

    #[test]
    fn an_rs256_token_verifies_with_its_key_and_not_with_another() {
        let key = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
        let other = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
        let input = input(r#"{"alg":"RS256","kid":"k1"}"#);
        let mut sig = vec![0; key.public_modulus_len()];
        key.sign(
            &RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            input.as_bytes(),
            &mut sig,
        )
        .unwrap();
        let token = format!("{input}.{}", b64(&sig));
        let jws = Jws::parse(&token).unwrap();
        assert_eq!((jws.alg(), jws.kid()), (Alg::Rs256, Some("k1")));
        let public = |k: &RsaKeyPair| {
            ParsedPublicKey::new(
                &RSA_PKCS1_2048_8192_SHA256,
                k.public_key().as_der().unwrap().as_ref(),
            )
            .unwrap()
        };
        assert_eq!(
            verify_with(&public(&key), jws.signing_input, &jws.signature),
            Ok(())
        );
        assert_eq!(
            verify_with(&public(&other), jws.signing_input, &jws.signature),
            Err(Refusal::Signature)
        );
        // The claims changed, the signature kept: refused.
        let forged = format!(
            "{}.{}.{}",
            b64(r#"{"alg":"RS256","kid":"k1"}"#),
            b64(r#"{"sub":"y"}"#),
            b64(&sig)
        );
        let jws = Jws::parse(&forged).unwrap();
        assert_eq!(
            verify_with(&public(&key), jws.signing_input, &jws.signature),
            Err(Refusal::Signature)
        );
    }

    #[test]
    fn an_es256_token_verifies_with_its_key() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref()).unwrap();
        let input = input(r#"{"alg":"ES256","kid":"ec"}"#);
        let sig = key.sign(&rng, input.as_bytes()).unwrap();
        let token = format!("{input}.{}", b64(sig.as_ref()));
        let jws = Jws::parse(&token).unwrap();
        assert_eq!(jws.alg(), Alg::Es256);
        let public =
            ParsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, key.public_key().as_ref()).unwrap();
        assert_eq!(
            verify_with(&public, jws.signing_input, &jws.signature),
            Ok(())
        );
        let mut bad = jws.signature.clone();
        bad[5] ^= 1;
        assert_eq!(
            verify_with(&public, jws.signing_input, &bad),
            Err(Refusal::Signature)
        );
    }

    #[test]
    fn unsupported_algorithms_and_headers_are_refused_by_name() {
        for (header, refusal) in [
            (r#"{"alg":"none"}"#, Refusal::Algorithm),
            (r#"{"alg":"HS256","kid":"k"}"#, Refusal::Algorithm),
            (r#"{"kid":"k"}"#, Refusal::Algorithm),
            (
                r#"{"alg":"RS256","crit":["exp"]}"#,
                Refusal::Malformed(
                    "its header has critical parameters (crit) this provider does not read",
                ),
            ),
            (
                r#"{"alg":"RS256","kid":7}"#,
                Refusal::Malformed("its key id (kid) is not a string"),
            ),
        ] {
            let token = format!("{}.sig", input(header));
            assert_eq!(Jws::parse(&token).unwrap_err(), refusal, "{header}");
        }
        let token = format!("{}.not*base64", input(r#"{"alg":"RS256"}"#));
        assert_eq!(
            Jws::parse(&token).unwrap_err(),
            Refusal::Malformed("its signature is not base64url")
        );
        assert!(matches!(
            Jws::parse("xxx.yyy.AAAA").unwrap_err(),
            Refusal::Malformed(_)
        ));
    }
}
