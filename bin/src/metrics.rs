//! Prometheus metrics of the provider.

use std::sync::Mutex;
use std::time::Duration;

use csi_grpc::{ErrorKind, MountObserver};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabel {
    host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

/// The registry and the metrics the binary records.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Mutex<Registry>,
    mounts: Family<CodeLabel, Counter>,
    duration: Histogram,
    in_flight: Gauge,
    transport: transport::Transport,
    open: Family<HostLabel, Gauge>,
    opened: Family<HostLabel, Gauge>,
    requests: Family<HostLabel, Gauge>,
    alive_tasks: Gauge,
}

impl Metrics {
    pub(crate) fn new(version: &'static str, transport: transport::Transport) -> Self {
        let mut registry = Registry::with_prefix("oci_provider");
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
        let in_flight = Gauge::default();
        registry.register("mounts_in_flight", "Mounts being served", in_flight.clone());
        let build = Family::<VersionLabel, Gauge>::default();
        build.get_or_create(&VersionLabel { version }).set(1);
        registry.register("build_info", "Provider version", build);
        // Read from the transport's counters at scrape time (monotonic counts exposed as
        // gauges holding the current total, since prometheus-client counters only go up by
        // increments).
        let open = Family::<HostLabel, Gauge>::default();
        registry.register(
            "upstream_connections_open",
            "Upstream connections open now, per host",
            open.clone(),
        );
        let opened = Family::<HostLabel, Gauge>::default();
        registry.register(
            "upstream_connections_opened_total",
            "Upstream connections opened since start, per host",
            opened.clone(),
        );
        let requests = Family::<HostLabel, Gauge>::default();
        registry.register(
            "upstream_requests_total",
            "Upstream requests sent since start, per host (each attempt)",
            requests.clone(),
        );
        let alive_tasks = Gauge::default();
        registry.register(
            "runtime_alive_tasks",
            "Tasks alive in the async runtime (leak detector: returns to its baseline when idle)",
            alive_tasks.clone(),
        );
        Self {
            alive_tasks,
            registry: Mutex::new(registry),
            mounts,
            duration,
            in_flight,
            transport,
            open,
            opened,
            requests,
        }
    }

    /// The text exposition format.
    pub(crate) fn encode(&self) -> String {
        for (host, stats) in self.transport.stats() {
            let label = HostLabel { host };
            let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            self.open.get_or_create(&label).set(clamp(stats.open));
            self.opened.get_or_create(&label).set(clamp(stats.opened));
            self.requests
                .get_or_create(&label)
                .set(clamp(stats.requests));
        }
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
    fn mount_started(&self) {
        self.in_flight.inc();
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
