//! Counters that tests read and wait on.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::seed::WorkloadRef;

/// The endpoints (one listener each) the emulator serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Endpoint {
    /// OCI Secrets retrieval API (HTTPS).
    Secrets,
    /// OCI Auth service x509 federation (HTTPS).
    Auth,
    /// OKE proxymux workload-identity token exchange (HTTPS).
    Proxymux,
    /// Kubernetes API server subset (HTTPS).
    Kube,
    /// Instance metadata service v2 (plain HTTP).
    Imds,
    /// OCI Certificates retrieval API (HTTPS).
    Certificates,
    /// An OCI identity domain's OAuth token endpoint: workload identity federation (HTTPS).
    IdentityDomain,
    /// OCI Vault (secret management) API: ListSecrets (HTTPS).
    Vaults,
}

impl Endpoint {
    /// All endpoints.
    pub const ALL: [Endpoint; 8] = [
        Endpoint::Secrets,
        Endpoint::Auth,
        Endpoint::Proxymux,
        Endpoint::Kube,
        Endpoint::Imds,
        Endpoint::Certificates,
        Endpoint::IdentityDomain,
        Endpoint::Vaults,
    ];

    /// Whether this endpoint is served over TLS.
    pub fn is_tls(self) -> bool {
        self != Endpoint::Imds
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Endpoint::Secrets => "secrets",
            Endpoint::Auth => "auth",
            Endpoint::Proxymux => "proxymux",
            Endpoint::Kube => "kube",
            Endpoint::Imds => "imds",
            Endpoint::Certificates => "certificates",
            Endpoint::IdentityDomain => "identity_domain",
            Endpoint::Vaults => "vaults",
        })
    }
}

/// Connection counters of one listener.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ListenerStats {
    /// TCP connections accepted since start.
    pub accepted: u64,
    /// TCP connections open now (accepted and not yet closed by either side).
    pub open: u64,
    /// Highest value `open` has reached.
    pub high_water: u64,
    /// TLS handshakes completed.
    pub tls_handshakes: u64,
    /// TLS handshakes that failed.
    pub tls_handshake_failures: u64,
    /// Connections that negotiated HTTP/2.
    pub http2_connections: u64,
    /// Connections the emulator closed because they stayed idle too long.
    pub idle_closed: u64,
}

/// A point-in-time copy of every counter.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    /// Per listener connection counters.
    pub listeners: BTreeMap<Endpoint, ListenerStats>,
    /// Requests that arrived, per endpoint (counted before any fault or handler runs).
    pub arrived: BTreeMap<Endpoint, u64>,
    /// Requests answered, per endpoint and HTTP status.
    pub responses: BTreeMap<Endpoint, BTreeMap<u16, u64>>,
    /// Requests currently held by a gate or a stall fault, per endpoint.
    pub held: BTreeMap<Endpoint, u64>,
    /// Successful proxymux exchanges per workload.
    pub proxymux_exchanges: BTreeMap<WorkloadRef, u64>,
    /// Successful Kubernetes TokenRequests per service account.
    pub token_requests: BTreeMap<WorkloadRef, u64>,
    /// Successful federation calls.
    pub federations: u64,
    /// Successful token exchanges at the identity domain, per service account.
    pub token_exchanges: BTreeMap<WorkloadRef, u64>,
    /// Token exchanges the identity domain refused, by OAuth `error`.
    pub token_exchange_refusals: BTreeMap<String, u64>,
    /// Requests for the service-account issuer's discovery document
    /// (`/.well-known/openid-configuration` at the Kubernetes endpoint), faulted ones
    /// included.
    pub issuer_discovery_requests: u64,
    /// Requests for the service-account issuer's keys (`/openid/v1/jwks` at the Kubernetes
    /// endpoint), faulted ones included.
    pub jwks_requests: u64,
    /// JSON patches applied, per node.
    pub node_patches: BTreeMap<String, u64>,
}

impl Stats {
    /// Counters of one listener.
    pub fn listener(&self, endpoint: Endpoint) -> ListenerStats {
        self.listeners.get(&endpoint).copied().unwrap_or_default()
    }

    /// Requests that arrived at an endpoint.
    pub fn arrived(&self, endpoint: Endpoint) -> u64 {
        self.arrived.get(&endpoint).copied().unwrap_or(0)
    }

    /// Responses of an endpoint with the given status.
    pub fn responses(&self, endpoint: Endpoint, status: u16) -> u64 {
        self.responses
            .get(&endpoint)
            .and_then(|m| m.get(&status))
            .copied()
            .unwrap_or(0)
    }

    /// Responses of an endpoint, all statuses.
    pub fn total_responses(&self, endpoint: Endpoint) -> u64 {
        self.responses
            .get(&endpoint)
            .map(|m| m.values().sum())
            .unwrap_or(0)
    }

    /// Requests currently held at an endpoint.
    pub fn held(&self, endpoint: Endpoint) -> u64 {
        self.held.get(&endpoint).copied().unwrap_or(0)
    }

    /// Proxymux exchanges of a workload.
    pub fn proxymux_exchanges(&self, namespace: &str, service_account: &str) -> u64 {
        self.proxymux_exchanges
            .get(&WorkloadRef {
                namespace: namespace.into(),
                service_account: service_account.into(),
            })
            .copied()
            .unwrap_or(0)
    }

    /// All proxymux exchanges.
    pub fn total_proxymux_exchanges(&self) -> u64 {
        self.proxymux_exchanges.values().sum()
    }

    /// All TokenRequests.
    pub fn total_token_requests(&self) -> u64 {
        self.token_requests.values().sum()
    }

    /// Token exchanges of a service account at the identity domain.
    pub fn token_exchanges(&self, namespace: &str, service_account: &str) -> u64 {
        self.token_exchanges
            .get(&WorkloadRef {
                namespace: namespace.into(),
                service_account: service_account.into(),
            })
            .copied()
            .unwrap_or(0)
    }

    /// All token exchanges at the identity domain.
    pub fn total_token_exchanges(&self) -> u64 {
        self.token_exchanges.values().sum()
    }

    /// Token exchanges the identity domain refused with `error`.
    pub fn token_exchange_refusals(&self, error: &str) -> u64 {
        self.token_exchange_refusals
            .get(error)
            .copied()
            .unwrap_or(0)
    }
}

/// Error returned when a wait times out.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {0:?} waiting for the emulator counters; last value: {1:?}")]
pub struct WaitTimeout(pub Duration, pub Box<Stats>);

/// The live counters, shared by the emulator tasks and the test handle.
#[derive(Debug)]
pub(crate) struct Counters {
    tx: watch::Sender<Stats>,
}

impl Counters {
    pub(crate) fn new() -> Self {
        let (tx, _rx) = watch::channel(Stats::default());
        Self { tx }
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut Stats)) {
        self.tx.send_modify(f);
    }

    pub(crate) fn listener(&self, endpoint: Endpoint, f: impl FnOnce(&mut ListenerStats)) {
        self.update(|s| f(s.listeners.entry(endpoint).or_default()));
    }

    pub(crate) fn snapshot(&self) -> Stats {
        self.tx.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Stats> {
        self.tx.subscribe()
    }
}

/// Waits until `pred` holds for the counters, without polling or sleeping.
pub(crate) async fn wait_for(
    mut rx: watch::Receiver<Stats>,
    timeout: Duration,
    mut pred: impl FnMut(&Stats) -> bool,
) -> Result<Stats, WaitTimeout> {
    let waited = tokio::time::timeout(timeout, async {
        rx.wait_for(|s| pred(s)).await.map(|s| s.clone())
    })
    .await;
    match waited {
        Ok(Ok(stats)) => Ok(stats),
        _ => Err(WaitTimeout(timeout, Box::new(rx.borrow().clone()))),
    }
}
