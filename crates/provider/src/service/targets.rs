//! Where a mount's fetches go: the primary region (the class's `region`, else the
//! principal's) and the failover region, kept in one realm and in the operator's list.

use csi_grpc::{ErrorKind, MountError};

use crate::contract::MountContext;
use crate::endpoints::RegionEndpoints;
use crate::entries::{Target, Targets};
use crate::params::{AuthSpec, MountParameters};

/// The primary region's endpoints (`region`, else the principal's) and the failover
/// region's, which must be in the same realm; every region a mount would contact held to
/// the operator's list first.
pub(super) fn targets(
    config: &MountContext,
    params: &MountParameters,
    established: &auth::Established,
) -> Result<Targets, MountError> {
    let endpoints = &config.endpoints;
    let resolve = |key: &str, region: &str| {
        let resolved = endpoints.named(region).map_err(|why| {
            MountError::invalid_argument(format!(
                "parameter {key:?} {}: {why}",
                bounded::quote(region)
            ))
        })?;
        check_allowed(config, key, region, &resolved)?;
        Ok::<_, MountError>(resolved)
    };
    let principal = endpoints
        .of(established.region.as_ref())
        .map_err(endpoint_error)?;
    // A user principal's region is the tenant's too (its Secret's `auth.region`): when
    // the mount would call it, it passes the operator's list like a class's `region`.
    // (The instance and workload principals' regions are the operator's own.)
    if params.region.is_none()
        && matches!(params.auth, AuthSpec::User { .. })
        && let Some(region) = &established.region
    {
        check_allowed(
            config,
            "the user principal's region (auth.region of its Secret)",
            region.id(),
            &principal,
        )?;
    }
    let primary = match &params.region {
        Some(region) => {
            let r = resolve("region", region)?;
            // A tenant's region stays in the principal's realm, as a failover does.
            if let (Some(own), Some(theirs)) = (principal.realm(), r.realm())
                && own != theirs
            {
                return Err(MountError::invalid_argument(format!(
                    "parameter \"region\" {} is in realm {theirs}, the principal in \
                         realm {own}: a SecretProviderClass reads within its principal's realm",
                    bounded::quote(region)
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
                    "parameter \"failoverRegion\" {} is in realm {failover}, the \
                         primary region in realm {primary}: a failover stays in one realm",
                    bounded::quote(region)
                )));
            }
            Some(target)
        }
    };
    let target = |endpoints: std::sync::Arc<RegionEndpoints>| Target {
        session: established.session.toward(endpoints.region.as_ref()),
        endpoints,
    };
    Ok(Targets {
        primary: target(primary),
        failover: failover.map(target),
    })
}

/// `[auth] allowed_regions`, when set, lists every region a mount may contact.
fn check_allowed(
    config: &MountContext,
    key: &str,
    region: &str,
    resolved: &RegionEndpoints,
) -> Result<(), MountError> {
    let allowed = &config.allowed_regions;
    let regions = config.endpoints.regions();
    let id = resolved.name();
    if allowed.is_empty()
        || allowed
            .iter()
            .any(|a| a == id || regions.resolve_known(a).is_ok_and(|r| r.id() == id))
    {
        return Ok(());
    }
    let what = if key.starts_with("the ") {
        key.to_owned()
    } else {
        format!("parameter {key:?}")
    };
    Err(MountError::new(
        ErrorKind::PermissionDenied,
        format!(
            "{what} {} is not among the regions this provider's auth.allowed_regions lists \
                 ({})",
            bounded::quote(region),
            allowed.join(", ")
        ),
    ))
}

/// A mount without an endpoint to call: the operator's configuration.
pub(super) fn endpoint_error(err: crate::endpoints::EndpointError) -> MountError {
    MountError::invalid_argument(err.to_string())
}
