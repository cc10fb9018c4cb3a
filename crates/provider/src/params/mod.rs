//! The SecretProviderClass parameters of an OCI mount: the YAML `secrets` list read within
//! the mount's limits (`yaml`), the class-level attributes (`class`), and each entry checked
//! into a [`SecretSpec`] (`secret`) or a [`CertificateSpec`] (`certificate`), with the
//! checks both kinds share (`entries`).

use std::collections::BTreeMap;
use std::fmt;

use csi_grpc::{FilePath, Pod};
use serde::Deserialize;

use crate::extract::{Format, KeySpec};

mod certificate;
mod class;
mod entries;
mod problems;
mod secret;
mod yaml;

use bounded::quote;
use class::{check_ocid, parse_auth, parse_region, parse_vault_id};
use entries::check_secrets;
pub use problems::{MAX_PROBLEMS, ParamError};
use problems::{Problems, RETRIEVE_PREFIX};
pub use yaml::MAX_SECRETS_BYTES;
use yaml::parse_secrets_yaml;

const SECRETS: &str = "secrets";
const AUTH_TYPE: &str = "authType";
const AUTH_SECRET_NAME: &str = "authSecretName";
const VAULT_ID: &str = "vaultId";
const REGION: &str = "region";
const FAILOVER_REGION: &str = "failoverRegion";
const FAILOVER_VAULT_ID: &str = "failoverVaultId";

/// Longest secret name and vault OCID the Secrets API accepts (spec 2.2).
const MAX_OCI_PARAMETER_LEN: usize = 255;

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
        // Every check runs whatever the others found, so one error names every problem.
        let mut problems = Problems::default();
        let raw = problems.take(parse_secrets_yaml(attributes, limits));
        let auth = problems.take(parse_auth(attributes, pod));
        let vault_id = problems.take(parse_vault_id(attributes));
        let region = problems.take(parse_region(attributes, REGION));
        let failover_region = problems.take(parse_region(attributes, FAILOVER_REGION));
        let failover_vault = problems.take(match attributes.get(FAILOVER_VAULT_ID) {
            None => Ok(None),
            Some(id) if id.is_empty() => Ok(None),
            Some(id) => check_ocid("parameter \"failoverVaultId\"", id, "vault").map(Some),
        });
        if let (Some(Some(_)), Some(None)) = (&failover_vault, &failover_region) {
            problems.note(ParamError::new(
                "parameter \"failoverVaultId\" needs \"failoverRegion\", the region of that vault",
            ));
        }
        if let (Some(Some(primary)), Some(Some(failover))) = (&region, &failover_region)
            && primary == failover
        {
            problems.note(ParamError::new(format!(
                "parameter \"failoverRegion\" {} is the primary region: name another",
                quote(failover)
            )));
        }
        // A class vault that is itself a problem stands as an empty vault, so that its
        // entries are not also reported as naming none (the mount fails either way).
        let class_vault = match &vault_id {
            Some(id) => id.as_deref(),
            None => Some(""),
        };
        let failover_vault = failover_vault.flatten();
        let failover = match &failover_region {
            Some(Some(_)) => Some(failover_vault.as_deref()),
            _ => None,
        };
        let checked = raw.map(|raw| check_secrets(raw, class_vault, failover, &mut problems));
        if let Some((secrets, certificates)) = &checked {
            let files = secrets.iter().map(|s| s.files().count()).sum::<usize>()
                + certificates
                    .iter()
                    .map(|c| c.files().count())
                    .sum::<usize>();
            if files > limits.max_files {
                problems.note(too_many_files(files, limits.max_files));
            }
        }
        problems.finish()?;
        let (
            Some((secrets, certificates)),
            Some(auth),
            Some(vault_id),
            Some(region),
            Some(failover_region),
        ) = (checked, auth, vault_id, region, failover_region)
        else {
            return Err(ParamError::new(
                "internal error: a parameter was neither checked nor refused",
            ));
        };
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
    ParamError::new(format!(
        "{RETRIEVE_PREFIX}: the mount would write {files} files (entries, keys items and \
         certificate files), more than the {max} one mount may write \
         (server.max_files_per_mount); split it over several SecretProviderClasses"
    ))
}

#[cfg(test)]
mod tests {
    use super::certificate::takes;
    use super::yaml::RawSecret;
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
        let raw: RawSecret =
            bounded::yaml::from_str(EVERY_FIELD, &bounded::ParseBudget::new(4096)).unwrap();
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
