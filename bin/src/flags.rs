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
    /// Mode of the Unix socket, octal [server.endpoint_permissions].
    #[arg(long, value_name = "MODE")]
    pub endpoint_permissions: Option<String>,
    /// Port of /health, /healthz and /readyz [server.healthz_port].
    #[arg(long, value_name = "PORT")]
    pub healthz_port: Option<u16>,
    /// Metrics exporter, only "prometheus" [server.metrics_backend].
    #[arg(long, value_name = "NAME")]
    pub metrics_backend: Option<String>,
    /// Port of /metrics [server.metrics_port].
    #[arg(long, value_name = "PORT")]
    pub metrics_port: Option<u16>,
    /// Accepted for compatibility; profiling is not supported [server.enable_pprof].
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub enable_pprof: Option<bool>,
    /// Accepted for compatibility [server.pprof_port].
    #[arg(long, value_name = "PORT")]
    pub pprof_port: Option<u16>,
    /// Log format: text or json [log.format].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Log level or tracing filter directive [log.level].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
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
            self.endpoint_permissions.clone().map(Value::from),
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
        assert_eq!(f.endpoint_permissions.as_deref(), Some("0660"));

        let f = parse(&["--enable-pprof", "--log-format", "json"]).unwrap();
        assert_eq!(f.enable_pprof, Some(true));
        assert_eq!(f.log_format.as_deref(), Some("json"));
        assert_eq!(
            parse(&["-enable-pprof=false"]).unwrap().enable_pprof,
            Some(false)
        );
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
