//! A pod storm of one namespace on a warm node, through the real binary: served in full, the
//! mounts past the namespace's slots waiting for one rather than being shed.

use std::time::Duration;

use testkit::Endpoint;
use tokio::time::Instant;

use super::{NO_CACHE, SECRET_BYTES, WAIT, emulator, metric, metrics_when, provider, request};

#[tokio::test]
async fn sixty_four_concurrent_mounts_of_one_secret_by_one_identity_on_a_warm_node_all_succeed() {
    let emu = emulator(1).await;
    // The default limits: 64 slots, a share of 16, 64 places to wait. Every mount reads OCI
    // (no cache) and Secrets holds the one fetch they share at its gate, so the 64 are in
    // flight together however fast the machine: 48 take a slot (all but one share), and
    // the other 16 must wait, where they used to be refused.
    let provider = provider(&emu, &["--log-level=warn"], &[NO_CACHE]).await;
    let client = provider.client().await;
    // Warm: the identity's session and the connections are there.
    client
        .clone()
        .mount(request("workload", "sa-0", 0, "- name: db-password\n"))
        .await
        .unwrap();
    emu.close_gate(Endpoint::Secrets);
    let storm: Vec<_> = (1..=64)
        .map(|pod| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .mount(request("workload", "sa-0", pod, "- name: db-password\n"))
                    .await
            })
        })
        .collect();
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = provider.metrics().await;
        let now = |name| metric(&metrics, name);
        if (
            now("oci_provider_mounts_in_flight"),
            now("oci_provider_mounts_queued"),
        ) == (48.0, 16.0)
        {
            assert_eq!(now("oci_provider_mounts_shed_total"), 0.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "48 mounts in flight and 16 waiting: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    emu.open_gate(Endpoint::Secrets);
    for mount in storm {
        let response = mount.await.unwrap().unwrap().into_inner();
        assert_eq!(response.files[0].contents, SECRET_BYTES.as_bytes());
    }
    let metrics = metrics_when(&provider, "oci_provider_mounts_total{code=\"ok\"}", 65.0).await;
    for (name, expected) in [
        ("oci_provider_mounts_total{code=\"ok\"}", 65.0),
        ("oci_provider_mounts_shed_total", 0.0),
        ("oci_provider_mounts_queued", 0.0),
        ("oci_provider_mounts_in_flight", 0.0),
        (
            "oci_provider_mount_queue_wait_seconds_count{outcome=\"admitted\"}",
            16.0,
        ),
    ] {
        assert_eq!(metric(&metrics, name), expected, "{name}: {metrics}");
    }
    assert!(provider.terminate().await.status.success());
}

/// Mounts whose requests are large (a `secrets` list near its 256 KiB cap, padded with a
/// YAML comment) are held at the emulator until one namespace's requests would pass
/// `server.max_request_bytes_per_namespace` (1 MiB here) while the node (2 MiB) has no share
/// left for the others: that mount is shed at once, named,
/// counted by reason; once the held mounts are answered their bytes are given back and the
/// same mount is served.
#[tokio::test]
async fn a_mount_whose_request_would_pass_its_namespaces_held_bytes_is_shed_naming_the_setting() {
    let emu = emulator(1).await;
    let provider = provider(
        &emu,
        &["--log-level=warn"],
        &[
            NO_CACHE,
            ("OCI_PROVIDER_SERVER__MAX_REQUEST_BYTES", "2097152"),
            (
                "OCI_PROVIDER_SERVER__MAX_REQUEST_BYTES_PER_NAMESPACE",
                "1048576",
            ),
        ],
    )
    .await;
    let client = provider.client().await;
    let large = format!("- name: db-password\n# {}\n", "x".repeat(240_000));
    client
        .clone()
        .mount(request("workload", "sa-0", 0, &large))
        .await
        .unwrap();
    emu.close_gate(Endpoint::Secrets);
    // Four take about 0.96 MiB of the namespace's 1 MiB.
    let held: Vec<_> = (1..=4)
        .map(|pod| {
            let (mut client, large) = (client.clone(), large.clone());
            tokio::spawn(
                async move { client.mount(request("workload", "sa-0", pod, &large)).await },
            )
        })
        .collect();
    metrics_when(&provider, "oci_provider_mounts_in_flight", 4.0).await;
    let shed = client
        .clone()
        .mount(request("workload", "sa-0", 5, &large))
        .await
        .unwrap_err();
    assert_eq!(shed.code(), tonic::Code::ResourceExhausted, "{shed:?}");
    for fragment in [
        "server.max_request_bytes_per_namespace",
        "of 1048576",
        "the driver will retry",
    ] {
        assert!(shed.message().contains(fragment), "{fragment}: {shed:?}");
    }
    emu.open_gate(Endpoint::Secrets);
    for mount in held {
        mount.await.unwrap().unwrap();
    }
    client
        .clone()
        .mount(request("workload", "sa-0", 5, &large))
        .await
        .unwrap();
    let metrics = metrics_when(&provider, "oci_provider_mounts_total", 7.0).await;
    for (name, expected) in [
        (
            "oci_provider_mounts_shed_total{reason=\"request_bytes\"}",
            1.0,
        ),
        ("oci_provider_mounts_shed_total{reason=\"in_flight\"}", 0.0),
        ("oci_provider_mounts_total{code=\"ok\"}", 6.0),
    ] {
        assert_eq!(metric(&metrics, name), expected, "{name}: {metrics}");
    }
    assert!(provider.terminate().await.status.success());
}
