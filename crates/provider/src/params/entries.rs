//! What every entry goes through whatever its kind: the list as a whole (no duplicate or
//! colliding file), the version selector and the file mode.

use std::collections::BTreeMap;

use csi_grpc::validate_file_set;

use super::certificate::{certificate_kind, check_certificate};
use super::secret::{check_secret, refuse_certificate_fields};
use super::yaml::{RawMode, RawSecret, RawVersion};
use super::{
    CertificateSpec, MAX_OCI_PARAMETER_LEN, ParamError, RETRIEVE_PREFIX, SecretSpec, Stage,
    UNMARSHAL_PREFIX, VersionSelector,
};

/// `failover`: `None` without `failoverRegion`, else the class-level `failoverVaultId`.
pub(super) fn check_secrets(
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

/// `stage`, `versionNumber`, `versionName`: at most one (default stage `CURRENT`).
pub(super) fn parse_selector(
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

pub(super) fn parse_mode(
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
