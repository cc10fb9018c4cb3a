use std::sync::Arc;
use std::time::Duration;

use secrets_store_csi_grpc::{
    File, FileContents, FilePath, MountError, MountLimits, MountRequest, MountResponse,
    ObjectVersion,
};
use serde_json::json;

use crate::support::{connect, driver_request, start};

/// A service whose mounts wait until released, announcing each arrival.
fn gated() -> (
    impl tower::Service<MountRequest, Response = MountResponse, Error = MountError, Future: Send>
    + Clone
    + Send
    + Sync,
    tokio::sync::mpsc::UnboundedReceiver<()>,
    Arc<tokio::sync::Semaphore>,
) {
    let (entered_tx, entered_rx) = tokio::sync::mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let release = gate.clone();
    let service = tower::service_fn(move |req: MountRequest| {
        let entered = entered_tx.clone();
        let gate = gate.clone();
        async move {
            let _ = entered.send(());
            gate.acquire().await.unwrap().forget();
            Ok(MountResponse {
                files: vec![File {
                    path: FilePath::new("a").unwrap(),
                    mode: req.file_mode,
                    contents: FileContents::new(b"v".to_vec()),
                }],
                object_versions: vec![ObjectVersion {
                    id: "a".into(),
                    version: "1".into(),
                }],
            })
        }
    });
    (service, entered_rx, release)
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_mount_finish_then_removes_the_socket() {
    let (service, mut entered, release) = gated();
    let mut server = start(service, MountLimits::default(), Duration::from_secs(30));
    let mut client = connect(&server.path).await;
    let mount = tokio::spawn(async move { client.mount(driver_request(json!({}))).await });
    entered.recv().await.unwrap();

    server.trigger_stop();
    // New connections are refused once shutdown has begun: wait until the listener is gone.
    let path = server.path.clone();
    tokio::time::timeout(Duration::from_secs(10), async {
        while tokio::net::UnixStream::connect(&path).await.is_ok() && !server.done.is_finished() {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    assert!(
        !server.done.is_finished(),
        "the server waits for the in-flight mount"
    );

    release.add_permits(1);
    let response = mount.await.unwrap().unwrap().into_inner();
    assert_eq!(response.files[0].contents, b"v");
    tokio::time::timeout(Duration::from_secs(10), &mut server.done)
        .await
        .unwrap()
        .unwrap();
    assert!(!server.path.exists(), "the socket is removed");
}

#[tokio::test]
async fn shutdown_leaves_a_socket_that_another_process_now_owns() {
    let (service, _entered, _release) = gated();
    let server = start(service, MountLimits::default(), Duration::from_secs(1));
    // The next pod of a rolling update binds the same path. (The old file is moved away, not
    // deleted, so the successor cannot get the same inode number back.)
    std::fs::rename(&server.path, server.path.with_extension("old")).unwrap();
    let _successor = std::os::unix::net::UnixListener::bind(&server.path).unwrap();
    let path = server.path.clone();
    let _dir = server.stop().await;
    assert!(path.exists(), "the successor's socket stays");
    std::os::unix::net::UnixStream::connect(&path).unwrap();
}

#[tokio::test]
async fn the_grace_period_bounds_the_wait_for_in_flight_mounts() {
    let (service, mut entered, _release) = gated();
    // serve() returns after the grace period; connection tasks it leaves behind end with the
    // process (the binary exits), or here, at the mount's own deadline.
    let limits = MountLimits {
        default_deadline: Duration::from_secs(2),
        ..MountLimits::default()
    };
    let server = start(service, limits, Duration::from_millis(200));
    let mut client = connect(&server.path).await;
    let mount = tokio::spawn(async move { client.mount(driver_request(json!({}))).await });
    entered.recv().await.unwrap();
    let path = server.path.clone();
    let started = std::time::Instant::now();
    let _dir = server.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "serve returned after the grace period"
    );
    assert!(!path.exists());
    assert!(
        mount.await.unwrap().is_err(),
        "the abandoned mount fails on the client side"
    );
}

/// A provider serving `path` as `name`, stopped by sending on the sender.
fn serve_as(
    path: &std::path::Path,
    name: &str,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let info = secrets_store_csi_grpc::ServerInfo {
        runtime_name: name.into(),
        runtime_version: "1.0.0".into(),
    };
    let (service, _entered, _release) = gated();
    crate::support::start_at(
        path,
        info,
        service,
        MountLimits::default(),
        Duration::from_secs(5),
    )
}

async fn runtime_name(client: &mut secrets_store_csi_grpc::client::Client) -> String {
    client
        .version(secrets_store_csi_grpc::proto::VersionRequest {
            version: "v1alpha1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .runtime_name
}

#[tokio::test]
async fn a_rolling_update_takes_over_the_socket_and_the_old_provider_keeps_its_connections() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oci.sock");
    let (stop_old, old_done) = serve_as(&path, "old");
    let mut old_client = connect(&path).await;
    assert_eq!(runtime_name(&mut old_client).await, "old");

    // The new pod starts while the old one serves (maxSurge): it takes the path over.
    let (stop_new, new_done) = serve_as(&path, "new");
    let mut new_client = connect(&path).await;
    assert_eq!(runtime_name(&mut new_client).await, "new");
    // The old provider keeps the connection it accepted.
    assert_eq!(runtime_name(&mut old_client).await, "old");

    // The old one exits: the path is the new one's, so it stays.
    drop(old_client);
    stop_old.send(()).unwrap();
    old_done.await.unwrap();
    assert!(
        path.exists(),
        "the old provider left the new one's socket alone"
    );
    let mut after = connect(&path).await;
    assert_eq!(runtime_name(&mut after).await, "new");

    drop((new_client, after));
    stop_new.send(()).unwrap();
    new_done.await.unwrap();
    assert!(!path.exists(), "the last provider removes its own socket");
}
