//! A selection by tag through the real binary: the Vault API's ListSecrets, every page,
//! then each selected secret read as a `name` entry, none again within the cache's TTL.

use std::sync::Arc;

use clock::SystemClock;
use serde_json::json;
use testkit::{CompartmentSeed, Emulator, SecretSeed};

use super::{NAMESPACE, VAULT, files_of, provider, request, seed};

const COMPARTMENT: &str = "ocid1.compartment.oc1..payments";

#[tokio::test]
async fn a_tag_selecting_3_of_7_secrets_over_2_pages_mounts_them_from_2_list_calls_and_3_fetches() {
    let mut seed =
        seed(1).compartment(CompartmentSeed::new(COMPARTMENT).allow_workload(NAMESPACE, "sa-0"));
    for (name, team, state) in [
        ("app-db", "payments", "ACTIVE"),
        ("app-queue", "payments", "ACTIVE"),
        ("app-cache", "billing", "ACTIVE"),
        ("app-old", "payments", "PENDING_DELETION"),
        ("web-cert", "payments", "ACTIVE"),
        ("web-key", "web", "ACTIVE"),
        ("zz-ops", "ops", "ACTIVE"),
    ] {
        seed = seed.secret(
            SecretSeed::new(format!("ocid1.vaultsecret.oc1.iad.{name}"), VAULT, name)
                .in_compartment(COMPARTMENT)
                .tag("team", team)
                .lifecycle(state)
                .version(1, format!("{name}-value"), &["CURRENT"])
                .allow_workload(NAMESPACE, "sa-0"),
        );
    }
    let emu = Emulator::start(seed, Arc::new(SystemClock)).await.unwrap();
    emu.set_list_page_size(4);
    let provider = provider(&emu, &[], &[]).await;
    let mut client = provider.client().await;
    let mount = |pod| {
        let mut mount = request(
            "workload",
            "sa-0",
            pod,
            "- tag: team=payments\n  directory: pay\n",
        );
        let mut attributes: serde_json::Value = serde_json::from_str(&mount.attributes).unwrap();
        attributes["compartmentId"] = json!(COMPARTMENT);
        mount.attributes = attributes.to_string();
        mount
    };
    let response = client.mount(mount(1)).await.unwrap().into_inner();
    let files: Vec<(&str, Vec<u8>)> = files_of(&response)
        .into_iter()
        .map(|(path, contents, _)| (path, contents))
        .collect();
    assert_eq!(
        files,
        [
            ("pay/app-db", b"app-db-value".to_vec()),
            ("pay/app-queue", b"app-queue-value".to_vec()),
            ("pay/web-cert", b"web-cert-value".to_vec()),
        ]
    );
    let ids: Vec<&str> = response
        .object_version
        .iter()
        .map(|v| v.id.as_str())
        .collect();
    assert_eq!(
        ids,
        [
            "ocid1.vaultsecret.oc1.iad.app-db",
            "ocid1.vaultsecret.oc1.iad.app-queue",
            "ocid1.vaultsecret.oc1.iad.web-cert"
        ]
    );
    assert_eq!(emu.vaults_calls().len(), 2, "2 ListSecrets pages");
    assert_eq!(
        emu.secrets_calls().len(),
        3,
        "3 GetSecretBundleByName calls"
    );
    client.mount(mount(2)).await.unwrap();
    assert_eq!(
        (emu.vaults_calls().len(), emu.secrets_calls().len()),
        (2, 3),
        "within the TTL, from the caches"
    );
    provider.terminate().await;
}
