//! Command-line flags, in the forms the Go provider's chart and users pass them:
//! `--flag=value`, `--flag value`, `-flag=value`, `-flag value`, and booleans as
//! `--enable-pprof` or `--enable-pprof=true`.

use std::path::PathBuf;

use clap::{CommandFactory, Parser};
use figment::value::Value;

/// Flags of the provider binary. Each overrides the configuration key it names.
#[derive(Debug, Default, Parser)]
#[command(
    name = "oci-secrets-store-csi-driver-provider",
    version,
    about = "OCI Vault provider for the Kubernetes Secrets Store CSI driver"
)]
pub struct Flags {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// gRPC endpoint: unix:///path or tcp://127.0.0.1:port [server.endpoint].
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Mode of the Unix socket, read as Go's flag.Int reads it: 0600 (leading 0: octal),
    /// 384 (decimal), 0x180 (hex), 0o600; at most 0777 [server.endpoint_permissions].
    #[arg(long, value_name = "MODE", value_parser = go_mode)]
    pub endpoint_permissions: Option<u32>,
    /// Port of /health, /healthz and /readyz [server.healthz_port].
    #[arg(long, value_name = "PORT", value_parser = go_port)]
    pub healthz_port: Option<u16>,
    /// Metrics exporter, only "prometheus" [server.metrics_backend].
    #[arg(long, value_name = "NAME")]
    pub metrics_backend: Option<String>,
    /// Port of /metrics [server.metrics_port].
    #[arg(long, value_name = "PORT", value_parser = go_port)]
    pub metrics_port: Option<u16>,
    /// Serve CPU (and, with the jemalloc build, heap) profiles and /debug/stats on the
    /// loopback-only debug server (--pprof-port); off by default [server.enable_pprof].
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub enable_pprof: Option<bool>,
    /// Port of the debug server (--enable-pprof) [server.pprof_port].
    #[arg(long, value_name = "PORT", value_parser = go_port)]
    pub pprof_port: Option<u16>,
    /// Log format: text or json [log.format].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Log level or tracing filter directive [log.level].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// OTLP/HTTP collector base URL for traces (`…/v1/traces` is appended)
    /// [telemetry.otlp_endpoint; else OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT].
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Once the socket serves and Version answers on it, remove this NoSchedule/NoExecute
    /// taint from the provider's own node (NODE_NAME, from the downward API); off by
    /// default [server.remove_node_taint].
    #[arg(long, value_name = "KEY")]
    pub remove_node_taint: Option<String>,
    /// A command instead of serving (the provider serves when none is given).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The binary's commands; without one it serves the driver.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Validate SecretProviderClass manifests offline: the files each would mount, or every
    /// problem of each (`check --help`).
    Check {
        /// Its arguments (see `check --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

impl Flags {
    /// Parses `args` (with the program name first), accepting Go's single-dash long flags.
    pub fn parse_from_args(args: &[String]) -> Result<Self, clap::Error> {
        Flags::try_parse_from(normalize(args))
    }

    /// The flags that were given, as (flag, configuration key, value).
    pub(crate) fn overrides(&self) -> Vec<(&'static str, &'static str, Value)> {
        let mut out = Vec::new();
        let mut push = |flag, key, value: Option<Value>| {
            if let Some(value) = value {
                out.push((flag, key, value));
            }
        };
        push(
            "--endpoint",
            "server.endpoint",
            self.endpoint.clone().map(Value::from),
        );
        push(
            "--endpoint-permissions",
            "server.endpoint_permissions",
            // As the octal text the configuration key takes.
            self.endpoint_permissions
                .map(|mode| Value::from(format!("{mode:04o}"))),
        );
        push(
            "--healthz-port",
            "server.healthz_port",
            self.healthz_port.map(Value::from),
        );
        push(
            "--metrics-backend",
            "server.metrics_backend",
            self.metrics_backend.clone().map(Value::from),
        );
        push(
            "--metrics-port",
            "server.metrics_port",
            self.metrics_port.map(Value::from),
        );
        push(
            "--enable-pprof",
            "server.enable_pprof",
            self.enable_pprof.map(Value::from),
        );
        push(
            "--otlp-endpoint",
            "telemetry.otlp_endpoint",
            self.otlp_endpoint.clone().map(Value::from),
        );
        push(
            "--remove-node-taint",
            "server.remove_node_taint",
            self.remove_node_taint.clone().map(Value::from),
        );
        push(
            "--pprof-port",
            "server.pprof_port",
            self.pprof_port.map(Value::from),
        );
        push(
            "--log-format",
            "log.format",
            self.log_format.clone().map(Value::from),
        );
        push(
            "--log-level",
            "log.level",
            self.log_level.clone().map(Value::from),
        );
        out
    }
}

/// Reads an integer as Go's `flag.Int` does (`strconv.ParseInt(s, 0, 64)`): an optional
/// sign, then `0x`/`0X` hex, `0o`/`0O` or a bare leading `0` octal, `0b`/`0B` binary, else
/// decimal, with `_` allowed between digits as in Go's integer literals.
fn go_int(text: &str) -> Result<i64, String> {
    let invalid = || format!("{text:?} is not an integer as Go's flag.Int reads it");
    let (negative, s) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(invalid());
    }
    let (radix, digits) = if b[0] == b'0' {
        match b.get(1).map(u8::to_ascii_lowercase) {
            Some(b'x') if b.len() >= 3 => (16, &s[2..]),
            Some(b'o') if b.len() >= 3 => (8, &s[2..]),
            Some(b'b') if b.len() >= 3 => (2, &s[2..]),
            _ => (8, &s[1..]),
        }
    } else {
        (10, s)
    };
    let mut magnitude: u64 = 0;
    let mut underscores = false;
    for c in digits.chars() {
        if c == '_' {
            underscores = true;
            continue;
        }
        let digit = c.to_digit(radix).ok_or_else(invalid)?;
        magnitude = magnitude
            .checked_mul(u64::from(radix))
            .and_then(|m| m.checked_add(u64::from(digit)))
            .ok_or_else(invalid)?;
    }
    if underscores && !go_underscores_ok(s) {
        return Err(invalid());
    }
    if negative {
        0i64.checked_sub_unsigned(magnitude).ok_or_else(invalid)
    } else {
        i64::try_from(magnitude).map_err(|_| invalid())
    }
}

/// Go's `underscoreOK`: each `_` follows a digit or the base prefix and precedes a digit.
fn go_underscores_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    let mut saw = b'^';
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = b[1].eq_ignore_ascii_case(&b'x');
    }
    for &c in &b[i..] {
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
    }
    saw != b'_'
}

/// `--endpoint-permissions`: Go's integer reading, then at most 0o777.
fn go_mode(text: &str) -> Result<u32, String> {
    let value = go_int(text)?;
    let octal_digits = text.trim_start_matches('+');
    let also = if !octal_digits.is_empty()
        && !octal_digits.starts_with('0')
        && octal_digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        format!(
            "; if you meant the octal mode 0{octal_digits}, write --endpoint-permissions=0{octal_digits}"
        )
    } else {
        String::new()
    };
    match u32::try_from(value) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ if value < 0 => Err(format!(
            "{text} is negative, not a file mode between 0 and 0o777 for server.endpoint_permissions"
        )),
        _ => Err(format!(
            "{text} reads as {value} (0o{value:o}) the way Go's flag.Int reads it (leading 0: \
             octal, 0x: hex, else decimal), which is not a file mode between 0 and 0o777 \
             (511) for server.endpoint_permissions{also}"
        )),
    }
}

/// A port flag: Go's integer reading, then a TCP port.
fn go_port(text: &str) -> Result<u16, String> {
    let value = go_int(text)?;
    u16::try_from(value)
        .map_err(|_| format!("{text} reads as {value}, which is not a port (0 to 65535)"))
}

/// Rewrites Go-style `-name[=value]` into `--name[=value]` for the flags we know, leaving
/// everything else (values that start with `-`, unknown flags) for clap to judge.
fn normalize(args: &[String]) -> Vec<String> {
    let command = Flags::command();
    let known: Vec<&str> = command
        .get_arguments()
        .filter_map(|a| a.get_long())
        .chain(["help", "version"])
        .collect();
    args.iter()
        .enumerate()
        .map(|(i, arg)| {
            if i == 0 || arg.starts_with("--") {
                return arg.clone();
            }
            let Some(rest) = arg.strip_prefix('-') else {
                return arg.clone();
            };
            let name = rest.split('=').next().unwrap_or(rest);
            if known.contains(&name) {
                format!("-{arg}")
            } else {
                arg.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_says_what_profiling_does() {
        let help = <Flags as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        assert!(
            help.contains("CPU (and, with the jemalloc build, heap) profiles"),
            "{help}"
        );
        assert!(!help.contains("not supported"), "{help}");
    }

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        let mut all = vec!["provider".to_owned()];
        all.extend(args.iter().map(|s| (*s).to_owned()));
        Flags::parse_from_args(&all)
    }

    #[test]
    fn accepts_the_go_flag_forms() {
        let f = parse(&[
            "--endpoint=unix:///a.sock",
            "--healthz-port",
            "9000",
            "-metrics-port=9001",
            "-pprof-port",
            "6061",
            "--enable-pprof=true",
            "-endpoint-permissions=0660",
        ])
        .unwrap();
        assert_eq!(f.endpoint.as_deref(), Some("unix:///a.sock"));
        assert_eq!(f.healthz_port, Some(9000));
        assert_eq!(f.metrics_port, Some(9001));
        assert_eq!(f.pprof_port, Some(6061));
        assert_eq!(f.enable_pprof, Some(true));
        assert_eq!(f.endpoint_permissions, Some(0o660));

        let f = parse(&["--enable-pprof", "--log-format", "json"]).unwrap();
        assert_eq!(f.enable_pprof, Some(true));
        assert_eq!(f.log_format.as_deref(), Some("json"));
        assert_eq!(
            parse(&["-enable-pprof=false"]).unwrap().enable_pprof,
            Some(false)
        );
    }

    #[test]
    fn integers_read_as_gos_flag_int_reads_them() {
        for (text, value) in [
            ("384", 384),
            ("0600", 0o600),
            ("0", 0),
            ("00", 0),
            ("0x180", 0x180),
            ("0X1a", 0x1a),
            ("0o660", 0o660),
            ("0O660", 0o660),
            ("0b110", 6),
            ("+12", 12),
            ("-12", -12),
            ("1_000", 1000),
            ("0x_1f", 0x1f),
            ("0_600", 0o600),
            ("-9223372036854775808", i64::MIN),
        ] {
            assert_eq!(go_int(text), Ok(value), "{text}");
        }
        for text in [
            "",
            "-",
            "08",
            "0x",
            "0o",
            "0b2",
            "1__0",
            "_1",
            "1_",
            "0x_",
            "1e3",
            " 1",
            "1.0",
            "9223372036854775808",
            "0600 ",
        ] {
            assert!(go_int(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn the_go_charts_rendered_permissions_mean_what_they_meant_to_go() {
        // The Go chart's `endpointPermissions: 0600` renders through Helm's YAML 1.1 as
        // --endpoint-permissions=384; `0660` as 432.
        assert_eq!(
            parse(&["--endpoint-permissions=384"])
                .unwrap()
                .endpoint_permissions,
            Some(0o600)
        );
        assert_eq!(
            parse(&["--endpoint-permissions=432"])
                .unwrap()
                .endpoint_permissions,
            Some(0o660)
        );
        assert_eq!(
            parse(&["-endpoint-permissions", "0660"])
                .unwrap()
                .endpoint_permissions,
            Some(0o660)
        );
        assert_eq!(
            parse(&["--endpoint-permissions=0x1b0"])
                .unwrap()
                .endpoint_permissions,
            Some(0o660)
        );
        // The Go chart's whole default argument list parses.
        let f = parse(&[
            "--endpoint=unix:///opt/provider/sockets/oci.sock",
            "--endpoint-permissions=384",
            "--healthz-port=8098",
            "--metrics-port=8198",
            "--metrics-backend=prometheus",
            "--enable-pprof=true",
            "--pprof-port=6060",
        ])
        .unwrap();
        assert_eq!(f.endpoint_permissions, Some(0o600));
        assert_eq!(
            (f.healthz_port, f.metrics_port, f.pprof_port),
            (Some(8098), Some(8198), Some(6060))
        );
        assert_eq!(f.overrides()[1].2, Value::from("0600".to_owned()));
    }

    #[test]
    fn modes_above_0777_are_refused_naming_both_readings() {
        let err = parse(&["--endpoint-permissions=600"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--endpoint-permissions"), "{err}");
        assert!(err.contains("600 reads as 600 (0o1130)"), "{err}");
        assert!(err.contains("octal mode 0600"), "{err}");
        let err = parse(&["--endpoint-permissions=01777"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("1023 (0o1777)"), "{err}");
        assert!(!err.contains("if you meant"), "{err}");
        let err = parse(&["--endpoint-permissions=-1"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("negative"), "{err}");
        let err = parse(&["--endpoint-permissions=rw-------"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not an integer as Go's flag.Int reads it"),
            "{err}"
        );
    }

    #[test]
    fn ports_read_as_go_reads_them() {
        assert_eq!(
            parse(&["--healthz-port=0x1f92"]).unwrap().healthz_port,
            Some(8082)
        );
        assert_eq!(
            parse(&["--metrics-port=017"]).unwrap().metrics_port,
            Some(15)
        );
        let err = parse(&["--pprof-port=65536"]).unwrap_err().to_string();
        assert!(err.contains("not a port"), "{err}");
        let err = parse(&["--healthz-port=08098"]).unwrap_err().to_string();
        assert!(err.contains("--healthz-port"), "{err}");
    }

    #[test]
    fn refuses_unknown_and_malformed_flags_naming_them() {
        let err = parse(&["--no-such-flag"]).unwrap_err().to_string();
        assert!(err.contains("--no-such-flag"), "{err}");
        let err = parse(&["--healthz-port", "http"]).unwrap_err().to_string();
        assert!(err.contains("--healthz-port"), "{err}");
        let err = parse(&["-enable-pprof=maybe"]).unwrap_err().to_string();
        assert!(err.contains("--enable-pprof"), "{err}");
    }
}
