//! Refusals remembered. An identity domain whose trust maps no rule to a service account, or
//! a proxymux that does not accept its token, refuses every attempt the same way, and each
//! attempt costs a TokenRequest, an RSA key and a call every tenant of the node shares. A
//! definite refusal (400, 401 or 403 for that subject; not `invalid_client`, which is about
//! the node's own client authentication and changes when it is renewed) is kept per
//! (namespace, service account) for `refusal_memory`, and the mounts of that identity fail
//! at once with it meanwhile. Transport failures, timeouts, 5xx and 429 are never kept.
//!
//! Bounded twice, so one namespace never evicts another's entries: at most
//! [`PER_NAMESPACE`] entries of one namespace (a new one replaces that namespace's soonest to
//! expire), at most [`MAX_ENTRIES`] in all (when every one is live, a new refusal is not
//! kept: that namespace is then only paced). An entry holds the refusal's names, status and
//! error code, never a token; it is served only to the same namespace and service account.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::error::{AuthError, Endpoint};

/// The most refusals one namespace keeps at once.
pub(super) const PER_NAMESPACE: usize = 16;
/// The most refusals kept at once, all namespaces together: an entry is a few hundred bytes,
/// at most 1.2 KiB with the longest names, so the table stays within 1.2 MiB.
pub(super) const MAX_ENTRIES: usize = 1024;
/// The longest namespace or service-account name kept: Kubernetes names are at most 253
/// bytes, so a longer one is no identity and its refusal is not kept.
pub(super) const MAX_NAME_BYTES: usize = 253;

/// The refusals of the node's workload exchanges, by namespace.
pub(super) struct Refusals {
    /// How long a refusal is kept; zero keeps none.
    memory: Duration,
    per_namespace: usize,
    max_entries: usize,
    table: std::sync::Mutex<Table>,
    remembered: AtomicU64,
    served: AtomicU64,
    unkept: AtomicU64,
}

#[derive(Default)]
struct Table {
    by_namespace: HashMap<String, Vec<Entry>>,
    /// Entries of every namespace.
    len: usize,
}

struct Entry {
    service_account: String,
    /// The refusal as it was answered: a `TokenExchange` or a proxymux `Status`, which hold
    /// names, a status, an error code and a checked description, never a token.
    refusal: Arc<AuthError>,
    until: SystemTime,
}

/// What the refusals did: kept, served to a mount instead of an exchange, not kept (no room).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RefusalCounts {
    pub(super) remembered: u64,
    pub(super) served: u64,
    pub(super) unkept: u64,
}

impl Refusals {
    pub(super) fn new(memory: Duration) -> Self {
        Self::with_bounds(memory, PER_NAMESPACE, MAX_ENTRIES)
    }

    fn with_bounds(memory: Duration, per_namespace: usize, max_entries: usize) -> Self {
        Self {
            memory,
            per_namespace,
            max_entries,
            table: std::sync::Mutex::new(Table::default()),
            remembered: AtomicU64::new(0),
            served: AtomicU64::new(0),
            unkept: AtomicU64::new(0),
        }
    }

    /// The refusal kept for exactly this namespace and service account, while it lasts.
    pub(super) fn check(
        &self,
        namespace: &str,
        service_account: &str,
        now: SystemTime,
    ) -> Result<(), AuthError> {
        if self.memory.is_zero() {
            return Ok(());
        }
        let mut table = super::lock(&self.table);
        let Some(entries) = table.by_namespace.get(namespace) else {
            return Ok(());
        };
        let Some(at) = entries
            .iter()
            .position(|e| e.service_account == service_account)
        else {
            return Ok(());
        };
        match entries[at].until.duration_since(now) {
            Ok(left) if !left.is_zero() => {
                self.served.fetch_add(1, Ordering::Relaxed);
                Err(AuthError::RefusalRemembered {
                    refusal: Arc::clone(&entries[at].refusal),
                    retry_in_secs: whole_seconds(left),
                })
            }
            _ => {
                table.remove(namespace, at);
                Ok(())
            }
        }
    }

    /// What an exchange's `error` becomes: a definite refusal is kept (and says so), anything
    /// else is answered as it is.
    pub(super) fn remember(
        &self,
        namespace: &str,
        service_account: &str,
        error: AuthError,
        now: SystemTime,
    ) -> AuthError {
        let long = namespace.len() > MAX_NAME_BYTES || service_account.len() > MAX_NAME_BYTES;
        if self.memory.is_zero() || long || !is_refusal(&error) {
            return error;
        }
        let refusal = Arc::new(error);
        let entry = Entry {
            service_account: service_account.to_owned(),
            refusal: Arc::clone(&refusal),
            until: now + self.memory,
        };
        let kept = super::lock(&self.table).insert(
            namespace,
            entry,
            now,
            (self.per_namespace, self.max_entries),
        );
        if !kept {
            self.unkept.fetch_add(1, Ordering::Relaxed);
            return AuthError::Shared(refusal);
        }
        self.remembered.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            namespace = %bounded::quote(namespace),
            service_account = %bounded::quote(service_account),
            memory_secs = self.memory.as_secs(),
            "a refused token exchange is remembered: the service account's mounts fail without \
             an exchange until it expires"
        );
        AuthError::RefusalRemembered {
            refusal,
            retry_in_secs: whole_seconds(self.memory),
        }
    }

    /// Drops the refusal of an identity that was just exchanged.
    pub(super) fn forget(&self, namespace: &str, service_account: &str) {
        let mut table = super::lock(&self.table);
        let at = table
            .by_namespace
            .get(namespace)
            .and_then(|es| es.iter().position(|e| e.service_account == service_account));
        if let Some(at) = at {
            table.remove(namespace, at);
        }
    }

    pub(super) fn counts(&self) -> RefusalCounts {
        RefusalCounts {
            remembered: self.remembered.load(Ordering::Relaxed),
            served: self.served.load(Ordering::Relaxed),
            unkept: self.unkept.load(Ordering::Relaxed),
        }
    }
}

impl Table {
    fn remove(&mut self, namespace: &str, at: usize) {
        if let Some(entries) = self.by_namespace.get_mut(namespace) {
            entries.swap_remove(at);
            self.len -= 1;
            if entries.is_empty() {
                self.by_namespace.remove(namespace);
            }
        }
    }

    /// Keeps `entry` for `namespace`: in place of its own entry for that service account,
    /// or of its own entry soonest to expire when it holds `per_namespace`; never in place of
    /// another namespace's live entry. Whether it was kept.
    fn insert(
        &mut self,
        namespace: &str,
        entry: Entry,
        now: SystemTime,
        (per_namespace, max_entries): (usize, usize),
    ) -> bool {
        if let Some(entries) = self.by_namespace.get_mut(namespace) {
            let before = entries.len();
            entries.retain(|e| e.until > now && e.service_account != entry.service_account);
            if entries.len() >= per_namespace
                && let Some(soonest) = (0..entries.len()).min_by_key(|&i| entries[i].until)
            {
                entries.swap_remove(soonest);
            }
            self.len -= before - entries.len();
        }
        if self.len >= max_entries {
            self.purge(now);
        }
        if self.len >= max_entries {
            return false;
        }
        self.by_namespace
            .entry(namespace.to_owned())
            .or_default()
            .push(entry);
        self.len += 1;
        true
    }

    /// Drops every expired entry.
    fn purge(&mut self, now: SystemTime) {
        self.by_namespace.retain(|_, entries| {
            entries.retain(|e| e.until > now);
            !entries.is_empty()
        });
        self.len = self.by_namespace.values().map(Vec::len).sum();
    }
}

/// Whether `error` is a definite refusal of the subject by the identity domain or the
/// proxymux: an answer of 400, 401 or 403 (the same request would be refused again), except
/// the domain's `invalid_client` (the node's client authentication, renewed or read again by
/// the next exchange).
fn is_refusal(error: &AuthError) -> bool {
    match error {
        AuthError::TokenExchange {
            status: 400 | 401 | 403,
            error,
            ..
        } => error.as_deref() != Some("invalid_client"),
        AuthError::Status {
            endpoint: Endpoint::Proxymux,
            status: 400 | 401 | 403,
            ..
        } => true,
        AuthError::Shared(shared) => is_refusal(shared),
        _ => false,
    }
}

/// `duration` in whole seconds, rounded up (a mount is never told "0 s").
fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn refused(namespace: &str, service_account: &str, status: u16, error: &str) -> AuthError {
        AuthError::TokenExchange {
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            status,
            error: Some(error.to_owned()),
            description: None,
        }
    }

    #[test]
    fn only_definite_refusals_of_the_subject_are_kept() {
        let refusals = Refusals::new(Duration::from_secs(60));
        for (status, error, kept) in [
            (400, "invalid_grant", true),
            (401, "invalid_grant", true),
            (403, "NotAuthorized", true),
            (400, "invalid_request", true),
            (401, "invalid_client", false),
            (429, "TooManyRequests", false),
            (503, "ServiceUnavailable", false),
            (404, "NotFound", false),
        ] {
            let error = refusals.remember("ns", "sa", refused("ns", "sa", status, error), at(0));
            let remembered = matches!(error, AuthError::RefusalRemembered { .. });
            assert_eq!(remembered, kept, "{status} {error}");
            assert_eq!(refusals.check("ns", "sa", at(1)).is_err(), kept, "{status}");
            refusals.forget("ns", "sa");
        }
        let transport = AuthError::DeadlineExceeded("exchanging");
        let error = refusals.remember("ns", "sa", transport, at(0));
        assert!(matches!(error, AuthError::DeadlineExceeded(_)));
        assert!(refusals.check("ns", "sa", at(1)).is_ok());
    }

    #[test]
    fn a_refusal_is_served_to_its_own_identity_only_until_it_expires() {
        let refusals = Refusals::new(Duration::from_secs(60));
        refusals.remember(
            "a",
            "web",
            refused("a", "web", 400, "invalid_grant"),
            at(100),
        );
        let served = refusals.check("a", "web", at(130)).unwrap_err();
        assert!(
            served.to_string().contains("tried again in 30s"),
            "{served}"
        );
        assert_eq!(served.kind(), crate::ErrorKind::Unauthenticated);
        assert!(refusals.check("b", "web", at(130)).is_ok());
        assert!(refusals.check("a", "api", at(130)).is_ok());
        assert!(refusals.check("a", "web", at(160)).is_ok(), "expired");
        assert!(refusals.check("a", "web", at(130)).is_ok(), "and dropped");
        assert_eq!(
            refusals.counts(),
            RefusalCounts {
                remembered: 1,
                served: 1,
                unkept: 0
            }
        );
    }

    #[test]
    fn a_namespace_flooding_refusals_evicts_only_its_own() {
        let refusals = Refusals::with_bounds(Duration::from_secs(60), 4, 8);
        refusals.remember(
            "b",
            "kept",
            refused("b", "kept", 400, "invalid_grant"),
            at(0),
        );
        for i in 0..100 {
            let sa = format!("sa-{i}");
            refusals.remember("a", &sa, refused("a", &sa, 400, "invalid_grant"), at(1));
        }
        assert!(refusals.check("b", "kept", at(2)).is_err());
        assert!(refusals.check("a", "sa-99", at(2)).is_err());
        assert!(
            refusals.check("a", "sa-0", at(2)).is_ok(),
            "its own evicted"
        );
        let table = super::super::lock(&refusals.table);
        assert_eq!(table.len, 5);
        assert_eq!(table.by_namespace["a"].len(), 4);
    }

    #[test]
    fn a_full_table_keeps_no_new_refusal_rather_than_evict_another_namespaces() {
        let refusals = Refusals::with_bounds(Duration::from_secs(60), 2, 4);
        for ns in ["a", "b"] {
            for sa in ["x", "y"] {
                refusals.remember(ns, sa, refused(ns, sa, 400, "invalid_grant"), at(0));
            }
        }
        let error = refusals.remember("c", "x", refused("c", "x", 400, "invalid_grant"), at(1));
        assert!(matches!(error, AuthError::Shared(_)), "{error:?}");
        assert!(refusals.check("c", "x", at(2)).is_ok());
        assert!(refusals.check("a", "x", at(2)).is_err());
        assert_eq!(refusals.counts().unkept, 1);
        // Once the others expire there is room again.
        refusals.remember("c", "x", refused("c", "x", 400, "invalid_grant"), at(61));
        assert!(refusals.check("c", "x", at(62)).is_err());
    }

    #[test]
    fn names_no_kubernetes_object_can_have_are_not_kept() {
        let refusals = Refusals::new(Duration::from_secs(60));
        let long = "n".repeat(MAX_NAME_BYTES + 1);
        refusals.remember(
            &long,
            "sa",
            refused(&long, "sa", 400, "invalid_grant"),
            at(0),
        );
        assert!(refusals.check(&long, "sa", at(1)).is_ok());
        let off = Refusals::new(Duration::ZERO);
        off.remember("a", "sa", refused("a", "sa", 400, "invalid_grant"), at(0));
        assert!(off.check("a", "sa", at(0)).is_ok());
    }
}
