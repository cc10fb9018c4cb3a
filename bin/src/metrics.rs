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
struct CertificateLabel {
    namespace: String,
    certificate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoLabels {}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabel {
    host: String,
}

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
    alive_tasks: Gauge,
    ready: Gauge,
    shed: std::sync::Arc<std::sync::atomic::AtomicU64>,
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
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
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
struct BudgetCollector(
    provider::ByteBudget,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
);

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
        let mut family = encoder.encode_descriptor(
            "mounts_shed",
            "Mounts refused to protect the node, by reason: in_flight \
             (server.max_in_flight_mounts), byte_budget (server.max_in_flight_bytes)",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in [
            (
                "in_flight",
                self.1.load(std::sync::atomic::Ordering::Relaxed),
            ),
            ("byte_budget", self.0.refused() as u64),
        ] {
            ConstCounter::new(n).encode(family.encode_family(&ReasonLabel { reason })?)?;
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FetchLabel {
    kind: &'static str,
    op: &'static str,
    result: &'static str,
}

/// Which class of upstream an authority is (`secrets`, `kubernetes`, `proxymux`,
/// `federation`, `imds`): the configured endpoints, then the OCI host names.
#[derive(Debug, Default)]
pub(crate) struct HostClasses(std::collections::BTreeMap<String, &'static str>);

impl HostClasses {
    pub(crate) fn insert(&mut self, authority: String, class: &'static str) {
        self.0.entry(authority).or_insert(class);
    }

    fn class(&self, authority: &str) -> &'static str {
        if let Some(class) = self.0.get(authority) {
            return class;
        }
        let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
        if host.starts_with("secrets.") {
            "secrets"
        } else if host.starts_with("certificates.") {
            "certificates"
        } else if host.starts_with("auth.") {
            "federation"
        } else if host == "169.254.169.254" {
            "imds"
        } else if authority.ends_with(":12250") {
            "proxymux"
        } else {
            "other"
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExchangeLabel {
    host_class: &'static str,
    status_class: &'static str,
}

/// Upstream exchange durations by host class and status class, fed by the transport.
#[derive(Debug)]
pub(crate) struct UpstreamTimings {
    classes: HostClasses,
    durations: Family<ExchangeLabel, Histogram, fn() -> Histogram>,
}

impl UpstreamTimings {
    pub(crate) fn new(classes: HostClasses) -> Self {
        fn buckets() -> Histogram {
            Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ])
        }
        Self {
            classes,
            durations: Family::new_with_constructor(buckets),
        }
    }
}

impl transport::ExchangeObserver for UpstreamTimings {
    fn exchanged(&self, authority: &str, outcome: transport::Outcome, elapsed: Duration) {
        let status_class = match outcome {
            transport::Outcome::Status(s) if s < 200 => "1xx",
            transport::Outcome::Status(s) if s < 300 => "2xx",
            transport::Outcome::Status(s) if s < 400 => "3xx",
            transport::Outcome::Status(s) if s < 500 => "4xx",
            transport::Outcome::Status(_) => "5xx",
            transport::Outcome::Failed(transport::ErrorKind::Connect) => "connect_error",
            transport::Outcome::Failed(transport::ErrorKind::Timeout) => "timeout",
            transport::Outcome::Failed(transport::ErrorKind::TooLarge) => "too_large",
            transport::Outcome::Failed(_) => "error",
        };
        let label = ExchangeLabel {
            host_class: self.classes.class(authority),
            status_class,
        };
        self.durations
            .get_or_create(&label)
            .observe(elapsed.as_secs_f64());
    }
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
        let counters: [(&str, &str, CacheCounter); 4] = [
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
            (
                "cache_unusable",
                "Callers that gave up after the fetches they joined kept bringing values they \
                 cannot use (another caller's), by kind: they got an error, never the value",
                |s| s.unusable,
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
            let family = encoder.encode_descriptor(
                "otlp_export_failures",
                "Trace exports that failed (collector down, slow or refusing); their spans are dropped",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(self.otlp.failures()).encode(family)?;
            let family = encoder.encode_descriptor(
                "otlp_spans_dropped",
                "Finished spans dropped because the export queue was full \
                 (OTEL_BSP_MAX_QUEUE_SIZE); mounts never wait for the collector",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(self.otlp.dropped()).encode(family)?;
        }
        for (name, help, counts) in [
            (
                "upstream_retries",
                "Secrets API attempts retried, by reason",
                self.retries.snapshot(),
            ),
            (
                "upstream_gave_up",
                "Secrets and Certificates calls that failed after their retries, by the reason of \
                 the last failure (throttled: a 429 the retries did not outlast)",
                self.retries.gave_up_snapshot(),
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (reason, n) in counts {
                ConstCounter::new(n).encode(family.encode_family(&ReasonLabel {
                    reason: reason.as_str(),
                })?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "credential_fetches",
                "Token exchanges and refreshes (and user key loads), by principal kind and result",
                None,
                MetricType::Counter,
            )?;
            for ((kind, op, result), n) in self.principals.credential_fetches() {
                ConstCounter::new(n).encode(family.encode_family(&FetchLabel {
                    kind,
                    op,
                    result,
                })?)?;
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
        {
            let mut family = encoder.encode_descriptor(
                "certificate_not_after_seconds",
                "The soonest notAfter (Unix seconds) of the certificates, CAs and CA bundles \
                 mounted in the last 24 hours (each by namespace and OCID with \
                 telemetry.certificate_ids_in_metrics): alert before it passes",
                None,
                MetricType::Gauge,
            )?;
            if self.certificate_ids {
                for (namespace, certificate, not_after) in self.certificate_expiry.entries() {
                    ConstGauge::new(not_after).encode(family.encode_family(
                        &CertificateLabel {
                            namespace,
                            certificate,
                        },
                    )?)?;
                }
            } else if let Some(soonest) = self.certificate_expiry.soonest() {
                ConstGauge::new(soonest).encode(family.encode_family(&NoLabels {})?)?;
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

/// The conventional `process_*` metrics, read from `/proc/self` at scrape time (no prefix).
#[derive(Debug)]
struct ProcessCollector {
    start_time_seconds: f64,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self {
            start_time_seconds: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        }
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or(0)
        };
        let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as i64);
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                field("VmRSS:") * 1024,
            ),
            ("process_open_fds", "Open file descriptors", fds),
            ("process_threads", "OS threads", field("Threads:")),
        ] {
            // `process_*` without the registry's prefix, as Prometheus clients name them.
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(family)?;
        }
        let family = encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.start_time_seconds).encode(family)?;
        let family = encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(cpu_seconds(
            &std::fs::read_to_string("/proc/self/stat").unwrap_or_default(),
        ))
        .encode(family)?;
        Ok(())
    }
}

/// User plus system time from a `/proc/<pid>/stat` line (fields 14 and 15, in clock ticks
/// after the parenthesised command name, which may hold spaces). Ticks are `USER_HZ`, which
/// Linux fixes at 100 for user space on every architecture it still supports.
fn cpu_seconds(stat: &str) -> f64 {
    const USER_HZ: f64 = 100.0;
    let Some((_, after_name)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `after_name` starts at field 3 (state): utime is field 14, stime field 15.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / USER_HZ
}

impl Metrics {
    pub(crate) fn new(
        version: &'static str,
        max_in_flight_mounts: usize,
        transport: transport::Transport,
        budget: provider::ByteBudget,
        caches: CacheSources,
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
        registry.register("mounts_in_flight", "Mounts being served", in_flight.clone());
        let limit = Gauge::<i64>::default();
        limit.set(i64::try_from(max_in_flight_mounts).unwrap_or(i64::MAX));
        registry.register(
            "mounts_in_flight_limit",
            "server.max_in_flight_mounts: mounts past it are shed",
            limit,
        );
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
        let sources = StatsSources {
            transport: transport.clone(),
            bundles: caches.bundles.clone(),
            principals: caches.principals.clone(),
            budget: budget.clone(),
            in_flight: in_flight.clone(),
        };
        registry.register_collector(Box::new(UpstreamCollector(transport)));
        let shed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        registry.register_collector(Box::new(BudgetCollector(budget, shed.clone())));
        registry.register(
            "upstream_request_duration_seconds",
            "Upstream exchanges (each attempt) by host class and status class, body included",
            caches.timings.durations.clone(),
        );
        registry.register_collector(Box::new(caches));
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
            sources,
            registry: Mutex::new(root),
            mounts,
            duration,
            in_flight,
        }
    }

    /// Records what the readiness check answered, for `oci_provider_ready`.
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
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
        self.shed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

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

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_seconds_are_read_after_a_command_name_with_spaces_and_parentheses() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime ...
        let stat = "4242 (oci provider) (x)) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 125 0 0 20 0 9 0 100 1000 200";
        assert!((super::cpu_seconds(stat) - 3.75).abs() < 1e-9);
        assert_eq!(super::cpu_seconds("garbage"), 0.0);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(super::cpu_seconds(&own) >= 0.0);
    }
}
