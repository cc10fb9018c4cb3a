//! A real Prometheus (Debian's 2.42, installed by `.ci/run`) scraping the real binary every
//! second: every query of the Grafana dashboard, read from the dashboard file itself, returns
//! series with the labels its panel's legend uses, and the alert rules load and evaluate
//! against the real series (the failing-mounts and throttling alerts go pending, the
//! not-ready and down alerts stay quiet).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use testkit::{Endpoint, Fault};
use tokio::process::{Child, Command};
use tonic::Code;

use super::{CERTIFICATES, emulator, provider, request};
use crate::process::{free_port, http_get};

/// The job the alert rules select (the chart's metrics Service).
const JOB: &str = "oci-secrets-store-csi-driver-provider-metrics";
const MAX_IN_FLIGHT: &str = "37";

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// `prometheus` on `PATH` (the test that needs it is ignored unless asked for; asked for,
/// a missing binary fails it with what to install).
fn prometheus_binary() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("prometheus"))
                .find(|p| p.is_file())
        })
        .expect(
            "`prometheus` is not on PATH; install it (Debian: apt-get install prometheus) to run \
             the dashboard and alert queries against a real Prometheus",
        )
}

struct Prometheus {
    port: u16,
    _child: Child,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `127.0.0.1:metrics_port` as [`JOB`] every second, with the
    /// alert rules loaded, and waits until it is ready.
    async fn start(binary: &Path, metrics_port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rules = repo_file("deploy/prometheus/alerts.yaml");
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 1s}}\n\
             rule_files: [{rules:?}]\n\
             scrape_configs:\n\
             - job_name: {JOB}\n  static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n",
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let prometheus = Self {
            port,
            _child: child,
            _dir: dir,
        };
        eventually("Prometheus is ready", || async {
            (http_get(port, "/-/ready").await.0 == 200).then_some(())
        })
        .await;
        prometheus
    }

    /// `GET /api/v1/<path>`, its `data` (the answer must be `success`).
    async fn api(&self, path: &str) -> Value {
        let (code, body) = http_get(self.port, &format!("/api/v1/{path}")).await;
        let answer: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("/api/v1/{path}: HTTP {code}, not JSON ({e}): {body}"));
        assert_eq!(answer["status"], "success", "/api/v1/{path}: {answer}");
        answer["data"].clone()
    }

    /// An instant query's series.
    async fn query(&self, promql: &str) -> Vec<Value> {
        let data = self
            .api(&format!("query?query={}", url_encode(promql)))
            .await;
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Retries `probe` until it gives `Some` (scrapes and rule evaluations happen every second).
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Each panel's targets as (panel title, expr, legend labels).
fn dashboard_queries() -> Vec<(String, String, Vec<String>)> {
    let path = repo_file("deploy/grafana/oci-provider.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            let labels = legend
                .split("{{")
                .skip(1)
                .filter_map(|rest| rest.split_once("}}"))
                .map(|(label, _)| label.trim().to_owned())
                .collect();
            queries.push((
                panel["title"].as_str().unwrap().to_owned(),
                target["expr"].as_str().unwrap().to_owned(),
                labels,
            ));
        }
    }
    queries
}

fn label<'a>(series: &'a Value, name: &str) -> Option<&'a str> {
    series["metric"][name].as_str()
}

fn value(series: &Value) -> f64 {
    series["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// One mount of each kind the dashboard shows: cached successes, a NotFound, a 429 the
/// retries cannot outlast, certificates, and each principal.
async fn mount_each_kind(
    emu: &testkit::Emulator,
    client: &mut csi_grpc::client::Client,
    round: usize,
) {
    let pod = |i: usize| round * 10 + i;
    for auth in ["workload", "instance", "user"] {
        client
            .mount(request(auth, "sa-0", pod(1), "- name: db-password\n"))
            .await
            .unwrap_or_else(|e| panic!("{auth}: {e:?}"));
    }
    let missing = client
        .mount(request("workload", "sa-0", pod(2), "- name: nope\n"))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    emu.script(
        Endpoint::Secrets,
        [Fault::TooManyRequests {
            retry_after_secs: 30,
        }],
    );
    let mut throttled =
        tonic::Request::new(request("workload", "sa-0", pod(3), "- name: tls-key\n"));
    throttled.set_timeout(Duration::from_secs(5));
    let status = client.mount(throttled).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    client
        .mount(request("workload", "sa-0", pod(4), CERTIFICATES))
        .await
        .unwrap();
}

#[tokio::test]
#[ignore = "needs prometheus on PATH (Debian: prometheus)"]
async fn every_dashboard_query_returns_its_labels_from_a_real_prometheus() {
    let binary = prometheus_binary();
    let emu = emulator(1).await;
    let provider = provider(
        &emu,
        &[],
        &[("OCI_PROVIDER_SERVER__MAX_IN_FLIGHT_MOUNTS", MAX_IN_FLIGHT)],
    )
    .await;
    let prometheus = Prometheus::start(&binary, provider.metrics_port).await;
    let mut client = provider.client().await;

    // Two rounds with a scrape between them, so that every counter the first round creates
    // is seen to increase (a series' first sample is not a rate).
    mount_each_kind(&emu, &mut client, 1).await;
    eventually("the first round is scraped", || async {
        let seen = prometheus
            .query(&format!(
                "oci_provider_mounts_total{{job=\"{JOB}\",code=\"not_found\"}}"
            ))
            .await;
        seen.first().is_some_and(|s| value(s) >= 1.0).then_some(())
    })
    .await;
    mount_each_kind(&emu, &mut client, 2).await;
    eventually("the second round is scraped", || async {
        let seen = prometheus
            .query(&format!(
                "increase(oci_provider_mounts_total{{job=\"{JOB}\",code=\"resource_exhausted\"}}[1m])"
            ))
            .await;
        seen.first().is_some_and(|s| value(s) > 0.0).then_some(())
    })
    .await;

    // Every dashboard query returns series, each with the labels its legend names.
    let queries = dashboard_queries();
    assert!(queries.len() >= 19, "{queries:?}");
    for (panel, expr, labels) in &queries {
        let series = prometheus.query(expr).await;
        assert!(!series.is_empty(), "{panel}: `{expr}` returned no series");
        for s in &series {
            for name in labels {
                assert!(
                    label(s, name).is_some_and(|v| !v.is_empty()),
                    "{panel}: `{expr}` returned a series without `{name}`: {s}"
                );
            }
        }
    }

    // And what they return is what happened.
    let by = |series: &[Value], name: &str| -> Vec<(String, f64)> {
        let mut all: Vec<_> = series
            .iter()
            .map(|s| (label(s, name).unwrap_or_default().to_owned(), value(s)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    };
    let query_of = |title: &str| {
        queries
            .iter()
            .find(|(panel, ..)| panel == title)
            .unwrap_or_else(|| panic!("no panel {title}"))
            .1
            .clone()
    };
    let mounts = by(
        &prometheus
            .query(&query_of("Mounts per second by code"))
            .await,
        "code",
    );
    for code in ["ok", "not_found", "resource_exhausted"] {
        assert!(
            mounts.iter().any(|(c, rate)| c == code && *rate > 0.0),
            "{code}: {mounts:?}"
        );
    }
    let gave_up = prometheus
        .query(&format!(
            "sum by (reason) (oci_provider_upstream_gave_up_total{{job=\"{JOB}\"}}) > 0"
        ))
        .await;
    assert_eq!(by(&gave_up, "reason"), [("throttled".to_owned(), 2.0)]);
    let upstream = by(
        &prometheus
            .query(&query_of("Upstream calls by host class and status"))
            .await,
        "host_class",
    );
    for class in ["secrets", "certificates", "proxymux", "kubernetes"] {
        assert!(upstream.iter().any(|(c, _)| c == class), "{upstream:?}");
    }
    let hits = by(
        &prometheus.query(&query_of("Cache hit ratio")).await,
        "kind",
    );
    assert!(
        hits.iter().any(|(k, ratio)| k == "bundle" && *ratio > 0.0),
        "the second round's secrets came from the cache: {hits:?}"
    );
    let credentials = by(
        &prometheus.query(&query_of("Credentials by kind")).await,
        "kind",
    );
    for kind in ["rpst", "instance", "user"] {
        assert!(
            credentials.iter().any(|(k, _)| k == kind),
            "{credentials:?}"
        );
    }
    let expiry = prometheus
        .query(&query_of("Soonest certificate expiry"))
        .await;
    assert!(value(&expiry[0]) > 86_400.0, "{expiry:?}");
    let limit = prometheus
        .query("max by (instance) (oci_provider_mounts_in_flight_limit)")
        .await;
    assert_eq!(value(&limit[0]), 37.0);
    let ready = prometheus
        .query(&query_of("Ready (Version answers on the socket)"))
        .await;
    assert_eq!(value(&ready[0]), 1.0);

    // The alert rules load and evaluate without error against the real series; the
    // failing-mounts (by code) and throttling alerts are pending, the others quiet.
    let rules = eventually("every rule evaluated", || async {
        let groups = prometheus.api("rules").await;
        let rules: Vec<Value> = groups["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = rules.iter().all(|r| {
            !r["lastEvaluation"]
                .as_str()
                .unwrap_or("0001")
                .starts_with("0001")
        });
        (rules.len() == 7 && evaluated).then_some(rules)
    })
    .await;
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    let pending = eventually(
        "the failing-mounts and throttling alerts are pending",
        || async {
            let alerts = prometheus.api("alerts").await;
            let mut firing: Vec<(String, String)> = alerts["alerts"]
                .as_array()?
                .iter()
                .map(|a| {
                    let name = a["labels"]["alertname"].as_str().unwrap_or_default();
                    let code = a["labels"]["code"].as_str().unwrap_or_default();
                    (name.to_owned(), code.to_owned())
                })
                .collect();
            firing.sort();
            (firing.len() >= 3).then_some(firing)
        },
    )
    .await;
    assert_eq!(
        pending,
        [
            (
                "OCIProviderMountsFailing".to_owned(),
                "not_found".to_owned()
            ),
            (
                "OCIProviderMountsFailing".to_owned(),
                "resource_exhausted".to_owned()
            ),
            ("OCIProviderUpstreamThrottled".to_owned(), String::new()),
        ]
    );
    assert!(provider.terminate().await.status.success());
}
