//! The real grpc-go library against our socket, dialled as each driver version dials:
//! the socket path as `:authority` (drivers v1.0 to v1.5.x) and `localhost` (v1.6.0).
//! The client is the testkit's `driver/driverclient.go`, built with Debian's `golang-go` +
//! `golang-google-grpc-dev` (offline, GOPATH mode); `.ci/run` installs them. The same client
//! dials as the secrets-store-sync-controller v0.0.4 does (no deadline, no `Version`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrets_store_csi_grpc::{
    File, FileContents, FilePath, MountError, MountLimits, MountRequest, MountResponse,
    ObjectVersion,
};
use serde_json::Value;
use testkit::{DriverClient, fnv1a};

use crate::support::start;

fn driver_client() -> DriverClient {
    DriverClient::for_tests(env!("CARGO_TARGET_TMPDIR"))
}

/// `version` is a driver version (`v1.6`) or `sync-controller/v0.0.4`.
fn fixture_path(version: &str) -> PathBuf {
    let name = if version.contains('/') {
        version.to_owned()
    } else {
        format!("driver/{version}")
    };
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/{name}.json"))
}

fn fixture(version: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture_path(version)).unwrap()).unwrap()
}

/// What the fake provider saw of one mount, to compare with the fixture's `expect`.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    caller: &'static str,
    pod_namespace: Option<String>,
    pod_name: Option<String>,
    service_account: Option<String>,
    token_audiences: Vec<String>,
    current_object_versions: usize,
    node_publish_secrets: usize,
    secret_provider_class: Option<String>,
    file_size: usize,
}

/// The bytes of a test file of `size` bytes: a pattern the client checksums, so a frame
/// lost, repeated or reordered on the way shows.
fn pattern(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i * 31 % 251) as u8).collect()
}

type Recorder = Arc<Mutex<Vec<Seen>>>;

fn recording_provider(
    seen: Recorder,
) -> impl tower::Service<MountRequest, Response = MountResponse, Error = MountError, Future: Send>
+ Clone
+ Send
+ Sync {
    tower::service_fn(move |req: MountRequest| {
        let seen = seen.clone();
        async move {
            let file_size: usize = req
                .attributes
                .get("test.fileSize")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            seen.lock().unwrap().push(Seen {
                caller: req.caller.as_str(),
                pod_namespace: req.pod.namespace.clone(),
                pod_name: req.pod.name.clone(),
                service_account: req.pod.service_account.clone(),
                token_audiences: req
                    .service_account_tokens
                    .audiences()
                    .map(str::to_owned)
                    .collect(),
                current_object_versions: req.current_object_versions.len(),
                node_publish_secrets: req.node_publish_secrets.len(),
                secret_provider_class: req.attributes.get("secretProviderClass").cloned(),
                file_size,
            });
            Ok(MountResponse {
                files: vec![File {
                    path: FilePath::new("data/secret").unwrap(),
                    mode: req.file_mode,
                    contents: FileContents::new(pattern(file_size)),
                }],
                object_versions: vec![ObjectVersion {
                    id: "ocid1.vaultsecret.oc1.iad.fixture".into(),
                    version: "1".into(),
                }],
            })
        }
    })
}

fn expected(request: &Value) -> Seen {
    let e = &request["expect"];
    let s = |k: &str| e[k].as_str().map(str::to_owned);
    Seen {
        caller: match e["caller"].as_str() {
            Some("sync-controller") => "sync-controller",
            _ => "driver",
        },
        pod_namespace: s("pod_namespace"),
        pod_name: s("pod_name"),
        service_account: s("service_account"),
        token_audiences: e["token_audiences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect(),
        current_object_versions: e["current_object_versions"].as_u64().unwrap() as usize,
        node_publish_secrets: e["node_publish_secrets"].as_u64().unwrap() as usize,
        secret_provider_class: s("secret_provider_class"),
        file_size: e["file_size"].as_u64().unwrap() as usize,
    }
}

/// Runs the Go client on `socket` with `fixture` and returns its summary.
async fn run_client(client: &DriverClient, socket: &Path, version: &str, args: &[&str]) -> Value {
    let (summary, ok) = client
        .run(socket, &fixture_path(version), args)
        .await
        .unwrap();
    assert!(ok, "driver client ({version}) failed: {summary}");
    summary
}

async fn replay(version: &str, repeat: usize) {
    let client = driver_client();
    let seen = Recorder::default();
    let server = start(
        recording_provider(seen.clone()),
        MountLimits::default(),
        Duration::from_secs(1),
    );
    let fx = fixture(version);
    let requests = fx["requests"].as_array().unwrap();
    let summary = run_client(
        &client,
        &server.path,
        version,
        &["-repeat", &repeat.to_string()],
    )
    .await;

    let dial = fx["dial"].as_str().unwrap();
    let authority = summary["authority"].as_str().unwrap();
    if dial == "socket-path" {
        assert_eq!(
            authority,
            server.path.to_str().unwrap(),
            "grpc-go sent the path"
        );
    } else {
        assert_eq!(authority, "localhost");
    }
    if dial == "sync-controller" {
        // Mounts without a grpc-timeout and without a Version call first.
        assert_eq!(summary["deadline_sent"], false);
        assert!(summary["version"].is_null(), "{summary}");
    } else {
        assert_eq!(summary["deadline_sent"], true);
        assert_eq!(summary["version"]["version"], "v1alpha1");
        assert_eq!(summary["version"]["runtime_name"], "test-provider");
    }
    assert_eq!(
        summary["mounts"].as_u64().unwrap() as usize,
        requests.len() * repeat
    );
    assert_eq!(summary["failures"].as_array().unwrap().len(), 0);

    // Every answer arrived whole: size and checksum of the pattern the provider wrote.
    let results = summary["results"].as_array().unwrap();
    assert_eq!(results.len(), (requests.len() * repeat).min(1000));
    for (result, request) in results.iter().zip(requests.iter().cycle()) {
        let size = expected(request).file_size;
        let file = &result["files"][0];
        assert_eq!(file["path"], "data/secret");
        assert_eq!(file["mode"], 420, "the driver's permission, decimal 0644");
        assert_eq!(file["size"].as_u64().unwrap() as usize, size);
        assert_eq!(
            file["checksum"].as_u64().unwrap() as u32,
            fnv1a(&pattern(size))
        );
        assert_eq!(result["object_versions"][0]["version"], "1");
    }

    // And the provider saw what each driver version sends.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), requests.len() * repeat);
    for (seen, request) in seen.iter().zip(requests.iter().cycle()) {
        assert_eq!(seen, &expected(request), "{}", request["name"]);
    }
    server.stop().await;
}

#[ignore = "needs Go and grpc-go (Debian: golang-go golang-google-grpc-dev golang-google-protobuf-dev)"]
#[tokio::test]
async fn driver_v1_0_with_the_socket_path_as_authority() {
    replay("v1.0", 1).await;
}

#[ignore = "needs Go and grpc-go (Debian: golang-go golang-google-grpc-dev golang-google-protobuf-dev)"]
#[tokio::test]
async fn driver_v1_1_with_the_socket_path_as_authority() {
    replay("v1.1", 1).await;
}

#[ignore = "needs Go and grpc-go (Debian: golang-go golang-google-grpc-dev golang-google-protobuf-dev)"]
#[tokio::test]
async fn driver_v1_2_with_the_socket_path_as_authority() {
    replay("v1.2", 1).await;
}

#[ignore = "needs Go and grpc-go (Debian: golang-go golang-google-grpc-dev golang-google-protobuf-dev)"]
#[tokio::test]
async fn driver_v1_3_many_mounts_on_one_connection() {
    // 3 requests x 40: 120 mounts on one connection, two thirds of them above 16 KiB, so
    // grpc-go's HPACK dynamic table is reused for every request after the first.
    replay("v1.3", 40).await;
}

#[ignore = "needs Go and grpc-go (Debian: golang-go golang-google-grpc-dev golang-google-protobuf-dev)"]
#[tokio::test]
async fn driver_v1_4_with_the_socket_path_as_authority() {
    replay("v1.4", 1).await;
}

#[ignore = "needs Go and grpc-go (Debian: golang-go golang-google-grpc-dev golang-google-protobuf-dev)"]
#[tokio::test]
async fn driver_v1_5_with_the_socket_path_as_authority() {
    replay("v1.5", 1).await;
}

#[ignore = "needs Go and grpc-go (Debian: golang-go golang-google-grpc-dev golang-google-protobuf-dev)"]
#[tokio::test]
async fn driver_v1_6_with_localhost_many_mounts_on_one_connection() {
    replay("v1.6", 34).await;
}

#[ignore = "needs Go and grpc-go (Debian: golang-go golang-google-grpc-dev golang-google-protobuf-dev)"]
#[tokio::test]
async fn sync_controller_v0_0_4_without_deadline_or_version_with_and_without_tokens() {
    replay("sync-controller/v0.0.4", 5).await;
}

/// The controller's calls carry no `grpc-timeout`: each mount gets the provider's default
/// deadline, and a mount that would never end is answered DeadlineExceeded at that
/// deadline instead of holding the controller's only reconcile worker forever.
#[ignore = "needs Go and grpc-go (Debian: golang-go golang-google-grpc-dev golang-google-protobuf-dev)"]
#[tokio::test]
async fn a_sync_controller_mount_without_a_deadline_gets_the_providers_own() {
    let client = driver_client();
    let limits = MountLimits {
        default_deadline: Duration::from_secs(2),
        ..MountLimits::default()
    };
    let given = Arc::new(Mutex::new(Vec::new()));
    let recorded = given.clone();
    let provider = tower::service_fn(move |req: MountRequest| {
        let recorded = recorded.clone();
        async move {
            recorded.lock().unwrap().push(
                req.deadline
                    .saturating_duration_since(tokio::time::Instant::now()),
            );
            std::future::pending::<Result<MountResponse, MountError>>().await
        }
    });
    let server = start(provider, limits, Duration::from_secs(1));
    let mut fx = fixture("sync-controller/v0.0.4");
    fx["requests"] = Value::Array(vec![fx["requests"][0].clone()]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stall.json");
    std::fs::write(&path, fx.to_string()).unwrap();
    let (summary, ok) = client
        .run(&server.path, &path, &["-watchdog", "30s"])
        .await
        .unwrap();
    assert!(!ok, "{summary}");
    let failures = summary["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{summary}");
    let failure = failures[0].as_str().unwrap();
    assert!(failure.contains("DeadlineExceeded"), "{failure}");
    let given = given.lock().unwrap().clone();
    assert_eq!(
        given.len(),
        1,
        "one mount (DeadlineExceeded is not retried)"
    );
    assert!(
        given[0] <= Duration::from_secs(2) && given[0] > Duration::from_secs(1),
        "the mount was given {:?}, not the 2 s default",
        given[0]
    );
    server.stop().await;
}

#[ignore = "needs Python's grpcio (pip install grpcio)"]
#[tokio::test]
async fn a_v1_6_request_dialled_with_the_socket_path_works_too() {
    let client = driver_client();
    let server = start(
        recording_provider(Recorder::default()),
        MountLimits::default(),
        Duration::from_secs(1),
    );
    let summary = run_client(&client, &server.path, "v1.6", &["-dial", "socket-path"]).await;
    assert_eq!(summary["authority"], server.path.to_str().unwrap());
    assert_eq!(summary["mounts"], 3);
    server.stop().await;
}

/// Python's grpcio (grpc-core), pinned in `.ci/run`: its default authority for a `unix:`
/// target is the percent-encoded socket path; `grpc.default_authority` sends the path.
async fn grpcio(authority: &str) {
    let have_grpcio = Command::new("python3")
        .args(["-c", "import grpc"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        have_grpcio,
        "grpc-core compat tests need Python's grpcio (pip install grpcio)"
    );
    let server = start(
        recording_provider(Recorder::default()),
        MountLimits::default(),
        Duration::from_secs(1),
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpcio/client.py");
    let output = tokio::process::Command::new("python3")
        .arg(script)
        .arg("--socket")
        .arg(&server.path)
        .args(["--authority", authority, "--mounts", "20"])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "grpcio client failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["version"]["1"], "v1alpha1");
    assert_eq!(summary["file_sizes"], serde_json::json!(vec![20000; 20]));
    server.stop().await;
}

#[ignore = "needs Python's grpcio (pip install grpcio)"]
#[tokio::test]
async fn grpc_core_with_its_default_percent_encoded_authority() {
    grpcio("default").await;
}

#[ignore = "needs Python's grpcio (pip install grpcio)"]
#[tokio::test]
async fn grpc_core_with_the_socket_path_as_authority() {
    grpcio("path").await;
}
