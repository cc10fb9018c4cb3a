//! Prometheus metrics of the provider.

use std::sync::Mutex;
use std::time::Duration;

use csi_grpc::{ErrorKind, MountLimits, MountObserver, WaitOutcome};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod collectors;
mod upstream;

use collectors::*;
pub(crate) use upstream::{HostClasses, UpstreamTimings};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    /// How a wait for a slot ended: `admitted`, `deadline_exceeded`, `cancelled`.
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    /// What an attempt to remove the startup taint came to: `removed`, `absent`,
    /// `forbidden`, `conflict`, `error`.
    result: &'static str,
}

/// How long mounts waited for a slot, by how the wait ended.
type Waits = Family<OutcomeLabel, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: &'static str,
    /// `"true"` in the `fips` build (AWS-LC's FIPS module).
    fips: &'static str,
}

/// The registry and the metrics the binary records.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Mutex<Registry>,
    mounts: Family<CodeLabel, Counter>,
    duration: Histogram,
    in_flight: Gauge,
    queued: Gauge,
    waits: Waits,
    alive_tasks: Gauge,
    ready: Gauge,
    node_taint_attempts: Family<ResultLabel, Counter>,
    node_taint_pending: Gauge,
    shed: std::sync::Arc<collectors::ShedCounts>,
    /// What `/debug/stats` reads (the same sources as the collectors).
    pub(crate) sources: StatsSources,
}

/// Handles to the live state `/debug/stats` reports: never a token or a secret value,
/// only counts.
#[derive(Clone, Debug)]
pub(crate) struct StatsSources {
    pub(crate) transport: transport::Transport,
    pub(crate) bundles: cache::Cache<vault::BundleKey, vault::SecretBundle>,
    pub(crate) principals: auth::Principals,
    pub(crate) budget: provider::ByteBudget,
    pub(crate) in_flight: Gauge,
    pub(crate) queued: Gauge,
}

/// What `/metrics` reads at scrape time beyond its own counters: the caches (secret bundles,
/// listings, the principals' credentials), regions served, certificate expiry, upstream timings,
/// retries and the trace exporter.
#[derive(Debug)]
pub(crate) struct ScrapeSources {
    pub(crate) bundles: cache::Cache<vault::BundleKey, vault::SecretBundle>,
    /// The listings of version histories and selections.
    pub(crate) listings: cache::Cache<vault::ListKey, vault::Listing>,
    pub(crate) principals: auth::Principals,
    /// Which region served each entry.
    pub(crate) served: std::sync::Arc<provider::RegionStats>,
    /// The `notAfter` of the certificates mounted lately.
    pub(crate) certificate_expiry: std::sync::Arc<provider::CertificateExpiry>,
    /// Whether the expiry gauge names certificate OCIDs (`telemetry.certificate_ids_in_metrics`).
    pub(crate) certificate_ids: bool,
    /// Upstream exchange durations.
    pub(crate) timings: std::sync::Arc<UpstreamTimings>,
    /// The Secrets client's retries by reason.
    pub(crate) retries: std::sync::Arc<vault::Retries>,
    /// The trace exporter's client.
    pub(crate) otlp: crate::otel::OtlpClient,
}

/// The gauges set once (the build, the in-flight and queue limits) and the readiness
/// gauge, which is answered.
fn register_constants(
    registry: &mut Registry,
    version: &'static str,
    limits: &MountLimits,
) -> Gauge {
    for (name, help, value) in [
        (
            "mounts_in_flight_limit",
            "server.max_in_flight_mounts: mounts past it wait for a slot",
            limits.max_in_flight,
        ),
        (
            "mounts_queued_limit",
            "server.max_queued_mounts: mounts past it are shed",
            limits.max_queued,
        ),
    ] {
        let limit = Gauge::<i64>::default();
        limit.set(i64::try_from(value).unwrap_or(i64::MAX));
        registry.register(name, help, limit);
    }
    let ready = Gauge::default();
    registry.register(
        "ready",
        "1 while the provider serves its socket and Version answers on it (what /readyz \
         checks, every 2 s), else 0",
        ready.clone(),
    );
    let build = Family::<BuildLabel, Gauge>::default();
    let fips = if cfg!(feature = "fips") {
        "true"
    } else {
        "false"
    };
    build.get_or_create(&BuildLabel { version, fips }).set(1);
    registry.register(
        "build_info",
        "Provider version, and whether it runs on AWS-LC's FIPS module",
        build,
    );
    ready
}

/// The startup taint's removal (`--remove-node-taint`): attempts by result, and whether it
/// is still to be removed.
fn register_node_taint(registry: &mut Registry) -> (Family<ResultLabel, Counter>, Gauge) {
    let attempts = Family::<ResultLabel, Counter>::default();
    registry.register(
        "node_taint_removal_attempts",
        "Attempts to remove the startup taint (--remove-node-taint) from this node, by result: \
         removed, absent, forbidden (RBAC or the admission policy), conflict (the node changed meanwhile), error",
        attempts.clone(),
    );
    let pending = Gauge::default();
    registry.register(
        "node_taint_pending",
        "1 while the startup taint (--remove-node-taint) is still on this node to be removed",
        pending.clone(),
    );
    (attempts, pending)
}

/// The mounts waiting for a slot now, and how long each wait took by how it ended.
fn register_queue(registry: &mut Registry) -> (Gauge, Waits) {
    let queued = Gauge::default();
    registry.register(
        "mounts_queued",
        "Mounts waiting for a slot now: every slot taken (server.max_in_flight_mounts), or \
         their namespace past its share (server.max_in_flight_per_namespace)",
        queued.clone(),
    );
    fn buckets() -> Histogram {
        Histogram::new([
            0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ])
    }
    let waits: Waits = Family::new_with_constructor(buckets);
    registry.register(
        "mount_queue_wait_seconds",
        "Time mounts waited for a slot, by how the wait ended: admitted, deadline_exceeded \
         (answered DeadlineExceeded), cancelled (the caller went away)",
        waits.clone(),
    );
    (queued, waits)
}

impl Metrics {
    pub(crate) fn new(
        version: &'static str,
        limits: &MountLimits,
        transport: transport::Transport,
        budget: provider::ByteBudget,
        caches: ScrapeSources,
    ) -> Self {
        // `process_*` at the root, as Prometheus clients name them; ours under `oci_provider_`.
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector::default()));
        let registry = root.sub_registry_with_prefix("oci_provider");
        let in_flight = Gauge::default();
        let mounts = Family::<CodeLabel, Counter>::default();
        registry.register("mounts", "Mounts answered, by gRPC outcome", mounts.clone());
        let duration = Histogram::new([
            0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ]);
        registry.register(
            "mount_duration_seconds",
            "Time to answer a mount",
            duration.clone(),
        );
        registry.register(
            "mounts_in_flight",
            "Mounts being served (received, not waiting for a slot, not yet answered)",
            in_flight.clone(),
        );
        let (queued, waits) = register_queue(registry);
        let ready = register_constants(registry, version, limits);
        let sources = StatsSources {
            transport: transport.clone(),
            bundles: caches.bundles.clone(),
            principals: caches.principals.clone(),
            budget: budget.clone(),
            in_flight: in_flight.clone(),
            queued: queued.clone(),
        };
        registry.register_collector(Box::new(UpstreamCollector(transport)));
        let shed = std::sync::Arc::new(collectors::ShedCounts::default());
        registry.register_collector(Box::new(BudgetCollector(budget, shed.clone())));
        registry.register(
            "upstream_request_duration_seconds",
            "Upstream exchanges (each attempt) by host class and status class, body included",
            caches.timings.durations.clone(),
        );
        registry.register_collector(Box::new(caches));
        let (node_taint_attempts, node_taint_pending) = register_node_taint(registry);
        let alive_tasks = Gauge::default();
        registry.register(
            "runtime_alive_tasks",
            "Tasks alive in the async runtime (leak detector: returns to its baseline when idle)",
            alive_tasks.clone(),
        );
        Self {
            shed,
            alive_tasks,
            ready,
            node_taint_attempts,
            node_taint_pending,
            sources,
            registry: Mutex::new(root),
            mounts,
            duration,
            in_flight,
            queued,
            waits,
        }
    }

    /// Records what the readiness check answered, for `oci_provider_ready`.
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Counts one attempt to remove the startup taint by its `result`.
    pub(crate) fn node_taint_attempt(&self, result: &'static str) {
        self.node_taint_attempts
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Whether the startup taint is still to be removed.
    pub(crate) fn set_node_taint_pending(&self, pending: bool) {
        self.node_taint_pending.set(i64::from(pending));
    }

    /// The text exposition format.
    pub(crate) fn encode(&self) -> String {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let alive = handle.metrics().num_alive_tasks();
            self.alive_tasks
                .set(i64::try_from(alive).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

impl MountObserver for Metrics {
    fn mount_shed(&self) {
        self.shed
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn mount_shed_for_request_bytes(&self) {
        self.shed
            .request_bytes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn mount_started(&self) {
        self.in_flight.inc();
    }

    // A waiting mount counts as queued, not in flight: it is back in flight (until it is
    // answered, admitted or not) when its wait ends.
    fn mount_queued(&self) {
        self.in_flight.dec();
        self.queued.inc();
    }

    fn mount_dequeued(&self, outcome: WaitOutcome, waited: Duration) {
        self.queued.dec();
        self.in_flight.inc();
        self.waits
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            })
            .observe(waited.as_secs_f64());
    }

    fn mount_finished(&self, outcome: Result<(), ErrorKind>, elapsed: Duration) {
        self.in_flight.dec();
        let code = match outcome {
            Ok(()) => "ok",
            Err(kind) => kind.as_str(),
        };
        self.mounts.get_or_create(&CodeLabel { code }).inc();
        self.duration.observe(elapsed.as_secs_f64());
    }
}
