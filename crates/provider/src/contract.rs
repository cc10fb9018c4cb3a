//! What a mount needs of the services it is built over (identity, Secrets, Certificates and
//! listing fetches), and what every mount shares: its bounds and policy (`MountContext`) and
//! the runtime handles it reports to (`CertificateExpiry`). A leaf below the service and the
//! entries: they import from it, it imports neither.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use csi_grpc::{ErrorKind, MountError};
use tower::Service;

use crate::budget::Reservation;
use crate::layers::budget::{Held, Metered, Refused};
use crate::layers::failover::{ServedBy, WithFailover};

/// What the mount service needs of the identity service: `auth::Principals`, or any
/// cloneable tower service from an [`auth::IdentityRequest`] to an [`auth::Established`]
/// identity (a mock in tests). Every such service implements it.
pub trait IdentityService:
    Service<
        auth::IdentityRequest,
        Response = auth::Established,
        Error = auth::AuthError,
        Future = <Self as IdentityService>::IdentityFuture,
    > + Clone
    + Send
    + Sync
    + 'static
{
    /// The service's future.
    type IdentityFuture: Future<Output = Result<auth::Established, auth::AuthError>>
        + Send
        + 'static;
}

impl<A> IdentityService for A
where
    A: Service<auth::IdentityRequest, Response = auth::Established, Error = auth::AuthError>
        + Clone
        + Send
        + Sync
        + 'static,
    A::Future: Send + 'static,
{
    type IdentityFuture = A::Future;
}

/// What the mount service needs of the Secrets service's answer: the bundle, and whether
/// it came from the cache. A bare `vault::SecretBundle` (a `VaultClient`, a test fake) was
/// fetched; `cache::Cached` (a `CacheLayer` in front of the client) says.
pub trait BundleResponse: crate::budget::Weigh + Send + 'static {
    /// The bundle and how it was obtained.
    fn into_parts(self) -> (vault::SecretBundle, cache::Lookup);
}

impl BundleResponse for vault::SecretBundle {
    fn into_parts(self) -> (vault::SecretBundle, cache::Lookup) {
        (self, cache::Lookup::Fetched)
    }
}

impl BundleResponse for cache::Cached<vault::SecretBundle> {
    fn into_parts(self) -> (vault::SecretBundle, cache::Lookup) {
        (self.value, self.lookup)
    }
}

/// What the mount service needs of the Secrets fetch service: an entry's request to its
/// primary region (and failover region) in, within the mount's byte bounds
/// ([`crate::BudgetLayer`] under [`crate::FailoverLayer`]), the bundle held in the budget
/// and the region that served it out. Every such service implements it.
pub trait SecretsService:
    Service<
        WithFailover<Metered<vault::SecretRequest>>,
        Response = (Held<<Self as SecretsService>::Bundle>, ServedBy),
        Error = Refused<vault::VaultError>,
        Future = <Self as SecretsService>::SecretsFuture,
    > + Clone
    + Send
    + Sync
    + 'static
{
    /// The bundle (and how it was looked up).
    type Bundle: BundleResponse;
    /// The service's future.
    type SecretsFuture: Future<Output = Result<(Held<Self::Bundle>, ServedBy), Refused<vault::VaultError>>>
        + Send
        + 'static;
}

impl<V, B> SecretsService for V
where
    V: Service<
            WithFailover<Metered<vault::SecretRequest>>,
            Response = (Held<B>, ServedBy),
            Error = Refused<vault::VaultError>,
        > + Clone
        + Send
        + Sync
        + 'static,
    V::Future: Send + 'static,
    B: BundleResponse,
{
    type Bundle = B;
    type SecretsFuture = V::Future;
}

/// What the mount service needs of a listing's answer: the listing, and whether it came
/// from the cache. A bare `vault::Listing` was listed; `cache::Cached` says.
pub trait ListingResponse: crate::budget::Weigh + Send + 'static {
    /// The listing and how it was obtained.
    fn into_parts(self) -> (vault::Listing, cache::Lookup);
}

impl ListingResponse for vault::Listing {
    fn into_parts(self) -> (vault::Listing, cache::Lookup) {
        (self, cache::Lookup::Fetched)
    }
}

impl ListingResponse for cache::Cached<vault::Listing> {
    fn into_parts(self) -> (vault::Listing, cache::Lookup) {
        (self.value, self.lookup)
    }
}

/// What the mount service needs of the listing service (the versions of a secret, the
/// secrets of a vault): a listing within the mount's byte bounds ([`crate::BudgetLayer`]
/// over the cache over `vault::Lister`), held in the budget. Every such service
/// implements it; [`NoListings`] refuses every listing.
pub trait ListingService:
    Service<
        Metered<vault::ListRequest>,
        Response = Held<<Self as ListingService>::Answer>,
        Error = Refused<vault::VaultError>,
        Future = <Self as ListingService>::ListingFuture,
    > + Clone
    + Send
    + Sync
    + 'static
{
    /// The listing (and how it was looked up).
    type Answer: ListingResponse;
    /// The service's future.
    type ListingFuture: Future<Output = Result<Held<Self::Answer>, Refused<vault::VaultError>>>
        + Send
        + 'static;
}

impl<L, A> ListingService for L
where
    L: Service<Metered<vault::ListRequest>, Response = Held<A>, Error = Refused<vault::VaultError>>
        + Clone
        + Send
        + Sync
        + 'static,
    L::Future: Send + 'static,
    A: ListingResponse,
{
    type Answer = A;
    type ListingFuture = L::Future;
}

/// A listing service that refuses every listing: the mount service's default until
/// [`crate::OciMount::with_listings`] gives it one (`versions`, `tag` and `namePrefix`
/// entries then fail, naming the missing client). It never answers, so it never claims an
/// answer went through the byte budget.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoListings;

impl Service<Metered<vault::ListRequest>> for NoListings {
    type Response = Held<vault::Listing>;
    type Error = Refused<vault::VaultError>;
    type Future = std::future::Ready<Result<Held<vault::Listing>, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, metered: Metered<vault::ListRequest>) -> Self::Future {
        let request = metered.request();
        let subject = Box::new(vault::Subject {
            object: request.describe(),
            principal: request.session.identity(),
            grant: vault::Subject::LIST_GRANT,
        });
        std::future::ready(Err(Refused::Failed(vault::VaultError::InvalidRequest {
            subject,
            reason: "this provider has no listing client configured".into(),
        })))
    }
}

/// What every mount shares: its bounds, the operator's policy (allowed types and regions),
/// the endpoints, and the runtime handles it reports to (the gate of tenant keys, the
/// certificate-expiry gauge).
#[derive(Clone, Debug)]
pub struct MountContext {
    /// Secrets of one mount fetched at once.
    pub fan_out: usize,
    /// Largest total size of a mount's files; the driver refuses responses above 4 MiB.
    /// Checked as the secrets arrive: the mount fails as soon as it is passed.
    pub max_total_bytes: usize,
    /// Most entries in a mount's `secrets` list; the parser stops there.
    pub max_secrets: usize,
    /// Most files a mount writes, every kind counted; the parser stops there.
    pub max_files: usize,
    /// Most listing pages (ListSecrets, ListSecretBundleVersions) one mount sends upstream,
    /// over all its `versions`, `tag` and `namePrefix` entries (a cached listing sends none).
    pub max_listing_pages: u32,
    /// Where calls go: the principal's region, or the `region` / `failoverRegion` a class
    /// names, as URLs.
    pub endpoints: Arc<crate::endpoints::Endpoints>,
    /// The `notAfter` of the certificates mounted lately (the expiry gauge).
    pub certificate_expiry: Arc<CertificateExpiry>,
    /// Regions (ids or short codes) a SecretProviderClass may name in `region` /
    /// `failoverRegion` (`[auth] allowed_regions`); empty: any region the provider knows in
    /// the principal's realm.
    pub allowed_regions: Vec<String>,
    /// The `authType`s a mount may use (`[auth] allowed_types`); others are
    /// PermissionDenied before any upstream call.
    pub allowed_types: Vec<crate::params::AuthType>,
    /// The one gate of tenant private keys (`auth::Principals::tenant_keys`): certificate
    /// keys are decoded through it, as user keys are.
    pub tenant_keys: auth::TenantKeys,
    /// The byte budget the fetches reserve from (the one given to [`crate::BudgetLayer`]):
    /// the parse of a mount's parameters and of a secret read for `keys` reserve what they
    /// may allocate from it, in the mount's namespace share, while they run. `None`: no
    /// process budget.
    pub byte_budget: Option<crate::ByteBudget>,
    /// Mounts rendering their templates at once, on the blocking pool: fewer than the
    /// runtime's workers, so renders never hold them all (see `entries/template.rs`).
    pub template_renders: Arc<tokio::sync::Semaphore>,
    /// The classes parsed lately, by their parameters: a republish is not parsed again.
    pub classes: Arc<crate::classes::ParsedClasses>,
}

impl MountContext {
    /// `bytes` of the byte budget for `namespace` while `what` runs (a parse); `None`
    /// without a process budget; refused (`ResourceExhausted` naming `what`) past the
    /// budget or the namespace's share.
    pub(crate) fn reserve(
        &self,
        namespace: &str,
        bytes: usize,
        what: &str,
    ) -> Result<Option<Reservation>, MountError> {
        let Some(budget) = &self.byte_budget else {
            return Ok(None);
        };
        budget
            .try_reserve_for(&Arc::from(namespace), bytes)
            .map(Some)
            .map_err(|refusal| {
                MountError::new(ErrorKind::ResourceExhausted, format!("{what}: {refusal}"))
            })
    }
}

impl Default for MountContext {
    fn default() -> Self {
        Self {
            fan_out: 8,
            max_total_bytes: 3 * 1024 * 1024 + 512 * 1024,
            max_secrets: crate::params::DEFAULT_MAX_SECRETS,
            max_files: crate::params::DEFAULT_MAX_FILES,
            max_listing_pages: vault::MAX_PAGES,
            endpoints: Arc::default(),
            certificate_expiry: Arc::default(),
            tenant_keys: auth::TenantKeys::new(2, std::time::Duration::from_secs(10)),
            allowed_types: crate::params::AuthType::ALL.to_vec(),
            allowed_regions: Vec::new(),
            byte_budget: None,
            template_renders: Arc::new(tokio::sync::Semaphore::new(default_template_renders())),
            classes: Arc::default(),
        }
    }
}

/// One render at a time per core but one (tokio runs a worker per core), at least one.
fn default_template_renders() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |cores| cores.get().saturating_sub(1))
        .max(1)
}

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

    pub(crate) fn record(&self, namespace: &str, id: &str, not_after: i64) {
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
