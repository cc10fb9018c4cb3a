//! What the parameters of a mount mean once checked: the typed entries, the principal, the
//! limits, and the parameter names. A leaf module: the checks import it, it imports none of
//! them.

use std::fmt;

use serde::Deserialize;

pub(crate) const SECRETS: &str = "secrets";
pub(crate) const AUTH_TYPE: &str = "authType";
pub(crate) const AUTH_SECRET_NAME: &str = "authSecretName";
pub(crate) const VAULT_ID: &str = "vaultId";
pub(crate) const REGION: &str = "region";
pub(crate) const FAILOVER_REGION: &str = "failoverRegion";
pub(crate) const FAILOVER_VAULT_ID: &str = "failoverVaultId";
pub(crate) const COMPARTMENT_ID: &str = "compartmentId";

/// Longest secret name and vault OCID the Secrets API accepts (spec 2.2).
pub(crate) const MAX_OCI_PARAMETER_LEN: usize = 255;

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

/// The class-level values entries fall back on: `vaultId` and `compartmentId` (a class
/// value that is itself a problem stands as an empty one, so that its entries are not also
/// reported as naming none), and `failover`: `None` without `failoverRegion`, else the
/// class-level `failoverVaultId`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassDefaults<'a> {
    pub(crate) vault: Option<&'a str>,
    pub(crate) compartment: Option<&'a str>,
    pub(crate) failover: Option<Option<&'a str>>,
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
