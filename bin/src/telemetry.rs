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
    let parse = || {
        EnvFilter::builder().parse(&config.level).with_context(|| {
            format!(
                "log.level (--log-level) {:?} is not a level or filter directive",
                config.level
            )
        })
    };
    let filter = parse()?;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // The text or JSON log names a line's mount (its `mount` span: the pod, the class, the
    // code, the calls that reached OCI); the spans within it (the identity, each fetch,
    // each upstream request) are named too from `debug` on, and are always in the traces.
    // At `info` a cached mount then makes one span and one line, not three spans whose
    // fields are written out for no line (`cargo xtask instructions`).
    let spans = if filter.max_level_hint() >= Some(tracing::level_filters::LevelFilter::DEBUG) {
        TextSpans::All
    } else {
        TextSpans::MountOnly
    };
    // Colours only on a terminal: a container's log file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let fmt: Box<dyn tracing_subscriber::Layer<_> + Send + Sync> = match config.format {
        LogFormat::Text if !ansi => Box::new(fmt.fmt_fields(TextFields)),
        LogFormat::Text => Box::new(fmt),
        LogFormat::Json => Box::new(fmt.json().flatten_event(true)),
    };
    let mut layers = vec![fmt.with_filter(filter.and(spans)).boxed()];
    // The level applies to logs and traces alike: spans below it are not exported.
    if let Some(traces) = traces {
        layers.push(crate::otel::layer(traces).with_filter(parse()?).boxed());
    }
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}

/// Which spans the text (or JSON) log names: every span, or only each mount's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TextSpans {
    All,
    MountOnly,
}

impl TextSpans {
    fn shows(self, metadata: &tracing::Metadata<'_>) -> bool {
        self == Self::All
            || !metadata.is_span()
            || (metadata.name() == "mount" && metadata.target() == "secrets_store_csi_grpc::server")
    }
}

impl<S> tracing_subscriber::layer::Filter<S> for TextSpans {
    fn enabled(
        &self,
        metadata: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        self.shows(metadata)
    }

    fn callsite_enabled(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if self.shows(metadata) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
}

/// The text log's fields, written as tracing-subscriber's default writes them without
/// colour (`name="value"`, the message bare with its terminal control characters escaped),
/// a field of plain printable text copied as it is instead of through `fmt`'s escaping
/// character by character: a mount's line and its spans' fields cost a third of what they
/// did (`cargo xtask instructions`). A test holds the output byte for byte to the default's.
pub(crate) struct TextFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for TextFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = TextVisitor {
            writer,
            padded: false,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }

    /// A space before each field written (a field left to the traces adds none).
    fn add_fields(
        &self,
        current: &'w mut tracing_subscriber::fmt::FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> std::fmt::Result {
        let padded = !current.fields.is_empty();
        let mut visitor = TextVisitor {
            writer: current.as_writer(),
            padded,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct TextVisitor<'w> {
    writer: tracing_subscriber::fmt::format::Writer<'w>,
    padded: bool,
    result: std::fmt::Result,
}

impl TextVisitor<'_> {
    /// Whether the field is written (the `log` crate's metadata fields are not, nor the
    /// OpenTelemetry conventions a trace reads: `otel.kind`, `rpc.system`, `rpc.service`,
    /// `rpc.method`, `rpc.grpc.status_code`, the same on every mount and said by its line's
    /// `code`), with the space before it if it is not the first.
    fn start(&mut self, name: &str) -> bool {
        if self.result.is_err() || skipped(name) {
            return false;
        }
        if self.padded {
            self.result = self.writer.write_char(' ');
        }
        self.padded = true;
        self.result.is_ok()
    }
}

/// The fields the text log leaves to the traces (and the `log` crate's metadata).
fn skipped(name: &str) -> bool {
    name.starts_with("log.") || name.starts_with("otel.") || name.starts_with("rpc.")
}

/// Whether `{:?}` of `value` is `value` in quotes: printable ASCII without `"` or `\`.
fn plain(value: &str) -> bool {
    value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

impl tracing::field::Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        let name = field.name();
        if skipped(name) {
            return;
        }
        if name == "message" || !plain(value) {
            self.record_debug(field, &value);
            return;
        }
        if !self.start(name) {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let w = &mut self.writer;
        self.result = w
            .write_str(name)
            .and_then(|()| w.write_str("=\""))
            .and_then(|()| w.write_str(value))
            .and_then(|()| w.write_char('"'));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let name = field.name();
        if !self.start(name) {
            return;
        }
        self.result = match name {
            // The message is written bare, its control characters escaped (a terminal
            // reading the log must not take them as commands).
            "message" => write!(EscapeControls(&mut self.writer), "{value:?}"),
            name => write!(
                self.writer,
                "{}={value:?}",
                name.strip_prefix("r#").unwrap_or(name)
            ),
        };
    }
}

use std::fmt::Write as _;

/// What tracing-subscriber escapes in a message: ESC, BEL, BS, FF, DEL and the C1 controls.
struct EscapeControls<'a, W>(&'a mut W);

impl<W: std::fmt::Write> std::fmt::Write for EscapeControls<'_, W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let controls = |c: char| {
            matches!(
                c,
                '\x1b' | '\x07' | '\x08' | '\x0c' | '\x7f' | '\u{80}'..='\u{9f}'
            )
        };
        if !s.contains(controls) {
            return self.0.write_str(s);
        }
        for c in s.chars() {
            match c {
                '\x1b' => self.0.write_str("\\x1b")?,
                '\x07' => self.0.write_str("\\x07")?,
                '\x08' => self.0.write_str("\\x08")?,
                '\x0c' => self.0.write_str("\\x0c")?,
                '\x7f' => self.0.write_str("\\x7f")?,
                c if controls(c) => write!(self.0, "\\u{{{:x}}}", c as u32)?,
                c => self.0.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::TextFields;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    struct Shown(&'static str);

    impl std::fmt::Display for Shown {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    #[test]
    fn the_text_fields_are_the_default_fields_byte_for_byte() {
        let (ours, theirs) = (Buffer::default(), Buffer::default());
        let writer = |buffer: &Buffer| {
            let buffer = buffer.clone();
            move || buffer.clone()
        };
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .without_time()
                    .with_writer(writer(&ours))
                    .fmt_fields(TextFields),
            )
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .without_time()
                    .with_writer(writer(&theirs)),
            );
        let values = [
            "plain",
            "",
            "with \"quotes\" and \\ backslash",
            "new\nline\ttab\r",
            "esc \x1b[31m red \x07 bel \x7f del",
            "c1 \u{85} \u{9b}",
            "unicode é ✓ \u{200b} zero-width",
            "ocid1.vaultsecret.oc1.iad.amaaaaaa version 1 (hit)",
        ];
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "mount",
                pod.name = Some("web-0"),
                r#type = "raw",
                absent = Option::<&str>::None,
                later = tracing::field::Empty,
                count = tracing::field::Empty,
            );
            let _entered = span.enter();
            for value in values {
                span.record("later", value);
                span.record("count", 7_u64);
                tracing::info!(field = value, shown = %Shown(value), number = -3_i64, flag = true, "message {value}");
                tracing::warn!(value, "literal message");
                tracing::info!(error = %std::io::Error::other(value));
                tracing::info!(owned = value.to_owned(), debug = ?value);
            }
        });
        let (ours, theirs) = (ours.text(), theirs.text());
        assert_eq!(ours.matches("literal message").count(), values.len());
        assert!(
            ours.contains(r#"mount{pod.name="web-0" type="raw" later="plain" count=7}"#),
            "{ours}"
        );
        assert_eq!(ours, theirs);
    }

    #[test]
    fn the_text_log_leaves_the_opentelemetry_conventions_to_the_traces() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .fmt_fields(TextFields);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let span = tracing::info_span!(
                "mount",
                otel.kind = "server",
                rpc.system = "grpc",
                pod.name = "web-0",
                rpc.grpc.status_code = tracing::field::Empty,
            );
            span.record("rpc.grpc.status_code", 0);
            let _entered = span.enter();
            tracing::info!(code = "ok", "mount succeeded");
        });
        let text = buffer.text();
        assert!(
            text.contains(r#"mount{pod.name="web-0"}: "#) && text.contains(r#"code="ok""#),
            "{text}"
        );
        assert!(!text.contains("otel.") && !text.contains("rpc."), "{text}");
    }

    fn text_of(spans: super::TextSpans) -> String {
        use tracing_subscriber::Layer as _;
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .fmt_fields(TextFields)
            .with_filter(spans);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let mount = tracing::info_span!(target: "secrets_store_csi_grpc::server", "mount", pod.name = "web-0");
            let _mount = mount.enter();
            let fetch = tracing::info_span!("fetch secret", entry = 0_u64);
            let _fetch = fetch.enter();
            tracing::warn!("the primary region failed");
        });
        buffer.text()
    }

    #[test]
    fn at_info_a_line_names_its_mount_and_from_debug_the_spans_within() {
        let info = text_of(super::TextSpans::MountOnly);
        assert!(
            info.contains(r#"mount{pod.name="web-0"}: "#) && !info.contains("fetch secret"),
            "{info}"
        );
        assert!(info.contains("the primary region failed"), "{info}");
        let debug = text_of(super::TextSpans::All);
        assert!(
            debug.contains(r#"mount{pod.name="web-0"}:fetch secret{entry=0}: "#),
            "{debug}"
        );
    }
}
