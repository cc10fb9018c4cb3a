use std::collections::BTreeMap;
use std::fmt;

use csi_grpc::{FilePath, MountError, Pod, validate_file_set};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

const SECRETS: &str = "secrets";
const AUTH_TYPE: &str = "authType";
const AUTH_SECRET_NAME: &str = "authSecretName";
const VAULT_ID: &str = "vaultId";

/// Longest secret name and vault OCID the Secrets API accepts (spec 2.2).
const MAX_OCI_PARAMETER_LEN: usize = 255;

/// The Go provider's prefixes, kept so messages read the same to existing users.
const HANDLE_PREFIX: &str = "unable to handle SecretProviderClass secrets";
const UNMARSHAL_PREFIX: &str = "unable to handle SecretProviderClass secrets: failed to unmarshal SecretProviderClass parameter \"secrets\"";
const RETRIEVE_PREFIX: &str = "unable to retrieve secrets";

/// Entries a mount's `secrets` list may have unless configured otherwise
/// (`server.max_secrets_per_mount`).
pub const DEFAULT_MAX_SECRETS: usize = 256;

pub use vault::Stage;

/// Which version of a secret to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VersionSelector {
    /// The version carrying a stage (`CURRENT` when the entry names neither).
    Stage(Stage),
    /// A version number, greater than 0.
    Number(u64),
}

/// One entry of the `secrets` parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretSpec {
    /// The secret's name in the vault, exactly as written (not trimmed, as in Go).
    pub name: String,
    /// Which version.
    pub selector: VersionSelector,
    /// Where the driver writes it: `fileName` trimmed, else `name` trimmed.
    pub path: FilePath,
}

/// How the provider authenticates to OCI (`authType`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthSpec {
    /// `user`: an API key from the Kubernetes Secret `authSecretName` in the pod's namespace.
    User {
        /// `authSecretName`.
        secret_name: String,
    },
    /// `instance`: the node's instance principal.
    Instance,
    /// `workload`: OKE workload identity of the pod's service account.
    Workload,
}

/// The SecretProviderClass parameters of an OCI mount, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountParameters {
    /// The secrets, in request order.
    pub secrets: Vec<SecretSpec>,
    /// `vaultId`: the vault OCID.
    pub vault_id: String,
    /// `authType` (and `authSecretName`).
    pub auth: AuthSpec,
}

/// A parameter the driver sent that cannot be used. Always `InvalidArgument`: retrying the
/// same SecretProviderClass cannot succeed. The message names the parameter, the entry and
/// the value; parameters hold names and OCIDs, never secret material.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParamError(String);

impl From<ParamError> for MountError {
    fn from(err: ParamError) -> Self {
        MountError::invalid_argument(err.0)
    }
}

/// `versionNumber` as written: Go accepts an integer or a quoted integer, nothing else.
#[derive(Debug)]
enum RawVersion {
    Integer(i128),
    Text(String),
    Other(String),
}

impl<'de> Deserialize<'de> for RawVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawVersion;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer version number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawVersion, E> {
                Ok(RawVersion::Integer(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawVersion, E> {
                Ok(RawVersion::Integer(v.into()))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<RawVersion, E> {
                Ok(RawVersion::Integer(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawVersion, E> {
                Ok(RawVersion::Other(format!("{v:?}")))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawVersion, E> {
                Ok(RawVersion::Other(v.to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawVersion, E> {
                Ok(RawVersion::Text(v.to_owned()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<RawVersion, E> {
                Ok(RawVersion::Text(String::new()))
            }
            fn visit_none<E: de::Error>(self) -> Result<RawVersion, E> {
                Ok(RawVersion::Text(String::new()))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecret {
    name: Option<String>,
    stage: Option<String>,
    #[serde(rename = "versionNumber")]
    version_number: Option<RawVersion>,
    #[serde(rename = "fileName")]
    file_name: Option<String>,
}

impl MountParameters {
    /// Validates the parameters of a mount. `pod` is needed where the identity depends on
    /// it (user and workload principals). At most [`DEFAULT_MAX_SECRETS`] entries.
    pub fn parse(attributes: &BTreeMap<String, String>, pod: &Pod) -> Result<Self, ParamError> {
        Self::parse_limited(attributes, pod, DEFAULT_MAX_SECRETS)
    }

    /// Like [`MountParameters::parse`] with at most `max_secrets` entries in `secrets`; the
    /// YAML parser stops at the first entry past it, so a list of thousands is never built.
    pub fn parse_limited(
        attributes: &BTreeMap<String, String>,
        pod: &Pod,
        max_secrets: usize,
    ) -> Result<Self, ParamError> {
        let raw = parse_secrets_yaml(attributes, max_secrets)?;
        let auth = parse_auth(attributes, pod)?;
        let vault_id = parse_vault_id(attributes)?;
        let secrets = check_secrets(raw)?;
        Ok(Self {
            secrets,
            vault_id,
            auth,
        })
    }
}

fn parse_secrets_yaml(
    attributes: &BTreeMap<String, String>,
    max_secrets: usize,
) -> Result<Vec<RawSecret>, ParamError> {
    let yaml = attributes.get(SECRETS).ok_or_else(|| {
        ParamError(format!(
            "{HANDLE_PREFIX}: missed \"secrets\" SecretProviderClass parameters"
        ))
    })?;
    if yaml.trim().is_empty() {
        return Err(ParamError(format!(
            "{HANDLE_PREFIX}: missed content of SecretProviderClass parameter \"secrets\""
        )));
    }
    let over = std::cell::Cell::new(false);
    let seed = CappedList {
        max: max_secrets,
        over: &over,
    };
    let parsed = serde_saphyr::with_deserializer_from_str(yaml, |de| {
        serde::de::DeserializeSeed::deserialize(seed, de)
    });
    if over.get() {
        return Err(ParamError(format!(
            "{UNMARSHAL_PREFIX}: the list has more than {max_secrets} entries, the most one \
             mount may have (server.max_secrets_per_mount); split it over several \
             SecretProviderClasses"
        )));
    }
    parsed.map_err(|e| {
        ParamError(format!(
            "{UNMARSHAL_PREFIX}: expected a YAML list of {{name, stage, versionNumber, fileName}}: {}",
            one_line(&e.to_string())
        ))
    })
}

/// A YAML sequence of [`RawSecret`] of at most `max` entries: past it, deserializing stops
/// with an error (and `over` set), before the rest of the list is built.
struct CappedList<'a> {
    max: usize,
    over: &'a std::cell::Cell<bool>,
}

impl<'de> serde::de::DeserializeSeed<'de> for CappedList<'_> {
    type Value = Vec<RawSecret>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for CappedList<'_> {
    type Value = Vec<RawSecret>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of secrets")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max));
        while out.len() < self.max {
            match seq.next_element::<RawSecret>()? {
                Some(entry) => out.push(entry),
                None => return Ok(out),
            }
        }
        // One more entry, of any shape, is one too many; it is not built.
        if seq.next_element::<de::IgnoredAny>()?.is_some() {
            self.over.set(true);
            return Err(de::Error::custom("too many entries"));
        }
        Ok(out)
    }
}

/// Pod events show one line; YAML errors may span several (with a source excerpt).
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn parse_auth(attributes: &BTreeMap<String, String>, pod: &Pod) -> Result<AuthSpec, ParamError> {
    const KINDS: &str = "expected one of user, instance, workload";
    let auth = match attributes.get(AUTH_TYPE).map(String::as_str) {
        None | Some("") => {
            return Err(ParamError(format!(
                "missed \"authType\" SecretProviderClass parameters: {KINDS}"
            )));
        }
        Some("instance") => AuthSpec::Instance,
        Some("workload") => AuthSpec::Workload,
        Some("user") => match attributes.get(AUTH_SECRET_NAME).map(|s| s.trim()) {
            Some(name) if !name.is_empty() => AuthSpec::User {
                secret_name: name.to_owned(),
            },
            _ => {
                return Err(ParamError(
                    "missed \"authSecretName\" SecretProviderClass parameters: authType \"user\" \
                     reads the API key from this Kubernetes Secret in the pod's namespace"
                        .to_owned(),
                ));
            }
        },
        Some(other) => {
            return Err(ParamError(format!(
                "invalid auth principal type, {other}: parameter \"authType\" {KINDS} (lower case)"
            )));
        }
    };
    let missing = |what: &str, key: &str| {
        ParamError(format!(
            "authType \"{}\" needs the pod's {what} ({key}); is podInfoOnMount enabled on the \
             secrets-store.csi.k8s.io CSIDriver?",
            match auth {
                AuthSpec::User { .. } => "user",
                AuthSpec::Instance => "instance",
                AuthSpec::Workload => "workload",
            }
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

fn parse_vault_id(attributes: &BTreeMap<String, String>) -> Result<String, ParamError> {
    match attributes.get(VAULT_ID).map(String::as_str) {
        None | Some("") => Err(ParamError(
            "missed \"vaultId\" SecretProviderClass parameters: the OCID of the vault that holds \
             the secrets"
                .to_owned(),
        )),
        Some(id) if id.len() > MAX_OCI_PARAMETER_LEN || id.trim() != id => {
            Err(ParamError(format!(
                "parameter \"vaultId\" {id:?} is not a vault OCID (at most {MAX_OCI_PARAMETER_LEN} \
             characters, no surrounding spaces)"
            )))
        }
        Some(id) => Ok(id.to_owned()),
    }
}

fn check_secrets(raw: Vec<RawSecret>) -> Result<Vec<SecretSpec>, ParamError> {
    if raw.is_empty() {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: requested secrets are missed: parameter \"secrets\" is an empty list"
        )));
    }
    let mut specs = Vec::with_capacity(raw.len());
    // Output path -> (index, whether it came from fileName), for duplicate messages.
    let mut paths: BTreeMap<String, (usize, bool)> = BTreeMap::new();
    for (index, item) in raw.into_iter().enumerate() {
        let spec = check_secret(index, &item)?;
        let from_file_name = item
            .file_name
            .as_deref()
            .is_some_and(|f| !f.trim().is_empty());
        if let Some((first, _)) =
            paths.insert(spec.path.as_str().to_owned(), (index, from_file_name))
        {
            let what = if from_file_name {
                "duplicated fileName name"
            } else {
                "duplicated secret name"
            };
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: {what}: {}: secrets[{first}] and secrets[{index}] would both \
                 be written to file {:?}",
                spec.path, spec.path
            )));
        }
        specs.push(spec);
    }
    validate_file_set(specs.iter().map(|s| &s.path)).map_err(|e| {
        ParamError(format!(
            "{RETRIEVE_PREFIX}: invalid file name in parameter \"secrets\": {e}"
        ))
    })?;
    Ok(specs)
}

fn check_secret(index: usize, item: &RawSecret) -> Result<SecretSpec, ParamError> {
    let name = item.name.clone().unwrap_or_default();
    if name.trim().is_empty() {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: missed secret name: secrets[{index}].name is empty"
        )));
    }
    if name.len() > MAX_OCI_PARAMETER_LEN {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].name is {} characters long; OCI secret names \
             have at most {MAX_OCI_PARAMETER_LEN}",
            name.len()
        )));
    }
    let stage = match item.stage.as_deref() {
        None | Some("") => None,
        Some(s) => Some(s.parse::<Stage>().map_err(|_| {
            ParamError(format!(
                "{UNMARSHAL_PREFIX}: secrets[{index}].stage {s:?} is not one of CURRENT, PENDING, \
                 LATEST, PREVIOUS, DEPRECATED (upper case)"
            ))
        })?),
    };
    let number = match &item.version_number {
        None => None,
        Some(raw) => parse_version_number(index, raw)?,
    };
    let selector = match (stage, number) {
        (Some(stage), Some(number)) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secret should be identified either with a version number or \
                 with stage: secrets[{index}] ({name:?}) has stage {stage} and versionNumber {number}"
            )));
        }
        (Some(stage), None) => VersionSelector::Stage(stage),
        (None, Some(number)) => VersionSelector::Number(number),
        (None, None) => VersionSelector::Stage(Stage::Current),
    };
    let (source, raw_path) = match item.file_name.as_deref().map(str::trim) {
        Some(f) if !f.is_empty() => ("fileName", f),
        _ => ("name", name.trim()),
    };
    let path = FilePath::new(raw_path).map_err(|e| {
        ParamError(format!(
            "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].{source}: {e}"
        ))
    })?;
    Ok(SecretSpec {
        name,
        selector,
        path,
    })
}

fn parse_version_number(index: usize, raw: &RawVersion) -> Result<Option<u64>, ParamError> {
    let bad = |shown: &str| {
        ParamError(format!(
            "{UNMARSHAL_PREFIX}: secrets[{index}].versionNumber {shown} must be a whole number \
             greater than 0"
        ))
    };
    match raw {
        RawVersion::Integer(n) => match u64::try_from(*n) {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(bad(&n.to_string())),
        },
        RawVersion::Text(t) if t.is_empty() => Ok(None),
        RawVersion::Text(t) => match t.parse::<u64>() {
            Ok(n) if n > 0 && t.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(n)),
            _ => Err(bad(&format!("{t:?}"))),
        },
        RawVersion::Other(o) => Err(bad(o)),
    }
}
