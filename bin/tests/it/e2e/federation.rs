//! Workload identity federation through the real binary against the emulator's identity
//! domain: the class keeps `authType: workload`, the node's `[auth.workload]` says
//! `federation`. Driver tokens and TokenRequests, UPSTs and RPSTs, Basic and
//! instance-principal client authentication, the sync controller's mounts, a storm with
//! exact exchange counts, and trace logs with no credential in them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clock::SystemClock;
use serde_json::json;
use testkit::{Emulator, Endpoint, Fault, IdentityDomainSeed, Principal, Seed, Signer, TokenSpec};
use tonic::Code;

use super::{NAMESPACE, SECRET_BYTES, TWO_SECRETS, files_of, metric, metrics_when, request, seed};
use crate::process::Provider;

const CLIENT: &str = "k8s-csi-runtime";
const CLIENT_SECRET: &str = "runtime-client-secret-never-logged";
const AUDIENCE: &str = "oci-workload-federation";
const SERVICE_USER: &str = "svc-storm";

fn subject(sa: &str) -> String {
    format!("system:serviceaccount:{NAMESPACE}:{sa}")
}

/// The e2e seed with an identity domain trusting the emulator's cluster for `AUDIENCE`:
/// every service account of the namespace impersonates `SERVICE_USER` (UPST), RPSTs for
/// `k8sworkload`, the instance's tenancy may exchange too; the secrets and certificates
/// allow the service user and every subject.
fn federation_seed(identities: usize) -> Seed {
    let mut seed = seed(identities);
    seed.identity_domain = IdentityDomainSeed::new(CLIENT, CLIENT_SECRET, AUDIENCE)
        .rule(&format!("sub eq {}", subject("*")), SERVICE_USER);
    seed.identity_domain.trusts[0]
        .instance_tenancies
        .push(seed.instance.tenancy.clone());
    let names: Vec<String> = std::iter::once(SERVICE_USER.to_owned())
        .chain((0..identities).map(|i| subject(&format!("sa-{i}"))))
        .collect();
    for access in seed
        .secrets
        .iter_mut()
        .map(|s| &mut s.access)
        .chain(seed.certificates.iter_mut().map(|c| &mut c.access))
    {
        access.federated.extend(names.iter().cloned());
    }
    seed
}

async fn federation_emulator(identities: usize) -> Emulator {
    let emu = Emulator::start(federation_seed(identities), Arc::new(SystemClock))
        .await
        .unwrap();
    for endpoint in [Endpoint::Secrets, Endpoint::Kube, Endpoint::IdentityDomain] {
        emu.set_http1_only(endpoint, true);
    }
    emu
}

/// The emulator's provider configuration with `[auth.workload]` federation settings
/// `settings` (the lines of `[auth.workload.federation]` after `domain_url`).
fn config(emu: &Emulator, name: &str, settings: &str) -> PathBuf {
    let path = emu.files().dir.join(name);
    let text = format!(
        "{}\n[auth]\nworkload_audience = {AUDIENCE:?}\n\n[auth.workload]\nmechanism = \
         \"federation\"\n\n[auth.workload.federation]\ndomain_url = {:?}\n{settings}\n",
        emu.provider_config("us-ashburn-1"),
        emu.url(Endpoint::IdentityDomain)
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn start(config: &std::path::Path, args: &[&str]) -> Provider {
    let config = config.to_str().unwrap();
    let mut all = vec!["--config", config];
    all.extend_from_slice(args);
    Provider::start(
        &all,
        &[
            ("OCI_PROVIDER_UPSTREAM__MAX_CONNECTIONS_PER_HOST", "4"),
            super::NO_CACHE,
        ],
    )
    .await
}

/// A token of `sa` for the audience, bound to pod `pod` as the e2e requests name it.
fn driver_token(emu: &Emulator, sa: &str, pod: usize) -> String {
    emu.mint_service_account_token(
        &TokenSpec::new(NAMESPACE, sa)
            .audiences(&[AUDIENCE])
            .bound_to(
                &format!("pod-{pod}"),
                &format!("00000000-0000-0000-0000-{pod:012}"),
            ),
    )
    .unwrap()
}

/// `request` with `token` for the audience in the attributes, as the driver sends it.
fn with_token(
    mut request: csi_grpc::proto::MountRequest,
    token: &str,
) -> csi_grpc::proto::MountRequest {
    let mut attributes: serde_json::Value = serde_json::from_str(&request.attributes).unwrap();
    attributes["csi.storage.k8s.io/serviceAccount.tokens"] = json!(
        json!({ AUDIENCE: {"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"} })
            .to_string()
    );
    request.attributes = attributes.to_string();
    request
}

/// The request as the secrets-store-sync-controller sends it: its own pod, the target
/// `/mnt/secrets-store`, no `secretProviderClass` attribute, its unbound token.
fn sync_controller(emu: &Emulator, sa: &str) -> csi_grpc::proto::MountRequest {
    let token = emu
        .mint_service_account_token(&TokenSpec::new(NAMESPACE, sa).audiences(&[AUDIENCE]))
        .unwrap();
    let mut request = with_token(request("workload", sa, 77, TWO_SECRETS), &token);
    let mut attributes: serde_json::Value = serde_json::from_str(&request.attributes).unwrap();
    attributes
        .as_object_mut()
        .unwrap()
        .remove("secretProviderClass");
    request.attributes = attributes.to_string();
    request.target_path = csi_grpc::SYNC_CONTROLLER_TARGET_PATH.into();
    request
}

/// Who the emulator saw the Secrets calls as since call `from`.
fn callers(emu: &Emulator, from: usize) -> Vec<(String, String, String)> {
    emu.secrets_calls()[from..]
        .iter()
        .map(|c| match &c.identity {
            Some(Principal::Federated {
                token_type,
                name,
                client,
                ..
            }) => (token_type.clone(), name.clone(), client.clone()),
            other => panic!("not federated: {other:?}"),
        })
        .collect()
}

fn expected_files() -> Vec<(&'static str, Vec<u8>, i32)> {
    vec![
        ("db-password", SECRET_BYTES.as_bytes().to_vec(), 420),
        ("tls/key.bin", vec![0, 159, 146, 150, 255], 420),
    ]
}

#[tokio::test]
async fn federated_upst_mounts_with_driver_tokens_token_requests_and_the_sync_controller() {
    let emu = federation_emulator(3).await;
    let settings = format!(
        "client_id = {CLIENT:?}\nclient_secret_file = {:?}\n",
        emu.files().client_secret.display().to_string()
    );
    let provider = start(&config(&emu, "upst.toml", &settings), &[]).await;
    let mut client = provider.client().await;
    let driver = with_token(
        request("workload", "sa-0", 1, TWO_SECRETS),
        &driver_token(&emu, "sa-0", 1),
    );
    let by_token_request = request("workload", "sa-1", 2, TWO_SECRETS);
    for mount in [driver, by_token_request, sync_controller(&emu, "sa-2")] {
        let response = client.mount(mount).await.unwrap().into_inner();
        assert_eq!(files_of(&response), expected_files());
    }
    let upst = (
        "upst".to_owned(),
        SERVICE_USER.to_owned(),
        CLIENT.to_owned(),
    );
    assert!(
        callers(&emu, 0).iter().all(|c| *c == upst),
        "{:?}",
        callers(&emu, 0)
    );
    let stats = emu.stats();
    for sa in ["sa-0", "sa-1", "sa-2"] {
        assert_eq!(stats.token_exchanges(NAMESPACE, sa), 1, "{sa}");
    }
    // Only the driver's mount without a token made a TokenRequest; OKE's proxymux is idle.
    assert_eq!(stats.total_token_requests(), 1);
    assert_eq!(stats.arrived(Endpoint::Proxymux), 0);
    let metrics = provider.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "oci_provider_credential_fetches_total{kind=\"upst\",op=\"exchange\",result=\"ok\"}"
        ),
        3.0,
        "{metrics}"
    );
    assert!(provider.terminate().await.status.success());
}

#[tokio::test]
async fn federated_rpst_mounts_signed_by_the_instance_principal_and_a_secret_of_the_provider() {
    let emu = federation_emulator(2).await;
    let rpst = "requested_token_type = \"urn:oci:token-type:oci-rpst\"\n\
                resource_type = \"k8sworkload\"\n";
    let settings = format!("use_instance_principal = true\n{rpst}");
    let provider = start(&config(&emu, "rpst.toml", &settings), &[]).await;
    let mut client = provider.client().await;
    let response = client
        .mount(with_token(
            request("workload", "sa-0", 1, TWO_SECRETS),
            &driver_token(&emu, "sa-0", 1),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(files_of(&response), expected_files());
    let seen = callers(&emu, 0);
    assert!(
        seen.iter().all(|(kind, name, client)| kind == "rpst"
            && *name == subject("sa-0")
            && client.starts_with("instance:")),
        "{seen:?}"
    );
    assert_eq!(emu.stats().federations, 1, "the node's instance session");
    assert!(provider.terminate().await.status.success());

    // The client secret from a Kubernetes Secret in the provider's own namespace.
    let namespace = Seed::default().provider_service_account.namespace;
    emu.put_kube_secret(
        testkit::KubeSecretSeed::new(&namespace, "oci-federation")
            .data("client-secret", CLIENT_SECRET),
    );
    let settings = format!(
        "client_id = {CLIENT:?}\nclient_secret_ref = {{ namespace = {namespace:?}, name = \
         \"oci-federation\", key = \"client-secret\" }}\n{rpst}"
    );
    let provider = start(&config(&emu, "secret.toml", &settings), &[]).await;
    let from = emu.secrets_calls().len();
    let response = provider
        .client()
        .await
        .mount(request("workload", "sa-1", 2, TWO_SECRETS))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(files_of(&response), expected_files());
    assert!(
        callers(&emu, from)
            .iter()
            .all(|(kind, _, client)| kind == "rpst" && client == CLIENT)
    );
    assert!(provider.terminate().await.status.success());
}

#[tokio::test]
async fn five_mounts_of_a_refused_service_account_through_the_socket_make_one_exchange() {
    let emu = federation_emulator(2).await;
    let settings = format!(
        "client_id = {CLIENT:?}\nclient_secret_file = {:?}\n",
        emu.files().client_secret.display().to_string()
    );
    let provider = start(&config(&emu, "refused.toml", &settings), &[]).await;
    let mut client = provider.client().await;
    emu.set_fault(Endpoint::IdentityDomain, Some(Fault::invalid_grant()));
    // Five pods of the service account, each mount by TokenRequest: one is made.
    for pod in 10..15 {
        let status = client
            .mount(request("workload", "sa-0", pod, "- name: db-password\n"))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert!(status.message().contains("invalid_grant"), "{status:?}");
        assert!(
            status.message().contains("this refusal is remembered"),
            "{status:?}"
        );
    }
    let stats = emu.stats();
    assert_eq!(
        (
            stats.arrived(Endpoint::IdentityDomain),
            stats.total_token_requests()
        ),
        (1, 1)
    );
    let served = "oci_provider_credential_refusals_total{outcome=\"served\"}";
    let metrics = metrics_when(&provider, served, 4.0).await;
    assert_eq!(
        metric(
            &metrics,
            "oci_provider_credential_refusals_total{outcome=\"remembered\"}"
        ),
        1.0,
        "{metrics}"
    );
    // Another service account of the namespace is exchanged at once.
    emu.clear_faults(Endpoint::IdentityDomain);
    client
        .mount(request("workload", "sa-1", 20, "- name: db-password\n"))
        .await
        .unwrap();
    assert!(provider.terminate().await.status.success());
}

#[tokio::test]
async fn a_storm_of_2000_federated_mounts_of_20_identities_makes_20_exchanges() {
    const IDENTITIES: usize = 20;
    const MOUNTS: usize = 2000;
    let emu = federation_emulator(IDENTITIES).await;
    let settings = format!(
        "client_id = {CLIENT:?}\nclient_secret_file = {:?}\n",
        emu.files().client_secret.display().to_string()
    );
    let provider = start(
        &config(&emu, "storm.toml", &settings),
        &["--log-level=warn"],
    )
    .await;
    let client = provider.client().await;
    // Each pod its own token, as the kubelet hands them out: 2000 distinct tokens, each
    // verified, 20 identities exchanged once each.
    let mounts: Vec<_> = (0..MOUNTS)
        .map(|i| {
            let sa = format!("sa-{}", i % IDENTITIES);
            let pod = 1000 + i;
            with_token(
                request("workload", &sa, pod, "- name: db-password\n"),
                &driver_token(&emu, &sa, pod),
            )
        })
        .collect();
    let permits = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = Vec::with_capacity(MOUNTS);
    for mount in mounts {
        let permit = permits.clone().acquire_owned().await.unwrap();
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let started = Instant::now();
            let response = client.mount(mount).await;
            (started.elapsed(), response)
        }));
    }
    let mut latencies = Vec::with_capacity(MOUNTS);
    for task in tasks {
        let (elapsed, response) = task.await.unwrap();
        assert_eq!(
            response.unwrap().into_inner().files[0].contents,
            SECRET_BYTES.as_bytes()
        );
        latencies.push(elapsed);
    }
    let stats = emu.stats();
    assert_eq!(stats.total_token_exchanges(), IDENTITIES as u64);
    for i in 0..IDENTITIES {
        assert_eq!(
            stats.token_exchanges(NAMESPACE, &format!("sa-{i}")),
            1,
            "sa-{i}"
        );
    }
    assert_eq!(stats.arrived(Endpoint::IdentityDomain), IDENTITIES as u64);
    assert_eq!(stats.total_token_requests(), 0);
    for endpoint in [Endpoint::Secrets, Endpoint::IdentityDomain, Endpoint::Kube] {
        let listener = stats.listener(endpoint);
        assert!(listener.high_water <= 4, "{endpoint:?}: {listener:?}");
    }
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let rss = std::fs::read_to_string(format!("/proc/{}/status", provider.pid()))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("VmHWM") || l.starts_with("VmRSS"))
        .collect::<Vec<_>>()
        .join(", ");
    eprintln!(
        "measured: {MOUNTS} federated mounts of {IDENTITIES} identities: {} exchanges, {} \
         token verifications, p50 {:?}, p99 {:?}, max {:?}; provider {rss}",
        stats.total_token_exchanges(),
        metric(
            &provider.metrics().await,
            "oci_provider_token_verifications_total"
        ),
        at(0.5),
        at(0.99),
        at(1.0),
    );
    assert!(provider.terminate().await.status.success());
}

#[tokio::test]
async fn federated_trace_logs_hold_no_client_secret_subject_or_session_token() {
    let emu = federation_emulator(5).await;
    let settings = format!(
        "client_id = {CLIENT:?}\nclient_secret_file = {:?}\n",
        emu.files().client_secret.display().to_string()
    );
    let provider = start(
        &config(&emu, "trace.toml", &settings),
        &["--log-level=trace"],
    )
    .await;
    let mut client = provider.client().await;
    let token = driver_token(&emu, "sa-0", 1);
    client
        .mount(with_token(
            request("workload", "sa-0", 1, TWO_SECRETS),
            &token,
        ))
        .await
        .unwrap();
    client
        .mount(request("workload", "sa-1", 2, TWO_SECRETS))
        .await
        .unwrap();
    // A 401 from OCI: the session is exchanged again within the request.
    emu.script(Endpoint::Secrets, [Fault::Status(401)]);
    client
        .mount(with_token(
            request("workload", "sa-0", 1, "- name: db-password\n"),
            &token,
        ))
        .await
        .unwrap();
    let mut errors = Vec::new();
    // Forged or foreign driver tokens: refused before any exchange, naming the check.
    let now = emu.now();
    let forge = |spec: TokenSpec| {
        emu.mint_service_account_token(
            &spec.bound_to("pod-3", "00000000-0000-0000-0000-000000000003"),
        )
        .unwrap()
    };
    let base = || TokenSpec::new(NAMESPACE, "sa-1");
    let forged = [
        (
            forge(base().audiences(&[AUDIENCE]).signed_by(Signer::OtherKey)),
            "key id (kid)",
        ),
        (
            forge(base().audiences(&["https://kubernetes.default.svc"])),
            "audience (aud)",
        ),
        (
            forge(
                base()
                    .audiences(&[AUDIENCE])
                    .issued_at(now - Duration::from_secs(7200)),
            ),
            "expired",
        ),
        (
            forge(base().audiences(&[AUDIENCE]).issuer("https://elsewhere")),
            "issuer (iss)",
        ),
    ];
    let exchanges = emu.stats().arrived(Endpoint::IdentityDomain);
    for (token, check) in &forged {
        let status = client
            .mount(with_token(
                request("workload", "sa-1", 3, TWO_SECRETS),
                token,
            ))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert!(status.message().contains(check), "{check}: {status:?}");
        errors.push(status);
    }
    assert_eq!(emu.stats().arrived(Endpoint::IdentityDomain), exchanges);
    // The domain refusing the client, the subject, and failing: identities not exchanged
    // yet (sa-2, sa-3, sa-4), each mount's exchange faulted.
    for (sa, fault, expected) in [
        ("sa-2", Fault::invalid_client(), "invalid_client"),
        ("sa-3", Fault::invalid_grant(), "invalid_grant"),
        ("sa-4", Fault::Status(503), "failed on every attempt"),
    ] {
        emu.set_fault(Endpoint::IdentityDomain, Some(fault));
        let status = client
            .mount(request("workload", sa, 4, "- name: db-password\n"))
            .await
            .unwrap_err();
        emu.clear_faults(Endpoint::IdentityDomain);
        assert!(status.message().contains(expected), "{status:?}");
        errors.push(status);
    }
    let output = provider.terminate().await;
    assert!(output.status.success());
    assert!(output.stderr.contains("TRACE"), "trace logs were captured");
    assert!(
        output
            .stderr
            .contains("exchanged a service-account token at the identity domain")
    );
    let basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("{CLIENT}:{CLIENT_SECRET}"))
    };
    let mut forbidden = vec![
        CLIENT_SECRET.to_owned(),
        basic,
        SECRET_BYTES.to_owned(),
        // Every JWT (subject tokens, session tokens) starts so; key ids show `ST$<redacted>`.
        "eyJ".to_owned(),
        "ST$ey".to_owned(),
        "PRIVATE KEY".to_owned(),
    ];
    for (token, _) in &forged {
        forbidden.extend(token.split('.').map(str::to_owned));
    }
    forbidden.extend(token.split('.').map(str::to_owned));
    super::assert_none_holds(&output, &errors, &forbidden);
}
