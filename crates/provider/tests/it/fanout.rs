//! Fetching: fan-out, all or nothing, error precedence, cancellation, assembly.

use std::sync::atomic::Ordering;

use csi_grpc::{ErrorKind, MountRequest, MountResponse};
use oci_csi_provider::MountContext;
use serde_json::json;
use tower::ServiceExt;

use crate::fakes::{Auth, Behaviour, Vault, mount_service};

pub fn request(secrets: &str) -> MountRequest {
    let attributes = json!({
        "secrets": secrets,
        "vaultId": "ocid1.vault.oc1..v",
        "authType": "workload",
        "csi.storage.k8s.io/pod.name": "web-0",
        "csi.storage.k8s.io/pod.namespace": "app",
        "csi.storage.k8s.io/pod.uid": "uid",
        "csi.storage.k8s.io/serviceAccount.name": "web",
    });
    MountRequest::from_proto(
        csi_grpc::proto::MountRequest {
            attributes: attributes.to_string(),
            secrets: "{}".into(),
            target_path: String::new(),
            permission: "292".into(),
            current_object_version: vec![],
        },
        tokio::time::Instant::now() + std::time::Duration::from_secs(30),
    )
    .unwrap()
}

async fn mount(
    service: crate::fakes::Mount<Auth, Vault>,
    secrets: &str,
) -> Result<MountResponse, csi_grpc::MountError> {
    service.oneshot(request(secrets)).await
}

#[tokio::test]
async fn files_and_versions_follow_the_request_order() {
    let vault = Vault::default();
    let response = mount(
        mount_service(vault.clone()),
        "- name: a\n- name: b\n  fileName: dir/b.txt\n- name: c\n  versionNumber: 4\n",
    )
    .await
    .unwrap();
    let files: Vec<_> = response
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.contents.as_bytes(), f.mode.get()))
        .collect();
    assert_eq!(
        files,
        vec![
            ("a", &b"a"[..], 292),
            ("dir/b.txt", &b"b"[..], 292),
            ("c", &b"c"[..], 292)
        ]
    );
    let ids: Vec<_> = response
        .object_versions
        .iter()
        .map(|v| (v.id.as_str(), v.version.as_str()))
        .collect();
    assert_eq!(
        ids,
        vec![
            ("ocid1.vaultsecret.oc1..a", "1"),
            ("ocid1.vaultsecret.oc1..b", "1"),
            ("ocid1.vaultsecret.oc1..c", "1")
        ]
    );
    let requests = vault.requests.lock().unwrap();
    assert_eq!(requests.len(), 3);
    assert!(
        requests
            .iter()
            .all(|r| r.base_url == "https://secrets.example")
    );
    let selectors: Vec<_> = requests
        .iter()
        .map(|r| format!("{:?}", r.selector))
        .collect();
    assert!(
        selectors.contains(&"VersionNumber(4)".to_owned()),
        "{selectors:?}"
    );
}

#[tokio::test]
async fn one_secret_mounted_twice_gets_distinct_version_ids() {
    let vault = Vault::default().with(
        "db",
        Behaviour::Bundle {
            content: b"x".to_vec(),
            secret_id: "ocid1.vaultsecret.oc1..db".into(),
            version: 2,
        },
    );
    let response = mount(
        mount_service(vault),
        "- name: db\n- name: db\n  fileName: db.previous\n",
    )
    .await
    .unwrap();
    let ids: Vec<_> = response
        .object_versions
        .iter()
        .map(|v| v.id.clone())
        .collect();
    assert_eq!(
        ids,
        vec![
            "ocid1.vaultsecret.oc1..db/db",
            "ocid1.vaultsecret.oc1..db/db.previous"
        ]
    );
}

#[tokio::test]
async fn fetches_run_concurrently_up_to_the_fan_out() {
    let vault = Vault::default();
    let service = crate::fakes::mount(
        Auth::default(),
        vault.clone(),
        oci_csi_provider::NoCertificates,
        MountContext {
            fan_out: 3,
            ..crate::fakes::config()
        },
        None,
    );
    let secrets: String = (0..12).map(|i| format!("- name: s{i}\n")).collect();
    let response = mount(service, &secrets).await.unwrap();
    assert_eq!(response.files.len(), 12);
    assert_eq!(vault.max_in_flight.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn several_failures_are_all_named_and_the_code_follows_the_precedence() {
    // Transient failures are collected while the others go on; a permanent one (here always
    // the late "b") ends the mount. The code is the most actionable of those collected.
    let late = |status| Behaviour::Late(Box::new(Behaviour::Status(status)));
    let cases = [
        (Behaviour::Status(503), late(404), ErrorKind::NotFound),
        (
            Behaviour::Status(429),
            late(401),
            ErrorKind::Unauthenticated,
        ),
        (
            Behaviour::Status(503),
            late(403),
            ErrorKind::PermissionDenied,
        ),
        (
            Behaviour::Status(503),
            late(400),
            ErrorKind::InvalidArgument,
        ),
        (
            Behaviour::Status(429),
            Behaviour::Status(503),
            ErrorKind::ResourceExhausted,
        ),
        (
            Behaviour::Status(503),
            Behaviour::Status(503),
            ErrorKind::Unavailable,
        ),
    ];
    for (a, b, expected) in cases {
        let vault = Vault::default().with("a", a.clone()).with("b", b.clone());
        let err = mount(mount_service(vault), "- name: a\n- name: b\n- name: ok\n")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), expected, "{a:?} {b:?}: {err}");
        assert!(err.message().contains("2 of 3 failed"), "{err}");
        assert!(err.message().contains("secrets[0] \"a\""), "{err}");
        assert!(err.message().contains("secrets[1] \"b\""), "{err}");
        assert!(
            err.message()
                .contains("workload identity of service account app/web"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn the_failure_message_is_capped_and_lists_the_most_actionable_first() {
    // 200 transient failures with long names, one throttled among the last: the message
    // stays under 4 KiB, starts with the throttled secret (ResourceExhausted outranks
    // Unavailable) and says how many it left out.
    let names: Vec<String> = (0..200)
        .map(|i| format!("secret-with-a-long-name-{i:03}-{}", "x".repeat(40)))
        .collect();
    let mut vault = Vault::default();
    for (i, name) in names.iter().enumerate() {
        let status = if i == 190 { 429 } else { 503 };
        vault = vault.with(name, Behaviour::Status(status));
    }
    let secrets: String = names.iter().map(|n| format!("- name: {n}\n")).collect();
    let err = mount(mount_service(vault), &secrets).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    let message = err.message();
    assert!(message.len() <= 4096, "{} bytes", message.len());
    assert!(
        message.contains("200 of 200 failed: secrets[190]"),
        "{message}"
    );
    let listed = message.matches("secrets[").count();
    assert!(listed > 5, "{message}");
    assert!(
        message.ends_with(&format!("; ... and {} more", 200 - listed)),
        "{message}"
    );
}

#[tokio::test]
async fn a_permanent_failure_cancels_the_other_fetches() {
    let vault = Vault::default()
        .with("slow", Behaviour::Hang)
        .with("missing", Behaviour::Status(404));
    let err = mount(
        mount_service(vault.clone()),
        "- name: slow\n- name: missing\n",
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(
        err.message()
            .contains("1 not fetched after a permanent failure"),
        "{err}"
    );
    assert_eq!(
        vault.in_flight.load(Ordering::SeqCst),
        0,
        "the hanging fetch was dropped"
    );
    assert_eq!(vault.dropped_unfinished.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_mount_larger_than_the_driver_accepts_is_resource_exhausted() {
    let big = vec![b'x'; 2048];
    let vault = Vault::default().with(
        "big",
        Behaviour::Bundle {
            content: big,
            secret_id: "ocid1.vaultsecret.oc1..big".into(),
            version: 1,
        },
    );
    let service = crate::fakes::mount(
        Auth::default(),
        vault,
        oci_csi_provider::NoCertificates,
        MountContext {
            max_total_bytes: 1024,
            ..crate::fakes::config()
        },
        None,
    );
    let err = mount(service, "- name: big\n- name: small\n")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(err.message().contains("big (2048 bytes)"), "{err}");
}

#[tokio::test]
async fn error_messages_never_contain_secret_bytes() {
    let vault = Vault::default()
        .with(
            "a",
            Behaviour::Bundle {
                content: b"TOP-SECRET-BYTES".to_vec(),
                secret_id: "ocid1..a".into(),
                version: 1,
            },
        )
        .with("b", Behaviour::Status(404));
    let err = mount(mount_service(vault), "- name: a\n- name: b\n")
        .await
        .unwrap_err();
    assert!(!err.message().contains("TOP-SECRET-BYTES"));
    let ok = mount(
        mount_service(Vault::default().with(
            "a",
            Behaviour::Bundle {
                content: b"TOP-SECRET-BYTES".to_vec(),
                secret_id: "ocid1..a".into(),
                version: 1,
            },
        )),
        "- name: a\n",
    )
    .await
    .unwrap();
    assert!(!format!("{ok:?}").contains("TOP-SECRET-BYTES"));
}

/// A large mount with a failover region: each entry's primary gets half of the time left
/// when the entry starts, not when the mount began (later entries waited for the fan-out,
/// and a deadline fixed up front sent them all to the failover region).
#[tokio::test(start_paused = true)]
async fn each_entrys_primary_gets_half_the_time_left_when_the_entry_starts() {
    let vault = Vault::default();
    let config = oci_csi_provider::MountContext {
        fan_out: 1,
        ..crate::fakes::config()
    };
    let service = crate::fakes::mount(
        Auth::default(),
        vault.clone(),
        oci_csi_provider::NoCertificates,
        config,
        None,
    );
    let secrets: String = (0..6)
        .map(|i| format!("- secretId: ocid1.vaultsecret.oc1..s{i}\n"))
        .collect();
    let attributes = json!({
        "secrets": secrets,
        "authType": "workload",
        "failoverRegion": "us-phoenix-1",
        "csi.storage.k8s.io/pod.name": "web-0",
        "csi.storage.k8s.io/pod.namespace": "app",
        "csi.storage.k8s.io/pod.uid": "uid",
        "csi.storage.k8s.io/serviceAccount.name": "web",
    });
    let start = tokio::time::Instant::now();
    let deadline = start + std::time::Duration::from_secs(30);
    let request = MountRequest::from_proto(
        csi_grpc::proto::MountRequest {
            attributes: attributes.to_string(),
            secrets: "{}".into(),
            target_path: String::new(),
            permission: "292".into(),
            current_object_version: vec![],
        },
        deadline,
    )
    .unwrap();
    service.oneshot(request).await.unwrap();
    let requests = vault.requests.lock().unwrap();
    assert_eq!(requests.len(), 6, "one fetch per entry, none failed over");
    for (k, fetched) in requests.iter().enumerate() {
        // The fake vault answers in 5 ms; with a fan-out of one, entry k starts 5k ms in.
        let began = start + std::time::Duration::from_millis(5 * k as u64);
        assert_eq!(
            fetched.deadline,
            began + (deadline - began) / 2,
            "entry {k}"
        );
    }
    assert!(requests[5].deadline > requests[0].deadline);
}

/// Secrets and certificates of one mount are fetched at once: the mount takes as long as
/// the slower of the two, not their sum.
#[tokio::test(start_paused = true)]
async fn secrets_and_certificates_are_fetched_at_once() {
    // The secret answers in 55 ms (the fake's 5 ms, then 50 more), the certificate in 50.
    let vault = Vault::default().with(
        "slow",
        Behaviour::Late(Box::new(Behaviour::Bundle {
            content: b"s".to_vec(),
            secret_id: "ocid1.vaultsecret.oc1..slow".into(),
            version: 1,
        })),
    );
    let certs = crate::tenancy::Certs::new(
        crate::tenancy::bundle("ocid1.certificate.oc1..c", crate::tenancy::self_signed()),
        None,
    )
    .with_delay(std::time::Duration::from_millis(50));
    let service = crate::fakes::mount(
        Auth::default(),
        vault,
        certs.clone(),
        crate::fakes::config(),
        None,
    );
    let started = tokio::time::Instant::now();
    let response = service
        .oneshot(request(
            "- name: slow\n- certificateId: ocid1.certificate.oc1..c\n",
        ))
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(
        response.files.len(),
        2,
        "the secret and tls.crt (a self-signed leaf: no ca.crt)"
    );
    assert_eq!(certs.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        took,
        std::time::Duration::from_millis(55),
        "the slower, not the sum"
    );
}
