//! The two listings the provider makes: ListSecretBundleVersions on the Secrets endpoint
//! and ListSecrets on the Vault endpoint, paged, sorted, filtered and authorised.

use std::time::SystemTime;

use http::StatusCode;
use oci_csi_testkit::{CompartmentSeed, EmulatorHandle, Endpoint, SecretSeed};

use super::client::{Resp, Unsigned, send};
use super::{SECRET, USER, VAULT, base_seed, key_id, vector_key};

const TEAM: &str = "ocid1.compartment.oc1..team";
const OTHER: &str = "ocid1.compartment.oc1..other";

async fn signed(emu: &EmulatorHandle, endpoint: Endpoint, target: &str) -> Resp {
    let host = emu.addr(endpoint).to_string();
    let req = Unsigned::new("GET", target, &host, emu.now()).sign(&key_id(), &vector_key());
    send(emu, endpoint, req).await
}

fn numbers(resp: &Resp) -> Vec<i64> {
    resp.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["versionNumber"].as_i64().unwrap())
        .collect()
}

fn names(resp: &Resp) -> Vec<String> {
    resp.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["secretName"].as_str().unwrap().to_owned())
        .collect()
}

fn next(resp: &Resp) -> Option<String> {
    resp.headers
        .get("opc-next-page")
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn versions_are_listed_oldest_first_unless_asked_and_paged_by_limit_and_page() {
    let emu =
        oci_csi_testkit::Emulator::start(base_seed(), std::sync::Arc::new(clock::SystemClock))
            .await
            .unwrap();
    let path = format!("/20190301/secretbundles/{SECRET}/versions");
    let all = signed(&emu, Endpoint::Secrets, &path).await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(
        numbers(&all),
        [1, 2, 3],
        "the SDK's default order: ascending"
    );
    assert_eq!(all.json()[1]["stages"][0], "CURRENT");
    let first = signed(
        &emu,
        Endpoint::Secrets,
        &format!("{path}?limit=2&sortBy=VERSION_NUMBER&sortOrder=DESC"),
    )
    .await;
    assert_eq!(numbers(&first), [3, 2]);
    let token = next(&first).expect("a next page");
    let rest = signed(
        &emu,
        Endpoint::Secrets,
        &format!("{path}?limit=2&page={token}&sortBy=VERSION_NUMBER&sortOrder=DESC"),
    )
    .await;
    assert_eq!((numbers(&rest), next(&rest)), (vec![1], None));
    // The emulator's page size caps what `limit` asks.
    emu.set_list_page_size(1);
    let capped = signed(&emu, Endpoint::Secrets, &format!("{path}?limit=10")).await;
    assert_eq!(numbers(&capped), [1]);
    assert!(next(&capped).is_some());
    let bad = signed(&emu, Endpoint::Secrets, &format!("{path}?page=forged")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let hidden = signed(
        &emu,
        Endpoint::Secrets,
        "/20190301/secretbundles/ocid1.vaultsecret.oc1..private/versions",
    )
    .await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    let calls = emu.secrets_calls();
    assert_eq!(calls.last().unwrap().status, 404);
    assert_eq!(calls[0].secret_id.as_deref(), Some(SECRET));
}

#[tokio::test]
async fn list_secrets_pages_the_active_secrets_of_a_compartment_it_may_inspect() {
    let mut seed = base_seed().compartment(CompartmentSeed::new(TEAM).allow_user(USER));
    for (name, compartment, state, team) in [
        ("b-db", TEAM, "ACTIVE", "payments"),
        ("a-api", TEAM, "ACTIVE", "payments"),
        ("c-old", TEAM, "PENDING_DELETION", "payments"),
        ("d-other", OTHER, "ACTIVE", "payments"),
    ] {
        seed = seed.secret(
            SecretSeed::new(format!("ocid1.vaultsecret.oc1..{name}"), VAULT, name)
                .in_compartment(compartment)
                .lifecycle(state)
                .tag("team", team)
                .version(1, name, &["CURRENT"])
                .allow_user(USER),
        );
    }
    let emu = oci_csi_testkit::Emulator::start(seed, std::sync::Arc::new(clock::SystemClock))
        .await
        .unwrap();
    emu.set_list_page_size(1);
    let query = format!(
        "/20180608/secrets?compartmentId={TEAM}&lifecycleState=ACTIVE&limit=50\
         &sortBy=NAME&sortOrder=ASC&vaultId={VAULT}"
    );
    let mut seen = Vec::new();
    let mut page = signed(&emu, Endpoint::Vaults, &query).await;
    loop {
        assert_eq!(page.status, StatusCode::OK, "{:?}", page.body);
        seen.extend(names(&page));
        let Some(token) = next(&page) else { break };
        page = signed(&emu, Endpoint::Vaults, &format!("{query}&page={token}")).await;
    }
    assert_eq!(seen, ["a-api", "b-db"]);
    assert_eq!(emu.vaults_calls().len(), 2);
    let summary = signed(&emu, Endpoint::Vaults, &query).await.json();
    assert_eq!(summary[0]["freeformTags"]["team"], "payments");
    assert_eq!(summary[0]["compartmentId"], TEAM);
    // Without `inspect secrets` in the compartment, or without it named: 404 and 400.
    let other = signed(
        &emu,
        Endpoint::Vaults,
        &format!("/20180608/secrets?compartmentId={OTHER}"),
    )
    .await;
    assert_eq!(
        (other.status, other.code().as_str()),
        (StatusCode::NOT_FOUND, "NotAuthorizedOrNotFound")
    );
    let unnamed = signed(&emu, Endpoint::Vaults, "/20180608/secrets").await;
    assert_eq!(unnamed.code(), "MissingParameter");
    // Requests are signed like any OCI call.
    let host = emu.addr(Endpoint::Vaults).to_string();
    let forged = Unsigned::new("GET", &query, &host, SystemTime::now()).build(&format!(
        "Signature version=\"1\",keyId=\"{}\",algorithm=\"rsa-sha256\",headers=\"date (request-target) host\",signature=\"AAAA\"",
        key_id()
    ));
    let refused = send(&emu, Endpoint::Vaults, forged).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    // A secret scheduled for deletion leaves the active listing.
    emu.set_secret_lifecycle("ocid1.vaultsecret.oc1..a-api", "PENDING_DELETION")
        .unwrap();
    emu.set_list_page_size(10);
    let after = signed(&emu, Endpoint::Vaults, &query).await;
    assert_eq!(names(&after), ["b-db"]);
}
