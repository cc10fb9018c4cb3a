//! A secret entry's requests (its primary region's, its failover region's) and its fetch:
//! a fan-out permit, the Secrets stack (failover over the byte budget), then its files.

use csi_grpc::{ErrorKind, MountError};
use tower::ServiceExt;
use tracing::Instrument;

use super::{SecretSpec, secret_files};
use crate::contract::{BundleResponse, SecretsService};
use crate::entries::run::{
    EntryFiles, EntryOutcome, EntryVersion, Fetched, MountRun, Running, Start, Target, Targets,
};
use crate::failure::{Failure, vault_kind};
use crate::layers::budget::{Metered, Refused};
use crate::layers::failover::WithFailover;
use crate::params::spec::{SecretSource, VersionSelector};

/// The span of a secret entry's fetch (and of a version history's): its fields the region,
/// lookup, listing, request id and error kind are recorded as the fetch goes.
pub(crate) fn fetch_span(spec: &SecretSpec) -> tracing::Span {
    tracing::info_span!(
        "fetch secret",
        entry = spec.index,
        secret = %bounded::quote(spec.source.display()),
        versions = spec.history.len(),
        region = tracing::field::Empty,
        lookup = tracing::field::Empty,
        listing = tracing::field::Empty,
        oci.request_id = tracing::field::Empty,
        error.kind = tracing::field::Empty,
    )
}

/// The entry ready to start: it then waits for a fan-out permit.
pub(crate) fn start<'a, V: SecretsService>(
    run: &'a MountRun<'_>,
    secrets: &'a V,
    spec: &'a SecretSpec,
    targets: &'a Targets,
) -> Start<'a> {
    Box::new(move || {
        let span = fetch_span(spec);
        let requests = secret_requests(spec, targets, run.request.deadline);
        let secrets = secrets.clone();
        let recorded = span.clone();
        let entry = async move { secret_entry(run, secrets, spec, requests, &recorded).await };
        Box::pin(entry.instrument(span)) as Running<'a>
    })
}

/// An entry's requests to its primary region and, if it has one, its failover region, as
/// the byte budget takes them. With a failover, the primary gets half of the time left now
/// that the entry starts (not when the mount began: a large mount's later entries wait for
/// the fan-out), so that the failover has time to answer.
pub(crate) fn metered(
    run: &MountRun<'_>,
    (mut primary, failover): (vault::SecretRequest, Option<(String, vault::SecretRequest)>),
) -> WithFailover<Metered<vault::SecretRequest>> {
    if failover.is_some() {
        let now = tokio::time::Instant::now();
        primary.deadline = now + primary.deadline.saturating_duration_since(now) / 2;
    }
    WithFailover {
        primary: Metered::new(primary, &run.mount),
        failover: failover.map(|(region, again)| (region, Metered::new(again, &run.mount))),
    }
}

/// One bundle through the Secrets fetch stack (the failover region if the primary fails
/// over, within the byte bounds); a refusal or a failure is how the entry ends (`shown`:
/// how messages name what was asked for). What happened goes into `span`.
pub(crate) async fn fetch_bundle<V: SecretsService>(
    secrets: V,
    request: WithFailover<Metered<vault::SecretRequest>>,
    (index, shown): (usize, &str),
    span: &tracing::Span,
) -> Result<Fetched, EntryOutcome> {
    let (held, served) = match secrets.oneshot(request).await {
        Ok(answer) => answer,
        Err(Refused::Budget(refusal)) => {
            return Err(EntryOutcome::Stop(MountError::new(
                ErrorKind::ResourceExhausted,
                refusal.to_string(),
            )));
        }
        Err(Refused::MountOver) => return Err(EntryOutcome::Over(None)),
        Err(Refused::Failed(error)) => {
            span.record("error.kind", vault_kind(&error).as_str());
            if let Some(id) = error.opc_request_id() {
                span.record("oci.request_id", id);
            }
            return Err(EntryOutcome::Failed(Failure {
                index,
                shown: shown.to_owned(),
                error,
            }));
        }
    };
    let (answer, reservation, over) = held.into_parts();
    let (bundle, lookup) = answer.into_parts();
    span.record("lookup", lookup.as_str());
    if let Some(id) = &bundle.opc_request_id {
        span.record("oci.request_id", id.as_str());
    }
    Ok(Fetched {
        bundle,
        lookup,
        reservation,
        served,
        over,
    })
}

/// A fetched bundle made into the files `spec` writes (decoded, its keys extracted).
pub(crate) fn bundle_files(
    run: &MountRun<'_>,
    spec: &SecretSpec,
    fetched: Fetched,
) -> EntryOutcome {
    let Fetched {
        bundle,
        lookup,
        reservation,
        over,
        ..
    } = fetched;
    let bytes = bundle.content.len();
    if over {
        return EntryOutcome::Over(Some((spec.index, spec.path.clone(), bytes)));
    }
    let vault::SecretBundle {
        secret_id,
        version_number,
        content,
        ..
    } = bundle;
    match secret_files(
        spec,
        content.into_inner(),
        run.request.file_mode,
        run.config,
        run.namespace,
    ) {
        Ok(files) => EntryOutcome::Files(EntryFiles {
            index: spec.index,
            files,
            versions: vec![EntryVersion::Secret {
                path: spec.path.clone(),
                secret_id,
                version: version_number,
                lookup,
                fetched: bytes,
            }],
            reservations: reservation.into_iter().collect(),
            write: spec.write,
        }),
        Err(err) => EntryOutcome::Stop(err),
    }
}

/// One secret entry: a fan-out permit, the Secrets fetch stack (its primary region, its
/// failover region if the primary fails over, within the byte bounds), its files; what
/// happened goes into `span`.
pub(crate) async fn secret_entry<V: SecretsService>(
    run: &MountRun<'_>,
    secrets: V,
    spec: &SecretSpec,
    requests: (vault::SecretRequest, Option<(String, vault::SecretRequest)>),
    span: &tracing::Span,
) -> EntryOutcome {
    let _permit = run.permits.clone().acquire_owned().await;
    let shown = (spec.index, spec.source.display());
    match fetch_bundle(secrets, metered(run, requests), shown, span).await {
        Ok(fetched) => bundle_files(run, spec, fetched),
        Err(ended) => ended,
    }
}

/// The request of a secret entry to its primary region and, when the class and the entry
/// name one, to the failover region, both with the mount's deadline (the primary's is
/// halved when the entry starts: [`metered`]).
pub(crate) fn secret_requests(
    spec: &SecretSpec,
    targets: &Targets,
    deadline: tokio::time::Instant,
) -> (vault::SecretRequest, Option<(String, vault::SecretRequest)>) {
    let request = |target: &Target, source: &SecretSource| vault::SecretRequest {
        base_url: target.endpoints.secrets.clone(),
        session: target.session.clone(),
        secret: match source {
            SecretSource::Name { name, vault_id } => vault::SecretRef::ByName {
                vault_id: vault_id.clone(),
                name: name.clone(),
            },
            SecretSource::Id(secret_id) => vault::SecretRef::ById {
                secret_id: secret_id.clone(),
            },
        },
        selector: selector(&spec.selector),
        deadline,
        // `Budget` puts its hook in when it passes the request on.
        backoff: vault::Backoff::none(),
    };
    let failover = targets
        .failover
        .as_ref()
        .zip(spec.failover.as_ref())
        .map(|(target, source)| {
            let again = request(target, source);
            (target.endpoints.name().to_owned(), again)
        });
    (request(&targets.primary, &spec.source), failover)
}

fn selector(selector: &VersionSelector) -> vault::Selector {
    match selector {
        VersionSelector::Number(n) => vault::Selector::VersionNumber(*n),
        VersionSelector::Stage(stage) => vault::Selector::Stage(*stage),
        VersionSelector::Name(name) => vault::Selector::VersionName(name.clone()),
    }
}
