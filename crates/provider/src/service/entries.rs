//! One entry of a mount, whatever its kind, from its request to its files: a fan-out
//! permit, each fetch through the byte budget (and the failover region, for secrets), then
//! the entry's files and object versions. The fan-out (`fanout.rs`) runs every entry of a
//! mount at once through these; the entries made of several fetches (`history.rs`,
//! `selection.rs`) are built from the same steps.

use std::sync::Arc;

use csi_grpc::{ErrorKind, File, FilePath, MountError, MountRequest, ObjectVersion};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use super::files::secret_files;
use super::targets::{Target, Targets};
use crate::budget::Reservation;
use crate::contract::CertificateService;
use crate::contract::{
    BundleResponse, ListingResponse, ListingService, MountContext, SecretsService,
};
use crate::failure::{Failure, chain, over_limit, refused_error, vault_kind};
use crate::layers::budget::{Metered, MountBytes, Refused};
use crate::layers::failover::{ServedBy, WithFailover};
use crate::params::{CertificateSpec, SecretSource, SecretSpec, VersionSelector};

/// What every entry of one mount shares while it runs.
pub(super) struct MountRun<'a> {
    pub(super) config: &'a MountContext,
    pub(super) request: &'a MountRequest,
    pub(super) namespace: &'a str,
    /// The mount's running total and size limit.
    pub(super) mount: Arc<MountBytes>,
    /// Fetches made at once (`MountContext::fan_out`).
    pub(super) permits: Arc<Semaphore>,
    /// The listing pages the mount may still send upstream, over all its listings
    /// (`MountContext::max_listing_pages`).
    pub(super) pages: vault::Pages,
}

/// What an entry gives the mount: its files, what their object versions are made of, and
/// the bytes its answers hold in the budget until the mount is answered.
pub(super) struct EntryFiles {
    /// The entry's position in the class's list.
    pub(super) index: usize,
    pub(super) files: Vec<File>,
    /// One per fetch: a version history or a selection has several.
    pub(super) versions: Vec<EntryVersion>,
    pub(super) reservations: Vec<Reservation>,
    /// Whether its files are written (`writeFile`); `false`: read by templates only.
    pub(super) write: bool,
}

impl EntryFiles {
    /// The files of one entry's fetches as the entry's.
    fn merge(index: usize, parts: Vec<EntryFiles>, listing: Option<Reservation>) -> Self {
        let mut merged = EntryFiles {
            index,
            files: Vec::new(),
            versions: Vec::new(),
            reservations: listing.into_iter().collect(),
            write: parts.first().is_none_or(|p| p.write),
        };
        for part in parts {
            merged.files.extend(part.files);
            merged.versions.extend(part.versions);
            merged.reservations.extend(part.reservations);
        }
        merged
    }
}

/// One fetch's object version: a secret's is settled with the mount's other secrets (one
/// OCID mounted twice carries its path), a certificate's is its own.
pub(super) enum EntryVersion {
    Secret {
        /// The fetch's file (a secret mounted twice is told apart by it).
        path: FilePath,
        secret_id: String,
        version: u64,
        /// How the bundle was looked up (a read from the cache never reached OCI).
        lookup: cache::Lookup,
        /// The bytes fetched.
        fetched: usize,
    },
    Certificate(ObjectVersion),
    /// A template's: its inputs' versions, digested.
    Template(ObjectVersion),
}

/// How an entry ended.
pub(super) enum EntryOutcome {
    Files(EntryFiles),
    /// A secret could not be read: the mount's message lists every such entry.
    Failed(Failure),
    /// The mount passed its size limit (with this entry's `(index, file, bytes)`, when it
    /// was fetched).
    Over(Option<(usize, FilePath, usize)>),
    /// Fails the mount now: the budget refused it, its content could not be used, a
    /// listing or a certificate entry failed.
    Stop(MountError),
}

/// A bundle fetched within the bounds, and what the fetch says of it.
pub(super) struct Fetched {
    pub(super) bundle: vault::SecretBundle,
    pub(super) lookup: cache::Lookup,
    pub(super) reservation: Option<Reservation>,
    /// The region that served it.
    pub(super) served: ServedBy,
    /// It brought the mount past its size limit.
    pub(super) over: bool,
}

/// An entry's requests to its primary region and, if it has one, its failover region, as
/// the byte budget takes them. With a failover, the primary gets half of the time left now
/// that the entry starts (not when the mount began: a large mount's later entries wait for
/// the fan-out), so that the failover has time to answer.
pub(super) fn metered(
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
pub(super) async fn fetch_bundle<V: SecretsService>(
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
pub(super) fn bundle_files(
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
pub(super) async fn secret_entry<V: SecretsService>(
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

/// The outcomes of an entry's fetches, as they arrive: their files as the entry's, in the
/// order of `parts` (with the listing's bytes), or the first outcome that is not files (the
/// rest are dropped, so cancelled).
pub(super) async fn gather_parts<'a>(
    index: usize,
    parts: impl IntoIterator<Item = futures_util::future::BoxFuture<'a, EntryOutcome>>,
    listing: Option<Reservation>,
) -> EntryOutcome {
    let mut pending: FuturesUnordered<_> = parts
        .into_iter()
        .enumerate()
        .map(|(at, part)| async move { (at, part.await) })
        .collect();
    let mut done = Vec::with_capacity(pending.len());
    while let Some((at, outcome)) = pending.next().await {
        match outcome {
            EntryOutcome::Files(files) => done.push((at, files)),
            ended => return ended,
        }
    }
    done.sort_by_key(|(at, _)| *at);
    let done = done.into_iter().map(|(_, files)| files).collect();
    EntryOutcome::Files(EntryFiles::merge(index, done, listing))
}

/// A listing through the listing stack (pages through the retries, the cache, the byte
/// budget): the listing and its bytes held, or how the entry ends; `what` names the entry
/// field in messages, `hint` what a refusal (403, 404) means.
pub(super) async fn list<L: ListingService>(
    run: &MountRun<'_>,
    listings: L,
    request: vault::ListRequest,
    (what, hint): (&str, &str),
    span: &tracing::Span,
) -> Result<(vault::Listing, Option<Reservation>), EntryOutcome> {
    let described = request.describe();
    let identity = request.session.identity();
    let held = match listings.oneshot(Metered::new(request, &run.mount)).await {
        Ok(held) => held,
        Err(Refused::Failed(error)) => {
            let kind = vault_kind(&error);
            span.record("error.kind", kind.as_str());
            let refused = matches!(kind, ErrorKind::PermissionDenied | ErrorKind::NotFound);
            let hint = if refused { hint } else { "" };
            return Err(EntryOutcome::Stop(MountError::new(
                kind,
                format!(
                    "{what}: cannot list {described} as {identity}: {}{hint}",
                    chain(&error)
                ),
            )));
        }
        Err(Refused::Budget(refusal)) => {
            return Err(EntryOutcome::Stop(MountError::new(
                ErrorKind::ResourceExhausted,
                refusal.to_string(),
            )));
        }
        Err(Refused::MountOver) => return Err(EntryOutcome::Over(None)),
    };
    let (answer, reservation, over) = held.into_parts();
    if over {
        return Err(EntryOutcome::Over(None));
    }
    let (listing, lookup) = answer.into_parts();
    span.record("listing", lookup.as_str());
    Ok((listing, reservation))
}

/// One certificate entry: a fan-out permit, the Certificates call through the byte budget,
/// the private key through the gate of tenant keys, then its files; what happened goes into
/// `span`. Certificates do not fail over, and a failed one fails the mount.
pub(super) async fn certificate_entry<C: CertificateService>(
    run: &MountRun<'_>,
    certificates: C,
    spec: &CertificateSpec,
    call: vault::CertificateRequest,
    span: &tracing::Span,
) -> EntryOutcome {
    let _permit = run.permits.clone().acquire_owned().await;
    let held = match certificates.oneshot(Metered::new(call, &run.mount)).await {
        Ok(held) => held,
        Err(refused) => {
            let failed = |err: &vault::VaultError| {
                span.record("error.kind", vault_kind(err).as_str());
                crate::certificates::fetch_error(spec, err)
            };
            return EntryOutcome::Stop(refused_error(refused, failed, &run.mount));
        }
    };
    let (bundle, reservation, over) = held.into_parts();
    if let Some(id) = &bundle.opc_request_id {
        span.record("oci.request_id", id.as_str());
    }
    if over {
        return EntryOutcome::Stop(over_limit(
            &run.mount,
            &format!("secrets[{}] {} {}", spec.index, spec.kind.field(), spec.id),
        ));
    }
    let made = async {
        let key = crate::certificates::private_key(
            spec,
            &bundle,
            &run.config.tenant_keys,
            run.namespace,
            run.request.deadline,
        )
        .await?;
        crate::certificates::files(
            spec,
            &bundle,
            key.as_ref(),
            run.request.file_mode,
            &run.config.certificate_expiry,
            run.namespace,
        )
    };
    match made.await {
        Ok((files, version)) => EntryOutcome::Files(EntryFiles {
            index: spec.index,
            files,
            versions: vec![EntryVersion::Certificate(version)],
            reservations: reservation.into_iter().collect(),
            write: spec.write,
        }),
        Err(err) => EntryOutcome::Stop(err),
    }
}

/// The request of a secret entry to its primary region and, when the class and the entry
/// name one, to the failover region, both with the mount's deadline (the primary's is
/// halved when the entry starts: [`metered`]).
pub(super) fn secret_requests(
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
