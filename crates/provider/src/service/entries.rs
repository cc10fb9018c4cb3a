//! One entry of a mount, whatever its kind, from its request to its files: a fan-out
//! permit, the fetch through the byte budget (and the failover region, for secrets), then
//! the entry's files and object version. The fan-out (`fanout.rs`) runs every entry of a
//! mount at once through these.

use std::sync::Arc;

use csi_grpc::{ErrorKind, File, FilePath, MountError, MountRequest, ObjectVersion};
use tokio::sync::Semaphore;
use tower::ServiceExt;

use super::contract::{BundleResponse, MountContext, SecretsService};
use super::failure::{over_limit, refused_error, vault_kind};
use super::files::secret_files;
use super::targets::{Target, Targets};
use crate::budget::{Metered, MountBytes, Refused, Reservation};
use crate::certificates::CertificateService;
use crate::failover::WithFailover;
use crate::params::{CertificateSpec, SecretSource, SecretSpec, VersionSelector};

/// What every entry of one mount shares while it runs.
pub(super) struct MountRun<'a> {
    pub(super) config: &'a MountContext,
    pub(super) request: &'a MountRequest,
    pub(super) namespace: &'a str,
    /// The mount's running total and size limit.
    pub(super) mount: Arc<MountBytes>,
    /// Entries fetched at once (`MountContext::fan_out`).
    pub(super) permits: Arc<Semaphore>,
}

/// What an entry gives the mount: its files, what its object version is made of, and the
/// bytes its answer holds in the budget until the mount is answered.
pub(super) struct EntryFiles {
    /// The entry's position in the class's list.
    pub(super) index: usize,
    pub(super) files: Vec<File>,
    pub(super) version: EntryVersion,
    pub(super) reservation: Option<Reservation>,
    /// Whether its files are written (`writeFile`); `false`: read by templates only.
    pub(super) write: bool,
}

/// An entry's object version: a secret's is settled with the mount's other secrets (one
/// OCID mounted twice carries its path), a certificate's is its own.
pub(super) enum EntryVersion {
    Secret {
        /// The entry's file (a secret mounted twice is told apart by it).
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
    /// The secret could not be read: the mount's message lists every such entry.
    Failed(vault::VaultError),
    /// The mount passed its size limit (with this entry's bytes, when it was fetched).
    Over(Option<(FilePath, usize)>),
    /// Fails the mount now: the budget refused it, its content could not be used, or a
    /// certificate entry failed.
    Stop(MountError),
}

/// One secret entry: a fan-out permit, the Secrets fetch stack (its primary region, its
/// failover region if the primary fails over, within the byte bounds), its files; what
/// happened goes into `span`.
pub(super) async fn secret_entry<V: SecretsService>(
    run: &MountRun<'_>,
    secrets: V,
    spec: &SecretSpec,
    (mut primary, failover): (vault::SecretRequest, Option<(String, vault::SecretRequest)>),
    span: &tracing::Span,
) -> EntryOutcome {
    let _permit = run.permits.clone().acquire_owned().await;
    // With a failover, the primary gets half of the time left now that the entry starts
    // (not when the mount began: a large mount's later entries wait for the fan-out), so
    // that the failover has time to answer.
    if failover.is_some() {
        let now = tokio::time::Instant::now();
        primary.deadline = now + primary.deadline.saturating_duration_since(now) / 2;
    }
    let request = WithFailover {
        primary: Metered::new(primary, &run.mount),
        failover: failover.map(|(region, again)| (region, Metered::new(again, &run.mount))),
    };
    let (held, _served) = match secrets.oneshot(request).await {
        Ok(answer) => answer,
        Err(Refused::Budget(refusal)) => {
            return EntryOutcome::Stop(MountError::new(
                ErrorKind::ResourceExhausted,
                refusal.to_string(),
            ));
        }
        Err(Refused::MountOver) => return EntryOutcome::Over(None),
        Err(Refused::Failed(err)) => {
            span.record("error.kind", vault_kind(&err).as_str());
            if let Some(id) = err.opc_request_id() {
                span.record("oci.request_id", id);
            }
            return EntryOutcome::Failed(err);
        }
    };
    let (answer, reservation, over) = held.into_parts();
    let (bundle, lookup) = answer.into_parts();
    span.record("lookup", lookup.as_str());
    if let Some(id) = &bundle.opc_request_id {
        span.record("oci.request_id", id.as_str());
    }
    let fetched = bundle.content.len();
    if over {
        return EntryOutcome::Over(Some((spec.path.clone(), fetched)));
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
            version: EntryVersion::Secret {
                path: spec.path.clone(),
                secret_id,
                version: version_number,
                lookup,
                fetched,
            },
            reservation,
            write: spec.write,
        }),
        Err(err) => EntryOutcome::Stop(err),
    }
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
        return EntryOutcome::Stop(over_limit(&run.mount, spec));
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
            version: EntryVersion::Certificate(version),
            reservation,
            write: spec.write,
        }),
        Err(err) => EntryOutcome::Stop(err),
    }
}

/// The request of a secret entry to its primary region and, when the class and the entry
/// name one, to the failover region, both with the mount's deadline (the primary's is
/// halved when the entry starts: [`secret_entry`]).
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
