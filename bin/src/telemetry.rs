//! Logging to stderr, as text or JSON lines.

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. `RUST_LOG` is not read: the level comes from the
/// configuration (`log.level`, `--log-level`, `OCI_PROVIDER_LOG__LEVEL`).
pub(crate) fn init(config: &LogConfig) -> anyhow::Result<()> {
    let filter = EnvFilter::builder()
        .parse(&config.level)
        .with_context(|| format!("log.level (--log-level) {:?} is not a level or filter directive", config.level))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
