//! What every entry goes through whatever its kind: the list as a whole (no duplicate or
//! colliding file), the version selector and the file mode.

use std::collections::BTreeMap;

use bounded::quote;
use csi_grpc::{FilePath, validate_file_set};

use super::certificate::{certificate_kind, check_certificate};
use super::problems::{ParamError, Problems, RETRIEVE_PREFIX, UNMARSHAL_PREFIX};
use super::secret::{check_secret, refuse_certificate_fields};
use super::yaml::{RawMode, RawSecret, RawVersion};
use super::{CertificateSpec, MAX_OCI_PARAMETER_LEN, SecretSpec, Stage, VersionSelector};

/// Every entry, each checked whatever the others gave; their problems go to `problems` and
/// the entries without any are answered. `failover`: `None` without `failoverRegion`, else
/// the class-level `failoverVaultId`.
pub(super) fn check_secrets(
    raw: Vec<RawSecret>,
    class_vault: Option<&str>,
    failover: Option<Option<&str>>,
    problems: &mut Problems,
) -> (Vec<SecretSpec>, Vec<CertificateSpec>) {
    if raw.is_empty() {
        problems.note(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: requested secrets are missed: parameter \"secrets\" is an empty list"
        )));
        return (Vec::new(), Vec::new());
    }
    let mut specs = Vec::with_capacity(raw.len());
    let mut certificates = Vec::new();
    let mut files = FileNames::default();

    for (index, item) in raw.into_iter().enumerate() {
        if let Some(kind) = certificate_kind(&item) {
            if let Some(spec) = problems.take(check_certificate(index, kind, &item)) {
                for path in spec.files() {
                    problems.take(files.claim(path, index, None, "duplicated file name"));
                }
                certificates.push(spec);
            }
            continue;
        }
        problems.take(refuse_certificate_fields(index, &item));
        let Some(spec) = check_secret(index, &item, class_vault, failover, problems) else {
            continue;
        };
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
        specs.push(spec);
    }
    // The driver's rules for the set (no file that is also a directory, ...); duplicates
    // were named above, entry by entry.
    if files.duplicated {
        return (specs, certificates);
    }
    problems.take(
        validate_file_set(
            specs
                .iter()
                .flat_map(SecretSpec::files)
                .chain(certificates.iter().flat_map(CertificateSpec::files)),
        )
        .map_err(|e| {
            ParamError::new(format!(
                "{RETRIEVE_PREFIX}: invalid file name in parameter \"secrets\": {e}"
            ))
        }),
    );
    (specs, certificates)
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

/// `stage`, `versionNumber`, `versionName`: at most one (default stage `CURRENT`).
pub(super) fn parse_selector(
    index: usize,
    item: &RawSecret,
    shown: &str,
) -> Result<VersionSelector, ParamError> {
    let stage = match item.stage.as_deref() {
        None | Some("") => None,
        Some(s) => Some(s.parse::<Stage>().map_err(|_| {
            ParamError::new(format!(
                "{UNMARSHAL_PREFIX}: secrets[{index}].stage {} is not one of CURRENT, PENDING, \
                 LATEST, PREVIOUS, DEPRECATED (upper case)",
                quote(s)
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
            return Err(ParamError::new(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].versionName {} is not a version name (at \
                 most {MAX_OCI_PARAMETER_LEN} characters, no surrounding spaces)",
                quote(n)
            )));
        }
        Some(n) => Some(n.to_owned()),
    };
    Ok(match (stage, number, version_name) {
        (None, None, Some(version_name)) => VersionSelector::Name(version_name),
        (Some(stage), Some(number), _) => {
            return Err(ParamError::new(format!(
                "{RETRIEVE_PREFIX}: secret should be identified either with a version number or \
                 with stage: secrets[{index}] ({}) has stage {stage} and versionNumber {number}",
                quote(shown)
            )));
        }
        (stage, number, Some(version_name)) => {
            return Err(ParamError::new(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}] ({}) has versionName \
                 {} and also {}: give at most one of stage, versionNumber, \
                 versionName",
                quote(shown),
                quote(&version_name),
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

pub(super) fn parse_mode(
    index: usize,
    raw: Option<&RawMode>,
) -> Result<Option<csi_grpc::FileMode>, ParamError> {
    let text = match raw {
        None => return Ok(None),
        Some(RawMode::Text(t)) if t.is_empty() => return Ok(None),
        Some(RawMode::Text(t)) => t,
        Some(RawMode::Integer(n)) => {
            return Err(ParamError::new(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].mode {n} is a YAML number: quote it, e.g. \
                 mode: \"0400\" (YAML 1.1 and 1.2 read an unquoted 0400 differently)"
            )));
        }
        Some(RawMode::Other) => {
            return Err(ParamError::new(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].mode must be a quoted octal mode such as \"0400\""
            )));
        }
    };
    let octal = (3..=4).contains(&text.len()) && text.bytes().all(|b| (b'0'..=b'7').contains(&b));
    let mode = u32::from_str_radix(text, 8)
        .ok()
        .filter(|m| octal && *m <= 0o777);
    mode.and_then(csi_grpc::FileMode::new)
        .map(Some)
        .ok_or_else(|| {
            ParamError::new(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].mode {} is not a file mode: 3 or 4 octal \
             digits, at most 0777 (e.g. \"0400\", \"640\")",
                quote(text)
            ))
        })
}

fn parse_version_number(index: usize, raw: &RawVersion) -> Result<Option<u64>, ParamError> {
    let bad = |shown: &str| {
        ParamError::new(format!(
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
            _ => Err(bad(&quote(t).to_string())),
        },
        RawVersion::Other(o) => Err(bad(o)),
    }
}
