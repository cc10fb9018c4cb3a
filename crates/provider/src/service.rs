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
    /// Resolves `region` / `failoverRegion`; `None`: those parameters are refused.
    pub regions: Option<Arc<dyn RegionResolver>>,
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
            regions: None,
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
        if !self.config.allowed_types.contains(&auth_type) {
            let allowed: Vec<&str> = self
                .config
                .allowed_types
                .iter()
                .map(|t| t.as_str())
                .collect();
            return Err(MountError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "authType \"{auth_type}\" is not allowed on this node: the provider's \
                     auth.allowed_types is [{}]; use one of those, or ask the cluster operator",
                    allowed.join(", ")
                ),
            ));
        }
        let identity_request = auth::IdentityRequest {
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
        };
        let principal = auth_type.as_str();
        let established = tracing::Instrument::instrument(
            self.auth.clone().oneshot(identity_request),
            tracing::info_span!("establish identity", principal),
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

    /// The certificate entries, fetched concurrently (bounded by the fan-out) with the
    /// mount's identity and within its byte bounds, their keys decoded through the gate of
    /// tenant keys; the first failure fails the mount.
    async fn fetch_certificates(
        &self,
        params: &MountParameters,
        established: &auth::Established,
        targets: &Targets,
        mount: &Arc<MountBytes>,
        request: &MountRequest,
    ) -> Result<(Vec<File>, Vec<ObjectVersion>, Vec<Reservation>), MountError> {
        let permits = Arc::new(Semaphore::new(self.config.fan_out.max(1)));
        let namespace = request.pod.namespace.clone().unwrap_or_default();
        let mut pending: FuturesUnordered<_> = params
            .certificates
            .iter()
            .map(|spec| {
                let call = crate::certificates::request(
                    spec,
                    &targets.certificates,
                    &established.session,
                    request.deadline,
                );
                let client = self.certificates.clone();
                let permits = permits.clone();
                let mount = mount.clone();
                let keys = self.config.tenant_keys.clone();
                let namespace = namespace.clone();
                let (deadline, file_mode) = (request.deadline, request.file_mode);
                let expiry = self.config.certificate_expiry.clone();
                let span = tracing::info_span!(
                    "fetch certificate",
                    entry = spec.index,
                    certificate = %spec.id,
                    private_key = spec.private_key,
                    oci.request_id = tracing::field::Empty,
                    error.kind = tracing::field::Empty,
                );
                let record = span.clone();
                tracing::Instrument::instrument(
                    async move {
                        let _permit = permits.acquire_owned().await;
                        let held = match client.fetch(&mount, call).await {
                            Ok(held) => held,
                            Err(refused) => {
                                let error = refused_error(
                                    refused,
                                    |err| {
                                        record.record("error.kind", vault_kind(err).as_str());
                                        crate::certificates::fetch_error(spec, err)
                                    },
                                    &mount,
                                );
                                return (spec.index, Err(error));
                            }
                        };
                        if let Some(id) = &held.value.opc_request_id {
                            record.record("oci.request_id", id.as_str());
                        }
                        if held.over {
                            return (spec.index, Err(over_limit(&mount, spec)));
                        }
                        let made = async {
                            let key = crate::certificates::private_key(
                                spec,
                                &held.value,
                                &keys,
                                &namespace,
                                deadline,
                            )
                            .await?;
                            let (files, version) = crate::certificates::files(
                                spec,
                                &held.value,
                                key.as_ref(),
                                file_mode,
                                &expiry,
                                &namespace,
                            )?;
                            Ok((files, version, held.reservation))
                        };
                        (spec.index, made.await)
                    },
                    span,
                )
            })
            .collect();
        let mut done = Vec::with_capacity(params.certificates.len());
        while let Some((index, made)) = pending.next().await {
            // Dropping `pending` on the first failure cancels the fetches still running.
            done.push((index, made?));
        }
        // In request order.
        done.sort_by_key(|(index, _)| *index);
        let (mut files, mut versions, mut held) = (Vec::new(), Vec::new(), Vec::new());
        for (_, (f, v, r)) in done {
            files.extend(f);
            versions.push(v);
            held.extend(r);
        }
        Ok((files, versions, held))
    }

    /// The primary region's Secrets endpoint (`region`, else the principal's) and the
    /// failover region's, which must be in the same realm.
    fn targets(
        &self,
        params: &MountParameters,
        established: &auth::Established,
    ) -> Result<Targets, MountError> {
        let resolve = |key: &str, region: &str| {
            let resolver = self.config.regions.as_ref().ok_or_else(|| {
                MountError::invalid_argument(format!(
                    "parameter {key:?} {region:?} cannot be used: this provider resolves no regions"
                ))
            })?;
            let resolved = resolver.resolve(region).map_err(|why| {
                MountError::invalid_argument(format!("parameter {key:?} {region:?}: {why}"))
            })?;
            self.check_allowed(key, region, &resolved, resolver.as_ref())?;
            Ok::<_, MountError>(resolved)
        };
        let principal_realm = established
            .region
            .as_ref()
            .and_then(|r| r.domain().map(str::to_owned));
        let (primary, certificates, realm) = match &params.region {
            Some(region) => {
                let r = resolve("region", region)?;
                // A tenant's region stays in the principal's realm, as a failover does.
                if let (Some(own), Some(theirs)) = (&principal_realm, &r.realm)
                    && own != theirs
                {
                    return Err(MountError::invalid_argument(format!(
                        "parameter \"region\" {region:?} is in realm {theirs}, the principal in \
                         realm {own}: a SecretProviderClass reads within its principal's realm"
                    )));
                }
                (r.secrets_endpoint, r.certificates_endpoint, r.realm)
            }
            None => (
                established.secrets_endpoint.clone(),
                established.certificates_endpoint.clone(),
                principal_realm,
            ),
        };
        let failover = match &params.failover_region {
            None => None,
            Some(region) => {
                let target = resolve("failoverRegion", region)?;
                if let (Some(primary), Some(failover)) = (&realm, &target.realm)
                    && primary != failover
                {
                    return Err(MountError::invalid_argument(format!(
                        "parameter \"failoverRegion\" {region:?} is in realm {failover}, the \
                         primary region in realm {primary}: a failover stays in one realm"
                    )));
                }
                Some(target)
            }
        };
        Ok(Targets {
            primary,
            certificates,
            failover,
        })
    }

    /// `[auth] allowed_regions`, when set, lists every region a class may name.
    fn check_allowed(
        &self,
        key: &str,
        region: &str,
        resolved: &ResolvedRegion,
        resolver: &dyn RegionResolver,
    ) -> Result<(), MountError> {
        let allowed = &self.config.allowed_regions;
        if allowed.is_empty()
            || allowed.iter().any(|a| {
                a == &resolved.region
                    || resolver
                        .resolve(a)
                        .is_ok_and(|r| r.region == resolved.region)
            })
        {
            return Ok(());
        }
        Err(MountError::new(
            ErrorKind::PermissionDenied,
            format!(
                "parameter {key:?} {region:?} is not among the regions this provider's \
                 auth.allowed_regions lists ({})",
                allowed.join(", ")
            ),
        ))
    }

    async fn fetch_all(
        &self,
        params: &MountParameters,
        established: &auth::Established,
        targets: &Targets,
        mount: &Arc<MountBytes>,
        deadline: tokio::time::Instant,
    ) -> Result<(Vec<vault::SecretBundle>, Vec<Reservation>), MountError> {
        let permits = Arc::new(Semaphore::new(self.config.fan_out.max(1)));
        let mut pending: FuturesUnordered<_> = params
            .secrets
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                let request = |base_url: &str, source: &SecretSource, deadline| {
                    vault::SecretRequest {
                        base_url: base_url.to_owned(),
                        session: established.session.clone(),
                        secret: match source {
                            SecretSource::Name { name, vault_id } => vault::SecretRef::ByName {
                                vault_id: vault_id.clone(),
                                name: name.clone(),
                            },
                            SecretSource::Id(secret_id) => vault::SecretRef::ById {
                                secret_id: secret_id.clone(),
                            },
                        },
                        selector: selector(spec),
                        deadline,
                    }
                };
                // With a failover region, the primary gets half of the time left, so the
                // failover has time to answer.
                let failover = targets.failover.as_ref().zip(spec.failover.as_ref()).map(
                    |(target, source)| (target.clone(), request(&target.secrets_endpoint, source, deadline)),
                );
                let primary_deadline = match failover {
                    Some(_) => {
                        let now = tokio::time::Instant::now();
                        now + deadline.saturating_duration_since(now) / 2
                    }
                    None => deadline,
                };
                let request = request(&targets.primary, &spec.source, primary_deadline);
                let stats = self.config.served.clone();
                let path = spec.path.clone();
                let vault = self.vault.clone();
                let permits = permits.clone();
                let mount = mount.clone();
                let span = tracing::info_span!(
                    "fetch secret",
                    entry = index,
                    secret = %spec.source.display(),
                    region = tracing::field::Empty,
                    lookup = tracing::field::Empty,
                    oci.request_id = tracing::field::Empty,
                    error.kind = tracing::field::Empty,
                );
                let fetch_span = span.clone();
                tracing::Instrument::instrument(async move {
                    let span = fetch_span;
                    let _permit = permits.acquire_owned().await;
                    let answer = match vault.fetch(&mount, request).await {
                        Err(Refused::Failed(err)) if failover.is_some() && fails_over(&err) => {
                            let Some((target, again)) = failover else {
                                return (index, Fetched::Failed(err));
                            };
                            tracing::warn!(
                                secret = %path,
                                region = %target.region,
                                error = %chain(&err),
                                "the primary region failed; reading the failover region"
                            );
                            span.record("region", "failover");
                            let answer = vault.fetch(&mount, again).await;
                            if answer.is_ok() {
                                stats.failover.fetch_add(1, Ordering::Relaxed);
                                tracing::info!(secret = %path, region = %target.region, "served by the failover region");
                            }
                            answer
                        }
                        answer => {
                            span.record("region", "primary");
                            if answer.is_ok() {
                                stats.primary.fetch_add(1, Ordering::Relaxed);
                            }
                            answer
                        }
                    };
                    match answer {
                        Ok(held) => {
                            let (bundle, lookup) = held.value.into_parts();
                            span.record("lookup", lookup.as_str());
                            if let Some(id) = &bundle.opc_request_id {
                                span.record("oci.request_id", id.as_str());
                            }
                            (index, Fetched::Bundle(bundle, lookup, held.reservation, held.over))
                        }
                        Err(Refused::Budget(refusal)) => (index, Fetched::Refused(refusal)),
                        Err(Refused::MountOver) => (index, Fetched::MountOver),
                        Err(Refused::Failed(err)) => {
                            span.record("error.kind", vault_kind(&err).as_str());
                            if let Some(id) = err.opc_request_id() {
                                span.record("oci.request_id", id);
                            }
                            (index, Fetched::Failed(err))
                        }
                    }
                }, span)
            })
            .collect();
        let mut bundles: Vec<Option<vault::SecretBundle>> =
            (0..params.secrets.len()).map(|_| None).collect();
        let mut reservations = Vec::new();
        let mut failures: Vec<(usize, vault::VaultError)> = Vec::new();
        let mut shared: Vec<(usize, cache::Lookup)> = Vec::new();
        while let Some((index, fetched)) = pending.next().await {
            match fetched {
                Fetched::Bundle(bundle, lookup, reservation, over) => {
                    if lookup.is_shared() {
                        shared.push((index, lookup));
                    }
                    bundles[index] = Some(bundle);
                    reservations.extend(reservation);
                    if over {
                        // Dropping `pending` cancels the fetches still running.
                        return Err(too_large(params, &bundles, self.config.max_total_bytes));
                    }
                }
                Fetched::MountOver => {
                    return Err(too_large(params, &bundles, self.config.max_total_bytes));
                }
                Fetched::Refused(refusal) => {
                    return Err(MountError::new(
                        ErrorKind::ResourceExhausted,
                        refusal.to_string(),
                    ));
                }
                Fetched::Failed(err) => {
                    let permanent = !err.is_retryable();
                    failures.push((index, err));
                    // A permanent failure fails the mount whatever the others give:
                    // stop their retries now.
                    if permanent {
                        break;
                    }
                }
            }
        }
        let abandoned = pending.len();
        drop(pending);
        if !failures.is_empty() {
            return Err(combine(
                params,
                failures,
                abandoned,
                &established.identity(),
            ));
        }
        let bundles = bundles
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                MountError::internal("internal error: a secret was neither fetched nor failed")
            })?;
        // Reads that reached OCI (not answered by the cache), in the mount's span.
        // Certificate entries are always read from OCI (they are not cached).
        let upstream = bundles.len() - shared.len() + params.certificates.len();
        tracing::Span::current().record("upstream_calls", upstream);
        log_shared(established.credential(), &bundles, shared);
        Ok((bundles, reservations))
    }
}

/// Completes OCI's audit trail: reads answered from the cache (or by joining another
/// mount's fetch) never reached OCI, so the provider's log says which, for whom.
fn log_shared(
    credential: &auth::Credential,
    bundles: &[vault::SecretBundle],
    mut shared: Vec<(usize, cache::Lookup)>,
) {
    if shared.is_empty() {
        return;
    }
    shared.sort_by_key(|(index, _)| *index);
    let entries: Vec<String> = shared
        .iter()
        .filter_map(|(index, lookup)| {
            let bundle = bundles.get(*index)?;
            Some(format!(
                "secrets[{index}] {} version {} ({})",
                bundle.secret_id,
                bundle.version_number,
                lookup.as_str()
            ))
        })
        .collect();
    tracing::info!(
        %credential,
        served_without_oci = %entries.join(", "),
        "secrets served from the provider's cache (OCI's audit log does not see these reads)"
    );
}

/// Where a mount's Secrets calls go.
struct Targets {
    /// The primary region's Secrets base URL.
    primary: String,
    /// The primary region's Certificates base URL (certificate entries do not fail over).
    certificates: String,
    /// The failover region, if the class names one.
    failover: Option<ResolvedRegion>,
}

/// Whether a failure of the primary region sends the entry to the failover region: a
/// connection error, 5xx, 429 after retries, a timeout; never 400, 401, 403 or 404.
fn fails_over(err: &vault::VaultError) -> bool {
    matches!(
        err.kind(),
        auth::ErrorKind::Unavailable
            | auth::ErrorKind::ResourceExhausted
            | auth::ErrorKind::DeadlineExceeded
    )
}

/// A region a SecretProviderClass names, resolved by the provider's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedRegion {
    /// The region id.
    pub region: String,
    /// The realm's second-level domain, when known.
    pub realm: Option<String>,
    /// Its Secrets base URL.
    pub secrets_endpoint: String,
    /// Its Certificates base URL.
    pub certificates_endpoint: String,
}

/// Resolves the `region` and `failoverRegion` of SecretProviderClasses: only regions the
/// provider knows, never a host (the binary answers from `auth::Principals`).
pub trait RegionResolver: Send + Sync + fmt::Debug {
    /// The region, or why it cannot be used (no secret material in it).
    fn resolve(&self, region: &str) -> Result<ResolvedRegion, String>;
}

/// Entries served by the primary and by the failover region, since start.
#[derive(Debug, Default)]
pub struct RegionStats {
    /// Served by the primary region.
    pub primary: std::sync::atomic::AtomicU64,
    /// Served by the failover region.
    pub failover: std::sync::atomic::AtomicU64,
}

/// What one fetch gave.
enum Fetched {
    /// The bundle, how it was looked up, its bytes in the budget, and whether it brought
    /// the mount past its size limit.
    Bundle(
        vault::SecretBundle,
        cache::Lookup,
        Option<Reservation>,
        bool,
    ),
    Failed(vault::VaultError),
    Refused(crate::budget::Refusal),
    MountOver,
}

/// A fetch that did not run within the bounds, or failed (`failed` names it).
fn refused_error(
    refused: Refused<vault::VaultError>,
    failed: impl FnOnce(&vault::VaultError) -> MountError,
    mount: &MountBytes,
) -> MountError {
    match refused {
        Refused::Failed(err) => failed(&err),
        Refused::Budget(refusal) => {
            MountError::new(ErrorKind::ResourceExhausted, refusal.to_string())
        }
        Refused::MountOver => MountError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "the mounted files would take more than {} bytes (the driver refuses answers \
                 above 4 MiB): {} bytes fetched so far",
                mount.limit(),
                mount.total()
            ),
        ),
    }
}

/// A certificate entry brought the mount past its size limit.
fn over_limit(mount: &MountBytes, spec: &crate::params::CertificateSpec) -> MountError {
    MountError::new(
        ErrorKind::ResourceExhausted,
        format!(
            "the mounted files would take more than {} bytes (the driver refuses answers above \
             4 MiB): {} bytes fetched so far, secrets[{}] {} {} the last",
            mount.limit(),
            mount.total(),
            spec.index,
            spec.kind.field(),
            spec.id
        ),
    )
}

/// The mount passed `max_total_bytes` while its secrets arrived: the sizes of those that
/// did, largest first.
fn too_large(
    params: &MountParameters,
    bundles: &[Option<vault::SecretBundle>],
    max_total_bytes: usize,
) -> MountError {
    let mut sizes: Vec<(usize, usize)> = bundles
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.as_ref().map(|b| (i, b.content.len())))
        .collect();
    sizes.sort_by_key(|(i, size)| (std::cmp::Reverse(*size), *i));
    let total: usize = sizes.iter().map(|(_, s)| s).sum();
    let listed: Vec<String> = sizes
        .iter()
        .take(20)
        .map(|(i, size)| {
            let spec = &params.secrets[*i];
            format!("secrets[{}] {} ({size} bytes)", spec.index, spec.path)
        })
        .collect();
    let more = sizes.len().saturating_sub(listed.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    MountError::new(
        ErrorKind::ResourceExhausted,
        format!(
            "the mounted files would take more than {max_total_bytes} bytes (the driver refuses \
             answers above 4 MiB): {total} bytes from the {} secrets fetched so far: {}{more}",
            sizes.len(),
            listed.join(", ")
        ),
    )
}

fn selector(spec: &SecretSpec) -> vault::Selector {
    match &spec.selector {
        VersionSelector::Number(n) => vault::Selector::VersionNumber(*n),
        VersionSelector::Stage(stage) => vault::Selector::Stage(*stage),
        VersionSelector::Name(name) => vault::Selector::VersionName(name.clone()),
    }
}

fn auth_error(err: auth::AuthError) -> MountError {
    MountError::new(
        grpc_kind(err.kind()),
        format!("unable to establish the OCI identity: {}", chain(&err)),
    )
}

fn vault_kind(err: &vault::VaultError) -> ErrorKind {
    grpc_kind(err.kind())
}

/// The one mapping from the kind below the gRPC edge (auth's, which vault shares) to the
/// gRPC code.
pub(crate) fn grpc_kind(kind: auth::ErrorKind) -> ErrorKind {
    match kind {
        auth::ErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
        auth::ErrorKind::NotFound => ErrorKind::NotFound,
        auth::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
        auth::ErrorKind::Unauthenticated => ErrorKind::Unauthenticated,
        auth::ErrorKind::ResourceExhausted => ErrorKind::ResourceExhausted,
        auth::ErrorKind::Unavailable => ErrorKind::Unavailable,
        auth::ErrorKind::DeadlineExceeded => ErrorKind::DeadlineExceeded,
        // Kinds added to auth later are bugs until mapped here.
        _ => ErrorKind::Internal,
    }
}

/// Which code a mount with several failures answers: the one that most needs a person.
const PRECEDENCE: [ErrorKind; 8] = [
    ErrorKind::InvalidArgument,
    ErrorKind::Unauthenticated,
    ErrorKind::PermissionDenied,
    ErrorKind::NotFound,
    ErrorKind::ResourceExhausted,
    ErrorKind::Unavailable,
    ErrorKind::DeadlineExceeded,
    ErrorKind::Internal,
];

fn rank(kind: ErrorKind) -> usize {
    PRECEDENCE
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(PRECEDENCE.len())
}

/// An error and its causes on one line.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// The longest failure message: it ends up in a pod event, and the driver logs it whole.
const MAX_MESSAGE_BYTES: usize = 4096;

fn combine(
    params: &MountParameters,
    mut failures: Vec<(usize, vault::VaultError)>,
    abandoned: usize,
    identity: &auth::Identity,
) -> MountError {
    // The most actionable failures first, then in request order.
    failures.sort_by_key(|(index, e)| (rank(vault_kind(e)), *index));
    let kind = failures
        .first()
        .map(|(_, e)| vault_kind(e))
        .unwrap_or(ErrorKind::Internal);
    let mut message = format!(
        "unable to retrieve secrets as {identity}: {} of {} failed: ",
        failures.len(),
        params.secrets.len(),
    );
    let mut tail = String::new();
    if abandoned > 0 {
        tail = format!(" ({abandoned} not fetched after a permanent failure)");
    }
    // Room for "; ... and N more" and the tail.
    let budget = MAX_MESSAGE_BYTES.saturating_sub(tail.len() + 32);
    let mut listed = 0;
    for (index, err) in &failures {
        let cause = format!(
            "secrets[{}] {:?}: {}",
            params.secrets[*index].index,
            params.secrets[*index].source.display(),
            chain(err)
        );
        let separator = if listed == 0 { "" } else { "; " };
        if message.len() + separator.len() + cause.len() > budget {
            if listed == 0 {
                // Even one cause is too long: keep its start.
                let room = budget.saturating_sub(message.len());
                message.push_str(truncate_at_char(&cause, room));
                listed = 1;
            }
            break;
        }
        message.push_str(separator);
        message.push_str(&cause);
        listed += 1;
    }
    if listed < failures.len() {
        message.push_str(&format!("; ... and {} more", failures.len() - listed));
    }
    message.push_str(&tail);
    MountError::new(kind, message)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate_at_char(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn assemble(
    params: &MountParameters,
    bundles: Vec<vault::SecretBundle>,
    mode: csi_grpc::FileMode,
    max_total_bytes: usize,
) -> Result<MountResponse, MountError> {
    let total: usize = bundles.iter().map(|b| b.content.len()).sum();
    if total > max_total_bytes {
        let mut sizes: Vec<String> = params
            .secrets
            .iter()
            .zip(&bundles)
            .map(|(spec, bundle)| format!("{} ({} bytes)", spec.path, bundle.content.len()))
            .collect();
        sizes.sort();
        return Err(MountError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "the secrets of this mount take {total} bytes, more than the {max_total_bytes} bytes the driver accepts in one response: {}",
                sizes.join(", ")
            ),
        ));
    }
    let mut ids: BTreeMap<String, usize> = BTreeMap::new();
    for bundle in &bundles {
        *ids.entry(bundle.secret_id.clone()).or_default() += 1;
    }
    let mut object_versions = Vec::with_capacity(bundles.len());
    let mut files = Vec::with_capacity(bundles.len());
    // The bytes of the files so far: each extracted value is checked against the room
    // left before it is copied.
    let mut written = 0usize;
    for (spec, bundle) in params.secrets.iter().zip(bundles) {
        let index = spec.index;
        // The driver keys versions by id; one OCID mounted twice (two versions, two
        // files) would collapse, so such ids carry the file path.
        let id = if ids.get(&bundle.secret_id).copied().unwrap_or(0) > 1 {
            format!("{}/{}", bundle.secret_id, spec.path)
        } else {
            bundle.secret_id.clone()
        };
        object_versions.push(ObjectVersion {
            id,
            version: bundle.version_number.to_string(),
        });
        // The bytes move from the bundle's zeroizing buffer into the file's; no copy (a
        // decoded encoding is written to a new buffer, the encoded one wiped).
        let mut content = decode(index, spec, bundle.content.into_inner())?;
        let entry_mode = spec.mode.unwrap_or(mode);
        if !spec.keys.is_empty() {
            written += extract_keys(
                index,
                spec,
                &content,
                entry_mode,
                &mut files,
                max_total_bytes.saturating_sub(written),
            )?;
        }
        if spec.whole {
            written += content.len();
        }
        if spec.whole {
            files.push(File {
                path: spec.path.clone(),
                mode: entry_mode,
                contents: FileContents::new(std::mem::take(&mut *content)),
            });
        }
    }
    // Extracted values count against the same bound as whole secrets.
    if written > max_total_bytes {
        return Err(MountError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "the files of this mount take {written} bytes with the extracted keys, more \
                 than the {max_total_bytes} bytes the driver accepts in one response"
            ),
        ));
    }
    Ok(MountResponse {
        files,
        object_versions,
    })
}

/// The files of an entry's `keys`, at most `room` bytes in all (checked before each copy);
/// answers the bytes written. Errors name the secret and the keys, and for content that
/// does not parse only the position and kind. The parsed document is wiped as soon as the
/// keys are taken.
fn extract_keys(
    index: usize,
    spec: &SecretSpec,
    content: &[u8],
    mode: csi_grpc::FileMode,
    files: &mut Vec<File>,
    room: usize,
) -> Result<usize, MountError> {
    use crate::extract::{ExtractError, parse, value_of, wipe};
    let secret = spec.source.display();
    let document = parse(content, spec.format).map_err(|e| match e {
        ExtractError::Parse(why) => {
            let asked: Vec<String> = spec.keys.iter().map(|k| format!("{:?}", k.key)).collect();
            MountError::invalid_argument(format!(
                "secrets[{index}] {secret:?}: its content cannot be read for keys [{}] \
                 (secrets[{index}].keys): {why}",
                asked.join(", ")
            ))
        }
        _ => MountError::internal("internal error: a parse without a key"),
    })?;
    let mut written = 0usize;
    let mut taken = Ok(());
    for (k, key) in spec.keys.iter().enumerate() {
        match value_of(&document, &key.key, room.saturating_sub(written)) {
            Ok(value) => {
                written += value.len();
                files.push(File {
                    path: key.path.clone(),
                    mode: key.mode.unwrap_or(mode),
                    contents: FileContents::new(value),
                });
            }
            Err(ExtractError::TooLarge) => {
                taken = Err(MountError::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "secrets[{index}] {secret:?}: the value of key {:?} \
                         (secrets[{index}].keys[{k}]) would take the mount's files past the \
                         bytes the driver accepts in one response; the keys before it took \
                         {written} of the {room} bytes left",
                        key.key
                    ),
                ));
                break;
            }
            Err(_) => {
                taken = Err(MountError::invalid_argument(format!(
                    "secrets[{index}] {secret:?} has no key {:?} (secrets[{index}].keys[{k}].key)",
                    key.key
                )));
                break;
            }
        }
    }
    wipe(document);
    taken.map(|()| written)
}

/// The entry's `encoding` removed. Failures name the entry and the encoding, never the
/// content.
fn decode(
    index: usize,
    spec: &SecretSpec,
    content: zeroize::Zeroizing<Vec<u8>>,
) -> Result<zeroize::Zeroizing<Vec<u8>>, MountError> {
    use base64::Engine as _;
    let invalid = |why: &str| {
        MountError::invalid_argument(format!(
            "secrets[{index}] {:?}: its content is not valid {} (secrets[{index}].encoding): {why}",
            spec.source.display(),
            spec.encoding.as_str()
        ))
    };
    match spec.encoding {
        Encoding::Utf8 => Ok(content),
        Encoding::Base64 => {
            let text: Vec<u8> = content
                .iter()
                .copied()
                .filter(|b| !b.is_ascii_whitespace())
                .collect();
            let text = zeroize::Zeroizing::new(text);
            let engine = base64::engine::GeneralPurpose::new(
                &base64::alphabet::STANDARD,
                base64::engine::GeneralPurposeConfig::new()
                    .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
            );
            engine
                .decode(text.as_slice())
                .map(zeroize::Zeroizing::new)
                .map_err(|e| match e {
                    base64::DecodeError::InvalidByte(at, _) => {
                        invalid(&format!("an invalid character at offset {at}"))
                    }
                    base64::DecodeError::InvalidLength(_) => invalid("its length is wrong"),
                    _ => invalid("it does not end as base64 does"),
                })
        }
        Encoding::Hex => {
            let digits: zeroize::Zeroizing<Vec<u8>> = zeroize::Zeroizing::new(
                content
                    .iter()
                    .copied()
                    .filter(|b| !b.is_ascii_whitespace())
                    .collect(),
            );
            if !digits.len().is_multiple_of(2) {
                return Err(invalid("it has an odd number of digits"));
            }
            let value = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
            let mut out = zeroize::Zeroizing::new(Vec::with_capacity(digits.len() / 2));
            for (at, pair) in digits.chunks_exact(2).enumerate() {
                match (value(pair[0]), value(pair[1])) {
                    (Some(high), Some(low)) => out.push(high << 4 | low),
                    _ => return Err(invalid(&format!("a non-hex digit at pair {at}"))),
                }
            }
            Ok(out)
        }
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
