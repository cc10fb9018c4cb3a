use crate::tls::TrustError;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower::ServiceBuilder;

use crate::config::TransportConfig;
use crate::connector::Connector;
use crate::error::TransportError;
use crate::exchange::Exchange;
use crate::layers::{HostLimitLayer, ObserveLayer, TimeoutLayer};
use crate::stats::{HostStats, Stats};
use crate::tls;

/// The transport as a type-erased, cloneable service, which is how the other crates take it.
pub type HttpService =
    tower::util::BoxCloneSyncService<Request<Bytes>, Response<Bytes>, TransportError>;

/// The process's HTTP client: the pool (its connector with the per-host connection bound
/// and trust per destination), the [`Exchange`] over it, and the standard stack of layers
/// over that ([`Transport::service`]). Clones share the pool, the bounds and the counters.
#[derive(Clone, Debug)]
pub struct Transport {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    exchange: Exchange,
    service: HttpService,
    stats: Stats,
}

impl Transport {
    /// Builds the transport. Must be called within a Tokio runtime (the pool's idle timer
    /// runs on it).
    // The one place in the workspace that builds an HTTP client: one transport per process
    // (ARCHITECTURE.md, invariant 1).
    #[allow(clippy::disallowed_methods)] // reason: this crate is the transport
    pub fn new(config: TransportConfig) -> Result<Self, TransportBuildError> {
        let oci = tls::oci_roots(config.ssl_cert_file.as_deref(), &config.oci_ca_files)
            .and_then(tls::client_config)
            .map_err(TransportBuildError::OciTrust)?;
        let mut dedicated = HashMap::new();
        for (authority, file) in &config.dedicated_trust {
            let tls = tls::file_roots(file)
                .and_then(tls::client_config)
                .map_err(|source| TransportBuildError::DedicatedTrust {
                    authority: authority.clone(),
                    source,
                })?;
            dedicated.insert(authority.clone(), tls);
        }
        let stats = Stats::default();
        let connector = Connector::new(
            oci,
            dedicated,
            config.plain_http_authorities.clone(),
            config.proxy.clone(),
            config.max_connections_per_host,
            config.connect_timeout,
            config.tcp_keepalive,
            stats.clone(),
        );
        // hyper-util evicts idle connections on a timer whose period is the pool's idle
        // timeout, so a connection may live up to twice that. Half the configured value
        // makes `idle_timeout` an upper bound: nothing stays idle longer than it.
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(config.idle_timeout / 2)
            .pool_max_idle_per_host(config.max_idle_per_host)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        let exchange = Exchange::new(client, stats.clone(), config.max_response_bytes);
        let service = stack(&config, exchange.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                exchange,
                service,
                stats,
            }),
        })
    }

    /// The exchange over the pool, without any layer (for tests of a layer alone; every
    /// upstream call of the binary goes through [`Transport::service`]).
    pub fn exchange(&self) -> Exchange {
        self.inner.exchange.clone()
    }

    /// The standard stack, built once: [`ObserveLayer`] (with the configured observer),
    /// [`TimeoutLayer`] (`request_timeout`), [`HostLimitLayer`] (`max_connections_per_host`
    /// requests in flight per host), then the [`Exchange`]. Clones share its bounds.
    pub fn service(&self) -> HttpService {
        self.inner.service.clone()
    }

    /// Connection counters per host (`host:port`).
    pub fn stats(&self) -> BTreeMap<String, HostStats> {
        self.inner.stats.snapshot()
    }

    /// Connections open now, all hosts together.
    pub fn open_connections(&self) -> u64 {
        self.stats().values().map(|h| h.open).sum()
    }
}

/// The one composition of the transport's layers over an exchange, outermost first: a
/// client span and the exchange metrics ([`ObserveLayer`], `observer`), the request timeout
/// or the request's deadline when earlier ([`TimeoutLayer`], `request_timeout`), the
/// requests in flight per host ([`HostLimitLayer`], `max_connections_per_host`). The
/// binary's wiring and the tests get it from [`Transport::service`]; nothing else stacks
/// these layers.
fn stack(config: &TransportConfig, exchange: Exchange) -> HttpService {
    HttpService::new(
        ServiceBuilder::new()
            .layer(ObserveLayer::new(config.observer.clone()))
            .layer(TimeoutLayer::new(config.request_timeout))
            .layer(HostLimitLayer::new(config.max_connections_per_host))
            .service(exchange),
    )
}

/// Why the transport could not be built (a CA file or the platform roots).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportBuildError {
    /// The trust for OCI hosts (`SSL_CERT_FILE`, `endpoints.oci_ca_files` or the
    /// platform's roots) cannot be set up.
    #[error("cannot set up the HTTPS transport's trust for OCI hosts")]
    OciTrust(#[source] TrustError),
    /// The dedicated CA file of one authority cannot be used.
    #[error("cannot set up the HTTPS transport's trust for {authority}")]
    DedicatedTrust {
        /// host:port.
        authority: String,
        /// Why.
        #[source]
        source: TrustError,
    },
}
