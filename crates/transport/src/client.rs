use crate::tls::TrustError;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::Instant;
use tower::Service;

use crate::config::TransportConfig;
use crate::connector::{Connector, Permits, authority_of};
use crate::error::TransportError;
use crate::stats::{HostStats, Stats};
use crate::tls;

/// The transport as a type-erased, cloneable service, which is how the other crates take it.
pub type HttpService =
    tower::util::BoxCloneSyncService<Request<Bytes>, Response<Bytes>, TransportError>;

/// A request extension: the exchange must be over by then (e.g. the mount's deadline).
/// The earlier of this and the configured request timeout applies.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub Instant);

/// A request extension: read at most this many bytes of the answer's body (less than the
/// configured `max_response_bytes`, for callers that know their answers are small and
/// account for the buffer, as the Secrets client does).
#[derive(Clone, Copy, Debug)]
pub struct MaxBodyBytes(pub usize);

/// The process's HTTP client. Clones share the pool, the bounds and the counters.
#[derive(Clone, Debug)]
pub struct Transport {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client<Connector, Full<Bytes>>,
    requests: Permits,
    stats: Stats,
    config: TransportConfig,
}

impl Transport {
    /// Builds the transport. Must be called within a Tokio runtime (the pool's idle timer
    /// runs on it).
    // The one place in the workspace that builds an HTTP client (DESIGN.md, invariant 1).
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
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                requests: Permits::new(config.max_connections_per_host),
                stats,
                config,
            }),
        })
    }

    /// The transport as an [`HttpService`].
    pub fn service(&self) -> HttpService {
        HttpService::new(self.clone())
    }

    /// Connection counters per host (`host:port`).
    pub fn stats(&self) -> BTreeMap<String, HostStats> {
        self.inner.stats.snapshot()
    }

    /// Connections open now, all hosts together.
    pub fn open_connections(&self) -> u64 {
        self.stats().values().map(|h| h.open).sum()
    }

    async fn send(self, request: Request<Bytes>) -> Result<Response<Bytes>, TransportError> {
        let uri = request.uri().clone();
        let authority = authority_of(&uri).ok_or_else(|| TransportError::InvalidUri {
            uri: format!(
                "{}://{}{}",
                uri.scheme_str().unwrap_or(""),
                uri.authority().map(|a| a.as_str()).unwrap_or(""),
                uri.path()
            ),
            reason: "an absolute http or https URI is required",
        })?;
        let config = &self.inner.config;
        self.inner.stats.request(&authority);
        let request_untraced = request.extensions().get::<Untraced>().is_some();
        let method = request.method().clone();
        let mut deadline = Instant::now() + config.request_timeout;
        if let Some(Deadline(requested)) = request.extensions().get::<Deadline>() {
            deadline = deadline.min(*requested);
        }
        let budget = deadline.saturating_duration_since(Instant::now());
        let limit = match request.extensions().get::<MaxBodyBytes>() {
            Some(MaxBodyBytes(requested)) => (*requested).min(config.max_response_bytes),
            None => config.max_response_bytes,
        };
        let exchange = self.exchange(&authority, request, limit);
        // A client span per exchange (method, host, status; never headers), except for the
        // trace exporter's own requests, which would otherwise trace themselves.
        let span = exchange_span(request_untraced, &method, &authority);
        let started = Instant::now();
        let timed = tracing::Instrument::instrument(
            tokio::time::timeout_at(deadline, exchange),
            span.clone(),
        );
        let result = match timed.await {
            Ok(result) => result,
            Err(_) => Err(TransportError::Timeout {
                authority: authority.clone(),
                after: budget,
            }),
        };
        report(
            &span,
            config.observer.as_deref(),
            &authority,
            &result,
            started,
        );
        result
    }

    /// One exchange, within a per-host request permit: send, then read the body up to
    /// `limit` bytes.
    async fn exchange(
        &self,
        authority: &str,
        request: Request<Bytes>,
        limit: usize,
    ) -> Result<Response<Bytes>, TransportError> {
        // Requests in flight per host are bounded like connections, so a storm waits
        // here instead of queueing connects.
        let _permit = self
            .inner
            .requests
            .of(authority)
            .acquire_owned()
            .await
            .map_err(|e| TransportError::Http {
                authority: authority.to_owned(),
                source: Box::new(e),
            })?;
        let response = self
            .inner
            .client
            .request(request.map(Full::new))
            .await
            .map_err(|e| classify(authority, e))?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, limit).collect().await.map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                TransportError::TooLarge {
                    authority: authority.to_owned(),
                    limit,
                }
            } else {
                TransportError::Http {
                    authority: authority.to_owned(),
                    source: e,
                }
            }
        })?;
        Ok(Response::from_parts(parts, body.to_bytes()))
    }
}

/// A client span per exchange (method, host, status; never headers), except for the
/// trace exporter's own requests, which would otherwise trace themselves.
fn exchange_span(untraced: bool, method: &http::Method, authority: &str) -> tracing::Span {
    if untraced {
        return tracing::Span::none();
    }
    tracing::info_span!(
        "upstream request",
        otel.kind = "client",
        http.request.method = %method,
        server.address = %authority,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    )
}

/// An exchange's outcome, on its span and to the observer (the metrics).
fn report(
    span: &tracing::Span,
    observer: Option<&dyn crate::ExchangeObserver>,
    authority: &str,
    result: &Result<Response<Bytes>, TransportError>,
    started: Instant,
) {
    let outcome = match result {
        Ok(response) => {
            span.record("http.response.status_code", response.status().as_u16());
            crate::Outcome::Status(response.status().as_u16())
        }
        Err(err) => {
            span.record("error.type", format!("{:?}", err.kind()).as_str());
            crate::Outcome::Failed(err.kind())
        }
    };
    if let Some(observer) = observer {
        observer.exchanged(authority, outcome, started.elapsed());
    }
}

/// Put in a request's extensions to send it without a trace span (the trace exporter's
/// own requests).
#[derive(Clone, Copy, Debug, Default)]
pub struct Untraced;

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

fn classify(authority: &str, error: hyper_util::client::legacy::Error) -> TransportError {
    let authority = authority.to_owned();
    if error.is_connect() {
        TransportError::Connect {
            authority,
            source: Box::new(error),
        }
    } else {
        TransportError::Http {
            authority,
            source: Box::new(error),
        }
    }
}

impl Service<Request<Bytes>> for Transport {
    type Response = Response<Bytes>;
    type Error = TransportError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Bytes>, TransportError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), TransportError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        Box::pin(self.clone().send(request))
    }
}
