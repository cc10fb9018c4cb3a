//! Traces: the binary exports OTLP/HTTP protobuf to an in-process receiver; the span tree
//! of a successful and a failed mount, and mounts unaffected by a dead collector.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clock::SystemClock;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;
use testkit::{Emulator, SecretSeed, Seed};

use crate::process::Provider;

const VAULT: &str = "ocid1.vault.oc1.iad.traces";
const CONTENT: &str = "traced-secret-never-exported";
const INSTANCE_TENANCY: &str = "ocid1.tenancy.oc1..tracesinstance";

/// Collects the bodies POSTed to it, answering 200.
async fn receiver() -> (u16, Arc<Mutex<Vec<Bytes>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = bodies.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |request: http::Request<hyper::body::Incoming>| {
                        let kept = kept.clone();
                        async move {
                            let body = request
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            kept.lock().unwrap().push(body);
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                Bytes::new(),
                            )))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (port, bodies)
}

fn spans(bodies: &[Bytes]) -> Vec<Span> {
    bodies
        .iter()
        .filter_map(|b| ExportTraceServiceRequest::decode(b.as_ref()).ok())
        .flat_map(|r| r.resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            Value::IntValue(i) => Some(i.to_string()),
            Value::BoolValue(b) => Some(b.to_string()),
            other => Some(format!("{other:?}")),
        }
    })
}

async fn emulator() -> Emulator {
    let mut seed = Seed::default();
    seed.instance.tenancy = INSTANCE_TENANCY.into();
    let seed = seed.vault(VAULT).service_account("app", "web").secret(
        SecretSeed::new("ocid1.vaultsecret.oc1.iad.traced", VAULT, "db")
            .version(1, CONTENT, &["CURRENT"])
            .allow_workload("app", "web")
            .allow_instance_tenancy(INSTANCE_TENANCY),
    );
    Emulator::start(seed, Arc::new(SystemClock)).await.unwrap()
}

fn request(secrets: &str) -> csi_grpc::proto::MountRequest {
    csi_grpc::proto::MountRequest {
        attributes: json!({
            "secrets": secrets,
            "vaultId": VAULT,
            "authType": "workload",
            "csi.storage.k8s.io/pod.name": "web-0",
            "csi.storage.k8s.io/pod.namespace": "app",
            "csi.storage.k8s.io/pod.uid": "00000000-0000-0000-0000-000000000001",
            "csi.storage.k8s.io/serviceAccount.name": "web",
        })
        .to_string(),
        secrets: "{}".into(),
        target_path: "/tmp/x".into(),
        permission: "420".into(),
        current_object_version: vec![],
    }
}

#[tokio::test]
async fn mounts_are_exported_as_span_trees_without_secrets() {
    let emu = emulator().await;
    let (port, bodies) = receiver().await;
    let endpoint = format!("http://127.0.0.1:{port}");
    let config = emu.files().provider_config.to_str().unwrap().to_owned();
    let provider = Provider::start(
        &["--config", &config],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OCI_PROVIDER_CACHE__BUNDLE_TTL_SECONDS", "0"),
        ],
    )
    .await;
    let mut client = provider.client().await;
    client.mount(request("- name: db\n")).await.unwrap();
    let status = client.mount(request("- name: nope\n")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
    let metrics = provider.metrics().await;
    let output = provider.terminate().await;
    assert!(output.status.success());
    let all = spans(&bodies.lock().unwrap());
    let mounts: Vec<&Span> = all.iter().filter(|s| s.name == "mount").collect();
    assert_eq!(
        mounts.len(),
        2,
        "{:?}",
        all.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let codes: Vec<_> = mounts
        .iter()
        .map(|s| attribute(s, "rpc.grpc.status_code"))
        .collect();
    assert_eq!(codes, [Some("0".into()), Some("5".into())]);
    for mount in &mounts {
        assert_eq!(attribute(mount, "rpc.system").as_deref(), Some("grpc"));
        assert_eq!(attribute(mount, "rpc.method").as_deref(), Some("Mount"));
        assert_eq!(attribute(mount, "pod.namespace").as_deref(), Some("app"));
        assert_eq!(attribute(mount, "pod.name").as_deref(), Some("web-0"));
        assert!(mount.parent_span_id.is_empty(), "mounts are roots");
        // Its children: the identity, each fetch, and the upstream requests below them.
        let children: Vec<&Span> = all
            .iter()
            .filter(|s| s.parent_span_id == mount.span_id)
            .collect();
        let names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
        assert!(
            names.contains(&"establish identity") && names.contains(&"fetch secret"),
            "{names:?}"
        );
        let fetch = children.iter().find(|s| s.name == "fetch secret").unwrap();
        assert_eq!(attribute(fetch, "region").as_deref(), Some("primary"));
        assert!(attribute(fetch, "oci.request_id").is_some_and(|id| !id.is_empty()));
        let upstream: Vec<&Span> = all
            .iter()
            .filter(|s| s.parent_span_id == fetch.span_id && s.name == "upstream request")
            .collect();
        assert_eq!(upstream.len(), 1);
        assert!(attribute(upstream[0], "http.response.status_code").is_some());
    }
    assert_eq!(attribute(mounts[0], "files").as_deref(), Some("1"));
    let identity = all.iter().find(|s| s.name == "establish identity").unwrap();
    assert_eq!(
        attribute(identity, "principal").as_deref(),
        Some("workload")
    );
    // No secret bytes, security token or service-account token in what was exported.
    let raw: Vec<u8> = bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| b.to_vec())
        .collect();
    let raw = String::from_utf8_lossy(&raw);
    for needle in [CONTENT, "ST$", "eyJ", "Bearer", "Signature"] {
        assert!(!raw.contains(needle), "the export holds {needle:?}");
    }
    assert_eq!(
        metrics
            .lines()
            .find(|l| l.starts_with("oci_provider_otlp_export_failures_total"))
            .and_then(|l| l.rsplit(' ').next()),
        Some("0")
    );
}

#[tokio::test]
async fn a_dead_collector_never_fails_a_mount_and_the_drops_are_counted() {
    let emu = emulator().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{dead}");
    let config = emu.files().provider_config.to_str().unwrap().to_owned();
    let provider = Provider::start(
        &["--config", &config],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    )
    .await;
    let mut client = provider.client().await;
    for _ in 0..5 {
        let response = client
            .mount(request("- name: db\n"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.files[0].contents, CONTENT.as_bytes());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = provider.metrics().await;
        let failures: f64 = metrics
            .lines()
            .find(|l| l.starts_with("oci_provider_otlp_export_failures_total"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0);
        if failures >= 1.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "export failures are counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(provider.terminate().await.status.success());
}

#[tokio::test]
async fn grpc_is_refused_as_the_otlp_protocol() {
    let output = Provider::spawn_at(
        &std::env::temp_dir().join("never-otlp.sock"),
        &["--otlp-endpoint", "http://127.0.0.1:4318"],
        &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
    )
    .wait_exit()
    .await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        output.stderr.contains("http/protobuf only"),
        "{}",
        output.stderr
    );
}

#[tokio::test]
async fn a_stalled_collector_fills_the_bounded_queue_and_the_drops_are_counted() {
    let emu = emulator().await;
    // Accepts connections and reads nothing: every export waits.
    let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = stalled.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = stalled.accept().await {
            open.push(stream);
        }
    });
    let endpoint = format!("http://127.0.0.1:{port}");
    let config = emu.files().provider_config.to_str().unwrap().to_owned();
    let provider = Provider::start(
        &["--config", &config, "--otlp-endpoint", &endpoint],
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "4"),
            ("OCI_PROVIDER_CACHE__BUNDLE_TTL_SECONDS", "0"),
        ],
    )
    .await;
    let mut client = provider.client().await;
    for _ in 0..20 {
        let response = client
            .mount(request("- name: db\n"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.files[0].contents, CONTENT.as_bytes());
    }
    let metrics = provider.metrics().await;
    let dropped: f64 = metrics
        .lines()
        .find(|l| l.starts_with("oci_provider_otlp_spans_dropped_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0);
    // 20 mounts make at least 80 spans; at most 4 wait and one batch is being exported.
    assert!(dropped >= 60.0, "{metrics}");
    assert_eq!(
        metrics
            .lines()
            .find(|l| l.starts_with("oci_provider_mounts_total{code=\"ok\"}"))
            .and_then(|l| l.rsplit(' ').next()),
        Some("20"),
        "{metrics}"
    );
    assert!(provider.terminate().await.status.success());
    held.abort();
}
