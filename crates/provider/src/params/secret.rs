//! Secret entries (`name` or `secretId`): their source, version, file, encoding, `keys` and
//! failover.

use csi_grpc::FilePath;

use super::class::check_ocid;
use super::entries::{parse_mode, parse_selector};
use super::yaml::{RawKey, RawSecret};
use super::{
    Encoding, Format, KeySpec, MAX_OCI_PARAMETER_LEN, ParamError, RETRIEVE_PREFIX, SecretSource,
    SecretSpec,
};

/// A secret entry with a field that only certificate entries take.
pub(super) fn refuse_certificate_fields(index: usize, item: &RawSecret) -> Result<(), ParamError> {
    match item.misplaced(None) {
        Some(field) => Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].{field} applies to certificate entries only \
             (certificateId, certificateAuthorityId, caBundleId)"
        ))),
        None => Ok(()),
    }
}

/// A `name` or `secretId` entry: its source, version and file, then what it is written as
/// (encoding, `keys`), then where it is read on failover.
pub(super) fn check_secret(
    index: usize,
    item: &RawSecret,
    class_vault: Option<&str>,
    failover: Option<Option<&str>>,
) -> Result<SecretSpec, ParamError> {
    let source = secret_source(index, item, class_vault)?;
    let selector = parse_selector(index, item, source.display())?;
    let (field, path) = secret_path(index, item, &source)?;
    let (keys, format) = secret_keys(index, item)?;
    let failover = secret_failover(index, item, failover, &source)?;
    Ok(SecretSpec {
        index,
        failover,
        source,
        selector,
        path,
        mode: parse_mode(index, item.mode.as_ref())?,
        encoding: parse_encoding(index, item.encoding.as_deref())?,
        // With keys, the whole secret is written too only where the entry names its file.
        whole: keys.is_empty() || field == "fileName",
        keys,
        format,
    })
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
        (true, true) => Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: missed secret name: secrets[{index}].name is empty (or give \
             secrets[{index}].secretId, a secret OCID)"
        ))),
        (false, false) => Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}] has both name {name:?} and secretId \
             {secret_id:?}: give exactly one"
        ))),
        (true, false) => {
            if let Some(vault) = &item.vault_id {
                return Err(ParamError(format!(
                    "{RETRIEVE_PREFIX}: secrets[{index}].vaultId {vault:?} applies to name \
                     entries only; secretId {secret_id:?} already names the secret"
                )));
            }
            let what = format!("{RETRIEVE_PREFIX}: secrets[{index}].secretId");
            Ok(SecretSource::Id(check_ocid(&what, secret_id, "secret")?))
        }
        (false, true) => {
            if name.len() > MAX_OCI_PARAMETER_LEN {
                return Err(ParamError(format!(
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
                    ParamError(format!(
                        "missed \"vaultId\" SecretProviderClass parameters: the OCID of the \
                         vault that holds the secrets (secrets[{index}] {name:?} has no vaultId \
                         of its own)"
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
        ParamError(format!(
            "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].{field}: {e}"
        ))
    })?;
    Ok((field, path))
}

/// `keys` (not empty when given) and the `format` they are read with (only with keys).
fn secret_keys(
    index: usize,
    item: &RawSecret,
) -> Result<(Vec<KeySpec>, Option<Format>), ParamError> {
    let format = match item.format.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(f) if f.eq_ignore_ascii_case("json") => Some(Format::Json),
        Some(f) if f.eq_ignore_ascii_case("yaml") => Some(Format::Yaml),
        Some(f) => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].format {f:?} is not one of json, yaml"
            )));
        }
    };
    let keys: Vec<KeySpec> = match item.keys.as_ref().map(|k| &k.0) {
        None => Vec::new(),
        Some(keys) if keys.is_empty() => {
            return Err(ParamError(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}].keys is an empty list: name at least one key, \
                 or leave keys out to write the whole secret"
            )));
        }
        Some(keys) => keys
            .iter()
            .enumerate()
            .map(|(k, raw)| check_key(index, k, raw))
            .collect::<Result<_, _>>()?,
    };
    if format.is_some() && keys.is_empty() {
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].format applies with keys only"
        )));
    }
    Ok((keys, format))
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
        (None, _) if own_vault.is_some() => Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].failoverVaultId needs the class parameter \
             \"failoverRegion\""
        ))),
        (None, _) => Ok(None),
        (Some(_), SecretSource::Id(_)) if own_vault.is_some() => Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].failoverVaultId applies to name entries \
             only; a secretId is the same in its replica"
        ))),
        (Some(_), SecretSource::Id(id)) => Ok(Some(SecretSource::Id(id.clone()))),
        (Some(class_vault), SecretSource::Name { name, .. }) => {
            let vault_id = own_vault
                .or_else(|| class_vault.map(str::to_owned))
                .ok_or_else(|| {
                    ParamError(format!(
                        "{RETRIEVE_PREFIX}: secrets[{index}] {name:?} is read by name, so with \
                         \"failoverRegion\" it needs the replica vault: set \"failoverVaultId\" \
                         (or secrets[{index}].failoverVaultId)"
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
        return Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].keys[{k}].key must be a top-level key or a JSON \
             Pointer starting with / (1 to 1024 characters)"
        )));
    }
    let (field, name) = match raw.file_name.as_deref().map(str::trim) {
        Some(f) if !f.is_empty() => ("fileName", f.to_owned()),
        _ => ("key", KeySpec::default_file_name(key)),
    };
    let path = FilePath::new(&name).map_err(|e| {
        ParamError(format!(
            "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].keys[{k}].{field} {name:?}: {e}"
        ))
    })?;
    let mode = parse_mode(index, raw.mode.as_ref()).map_err(|e| {
        ParamError(e.0.replace(
            &format!("secrets[{index}].mode"),
            &format!("secrets[{index}].keys[{k}].mode"),
        ))
    })?;
    Ok(KeySpec {
        key: key.to_owned(),
        path,
        mode,
    })
}

fn parse_encoding(index: usize, raw: Option<&str>) -> Result<Encoding, ParamError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(Encoding::Utf8),
        Some(e) if e.eq_ignore_ascii_case("utf-8") || e.eq_ignore_ascii_case("utf8") => {
            Ok(Encoding::Utf8)
        }
        Some(e) if e.eq_ignore_ascii_case("base64") => Ok(Encoding::Base64),
        Some(e) if e.eq_ignore_ascii_case("hex") => Ok(Encoding::Hex),
        Some(e) => Err(ParamError(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].encoding {e:?} is not one of utf-8, base64, hex"
        ))),
    }
}
