//! `[server]`: the servers the provider runs and the bounds of the mounts they admit.

use serde::{Deserialize, Serialize};

use super::OctalMode;

/// The servers the provider runs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// `unix:///path` (what the driver dials) or `tcp://127.0.0.1:port` (debugging).
    pub endpoint: String,
    /// Mode of the Unix socket, octal (`"0600"`).
    pub endpoint_permissions: OctalMode,
    /// Address the health and metrics servers bind.
    pub bind_address: std::net::IpAddr,
    /// Port of `/health`, `/healthz` and `/readyz`.
    pub healthz_port: u16,
    /// Port of `/metrics`.
    pub metrics_port: u16,
    /// Metrics exporter; only `prometheus` is supported.
    pub metrics_backend: String,
    /// Serve the debug server (CPU and heap profiles, `/debug/stats`); the Go provider's
    /// `--enable-pprof`. Off by default.
    pub enable_pprof: bool,
    /// Port of the debug server (`--pprof-port`).
    pub pprof_port: u16,
    /// Address the debug server binds: a loopback address only (under `hostNetwork`,
    /// 127.0.0.1 is the whole node's loopback).
    pub pprof_address: std::net::IpAddr,
    /// Longest CPU profile `/debug/pprof/profile?seconds=N` takes.
    pub max_profile_seconds: u64,
    /// Mounts served at once (the node's slots); beyond it a mount waits for a slot.
    pub max_in_flight_mounts: usize,
    /// Upper bound of a mount's deadline in seconds (also the deadline when the driver
    /// sends none).
    pub mount_timeout_seconds: u64,
    /// On SIGTERM, how long in-flight mounts may take to finish, in seconds.
    pub shutdown_grace_seconds: u64,
    /// Connections the health and metrics servers each keep open at once.
    pub http_max_connections: usize,
    /// Connections the health and metrics servers each keep open from one source address.
    pub http_max_connections_per_address: usize,
    /// Seconds a health or metrics client may take to send its request headers, or stay
    /// idle between requests, before its connection is closed.
    pub http_header_read_timeout_seconds: u64,
    /// Bytes all mounts in flight may hold at once (each fetch reserves
    /// `upstream.max_bundle_bytes` first); beyond it a mount is `ResourceExhausted`.
    pub max_in_flight_bytes: usize,
    /// Bytes the mounts of one namespace in flight may hold at once; `None`: a quarter
    /// of `max_in_flight_bytes` (at least one fetch).
    pub max_in_flight_bytes_per_namespace: Option<usize>,
    /// Mounts of one namespace served at once; `None`: a quarter of
    /// `max_in_flight_mounts` (at least 1).
    pub max_in_flight_per_namespace: Option<usize>,
    /// Mounts waiting for a slot at once (every slot taken, or their namespace past its
    /// share), until a slot frees or their deadline passes; beyond it a mount is
    /// `ResourceExhausted`. `None`: `max_in_flight_mounts`; 0: no mount waits.
    pub max_queued_mounts: Option<usize>,
    /// Mounts of one namespace waiting at once; `None`: a quarter of `max_queued_mounts`.
    pub max_queued_mounts_per_namespace: Option<usize>,
    /// Bytes the decoded requests of the mounts in flight and waiting may hold at once (a
    /// request is at most 1 MiB, a driver's a few KiB); beyond it a mount is
    /// `ResourceExhausted`. Part of the memory model's baseline.
    pub max_request_bytes: usize,
    /// A namespace's share of `max_request_bytes`: past it its requests hold more only while
    /// a share stays free for the others; `None`: an eighth of `max_request_bytes`, at least
    /// one largest request (1 MiB).
    pub max_request_bytes_per_namespace: Option<usize>,
    /// Entries a SecretProviderClass's `secrets` list may have.
    pub max_secrets_per_mount: usize,
    /// Files one mount may write, counting every file: entries, `keys` items and
    /// certificate files.
    pub max_files_per_mount: usize,
    /// The uids whose connections to the Unix socket are served (`SO_PEERCRED`), besides
    /// the provider's own; others are closed at accept with a warning. The driver and the
    /// sync controller's sidecar socket user run as root.
    pub allowed_peer_uids: Vec<u32>,
    /// A startup taint's key: once the socket serves and the readiness self-check passes,
    /// its `NoSchedule` and `NoExecute` taints are removed from this node (`node_name`)
    /// through the Kubernetes API. `None` (the default): no node is touched.
    pub remove_node_taint: Option<String>,
    /// The node this provider runs on: `NODE_NAME`, from the downward API
    /// (`fieldRef: spec.nodeName`).
    pub node_name: Option<String>,
}

impl ServerConfig {
    /// `max_in_flight_bytes_per_namespace`, resolved.
    pub fn namespace_bytes(&self, fetch_bytes: usize) -> usize {
        self.max_in_flight_bytes_per_namespace
            .unwrap_or((self.max_in_flight_bytes / 4).max(fetch_bytes))
    }

    /// `max_in_flight_per_namespace`, resolved.
    pub fn namespace_mounts(&self) -> usize {
        self.max_in_flight_per_namespace
            .unwrap_or((self.max_in_flight_mounts / 4).max(1))
    }

    /// `max_queued_mounts`, resolved: by default a storm of one namespace as large as the
    /// slots is served in full (all but a share at once, the rest as slots free up).
    pub fn queued_mounts(&self) -> usize {
        self.max_queued_mounts.unwrap_or(self.max_in_flight_mounts)
    }

    /// `max_request_bytes_per_namespace`, resolved.
    pub fn namespace_request_bytes(&self) -> usize {
        self.max_request_bytes_per_namespace.unwrap_or(
            (self.max_request_bytes / 8)
                .max(csi_grpc::MAX_REQUEST_BYTES)
                .min(self.max_request_bytes),
        )
    }

    /// `max_queued_mounts_per_namespace`, resolved.
    pub fn namespace_queued_mounts(&self) -> usize {
        self.max_queued_mounts_per_namespace
            .unwrap_or_else(|| self.queued_mounts().div_ceil(4))
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            endpoint: "unix:///opt/provider/sockets/oci.sock".into(),
            endpoint_permissions: OctalMode(0o600),
            bind_address: std::net::IpAddr::from([0, 0, 0, 0]),
            healthz_port: 8098,
            metrics_port: 8198,
            metrics_backend: "prometheus".into(),
            enable_pprof: false,
            pprof_port: 6060,
            pprof_address: std::net::IpAddr::from([127, 0, 0, 1]),
            max_profile_seconds: 60,
            max_in_flight_mounts: 64,
            mount_timeout_seconds: 60,
            shutdown_grace_seconds: 25,
            http_max_connections: 256,
            http_max_connections_per_address: 8,
            http_header_read_timeout_seconds: 5,
            max_in_flight_bytes: 32 * 1024 * 1024,
            max_in_flight_bytes_per_namespace: None,
            max_in_flight_per_namespace: None,
            max_queued_mounts: None,
            max_queued_mounts_per_namespace: None,
            max_request_bytes: 8 * 1024 * 1024,
            max_request_bytes_per_namespace: None,
            max_secrets_per_mount: 256,
            max_files_per_mount: 256,
            allowed_peer_uids: vec![0],
            remove_node_taint: None,
            node_name: None,
        }
    }
}
