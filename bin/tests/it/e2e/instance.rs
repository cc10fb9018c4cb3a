//! The node's instance session under tenants' 401s, through the real binary: one emulator
//! Secrets listener answers as two regions (`us-ashburn-1`, the principal's own, at
//! `127.0.0.1`; `us-phoenix-1` at `localhost`), and only phoenix refuses the token.

use std::sync::Arc;

use clock::SystemClock;
use serde_json::json;
use testkit::{Emulator, Endpoint, Fault, SecretSeed};
use tonic::Code;

use super::{NO_CACHE, TENANCY, VAULT, WAIT, metric, metrics_when, request, seed};
use crate::process::Provider;

/// A mount of `secrets` as the instance principal, reading `region` when given.
fn instance_mount(
    pod: usize,
    secrets: &str,
    region: Option<&str>,
) -> csi_grpc::proto::MountRequest {
    let mut request = request("instance", "sa-0", pod, secrets);
    if let Some(region) = region {
        let mut attributes: serde_json::Value = serde_json::from_str(&request.attributes).unwrap();
        attributes["region"] = json!(region);
        request.attributes = attributes.to_string();
    }
    request
}

fn renewals(metrics: &str, outcome: &str) -> f64 {
    metric(
        metrics,
        &format!(
            "oci_provider_credential_renewals_total{{kind=\"instance\",outcome=\"{outcome}\"}}"
        ),
    )
}

#[tokio::test]
async fn instance_mounts_refused_in_another_region_keep_the_nodes_session_and_metrics_count_renewals()
 {
    // Ten secrets the instance may read, so that a burst of mounts makes ten Secrets calls
    // (mounts of one secret would share one fetch).
    let mut seed = seed(1);
    for i in 0..10 {
        seed = seed.secret(
            SecretSeed::new(
                format!("ocid1.vaultsecret.oc1.iad.burst{i}"),
                VAULT,
                format!("burst-{i}"),
            )
            .version(1, format!("value-{i}"), &["CURRENT"])
            .allow_instance_tenancy(TENANCY),
        );
    }
    let emu = Emulator::start(seed, Arc::new(SystemClock)).await.unwrap();
    let port = emu.addr(Endpoint::Secrets).port();
    let config = emu
        .files()
        .provider_config
        .with_file_name("two-regions.toml");
    let text = std::fs::read_to_string(&emu.files().provider_config).unwrap();
    std::fs::write(
        &config,
        format!("{text}\n[endpoints.secrets_by_region]\n\"us-phoenix-1\" = \"https://localhost:{port}\"\n"),
    )
    .unwrap();
    // Requests in flight per host above the burst's ten (the default is 4).
    let provider = Provider::start(
        &["--config", config.to_str().unwrap()],
        &[
            NO_CACHE,
            ("OCI_PROVIDER_UPSTREAM__MAX_CONNECTIONS_PER_HOST", "16"),
        ],
    )
    .await;
    let client = provider.client().await;
    emu.set_host_fault(Endpoint::Secrets, "localhost", Some(Fault::Status(401)));

    // 1. Ten mounts naming phoenix: each fails Unauthenticated saying where; the session
    // federated for the first of them is all there is.
    for pod in 0..10 {
        let status = client
            .clone()
            .mount(instance_mount(
                pod,
                "- name: db-password\n",
                Some("us-phoenix-1"),
            ))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert!(
            status.message().contains("in region us-phoenix-1")
                && status
                    .message()
                    .contains("established in region us-ashburn-1"),
            "{}",
            status.message()
        );
    }
    let stats = emu.stats();
    assert_eq!(stats.responses(Endpoint::Secrets, 401), 10, "no retries");
    assert_eq!(stats.federations, 1, "no federation for phoenix's 401s");
    // The next mount in the principal's own region: served from that session.
    let response = client
        .clone()
        .mount(instance_mount(10, "- name: db-password\n", None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.files[0].contents, super::SECRET_BYTES.as_bytes());
    assert_eq!(emu.stats().federations, 1);

    // 2. The token revoked in the principal's own region: ten concurrent mounts are
    // refused, one federation (held at the gate until all ten were refused) serves them all.
    // Their calls wait at the Secrets gate until all ten are signed with the old token (a
    // mount that established after the first 401 would simply join the renewal).
    emu.expire_all_tokens();
    emu.close_gate(Endpoint::Secrets);
    emu.close_gate(Endpoint::Auth);
    let burst: Vec<_> = (0..10)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .mount(instance_mount(
                        20 + i,
                        &format!("- name: burst-{i}\n"),
                        None,
                    ))
                    .await
            })
        })
        .collect();
    emu.wait_for(WAIT, |s| s.held(Endpoint::Secrets) == 10)
        .await
        .unwrap();
    emu.open_gate(Endpoint::Secrets);
    emu.wait_for(WAIT, |s| {
        s.responses(Endpoint::Secrets, 401) == 20 && s.held(Endpoint::Auth) == 1
    })
    .await
    .unwrap();
    emu.open_gate(Endpoint::Auth);
    for (i, mount) in burst.into_iter().enumerate() {
        let response = mount.await.unwrap().unwrap().into_inner();
        assert_eq!(response.files[0].contents, format!("value-{i}").as_bytes());
    }
    assert_eq!(emu.stats().federations, 2, "one renewal for the burst");

    // 3. Refused again within the cool-down (30 s): no federation, the mount fails saying
    // the session was renewed moments ago.
    emu.expire_all_tokens();
    let status = client
        .clone()
        .mount(instance_mount(40, "- name: db-password\n", None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("instance principal")
            && status.message().contains("renewed")
            && status.message().contains("s ago"),
        "{}",
        status.message()
    );
    assert!(!status.message().contains("ST$"), "{}", status.message());
    assert_eq!(emu.stats().federations, 2);

    let metrics = metrics_when(
        &provider,
        "oci_provider_credential_renewals_total{kind=\"instance\",outcome=\"cooling_down\"}",
        1.0,
    )
    .await;
    assert_eq!(renewals(&metrics, "other_region"), 10.0, "{metrics}");
    assert_eq!(renewals(&metrics, "renewed"), 1.0, "{metrics}");
    assert_eq!(renewals(&metrics, "joined"), 9.0, "{metrics}");
    assert!(provider.terminate().await.status.success());
}
