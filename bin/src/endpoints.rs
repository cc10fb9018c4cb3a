use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Instance metadata v2, where the instance principal starts (defined once, in `auth`).
use auth::DEFAULT_INSTANCE_METADATA;
/// The in-cluster service-account directory.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The `[endpoints]` table: every remote endpoint the provider talks to, and the files
/// that trust or authenticate them. Every endpoint is configurable so that tests and the
/// demo point all of them at the emulator on loopback.
///
/// Unset endpoints are derived the way the Go provider's SDK derives them: the Secrets
/// host from the region, the federation host from the region, the proxymux from
/// `KUBERNETES_SERVICE_HOST` on port 12250, the Kubernetes API from
/// `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Endpoints {
    /// OCI Secrets API base URL (default `https://secrets.vaults.<region>.oci.<domain>`).
    pub secrets: Option<HttpsUrl>,
    /// Secrets API base URLs by region id (`us-ashburn-1`), before `secrets`: a private
    /// endpoint per region, or tests pointing a primary and a failover region somewhere.
    pub secrets_by_region: std::collections::BTreeMap<String, HttpsUrl>,
    /// OCI Certificates API base URL (default `https://certificates.<region>.oci.<domain>`;
    /// certificate entries, `docs/oci-certificates.md`).
    pub certificates: Option<HttpsUrl>,
    /// Certificates API base URLs by region id, before `certificates`.
    pub certificates_by_region: std::collections::BTreeMap<String, HttpsUrl>,
    /// OCI Vault (secret management) API base URL, where `tag` and `namePrefix` entries
    /// list a vault's secrets (default `https://vaults.<region>.oci.<domain>`).
    pub vaults: Option<HttpsUrl>,
    /// Vault API base URLs by region id, before `vaults`.
    pub vaults_by_region: std::collections::BTreeMap<String, HttpsUrl>,
    /// OCI x509 federation base URL for the instance principal (default
    /// `https://auth.<region>.<domain>`; `OCI_SDK_AUTH_CLIENT_REGION_URL`).
    pub federation: Option<HttpsUrl>,
    /// Instance metadata base URL (`OCI_METADATA_BASE_URL`); plain HTTP, like the real one.
    pub instance_metadata: MetadataUrl,
    /// OKE proxymux base URL (default `https://<KUBERNETES_SERVICE_HOST>:12250`).
    pub proxymux: Option<HttpsUrl>,
    /// Kubernetes API base URL (default from `KUBERNETES_SERVICE_HOST`/`_PORT`).
    pub kubernetes_api: Option<HttpsUrl>,
    /// `KUBERNETES_SERVICE_HOST`, from which the proxymux and API defaults derive.
    pub kubernetes_service_host: Option<String>,
    /// `KUBERNETES_SERVICE_PORT`.
    pub kubernetes_service_port: Option<u16>,
    /// An explicit kubeconfig file. Never an implicit `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// The provider's own service-account token (Kubernetes API bearer).
    pub service_account_token_file: PathBuf,
    /// CA bundle trusted for the Kubernetes API.
    pub kubernetes_ca_file: PathBuf,
    /// CA bundle trusted (alone) for the proxymux (`OCI_KUBERNETES_SERVICE_ACCOUNT_CERT_PATH`).
    pub proxymux_ca_file: PathBuf,
    /// Trust only this CA bundle for OCI hosts instead of the platform roots
    /// (`SSL_CERT_FILE`, as the Go provider does).
    pub ssl_cert_file: Option<PathBuf>,
    /// Extra CA bundles trusted for OCI hosts, besides the platform roots (or
    /// `ssl_cert_file` when set).
    pub oci_ca_files: Vec<PathBuf>,
    /// One region's metadata as JSON (`OCI_REGION_METADATA`), for regions the built-in
    /// table does not know.
    pub region_metadata: Option<String>,
    /// Second-level domain for unknown regions (`OCI_DEFAULT_REALM`, e.g. `oraclecloud.com`).
    pub default_realm: Option<String>,
}

impl Default for Endpoints {
    fn default() -> Self {
        Self {
            secrets: None,
            secrets_by_region: std::collections::BTreeMap::new(),
            certificates: None,
            certificates_by_region: std::collections::BTreeMap::new(),
            vaults: None,
            vaults_by_region: std::collections::BTreeMap::new(),
            federation: None,
            instance_metadata: MetadataUrl(DEFAULT_INSTANCE_METADATA.to_owned()),
            proxymux: None,
            kubernetes_api: None,
            kubernetes_service_host: None,
            kubernetes_service_port: None,
            kubeconfig: None,
            service_account_token_file: PathBuf::from(SERVICE_ACCOUNT_DIR).join("token"),
            kubernetes_ca_file: PathBuf::from(SERVICE_ACCOUNT_DIR).join("ca.crt"),
            proxymux_ca_file: PathBuf::from(SERVICE_ACCOUNT_DIR).join("ca.crt"),
            ssl_cert_file: None,
            oci_ca_files: Vec::new(),
            region_metadata: None,
            default_realm: None,
        }
    }
}

/// Checks an endpoint URL: the scheme is one of `schemes`, there is a host, and nothing
/// but an optional path follows (no query, no user info).
fn check_url(url: &str, schemes: &[&str]) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let scheme = uri.scheme_str().unwrap_or("");
    if !schemes.contains(&scheme) {
        return Err(format!(
            "{url:?} must start with {}",
            schemes
                .iter()
                .map(|s| format!("{s}://"))
                .collect::<Vec<_>>()
                .join(" or ")
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("{url:?} has no host"))?;
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return Err(format!("{url:?} must be scheme://host[:port][/path]"));
    }
    if uri.query().is_some() {
        return Err(format!("{url:?} must not have a query"));
    }
    Ok(())
}

macro_rules! url_type {
    ($(#[$doc:meta])* $name:ident, $schemes:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq)]
        pub struct $name(String);

        impl $name {
            /// Validates `url`.
            pub fn new(url: impl Into<String>) -> Result<Self, String> {
                let url = url.into();
                check_url(&url, $schemes)?;
                Ok(Self(url.trim_end_matches('/').to_owned()))
            }

            /// The URL, without a trailing `/`.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let url = String::deserialize(d)?;
                Self::new(url).map_err(serde::de::Error::custom)
            }
        }
    };
}

url_type!(
    /// An `https://` endpoint URL.
    HttpsUrl,
    &["https"]
);
url_type!(
    /// The instance metadata URL: `http://` like the real service, or `https://`.
    MetadataUrl,
    &["http", "https"]
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert_eq!(
            HttpsUrl::new("https://127.0.0.1:8443/").unwrap().as_str(),
            "https://127.0.0.1:8443"
        );
        assert!(
            HttpsUrl::new("http://127.0.0.1:8443")
                .unwrap_err()
                .contains("https://")
        );
        assert!(
            HttpsUrl::new("https://u:p@host")
                .unwrap_err()
                .contains("scheme://host")
        );
        assert!(
            HttpsUrl::new("https://host/?a=b")
                .unwrap_err()
                .contains("query")
        );
        assert!(HttpsUrl::new("not a url").is_err());
        assert!(MetadataUrl::new("http://127.0.0.1:9000/opc/v2").is_ok());
        assert!(MetadataUrl::new("ftp://x").is_err());
    }
}
