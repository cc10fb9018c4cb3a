//! What a node configures for workload identity federation, in the vocabulary OCI's own
//! implementations use (the cloud-controller-manager's `OCI_WORKLOAD_IDENTITY_*`, the
//! Terraform provider's `token_exchange_*`).

use std::path::PathBuf;

/// Which mechanism serves `authType: workload` on this node. A class says only "the pod's
/// own service-account identity"; the node says how that identity becomes an OCI session,
/// so one class mounts the same secrets on OKE and on any other cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum WorkloadMechanism {
    /// OKE workload identity: the proxymux of the cluster's control plane answers an RPST.
    #[default]
    Oke,
    /// Workload identity federation: an OCI identity domain that trusts the cluster's
    /// service-account issuer exchanges the pod's token (RFC 8693) for a session token.
    Federation(FederationConfig),
}

impl WorkloadMechanism {
    /// The kind of session token it answers, as the metrics' `kind` label says it: `rpst`
    /// (OKE, or an identity domain asked for RPSTs) or `upst`.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkloadMechanism::Oke => "rpst",
            WorkloadMechanism::Federation(config) => config.token_type.label(),
        }
    }
}

/// The identity domain and how the provider authenticates to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FederationConfig {
    /// The identity domain's base URL, no path: `https://idcs-<id>.identity.oraclecloud.com`
    /// (`OCI_WORKLOAD_IDENTITY_DOMAIN_URL`); the exchange is `POST {domain_url}/oauth2/v1/token`.
    pub domain_url: String,
    /// How the provider authenticates its exchange requests.
    pub client: ClientAuth,
    /// What it asks for (`OCI_WORKLOAD_IDENTITY_REQUESTED_TOKEN_TYPE`).
    pub token_type: TokenType,
}

/// How the exchange request is authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// The confidential application's id and secret, as HTTP Basic
    /// (`OCI_WORKLOAD_IDENTITY_CLIENT_ID`, the secret from a file or a Kubernetes Secret).
    Secret {
        /// The confidential application's client id.
        client_id: String,
        /// Where its secret is read.
        secret: ClientSecret,
    },
    /// The request signed by the node's instance principal, no Basic header (nodes on OCI
    /// compute; `OCI_WORKLOAD_IDENTITY_USE_INSTANCE_PRINCIPAL_FOR_TOKEN_EXCHANGE`).
    InstancePrincipal,
}

/// Where the confidential application's secret is read, at every exchange (a rotated
/// secret is used from the next exchange on). Always a place the node's operator chose,
/// never one a SecretProviderClass names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientSecret {
    /// A file (a mounted Secret volume); surrounding whitespace is trimmed.
    File(PathBuf),
    /// A member of a Kubernetes Secret in the provider's own namespace, read through the
    /// API with the provider's service account.
    KubernetesSecret {
        /// The provider's namespace.
        namespace: String,
        /// The Secret.
        name: String,
        /// Its data member holding the client secret.
        key: String,
    },
}

/// The session token asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TokenType {
    /// A user principal session token of the service user the trust maps the service
    /// account to (`urn:oci:token-type:oci-upst`).
    #[default]
    Upst,
    /// A resource principal session token of the service account itself
    /// (`urn:oci:token-type:oci-rpst`), for the trust's `impersonatingResource`.
    Rpst {
        /// `res_type` (`OCI_WORKLOAD_IDENTITY_RESOURCE_TYPE`), e.g. `k8sworkload`.
        resource_type: String,
    },
}

impl TokenType {
    /// The `requested_token_type` URN.
    pub fn urn(&self) -> &'static str {
        match self {
            TokenType::Upst => "urn:oci:token-type:oci-upst",
            TokenType::Rpst { .. } => "urn:oci:token-type:oci-rpst",
        }
    }

    /// `upst` or `rpst`.
    pub fn label(&self) -> &'static str {
        match self {
            TokenType::Upst => "upst",
            TokenType::Rpst { .. } => "rpst",
        }
    }
}
