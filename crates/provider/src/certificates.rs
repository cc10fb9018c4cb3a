//! Certificate entries: fetched from the OCI Certificates service with the
//! mount's identity and written as `tls.crt`, `ca.crt` and (asked for) `tls.key`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use csi_grpc::{File, FileContents, MountError, ObjectVersion};
use tower::Service;

use crate::budget::{Held, Metered, Refused};
use crate::params::{CertificateKind, CertificateSpec, VersionSelector};

/// What the mount service needs of the Certificates fetch service: a certificate entry's
/// request in, within the mount's byte bounds ([`crate::BudgetLayer`] over the retried
/// client), the bundle held in the budget out. Every such service implements it.
pub trait CertificateService:
    Service<
        Metered<vault::CertificateRequest>,
        Response = Held<vault::CertificateBundle>,
        Error = Refused<vault::VaultError>,
        Future = <Self as CertificateService>::CertificateFuture,
    > + Clone
    + Send
    + Sync
    + 'static
{
    /// The service's future.
    type CertificateFuture: Future<Output = Result<Held<vault::CertificateBundle>, Refused<vault::VaultError>>>
        + Send
        + 'static;
}

impl<C> CertificateService for C
where
    C: Service<
            Metered<vault::CertificateRequest>,
            Response = Held<vault::CertificateBundle>,
            Error = Refused<vault::VaultError>,
        > + Clone
        + Send
        + Sync
        + 'static,
    C::Future: Send + 'static,
{
    type CertificateFuture = C::Future;
}

/// The Certificates client of a mount service that reads no certificates: certificate
/// entries are refused (put the byte budget's layer over it like over a real client).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCertificates;

impl Service<vault::CertificateRequest> for NoCertificates {
    type Response = vault::CertificateBundle;
    type Error = vault::VaultError;
    type Future =
        Pin<Box<dyn Future<Output = Result<vault::CertificateBundle, vault::VaultError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), vault::VaultError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: vault::CertificateRequest) -> Self::Future {
        let subject = Box::new(vault::Subject {
            object: request.target.id().to_owned(),
            principal: request.identity(),
            grant: vault::Subject::CERTIFICATES_GRANT,
        });
        Box::pin(async move {
            Err(vault::VaultError::InvalidRequest {
                subject,
                reason: "this provider has no Certificates client configured".into(),
            })
        })
    }
}

/// The `notAfter` of each certificate mounted recently, for the expiry gauge: bounded to
/// the certificates mounted within `keep` (the driver remounts on every rotation poll)
/// and to `max` entries.
#[derive(Debug)]
pub struct CertificateExpiry {
    /// OCID → (namespace that mounted it last, notAfter, when).
    seen: Mutex<HashMap<String, Seen>>,
    keep: Duration,
    max: usize,
}

type Seen = (String, i64, tokio::time::Instant);

/// A certificate mounted this close to its `notAfter` is logged at warn.
const EXPIRY_WARNING_SECONDS: i64 = 14 * 86_400;

impl Default for CertificateExpiry {
    fn default() -> Self {
        Self::new(Duration::from_secs(24 * 3600), 1024)
    }
}

impl CertificateExpiry {
    /// Entries kept `keep` after their last mount, at most `max` of them.
    pub fn new(keep: Duration, max: usize) -> Self {
        Self {
            seen: Mutex::new(HashMap::new()),
            keep,
            max,
        }
    }

    /// The entries, those not mounted within `keep` dropped.
    fn fresh(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        let now = tokio::time::Instant::now();
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.retain(|_, (_, _, at)| now.duration_since(*at) < self.keep);
        seen
    }

    fn record(&self, namespace: &str, id: &str, not_after: i64) {
        // The operator's log names what the anonymous gauge cannot.
        let left = not_after.saturating_sub(vault::unix(std::time::SystemTime::now()));
        if left < EXPIRY_WARNING_SECONDS {
            tracing::warn!(
                namespace,
                certificate = id,
                not_after,
                days_left = left / 86_400,
                "a mounted certificate expires within 14 days (or has expired)"
            );
        }
        let now = tokio::time::Instant::now();
        let mut seen = self.fresh();
        if !seen.contains_key(id) && seen.len() >= self.max {
            // The least recently mounted makes room.
            if let Some(oldest) = seen
                .iter()
                .min_by_key(|(_, (_, _, at))| *at)
                .map(|(k, _)| k.clone())
            {
                seen.remove(&oldest);
            }
        }
        seen.insert(id.to_owned(), (namespace.to_owned(), not_after, now));
    }

    /// (certificate OCID, `notAfter` in Unix seconds) of the certificates mounted lately.
    pub fn snapshot(&self) -> Vec<(String, i64)> {
        let seen = self.fresh();
        let mut out: Vec<(String, i64)> =
            seen.iter().map(|(k, (_, t, _))| (k.clone(), *t)).collect();
        out.sort();
        out
    }

    /// (namespace, certificate OCID, `notAfter`) of the certificates mounted lately.
    pub fn entries(&self) -> Vec<(String, String, i64)> {
        let seen = self.fresh();
        let mut out: Vec<(String, String, i64)> = seen
            .iter()
            .map(|(id, (namespace, t, _))| (namespace.clone(), id.clone(), *t))
            .collect();
        out.sort();
        out
    }

    /// The soonest `notAfter` of the certificates mounted lately: what the gauge publishes
    /// by default, so that `/metrics`, which any pod that reaches the port can read, names
    /// no tenant's namespace or certificate OCID.
    pub fn soonest(&self) -> Option<i64> {
        self.fresh()
            .values()
            .map(|(_, not_after, _)| *not_after)
            .min()
    }
}

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
                crate::service::grpc_kind(e.kind()),
                format!(
                    "{what}: its private key cannot be decoded now: {}",
                    crate::service::chain(&e)
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
        crate::service::grpc_kind(err.kind()),
        format!(
            "unable to retrieve secrets[{}] ({} {}): {}",
            spec.index,
            spec.kind.field(),
            spec.id,
            crate::service::chain(err)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_expiry_gauge_keeps_recent_certificates_only_and_at_most_max() {
        let expiry = CertificateExpiry::new(Duration::from_secs(60), 2);
        expiry.record("x", "a", 1);
        tokio::time::advance(Duration::from_secs(10)).await;
        expiry.record("x", "b", 2);
        tokio::time::advance(Duration::from_secs(10)).await;
        expiry.record("y", "c", 3);
        assert_eq!(
            expiry.snapshot(),
            [("b".to_owned(), 2), ("c".to_owned(), 3)],
            "the least recently mounted made room"
        );
        assert_eq!(expiry.soonest(), Some(2));
        assert_eq!(
            expiry.entries(),
            [
                ("x".to_owned(), "b".to_owned(), 2),
                ("y".to_owned(), "c".to_owned(), 3)
            ]
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        expiry.record("x", "b", 4);
        tokio::time::advance(Duration::from_secs(35)).await;
        assert_eq!(
            expiry.snapshot(),
            [("b".to_owned(), 4)],
            "c was last mounted 65 s ago"
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(expiry.snapshot().is_empty());
    }
}
