//! What the retries did: retries by reason, and calls that failed after theirs.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::VaultError;

/// Retries made by a [`crate::RetryLayer`]'s services, by reason, and the calls that failed
/// after their retries, by the reason of the last failure.
#[derive(Debug, Default)]
pub struct Retries {
    counts: [AtomicU64; RetryReason::ALL.len()],
    gave_up: [AtomicU64; RetryReason::ALL.len()],
}

/// Why an attempt was retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// 429 TooManyRequests.
    Throttled,
    /// 500, 502, 503, 504 (and 501 unless `MethodNotImplemented`).
    ServerError,
    /// 409 `IncorrectState`.
    Conflict,
    /// No connection could be made.
    Connect,
    /// The exchange timed out.
    Timeout,
    /// The connection broke mid-exchange.
    Io,
    /// A token exchange failed transiently (proxymux or federation unavailable).
    Credentials,
}

impl RetryReason {
    /// Every reason, in a fixed order.
    pub const ALL: [RetryReason; 7] = [
        RetryReason::Throttled,
        RetryReason::ServerError,
        RetryReason::Conflict,
        RetryReason::Connect,
        RetryReason::Timeout,
        RetryReason::Io,
        RetryReason::Credentials,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Throttled => "throttled",
            RetryReason::ServerError => "server_error",
            RetryReason::Conflict => "conflict",
            RetryReason::Connect => "connect",
            RetryReason::Timeout => "timeout",
            RetryReason::Io => "io",
            RetryReason::Credentials => "credentials",
        }
    }

    pub(crate) fn of(error: &VaultError) -> Self {
        match error {
            VaultError::Status { oci, .. } if oci.status == 429 => RetryReason::Throttled,
            VaultError::Status { oci, .. } if oci.status == 409 => RetryReason::Conflict,
            VaultError::Status { .. } => RetryReason::ServerError,
            VaultError::Transport { source, .. } => match source.kind() {
                transport::ErrorKind::Connect => RetryReason::Connect,
                transport::ErrorKind::Timeout => RetryReason::Timeout,
                _ => RetryReason::Io,
            },
            _ => RetryReason::Credentials,
        }
    }
}

impl Retries {
    /// Retries so far, by reason.
    pub fn snapshot(&self) -> Vec<(RetryReason, u64)> {
        Self::read(&self.counts)
    }

    /// Calls that failed after retrying, by the reason of their last failure: `throttled`
    /// is a 429 the retries did not outlast.
    pub fn gave_up_snapshot(&self) -> Vec<(RetryReason, u64)> {
        Self::read(&self.gave_up)
    }

    fn read(counts: &[AtomicU64; RetryReason::ALL.len()]) -> Vec<(RetryReason, u64)> {
        RetryReason::ALL
            .iter()
            .zip(counts)
            .map(|(reason, n)| (*reason, n.load(Ordering::Relaxed)))
            .collect()
    }

    pub(crate) fn count(&self, reason: RetryReason) {
        Self::add(&self.counts, reason);
    }

    pub(crate) fn count_gave_up(&self, reason: RetryReason) {
        Self::add(&self.gave_up, reason);
    }

    fn add(counts: &[AtomicU64; RetryReason::ALL.len()], reason: RetryReason) {
        if let Some(i) = RetryReason::ALL.iter().position(|r| *r == reason) {
            counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}
