//! A `tag` / `namePrefix` entry: the active secrets of a vault listed (the Vault API's
//! ListSecrets, every page, cached per credential like a bundle: one listing per vault,
//! however many entries select from it, joined while in flight), filtered here, at most the
//! files the mount may still write, then each selected secret read as a `name` entry, at
//! once, each under its own fan-out permit and through the byte budget.

use std::sync::atomic::{AtomicUsize, Ordering};

use bounded::quote;
use csi_grpc::{ErrorKind, MountError};
use futures_util::FutureExt as _;

use super::entries::{EntryOutcome, MountRun, gather_parts, list, secret_entry, secret_requests};
use super::targets::Targets;
use crate::contract::{ListingService, SecretsService};
use crate::params::{SecretSource, SecretSpec, SelectionSpec, Stage, VersionSelector};

/// One selection entry, taking what it selects from `room` (the files the mount's
/// selections may still write besides its other entries') before it fetches anything; what
/// happened goes into `span`.
pub(super) async fn selection_entry<V: SecretsService, L: ListingService>(
    run: &MountRun<'_>,
    (secrets, listings): (V, L),
    spec: &SelectionSpec,
    (targets, room): (&Targets, &AtomicUsize),
    span: &tracing::Span,
) -> EntryOutcome {
    let index = spec.index;
    let permit = run.permits.clone().acquire_owned().await;
    let target = &targets.primary;
    let Some(base_url) = target.endpoints.vaults.clone() else {
        return EntryOutcome::Stop(MountError::invalid_argument(format!(
            "secrets[{index}].{}: no Vault API endpoint to list secrets: the principal's \
             region is not known and the provider's [endpoints] vaults is not set",
            spec.describe()
        )));
    };
    let request = vault::ListRequest {
        base_url,
        session: target.session.clone(),
        kind: vault::ListKind::Secrets {
            compartment_id: spec.compartment_id.clone(),
            vault_id: spec.vault_id.clone(),
        },
        deadline: run.request.deadline,
        // `Budget` puts its hook in when it passes the request on.
        backoff: vault::Backoff::none(),
        pages: run.pages.clone(),
    };
    let what = format!("secrets[{index}].{}", spec.describe());
    let hint = policy_hint(&spec.compartment_id);
    let (listing, held) = match list(run, listings, request, (&what, &hint), span).await {
        Ok(listed) => listed,
        Err(ended) => return ended,
    };
    drop(permit);
    if let Some(stopped) = listing.stopped {
        return EntryOutcome::Stop(stopped_early(spec, stopped));
    }
    let selected: Vec<&vault::ListedSecret> = listing
        .secrets
        .iter()
        .filter(|secret| spec.filter.matches(&secret.name, &secret.tags))
        .collect();
    let taken = room.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
        left.checked_sub(selected.len())
    });
    if let Err(left) = taken {
        return EntryOutcome::Stop(too_many(run, spec, left));
    }
    if selected.is_empty() {
        // As a `name` entry whose secret does not exist: most likely a mistyped tag.
        return EntryOutcome::Stop(MountError::new(
            ErrorKind::NotFound,
            format!(
                "{what} selects no ACTIVE secret of vault {} in compartment {}",
                spec.vault_id, spec.compartment_id
            ),
        ));
    }
    let entries: Result<Vec<SecretSpec>, MountError> = selected
        .iter()
        .map(|secret| name_entry(spec, &secret.name))
        .collect();
    let entries = match entries {
        Ok(entries) => entries,
        Err(err) => return EntryOutcome::Stop(err),
    };
    let deadline = run.request.deadline;
    let parts = entries.iter().map(|entry| {
        let requests = secret_requests(entry, targets, deadline);
        secret_entry(run, secrets.clone(), entry, requests, span).boxed()
    });
    gather_parts(index, parts, held).await
}

/// A selected secret as the `name` entry it is read as: its `CURRENT` version, written
/// whole to `directory/<its name>`, never failing over (its listing did not).
fn name_entry(spec: &SelectionSpec, name: &str) -> Result<SecretSpec, MountError> {
    let path = spec.path_of(name).map_err(|e| {
        MountError::invalid_argument(format!(
            "secrets[{}].{} selected secret {}, which cannot be a file name: {e}",
            spec.index,
            spec.describe(),
            quote(name)
        ))
    })?;
    Ok(SecretSpec {
        index: spec.index,
        source: SecretSource::Name {
            name: name.to_owned(),
            vault_id: spec.vault_id.clone(),
        },
        selector: VersionSelector::Stage(Stage::Current),
        path,
        mode: spec.mode,
        encoding: spec.encoding,
        keys: Vec::new(),
        format: None,
        whole: true,
        history: Vec::new(),
        failover: None,
        write: true,
    })
}

/// The policy statement a refused ListSecrets needs (its subject depends on who the
/// principal is, which the operator knows).
fn policy_hint(compartment: &str) -> String {
    format!(
        "; listing a vault's secrets needs the IAM policy statement \"Allow <the principal's \
         group or dynamic-group> to inspect secrets in compartment id {compartment}\" besides \
         \"read secret-bundles\" (and the compartment must hold the vault)"
    )
}

/// More secrets selected than the mount may still write.
fn too_many(run: &MountRun<'_>, spec: &SelectionSpec, room: usize) -> MountError {
    MountError::invalid_argument(format!(
        "secrets[{}].{} selects more than {room} secrets of vault {}, the files this mount may \
         still write (server.max_files_per_mount is {}); narrow the selection or split it over \
         several SecretProviderClasses",
        spec.index,
        spec.describe(),
        spec.vault_id,
        run.config.max_files
    ))
}

/// The listing stopped before its end: a vault too large to list.
fn stopped_early(spec: &SelectionSpec, stopped: vault::ListStop) -> MountError {
    let index = spec.index;
    let selection = spec.describe();
    match stopped {
        vault::ListStop::TooManyPages => MountError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "secrets[{index}].{selection}: vault {} has more than {} secrets in \
                 compartment {}; the listing stopped there: select from a smaller vault",
                spec.vault_id,
                vault::MAX_PAGES as usize * vault::SECRETS_PAGE_LIMIT,
                spec.compartment_id
            ),
        ),
    }
}
