//! The mount's entries, every kind at once: one fan-out (`MountContext::fan_out` permits)
//! over secrets and certificates alike, each through the byte budget, the running total
//! stopping the mount as soon as it passes its size limit, and the first permanent failure
//! cancelling the rest.

use bounded::quote;
use csi_grpc::{FilePath, MountError};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tracing::Instrument;

use super::contract::SecretsService;
use super::entries::{
    EntryFiles, EntryOutcome, EntryVersion, MountRun, certificate_entry, secret_entry,
    secret_requests,
};
use super::failure::{combine, too_large};
use super::targets::Targets;
use crate::certificates::CertificateService;
use crate::params::{MountParameters, SecretSpec};

/// An entry running: its outcome, and its spec when it is a secret.
type Running<'a> = BoxFuture<'a, (Option<&'a SecretSpec>, EntryOutcome)>;

/// Every entry of the class, fetched and made into files concurrently; the entries in the
/// class's order, or the mount's error.
pub(super) async fn fetch_all<V: SecretsService, C: CertificateService>(
    run: &MountRun<'_>,
    services: (&V, &C),
    params: &MountParameters,
    established: &auth::Established,
    targets: &Targets,
) -> Result<Vec<EntryFiles>, MountError> {
    let pending = start(run, services, params, targets);
    let mut entries = gather(run, params, established, pending).await?;
    entries.sort_by_key(|entry| entry.index);
    log_shared(established.credential(), &entries);
    Ok(entries)
}

/// Every entry of the class, started: each waits for a fan-out permit.
fn start<'a, V: SecretsService, C: CertificateService>(
    run: &'a MountRun<'_>,
    (secrets, certificates): (&V, &C),
    params: &'a MountParameters,
    targets: &Targets,
) -> FuturesUnordered<Running<'a>> {
    let deadline = run.request.deadline;
    let pending: FuturesUnordered<Running<'a>> = FuturesUnordered::new();
    for spec in &params.secrets {
        let span = tracing::info_span!(
            "fetch secret",
            entry = spec.index,
            secret = %quote(spec.source.display()),
            region = tracing::field::Empty,
            lookup = tracing::field::Empty,
            oci.request_id = tracing::field::Empty,
            error.kind = tracing::field::Empty,
        );
        let requests = secret_requests(spec, targets, deadline);
        let secrets = secrets.clone();
        let recorded = span.clone();
        let entry = async move {
            let outcome = secret_entry(run, secrets, spec, requests, &recorded).await;
            (Some(spec), outcome)
        };
        pending.push(Box::pin(entry.instrument(span)));
    }
    for spec in &params.certificates {
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
        let entry = async move {
            let outcome = certificate_entry(run, certificates, spec, call, &recorded).await;
            (None, outcome)
        };
        pending.push(Box::pin(entry.instrument(span)));
    }
    pending
}

/// The entries' outcomes as they arrive: their files, or the mount's error (the secrets
/// that failed together, or the first that stops the mount).
async fn gather<'a>(
    run: &MountRun<'_>,
    params: &'a MountParameters,
    established: &auth::Established,
    mut pending: FuturesUnordered<Running<'a>>,
) -> Result<Vec<EntryFiles>, MountError> {
    let mut entries = Vec::with_capacity(pending.len());
    let mut failures = Vec::new();
    // What the secrets fetched so far took, for the message of a mount past its size.
    let mut fetched: Vec<(usize, FilePath, usize)> = Vec::new();
    while let Some((secret, outcome)) = pending.next().await {
        // Returning or breaking drops `pending`: the entries still running are cancelled.
        match (outcome, secret) {
            (EntryOutcome::Files(files), _) => {
                if let EntryVersion::Secret {
                    path,
                    fetched: bytes,
                    ..
                } = &files.version
                {
                    fetched.push((files.index, path.clone(), *bytes));
                }
                entries.push(files);
            }
            (EntryOutcome::Failed(err), Some(spec)) => {
                // A permanent failure fails the mount whatever the others give: their
                // retries stop now.
                let permanent = !err.is_retryable();
                failures.push((spec, err));
                if permanent {
                    break;
                }
            }
            (EntryOutcome::Over(this), spec) => {
                if let (Some((path, bytes)), Some(spec)) = (this, spec) {
                    fetched.push((spec.index, path, bytes));
                }
                return Err(too_large(&fetched, run.config.max_total_bytes));
            }
            (EntryOutcome::Stop(err), _) => return Err(err),
            (EntryOutcome::Failed(_), None) => {
                return Err(MountError::internal(
                    "internal error: a certificate entry failed as a secret",
                ));
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
    Ok(entries)
}

/// Completes OCI's audit trail: reads answered from the cache (or by joining another
/// mount's fetch) never reached OCI, so the provider's log says which, for whom; the
/// mount's span counts the reads that did.
fn log_shared(credential: &auth::Credential, entries: &[EntryFiles]) {
    let shared: Vec<String> = entries
        .iter()
        .filter_map(|entry| match &entry.version {
            EntryVersion::Secret {
                secret_id,
                version,
                lookup,
                ..
            } if lookup.is_shared() => Some(format!(
                "secrets[{}] {secret_id} version {version} ({})",
                entry.index,
                lookup.as_str()
            )),
            _ => None,
        })
        .collect();
    tracing::Span::current().record("upstream_calls", entries.len() - shared.len());
    if shared.is_empty() {
        return;
    }
    tracing::info!(
        %credential,
        served_without_oci = %shared.join(", "),
        "secrets served from the provider's cache (OCI's audit log does not see these reads)"
    );
}
