//! `cargo xtask compat`: the real grpc-go client against the provider and the emulator.
//!
//! Builds the testkit's grpc-go driver client (`crates/testkit/driver/driverclient.go`, as
//! the tests do), starts the emulator and the provider as processes, and mounts
//! through the socket dialled as drivers v1.0 to v1.5.x dial (the socket path as
//! `:authority`, rewritten by `h2-authority`) and as v1.6.0 dials (`localhost`), in
//! alternating rounds on one connection each. Reports Mount latency p50/p99 per mode.

use std::path::Path;

use anyhow::{Context, bail};
use serde_json::json;

use crate::procs::{Emulator, Provider, build, root};

struct Options {
    mounts: usize,
    rounds: usize,
    release: bool,
    dials: Vec<(&'static str, &'static str)>,
}

const DIALS: [(&str, &str); 2] = [("socket-path", "v1.0-v1.5"), ("localhost", "v1.6")];

fn parse(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        mounts: 10_000,
        rounds: 2,
        release: true,
        dials: DIALS.to_vec(),
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> anyhow::Result<usize> {
            args.next()
                .with_context(|| format!("{name} needs a number"))?
                .parse()
                .with_context(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--mounts" => options.mounts = number("--mounts")?,
            "--rounds" => options.rounds = number("--rounds")?,
            "--debug" => options.release = false,
            "--dial" => {
                let dial = args.next().map(String::as_str).unwrap_or_default();
                options.dials = DIALS.iter().copied().filter(|(d, _)| *d == dial).collect();
                if options.dials.is_empty() {
                    bail!("--dial takes socket-path or localhost");
                }
            }
            "--help" | "-h" => {
                eprintln!(
                    "usage: cargo xtask compat [--mounts N (10000)] [--rounds R (2)] [--dial socket-path|localhost] [--debug]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown option {other:?} (see --help)"),
        }
    }
    if options.mounts < 2 || options.rounds == 0 {
        bail!("--mounts must be at least 2 and --rounds at least 1");
    }
    Ok(options)
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let options = parse(args)?;
    let bin = build(options.release)?;
    let dir = root().join("target").join("compat");
    std::fs::create_dir_all(&dir)?;
    let client = testkit::DriverClient::build_into(&dir.join("grpc-go"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(compat(&bin, &dir, &client, &options))
}

/// Two pods of the demo seed, one per principal, as the driver sends them.
fn fixture(path: &Path) -> anyhow::Result<()> {
    let request = |pod: &str, auth_type: &str| {
        json!({
            "name": format!("{pod} ({auth_type})"),
            "attributes": {
                "secrets": "- name: db-password\n- name: tls-key\n  fileName: tls/key.bin\n",
                "vaultId": "ocid1.vault.oc1.iad.demo",
                "authType": auth_type,
                "secretProviderClass": "demo-secrets",
                "csi.storage.k8s.io/pod.name": pod,
                "csi.storage.k8s.io/pod.namespace": "demo",
                "csi.storage.k8s.io/pod.uid": "00000000-0000-0000-0000-000000000001",
                "csi.storage.k8s.io/serviceAccount.name": "demo-app",
                "csi.storage.k8s.io/ephemeral": "false",
            },
            "secrets": null,
            "target_path": "/var/lib/kubelet/pods/demo/volumes/kubernetes.io~csi/secrets/mount",
            "permission": "420",
        })
    };
    let fixture = json!({
        "driver": "compat bench",
        "dial": "socket-path",
        "requests": [request("web-0", "workload"), request("batch-0", "instance")],
    });
    std::fs::write(path, serde_json::to_vec_pretty(&fixture)?)?;
    Ok(())
}

async fn compat(
    bin: &Path,
    dir: &Path,
    client: &testkit::DriverClient,
    options: &Options,
) -> anyhow::Result<()> {
    let emulator = Emulator::start(
        bin,
        &root().join("xtask/demo/seed.toml"),
        &dir.join("emulator"),
    )
    .await?;
    let provider = Provider::start(
        bin,
        &emulator.config,
        dir,
        &[("OCI_PROVIDER_LOG__LEVEL", "warn")],
    )
    .await?;
    let fixture_path = dir.join("fixture.json");
    fixture(&fixture_path)?;
    let result = rounds(client, &provider.socket, &fixture_path, options).await;
    let stopped = provider.stop().await;
    emulator.stop().await;
    result?;
    stopped
}

async fn rounds(
    client: &testkit::DriverClient,
    socket: &Path,
    fixture: &Path,
    options: &Options,
) -> anyhow::Result<()> {
    println!(
        "{} mounts per round (2 secrets each, workload and instance principals alternating), one connection per round",
        options.mounts
    );
    println!("| round | dial (driver) | mounts | failures | p50 µs | p99 µs |");
    println!("|---|---|---|---|---|---|");
    for round in 1..=options.rounds {
        for &(dial, driver) in &options.dials {
            let repeat = (options.mounts / 2).to_string();
            let (summary, _) = client
                .run(
                    socket,
                    fixture,
                    &["-dial", dial, "-keep", "0", "-repeat", &repeat],
                )
                .await?;
            let failures = summary["failures"].as_array().map_or(0, Vec::len);
            println!(
                "| {round} | {dial} ({driver}) | {} | {failures} | {} | {} |",
                summary["mounts"], summary["p50_us"], summary["p99_us"]
            );
            if failures > 0 {
                bail!("mounts failed: {}", summary["failures"]);
            }
        }
    }
    Ok(())
}
