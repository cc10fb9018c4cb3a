//! The entries of a class's `secrets` list, one module per kind, each owning its parameters
//! and checks, its description for `check`, its requests, its fetch and its files:
//!
//! - `secret/`: `name` or `secretId`, its `keys`;
//! - `history.rs`: `versions: N` on a secret entry;
//! - `certificate.rs`: `certificateId`, `certificateAuthorityId`, `caBundleId`;
//! - `selection.rs`: `tag`, `namePrefix`;
//! - `template.rs`: `template`, rendered from the others' files.
//!
//! [`Entry`] is one entry of any kind, in the class's order; this module matches on it once
//! for each thing every kind does (its check, its files, its description, its start in the
//! fan-out, its place in the answer). `run.rs`, below them all, is what they share while a
//! mount runs. ARCHITECTURE.md ("Add an entry kind") lists what a new kind touches.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use csi_grpc::{FileMode, FilePath};

mod certificate;
mod history;
mod run;
mod secret;
mod selection;
mod template;

pub use certificate::CertificateSpec;
pub use secret::SecretSpec;
pub use selection::SelectionSpec;
pub use template::TemplateSpec;

pub(crate) use run::{
    EntryFiles, EntryOutcome, EntryVersion, MountRun, Services, Start, Target, Targets,
};
// `crate::fuzzing` makes a secret's files as a mount does.
pub(crate) use secret::secret_files;
pub(crate) use template::{check_reads, render_templates};
#[cfg(test)]
pub(crate) use {certificate::takes, selection::SELECTION_TAKES};

use crate::contract::{CertificateService, ListingService, SecretsService};
use crate::params::problems::{ParamError, Problems};
use crate::params::spec::ClassDefaults;
use crate::params::yaml::RawSecret;

/// One entry of a class's `secrets` list, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `name` or `secretId`: a secret, whole or by its `keys`.
    Secret(SecretSpec),
    /// `versions: N` on a secret entry: its current and older versions.
    History(SecretSpec),
    /// `certificateId`, `certificateAuthorityId` or `caBundleId`.
    Certificate(CertificateSpec),
    /// `tag` / `namePrefix`: the secrets of a vault it selects, listed at mount time.
    Selection(SelectionSpec),
    /// `template`: a file rendered from the others'.
    Template(TemplateSpec),
}

/// Every kind of entry: its name, and the fields that make an entry of it. What `check`
/// describes, the README's entry table lists and `cargo xtask demo` mounts (a test holds
/// all three to it).
pub const KINDS: [(&str, &[&str]); 5] = [
    ("secret", &["name", "secretId"]),
    ("version history", &["versions"]),
    (
        "certificate",
        &["certificateId", "certificateAuthorityId", "caBundleId"],
    ),
    ("selection", &["tag", "namePrefix"]),
    ("template", &["template"]),
];

/// One file an entry writes (or reads for the class's templates), as `check` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileDescription {
    /// The file (for a selection, its directory and `<each secret's name>`).
    pub path: String,
    /// Its mode; `None`: the driver's permission.
    pub mode: Option<FileMode>,
    /// What it is made of.
    pub source: String,
    /// The vault it is read from, if a secret's.
    pub vault: String,
    /// Which version.
    pub selector: String,
    /// The key it holds, if a `keys` item.
    pub key: String,
    /// How it is encoded.
    pub encoding: String,
    /// Written (`false`: read by the class's templates only).
    pub written: bool,
    /// What a selection selects.
    pub selection: Option<String>,
}

impl Entry {
    /// Checks entry `index` by its kind (a `template` makes a template entry, a
    /// certificate OCID a certificate entry, `tag` / `namePrefix` a selection, else a secret
    /// entry, a version history with `versions`): every check of the kind runs whatever the
    /// others found, the problems go to `problems`.
    pub(crate) fn check(
        index: usize,
        item: &RawSecret,
        class: ClassDefaults<'_>,
        problems: &mut Problems,
    ) -> Option<Entry> {
        if item.template.is_some() {
            return template::check(index, item, problems).map(Entry::Template);
        }
        if let Some(kind) = certificate::certificate_kind(item) {
            return problems
                .take(certificate::check(index, kind, item))
                .map(Entry::Certificate);
        }
        if item.selects() {
            return selection::check(index, item, class, problems).map(Entry::Selection);
        }
        problems.take(secret::refuse_certificate_fields(index, item));
        let spec = secret::check(index, item, class.vault, class.failover, problems)?;
        Some(if spec.history.is_empty() {
            Entry::Secret(spec)
        } else {
            Entry::History(spec)
        })
    }

    /// Its position in the class's list (messages say `secrets[index]`).
    pub fn index(&self) -> usize {
        match self {
            Entry::Secret(s) | Entry::History(s) => s.index,
            Entry::Certificate(c) => c.index,
            Entry::Selection(s) => s.index,
            Entry::Template(t) => t.index,
        }
    }

    /// Its kind's name ([`KINDS`]).
    pub fn kind(&self) -> &'static str {
        let at = match self {
            Entry::Secret(_) => 0,
            Entry::History(_) => 1,
            Entry::Certificate(_) => 2,
            Entry::Selection(_) => 3,
            Entry::Template(_) => 4,
        };
        KINDS[at].0
    }

    /// The files it writes or reads for the templates, known from the class (a
    /// selection's only once its vault is listed: none here).
    pub fn files(&self) -> Vec<&FilePath> {
        match self {
            Entry::Secret(s) | Entry::History(s) => s.files().collect(),
            Entry::Certificate(c) => c.files().collect(),
            Entry::Selection(_) => Vec::new(),
            Entry::Template(t) => vec![&t.path],
        }
    }

    /// Whether its files are written (`writeFile`); `false`: read by templates only.
    pub fn written(&self) -> bool {
        match self {
            Entry::Secret(s) | Entry::History(s) => s.write,
            Entry::Certificate(c) => c.write,
            Entry::Selection(_) | Entry::Template(_) => true,
        }
    }

    /// Its files as `check` shows them.
    pub fn describe(&self) -> Vec<FileDescription> {
        match self {
            Entry::Secret(s) => secret::describe(s),
            Entry::History(s) => history::describe(s),
            Entry::Certificate(c) => certificate::describe(c),
            Entry::Selection(s) => selection::describe(s),
            Entry::Template(t) => template::describe(t),
        }
    }

    /// Each file it claims in the class, with the `keys` item it comes from and how a
    /// duplicate is named (`duplicated fileName name`, ...).
    pub(crate) fn claims<'a>(
        &'a self,
        item: &RawSecret,
    ) -> Vec<(&'a FilePath, Option<usize>, &'static str)> {
        match self {
            Entry::Secret(s) | Entry::History(s) => secret::claims(s, item),
            Entry::Certificate(c) => c
                .files()
                .map(|f| (f, None, "duplicated file name"))
                .collect(),
            Entry::Selection(_) => Vec::new(),
            Entry::Template(t) => vec![(&t.path, None, "duplicated fileName name")],
        }
    }

    /// Whether it reads secrets (what a failed mount's "n of m" counts).
    pub(crate) fn reads_secrets(&self) -> bool {
        matches!(
            self,
            Entry::Secret(_) | Entry::History(_) | Entry::Selection(_)
        )
    }

    /// Where its files go in the answer: the secrets' (selections' and histories'
    /// included) first, then the certificates', then the templates', each in the class's
    /// order.
    pub(crate) fn answer_group(&self) -> u8 {
        match self {
            Entry::Secret(_) | Entry::History(_) | Entry::Selection(_) => 0,
            Entry::Certificate(_) => 1,
            Entry::Template(_) => 2,
        }
    }

    /// The entry ready to start in the fan-out; a template starts once the others are
    /// fetched (`None`). `room`: the files the mount's selections may still write, shared
    /// by them all.
    pub(crate) fn start<'a, V: SecretsService, C: CertificateService, L: ListingService>(
        &'a self,
        run: &'a MountRun<'_>,
        (secrets, certificates, listings): Services<'a, V, C, L>,
        targets: &'a Targets,
        room: &Arc<AtomicUsize>,
    ) -> Option<Start<'a>> {
        Some(match self {
            Entry::Secret(spec) => secret::start(run, secrets, spec, targets),
            Entry::History(spec) => history::start(run, (secrets, listings), spec, targets),
            Entry::Certificate(spec) => certificate::start(run, certificates, spec, targets),
            Entry::Selection(spec) => {
                selection::start(run, (secrets, listings), spec, (targets, room.clone()))
            }
            Entry::Template(_) => return None,
        })
    }
}

/// A refusal of a class with no entry.
pub(crate) fn none_given() -> ParamError {
    ParamError::new(format!(
        "{}: requested secrets are missed: parameter \"secrets\" is an empty list",
        crate::params::problems::RETRIEVE_PREFIX
    ))
}
