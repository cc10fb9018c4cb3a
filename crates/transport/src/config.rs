use std::path::PathBuf;
use std::time::Duration;

/// How the transport behaves. Every bound is per host (`host:port`).
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// Most connections open to one host at once (busy and idle together).
    pub max_connections_per_host: usize,
    /// Most idle connections kept per host.
    pub max_idle_per_host: usize,
    /// Idle connections are closed at the latest this long after their last use (and not
    /// before half of it).
    pub idle_timeout: Duration,
    /// Budget for TCP connect, proxy tunnel and TLS handshake.
    pub connect_timeout: Duration,
    /// Budget for a whole exchange, body included (a [`crate::Deadline`] on the request
    /// can shorten it).
    pub request_timeout: Duration,
    /// TCP keepalive probe interval, if any.
    pub tcp_keepalive: Option<Duration>,
    /// Largest response body accepted.
    pub max_response_bytes: usize,
    /// Told of every exchange's outcome and duration (metrics); `None`: nobody.
    pub observer: Option<std::sync::Arc<dyn crate::ExchangeObserver>>,
    /// Trust for OCI hosts: this file only (like `SSL_CERT_FILE` in Go) instead of the
    /// platform roots.
    pub ssl_cert_file: Option<PathBuf>,
    /// Extra CA files trusted for OCI hosts, besides the roots above.
    pub oci_ca_files: Vec<PathBuf>,
    /// Authorities (`host:port`) that trust only their own CA file and bypass the proxy:
    /// the proxymux and the Kubernetes API.
    pub dedicated_trust: Vec<(String, PathBuf)>,
    /// The authorities allowed plain `http://` (instance metadata, a trace collector given
    /// as `http://`); they bypass the proxy.
    pub plain_http_authorities: Vec<String>,
    /// An `HTTPS_PROXY` for OCI hosts.
    pub proxy: Option<Proxy>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            max_connections_per_host: 4,
            max_idle_per_host: 4,
            idle_timeout: Duration::from_secs(90),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            tcp_keepalive: Some(Duration::from_secs(30)),
            max_response_bytes: 4 * 1024 * 1024,
            observer: None,
            ssl_cert_file: None,
            oci_ca_files: Vec::new(),
            dedicated_trust: Vec::new(),
            plain_http_authorities: Vec::new(),
            proxy: None,
        }
    }
}

impl TransportConfig {
    /// Trusts only `ca_file` for `authority` (`host:port`), and never proxies it.
    pub fn trust_only(mut self, authority: impl Into<String>, ca_file: impl Into<PathBuf>) -> Self {
        self.dedicated_trust
            .push((authority.into(), ca_file.into()));
        self
    }

    /// Allows plain HTTP to `authority` (`host:port`) too, and never proxies it.
    pub fn allow_plain_http(mut self, authority: impl Into<String>) -> Self {
        self.plain_http_authorities.push(authority.into());
        self
    }
}

/// An HTTP CONNECT proxy for OCI hosts. `Debug` never shows the credentials.
#[derive(Clone)]
pub struct Proxy {
    /// `host:port` of the proxy.
    pub authority: String,
    /// `Proxy-Authorization: Basic ...` credentials from the proxy URL, if any.
    pub basic_auth: Option<String>,
    /// `NO_PROXY` entries: `*`, host names (a leading `.` or `*.` matches subdomains), IPs.
    pub no_proxy: Vec<String>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("authority", &self.authority)
            .field(
                "basic_auth",
                &self.basic_auth.as_ref().map(|_| "[redacted]"),
            )
            .field("no_proxy", &self.no_proxy)
            .finish()
    }
}

impl Proxy {
    /// Reads `HTTPS_PROXY`/`https_proxy` and `NO_PROXY`/`no_proxy` from `env` (a lookup
    /// function, so tests pass a map). `None` when no proxy is set.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let Some(url) = env("HTTPS_PROXY")
            .or_else(|| env("https_proxy"))
            .filter(|v| !v.trim().is_empty())
        else {
            return Ok(None);
        };
        let no_proxy = env("NO_PROXY")
            .or_else(|| env("no_proxy"))
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let with_scheme = if url.contains("://") {
            url.clone()
        } else {
            format!("http://{url}")
        };
        let uri: http::Uri = with_scheme
            .parse()
            .map_err(|_| "HTTPS_PROXY is not a URL".to_owned())?;
        if uri.scheme_str() != Some("http") {
            return Err("HTTPS_PROXY must be an http:// proxy (CONNECT tunnel)".to_owned());
        }
        let authority = uri
            .authority()
            .ok_or_else(|| "HTTPS_PROXY has no host".to_owned())?;
        let (basic_auth, host_port) = match authority.as_str().rsplit_once('@') {
            Some((userinfo, rest)) => {
                use base64::Engine as _;
                (
                    Some(base64::engine::general_purpose::STANDARD.encode(userinfo)),
                    rest.to_owned(),
                )
            }
            None => (None, authority.as_str().to_owned()),
        };
        let authority = if host_port
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            host_port
        } else {
            format!("{host_port}:80")
        };
        Ok(Some(Proxy {
            authority,
            basic_auth,
            no_proxy,
        }))
    }

    /// Whether `host` is exempt from the proxy.
    pub fn bypasses(&self, host: &str) -> bool {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        self.no_proxy.iter().any(|entry| {
            let entry = entry.trim_start_matches("*.").trim_start_matches('.');
            entry == "*" || host == entry || host.ends_with(&format!(".{entry}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_proxy_from_the_environment() {
        let env = |k: &str| match k {
            "HTTPS_PROXY" => Some("http://user:pw@proxy.local:3128".to_owned()),
            "NO_PROXY" => Some("localhost, .internal,10.0.0.1".to_owned()),
            _ => None,
        };
        let proxy = Proxy::from_env(env).unwrap().unwrap();
        assert_eq!(proxy.authority, "proxy.local:3128");
        assert_eq!(proxy.basic_auth.as_deref(), Some("dXNlcjpwdw=="));
        assert!(proxy.bypasses("localhost"));
        assert!(proxy.bypasses("vault.internal"));
        assert!(proxy.bypasses("10.0.0.1"));
        assert!(!proxy.bypasses("secrets.vaults.us-ashburn-1.oci.oraclecloud.com"));
        assert!(Proxy::from_env(|_| None).unwrap().is_none());
        assert!(
            Proxy::from_env(|k| (k == "https_proxy").then(|| "https://p:1".to_owned())).is_err()
        );
        let bare = Proxy::from_env(|k| (k == "HTTPS_PROXY").then(|| "proxy".to_owned()))
            .unwrap()
            .unwrap();
        assert_eq!(bare.authority, "proxy:80");
    }

    #[test]
    fn debug_output_never_shows_the_proxy_credentials() {
        let proxy = Proxy::from_env(|k| {
            (k == "HTTPS_PROXY").then(|| "http://alice:s3cr3t-pw@proxy.local:3128".to_owned())
        })
        .unwrap()
        .unwrap();
        let encoded = proxy.basic_auth.clone().unwrap();
        let config = TransportConfig {
            proxy: Some(proxy.clone()),
            ..TransportConfig::default()
        };
        for text in [
            format!("{proxy:?}"),
            format!("{proxy:#?}"),
            format!("{config:?}"),
        ] {
            assert!(text.contains("proxy.local:3128"), "{text}");
            assert!(text.contains("[redacted]"), "{text}");
            assert!(!text.contains(&encoded), "{text}");
            assert!(!text.contains("s3cr3t"), "{text}");
            assert!(!text.contains("alice"), "{text}");
        }
    }
}
