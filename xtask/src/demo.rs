//! `cargo xtask demo`: the provider's main job against the bundled emulator, end to end.
//!
//! Starts the OCI emulator (its own process) and the provider binary, mounts through the
//! real Unix socket as the Secrets Store CSI driver would, writes the files under
//! `target/demo/mount/`, and prints them with the provider's upstream connection count.
//! Then a second provider, configured for workload identity federation at the emulator's
//! identity domain (`provider-federation.toml`), mounts the same class for another pod:
//! `authType: workload` unchanged, the node's mechanism another.

use std::path::Path;

use anyhow::Context;
use serde_json::json;

use crate::procs::{Emulator, Provider, build, metric_sum, mount_request, root};

pub(crate) fn run(release: bool) -> anyhow::Result<()> {
    let bin = build(release)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(demo(&bin))
}

async fn demo(bin: &Path) -> anyhow::Result<()> {
    let dir = root().join("target").join("demo");
    let emulator = Emulator::start(
        bin,
        &root().join("xtask/demo/seed.toml"),
        &dir.join("emulator"),
    )
    .await?;
    let provider = Provider::start(bin, &emulator.config, &dir, &[]).await?;
    let pods = [
        ("OKE workload identity", "web-0", "workload"),
        ("instance principal", "batch-0", "instance"),
    ];
    let result = mounts(&provider, &dir.join("mount"), &pods).await;
    let stopped = provider.stop().await;
    let federated = match (result, stopped) {
        (Ok(()), Ok(())) => federation(bin, &emulator.config, &dir).await,
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    emulator.stop().await;
    federated
}

/// The same class mounted through workload identity federation: a provider whose
/// `[auth.workload]` names the emulator's identity domain.
async fn federation(bin: &Path, config: &Path, dir: &Path) -> anyhow::Result<()> {
    let config = config.with_file_name("provider-federation.toml");
    let socket_dir = dir.join("federation");
    std::fs::create_dir_all(&socket_dir)?;
    let provider = Provider::start(bin, &config, &socket_dir, &[]).await?;
    let pods = [(
        "workload identity federation, any cluster",
        "web-1",
        "workload",
    )];
    let result = mounts(&provider, &dir.join("mount"), &pods).await;
    let stopped = provider.stop().await;
    result?;
    stopped
}

async fn mounts(
    provider: &Provider,
    out: &Path,
    pods: &[(&str, &str, &str)],
) -> anyhow::Result<()> {
    let mut client = csi_grpc::client::connect_unix(&provider.socket).await?;
    let version = client
        .version(csi_grpc::proto::VersionRequest {
            version: "v1alpha1".into(),
        })
        .await?
        .into_inner();
    println!(
        "provider {} {} on {}",
        version.runtime_name,
        version.runtime_version,
        provider.socket.display()
    );
    let secrets = SECRETS;
    for &(label, pod, auth_type) in pods {
        let class = format!("demo-{auth_type}");
        let vault = "ocid1.vault.oc1.iad.demo";
        println!(
            "
== pod demo/{pod} ({label}) mounts this SecretProviderClass:
"
        );
        print!("{}", class_manifest(&class, vault, auth_type, secrets));
        let attributes = json!({
            "secrets": secrets,
            "vaultId": vault,
            "compartmentId": COMPARTMENT,
            "authType": auth_type,
            "secretProviderClass": class,
            "csi.storage.k8s.io/pod.name": pod,
            "csi.storage.k8s.io/pod.namespace": "demo",
            "csi.storage.k8s.io/pod.uid": format!("00000000-0000-0000-0000-{:012}", pod.len()),
            "csi.storage.k8s.io/serviceAccount.name": "demo-app",
        });
        println!(
            "\n   the provider answers these files (written under {}):",
            out.join(pod).display()
        );
        let response = match client.mount(mount_request(attributes)).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                println!("   failed: {:?}: {}", status.code(), status.message());
                continue;
            }
        };
        let target = out.join(pod);
        let _ = std::fs::remove_dir_all(&target);
        for file in &response.files {
            let path = target.join(&file.path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, &file.contents)
                .with_context(|| format!("cannot write {}", path.display()))?;
            let shown = match std::str::from_utf8(&file.contents) {
                // Certificates and keys: how many blocks of what, not their bytes.
                Ok(text) if text.starts_with("-----BEGIN ") => {
                    let labels: Vec<&str> = text
                        .lines()
                        .filter_map(|l| l.strip_prefix("-----BEGIN ")?.strip_suffix("-----"))
                        .collect();
                    format!("PEM, {} bytes: {}", text.len(), labels.join(" + "))
                }
                Ok(text) if !text.chars().any(|c| c.is_control() && c != '\n') => {
                    format!("{text:?}")
                }
                _ => format!("{} bytes: {}", file.contents.len(), hex(&file.contents)),
            };
            println!("   {} (mode {:o}) = {shown}", path.display(), file.mode);
        }
        // The driver keeps these and sends them back on its rotation's next Mount: a
        // changed version is how it knows to rewrite the files.
        println!("   object versions (the driver's rotation rewrites the files when one changes):");
        for version in &response.object_version {
            println!("     {} = {}", version.id, version.version);
        }
    }
    let metrics = provider.metrics_counting(pods.len()).await?;
    println!(
        "\nupstream connections open now: {}; upstream requests sent: {}; mounts answered: {}",
        metric_sum(&metrics, "oci_provider_upstream_connections_open"),
        metric_sum(&metrics, "oci_provider_upstream_requests_total"),
        metric_sum(&metrics, "oci_provider_mounts_total"),
    );
    Ok(())
}

/// The compartment of the secrets the class selects by tag.
const COMPARTMENT: &str = "ocid1.compartment.oc1..aaaaaaaademocompartment";

/// The class's entries: one of every kind (`provider::KINDS`): secrets (whole, a version by
/// number, one to a file of its own), a version history, a certificate with its key, a
/// selection by tag, and a template made of the others.
pub(crate) const SECRETS: &str = "\
- name: db-password
- name: db-password
  versionNumber: 1
  fileName: db-password.v1
- name: db-password
  versions: 2
  fileName: db-password-history
- name: tls-key
  fileName: tls/key.bin
- certificateId: ocid1.certificate.oc1.iad.demoweb
  privateKey: true
  directory: web-tls
- tag: team=demo
  directory: config
- fileName: app.env
  template: |
    DB_PASSWORD={{ text(\"db-password\") }}
    DB_PASSWORD_BEFORE={{ text(\"db-password-history/1\") }}
";

/// The SecretProviderClass a pod of the demo mounts, as a user writes it.
fn class_manifest(name: &str, vault: &str, auth_type: &str, secrets: &str) -> String {
    let mut out = format!(
        "   apiVersion: secrets-store.csi.x-k8s.io/v1\n   kind: SecretProviderClass\n   \
         metadata: {{ name: {name}, namespace: demo }}\n   spec:\n     provider: oci\n     \
         parameters:\n       vaultId: {vault}\n       compartmentId: {COMPARTMENT}\n       \
         authType: {auth_type}\n       secrets: |\n"
    );
    for line in secrets.lines() {
        out.push_str("         ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
