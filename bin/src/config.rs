//! Configuration: defaults < TOML file (`--config`) < SDK-compatible environment variables <
//! `OCI_PROVIDER_*` environment variables < command-line flags.
//!
//! The environment is taken as a map, so tests never touch the process environment.

use std::collections::BTreeMap;
use std::fmt;

use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::flags::Flags;

mod server;

pub(crate) use server::ServerConfig;

/// Prefix of the provider's own environment variables; `__` separates nested keys
/// (`OCI_PROVIDER_SERVER__HEALTHZ_PORT`).
pub const ENV_PREFIX: &str = "OCI_PROVIDER_";

/// The whole configuration.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// OCI region (full id like `us-ashburn-1` or short code like `iad`). When unset the
    /// principals find it: `OCI_RESOURCE_PRINCIPAL_REGION`, the user's config, or instance
    /// metadata.
    pub region: Option<String>,
    /// The gRPC, health and metrics servers.
    pub server: ServerConfig,
    /// Logging.
    pub log: LogConfig,
    /// Every remote endpoint, and the files that trust or authenticate them.
    pub endpoints: crate::endpoints::Endpoints,
    /// The one HTTPS transport to OCI, the proxymux, instance metadata and the Kubernetes API.
    pub upstream: UpstreamConfig,
    /// Credentials and identities.
    pub auth: AuthConfig,
    /// The secret-bundle cache.
    pub cache: CacheConfig,
    /// Traces.
    pub telemetry: TelemetryConfig,
}

/// OpenTelemetry traces (off unless an endpoint is set here or by `OTEL_EXPORTER_OTLP_*`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP collector's base URL (`--otlp-endpoint`); plain `http://` is allowed
    /// to this authority only.
    pub otlp_endpoint: Option<String>,
    /// The CA bundle trusted (alone) for an `https://` collector; default: the OCI trust.
    pub otlp_ca_file: Option<std::path::PathBuf>,
    /// Label `oci_provider_certificate_not_after_seconds` by certificate OCID too. Off by
    /// default: `/metrics` is readable by whoever reaches the port, and tenants' OCIDs
    /// name their tenancy's compartments; the default gauge is the soonest `notAfter` per
    /// namespace.
    pub certificate_ids_in_metrics: bool,
}

/// The secret-bundle cache: what mounts of one secret, version and credential share.
///
/// The trade-off, in plain words: a rotated secret, or an IAM policy that no longer lets a
/// principal read it, is seen up to `bundle_ttl_seconds` later than without the cache
/// (the driver's rotation poll interval adds to that, as it always did).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// How long a fetched bundle is served to mounts with the same credential, in seconds.
    /// 0 keeps nothing, but identical fetches in flight at once are still made once.
    pub bundle_ttl_seconds: u64,
    /// Most bytes of secret content kept (part of the chart's memory model); a sixteenth of
    /// it, at most 1 MiB, holds the listings of version histories and selections.
    pub bundle_max_bytes: u64,
    /// Most bundles kept.
    pub bundle_max_entries: u64,
    /// How often expired bundles and credentials are dropped from memory, in seconds.
    pub purge_interval_seconds: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            bundle_ttl_seconds: 30,
            bundle_max_bytes: 16 * 1024 * 1024,
            bundle_max_entries: 4096,
            purge_interval_seconds: 10,
        }
    }
}

/// Bounds of the one transport (per upstream host).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Most connections open to one host (busy and idle together).
    pub max_connections_per_host: usize,
    /// Most idle connections kept per host.
    pub max_idle_per_host: usize,
    /// Idle connections are closed after this many seconds.
    pub idle_timeout_seconds: u64,
    /// Budget of TCP connect + TLS handshake, in seconds.
    pub connect_timeout_seconds: u64,
    /// Budget of one exchange, body included, in seconds (the mount deadline may be shorter).
    pub request_timeout_seconds: u64,
    /// Largest response body accepted, in bytes.
    pub max_response_bytes: usize,
    /// Secrets of one mount fetched at once.
    pub fan_out: usize,
    /// Largest Secrets API answer read, in bytes (OCI secrets hold at most 25 KB; the
    /// bundle is Base64 in JSON): what each fetch reserves from `server.max_in_flight_bytes`.
    pub max_bundle_bytes: usize,
    /// Attempts per Secrets call (retryable failures only).
    pub max_attempts: u32,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            max_connections_per_host: 4,
            max_idle_per_host: 4,
            idle_timeout_seconds: 90,
            connect_timeout_seconds: 10,
            request_timeout_seconds: 30,
            max_response_bytes: 4 * 1024 * 1024,
            fan_out: 8,
            max_bundle_bytes: 256 * 1024,
            max_attempts: 5,
        }
    }
}

/// Credentials and identities.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// How long a user principal's Kubernetes Secret is cached, in seconds.
    pub user_secret_ttl_seconds: u64,
    /// Audience of the service-account token used for workload identity (`""`: the API
    /// server's default audience, as the Go provider requests).
    pub workload_audience: String,
    /// Whether to ask the Kubernetes API for a pod-bound token when the driver supplies
    /// none (needs `create` on `serviceaccounts/token`).
    pub token_request: bool,
    /// User principals' private keys loaded (decrypted) at once on this node; the turns
    /// go round the namespaces.
    pub max_concurrent_key_loads: usize,
    /// Seconds a key load waits for its turn before the mount is `Unavailable` (the
    /// driver retries).
    pub key_load_wait_seconds: u64,
    /// The `authType`s a SecretProviderClass may use (default all three, as the Go
    /// provider); a mount of another is PermissionDenied before any upstream call.
    pub allowed_types: Vec<provider::AuthType>,
    /// Regions a SecretProviderClass may name in `region` / `failoverRegion`; empty: any
    /// region the provider knows in the principal's realm.
    pub allowed_regions: Vec<String>,
    /// `[auth.workload]`: what serves `authType: workload` (OKE's proxymux, or workload
    /// identity federation at an identity domain).
    pub workload: crate::workload::WorkloadConfig,
    /// Session keys (RSA-2048, ~100 ms of one core each) generated ahead for workload
    /// exchanges and the instance principal, from start, at the lowest CPU priority: that
    /// many new identities of a node (its pods after a reboot, a storm) wait for no key.
    /// At most [`MAX_SESSION_KEYS_AHEAD`]; 0 keeps none.
    pub session_keys_ahead: usize,
}

/// The most session keys `auth.session_keys_ahead` may keep (~3 KiB each).
pub(crate) const MAX_SESSION_KEYS_AHEAD: usize = 256;

/// The session keys kept ahead on a node by default: the service accounts of a node's pods
/// mounting at once after a reboot, in most clusters; ~100 KiB and ~3 s of one core at
/// start, behind the mounts.
pub(crate) const DEFAULT_SESSION_KEYS_AHEAD: usize = 32;

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            user_secret_ttl_seconds: 60,
            workload_audience: String::new(),
            token_request: true,
            max_concurrent_key_loads: 1,
            key_load_wait_seconds: 10,
            allowed_types: provider::AuthType::ALL.to_vec(),
            allowed_regions: Vec::new(),
            workload: crate::workload::WorkloadConfig::default(),
            session_keys_ahead: DEFAULT_SESSION_KEYS_AHEAD,
        }
    }
}

/// Logging.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A level (`info`) or a tracing filter directive (`info,oci_csi_auth=debug`).
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A Unix file mode written in octal (`"0600"`, `"660"`, `"0o640"`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct OctalMode(pub u32);

impl fmt::Debug for OctalMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl OctalMode {
    /// Parses octal digits with an optional `0o` prefix; at most 0777.
    pub fn parse(s: &str) -> Option<Self> {
        let digits = s.trim().trim_start_matches("0o");
        if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return None;
        }
        u32::from_str_radix(digits, 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .map(Self)
    }
}

impl Serialize for OctalMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:04o}", self.0))
    }
}

impl<'de> Deserialize<'de> for OctalMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Environment values arrive parsed ("0600" becomes the integer 600), so an integer
        // is read as its decimal digits, which must be octal digits.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(u64),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Text(t) => t,
            Raw::Number(n) => n.to_string(),
        };
        OctalMode::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{text:?} is not an octal file mode between \"0000\" and \"0777\" (write it as a string, e.g. \"0600\")"
            ))
        })
    }
}

/// Why the configuration is unusable. The message names the key and where it came from.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(String);

impl Config {
    /// Loads the configuration from its sources, in precedence order.
    pub fn load(flags: &Flags, env: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = &flags.config {
            if !path.is_file() {
                return Err(ConfigError(format!(
                    "configuration file {} (--config) does not exist or is not a file",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment
            .merge(MapSource::sdk(env)?)
            .merge(MapSource::prefixed(env))
            .merge(MapSource::flags(flags));
        let config: Config = figment.extract().map_err(|e| {
            ConfigError(
                e.into_iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        config.validate()?;
        Ok(config)
    }

    /// The checks in the order they report: the server's own settings, the counts that
    /// must be positive, how the budgets relate, the mount timeout and the region.
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        self.validate_node_taint()?;
        self.validate_counts()?;
        self.validate_budgets()?;
        self.validate_request_bytes()?;
        if self.server.mount_timeout_seconds == 0 {
            return Err(ConfigError(
                "server.mount_timeout_seconds must be at least 1".into(),
            ));
        }
        if let Some(region) = &self.region
            && (region.is_empty() || region.contains(char::is_whitespace))
        {
            return Err(ConfigError(format!(
                "region {region:?}: region can not be empty or have spaces"
            )));
        }
        self.auth
            .workload
            .validate(self.region.as_deref(), &self.auth.workload_audience)
            .map_err(ConfigError)
    }

    /// The endpoint, the metrics backend and the debug server.
    fn validate_server(&self) -> Result<(), ConfigError> {
        self.server
            .endpoint
            .parse::<csi_grpc::Endpoint>()
            .map_err(|e| ConfigError(format!("server.endpoint (--endpoint): {e}")))?;
        if self.server.metrics_backend != "prometheus" {
            return Err(ConfigError(format!(
                "server.metrics_backend (--metrics-backend): {:?} is not supported; use \"prometheus\"",
                self.server.metrics_backend
            )));
        }
        if !self.server.pprof_address.is_loopback() {
            return Err(ConfigError(format!(
                "server.pprof_address {}: the debug server (--enable-pprof) binds a loopback \
                 address only (127.0.0.1 or ::1); profiles and /debug/stats are for someone \
                 on the node, never the network",
                self.server.pprof_address
            )));
        }
        if self.server.max_profile_seconds == 0 || self.server.max_profile_seconds > 600 {
            return Err(ConfigError(format!(
                "server.max_profile_seconds {}: must be between 1 and 600",
                self.server.max_profile_seconds
            )));
        }
        if self.server.max_in_flight_mounts == 0 {
            return Err(ConfigError(
                "server.max_in_flight_mounts must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// `--remove-node-taint`: a taint key as Kubernetes writes one, and the node's name.
    fn validate_node_taint(&self) -> Result<(), ConfigError> {
        let Some(key) = &self.server.remove_node_taint else {
            return Ok(());
        };
        if let Err(why) = crate::taint::check_key(key) {
            return Err(ConfigError(format!(
                "server.remove_node_taint (--remove-node-taint) {}: {why}",
                bounded::quote(key)
            )));
        }
        match self.server.node_name.as_deref() {
            Some(node) if !node.is_empty() && node.len() <= 253 && !node.contains('/') => Ok(()),
            Some(node) => Err(ConfigError(format!(
                "server.node_name (NODE_NAME) {} is not a node name",
                bounded::quote(node)
            ))),
            None => Err(ConfigError(
                "server.remove_node_taint (--remove-node-taint) needs this node's name: set \
                 NODE_NAME from the downward API (fieldRef: spec.nodeName), or server.node_name"
                    .into(),
            )),
        }
    }

    /// Limits and sizes that are counts: none may be 0.
    fn validate_counts(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            (
                "upstream.max_connections_per_host",
                self.upstream.max_connections_per_host,
            ),
            (
                "upstream.max_idle_per_host",
                self.upstream.max_idle_per_host,
            ),
            ("upstream.fan_out", self.upstream.fan_out),
            ("upstream.max_bundle_bytes", self.upstream.max_bundle_bytes),
            (
                "server.max_secrets_per_mount",
                self.server.max_secrets_per_mount,
            ),
            (
                "server.max_files_per_mount",
                self.server.max_files_per_mount,
            ),
            (
                "server.max_in_flight_per_namespace",
                self.server.namespace_mounts(),
            ),
            ("upstream.max_attempts", self.upstream.max_attempts as usize),
            (
                "cache.bundle_max_entries",
                usize::try_from(self.cache.bundle_max_entries).unwrap_or(usize::MAX),
            ),
            (
                "cache.purge_interval_seconds",
                usize::try_from(self.cache.purge_interval_seconds).unwrap_or(usize::MAX),
            ),
        ] {
            if value == 0 {
                return Err(ConfigError(format!("{key} must be at least 1")));
            }
        }
        if self.auth.session_keys_ahead > MAX_SESSION_KEYS_AHEAD {
            return Err(ConfigError(format!(
                "auth.session_keys_ahead is {}; at most {MAX_SESSION_KEYS_AHEAD} keys are kept ahead",
                self.auth.session_keys_ahead
            )));
        }
        Ok(())
    }

    /// The byte and mount budgets hold at least one fetch, and a namespace's share (of
    /// the bytes, the slots and the places to wait) fits in the node's.
    fn validate_budgets(&self) -> Result<(), ConfigError> {
        if self.server.max_in_flight_bytes < self.upstream.max_bundle_bytes {
            return Err(ConfigError(format!(
                "server.max_in_flight_bytes ({}) must hold at least one fetch of \
                 upstream.max_bundle_bytes ({})",
                self.server.max_in_flight_bytes, self.upstream.max_bundle_bytes
            )));
        }
        let share = self.server.namespace_bytes(self.upstream.max_bundle_bytes);
        if share < self.upstream.max_bundle_bytes || share > self.server.max_in_flight_bytes {
            return Err(ConfigError(format!(
                "server.max_in_flight_bytes_per_namespace ({share}) must hold at least one fetch \
                 of upstream.max_bundle_bytes ({}) and at most server.max_in_flight_bytes ({})",
                self.upstream.max_bundle_bytes, self.server.max_in_flight_bytes
            )));
        }
        if self.server.namespace_mounts() > self.server.max_in_flight_mounts {
            return Err(ConfigError(format!(
                "server.max_in_flight_per_namespace ({}) must be at most \
                 server.max_in_flight_mounts ({})",
                self.server.namespace_mounts(),
                self.server.max_in_flight_mounts
            )));
        }
        if self.server.namespace_queued_mounts() > self.server.queued_mounts() {
            return Err(ConfigError(format!(
                "server.max_queued_mounts_per_namespace ({}) must be at most \
                 server.max_queued_mounts ({})",
                self.server.namespace_queued_mounts(),
                self.server.queued_mounts()
            )));
        }
        if self.cache.bundle_max_bytes < self.upstream.max_bundle_bytes as u64 {
            return Err(ConfigError(format!(
                "cache.bundle_max_bytes ({}) must hold at least one bundle of \
                 upstream.max_bundle_bytes ({})",
                self.cache.bundle_max_bytes, self.upstream.max_bundle_bytes
            )));
        }
        Ok(())
    }

    /// The node and each namespace can hold at least one largest request, a namespace no
    /// more than the node.
    fn validate_request_bytes(&self) -> Result<(), ConfigError> {
        let (node, share) = (
            self.server.max_request_bytes,
            self.server.namespace_request_bytes(),
        );
        if node < csi_grpc::MAX_REQUEST_BYTES {
            return Err(ConfigError(format!(
                "server.max_request_bytes ({node}) must hold at least one request of the \
                 largest size the provider decodes ({})",
                csi_grpc::MAX_REQUEST_BYTES
            )));
        }
        if share < csi_grpc::MAX_REQUEST_BYTES || share > node {
            return Err(ConfigError(format!(
                "server.max_request_bytes_per_namespace ({share}) must hold at least one \
                 request of the largest size the provider decodes ({}) and at most \
                 server.max_request_bytes ({node})",
                csi_grpc::MAX_REQUEST_BYTES
            )));
        }
        Ok(())
    }

    /// The parsed gRPC endpoint (validated by [`Config::load`]).
    pub fn grpc_endpoint(&self) -> Result<csi_grpc::Endpoint, ConfigError> {
        self.server
            .endpoint
            .parse()
            .map_err(|e| ConfigError(format!("server.endpoint: {e}")))
    }
}

/// A figment provider over values from environment variables or flags, naming each
/// variable or flag in errors.
struct MapSource {
    name: &'static str,
    dict: Dict,
    /// Config key path (`server.healthz_port`) to the variable it came from.
    sources: BTreeMap<String, String>,
}

impl MapSource {
    /// `OCI_PROVIDER_*`: `OCI_PROVIDER_SERVER__HEALTHZ_PORT` -> `server.healthz_port`.
    fn prefixed(env: &BTreeMap<String, String>) -> Self {
        let mut map = MapSource {
            name: "environment variable",
            dict: Dict::new(),
            sources: BTreeMap::new(),
        };
        for (var, value) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let path: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
            if path.iter().any(String::is_empty) {
                continue;
            }
            let parsed: Value = value.parse().unwrap_or_else(|never| match never {});
            map.insert(&path, parsed, var);
        }
        map
    }

    /// The variables the Go provider's SDK reads (spec 3.2, 4.1, 4.3), and `NODE_NAME`,
    /// mapped to our keys.
    fn sdk(env: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut map = MapSource {
            name: "SDK environment variable",
            dict: Dict::new(),
            sources: BTreeMap::new(),
        };
        Self::refuse_sdk_variables(env)?;
        if let Some(port) = env.get("KUBERNETES_SERVICE_PORT").filter(|v| !v.is_empty()) {
            let port: u16 = port.parse().map_err(|_| {
                ConfigError(format!(
                    "KUBERNETES_SERVICE_PORT {port:?} is not a port number"
                ))
            })?;
            map.insert(
                &["endpoints".to_owned(), "kubernetes_service_port".to_owned()],
                Value::from(port),
                "KUBERNETES_SERVICE_PORT",
            );
        }
        let strings: [(&str, &[&str]); 7] = [
            // The downward API's conventional name for `spec.nodeName`.
            ("NODE_NAME", &["server", "node_name"]),
            ("SSL_CERT_FILE", &["endpoints", "ssl_cert_file"]),
            ("OCI_RESOURCE_PRINCIPAL_REGION", &["region"]),
            (
                "KUBERNETES_SERVICE_HOST",
                &["endpoints", "kubernetes_service_host"],
            ),
            (
                "OCI_KUBERNETES_SERVICE_ACCOUNT_CERT_PATH",
                &["endpoints", "proxymux_ca_file"],
            ),
            ("OCI_METADATA_BASE_URL", &["endpoints", "instance_metadata"]),
            (
                "OCI_SDK_AUTH_CLIENT_REGION_URL",
                &["endpoints", "federation"],
            ),
        ];
        for (var, path) in strings {
            if let Some(value) = env.get(var).filter(|v| !v.is_empty()) {
                let mut value = value.clone();
                if var == "OCI_SDK_AUTH_CLIENT_REGION_URL" && !value.contains("://") {
                    // The SDK assumes https when the scheme is left out.
                    value = format!("https://{value}");
                }
                let path: Vec<String> = path.iter().map(|s| (*s).to_owned()).collect();
                map.insert(&path, Value::from(value), var);
            }
        }
        for (var, key) in crate::workload::SDK_VARIABLES {
            if let Some(value) = env.get(var).filter(|v| !v.is_empty()) {
                let path = ["auth", "workload", "federation", key].map(str::to_owned);
                let parsed: Value = value.parse().unwrap_or_else(|never| match never {});
                map.insert(&path, parsed, var);
            }
        }
        for (var, key) in [
            ("OCI_REGION_METADATA", "region_metadata"),
            ("OCI_DEFAULT_REALM", "default_realm"),
        ] {
            if let Some(value) = env.get(var).filter(|v| !v.is_empty()) {
                map.insert(
                    &["endpoints".to_owned(), key.to_owned()],
                    Value::from(value.clone()),
                    var,
                );
            }
        }
        Ok(map)
    }

    /// SDK variables whose value (or presence) the provider cannot honour.
    fn refuse_sdk_variables(env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
        if let Some(version) = env.get("OCI_RESOURCE_PRINCIPAL_VERSION")
            && version != "2.2"
            && version != "1.1"
        {
            return Err(ConfigError(format!(
                "OCI_RESOURCE_PRINCIPAL_VERSION {version:?} must be valid: \"2.2\" or \"1.1\""
            )));
        }
        for (var, why) in crate::workload::REFUSED_VARIABLES {
            if env.get(var).is_some_and(|v| !v.is_empty()) {
                return Err(ConfigError(format!("{var} is set: {why}")));
            }
        }
        Ok(())
    }

    /// The flags given on the command line.
    fn flags(flags: &Flags) -> Self {
        let mut map = MapSource {
            name: "command-line flag",
            dict: Dict::new(),
            sources: BTreeMap::new(),
        };
        for (flag, path, value) in flags.overrides() {
            let path: Vec<String> = path.split('.').map(str::to_owned).collect();
            map.insert(&path, value, flag);
        }
        map
    }

    fn insert(&mut self, path: &[String], value: Value, var: &str) {
        self.sources.insert(path.join("."), var.to_owned());
        let mut dict = &mut self.dict;
        let (last, parents) = match path.split_last() {
            Some(split) => split,
            None => return,
        };
        for key in parents {
            let entry = dict
                .entry(key.clone())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            dict = match entry {
                Value::Dict(_, d) => d,
                _ => return,
            };
        }
        dict.insert(last.clone(), value);
    }
}

impl Provider for MapSource {
    fn metadata(&self) -> Metadata {
        let sources = self.sources.clone();
        Metadata::named(self.name).interpolater(move |_profile: &Profile, keys: &[&str]| {
            let key = keys.join(".");
            match sources.get(&key) {
                Some(source) => format!("{key} ({source})"),
                None => key,
            }
        })
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut all = vec!["provider".to_owned()];
        all.extend(args.iter().map(|s| (*s).to_owned()));
        Flags::parse_from_args(&all).unwrap()
    }

    fn env(vars: &[(&str, &str)]) -> BTreeMap<String, String> {
        vars.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn toml_file(content: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), content).unwrap();
        file
    }

    #[test]
    fn defaults_match_the_go_provider() {
        let config = Config::load(&flags(&[]), &env(&[])).unwrap();
        assert_eq!(
            config.server.endpoint,
            "unix:///opt/provider/sockets/oci.sock"
        );
        assert_eq!(config.server.endpoint_permissions, OctalMode(0o600));
        assert_eq!(config.server.healthz_port, 8098);
        assert_eq!(config.server.metrics_port, 8198);
        assert_eq!(
            config.endpoints.instance_metadata.as_str(),
            "http://169.254.169.254/opc/v2"
        );
        assert_eq!(config.region, None);
    }

    #[test]
    fn sources_apply_in_precedence_order() {
        let file = toml_file(
            "region = \"us-phoenix-1\"\n[server]\nhealthz_port = 1001\nmetrics_port = 1002\npprof_port = 1003\nendpoint_permissions = \"0640\"\n",
        );
        let path = file.path().to_str().unwrap();
        let vars = env(&[
            ("OCI_RESOURCE_PRINCIPAL_REGION", "us-ashburn-1"),
            ("OCI_PROVIDER_SERVER__METRICS_PORT", "2002"),
            ("OCI_PROVIDER_SERVER__PPROF_PORT", "2003"),
            ("OCI_PROVIDER_SERVER__ENDPOINT_PERMISSIONS", "0660"),
        ]);
        let config = Config::load(&flags(&["--config", path, "-pprof-port=3003"]), &vars).unwrap();
        // The flag, as the Go chart renders 0660 (Go's flag.Int: decimal 432), wins too.
        let over = Config::load(
            &flags(&["--config", path, "--endpoint-permissions=416"]),
            &vars,
        )
        .unwrap();
        assert_eq!(over.server.endpoint_permissions, OctalMode(0o640));
        assert_eq!(config.server.healthz_port, 1001, "file over defaults");
        assert_eq!(
            config.region.as_deref(),
            Some("us-ashburn-1"),
            "SDK variable over file"
        );
        assert_eq!(config.server.metrics_port, 2002, "OCI_PROVIDER_ over file");
        assert_eq!(config.server.pprof_port, 3003, "flag over environment");
        assert_eq!(config.server.endpoint_permissions, OctalMode(0o660));

        let config = Config::load(
            &flags(&[]),
            &env(&[
                ("OCI_RESOURCE_PRINCIPAL_REGION", "iad"),
                ("OCI_PROVIDER_REGION", "fra"),
            ]),
        )
        .unwrap();
        assert_eq!(
            config.region.as_deref(),
            Some("fra"),
            "OCI_PROVIDER_ over SDK variables"
        );
    }

    /// The provider container's args and env as the chart renders them (with its defaults
    /// and with the Go chart's default values file), kept in sync by `deploy/check.py`.
    #[test]
    fn allowed_types_and_the_namespace_shares_come_from_the_environment() {
        let vars: BTreeMap<String, String> = [
            ("OCI_PROVIDER_AUTH__ALLOWED_TYPES", "[workload, user]"),
            ("OCI_PROVIDER_AUTH__ALLOWED_REGIONS", "[iad, us-phoenix-1]"),
            ("OCI_PROVIDER_SERVER__MAX_FILES_PER_MOUNT", "64"),
            ("OCI_PROVIDER_SERVER__MAX_IN_FLIGHT_PER_NAMESPACE", "8"),
            ("OCI_PROVIDER_SERVER__MAX_QUEUED_MOUNTS_PER_NAMESPACE", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let flags = Flags::parse_from_args(&["provider".to_owned()]).unwrap();
        let config = Config::load(&flags, &vars).unwrap();
        assert_eq!(
            config.auth.allowed_types,
            [provider::AuthType::Workload, provider::AuthType::User]
        );
        assert_eq!(config.auth.allowed_regions, ["iad", "us-phoenix-1"]);
        assert_eq!(config.server.max_files_per_mount, 64);
        assert_eq!(config.server.namespace_mounts(), 8);
        assert_eq!(config.server.namespace_queued_mounts(), 0);
        // Defaults: a quarter of the slots and of the bytes; as many places to wait as
        // slots for the node, a quarter of them for one namespace (issue 39: one namespace
        // no longer fills the queue).
        let config = Config::load(&flags, &BTreeMap::new()).unwrap();
        assert_eq!(config.server.namespace_mounts(), 16);
        assert_eq!(
            (
                config.server.queued_mounts(),
                config.server.namespace_queued_mounts()
            ),
            (64, 16)
        );
        assert_eq!(config.server.namespace_request_bytes(), 1 << 20);
        assert_eq!(config.server.namespace_bytes(256 * 1024), 8 << 20);
        let vars: BTreeMap<String, String> = [(
            "OCI_PROVIDER_AUTH__ALLOWED_TYPES".to_owned(),
            "[kerberos]".to_owned(),
        )]
        .into();
        let error = Config::load(&flags, &vars).unwrap_err().to_string();
        assert!(error.contains("allowed_types"), "{error}");
    }

    #[test]
    fn the_charts_rendered_args_and_env_mean_what_the_values_say() {
        let rendered: serde_json::Value = bounded::json::from_str(
            include_str!("../../deploy/tests/rendered-args.json"),
            &bounded::ParseBudget::new(1 << 20),
        )
        .unwrap();
        let load = |label: &str| {
            let container = &rendered[label];
            let mut args = vec!["provider".to_owned()];
            args.extend(
                container["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_owned()),
            );
            let vars: BTreeMap<String, String> = container["env"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            Config::load(&Flags::parse_from_args(&args).unwrap(), &vars).unwrap()
        };
        for (label, pprof) in [("defaults", false), ("go-chart-values", true)] {
            let config = load(label);
            // endpointPermissions: 0600 reaches the flag as 384 and means 0600.
            assert_eq!(
                config.server.endpoint_permissions,
                OctalMode(0o600),
                "{label}"
            );
            assert_eq!(
                config.server.endpoint,
                "unix:///opt/provider/sockets/oci.sock"
            );
            assert_eq!(
                (config.server.healthz_port, config.server.metrics_port),
                (8098, 8198)
            );
            assert_eq!(config.server.enable_pprof, pprof, "{label}: enableProfile");
            assert_eq!(config.server.pprof_port, 6060);
            assert_eq!(config.region.as_deref(), Some("us-ashburn-1"), "{label}");
            // The bundled driver hands the tokens, so the fallback is off by default.
            assert!(!config.auth.token_request, "{label}");
            assert_eq!(
                config.auth.allowed_types,
                provider::AuthType::ALL,
                "{label}: the three enabled values"
            );
        }
        // provider.oci.auth.types.workload.federation as the provider reads it.
        let federation = load("federation").auth.workload.mechanism();
        assert_eq!(
            federation,
            auth::WorkloadMechanism::Federation(auth::FederationConfig {
                domain_url: "https://idcs-0123.identity.oraclecloud.com".into(),
                client: auth::ClientAuth::Secret {
                    client_id: "k8s-csi-runtime".into(),
                    secret: auth::ClientSecret::File("/etc/oci-federation/client-secret".into()),
                },
                token_type: auth::TokenType::Upst,
            })
        );
        assert_eq!(load("federation").auth.workload_audience, "oci-federation");
        // Our chart's budget, and the Go values' 100Mi limit lowering it to fit.
        assert_eq!(load("defaults").server.max_in_flight_bytes, 32 << 20);
        assert_eq!(load("go-chart-values").server.max_in_flight_bytes, 25 << 20);
        assert_eq!(load("go-chart-values").cache.bundle_max_bytes, 16 << 20);

        // The sync controller's sidecar (deploy/sync-controller/values.yaml in its chart):
        // the socket the controller dials, the audience it asks tokens for, no TokenRequests,
        // no user principal (the controller's account may not get Secrets).
        let sidecar = load("sync-controller-sidecar");
        assert_eq!(sidecar.server.endpoint, "unix:///provider/oci.sock");
        assert_eq!(sidecar.server.endpoint_permissions, OctalMode(0o600));
        assert_eq!(
            sidecar.auth.workload_audience,
            "https://kubernetes.default.svc.cluster.local"
        );
        assert!(!sidecar.auth.token_request);
        assert_eq!(
            sidecar.auth.allowed_types,
            [provider::AuthType::Instance, provider::AuthType::Workload]
        );
        assert_eq!(sidecar.server.allowed_peer_uids, [0]);
    }

    #[test]
    fn the_startup_taint_is_off_by_default_and_needs_a_taint_key_and_the_nodes_name() {
        let config = Config::load(&flags(&[]), &env(&[("NODE_NAME", "worker-1")])).unwrap();
        assert_eq!(config.server.remove_node_taint, None);
        let node = env(&[("NODE_NAME", "worker-1")]);
        for good in [
            "x",
            "A_b.c-9",
            "node.cilium.io/agent-not-ready",
            "startup-taint.cluster-autoscaler.kubernetes.io/oci-secrets-provider",
        ] {
            let flag = format!("--remove-node-taint={good}");
            let config = Config::load(&flags(&[&flag]), &node).unwrap();
            assert_eq!(config.server.remove_node_taint.as_deref(), Some(good));
            assert_eq!(config.server.node_name.as_deref(), Some("worker-1"));
        }
        let long = "x".repeat(64);
        for bad in [
            "",
            "-x",
            "x-",
            "x y",
            "Node.Example.com/x",
            "a/b/c",
            "/x",
            long.as_str(),
        ] {
            let flag = format!("--remove-node-taint={bad}");
            let error = Config::load(&flags(&[&flag]), &node)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("server.remove_node_taint"),
                "{bad:?}: {error}"
            );
        }
        let error = Config::load(&flags(&["--remove-node-taint=x"]), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("NODE_NAME") && error.contains("spec.nodeName"),
            "{error}"
        );
        let error = Config::load(
            &flags(&["--remove-node-taint=x"]),
            &env(&[("NODE_NAME", "a/b")]),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("not a node name"), "{error}");
    }

    #[test]
    fn sdk_variables_fill_the_endpoints() {
        let vars = env(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("OCI_KUBERNETES_SERVICE_ACCOUNT_CERT_PATH", "/etc/ca.pem"),
            ("OCI_METADATA_BASE_URL", "http://127.0.0.1:9000/opc/v2"),
            ("OCI_SDK_AUTH_CLIENT_REGION_URL", "127.0.0.1:9443"),
            ("OCI_RESOURCE_PRINCIPAL_VERSION", "2.2"),
            ("OCI_DEFAULT_REALM", "oraclecloud.com"),
        ]);
        let config = Config::load(&flags(&[]), &vars).unwrap();
        let e = &config.endpoints;
        assert_eq!(e.kubernetes_service_host.as_deref(), Some("10.96.0.1"));
        assert_eq!(e.kubernetes_service_port, Some(443));
        assert_eq!(e.proxymux_ca_file, std::path::PathBuf::from("/etc/ca.pem"));
        assert_eq!(e.instance_metadata.as_str(), "http://127.0.0.1:9000/opc/v2");
        assert_eq!(
            e.federation.as_ref().unwrap().as_str(),
            "https://127.0.0.1:9443"
        );
        assert_eq!(e.default_realm.as_deref(), Some("oraclecloud.com"));
    }

    #[test]
    fn invalid_values_name_the_key_and_the_source() {
        type Case<'a> = (
            Vec<&'a str>,
            Vec<(&'a str, &'a str)>,
            Option<&'a str>,
            Vec<&'a str>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                vec![],
                vec![("OCI_PROVIDER_SERVER__HEALTHZ_PORT", "eighty")],
                None,
                vec!["server.healthz_port", "OCI_PROVIDER_SERVER__HEALTHZ_PORT"],
            ),
            (
                vec![],
                vec![("OCI_PROVIDER_ENDPOINTS__SECRETS", "http://127.0.0.1:1")],
                None,
                vec![
                    "endpoints.secrets",
                    "https://",
                    "OCI_PROVIDER_ENDPOINTS__SECRETS",
                ],
            ),
            (
                vec![],
                vec![("OCI_METADATA_BASE_URL", "ftp://x")],
                None,
                vec!["endpoints.instance_metadata", "OCI_METADATA_BASE_URL"],
            ),
            (
                vec![],
                vec![("OCI_RESOURCE_PRINCIPAL_VERSION", "3.0")],
                None,
                vec!["OCI_RESOURCE_PRINCIPAL_VERSION", "must be valid"],
            ),
            (
                vec![],
                vec![("OCI_PROVIDER_SERVER__ENDPOINT_PERMISSIONS", "0999")],
                None,
                vec![
                    "server.endpoint_permissions",
                    "OCI_PROVIDER_SERVER__ENDPOINT_PERMISSIONS",
                    "octal",
                ],
            ),
            (
                vec!["--endpoint", "/tmp/x.sock"],
                vec![],
                None,
                vec!["server.endpoint", "unix://"],
            ),
            (
                vec!["--metrics-backend=opencensus"],
                vec![],
                None,
                vec!["metrics_backend", "prometheus"],
            ),
            (
                vec!["--log-format=xml"],
                vec![],
                None,
                vec!["log.format", "--log-format"],
            ),
            (
                vec![],
                vec![],
                Some("[server]\nhealthz_prot = 1\n"),
                vec!["healthz_prot", "TOML"],
            ),
            (
                vec![],
                vec![],
                Some("[endpoints]\nproxymux = \"https://\"\n"),
                vec!["endpoints.proxymux", "TOML"],
            ),
            (
                vec![],
                vec![("OCI_PROVIDER_REGION", "us ashburn")],
                None,
                vec!["region", "spaces"],
            ),
            (
                vec!["--enable-pprof"],
                vec![("OCI_PROVIDER_SERVER__PPROF_ADDRESS", "0.0.0.0")],
                None,
                vec!["server.pprof_address 0.0.0.0", "loopback"],
            ),
            (
                vec![],
                vec![],
                Some("[server]\npprof_address = \"10.0.0.7\"\n"),
                vec!["server.pprof_address 10.0.0.7", "loopback"],
            ),
            (
                vec![],
                vec![("OCI_PROVIDER_SERVER__MAX_PROFILE_SECONDS", "0")],
                None,
                vec!["server.max_profile_seconds 0"],
            ),
            (
                vec![],
                vec![],
                Some("[server]\nmax_queued_mounts = 8\nmax_queued_mounts_per_namespace = 9\n"),
                vec!["server.max_queued_mounts_per_namespace (9)", "at most"],
            ),
            (
                vec![],
                vec![("OCI_PROVIDER_SERVER__MAX_REQUEST_BYTES", "65536")],
                None,
                vec!["server.max_request_bytes (65536)", "1048576"],
            ),
            (
                vec![],
                vec![],
                Some(
                    "[server]\nmax_request_bytes = 4194304\nmax_request_bytes_per_namespace = 8388608\n",
                ),
                vec![
                    "server.max_request_bytes_per_namespace (8388608)",
                    "at most",
                ],
            ),
        ];
        for (args, vars, file, fragments) in cases {
            let file = file.map(toml_file);
            let mut args: Vec<&str> = args;
            let path;
            if let Some(file) = &file {
                path = file.path().to_str().unwrap().to_owned();
                args.extend(["--config", path.as_str()]);
            }
            let err = Config::load(&flags(&args), &env(&vars))
                .unwrap_err()
                .to_string();
            for fragment in fragments {
                assert!(
                    err.contains(fragment),
                    "{args:?} {vars:?}: {fragment:?} not in {err}"
                );
            }
        }
    }

    #[test]
    fn a_missing_config_file_is_named() {
        let err =
            Config::load(&flags(&["--config", "/no/such/provider.toml"]), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("/no/such/provider.toml"), "{err}");
    }

    #[test]
    fn octal_modes_parse() {
        assert_eq!(OctalMode::parse("0600"), Some(OctalMode(0o600)));
        assert_eq!(OctalMode::parse("660"), Some(OctalMode(0o660)));
        assert_eq!(OctalMode::parse("0o640"), Some(OctalMode(0o640)));
        assert_eq!(OctalMode::parse("0800"), None);
        assert_eq!(OctalMode::parse("01777"), None);
        assert_eq!(OctalMode::parse(""), None);
    }
}
