//! The transport against the emulator over real TLS on loopback.
// Test helpers are shared between the tests of this one binary; they are not an API.
#![allow(unreachable_pub, missing_debug_implementations)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clock::SystemClock;
use oci_csi_transport::{Deadline, ErrorKind, Proxy, Transport, TransportConfig};
use testkit::{Emulator, Endpoint, Fault, Seed};
use tower::{Service, ServiceExt};

mod layers;

async fn emulator() -> Emulator {
    Emulator::start(Seed::default(), Arc::new(SystemClock))
        .await
        .unwrap()
}

fn config(emu: &Emulator) -> TransportConfig {
    TransportConfig {
        ssl_cert_file: Some(emu.files().ca.clone()),
        ..TransportConfig::default()
    }
}

fn authority(emu: &Emulator, endpoint: Endpoint) -> String {
    emu.addr(endpoint).to_string()
}

fn get(url: String) -> http::Request<Bytes> {
    http::Request::get(url).body(Bytes::new()).unwrap()
}

fn secrets_url(emu: &Emulator) -> String {
    format!(
        "{}/20190301/secretbundles/ocid1.vaultsecret.oc1..nope",
        emu.url(Endpoint::Secrets)
    )
}

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn speaks_https_to_oci_hosts_trusting_the_configured_roots() {
    let emu = emulator().await;
    let transport = Transport::new(config(&emu)).unwrap();
    // Unsigned: the emulator answers 401 NotAuthenticated, which is an HTTP answer all the same.
    let response = transport
        .service()
        .oneshot(get(secrets_url(&emu)))
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert!(String::from_utf8_lossy(response.body()).contains("NotAuthenticated"));
    let host = transport.stats()[&authority(&emu, Endpoint::Secrets)];
    assert_eq!((host.open, host.opened), (1, 1));
}

#[tokio::test]
async fn trust_is_per_destination_and_never_merged() {
    let ours = emulator().await;
    let other = emulator().await;
    // OCI hosts trust `ours`; the other emulator's proxymux is trusted with its own CA only.
    let config = config(&ours).trust_only(
        authority(&other, Endpoint::Proxymux),
        other.files().ca.clone(),
    );
    let transport = Transport::new(config).unwrap();

    let err = transport
        .service()
        .oneshot(get(secrets_url(&other)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect, "{err:?}");
    assert!(
        err.to_string()
            .contains(&authority(&other, Endpoint::Secrets))
    );

    let proxymux = format!(
        "{}/resourcePrincipalSessionTokens",
        other.url(Endpoint::Proxymux)
    );
    let response = transport.service().oneshot(get(proxymux)).await.unwrap();
    assert!(
        response.status().is_client_error(),
        "an HTTP answer: {}",
        response.status()
    );

    // And the dedicated CA is not trusted for anything else of `ours`.
    let config = config_with_dedicated_only(&other);
    let transport = Transport::new(config).unwrap();
    let err = transport
        .service()
        .oneshot(get(secrets_url(&ours)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect);
}

fn config_with_dedicated_only(other: &Emulator) -> TransportConfig {
    TransportConfig {
        ssl_cert_file: Some(other.files().ca.clone()),
        ..TransportConfig::default()
    }
}

#[tokio::test]
async fn plain_http_only_to_the_instance_metadata_authority() {
    let emu = emulator().await;
    let imds = emu.url(Endpoint::Imds);
    let transport = Transport::new(config(&emu)).unwrap();
    let request = |url: String| {
        http::Request::get(url)
            .header("authorization", "Bearer Oracle")
            .body(Bytes::new())
            .unwrap()
    };
    let err = transport
        .service()
        .oneshot(request(format!("{imds}/instance/region")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect, "{err:?}");
    assert!(format!("{err:?}").contains("plain http"), "{err:?}");

    let transport =
        Transport::new(config(&emu).allow_plain_http(authority(&emu, Endpoint::Imds))).unwrap();
    let response = transport
        .service()
        .oneshot(request(format!("{imds}/instance/region")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.body().as_ref(), b"us-ashburn-1");

    let plain_secrets = secrets_url(&emu).replace("https://", "http://");
    let err = transport
        .service()
        .oneshot(get(plain_secrets))
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("plain http"), "{err:?}");

    // A second plain-HTTP authority (a trace collector) does not replace the first.
    let transport = Transport::new(
        config(&emu)
            .allow_plain_http(authority(&emu, Endpoint::Imds))
            .allow_plain_http("127.0.0.1:4318"),
    )
    .unwrap();
    let response = transport
        .service()
        .oneshot(request(format!("{imds}/instance/region")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn open_connections_per_host_never_exceed_the_bound() {
    let emu = emulator().await;
    emu.set_http1_only(Endpoint::Secrets, true);
    emu.set_fault(
        Endpoint::Secrets,
        Some(Fault::Latency(Duration::from_millis(20))),
    );
    let transport = Transport::new(TransportConfig {
        max_connections_per_host: 4,
        ..config(&emu)
    })
    .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let mut service = transport.service();
        let request = get(secrets_url(&emu));
        tasks.push(tokio::spawn(async move {
            service.ready().await?.call(request).await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status(), 401);
    }
    let stats = emu.stats();
    let listener = stats.listener(Endpoint::Secrets);
    assert!(listener.high_water <= 4, "{listener:?}");
    assert!(listener.accepted <= 4, "{listener:?}");
    assert_eq!(stats.total_responses(Endpoint::Secrets), 64);
    let ours = transport.stats()[&authority(&emu, Endpoint::Secrets)];
    assert!(ours.high_water <= 4, "{ours:?}");
    // At quiescence both sides count the same open connections.
    assert_eq!(
        ours.open,
        emu.stats().listener(Endpoint::Secrets).open,
        "{ours:?}"
    );
}

#[tokio::test]
async fn idle_connections_stay_until_the_idle_timeout_then_close_on_both_sides() {
    let emu = emulator().await;
    let transport = Transport::new(TransportConfig {
        // Long enough that a loaded machine cannot let the connection expire between the
        // two requests (the pool evicts after half of it), short enough to wait for.
        idle_timeout: Duration::from_secs(4),
        ..config(&emu)
    })
    .unwrap();
    transport
        .service()
        .oneshot(get(secrets_url(&emu)))
        .await
        .unwrap();
    assert_eq!(transport.open_connections(), 1);
    assert_eq!(emu.stats().listener(Endpoint::Secrets).open, 1);
    // A second request reuses the idle connection.
    transport
        .service()
        .oneshot(get(secrets_url(&emu)))
        .await
        .unwrap();
    assert_eq!(
        transport.stats()[&authority(&emu, Endpoint::Secrets)].opened,
        1
    );

    emu.wait_for(WAIT, |s| s.listener(Endpoint::Secrets).open == 0)
        .await
        .unwrap();
    assert_eq!(transport.open_connections(), 0);
    assert_eq!(
        transport.stats()[&authority(&emu, Endpoint::Secrets)].closed,
        1
    );
}

#[tokio::test]
async fn the_request_timeout_covers_the_body() {
    let emu = emulator().await;
    let transport = Transport::new(TransportConfig {
        request_timeout: Duration::from_millis(300),
        ..config(&emu)
    })
    .unwrap();
    for fault in [Fault::StallBeforeHeaders, Fault::StallAfterHeaders] {
        emu.script(Endpoint::Secrets, [fault.clone()]);
        let err = transport
            .service()
            .oneshot(get(secrets_url(&emu)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{fault:?}: {err:?}");
        emu.release_stalls();
    }
    // A request deadline shorter than the timeout wins.
    emu.script(Endpoint::Secrets, [Fault::StallBeforeHeaders]);
    let mut request = get(secrets_url(&emu));
    request.extensions_mut().insert(Deadline(
        tokio::time::Instant::now() + Duration::from_millis(50),
    ));
    let err = transport.service().oneshot(request).await.unwrap_err();
    match err {
        oci_csi_transport::TransportError::Timeout { after, .. } => {
            assert!(after <= Duration::from_millis(50))
        }
        other => panic!("{other:?}"),
    }
    emu.release_stalls();
}

#[tokio::test]
async fn oversized_bodies_and_dropped_connections_are_errors() {
    let emu = emulator().await;
    let transport = Transport::new(TransportConfig {
        max_response_bytes: 1024,
        ..config(&emu)
    })
    .unwrap();
    emu.script(Endpoint::Secrets, [Fault::Body("x".repeat(4096))]);
    let err = transport
        .service()
        .oneshot(get(secrets_url(&emu)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err:?}");

    emu.set_http1_only(Endpoint::Secrets, true);
    let transport = Transport::new(config(&emu)).unwrap();
    emu.script(Endpoint::Secrets, [Fault::DropMidResponse]);
    let err = transport
        .service()
        .oneshot(get(secrets_url(&emu)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err:?}");
    // The next request gets a fresh connection and an answer.
    assert_eq!(
        transport
            .service()
            .oneshot(get(secrets_url(&emu)))
            .await
            .unwrap()
            .status(),
        401
    );
}

/// A CONNECT proxy on loopback that counts its tunnels.
async fn connect_proxy() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let tunnels = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = tunnels.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let target = head
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                assert!(head.starts_with("CONNECT "), "{head}");
                let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await else {
                    let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    (address, tunnels)
}

#[tokio::test]
async fn oci_hosts_go_through_the_proxy_and_dedicated_ones_do_not() {
    let emu = emulator().await;
    let (proxy, tunnels) = connect_proxy().await;
    let proxied = TransportConfig {
        proxy: Proxy::from_env(|k| (k == "HTTPS_PROXY").then(|| format!("http://{proxy}")))
            .unwrap(),
        ..config(&emu)
    }
    .trust_only(authority(&emu, Endpoint::Proxymux), emu.files().ca.clone());
    let transport = Transport::new(proxied).unwrap();
    assert_eq!(
        transport
            .service()
            .oneshot(get(secrets_url(&emu)))
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(tunnels.load(std::sync::atomic::Ordering::SeqCst), 1);
    let proxymux = format!(
        "{}/resourcePrincipalSessionTokens",
        emu.url(Endpoint::Proxymux)
    );
    transport.service().oneshot(get(proxymux)).await.unwrap();
    assert_eq!(
        tunnels.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the proxymux is never proxied"
    );

    // NO_PROXY exempts a host.
    let exempt = TransportConfig {
        proxy: Proxy::from_env(|k| match k {
            "HTTPS_PROXY" => Some(format!("http://{proxy}")),
            "NO_PROXY" => Some("127.0.0.1".into()),
            _ => None,
        })
        .unwrap(),
        ..config(&emu)
    };
    let transport = Transport::new(exempt).unwrap();
    transport
        .service()
        .oneshot(get(secrets_url(&emu)))
        .await
        .unwrap();
    assert_eq!(tunnels.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_ca_file_without_certificates_is_refused_at_build() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "not a certificate").unwrap();
    let err = Transport::new(TransportConfig {
        ssl_cert_file: Some(file.path().to_owned()),
        ..TransportConfig::default()
    })
    .unwrap_err();
    let cause = std::error::Error::source(&err)
        .expect("the file's error")
        .to_string();
    assert!(cause.contains("no usable certificate"), "{err}: {cause}");
}

/// Records what the transport reports of each exchange.
#[derive(Debug, Default)]
struct Recorder(std::sync::Mutex<Vec<(String, oci_csi_transport::Outcome)>>);

impl oci_csi_transport::ExchangeObserver for Recorder {
    fn exchanged(&self, authority: &str, outcome: oci_csi_transport::Outcome, _: Duration) {
        self.0.lock().unwrap().push((authority.to_owned(), outcome));
    }
}

#[tokio::test]
async fn the_observer_sees_every_exchange_with_its_status_or_error_kind() {
    use oci_csi_transport::Outcome;
    let emu = emulator().await;
    let recorder = Arc::new(Recorder::default());
    let transport = Transport::new(TransportConfig {
        observer: Some(recorder.clone()),
        ..config(&emu)
    })
    .unwrap();
    transport
        .service()
        .oneshot(get(secrets_url(&emu)))
        .await
        .unwrap();
    // Nothing listens there: a connect error.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let _ = transport
        .service()
        .oneshot(get(format!("https://{dead}/x")))
        .await
        .unwrap_err();
    let seen = recorder.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (authority(&emu, Endpoint::Secrets), Outcome::Status(401)),
            (dead.to_string(), Outcome::Failed(ErrorKind::Connect)),
        ]
    );
}

/// A CA file that cannot be used stops the build with an error naming whose trust it was
/// and, as its source, the file: each level says its part once.
#[tokio::test]
async fn unusable_ca_files_are_build_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let oci = Transport::new(TransportConfig {
        oci_ca_files: vec![dir.path().join("missing.pem")],
        ..TransportConfig::default()
    })
    .unwrap_err();
    assert!(
        matches!(oci, oci_csi_transport::TransportBuildError::OciTrust(_)),
        "{oci:?}"
    );
    let cause = std::error::Error::source(&oci)
        .expect("the file's error")
        .to_string();
    assert!(cause.contains("missing.pem"), "{cause}");
    assert!(!oci.to_string().contains(&cause), "{oci}");

    let dedicated = Transport::new(TransportConfig {
        dedicated_trust: vec![("kube:6443".into(), empty.clone())],
        ..TransportConfig::default()
    })
    .unwrap_err();
    assert!(dedicated.to_string().contains("kube:6443"), "{dedicated}");
    let cause = std::error::Error::source(&dedicated).unwrap().to_string();
    assert!(cause.contains("empty.pem"), "{cause}");
}
