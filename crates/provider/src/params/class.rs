//! The class-level attributes: `authType` and `authSecretName`, `vaultId`, `region` and
//! `failoverRegion`, and the OCID check every OCID a user writes goes through.

use std::collections::BTreeMap;

use bounded::quote;
use csi_grpc::Pod;

use super::problems::{ParamError, nearest};
use super::spec::{
    AUTH_SECRET_NAME, AUTH_TYPE, AuthSpec, COMPARTMENT_ID, FAILOVER_REGION, FAILOVER_VAULT_ID,
    MAX_OCI_PARAMETER_LEN, REGION, SECRETS, VAULT_ID,
};

/// The class parameters the provider reads.
const CLASS_PARAMETERS: [&str; 8] = [
    SECRETS,
    VAULT_ID,
    AUTH_TYPE,
    AUTH_SECRET_NAME,
    REGION,
    FAILOVER_REGION,
    FAILOVER_VAULT_ID,
    COMPARTMENT_ID,
];

/// The driver's own attributes without a `/` (the others are `csi.storage.k8s.io/...`).
const DRIVER_ATTRIBUTES: [&str; 1] = ["secretProviderClass"];

/// The most warnings of one class.
const MAX_WARNINGS: usize = 8;

/// A warning for each attribute that looks like a misspelt class parameter (`vaultid`,
/// `regoin`), naming the parameter meant. Never an error: the driver passes attributes of
/// its own (`csi.storage.k8s.io/...`, `secretProviderClass`), and other providers' classes
/// may hold parameters of theirs.
pub(crate) fn misspelt_parameters(attributes: &BTreeMap<String, String>) -> Vec<String> {
    attributes
        .keys()
        .filter(|k| {
            let k = k.as_str();
            !CLASS_PARAMETERS.contains(&k) && !DRIVER_ATTRIBUTES.contains(&k) && !k.contains('/')
        })
        .filter_map(|k| {
            nearest(k, &CLASS_PARAMETERS).map(|meant| {
                format!(
                    "parameter {} is not one the provider reads (ignored); did you mean \"{meant}\"?",
                    quote(k)
                )
            })
        })
        .take(MAX_WARNINGS)
        .collect()
}

pub(crate) fn parse_auth(
    attributes: &BTreeMap<String, String>,
    pod: &Pod,
) -> Result<AuthSpec, ParamError> {
    const KINDS: &str = "expected one of user, instance, workload";
    let auth = match attributes.get(AUTH_TYPE).map(String::as_str) {
        None | Some("") => {
            return Err(ParamError::new(format!(
                "missed \"authType\" SecretProviderClass parameters: {KINDS}"
            )));
        }
        Some("instance") => AuthSpec::Instance,
        Some("workload") => AuthSpec::Workload,
        Some("user") => match attributes.get(AUTH_SECRET_NAME).map(|s| s.trim()) {
            Some(name) if !name.is_empty() && !is_kubernetes_name(name) => {
                return Err(ParamError::new(format!(
                    "parameter \"authSecretName\" {} is not a Kubernetes Secret name (lower-case \
                     letters, digits, '-' and '.', at most 253 characters)",
                    quote(name)
                )));
            }
            Some(name) if !name.is_empty() => AuthSpec::User {
                secret_name: name.to_owned(),
            },
            _ => {
                return Err(ParamError::new(
                    "missed \"authSecretName\" SecretProviderClass parameters: authType \"user\" \
                     reads the API key from this Kubernetes Secret in the pod's namespace"
                        .to_owned(),
                ));
            }
        },
        Some(other) => {
            return Err(ParamError::new(format!(
                "invalid auth principal type, {}: parameter \"authType\" {KINDS} (lower case)",
                quote(other)
            )));
        }
    };
    let missing = |what: &str, key: &str| {
        ParamError::new(format!(
            "authType \"{}\" needs the pod's {what} ({key}); is podInfoOnMount enabled on the \
             secrets-store.csi.k8s.io CSIDriver?",
            auth.auth_type()
        ))
    };
    let present = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
    match auth {
        AuthSpec::User { .. } | AuthSpec::Workload if !present(&pod.namespace) => {
            return Err(missing("namespace", "csi.storage.k8s.io/pod.namespace"));
        }
        AuthSpec::Workload if !present(&pod.service_account) => {
            return Err(missing(
                "service account",
                "csi.storage.k8s.io/serviceAccount.name",
            ));
        }
        _ => {}
    }
    Ok(auth)
}

/// A Kubernetes object name (a DNS-1123 subdomain): what the API server would accept, so
/// nothing else reaches a URL, a message or a log line.
fn is_kubernetes_name(name: &str) -> bool {
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    name.len() <= 253
        && edge(name.bytes().next())
        && edge(name.bytes().last())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// A region parameter as written: a region id or short code (`us-ashburn-1`, `iad`), never
/// a host or URL; whether the provider knows it is checked when the mount resolves it.
pub(crate) fn parse_region(
    attributes: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<String>, ParamError> {
    match attributes.get(key).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(r)
            if r.len() <= 64
                && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && regions::validate(r).is_ok() =>
        {
            Ok(Some(r.to_ascii_lowercase()))
        }
        Some(r) => Err(ParamError::new(format!(
            "parameter {key:?} {} is not a region id or short code (e.g. us-ashburn-1 or iad): \
             letters, digits and hyphens only, never a host",
            quote(r)
        ))),
    }
}

/// The class-level `vaultId`, when given; whether it is needed is decided per entry.
pub(crate) fn parse_vault_id(
    attributes: &BTreeMap<String, String>,
) -> Result<Option<String>, ParamError> {
    match attributes.get(VAULT_ID).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(id) => check_ocid("parameter \"vaultId\"", id, "vault").map(Some),
    }
}

/// The class-level `compartmentId`, when given: the compartment `tag` and `namePrefix`
/// entries list, unless they name their own.
pub(crate) fn parse_compartment_id(
    attributes: &BTreeMap<String, String>,
) -> Result<Option<String>, ParamError> {
    match attributes.get(COMPARTMENT_ID).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(id) => check_ocid("parameter \"compartmentId\"", id, "compartment").map(Some),
    }
}

/// An OCID a user wrote: at most 255 characters, no surrounding spaces, and (for secret and
/// vault OCIDs) of the right type, so a typo is named before any call.
pub(crate) fn check_ocid(what: &str, id: &str, kind: &str) -> Result<String, ParamError> {
    if id.len() > MAX_OCI_PARAMETER_LEN || id.trim() != id || id.is_empty() {
        return Err(ParamError::new(format!(
            "{what} {} is not a {kind} OCID (at most {MAX_OCI_PARAMETER_LEN} characters, no \
             surrounding spaces)",
            quote(id)
        )));
    }
    let prefix = match kind {
        "secret" => "ocid1.vaultsecret.",
        "vault" => "ocid1.vault.",
        other => &format!("ocid1.{other}."),
    };
    // The Go provider sent any vaultId as given; only OCIDs of what it did not read (secret
    // and certificate OCIDs, new) are held to their type.
    // A tenancy is its own root compartment.
    let root = kind == "compartment" && id.starts_with("ocid1.tenancy.");
    if kind != "vault" && !id.starts_with(prefix) && !root {
        return Err(ParamError::new(format!(
            "{what} {} is not a {kind} OCID: it must start with {prefix}",
            quote(id)
        )));
    }
    Ok(id.to_owned())
}
