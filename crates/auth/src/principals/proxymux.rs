//! OKE workload identity's exchange (spec 3.3, 3.4): a service-account token for an RPST
//! bound to a fresh session key, at the cluster's proxymux.

use std::sync::Arc;
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, StatusCode};
use secrecy::{ExposeSecret as _, SecretString};
use zeroize::Zeroizing;

use super::{Exchanged, Inner, refresh_at};
use crate::error::{AuthError, Endpoint};
use crate::jwt;
use crate::remote::{build, error_detail, opc_request_id, send};

fn proxymux_url(inner: &Inner) -> Result<String, AuthError> {
    inner.config.proxymux_url().ok_or_else(|| {
        AuthError::Config(
            "workload identity needs the proxymux url or KUBERNETES_SERVICE_HOST".into(),
        )
    })
}

/// One proxymux exchange for `session_key`, bound to no token yet: the RPST, refreshed in
/// the background from the earlier of half its life and five minutes before it expires.
pub(super) async fn exchange(
    inner: &Inner,
    (namespace, service_account): (&str, &str),
    token: &SecretString,
    session_key: &Arc<crate::PrivateKey>,
    deadline: tokio::time::Instant,
) -> Result<Exchanged, AuthError> {
    let operation = format!("the token exchange of service account {namespace}/{service_account}");
    let malformed = |reason: &str| AuthError::MalformedResponse {
        endpoint: Endpoint::Proxymux,
        operation: operation.clone(),
        reason: reason.to_owned(),
    };
    let body = serde_json::json!({ "podKey": session_key.public_key_pem() }).to_string();
    let bearer = Zeroizing::new(format!("Bearer {}", token.expose_secret()));
    let mut bearer =
        HeaderValue::from_str(&bearer).map_err(|_| AuthError::InvalidServiceAccountToken {
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            reason: "it is not a valid header value",
        })?;
    bearer.set_sensitive(true);
    let request = build(
        Request::builder()
            .method(Method::POST)
            .uri(format!(
                "{}/resourcePrincipalSessionTokens",
                proxymux_url(inner)?
            ))
            .header(AUTHORIZATION, bearer)
            .header(CONTENT_TYPE, "application/json")
            // Zeros if the RNG fails: the id is for correlation only.
            .header(
                "opc-request-id",
                opc_request_id(3).unwrap_or_else(|| vec!["0".repeat(32); 3].join("/")),
            ),
        body,
    )?;
    let response = send(
        &inner.http,
        request,
        deadline,
        Endpoint::Proxymux,
        &operation,
    )
    .await?;
    if response.status() != StatusCode::OK {
        return Err(AuthError::Status {
            endpoint: Endpoint::Proxymux,
            operation,
            status: response.status().as_u16(),
            detail: error_detail(response.body()),
        });
    }
    let (rpst, exp, issued) =
        parse_proxymux_reply(response.body(), inner.now()).map_err(malformed)?;
    tracing::info!(
        namespace,
        service_account,
        "exchanged a service-account token for a resource principal session token"
    );
    Ok(Exchanged {
        token: rpst,
        exp,
        refresh_at: refresh_at(issued, exp),
        key: Arc::clone(session_key),
    })
}

/// The proxymux answer: a JSON string literal around standard Base64 of
/// `{"token":"ST$<rpst>"}`; the RPST (a JWT with `exp` and `res_tenant`), its expiry and
/// when it was issued (its `iat`, no later than `now`; `now` without one). Failures are
/// described, never quoted (the body holds a token).
pub(super) fn parse_proxymux_reply(
    body: &[u8],
    now: SystemTime,
) -> Result<(Zeroizing<String>, SystemTime, SystemTime), &'static str> {
    let quoted = body.len() >= 2 && body.first() == Some(&b'"') && body.last() == Some(&b'"');
    if !quoted {
        return Err("the body is not a quoted string");
    }
    let decoded = Zeroizing::new(
        STANDARD
            .decode(&body[1..body.len() - 1])
            .map_err(|_| "the body is not base64")?,
    );
    let object: serde_json::Map<String, serde_json::Value> =
        bounded::json::from_slice(&decoded, &bounded::ParseBudget::new(decoded.len()))
            .map_err(|_| "the decoded body is not a json object")?;
    let token = object
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("token"))
        .and_then(|(_, v)| v.as_str())
        .filter(|t| t.len() >= 3)
        .ok_or("no token member")?;
    // The SDK strips the first three characters (`ST$`) without looking at them.
    let rpst = token.get(3..).ok_or("the token is not text")?;
    let claims = jwt::claims(rpst)?;
    let exp = jwt::exp(&claims)?;
    if claims.get("res_tenant").and_then(|t| t.as_str()).is_none() {
        return Err("the token has no res_tenant claim");
    }
    let issued = jwt::iat(&claims)?.map_or(now, |iat| iat.min(now));
    Ok((Zeroizing::new(rpst.to_owned()), exp, issued))
}
