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
