//! Selection entries (`tag`, `namePrefix`): which secrets of which vault and compartment
//! they select and where their files go (their checks); at mount time the vault's `ACTIVE`
//! secrets listed (the Vault API's ListSecrets, every page, cached per credential and vault:
//! one listing however many entries select from it), filtered here, the files taken from
//! the mount's shared room, then each selected secret read as a `name` entry, each under
//! its own fan-out permit and through the byte budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bounded::quote;
use csi_grpc::{ErrorKind, FilePath, MountError};
use futures_util::FutureExt as _;
use tracing::Instrument;

use super::FileDescription;
use super::run::{EntryOutcome, MountRun, Running, Start, Targets, gather_parts, list};
use super::secret::{SecretSpec, parse_encoding, secret_entry, secret_requests};
use crate::contract::{ListingService, SecretsService};
use crate::params::class::check_ocid;
use crate::params::fields::parse_mode;
use crate::params::problems::{ParamError, Problems, RETRIEVE_PREFIX};
use crate::params::spec::{
    ClassDefaults, Encoding, MAX_OCI_PARAMETER_LEN, SecretSource, Stage, VersionSelector,
};
use crate::params::yaml::{EntryKind, RawSecret};

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

/// What a selection entry takes, as messages say it (checked against
/// [`RawSecret::given`]'s table by a test).
pub(crate) const SELECTION_TAKES: &str = "tag and namePrefix entries take vaultId, encoding, \
     tag, namePrefix, compartmentId, directory and mode";

/// A `tag` / `namePrefix` entry, each field checked whatever the others gave; the
/// problems go to `problems`.
pub(crate) fn check(
    index: usize,
    item: &RawSecret,
    class: ClassDefaults<'_>,
    problems: &mut Problems,
) -> Option<SelectionSpec> {
    if let Some(bad) = item.misplaced(EntryKind::Selection) {
        problems.note(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].{bad} does not apply to a tag or namePrefix \
             entry: {SELECTION_TAKES}"
        )));
    }
    let tag = problems.take(parse_tag(index, item.tag.as_deref()));
    let name_prefix = problems.take(parse_prefix(index, item.name_prefix.as_deref()));
    let vault_id = problems.take(own_or_class(
        index,
        ("vaultId", item.vault_id.as_deref(), class.vault),
        "vault",
        "the vault whose secrets it lists",
    ));
    let compartment_id = problems.take(own_or_class(
        index,
        (
            "compartmentId",
            item.compartment_id.as_deref(),
            class.compartment,
        ),
        "compartment",
        "the compartment of the vault's secrets, which ListSecrets needs",
    ));
    let directory = problems.take(parse_directory(index, item.directory.as_deref()));
    let mode = problems.take(parse_mode(index, item.mode.as_ref()));
    let encoding = problems.take(parse_encoding(index, item.encoding.as_deref()));
    Some(SelectionSpec {
        index,
        vault_id: vault_id?,
        compartment_id: compartment_id?,
        filter: vault::SecretFilter {
            tag: tag?,
            name_prefix: name_prefix?,
        },
        directory: directory?,
        mode: mode?,
        encoding: encoding?,
    })
}

/// `tag`: `key=value`, or `key` alone for any value (freeform tags, compared exactly).
fn parse_tag(index: usize, raw: Option<&str>) -> Result<Option<vault::TagFilter>, ParamError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let (key, value) = match raw.split_once('=') {
        Some((key, value)) => (key, Some(value.to_owned())),
        None => (raw, None),
    };
    if key.is_empty() || key.trim() != key || key.len() > 100 {
        return Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].tag {} is not a freeform tag: write key=value \
             (or key, for any value), the key 1 to 100 characters without surrounding spaces",
            quote(raw)
        )));
    }
    Ok(Some(vault::TagFilter {
        key: key.to_owned(),
        value,
    }))
}

/// `namePrefix`: the start of the names selected, not empty.
fn parse_prefix(index: usize, raw: Option<&str>) -> Result<Option<String>, ParamError> {
    match raw {
        None => Ok(None),
        Some(p) if !p.is_empty() && p.len() <= MAX_OCI_PARAMETER_LEN => Ok(Some(p.to_owned())),
        Some(p) => Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].namePrefix {} must be 1 to \
             {MAX_OCI_PARAMETER_LEN} characters (leave it out to select by tag alone)",
            quote(p)
        ))),
    }
}

/// The entry's own OCID of `field`, else the class parameter of the same name.
fn own_or_class(
    index: usize,
    (field, own, class): (&str, Option<&str>, Option<&str>),
    kind: &str,
    why: &str,
) -> Result<String, ParamError> {
    match (own.filter(|v| !v.is_empty()), class) {
        (Some(own), _) => {
            let what = format!("{RETRIEVE_PREFIX}: secrets[{index}].{field}");
            check_ocid(&what, own, kind)
        }
        (None, Some(class)) => Ok(class.to_owned()),
        (None, None) => Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}] selects secrets by tag or namePrefix: it needs \
             {field}, {why} (give secrets[{index}].{field} or the class parameter \"{field}\")"
        ))),
    }
}

/// `directory`: where the selected secrets' files go (`.` or none: the top of the mount).
fn parse_directory(index: usize, raw: Option<&str>) -> Result<Option<String>, ParamError> {
    match raw.map(str::trim) {
        None | Some("") | Some(".") => Ok(None),
        Some(d) => {
            let d = d.trim_end_matches('/');
            FilePath::new(d).map(|_| Some(d.to_owned())).map_err(|e| {
                ParamError::new(format!(
                    "{RETRIEVE_PREFIX}: invalid directory: secrets[{index}].directory: {e}"
                ))
            })
        }
    }
}

/// The entry ready to start: it then waits for a fan-out permit (its listing's, then each
/// selected secret's).
pub(crate) fn start<'a, V: SecretsService, L: ListingService>(
    run: &'a MountRun<'_>,
    (secrets, listings): (&'a V, &'a L),
    spec: &'a SelectionSpec,
    (targets, room): (&'a Targets, Arc<AtomicUsize>),
) -> Start<'a> {
    Box::new(move || {
        let span = tracing::info_span!(
            "select secrets",
            entry = spec.index,
            selection = %spec.describe(),
            region = tracing::field::Empty,
            lookup = tracing::field::Empty,
            listing = tracing::field::Empty,
            oci.request_id = tracing::field::Empty,
            error.kind = tracing::field::Empty,
        );
        let services = (secrets.clone(), listings.clone());
        let recorded = span.clone();
        let entry =
            async move { selection_entry(run, services, spec, (targets, &room), &recorded).await };
        Box::pin(entry.instrument(span)) as Running<'a>
    })
}

/// One selection entry, taking what it selects from `room` (the files the mount's
/// selections may still write besides its other entries') before it fetches anything; what
/// happened goes into `span`.
async fn selection_entry<V: SecretsService, L: ListingService>(
    run: &MountRun<'_>,
    (secrets, listings): (V, L),
    spec: &SelectionSpec,
    (targets, room): (&Targets, &AtomicUsize),
    span: &tracing::Span,
) -> EntryOutcome {
    let index = spec.index;
    let permit = run.permits.clone().acquire_owned().await;
    let target = &targets.primary;
    let Some(base_url) = target.endpoints.vaults.clone() else {
        return EntryOutcome::Stop(MountError::invalid_argument(format!(
            "secrets[{index}].{}: no Vault API endpoint to list secrets: the principal's \
             region is not known and the provider's [endpoints] vaults is not set",
            spec.describe()
        )));
    };
    let request = vault::ListRequest {
        base_url,
        session: target.session.clone(),
        kind: vault::ListKind::Secrets {
            compartment_id: spec.compartment_id.clone(),
            vault_id: spec.vault_id.clone(),
        },
        deadline: run.request.deadline,
        // `Budget` puts its hook in when it passes the request on.
        backoff: vault::Backoff::none(),
        pages: run.pages.clone(),
    };
    let what = format!("secrets[{index}].{}", spec.describe());
    let hint = policy_hint(&spec.compartment_id);
    let (listing, held) = match list(run, listings, request, (&what, &hint), span).await {
        Ok(listed) => listed,
        Err(ended) => return ended,
    };
    drop(permit);
    if let Some(stopped) = listing.stopped {
        return EntryOutcome::Stop(stopped_early(spec, stopped));
    }
    let selected: Vec<&vault::ListedSecret> = listing
        .secrets
        .iter()
        .filter(|secret| spec.filter.matches(&secret.name, &secret.tags))
        .collect();
    let taken = room.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
        left.checked_sub(selected.len())
    });
    if let Err(left) = taken {
        return EntryOutcome::Stop(too_many(run, spec, left));
    }
    if selected.is_empty() {
        // As a `name` entry whose secret does not exist: most likely a mistyped tag.
        return EntryOutcome::Stop(MountError::new(
            ErrorKind::NotFound,
            format!(
                "{what} selects no ACTIVE secret of vault {} in compartment {}",
                spec.vault_id, spec.compartment_id
            ),
        ));
    }
    let entries: Result<Vec<SecretSpec>, MountError> = selected
        .iter()
        .map(|secret| name_entry(spec, &secret.name))
        .collect();
    let entries = match entries {
        Ok(entries) => entries,
        Err(err) => return EntryOutcome::Stop(err),
    };
    let deadline = run.request.deadline;
    let parts = entries.iter().map(|entry| {
        let requests = secret_requests(entry, targets, deadline);
        secret_entry(run, secrets.clone(), entry, requests, span).boxed()
    });
    gather_parts(index, parts, held).await
}

/// A selected secret as the `name` entry it is read as: its `CURRENT` version, written
/// whole to `directory/<its name>`, never failing over (its listing did not).
fn name_entry(spec: &SelectionSpec, name: &str) -> Result<SecretSpec, MountError> {
    let path = spec.path_of(name).map_err(|e| {
        MountError::invalid_argument(format!(
            "secrets[{}].{} selected secret {}, which cannot be a file name: {e}",
            spec.index,
            spec.describe(),
            quote(name)
        ))
    })?;
    Ok(SecretSpec {
        index: spec.index,
        source: SecretSource::Name {
            name: name.to_owned(),
            vault_id: spec.vault_id.clone(),
        },
        selector: VersionSelector::Stage(Stage::Current),
        path,
        mode: spec.mode,
        encoding: spec.encoding,
        keys: Vec::new(),
        format: None,
        whole: true,
        history: Vec::new(),
        failover: None,
        write: true,
    })
}

/// The policy statement a refused ListSecrets needs (its subject depends on who the
/// principal is, which the operator knows).
fn policy_hint(compartment: &str) -> String {
    format!(
        "; listing a vault's secrets needs the IAM policy statement \"Allow <the principal's \
         group or dynamic-group> to inspect secrets in compartment id {compartment}\" besides \
         \"read secret-bundles\" (and the compartment must hold the vault)"
    )
}

/// More secrets selected than the mount may still write.
fn too_many(run: &MountRun<'_>, spec: &SelectionSpec, room: usize) -> MountError {
    MountError::invalid_argument(format!(
        "secrets[{}].{} selects more than {room} secrets of vault {}, the files this mount may \
         still write (server.max_files_per_mount is {}); narrow the selection or split it over \
         several SecretProviderClasses",
        spec.index,
        spec.describe(),
        spec.vault_id,
        run.config.max_files
    ))
}

/// The listing stopped before its end: a vault too large to list.
fn stopped_early(spec: &SelectionSpec, stopped: vault::ListStop) -> MountError {
    let index = spec.index;
    let selection = spec.describe();
    match stopped {
        vault::ListStop::TooManyPages => MountError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "secrets[{index}].{selection}: vault {} has more than {} secrets in \
                 compartment {}; the listing stopped there: select from a smaller vault",
                spec.vault_id,
                vault::MAX_PAGES as usize * vault::SECRETS_PAGE_LIMIT,
                spec.compartment_id
            ),
        ),
    }
}

/// The entry's files, known only once the vault is listed, as `check` shows them: one line
/// for them all, saying what is selected, from where.
pub(crate) fn describe(spec: &SelectionSpec) -> Vec<FileDescription> {
    let path = match &spec.directory {
        Some(directory) => format!("{directory}/<each secret's name>"),
        None => "<each secret's name>".to_owned(),
    };
    vec![FileDescription {
        path,
        mode: spec.mode,
        source: format!(
            "every ACTIVE secret with {} (listed at mount time), compartment {}",
            spec.describe(),
            spec.compartment_id
        ),
        vault: spec.vault_id.clone(),
        selector: "stage CURRENT".to_owned(),
        key: String::new(),
        encoding: spec.encoding.as_str().to_owned(),
        written: true,
        selection: Some(spec.describe()),
    }]
}
