//! The list as a whole: every entry checked by its kind, no file written twice or colliding
//! with another.

use std::collections::BTreeMap;

use bounded::quote;
use csi_grpc::{FilePath, validate_file_set};

use super::certificate::{certificate_kind, check_certificate};
use super::problems::{ParamError, Problems, RETRIEVE_PREFIX};
use super::secret::{check_secret, refuse_certificate_fields};
use super::selection::{ClassDefaults, check_selection};
use super::spec::{CertificateSpec, SecretSpec, SelectionSpec, TemplateSpec};
use super::template::{check_reads, check_template};
use super::yaml::RawSecret;

/// The entries of a class, checked, by kind, each in the list's order.
#[derive(Debug, Default)]
pub(super) struct Checked {
    pub(super) secrets: Vec<SecretSpec>,
    pub(super) certificates: Vec<CertificateSpec>,
    pub(super) selections: Vec<SelectionSpec>,
    pub(super) templates: Vec<TemplateSpec>,
}

impl Checked {
    /// The files the entries write or read, every kind counted (a selection's are known
    /// only once its vault is listed).
    pub(super) fn files(&self) -> usize {
        let secrets = self.secrets.iter().map(|s| s.files().count());
        let certificates = self.certificates.iter().map(|c| c.files().count());
        secrets.chain(certificates).sum::<usize>() + self.templates.len()
    }
}

/// Every entry, each checked whatever the others gave; their problems go to `problems` and
/// the entries without any are answered. `class`: the class-level `vaultId` and
/// `compartmentId`; `failover`: `None` without `failoverRegion`, else the class-level
/// `failoverVaultId`.
pub(super) fn check_secrets(
    raw: Vec<RawSecret>,
    class: ClassDefaults<'_>,
    failover: Option<Option<&str>>,
    problems: &mut Problems,
) -> Checked {
    if raw.is_empty() {
        problems.note(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: requested secrets are missed: parameter \"secrets\" is an empty list"
        )));
        return Checked::default();
    }
    let mut specs = Vec::with_capacity(raw.len());
    let mut certificates = Vec::new();
    let mut selections = Vec::new();
    let mut templates = Vec::new();
    let mut files = FileNames::default();
    check_template_count(&raw, problems);
    for (index, item) in raw.into_iter().enumerate() {
        if item.template.is_some() {
            if let Some(spec) = check_template(index, &item, problems) {
                problems.take(files.claim(&spec.path, index, None, "duplicated fileName name"));
                templates.push(spec);
            }
            continue;
        }
        if let Some(kind) = certificate_kind(&item) {
            if let Some(spec) = problems.take(check_certificate(index, kind, &item)) {
                for path in spec.files() {
                    problems.take(files.claim(path, index, None, "duplicated file name"));
                }
                certificates.push(spec);
            }
            continue;
        }
        if item.selects() {
            selections.extend(check_selection(index, &item, class, problems));
            continue;
        }
        problems.take(refuse_certificate_fields(index, &item));
        let Some(spec) = check_secret(index, &item, class.vault, failover, problems) else {
            continue;
        };
        claim_secret_files(&spec, &item, index, &mut files, problems);
        specs.push(spec);
    }
    // What the templates read is written by the other entries (read or written).
    let read: Vec<&FilePath> = specs
        .iter()
        .flat_map(SecretSpec::files)
        .chain(certificates.iter().flat_map(CertificateSpec::files))
        .collect();
    check_reads(&templates, &read, problems);
    // The driver's rules for the set of written files (no file that is also a directory,
    // ...); duplicates were named above, entry by entry.
    if !files.duplicated {
        let written = specs
            .iter()
            .filter(|s| s.write)
            .flat_map(SecretSpec::files)
            .chain(
                certificates
                    .iter()
                    .filter(|c| c.write)
                    .flat_map(CertificateSpec::files),
            )
            .chain(templates.iter().map(|t| &t.path));
        problems.take(validate_file_set(written).map_err(|e| {
            ParamError::new(format!(
                "{RETRIEVE_PREFIX}: invalid file name in parameter \"secrets\": {e}"
            ))
        }));
    }
    Checked {
        secrets: specs,
        certificates,
        selections,
        templates,
    }
}

/// At most [`crate::template::MAX_TEMPLATES`] template entries: their renders share one
/// mount's work, but each is parsed and checked first.
fn check_template_count(raw: &[RawSecret], problems: &mut Problems) {
    let templates = raw.iter().filter(|item| item.template.is_some()).count();
    if templates > crate::template::MAX_TEMPLATES {
        problems.note(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: parameter \"secrets\" has {templates} template entries; a \
             class may have at most {}",
            crate::template::MAX_TEMPLATES
        )));
    }
}

/// Claims the files of a secret entry: each key's, the whole secret's (a duplicate is
/// named after the field it comes from: `fileName` or the secret's name), each version's.
fn claim_secret_files(
    spec: &SecretSpec,
    item: &RawSecret,
    index: usize,
    files: &mut FileNames,
    problems: &mut Problems,
) {
    for (k, key) in spec.keys.iter().enumerate() {
        problems.take(files.claim(&key.path, index, Some(k), "duplicated fileName name"));
    }
    if spec.whole {
        let from_file_name = item
            .file_name
            .as_deref()
            .is_some_and(|f| !f.trim().is_empty());
        let what = if from_file_name {
            "duplicated fileName name"
        } else {
            "duplicated secret name"
        };
        problems.take(files.claim(&spec.path, index, None, what));
    }
    for path in &spec.history {
        problems.take(files.claim(path, index, None, "duplicated file name"));
    }
}

/// The files written so far, the entry writing each, and whether one was claimed twice.
#[derive(Default)]
struct FileNames {
    claimed: BTreeMap<String, usize>,
    duplicated: bool,
}

impl FileNames {
    /// `path` for entry `index` (its `keys[k]` item), refused when an earlier entry writes it.
    fn claim(
        &mut self,
        path: &FilePath,
        index: usize,
        key: Option<usize>,
        what: &str,
    ) -> Result<(), ParamError> {
        let Some(first) = self.claimed.insert(path.as_str().to_owned(), index) else {
            return Ok(());
        };
        self.duplicated = true;
        let this = match key {
            Some(k) => format!("secrets[{index}].keys[{k}]"),
            None => format!("secrets[{index}]"),
        };
        Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: {what}: {}: secrets[{first}] and {this} would both be written to \
             file {}",
            quote(path.as_str()),
            quote(path.as_str())
        )))
    }
}
