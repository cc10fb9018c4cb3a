//! Version histories (`versions: N` on a `name` or `secretId` entry): the current version
//! fetched as a secret entry's, the secret's versions listed (ListSecretBundleVersions,
//! within the mount's pages), then each older version fetched, each written whole to
//! `path/k`. The entry is checked as a secret entry is (`secret.rs`: its `versions`).

use futures_util::FutureExt as _;
use tracing::Instrument;

use super::FileDescription;
use super::run::{EntryOutcome, MountRun, Running, Start, Targets, gather_parts, list};
use super::secret::{
    SecretSpec, bundle_files, fetch_bundle, fetch_span, metered, secret_requests, source_and_vault,
};
use crate::contract::{ListingService, SecretsService};
use crate::layers::budget::Metered;
use crate::layers::failover::{ServedBy, WithFailover};

/// The entry ready to start: it then waits for a fan-out permit.
pub(crate) fn start<'a, V: SecretsService, L: ListingService>(
    run: &'a MountRun<'_>,
    (secrets, listings): (&'a V, &'a L),
    spec: &'a SecretSpec,
    targets: &'a Targets,
) -> Start<'a> {
    Box::new(move || {
        let span = fetch_span(spec);
        let requests = secret_requests(spec, targets, run.request.deadline);
        let services = (secrets.clone(), listings.clone());
        let recorded = span.clone();
        let entry =
            async move { versions_entry(run, services, spec, requests, targets, &recorded).await };
        Box::pin(entry.instrument(span)) as Running<'a>
    })
}

/// One `versions` entry; what happened goes into `span`.
async fn versions_entry<V: SecretsService, L: ListingService>(
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

/// What the `k`th file of a version history holds.
fn history_selector(k: usize) -> String {
    match k {
        0 => "the current version".to_owned(),
        1 => "the version before the current".to_owned(),
        k => format!("{k} versions before the current"),
    }
}

/// The entry's files as `check` shows them: one a version, the current first.
pub(crate) fn describe(spec: &SecretSpec) -> Vec<FileDescription> {
    let (source, vault) = source_and_vault(spec);
    spec.history
        .iter()
        .enumerate()
        .map(|(k, path)| FileDescription {
            path: path.as_str().to_owned(),
            mode: spec.mode,
            source: source.clone(),
            vault: vault.clone(),
            selector: history_selector(k),
            key: String::new(),
            encoding: spec.encoding.as_str().to_owned(),
            written: spec.write,
            selection: None,
        })
        .collect()
}
