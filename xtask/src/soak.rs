//! `cargo xtask soak`: a benchmark, not a test. Many mounts through the provider's socket
//! against the emulator in its own process; reports throughput, latency, the RSS slope after
//! warm-up, open upstream connections and upstream requests per mount.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::json;

use crate::procs::{Emulator, Provider, build_with, metric_sum, mount_request, root};

const HELP: &str =
    "usage: cargo xtask soak [--mounts N] [--concurrency C] [--secrets K] [--identities I]
                        [--auth workload|instance] [--warmup W] [--checkpoints P] [--debug]
                        [--distinct-secrets N] [--secret-bytes B] [--ttl SECONDS]

  --mounts N        mounts after warm-up (default 100000)
  --concurrency C   mounts in flight (default 16)
  --secrets K       secrets per mount, 1..=3 (default 1)
  --identities I    distinct service accounts for workload identity (default 20)
  --auth A          workload (default) or instance
  --warmup W        mounts before measuring (default 1000)
  --checkpoints P   RSS samples over the run (default 10)
  --debug           use debug builds (default: release)
  --distinct-secrets N
                    N secrets of --secret-bytes each; mount i reads K of them in turn, so
                    the bundle cache fills and evicts (default 0: the 3 small secrets)
  --secret-bytes B  size of each distinct secret (default 4096)
  --ttl SECONDS     cache.bundle_ttl_seconds of the provider (default: its default, 30)
  --provider-bin PATH
                    the provider binary to run (an older build, for a before figure in the
                    same sitting; default: this workspace's)
  --jemalloc        build the provider with jemalloc as its allocator (feature `jemalloc`)
  --plot FILE       also draw the run as an SVG chart (RSS, open upstream connections, p99
                    against mounts completed) with the Go provider's rig figures beside it
  --baseline FILE   the Go figures for --plot (default docs/soak/go-workload-1.csv; a
                    CSV of mounts,rss_kib,tcp_established,p99_ms or a rig JSON record)
  --provider-env K=V
                    an environment variable of the provider (repeatable), e.g.
                    _RJEM_MALLOC_CONF=prof:true,prof_active:true,lg_prof_sample:19
";

#[derive(Debug)]
struct Options {
    mounts: usize,
    concurrency: usize,
    secrets: usize,
    identities: usize,
    auth: String,
    warmup: usize,
    checkpoints: usize,
    release: bool,
    distinct_secrets: usize,
    secret_bytes: usize,
    ttl: Option<usize>,
    jemalloc: bool,
    provider_env: Vec<(String, String)>,
    plot: Option<std::path::PathBuf>,
    baseline: std::path::PathBuf,
    provider_bin: Option<std::path::PathBuf>,
}

fn parse(args: &[String]) -> anyhow::Result<Option<Options>> {
    let mut o = Options {
        mounts: 100_000,
        concurrency: 16,
        secrets: 1,
        identities: 20,
        auth: "workload".into(),
        warmup: 1000,
        checkpoints: 10,
        release: true,
        distinct_secrets: 0,
        secret_bytes: 4096,
        ttl: None,
        jemalloc: false,
        provider_env: Vec::new(),
        plot: None,
        baseline: root().join("docs").join("soak").join("go-workload-1.csv"),
        provider_bin: None,
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
            "--mounts" => o.mounts = value("--mounts")?,
            "--provider-bin" => {
                o.provider_bin = Some(it.next().context("--provider-bin needs a path")?.into())
            }
            "--concurrency" => o.concurrency = value("--concurrency")?.max(1),
            "--secrets" => o.secrets = value("--secrets")?.clamp(1, 3),
            "--identities" => o.identities = value("--identities")?.max(1),
            "--warmup" => o.warmup = value("--warmup")?,
            "--checkpoints" => o.checkpoints = value("--checkpoints")?.max(1),
            "--auth" => o.auth = it.next().context("--auth needs a value")?.clone(),
            "--debug" => o.release = false,
            "--distinct-secrets" => o.distinct_secrets = value("--distinct-secrets")?,
            "--secret-bytes" => o.secret_bytes = value("--secret-bytes")?.clamp(1, 24 * 1024),
            "--ttl" => o.ttl = Some(value("--ttl")?),
            "--jemalloc" => o.jemalloc = true,
            "--plot" => o.plot = Some(it.next().context("--plot needs a file")?.into()),
            "--baseline" => o.baseline = it.next().context("--baseline needs a file")?.into(),
            "--provider-env" => {
                let pair = it.next().context("--provider-env needs K=V")?;
                let (k, v) = pair.split_once('=').context("--provider-env needs K=V")?;
                o.provider_env.push((k.to_owned(), v.to_owned()));
            }
            "-h" | "--help" => {
                eprint!("{HELP}");
                return Ok(None);
            }
            other => bail!("unknown option {other:?}\n{HELP}"),
        }
    }
    if o.auth != "workload" && o.auth != "instance" {
        bail!("--auth must be workload or instance");
    }
    Ok(Some(o))
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(options) = parse(args)? else {
        return Ok(());
    };
    let features: &[&str] = if options.jemalloc { &["jemalloc"] } else { &[] };
    let bin = build_with(options.release, features)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(soak(&bin, &options))
}

fn seed(options: &Options) -> String {
    let mut seed = String::from(
        "region = \"us-ashburn-1\"\nworkload_tenancy = \"ocid1.tenancy.oc1..soak\"\n\n[[vaults]]\nid = \"ocid1.vault.oc1.iad.soak\"\n\n[instance]\ntenancy = \"ocid1.tenancy.oc1..soakinstance\"\ninstance_id = \"ocid1.instance.oc1.iad.soak\"\n",
    );
    let workloads: Vec<String> = (0..options.identities)
        .map(|i| format!("{{ namespace = \"soak\", service_account = \"sa-{i}\" }}"))
        .collect();
    for s in 1..=3 {
        let _ = write!(
            seed,
            "\n[[secrets]]\nid = \"ocid1.vaultsecret.oc1.iad.soak{s}\"\nname = \"s{s}\"\nvault_id = \"ocid1.vault.oc1.iad.soak\"\n\n[[secrets.versions]]\nnumber = 1\nstages = [\"CURRENT\", \"LATEST\"]\ncontent = {{ text = \"value-of-s{s}-v1\" }}\n\n[secrets.access]\nworkloads = [{}]\ninstance_tenancies = [\"ocid1.tenancy.oc1..soakinstance\"]\n",
            workloads.join(", ")
        );
    }
    for d in 0..options.distinct_secrets {
        // Distinct bytes per secret, so nothing can share them.
        let text: String = format!("d{d}-")
            .chars()
            .cycle()
            .take(options.secret_bytes)
            .collect();
        let _ = write!(
            seed,
            "\n[[secrets]]\nid = \"ocid1.vaultsecret.oc1.iad.distinct{d}\"\nname = \"d{d}\"\nvault_id = \"ocid1.vault.oc1.iad.soak\"\n\n[[secrets.versions]]\nnumber = 1\nstages = [\"CURRENT\", \"LATEST\"]\ncontent = {{ text = \"{text}\" }}\n\n[secrets.access]\nworkloads = [{}]\ninstance_tenancies = [\"ocid1.tenancy.oc1..soakinstance\"]\n",
            workloads.join(", ")
        );
    }
    for i in 0..options.identities {
        let _ = write!(
            seed,
            "\n[[service_accounts]]\nnamespace = \"soak\"\nname = \"sa-{i}\"\n"
        );
    }
    seed.push_str("\n[lifetimes]\nrpst_secs = 86400\ninstance_token_secs = 86400\nkube_token_default_secs = 86400\nprovider_token_secs = 86400\n");
    seed
}

fn rss_kib(pid: u32) -> u64 {
    crate::procs::status_kib(pid, "VmRSS")
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    if den == 0.0 { 0.0 } else { num / den }
}

async fn batch(
    client: &csi_grpc::client::Client,
    options: &Options,
    start: usize,
    count: usize,
) -> (Vec<u64>, usize, Option<String>) {
    let fixed: String = (1..=options.secrets)
        .map(|s| format!("- name: s{s}\n"))
        .collect();
    let permits = Arc::new(tokio::sync::Semaphore::new(options.concurrency));
    let mut tasks = Vec::with_capacity(count);
    for i in start..start + count {
        let permit = permits.clone().acquire_owned().await;
        let mut client = client.clone();
        let secrets = if options.distinct_secrets == 0 {
            fixed.clone()
        } else {
            (0..options.secrets)
                .map(|k| {
                    format!(
                        "- name: d{}\n",
                        (i * options.secrets + k) % options.distinct_secrets
                    )
                })
                .collect()
        };
        let attributes = json!({
            "secrets": secrets,
            "vaultId": "ocid1.vault.oc1.iad.soak",
            "authType": options.auth,
            "secretProviderClass": "soak",
            "csi.storage.k8s.io/pod.name": format!("pod-{i}"),
            "csi.storage.k8s.io/pod.namespace": "soak",
            "csi.storage.k8s.io/pod.uid": format!("00000000-0000-0000-0000-{i:012}"),
            "csi.storage.k8s.io/serviceAccount.name": format!("sa-{}", i % options.identities),
        });
        let expected = options.secrets;
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let started = Instant::now();
            let result = client.mount(mount_request(attributes)).await;
            let micros = started.elapsed().as_micros() as u64;
            match result {
                Ok(r) if r.get_ref().files.len() == expected => (micros, None),
                Ok(r) => (micros, Some(format!("{} files", r.get_ref().files.len()))),
                Err(status) => (
                    micros,
                    Some(format!("{:?}: {}", status.code(), status.message())),
                ),
            }
        }));
    }
    let mut latencies = Vec::with_capacity(count);
    let mut failures = 0;
    let mut first_failure = None;
    for task in tasks {
        if let Ok((micros, failure)) = task.await {
            latencies.push(micros);
            if let Some(failure) = failure {
                failures += 1;
                first_failure.get_or_insert(failure);
            }
        }
    }
    (latencies, failures, first_failure)
}

async fn soak(bin: &Path, options: &Options) -> anyhow::Result<()> {
    let dir = root().join("target").join("soak");
    std::fs::create_dir_all(&dir)?;
    let seed_path = dir.join("seed.toml");
    std::fs::write(&seed_path, seed(options))?;
    let emulator = Emulator::start(bin, &seed_path, &dir.join("emulator")).await?;
    let ttl = options.ttl.map(|t| t.to_string());
    let mut env = vec![("OCI_PROVIDER_LOG__LEVEL", "warn")];
    if let Some(ttl) = &ttl {
        env.push(("OCI_PROVIDER_CACHE__BUNDLE_TTL_SECONDS", ttl.as_str()));
    }
    for (k, v) in &options.provider_env {
        env.push((k.as_str(), v.as_str()));
    }
    let provider = match &options.provider_bin {
        Some(path) => Provider::start_binary(path, &emulator.config, &dir, &env).await?,
        None => Provider::start(bin, &emulator.config, &dir, &env).await?,
    };
    let result = measure(&provider, options).await;
    let stopped = provider.stop().await;
    emulator.stop().await;
    result?;
    stopped
}

async fn measure(provider: &Provider, options: &Options) -> anyhow::Result<()> {
    let pid = provider.pid().context("the provider has no pid")?;
    let client = csi_grpc::client::connect_unix(&provider.socket).await?;
    println!("soak: {options:?}");
    let (_, warm_failures, warm_first) = batch(&client, options, 0, options.warmup).await;
    if warm_failures > 0 {
        bail!(
            "{warm_failures} of {} warm-up mounts failed, first: {}",
            options.warmup,
            warm_first.unwrap_or_default()
        );
    }
    let before = provider.metrics_counting(options.warmup).await?;
    let requests_before = metric_sum(&before, "oci_provider_upstream_requests_total");
    let bundle = |text: &str, name: &str| metric_sum(text, &format!("{name}{{kind=\"bundle\"}}"));
    let fetches_before = bundle(&before, "oci_provider_cache_misses_total");
    let hits_before = bundle(&before, "oci_provider_cache_hits_total");
    let joined_before = bundle(&before, "oci_provider_cache_joined_total");
    println!(
        "\n{:>9} {:>9} {:>10} {:>9} {:>8} {:>8} {:>6}",
        "mounts", "rss_kib", "mounts/s", "open_conn", "p50_ms", "p99_ms", "fail"
    );
    let mut points = vec![(0.0, rss_kib(pid) as f64)];
    let mut samples = vec![crate::plot::Sample {
        mounts: options.warmup as f64,
        rss_mib: points[0].1 / 1024.0,
        connections: metric_sum(&before, "oci_provider_upstream_connections_open"),
        p99_ms: None,
    }];
    println!(
        "{:>9} {:>9} {:>10} {:>9} {:>8} {:>8} {:>6}",
        0,
        points[0].1,
        "-",
        metric_sum(&before, "oci_provider_upstream_connections_open"),
        "-",
        "-",
        0
    );
    let chunk = options.mounts.div_ceil(options.checkpoints).max(1);
    let mut done = 0;
    let mut all = Vec::with_capacity(options.mounts);
    let mut failures = 0;
    let mut first_failure = None;
    let started = Instant::now();
    while done < options.mounts {
        let count = chunk.min(options.mounts - done);
        let t = Instant::now();
        let (mut latencies, failed, first) =
            batch(&client, options, options.warmup + done, count).await;
        let rate = count as f64 / t.elapsed().as_secs_f64();
        done += count;
        failures += failed;
        if first_failure.is_none() {
            first_failure = first;
        }
        let rss = rss_kib(pid);
        points.push((done as f64, rss as f64));
        let metrics = provider.metrics().await?;
        latencies.sort_unstable();
        samples.push(crate::plot::Sample {
            mounts: (options.warmup + done) as f64,
            rss_mib: rss as f64 / 1024.0,
            connections: metric_sum(&metrics, "oci_provider_upstream_connections_open"),
            p99_ms: Some(percentile(&latencies, 0.99)),
        });
        println!(
            "{done:>9} {rss:>9} {rate:>10.0} {:>9} {:>8.2} {:>8.2} {failed:>6}",
            metric_sum(&metrics, "oci_provider_upstream_connections_open"),
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
        );
        all.extend(latencies);
    }
    let elapsed = started.elapsed();
    all.sort_unstable();
    let after = provider
        .metrics_counting(options.warmup + options.mounts)
        .await?;
    // The last scrape, for reading every family after a run (and for notes).
    let scrape = root().join("target").join("soak").join("metrics.txt");
    std::fs::write(&scrape, &after)?;
    if let Some(path) = &options.plot {
        let mut series = vec![crate::plot::Series {
            label: format!(
                "this provider ({} auth, {} identities, concurrency {})",
                options.auth, options.identities, options.concurrency
            ),
            samples: samples.clone(),
        }];
        if options.baseline.exists() {
            series.push(crate::plot::Series {
                label: "Go provider (measuring rig: workload auth, 1 identity, concurrency 1)"
                    .to_owned(),
                samples: crate::plot::read_baseline(&options.baseline)?,
            });
        } else {
            println!(
                "soak: no baseline at {}; plotting this run alone",
                options.baseline.display()
            );
        }
        let title = format!(
            "cargo xtask soak --mounts {}: {} secret(s) per mount",
            options.mounts, options.secrets
        );
        std::fs::write(path, crate::plot::svg(&title, &series)?)?;
        println!("soak: chart written to {}", path.display());
    }
    let requests = metric_sum(&after, "oci_provider_upstream_requests_total") - requests_before;
    let kib_per_1000 = slope(&points) * 1000.0;
    let growth =
        points.last().map(|p| p.1).unwrap_or(0.0) - points.first().map(|p| p.1).unwrap_or(0.0);
    println!(
        "\n{} mounts ({} secrets each, {} auth, {} identities, concurrency {}) in {:.1} s: {:.0} mounts/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {failures} failures",
        options.mounts,
        options.secrets,
        options.auth,
        options.identities,
        options.concurrency,
        elapsed.as_secs_f64(),
        options.mounts as f64 / elapsed.as_secs_f64(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        percentile(&all, 1.0),
    );
    println!(
        "RSS after warm-up: {:.0} KiB -> {:.0} KiB (growth {growth:.0} KiB, slope {kib_per_1000:.2} KiB per 1000 mounts); upstream connections open: {}, opened in all: {}; upstream requests per mount: {:.3}",
        points.first().map(|p| p.1).unwrap_or(0.0),
        points.last().map(|p| p.1).unwrap_or(0.0),
        metric_sum(&after, "oci_provider_upstream_connections_open"),
        metric_sum(&after, "oci_provider_upstream_connections_opened_total"),
        requests / options.mounts.max(1) as f64,
    );
    let per_mount = |n: f64| n / options.mounts.max(1) as f64;
    println!(
        "secrets fetched from OCI per mount: {:.3} ({:.3} per secret mounted); cache hits per mount: {:.3}, joined: {:.3}; bundle cache now {} entries, {} bytes, {} evicted for size",
        per_mount(bundle(&after, "oci_provider_cache_misses_total") - fetches_before),
        per_mount(bundle(&after, "oci_provider_cache_misses_total") - fetches_before)
            / options.secrets as f64,
        per_mount(bundle(&after, "oci_provider_cache_hits_total") - hits_before),
        per_mount(bundle(&after, "oci_provider_cache_joined_total") - joined_before),
        bundle(&after, "oci_provider_cache_entries"),
        bundle(&after, "oci_provider_cache_bytes"),
        metric_sum(
            &after,
            "oci_provider_cache_evictions_total{kind=\"bundle\",cause=\"size\"}"
        ),
    );
    if let Some(first) = first_failure {
        println!("first failure: {first}");
    }
    Ok(())
}
