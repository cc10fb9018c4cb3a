//! The mount's entries, every kind at once: one fan-out (`MountContext::fan_out` permits)
//! over secrets, version histories, selections and certificates alike, each fetch through
//! the byte budget, the running total stopping the mount as soon as it passes its size
//! limit, and the first permanent failure cancelling the rest.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use bounded::quote;
use csi_grpc::{FilePath, MountError};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tracing::Instrument;

use super::entries::{
    EntryFiles, EntryOutcome, EntryVersion, MountRun, certificate_entry, secret_entry,
    secret_requests,
};
use super::history::versions_entry;
use super::selection::selection_entry;
use super::targets::Targets;
use crate::contract::CertificateService;
use crate::contract::{ListingService, SecretsService};
use crate::failure::{combine, too_large};
use crate::params::MountParameters;

/// An entry running.
type Running<'a> = BoxFuture<'a, EntryOutcome>;

/// An entry not yet started: what it needs is borrowed, so an entry waiting its turn holds
/// a pointer's worth of memory, not a request, a service and a future (a list of hundreds
/// of small entries would otherwise hold them all at once).
type Start<'a> = Box<dyn FnOnce() -> Running<'a> + Send + 'a>;

/// The fetch services of a mount: secrets, certificates, listings.
pub(super) type Services<'s, V, C, L> = (&'s V, &'s C, &'s L);

/// Every entry of the class, fetched and made into files concurrently; the entries in the
/// class's order, or the mount's error.
pub(super) async fn fetch_all<V: SecretsService, C: CertificateService, L: ListingService>(
    run: &MountRun<'_>,
    services: Services<'_, V, C, L>,
    params: &MountParameters,
    established: &auth::Established,
    targets: &Targets,
) -> Result<Vec<EntryFiles>, MountError> {
    let mut pending = start_secrets(run, services, params, targets);
    pending.extend(start_certificates(run, services.1, params, targets));
    let mut entries = gather(run, params, established, pending).await?;
    entries.sort_by_key(|entry| entry.index);
    log_shared(established.credential(), &entries);
    Ok(entries)
}

/// The files every entry but the selections writes, as the class says.
pub(super) fn static_files(params: &MountParameters) -> usize {
    params
        .secrets
        .iter()
        .map(|s| s.files().count())
        .chain(params.certificates.iter().map(|c| c.files().count()))
        .sum()
}

/// Every secret, version history and selection of the class, ready to start: each then
/// waits for a fan-out permit.
fn start_secrets<'a, V: SecretsService, C, L: ListingService>(
    run: &'a MountRun<'_>,
    (secrets, _, listings): Services<'a, V, C, L>,
    params: &'a MountParameters,
    targets: &'a Targets,
) -> Vec<Start<'a>> {
    let deadline = run.request.deadline;
    let mut pending: Vec<Start<'a>> = Vec::new();
    for spec in &params.secrets {
        pending.push(Box::new(move || {
            let span = tracing::info_span!(
                "fetch secret",
                entry = spec.index,
                secret = %quote(spec.source.display()),
                versions = spec.history.len(),
                region = tracing::field::Empty,
                lookup = tracing::field::Empty,
                listing = tracing::field::Empty,
                oci.request_id = tracing::field::Empty,
                error.kind = tracing::field::Empty,
            );
            let requests = secret_requests(spec, targets, deadline);
            let services = (secrets.clone(), listings.clone());
            let recorded = span.clone();
            let entry = async move {
                if spec.history.is_empty() {
                    secret_entry(run, services.0, spec, requests, &recorded).await
                } else {
                    versions_entry(run, services, spec, requests, targets, &recorded).await
                }
            };
            Box::pin(entry.instrument(span)) as Running<'a>
        }));
    }
    // The files the selections may write, all of them together: each takes what it selects
    // before it fetches, so a mount's fetches stay within `max_files`.
    let room = Arc::new(AtomicUsize::new(
        run.config.max_files.saturating_sub(static_files(params)),
    ));
    for spec in &params.selections {
        let room = room.clone();
        pending.push(Box::new(move || {
            let span = tracing::info_span!(
                "select secrets",
                entry = spec.index,
                selection = %spec.describe(),
                region = tracing::field::Empty,
                lookup = tracing::field::Empty,
                listing = tracing::field::Empty,
                oci.request_id = tracing::field::Empty,
                error.kind = tracing::field::Empty,
            );
            let services = (secrets.clone(), listings.clone());
            let recorded = span.clone();
            let entry = async move {
                selection_entry(run, services, spec, (targets, &room), &recorded).await
            };
            Box::pin(entry.instrument(span)) as Running<'a>
        }));
    }
    pending
}

/// Every certificate entry of the class, ready to start.
fn start_certificates<'a, C: CertificateService>(
    run: &'a MountRun<'_>,
    certificates: &'a C,
    params: &'a MountParameters,
    targets: &'a Targets,
) -> Vec<Start<'a>> {
    let deadline = run.request.deadline;
    let mut pending: Vec<Start<'a>> = Vec::new();
    for spec in &params.certificates {
        pending.push(Box::new(move || {
            let span = tracing::info_span!(
                "fetch certificate",
                entry = spec.index,
                certificate = %spec.id,
                private_key = spec.private_key,
                oci.request_id = tracing::field::Empty,
                error.kind = tracing::field::Empty,
            );
            let call = crate::certificates::request(
                spec,
                &targets.primary.endpoints.certificates,
                &targets.primary.session,
                deadline,
            );
            let certificates = certificates.clone();
            let recorded = span.clone();
            let entry =
                async move { certificate_entry(run, certificates, spec, call, &recorded).await };
            Box::pin(entry.instrument(span)) as Running<'a>
        }));
    }
    pending
}

/// The entries' outcomes as they arrive: their files, or the mount's error (the secrets
/// that failed together, or the first that stops the mount).
async fn gather(
    run: &MountRun<'_>,
    params: &MountParameters,
    established: &auth::Established,
    pending: Vec<Start<'_>>,
) -> Result<Vec<EntryFiles>, MountError> {
    let total = pending.len();
    let mut entries = Vec::with_capacity(total);
    // Entries start as others end: at most `fan_out` of them exist at once (each waits for
    // its fetch permit too), whatever the length of the list.
    let mut waiting = pending.into_iter();
    let mut pending: FuturesUnordered<Running<'_>> = waiting
        .by_ref()
        .take(run.config.fan_out.max(1))
        .map(|start| start())
        .collect();
    let mut ended = 0;
    let mut failures = Vec::new();
    // What the secrets fetched so far took, for the message of a mount past its size.
    let mut fetched: Vec<(usize, FilePath, usize)> = Vec::new();
    while let Some(outcome) = pending.next().await {
        ended += 1;
        if let Some(start) = waiting.next() {
            pending.push(start());
        }
        // Returning or breaking drops `pending`: the entries still running are cancelled.
        match outcome {
            EntryOutcome::Files(files) => {
                for version in &files.versions {
                    if let EntryVersion::Secret {
                        path,
                        fetched: bytes,
                        ..
                    } = version
                    {
                        fetched.push((files.index, path.clone(), *bytes));
                    }
                }
                entries.push(files);
            }
            EntryOutcome::Failed(failure) => {
                // A permanent failure fails the mount whatever the others give: their
                // retries stop now.
                let permanent = !failure.error.is_retryable();
                failures.push(failure);
                if permanent {
                    break;
                }
            }
            EntryOutcome::Over(this) => {
                fetched.extend(this);
                return Err(too_large(&fetched, run.config.max_total_bytes));
            }
            EntryOutcome::Stop(err) => return Err(err),
        }
    }
    let abandoned = total - ended;
    drop(pending);
    if !failures.is_empty() {
        return Err(combine(
            params.secrets.len() + params.selections.len(),
            failures,
            abandoned,
            &established.identity(),
        ));
    }
    Ok(entries)
}

/// Completes OCI's audit trail: reads answered from the cache (or by joining another
/// mount's fetch) never reached OCI, so the provider's log says which, for whom; the
/// mount's span counts the reads that did.
fn log_shared(credential: &auth::Credential, entries: &[EntryFiles]) {
    let mut reads = 0;
    let mut shared = Vec::new();
    for entry in entries {
        for version in &entry.versions {
            reads += 1;
            if let EntryVersion::Secret {
                secret_id,
                version,
                lookup,
                ..
            } = version
                && lookup.is_shared()
            {
                shared.push(format!(
                    "secrets[{}] {secret_id} version {version} ({})",
                    entry.index,
                    lookup.as_str()
                ));
            }
        }
    }
    tracing::Span::current().record("upstream_calls", reads - shared.len());
    if shared.is_empty() {
        return;
    }
    tracing::info!(
        %credential,
        served_without_oci = %shared.join(", "),
        "secrets served from the provider's cache (OCI's audit log does not see these reads)"
    );
}
