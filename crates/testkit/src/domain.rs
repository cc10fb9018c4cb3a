//! The OCI identity domain of workload identity federation: `POST /oauth2/v1/token`, the
//! RFC 8693 token exchange of a Kubernetes service-account token for a session token bound
//! to the client's public key (`spec/oci-workload-identity-federation.md`, sections 1, 2, 6).
//!
//! Where the spec lists a behaviour as not confirmed, this emulator does one thing, which
//! `ARCHITECTURE.md` states: client authentication by HTTP Basic or by an instance
//! principal's signature only (not in the form, not `client_assertion`);
//! `subject_token_type` exactly `jwt`; errors as RFC 6749 5.2 bodies (401 `invalid_client`,
//! 400 `invalid_request`, `unsupported_grant_type`, `invalid_grant` with a description
//! naming the failed check); rule values bare or in single quotes, `*` a wildcard of `eq`;
//! answers `{"token": ...}` only; the `jwk` claim a JSON object serialised into a string;
//! instance-principal client authentication for UPSTs and RPSTs alike.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::request::Parts;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::crypto::{is_rsa_public_key, jwk_string, jwt_parts};
use crate::oci_error;
use crate::seed::{TrustKeys, TrustSeed, WorkloadRef};
use crate::server::Reply;
use crate::state::{Principal, Shared, TokenKind};

const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const UPST: &str = "urn:oci:token-type:oci-upst";
const RPST: &str = "urn:oci:token-type:oci-rpst";

/// A refused exchange: an RFC 6749 5.2 error.
struct Refusal {
    status: StatusCode,
    error: &'static str,
    description: String,
}

fn refuse(status: StatusCode, error: &'static str, description: impl Into<String>) -> Refusal {
    Refusal {
        status,
        error,
        description: description.into(),
    }
}

fn invalid_client(description: impl Into<String>) -> Refusal {
    refuse(StatusCode::UNAUTHORIZED, "invalid_client", description)
}

fn invalid_request(description: impl Into<String>) -> Refusal {
    refuse(StatusCode::BAD_REQUEST, "invalid_request", description)
}

fn invalid_grant(description: impl Into<String>) -> Refusal {
    refuse(StatusCode::BAD_REQUEST, "invalid_grant", description)
}

pub(crate) fn handle(shared: &Shared, parts: &Parts, body: &[u8]) -> Reply {
    if parts.uri.path() != "/oauth2/v1/token" {
        return oci_error(StatusCode::NOT_FOUND, "NotFound", "unknown path");
    }
    if parts.method != Method::POST {
        return oci_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "method not allowed",
        );
    }
    match exchange(shared, parts, body) {
        Ok(reply) => reply,
        Err(refusal) => {
            shared.counters.update(|s| {
                *s.token_exchange_refusals
                    .entry(refusal.error.to_owned())
                    .or_default() += 1;
            });
            Reply::json(
                refusal.status,
                &json!({"error": refusal.error, "error_description": refusal.description}),
            )
        }
    }
}

/// Who exchanges: a confidential application, or an instance by its principal signature.
enum Client {
    App(String),
    Instance { tenancy: String, instance: String },
}

impl Client {
    fn name(&self) -> String {
        match self {
            Client::App(id) => id.clone(),
            Client::Instance { instance, .. } => format!("instance:{instance}"),
        }
    }

    /// Whether `trust` lets this client exchange.
    fn trusted_by(&self, trust: &TrustSeed) -> bool {
        match self {
            Client::App(id) => trust.oauth_clients.iter().any(|c| c == id),
            Client::Instance { tenancy, .. } => {
                trust.instance_tenancies.iter().any(|t| t == tenancy)
            }
        }
    }
}

/// What the form asks for.
struct Ask {
    subject_token: String,
    public_key: Vec<u8>,
    /// `None`: a UPST; else an RPST for this `res_type`.
    res_type: Option<String>,
}

fn exchange(shared: &Shared, parts: &Parts, body: &[u8]) -> Result<Reply, Refusal> {
    let client = client(shared, parts, body)?;
    let ask = ask(parts, body)?;
    let trusts: Vec<TrustSeed> = shared
        .state()
        .identity_domain
        .trusts
        .iter()
        .filter(|t| t.active && client.trusted_by(t))
        .cloned()
        .collect();
    if trusts.is_empty() {
        return Err(invalid_client(
            "the client is in no active identity propagation trust",
        ));
    }
    let (_, claims) = jwt_parts(&ask.subject_token)
        .ok_or_else(|| invalid_grant("the subject token is not a JWT"))?;
    let issuer = claims.get("iss").and_then(Value::as_str).unwrap_or("");
    let trust = trusts.iter().find(|t| t.issuer == issuer).ok_or_else(|| {
        invalid_grant(
            "issuer: the subject token's iss is the issuer of no active trust of this client",
        )
    })?;
    verify_subject(shared, trust, &ask.subject_token, &claims)?;
    let sub = claims.get("sub").and_then(Value::as_str).unwrap_or("");
    let (namespace, service_account) = sub
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .ok_or_else(|| invalid_grant("the subject token's sub is not a service account"))?;
    let (token_type, name) = match &ask.res_type {
        None => ("upst", service_user(trust, &claims)?),
        Some(res_type) if trust.impersonating_resource.as_deref() == Some(res_type) => {
            ("rpst", sub.to_owned())
        }
        Some(_) => {
            return Err(invalid_grant(
                "res_type is not the trust's impersonatingResource",
            ));
        }
    };
    let principal = Principal::Federated {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        token_type: token_type.to_owned(),
        name,
        client: client.name(),
    };
    let token = mint(shared, principal, &ask, issuer, sub)?;
    let workload = WorkloadRef {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
    };
    shared
        .counters
        .update(|s| *s.token_exchanges.entry(workload).or_default() += 1);
    Ok(Reply::json(StatusCode::OK, &json!({ "token": token })))
}

/// The client: HTTP Basic of a confidential application, or an OCI signature by an
/// instance principal's session token; credentials in the form are not accepted.
fn client(shared: &Shared, parts: &Parts, body: &[u8]) -> Result<Client, Refusal> {
    let authorization = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Some(basic) = authorization.strip_prefix("Basic ") {
        let decoded = STANDARD
            .decode(basic.trim())
            .ok()
            .and_then(|d| String::from_utf8(d).ok())
            .ok_or_else(|| invalid_client("the Basic credentials are not base64 text"))?;
        let (id, secret) = decoded
            .split_once(':')
            .ok_or_else(|| invalid_client("the Basic credentials are not id:secret"))?;
        let known = shared
            .state()
            .identity_domain
            .clients
            .iter()
            .any(|c| c.id == id && c.secret == secret);
        return if known {
            Ok(Client::App(id.to_owned()))
        } else {
            Err(invalid_client("unknown client or wrong secret"))
        };
    }
    if authorization.starts_with("Signature ") {
        return match crate::handlers::authenticate(shared, parts, body) {
            Ok(Principal::Instance {
                tenancy,
                instance_id,
            }) => Ok(Client::Instance {
                tenancy,
                instance: instance_id,
            }),
            Ok(_) => Err(invalid_client(
                "only an instance principal may sign an exchange",
            )),
            Err(why) => Err(invalid_client(format!("the signature is refused: {why}"))),
        };
    }
    Err(invalid_client(
        "no client authentication (HTTP Basic or an instance principal signature); client \
         credentials in the form are not accepted",
    ))
}

/// The form: its content type, every parameter once, the grant, the token types and the
/// public key.
fn ask(parts: &Parts, body: &[u8]) -> Result<Ask, Refusal> {
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/x-www-form-urlencoded") {
        return Err(invalid_request(
            "the body is not application/x-www-form-urlencoded",
        ));
    }
    let mut form = BTreeMap::new();
    for (name, value) in url::form_urlencoded::parse(body) {
        if form.insert(name.to_string(), value.to_string()).is_some() {
            return Err(invalid_request(format!("{name} is given twice")));
        }
    }
    let field = |name: &str| {
        form.get(name)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| invalid_request(format!("{name} is missing")))
    };
    if field("grant_type")? != TOKEN_EXCHANGE {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "only token exchange is supported here",
        ));
    }
    if field("subject_token_type")? != "jwt" {
        return Err(invalid_request("subject_token_type must be jwt"));
    }
    let res_type = match field("requested_token_type")?.as_str() {
        UPST => None,
        RPST => Some(field("res_type")?),
        _ => {
            return Err(invalid_request(
                "requested_token_type is not oci-upst or oci-rpst",
            ));
        }
    };
    let public_key = field("public_key")?;
    // A literal space is a `+` sent unencoded.
    if public_key.contains(' ') {
        return Err(invalid_request(
            "public_key holds a space: an unencoded '+'?",
        ));
    }
    let public_key = STANDARD
        .decode(&public_key)
        .ok()
        .filter(|der| is_rsa_public_key(der) && jwk_string(der).is_some())
        .ok_or_else(|| {
            invalid_request("public_key is not base64 of an RSA SubjectPublicKeyInfo")
        })?;
    Ok(Ask {
        subject_token: field("subject_token")?,
        public_key,
        res_type,
    })
}

/// The subject token's signature (by the trust's keys), `exp` and `nbf` (within the trust's
/// clock skew) and audience (one of the trust's `clientClaimValues`).
fn verify_subject(
    shared: &Shared,
    trust: &TrustSeed,
    token: &str,
    claims: &Value,
) -> Result<(), Refusal> {
    let (header, _) = jwt_parts(token).ok_or_else(|| invalid_grant("not a JWT"))?;
    let kid = header.get("kid").and_then(Value::as_str);
    let keys = match trust.public_keys {
        TrustKeys::Endpoint => shared.state().issuer_keys.clone(),
        TrustKeys::Pinned => shared.state().pinned_issuer_keys.clone(),
    };
    let signed = header.get("alg").and_then(Value::as_str) == Some("RS256")
        && keys
            .iter()
            .any(|k| kid.is_none_or(|kid| k.kid() == kid) && k.verify(token));
    if !signed {
        return Err(invalid_grant(
            "signature: the subject token does not verify with the trust's public keys",
        ));
    }
    let now = shared.now();
    let skew = Duration::from_secs(trust.clock_skew_secs);
    let time = |name: &str| {
        claims
            .get(name)
            .and_then(Value::as_u64)
            .map(|secs| UNIX_EPOCH + Duration::from_secs(secs))
    };
    let exp = time("exp").ok_or_else(|| invalid_grant("the subject token has no exp"))?;
    if exp + skew <= now {
        return Err(invalid_grant("expired: the subject token's exp has passed"));
    }
    if time("nbf").is_some_and(|nbf| nbf > now + skew) {
        return Err(invalid_grant(
            "not valid yet: the subject token's nbf is ahead",
        ));
    }
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !trust.client_claim_values.is_empty()
        && !audiences
            .iter()
            .any(|a| trust.client_claim_values.iter().any(|v| v == a))
    {
        return Err(invalid_grant(
            "audience: the subject token's aud holds none of the trust's clientClaimValues",
        ));
    }
    Ok(())
}

/// The service user of the first rule that matches the token (UPSTs).
fn service_user(trust: &TrustSeed, claims: &Value) -> Result<String, Refusal> {
    trust
        .impersonation_service_users
        .iter()
        .find(|rule| matches(&rule.rule, claims))
        .map(|rule| rule.value.clone())
        .ok_or_else(|| invalid_grant("no impersonation rule of the trust matches the subject"))
}

/// Whether `<claim> eq|co <value>` holds for the token's claims.
fn matches(rule: &str, claims: &Value) -> bool {
    let mut words = rule.splitn(3, ' ');
    let (Some(claim), Some(op), Some(value)) = (words.next(), words.next(), words.next()) else {
        return false;
    };
    let value = value.trim();
    let value = value
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .unwrap_or(value);
    let Some(actual) = claims.get(claim).and_then(Value::as_str) else {
        return false;
    };
    match op {
        "eq" => match value.split_once('*') {
            Some((prefix, suffix)) => actual.starts_with(prefix) && actual.ends_with(suffix),
            None => actual == value,
        },
        "co" => actual.contains(value),
        _ => false,
    }
}

/// Mints the session token: the submitted key as its `jwk` claim, and the claims of a UPST
/// (`sub` the service user, `tenant`, `source_authn_prin`, `sess_exp`) or of an RPST (`sub`
/// the subject, `res_type`, `res_tenant`, `ext_iss`).
fn mint(
    shared: &Shared,
    principal: Principal,
    ask: &Ask,
    issuer: &str,
    sub: &str,
) -> Result<String, Refusal> {
    let (tenancy, lifetime) = {
        let st = shared.state();
        (
            st.workload_tenancy.clone(),
            Duration::from_secs(st.lifetimes.federated_token_secs),
        )
    };
    let jwk = jwk_string(&ask.public_key).unwrap_or_default();
    let Principal::Federated { name, .. } = &principal else {
        return Err(invalid_request("internal: not a federated principal"));
    };
    let claims = match &ask.res_type {
        None => json!({
            "sub": name,
            "tenant": tenancy,
            "iss": "authService.oracle.com",
            "aud": "oci",
            "ttype": "upst",
            "jwk": jwk,
            "source_authn_prin": sub,
            "sess_exp": httpdate::fmt_http_date(shared.now() + lifetime),
        }),
        Some(res_type) => json!({
            "sub": sub,
            "iss": "authService.oracle.com",
            "aud": "oci",
            "ttype": "res_principal",
            "res_type": res_type,
            "res_tenant": tenancy,
            "ext_iss": issuer,
            "jwk": jwk,
        }),
    };
    shared
        .issue_token(
            TokenKind::Federated,
            principal,
            claims,
            lifetime,
            Some(ask.public_key.clone()),
        )
        .map(|(token, _)| token)
        .map_err(|_| {
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "signing failed",
            )
        })
}
