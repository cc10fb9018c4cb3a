//! OpenTelemetry traces of mounts, exported with OTLP over HTTP/protobuf through the
//! process's one transport (invariant 1): the exporter's `HttpClient` is our `HttpService`,
//! bound once the stack is built. Off unless an endpoint is configured.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use tower::ServiceExt as _;

/// The traces endpoint (`…/v1/traces`): `--otlp-endpoint` / `telemetry.otlp_endpoint` (a
/// base URL), else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is), else
/// `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`. Only `http/protobuf` is supported.
pub(crate) fn traces_endpoint(
    configured: Option<&str>,
    env: &BTreeMap<String, String>,
) -> anyhow::Result<Option<String>> {
    let get = |k: &str| env.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    if let Some(protocol) =
        get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or(get("OTEL_EXPORTER_OTLP_PROTOCOL"))
        && protocol != "http/protobuf"
    {
        anyhow::bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL {protocol:?} is not supported: traces are exported with \
             http/protobuf only, over the provider's one HTTPS transport (grpc would need a \
             second HTTP/2 client)"
        );
    }
    let base = |url: &str| format!("{}/v1/traces", url.trim_end_matches('/'));
    let endpoint = match (
        configured.filter(|c| !c.is_empty()),
        get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ) {
        (Some(url), _) => Some(base(url)),
        (None, Some(url)) => Some(url.to_owned()),
        (None, None) => get("OTEL_EXPORTER_OTLP_ENDPOINT").map(base),
    };
    if let Some(url) = &endpoint
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        anyhow::bail!("the OTLP endpoint {url:?} must be an http:// or https:// URL");
    }
    Ok(endpoint)
}

/// The exporter's HTTP client: the transport's service, run on the Tokio runtime (the
/// SDK's batch processor exports from its own thread).
#[derive(Clone, Debug, Default)]
pub(crate) struct OtlpClient {
    bound: Arc<OnceLock<(transport::HttpService, tokio::runtime::Handle)>>,
    failures: Arc<AtomicU64>,
    queue: Arc<Queue>,
}

impl OtlpClient {
    /// Binds the transport; until then exports fail (and are counted).
    pub(crate) fn bind(&self, http: transport::HttpService) {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let _ = self.bound.set((http, handle));
        }
    }

    /// Export requests that failed (each drops its batch of spans).
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Finished spans dropped because the export queue was full (collector slow or down).
    pub(crate) fn dropped(&self) -> u64 {
        self.queue.dropped.load(Ordering::Relaxed)
    }
}

#[async_trait::async_trait]
impl HttpClient for OtlpClient {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let result = async {
            let (http, handle) = self
                .bound
                .get()
                .ok_or("the provider's transport is not set up yet")?;
            let mut request = request;
            request.extensions_mut().insert(transport::Untraced);
            let call = http.clone().oneshot(request);
            let response = handle.spawn(call).await??;
            if !response.status().is_success() {
                return Err(format!("the collector answered HTTP {}", response.status()).into());
            }
            Ok::<_, HttpError>(response)
        }
        .await;
        if result.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

/// Spans waiting for export at most (`OTEL_BSP_MAX_QUEUE_SIZE`, default 2048); beyond it a
/// finished span is dropped and counted, and the mount goes on.
fn queue_bound(env: &BTreeMap<String, String>) -> usize {
    env.get("OTEL_BSP_MAX_QUEUE_SIZE")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(2048)
}

/// Finished spans waiting for export (handed to the batch processor, not yet to the
/// exporter) and spans dropped because too many were waiting.
#[derive(Debug, Default)]
struct Queue {
    pending: AtomicU64,
    dropped: AtomicU64,
}

/// Bounds the spans the SDK's batch processor holds and counts those dropped beyond the
/// bound: the SDK drops silently (its counter is private), so the bound is kept here and
/// the SDK's own queue is made larger than it, so that only this one ever drops.
#[derive(Debug)]
struct BoundedProcessor {
    inner: opentelemetry_sdk::trace::BatchSpanProcessor,
    queue: Arc<Queue>,
    bound: u64,
}

impl opentelemetry_sdk::trace::SpanProcessor for BoundedProcessor {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: opentelemetry_sdk::trace::SpanData) {
        let admitted = self
            .queue
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.bound).then_some(n + 1)
            });
        if admitted.is_err() {
            self.queue.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, telling the queue when spans leave it.
#[derive(Debug)]
struct CountingExporter {
    inner: opentelemetry_otlp::SpanExporter,
    queue: Arc<Queue>,
}

impl opentelemetry_sdk::trace::SpanExporter for CountingExporter {
    fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        let n = batch.len() as u64;
        let _ = self
            .queue
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                Some(p.saturating_sub(n))
            });
        self.inner.export(batch)
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The tracer provider: a batch exporter over `client` whose queue is bounded (dropping
/// and counting beyond it, in [`OtlpClient::dropped`]). Service name and resource from
/// `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, sampler from
/// `OTEL_TRACES_SAMPLER`/`_ARG` (the SDK reads them).
pub(crate) fn provider(
    endpoint: &str,
    client: OtlpClient,
    env: &BTreeMap<String, String>,
) -> anyhow::Result<opentelemetry_sdk::trace::SdkTracerProvider> {
    let queue = client.queue.clone();
    let inner = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| anyhow::anyhow!("cannot set up the OTLP exporter: {e}"))?;
    let bound = queue_bound(env);
    let exporter = CountingExporter {
        inner,
        queue: queue.clone(),
    };
    // The SDK's queue holds at most the spans pending here: twice the bound never fills.
    let config = opentelemetry_sdk::trace::BatchConfigBuilder::default()
        .with_max_queue_size(bound.saturating_mul(2))
        .build();
    let batch = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter)
        .with_batch_config(config)
        .build();
    let processor = BoundedProcessor {
        inner: batch,
        queue,
        bound: bound as u64,
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(crate::RUNTIME_NAME);
    }
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource.build())
        .build())
}

/// The tracing layer sending spans to `provider`.
pub(crate) fn layer<S>(
    provider: &opentelemetry_sdk::trace::SdkTracerProvider,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer(crate::RUNTIME_NAME))
}
