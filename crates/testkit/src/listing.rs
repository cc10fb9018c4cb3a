//! The two listings: the Secrets API's ListSecretBundleVersions
//! (`GET /20190301/secretbundles/{secretId}/versions`) and the Vault API's ListSecrets
//! (`GET /20180608/secrets`), paged with `limit`, `page` and `opc-next-page` (a page holds
//! at most `limit` items and at most the emulator's page size), sorted as the SDKs
//! document (versions ascending by number unless `sortOrder=DESC`; secrets by time created,
//! newest first, or by name, A to Z), each authorised by its own policy.

use std::collections::BTreeMap;

use http::StatusCode;
use http::request::Parts;
use serde_json::json;

use crate::handlers::{authenticate, not_found, unauthenticated};
use crate::oci_error;
use crate::server::Reply;
use crate::state::{SecretsCall, Shared, VaultsCall, rfc3339};

fn query(parts: &Parts) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

fn invalid(parameter: &str) -> Reply {
    oci_error(
        StatusCode::BAD_REQUEST,
        "InvalidParameter",
        &format!("invalid parameter {parameter}"),
    )
}

/// The page of `items` that `limit` and `page` ask for, and the next page's token.
fn page<T>(
    mut items: Vec<T>,
    query: &BTreeMap<String, String>,
    (default_limit, page_size): (usize, usize),
) -> Result<(Vec<T>, Option<String>), Reply> {
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => default_limit,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(_) => return Err(invalid("limit")),
    };
    let offset = match query.get("page") {
        None => 0,
        Some(token) => match token
            .strip_prefix("emulator-page-")
            .map(str::parse::<usize>)
        {
            Some(Ok(n)) if n <= items.len() => n,
            _ => return Err(invalid("page")),
        },
    };
    let end = (offset + limit.min(page_size.max(1))).min(items.len());
    let next = (end < items.len()).then(|| format!("emulator-page-{end}"));
    items.truncate(end);
    Ok((items.split_off(offset), next))
}

/// ListSecretBundleVersions: the versions of a secret the principal may read.
pub(crate) fn versions(
    shared: &Shared,
    parts: &Parts,
    body: &[u8],
    secret_id: &str,
    call: &mut SecretsCall,
) -> Reply {
    if parts.method != http::Method::GET {
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
    let query = query(parts);
    if query.get("sortBy").is_some_and(|s| s != "VERSION_NUMBER") {
        return invalid("sortBy");
    }
    let descending = match query.get("sortOrder").map(String::as_str) {
        None | Some("ASC") => false,
        Some("DESC") => true,
        Some(_) => return invalid("sortOrder"),
    };
    let st = shared.state();
    let Some(secret) = st.secrets.iter().find(|s| s.id == secret_id) else {
        return not_found();
    };
    if !shared.allowed(&principal, &secret.access) {
        return not_found();
    }
    call.secret_id = Some(secret.id.clone());
    let mut versions: Vec<_> = secret.versions.iter().collect();
    versions.sort_by_key(|v| v.number);
    if descending {
        versions.reverse();
    }
    let (items, next) = match page(versions, &query, (10, st.list_page_size)) {
        Ok(paged) => paged,
        Err(reply) => return reply,
    };
    let items: Vec<serde_json::Value> = items
        .iter()
        .map(|v| {
            json!({
                "secretId": secret.id,
                "versionNumber": v.number,
                "versionName": v.name,
                "timeCreated": rfc3339(v.time_created),
                "timeOfDeletion": null,
                "timeOfExpiry": null,
                "stages": v.stages,
            })
        })
        .collect();
    let reply = Reply::json(StatusCode::OK, &serde_json::Value::Array(items));
    match next {
        Some(next) => reply.header("opc-next-page", next),
        None => reply,
    }
}

/// The Vault API endpoint: ListSecrets, recorded.
pub(crate) fn vaults(shared: &Shared, parts: &Parts, body: &[u8]) -> Reply {
    let mut call = VaultsCall {
        identity: None,
        target: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default(),
        items: 0,
        status: 0,
    };
    let reply = list_secrets(shared, parts, body, &mut call);
    call.status = reply.status.as_u16();
    shared.state().vaults_calls.push(call);
    reply
}

fn list_secrets(shared: &Shared, parts: &Parts, body: &[u8], call: &mut VaultsCall) -> Reply {
    if parts.uri.path() != "/20180608/secrets" {
        return not_found();
    }
    if parts.method != http::Method::GET {
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
    let query = query(parts);
    let Some(compartment) = query.get("compartmentId") else {
        return oci_error(
            StatusCode::BAD_REQUEST,
            "MissingParameter",
            "missing required parameter compartmentId",
        );
    };
    let by_name = match query.get("sortBy").map(String::as_str) {
        None | Some("TIMECREATED") => false,
        Some("NAME") => true,
        Some(_) => return invalid("sortBy"),
    };
    let descending = match query.get("sortOrder").map(String::as_str) {
        None => !by_name,
        Some("ASC") => false,
        Some("DESC") => true,
        Some(_) => return invalid("sortOrder"),
    };
    let state = query.get("lifecycleState").map(|s| s.to_ascii_uppercase());
    if state
        .as_deref()
        .is_some_and(|s| !crate::seed::LIFECYCLE_STATES.contains(&s))
    {
        return invalid("lifecycleState");
    }
    let st = shared.state();
    // `inspect secrets in compartment`: without it, OCI answers as for a compartment that
    // does not exist.
    let allowed = st
        .compartments
        .get(compartment)
        .is_some_and(|access| shared.allowed(&principal, access));
    if !allowed {
        return not_found();
    }
    let mut secrets: Vec<_> = st
        .secrets
        .iter()
        .filter(|s| &s.compartment_id == compartment)
        .filter(|s| query.get("vaultId").is_none_or(|v| *v == s.vault_id))
        .filter(|s| query.get("name").is_none_or(|n| *n == s.name))
        .filter(|s| state.as_ref().is_none_or(|l| *l == s.lifecycle_state))
        .collect();
    if by_name {
        secrets.sort_by(|a, b| a.name.cmp(&b.name));
    } else {
        secrets.sort_by_key(|s| (s.time_created, s.name.clone()));
    }
    if descending {
        secrets.reverse();
    }
    let (items, next) = match page(secrets, &query, (100, st.list_page_size)) {
        Ok(paged) => paged,
        Err(reply) => return reply,
    };
    call.items = items.len();
    let items: Vec<serde_json::Value> = items
        .iter()
        .map(|s| {
            json!({
                "compartmentId": s.compartment_id,
                "id": s.id,
                "secretName": s.name,
                "vaultId": s.vault_id,
                "lifecycleState": s.lifecycle_state,
                "timeCreated": rfc3339(s.time_created),
                "freeformTags": s.freeform_tags,
                "definedTags": {},
                "systemTags": {},
                "description": null,
                "keyId": "ocid1.key.oc1..emulator",
            })
        })
        .collect();
    let reply = Reply::json(StatusCode::OK, &serde_json::Value::Array(items));
    match next {
        Some(next) => reply.header("opc-next-page", next),
        None => reply,
    }
}
