//! Logging to stderr, as text or JSON lines.

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. `RUST_LOG` is not read: the level comes from the
/// configuration (`log.level`, `--log-level`, `OCI_PROVIDER_LOG__LEVEL`).
pub(crate) fn init(config: &LogConfig) -> anyhow::Result<()> {
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
    // Colours only on a terminal: a container's log file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let result = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
