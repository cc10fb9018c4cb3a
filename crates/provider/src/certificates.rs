//! Certificate entries: fetched from the OCI Certificates service with the
//! mount's identity and written as `tls.crt`, `ca.crt` and (asked for) `tls.key`.

use csi_grpc::{File, FileContents, MountError, ObjectVersion};

use crate::contract::CertificateExpiry;
use crate::params::{CertificateKind, CertificateSpec, VersionSelector};

/// The request of one entry.
pub(crate) fn request(
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
pub(crate) async fn private_key(
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

pub(crate) fn files(
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
pub(crate) fn fetch_error(spec: &CertificateSpec, err: &vault::VaultError) -> MountError {
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
