//! Prometheus metrics of the provider.

use std::sync::Mutex;
use std::time::Duration;

use csi_grpc::{ErrorKind, MountObserver};
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
    alive_tasks: Gauge,
}

/// Reads one counter of a host.
type HostCounter = fn(&transport::HostStats) -> u64;

/// The transport's per-host counters, read at scrape time: connections open now (gauge),
/// opened, closed and requests sent (counters).
#[derive(Debug)]
struct UpstreamCollector(transport::Transport);

impl Collector for UpstreamCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stats = self.0.stats();
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        {
            let mut family = encoder.encode_descriptor(
                "upstream_connections_open",
                "Upstream connections open now, per host",
                None,
                MetricType::Gauge,
            )?;
            for (host, s) in &stats {
                let label = HostLabel { host: host.clone() };
                ConstGauge::new(clamp(s.open)).encode(family.encode_family(&label)?)?;
            }
        }
        let counters: [(&str, &str, HostCounter); 3] = [
            (
                "upstream_connections_opened",
                "Upstream connections opened, per host",
                |s| s.opened,
            ),
            (
                "upstream_connections_closed",
                "Upstream connections closed, per host",
                |s| s.closed,
            ),
            (
                "upstream_requests",
                "Upstream requests sent (each attempt), per host",
                |s| s.requests,
            ),
        ];
        for (name, help, value) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (host, s) in &stats {
                let label = HostLabel { host: host.clone() };
                ConstCounter::new(value(s)).encode(family.encode_family(&label)?)?;
            }
        }
        Ok(())
    }
}

/// The in-flight byte budget, read at scrape time.
#[derive(Debug)]
struct BudgetCollector(provider::ByteBudget);

impl Collector for BudgetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let clamp = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for (name, help, value) in [
            (
                "in_flight_bytes",
                "Bytes reserved by mounts in flight now (server.max_in_flight_bytes)",
                self.0.used(),
            ),
            (
                "in_flight_bytes_high_water",
                "The most bytes mounts in flight ever held at once",
                self.0.high_water(),
            ),
            (
                "in_flight_bytes_limit",
                "server.max_in_flight_bytes",
                self.0.capacity(),
            ),
        ] {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(clamp(value)).encode(family)?;
        }
        Ok(())
    }
}

/// The caches whose counters `/metrics` reports: secret bundles and the principals'
/// credentials.
#[derive(Debug)]
pub(crate) struct CacheSources {
    pub(crate) bundles: cache::Cache<vault::BundleKey, vault::SecretBundle>,
    pub(crate) principals: auth::Principals,
    /// Which region served each entry.
    pub(crate) served: std::sync::Arc<provider::RegionStats>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegionLabel {
    region: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabel {
    kind: &'static str,
    cause: &'static str,
}

type CacheCounter = fn(&cache::CacheStats) -> u64;

impl Collector for CacheSources {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut all = vec![("bundle", self.bundles.stats())];
        all.extend(self.principals.cache_stats());
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let counters: [(&str, &str, CacheCounter); 3] = [
            ("cache_hits", "Answers from the cache, by kind", |s| s.hits),
            (
                "cache_misses",
                "Upstream fetches made for the cache (one per key at a time), by kind",
                |s| s.misses,
            ),
            (
                "cache_joined",
                "Callers that waited for another caller's fetch of the same key, by kind",
                |s| s.joined,
            ),
        ];
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (kind, stats) in &all {
                ConstCounter::new(read(stats))
                    .encode(family.encode_family(&KindLabel { kind })?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "cache_evictions",
                "Entries dropped, by kind and cause (size, expired, invalidated)",
                None,
                MetricType::Counter,
            )?;
            for (kind, stats) in &all {
                for (cause, n) in [
                    ("size", stats.evicted_size),
                    ("expired", stats.evicted_expired),
                    ("invalidated", stats.evicted_invalidated),
                ] {
                    ConstCounter::new(n)
                        .encode(family.encode_family(&EvictionLabel { kind, cause })?)?;
                }
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "secrets_served",
                "Secrets mounted, by the region that served them (primary or failover)",
                None,
                MetricType::Counter,
            )?;
            for (region, n) in [
                ("primary", &self.served.primary),
                ("failover", &self.served.failover),
            ] {
                ConstCounter::new(n.load(std::sync::atomic::Ordering::Relaxed))
                    .encode(family.encode_family(&RegionLabel { region })?)?;
            }
        }
        let gauges: [(&str, &str, CacheCounter); 3] = [
            ("cache_entries", "Entries held now, by kind", |s| s.entries),
            (
                "cache_in_flight",
                "Callers leading or waiting for an upstream fetch now, by kind",
                |s| s.in_flight,
            ),
            (
                "cache_bytes",
                "Bytes of secret material held now, by kind",
                |s| s.bytes,
            ),
        ];
        for (name, help, read) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (kind, stats) in &all {
                ConstGauge::new(clamp(read(stats)))
                    .encode(family.encode_family(&KindLabel { kind })?)?;
            }
        }
        Ok(())
    }
}

impl Metrics {
    pub(crate) fn new(
        version: &'static str,
        transport: transport::Transport,
        budget: provider::ByteBudget,
        caches: CacheSources,
    ) -> Self {
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
        registry.register_collector(Box::new(UpstreamCollector(transport)));
        registry.register_collector(Box::new(BudgetCollector(budget)));
        registry.register_collector(Box::new(caches));
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
        }
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
