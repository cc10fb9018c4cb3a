//! The mount service `csi-grpc` calls: parameters, then the identity, then the fetches
//! (`fetch`) to the targets (`targets`), then the files (`files`); a failure says what
//! failed (`failure`).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use csi_grpc::{
    Caller, ErrorKind, File, FileContents, MountError, MountRequest, MountResponse, ObjectVersion,
};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Semaphore;
use tower::{Service, ServiceExt};

mod failure;
mod fetch;
mod files;
mod targets;

use failure::*;
pub(crate) use failure::{chain, grpc_kind};
// `crate::fuzzing` assembles files as a mount does.
pub(crate) use files::{assemble, check_size};
use targets::{Targets, endpoint_error};

use crate::budget::{Held, Metered, MountBytes, Refused, Reservation};
use crate::failover::{ServedBy, WithFailover};
use crate::params::{
    AuthSpec, Encoding, MountParameters, SecretSource, SecretSpec, VersionSelector,
};

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

/// The default of [`MountContext::max_total_bytes`]: the driver refuses responses above
/// 4 MiB.
pub(crate) const DEFAULT_MAX_TOTAL_BYTES: usize = 3 * 1024 * 1024 + 512 * 1024;

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
    /// Where calls go: the principal's region, or the `region` / `failoverRegion` a class
    /// names, as URLs.
    pub endpoints: Arc<crate::endpoints::Endpoints>,
    /// The `notAfter` of the certificates mounted lately (the expiry gauge).
    pub certificate_expiry: Arc<crate::certificates::CertificateExpiry>,
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
}

impl Default for MountContext {
    fn default() -> Self {
        Self {
            fan_out: 8,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            max_secrets: crate::params::DEFAULT_MAX_SECRETS,
            max_files: crate::params::DEFAULT_MAX_FILES,
            endpoints: Arc::default(),
            certificate_expiry: Arc::default(),
            tenant_keys: auth::TenantKeys::new(2, std::time::Duration::from_secs(10)),
            allowed_types: crate::params::AuthType::ALL.to_vec(),
            allowed_regions: Vec::new(),
        }
    }
}

/// The OCI mount service that `csi-grpc` calls: parameters, identity, then the entries
/// fetched concurrently (bounded), all or nothing.
pub struct OciMount<A, V, C> {
    auth: A,
    // The fetch services answer `Held`, which only the byte budget's layer makes: every
    // fetch passes through it.
    secrets: V,
    certificates: C,
    config: Arc<MountContext>,
}

impl<A: Clone, V: Clone, C: Clone> Clone for OciMount<A, V, C> {
    fn clone(&self) -> Self {
        Self {
            auth: self.auth.clone(),
            secrets: self.secrets.clone(),
            certificates: self.certificates.clone(),
            config: self.config.clone(),
        }
    }
}

impl<A, V, C> fmt::Debug for OciMount<A, V, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OciMount")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<A, V, C> OciMount<A, V, C> {
    /// A mount service establishing identities with `auth` (a tower service, usually
    /// `auth::Principals`), reading secret entries through `secrets` and certificate
    /// entries through `certificates` (the byte budget's layer over the fetch stacks; a
    /// `NoCertificates` under it refuses certificate entries).
    pub fn new(auth: A, secrets: V, certificates: C, config: MountContext) -> Self {
        Self {
            auth,
            secrets,
            certificates,
            config: Arc::new(config),
        }
    }
}

impl<A, V, C> OciMount<A, V, C>
where
    A: IdentityService,
    V: SecretsService,
    C: crate::certificates::CertificateService,
{
    /// `[auth] allowed_types`: another type is PermissionDenied before any upstream call.
    fn check_allowed_type(&self, auth_type: crate::params::AuthType) -> Result<(), MountError> {
        let allowed = &self.config.allowed_types;
        if allowed.contains(&auth_type) {
            return Ok(());
        }
        let allowed: Vec<&str> = allowed.iter().map(|t| t.as_str()).collect();
        Err(MountError::new(
            ErrorKind::PermissionDenied,
            format!(
                "authType \"{auth_type}\" is not allowed on this node: the provider's \
                 auth.allowed_types is [{}]; use one of those, or ask the cluster operator",
                allowed.join(", ")
            ),
        ))
    }

    async fn mount(self, request: MountRequest) -> Result<MountResponse, MountError> {
        let params = MountParameters::parse_within(
            &request.attributes,
            &request.pod,
            crate::params::ParseLimits {
                max_secrets: self.config.max_secrets,
                max_files: self.config.max_files,
            },
        )?;
        let auth_type = params.auth.auth_type();
        self.check_allowed_type(auth_type)?;
        if auth_type == crate::params::AuthType::Workload {
            // Workload identity's region is the configured one: a mount no endpoint could
            // serve is refused before its token is exchanged.
            let endpoints = &self.config.endpoints;
            endpoints
                .of(endpoints.configured_region())
                .map_err(endpoint_error)?;
        }
        let established = tracing::Instrument::instrument(
            self.auth
                .clone()
                .oneshot(identity_request(&params, &request)),
            tracing::info_span!("establish identity", principal = auth_type.as_str()),
        )
        .await
        .map_err(auth_error)?;
        let targets = self.targets(&params, &established)?;
        let mount = MountBytes::new(
            request.pod.namespace.as_deref().unwrap_or(""),
            self.config.max_total_bytes,
        );
        // The reservations are held until the answer is assembled and handed on.
        let (bundles, mut reservations) = self
            .fetch_all(&params, &established, &targets, &mount, request.deadline)
            .await?;
        let mut response = assemble(
            &params,
            bundles,
            request.file_mode,
            self.config.max_total_bytes,
            reservations.first(),
        )?;
        if !params.certificates.is_empty() {
            let (files, versions, held) = self
                .fetch_certificates(&params, &established, &targets, &mount, &request)
                .await?;
            reservations.extend(held);
            response.files.extend(files);
            response.object_versions.extend(versions);
        }
        check_size(&response.files, self.config.max_total_bytes)?;
        drop(reservations);
        Ok(response)
    }
}

/// What the identity service is asked for one mount: the class's principal and what the
/// request says of the pod and its tokens.
fn identity_request(params: &MountParameters, request: &MountRequest) -> auth::IdentityRequest {
    auth::IdentityRequest {
        kind: match &params.auth {
            AuthSpec::User { secret_name } => auth::PrincipalKind::User {
                secret_name: secret_name.clone(),
            },
            AuthSpec::Instance => auth::PrincipalKind::Instance,
            AuthSpec::Workload => auth::PrincipalKind::Workload,
        },
        namespace: request.pod.namespace.clone(),
        pod_name: request.pod.name.clone(),
        pod_uid: request.pod.uid.clone(),
        service_account: request.pod.service_account.clone(),
        service_account_tokens: request
            .service_account_tokens
            .iter()
            .map(|(audience, token)| (audience.to_owned(), token.token.clone()))
            .collect(),
        deadline: request.deadline,
        caller: match request.caller {
            Caller::Driver => auth::Caller::Driver,
            Caller::SyncController => auth::Caller::SyncController,
        },
    }
}

impl<A, V, C> Service<MountRequest> for OciMount<A, V, C>
where
    A: IdentityService,
    V: SecretsService,
    C: crate::certificates::CertificateService,
{
    type Response = MountResponse;
    type Error = MountError;
    type Future = futures_util::future::BoxFuture<'static, Result<MountResponse, MountError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), MountError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: MountRequest) -> Self::Future {
        Box::pin(self.clone().mount(request))
    }
}
