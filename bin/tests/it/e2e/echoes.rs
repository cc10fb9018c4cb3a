//! What a tenant writes is echoed escaped and cut: whatever the value (650 KB of vault OCID,
//! a newline and an escape sequence in authType, a key of 300 KB), no status message and
//! no log line grows with it, and none can forge a line or colour a terminal.

use super::*;

/// The longest status message a mount may answer.
const MESSAGE_BOUND: usize = 4096;
/// The longest log line (at trace level) a mount may write.
const LOG_LINE_BOUND: usize = 16 * 1024;

/// A value made to hurt: long, with a newline, an escape sequence and a forged log line.
fn hostile(len: usize) -> String {
    let forged = "\n2026-12-04T00:00:00Z  INFO FORGED line\u{1b}[31m";
    let mut value = String::with_capacity(len + forged.len());
    value.push_str("ocid1.vault.oc1.iad.");
    value.push_str(forged);
    while value.len() < len {
        value.push('v');
    }
    value
}

#[tokio::test]
async fn no_status_message_or_log_line_grows_with_what_a_tenant_writes() {
    let emu = emulator(1).await;
    let provider = provider(&emu, &["--log-level=trace"], &[NO_CACHE]).await;
    let mut client = provider.client().await;
    let big = hostile(650_000);
    let short = hostile(2_000);
    let with = |attribute: &str, value: &str, secrets: &str| {
        let mut mount = request("workload", "sa-0", 1, secrets);
        let mut attributes: serde_json::Value = serde_json::from_str(&mount.attributes).unwrap();
        attributes[attribute] = json!(value);
        mount.attributes = attributes.to_string();
        mount
    };
    let mut mounts = Vec::new();
    for attribute in [
        "vaultId",
        "authType",
        "region",
        "failoverRegion",
        "failoverVaultId",
        "authSecretName",
        &big[..300],
    ] {
        mounts.push(with(attribute, &big, TWO_SECRETS));
    }
    let user = |secret_name: &str| {
        let mut mount = request("user", "sa-0", 1, TWO_SECRETS);
        mount.attributes = mount
            .attributes
            .replace("\"oci-config\"", &json!(secret_name).to_string());
        mount
    };
    mounts.push(user(&short));
    for secrets in [
        format!("- name: {}\n", json!(short)),
        format!("- name: a\n  fileName: {}\n", json!(short)),
        format!("- name: a\n  stage: {}\n", json!(short)),
        format!("- name: a\n  mode: {}\n", json!(short)),
        format!("- name: a\n  encoding: {}\n", json!(short)),
        format!("- name: a\n  keys: [{{key: {}}}]\n", json!(&short[..1000])),
        format!("- secretId: {}\n", json!(short)),
        format!("- certificateId: {}\n", json!(short)),
        format!("- name: a\n  {}: b\n", json!(&short[..1000])),
        format!("{}\n", big),
    ] {
        mounts.push(request("workload", "sa-0", 1, &secrets));
    }
    let mut statuses = Vec::new();
    let mut mounted = 0;
    for mount in mounts {
        match client.mount(mount).await {
            Ok(_) => mounted += 1,
            Err(status) => statuses.push(status),
        }
    }
    let output: Output = provider.terminate().await;
    assert!(output.status.success());
    // Two mounts succeed: an unknown attribute and a workload class's authSecretName are
    // not read (they may be logged, which is what this test is about).
    assert_eq!((statuses.len(), mounted), (16, 2), "{statuses:#?}");
    for status in &statuses {
        let message = status.message();
        assert!(
            message.len() <= MESSAGE_BOUND,
            "{} bytes: {}",
            message.len(),
            &message[..300.min(message.len())]
        );
        assert!(
            !message.contains('\n') && !message.contains('\u{1b}'),
            "{message:?}"
        );
        assert!(!message.contains("vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv"));
    }
    // The capture caught the mounts (and their failures) before nothing was found in it.
    assert!(output.stderr.contains("mount failed"), "logs were captured");
    for line in output.stderr.lines() {
        assert!(
            line.len() <= LOG_LINE_BOUND,
            "a log line of {} bytes: {}",
            line.len(),
            &line[..300.min(line.len())]
        );
        assert!(
            !line.contains('\u{1b}'),
            "an escape sequence reached the log: {line:?}"
        );
        // Quoted, the forged text stays inside its field, escaped; it never starts a line.
        assert!(
            !line.starts_with("2026-12-04T00:00:00Z"),
            "a forged line: {line:?}"
        );
    }
}

#[tokio::test]
async fn a_misspelt_parameter_mounts_and_the_log_says_what_was_meant() {
    let emu = emulator(1).await;
    let provider = provider(&emu, &[], &[]).await;
    let mut client = provider.client().await;
    let mut mount = request("workload", "sa-0", 1, TWO_SECRETS);
    let mut attributes: serde_json::Value = serde_json::from_str(&mount.attributes).unwrap();
    attributes["regoin"] = json!("iad");
    mount.attributes = attributes.to_string();
    client.mount(mount).await.unwrap();
    let out = provider.terminate().await;
    assert!(
        out.stderr.contains(
            "parameter \"regoin\" is not one the provider reads (ignored); did you mean \"region\"?"
        ),
        "{}",
        out.stderr
    );
}
