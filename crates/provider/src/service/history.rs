//! A `versions: N` entry: its current version like any secret entry (the failover region
//! included), then the secret's versions listed (ListSecretBundleVersions, newest first) in
//! the region that served it, then each older version by OCID and number, at once, each
//! under its own fan-out permit and through the byte budget. Every version is cached like
//! any bundle (by number, so for as long as the cache keeps it); fewer versions than asked
//! mount what exists.

use futures_util::FutureExt as _;

use super::entries::{
    EntryOutcome, MountRun, bundle_files, fetch_bundle, gather_parts, list, metered,
};
use super::targets::Targets;
use crate::contract::{ListingService, SecretsService};
use crate::layers::budget::Metered;
use crate::layers::failover::{ServedBy, WithFailover};
use crate::params::SecretSpec;

/// One `versions` entry; what happened goes into `span`.
pub(super) async fn versions_entry<V: SecretsService, L: ListingService>(
    run: &MountRun<'_>,
    (secrets, listings): (V, L),
    spec: &SecretSpec,
    requests: (vault::SecretRequest, Option<(String, vault::SecretRequest)>),
    targets: &Targets,
    span: &tracing::Span,
) -> EntryOutcome {
    let permit = run.permits.clone().acquire_owned().await;
    let shown = (spec.index, spec.source.display());
    let current = match fetch_bundle(secrets.clone(), metered(run, requests), shown, span).await {
        Ok(fetched) => fetched,
        Err(ended) => return ended,
    };
    if current.over {
        // Past the mount's size already: no listing, no older version.
        return bundle_files(run, &version(spec, 0), current);
    }
    let target = match (current.served, &targets.failover) {
        (ServedBy::Failover, Some(failover)) => failover,
        _ => &targets.primary,
    };
    let secret_id = current.bundle.secret_id.clone();
    let number = current.bundle.version_number;
    let request = vault::ListRequest {
        base_url: target.endpoints.secrets.clone(),
        session: target.session.clone(),
        kind: vault::ListKind::Versions {
            secret_id: secret_id.clone(),
            at_most: number,
            count: spec.history.len(),
        },
        deadline: run.request.deadline,
        // `Budget` puts its hook in when it passes the request on.
        backoff: vault::Backoff::none(),
        pages: run.pages.clone(),
    };
    let what = format!("secrets[{}].versions", spec.index);
    let (listing, held) = match list(run, listings, request, (&what, ""), span).await {
        Ok(listed) => listed,
        Err(ended) => return ended,
    };
    // The older versions wait for permits of their own.
    drop(permit);
    let older = listing.versions.into_iter().filter(|n| *n < number);
    let mut parts = vec![std::future::ready(bundle_files(run, &version(spec, 0), current)).boxed()];
    for (k, older) in (1..spec.history.len()).zip(older) {
        let request = vault::SecretRequest {
            base_url: target.endpoints.secrets.clone(),
            session: target.session.clone(),
            secret: vault::SecretRef::ById {
                secret_id: secret_id.clone(),
            },
            selector: vault::Selector::VersionNumber(older),
            deadline: run.request.deadline,
            backoff: vault::Backoff::none(),
        };
        let secrets = secrets.clone();
        parts.push(
            async move {
                let _permit = run.permits.clone().acquire_owned().await;
                let request = WithFailover {
                    primary: Metered::new(request, &run.mount),
                    failover: None,
                };
                let file = version(spec, k);
                let shown = (spec.index, spec.source.display());
                match fetch_bundle(secrets, request, shown, span).await {
                    Ok(fetched) => bundle_files(run, &file, fetched),
                    Err(ended) => ended,
                }
            }
            .boxed(),
        );
    }
    gather_parts(spec.index, parts, held).await
}

/// The entry as the one file `path/k` it writes of its `k`th version back.
fn version(spec: &SecretSpec, k: usize) -> SecretSpec {
    let path = spec.history.get(k).unwrap_or(&spec.path).clone();
    SecretSpec {
        path,
        whole: true,
        keys: Vec::new(),
        format: None,
        history: Vec::new(),
        ..spec.clone()
    }
}
