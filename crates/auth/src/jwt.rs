//! Just enough JWT reading for expiry decisions: the SDK never verifies signatures of the
//! tokens it holds, and neither do we (the issuer verifies them when they come back).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// The claims of a JWT, after checking it has three parts and that its header and payload
/// are Base64url JSON objects. Errors are fixed strings: never the token.
pub(crate) fn claims(token: &str) -> Result<Map<String, Value>, &'static str> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("it is not a jwt of three parts");
    };
    object(header).map_err(|_| "its header is not base64url json")?;
    object(payload).map_err(|_| "its payload is not base64url json")
}

fn object(part: &str) -> Result<Map<String, Value>, ()> {
    // Padding is tolerated (the SDK pads before decoding); `+` and `/` are not.
    let bytes = zeroize::Zeroizing::new(
        URL_SAFE_NO_PAD
            .decode(part.trim_end_matches('='))
            .map_err(|_| ())?,
    );
    // A token's part is a few hundred bytes; its length is its budget.
    match bounded::json::from_slice::<Value>(&bytes, &bounded::ParseBudget::new(bytes.len())) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(()),
    }
}

/// The latest `exp` accepted: the year 9999. Anything later is no real expiry, and its
/// `SystemTime` arithmetic could overflow.
const MAX_EXP_SECS: u64 = 253_402_300_799;

/// The numeric `exp` claim as a time, whole seconds since the epoch.
pub(crate) fn exp(claims: &Map<String, Value>) -> Result<SystemTime, &'static str> {
    let exp = claims
        .get("exp")
        .and_then(Value::as_f64)
        .ok_or("it has no numeric exp claim")?;
    if !exp.is_finite() || exp < 0.0 || exp > MAX_EXP_SECS as f64 {
        return Err("its exp claim is out of range");
    }
    // Truncation is intended: expiry is compared in whole seconds.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // reason: checked above
    let secs = exp as u64;
    UNIX_EPOCH
        .checked_add(Duration::from_secs(secs))
        .ok_or("its exp claim is out of range")
}

/// A string claim at a JSON pointer, e.g. `/kubernetes.io/serviceaccount/uid`.
pub(crate) fn string_at(claims: &Map<String, Value>, path: &[&str]) -> Option<String> {
    let (first, rest) = path.split_first()?;
    let mut value = claims.get(*first)?;
    for key in rest {
        value = value.get(*key)?;
    }
    value.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(payload: &str) -> String {
        format!(
            "{}.{}.sig",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256"}"#),
            URL_SAFE_NO_PAD.encode(payload)
        )
    }

    #[test]
    fn reads_exp_and_nested_claims() {
        let c = claims(&token(
            r#"{"exp":1700000000,"kubernetes.io":{"serviceaccount":{"uid":"u-1"}}}"#,
        ))
        .unwrap();
        assert_eq!(exp(&c), Ok(UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
        assert_eq!(
            string_at(&c, &["kubernetes.io", "serviceaccount", "uid"]).as_deref(),
            Some("u-1")
        );
    }

    #[test]
    fn rejects_malformed_tokens_without_echoing_them() {
        assert!(claims("a.b").is_err());
        assert!(claims("a.b.c.d").is_err());
        assert!(claims(&format!("{}.e30.s", URL_SAFE_NO_PAD.encode("[]"))).is_err());
        let c = claims(&token(r#"{"exp":"soon"}"#)).unwrap();
        assert_eq!(exp(&c), Err("it has no numeric exp claim"));
    }

    #[test]
    fn an_exp_beyond_any_clock_is_out_of_range_not_a_panic() {
        for exp_claim in ["1e300", "1.8446744073709552e19", "253402300800", "-1"] {
            let c = claims(&token(&format!(r#"{{"exp":{exp_claim}}}"#))).unwrap();
            assert_eq!(exp(&c), Err("its exp claim is out of range"), "{exp_claim}");
        }
        let c = claims(&token(r#"{"exp":253402300799}"#)).unwrap();
        assert!(exp(&c).is_ok());
    }
}
