//! The collectors read at scrape time: the transport's hosts, the byte budget, the caches,
//! retries, credentials, regions, certificates and the process.

use super::*;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CertificateLabel {
    namespace: String,
    certificate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NoLabels {}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CodeLabel {
    pub(super) code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HostLabel {
    host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    reason: &'static str,
}

/// Reads one counter of a host.
pub(super) type HostCounter = fn(&transport::HostStats) -> u64;

/// The transport's per-host counters, read at scrape time: connections open now (gauge),
/// opened, closed and requests sent (counters).
#[derive(Debug)]
pub(super) struct UpstreamCollector(pub(super) transport::Transport);

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
pub(super) struct BudgetCollector(
    pub(super) provider::ByteBudget,
    pub(super) std::sync::Arc<ShedCounts>,
);

/// Mounts shed at the edge, by reason (the byte budget counts its own refusals).
#[derive(Debug, Default)]
pub(super) struct ShedCounts {
    /// No slot, and its queue full.
    pub(super) in_flight: std::sync::atomic::AtomicU64,
    /// The requests held would pass `server.max_request_bytes` or a namespace's share.
    pub(super) request_bytes: std::sync::atomic::AtomicU64,
}

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
            "Mounts refused to protect the node, by reason: in_flight (no slot of \
             server.max_in_flight_mounts for it and its queue full: server.max_queued_mounts \
             or server.max_queued_mounts_per_namespace), byte_budget (server.max_in_flight_bytes), \
             request_bytes (server.max_request_bytes or server.max_request_bytes_per_namespace)",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in [
            (
                "in_flight",
                self.1.in_flight.load(std::sync::atomic::Ordering::Relaxed),
            ),
            ("byte_budget", self.0.refused() as u64),
            (
                "request_bytes",
                self.1
                    .request_bytes
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
        ] {
            ConstCounter::new(n).encode(family.encode_family(&ReasonLabel { reason })?)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FetchLabel {
    kind: &'static str,
    op: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RenewalLabel {
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct VerificationLabel {
    result: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RegionLabel {
    region: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EvictionLabel {
    kind: &'static str,
    cause: &'static str,
}

pub(super) type CacheCounter = fn(&cache::CacheStats) -> u64;

impl Collector for ScrapeSources {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut all = vec![
            ("bundle", self.bundles.stats()),
            ("listing", self.listings.stats()),
        ];
        all.extend(self.principals.cache_stats());
        encode_cache_counters(&mut encoder, &all)?;
        self.encode_otlp(&mut encoder)?;
        self.encode_upstream(&mut encoder)?;
        self.encode_exchange_guards(&mut encoder)?;
        self.encode_served(&mut encoder)?;
        self.encode_certificates(&mut encoder)?;
        encode_cache_gauges(&mut encoder, &all)
    }
}

impl ScrapeSources {
    fn encode_otlp(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
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
        ConstCounter::new(self.otlp.dropped()).encode(family)
    }

    /// Retries and give-ups by reason, and credential fetches.
    fn encode_upstream(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
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
        let mut family = encoder.encode_descriptor(
            "credential_fetches",
            "Token exchanges and refreshes (and user key loads), by principal kind, op \
             (exchange; refresh: a mount waited for it; ahead: in the background while the \
             credential served) and result",
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
        let mut family = encoder.encode_descriptor(
            "credential_renewals",
            "What became of the 401s OCI answered to established credentials, by principal \
             kind and outcome: renewed (the 401 dropped the credential for a new one), joined \
             (another request's renewal served it), cooling_down (the instance session was \
             renewed within the cool-down: kept, the mount failed), other_region (a region \
             other than the principal's own: kept, the mount failed)",
            None,
            MetricType::Counter,
        )?;
        for ((kind, outcome), n) in self.principals.credential_renewals() {
            ConstCounter::new(n).encode(family.encode_family(&RenewalLabel { kind, outcome })?)?;
        }
        let mut family = encoder.encode_descriptor(
            "token_verifications",
            "Service-account tokens mounts supplied, checked before any cached session is \
             served to them: ok (verified, cached), refused by the check that failed \
             (signature, unknown_key, algorithm, issuer, audience, expired, not_yet_valid, \
             claims, malformed) or cached (an identical token's kept refusal), unavailable \
             (the cluster's issuer keys could not be read)",
            None,
            MetricType::Counter,
        )?;
        for ((result, reason), n) in self.principals.token_verifications() {
            ConstCounter::new(n)
                .encode(family.encode_family(&VerificationLabel { result, reason })?)?;
        }
        Ok(())
    }

    /// What kept workload exchanges from the identity domain or the proxymux: refusals
    /// remembered and served, and the namespaces' pace.
    fn encode_exchange_guards(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        let guards = self.principals.exchange_guards();
        for (name, help, counts) in [
            (
                "credential_refusals",
                "Definite refusals of workload exchanges (identity domain or proxymux; 400, 401 \
                 or 403, not invalid_client): remembered per namespace and service account, \
                 served to a mount instead of an exchange, unkept (no room)",
                vec![
                    ("remembered", guards.refusals_remembered),
                    ("served", guards.refusals_served),
                    ("unkept", guards.refusals_unkept),
                ],
            ),
            (
                "credential_exchange_pace",
                "Workload exchanges over their namespace's pace: waited for their turn, or \
                 refused at once (the turn came after the mount's deadline)",
                vec![
                    ("waited", guards.paced_waited),
                    ("refused", guards.paced_refused),
                ],
            ),
            (
                "session_keys_taken",
                "Session keys (RSA-2048) taken by exchanges: ready (generated ahead), waited \
                 (none was ready: the exchange waited for one; a storm of new identities \
                 larger than auth.session_keys_ahead), reused (the key of an exchange answered \
                 without a token)",
                vec![
                    ("ready", guards.keys_ready),
                    ("waited", guards.keys_waited),
                    ("reused", guards.keys_reused),
                ],
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (outcome, n) in counts {
                ConstCounter::new(n).encode(family.encode_family(&OutcomeLabel { outcome })?)?;
            }
        }
        let family = encoder.encode_descriptor(
            "session_keys_ready",
            "Session keys generated ahead and ready now (at most auth.session_keys_ahead)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(guards.keys_held as i64).encode(family)?;
        Ok(())
    }

    fn encode_served(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
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
        Ok(())
    }

    fn encode_certificates(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
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
                ConstGauge::new(not_after).encode(family.encode_family(&CertificateLabel {
                    namespace,
                    certificate,
                })?)?;
            }
        } else if let Some(soonest) = self.certificate_expiry.soonest() {
            ConstGauge::new(soonest).encode(family.encode_family(&NoLabels {})?)?;
        }
        Ok(())
    }
}

/// Hits, misses, joins, unusable values and evictions of every cache, by kind.
pub(super) fn encode_cache_counters(
    encoder: &mut DescriptorEncoder<'_>,
    all: &[(&'static str, cache::CacheStats)],
) -> Result<(), std::fmt::Error> {
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
        for (kind, stats) in all {
            ConstCounter::new(read(stats)).encode(family.encode_family(&KindLabel { kind })?)?;
        }
    }
    let mut family = encoder.encode_descriptor(
        "cache_evictions",
        "Entries dropped, by kind and cause (size, expired, invalidated)",
        None,
        MetricType::Counter,
    )?;
    for (kind, stats) in all {
        for (cause, n) in [
            ("size", stats.evicted_size),
            ("expired", stats.evicted_expired),
            ("invalidated", stats.evicted_invalidated),
        ] {
            ConstCounter::new(n).encode(family.encode_family(&EvictionLabel { kind, cause })?)?;
        }
    }
    Ok(())
}

/// Entries, fetches in flight and bytes of every cache now, by kind.
pub(super) fn encode_cache_gauges(
    encoder: &mut DescriptorEncoder<'_>,
    all: &[(&'static str, cache::CacheStats)],
) -> Result<(), std::fmt::Error> {
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
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
        for (kind, stats) in all {
            ConstGauge::new(clamp(read(stats)))
                .encode(family.encode_family(&KindLabel { kind })?)?;
        }
    }
    Ok(())
}

/// The conventional `process_*` metrics, read from `/proc/self` at scrape time (no prefix).
#[derive(Debug)]
pub(super) struct ProcessCollector {
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
pub(super) fn cpu_seconds(stat: &str) -> f64 {
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
