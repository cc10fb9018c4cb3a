//! `--remove-node-taint`: the provider removes its own node's startup taint once it serves,
//! through the emulator's Kubernetes API, and touches nothing else; a refusal, the API being
//! down and a concurrent edit are retried while it keeps serving; without the flag no node
//! is read.

use std::sync::Arc;
use std::time::Duration;

use clock::SystemClock;
use serde_json::Value;
use testkit::{Emulator, Endpoint, Fault, NodeSeed};
use tokio::time::Instant;

use super::{SECRET_BYTES, WAIT, metric, metrics_reaching, metrics_when, provider, request, seed};
use crate::process::Provider;

const KEY: &str = "oci.oraclecloud.com/secrets-provider-not-ready";
const OTHER: &str = "node.example.com/keep";
const NODE: &str = "node-a";
const NEIGHBOUR: &str = "node-b";

async fn emulator_with_nodes() -> Emulator {
    let seed = seed(1)
        .node(NodeSeed::new(
            NODE,
            &[
                (KEY, "NoSchedule"),
                (OTHER, "NoSchedule"),
                (KEY, "NoExecute"),
                (KEY, "PreferNoSchedule"),
            ],
        ))
        .node(NodeSeed::new(NEIGHBOUR, &[(KEY, "NoSchedule")]));
    Emulator::start(seed, Arc::new(SystemClock)).await.unwrap()
}

async fn with_flag(emu: &Emulator) -> Provider {
    let flag = format!("--remove-node-taint={KEY}");
    provider(emu, &[&flag], &[("NODE_NAME", NODE)]).await
}

/// (key, effect) of a node's taints, in order.
fn taints(emu: &Emulator, node: &str) -> Vec<(String, String)> {
    emu.node_taints(node)
        .unwrap()
        .iter()
        .map(|t: &Value| {
            (
                t["key"].as_str().unwrap().to_owned(),
                t["effect"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pair(key: &str, effect: &str) -> (String, String) {
    (key.to_owned(), effect.to_owned())
}

/// Waits until the startup taint's NoSchedule and NoExecute are gone from `NODE`.
async fn until_removed(emu: &Emulator) {
    let deadline = Instant::now() + WAIT;
    while taints(emu, NODE)
        .iter()
        .any(|(k, e)| k == KEY && e != "PreferNoSchedule")
    {
        assert!(
            Instant::now() < deadline,
            "the taint is removed: {:?}",
            taints(emu, NODE)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A mount through the socket answers the secret: the provider serves.
async fn serves(provider: &Provider) {
    let response = provider
        .client()
        .await
        .mount(request("instance", "sa-0", 1, "- name: db-password\n"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.files[0].contents, SECRET_BYTES.as_bytes());
}

#[tokio::test]
async fn the_startup_taint_is_removed_from_its_own_node_and_nothing_else_is_touched() {
    let emu = emulator_with_nodes().await;
    let provider = with_flag(&emu).await;
    until_removed(&emu).await;
    assert_eq!(
        taints(&emu, NODE),
        [pair(OTHER, "NoSchedule"), pair(KEY, "PreferNoSchedule")],
        "only the key's NoSchedule and NoExecute taints go, the others stay in order"
    );
    assert_eq!(taints(&emu, NEIGHBOUR), [pair(KEY, "NoSchedule")]);
    let metrics = metrics_when(
        &provider,
        "oci_provider_node_taint_removal_attempts_total{result=\"removed\"}",
        1.0,
    )
    .await;
    assert_eq!(metric(&metrics, "oci_provider_node_taint_pending"), 0.0);
    assert_eq!(
        emu.stats().node_patches,
        [(NODE.to_owned(), 1)].into_iter().collect(),
        "one patch, of its own node"
    );
    serves(&provider).await;
    let output = provider.terminate().await;
    assert!(output.status.success(), "{output:?}");
    assert!(
        output.stderr.contains("removed the startup taint"),
        "{output:?}"
    );
}

#[tokio::test]
async fn without_the_flag_no_node_is_read_or_patched() {
    let emu = emulator_with_nodes().await;
    let provider = provider(&emu, &[], &[("NODE_NAME", NODE)]).await;
    serves(&provider).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        emu.stats().arrived(Endpoint::Kube),
        0,
        "the Kubernetes API was called"
    );
    assert_eq!(taints(&emu, NODE).len(), 4);
    let metrics = provider.metrics().await;
    assert_eq!(
        metric(&metrics, "oci_provider_node_taint_removal_attempts_total"),
        0.0
    );
    assert!(provider.terminate().await.status.success());
}

#[tokio::test]
async fn a_refused_patch_is_logged_and_counted_and_retried_while_the_provider_serves() {
    let emu = emulator_with_nodes().await;
    emu.forbid_node_verbs(&["patch"]);
    let provider = with_flag(&emu).await;
    let metrics = metrics_reaching(
        &provider,
        "oci_provider_node_taint_removal_attempts_total{result=\"forbidden\"}",
        1.0,
    )
    .await;
    assert_eq!(metric(&metrics, "oci_provider_node_taint_pending"), 1.0);
    assert_eq!(taints(&emu, NODE).len(), 4, "nothing changed");
    serves(&provider).await;
    // The operator grants the rule: the next attempt (after the backoff) removes it.
    emu.forbid_node_verbs(&[]);
    until_removed(&emu).await;
    metrics_when(&provider, "oci_provider_node_taint_pending", 0.0).await;
    let output = provider.terminate().await;
    assert!(output.status.success(), "{output:?}");
    let refusal = output
        .stderr
        .lines()
        .find(|l| l.contains("cannot remove the startup taint"))
        .unwrap_or_else(|| panic!("no log line for the refusal: {output:?}"));
    assert!(refusal.contains("ERROR"), "{refusal}");
    assert!(refusal.contains("may not get or patch nodes"), "{refusal}");
    assert!(refusal.contains("http 403"), "{refusal}");
}

#[tokio::test]
async fn the_api_down_at_start_is_retried_with_backoff_until_the_taint_is_gone() {
    let emu = emulator_with_nodes().await;
    emu.set_fault(Endpoint::Kube, Some(Fault::DropMidResponse));
    let provider = with_flag(&emu).await;
    metrics_reaching(
        &provider,
        "oci_provider_node_taint_removal_attempts_total{result=\"error\"}",
        2.0,
    )
    .await;
    serves(&provider).await;
    emu.clear_faults(Endpoint::Kube);
    until_removed(&emu).await;
    let metrics = metrics_when(
        &provider,
        "oci_provider_node_taint_removal_attempts_total{result=\"removed\"}",
        1.0,
    )
    .await;
    assert_eq!(metric(&metrics, "oci_provider_node_taint_pending"), 0.0);
    assert!(provider.terminate().await.status.success());
}

#[tokio::test]
async fn a_concurrent_edit_fails_the_test_op_and_the_taint_goes_from_a_fresh_read() {
    let emu = emulator_with_nodes().await;
    // Another controller adds a taint between the provider's read and its patch.
    emu.taint_node_after_next_read(NODE, "node.example.com/added", "NoSchedule");
    let provider = with_flag(&emu).await;
    until_removed(&emu).await;
    assert_eq!(
        taints(&emu, NODE),
        [
            pair(OTHER, "NoSchedule"),
            pair(KEY, "PreferNoSchedule"),
            pair("node.example.com/added", "NoSchedule"),
        ],
        "the other controller's taint survives"
    );
    let metrics = metrics_when(
        &provider,
        "oci_provider_node_taint_removal_attempts_total{result=\"removed\"}",
        1.0,
    )
    .await;
    assert_eq!(
        metric(
            &metrics,
            "oci_provider_node_taint_removal_attempts_total{result=\"conflict\"}"
        ),
        1.0
    );
    assert_eq!(emu.stats().responses(Endpoint::Kube, 422), 1);
    assert!(provider.terminate().await.status.success());
}
