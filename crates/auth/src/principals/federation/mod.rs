//! Workload identity federation (`spec/oci-workload-identity-federation.md`): the pod's
//! service-account token exchanged at an OCI identity domain (RFC 8693 token exchange) for a
//! session token bound to a fresh session key, on any Kubernetes cluster.
//!
//! One exchange: `POST {domain}/oauth2/v1/token` with the form `grant_type` (token
//! exchange), `public_key` (Base64 of the session key's DER SubjectPublicKeyInfo),
//! `requested_token_type` (UPST, or RPST with `res_type`), `subject_token` (the service-
//! account token as is) and `subject_token_type=jwt`; the client authenticated by HTTP
//! Basic (the confidential application) or by the node's instance principal signature.
//! The answer `{"token": "<jwt>"}` is read within a budget; the session token's `exp` and
//! `iat` say when it is refreshed in the background: at the earlier of five minutes before
//! it expires and half its lifetime. A 5xx, a 429 or a broken connection is tried again (three attempts,
//! within the mount's deadline); a refusal is not.

mod config;

pub use config::{ClientAuth, ClientSecret, FederationConfig, TokenType, WorkloadMechanism};

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use secrecy::{ExposeSecret as _, SecretString};
use zeroize::Zeroizing;

use super::{Exchanged, Inner, refresh_at};
use crate::error::{AuthError, Endpoint, ErrorKind};
use crate::remote::{build, form_urlencoded, send};
use crate::signing::{KeyId, SignatureProfile, sign_request};
use crate::{Identity, jwt};

/// The identity domain's OAuth token endpoint, below its base URL.
pub(crate) const TOKEN_PATH: &str = "/oauth2/v1/token";
/// The RFC 8693 grant.
const TOKEN_EXCHANGE_GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// Attempts of one exchange when the domain fails (5xx, 429) or cannot be reached.
pub(crate) const ATTEMPTS: u32 = 3;
/// The wait before the second attempt; doubled before the third.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The most bytes of an answer read: a session token is a few KiB.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The most bytes of a client secret read from its file or Secret.
const MAX_SECRET_BYTES: usize = 4096;
/// The longest `error_description` repeated in a message.
const MAX_DESCRIPTION_BYTES: usize = 300;

/// One exchange of `token` (proven, or the provider's own TokenRequest's) for a session
/// token of `namespace/service_account`, bound to `key` (bound to no token yet).
pub(super) async fn exchange(
    inner: &Inner,
    config: &FederationConfig,
    (namespace, service_account): (&str, &str),
    token: &SecretString,
    key: &Arc<crate::PrivateKey>,
    deadline: tokio::time::Instant,
) -> Result<Exchanged, AuthError> {
    let public_key = key.public_key_base64();
    let mut fields = vec![
        ("grant_type", TOKEN_EXCHANGE_GRANT),
        ("public_key", public_key.as_str()),
        ("requested_token_type", config.token_type.urn()),
    ];
    if let TokenType::Rpst { resource_type } = &config.token_type {
        fields.push(("res_type", resource_type.as_str()));
    }
    fields.push(("subject_token", token.expose_secret()));
    fields.push(("subject_token_type", "jwt"));
    let body = Bytes::copy_from_slice(form_urlencoded(&fields).as_bytes());
    let (basic, secret) = match &config.client {
        ClientAuth::Secret { client_id, secret } => {
            let secret = client_secret(inner, secret, deadline).await?;
            (Some(basic(client_id, &secret)?), Some(secret))
        }
        ClientAuth::InstancePrincipal => (None, None),
    };
    let who = (namespace, service_account);
    let (response, signer) = attempts(inner, config, &body, basic.as_ref(), who, deadline).await?;
    if response.status() != StatusCode::OK {
        let sent = [
            token.expose_secret(),
            secret.as_deref().map_or("", |s| s.as_str()),
        ];
        let refused = refusal(who, &response, &sent);
        if let (Some(signer), true) = (&signer, refuses_the_client(&refused)) {
            // The domain refused the instance session that signed for the client: it is
            // federated again by the next exchange (at most once per cool-down, as after
            // any 401). A 401 about the subject (`invalid_grant`) leaves the node's session.
            super::instance::invalidate(inner, signer).await;
        }
        return Err(refused);
    }
    let (session_token, exp, issued) =
        answer(response.body(), inner.now()).map_err(|reason| AuthError::MalformedResponse {
            endpoint: Endpoint::IdentityDomain,
            operation: operation(who),
            reason: reason.to_owned(),
        })?;
    tracing::info!(
        namespace,
        service_account,
        token_type = config.token_type.label(),
        "exchanged a service-account token at the identity domain for a session token"
    );
    Ok(Exchanged {
        token: session_token,
        exp,
        refresh_at: refresh_at(issued, exp),
        key: Arc::clone(key),
    })
}

/// Whether the domain refused the client's authentication rather than the subject: a 401
/// with the RFC 6749 error `invalid_client` (a 401 without it, or `invalid_grant`, is about
/// the service account's token).
fn refuses_the_client(refused: &AuthError) -> bool {
    matches!(
        refused,
        AuthError::TokenExchange { status: 401, error: Some(error), .. } if error == "invalid_client"
    )
}

fn operation((namespace, service_account): (&str, &str)) -> String {
    format!("the token exchange of service account {namespace}/{service_account}")
}

/// Sends the exchange until it is answered other than by a failure of the domain (5xx,
/// 429) or of the connection, [`ATTEMPTS`] times at most, never waiting past `deadline`.
/// Answers the response and, with instance-principal client authentication, the key id
/// that signed it.
async fn attempts(
    inner: &Inner,
    config: &FederationConfig,
    body: &Bytes,
    basic: Option<&HeaderValue>,
    who: (&str, &str),
    deadline: tokio::time::Instant,
) -> Result<(Response<Bytes>, Option<KeyId>), AuthError> {
    let operation = operation(who);
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        let (request, signer) = request(inner, config, body, basic, deadline).await?;
        let result = send(
            &inner.http,
            request,
            deadline,
            Endpoint::IdentityDomain,
            &operation,
        )
        .await;
        let failed = match &result {
            Ok(response) => {
                response.status().is_server_error()
                    || response.status() == StatusCode::TOO_MANY_REQUESTS
            }
            Err(error) => error.kind() == ErrorKind::Unavailable,
        };
        if !failed || attempt >= ATTEMPTS || tokio::time::Instant::now() + backoff >= deadline {
            return result.map(|response| (response, signer));
        }
        tracing::debug!(
            attempt,
            ?backoff,
            "the identity domain failed; trying again"
        );
        tokio::time::sleep(backoff).await;
        backoff *= 2;
        attempt += 1;
    }
}

/// One attempt's request: Basic, or signed with the node's instance session (a fresh date
/// per attempt).
async fn request(
    inner: &Inner,
    config: &FederationConfig,
    body: &Bytes,
    basic: Option<&HeaderValue>,
    deadline: tokio::time::Instant,
) -> Result<(Request<Bytes>, Option<KeyId>), AuthError> {
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(format!(
            "{}{TOKEN_PATH}",
            config.domain_url.trim_end_matches('/')
        ))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(ACCEPT, "application/json");
    if let Some(basic) = basic {
        builder = builder.header(AUTHORIZATION, basic.clone());
    }
    let mut request = build(builder, body.clone())?;
    request
        .extensions_mut()
        .insert(transport::MaxBodyBytes(MAX_ANSWER_BYTES));
    if basic.is_some() {
        return Ok((request, None));
    }
    let instance = super::instance::session(inner, deadline).await?;
    let key = instance.key();
    sign_request(
        &mut request,
        &Identity::Instance,
        key,
        inner.now(),
        SignatureProfile::Standard,
    )?;
    Ok((request, Some(key.key_id().clone())))
}

/// `Basic base64(client_id:client_secret)`, as the SDKs send it (not form-encoded first),
/// marked sensitive.
fn basic(client_id: &str, secret: &str) -> Result<HeaderValue, AuthError> {
    let pair = Zeroizing::new(format!("{client_id}:{secret}"));
    let value = Zeroizing::new(format!("Basic {}", STANDARD.encode(pair.as_bytes())));
    let mut value = HeaderValue::from_str(&value)
        .map_err(|_| AuthError::Internal("a base64 header value is always valid"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// The confidential application's secret, read now from where the operator put it.
async fn client_secret(
    inner: &Inner,
    secret: &ClientSecret,
    deadline: tokio::time::Instant,
) -> Result<Zeroizing<String>, AuthError> {
    let (place, bytes) = match secret {
        ClientSecret::File(path) => {
            let place = format!("file {}", path.display());
            let bytes = read_file(path).map_err(|problem| AuthError::ClientSecret {
                place: place.clone(),
                problem,
            })?;
            (place, bytes)
        }
        ClientSecret::KubernetesSecret {
            namespace,
            name,
            key,
        } => {
            let place = format!("member {key} of Secret {namespace}/{name}");
            let member = inner
                .kube()?
                .secret_member(namespace, name, key, deadline)
                .await?;
            let bytes = member.ok_or_else(|| AuthError::ClientSecret {
                place: place.clone(),
                problem: "the Secret or its member does not exist".into(),
            })?;
            (place, bytes)
        }
    };
    let text = std::str::from_utf8(&bytes)
        .map(str::trim)
        .map_err(|_| AuthError::ClientSecret {
            place: place.clone(),
            problem: "it is not utf-8 text".into(),
        })?;
    if text.is_empty() {
        return Err(AuthError::ClientSecret {
            place,
            problem: "it is empty".into(),
        });
    }
    Ok(Zeroizing::new(text.to_owned()))
}

/// A client secret file, at most [`MAX_SECRET_BYTES`].
fn read_file(path: &std::path::Path) -> Result<Zeroizing<Vec<u8>>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open it ({})", e.kind()))?;
    let mut bytes = Zeroizing::new(Vec::new());
    file.take(MAX_SECRET_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it ({})", e.kind()))?;
    if bytes.len() > MAX_SECRET_BYTES {
        return Err(format!("it is longer than {MAX_SECRET_BYTES} bytes"));
    }
    Ok(bytes)
}

/// The session token of a 200 answer (`{"token": "<jwt>"}`, other members ignored), its
/// expiry and when it was issued (its `iat`, no later than `now`; `now` without one).
/// Failures are described, never quoted (the body holds a token).
pub(crate) fn answer(
    body: &[u8],
    now: SystemTime,
) -> Result<(Zeroizing<String>, SystemTime, SystemTime), &'static str> {
    #[derive(serde::Deserialize)]
    struct Answer {
        token: Option<String>,
    }
    let answer: Answer = bounded::json::from_slice(body, &bounded::ParseBudget::new(body.len()))
        .map_err(|_| "the body is not a json object")?;
    // Moved, not copied, into a buffer wiped when dropped.
    let token = Zeroizing::new(answer.token.ok_or("no token member")?);
    let claims = jwt::claims(&token)?;
    let exp = jwt::exp(&claims)?;
    let issued = jwt::iat(&claims)?.map_or(now, |iat| iat.min(now));
    if exp <= issued {
        return Err("its exp is not after its iat");
    }
    Ok((token, exp, issued))
}

/// The error of an exchange the domain answered other than 200: its status, its OAuth
/// `error` (or OCI `code`) and, when it repeats nothing that was sent (`sent`: the subject
/// token, the client secret), its `error_description` (or `message`).
fn refusal(
    (namespace, service_account): (&str, &str),
    response: &Response<Bytes>,
    sent: &[&str],
) -> AuthError {
    #[derive(serde::Deserialize)]
    struct Body {
        error: Option<String>,
        error_description: Option<String>,
        code: Option<String>,
        message: Option<String>,
    }
    let body = response.body();
    let parsed: Option<Body> =
        bounded::json::from_slice(body, &bounded::ParseBudget::new(body.len())).ok();
    let (error, description) = parsed.map_or((None, None), |b| {
        (b.error.or(b.code), b.error_description.or(b.message))
    });
    let error = error.filter(|e| {
        !e.is_empty() && e.len() <= 64 && e.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
    });
    AuthError::TokenExchange {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        status: response.status().as_u16(),
        error,
        description: description.and_then(|d| safe_description(&d, sent)),
    }
}

/// `text` when it is short and holds nothing that looks like a token or repeats a part of
/// what was sent; quoted.
fn safe_description(text: &str, sent: &[&str]) -> Option<String> {
    let text = text.trim();
    if text.is_empty() || text.len() > MAX_DESCRIPTION_BYTES || text.contains("eyJ") {
        return None;
    }
    let repeats = sent.iter().any(|s| {
        (s.len() >= 4 && text.contains(s))
            || s.split('.')
                .any(|part| part.len() >= 8 && text.contains(part))
    });
    (!repeats).then(|| bounded::quote(text).to_string())
}

/// The message of a refusal answered with `status` and `body` to an exchange that sent
/// `sent`, for the property tests in `crate::fuzz`.
#[cfg(test)]
pub(crate) fn fuzz_refusal(status: u16, body: &[u8], sent: &[&str]) -> String {
    let mut response = Response::new(Bytes::copy_from_slice(body));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    refusal(("app", "web"), &response, sent).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_session_token_is_refreshed_at_half_life_or_five_minutes_before_expiry() {
        // A UPST of an hour: at half its life.
        assert_eq!(refresh_at(at(1000), at(4600)), at(2800));
        // Eight minutes: five minutes before it expires comes first.
        assert_eq!(refresh_at(at(1000), at(1480)), at(1180));
        // Shorter than five minutes: at once.
        assert_eq!(refresh_at(at(1000), at(1100)), at(1000));
    }

    #[test]
    fn a_description_that_repeats_what_was_sent_is_dropped() {
        let token = "aaaaaaaa.bbbbbbbbbb.cccccccccc";
        assert_eq!(
            safe_description("bad audience", &[token, "s3cret"]).as_deref(),
            Some("\"bad audience\"")
        );
        for leak in [
            "token bbbbbbbbbb is bad",
            "secret s3cret is wrong",
            "eyJhbGci",
            &"x".repeat(400),
            "",
        ] {
            assert_eq!(safe_description(leak, &[token, "s3cret"]), None, "{leak}");
        }
    }
}
