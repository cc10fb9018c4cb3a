//! Selection entries (`tag`, `namePrefix`): which secrets of which vault and compartment
//! they list, and where their files go.

use bounded::quote;
use csi_grpc::FilePath;

use super::class::check_ocid;
use super::fields::parse_mode;
use super::problems::{ParamError, Problems, RETRIEVE_PREFIX};
use super::secret::parse_encoding;
use super::spec::{MAX_OCI_PARAMETER_LEN, SelectionSpec};
use super::yaml::{EntryKind, RawSecret};

/// What a selection entry takes, as messages say it (checked against
/// [`RawSecret::given`]'s table by a test).
pub(super) const SELECTION_TAKES: &str = "tag and namePrefix entries take vaultId, encoding, \
     tag, namePrefix, compartmentId, directory and mode";

/// The class-level values a selection falls back on: `vaultId`, `compartmentId`.
#[derive(Clone, Copy, Debug)]
pub(super) struct ClassDefaults<'a> {
    pub(super) vault: Option<&'a str>,
    pub(super) compartment: Option<&'a str>,
}

/// A `tag` / `namePrefix` entry, each field checked whatever the others gave; the
/// problems go to `problems`.
pub(super) fn check_selection(
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
