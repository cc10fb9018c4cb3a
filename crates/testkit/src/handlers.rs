//! Request handlers of every endpoint.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::request::Parts;
use http::{Method, StatusCode};
use serde_json::json;

use crate::crypto::{
    is_rsa_public_key, pem_decode, rsa_verify_components, sha1_fingerprint, sha256_fingerprint,
};
use crate::seed::{STAGES, WorkloadRef};
use crate::server::{IssuerDocument, Reply};
use crate::sig;
use crate::state::{Principal, SecretsCall, Shared, TokenKind, rfc3339};
use crate::stats::Endpoint;
use crate::{kube_status, oci_error};

pub(crate) async fn handle(
    shared: &Shared,
    endpoint: Endpoint,
    parts: &Parts,
    body: &Bytes,
    rid: &str,
) -> Reply {
    match endpoint {
        Endpoint::Secrets => secrets(shared, parts, body, rid),
        Endpoint::Auth => federation(shared, parts, body),
        Endpoint::Proxymux => proxymux(shared, parts, body),
        Endpoint::Kube => kube(shared, parts, body),
        Endpoint::Imds => imds(shared, parts),
        Endpoint::Certificates => certificates(shared, parts, body),
        Endpoint::IdentityDomain => crate::domain::handle(shared, parts, body),
        Endpoint::Vaults => crate::listing::vaults(shared, parts, body),
    }
}

pub(crate) fn unauthenticated(msg: &str) -> Reply {
    oci_error(
        StatusCode::UNAUTHORIZED,
        "NotAuthenticated",
        &format!(
            "The required information to complete authentication was not provided or was incorrect: {msg}"
        ),
    )
}

pub(crate) fn not_found() -> Reply {
    oci_error(
        StatusCode::NOT_FOUND,
        "NotAuthorizedOrNotFound",
        "Authorization failed or requested resource not found.",
    )
}

/// Authenticates an OCI-signed request (user key or `ST$` token).
pub(crate) fn authenticate(
    shared: &Shared,
    parts: &Parts,
    body: &[u8],
) -> Result<Principal, String> {
    let params = sig::parse_authorization(parts)?;
    let signing = sig::signing_string(parts, body, &params, false, shared.now())?;
    if let Some(token) = params.key_id.strip_prefix("ST$") {
        let kinds = [TokenKind::Rpst, TokenKind::Instance, TokenKind::Federated];
        let rec = shared.check_token(token, &kinds)?;
        let verified = if rec.kind == TokenKind::Federated {
            // The identity domain's session tokens carry their key: OCI verifies with it.
            let (n, e) = jwk_of(token).ok_or("the session token has no usable jwk claim")?;
            rsa_verify_components(&n, &e, signing.as_bytes(), &params.signature)
        } else {
            let key = rec.session_spki.ok_or("token has no session key")?;
            sig::verify(&key, &signing, &params)
        };
        if !verified {
            return Err("signature does not verify".into());
        }
        return Ok(rec.principal);
    }
    let mut it = params.key_id.split('/');
    let (Some(tenancy), Some(user), Some(fp), None) = (it.next(), it.next(), it.next(), it.next())
    else {
        return Err("keyId is not tenancy/user/fingerprint".into());
    };
    let key = shared
        .state()
        .users
        .iter()
        .find(|k| k.tenancy == tenancy && k.user == user && k.fingerprint.eq_ignore_ascii_case(fp))
        .map(|k| k.spki.clone())
        .ok_or("unknown api key")?;
    let p = Principal::User {
        tenancy: tenancy.into(),
        user: user.into(),
    };
    if shared.is_revoked(&p) {
        return Err("principal has been revoked".into());
    }
    if !sig::verify(&key, &signing, &params) {
        return Err("signature does not verify".into());
    }
    Ok(p)
}

/// The modulus and exponent of the `jwk` claim (a JSON string holding a JWK) of a token.
fn jwk_of(token: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (_, claims) = crate::crypto::jwt_parts(token)?;
    let jwk: serde_json::Value = serde_json::from_str(claims.get("jwk")?.as_str()?).ok()?;
    let field = |name: &str| URL_SAFE_NO_PAD.decode(jwk.get(name)?.as_str()?).ok();
    Some((field("n")?, field("e")?))
}

fn secrets(shared: &Shared, parts: &Parts, body: &[u8], rid: &str) -> Reply {
    let mut call = SecretsCall {
        identity: None,
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default(),
        secret_id: None,
        version_number: None,
        status: 0,
        request_id: rid.to_owned(),
    };
    let versions = parts
        .uri
        .path()
        .strip_prefix("/20190301/secretbundles/")
        .and_then(|rest| rest.strip_suffix("/versions"))
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .map(str::to_owned);
    let reply = match versions {
        Some(id) => crate::listing::versions(shared, parts, body, &id, &mut call),
        None => secrets_inner(shared, parts, body, &mut call),
    };
    call.status = reply.status.as_u16();
    shared.state().secrets_calls.push(call);
    reply
}

fn secrets_inner(shared: &Shared, parts: &Parts, body: &[u8], call: &mut SecretsCall) -> Reply {
    let path = parts.uri.path();
    let query: BTreeMap<String, String> =
        url::form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let by_name = path == "/20190301/secretbundles/actions/getByName";
    let by_id = path
        .strip_prefix("/20190301/secretbundles/")
        .filter(|id| !id.is_empty() && !id.contains('/') && !by_name);
    if by_name && parts.method != Method::POST || by_id.is_some() && parts.method != Method::GET {
        return oci_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "method not allowed",
        );
    }
    if !by_name && by_id.is_none() {
        return not_found();
    }
    let principal = match authenticate(shared, parts, body) {
        Ok(p) => p,
        Err(e) => return unauthenticated(&e),
    };
    call.identity = Some(principal.clone());

    if by_name {
        for p in ["secretName", "vaultId"] {
            match query.get(p) {
                None => {
                    return oci_error(
                        StatusCode::BAD_REQUEST,
                        "MissingParameter",
                        &format!("missing required parameter {p}"),
                    );
                }
                Some(v) if v.is_empty() || v.len() > 255 => {
                    return oci_error(
                        StatusCode::BAD_REQUEST,
                        "InvalidParameter",
                        &format!("invalid parameter {p}"),
                    );
                }
                Some(_) => {}
            }
        }
    }
    let stage = query.get("stage");
    if let Some(s) = stage
        && !STAGES.contains(&s.as_str())
    {
        return oci_error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            "invalid parameter stage",
        );
    }
    let version_number = match query.get("versionNumber").map(|v| v.parse::<i64>()) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => {
            return oci_error(
                StatusCode::BAD_REQUEST,
                "InvalidParameter",
                "invalid parameter versionNumber",
            );
        }
    };
    let version_name = query.get("secretVersionName");

    let st = shared.state();
    let secret = if by_name {
        st.secrets.iter().find(|s| {
            Some(&s.name) == query.get("secretName") && Some(&s.vault_id) == query.get("vaultId")
        })
    } else {
        st.secrets.iter().find(|s| Some(s.id.as_str()) == by_id)
    };
    let Some(secret) = secret else {
        return not_found();
    };
    if !shared.allowed(&principal, &secret.access) {
        return not_found();
    }
    // Every selector given must match; none given selects CURRENT.
    let wanted_stage = match (stage, version_number, version_name) {
        (None, None, None) => Some("CURRENT"),
        (s, _, _) => s.map(String::as_str),
    };
    let version = secret.versions.iter().find(|v| {
        wanted_stage.is_none_or(|s| v.stages.iter().any(|vs| vs == s))
            && version_number.is_none_or(|n| v.number == n)
            && version_name.is_none_or(|n| v.name.as_ref() == Some(n))
    });
    let Some(v) = version else {
        return not_found();
    };
    call.secret_id = Some(secret.id.clone());
    call.version_number = Some(v.number);
    let bundle = json!({
        "secretId": secret.id,
        "timeCreated": rfc3339(v.time_created),
        "versionNumber": v.number,
        "versionName": v.name,
        "secretBundleContent": {"contentType": "BASE64", "content": STANDARD.encode(&v.content)},
        "timeOfDeletion": null,
        "timeOfExpiry": null,
        "stages": v.stages,
        "metadata": null,
    });
    let etag = crate::crypto::sha256_b64(format!("{}:{}", secret.id, v.number).as_bytes());
    Reply::json(StatusCode::OK, &bundle).header("etag", etag)
}

fn certificates(shared: &Shared, parts: &Parts, body: &[u8]) -> Reply {
    let query: BTreeMap<String, String> =
        url::form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let mut call = crate::certs::CertificateCall {
        identity: None,
        target: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default(),
        bundle_type: query.get("certificateBundleType").cloned(),
        version_number: None,
        status: 0,
    };
    let reply = certificates_inner(shared, parts, body, &query, &mut call);
    call.status = reply.status.as_u16();
    shared.state().certificate_calls.push(call);
    reply
}

fn certificates_inner(
    shared: &Shared,
    parts: &Parts,
    body: &[u8],
    query: &BTreeMap<String, String>,
    call: &mut crate::certs::CertificateCall,
) -> Reply {
    let Some((collection, id)) = crate::certs::route(parts.uri.path()) else {
        return not_found();
    };
    if parts.method != Method::GET {
        return oci_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "method not allowed",
        );
    }
    let principal = match authenticate(shared, parts, body) {
        Ok(p) => p,
        Err(e) => return unauthenticated(&e),
    };
    call.identity = Some(principal.clone());
    let invalid = |p: &str| {
        oci_error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            &format!("invalid parameter {p}"),
        )
    };
    let stage = query.get("stage");
    if stage.is_some_and(|s| !STAGES.contains(&s.as_str())) {
        return invalid("stage");
    }
    let version_number = match query.get("versionNumber").map(|v| v.parse::<i64>()) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => return invalid("versionNumber"),
    };
    let st = shared.state();
    let chain = format!("{}{}", st.cert_pki.intermediate_pem, st.cert_pki.root_pem);
    match collection {
        "caBundles" => {
            let Some(bundle) = st.ca_bundles.iter().find(|b| b.id == id) else {
                return not_found();
            };
            if !shared.allowed(&principal, &bundle.access) {
                return not_found();
            }
            Reply::json(
                StatusCode::OK,
                &json!({"id": bundle.id, "name": bundle.name, "caBundlePem": chain}),
            )
        }
        "certificateAuthorityBundles" => {
            let Some(ca) = st.certificate_authorities.iter().find(|c| c.id == id) else {
                return not_found();
            };
            if !shared.allowed(&principal, &ca.access) {
                return not_found();
            }
            if version_number.is_some_and(|n| n != 1)
                || stage.is_some_and(|s| s != "CURRENT" && s != "LATEST")
            {
                return not_found();
            }
            call.version_number = Some(1);
            Reply::json(
                StatusCode::OK,
                &json!({
                    "certificateAuthorityId": ca.id,
                    "certificateAuthorityName": ca.name,
                    "serialNumber": "01",
                    "certificatePem": st.cert_pki.intermediate_pem,
                    "certChainPem": st.cert_pki.root_pem,
                    "versionNumber": 1,
                    "stages": ["CURRENT", "LATEST"],
                }),
            )
        }
        _ => {
            let bundle_type = query
                .get("certificateBundleType")
                .map_or("CERTIFICATE_CONTENT_PUBLIC_ONLY", String::as_str);
            let with_key = match bundle_type {
                "CERTIFICATE_CONTENT_PUBLIC_ONLY" => false,
                "CERTIFICATE_CONTENT_WITH_PRIVATE_KEY" => true,
                _ => return invalid("certificateBundleType"),
            };
            let Some(cert) = st.certificates.iter().find(|c| c.seed.id == id) else {
                return not_found();
            };
            if !shared.allowed(&principal, &cert.seed.access) {
                return not_found();
            }
            let version_name = query.get("certificateVersionName");
            let wanted_stage = match (stage, version_number, version_name) {
                (None, None, None) => Some("CURRENT"),
                (s, _, _) => s.map(String::as_str),
            };
            let Some(v) = cert.versions.iter().find(|v| {
                wanted_stage.is_none_or(|s| v.stages.iter().any(|vs| vs == s))
                    && version_number.is_none_or(|n| v.number == n)
                    && version_name.is_none_or(|n| *n == format!("v{}", v.number))
            }) else {
                return not_found();
            };
            call.version_number = Some(v.number);
            let with_key = with_key && !cert.seed.no_private_key;
            let mut bundle = json!({
                "certificateBundleType": if with_key { "CERTIFICATE_CONTENT_WITH_PRIVATE_KEY" } else { "CERTIFICATE_CONTENT_PUBLIC_ONLY" },
                "certificateId": cert.seed.id,
                "certificateName": cert.seed.name,
                "versionNumber": v.number,
                "versionName": format!("v{}", v.number),
                "serialNumber": format!("{:02X}", v.number),
                "certificatePem": v.leaf_pem,
                // Root first: OCI does not document an order, and the provider must not rely on one.
                "certChainPem": format!("{}{}", st.cert_pki.root_pem, st.cert_pki.intermediate_pem),
                "timeCreated": rfc3339(v.not_before),
                "validity": {
                    "timeOfValidityNotBefore": rfc3339(v.not_before),
                    "timeOfValidityNotAfter": rfc3339(v.not_after),
                },
                "stages": v.stages,
            });
            if let Some(reason) = &v.revoked {
                bundle["revocationStatus"] =
                    json!({"timeRevoked": rfc3339(v.not_before), "revocationReason": reason});
            }
            if with_key {
                bundle["privateKeyPem"] = json!(v.key_pem);
                if let Some(p) = &cert.seed.passphrase {
                    bundle["privateKeyPemPassphrase"] = json!(p);
                }
            }
            Reply::json(StatusCode::OK, &bundle)
        }
    }
}

fn bearer(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

fn proxymux(shared: &Shared, parts: &Parts, body: &[u8]) -> Reply {
    if parts.uri.path() != "/resourcePrincipalSessionTokens" {
        return oci_error(StatusCode::NOT_FOUND, "NotFound", "unknown path");
    }
    if parts.method != Method::POST {
        return oci_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "method not allowed",
        );
    }
    let Some(token) = bearer(parts) else {
        return unauthenticated("missing bearer service-account token");
    };
    let record = match shared.check_token(token, &[TokenKind::Kube]) {
        Ok(r) => r,
        Err(e) => return unauthenticated(&e),
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return oci_error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            "body is not JSON",
        );
    };
    let Some(pem) = v.get("podKey").and_then(|k| k.as_str()) else {
        return oci_error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            "missing podKey",
        );
    };
    let Some(spki) = pem_decode(pem, &["PUBLIC KEY"]).filter(|d| is_rsa_public_key(d)) else {
        return oci_error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            "podKey is not a PEM RSA public key",
        );
    };
    let Principal::Workload {
        namespace,
        service_account,
        service_account_uid,
        tenancy,
    } = record.principal.clone()
    else {
        return unauthenticated("not a workload token");
    };
    let lifetime = Duration::from_secs(shared.state().lifetimes.rpst_secs);
    let claims = json!({
        "sub": format!("ocid1.workload.oc1..{service_account_uid}"),
        "iss": "authService.oracle.com",
        "aud": "oci",
        "ttype": "res_principal",
        "res_type": "workload",
        "res_tenant": tenancy,
        "res_compartment": tenancy,
        "namespace": namespace,
        "service_account": service_account,
        "service_account_uid": service_account_uid,
    });
    let issued = shared.issue_token(
        TokenKind::Rpst,
        record.principal.clone(),
        claims,
        lifetime,
        Some(spki),
    );
    let Ok((rpst, _)) = issued else {
        return oci_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "signing failed",
        );
    };
    shared.counters.update(|s| {
        *s.proxymux_exchanges
            .entry(WorkloadRef {
                namespace,
                service_account,
            })
            .or_default() += 1;
    });
    let inner = json!({"token": format!("ST${rpst}")}).to_string();
    Reply::json(StatusCode::OK, &serde_json::Value::Null)
        .body_raw(format!("\"{}\"", STANDARD.encode(inner)))
}

impl Reply {
    fn body_raw(mut self, body: String) -> Self {
        self.body = Bytes::from(body);
        self
    }
}

fn kube(shared: &Shared, parts: &Parts, body: &[u8]) -> Reply {
    let Some(token) = bearer(parts) else {
        return kube_status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    };
    if let Err(e) = shared.check_token(token, &[TokenKind::Kube]) {
        return kube_status(StatusCode::UNAUTHORIZED, "Unauthorized", &e);
    }
    if let Some(document) = crate::server::issuer_document(Endpoint::Kube, parts.uri.path()) {
        return issuer_document(shared, parts, document);
    }
    let segs: Vec<&str> = parts
        .uri
        .path()
        .trim_start_matches('/')
        .split('/')
        .collect();
    match (parts.method.clone(), segs.as_slice()) {
        (
            Method::POST,
            [
                "api",
                "v1",
                "namespaces",
                ns,
                "serviceaccounts",
                sa,
                "token",
            ],
        ) => token_request(shared, ns, sa, body),
        (Method::GET | Method::PATCH, ["api", "v1", "nodes", name]) => {
            crate::nodes::handle(shared, parts, name, body)
        }
        (Method::GET, ["api", "v1", "namespaces", ns, "secrets", name]) => {
            let st = shared.state();
            let Some(data) = st.kube_secrets.get(&((*ns).to_owned(), (*name).to_owned())) else {
                return kube_status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("secrets \"{name}\" not found"),
                );
            };
            let data: serde_json::Map<String, serde_json::Value> = data
                .iter()
                .map(|(k, v)| (k.clone(), STANDARD.encode(v).into()))
                .collect();
            let version = st
                .kube_secret_versions
                .get(&((*ns).to_owned(), (*name).to_owned()))
                .copied()
                .unwrap_or(1);
            Reply::json(
                StatusCode::OK,
                &json!({
                    "kind": "Secret",
                    "apiVersion": "v1",
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "uid": crate::state::derived_uid(ns, name),
                        "resourceVersion": version.to_string(),
                    },
                    "type": "Opaque",
                    "data": data,
                }),
            )
        }
        _ => kube_status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        ),
    }
}

/// The service-account issuer's discovery document and keys, as an API server serves them:
/// the issuer is what its tokens carry as `iss` (not this endpoint's URL), and `jwks_uri`
/// names the issuer's host, which a client need not reach.
fn issuer_document(shared: &Shared, parts: &Parts, document: IssuerDocument) -> Reply {
    if parts.method != Method::GET {
        return kube_status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        );
    }
    match document {
        IssuerDocument::Discovery => Reply::json(
            StatusCode::OK,
            &json!({
                "issuer": crate::SERVICE_ACCOUNT_ISSUER,
                "jwks_uri": format!("{}/openid/v1/jwks", crate::SERVICE_ACCOUNT_ISSUER),
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
            }),
        ),
        IssuerDocument::Jwks => {
            let keys: Vec<serde_json::Value> =
                shared.state().issuer_keys.iter().map(|k| k.jwk()).collect();
            Reply::json(StatusCode::OK, &json!({ "keys": keys }))
        }
    }
}

fn token_request(shared: &Shared, ns: &str, sa: &str, body: &[u8]) -> Reply {
    let wl = WorkloadRef {
        namespace: ns.into(),
        service_account: sa.into(),
    };
    let Some(principal) = shared.workload_of(&wl) else {
        return kube_status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("serviceaccounts \"{sa}\" not found"),
        );
    };
    if shared.is_revoked(&principal) {
        return kube_status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "service account revoked",
        );
    }
    let Ok(req) = serde_json::from_slice::<serde_json::Value>(body) else {
        return kube_status(StatusCode::BAD_REQUEST, "BadRequest", "body is not JSON");
    };
    let spec = req.get("spec").cloned().unwrap_or(json!({}));
    let mut audiences: Vec<String> = spec
        .get("audiences")
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if audiences.is_empty() {
        audiences.push(crate::SERVICE_ACCOUNT_ISSUER.into());
    }
    let default = shared.state().lifetimes.kube_token_default_secs;
    let secs = match spec.get("expirationSeconds") {
        None | Some(serde_json::Value::Null) => default,
        Some(v) => match v.as_u64() {
            Some(s) if s >= 600 => s,
            _ => {
                return kube_status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "spec.expirationSeconds: may not specify a duration less than 10 minutes",
                );
            }
        },
    };
    let Principal::Workload {
        service_account_uid,
        ..
    } = &principal
    else {
        return kube_status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "bad principal",
        );
    };
    let mut kio = json!({
        "namespace": ns,
        "serviceaccount": {"name": sa, "uid": service_account_uid},
    });
    let bound = spec.get("boundObjectRef").filter(|b| !b.is_null());
    if let Some(b) = bound
        && b.get("kind").and_then(|k| k.as_str()) == Some("Pod")
    {
        kio["pod"] = json!({
            "name": b.get("name").cloned().unwrap_or(json!("")),
            "uid": b.get("uid").cloned().unwrap_or(json!("")),
        });
    }
    let claims = json!({
        "aud": audiences,
        "iss": crate::SERVICE_ACCOUNT_ISSUER,
        "sub": format!("system:serviceaccount:{ns}:{sa}"),
        "kubernetes.io": kio,
    });
    let Ok((token, exp)) = shared.issue_token(
        TokenKind::Kube,
        principal,
        claims,
        Duration::from_secs(secs),
        None,
    ) else {
        return kube_status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "signing failed",
        );
    };
    shared
        .counters
        .update(|s| *s.token_requests.entry(wl).or_default() += 1);
    let mut out = req.clone();
    if !out.is_object() {
        out = json!({});
    }
    out["kind"] = json!("TokenRequest");
    out["apiVersion"] = json!("authentication.k8s.io/v1");
    out["metadata"] = json!({"name": sa, "namespace": ns});
    out["spec"] = spec;
    out["spec"]["audiences"] = json!(audiences_or(&req));
    out["spec"]["expirationSeconds"] = json!(secs);
    let mut exp_str = rfc3339(exp);
    // Kubernetes renders seconds precision.
    if let Some(dot) = exp_str.find('.') {
        exp_str.replace_range(dot..exp_str.len() - 1, "");
    }
    out["status"] = json!({"token": token, "expirationTimestamp": exp_str});
    Reply::json(StatusCode::CREATED, &out)
}

fn audiences_or(req: &serde_json::Value) -> serde_json::Value {
    match req.pointer("/spec/audiences") {
        Some(a) if a.as_array().is_some_and(|a| !a.is_empty()) => a.clone(),
        _ => json!([crate::SERVICE_ACCOUNT_ISSUER]),
    }
}

fn imds(shared: &Shared, parts: &Parts) -> Reply {
    if parts.method != Method::GET {
        return Reply::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    for h in ["forwarded", "x-forwarded-for", "x-forwarded-host"] {
        if parts.headers.contains_key(h) {
            return Reply::text(StatusCode::FORBIDDEN, "forwarded requests are refused");
        }
    }
    let auth = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if auth != Some("Bearer Oracle") {
        return Reply::text(
            StatusCode::UNAUTHORIZED,
            "Authorization: Bearer Oracle required",
        );
    }
    let inst = &shared.pki.instance;
    let st = shared.state();
    match parts.uri.path() {
        "/opc/v2/instance/region" => Reply::text(StatusCode::OK, st.region.clone()),
        "/opc/v2/instance/regionInfo" => Reply::json(
            StatusCode::OK,
            &json!({
                "realmKey": "oc1",
                "realmDomainComponent": "oraclecloud.com",
                "regionKey": region_key(&st.region),
                "regionIdentifier": st.region,
            }),
        ),
        "/opc/v2/identity/cert.pem" => Reply::text(StatusCode::OK, inst.cert_pem.clone()),
        "/opc/v2/identity/key.pem" => Reply::text(StatusCode::OK, inst.key_pem.clone()),
        "/opc/v2/identity/intermediate.pem" => {
            Reply::text(StatusCode::OK, inst.intermediate_pem.clone())
        }
        _ => Reply::text(StatusCode::NOT_FOUND, "not found"),
    }
}

fn region_key(region: &str) -> String {
    match region {
        "us-ashburn-1" => "IAD",
        "us-phoenix-1" => "PHX",
        "eu-frankfurt-1" => "FRA",
        "uk-london-1" => "LHR",
        _ => return region.to_ascii_uppercase(),
    }
    .into()
}

fn federation(shared: &Shared, parts: &Parts, body: &[u8]) -> Reply {
    if parts.uri.path() != "/v1/x509" {
        return oci_error(StatusCode::NOT_FOUND, "NotFound", "unknown path");
    }
    if parts.method != Method::POST {
        return oci_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "method not allowed",
        );
    }
    match federation_inner(shared, parts, body) {
        Ok(reply) => reply,
        Err(e) => unauthenticated(&e),
    }
}

fn federation_inner(shared: &Shared, parts: &Parts, body: &[u8]) -> Result<Reply, String> {
    let params = sig::parse_authorization(parts)?;
    let signing = sig::signing_string(parts, body, &params, true, shared.now())?;
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| "federation body is not JSON")?;
    let cert_b64 = v
        .get("certificate")
        .and_then(|c| c.as_str())
        .ok_or("missing certificate")?;
    let cert_der = STANDARD
        .decode(cert_b64)
        .map_err(|_| "certificate is not base64")?;
    let session_spki = STANDARD
        .decode(
            v.get("publicKey")
                .and_then(|c| c.as_str())
                .ok_or("missing publicKey")?,
        )
        .map_err(|_| "publicKey is not base64")?;
    if !is_rsa_public_key(&session_spki) {
        return Err("publicKey is not an RSA public key".into());
    }
    let mut it = params.key_id.splitn(3, '/');
    let (Some(tenancy), Some(form), Some(fp)) = (it.next(), it.next(), it.next()) else {
        return Err("keyId is not tenancy/fed-x509/fingerprint".into());
    };
    let actual_fp = match form {
        "fed-x509" => sha1_fingerprint(&cert_der),
        "fed-x509-sha256" => sha256_fingerprint(&cert_der),
        _ => return Err("keyId is not a federation key id".into()),
    };
    if !actual_fp.eq_ignore_ascii_case(fp) {
        return Err("fingerprint does not match the certificate".into());
    }
    // The only leaf this emulator knows is the one its instance metadata serves.
    let inst = &shared.pki.instance;
    if cert_der != inst.cert_der {
        return Err("certificate was not issued by this emulator".into());
    }
    let (inst_tenancy, instance_id, lifetime) = {
        let st = shared.state();
        (
            st.instance_tenancy.clone(),
            st.instance_id.clone(),
            Duration::from_secs(st.lifetimes.instance_token_secs),
        )
    };
    if tenancy != inst_tenancy {
        return Err("tenancy in keyId does not match the certificate".into());
    }
    if !sig::verify(&inst.leaf_spki, &signing, &params) {
        return Err("signature does not verify".into());
    }
    let principal = Principal::Instance {
        tenancy: inst_tenancy.clone(),
        instance_id: instance_id.clone(),
    };
    if shared.is_revoked(&principal) {
        return Err("principal has been revoked".into());
    }
    let claims = json!({
        "sub": instance_id,
        "iss": "authService.oracle.com",
        "aud": "oci",
        "ttype": "x509",
        "opc-tenant": inst_tenancy,
        "opc-instance": instance_id,
        "opc-certtype": "instance",
    });
    let (token, _) = shared
        .issue_token(
            TokenKind::Instance,
            principal,
            claims,
            lifetime,
            Some(session_spki),
        )
        .map_err(|e| e.to_string())?;
    shared.counters.update(|s| s.federations += 1);
    Ok(Reply::json(StatusCode::OK, &json!({"token": token})))
}
