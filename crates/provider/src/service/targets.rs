//! Where a mount's fetches go: the primary region (the class's `region`, else the
//! principal's) and the failover region, kept in one realm and in the operator's list.

use super::*;

impl<A, V, C> OciMount<A, V, C>
where
    A: IdentityService,
    V: Service<vault::SecretRequest, Error = vault::VaultError> + Clone + Send + Sync + 'static,
    V::Response: BundleResponse,
    V::Future: Send + 'static,
    C: crate::certificates::CertificateService,
{
    /// The primary region's Secrets endpoint (`region`, else the principal's) and the
    /// failover region's, which must be in the same realm.
    pub(super) fn targets(
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
    pub(super) fn check_allowed(
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
}

/// Where a mount's Secrets calls go.
pub(super) struct Targets {
    /// The primary region's Secrets base URL.
    pub(super) primary: String,
    /// The primary region's Certificates base URL (certificate entries do not fail over).
    pub(super) certificates: String,
    /// The failover region, if the class names one.
    pub(super) failover: Option<ResolvedRegion>,
}

/// Whether a failure of the primary region sends the entry to the failover region: a
/// connection error, 5xx, 429 after retries, a timeout; never 400, 401, 403 or 404.
pub(super) fn fails_over(err: &vault::VaultError) -> bool {
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
