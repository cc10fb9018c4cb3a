//! `cargo xtask storm`: a pod storm on one node, measured. The emulator and the provider run
//! as processes; one mount warms the node (the identity's session, the connections), then N
//! mounts of one secret by one identity (workload identity, one namespace) are fired at once
//! over one connection, as the driver does when a Deployment scales onto the node, R times.
//! Reports the mounts that succeeded, those that failed by gRPC code, and the latency.
//!
//! The bundle cache keeps nothing by default (`--ttl 0`): each storm's mounts join one fetch
//! of the secret, as on a node that has not mounted it within the cache's TTL, so the
//! storm's mounts are in flight together. With the cache warm a mount is answered in well
//! under a millisecond and a storm of 64 rarely has many in flight at once.
//!
//! `--provider-bin` runs another build of the provider (an older release, for a "before"
//! figure): only flags and settings every release accepts are passed to it.
//!
//! `--federation` runs the storm through workload identity federation at the emulator's
//! identity domain instead of OKE's proxymux; `--identities N` spreads the mounts over N
//! service accounts and `--concurrency C` keeps at most C in flight (the driver's kubelets
//! across a node): `--federation --identities 20 --mounts 2000 --concurrency 64` is the
//! figure of 2000 mounts of 20 identities, with the exchanges made and the provider's RSS.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::json;

use crate::procs::{
    Emulator, PROVIDER_BIN, Provider, build, build_emulator, metric_sum, mount_request, root,
    status_kib,
};
use crate::soak::percentile;

const HELP: &str =
    "usage: cargo xtask storm [--mounts N] [--rounds R] [--provider-bin PATH] [--debug]
                         [--ttl SECONDS] [--federation] [--identities N] [--concurrency C]

  --mounts N           mounts fired at once in each round (default 64)
  --rounds R           storms, one after the other (default 1)
  --ttl SECONDS        cache.bundle_ttl_seconds of the provider (default 0: each storm's
                       mounts join one fetch of the secret)
  --provider-bin PATH  the provider binary to run (default: this workspace's build); the
                       emulator is built from this workspace
  --debug              use debug builds (default: release)
  --federation         workload identity federation at the emulator's identity domain
                       (the provider's [auth.workload] mechanism) instead of OKE's proxymux
  --identities N       service accounts the mounts are spread over (default 1)
  --concurrency C      mounts in flight at most (default: all of a round at once)
";

#[derive(Debug)]
struct Options {
    mounts: usize,
    rounds: usize,
    provider_bin: Option<PathBuf>,
    release: bool,
    ttl: usize,
    federation: bool,
    identities: usize,
    concurrency: Option<usize>,
}

fn parse(args: &[String]) -> anyhow::Result<Option<Options>> {
    let mut o = Options {
        mounts: 64,
        rounds: 1,
        provider_bin: None,
        release: true,
        ttl: 0,
        federation: false,
        identities: 1,
        concurrency: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> anyhow::Result<usize> {
            it.next()
                .with_context(|| format!("{name} needs a value"))?
                .parse()
                .with_context(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--mounts" => o.mounts = value("--mounts")?.max(1),
            "--rounds" => o.rounds = value("--rounds")?.max(1),
            "--provider-bin" => {
                o.provider_bin = Some(it.next().context("--provider-bin needs a path")?.into());
            }
            "--debug" => o.release = false,
            "--ttl" => o.ttl = value("--ttl")?,
            "--federation" => o.federation = true,
            "--identities" => o.identities = value("--identities")?.max(1),
            "--concurrency" => o.concurrency = Some(value("--concurrency")?.max(1)),
            "-h" | "--help" => {
                eprint!("{HELP}");
                return Ok(None);
            }
            other => bail!("unknown option {other:?}\n{HELP}"),
        }
    }
    Ok(Some(o))
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(options) = parse(args)? else {
        return Ok(());
    };
    let (emulator_dir, provider) = match &options.provider_bin {
        Some(path) => {
            let path = std::fs::canonicalize(path)
                .with_context(|| format!("--provider-bin {}", path.display()))?;
            (build_emulator(options.release)?, path)
        }
        None => {
            let bin = build(options.release)?;
            let provider = bin.join(PROVIDER_BIN);
            (bin, provider)
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(storm(&emulator_dir, &provider, &options))
}

/// One vault, one secret, `identities` service accounts allowed to read it (`web` alone,
/// or `web-0`...), and an identity domain mapping each to the service user `svc-storm`.
fn seed(identities: usize) -> String {
    let accounts = service_accounts(identities);
    let workloads: Vec<String> = accounts
        .iter()
        .map(|sa| format!("{{ namespace = \"storm\", service_account = \"{sa}\" }}"))
        .collect();
    let mut lines = vec![
        "region = \"us-ashburn-1\"".to_owned(),
        "workload_tenancy = \"ocid1.tenancy.oc1..storm\"".into(),
        "[[vaults]]".into(),
        "id = \"ocid1.vault.oc1.iad.storm\"".into(),
        "[instance]".into(),
        "tenancy = \"ocid1.tenancy.oc1..storminstance\"".into(),
        "instance_id = \"ocid1.instance.oc1.iad.storm\"".into(),
        "[[secrets]]".into(),
        "id = \"ocid1.vaultsecret.oc1.iad.storm\"".into(),
        "name = \"db-password\"".into(),
        "vault_id = \"ocid1.vault.oc1.iad.storm\"".into(),
        "[[secrets.versions]]".into(),
        "number = 1".into(),
        "stages = [\"CURRENT\", \"LATEST\"]".into(),
        "content = { text = \"storm-value\" }".into(),
        "[secrets.access]".into(),
        format!("workloads = [{}]", workloads.join(", ")),
        "federated = [\"svc-storm\"]".into(),
    ];
    for sa in &accounts {
        lines.push(format!(
            "[[service_accounts]]\nnamespace = \"storm\"\nname = \"{sa}\""
        ));
    }
    lines.extend(
        [
            "[lifetimes]",
            "rpst_secs = 86400",
            "instance_token_secs = 86400",
            "kube_token_default_secs = 86400",
            "provider_token_secs = 86400",
            "federated_token_secs = 86400",
            "[[identity_domain.clients]]",
            "id = \"storm-runtime\"",
            "secret = \"storm-client-secret\"",
            "[[identity_domain.trusts]]",
            "oauth_clients = [\"storm-runtime\"]",
            "client_claim_values = [\"oci-federation-storm\"]",
            "[[identity_domain.trusts.impersonation_service_users]]",
            "rule = \"sub eq system:serviceaccount:storm:*\"",
            "value = \"svc-storm\"",
        ]
        .map(str::to_owned),
    );
    lines.join("\n") + "\n"
}

/// The service accounts of the storm: `web`, or `web-0` to `web-<n-1>`.
fn service_accounts(identities: usize) -> Vec<String> {
    match identities {
        1 => vec!["web".to_owned()],
        n => (0..n).map(|i| format!("web-{i}")).collect(),
    }
}

async fn storm(emulator_dir: &Path, provider_bin: &Path, options: &Options) -> anyhow::Result<()> {
    let dir = root().join("target").join("storm");
    std::fs::create_dir_all(&dir)?;
    let seed_path = dir.join("seed.toml");
    std::fs::write(&seed_path, seed(options.identities))?;
    let emulator = Emulator::start(emulator_dir, &seed_path, &dir.join("emulator")).await?;
    let config = if options.federation {
        emulator.config.with_file_name("provider-federation.toml")
    } else {
        emulator.config.clone()
    };
    // The provider's defaults (64 slots, a share of 16 per namespace) but for the log level
    // and the cache's TTL, settings every release accepts.
    let ttl = options.ttl.to_string();
    let mut env = vec![
        ("OCI_PROVIDER_LOG__LEVEL", "error"),
        ("OCI_PROVIDER_CACHE__BUNDLE_TTL_SECONDS", ttl.as_str()),
    ];
    // This build keeps 32 session keys ahead by default; a storm of more identities gets a
    // pool its size (an older release reads no such setting).
    let keys = options.identities.clamp(32, 256).to_string();
    if options.provider_bin.is_none() {
        env.push(("OCI_PROVIDER_AUTH__SESSION_KEYS_AHEAD", keys.as_str()));
    }
    let provider = Provider::start_binary(provider_bin, &config, &dir, &env).await?;
    println!(
        "storm: {} mounts of one secret ({} at once) by {} identities (workload {}, one \
         namespace), {} round(s), bundle cache TTL {} s, provider {}",
        options.mounts,
        options.concurrency.unwrap_or(options.mounts),
        options.identities,
        if options.federation {
            "identity federation"
        } else {
            "identity on OKE"
        },
        options.rounds,
        options.ttl,
        provider_bin.display()
    );
    let result = measure(&provider, options).await;
    let stopped = provider.stop().await;
    emulator.stop().await;
    result?;
    stopped
}

/// How one mount ended: its latency, and the gRPC code of its failure.
type Outcome = (u64, Option<tonic::Code>);

async fn measure(provider: &Provider, options: &Options) -> anyhow::Result<()> {
    let client = csi_grpc::client::connect_unix(&provider.socket).await?;
    let accounts = Arc::new(service_accounts(options.identities));
    let (_, warm) = mount(client.clone(), 0, &accounts).await;
    if let Some(code) = warm {
        bail!("the warm-up mount failed: {code:?}");
    }
    keys_ready(provider, options.identities).await?;
    let before = provider.metrics().await?;
    let mut all = Vec::new();
    for round in 1..=options.rounds {
        let first = round * options.mounts;
        let outcomes = fire(&client, options, first, &accounts).await?;
        println!("round {round}: {}", summary(&outcomes));
        all.extend(outcomes);
    }
    if options.rounds > 1 {
        println!("all {} mounts: {}", all.len(), summary(&all));
    }
    // /metrics renders at most once a second: wait for a rendering after the last mount.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let after = provider.metrics().await?;
    let delta = |name: &str| metric_sum(&after, name) - metric_sum(&before, name);
    let mut line = format!(
        "provider: shed {:.0}",
        delta("oci_provider_mounts_shed_total")
    );
    // Only releases with admission queues report waits.
    if after.contains("oci_provider_mount_queue_wait_seconds") {
        let waits = delta("oci_provider_mount_queue_wait_seconds_count");
        let waited = delta("oci_provider_mount_queue_wait_seconds_sum");
        let _ = write!(
            line,
            ", waited for a slot {waits:.0} (mean {:.1} ms)",
            if waits > 0.0 {
                waited / waits * 1000.0
            } else {
                0.0
            }
        );
    }
    println!("{line}");
    // Every exchange since the start (the warm-up's too): one per identity is the bound.
    let exchanges = ["rpst", "upst"].map(|kind| {
        metric_sum(
            &after,
            &format!(
                "oci_provider_credential_fetches_total{{kind=\"{kind}\",op=\"exchange\",result=\"ok\"}}"
            ),
        )
    });
    if let Some(pid) = provider.pid() {
        println!(
            "identities {}: token exchanges {:.0}; provider RSS {} KiB, peak {} KiB",
            options.identities,
            exchanges.iter().sum::<f64>(),
            status_kib(pid, "VmRSS"),
            status_kib(pid, "VmHWM")
        );
    }
    Ok(())
}

/// Waits (a minute at most) until the provider holds a session key for each identity of
/// the storm, as a node's provider does seconds after it starts: the storm then measures
/// the exchanges of new identities, not the provider's first seconds. A release without
/// the pool (no `oci_provider_session_keys_ready`) is not waited for.
async fn keys_ready(provider: &Provider, identities: usize) -> anyhow::Result<()> {
    const READY: &str = "oci_provider_session_keys_ready";
    let started = Instant::now();
    loop {
        let metrics = provider.metrics().await?;
        if !metrics.contains(READY) {
            return Ok(());
        }
        let ready = metric_sum(&metrics, READY);
        // The warm-up's identity has its session already.
        if ready + 1.0 >= identities as f64 || started.elapsed().as_secs() >= 60 {
            println!(
                "session keys ready before the storm: {ready:.0} (after {:.1} s)",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// The mounts of pods `first..` (`--mounts` of them): started together (a barrier
/// releases them at once), or at most `--concurrency` in flight.
async fn fire(
    client: &csi_grpc::client::Client,
    options: &Options,
    first: usize,
    accounts: &Arc<Vec<String>>,
) -> anyhow::Result<Vec<Outcome>> {
    let count = options.mounts;
    let start = Arc::new(tokio::sync::Barrier::new(count));
    let permits = Arc::new(tokio::sync::Semaphore::new(
        options.concurrency.unwrap_or(count),
    ));
    let paced = options.concurrency.is_some();
    let tasks: Vec<_> = (first..first + count)
        .map(|pod| {
            let (client, start, permits) = (client.clone(), start.clone(), permits.clone());
            let accounts = accounts.clone();
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await;
                if !paced {
                    start.wait().await;
                }
                mount(client, pod, &accounts).await
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(count);
    for task in tasks {
        outcomes.push(task.await?);
    }
    Ok(outcomes)
}

/// One mount of the secret for pod `pod`, by its service account among `accounts`.
async fn mount(mut client: csi_grpc::client::Client, pod: usize, accounts: &[String]) -> Outcome {
    let service_account = &accounts[pod % accounts.len()];
    let attributes = json!({
        "secrets": "- name: db-password\n",
        "vaultId": "ocid1.vault.oc1.iad.storm",
        "authType": "workload",
        "secretProviderClass": "storm",
        "csi.storage.k8s.io/pod.name": format!("web-{pod}"),
        "csi.storage.k8s.io/pod.namespace": "storm",
        "csi.storage.k8s.io/pod.uid": format!("00000000-0000-0000-0000-{pod:012}"),
        "csi.storage.k8s.io/serviceAccount.name": service_account,
    });
    let started = Instant::now();
    let result = client.mount(mount_request(attributes)).await;
    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    match result {
        Ok(response) if response.get_ref().files.len() == 1 => (micros, None),
        Ok(_) => (micros, Some(tonic::Code::Internal)),
        Err(status) => (micros, Some(status.code())),
    }
}

/// `48 ok, 16 failed (ResourceExhausted 16); latency p50 .. ms, p99 .. ms, max .. ms`.
fn summary(outcomes: &[Outcome]) -> String {
    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    for (_, code) in outcomes {
        if let Some(code) = code {
            *failed.entry(format!("{code:?}")).or_default() += 1;
        }
    }
    let failures: usize = failed.values().sum();
    let by_code = failed
        .iter()
        .map(|(code, n)| format!("{code} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut latencies: Vec<u64> = outcomes.iter().map(|o| o.0).collect();
    latencies.sort_unstable();
    format!(
        "{} ok, {failures} failed{}; latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        outcomes.len() - failures,
        if failures > 0 {
            format!(" ({by_code})")
        } else {
            String::new()
        },
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0),
    )
}
