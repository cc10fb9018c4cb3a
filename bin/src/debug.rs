//! The debug server (`--enable-pprof`, `--pprof-port`): CPU profiles, heap profiles (with
//! the `jemalloc` feature) and `/debug/stats`, on a loopback address only
//! (`server.pprof_address`, checked when the configuration loads).
//!
//! Profiles are in pprof's `profile.proto` format, which `go tool pprof` and `pprof` read.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use crate::metrics::Metrics;

/// `seconds` of a CPU profile when the query gives none (as Go's `net/http/pprof`).
const DEFAULT_PROFILE_SECONDS: u64 = 30;
/// Samples per second of a CPU profile (Go's rate is 100; 99 avoids lock-step with timers).
const FREQUENCY: i32 = 99;

/// What the debug server answers.
#[derive(Debug)]
pub(crate) struct Debug {
    metrics: Arc<Metrics>,
    max_profile_seconds: u64,
    /// One profile (CPU or heap) at a time: the CPU profiler is process-wide.
    profiling: tokio::sync::Semaphore,
    started: std::time::Instant,
}

/// A debug answer: status, content type, body.
pub(crate) type Answer = (StatusCode, &'static str, Vec<u8>);

fn text(status: StatusCode, body: impl Into<String>) -> Answer {
    (
        status,
        "text/plain; charset=utf-8",
        body.into().into_bytes(),
    )
}

impl Debug {
    pub(crate) fn new(metrics: Arc<Metrics>, max_profile_seconds: u64) -> Self {
        Self {
            metrics,
            max_profile_seconds,
            profiling: tokio::sync::Semaphore::new(1),
            started: std::time::Instant::now(),
        }
    }

    /// How long an answer may take: the longest profile, and time to encode it.
    pub(crate) fn answer_timeout(&self) -> Duration {
        Duration::from_secs(self.max_profile_seconds + 15)
    }

    pub(crate) async fn answer(&self, path: &str, query: Option<&str>) -> Answer {
        match path {
            "/debug/pprof" | "/debug/pprof/" => text(
                StatusCode::OK,
                format!(
                    "/debug/pprof/profile?seconds=N  CPU profile, N from 1 to {} (default {})\n\
                     /debug/pprof/heap               heap profile ({})\n\
                     /debug/stats                    tasks, connections, caches (JSON)\n",
                    self.max_profile_seconds,
                    DEFAULT_PROFILE_SECONDS.min(self.max_profile_seconds),
                    heap::AVAILABILITY,
                ),
            ),
            "/debug/pprof/profile" => match profile_seconds(query, self.max_profile_seconds) {
                Ok(seconds) => self.cpu(Duration::from_secs(seconds)).await,
                Err(why) => text(StatusCode::BAD_REQUEST, why),
            },
            "/debug/pprof/heap" => {
                let Ok(_permit) = self.profiling.try_acquire() else {
                    return busy();
                };
                heap::profile().await
            }
            "/debug/stats" => (
                StatusCode::OK,
                "application/json",
                serde_json::to_vec_pretty(&self.stats()).unwrap_or_default(),
            ),
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    async fn cpu(&self, duration: Duration) -> Answer {
        let Ok(_permit) = self.profiling.try_acquire() else {
            return busy();
        };
        match tokio::task::spawn_blocking(move || cpu::profile(duration)).await {
            Ok(Ok(bytes)) => (StatusCode::OK, "application/octet-stream", bytes),
            Ok(Err(why)) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")),
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the CPU profile was not taken\n",
            ),
        }
    }

    /// Counts only: tasks, connections per host, cache entries and bytes, credentials
    /// cached per principal kind. Never a token, a key id or a secret value.
    fn stats(&self) -> serde_json::Value {
        let sources = &self.metrics.sources;
        let tasks_alive = tokio::runtime::Handle::try_current()
            .map(|h| h.metrics().num_alive_tasks())
            .ok();
        let upstream: serde_json::Map<String, serde_json::Value> = sources
            .transport
            .stats()
            .into_iter()
            .map(|(host, s)| {
                (
                    host,
                    json!({
                        "open": s.open,
                        "opened": s.opened,
                        "closed": s.closed,
                        "high_water": s.high_water,
                        "requests": s.requests,
                    }),
                )
            })
            .collect();
        let cache = |s: cache::CacheStats| {
            json!({
                "entries": s.entries,
                "bytes": s.bytes,
                "in_flight": s.in_flight,
                "hits": s.hits,
                "misses": s.misses,
                "joined": s.joined,
            })
        };
        let credentials: serde_json::Map<String, serde_json::Value> = sources
            .principals
            .cache_stats()
            .into_iter()
            .map(|(kind, s)| (kind.to_owned(), cache(s)))
            .collect();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": self.started.elapsed().as_secs(),
            "tasks_alive": tasks_alive,
            "mounts_in_flight": sources.in_flight.get(),
            "mounts_queued": sources.queued.get(),
            "in_flight_bytes": sources.budget.used(),
            "upstream_connections": upstream,
            "bundle_cache": cache(sources.bundles.stats()),
            "credentials_cached": credentials,
            "allocator": heap::ALLOCATOR,
        })
    }
}

fn profile_seconds(query: Option<&str>, max: u64) -> Result<u64, String> {
    let given = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("seconds="));
    let Some(given) = given else {
        return Ok(DEFAULT_PROFILE_SECONDS.min(max));
    };
    match given.parse::<u64>() {
        Ok(seconds) if (1..=max).contains(&seconds) => Ok(seconds),
        _ => Err(format!(
            "seconds={}: a CPU profile takes a whole number of seconds from 1 to {max} \
             (server.max_profile_seconds)\n",
            given.chars().take(32).collect::<String>()
        )),
    }
}

fn busy() -> Answer {
    text(
        StatusCode::CONFLICT,
        "another profile is being taken; one at a time\n",
    )
}

/// CPU profiles: `pprof`'s sampling profiler (SIGPROF), encoded as `profile.proto` here
/// with the workspace's one prost (pprof's own encoders bring a second prost or protobuf).
mod cpu {
    use std::collections::HashMap;
    use std::time::{Duration, UNIX_EPOCH};

    use prost::Message as _;

    use super::FREQUENCY;
    use crate::profile_proto as proto;

    /// Samples the whole process for `duration` (blocking the calling thread).
    pub(super) fn profile(duration: Duration) -> Result<Vec<u8>, String> {
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY)
            // Unwinding through these while they hold their locks can deadlock.
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .map_err(|e| format!("cannot start the CPU profiler: {e}"))?;
        std::thread::sleep(duration);
        let report = guard
            .report()
            .build()
            .map_err(|e| format!("cannot read the CPU profile: {e}"))?;
        drop(guard);
        Ok(encode(&report).encode_to_vec())
    }

    /// Strings, functions and locations interned into one profile.
    #[derive(Default)]
    struct Tables {
        strings: Vec<String>,
        string_ids: HashMap<String, i64>,
        functions: Vec<proto::Function>,
        function_ids: HashMap<(i64, i64), u64>,
        locations: Vec<proto::Location>,
        location_ids: HashMap<Vec<(u64, i64)>, u64>,
    }

    impl Tables {
        fn new() -> Self {
            let mut tables = Self::default();
            tables.string(""); // index 0 is the empty string, as profile.proto requires
            tables
        }

        fn string(&mut self, s: &str) -> i64 {
            if let Some(id) = self.string_ids.get(s) {
                return *id;
            }
            let id = self.strings.len() as i64;
            self.strings.push(s.to_owned());
            self.string_ids.insert(s.to_owned(), id);
            id
        }

        fn function(&mut self, name: &str, system_name: &str, file: &str) -> u64 {
            let (name, system_name, filename) = (
                self.string(name),
                self.string(system_name),
                self.string(file),
            );
            if let Some(id) = self.function_ids.get(&(name, filename)) {
                return *id;
            }
            let id = self.functions.len() as u64 + 1;
            self.functions.push(proto::Function {
                id,
                name,
                system_name,
                filename,
            });
            self.function_ids.insert((name, filename), id);
            id
        }

        /// One location per distinct list of (function, line): an address with the
        /// functions inlined into it, innermost first.
        fn location(&mut self, lines: Vec<(u64, i64)>, address: u64) -> u64 {
            if let Some(id) = self.location_ids.get(&lines) {
                return *id;
            }
            let id = self.locations.len() as u64 + 1;
            self.locations.push(proto::Location {
                id,
                address,
                line: lines
                    .iter()
                    .map(|&(function_id, line)| proto::Line { function_id, line })
                    .collect(),
            });
            self.location_ids.insert(lines, id);
            id
        }
    }

    pub(super) fn encode(report: &pprof::Report) -> proto::Profile {
        let period = 1_000_000_000 / i64::from(report.timing.frequency.max(1));
        let mut t = Tables::new();
        let mut samples = Vec::with_capacity(report.data.len());
        for (frames, count) in &report.data {
            let mut location_id = Vec::with_capacity(frames.frames.len());
            for symbols in &frames.frames {
                let lines: Vec<(u64, i64)> = symbols
                    .iter()
                    .map(|symbol| {
                        let function =
                            t.function(&symbol.name(), &symbol.sys_name(), &symbol.filename());
                        (function, i64::from(symbol.lineno()))
                    })
                    .collect();
                if lines.is_empty() {
                    continue;
                }
                let address = symbols
                    .first()
                    .and_then(|s| s.addr)
                    .map_or(0, |a| a as usize as u64);
                location_id.push(t.location(lines, address));
            }
            let count = *count as i64;
            let key = t.string("thread");
            let thread = t.string(&frames.thread_name_or_id());
            samples.push(proto::Sample {
                location_id,
                value: vec![count, count * period],
                label: vec![proto::Label { key, str: thread }],
            });
        }
        let sample_type = vec![
            proto::ValueType {
                r#type: t.string("samples"),
                unit: t.string("count"),
            },
            proto::ValueType {
                r#type: t.string("cpu"),
                unit: t.string("nanoseconds"),
            },
        ];
        let period_type = Some(proto::ValueType {
            r#type: t.string("cpu"),
            unit: t.string("nanoseconds"),
        });
        proto::Profile {
            sample_type,
            sample: samples,
            location: t.locations,
            function: t.functions,
            string_table: t.strings,
            time_nanos: report
                .timing
                .start_time
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            duration_nanos: i64::try_from(report.timing.duration.as_nanos()).unwrap_or(i64::MAX),
            period_type,
            period,
        }
    }
}

/// Heap profiles: jemalloc's sampling heap profiler through `jemalloc_pprof`, with the
/// `jemalloc` feature; otherwise a clear answer saying how to get one.
#[cfg(feature = "jemalloc")]
mod heap {
    use http::StatusCode;

    use super::{Answer, text};

    pub(super) const ALLOCATOR: &str = "jemalloc";
    pub(super) const AVAILABILITY: &str =
        "jemalloc; needs _RJEM_MALLOC_CONF=prof:true,prof_active:true,lg_prof_sample:19";

    pub(super) async fn profile() -> Answer {
        let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref() else {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "jemalloc's heap profiler is off: start the provider with \
                 _RJEM_MALLOC_CONF=prof:true,prof_active:true,lg_prof_sample:19\n",
            );
        };
        let ctl = ctl.clone();
        let dumped = tokio::task::spawn_blocking(move || {
            let mut ctl = ctl.blocking_lock();
            if !ctl.activated() {
                return Err(
                    "jemalloc's heap profiler is not active: start the provider with \
                     _RJEM_MALLOC_CONF=prof:true,prof_active:true,lg_prof_sample:19"
                        .to_owned(),
                );
            }
            ctl.dump_pprof()
                .map_err(|e| format!("cannot dump the heap profile: {e:#}"))
        })
        .await;
        match dumped {
            Ok(Ok(bytes)) => (StatusCode::OK, "application/octet-stream", bytes),
            Ok(Err(why)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the heap profile was not taken\n",
            ),
        }
    }
}

#[cfg(not(feature = "jemalloc"))]
mod heap {
    use http::StatusCode;

    use super::{Answer, text};

    pub(super) const ALLOCATOR: &str = "system";
    pub(super) const AVAILABILITY: &str = "needs a build with --features jemalloc";

    pub(super) async fn profile() -> Answer {
        text(
            StatusCode::NOT_IMPLEMENTED,
            "this build has no heap profiler: build with `cargo build --release --features \
             jemalloc` (or the image's jemalloc variant) and start it with \
             _RJEM_MALLOC_CONF=prof:true,prof_active:true,lg_prof_sample:19\n",
        )
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    #[test]
    fn a_cpu_profile_of_busy_work_names_its_functions() {
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(999)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .unwrap();
        let until = std::time::Instant::now() + Duration::from_millis(300);
        let mut x = 0u64;
        while std::time::Instant::now() < until {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let report = guard.report().build().unwrap();
        drop(guard);
        let bytes = cpu::encode(&report).encode_to_vec();
        let profile = crate::profile_proto::Profile::decode(bytes.as_slice()).unwrap();
        assert_eq!(profile.string_table[0], "");
        assert!(!profile.sample.is_empty(), "no samples in 300 ms of work");
        let names: Vec<&str> = profile
            .function
            .iter()
            .map(|f| profile.string_table[f.name as usize].as_str())
            .collect();
        assert!(
            names
                .iter()
                .any(|n| n.contains("a_cpu_profile_of_busy_work")),
            "{names:?}"
        );
        for sample in &profile.sample {
            assert_eq!(sample.value.len(), profile.sample_type.len());
            for id in &sample.location_id {
                assert!(*id >= 1 && *id as usize <= profile.location.len());
            }
        }
        assert_eq!(profile.period, 1_000_000_000 / 999);
    }

    #[test]
    fn profile_seconds_are_bounded() {
        assert_eq!(profile_seconds(None, 60), Ok(30));
        assert_eq!(profile_seconds(None, 10), Ok(10));
        assert_eq!(profile_seconds(Some("debug=1&seconds=5"), 60), Ok(5));
        for bad in [
            "seconds=0",
            "seconds=61",
            "seconds=-1",
            "seconds=1.5",
            "seconds=",
        ] {
            let err = profile_seconds(Some(bad), 60).unwrap_err();
            assert!(err.contains("from 1 to 60"), "{bad}: {err}");
        }
    }
}
