//! Certificate entries (`certificateId`, `certificateAuthorityId`, `caBundleId`): which
//! fields they take, their OCID, version and files.

use csi_grpc::FilePath;

use super::class::check_ocid;
use super::fields::{parse_mode, parse_selector};
use super::problems::{ParamError, Problems, RETRIEVE_PREFIX};
use super::spec::{CertificateKind, CertificateSpec};
use super::yaml::{EntryKind, Field, RawSecret};

/// The certificate kind an entry names, if it names one (several are refused later).
pub(super) fn certificate_kind(item: &RawSecret) -> Option<CertificateKind> {
    [
        (&item.certificate_id, CertificateKind::Certificate),
        (
            &item.certificate_authority_id,
            CertificateKind::CertificateAuthority,
        ),
        (&item.ca_bundle_id, CertificateKind::CaBundle),
    ]
    .into_iter()
    .find_map(|(id, kind)| id.as_deref().is_some_and(|v| !v.is_empty()).then_some(kind))
}

/// What an entry of `kind` takes, as messages say it (checked against
/// [`RawSecret::given`]'s table by a test).
pub(super) fn takes(kind: CertificateKind) -> &'static str {
    match kind {
        CertificateKind::Certificate => {
            "certificateId entries take stage, versionNumber, versionName, privateKey, \
             directory, certFileName, chainFileName, keyFileName, mode and writeFile"
        }
        CertificateKind::CertificateAuthority => {
            "certificateAuthorityId entries take stage, versionNumber, versionName, directory, \
             chainFileName, mode and writeFile"
        }
        CertificateKind::CaBundle => {
            "caBundleId entries take directory, chainFileName, mode and writeFile"
        }
    }
}

/// A `certificateId` / `certificateAuthorityId` / `caBundleId` entry, each field checked
/// whatever the others gave.
pub(super) fn check_certificate(
    index: usize,
    kind: CertificateKind,
    item: &RawSecret,
) -> Result<CertificateSpec, ParamError> {
    let mut problems = Problems::default();
    let id = problems.take(certificate_id(index, kind, item));
    let shown = id.as_deref().unwrap_or_default();
    let selector = problems.take(parse_selector(index, item, shown));
    let private_key = item.private_key.unwrap_or(false);
    let files = id
        .as_deref()
        .and_then(|id| problems.take(CertificateFiles::of(index, kind, item, id, private_key)));
    let mode = problems.take(parse_mode(index, item.mode.as_ref()));
    problems.finish()?;
    let (Some(id), Some(selector), Some(files), Some(mode)) = (id, selector, files, mode) else {
        return Err(ParamError::new(
            "internal error: a certificate field was neither checked nor refused",
        ));
    };
    Ok(CertificateSpec {
        index,
        kind,
        selector,
        private_key,
        cert_path: files.cert,
        chain_path: files.chain,
        key_path: files.key,
        mode,
        id,
        write: item.write_file.unwrap_or(true),
    })
}

/// The entry's one certificate OCID, of its kind, once no field of another kind is given.
fn certificate_id(
    index: usize,
    kind: CertificateKind,
    item: &RawSecret,
) -> Result<String, ParamError> {
    let field = kind.field();
    let named: Vec<&str> = [
        ("certificateId", &item.certificate_id),
        ("certificateAuthorityId", &item.certificate_authority_id),
        ("caBundleId", &item.ca_bundle_id),
    ]
    .into_iter()
    .filter(|(_, v)| v.as_deref().is_some_and(|v| !v.is_empty()))
    .map(|(k, _)| k)
    .collect();
    if named.len() > 1 {
        return Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}] has {}: give exactly one",
            named.join(" and ")
        )));
    }
    if let Some(bad) = item.misplaced(EntryKind::Certificate(kind)) {
        let applies = takes(kind);
        return Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].{bad} does not apply to a {field} entry: {applies}"
        )));
    }
    let id = item
        .certificate_id
        .as_deref()
        .or(item.certificate_authority_id.as_deref())
        .or(item.ca_bundle_id.as_deref())
        .unwrap_or_default();
    let ocid_kind = match kind {
        CertificateKind::Certificate => "certificate",
        CertificateKind::CertificateAuthority => "certificateauthority",
        CertificateKind::CaBundle => "cabundle",
    };
    let what = format!("{RETRIEVE_PREFIX}: secrets[{index}].{field}");
    check_ocid(&what, id, ocid_kind)
}

/// The files a certificate entry writes.
struct CertificateFiles {
    /// `tls.crt` (or `certFileName`), certificates only.
    cert: Option<FilePath>,
    /// `ca.crt` (or `chainFileName`).
    chain: FilePath,
    /// `tls.key` (or `keyFileName`), with `privateKey: true` only.
    key: Option<FilePath>,
}

impl CertificateFiles {
    /// In `directory` (default: the OCID's last segment; `.`: the top of the mount, for the
    /// sync controller, whose `sourcePath` cannot name a file in a directory).
    fn of(
        index: usize,
        kind: CertificateKind,
        item: &RawSecret,
        id: &str,
        private_key: bool,
    ) -> Result<Self, ParamError> {
        let directory = match item.directory.as_deref().map(str::trim) {
            Some(".") => None,
            Some(d) if !d.is_empty() => Some(d.trim_end_matches('/').to_owned()),
            _ => Some(id.rsplit('.').next().unwrap_or(id).to_owned()),
        };
        let file = |key: &str, given: &Option<Field>, default: &str| {
            let name = given
                .as_deref()
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .unwrap_or(default);
            let path = match &directory {
                Some(directory) => format!("{directory}/{name}"),
                None => name.to_owned(),
            };
            FilePath::new(path).map_err(|e| {
                ParamError::new(format!(
                    "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].{key}: {e}"
                ))
            })
        };
        let cert = match kind {
            CertificateKind::Certificate => {
                Some(file("certFileName", &item.cert_file_name, "tls.crt")?)
            }
            _ => None,
        };
        let chain = file("chainFileName", &item.chain_file_name, "ca.crt")?;
        let key = match (private_key, &item.key_file_name) {
            (true, given) => Some(file("keyFileName", given, "tls.key")?),
            (false, Some(_)) => {
                return Err(ParamError::new(format!(
                    "{RETRIEVE_PREFIX}: secrets[{index}].keyFileName needs privateKey: true"
                )));
            }
            (false, None) => None,
        };
        Ok(Self { cert, chain, key })
    }
}
