//! What every entry kind shares while a mount runs, below them all: the mount's run
//! ([`MountRun`]), what an entry gives the mount ([`EntryFiles`], [`EntryVersion`]) and how
//! it ends ([`EntryOutcome`]), and the steps several kinds take (a listing through the
//! listing stack, the parts of an entry gathered).

use std::sync::Arc;

use csi_grpc::{ErrorKind, File, FilePath, MountError, MountRequest, ObjectVersion};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::budget::Reservation;
use crate::contract::{ListingResponse, ListingService, MountContext};
use crate::endpoints::RegionEndpoints;
use crate::failure::{Failure, chain, vault_kind};
use crate::layers::budget::{Metered, MountBytes, Refused};
use crate::layers::failover::ServedBy;

/// An entry running.
pub(crate) type Running<'a> = BoxFuture<'a, EntryOutcome>;

/// An entry not yet started: what it needs is borrowed, so an entry waiting its turn holds
/// a pointer's worth of memory, not a request, a service and a future (a list of hundreds
/// of small entries would otherwise hold them all at once).
pub(crate) type Start<'a> = Box<dyn FnOnce() -> Running<'a> + Send + 'a>;

/// The fetch services of a mount: secrets, certificates, listings.
pub(crate) type Services<'s, V, C, L> = (&'s V, &'s C, &'s L);

/// What every entry of one mount shares while it runs.
pub(crate) struct MountRun<'a> {
    pub(crate) config: &'a MountContext,
    pub(crate) request: &'a MountRequest,
    pub(crate) namespace: &'a str,
    /// The mount's running total and size limit.
    pub(crate) mount: Arc<MountBytes>,
    /// Fetches made at once (`MountContext::fan_out`).
    pub(crate) permits: Arc<Semaphore>,
    /// The listing pages the mount may still send upstream, over all its listings
    /// (`MountContext::max_listing_pages`).
    pub(crate) pages: vault::Pages,
}

/// What an entry gives the mount: its files, what their object versions are made of, and
/// the bytes its answers hold in the budget until the mount is answered.
pub(crate) struct EntryFiles {
    /// The entry's position in the class's list.
    pub(crate) index: usize,
    pub(crate) files: Vec<File>,
    /// One per fetch: a version history or a selection has several.
    pub(crate) versions: Vec<EntryVersion>,
    pub(crate) reservations: Vec<Reservation>,
    /// Whether its files are written (`writeFile`); `false`: read by templates only.
    pub(crate) write: bool,
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
pub(crate) enum EntryVersion {
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
pub(crate) enum EntryOutcome {
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
pub(crate) struct Fetched {
    pub(crate) bundle: vault::SecretBundle,
    pub(crate) lookup: cache::Lookup,
    pub(crate) reservation: Option<Reservation>,
    /// The region that served it.
    pub(crate) served: ServedBy,
    /// It brought the mount past its size limit.
    pub(crate) over: bool,
}

/// The outcomes of an entry's fetches, as they arrive: their files as the entry's, in the
/// order of `parts` (with the listing's bytes), or the first outcome that is not files (the
/// rest are dropped, so cancelled).
pub(crate) async fn gather_parts<'a>(
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
pub(crate) async fn list<L: ListingService>(
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

/// Where a mount's calls go.
pub(crate) struct Targets {
    /// The primary region: every Secrets call first, and every Certificates call
    /// (certificate entries do not fail over).
    pub(crate) primary: Target,
    /// The failover region, if the class names one.
    pub(crate) failover: Option<Target>,
}

/// One region's endpoints and the mount's session for requests to them.
pub(crate) struct Target {
    pub(crate) endpoints: std::sync::Arc<RegionEndpoints>,
    /// The established session told the region its requests go to: the region is decided
    /// here, where the URL is, not by the signing layer from a host (the operator's
    /// overrides may map regions to any host). A 401 from a region the class named, other
    /// than the principal's own, then fails that request and leaves the credential every
    /// other mount shares alone (`auth::Session::toward`).
    pub(crate) session: auth::Session,
}
