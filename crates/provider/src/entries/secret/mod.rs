//! Secret entries (`name` or `secretId`): their parameters and checks (source, version,
//! file, encoding, `keys`, failover; `versions` makes them a version history, `history.rs`),
//! their requests and fetch (`fetch.rs`), and their files (`files.rs`).

use bounded::quote;
use csi_grpc::FilePath;

use crate::extract::{Format, KeySpec};
use crate::params::class::check_ocid;
use crate::params::fields::{parse_count, parse_mode, parse_selector};
use crate::params::problems::{ParamError, Problems, RETRIEVE_PREFIX};
use crate::params::spec::{
    Encoding, MAX_OCI_PARAMETER_LEN, MAX_VERSIONS, SecretSource, VersionSelector,
};
use crate::params::yaml::{EntryKind, RawKey, RawSecret};

use super::FileDescription;

mod fetch;
mod files;

pub(crate) use fetch::{
    bundle_files, fetch_bundle, fetch_span, metered, secret_entry, secret_requests, start,
};
pub(crate) use files::secret_files;

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

/// A secret entry with a field that only other kinds of entry take.
pub(crate) fn refuse_certificate_fields(index: usize, item: &RawSecret) -> Result<(), ParamError> {
    match item.misplaced(EntryKind::Secret) {
        Some(field) => Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].{field} applies to {}",
            item.kinds_of(field)
        ))),
        None => Ok(()),
    }
}

/// A `name` or `secretId` entry: its source, version and file, then what it is written as
/// (encoding, `keys`), then where it is read on failover. Each field is checked whatever
/// the others gave (a field that needs the source waits for one); the problems go to
/// `problems`.
pub(crate) fn check(
    index: usize,
    item: &RawSecret,
    class_vault: Option<&str>,
    failover: Option<Option<&str>>,
    problems: &mut Problems,
) -> Option<SecretSpec> {
    let source = problems.take(secret_source(index, item, class_vault));
    let shown = match &source {
        Some(source) => source.display(),
        None => item
            .name
            .as_deref()
            .or(item.secret_id.as_deref())
            .unwrap_or_default(),
    };
    let selector = problems.take(parse_selector(index, item, shown));
    let path = match &source {
        Some(source) => problems.take(secret_path(index, item, source)),
        // Without a source the entry's own fileName is still checked: every problem of the
        // entry is named at once, not one per run of `check`.
        None => {
            problems.take(own_file_name(index, item));
            None
        }
    };
    let keys = secret_keys(index, item, problems);
    let failover = source
        .as_ref()
        .and_then(|source| problems.take(secret_failover(index, item, failover, source)));
    let mode = problems.take(parse_mode(index, item.mode.as_ref()));
    let encoding = problems.take(parse_encoding(index, item.encoding.as_deref()));
    let history = path
        .as_ref()
        .and_then(|(_, path)| problems.take(secret_history(index, item, path)));
    let (source, selector, (field, path), (keys, format), failover, mode, encoding, history) = (
        source?, selector?, path?, keys?, failover?, mode?, encoding?, history?,
    );
    Some(SecretSpec {
        index,
        failover,
        source,
        selector,
        path,
        mode,
        encoding,
        // With keys, the whole secret is written too only where the entry names its file;
        // with versions, each version is.
        whole: history.is_empty() && (keys.is_empty() || field == "fileName"),
        keys,
        format,
        history,
        write: item.write_file.unwrap_or(true),
    })
}

/// `versions: N`: the files `path/0` (current) to `path/N-1`, N from 1 to
/// [`MAX_VERSIONS`], counting back from the current version (so with no other selector)
/// and each written whole (so without keys).
fn secret_history(
    index: usize,
    item: &RawSecret,
    path: &FilePath,
) -> Result<Vec<FilePath>, ParamError> {
    let Some(raw) = &item.versions else {
        return Ok(Vec::new());
    };
    let field = format!("secrets[{index}].versions");
    let count = parse_count(&field, raw, MAX_VERSIONS)?;
    let selector = [
        ("stage", item.stage.is_some()),
        ("versionNumber", item.version_number.is_some()),
        ("versionName", item.version_name.is_some()),
        ("keys", item.keys.is_some()),
    ];
    if let Some((other, _)) = selector.iter().find(|(_, given)| *given) {
        return Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: {field} counts back from the CURRENT version and writes each \
             version whole, to {path}/0, {path}/1, ...: it does not combine with \
             secrets[{index}].{other}"
        )));
    }
    (0..count)
        .map(|k| {
            FilePath::new(format!("{path}/{k}")).map_err(|e| {
                ParamError::new(format!(
                    "{RETRIEVE_PREFIX}: invalid file name: {field}: {e}"
                ))
            })
        })
        .collect()
}

/// `name` (in the entry's, else the class's, `vaultId`) or `secretId`: exactly one.
fn secret_source(
    index: usize,
    item: &RawSecret,
    class_vault: Option<&str>,
) -> Result<SecretSource, ParamError> {
    let name = item.name.as_deref().unwrap_or_default();
    let secret_id = item.secret_id.as_deref().unwrap_or_default();
    match (name.trim().is_empty(), secret_id.is_empty()) {
        (true, true) => Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: missed secret name: secrets[{index}].name is empty (or give \
             secrets[{index}].secretId, a secret OCID)"
        ))),
        (false, false) => Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}] has both name {} and secretId \
             {}: give exactly one",
            quote(name),
            quote(secret_id)
        ))),
        (true, false) => {
            if let Some(vault) = &item.vault_id {
                return Err(ParamError::new(format!(
                    "{RETRIEVE_PREFIX}: secrets[{index}].vaultId {} applies to name \
                     entries only; secretId {} already names the secret",
                    quote(vault),
                    quote(secret_id)
                )));
            }
            let what = format!("{RETRIEVE_PREFIX}: secrets[{index}].secretId");
            Ok(SecretSource::Id(check_ocid(&what, secret_id, "secret")?))
        }
        (false, true) => {
            if name.len() > MAX_OCI_PARAMETER_LEN {
                return Err(ParamError::new(format!(
                    "{RETRIEVE_PREFIX}: secrets[{index}].name is {} characters long; OCI secret \
                     names have at most {MAX_OCI_PARAMETER_LEN}",
                    name.len()
                )));
            }
            let vault_id = match item.vault_id.as_deref().filter(|v| !v.is_empty()) {
                Some(own) => {
                    let what = format!("{RETRIEVE_PREFIX}: secrets[{index}].vaultId");
                    check_ocid(&what, own, "vault")?
                }
                None => class_vault.map(str::to_owned).ok_or_else(|| {
                    ParamError::new(format!(
                        "missed \"vaultId\" SecretProviderClass parameters: the OCID of the \
                         vault that holds the secrets (secrets[{index}] {} has no vaultId \
                         of its own)",
                        quote(name)
                    ))
                })?,
            };
            Ok(SecretSource::Name {
                name: name.to_owned(),
                vault_id,
            })
        }
    }
}

/// The entry's file, and the field it came from: `fileName`, else `name`, else the
/// `secretId`'s last segment.
fn secret_path(
    index: usize,
    item: &RawSecret,
    source: &SecretSource,
) -> Result<(&'static str, FilePath), ParamError> {
    let (field, raw_path) = match (item.file_name.as_deref().map(str::trim), source) {
        (Some(f), _) if !f.is_empty() => ("fileName", f.to_owned()),
        (_, SecretSource::Name { name, .. }) => ("name", name.trim().to_owned()),
        (_, SecretSource::Id(id)) => ("secretId", id.rsplit('.').next().unwrap_or(id).to_owned()),
    };
    let path = FilePath::new(&raw_path).map_err(|e| {
        ParamError::new(format!(
            "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].{field}: {e}"
        ))
    })?;
    Ok((field, path))
}

/// The entry's `fileName`, when it gives one, checked on its own.
fn own_file_name(index: usize, item: &RawSecret) -> Result<(), ParamError> {
    match item.file_name.as_deref().map(str::trim) {
        Some(name) if !name.is_empty() => FilePath::new(name).map(drop).map_err(|e| {
            ParamError::new(format!(
                "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].fileName: {e}"
            ))
        }),
        _ => Ok(()),
    }
}

/// `keys` (not empty when given, each item checked) and the `format` they are read with
/// (only with keys).
fn secret_keys(
    index: usize,
    item: &RawSecret,
    problems: &mut Problems,
) -> Option<(Vec<KeySpec>, Option<Format>)> {
    let format = problems.take(match item.format.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(f) if f.eq_ignore_ascii_case("json") => Ok(Some(Format::Json)),
        Some(f) if f.eq_ignore_ascii_case("yaml") => Ok(Some(Format::Yaml)),
        Some(f) => Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].format {} is not one of json, yaml",
            quote(f)
        ))),
    });
    let keys: Option<Vec<KeySpec>> = match item.keys.as_ref().map(|k| &k.0) {
        None => Some(Vec::new()),
        Some(keys) if keys.is_empty() => {
            problems.note(ParamError::new(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].keys is an empty list: name at least one key, \
                 or leave keys out to write the whole secret"
            )));
            None
        }
        Some(keys) => {
            let checked: Vec<Option<KeySpec>> = keys
                .iter()
                .enumerate()
                .map(|(k, raw)| problems.take(check_key(index, k, raw)))
                .collect();
            checked.into_iter().collect()
        }
    };
    if matches!(format, Some(Some(_))) && item.keys.is_none() {
        problems.note(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].format applies with keys only"
        )));
        return None;
    }
    Some((keys?, format?))
}

/// Where the entry is read in the failover region (`failover`: `None` without
/// `failoverRegion`, else the class's `failoverVaultId`): the same OCID, or the name in the
/// entry's own or the class's replica vault.
fn secret_failover(
    index: usize,
    item: &RawSecret,
    failover: Option<Option<&str>>,
    source: &SecretSource,
) -> Result<Option<SecretSource>, ParamError> {
    let own_vault = match item.failover_vault_id.as_deref() {
        None | Some("") => None,
        Some(id) => {
            let what = format!("{RETRIEVE_PREFIX}: secrets[{index}].failoverVaultId");
            Some(check_ocid(&what, id, "vault")?)
        }
    };
    match (failover, source) {
        (None, _) if own_vault.is_some() => Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].failoverVaultId needs the class parameter \
             \"failoverRegion\""
        ))),
        (None, _) => Ok(None),
        (Some(_), SecretSource::Id(_)) if own_vault.is_some() => Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].failoverVaultId applies to name entries \
             only; a secretId is the same in its replica"
        ))),
        (Some(_), SecretSource::Id(id)) => Ok(Some(SecretSource::Id(id.clone()))),
        (Some(class_vault), SecretSource::Name { name, .. }) => {
            let vault_id = own_vault
                .or_else(|| class_vault.map(str::to_owned))
                .ok_or_else(|| {
                    ParamError::new(format!(
                        "{RETRIEVE_PREFIX}: secrets[{index}] {} is read by name, so with \
                         \"failoverRegion\" it needs the replica vault: set \"failoverVaultId\" \
                         (or secrets[{index}].failoverVaultId)",
                        quote(name)
                    ))
                })?;
            Ok(Some(SecretSource::Name {
                name: name.clone(),
                vault_id,
            }))
        }
    }
}

fn check_key(index: usize, k: usize, raw: &RawKey) -> Result<KeySpec, ParamError> {
    let key = raw.key.as_deref().unwrap_or_default();
    if key.is_empty() || key.len() > 1024 {
        return Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].keys[{k}].key must be a top-level key or a JSON \
             Pointer starting with / (1 to 1024 characters)"
        )));
    }
    let (field, name) = match raw.file_name.as_deref().map(str::trim) {
        Some(f) if !f.is_empty() => ("fileName", f.to_owned()),
        _ => ("key", KeySpec::default_file_name(key)),
    };
    let path = FilePath::new(&name).map_err(|e| {
        ParamError::new(format!(
            "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].keys[{k}].{field} {}: {e}",
            quote(&name)
        ))
    })?;
    let mode = parse_mode(index, raw.mode.as_ref()).map_err(|e| {
        e.map(|problem| {
            problem.replace(
                &format!("secrets[{index}].mode"),
                &format!("secrets[{index}].keys[{k}].mode"),
            )
        })
    })?;
    Ok(KeySpec {
        key: key.to_owned(),
        path,
        mode,
    })
}

pub(crate) fn parse_encoding(index: usize, raw: Option<&str>) -> Result<Encoding, ParamError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(Encoding::Utf8),
        Some(e) if e.eq_ignore_ascii_case("utf-8") || e.eq_ignore_ascii_case("utf8") => {
            Ok(Encoding::Utf8)
        }
        Some(e) if e.eq_ignore_ascii_case("base64") => Ok(Encoding::Base64),
        Some(e) if e.eq_ignore_ascii_case("hex") => Ok(Encoding::Hex),
        Some(e) => Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].encoding {} is not one of utf-8, base64, hex",
            quote(e)
        ))),
    }
}

/// How `check` names the secret, and its vault.
pub(crate) fn source_and_vault(spec: &SecretSpec) -> (String, String) {
    let (mut source, vault) = match &spec.source {
        SecretSource::Name { name, vault_id } => (format!("secret {name:?}"), vault_id.clone()),
        SecretSource::Id(id) => (format!("secret {id}"), String::new()),
    };
    if !spec.write {
        source.push_str(" (read by templates, not written)");
    }
    (source, vault)
}

/// The version `check` says a selector reads.
pub(crate) fn selector_text(selector: &VersionSelector) -> String {
    match selector {
        VersionSelector::Stage(stage) => format!("stage {stage}"),
        VersionSelector::Number(n) => format!("version {n}"),
        VersionSelector::Name(n) => format!("version name {n:?}"),
    }
}

/// The entry's files as `check` shows them: each `keys` item's, then the whole secret's.
pub(crate) fn describe(spec: &SecretSpec) -> Vec<FileDescription> {
    let (source, vault) = source_and_vault(spec);
    let file = |path: &FilePath, mode: Option<csi_grpc::FileMode>, key: &str| FileDescription {
        path: path.as_str().to_owned(),
        mode,
        source: source.clone(),
        vault: vault.clone(),
        selector: selector_text(&spec.selector),
        key: key.to_owned(),
        encoding: spec.encoding.as_str().to_owned(),
        written: spec.write,
        selection: None,
    };
    let mut files: Vec<FileDescription> = spec
        .keys
        .iter()
        .map(|key| file(&key.path, key.mode.or(spec.mode), &key.key))
        .collect();
    if spec.whole {
        files.push(file(&spec.path, spec.mode, ""));
    }
    files
}

/// The files the entry claims in the class: each key's, the whole secret's (a duplicate
/// is named after the field it comes from: `fileName` or the secret's name), each
/// version's.
pub(crate) fn claims<'a>(
    spec: &'a SecretSpec,
    item: &RawSecret,
) -> Vec<(&'a FilePath, Option<usize>, &'static str)> {
    let mut claims: Vec<(&FilePath, Option<usize>, &'static str)> = spec
        .keys
        .iter()
        .enumerate()
        .map(|(k, key)| (&key.path, Some(k), "duplicated fileName name"))
        .collect();
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
        claims.push((&spec.path, None, what));
    }
    claims.extend(
        spec.history
            .iter()
            .map(|p| (p, None, "duplicated file name")),
    );
    claims
}
