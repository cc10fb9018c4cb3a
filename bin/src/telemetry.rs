//! Logging to stderr, as text or JSON lines.

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. `RUST_LOG` is not read: the level comes from the
/// configuration (`log.level`, `--log-level`, `OCI_PROVIDER_LOG__LEVEL`).
pub(crate) fn init(
    config: &LogConfig,
    traces: Option<&opentelemetry_sdk::trace::SdkTracerProvider>,
) -> anyhow::Result<()> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    // A bare word is read by tracing as a target name; here it is far more likely a
    // misspelt level, so only levels and `target=level` directives are accepted.
    let level = config.level.trim();
    if !level.contains(['=', ',']) && !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
        anyhow::bail!(
            "log.level (--log-level) {level:?} is not one of {} or a filter directive like \"info,oci_csi_auth=debug\"",
            LEVELS.join(", ")
        );
    }
    let filter = EnvFilter::builder().parse(&config.level).with_context(|| {
        format!(
            "log.level (--log-level) {:?} is not a level or filter directive",
            config.level
        )
    })?;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // Colours only on a terminal: a container's log file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let fmt: Box<dyn tracing_subscriber::Layer<_> + Send + Sync> = match config.format {
        LogFormat::Text => Box::new(fmt),
        LogFormat::Json => Box::new(fmt.json().flatten_event(true)),
    };
    // The filter applies to logs and traces alike: spans below the level are not exported.
    let otel = traces.map(crate::otel::layer);
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
