//! `[auth.workload]`: which mechanism serves `authType: workload` on this node, and the
//! identity domain's settings when it is workload identity federation.
//!
//! A SecretProviderClass keeps `authType: workload` ("the pod's own service-account
//! identity") wherever it runs; the node says how that identity reaches OCI. The names are
//! those OCI users know from the cloud-controller-manager (`OCI_WORKLOAD_IDENTITY_*`, which
//! are read too) and the Terraform provider.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::endpoints::HttpsUrl;

/// `[auth.workload]`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadConfig {
    /// `oke` (the default: OKE's proxymux) or `federation` (an identity domain).
    pub mechanism: Mechanism,
    /// Seconds a definite refusal of a service account's exchange (400, 401 or 403 of the
    /// identity domain, not `invalid_client`, or of the proxymux) is remembered: its mounts
    /// fail at once meanwhile, and a fixed trust rule takes effect after at most this long
    /// (0: never remembered).
    pub refusal_memory_seconds: u64,
    /// Exchanges (TokenRequest, key and exchange) one namespace makes per minute after its
    /// burst; one over waits within its mount's deadline, else is `ResourceExhausted`.
    pub namespace_exchanges_per_minute: u32,
    /// Exchanges one namespace may make at once.
    pub namespace_exchange_burst: u32,
    /// `[auth.workload.federation]`, read when `mechanism = "federation"`.
    pub federation: FederationSettings,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            mechanism: Mechanism::default(),
            refusal_memory_seconds: auth::DEFAULT_REFUSAL_MEMORY.as_secs(),
            namespace_exchanges_per_minute: auth::DEFAULT_NAMESPACE_EXCHANGES_PER_MINUTE,
            namespace_exchange_burst: auth::DEFAULT_NAMESPACE_EXCHANGE_BURST,
            federation: FederationSettings::default(),
        }
    }
}

/// What serves `authType: workload`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// OKE workload identity (the cluster's proxymux answers RPSTs).
    #[default]
    Oke,
    /// Workload identity federation at an OCI identity domain, on any cluster.
    Federation,
}

/// `[auth.workload.federation]`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FederationSettings {
    /// The identity domain's URL, no path (`OCI_WORKLOAD_IDENTITY_DOMAIN_URL`).
    pub domain_url: Option<HttpsUrl>,
    /// The confidential application's client id (`OCI_WORKLOAD_IDENTITY_CLIENT_ID`).
    pub client_id: Option<String>,
    /// A file holding its client secret (a mounted Secret volume), read at each exchange.
    pub client_secret_file: Option<PathBuf>,
    /// A Kubernetes Secret holding it, in the provider's own namespace, read at each
    /// exchange with the provider's service account.
    pub client_secret_ref: Option<SecretRef>,
    /// Authenticate exchanges with the node's instance principal instead of a client id
    /// and secret (`OCI_WORKLOAD_IDENTITY_USE_INSTANCE_PRINCIPAL_FOR_TOKEN_EXCHANGE`).
    pub use_instance_principal: bool,
    /// UPST (default) or RPST (`OCI_WORKLOAD_IDENTITY_REQUESTED_TOKEN_TYPE`).
    pub requested_token_type: RequestedTokenType,
    /// `res_type` of RPSTs, the trust's `impersonatingResource`
    /// (`OCI_WORKLOAD_IDENTITY_RESOURCE_TYPE`).
    pub resource_type: Option<String>,
}

/// A member of a Kubernetes Secret.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// The provider's own namespace.
    pub namespace: String,
    /// The Secret.
    pub name: String,
    /// Its data member.
    pub key: String,
}

/// `requested_token_type`: the URN, or `upst` / `rpst`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum RequestedTokenType {
    /// A user principal session token of the service user the trust maps to.
    #[default]
    #[serde(rename = "urn:oci:token-type:oci-upst", alias = "upst")]
    Upst,
    /// A resource principal session token of the service account.
    #[serde(rename = "urn:oci:token-type:oci-rpst", alias = "rpst")]
    Rpst,
}

/// The cloud-controller-manager's variables this provider reads, and the key each sets.
pub(crate) const SDK_VARIABLES: [(&str, &str); 5] = [
    ("OCI_WORKLOAD_IDENTITY_DOMAIN_URL", "domain_url"),
    ("OCI_WORKLOAD_IDENTITY_CLIENT_ID", "client_id"),
    (
        "OCI_WORKLOAD_IDENTITY_USE_INSTANCE_PRINCIPAL_FOR_TOKEN_EXCHANGE",
        "use_instance_principal",
    ),
    (
        "OCI_WORKLOAD_IDENTITY_REQUESTED_TOKEN_TYPE",
        "requested_token_type",
    ),
    ("OCI_WORKLOAD_IDENTITY_RESOURCE_TYPE", "resource_type"),
];

/// The cloud-controller-manager's variables this provider refuses, and why: a setting that
/// would be ignored is an error, not a surprise.
pub(crate) const REFUSED_VARIABLES: [(&str, &str); 4] = [
    (
        "OCI_WORKLOAD_IDENTITY_CLIENT_SECRET",
        "the client secret is not read from the environment: set \
         auth.workload.federation.client_secret_file (a mounted Secret) or client_secret_ref",
    ),
    (
        "OCI_WORKLOAD_IDENTITY_TOKEN_PATH",
        "each mount's token is its own pod's (the driver's tokenRequests, or a TokenRequest \
         bound to the pod), not a file of the provider's",
    ),
    (
        "OCI_WORKLOAD_IDENTITY_PUBLIC_KEY",
        "the provider makes the key pair of each session, bound to no other token (OCI's Go \
         SDK makes a new one for every exchange and ignores this variable)",
    ),
    (
        "OCI_WORKLOAD_IDENTITY_RPST_EXP",
        "rpst_exp is not sent: its unit is not documented; the domain's default lifetime \
         applies",
    ),
];

impl WorkloadConfig {
    /// What a node with `region` and tokens for `audience` may configure: federation
    /// needs the region, an audience of its own, the domain, exactly one client
    /// authentication, and `resource_type` with RPSTs only.
    pub(crate) fn validate(&self, region: Option<&str>, audience: &str) -> Result<(), String> {
        if self.namespace_exchanges_per_minute == 0 || self.namespace_exchange_burst == 0 {
            return Err("auth.workload.namespace_exchanges_per_minute and \
                 namespace_exchange_burst are at least 1: 0 would refuse every workload exchange"
                .into());
        }
        let f = &self.federation;
        if self.mechanism == Mechanism::Oke {
            return match f.domain_url {
                Some(_) => Err("auth.workload.federation.domain_url is set but \
                     auth.workload.mechanism is \"oke\": set it to \"federation\""
                    .into()),
                None => Ok(()),
            };
        }
        let key = "auth.workload.mechanism \"federation\"";
        if region.is_none() {
            return Err(format!(
                "{key} needs region (OCI_RESOURCE_PRINCIPAL_REGION): a federated cluster has \
                 no OKE environment to read it from"
            ));
        }
        if audience.is_empty() {
            return Err(format!(
                "{key} needs auth.workload_audience: the audience the identity propagation \
                 trust pins (clientClaimValues), which the driver's tokenRequests ask for"
            ));
        }
        let domain = f.domain_url.as_ref().ok_or_else(|| {
            format!(
                "{key} needs auth.workload.federation.domain_url (OCI_WORKLOAD_IDENTITY_DOMAIN_URL)"
            )
        })?;
        if domain.as_str().splitn(4, '/').nth(3).is_some() {
            return Err(format!(
                "auth.workload.federation.domain_url {:?}: the identity domain's base URL, \
                 without a path (https://idcs-<id>.identity.oraclecloud.com)",
                domain.as_str()
            ));
        }
        self.validate_client()?;
        match (f.requested_token_type, f.resource_type.as_deref()) {
            (RequestedTokenType::Rpst, None | Some("")) => Err(
                "auth.workload.federation.requested_token_type RPST needs resource_type \
                 (OCI_WORKLOAD_IDENTITY_RESOURCE_TYPE): the trust's impersonatingResource"
                    .into(),
            ),
            (RequestedTokenType::Upst, Some(_)) => Err(
                "auth.workload.federation.resource_type is for RPSTs only: set \
                 requested_token_type to RPST or remove it"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// Exactly one of: a client id with one place of its secret, or the instance principal.
    fn validate_client(&self) -> Result<(), String> {
        let f = &self.federation;
        let secrets = usize::from(f.client_secret_file.is_some())
            + usize::from(f.client_secret_ref.is_some());
        let id = f.client_id.as_deref().is_some_and(|id| !id.is_empty());
        match (f.use_instance_principal, id, secrets) {
            (true, false, 0) | (false, true, 1) => Ok(()),
            (true, _, _) => Err(
                "auth.workload.federation.use_instance_principal authenticates \
                 with the node's instance principal: remove client_id and the client secret"
                    .into(),
            ),
            (false, false, _) => Err("auth.workload.federation needs client_id \
                 (OCI_WORKLOAD_IDENTITY_CLIENT_ID) and client_secret_file or client_secret_ref, \
                 or use_instance_principal = true"
                .into()),
            (false, true, 0) => Err("auth.workload.federation.client_id needs its secret: \
                 client_secret_file (a mounted Secret) or client_secret_ref"
                .into()),
            (false, true, _) => Err("auth.workload.federation: set one of client_secret_file \
                 and client_secret_ref, not both"
                .into()),
        }
    }

    /// The principals' mechanism (after [`WorkloadConfig::validate`]).
    pub(crate) fn mechanism(&self) -> auth::WorkloadMechanism {
        let f = &self.federation;
        let Some(domain) = f
            .domain_url
            .as_ref()
            .filter(|_| self.mechanism == Mechanism::Federation)
        else {
            return auth::WorkloadMechanism::Oke;
        };
        let secret = match (&f.client_secret_file, &f.client_secret_ref) {
            (Some(file), _) => auth::ClientSecret::File(file.clone()),
            (None, Some(r)) => auth::ClientSecret::KubernetesSecret {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                key: r.key.clone(),
            },
            // Refused by `validate`.
            (None, None) => auth::ClientSecret::File(PathBuf::new()),
        };
        let client = if f.use_instance_principal {
            auth::ClientAuth::InstancePrincipal
        } else {
            auth::ClientAuth::Secret {
                client_id: f.client_id.clone().unwrap_or_default(),
                secret,
            }
        };
        let token_type = match f.requested_token_type {
            RequestedTokenType::Upst => auth::TokenType::Upst,
            RequestedTokenType::Rpst => auth::TokenType::Rpst {
                resource_type: f.resource_type.clone().unwrap_or_default(),
            },
        };
        auth::WorkloadMechanism::Federation(auth::FederationConfig {
            domain_url: domain.as_str().to_owned(),
            client,
            token_type,
        })
    }

    /// How `check` says what serves `authType: workload`.
    pub(crate) fn describe(&self) -> String {
        match self.mechanism() {
            auth::WorkloadMechanism::Oke => "OKE workload identity (the proxymux)".to_owned(),
            auth::WorkloadMechanism::Federation(f) => format!(
                "workload identity federation at {} ({}, {})",
                f.domain_url,
                f.token_type.label().to_uppercase(),
                match f.client {
                    auth::ClientAuth::InstancePrincipal => "the instance principal's signature",
                    auth::ClientAuth::Secret { .. } => "the confidential application's secret",
                }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::config::Config;
    use crate::flags::Flags;

    fn load(vars: &[(&str, &str)]) -> Result<Config, String> {
        let flags = Flags::parse_from_args(&["provider".to_owned()]).unwrap();
        let env: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::load(&flags, &env).map_err(|e| e.to_string())
    }

    const FEDERATION: [(&str, &str); 4] = [
        ("OCI_PROVIDER_AUTH__WORKLOAD__MECHANISM", "federation"),
        ("OCI_RESOURCE_PRINCIPAL_REGION", "us-ashburn-1"),
        ("OCI_PROVIDER_AUTH__WORKLOAD_AUDIENCE", "oci-federation"),
        (
            "OCI_WORKLOAD_IDENTITY_DOMAIN_URL",
            "https://idcs-0123.identity.oraclecloud.com",
        ),
    ];

    #[test]
    fn the_cloud_controller_managers_variables_configure_federation() {
        let mut vars = FEDERATION.to_vec();
        vars.extend([
            ("OCI_WORKLOAD_IDENTITY_CLIENT_ID", "runtime"),
            (
                "OCI_PROVIDER_AUTH__WORKLOAD__FEDERATION__CLIENT_SECRET_FILE",
                "/etc/oci-federation/client-secret",
            ),
            (
                "OCI_WORKLOAD_IDENTITY_REQUESTED_TOKEN_TYPE",
                "urn:oci:token-type:oci-rpst",
            ),
            ("OCI_WORKLOAD_IDENTITY_RESOURCE_TYPE", "k8sworkload"),
        ]);
        let config = load(&vars).unwrap();
        assert_eq!(
            config.auth.workload.mechanism(),
            auth::WorkloadMechanism::Federation(auth::FederationConfig {
                domain_url: "https://idcs-0123.identity.oraclecloud.com".into(),
                client: auth::ClientAuth::Secret {
                    client_id: "runtime".into(),
                    secret: auth::ClientSecret::File("/etc/oci-federation/client-secret".into()),
                },
                token_type: auth::TokenType::Rpst {
                    resource_type: "k8sworkload".into(),
                },
            })
        );
        let mut vars = FEDERATION.to_vec();
        vars.extend([
            (
                "OCI_WORKLOAD_IDENTITY_USE_INSTANCE_PRINCIPAL_FOR_TOKEN_EXCHANGE",
                "true",
            ),
            ("OCI_WORKLOAD_IDENTITY_REQUESTED_TOKEN_TYPE", "upst"),
        ]);
        let config = load(&vars).unwrap();
        let auth::WorkloadMechanism::Federation(federation) = config.auth.workload.mechanism()
        else {
            panic!("not federation");
        };
        assert_eq!(federation.client, auth::ClientAuth::InstancePrincipal);
        assert_eq!(federation.token_type, auth::TokenType::Upst);
        // The default is OKE, whatever else is set.
        assert_eq!(
            load(&[]).unwrap().auth.workload.mechanism(),
            auth::WorkloadMechanism::Oke
        );
    }

    #[test]
    fn the_refusal_memory_and_the_namespace_pace_reach_the_principals() {
        let defaults =
            crate::wiring::principals_config(&load(&[]).unwrap(), regions::Regions::default());
        assert_eq!(defaults.refusal_memory, auth::DEFAULT_REFUSAL_MEMORY);
        assert_eq!(defaults.namespace_exchanges_per_minute, 120);
        assert_eq!(defaults.namespace_exchange_burst, 20);
        let config = load(&[
            ("OCI_PROVIDER_AUTH__WORKLOAD__REFUSAL_MEMORY_SECONDS", "0"),
            (
                "OCI_PROVIDER_AUTH__WORKLOAD__NAMESPACE_EXCHANGES_PER_MINUTE",
                "30",
            ),
            ("OCI_PROVIDER_AUTH__WORKLOAD__NAMESPACE_EXCHANGE_BURST", "5"),
        ])
        .unwrap();
        let principals = crate::wiring::principals_config(&config, regions::Regions::default());
        assert_eq!(principals.refusal_memory, std::time::Duration::ZERO);
        assert_eq!(principals.namespace_exchanges_per_minute, 30);
        assert_eq!(principals.namespace_exchange_burst, 5);
    }

    #[test]
    fn federation_settings_that_cannot_work_fail_at_start_naming_what_to_set() {
        let client = [
            ("OCI_WORKLOAD_IDENTITY_CLIENT_ID", "runtime"),
            (
                "OCI_PROVIDER_AUTH__WORKLOAD__FEDERATION__CLIENT_SECRET_FILE",
                "/s",
            ),
        ];
        let without = |name: &str| -> Vec<(&str, &str)> {
            FEDERATION
                .iter()
                .chain(client.iter())
                .filter(|(k, _)| *k != name)
                .copied()
                .collect()
        };
        let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
            FEDERATION
                .iter()
                .chain(client.iter())
                .chain(extra.iter())
                .copied()
                .collect()
        };
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (without("OCI_RESOURCE_PRINCIPAL_REGION"), "needs region"),
            (
                without("OCI_PROVIDER_AUTH__WORKLOAD_AUDIENCE"),
                "needs auth.workload_audience",
            ),
            (
                without("OCI_WORKLOAD_IDENTITY_DOMAIN_URL"),
                "needs auth.workload.federation.domain_url",
            ),
            (
                without("OCI_WORKLOAD_IDENTITY_CLIENT_ID"),
                "needs client_id (OCI_WORKLOAD_IDENTITY_CLIENT_ID)",
            ),
            (
                without("OCI_PROVIDER_AUTH__WORKLOAD__FEDERATION__CLIENT_SECRET_FILE"),
                "client_id needs its secret",
            ),
            (
                with(&[(
                    "OCI_WORKLOAD_IDENTITY_USE_INSTANCE_PRINCIPAL_FOR_TOKEN_EXCHANGE",
                    "true",
                )]),
                "remove client_id and the client secret",
            ),
            (
                with(&[(
                    "OCI_WORKLOAD_IDENTITY_REQUESTED_TOKEN_TYPE",
                    "urn:oci:token-type:oci-rpst",
                )]),
                "RPST needs resource_type",
            ),
            (
                with(&[("OCI_WORKLOAD_IDENTITY_RESOURCE_TYPE", "k8sworkload")]),
                "resource_type is for RPSTs only",
            ),
            (
                with(&[(
                    "OCI_WORKLOAD_IDENTITY_DOMAIN_URL",
                    "https://idcs-0123.identity.oraclecloud.com/oauth2/v1/token",
                )]),
                "without a path",
            ),
            (
                with(&[("OCI_WORKLOAD_IDENTITY_DOMAIN_URL", "http://idcs.example")]),
                "https://",
            ),
            (
                with(&[("OCI_WORKLOAD_IDENTITY_CLIENT_SECRET", "s3cret")]),
                "OCI_WORKLOAD_IDENTITY_CLIENT_SECRET is set: the client secret is not read",
            ),
            (
                with(&[("OCI_WORKLOAD_IDENTITY_TOKEN_PATH", "/var/run/token")]),
                "each mount's token is its own pod's",
            ),
            (
                with(&[("OCI_PROVIDER_AUTH__WORKLOAD__MECHANISM", "oke")]),
                "mechanism is \"oke\"",
            ),
            (
                with(&[("OCI_PROVIDER_AUTH__WORKLOAD__MECHANISM", "kerberos")]),
                "auth.workload.mechanism",
            ),
            (
                with(&[("OCI_PROVIDER_AUTH__WORKLOAD__NAMESPACE_EXCHANGE_BURST", "0")]),
                "namespace_exchange_burst are at least 1",
            ),
        ];
        for (vars, fragment) in cases {
            let error = load(&vars).unwrap_err();
            assert!(error.contains(fragment), "{fragment:?} not in {error}");
            assert!(!error.contains("s3cret"), "{error}");
        }
    }
}
