//! Where a mount's fetches go: the primary region (the class's `region`, else the
//! principal's) and the failover region, kept in one realm and in the operator's list.

use super::*;
use crate::endpoints::RegionEndpoints;

impl<A, V, C> OciMount<A, V, C>
where
    A: IdentityService,
    V: SecretsService,
    C: crate::certificates::CertificateService,
{
    /// The primary region's endpoints (`region`, else the principal's) and the failover
    /// region's, which must be in the same realm.
    pub(super) fn targets(
        &self,
        params: &MountParameters,
        established: &auth::Established,
    ) -> Result<Targets, MountError> {
        let endpoints = &self.config.endpoints;
        let resolve = |key: &str, region: &str| {
            let resolved = endpoints.named(region).map_err(|why| {
                MountError::invalid_argument(format!("parameter {key:?} {region:?}: {why}"))
            })?;
            self.check_allowed(key, region, &resolved)?;
            Ok::<_, MountError>(resolved)
        };
        let principal = endpoints
            .of(established.region.as_ref())
            .map_err(endpoint_error)?;
        let primary = match &params.region {
            Some(region) => {
                let r = resolve("region", region)?;
                // A tenant's region stays in the principal's realm, as a failover does.
                if let (Some(own), Some(theirs)) = (principal.realm(), r.realm())
                    && own != theirs
                {
                    return Err(MountError::invalid_argument(format!(
                        "parameter \"region\" {region:?} is in realm {theirs}, the principal in \
                         realm {own}: a SecretProviderClass reads within its principal's realm"
                    )));
                }
                r
            }
            None => principal,
        };
        let failover = match &params.failover_region {
            None => None,
            Some(region) => {
                let target = resolve("failoverRegion", region)?;
                if let (Some(primary), Some(failover)) = (primary.realm(), target.realm())
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
        let target = |endpoints: RegionEndpoints| Target {
            session: established.session.toward(endpoints.region.as_ref()),
            endpoints,
        };
        Ok(Targets {
            primary: target(primary),
            failover: failover.map(target),
        })
    }

    /// `[auth] allowed_regions`, when set, lists every region a class may name.
    pub(super) fn check_allowed(
        &self,
        key: &str,
        region: &str,
        resolved: &RegionEndpoints,
    ) -> Result<(), MountError> {
        let allowed = &self.config.allowed_regions;
        let regions = self.config.endpoints.regions();
        let id = resolved.name();
        if allowed.is_empty()
            || allowed
                .iter()
                .any(|a| a == id || regions.resolve_known(a).is_ok_and(|r| r.id() == id))
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

/// A mount without an endpoint to call: the operator's configuration.
pub(super) fn endpoint_error(err: crate::endpoints::EndpointError) -> MountError {
    MountError::invalid_argument(err.to_string())
}

/// Where a mount's calls go.
pub(super) struct Targets {
    /// The primary region: every Secrets call first, and every Certificates call
    /// (certificate entries do not fail over).
    pub(super) primary: Target,
    /// The failover region, if the class names one.
    pub(super) failover: Option<Target>,
}

/// One region's endpoints and the mount's session for requests to them.
pub(super) struct Target {
    pub(super) endpoints: RegionEndpoints,
    /// The established session told the region its requests go to: the region is decided
    /// here, where the URL is, not by the signing layer from a host (the operator's
    /// overrides may map regions to any host). A 401 from a region the class named, other
    /// than the principal's own, then fails that request and leaves the credential every
    /// other mount shares alone (`auth::Session::toward`).
    pub(super) session: auth::Session,
}
