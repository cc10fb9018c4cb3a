//! `cargo xtask instructions`: what one mount costs the provider, counted in instructions
//! (callgrind, Debian's valgrind), not timed: the count is the same on a busy machine. The
//! release provider runs under callgrind against the emulator twice for each path, with A
//! and then B mounts of one class at concurrency 1 after one warm-up mount (the identity's
//! session and its key made once in both runs); the difference of the two totals over
//! `B - A` is what a mount costs, start-up, key generation and shutdown taken out. The same
//! difference of each function's inclusive count gives where a mount's instructions go.
//!
//! Paths: `cached` (the bundle answered from the provider's cache, what every republish of
//! the driver costs) and `uncached` (every mount to OCI: a signed request each).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;

use crate::procs::{Emulator, PROVIDER_BIN, Provider, build, mount_request, root};

const USAGE: &str = "usage: cargo xtask instructions [--path cached|uncached] [--mounts A,B]
                                  [--top N] [--provider-bin PATH] [--log-level L]

  --path P            one path (default: both)
  --mounts A,B        the two runs' mounts after the warm-up (default 100,400)
  --top N             functions listed, by instructions a mount (default 20)
  --provider-bin PATH another build (an older release, for a before figure)
  --log-level L       the provider's log.level (default info; warn: what a mount costs
                      without its log line)

Needs valgrind (Debian's package). Prints instructions per mount and where they go.";

struct Options {
    paths: Vec<&'static str>,
    runs: (usize, usize),
    top: usize,
    provider_bin: Option<PathBuf>,
    log_level: String,
}

fn parse(args: &[String]) -> anyhow::Result<Option<Options>> {
    let mut o = Options {
        paths: vec!["cached", "uncached"],
        runs: (100, 400),
        top: 20,
        provider_bin: None,
        log_level: "info".to_owned(),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--path" => {
                o.paths = match value("--path")?.as_str() {
                    "cached" => vec!["cached"],
                    "uncached" => vec!["uncached"],
                    other => bail!("--path is cached or uncached, not {other:?}"),
                }
            }
            "--mounts" => {
                let text = value("--mounts")?;
                let (a, b) = text.split_once(',').context("--mounts A,B")?;
                o.runs = (a.trim().parse()?, b.trim().parse()?);
                if o.runs.1 <= o.runs.0 {
                    bail!("--mounts A,B needs B > A");
                }
            }
            "--top" => o.top = value("--top")?.parse()?,
            "--provider-bin" => o.provider_bin = Some(value("--provider-bin")?.into()),
            "--log-level" => o.log_level = value("--log-level")?.clone(),
            "-h" | "--help" => {
                eprintln!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown option {other:?}\n{USAGE}"),
        }
    }
    Ok(Some(o))
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(options) = parse(args)? else {
        return Ok(());
    };
    if Command::new("valgrind").arg("--version").output().is_err() {
        bail!("valgrind is not installed (Debian: apt-get install valgrind)");
    }
    let bin = build(true)?;
    let provider = match &options.provider_bin {
        Some(path) => std::fs::canonicalize(path)?,
        None => bin.join(PROVIDER_BIN),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    for path in &options.paths {
        runtime.block_on(measure(&bin, &provider, path, &options))?;
    }
    Ok(())
}

/// The emulator's seed: one vault, one secret the workload `bench/sa-0` may read.
const SEED: &str = "region = \"us-ashburn-1\"\nworkload_tenancy = \"ocid1.tenancy.oc1..bench\"\n\
[[vaults]]\nid = \"ocid1.vault.oc1.iad.bench\"\n\
[instance]\ntenancy = \"ocid1.tenancy.oc1..benchinstance\"\ninstance_id = \"ocid1.instance.oc1.iad.bench\"\n\
[[secrets]]\nid = \"ocid1.vaultsecret.oc1.iad.bench\"\nname = \"s1\"\nvault_id = \"ocid1.vault.oc1.iad.bench\"\n\
[[secrets.versions]]\nnumber = 1\nstages = [\"CURRENT\", \"LATEST\"]\ncontent = { text = \"value-of-s1\" }\n\
[secrets.access]\nworkloads = [{ namespace = \"bench\", service_account = \"sa-0\" }]\n\
[[service_accounts]]\nnamespace = \"bench\"\nname = \"sa-0\"\n\
[lifetimes]\nrpst_secs = 86400\ninstance_token_secs = 86400\nkube_token_default_secs = 86400\nprovider_token_secs = 86400\n";

async fn measure(bin: &Path, provider: &Path, path: &str, options: &Options) -> anyhow::Result<()> {
    let dir = root().join("target").join("instructions").join(path);
    std::fs::create_dir_all(&dir)?;
    let seed = dir.join("seed.toml");
    std::fs::write(&seed, SEED)?;
    let emulator = Emulator::start(bin, &seed, &dir.join("emulator")).await?;
    let (a, b) = options.runs;
    let runs = async {
        let level = options.log_level.as_str();
        let own = options.provider_bin.is_none();
        let first = one_run(provider, &emulator.config, &dir, (path, level), own, a).await?;
        let second = one_run(provider, &emulator.config, &dir, (path, level), own, b).await?;
        anyhow::Ok((first, second))
    }
    .await;
    emulator.stop().await;
    let (first, second) = runs?;
    let mounts = (b - a) as f64;
    // Key generations are random in cost: taken out.
    let total = |out: &Path| -> anyhow::Result<u64> {
        let (total, functions) = annotate(out)?;
        let keys = functions
            .iter()
            .filter(|(name, _)| name.ends_with(KEY_GENERATION))
            .map(|(_, ir)| *ir)
            .max()
            .unwrap_or(0);
        Ok(total.saturating_sub(keys))
    };
    let (ir_a, ir_b) = (total(&first)?, total(&second)?);
    println!(
        "instructions {path}: {:.0} a mount ({} mounts: {ir_a}, {} mounts: {ir_b}; {})",
        (ir_b.saturating_sub(ir_a)) as f64 / mounts,
        a,
        b,
        provider.display()
    );
    let (_, before) = annotate(&first)?;
    let (_, after) = annotate(&second)?;
    let mut per_mount: Vec<(f64, String)> = after
        .iter()
        .map(|(name, ir)| {
            let was = before.get(name).copied().unwrap_or(0);
            (ir.saturating_sub(was) as f64 / mounts, name.clone())
        })
        .filter(|(ir, name)| *ir >= 1.0 && !is_key_generation(name))
        .collect();
    per_mount.sort_by(|x, y| y.0.total_cmp(&x.0));
    println!("  where a mount's instructions go (inclusive, a mount):");
    for (ir, name) in per_mount.iter().take(options.top) {
        println!("  {ir:>10.0}  {name}");
    }
    Ok(())
}

/// One run under callgrind: the provider started, one warm-up mount, `mounts` more at
/// concurrency 1, SIGTERM; callgrind's output file.
async fn one_run(
    provider: &Path,
    config: &Path,
    dir: &Path,
    (path, log_level): (&str, &str),
    own_build: bool,
    mounts: usize,
) -> anyhow::Result<PathBuf> {
    let out = dir.join(format!("callgrind.{mounts}.out"));
    let _ = std::fs::remove_file(&out);
    let mut env = vec![("OCI_PROVIDER_LOG__LEVEL", log_level)];
    if own_build {
        // No keys made ahead: the warm-up mount's key is generated as it waits, and no
        // generation runs beside the mounts measured (this build's default fills a pool).
        env.push(("OCI_PROVIDER_AUTH__SESSION_KEYS_AHEAD", "0"));
    }
    if path == "uncached" {
        env.push(("OCI_PROVIDER_CACHE__BUNDLE_TTL_SECONDS", "0"));
    } else {
        env.push(("OCI_PROVIDER_CACHE__BUNDLE_TTL_SECONDS", "3600"));
    }
    let wrapper = [
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    let socket_dir = dir.join(format!("run-{mounts}"));
    std::fs::create_dir_all(&socket_dir)?;
    let started = Provider::start_wrapped(
        &wrapper,
        provider,
        config,
        &socket_dir,
        &env,
        Duration::from_secs(300),
    )
    .await?;
    let mut client = csi_grpc::client::connect_unix(&started.socket).await?;
    for pod in 0..=mounts {
        let attributes = json!({
            "secrets": "- name: s1\n",
            "vaultId": "ocid1.vault.oc1.iad.bench",
            "authType": "workload",
            "secretProviderClass": "bench",
            "csi.storage.k8s.io/pod.name": format!("web-{}", pod % 8),
            "csi.storage.k8s.io/pod.namespace": "bench",
            "csi.storage.k8s.io/pod.uid": format!("00000000-0000-0000-0000-{:012}", pod % 8),
            "csi.storage.k8s.io/serviceAccount.name": "sa-0",
        });
        client
            .mount(mount_request(attributes))
            .await
            .with_context(|| format!("mount {pod} under callgrind"))?;
    }
    started.stop_within(Duration::from_secs(120)).await?;
    if !out.exists() {
        bail!("callgrind wrote no {}", out.display());
    }
    Ok(out)
}

/// `callgrind_annotate --inclusive=yes` of `out`: the total, and each function's
/// inclusive instructions.
fn annotate(out: &Path) -> anyhow::Result<(u64, BTreeMap<String, u64>)> {
    let output = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(out)
        .output()
        .context("cannot run callgrind_annotate")?;
    if !output.status.success() {
        bail!("callgrind_annotate failed on {}", out.display());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let number = |s: &str| s.replace(',', "").parse::<u64>().ok();
    let mut total = 0;
    let mut functions = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(count) = line.strip_suffix("PROGRAM TOTALS") {
            total = number(count.split_whitespace().next().unwrap_or("")).unwrap_or(0);
            continue;
        }
        // `1,234,567 (12.34%)  file:function [object]`
        let mut parts = line.splitn(2, ' ');
        let (Some(count), Some(rest)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some(count) = number(count) else { continue };
        let rest = rest.trim_start();
        let rest = match rest.split_once(")  ") {
            Some((_, name)) => name,
            None => rest,
        };
        let name = rest.rsplit_once(" [").map_or(rest, |(name, _)| name);
        *functions.entry(shorten(function_of(name))).or_insert(0) += count;
    }
    if total == 0 {
        bail!(
            "no PROGRAM TOTALS in callgrind_annotate's output of {}",
            out.display()
        );
    }
    Ok((total, functions))
}

/// The function of `file:function` (a Rust path holds `::`, the file's separator is one
/// lone `:`).
fn function_of(name: &str) -> &str {
    let bytes = name.as_bytes();
    for (at, &b) in bytes.iter().enumerate() {
        let lone =
            b == b':' && bytes.get(at + 1) != Some(&b':') && (at == 0 || bytes[at - 1] != b':');
        if lone {
            return &name[at + 1..];
        }
    }
    name
}

/// The RSA key generations of a run (inclusive): random in cost (the search for primes),
/// so taken out of the totals compared (a run makes the same number of them).
const KEY_GENERATION: &str = "aws_lc_0_47_0_RSA_generate_key_ex";

/// A function's name without its hash suffix and generic arguments' paths cut short.
fn shorten(name: &str) -> String {
    let name = name.trim();
    let name = match name.rfind("::h") {
        Some(at) if name[at + 3..].chars().all(|c| c.is_ascii_hexdigit()) => &name[..at],
        _ => name,
    };
    if name.len() > 140 {
        format!("{}…", &name[..name.floor_char_boundary(140)])
    } else {
        name.to_owned()
    }
}

/// Whether `name` runs only inside a key generation (AWS-LC's RSA and prime functions).
fn is_key_generation(name: &str) -> bool {
    [
        "generate",
        "keygen",
        "prime",
        "miller_rabin",
        "BN_",
        "rsaz_",
        "RSAZ_",
        "bn_",
    ]
    .iter()
    .any(|part| name.contains(part))
}
