use std::os::unix::fs::{FileTypeExt, PermissionsExt};

use rustix::fs::Mode;
use secrets_store_csi_grpc::{BindError, Endpoint, Listener};

fn mode_of(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn socket_permissions_ignore_the_umask() {
    let previous = rustix::process::umask(Mode::empty());
    let dir = tempfile::tempdir().unwrap();

    let default = dir.path().join("default.sock");
    let _a = Listener::bind(&Endpoint::Unix(default.clone()), 0o600).unwrap();
    assert_eq!(mode_of(&default), 0o600);

    let group = dir.path().join("group.sock");
    let _b = Listener::bind(&Endpoint::Unix(group.clone()), 0o660).unwrap();
    assert_eq!(mode_of(&group), 0o660);

    rustix::process::umask(previous);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test]
async fn a_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oci.sock");
    // A socket file nobody listens on any more, as a crashed provider leaves it.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(
        std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_socket()
    );

    let listener = Listener::bind(&Endpoint::Unix(path.clone()), 0o600).unwrap();
    assert_eq!(listener.local_endpoint(), Endpoint::Unix(path.clone()));
    std::os::unix::net::UnixStream::connect(&path).unwrap();
}

#[tokio::test]
async fn a_live_socket_is_taken_over_atomically_in_a_private_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oci.sock");
    let other = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let listener = Listener::bind(&Endpoint::Unix(path.clone()), 0o600).unwrap();
    assert_eq!(listener.local_endpoint(), Endpoint::Unix(path.clone()));
    // The path is ours now: a new connection reaches our listener, not the other one.
    other.set_nonblocking(true).unwrap();
    std::os::unix::net::UnixStream::connect(&path).unwrap();
    assert!(
        other.accept().is_err(),
        "the old listener no longer gets connections"
    );
    assert_eq!(mode_of(&path), 0o600);
    // Nothing is left beside the socket: the private directory is gone.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["oci.sock"]);
}

#[tokio::test]
async fn a_regular_file_or_directory_is_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"keep me").unwrap();
    let err = Listener::bind(&Endpoint::Unix(file.clone()), 0o600).unwrap_err();
    assert!(err.to_string().contains("regular file"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

    let sub = dir.path().join("dir.sock");
    std::fs::create_dir(&sub).unwrap();
    let err = Listener::bind(&Endpoint::Unix(sub.clone()), 0o600).unwrap_err();
    assert!(err.to_string().contains("directory"), "{err}");
    assert!(sub.is_dir());

    let missing = dir.path().join("no/such/dir/oci.sock");
    let err = Listener::bind(&Endpoint::Unix(missing), 0o600).unwrap_err();
    assert!(matches!(err, BindError::NoDirectory(_)), "{err}");
}

#[tokio::test]
async fn tcp_serves_on_loopback_only() {
    let listener = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap(), 0o600).unwrap();
    match listener.local_endpoint() {
        Endpoint::Tcp(addr) => assert!(addr.ip().is_loopback() && addr.port() != 0),
        other => panic!("{other:?}"),
    }
    assert!("tcp://10.0.0.1:80".parse::<Endpoint>().is_err());
}

#[tokio::test]
async fn only_the_allowed_peer_uids_are_served() {
    use secrets_store_csi_grpc::{CsiProvider, MountLimits, serve};
    use std::os::unix::fs::MetadataExt as _;
    // This process's uid, as the kernel reports it for our connections.
    let own = std::fs::metadata("/proc/self").unwrap().uid();
    for (allowed, served) in [(vec![own.wrapping_add(1)], false), (vec![0, own], true)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("provider.sock");
        let listener = Listener::bind(&Endpoint::Unix(path.clone()), 0o600)
            .unwrap()
            .allow_peer_uids(allowed.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let provider = CsiProvider::new(
            tower::service_fn(|_req: secrets_store_csi_grpc::MountRequest| async {
                Err::<secrets_store_csi_grpc::MountResponse, _>(
                    secrets_store_csi_grpc::MountError::internal("unused"),
                )
            }),
            crate::support::info(),
            MountLimits::default(),
        );
        let server = tokio::spawn(serve(
            listener,
            provider,
            async move {
                let _ = stopped.await;
            },
            std::time::Duration::from_secs(1),
        ));
        let version = async {
            let mut client = secrets_store_csi_grpc::client::connect_unix(&path).await?;
            client
                .version(secrets_store_csi_grpc::proto::VersionRequest {
                    version: "v1alpha1".into(),
                })
                .await
                .map_err(Into::into)
        };
        let answer: Result<_, Box<dyn std::error::Error + Send + Sync>> =
            tokio::time::timeout(std::time::Duration::from_secs(5), version)
                .await
                .unwrap_or_else(|_| Err("timed out".into()));
        assert_eq!(
            answer.is_ok(),
            served,
            "allowed {allowed:?}, own uid {own}: {answer:?}"
        );
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
