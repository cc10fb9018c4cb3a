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

/// Hosts whose counters are kept; past it, hosts with no connection open are forgotten
/// (their counters restart if they come back), so the map and the metrics' `host` labels
/// stay bounded whatever hosts are asked for.
const MAX_TRACKED_HOSTS: usize = 64;

fn entry<'a>(hosts: &'a mut BTreeMap<String, HostStats>, authority: &str) -> &'a mut HostStats {
    if !hosts.contains_key(authority) && hosts.len() >= MAX_TRACKED_HOSTS {
        hosts.retain(|_, h| h.open > 0);
    }
    hosts.entry(authority.to_owned()).or_default()
}

impl Stats {
    pub(crate) fn opened(&self, authority: &str) -> OpenGuard {
        let mut hosts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let host = entry(&mut hosts, authority);
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
        entry(&mut hosts, authority).requests += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_stay_bounded_and_open_connections_are_never_forgotten() {
        let stats = Stats::default();
        let open = stats.opened("busy:443");
        for i in 0..1000 {
            stats.request(&format!("host-{i}:443"));
        }
        let snapshot = stats.snapshot();
        assert!(snapshot.len() <= MAX_TRACKED_HOSTS, "{}", snapshot.len());
        assert_eq!(snapshot["busy:443"].open, 1);
        drop(open);
        assert_eq!(stats.snapshot()["busy:443"].closed, 1);
    }
}

/// How one exchange ended, as an [`ExchangeObserver`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A response with this status arrived (its body read whole).
    Status(u16),
    /// No usable response: the error's kind.
    Failed(crate::ErrorKind),
}

/// Sees every exchange of the transport: which host, how it ended, how long it took
/// (from the request permit to the last body byte or the error). For metrics; never given
/// a header or a body.
pub trait ExchangeObserver: Send + Sync + std::fmt::Debug + 'static {
    /// One exchange ended.
    fn exchanged(&self, authority: &str, outcome: Outcome, elapsed: std::time::Duration);
}
