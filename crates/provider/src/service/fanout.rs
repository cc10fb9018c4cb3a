//! The mount's entries, every kind at once: one fan-out (`MountContext::fan_out` permits)
//! over secrets, version histories, selections and certificates alike, each fetch through
//! the byte budget, the running total stopping the mount as soon as it passes its size
//! limit, and the first permanent failure cancelling the rest.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use csi_grpc::{FilePath, MountError};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::contract::{CertificateService, ListingService, SecretsService};
use crate::entries::{EntryFiles, EntryOutcome, EntryVersion, MountRun, Services, Start, Targets};
use crate::failure::{combine, too_large};
use crate::params::MountParameters;

/// Every entry of the class but its templates, fetched and made into files concurrently;
/// the entries in the class's order, or the mount's error.
pub(super) async fn fetch_all<V: SecretsService, C: CertificateService, L: ListingService>(
    run: &MountRun<'_>,
    services: Services<'_, V, C, L>,
    params: &MountParameters,
    established: &auth::Established,
    targets: &Targets,
) -> Result<Vec<EntryFiles>, MountError> {
    // The files the selections may write, all of them together: each takes what it selects
    // before it fetches, so a mount's fetches stay within `max_files`.
    let room = Arc::new(AtomicUsize::new(
        run.config.max_files.saturating_sub(static_files(params)),
    ));
    let pending: Vec<Start<'_>> = params
        .entries
        .iter()
        .filter_map(|entry| entry.start(run, services, targets, &room))
        .collect();
    let mut entries = gather(run, params, established, pending).await?;
    entries.sort_by_key(|entry| entry.index);
    log_shared(established.credential(), &entries);
    Ok(entries)
}

/// The files every entry but the selections and the templates writes, as the class says.
fn static_files(params: &MountParameters) -> usize {
    params
        .entries
        .iter()
        .filter(|e| !matches!(e, crate::entries::Entry::Template(_)))
        .map(|e| e.files().len())
        .sum()
}

/// The entries' outcomes as they arrive: their files, or the mount's error (the secrets
/// that failed together, or the first that stops the mount).
async fn gather(
    run: &MountRun<'_>,
    params: &MountParameters,
    established: &auth::Established,
    pending: Vec<Start<'_>>,
) -> Result<Vec<EntryFiles>, MountError> {
    type Running<'a> = futures_util::future::BoxFuture<'a, EntryOutcome>;
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
            params.entries.iter().filter(|e| e.reads_secrets()).count(),
            failures,
            abandoned,
            &established.identity(),
        ));
    }
    Ok(entries)
}

/// Completes OCI's audit trail: reads answered from the cache (or by joining another
/// mount's fetch) never reached OCI, so the provider's log says which, for whom. The
/// mount's span counts the reads that did (`upstream_calls`) and, when it has the field
/// (the gRPC edge's `mount` span does), takes the others as `served_without_oci`: the
/// mount's one line then says it all. Under a span without it, they are a line of their own.
fn log_shared(credential: &auth::Credential, entries: &[EntryFiles]) {
    let versions = || {
        entries
            .iter()
            .flat_map(|e| e.versions.iter().map(move |v| (e, v)))
    };
    let shared = |version: &EntryVersion| matches!(version, EntryVersion::Secret { lookup, .. } if lookup.is_shared());
    let span = tracing::Span::current();
    let reads = versions().count();
    let served = versions().filter(|(_, v)| shared(v)).count();
    span.record("upstream_calls", reads - served);
    if served == 0 {
        return;
    }
    // Written where the line is made, if a line is: no string of it first.
    let served = tracing::field::display(Served {
        entries,
        credential,
    });
    if span.field("served_without_oci").is_some() {
        span.record("served_without_oci", served);
    } else {
        tracing::info!(
            served_without_oci = served,
            "secrets served from the provider's cache (OCI's audit log does not see these reads)"
        );
    }
}

/// `secrets[0] <OCID> version 1 (hit), ... as <credential>`: the entries a mount read
/// without OCI, and as whom.
struct Served<'a> {
    entries: &'a [EntryFiles],
    credential: &'a auth::Credential,
}

impl std::fmt::Display for Served<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut comma = "";
        for entry in self.entries {
            for version in &entry.versions {
                if let EntryVersion::Secret {
                    secret_id,
                    version,
                    lookup,
                    ..
                } = version
                    && lookup.is_shared()
                {
                    write!(
                        f,
                        "{comma}secrets[{}] {secret_id} version {version} ({})",
                        entry.index,
                        lookup.as_str()
                    )?;
                    comma = ", ";
                }
            }
        }
        write!(f, " as {}", self.credential)
    }
}
