//! What a failed mount says: one status by precedence, and a message that lists each
//! failed entry with its cause, capped, most actionable first. A leaf module: the entries,
//! the layers and the service report through it, it imports none of them.

use csi_grpc::{ErrorKind, FilePath, MountError};

use crate::layers::budget::{MountBytes, Refused};

/// A secret that could not be read: its entry, how messages name it, and why.
pub(crate) struct Failure {
    pub(crate) index: usize,
    pub(crate) shown: String,
    pub(crate) error: vault::VaultError,
}

/// A fetch that did not run within the bounds, or failed (`failed` names it).
pub(crate) fn refused_error(
    refused: Refused<vault::VaultError>,
    failed: impl FnOnce(&vault::VaultError) -> MountError,
    mount: &MountBytes,
) -> MountError {
    match refused {
        Refused::Failed(err) => failed(&err),
        Refused::Budget(refusal) => {
            MountError::new(ErrorKind::ResourceExhausted, refusal.to_string())
        }
        Refused::MountOver => MountError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "the mounted files would take more than {} bytes (the driver refuses answers \
                 above 4 MiB): {} bytes fetched so far",
                mount.limit(),
                mount.total()
            ),
        ),
    }
}

/// An entry (`shown`: `secrets[i] certificateId <ocid>`) brought the mount past its size
/// limit.
pub(crate) fn over_limit(mount: &MountBytes, shown: &str) -> MountError {
    MountError::new(
        ErrorKind::ResourceExhausted,
        format!(
            "the mounted files would take more than {} bytes (the driver refuses answers above \
             4 MiB): {} bytes fetched so far, {shown} the last",
            mount.limit(),
            mount.total(),
        ),
    )
}

/// The mount passed `max_total_bytes` while its secrets arrived: the sizes of those that
/// did, `(entry, file, bytes)`, largest first.
pub(crate) fn too_large(
    fetched: &[(usize, FilePath, usize)],
    max_total_bytes: usize,
) -> MountError {
    let mut sizes: Vec<&(usize, FilePath, usize)> = fetched.iter().collect();
    sizes.sort_by_key(|(index, _, size)| (std::cmp::Reverse(*size), *index));
    let total: usize = sizes.iter().map(|(_, _, s)| s).sum();
    let listed: Vec<String> = sizes
        .iter()
        .take(20)
        .map(|(index, path, size)| format!("secrets[{index}] {path} ({size} bytes)"))
        .collect();
    let more = sizes.len().saturating_sub(listed.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    MountError::new(
        ErrorKind::ResourceExhausted,
        format!(
            "the mounted files would take more than {max_total_bytes} bytes (the driver refuses \
             answers above 4 MiB): {total} bytes from the {} secrets fetched so far: {}{more}",
            sizes.len(),
            listed.join(", ")
        ),
    )
}

pub(crate) fn auth_error(err: auth::AuthError) -> MountError {
    MountError::new(
        grpc_kind(err.kind()),
        format!("unable to establish the OCI identity: {}", chain(&err)),
    )
}

pub(crate) fn vault_kind(err: &vault::VaultError) -> ErrorKind {
    grpc_kind(err.kind())
}

/// The one mapping from the kind below the gRPC edge (auth's, which vault shares) to the
/// gRPC code.
pub(crate) fn grpc_kind(kind: auth::ErrorKind) -> ErrorKind {
    match kind {
        auth::ErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
        auth::ErrorKind::NotFound => ErrorKind::NotFound,
        auth::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
        auth::ErrorKind::Unauthenticated => ErrorKind::Unauthenticated,
        auth::ErrorKind::ResourceExhausted => ErrorKind::ResourceExhausted,
        auth::ErrorKind::Unavailable => ErrorKind::Unavailable,
        auth::ErrorKind::DeadlineExceeded => ErrorKind::DeadlineExceeded,
        // Kinds added to auth later are bugs until mapped here.
        _ => ErrorKind::Internal,
    }
}

/// Which code a mount with several failures answers: the one that most needs a person.
pub(crate) const PRECEDENCE: [ErrorKind; 8] = [
    ErrorKind::InvalidArgument,
    ErrorKind::Unauthenticated,
    ErrorKind::PermissionDenied,
    ErrorKind::NotFound,
    ErrorKind::ResourceExhausted,
    ErrorKind::Unavailable,
    ErrorKind::DeadlineExceeded,
    ErrorKind::Internal,
];

pub(crate) fn rank(kind: ErrorKind) -> usize {
    PRECEDENCE
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(PRECEDENCE.len())
}

/// An error and its causes on one line (each `Display` prints its own level only).
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    vault::ErrorChain(err).to_string()
}

/// The longest failure message: it ends up in a pod event, and the driver logs it whole.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4096;

/// The secrets that failed, as one error: the most actionable status, each with its entry
/// and cause (at most [`MAX_MESSAGE_BYTES`]); "n of m" counts entries (`of`: the entries
/// that read secrets; a version history or a selection is one, however many of its secrets
/// failed).
pub(crate) fn combine(
    of: usize,
    mut failures: Vec<Failure>,
    abandoned: usize,
    identity: &auth::Identity,
) -> MountError {
    // The most actionable failures first, then in request order.
    failures.sort_by_key(|f| (rank(vault_kind(&f.error)), f.index));
    let kind = failures
        .first()
        .map(|f| vault_kind(&f.error))
        .unwrap_or(ErrorKind::Internal);
    let entries: std::collections::BTreeSet<usize> = failures.iter().map(|f| f.index).collect();
    let mut message = format!(
        "unable to retrieve secrets as {identity}: {} of {} failed: ",
        entries.len(),
        of,
    );
    let mut tail = String::new();
    if abandoned > 0 {
        tail = format!(" ({abandoned} not fetched after a permanent failure)");
    }
    // Room for "; ... and N more" and the tail.
    let budget = MAX_MESSAGE_BYTES.saturating_sub(tail.len() + 32);
    let mut listed = 0;
    for failure in &failures {
        let cause = format!(
            "secrets[{}] {}: {}",
            failure.index,
            bounded::quote(&failure.shown),
            chain(&failure.error)
        );
        let separator = if listed == 0 { "" } else { "; " };
        if message.len() + separator.len() + cause.len() > budget {
            if listed == 0 {
                // Even one cause is too long: keep its start.
                let room = budget.saturating_sub(message.len());
                message.push_str(truncate_at_char(&cause, room));
                listed = 1;
            }
            break;
        }
        message.push_str(separator);
        message.push_str(&cause);
        listed += 1;
    }
    if listed < failures.len() {
        message.push_str(&format!("; ... and {} more", failures.len() - listed));
    }
    message.push_str(&tail);
    MountError::new(kind, message)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub(crate) fn truncate_at_char(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
