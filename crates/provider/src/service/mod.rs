//! The mount service `csi-grpc` calls: parameters, then the identity, then the fetches
//! (`fetch`) to the targets (`targets`), then the files (`files`); a failure says what
//! failed (`failure`).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
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
use files::*;
pub use targets::RegionStats;
use targets::{Targets, endpoint_error, fails_over};

use crate::budget::{Budgeted, ByteBudget, MountBytes, Refused, Reservation};
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

/// Bounds of one mount.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// Secrets of one mount fetched at once.
    pub fan_out: usize,
    /// Largest total size of a mount's files; the driver refuses responses above 4 MiB.
    /// Checked as the secrets arrive: the mount fails as soon as it is passed.
    pub max_total_bytes: usize,
    /// Most entries in a mount's `secrets` list; the parser stops there.
    pub max_secrets: usize,
    /// Most files a mount writes, every kind counted; the parser stops there.
    pub max_files: usize,
    /// The process-wide budget of bytes held by mounts in flight; `None`: unbounded.
    pub budget: Option<ByteBudget>,
    /// What each fetch reserves from the budget before it starts: the Secrets client's
    /// body limit (bodies are buffered whole).
    pub fetch_reserve_bytes: usize,
    /// Where calls go: the principal's region, or the `region` / `failoverRegion` a class
    /// names, as URLs.
    pub endpoints: Arc<crate::endpoints::Endpoints>,
    /// Counts which region served each entry.
    pub served: Arc<RegionStats>,
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

impl Default for MountConfig {
    fn default() -> Self {
        Self {
            fan_out: 8,
            max_total_bytes: 3 * 1024 * 1024 + 512 * 1024,
            max_secrets: crate::params::DEFAULT_MAX_SECRETS,
            max_files: crate::params::DEFAULT_MAX_FILES,
            budget: None,
            fetch_reserve_bytes: 256 * 1024,
            endpoints: Arc::default(),
            served: Arc::new(RegionStats::default()),
            certificate_expiry: Arc::default(),
            tenant_keys: auth::TenantKeys::new(2, std::time::Duration::from_secs(10)),
            allowed_types: crate::params::AuthType::ALL.to_vec(),
            allowed_regions: Vec::new(),
        }
    }
}

/// The OCI mount service that `csi-grpc` calls: parameters, identity, then the secrets
/// fetched concurrently (bounded), all or nothing.
pub struct OciMount<A, V, C = crate::certificates::NoCertificates> {
    auth: A,
    // Every upstream fetch passes through the byte budget: the fetch services are held
    // only behind `Budgeted`, which has no way around it.
    vault: Budgeted<V>,
    certificates: Budgeted<C>,
    config: Arc<MountConfig>,
}

impl<A: Clone, V: Clone, C: Clone> Clone for OciMount<A, V, C> {
    fn clone(&self) -> Self {
        Self {
            auth: self.auth.clone(),
            vault: self.vault.clone(),
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

impl<A, V> OciMount<A, V>
where
    A: IdentityService,
    V: Service<vault::SecretRequest, Error = vault::VaultError> + Clone + Send + Sync + 'static,
    V::Response: BundleResponse,
    V::Future: Send + 'static,
{
    /// A mount service establishing identities with `auth` (a tower service, usually
    /// `auth::Principals`) and fetching through `vault`; certificate entries are refused
    /// until [`OciMount::with_certificates`] gives it a Certificates client.
    pub fn new(auth: A, vault: V, config: MountConfig) -> Self {
        Self {
            auth,
            vault: Budgeted::new(vault),
            certificates: Budgeted::new(crate::certificates::NoCertificates),
            config: Arc::new(config),
        }
    }
}

impl<A, V, C> OciMount<A, V, C>
where
    A: IdentityService,
    V: Service<vault::SecretRequest, Error = vault::VaultError> + Clone + Send + Sync + 'static,
    V::Response: BundleResponse,
    V::Future: Send + 'static,
    C: crate::certificates::CertificateService,
{
    /// The same service reading certificate entries through `certificates` (a
    /// `vault::VaultClient`: the same signing and transport as the Secrets API).
    pub fn with_certificates<C2>(self, certificates: C2) -> OciMount<A, V, C2> {
        OciMount {
            auth: self.auth,
            vault: self.vault,
            certificates: Budgeted::new(certificates),
            config: self.config,
        }
    }

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
            self.config.budget.clone(),
            request.pod.namespace.as_deref().unwrap_or(""),
            self.config.fetch_reserve_bytes,
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
        )?;
        if !params.certificates.is_empty() {
            let (files, versions, held) = self
                .fetch_certificates(&params, &established, &targets, &mount, &request)
                .await?;
            reservations.extend(held);
            response.files.extend(files);
            response.object_versions.extend(versions);
            let written: usize = response.files.iter().map(|f| f.contents.len()).sum();
            if written > self.config.max_total_bytes {
                return Err(MountError::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "the files of this mount take {written} bytes with its certificates, \
                         more than the {} bytes the driver accepts in one response",
                        self.config.max_total_bytes
                    ),
                ));
            }
        }
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
    V: Service<vault::SecretRequest, Error = vault::VaultError> + Clone + Send + Sync + 'static,
    V::Response: BundleResponse,
    V::Future: Send + 'static,
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
