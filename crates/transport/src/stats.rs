use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Connection counters of one host (`host:port`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Connections open now.
    pub open: u64,
    /// Connections ever opened.
    pub opened: u64,
    /// Connections closed.
    pub closed: u64,
    /// Most connections open at once.
    pub high_water: u64,
    /// Requests sent (each attempt counts).
    pub requests: u64,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Stats(Arc<Mutex<BTreeMap<String, HostStats>>>);

impl Stats {
    pub(crate) fn opened(&self, authority: &str) -> OpenGuard {
        let mut hosts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let host = hosts.entry(authority.to_owned()).or_default();
        host.open += 1;
        host.opened += 1;
        host.high_water = host.high_water.max(host.open);
        OpenGuard {
            stats: self.clone(),
            authority: authority.to_owned(),
        }
    }

    pub(crate) fn request(&self, authority: &str) {
        let mut hosts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        hosts.entry(authority.to_owned()).or_default().requests += 1;
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<String, HostStats> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Counts a connection as open until dropped.
#[derive(Debug)]
pub(crate) struct OpenGuard {
    stats: Stats,
    authority: String,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let mut hosts = self.stats.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(host) = hosts.get_mut(&self.authority) {
            host.open = host.open.saturating_sub(1);
            host.closed += 1;
        }
    }
}
