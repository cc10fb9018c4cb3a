use std::collections::BTreeMap;
use std::fmt;

use csi_grpc::{FilePath, MountError, Pod, validate_file_set};

use crate::extract::{Format, KeySpec};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

const SECRETS: &str = "secrets";
const AUTH_TYPE: &str = "authType";
const AUTH_SECRET_NAME: &str = "authSecretName";
const VAULT_ID: &str = "vaultId";
const REGION: &str = "region";
const FAILOVER_REGION: &str = "failoverRegion";
const FAILOVER_VAULT_ID: &str = "failoverVaultId";

/// Longest secret name and vault OCID the Secrets API accepts (spec 2.2).
const MAX_OCI_PARAMETER_LEN: usize = 255;

/// The Go provider's prefixes, kept so messages read the same to existing users.
const HANDLE_PREFIX: &str = "unable to handle SecretProviderClass secrets";
const UNMARSHAL_PREFIX: &str = "unable to handle SecretProviderClass secrets: failed to unmarshal SecretProviderClass parameter \"secrets\"";
const RETRIEVE_PREFIX: &str = "unable to retrieve secrets";

/// Entries a mount's `secrets` list may have unless configured otherwise
/// (`server.max_secrets_per_mount`).
pub const DEFAULT_MAX_SECRETS: usize = 256;

/// Files a mount may write unless configured otherwise (`server.max_files_per_mount`):
/// entries, `keys` items and certificate files together.
pub const DEFAULT_MAX_FILES: usize = 256;

/// How much of a `secrets` list is parsed at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseLimits {
    /// Entries (`server.max_secrets_per_mount`).
    pub max_secrets: usize,
    /// Files, every kind counted (`server.max_files_per_mount`).
    pub max_files: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        Self {
            max_secrets: DEFAULT_MAX_SECRETS,
            max_files: DEFAULT_MAX_FILES,
        }
    }
}

std::thread_local! {
    /// Files the list being parsed on this thread may still name (`None`: no parse under
    /// way). The YAML parse is synchronous, so the count cannot cross another parse.
    static FILES_LEFT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Takes one file from the parse's allowance; `false` once it is used up.
fn take_file() -> bool {
    FILES_LEFT.with(|left| match left.get() {
        Some(0) => false,
        Some(n) => {
            left.set(Some(n - 1));
            true
        }
        None => true,
    })
}

/// A `keys` list, each item counted against the files the mount may write as it is read.
#[derive(Debug)]
struct CappedKeys(Vec<RawKey>);

impl<'de> Deserialize<'de> for CappedKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeysVisitor;
        impl<'de> Visitor<'de> for KeysVisitor {
            type Value = CappedKeys;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of keys")
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<CappedKeys, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
                while let Some(key) = seq.next_element::<RawKey>()? {
                    if !take_file() {
                        return Err(de::Error::custom(TOO_MANY_FILES));
                    }
                    out.push(key);
                }
                Ok(CappedKeys(out))
            }
        }
        deserializer.deserialize_seq(KeysVisitor)
    }
}

/// The marker of the parse error that the file allowance ran out.
const TOO_MANY_FILES: &str = "too many files";

pub use vault::Stage;

/// Which version of a secret to fetch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum VersionSelector {
    /// The version carrying a stage (`CURRENT` when the entry names none).
    Stage(Stage),
    /// A version number, greater than 0.
    Number(u64),
    /// OCI's `secretVersionName`.
    Name(String),
}

/// Which secret an entry names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SecretSource {
    /// `name` in a vault: the entry's `vaultId`, else the class-level one.
    Name {
        /// The secret's name, exactly as written (not trimmed, as in Go).
        name: String,
        /// The vault OCID.
        vault_id: String,
    },
    /// `secretId`: a secret OCID (GetSecretBundle; no vault needed).
    Id(String),
}

impl SecretSource {
    /// How messages name it: the name, or the OCID.
    pub fn display(&self) -> &str {
        match self {
            SecretSource::Name { name, .. } => name,
            SecretSource::Id(id) => id,
        }
    }
}

/// How a secret's content is encoded (after OCI's transport Base64 is removed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// Written as it is (binary safe): `utf-8`, the default.
    #[default]
    Utf8,
    /// Base64 (standard alphabet, padding optional), decoded before writing.
    Base64,
    /// Hexadecimal, decoded before writing.
    Hex,
}

impl Encoding {
    /// The name users write.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Utf8 => "utf-8",
            Encoding::Base64 => "base64",
            Encoding::Hex => "hex",
        }
    }
}

/// One entry of the `secrets` parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretSpec {
    /// Its position in the `secrets` list (messages say `secrets[index]`).
    pub index: usize,
    /// Which secret.
    pub source: SecretSource,
    /// Which version.
    pub selector: VersionSelector,
    /// Where the driver writes it: `fileName` trimmed, else `name` trimmed, else the
    /// OCID's last segment.
    pub path: FilePath,
    /// The file's mode (`mode`); `None`: the request's permission.
    pub mode: Option<csi_grpc::FileMode>,
    /// How the content is encoded (`encoding`).
    pub encoding: Encoding,
    /// Files made from keys of the (JSON or YAML) content (`keys`).
    pub keys: Vec<KeySpec>,
    /// The parser for `keys` (`format`); `None`: JSON, then YAML.
    pub format: Option<Format>,
    /// Whether the whole secret is written to `path`: always without `keys`, and with
    /// them only when the entry sets its own `fileName`.
    pub whole: bool,
    /// Where this entry is read in the failover region: the same OCID, or the name in the
    /// entry's (else the class's) `failoverVaultId`. `None` without `failoverRegion`.
    pub failover: Option<SecretSource>,
}

impl SecretSpec {
    /// Every file this entry writes.
    pub fn files(&self) -> impl Iterator<Item = &FilePath> {
        self.whole
            .then_some(&self.path)
            .into_iter()
            .chain(self.keys.iter().map(|k| &k.path))
    }
}

/// What a certificate entry reads from the OCI Certificates service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CertificateKind {
    /// `certificateId`: leaf, chain and (with `privateKey: true`) key.
    Certificate,
    /// `certificateAuthorityId`: the CA's certificate and chain, as `ca.crt`.
    CertificateAuthority,
    /// `caBundleId`: a CA bundle, as `ca.crt`.
    CaBundle,
}

impl CertificateKind {
    /// The entry field that names it.
    pub fn field(self) -> &'static str {
        match self {
            CertificateKind::Certificate => "certificateId",
            CertificateKind::CertificateAuthority => "certificateAuthorityId",
            CertificateKind::CaBundle => "caBundleId",
        }
    }
}

/// One certificate entry of the `secrets` parameter (issue 15).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateSpec {
    /// Its position in the `secrets` list.
    pub index: usize,
    /// Certificate, CA or CA bundle.
    pub kind: CertificateKind,
    /// The OCID.
    pub id: String,
    /// Which version (`CURRENT` by default; CA bundles have none).
    pub selector: VersionSelector,
    /// Whether the key is asked for and written (`privateKey: true`).
    pub private_key: bool,
    /// `directory/tls.crt` (or `certFileName`); certificates only.
    pub cert_path: Option<FilePath>,
    /// `directory/ca.crt` (or `chainFileName`).
    pub chain_path: FilePath,
    /// `directory/tls.key` (or `keyFileName`), with `privateKey: true` only.
    pub key_path: Option<FilePath>,
    /// The files' mode (`mode`); `None`: the request's permission.
    pub mode: Option<csi_grpc::FileMode>,
}

impl CertificateSpec {
    /// Every file this entry writes.
    pub fn files(&self) -> impl Iterator<Item = &FilePath> {
        self.cert_path
            .iter()
            .chain(std::iter::once(&self.chain_path))
            .chain(self.key_path.iter())
    }
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

/// The `authType` of a SecretProviderClass, without its details: what an operator allows
/// (`[auth] allowed_types`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum AuthType {
    /// `user`.
    User,
    /// `instance`.
    Instance,
    /// `workload`.
    Workload,
}

impl AuthType {
    /// All three, the default: the Go provider allows every type.
    pub const ALL: [AuthType; 3] = [AuthType::User, AuthType::Instance, AuthType::Workload];

    /// The parameter's value.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthType::User => "user",
            AuthType::Instance => "instance",
            AuthType::Workload => "workload",
        }
    }
}

impl fmt::Display for AuthType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AuthSpec {
    /// Its type.
    pub fn auth_type(&self) -> AuthType {
        match self {
            AuthSpec::User { .. } => AuthType::User,
            AuthSpec::Instance => AuthType::Instance,
            AuthSpec::Workload => AuthType::Workload,
        }
    }
}

/// The SecretProviderClass parameters of an OCI mount, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountParameters {
    /// The secrets, in request order.
    pub secrets: Vec<SecretSpec>,
    /// The certificate entries, in request order.
    pub certificates: Vec<CertificateSpec>,
    /// The class-level `vaultId`, if given (each `name` entry has its vault in its
    /// [`SecretSource`]).
    pub vault_id: Option<String>,
    /// `authType` (and `authSecretName`).
    pub auth: AuthSpec,
    /// `region`: read from this region instead of the principal's.
    pub region: Option<String>,
    /// `failoverRegion`: where an entry is read when the primary region fails with a
    /// connection error, 5xx, 429 after retries or a timeout.
    pub failover_region: Option<String>,
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

/// `mode` as written: a string of octal digits; a YAML integer is refused (YAML 1.1 reads
/// `0400` as octal 256, YAML 1.2 as decimal 400).
#[derive(Debug)]
enum RawMode {
    Text(String),
    Integer(String),
    Other,
}

impl<'de> Deserialize<'de> for RawMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quoted octal mode such as \"0400\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawMode, E> {
                Ok(RawMode::Integer(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawMode, E> {
                Ok(RawMode::Integer(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawMode, E> {
                Ok(RawMode::Integer(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<RawMode, E> {
                Ok(RawMode::Other)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawMode, E> {
                Ok(RawMode::Text(v.to_owned()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<RawMode, E> {
                Ok(RawMode::Text(String::new()))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecret {
    name: Option<String>,
    #[serde(rename = "secretId")]
    secret_id: Option<String>,
    #[serde(rename = "vaultId")]
    vault_id: Option<String>,
    stage: Option<String>,
    #[serde(rename = "versionNumber")]
    version_number: Option<RawVersion>,
    #[serde(rename = "versionName")]
    version_name: Option<String>,
    #[serde(rename = "fileName")]
    file_name: Option<String>,
    mode: Option<RawMode>,
    encoding: Option<String>,
    keys: Option<CappedKeys>,
    format: Option<String>,
    #[serde(rename = "failoverVaultId")]
    failover_vault_id: Option<String>,
    #[serde(rename = "certificateId")]
    certificate_id: Option<String>,
    #[serde(rename = "certificateAuthorityId")]
    certificate_authority_id: Option<String>,
    #[serde(rename = "caBundleId")]
    ca_bundle_id: Option<String>,
    #[serde(rename = "privateKey")]
    private_key: Option<bool>,
    directory: Option<String>,
    #[serde(rename = "certFileName")]
    cert_file_name: Option<String>,
    #[serde(rename = "chainFileName")]
    chain_file_name: Option<String>,
    #[serde(rename = "keyFileName")]
    key_file_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    key: Option<String>,
    #[serde(rename = "fileName")]
    file_name: Option<String>,
    mode: Option<RawMode>,
}

impl MountParameters {
    /// Validates the parameters of a mount. `pod` is needed where the identity depends on
    /// it (user and workload principals). At most [`DEFAULT_MAX_SECRETS`] entries.
    pub fn parse(attributes: &BTreeMap<String, String>, pod: &Pod) -> Result<Self, ParamError> {
        Self::parse_within(attributes, pod, ParseLimits::default())
    }

    /// Like [`MountParameters::parse`] with at most `max_secrets` entries in `secrets` (and
    /// the default file limit).
    pub fn parse_limited(
        attributes: &BTreeMap<String, String>,
        pod: &Pod,
        max_secrets: usize,
    ) -> Result<Self, ParamError> {
        Self::parse_within(
            attributes,
            pod,
            ParseLimits {
                max_secrets,
                ..ParseLimits::default()
            },
        )
    }

    /// Like [`MountParameters::parse`] within `limits`: the YAML parser stops at the first
    /// entry past `max_secrets` and at the first entry or `keys` item past `max_files`, so
    /// a list of thousands is never built; the files of every kind are counted again
    /// exactly once the entries are checked.
    pub fn parse_within(
        attributes: &BTreeMap<String, String>,
        pod: &Pod,
        limits: ParseLimits,
    ) -> Result<Self, ParamError> {
        let raw = parse_secrets_yaml(attributes, limits)?;
        let auth = parse_auth(attributes, pod)?;
        let vault_id = parse_vault_id(attributes)?;
        let region = parse_region(attributes, REGION)?;
        let failover_region = parse_region(attributes, FAILOVER_REGION)?;
        let failover_vault = match attributes.get(FAILOVER_VAULT_ID).map(String::as_str) {
            None | Some("") => None,
            Some(id) => Some(check_ocid("parameter \"failoverVaultId\"", id, "vault")?),
        };
        if failover_vault.is_some() && failover_region.is_none() {
            return Err(ParamError(
                "parameter \"failoverVaultId\" needs \"failoverRegion\", the region of that vault"
                    .to_owned(),
            ));
        }
        if let (Some(primary), Some(failover)) = (&region, &failover_region)
            && primary == failover
        {
            return Err(ParamError(format!(
                "parameter \"failoverRegion\" {failover:?} is the primary region: name another"
            )));
        }
        let failover = failover_region.as_ref().map(|_| failover_vault.as_deref());
        let (secrets, certificates) = check_secrets(raw, vault_id.as_deref(), failover)?;
        let files = secrets.iter().map(|s| s.files().count()).sum::<usize>()
            + certificates
                .iter()
                .map(|c| c.files().count())
                .sum::<usize>();
        if files > limits.max_files {
            return Err(too_many_files(files, limits.max_files));
        }
        Ok(Self {
            secrets,
            certificates,
            vault_id,
            auth,
            region,
            failover_region,
        })
    }
}

fn too_many_files(files: usize, max: usize) -> ParamError {
    ParamError(format!(
        "{RETRIEVE_PREFIX}: the mount would write {files} files (entries, keys items and \
         certificate files), more than the {max} one mount may write \
         (server.max_files_per_mount); split it over several SecretProviderClasses"
    ))
}

fn parse_secrets_yaml(
    attributes: &BTreeMap<String, String>,
    limits: ParseLimits,
) -> Result<Vec<RawSecret>, ParamError> {
    let max_secrets = limits.max_secrets;
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
    let previous = FILES_LEFT.with(|left| left.replace(Some(limits.max_files)));
    let parsed = serde_saphyr::with_deserializer_from_str(yaml, |de| {
        serde::de::DeserializeSeed::deserialize(seed, de)
    });
    let files_over = FILES_LEFT.with(|left| left.replace(previous)) == Some(0)
        && parsed
            .as_ref()
            .is_err_and(|e| e.to_string().contains(TOO_MANY_FILES));
    if files_over {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: the list names more than {} files (entries and keys items), \
             the most one mount may write (server.max_files_per_mount); parsing stopped there: \
             split it over several SecretProviderClasses",
            limits.max_files
        )));
    }
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
                Some(entry) => {
                    // The entry's own file, unless it has keys (which counted themselves as
                    // they were read, and an entry with keys writes the whole secret only
                    // with fileName): a lower bound, the exact count follows the checks.
                    if entry.keys.is_none() && !take_file() {
                        return Err(de::Error::custom(TOO_MANY_FILES));
                    }
                    out.push(entry);
                }
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

/// A region parameter as written: a region id or short code (`us-ashburn-1`, `iad`), never
/// a host or URL; whether the provider knows it is checked when the mount resolves it.
fn parse_region(
    attributes: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<String>, ParamError> {
    match attributes.get(key).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(r)
            if r.len() <= 64
                && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && auth::region::validate(r).is_ok() =>
        {
            Ok(Some(r.to_ascii_lowercase()))
        }
        Some(r) => Err(ParamError(format!(
            "parameter {key:?} {r:?} is not a region id or short code (e.g. us-ashburn-1 or iad): \
             letters, digits and hyphens only, never a host"
        ))),
    }
}

/// The class-level `vaultId`, when given; whether it is needed is decided per entry.
fn parse_vault_id(attributes: &BTreeMap<String, String>) -> Result<Option<String>, ParamError> {
    match attributes.get(VAULT_ID).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(id) => check_ocid("parameter \"vaultId\"", id, "vault").map(Some),
    }
}

/// An OCID a user wrote: at most 255 characters, no surrounding spaces, and (for secret and
/// vault OCIDs) of the right type, so a typo is named before any call.
fn check_ocid(what: &str, id: &str, kind: &str) -> Result<String, ParamError> {
    if id.len() > MAX_OCI_PARAMETER_LEN || id.trim() != id || id.is_empty() {
        return Err(ParamError(format!(
            "{what} {id:?} is not a {kind} OCID (at most {MAX_OCI_PARAMETER_LEN} characters, no \
             surrounding spaces)"
        )));
    }
    let prefix = match kind {
        "secret" => "ocid1.vaultsecret.",
        "vault" => "ocid1.vault.",
        other => &format!("ocid1.{other}."),
    };
    // The Go provider sent any vaultId as given; only OCIDs of what it did not read (secret
    // and certificate OCIDs, new) are held to their type.
    if kind != "vault" && !id.starts_with(prefix) {
        return Err(ParamError(format!(
            "{what} {id:?} is not a {kind} OCID: it must start with {prefix}"
        )));
    }
    Ok(id.to_owned())
}

/// `failover`: `None` without `failoverRegion`, else the class-level `failoverVaultId`.
fn check_secrets(
    raw: Vec<RawSecret>,
    class_vault: Option<&str>,
    failover: Option<Option<&str>>,
) -> Result<(Vec<SecretSpec>, Vec<CertificateSpec>), ParamError> {
    if raw.is_empty() {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: requested secrets are missed: parameter \"secrets\" is an empty list"
        )));
    }
    let mut specs = Vec::with_capacity(raw.len());
    // Output path -> the index of the entry that writes it, for duplicate messages.
    let mut paths: BTreeMap<String, usize> = BTreeMap::new();
    let mut certificates = Vec::new();
    for (index, item) in raw.into_iter().enumerate() {
        if let Some(kind) = certificate_kind(&item) {
            let spec = check_certificate(index, kind, &item)?;
            for path in spec.files() {
                if let Some(first) = paths.insert(path.as_str().to_owned(), index) {
                    return Err(ParamError(format!(
                        "{RETRIEVE_PREFIX}: duplicated file name: {path}: secrets[{first}] and \
                         secrets[{index}] would both be written to file {:?}",
                        path.as_str()
                    )));
                }
            }
            certificates.push(spec);
            continue;
        }
        refuse_certificate_fields(index, &item)?;
        let spec = check_secret(index, &item, class_vault, failover)?;
        let from_file_name = item
            .file_name
            .as_deref()
            .is_some_and(|f| !f.trim().is_empty());
        for (k, key) in spec.keys.iter().enumerate() {
            if let Some(first) = paths.insert(key.path.as_str().to_owned(), index) {
                return Err(ParamError(format!(
                    "{RETRIEVE_PREFIX}: duplicated fileName name: {}: secrets[{first}] and \
                     secrets[{index}].keys[{k}] would both be written to file {:?}",
                    key.path, key.path
                )));
            }
        }
        if !spec.whole {
            specs.push(spec);
            continue;
        }
        if let Some(first) = paths.insert(spec.path.as_str().to_owned(), index) {
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
    validate_file_set(
        specs
            .iter()
            .flat_map(SecretSpec::files)
            .chain(certificates.iter().flat_map(CertificateSpec::files)),
    )
    .map_err(|e| {
        ParamError(format!(
            "{RETRIEVE_PREFIX}: invalid file name in parameter \"secrets\": {e}"
        ))
    })?;
    Ok((specs, certificates))
}

/// The certificate kind an entry names, if it names one (several are refused later).
fn certificate_kind(item: &RawSecret) -> Option<CertificateKind> {
    [
        (&item.certificate_id, CertificateKind::Certificate),
        (
            &item.certificate_authority_id,
            CertificateKind::CertificateAuthority,
        ),
        (&item.ca_bundle_id, CertificateKind::CaBundle),
    ]
    .into_iter()
    .find_map(|(id, kind)| id.as_deref().is_some_and(|v| !v.is_empty()).then_some(kind))
}

/// The kinds of entry a field applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Applies {
    secret: bool,
    certificate: bool,
    certificate_authority: bool,
    ca_bundle: bool,
}

impl Applies {
    const SECRET: Self = Self::new(true, false, false, false);
    const ANY_CERTIFICATE: Self = Self::new(false, true, true, true);
    const VERSIONED: Self = Self::new(true, true, true, false);
    const LEAF: Self = Self::new(false, true, false, false);
    const EVERY: Self = Self::new(true, true, true, true);

    const fn new(
        secret: bool,
        certificate: bool,
        certificate_authority: bool,
        ca_bundle: bool,
    ) -> Self {
        Self {
            secret,
            certificate,
            certificate_authority,
            ca_bundle,
        }
    }

    fn to(self, kind: Option<CertificateKind>) -> bool {
        match kind {
            None => self.secret,
            Some(CertificateKind::Certificate) => self.certificate,
            Some(CertificateKind::CertificateAuthority) => self.certificate_authority,
            Some(CertificateKind::CaBundle) => self.ca_bundle,
        }
    }
}

impl RawSecret {
    /// The fields given, as written, with the kinds of entry each applies to. The struct is
    /// destructured without `..`: a field added to `RawSecret` does not compile until it is
    /// placed here, so no field can pass unchecked.
    fn given(&self) -> Vec<(&'static str, Applies)> {
        let RawSecret {
            name,
            secret_id,
            vault_id,
            stage,
            version_number,
            version_name,
            file_name,
            mode,
            encoding,
            keys,
            format,
            failover_vault_id,
            certificate_id,
            certificate_authority_id,
            ca_bundle_id,
            private_key,
            directory,
            cert_file_name,
            chain_file_name,
            key_file_name,
        } = self;
        let cert_only = |kind| Applies::new(false, kind == 0, kind == 1, kind == 2);
        let named = |id: &Option<String>| id.as_deref().is_some_and(|v| !v.is_empty());
        [
            ("name", name.is_some(), Applies::SECRET),
            ("secretId", secret_id.is_some(), Applies::SECRET),
            ("vaultId", vault_id.is_some(), Applies::SECRET),
            ("fileName", file_name.is_some(), Applies::SECRET),
            ("encoding", encoding.is_some(), Applies::SECRET),
            ("keys", keys.is_some(), Applies::SECRET),
            ("format", format.is_some(), Applies::SECRET),
            (
                "failoverVaultId",
                failover_vault_id.is_some(),
                Applies::SECRET,
            ),
            ("stage", stage.is_some(), Applies::VERSIONED),
            (
                "versionNumber",
                version_number.is_some(),
                Applies::VERSIONED,
            ),
            ("versionName", version_name.is_some(), Applies::VERSIONED),
            ("privateKey", private_key.is_some(), Applies::LEAF),
            ("directory", directory.is_some(), Applies::ANY_CERTIFICATE),
            ("certFileName", cert_file_name.is_some(), Applies::LEAF),
            (
                "chainFileName",
                chain_file_name.is_some(),
                Applies::ANY_CERTIFICATE,
            ),
            ("keyFileName", key_file_name.is_some(), Applies::LEAF),
            ("mode", mode.is_some(), Applies::EVERY),
            // An empty id names no certificate (the entry is judged as a secret).
            ("certificateId", named(certificate_id), cert_only(0)),
            (
                "certificateAuthorityId",
                named(certificate_authority_id),
                cert_only(1),
            ),
            ("caBundleId", named(ca_bundle_id), cert_only(2)),
        ]
        .into_iter()
        .filter(|(_, set, _)| *set)
        .map(|(field, _, applies)| (field, applies))
        .collect()
    }

    /// The first field given that does not apply to an entry of `kind` (`None`: a secret).
    fn misplaced(&self, kind: Option<CertificateKind>) -> Option<&'static str> {
        self.given()
            .into_iter()
            .find(|(_, applies)| !applies.to(kind))
            .map(|(field, _)| field)
    }
}

/// A secret entry with a field that only certificate entries take.
fn refuse_certificate_fields(index: usize, item: &RawSecret) -> Result<(), ParamError> {
    match item.misplaced(None) {
        Some(field) => Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].{field} applies to certificate entries only \
             (certificateId, certificateAuthorityId, caBundleId)"
        ))),
        None => Ok(()),
    }
}

/// What an entry of `kind` takes, as messages say it (checked against
/// [`RawSecret::given`]'s table by a test).
fn takes(kind: CertificateKind) -> &'static str {
    match kind {
        CertificateKind::Certificate => {
            "certificateId entries take stage, versionNumber, \
             versionName, privateKey, directory, certFileName, chainFileName, keyFileName and mode"
        }
        CertificateKind::CertificateAuthority => {
            "certificateAuthorityId entries take stage, \
             versionNumber, versionName, directory, chainFileName and mode"
        }
        CertificateKind::CaBundle => "caBundleId entries take directory, chainFileName and mode",
    }
}

/// A `certificateId` / `certificateAuthorityId` / `caBundleId` entry.
fn check_certificate(
    index: usize,
    kind: CertificateKind,
    item: &RawSecret,
) -> Result<CertificateSpec, ParamError> {
    let field = kind.field();
    let named: Vec<&str> = [
        ("certificateId", &item.certificate_id),
        ("certificateAuthorityId", &item.certificate_authority_id),
        ("caBundleId", &item.ca_bundle_id),
    ]
    .into_iter()
    .filter(|(_, v)| v.as_deref().is_some_and(|v| !v.is_empty()))
    .map(|(k, _)| k)
    .collect();
    if named.len() > 1 {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}] has {}: give exactly one",
            named.join(" and ")
        )));
    }
    let applies = takes(kind);
    if let Some(bad) = item.misplaced(Some(kind)) {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].{bad} does not apply to a {field} entry: {applies}"
        )));
    }
    let id = item
        .certificate_id
        .as_deref()
        .or(item.certificate_authority_id.as_deref())
        .or(item.ca_bundle_id.as_deref())
        .unwrap_or_default();
    let ocid_kind = match kind {
        CertificateKind::Certificate => "certificate",
        CertificateKind::CertificateAuthority => "certificateauthority",
        CertificateKind::CaBundle => "cabundle",
    };
    let id = check_ocid(
        &format!("{RETRIEVE_PREFIX}: secrets[{index}].{field}"),
        id,
        ocid_kind,
    )?;
    let selector = parse_selector(index, item, &id)?;
    let private_key = item.private_key.unwrap_or(false);
    // `.`: the files at the top of the mount, for the sync controller, whose `sourcePath`
    // cannot name a file in a directory.
    let directory = match item.directory.as_deref().map(str::trim) {
        Some(".") => None,
        Some(d) if !d.is_empty() => Some(d.trim_end_matches('/').to_owned()),
        _ => Some(id.rsplit('.').next().unwrap_or(&id).to_owned()),
    };
    let file = |key: &str, given: &Option<String>, default: &str| -> Result<FilePath, ParamError> {
        let name = given
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .unwrap_or(default);
        let path = match &directory {
            Some(directory) => format!("{directory}/{name}"),
            None => name.to_owned(),
        };
        FilePath::new(path).map_err(|e| {
            ParamError(format!(
                "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].{key}: {e}"
            ))
        })
    };
    let cert_path = match kind {
        CertificateKind::Certificate => {
            Some(file("certFileName", &item.cert_file_name, "tls.crt")?)
        }
        _ => None,
    };
    let chain_path = file("chainFileName", &item.chain_file_name, "ca.crt")?;
    let key_path = match (private_key, &item.key_file_name) {
        (true, given) => Some(file("keyFileName", given, "tls.key")?),
        (false, Some(_)) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].keyFileName needs privateKey: true"
            )));
        }
        (false, None) => None,
    };
    Ok(CertificateSpec {
        index,
        kind,
        id,
        selector,
        private_key,
        cert_path,
        chain_path,
        key_path,
        mode: parse_mode(index, item.mode.as_ref())?,
    })
}

fn check_secret(
    index: usize,
    item: &RawSecret,
    class_vault: Option<&str>,
    failover: Option<Option<&str>>,
) -> Result<SecretSpec, ParamError> {
    let name = item.name.clone().unwrap_or_default();
    let secret_id = item.secret_id.as_deref().unwrap_or_default();
    let source = match (name.trim().is_empty(), secret_id.is_empty()) {
        (true, true) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: missed secret name: secrets[{index}].name is empty (or give \
                 secrets[{index}].secretId, a secret OCID)"
            )));
        }
        (false, false) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}] has both name {name:?} and secretId \
                 {secret_id:?}: give exactly one"
            )));
        }
        (true, false) => {
            if let Some(vault) = &item.vault_id {
                return Err(ParamError(format!(
                    "{RETRIEVE_PREFIX}: secrets[{index}].vaultId {vault:?} applies to name \
                     entries only; secretId {secret_id:?} already names the secret"
                )));
            }
            SecretSource::Id(check_ocid(
                &format!("{RETRIEVE_PREFIX}: secrets[{index}].secretId"),
                secret_id,
                "secret",
            )?)
        }
        (false, true) => {
            if name.len() > MAX_OCI_PARAMETER_LEN {
                return Err(ParamError(format!(
                    "{RETRIEVE_PREFIX}: secrets[{index}].name is {} characters long; OCI secret \
                     names have at most {MAX_OCI_PARAMETER_LEN}",
                    name.len()
                )));
            }
            let vault_id = match item.vault_id.as_deref().filter(|v| !v.is_empty()) {
                Some(own) => check_ocid(
                    &format!("{RETRIEVE_PREFIX}: secrets[{index}].vaultId"),
                    own,
                    "vault",
                )?,
                None => class_vault.map(str::to_owned).ok_or_else(|| {
                    ParamError(format!(
                        "missed \"vaultId\" SecretProviderClass parameters: the OCID of the \
                         vault that holds the secrets (secrets[{index}] {name:?} has no vaultId \
                         of its own)"
                    ))
                })?,
            };
            SecretSource::Name {
                name: name.clone(),
                vault_id,
            }
        }
    };
    let shown = source.display().to_owned();
    let selector = parse_selector(index, item, &shown)?;
    let (field, raw_path) = match (item.file_name.as_deref().map(str::trim), &source) {
        (Some(f), _) if !f.is_empty() => ("fileName", f.to_owned()),
        (_, SecretSource::Name { name, .. }) => ("name", name.trim().to_owned()),
        (_, SecretSource::Id(id)) => ("secretId", id.rsplit('.').next().unwrap_or(id).to_owned()),
    };
    let path = FilePath::new(&raw_path).map_err(|e| {
        ParamError(format!(
            "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].{field}: {e}"
        ))
    })?;
    let format = match item.format.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(f) if f.eq_ignore_ascii_case("json") => Some(Format::Json),
        Some(f) if f.eq_ignore_ascii_case("yaml") => Some(Format::Yaml),
        Some(f) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].format {f:?} is not one of json, yaml"
            )));
        }
    };
    let keys = match item.keys.as_ref().map(|k| &k.0) {
        None => Vec::new(),
        Some(keys) if keys.is_empty() => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].keys is an empty list: name at least one key, \
                 or leave keys out to write the whole secret"
            )));
        }
        Some(keys) => keys
            .iter()
            .enumerate()
            .map(|(k, raw)| check_key(index, k, raw))
            .collect::<Result<_, _>>()?,
    };
    if format.is_some() && keys.is_empty() {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].format applies with keys only"
        )));
    }
    let whole = keys.is_empty() || field == "fileName";
    let own_failover_vault = match item.failover_vault_id.as_deref() {
        None | Some("") => None,
        Some(id) => Some(check_ocid(
            &format!("{RETRIEVE_PREFIX}: secrets[{index}].failoverVaultId"),
            id,
            "vault",
        )?),
    };
    let failover = match (failover, &source) {
        (None, _) if own_failover_vault.is_some() => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].failoverVaultId needs the class parameter \
                 \"failoverRegion\""
            )));
        }
        (None, _) => None,
        (Some(_), SecretSource::Id(id)) => {
            if own_failover_vault.is_some() {
                return Err(ParamError(format!(
                    "{RETRIEVE_PREFIX}: secrets[{index}].failoverVaultId applies to name entries \
                     only; a secretId is the same in its replica"
                )));
            }
            Some(SecretSource::Id(id.clone()))
        }
        (Some(class_failover), SecretSource::Name { name, .. }) => {
            let vault_id = own_failover_vault
                .or_else(|| class_failover.map(str::to_owned))
                .ok_or_else(|| {
                    ParamError(format!(
                        "{RETRIEVE_PREFIX}: secrets[{index}] {name:?} is read by name, so with \
                         \"failoverRegion\" it needs the replica vault: set \"failoverVaultId\" \
                         (or secrets[{index}].failoverVaultId)"
                    ))
                })?;
            Some(SecretSource::Name {
                name: name.clone(),
                vault_id,
            })
        }
    };
    Ok(SecretSpec {
        index,
        failover,
        source,
        selector,
        path,
        mode: parse_mode(index, item.mode.as_ref())?,
        encoding: parse_encoding(index, item.encoding.as_deref())?,
        keys,
        format,
        whole,
    })
}

/// `stage`, `versionNumber`, `versionName`: at most one (default stage `CURRENT`).
fn parse_selector(
    index: usize,
    item: &RawSecret,
    shown: &str,
) -> Result<VersionSelector, ParamError> {
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
    let version_name = match item.version_name.as_deref() {
        None | Some("") => None,
        Some(n) if n.len() > MAX_OCI_PARAMETER_LEN || n.trim() != n => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].versionName {n:?} is not a version name (at \
                 most {MAX_OCI_PARAMETER_LEN} characters, no surrounding spaces)"
            )));
        }
        Some(n) => Some(n.to_owned()),
    };
    Ok(match (stage, number, version_name) {
        (None, None, Some(version_name)) => VersionSelector::Name(version_name),
        (Some(stage), Some(number), _) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secret should be identified either with a version number or \
                 with stage: secrets[{index}] ({shown:?}) has stage {stage} and versionNumber {number}"
            )));
        }
        (stage, number, Some(version_name)) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}] ({shown:?}) has versionName \
                 {version_name:?} and also {}: give at most one of stage, versionNumber, \
                 versionName",
                stage.map_or_else(
                    || format!("versionNumber {}", number.unwrap_or_default()),
                    |s| format!("stage {s}")
                )
            )));
        }
        (Some(stage), None, None) => VersionSelector::Stage(stage),
        (None, Some(number), None) => VersionSelector::Number(number),
        (None, None, None) => VersionSelector::Stage(Stage::Current),
    })
}

fn check_key(index: usize, k: usize, raw: &RawKey) -> Result<KeySpec, ParamError> {
    let key = raw.key.as_deref().unwrap_or_default();
    if key.is_empty() || key.len() > 1024 {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].keys[{k}].key must be a top-level key or a JSON \
             Pointer starting with / (1 to 1024 characters)"
        )));
    }
    let (field, name) = match raw.file_name.as_deref().map(str::trim) {
        Some(f) if !f.is_empty() => ("fileName", f.to_owned()),
        _ => ("key", KeySpec::default_file_name(key)),
    };
    let path = FilePath::new(&name).map_err(|e| {
        ParamError(format!(
            "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].keys[{k}].{field} {name:?}: {e}"
        ))
    })?;
    let mode = parse_mode(index, raw.mode.as_ref()).map_err(|e| {
        ParamError(e.0.replace(
            &format!("secrets[{index}].mode"),
            &format!("secrets[{index}].keys[{k}].mode"),
        ))
    })?;
    Ok(KeySpec {
        key: key.to_owned(),
        path,
        mode,
    })
}

fn parse_mode(
    index: usize,
    raw: Option<&RawMode>,
) -> Result<Option<csi_grpc::FileMode>, ParamError> {
    let text = match raw {
        None => return Ok(None),
        Some(RawMode::Text(t)) if t.is_empty() => return Ok(None),
        Some(RawMode::Text(t)) => t,
        Some(RawMode::Integer(n)) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].mode {n} is a YAML number: quote it, e.g. \
                 mode: \"0400\" (YAML 1.1 and 1.2 read an unquoted 0400 differently)"
            )));
        }
        Some(RawMode::Other) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].mode must be a quoted octal mode such as \"0400\""
            )));
        }
    };
    let octal = (3..=4).contains(&text.len()) && text.bytes().all(|b| (b'0'..=b'7').contains(&b));
    let mode = u32::from_str_radix(text, 8)
        .ok()
        .filter(|m| octal && *m <= 0o777);
    mode.and_then(csi_grpc::FileMode::new).map(Some).ok_or_else(|| {
        ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].mode {text:?} is not a file mode: 3 or 4 octal \
             digits, at most 0777 (e.g. \"0400\", \"640\")"
        ))
    })
}

fn parse_encoding(index: usize, raw: Option<&str>) -> Result<Encoding, ParamError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(Encoding::Utf8),
        Some(e) if e.eq_ignore_ascii_case("utf-8") || e.eq_ignore_ascii_case("utf8") => {
            Ok(Encoding::Utf8)
        }
        Some(e) if e.eq_ignore_ascii_case("base64") => Ok(Encoding::Base64),
        Some(e) if e.eq_ignore_ascii_case("hex") => Ok(Encoding::Hex),
        Some(e) => Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].encoding {e:?} is not one of utf-8, base64, hex"
        ))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry with every field `RawSecret` has.
    const EVERY_FIELD: &str = "name: n\nsecretId: s\nvaultId: v\nstage: CURRENT\n\
        versionNumber: 1\nversionName: x\nfileName: f\nmode: \"0600\"\nencoding: base64\n\
        keys: [{key: k}]\nformat: json\nfailoverVaultId: w\ncertificateId: c\n\
        certificateAuthorityId: a\ncaBundleId: b\nprivateKey: true\ndirectory: d\n\
        certFileName: t\nchainFileName: h\nkeyFileName: y\n";

    /// The one table of which field applies to which entry is complete, and what the
    /// messages say each certificate kind takes is what the table lets through.
    #[test]
    fn the_field_table_is_what_the_messages_say() {
        let raw: RawSecret = serde_saphyr::from_str(EVERY_FIELD).unwrap();
        let given = raw.given();
        assert_eq!(given.len(), 20, "every field of RawSecret is in the table");
        let ids = ["certificateId", "certificateAuthorityId", "caBundleId"];
        for kind in [
            CertificateKind::Certificate,
            CertificateKind::CertificateAuthority,
            CertificateKind::CaBundle,
        ] {
            let accepted: Vec<&str> = given
                .iter()
                .filter(|(field, applies)| applies.to(Some(kind)) && !ids.contains(field))
                .map(|(field, _)| *field)
                .collect();
            let (last, rest) = accepted.split_last().unwrap();
            let listed = if rest.is_empty() {
                (*last).to_owned()
            } else {
                format!("{} and {last}", rest.join(", "))
            };
            assert_eq!(
                takes(kind),
                format!("{} entries take {listed}", kind.field()),
                "{kind:?}"
            );
        }
        let secret: Vec<&str> = given
            .iter()
            .filter(|(_, applies)| applies.to(None))
            .map(|(field, _)| *field)
            .collect();
        assert_eq!(
            secret,
            [
                "name",
                "secretId",
                "vaultId",
                "fileName",
                "encoding",
                "keys",
                "format",
                "failoverVaultId",
                "stage",
                "versionNumber",
                "versionName",
                "mode"
            ]
        );
    }
}
