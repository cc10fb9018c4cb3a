//! What the parameters of a mount mean once checked: the typed entries, the principal, the
//! limits, and the parameter names. A leaf module: the checks import it, it imports none of
//! them.

use std::fmt;

use csi_grpc::FilePath;
use serde::Deserialize;

use crate::extract::{Format, KeySpec};

pub(super) const SECRETS: &str = "secrets";
pub(super) const AUTH_TYPE: &str = "authType";
pub(super) const AUTH_SECRET_NAME: &str = "authSecretName";
pub(super) const VAULT_ID: &str = "vaultId";
pub(super) const REGION: &str = "region";
pub(super) const FAILOVER_REGION: &str = "failoverRegion";
pub(super) const FAILOVER_VAULT_ID: &str = "failoverVaultId";
pub(super) const COMPARTMENT_ID: &str = "compartmentId";

/// Longest secret name and vault OCID the Secrets API accepts (spec 2.2).
pub(super) const MAX_OCI_PARAMETER_LEN: usize = 255;

/// What parsing a mount's parameters may allocate at most, per byte of them (its
/// attributes' names and values): the `secrets` list is at most three times its text at
/// any size, as the peak-heap tests measure (`crates/provider/tests/heap`). The parse
/// reserves this from the byte budget while it runs.
pub(crate) const PARSE_BYTES_PER_BYTE: usize = 4;

/// Entries a mount's `secrets` list may have unless configured otherwise
/// (`server.max_secrets_per_mount`).
pub const DEFAULT_MAX_SECRETS: usize = 256;

/// Files a mount may write unless configured otherwise (`server.max_files_per_mount`):
/// entries, `keys` items and certificate files together.
pub const DEFAULT_MAX_FILES: usize = 256;

/// The most versions one entry's `versions` asks for.
pub const MAX_VERSIONS: usize = 10;

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
    /// Whether the whole secret is written to `path`: without `keys` and `versions`, and
    /// with keys only when the entry sets its own `fileName`.
    pub whole: bool,
    /// `versions: N`: the files `path/0` (the current version), `path/1` (the one before
    /// it), ... `path/N-1`; empty without `versions`.
    pub history: Vec<FilePath>,
    /// Whether its files are written (`writeFile`, default true); `false`: read by the
    /// class's templates only.
    pub write: bool,
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
            .chain(&self.history)
    }
}

/// One `tag` / `namePrefix` entry: every `ACTIVE` secret of a vault it selects, listed at
/// mount time (the Vault API's ListSecrets), each read as a `name` entry and written whole
/// to `directory/<its name>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectionSpec {
    /// Its position in the `secrets` list.
    pub index: usize,
    /// The vault listed: the entry's `vaultId`, else the class's.
    pub vault_id: String,
    /// The compartment listed (ListSecrets needs it): the entry's, else the class's.
    pub compartment_id: String,
    /// `tag` and `namePrefix`: both hold when both are given.
    pub filter: vault::SecretFilter,
    /// `directory`, where the files go (`None`: the top of the mount).
    pub directory: Option<String>,
    /// The files' mode (`mode`); `None`: the request's permission.
    pub mode: Option<csi_grpc::FileMode>,
    /// How the contents are encoded (`encoding`).
    pub encoding: Encoding,
}

impl SelectionSpec {
    /// What the entry selects, as messages and `check` say it (tenant values quoted).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(tag) = &self.filter.tag {
            let written = match &tag.value {
                Some(value) => format!("{}={value}", tag.key),
                None => tag.key.clone(),
            };
            parts.push(format!("tag {}", bounded::quote(&written)));
        }
        if let Some(prefix) = &self.filter.name_prefix {
            parts.push(format!("namePrefix {}", bounded::quote(prefix)));
        }
        parts.join(" and ")
    }

    /// The file of a selected secret named `name`: `directory/name`.
    pub fn path_of(&self, name: &str) -> Result<FilePath, csi_grpc::PathError> {
        match &self.directory {
            Some(directory) => FilePath::new(format!("{directory}/{name}")),
            None => FilePath::new(name),
        }
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
    /// Whether its files are written (`writeFile`, default true); `false`: read by the
    /// class's templates only.
    pub write: bool,
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

/// One `template` entry: a file rendered from other files of the class
/// ([`crate::template`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateSpec {
    /// Its position in the `secrets` list.
    pub index: usize,
    /// The template, checked against the subset.
    pub source: String,
    /// Where the rendered file is written (`fileName`).
    pub path: FilePath,
    /// Its mode; `None`: the request's permission.
    pub mode: Option<csi_grpc::FileMode>,
    /// The files it reads, by the name a constant gives (`text("…")`), with where.
    pub reads: Vec<(String, usize, usize)>,
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
    /// The `tag` / `namePrefix` entries, in request order.
    pub selections: Vec<SelectionSpec>,
    /// The template entries, in request order.
    pub templates: Vec<TemplateSpec>,
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
