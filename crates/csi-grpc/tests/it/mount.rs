use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use secrecy::ExposeSecret;
use secrets_store_csi_grpc::proto::{MountRequest as WireRequest, VersionRequest};
use secrets_store_csi_grpc::{
    ErrorKind, File, FileContents, FileMode, FilePath, MountError, MountLimits, MountRequest,
    MountResponse, ObjectVersion, SERVICE_ACCOUNT_TOKENS_KEY,
};
use serde_json::json;
use tonic::Code;

use crate::support::{LogCapture, connect, driver_request, start};

fn one_file(req: &MountRequest) -> MountResponse {
    MountResponse {
        files: vec![File {
            path: FilePath::new("dir/secret").unwrap(),
            mode: req.file_mode,
            contents: FileContents::new(b"bytes\0\xff".to_vec()),
        }],
        object_versions: vec![ObjectVersion {
            id: "ocid1.vaultsecret.x".into(),
            version: "3".into(),
        }],
    }
}

fn echo()
-> impl tower::Service<MountRequest, Response = MountResponse, Error = MountError, Future: Send>
+ Clone
+ Send
+ Sync {
    tower::service_fn(|req: MountRequest| async move { Ok(one_file(&req)) })
}

#[tokio::test]
async fn version_answers_v1alpha1_and_the_runtime() {
    let server = start(echo(), MountLimits::default(), Duration::from_secs(1));
    let mut client = connect(&server.path).await;
    let version = client
        .version(VersionRequest {
            version: "v1alpha1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(version.version, "v1alpha1");
    assert_eq!(version.runtime_name, "test-provider");
    assert_eq!(version.runtime_version, "1.2.3");
    server.stop().await;
}

#[tokio::test]
async fn mount_returns_files_modes_and_versions() {
    let server = start(echo(), MountLimits::default(), Duration::from_secs(1));
    let mut client = connect(&server.path).await;
    let mut request = driver_request(json!({"secrets": "- name: a"}));
    request.permission = "292".into();
    let response = client.mount(request).await.unwrap().into_inner();
    assert!(response.error.is_none());
    assert_eq!(response.files.len(), 1);
    assert_eq!(response.files[0].path, "dir/secret");
    assert_eq!(response.files[0].mode, 292);
    assert_eq!(response.files[0].contents, b"bytes\0\xff");
    assert_eq!(response.object_version[0].id, "ocid1.vaultsecret.x");
    assert_eq!(response.object_version[0].version, "3");
    server.stop().await;
}

#[tokio::test]
async fn malformed_mounts_get_invalid_argument_and_the_server_keeps_serving() {
    let panics = Arc::new(AtomicUsize::new(0));
    let counter = panics.clone();
    std::panic::set_hook(Box::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    let server = start(
        echo(),
        MountLimits {
            max_in_flight: 256,
            ..MountLimits::default()
        },
        Duration::from_secs(1),
    );
    let client = connect(&server.path).await;

    let bad: Vec<(WireRequest, &str)> = vec![
        (
            WireRequest {
                attributes: "not json".into(),
                ..driver_request(json!({}))
            },
            "attributes must be a JSON object",
        ),
        (
            WireRequest {
                attributes: "[\"a\"]".into(),
                ..driver_request(json!({}))
            },
            "attributes must be a JSON object",
        ),
        (
            driver_request(json!({"secrets": 3})),
            "attribute \"secrets\" must be a string",
        ),
        (
            WireRequest {
                secrets: "{\"k\": [1]}".into(),
                ..driver_request(json!({}))
            },
            "entry \"k\" must be a string",
        ),
        (
            WireRequest {
                permission: "0644x".into(),
                ..driver_request(json!({}))
            },
            "file permission",
        ),
        (
            WireRequest {
                permission: "1000".into(),
                ..driver_request(json!({}))
            },
            "between 0 and 511",
        ),
        (
            driver_request(json!({ SERVICE_ACCOUNT_TOKENS_KEY: "{\"\": 5}" })),
            SERVICE_ACCOUNT_TOKENS_KEY,
        ),
    ];
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (request, fragment) = bad[i % bad.len()].clone();
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let status = client.mount(request).await.unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(
                status.message().contains(fragment),
                "{fragment}: {}",
                status.message()
            );
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut client = client.clone();
    client.version(VersionRequest::default()).await.unwrap();
    let _ = std::panic::take_hook();
    assert_eq!(panics.load(Ordering::SeqCst), 0);
    server.stop().await;
}

/// A request larger than the server decodes is refused before it is held, and the
/// connection keeps serving.
#[tokio::test]
async fn a_request_past_the_decoding_limit_is_refused_and_serving_goes_on() {
    let server = start(echo(), MountLimits::default(), Duration::from_secs(1));
    let mut client = connect(&server.path).await;
    let huge = "v".repeat(secrets_store_csi_grpc::MAX_REQUEST_BYTES);
    let status = client
        .mount(driver_request(json!({ "vaultId": huge })))
        .await
        .unwrap_err();
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );
    assert!(
        status.message().contains("message length too large"),
        "{status:?}"
    );
    client.mount(driver_request(json!({}))).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn each_error_kind_maps_to_its_status_code() {
    let kinds = [
        (ErrorKind::InvalidArgument, Code::InvalidArgument),
        (ErrorKind::NotFound, Code::NotFound),
        (ErrorKind::PermissionDenied, Code::PermissionDenied),
        (ErrorKind::Unauthenticated, Code::Unauthenticated),
        (ErrorKind::Unavailable, Code::Unavailable),
        (ErrorKind::DeadlineExceeded, Code::DeadlineExceeded),
        (ErrorKind::ResourceExhausted, Code::ResourceExhausted),
        (ErrorKind::Internal, Code::Internal),
    ];
    let service = tower::service_fn(|req: MountRequest| async move {
        let kind = req.attributes["kind"].clone();
        Err::<MountResponse, _>(MountError::new(
            match kind.as_str() {
                "InvalidArgument" => ErrorKind::InvalidArgument,
                "NotFound" => ErrorKind::NotFound,
                "PermissionDenied" => ErrorKind::PermissionDenied,
                "Unauthenticated" => ErrorKind::Unauthenticated,
                "Unavailable" => ErrorKind::Unavailable,
                "DeadlineExceeded" => ErrorKind::DeadlineExceeded,
                "ResourceExhausted" => ErrorKind::ResourceExhausted,
                _ => ErrorKind::Internal,
            },
            format!("failure of kind {kind}"),
        ))
    });
    let server = start(service, MountLimits::default(), Duration::from_secs(1));
    let mut client = connect(&server.path).await;
    for (kind, code) in kinds {
        let status = client
            .mount(driver_request(json!({"kind": format!("{kind:?}")})))
            .await
            .unwrap_err();
        assert_eq!(status.code(), code);
        assert_eq!(status.message(), format!("failure of kind {kind:?}"));
    }
    server.stop().await;
}

#[tokio::test]
async fn files_the_driver_would_refuse_never_reach_it() {
    let service = tower::service_fn(|req: MountRequest| async move {
        let mut response = one_file(&req);
        let extra = req.attributes["extra"].clone();
        response.files.push(File {
            path: FilePath::new(extra).map_err(|e| MountError::internal(e.to_string()))?,
            mode: req.file_mode,
            contents: FileContents::default(),
        });
        Ok(response)
    });
    let server = start(service, MountLimits::default(), Duration::from_secs(1));
    let mut client = connect(&server.path).await;
    for (extra, fragment) in [
        ("dir/secret", "returned twice"),
        ("dir", "also the directory of \"dir/secret\""),
    ] {
        let status = client
            .mount(driver_request(json!({"extra": extra})))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(fragment), "{}", status.message());
    }
    server.stop().await;
}

#[tokio::test]
async fn a_response_without_object_versions_is_internal() {
    let service =
        tower::service_fn(|_req: MountRequest| async move { Ok(MountResponse::default()) });
    let server = start(service, MountLimits::default(), Duration::from_secs(1));
    let mut client = connect(&server.path).await;
    let status = client.mount(driver_request(json!({}))).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert!(status.message().contains("no object versions"));
    server.stop().await;
}

#[tokio::test]
async fn an_oversized_response_is_resource_exhausted() {
    let service = tower::service_fn(|req: MountRequest| async move {
        let mut response = one_file(&req);
        response.files[0].contents = FileContents::new(vec![7; 2048]);
        Ok(response)
    });
    let limits = MountLimits {
        max_response_bytes: 1024,
        ..MountLimits::default()
    };
    let server = start(service, limits, Duration::from_secs(1));
    let mut client = connect(&server.path).await;
    let status = client.mount(driver_request(json!({}))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("limit of 1024 bytes"),
        "{}",
        status.message()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_panicking_service_yields_internal_and_serving_goes_on() {
    let service = tower::service_fn(|req: MountRequest| async move {
        if req.attributes.contains_key("panic") {
            panic!("boom");
        }
        Ok(one_file(&req))
    });
    let server = start(service, MountLimits::default(), Duration::from_secs(1));
    let mut client = connect(&server.path).await;
    let status = client
        .mount(driver_request(json!({"panic": "yes"})))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    client.mount(driver_request(json!({}))).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn the_deadline_is_the_grpc_timeout_capped_by_the_maximum() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let service = tower::service_fn(move |req: MountRequest| {
        let record = record.clone();
        async move {
            record
                .lock()
                .unwrap()
                .push(req.deadline - tokio::time::Instant::now());
            if req.attributes.contains_key("hang") {
                std::future::pending::<()>().await;
            }
            Ok(one_file(&req))
        }
    });
    let limits = MountLimits {
        default_deadline: Duration::from_secs(30),
        max_deadline: Duration::from_secs(40),
        ..MountLimits::default()
    };
    let server = start(service, limits, Duration::from_secs(1));
    let mut client = connect(&server.path).await;

    client.mount(driver_request(json!({}))).await.unwrap();
    // The header is set by hand so that only the server enforces it.
    let mut long = tonic::Request::new(driver_request(json!({})));
    long.metadata_mut()
        .insert("grpc-timeout", "600S".parse().unwrap());
    client.mount(long).await.unwrap();
    let mut short = tonic::Request::new(driver_request(json!({"hang": "1"})));
    short
        .metadata_mut()
        .insert("grpc-timeout", "300m".parse().unwrap());
    let status = client.mount(short).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("deadline of 300ms"),
        "{}",
        status.message()
    );

    let seen = seen.lock().unwrap().clone();
    // The service sees the deadline less a margin of a twentieth (at most 1 s) for the answer.
    assert!(
        seen[0] <= Duration::from_secs(29) && seen[0] > Duration::from_secs(28),
        "{:?}",
        seen[0]
    );
    assert!(
        seen[1] <= Duration::from_secs(39) && seen[1] > Duration::from_secs(38),
        "{:?}",
        seen[1]
    );
    assert!(seen[2] <= Duration::from_millis(300), "{:?}", seen[2]);
    server.stop().await;
}

/// A service whose mounts for which `held` holds report on the channel and wait until the
/// gate opens (for them and every later mount); the others answer at once.
fn gated(
    held: fn(&MountRequest) -> bool,
) -> (
    impl tower::Service<MountRequest, Response = MountResponse, Error = MountError, Future: Send>
    + Clone
    + Send
    + Sync,
    tokio::sync::mpsc::UnboundedReceiver<()>,
    tokio::sync::watch::Sender<bool>,
) {
    let (entered_tx, entered_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (open, gate) = tokio::sync::watch::channel(false);
    let service = tower::service_fn(move |req: MountRequest| {
        let entered = entered_tx.clone();
        let mut gate = gate.clone();
        async move {
            if held(&req) {
                let _ = entered.send(());
                let _ = gate.wait_for(|open| *open).await;
            }
            Ok(one_file(&req))
        }
    });
    (service, entered_rx, open)
}

#[tokio::test]
async fn mounts_beyond_the_in_flight_bound_are_resource_exhausted() {
    let (service, mut entered_rx, gate) = gated(|_| true);
    // No place to wait: past the slots, a mount is refused at once.
    let limits = MountLimits {
        max_in_flight: 2,
        max_queued: 0,
        ..MountLimits::default()
    };
    let server = start(service, limits, Duration::from_secs(1));
    let client = connect(&server.path).await;
    let held: Vec<_> = (0..2)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { client.mount(driver_request(json!({}))).await })
        })
        .collect();
    entered_rx.recv().await.unwrap();
    entered_rx.recv().await.unwrap();
    let status = client
        .clone()
        .mount(driver_request(json!({})))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("limit 2"), "{}", status.message());
    gate.send_replace(true);
    for task in held {
        task.await.unwrap().unwrap();
    }
    server.stop().await;
}

/// Twenty requests of 900 KB on one connection while the node holds 2 MiB of requests:
/// the bodies are counted as they arrive, before tonic decodes them, so the streams past the
/// bound end with ResourceExhausted without being buffered whole, and serving goes on.
#[tokio::test]
async fn request_bodies_past_the_nodes_bytes_are_refused_while_they_are_read() {
    let (service, mut entered_rx, gate) = gated(|_| true);
    let limits = MountLimits {
        max_request_bytes: 2 << 20,
        max_request_bytes_per_namespace: 2 << 20,
        ..MountLimits::default()
    };
    let server = start(service, limits, Duration::from_secs(1));
    let client = connect(&server.path).await;
    let large = "v".repeat(900_000);
    let mounts: Vec<_> = (0..20)
        .map(|_| {
            let (mut client, large) = (client.clone(), large.clone());
            tokio::spawn(async move { client.mount(driver_request(json!({ "pad": large }))).await })
        })
        .collect();
    // At most two fit: they reach the service and wait there; the others end.
    entered_rx.recv().await.unwrap();
    for _ in 0..200 {
        if mounts.iter().filter(|m| m.is_finished()).count() >= 18 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (finished, waiting): (Vec<_>, Vec<_>) = mounts.into_iter().partition(|m| m.is_finished());
    let mut refused = Vec::new();
    for mount in finished {
        refused.push(mount.await.unwrap().unwrap_err());
    }
    assert!(waiting.len() <= 2, "{} reached the service", waiting.len());
    assert!(refused.len() >= 18, "{}", refused.len());
    assert!(
        refused.iter().all(|s| s.code() == Code::ResourceExhausted),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|s| s.message().contains("waiting and being read on this node")),
        "some were refused while read, before decoding: {refused:?}"
    );
    gate.send_replace(true);
    for mount in waiting {
        mount.await.unwrap().unwrap();
    }
    client
        .clone()
        .mount(driver_request(json!({})))
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_stalled_namespace_leaves_its_share_of_slots_to_the_others() {
    // Namespace a's mounts hang. Alone it may take six of eight slots (all but one share
    // of two), then two more of its mounts wait (its places in the queue), then it is
    // refused; namespace b still mounts at once, twice over.
    let (service, mut entered_rx, gate) = gated(|req| req.pod.namespace.as_deref() == Some("a"));
    let limits = MountLimits {
        max_in_flight: 8,
        max_in_flight_per_namespace: 2,
        max_queued_per_namespace: 2,
        ..MountLimits::default()
    };
    let server = start(service, limits, Duration::from_secs(1));
    let client = connect(&server.path).await;
    let of =
        |namespace: &str| driver_request(json!({ "csi.storage.k8s.io/pod.namespace": namespace }));
    let held: Vec<_> = (0..6)
        .map(|_| {
            let (mut client, request) = (client.clone(), of("a"));
            tokio::spawn(async move { client.mount(request).await })
        })
        .collect();
    for _ in 0..6 {
        entered_rx.recv().await.unwrap();
    }
    // Three more: two wait (while a holds six, never admitted), the third is refused at
    // once, whichever of them arrives last.
    let mut more = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let (mut client, request) = (client.clone(), of("a"));
        more.spawn(async move { client.mount(request).await });
    }
    let status = more.join_next().await.unwrap().unwrap().unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status
            .message()
            .contains("server.max_in_flight_per_namespace"),
        "{}",
        status.message()
    );
    assert!(status.message().contains("\"a\""), "{}", status.message());
    for _ in 0..2 {
        client.clone().mount(of("b")).await.unwrap();
    }
    gate.send_replace(true);
    for task in held {
        task.await.unwrap().unwrap();
    }
    while let Some(waited) = more.join_next().await {
        waited.unwrap().unwrap();
    }
    server.stop().await;
}

#[tokio::test]
async fn service_account_tokens_reach_the_service_but_no_status_or_log() {
    let capture = LogCapture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(capture.clone())
        .finish();
    let _guard = tracing::subscriber::set_global_default(subscriber);

    const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXNhLXRva2Vu.c2ln";
    let service = tower::service_fn(|req: MountRequest| async move {
        let token = req
            .service_account_tokens
            .get("oci")
            .map(|t| t.token.expose_secret().to_owned());
        assert_eq!(token.as_deref(), Some(TOKEN));
        assert!(!req.attributes.contains_key(SERVICE_ACCOUNT_TOKENS_KEY));
        tracing::trace!(request = ?req, "inner service saw");
        Err::<MountResponse, _>(MountError::new(
            ErrorKind::Unauthenticated,
            format!("refused: {req:?}"),
        ))
    });
    let server = start(service, MountLimits::default(), Duration::from_secs(1));
    let mut client = connect(&server.path).await;
    let tokens =
        json!({"oci": {"token": TOKEN, "expirationTimestamp": "2030-01-01T00:00:00Z"}}).to_string();
    let status = client
        .mount(driver_request(
            json!({ SERVICE_ACCOUNT_TOKENS_KEY: tokens, "csi.storage.k8s.io/pod.name": "p" }),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(!status.message().contains(TOKEN));
    assert!(!status.message().contains("c2VjcmV0LXNhLXRva2Vu"));

    // The same token in malformed JSON: refused without being quoted.
    let broken = format!("{{\"oci\": {{\"token\": \"{TOKEN}\", }}");
    let status = client
        .mount(driver_request(
            json!({ SERVICE_ACCOUNT_TOKENS_KEY: broken }),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        !status.message().contains("c2VjcmV0LXNhLXRva2Vu"),
        "{}",
        status.message()
    );
    server.stop().await;

    let logs = capture.text();
    assert!(
        logs.contains("mount failed"),
        "the capture saw the mounts: {logs}"
    );
    assert!(!logs.contains("c2VjcmV0LXNhLXRva2Vu"), "{logs}");
}

#[test]
fn file_contents_debug_is_redacted() {
    let contents = FileContents::new(b"hunter2".to_vec());
    assert_eq!(format!("{contents:?}"), "FileContents([redacted; 7 bytes])");
    assert_eq!(FileMode::new(0o1000), None);
}
