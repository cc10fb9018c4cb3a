//! Verification of OCI HTTP request signatures (spec 1.6).

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::request::Parts;

use crate::crypto::{rsa_verify, sha256_b64};

/// Largest accepted distance between the `date` header and the emulator clock.
pub(crate) const MAX_SKEW: Duration = Duration::from_secs(300);

/// The parameters of an `Authorization: Signature ...` header.
#[derive(Debug, Clone)]
pub(crate) struct SigParams {
    pub(crate) key_id: String,
    pub(crate) headers: Vec<String>,
    pub(crate) signature: Vec<u8>,
}

/// Parses `Signature k="v",k="v"` (order-independent, optional whitespace).
pub(crate) fn parse_authorization(parts: &Parts) -> Result<SigParams, String> {
    let value = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .ok_or("missing authorization header")?
        .to_str()
        .map_err(|_| "authorization header is not ascii")?;
    let rest = value
        .strip_prefix("Signature")
        .ok_or("authorization scheme is not Signature")?;
    let mut version = None;
    let mut headers = None;
    let mut key_id = None;
    let mut algorithm = None;
    let mut signature = None;
    let mut s = rest.trim_start();
    while !s.is_empty() {
        let eq = s.find('=').ok_or("malformed signature parameters")?;
        let name = s[..eq].trim();
        let after = s[eq + 1..].trim_start();
        let after = after
            .strip_prefix('"')
            .ok_or("signature parameter value is not quoted")?;
        let close = after.find('"').ok_or("unterminated signature parameter")?;
        let val = after[..close].to_owned();
        match name {
            "version" => version = Some(val),
            "headers" => headers = Some(val),
            "keyId" => key_id = Some(val),
            "algorithm" => algorithm = Some(val),
            "signature" => signature = Some(val),
            _ => {}
        }
        s = after[close + 1..].trim_start();
        s = s.strip_prefix(',').unwrap_or(s).trim_start();
    }
    if version.as_deref() != Some("1") {
        return Err("signature version must be 1".into());
    }
    if algorithm.as_deref() != Some("rsa-sha256") {
        return Err("signature algorithm must be rsa-sha256".into());
    }
    let key_id = key_id.ok_or("missing keyId")?;
    let headers: Vec<String> = headers
        .ok_or("missing headers")?
        .split_ascii_whitespace()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    let signature = STANDARD
        .decode(signature.ok_or("missing signature")?)
        .map_err(|_| "signature is not base64")?;
    Ok(SigParams {
        key_id,
        headers,
        signature,
    })
}

fn header_value<'a>(parts: &'a Parts, name: &str) -> Result<&'a str, String> {
    if name == "host" {
        if let Some(v) = parts.headers.get(http::header::HOST) {
            return v
                .to_str()
                .map_err(|_| "host header is not ascii".to_owned());
        }
        // HTTP/2 carries the host in the :authority pseudo-header.
        return parts
            .uri
            .authority()
            .map(|a| a.as_str())
            .ok_or_else(|| "signed header host is missing".to_owned());
    }
    parts
        .headers
        .get(name)
        .ok_or_else(|| format!("signed header {name} is missing"))?
        .to_str()
        .map_err(|_| format!("header {name} is not ascii"))
}

/// Checks everything but the key: required headers, body digest and length, date skew, and
/// returns the signing string.
pub(crate) fn signing_string(
    parts: &Parts,
    body: &[u8],
    params: &SigParams,
    federation: bool,
    now: SystemTime,
) -> Result<String, String> {
    let method = parts.method.as_str().to_ascii_lowercase();
    let has_body = matches!(method.as_str(), "post" | "put" | "patch");
    let mut required: Vec<&str> = if federation {
        vec!["date", "(request-target)"]
    } else {
        vec!["date", "(request-target)", "host"]
    };
    if has_body {
        required.extend(["content-length", "content-type", "x-content-sha256"]);
    }
    for r in &required {
        if !params.headers.iter().any(|h| h == r) {
            return Err(format!("required header {r} is not signed"));
        }
    }
    if has_body {
        let sha = header_value(parts, "x-content-sha256")?;
        if sha != sha256_b64(body) {
            return Err("x-content-sha256 does not match the body".into());
        }
        let len = header_value(parts, "content-length")?;
        if len.parse::<usize>().ok() != Some(body.len()) {
            return Err("content-length does not match the body".into());
        }
    }
    let date = header_value(parts, "date")?;
    let date = httpdate::parse_http_date(date).map_err(|_| "date header is not an http date")?;
    let skew = match date.duration_since(now) {
        Ok(d) => d,
        Err(e) => e.duration(),
    };
    if skew > MAX_SKEW {
        return Err("date is more than 5 minutes from the server clock".into());
    }
    let mut lines = Vec::with_capacity(params.headers.len());
    for name in &params.headers {
        if name == "(request-target)" {
            let target = parts
                .uri
                .path_and_query()
                .map(|pq| pq.as_str())
                .unwrap_or("/");
            lines.push(format!("(request-target): {method} {target}"));
        } else {
            lines.push(format!("{name}: {}", header_value(parts, name)?));
        }
    }
    Ok(lines.join("\n"))
}

/// Verifies the signature over `signing_string` with `public_key_der`.
pub(crate) fn verify(public_key_der: &[u8], signing_string: &str, params: &SigParams) -> bool {
    rsa_verify(public_key_der, signing_string.as_bytes(), &params.signature)
}
