//! The DaemonSet binary's wiring: configuration, logging, the gRPC socket, health and
//! metrics servers, signals. No business logic lives here.

mod check;
mod config;
mod crypto;
mod debug;
mod endpoints;
mod flags;
mod health;
mod metrics;
mod otel;
mod profile_proto;
mod ready;
mod taint;
mod telemetry;
mod wiring;
mod workload;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

pub use config::{Config, ConfigError, ENV_PREFIX, LogFormat};
pub use endpoints::{Endpoints, HttpsUrl, MetadataUrl};
pub use flags::Flags;
pub use wiring::Traces;
pub use workload::{FederationSettings, Mechanism, RequestedTokenType, SecretRef, WorkloadConfig};

/// `runtime_name` answered by `Version`.
pub const RUNTIME_NAME: &str = "oci-secrets-store-csi-driver-provider";

/// `check` (with its own flags), and `help check` (its `--help`); `None` for anything else.
fn run_check(args: &[String]) -> Option<ExitCode> {
    let check = |rest: &[String]| {
        let mut check_args = vec![format!("{RUNTIME_NAME} check")];
        check_args.extend_from_slice(rest);
        check::main(&check_args, &mut std::io::stdin(), &mut std::io::stdout())
    };
    match (
        args.get(1).map(String::as_str),
        args.get(2).map(String::as_str),
    ) {
        (Some("check"), _) => Some(check(&args[2..])),
        (Some("help"), Some("check")) => Some(check(&["--help".to_owned()])),
        _ => None,
    }
}

/// Runs the binary with `args` (program name first) and the process environment as a map.
pub fn main(args: Vec<String>, env: BTreeMap<String, String>) -> ExitCode {
    if let Some(code) = run_check(&args) {
        return code;
    }
    let flags = match Flags::parse_from_args(&args) {
        Ok(flags) => flags,
        Err(err) => {
            let code = if err.use_stderr() { 2 } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let config = match Config::load(&flags, &env) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(2);
        }
    };
    // Traces: the exporter is set up before the logger (its layer is part of it) and gets
    // the transport once the stack is built.
    let traces = match otel::traces_endpoint(config.telemetry.otlp_endpoint.as_deref(), &env) {
        Ok(endpoint) => endpoint,
        Err(err) => {
            eprintln!("invalid configuration: {err:#}");
            return ExitCode::from(2);
        }
    };
    let otlp = otel::OtlpClient::default();
    let provider = match traces
        .as_deref()
        .map(|e| otel::provider(e, otlp.clone(), &env))
        .transpose()
    {
        Ok(provider) => provider,
        Err(err) => {
            eprintln!("invalid configuration: {err:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(err) = telemetry::init(&config.log, provider.as_ref()) {
        eprintln!("invalid configuration: {err:#}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let traces = wiring::Traces {
        endpoint: traces,
        client: otlp,
    };
    let result = runtime.block_on(async {
        let result = run(config, env, traces, shutdown_signal()).await;
        // Flush the spans still queued (the exporter sends through the runtime).
        if let Some(provider) = provider {
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "provider stopped");
            ExitCode::FAILURE
        }
    }
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        _ => {
            tracing::error!("cannot install signal handlers; serving until killed");
            return std::future::pending().await;
        }
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "shutting down");
}

/// Serves until `shutdown` completes.
///
/// `env` is the process environment (proxy variables, `HOME`); everything else comes from
/// `config`.
pub async fn run(
    config: Config,
    env: BTreeMap<String, String>,
    traces: wiring::Traces,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let module = crypto::check()?;
    tracing::info!(module = module.name, fips = module.fips, "crypto module");
    let endpoint = config.grpc_endpoint()?;
    let ready = Arc::new(ready::Readiness::new(endpoint.clone()));
    let stack = wiring::build(&config, &env, Arc::new(clock::SystemClock), &traces)?;

    let health_addr = SocketAddr::new(config.server.bind_address, config.server.healthz_port);
    let health = health::bind(health_addr).await.with_context(|| {
        format!("cannot listen on {health_addr} for health checks (--healthz-port)")
    })?;
    let metrics_addr = SocketAddr::new(config.server.bind_address, config.server.metrics_port);
    let metrics_listener = health::bind(metrics_addr)
        .await
        .with_context(|| format!("cannot listen on {metrics_addr} for metrics (--metrics-port)"))?;
    tracing::info!(
        healthz = %health.local_addr().unwrap_or(health_addr),
        metrics = %metrics_listener.local_addr().unwrap_or(metrics_addr),
        "health and metrics servers listening"
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let http_limits = health::HttpLimits::from(&config.server);
    let debug_task = debug_server(
        &config,
        &stack.metrics,
        http_limits.clone(),
        stop_rx.clone(),
    )
    .await?;
    let health_task = tokio::spawn(health::serve(
        health,
        health::Routes::Health(ready.clone()),
        http_limits.clone(),
        stop_rx.clone(),
    ));
    let metrics_task = tokio::spawn(health::serve(
        metrics_listener,
        health::Routes::Metrics(stack.metrics.clone(), Arc::default()),
        http_limits,
        stop_rx.clone(),
    ));

    let listener = csi_grpc::Listener::bind(&endpoint, config.server.endpoint_permissions.0)
        .with_context(|| format!("cannot serve {endpoint} (--endpoint)"))?
        .allow_peer_uids(peer_uids(&config.server.allowed_peer_uids));
    let provider = stack.provider;
    tracing::info!(endpoint = %listener.local_endpoint(), version = env!("CARGO_PKG_VERSION"), "serving the CSI provider API");
    ready.set_serving(true);
    let readiness_task = tokio::spawn(report_readiness(
        ready.clone(),
        stack.metrics.clone(),
        stop_rx.clone(),
    ));
    let taint_task = spawn_taint_removal(stack.node_taint, &ready, &stack.metrics, &stop_rx);

    let not_ready = ready.clone();
    let shutdown = async move {
        shutdown.await;
        not_ready.set_serving(false);
    };
    let grace = Duration::from_secs(config.server.shutdown_grace_seconds);
    let served = csi_grpc::serve(listener, provider, shutdown, grace).await;
    let _ = stop_tx.send(true);
    let _ = tokio::join!(health_task, metrics_task, readiness_task);
    for task in [taint_task, debug_task].into_iter().flatten() {
        let _ = task.await;
    }
    served.context("the gRPC server failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// The debug server (`--enable-pprof`), on a loopback address only (checked when the
/// configuration loaded); `None` when it is off.
async fn debug_server(
    config: &Config,
    metrics: &Arc<metrics::Metrics>,
    limits: health::HttpLimits,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    if !config.server.enable_pprof {
        return Ok(None);
    }
    let addr = SocketAddr::new(config.server.pprof_address, config.server.pprof_port);
    let listener = health::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} for profiles (--enable-pprof, --pprof-port)")
    })?;
    tracing::warn!(
        debug = %listener.local_addr().unwrap_or(addr),
        "debug server listening (--enable-pprof): CPU and heap profiles, /debug/stats"
    );
    let debug = debug::Debug::new(metrics.clone(), config.server.max_profile_seconds);
    Ok(Some(tokio::spawn(health::serve(
        listener,
        health::Routes::Debug(Arc::new(debug)),
        limits,
        stop,
    ))))
}

/// `--remove-node-taint`: the removal, once ready, in its own task (`None` when off).
fn spawn_taint_removal(
    node_taint: Option<auth::NodeTaint>,
    ready: &Arc<ready::Readiness>,
    metrics: &Arc<metrics::Metrics>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let node_taint = node_taint?;
    Some(tokio::spawn(taint::remove_when_ready(
        node_taint,
        ready.clone(),
        metrics.clone(),
        stop.clone(),
    )))
}

/// How often `oci_provider_ready` is brought up to date.
const READY_EVERY: Duration = Duration::from_secs(2);

/// Keeps `oci_provider_ready` current with one readiness check every [`READY_EVERY`] (at most
/// one `Version` call on the socket each, whatever scrapes and probes do) until `stop`.
async fn report_readiness(
    ready: Arc<ready::Readiness>,
    metrics: Arc<metrics::Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(READY_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopped = tokio::select! {
            _ = every.tick() => false,
            _ = stop.wait_for(|stop| *stop) => true,
        };
        if stopped {
            return;
        }
        metrics.set_ready(ready.check().await.is_ok());
    }
}

/// `server.allowed_peer_uids` and the provider's own uid (a process of that uid can act as
/// the provider anyway, and a developer's run under its own account keeps working).
fn peer_uids(configured: &[u32]) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let mut uids = configured.to_vec();
    if let Ok(own) = std::fs::metadata("/proc/self") {
        uids.push(own.uid());
    }
    uids.sort_unstable();
    uids.dedup();
    uids
}
