//! Just enough JWT reading for claims and expiry decisions. Signatures are not checked
//! here: the service-account tokens a mount supplies are verified by `crate::issuer`
//! against the cluster's keys; the tokens OCI and the API server hand us (RPSTs, instance
//! tokens, TokenRequest answers) are proven by where they came from, over TLS, and OCI
//! verifies them when they come back.

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

/// The header of a JWT, with the same checks as [`claims`].
pub(crate) fn header(token: &str) -> Result<Map<String, Value>, &'static str> {
    let mut parts = token.split('.');
    let (Some(header), Some(_payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("it is not a jwt of three parts");
    };
    object(header).map_err(|_| "its header is not base64url json")
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
    numeric_date(exp).ok_or("its exp claim is out of range")
}

/// The `nbf` claim as a time, if the token has one.
pub(crate) fn nbf(claims: &Map<String, Value>) -> Result<Option<SystemTime>, &'static str> {
    optional_date(
        claims.get("nbf"),
        "its nbf claim is not a number",
        "its nbf claim is out of range",
    )
}

/// The `iat` claim as a time, if the token has one.
pub(crate) fn iat(claims: &Map<String, Value>) -> Result<Option<SystemTime>, &'static str> {
    optional_date(
        claims.get("iat"),
        "its iat claim is not a number",
        "its iat claim is out of range",
    )
}

/// An optional NumericDate claim, with the errors to say when it is not one.
fn optional_date(
    claim: Option<&Value>,
    not_a_number: &'static str,
    out_of_range: &'static str,
) -> Result<Option<SystemTime>, &'static str> {
    let Some(claim) = claim else {
        return Ok(None);
    };
    numeric_date(claim.as_f64().ok_or(not_a_number)?)
        .map(Some)
        .ok_or(out_of_range)
}

/// A JWT NumericDate (seconds since the epoch) as a time, in whole seconds; `None` when it
/// is negative, not finite or past the year 9999.
fn numeric_date(secs: f64) -> Option<SystemTime> {
    if !secs.is_finite() || secs < 0.0 || secs > MAX_EXP_SECS as f64 {
        return None;
    }
    // Truncation is intended: times are compared in whole seconds.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // reason: checked above
    let secs = secs as u64;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Whether the `aud` claim (a string or an array of strings) holds `audience`.
pub(crate) fn has_audience(claims: &Map<String, Value>, audience: &str) -> bool {
    match claims.get("aud") {
        Some(Value::String(one)) => one == audience,
        Some(Value::Array(many)) => many.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    }
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

    #[test]
    fn nbf_is_optional_and_read_like_exp() {
        let c = claims(&token(r#"{"exp":1}"#)).unwrap();
        assert_eq!(nbf(&c), Ok(None));
        let c = claims(&token(r#"{"nbf":1700000000}"#)).unwrap();
        assert_eq!(
            nbf(&c),
            Ok(Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)))
        );
        let c = claims(&token(r#"{"nbf":"now"}"#)).unwrap();
        assert_eq!(nbf(&c), Err("its nbf claim is not a number"));
        let c = claims(&token(r#"{"nbf":1e300}"#)).unwrap();
        assert_eq!(nbf(&c), Err("its nbf claim is out of range"));
    }

    #[test]
    fn the_audience_is_a_string_or_one_of_an_array() {
        let one = claims(&token(r#"{"aud":"oci"}"#)).unwrap();
        let many = claims(&token(r#"{"aud":["x","oci"]}"#)).unwrap();
        let other = claims(&token(r#"{"aud":["x"]}"#)).unwrap();
        let none = claims(&token(r#"{}"#)).unwrap();
        assert!(has_audience(&one, "oci") && has_audience(&many, "oci"));
        assert!(!has_audience(&other, "oci") && !has_audience(&none, "oci"));
    }
}
