//! What entries of every kind share: the version selector and the file mode. A leaf of
//! the entry checks (`secret.rs`, `certificate.rs`).

use bounded::quote;

use super::problems::{ParamError, RETRIEVE_PREFIX, UNMARSHAL_PREFIX};
use super::spec::{MAX_OCI_PARAMETER_LEN, Stage, VersionSelector};
use super::yaml::{RawMode, RawSecret, RawVersion};

/// `stage`, `versionNumber`, `versionName`: at most one (default stage `CURRENT`).
pub(crate) fn parse_selector(
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

pub(crate) fn parse_mode(
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

/// A count from 1 to `max` (`versions`), written as an integer or a quoted integer.
pub(crate) fn parse_count(field: &str, raw: &RawVersion, max: usize) -> Result<usize, ParamError> {
    let shown = match raw {
        RawVersion::Integer(n) => n.to_string(),
        RawVersion::Text(t) => quote(t).to_string(),
        RawVersion::Other(o) => o.clone(),
    };
    let value = match raw {
        RawVersion::Integer(n) => usize::try_from(*n).ok(),
        RawVersion::Text(t) if t.bytes().all(|b| b.is_ascii_digit()) => t.parse().ok(),
        _ => None,
    };
    value.filter(|n| (1..=max).contains(n)).ok_or_else(|| {
        ParamError::new(format!(
            "{RETRIEVE_PREFIX}: {field} {shown} must be a whole number from 1 to {max}"
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
