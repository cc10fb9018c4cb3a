//! Certificate entries (`certificateId`, `certificateAuthorityId`, `caBundleId`): which fields
//! each kind takes and their checks (OCID, version, files); the fetch from the OCI
//! Certificates service with the mount's identity (through the byte budget; certificates do
//! not fail over, and a failed one fails the mount), the private key through the one gate of
//! tenant keys, and the files `tls.crt`, `ca.crt` and (asked for) `tls.key`.

use csi_grpc::{File, FileContents, FilePath, MountError, ObjectVersion};
use tower::ServiceExt;
use tracing::Instrument;

use super::FileDescription;
use super::run::{EntryFiles, EntryOutcome, EntryVersion, MountRun, Running, Start, Targets};
use crate::contract::{CertificateExpiry, CertificateService};
use crate::failure::{over_limit, refused_error, vault_kind};
use crate::layers::budget::Metered;
use crate::params::class::check_ocid;
use crate::params::fields::{parse_mode, parse_selector};
use crate::params::problems::{ParamError, Problems, RETRIEVE_PREFIX};
use crate::params::spec::{CertificateKind, VersionSelector};
use crate::params::yaml::{EntryKind, Field, RawSecret};

/// One certificate entry of the `secrets` parameter (issue 15).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateSpec {
    /// Its position in the `secrets` list.
    pub index: usize,
    /// Certificate, CA or CA bundle.
    pub kind: CertificateKind,
    /// The OCID.
    pub id: String,
    /// Which version (`CURRENT` by default; CA bundles have none).
    pub selector: VersionSelector,
    /// Whether the key is asked for and written (`privateKey: true`).
    pub private_key: bool,
    /// `directory/tls.crt` (or `certFileName`); certificates only.
    pub cert_path: Option<FilePath>,
    /// `directory/ca.crt` (or `chainFileName`).
    pub chain_path: FilePath,
    /// `directory/tls.key` (or `keyFileName`), with `privateKey: true` only.
    pub key_path: Option<FilePath>,
    /// The files' mode (`mode`); `None`: the request's permission.
    pub mode: Option<csi_grpc::FileMode>,
    /// Whether its files are written (`writeFile`, default true); `false`: read by the
    /// class's templates only.
    pub write: bool,
}

impl CertificateSpec {
    /// Every file this entry writes.
    pub fn files(&self) -> impl Iterator<Item = &FilePath> {
        self.cert_path
            .iter()
            .chain(std::iter::once(&self.chain_path))
            .chain(self.key_path.iter())
    }
}

/// The certificate kind an entry names, if it names one (several are refused later).
pub(crate) fn certificate_kind(item: &RawSecret) -> Option<CertificateKind> {
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
pub(crate) fn takes(kind: CertificateKind) -> &'static str {
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
pub(crate) fn check(
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

/// The entry ready to start: it then waits for a fan-out permit.
pub(crate) fn start<'a, C: CertificateService>(
    run: &'a MountRun<'_>,
    certificates: &'a C,
    spec: &'a CertificateSpec,
    targets: &'a Targets,
) -> Start<'a> {
    Box::new(move || {
        let span = tracing::info_span!(
            "fetch certificate",
            entry = spec.index,
            certificate = %spec.id,
            private_key = spec.private_key,
            oci.request_id = tracing::field::Empty,
            error.kind = tracing::field::Empty,
        );
        let call = request(
            spec,
            &targets.primary.endpoints.certificates,
            &targets.primary.session,
            run.request.deadline,
        );
        let certificates = certificates.clone();
        let recorded = span.clone();
        let entry =
            async move { certificate_entry(run, certificates, spec, call, &recorded).await };
        Box::pin(entry.instrument(span)) as Running<'a>
    })
}

/// One certificate entry: a fan-out permit, the Certificates call through the byte budget,
/// the private key through the gate of tenant keys, then its files; what happened goes into
/// `span`. Certificates do not fail over, and a failed one fails the mount.
async fn certificate_entry<C: CertificateService>(
    run: &MountRun<'_>,
    certificates: C,
    spec: &CertificateSpec,
    call: vault::CertificateRequest,
    span: &tracing::Span,
) -> EntryOutcome {
    let _permit = run.permits.clone().acquire_owned().await;
    let held = match certificates.oneshot(Metered::new(call, &run.mount)).await {
        Ok(held) => held,
        Err(refused) => {
            let failed = |err: &vault::VaultError| {
                span.record("error.kind", vault_kind(err).as_str());
                fetch_error(spec, err)
            };
            return EntryOutcome::Stop(refused_error(refused, failed, &run.mount));
        }
    };
    let (bundle, reservation, over) = held.into_parts();
    if let Some(id) = &bundle.opc_request_id {
        span.record("oci.request_id", id.as_str());
    }
    if over {
        return EntryOutcome::Stop(over_limit(
            &run.mount,
            &format!("secrets[{}] {} {}", spec.index, spec.kind.field(), spec.id),
        ));
    }
    let made = async {
        let key = private_key(
            spec,
            &bundle,
            &run.config.tenant_keys,
            run.namespace,
            run.request.deadline,
        )
        .await?;
        files(
            spec,
            &bundle,
            key.as_ref(),
            run.request.file_mode,
            &run.config.certificate_expiry,
            run.namespace,
        )
    };
    match made.await {
        Ok((files, version)) => EntryOutcome::Files(EntryFiles {
            index: spec.index,
            files,
            versions: vec![EntryVersion::Certificate(version)],
            reservations: reservation.into_iter().collect(),
            write: spec.write,
        }),
        Err(err) => EntryOutcome::Stop(err),
    }
}

/// The request of one entry.
fn request(
    spec: &CertificateSpec,
    base_url: &str,
    session: &auth::Session,
    deadline: tokio::time::Instant,
) -> vault::CertificateRequest {
    vault::CertificateRequest {
        base_url: base_url.to_owned(),
        session: session.clone(),
        target: match spec.kind {
            CertificateKind::Certificate => vault::CertificateRef::Certificate(spec.id.clone()),
            CertificateKind::CertificateAuthority => {
                vault::CertificateRef::CertificateAuthority(spec.id.clone())
            }
            CertificateKind::CaBundle => vault::CertificateRef::CaBundle(spec.id.clone()),
        },
        selector: match &spec.selector {
            VersionSelector::Number(n) => vault::Selector::VersionNumber(*n),
            VersionSelector::Stage(stage) => vault::Selector::Stage(*stage),
            VersionSelector::Name(name) => vault::Selector::VersionName(name.clone()),
        },
        private_key: spec.private_key,
        deadline,
        // `Budget` puts its hook in when it passes the request on.
        backoff: vault::Backoff::none(),
    }
}

/// An entry's files and object version from its bundle. Errors name the entry and the
/// certificate, never key material.
/// The certificate's private key, when the entry asks for it, decoded through the one gate
/// of tenant keys (its concurrency bound, namespace turns and key-derivation limits).
async fn private_key(
    spec: &CertificateSpec,
    bundle: &vault::CertificateBundle,
    keys: &auth::TenantKeys,
    namespace: &str,
    deadline: tokio::time::Instant,
) -> Result<Option<auth::CertificateKey>, MountError> {
    // A revoked version is refused by `files`, key or not.
    if !spec.private_key || bundle.revoked.is_some() {
        return Ok(None);
    }
    let what = format!("secrets[{}] {} {}", spec.index, spec.kind.field(), spec.id);
    let Some(pem) = &bundle.private_key_pem else {
        return Err(MountError::invalid_argument(format!(
            "{what} has no private key OCI can return (a certificate issued from an external \
             CSR, or imported without its key): leave out privateKey: true, or mount the key \
             from where it is kept"
        )));
    };
    let pem = zeroize::Zeroizing::new(pem.expose().to_vec());
    let passphrase = bundle
        .private_key_passphrase
        .as_ref()
        .map(|p| zeroize::Zeroizing::new(p.expose().to_vec()));
    let decoded = keys
        .certificate_key(namespace, deadline, pem, passphrase)
        .await
        .map_err(|e| {
            MountError::new(
                crate::failure::grpc_kind(e.kind()),
                format!(
                    "{what}: its private key cannot be decoded now: {}",
                    crate::failure::chain(&e)
                ),
            )
        })?;
    decoded
        .map(Some)
        .map_err(|e| MountError::invalid_argument(format!("{what}: {e}")))
}

fn files(
    spec: &CertificateSpec,
    bundle: &vault::CertificateBundle,
    key: Option<&auth::CertificateKey>,
    mode: csi_grpc::FileMode,
    expiry: &CertificateExpiry,
    namespace: &str,
) -> Result<(Vec<File>, ObjectVersion), MountError> {
    let index = spec.index;
    let what = format!("secrets[{index}] {} {}", spec.kind.field(), spec.id);
    if let Some(reason) = &bundle.revoked {
        return Err(MountError::invalid_argument(format!(
            "{what}: version {} is revoked ({reason}); mount another version or renew it",
            bundle.version_number.unwrap_or_default()
        )));
    }
    let mode = spec.mode.unwrap_or(mode);
    let file = |path: &csi_grpc::FilePath, bytes: Vec<u8>| File {
        path: path.clone(),
        mode,
        contents: FileContents::new(bytes),
    };
    let invalid = |e: vault::TlsError| MountError::invalid_argument(format!("{what}: {e}"));
    let version = bundle
        .version_number
        .map_or_else(|| "0".to_owned(), |n| n.to_string());
    let object_version = ObjectVersion {
        id: spec.id.clone(),
        version,
    };
    let files = match (spec.kind, &spec.cert_path) {
        (CertificateKind::Certificate, Some(cert_path)) => {
            let tls =
                vault::TlsFiles::new(&bundle.certificate_pem, bundle.chain_pem.as_deref(), key)
                    .map_err(invalid)?;
            expiry.record(namespace, &spec.id, tls.not_after_unix());
            let mut files = vec![file(cert_path, tls.tls_crt.into_bytes())];
            if !tls.ca_crt.is_empty() {
                files.push(file(&spec.chain_path, tls.ca_crt.into_bytes()));
            }
            if let (Some(key_path), Some(key)) = (&spec.key_path, &tls.tls_key) {
                files.push(file(key_path, key.as_bytes().to_vec()));
            }
            files
        }
        _ => {
            // A CA: its certificate then its chain; a CA bundle: as OCI holds it.
            let pem = match &bundle.chain_pem {
                Some(chain) => format!("{}{chain}", bundle.certificate_pem),
                None => bundle.certificate_pem.clone(),
            };
            let what_pem = match spec.kind {
                CertificateKind::CaBundle => "caBundlePem",
                _ => "certificatePem",
            };
            let (ca_crt, not_after) = vault::TlsFiles::ca_only(&pem, what_pem).map_err(invalid)?;
            expiry.record(namespace, &spec.id, vault::unix(not_after));
            vec![file(&spec.chain_path, ca_crt.into_bytes())]
        }
    };
    Ok((files, object_version))
}

/// A failed fetch, with the entry and the IAM hint the vault error carries.
fn fetch_error(spec: &CertificateSpec, err: &vault::VaultError) -> MountError {
    MountError::new(
        crate::failure::grpc_kind(err.kind()),
        format!(
            "unable to retrieve secrets[{}] ({} {}): {}",
            spec.index,
            spec.kind.field(),
            spec.id,
            crate::failure::chain(err)
        ),
    )
}

/// The entry's files as `check` shows them.
pub(crate) fn describe(spec: &CertificateSpec) -> Vec<FileDescription> {
    let selector = match spec.kind {
        CertificateKind::CaBundle => String::new(),
        _ => super::secret::selector_text(&spec.selector),
    };
    let unwritten = if spec.write {
        ""
    } else {
        " (read by templates, not written)"
    };
    let file = |path: &FilePath, what: &str| FileDescription {
        path: path.as_str().to_owned(),
        mode: spec.mode,
        source: format!("{} {} ({what}){unwritten}", spec.kind.field(), spec.id),
        vault: String::new(),
        selector: selector.clone(),
        key: String::new(),
        encoding: "pem".to_owned(),
        written: spec.write,
        selection: None,
    };
    let mut files = Vec::new();
    if let Some(cert) = &spec.cert_path {
        files.push(file(cert, "leaf and intermediates"));
    }
    files.push(file(&spec.chain_path, "CA chain"));
    if let Some(key) = &spec.key_path {
        files.push(file(key, "private key, PKCS#8"));
    }
    files
}
