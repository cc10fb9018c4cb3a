//! The real binary: flags, socket, health, metrics, signals.
#![allow(clippy::disallowed_methods)]
// reason: tests parse what they build; the budgets are the code's
// Test helpers are shared between modules of this one test binary; they are not an API.
#![allow(unreachable_pub, missing_debug_implementations)]

mod check;
mod debug;
mod e2e;
mod process;
mod traces;

use csi_grpc::proto::{MountRequest, VersionRequest};
use process::{Provider, http_get};
use serde_json::json;
use tonic::Code;

fn mount_request(attributes: serde_json::Value) -> MountRequest {
    MountRequest {
        attributes: attributes.to_string(),
        secrets: "{}".into(),
        target_path: "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/v/mount".into(),
        permission: "420".into(),
        current_object_version: vec![],
    }
}

fn valid_workload_attributes(extra: serde_json::Value) -> serde_json::Value {
    let mut attributes = json!({
        "secrets": "- name: db-password\n",
        "vaultId": "ocid1.vault.oc1.iad.example",
        "authType": "workload",
        "secretProviderClass": "app-spc",
        "csi.storage.k8s.io/pod.name": "web-0",
        "csi.storage.k8s.io/pod.namespace": "app",
        "csi.storage.k8s.io/pod.uid": "0f6c2b1e",
        "csi.storage.k8s.io/serviceAccount.name": "web",
    });
    if let (Some(a), Some(e)) = (attributes.as_object_mut(), extra.as_object()) {
        a.extend(e.clone());
    }
    attributes
}

#[tokio::test]
async fn starts_with_the_go_flags_and_serves_version_health_and_metrics() {
    let pprof_port = format!("-pprof-port={}", process::free_port());
    let provider = Provider::start(
        &[
            "--enable-pprof=true",
            &pprof_port,
            "--metrics-backend",
            "prometheus",
        ],
        &[],
    )
    .await;
    let mut client = provider.client().await;

    let version = client
        .version(VersionRequest {
            version: "v1alpha1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(version.version, "v1alpha1");
    assert_eq!(
        version.runtime_name,
        "oci-secrets-store-csi-driver-provider"
    );
    assert_eq!(version.runtime_version, env!("CARGO_PKG_VERSION"));

    let status = client
        .mount(mount_request(json!({"authType": "workload"})))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("missed \"secrets\""),
        "{}",
        status.message()
    );

    let status = client
        .mount(mount_request(valid_workload_attributes(json!({}))))
        .await
        .unwrap_err();
    // No region and no endpoints configured: the identity cannot be established, and the
    // status says why.
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("no region is configured"),
        "{status:?}"
    );

    for path in ["/health", "/healthz", "/readyz"] {
        let (code, _) = http_get(provider.healthz_port, path).await;
        assert_eq!(code, 200, "{path}");
    }
    let (code, _) = http_get(provider.healthz_port, "/nope").await;
    assert_eq!(code, 404);
    let (code, body) = http_get(provider.metrics_port, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        body.contains("oci_provider_mounts_total{code=\"invalid_argument\"} 2"),
        "{body}"
    );
    // Which crypto module runs: AWS-LC's FIPS module in the `fips` build.
    let fips = cfg!(feature = "fips");
    let build_info = format!(
        "oci_provider_build_info{{version=\"{}\",fips=\"{fips}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        body.lines().any(|l| l == build_info),
        "{build_info}: {body}"
    );

    let output = provider.terminate().await;
    assert!(output.status.success(), "{output:?}");
    assert!(
        output.stderr.contains("debug server listening"),
        "{}",
        output.stderr
    );
    let module = if fips {
        "AWS-LC FIPS module (aws-lc-fips-sys)"
    } else {
        "AWS-LC (aws-lc-sys)"
    };
    assert!(
        output
            .stderr
            .lines()
            .any(|l| l.contains("crypto module") && l.contains(module)),
        "{}",
        output.stderr
    );
}

#[tokio::test]
async fn sigterm_lets_in_flight_mounts_answer_exits_zero_and_removes_the_socket() {
    let provider = Provider::start(&[], &[]).await;
    let client = provider.client().await;
    let mounts: Vec<_> = (0..16)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .mount(mount_request(valid_workload_attributes(json!({}))))
                    .await
            })
        })
        .collect();
    let socket = provider.socket.clone();
    let output = provider.terminate().await;
    for mount in mounts {
        // Each mount either got its answer before the listener closed, or never reached the
        // provider: the socket was gone or refused (Unavailable), or the client wrote a new
        // stream onto a connection the server was closing (a client-side transport error).
        // No mount gets an answer of another kind.
        match mount.await.unwrap() {
            Err(status) if status.message().contains("no region is configured") => {}
            Err(status) => assert!(
                status.code() == Code::Unavailable || status.message() == "transport error",
                "{status:?}"
            ),
            Ok(response) => panic!("no mount can succeed without endpoints: {response:?}"),
        }
    }
    assert!(output.status.success(), "{output:?}");
    assert!(!socket.exists(), "the socket is removed");
    assert!(output.stderr.contains("SIGTERM"), "{}", output.stderr);
}

#[tokio::test]
async fn sigterm_leaves_a_socket_that_a_successor_bound() {
    let provider = Provider::start(&[], &[]).await;
    let socket = provider.socket.clone();
    std::fs::rename(&socket, socket.with_extension("old")).unwrap();
    let _successor = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let output = provider.terminate().await;
    assert!(output.status.success(), "{output:?}");
    assert!(socket.exists());
    std::os::unix::net::UnixStream::connect(&socket).unwrap();
}

#[tokio::test]
async fn a_rolling_update_takes_over_the_live_socket_and_the_old_provider_keeps_its_connections() {
    let old = Provider::start(&[], &[]).await;
    let mut old_client = old.client().await;
    old_client.version(VersionRequest::default()).await.unwrap();
    // The new pod (maxSurge) starts while the old one serves: it takes the path over.
    let new = old.start_successor(&[], &[]).await;
    let metrics_before = new.metrics().await;
    assert!(metrics_before.contains("oci_provider_build_info"));
    // The old provider still answers on the connection it accepted.
    old_client.version(VersionRequest::default()).await.unwrap();
    drop(old_client);
    let output = old.terminate().await;
    assert!(output.status.success(), "{output:?}");
    assert!(
        output.stderr.contains("now belongs to another process"),
        "{}",
        output.stderr
    );
    // The path is the new provider's, and it serves.
    assert!(new.socket.exists());
    new.client()
        .await
        .version(VersionRequest::default())
        .await
        .unwrap();
    let output = new.terminate().await;
    assert!(output.status.success(), "{output:?}");
    assert!(
        output.stderr.contains("took over the socket path"),
        "{}",
        output.stderr
    );
}

#[tokio::test]
async fn invalid_configuration_fails_at_start_naming_the_key_and_source() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: &[Case<'_>] = &[
        (
            &["--endpoint-permissions=999"],
            &[],
            &["server.endpoint_permissions", "--endpoint-permissions"],
        ),
        (
            &[],
            &[("OCI_PROVIDER_SERVER__MAX_IN_FLIGHT_MOUNTS", "many")],
            &[
                "server.max_in_flight_mounts",
                "OCI_PROVIDER_SERVER__MAX_IN_FLIGHT_MOUNTS",
            ],
        ),
        (&["--no-such-flag"], &[], &["--no-such-flag"]),
        (&["--log-level=loud"], &[], &["log.level", "loud"]),
        (
            &["--enable-pprof"],
            &[("OCI_PROVIDER_SERVER__PPROF_ADDRESS", "0.0.0.0")],
            &["server.pprof_address 0.0.0.0", "loopback"],
        ),
    ];
    for (args, vars, fragments) in cases {
        let output = Provider::spawn_at(&std::env::temp_dir().join("never.sock"), args, vars)
            .wait_exit()
            .await;
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        for fragment in *fragments {
            assert!(
                output.stderr.contains(fragment),
                "{args:?}: {fragment:?} not in {}",
                output.stderr
            );
        }
    }
}

#[tokio::test]
async fn tokens_never_reach_the_logs_at_trace_level() {
    const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6YXBwOndlYiJ9.dG9wLXNlY3JldC1zaWc";
    const VERIFIED_CLAIMS: &str = "eyJleHAiOjQxMDI0NDQ4MDAsImt1YmVybmV0ZXMuaW8iOnsibmFtZXNwYWNlIjoiYXBwIiwic2VydmljZWFjY291bnQiOnsibmFtZSI6IndlYiIsInVpZCI6InUtMSJ9LCJwb2QiOnsibmFtZSI6IndlYi0wIiwidWlkIjoiMGY2YzJiMWUifX19";
    const VERIFIED: &str = concat!(
        "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsifQ.",
        "eyJleHAiOjQxMDI0NDQ4MDAsImt1YmVybmV0ZXMuaW8iOnsibmFtZXNwYWNlIjoiYXBwIiwic2VydmljZWFjY291bnQiOnsibmFtZSI6IndlYiIsInVpZCI6InUtMSJ9LCJwb2QiOnsibmFtZSI6IndlYi0wIiwidWlkIjoiMGY2YzJiMWUifX19",
        ".dG9wLXNlY3JldC1zaWc"
    );
    // A region, so that mounts get as far as the workload principal (no endpoint is
    // contacted: the Kubernetes API is not configured).
    let provider = Provider::start(
        &["--log-level=trace", "--log-format=json"],
        &[("OCI_RESOURCE_PRINCIPAL_REGION", "us-ashburn-1")],
    )
    .await;
    let mut client = provider.client().await;
    let tokens =
        json!({"": {"token": TOKEN, "expirationTimestamp": "2030-01-01T00:00:00Z"}}).to_string();
    for attributes in [
        valid_workload_attributes(json!({ "csi.storage.k8s.io/serviceAccount.tokens": tokens })),
        valid_workload_attributes(
            json!({ "csi.storage.k8s.io/serviceAccount.tokens": tokens, "authType": "nope" }),
        ),
        valid_workload_attributes(
            json!({ "csi.storage.k8s.io/serviceAccount.tokens": format!("{{\"\": \"{TOKEN}\"") }),
        ),
    ] {
        let status = client.mount(mount_request(attributes)).await.unwrap_err();
        assert!(
            !status.message().contains("dG9wLXNlY3JldC1zaWc"),
            "{}",
            status.message()
        );
    }
    let mut request = mount_request(valid_workload_attributes(json!({})));
    request.secrets = json!({ "csi.storage.k8s.io/serviceAccount.tokens": tokens }).to_string();
    client.mount(request).await.unwrap_err();
    // A token whose claims pass (app/web, bound to web-0, expiring in 2100) goes on to the
    // signature check, which cannot read the issuer's keys here: that path's messages and
    // logs hold it no more than the others.
    let tokens =
        json!({"": {"token": VERIFIED, "expirationTimestamp": "2030-01-01T00:00:00Z"}}).to_string();
    let status = client
        .mount(mount_request(valid_workload_attributes(
            json!({ "csi.storage.k8s.io/serviceAccount.tokens": tokens }),
        )))
        .await
        .unwrap_err();
    assert!(
        status
            .message()
            .contains("cannot verify the service-account token"),
        "{}",
        status.message()
    );
    assert!(!status.message().contains(VERIFIED_CLAIMS), "{status:?}");
    let output = provider.terminate().await;
    assert!(
        output.stderr.contains("mount failed"),
        "trace logs were captured"
    );
    assert!(
        output.stderr.contains("TRACE") || output.stderr.contains("\"level\":\"TRACE\""),
        "trace level is on"
    );
    assert!(
        !output.stderr.contains("dG9wLXNlY3JldC1zaWc"),
        "{}",
        output.stderr
    );
    assert!(
        !output
            .stderr
            .contains("eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6YXBwOndlYiJ9")
    );
    assert!(!output.stderr.contains(VERIFIED_CLAIMS));
}

#[tokio::test]
async fn readyz_answers_only_while_the_socket_is_served() {
    let provider = Provider::start(&[], &[]).await;
    assert_eq!(http_get(provider.healthz_port, "/readyz").await.0, 200);
    let port = provider.healthz_port;
    let output = provider.terminate().await;
    assert!(output.status.success());
    // After exit nothing listens any more.
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
    );
}

/// Readiness calls `Version` over the socket, as the driver would: a removed socket makes
/// the provider unready (after the ~1 s the answer is cached), whatever the process says.
#[tokio::test]
async fn readyz_fails_when_the_socket_no_longer_answers() {
    let provider = Provider::start(&[], &[]).await;
    let (status, body) = http_get(provider.healthz_port, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    ready_metric_becomes(&provider, 1).await;
    std::fs::remove_file(&provider.socket).unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let body = loop {
        let (status, body) = http_get(provider.healthz_port, "/readyz").await;
        if status == 503 {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readyz stayed {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(body.contains("cannot connect to unix://"), "{body}");
    // Liveness is the runtime answering, not the socket.
    assert_eq!(http_get(provider.healthz_port, "/healthz").await.0, 200);
    // The metrics say so too (the not-ready alert reads it).
    ready_metric_becomes(&provider, 0).await;
    assert!(provider.terminate().await.status.success());
}

/// A socket that accepts but never answers (a wedged server) is not ready either: the check
/// gives up after its timeout instead of hanging the probe.
#[tokio::test]
async fn readyz_fails_when_the_socket_accepts_but_never_answers() {
    let provider = Provider::start(&[], &[]).await;
    std::fs::remove_file(&provider.socket).unwrap();
    let wedged = tokio::net::UnixListener::bind(&provider.socket).unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = wedged.accept().await {
            held.push(stream);
        }
    });
    // Past the cached answer of the start-up probe.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let started = std::time::Instant::now();
    let (status, body) = http_get(provider.healthz_port, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("did not answer"), "{body}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The scrape still answers (its readiness check is bounded) and says not ready.
    ready_metric_becomes(&provider, 0).await;
    holder.abort();
    assert!(provider.terminate().await.status.success());
}

/// Waits until `/metrics` says `oci_provider_ready <value>` (renders are reused for ~1 s).
async fn ready_metric_becomes(provider: &Provider, value: u8) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let line = format!("oci_provider_ready {value}");
    loop {
        let (status, body) = http_get(provider.metrics_port, "/metrics").await;
        assert_eq!(status, 200, "the metrics answer whatever the socket does");
        if body.lines().any(|l| l == line) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no `{line}` in {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_emulators_provider_config_is_a_valid_configuration() {
    let clock: clock::SharedClock = std::sync::Arc::new(clock::SystemClock);
    let emulator = testkit::Emulator::start(testkit::Seed::default(), clock)
        .await
        .unwrap();
    let config_path = emulator.files().provider_config.clone();
    let path = config_path.to_str().unwrap().to_owned();
    let provider = Provider::start(&["--config", &path], &[]).await;
    provider
        .client()
        .await
        .version(VersionRequest::default())
        .await
        .unwrap();
    assert!(provider.terminate().await.status.success());

    let flags = oci_secrets_store_csi_driver_provider::Flags::parse_from_args(&[
        "provider".to_owned(),
        "--config".to_owned(),
        path,
    ])
    .unwrap();
    let config =
        oci_secrets_store_csi_driver_provider::Config::load(&flags, &Default::default()).unwrap();
    assert_eq!(
        config.endpoints.secrets.unwrap().as_str(),
        emulator.url(testkit::Endpoint::Secrets)
    );
    assert_eq!(
        config.endpoints.instance_metadata.as_str(),
        emulator.url(testkit::Endpoint::Imds)
    );
}

/// A neighbour pod opens 1,000 connections to the health port from one address, half of
/// them sending half a request, and keeps them: the kubelet's probe (another address) is
/// still answered, the provider holds no more than the per-address cap of them, and after
/// the header-read timeout it holds none.
#[tokio::test]
async fn a_neighbour_holding_a_thousand_connections_cannot_starve_the_health_checks() {
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    let provider = Provider::start(
        &[],
        &[("OCI_PROVIDER_SERVER__HTTP_HEADER_READ_TIMEOUT_SECONDS", "2")],
    )
    .await;
    let baseline = provider.open_fds();
    let mut held = Vec::new();
    for i in 0..1000 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let Ok(mut stream) = socket
            .connect(([127, 0, 0, 1], provider.healthz_port).into())
            .await
        else {
            continue;
        };
        if i % 2 == 0 {
            let _ = stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await;
        }
        held.push(stream);
    }
    assert!(
        held.len() > 900,
        "the neighbour got its connections: {}",
        held.len()
    );
    let (status, body) = http_get(provider.healthz_port, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert_eq!(http_get(provider.healthz_port, "/readyz").await.0, 200);
    // Beyond the cap of 8 per address the provider closed them at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while provider.open_fds() > baseline + 8 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} fds open, baseline {baseline}",
            provider.open_fds()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And after the header-read timeout, none of them.
    while provider.open_fds() > baseline {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} fds open after the timeout, baseline {baseline}",
            provider.open_fds()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(held);
    assert!(provider.terminate().await.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_busy_neighbours_cannot_lock_the_kubelet_out_of_the_health_checks() {
    // 64 neighbour addresses (127.0.0.2 to .65; all of 127/8 is loopback) each hold their
    // per-address maximum of 8 connections on both ports and keep them busy: 512 against
    // a cap of 256 per server. The kubelet's probes and a scrape from 127.0.0.1 still
    // answer, and the server never holds more than its cap.
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let provider = Provider::start(&[], &[]).await;
    let baseline = provider.open_fds();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let mut neighbours = Vec::new();
    for port in [provider.healthz_port, provider.metrics_port] {
        let path = if port == provider.healthz_port {
            "/healthz"
        } else {
            "/metrics"
        };
        for address in 2..=65u8 {
            for _ in 0..8 {
                let stop = stop.clone();
                neighbours.push(tokio::spawn(async move {
                    let socket = tokio::net::TcpSocket::new_v4().unwrap();
                    socket.bind(([127, 0, 0, address], 0).into()).unwrap();
                    let Ok(mut stream) = socket.connect(([127, 0, 0, 1], port).into()).await else {
                        return;
                    };
                    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
                    let mut buf = vec![0u8; 64 * 1024];
                    while !stop.load(Ordering::Relaxed) {
                        if stream.write_all(request.as_bytes()).await.is_err() {
                            return;
                        }
                        match tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
                            .await
                        {
                            Ok(Ok(n)) if n > 0 => {}
                            _ => return,
                        }
                    }
                }));
            }
        }
    }
    // Wait until the neighbours fill both servers (256 connections each), so the probes
    // below meet full servers.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while provider.open_fds() < baseline + 2 * 256 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the neighbours filled the servers: {} fds, baseline {baseline}",
            provider.open_fds()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..5 {
        let (status, body) = http_get(provider.healthz_port, "/healthz").await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        assert_eq!(http_get(provider.healthz_port, "/readyz").await.0, 200);
        assert_eq!(http_get(provider.metrics_port, "/metrics").await.0, 200);
    }
    // Two servers of at most 256 connections each, the probes' own, and a few refused
    // connections whose close is still under way on a loaded machine (540 seen at load 8).
    assert!(
        provider.open_fds() <= baseline + 2 * 256 + 32,
        "{} fds open, baseline {baseline}",
        provider.open_fds()
    );
    stop.store(true, Ordering::Relaxed);
    for neighbour in neighbours {
        let _ = neighbour.await;
    }
    assert!(provider.terminate().await.status.success());
}

/// Connects to `socket` as `uid` (through setpriv) or as this process, sends the HTTP/2
/// preface and an empty SETTINGS frame, and answers how many bytes came back before EOF
/// or a second: the server's SETTINGS when served, nothing when refused at accept.
fn h2_bytes_back(socket: &std::path::Path, uid: Option<u32>) -> usize {
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.settimeout(1.0)\n\
         s.connect({path:?})\n\
         n = 0\n\
         try:\n\
         \x20   s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))\n\
         \x20   while True:\n\
         \x20       b = s.recv(4096)\n\
         \x20       if not b: break\n\
         \x20       n += len(b)\n\
         except (socket.timeout, ConnectionResetError, BrokenPipeError):\n\
         \x20   pass\n\
         print(n)\n",
        path = socket.to_str().unwrap()
    );
    let mut command = match uid {
        Some(uid) => {
            let mut c = std::process::Command::new("setpriv");
            c.args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "/usr/bin/python3",
            ]);
            c
        }
        None => std::process::Command::new("/usr/bin/python3"),
    };
    let out = command.arg("-c").arg(script).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[tokio::test]
async fn a_peer_of_another_uid_is_refused_at_accept() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let own = std::fs::metadata("/proc/self").unwrap().uid();
    let setpriv = std::process::Command::new("setpriv")
        .arg("--version")
        .output();
    // Debian's python3 (not a per-user one another uid cannot run) is the client.
    if own != 0 || setpriv.is_err() || !std::path::Path::new("/usr/bin/python3").exists() {
        eprintln!(
            "skipped: needs root, setpriv and /usr/bin/python3 to connect as another uid (CI has them)"
        );
        return;
    }
    // The socket's mode lets anyone connect: the peer check alone refuses uid 65534.
    let provider = Provider::start(&["--endpoint-permissions=0666"], &[]).await;
    let dir = provider.socket.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(h2_bytes_back(&provider.socket, None) > 0, "root is served");
    assert_eq!(
        h2_bytes_back(&provider.socket, Some(65534)),
        0,
        "uid 65534 is refused"
    );
    // Still serving.
    assert!(h2_bytes_back(&provider.socket, None) > 0);
    let output = provider.terminate().await;
    assert!(output.status.success());
    assert!(
        output.stderr.contains("from uid 65534")
            && output.stderr.contains("server.allowed_peer_uids"),
        "{}",
        output.stderr
    );
}
