//! Builds the stack of one process, in one place, bottom to top, one layer per concern:
//!
//! - the transport: the pool and its layers (`Transport::service`: `HostLimitLayer`,
//!   `TimeoutLayer`, `ObserveLayer`, built in one place);
//! - the principals over it, and `SigningLayer` (each request signed with its session);
//! - the fetch stacks over the signed `VaultClient`: `RetryLayer`, then for secrets
//!   `CacheLayer`, `BudgetLayer`, `FailoverLayer`; for certificates `BudgetLayer`; for
//!   listings `ListerLayer`, `CacheLayer`, `BudgetLayer`;
//! - `OciMount` (parameters, identity, fan-out of the entries, files);
//! - the edge: `CatchPanicLayer`, `DeadlineLayer`, `AdmissionLayer`, `RequestBytesLayer`,
//!   then the gRPC
//!   service (`CsiProvider`: translation, response checks, the mount span and metrics).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use auth::{Principals, PrincipalsConfig, Signing, SigningLayer};
use cache::{Cache, CacheLayer, CacheService};
use clock::SharedClock;
use csi_grpc::{
    Admission, AdmissionLayer, CatchPanic, CatchPanicLayer, DeadlineLayer, RequestBytes,
    RequestBytesLayer, WithinDeadline,
};
use provider::{
    Budget, BudgetLayer, ByteBudget, EndpointOverrides, Endpoints, Failover, FailoverLayer,
    MountContext, OciMount, RegionStats,
};
use regions::Regions;
use tower::{Layer as _, ServiceBuilder};
use transport::{HttpService, Proxy, Transport, TransportConfig};
use vault::{Lister, ListerLayer, Retry, RetryLayer, RetryPolicy, VaultClient};

use crate::config::{CacheConfig, Config, ServerConfig, UpstreamConfig};
use crate::health::HttpLimits;
use crate::metrics::Metrics;

/// The Secrets and Certificates client: one attempt over the signed transport.
type Client = VaultClient<Signing<HttpService>>;

/// What secret entries are read through: the failover region over the byte budget over the
/// bundle cache over the retries of the client.
pub(crate) type Secrets =
    Failover<Budget<CacheService<Retry<Client>, vault::BundleKey, vault::SecretBundle>>>;

/// What certificate entries are read through: the byte budget over the retries of the same
/// client (not cached: a certificate's files are made from each answer).
pub(crate) type Certificates = Budget<Retry<Client>>;

/// What version histories and selections list through: the byte budget over the listing
/// cache over the pages, each through the retries of the same client.
pub(crate) type Listings =
    Budget<CacheService<Lister<Retry<Client>>, vault::ListKey, vault::Listing>>;

/// The mount service: identity, then the entries through the fetch stacks.
pub(crate) type Mount = OciMount<Principals, Secrets, Certificates, Listings>;

/// What the gRPC server calls: the mount service under the edge's layers.
pub(crate) type Edge = RequestBytes<Admission<WithinDeadline<CatchPanic<Mount>>>>;

/// Where traces go, if anywhere: the collector's traces URL and the exporter's client,
/// which this module binds to the transport.
#[derive(Debug, Default)]
pub struct Traces {
    pub(crate) endpoint: Option<String>,
    pub(crate) client: crate::otel::OtlpClient,
}

/// Everything a running provider holds.
pub(crate) struct Stack {
    /// The CSI gRPC service, ready to serve.
    pub(crate) provider: csi_grpc::CsiProvider<Edge>,
    /// What `/metrics` reports (the transport's hosts, the byte budget, the mounts).
    pub(crate) metrics: Arc<Metrics>,
    /// The startup taint to remove once ready (`--remove-node-taint`), over the transport.
    pub(crate) node_taint: Option<auth::NodeTaint>,
}

/// The bytes of `cache.bundle_max_bytes` the listing cache keeps (names and OCIDs, no
/// secret content): a sixteenth, at most 1 MiB, taken from the bundle cache so that the
/// memory model's one cache term holds both.
fn listing_cache_bytes(c: &CacheConfig) -> u64 {
    (c.bundle_max_bytes / 16).min(1024 * 1024)
}

/// Listings are cached as bundles are, for `cache.bundle_ttl_seconds`: a secret added to a
/// selection, or a new version, is seen as late as a rotation.
fn listing_cache_config(c: &CacheConfig) -> cache::CacheConfig {
    cache::CacheConfig {
        ttl: Some(Duration::from_secs(c.bundle_ttl_seconds)),
        max_entries: c.bundle_max_entries,
        max_bytes: listing_cache_bytes(c),
        ..cache::CacheConfig::new("listing")
    }
}

fn bundle_cache_config(c: &CacheConfig) -> cache::CacheConfig {
    cache::CacheConfig {
        ttl: Some(Duration::from_secs(c.bundle_ttl_seconds)),
        max_entries: c.bundle_max_entries,
        max_bytes: c.bundle_max_bytes - listing_cache_bytes(c),
        ..cache::CacheConfig::new("bundle")
    }
}

impl From<&UpstreamConfig> for TransportConfig {
    fn from(u: &UpstreamConfig) -> Self {
        TransportConfig {
            max_connections_per_host: u.max_connections_per_host,
            max_idle_per_host: u.max_idle_per_host,
            idle_timeout: Duration::from_secs(u.idle_timeout_seconds),
            connect_timeout: Duration::from_secs(u.connect_timeout_seconds),
            request_timeout: Duration::from_secs(u.request_timeout_seconds),
            max_response_bytes: u.max_response_bytes,
            ..TransportConfig::default()
        }
    }
}

impl From<&ServerConfig> for csi_grpc::MountLimits {
    fn from(s: &ServerConfig) -> Self {
        csi_grpc::MountLimits {
            max_in_flight: s.max_in_flight_mounts,
            max_in_flight_per_namespace: s.namespace_mounts(),
            max_queued: s.queued_mounts(),
            max_queued_per_namespace: s.namespace_queued_mounts(),
            max_request_bytes: s.max_request_bytes,
            max_request_bytes_per_namespace: s.namespace_request_bytes(),
            default_deadline: Duration::from_secs(s.mount_timeout_seconds),
            max_deadline: Duration::from_secs(s.mount_timeout_seconds),
            ..csi_grpc::MountLimits::default()
        }
    }
}

impl From<&ServerConfig> for HttpLimits {
    fn from(s: &ServerConfig) -> Self {
        HttpLimits {
            max_connections: s.http_max_connections.max(1),
            max_connections_per_address: s.http_max_connections_per_address.max(1),
            header_read_timeout: Duration::from_secs(s.http_header_read_timeout_seconds.max(1)),
        }
    }
}

fn authority(url: &str, key: &str) -> anyhow::Result<String> {
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("{key} {url:?} is not a URL"))?;
    transport::authority_of(&uri).with_context(|| format!("{key} {url:?} has no host"))
}

/// The regions the process knows: the built-in table, `OCI_REGION_METADATA`,
/// `OCI_DEFAULT_REALM` and the SDK's `~/.oci/regions-config.json`, read only from the
/// `HOME` we were given. The principals and the mount service's endpoints share them.
pub(crate) fn regions(config: &Config, env: &BTreeMap<String, String>) -> anyhow::Result<Regions> {
    let e = &config.endpoints;
    let file = env
        .get("HOME")
        .map(|home| std::path::Path::new(home).join(".oci/regions-config.json"))
        .filter(|path| path.is_file());
    Regions::from_files(
        e.region_metadata.as_deref(),
        file.as_deref(),
        e.default_realm.as_deref(),
    )
    .context("cannot read the regions")
}

/// The principals over the transport. Workload exchanges and the instance principal's
/// federations take a session key each: generated ahead from now, so the node's first pods
/// wait for none.
fn principals(
    config: &Config,
    principals_config: PrincipalsConfig,
    http: &transport::HttpService,
    clock: &SharedClock,
) -> anyhow::Result<Principals> {
    let principals = Principals::new(principals_config, http.clone(), clock.clone())
        .context("cannot set up the OCI principals")?;
    if config.auth.allowed_types.iter().any(|t| {
        matches!(
            t,
            provider::AuthType::Workload | provider::AuthType::Instance
        )
    }) {
        principals.fill_session_keys();
    }
    Ok(principals)
}

/// The principals' configuration: the region, `[auth]` and where each identity endpoint
/// is (federation, instance metadata, proxymux, the Kubernetes API).
pub(crate) fn principals_config(config: &Config, regions: Regions) -> PrincipalsConfig {
    let e = &config.endpoints;
    PrincipalsConfig {
        region: config.region.clone(),
        regions,
        federation_endpoint: e.federation.as_ref().map(|u| u.as_str().to_owned()),
        instance_metadata: e.instance_metadata.as_str().to_owned(),
        proxymux: e.proxymux.as_ref().map(|u| u.as_str().to_owned()),
        kubernetes_api: e.kubernetes_api.as_ref().map(|u| u.as_str().to_owned()),
        kubernetes_service_host: e.kubernetes_service_host.clone(),
        kubernetes_service_port: e.kubernetes_service_port,
        kubeconfig: e.kubeconfig.clone(),
        service_account_token_file: e.service_account_token_file.clone(),
        user_secret_ttl: Duration::from_secs(config.auth.user_secret_ttl_seconds),
        max_concurrent_key_loads: config.auth.max_concurrent_key_loads.max(1),
        key_load_wait: Duration::from_secs(config.auth.key_load_wait_seconds),
        workload_audience: config.auth.workload_audience.clone(),
        token_request: config.auth.token_request,
        workload_mechanism: config.auth.workload.mechanism(),
        refusal_memory: Duration::from_secs(config.auth.workload.refusal_memory_seconds),
        namespace_exchanges_per_minute: config.auth.workload.namespace_exchanges_per_minute,
        namespace_exchange_burst: config.auth.workload.namespace_exchange_burst,
        session_keys_ahead: config.auth.session_keys_ahead,
        ..PrincipalsConfig::default()
    }
}

/// Where the mount service's Secrets and Certificates calls go: the regions' own URLs
/// unless `[endpoints]` overrides them.
fn endpoints(config: &Config, regions: Regions) -> anyhow::Result<Endpoints> {
    let e = &config.endpoints;
    let by_region = |urls: &BTreeMap<String, crate::endpoints::HttpsUrl>| {
        urls.iter()
            .map(|(region, url)| (region.clone(), url.as_str().to_owned()))
            .collect()
    };
    let overrides = EndpointOverrides {
        secrets: e.secrets.as_ref().map(|u| u.as_str().to_owned()),
        secrets_by_region: by_region(&e.secrets_by_region),
        certificates: e.certificates.as_ref().map(|u| u.as_str().to_owned()),
        certificates_by_region: by_region(&e.certificates_by_region),
        vaults: e.vaults.as_ref().map(|u| u.as_str().to_owned()),
        vaults_by_region: by_region(&e.vaults_by_region),
    };
    Endpoints::new(regions, config.region.as_deref(), overrides).context("invalid region")
}

/// Builds the whole stack, bottom to top: the one transport with trust per destination,
/// the principals and the signing layer over it, the Secrets and Certificates client, the
/// bundle cache, the mount service under the byte budget, and the CSI gRPC service with
/// its limits and its metrics observer.
pub(crate) fn build(
    config: &Config,
    env: &BTreeMap<String, String>,
    clock: SharedClock,
    traces: &Traces,
) -> anyhow::Result<Stack> {
    let regions = regions(config, env)?;
    let endpoints = Arc::new(endpoints(config, regions.clone())?);
    let principals_config = principals_config(config, regions);

    // 1. The one transport: the pool (connections bounded per host, trust per destination)
    //    and one layer per concern over each exchange.
    let (transport, timings) = transport(config, env, &principals_config, traces)?;
    let http = transport.service();
    traces.client.bind(http.clone());
    let node_taint = node_taint(config, &principals_config, &http)?;

    // 2. Identities over the transport; requests signed with the session each carries.
    let principals = principals(config, principals_config, &http, &clock)?;
    let signing = SigningLayer::new(clock.clone()).layer(http);

    // 3. The fetch stacks over the signed client, one layer per concern.
    let bundles = bundle_cache(config, clock.clone(), &principals);
    let listings = listing_cache(config, clock);
    let fetches = fetches(config, signing, (bundles.clone(), listings.clone()));

    // 4. The mount service: identity, then the entries through the fetch stacks.
    let certificate_expiry = Arc::new(provider::CertificateExpiry::default());
    let mount_context = MountContext {
        tenant_keys: principals.tenant_keys(),
        endpoints,
        certificate_expiry: certificate_expiry.clone(),
        // The parses of a mount's parameters and of secrets read for keys reserve from the
        // fetches' budget: one budget for everything a mount holds.
        byte_budget: Some(fetches.budget.clone()),
        ..mount_context(config)
    };
    let mount = OciMount::new(
        principals.clone(),
        fetches.secrets,
        fetches.certificates,
        mount_context,
    )
    .with_listings(fetches.listings);

    // 5. What /metrics reads.
    let caches = crate::metrics::ScrapeSources {
        bundles,
        listings,
        principals,
        served: fetches.served,
        certificate_expiry,
        certificate_ids: config.telemetry.certificate_ids_in_metrics,
        timings,
        retries: fetches.retries,
        otlp: traces.client.clone(),
    };
    let limits = csi_grpc::MountLimits::from(&config.server);
    let metrics = Arc::new(Metrics::new(
        env!("CARGO_PKG_VERSION"),
        &limits,
        transport,
        fetches.budget,
        caches,
    ));
    // 6. The edge: the bounds of every mount, then the gRPC translation.
    let provider = edge(mount, limits, &metrics);
    Ok(Stack {
        provider,
        metrics,
        node_taint,
    })
}

/// The edge over the mount service: the bytes requests hold, admission (slots, shares,
/// queues), the deadline, a panic as Internal; then the gRPC service with its limits and metrics observer.
fn edge(
    mount: Mount,
    limits: csi_grpc::MountLimits,
    metrics: &Arc<Metrics>,
) -> csi_grpc::CsiProvider<Edge> {
    let request_bytes = RequestBytesLayer::new(&limits).with_observer(metrics.clone());
    let decoding = request_bytes.decoding();
    let edge = ServiceBuilder::new()
        .layer(request_bytes)
        .layer(AdmissionLayer::new(&limits).with_observer(metrics.clone()))
        .layer(DeadlineLayer)
        .layer(CatchPanicLayer)
        .service(mount);
    csi_grpc::CsiProvider::new(edge, server_info(), limits)
        .with_observer(metrics.clone())
        .with_decoding(decoding)
}

/// `--remove-node-taint`: the node's startup taint, removed through the transport with the
/// principals' Kubernetes API (`None` when off).
fn node_taint(
    config: &Config,
    principals_config: &PrincipalsConfig,
    http: &HttpService,
) -> anyhow::Result<Option<auth::NodeTaint>> {
    let (Some(key), Some(node)) = (&config.server.remove_node_taint, &config.server.node_name)
    else {
        return Ok(None);
    };
    auth::NodeTaint::new(principals_config, http.clone(), node, key)
        .map(Some)
        .context("cannot set up --remove-node-taint")
}

/// The transport, observed by the exchange metrics it returns too.
fn transport(
    config: &Config,
    env: &BTreeMap<String, String>,
    principals_config: &PrincipalsConfig,
    traces: &Traces,
) -> anyhow::Result<(Transport, Arc<crate::metrics::UpstreamTimings>)> {
    let timings = Arc::new(crate::metrics::UpstreamTimings::new(host_classes(
        principals_config,
        config,
        traces,
    )));
    let transport = Transport::new(TransportConfig {
        observer: Some(timings.clone()),
        ..transport_config(config, env, principals_config, traces)?
    })?;
    Ok((transport, timings))
}

/// What `Version` answers.
fn server_info() -> csi_grpc::ServerInfo {
    csi_grpc::ServerInfo {
        runtime_name: crate::RUNTIME_NAME.to_owned(),
        runtime_version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// The transport's configuration: `[upstream]` bounds, the proxy, and trust per destination
/// (OCI hosts the platform roots or `ssl_cert_file`; the proxymux and the Kubernetes API only
/// their own CA; plain http only to instance metadata and an `http://` trace collector).
fn transport_config(
    config: &Config,
    env: &BTreeMap<String, String>,
    principals_config: &PrincipalsConfig,
    traces: &Traces,
) -> anyhow::Result<TransportConfig> {
    let e = &config.endpoints;
    let proxy = Proxy::from_env(|k| env.get(k).cloned())
        .map_err(|e| anyhow::anyhow!("invalid proxy settings: {e}"))?;
    let mut transport_config = TransportConfig {
        ssl_cert_file: e.ssl_cert_file.clone(),
        oci_ca_files: e.oci_ca_files.clone(),
        proxy,
        ..TransportConfig::from(&config.upstream)
    };
    if let Some(url) = principals_config.proxymux_url() {
        transport_config = transport_config.trust_only(
            authority(&url, "endpoints.proxymux")?,
            e.proxymux_ca_file.clone(),
        );
    }
    if let Some((url, kubeconfig_ca)) = principals_config
        .kubernetes_target()
        .context("cannot read the kubeconfig")?
    {
        let ca = kubeconfig_ca.unwrap_or_else(|| e.kubernetes_ca_file.clone());
        transport_config =
            transport_config.trust_only(authority(&url, "endpoints.kubernetes_api")?, ca);
    }
    let metadata = e.instance_metadata.as_str();
    if metadata.starts_with("http://") {
        transport_config =
            transport_config.allow_plain_http(authority(metadata, "endpoints.instance_metadata")?);
    }
    // The trace collector: plain http to it alone; its own CA when configured.
    if let Some(url) = &traces.endpoint {
        let collector = authority(url, "telemetry.otlp_endpoint")?;
        if url.starts_with("http://") {
            transport_config = transport_config.allow_plain_http(collector);
        } else if let Some(ca) = &config.telemetry.otlp_ca_file {
            transport_config = transport_config.trust_only(collector, ca.clone());
        }
    }
    Ok(transport_config)
}

/// Which class of upstream each configured endpoint is, for the exchange metrics.
fn host_classes(
    principals_config: &PrincipalsConfig,
    config: &Config,
    traces: &Traces,
) -> crate::metrics::HostClasses {
    let mut classes = crate::metrics::HostClasses::default();
    let mut name = |url: Option<&str>, class: &'static str| {
        if let Some(a) = url
            .and_then(|u| u.parse::<http::Uri>().ok())
            .as_ref()
            .and_then(transport::authority_of)
        {
            classes.insert(a, class);
        }
    };
    let e = &config.endpoints;
    for url in e.secrets.iter().chain(e.secrets_by_region.values()) {
        name(Some(url.as_str()), "secrets");
    }
    for url in e
        .certificates
        .iter()
        .chain(e.certificates_by_region.values())
    {
        name(Some(url.as_str()), "certificates");
    }
    for url in e.vaults.iter().chain(e.vaults_by_region.values()) {
        name(Some(url.as_str()), "vaults");
    }
    name(
        principals_config.federation_endpoint.as_deref(),
        "federation",
    );
    name(Some(config.endpoints.instance_metadata.as_str()), "imds");
    if let auth::WorkloadMechanism::Federation(f) = &principals_config.workload_mechanism {
        name(Some(&f.domain_url), "identity_domain");
    }
    name(traces.endpoint.as_deref(), "otlp");
    name(principals_config.proxymux_url().as_deref(), "proxymux");
    if let Ok(Some((url, _))) = principals_config.kubernetes_target() {
        name(Some(&url), "kubernetes");
    }
    classes
}

/// The fetch stacks and what the metrics read of them.
struct Fetches {
    secrets: Secrets,
    certificates: Certificates,
    listings: Listings,
    budget: ByteBudget,
    served: Arc<RegionStats>,
    retries: Arc<vault::Retries>,
}

/// The fetch stacks over the signed client, outermost first. Secrets: the failover region
/// when the primary fails over, the process's byte budget, the bundle cache (single flight,
/// keyed by credential), the retries. Certificates: the byte budget, the retries.
/// Listings: the byte budget, the listing cache (keyed by credential like bundles), the
/// pages, each page's retries.
fn fetches(
    config: &Config,
    signing: Signing<HttpService>,
    (bundles, listings): (
        Cache<vault::BundleKey, vault::SecretBundle>,
        Cache<vault::ListKey, vault::Listing>,
    ),
) -> Fetches {
    let client = vault_client(signing, &config.upstream);
    let retry = retry_layer(&config.upstream);
    let budget = ByteBudget::with_namespace_share(
        config.server.max_in_flight_bytes,
        config
            .server
            .namespace_bytes(config.upstream.max_bundle_bytes),
    );
    // Each fetch reserves the client's body limit: its answer is read whole, at most that.
    let bounds = BudgetLayer::new(Some(budget.clone()), config.upstream.max_bundle_bytes);
    let served = Arc::new(RegionStats::default());
    let secrets = ServiceBuilder::new()
        .layer(FailoverLayer::new(served.clone()))
        .layer(bounds.clone())
        .layer(CacheLayer::new(bundles))
        .layer(retry.clone())
        .service(client.clone());
    let listings = ServiceBuilder::new()
        .layer(bounds.clone())
        .layer(CacheLayer::new(listings))
        .layer(ListerLayer)
        .layer(retry.clone())
        .service(client.clone());
    let certificates = ServiceBuilder::new()
        .layer(bounds)
        .layer(retry.clone())
        .service(client);
    Fetches {
        secrets,
        certificates,
        listings,
        budget,
        served,
        retries: retry.retries(),
    }
}

/// The bundle cache; expired entries (and credentials) are dropped on a timer.
fn bundle_cache(
    config: &Config,
    clock: SharedClock,
    principals: &Principals,
) -> Cache<vault::BundleKey, vault::SecretBundle> {
    let bundles = Cache::new(bundle_cache_config(&config.cache), clock);
    let purge_every = Duration::from_secs(config.cache.purge_interval_seconds);
    if tokio::runtime::Handle::try_current().is_ok() {
        bundles.spawn_purger(purge_every);
        principals.spawn_purgers(purge_every);
    }
    bundles
}

/// The listing cache; expired listings are dropped on a timer.
fn listing_cache(config: &Config, clock: SharedClock) -> Cache<vault::ListKey, vault::Listing> {
    let listings = Cache::new(listing_cache_config(&config.cache), clock);
    if tokio::runtime::Handle::try_current().is_ok() {
        listings.spawn_purger(Duration::from_secs(config.cache.purge_interval_seconds));
    }
    listings
}

/// The retries of the Secrets and Certificates calls: `[upstream] max_attempts`.
fn retry_layer(u: &UpstreamConfig) -> RetryLayer {
    RetryLayer::new(RetryPolicy {
        max_attempts: u.max_attempts,
        ..RetryPolicy::default()
    })
}

/// The Secrets and Certificates client: `[upstream]` answer bound, our `User-Agent`.
fn vault_client(
    signing: Signing<HttpService>,
    u: &UpstreamConfig,
) -> VaultClient<Signing<HttpService>> {
    VaultClient::new(signing)
        .with_user_agent(concat!(
            "oci-secrets-store-csi-driver-provider/",
            env!("CARGO_PKG_VERSION")
        ))
        .with_max_body_bytes(u.max_bundle_bytes)
}

/// The mount service's bounds from the configuration (the runtime handles are added by
/// [`build`]).
fn mount_context(config: &Config) -> MountContext {
    MountContext {
        fan_out: config.upstream.fan_out,
        max_secrets: config.server.max_secrets_per_mount,
        max_files: config.server.max_files_per_mount,
        allowed_types: config.auth.allowed_types.clone(),
        allowed_regions: config.auth.allowed_regions.clone(),
        ..MountContext::default()
    }
}
