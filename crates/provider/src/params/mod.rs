//! The SecretProviderClass parameters of an OCI mount: the YAML `secrets` list read within
//! the mount's limits (`yaml`), the class-level attributes (`class`), the list as a whole
//! (`list`: each entry checked by its kind in `crate::entries`, files claimed once), and
//! what every kind's checks share (`fields`, `problems`, `spec`).

use std::collections::BTreeMap;

use csi_grpc::Pod;

pub(crate) mod class;
pub(crate) mod fields;
mod list;
pub(crate) mod problems;
pub(crate) mod spec;
pub(crate) mod yaml;

pub(crate) use spec::PARSE_BYTES_PER_BYTE;
pub use spec::{
    AuthSpec, AuthType, CertificateKind, DEFAULT_MAX_FILES, DEFAULT_MAX_SECRETS, Encoding,
    MAX_VERSIONS, ParseLimits, SecretSource, Stage, VersionSelector,
};
use spec::{FAILOVER_REGION, FAILOVER_VAULT_ID, REGION};

use bounded::quote;

use crate::entries::{CertificateSpec, Entry, SecretSpec, SelectionSpec, TemplateSpec};
use class::{check_ocid, parse_auth, parse_compartment_id, parse_region, parse_vault_id};
pub use problems::{MAX_PROBLEMS, ParamError};
use problems::{Problems, RETRIEVE_PREFIX};
use spec::ClassDefaults;
pub use yaml::MAX_SECRETS_BYTES;
use yaml::parse_secrets_yaml;

/// The SecretProviderClass parameters of an OCI mount, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountParameters {
    /// The entries of `secrets`, every kind, in the class's order.
    pub entries: Vec<Entry>,
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
    /// The secret entries (`name` or `secretId`, version histories included), in the
    /// class's order.
    pub fn secrets(&self) -> Vec<&SecretSpec> {
        self.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Secret(s) | Entry::History(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// The certificate entries, in the class's order.
    pub fn certificates(&self) -> Vec<&CertificateSpec> {
        self.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Certificate(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    /// The `tag` / `namePrefix` entries, in the class's order.
    pub fn selections(&self) -> Vec<&SelectionSpec> {
        self.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Selection(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// The template entries, in the class's order.
    pub fn templates(&self) -> Vec<&TemplateSpec> {
        self.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Template(t) => Some(t),
                _ => None,
            })
            .collect()
    }
}

/// The class's `failoverVaultId` (`None` when the parameter is itself a problem), and
/// whether it and `failoverRegion` go together with `region`.
fn check_failover(
    attributes: &BTreeMap<String, String>,
    region: &Option<Option<String>>,
    failover_region: &Option<Option<String>>,
    problems: &mut Problems,
) -> Option<Option<String>> {
    let failover_vault = problems.take(match attributes.get(FAILOVER_VAULT_ID) {
        None => Ok(None),
        Some(id) if id.is_empty() => Ok(None),
        Some(id) => check_ocid("parameter \"failoverVaultId\"", id, "vault").map(Some),
    });
    if let (Some(Some(_)), Some(None)) = (&failover_vault, failover_region) {
        problems.note(ParamError::new(
            "parameter \"failoverVaultId\" needs \"failoverRegion\", the region of that vault",
        ));
    }
    if let (Some(Some(primary)), Some(Some(failover))) = (region, failover_region)
        && primary == failover
    {
        problems.note(ParamError::new(format!(
            "parameter \"failoverRegion\" {} is the primary region: name another",
            quote(failover)
        )));
    }
    failover_vault
}

impl MountParameters {
    /// Warnings about the class, never fatal: each attribute that looks like a misspelt
    /// parameter (`vaultid`, `regoin`), with the parameter meant.
    pub fn warnings(attributes: &BTreeMap<String, String>) -> Vec<String> {
        class::misspelt_parameters(attributes)
    }

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
        let compartment = problems.take(parse_compartment_id(attributes));
        let region = problems.take(parse_region(attributes, REGION));
        let failover_region = problems.take(parse_region(attributes, FAILOVER_REGION));
        let failover_vault = check_failover(attributes, &region, &failover_region, &mut problems);
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
        let class = ClassDefaults {
            vault: class_vault,
            // A class compartment that is itself a problem stands as an empty one.
            compartment: compartment.as_ref().map_or(Some(""), Option::as_deref),
            failover,
        };
        let checked = raw.map(|raw| list::check_entries(raw, class, &mut problems));
        if let Some(files) = checked.as_deref().map(list::files)
            && files > limits.max_files
        {
            problems.note(too_many_files(files, limits.max_files));
        }
        problems.finish()?;
        let (Some(entries), Some(auth), Some(vault_id), Some(region), Some(failover_region)) =
            (checked, auth, vault_id, region, failover_region)
        else {
            return Err(ParamError::new(
                "internal error: a parameter was neither checked nor refused",
            ));
        };
        Ok(Self {
            entries,
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
    use super::yaml::{Applies, EntryKind, RawSecret};
    use super::*;
    use crate::entries::{SELECTION_TAKES, takes};

    /// An entry with every field `RawSecret` has.
    const EVERY_FIELD: &str = "name: n\nsecretId: s\nvaultId: v\nstage: CURRENT\n\
        versionNumber: 1\nversionName: x\nfileName: f\nmode: \"0600\"\nencoding: base64\n\
        keys: [{key: k}]\nformat: json\nfailoverVaultId: w\ncertificateId: c\n\
        certificateAuthorityId: a\ncaBundleId: b\nprivateKey: true\ndirectory: d\n\
        certFileName: t\nchainFileName: h\nkeyFileName: y\nversions: 2\ntag: a=b\n\
        namePrefix: p\ncompartmentId: o\ntemplate: z\nwriteFile: false\n";

    /// "`kind` entries take a, b and c", from the table.
    fn listed(kind: &str, given: &[(&str, Applies)], to: EntryKind, leave: &[&str]) -> String {
        let accepted: Vec<&str> = given
            .iter()
            .filter(|(field, applies)| applies.to(to) && !leave.contains(field))
            .map(|(field, _)| *field)
            .collect();
        let (last, rest) = accepted.split_last().unwrap();
        if rest.is_empty() {
            format!("{kind} entries take {last}")
        } else {
            format!("{kind} entries take {} and {last}", rest.join(", "))
        }
    }

    /// The one table of which field applies to which entry is complete, and what the
    /// messages say each certificate kind takes is what the table lets through.
    #[test]
    fn the_field_table_is_what_the_messages_say() {
        let raw: RawSecret =
            bounded::yaml::from_str(EVERY_FIELD, &bounded::ParseBudget::new(4096)).unwrap();
        let given = raw.given();
        assert_eq!(given.len(), 26, "every field of RawSecret is in the table");
        let names: Vec<&str> = given.iter().map(|(field, _)| *field).collect();
        assert_eq!(
            names,
            yaml::ENTRY_FIELDS,
            "the fields an unknown one is matched against"
        );
        let ids = ["certificateId", "certificateAuthorityId", "caBundleId"];
        for kind in [
            CertificateKind::Certificate,
            CertificateKind::CertificateAuthority,
            CertificateKind::CaBundle,
        ] {
            let to = EntryKind::Certificate(kind);
            assert_eq!(
                takes(kind),
                listed(kind.field(), &given, to, &ids),
                "{kind:?}"
            );
        }
        assert_eq!(
            SELECTION_TAKES,
            listed("tag and namePrefix", &given, EntryKind::Selection, &[])
        );
        let secret: Vec<&str> = given
            .iter()
            .filter(|(_, applies)| applies.to(EntryKind::Secret))
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
                "versions",
                "format",
                "failoverVaultId",
                "stage",
                "versionNumber",
                "versionName",
                "mode",
                "writeFile"
            ]
        );
        let template: Vec<&str> = given
            .iter()
            .filter(|(_, applies)| applies.to(EntryKind::Template))
            .map(|(field, _)| *field)
            .collect();
        assert_eq!(template, ["fileName", "mode", "template"]);
    }
}
