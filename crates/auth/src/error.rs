use crate::{Identity, KeyError};
use regions::RegionError;

/// A boxed error, as tower layers pass them around.
pub use tower::BoxError;

/// What kind of failure an [`AuthError`] is, so the provider can map it to a gRPC code
/// without knowing every variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input or configuration: a malformed user Secret, region or setting.
    InvalidArgument,
    /// Something named by the request does not exist (a Kubernetes Secret, a service
    /// account).
    NotFound,
    /// The provider's own service account may not do what was asked (Kubernetes 403).
    PermissionDenied,
    /// A credential was refused or is invalid (a 401 from OCI, the proxymux or
    /// federation; an invalid service-account token).
    Unauthenticated,
    /// An endpoint throttled the request (HTTP 429) until the retries or the deadline ran
    /// out.
    ResourceExhausted,
    /// An endpoint is unreachable or answered with a server error (5xx, 409).
    Unavailable,
    /// The mount's deadline passed.
    DeadlineExceeded,
    /// A bug or an unexpected state.
    Internal,
}

impl ErrorKind {
    /// The one classification of transport failures below the gRPC edge (auth's remote
    /// calls and the Secrets and Certificates APIs alike): a refused connection or a broken
    /// exchange is Unavailable, a timeout DeadlineExceeded, and a request that cannot be
    /// built or an answer over the size this provider accepts (`upstream.max_response_bytes`,
    /// `upstream.max_bundle_bytes`) Internal: retrying or failing over would get the same.
    pub fn from_transport(kind: transport::ErrorKind) -> Self {
        match kind {
            transport::ErrorKind::Connect | transport::ErrorKind::Io => ErrorKind::Unavailable,
            transport::ErrorKind::Timeout => ErrorKind::DeadlineExceeded,
            transport::ErrorKind::Request | transport::ErrorKind::TooLarge => ErrorKind::Internal,
        }
    }

    /// The one classification of HTTP error statuses below the gRPC edge (auth's remote
    /// calls and the Secrets API alike): 400/422 InvalidArgument, 401 Unauthenticated,
    /// 403 PermissionDenied, 404 NotFound, 429 ResourceExhausted, 409 and 5xx Unavailable,
    /// anything else Internal (an answer this client does not expect is a bug to report).
    pub fn from_http_status(status: u16) -> Self {
        match status {
            400 | 422 => ErrorKind::InvalidArgument,
            401 => ErrorKind::Unauthenticated,
            403 => ErrorKind::PermissionDenied,
            404 => ErrorKind::NotFound,
            429 => ErrorKind::ResourceExhausted,
            409 | 500..=599 => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        }
    }
}

/// A remote endpoint auth talks to, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// The Kubernetes API (TokenRequest, Secret reads).
    Kubernetes,
    /// The OKE proxymux (RPST exchange).
    Proxymux,
    /// Instance metadata.
    InstanceMetadata,
    /// OCI x509 federation.
    Federation,
    /// An OCI identity domain's token exchange (workload identity federation).
    IdentityDomain,
    /// The OCI Secrets API.
    Secrets,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Endpoint::Kubernetes => "the kubernetes api",
            Endpoint::Proxymux => "the proxymux",
            Endpoint::InstanceMetadata => "instance metadata",
            Endpoint::Federation => "oci x509 federation",
            Endpoint::IdentityDomain => "the oci identity domain",
            Endpoint::Secrets => "the oci secrets api",
        })
    }
}

/// What is wrong with a user principal's Kubernetes Secret (spec 5.1).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UserSecretError {
    /// `data.config` is missing or empty.
    #[error("auth config data is empty")]
    EmptyConfig,
    /// `config` is not YAML with an `auth` mapping of scalar strings.
    #[error("invalid auth config data: {0}")]
    InvalidConfig(String),
    /// `data.private-key` is missing or empty.
    #[error("invalid user auth config data: the private-key is empty")]
    EmptyPrivateKey,
    /// Required members of `auth` are missing, in the Go provider's wording.
    #[error("missing auth config data: [{}]", .0.join(", "))]
    Missing(Vec<&'static str>),
    /// `auth.region` is invalid.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// The private key cannot be loaded (wrong passphrase, unsupported form, ...). Shared:
    /// the same failure answers the mounts of this Secret version for the TTL.
    #[error("cannot load the private key")]
    Key(#[source] std::sync::Arc<KeyError>),
    /// A data value is not Base64.
    #[error("data member {} is not base64", bounded::quote(.0))]
    NotBase64(String),
    /// A member of `auth` is not of its form; its value is not echoed (it may be anything),
    /// only its length.
    #[error("auth.{member} is not {expected} (it has {len} characters)")]
    InvalidMember {
        /// The member.
        member: &'static str,
        /// What it must be.
        expected: &'static str,
        /// Its length.
        len: usize,
    },
}

/// Why a request could not be signed, or an identity not established.
///
/// Messages name identities, endpoints and headers, never key ids that hold a security
/// token, tokens, private keys or passphrases.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The request has no [`crate::Session`] in its extensions, so there is no key to sign
    /// with.
    #[error("the request carries no established session to sign it with")]
    MissingSession,
    /// Neither the URI nor a `Host` header says which host the request goes to, and the
    /// signature must cover it.
    #[error(
        "the request has no host to sign: its URI has no authority and there is no Host header"
    )]
    MissingHost,
    /// The key id cannot be put in a header (control characters or non-ASCII).
    #[error("the key id for {identity} is not a valid header value")]
    InvalidKeyId {
        /// Whose key id it is.
        identity: Identity,
    },
    /// Signing failed inside the crypto library.
    #[error("cannot sign the request")]
    Sign(#[source] KeyError),
    /// OCI refused a session's credential and it cannot be renewed within the request.
    #[error("cannot renew the credentials of the {identity}: {reason}")]
    CannotRenew {
        /// Whose credentials.
        identity: Identity,
        /// Why.
        reason: &'static str,
    },
    /// OCI answered 401 to a signed request (after one retry with a fresh security token).
    #[error("oci refused the credentials of the {identity} (http 401{}){}",
        code.as_deref().map(|c| format!(", {c}")).unwrap_or_default(),
        hint.as_deref().map(|h| format!(": {h}")).unwrap_or_default())]
    Unauthorized {
        /// Whose credentials were refused.
        identity: Identity,
        /// OCI's error code, e.g. `NotAuthenticated`.
        code: Option<String>,
        /// A likely cause, e.g. a configured fingerprint that differs from the key's.
        hint: Option<String>,
    },
    /// OCI answered 401 to a credential the principal renewed moments ago: it is not
    /// renewed again within the principal's cool-down (one renewal per cool-down, however
    /// many requests are refused), so this request fails.
    #[error("oci refused the credentials of the {identity} (http 401{}), renewed {ago_secs}s \
        ago after a 401: they are renewed at most once every {cool_down_secs}s, so the mount \
        fails until then",
        code.as_deref().map(|c| format!(", {c}")).unwrap_or_default())]
    RenewedMomentsAgo {
        /// Whose credentials were refused.
        identity: Identity,
        /// OCI's error code, e.g. `NotAuthenticated`.
        code: Option<String>,
        /// Seconds since the last renewal.
        ago_secs: u64,
        /// The cool-down between two renewals after a 401, in seconds.
        cool_down_secs: u64,
    },
    /// OCI answered 401 in a region other than the principal's own: the credential is kept
    /// for the requests of every other mount, and this request fails.
    #[error("oci refused the credentials of the {identity} in region {} (http 401{}); they \
        were established in region {}, where they are kept: is the tenancy subscribed to {}?",
        regions.0, code.as_deref().map(|c| format!(", {c}")).unwrap_or_default(), regions.1,
        regions.0)]
    RefusedInRegion {
        /// Whose credentials were refused.
        identity: Identity,
        /// OCI's error code, e.g. `NotAuthenticated`.
        code: Option<String>,
        /// The region the refused request went to, and the principal's own.
        regions: Box<(regions::Region, regions::Region)>,
    },
    /// The provider configuration is unusable.
    #[error("invalid auth configuration: {0}")]
    Config(String),
    /// A region is invalid, or the region metadata is.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// The mount request lacks something this principal needs (namespace, service
    /// account, ...).
    #[error("the mount request has no {0}")]
    MissingRequestField(&'static str),
    /// The user principal's Kubernetes Secret does not exist.
    #[error("error retrieving secret: {name} (namespace {namespace}): not found")]
    UserSecretNotFound {
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
    },
    /// The user principal's Kubernetes Secret is malformed.
    #[error("user principal secret {namespace}/{name}: {problem}")]
    UserSecret {
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// What is wrong: a detail of this error, rendered in its message (so not its
        /// `source()`).
        problem: UserSecretError,
    },
    /// The pod's service-account token is locally invalid (spec 3.3), so it was not sent.
    #[error("error validating service account token of {namespace}/{service_account}: {reason}")]
    InvalidServiceAccountToken {
        /// Namespace.
        namespace: String,
        /// Service account.
        service_account: String,
        /// What is wrong (never the token).
        reason: &'static str,
    },
    /// The cluster's service-account issuer keys could not be read, so the token a mount
    /// supplied cannot be verified; it is not served unverified.
    #[error("{}", issuer_keys_message(namespace, service_account, source.kind()))]
    IssuerKeys {
        /// Namespace.
        namespace: String,
        /// Service account.
        service_account: String,
        /// Why the keys could not be read (the Kubernetes API's answer, or the transport's).
        #[source]
        source: Box<AuthError>,
    },
    /// No service-account token for the workload audience was supplied, and the provider
    /// may not request one (TokenRequest disabled, or a caller whose mounts are for no pod).
    #[error("{}", no_token_message(namespace, service_account, audience, *caller, sent, *token_requests))]
    NoServiceAccountToken {
        /// Namespace.
        namespace: String,
        /// Service account.
        service_account: String,
        /// The configured audience.
        audience: String,
        /// Who sent the mount.
        caller: crate::Caller,
        /// The audiences the caller did send tokens for (names only).
        sent: Vec<String>,
        /// Whether `auth.token_request` is on (then the mount named no pod to bind to).
        token_requests: bool,
    },
    /// The provider's own service account may not read the user principal's Secret.
    #[error("{}", secret_forbidden_message(namespace, name, *caller))]
    SecretForbidden {
        /// Namespace.
        namespace: String,
        /// The Secret's name (`authSecretName`).
        name: String,
        /// Who sent the mount.
        caller: crate::Caller,
    },
    /// An endpoint answered with an error status.
    #[error("{endpoint} answered http {status} to {operation}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Status {
        /// Which endpoint.
        endpoint: Endpoint,
        /// What was asked, e.g. `the token request for ns/sa`.
        operation: String,
        /// The HTTP status.
        status: u16,
        /// The server's reason or error code (never a credential).
        detail: Option<String>,
    },
    /// An endpoint answered 2xx with a body we cannot use.
    #[error("{endpoint} answered {operation} with an unusable response: {reason}")]
    MalformedResponse {
        /// Which endpoint.
        endpoint: Endpoint,
        /// What was asked.
        operation: String,
        /// What is wrong (positions and member names only, never values).
        reason: String,
    },
    /// The exchange with an endpoint failed (connect, I/O, timeout).
    #[error("cannot reach {endpoint} for {operation}")]
    Transport {
        /// Which endpoint.
        endpoint: Endpoint,
        /// What was asked.
        operation: String,
        /// The transport's error.
        #[source]
        source: transport::TransportError,
    },
    /// The provider's own service-account token file cannot be read.
    #[error("cannot read the provider's service-account token file {path}")]
    TokenFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The identity domain answered a token exchange other than with a session token.
    #[error("{}", exchange_message(namespace, service_account, *status, error.as_deref(), description.as_deref()))]
    TokenExchange {
        /// Namespace.
        namespace: String,
        /// Service account.
        service_account: String,
        /// The HTTP status.
        status: u16,
        /// The OAuth `error` (RFC 6749 5.2; `invalid_grant`, `invalid_client`, ...) or OCI
        /// `code` of the body, when it is a short identifier.
        error: Option<String>,
        /// Its `error_description`, quoted, when short and repeating nothing that was sent.
        description: Option<String>,
    },
    /// The identity domain's client secret cannot be read.
    #[error(
        "cannot read the client secret of the identity domain's confidential application \
        from {place} (auth.workload.federation): {problem}"
    )]
    ClientSecret {
        /// The file or Secret member.
        place: String,
        /// What is wrong (never the content).
        problem: String,
    },
    /// The instance leaf certificate is not usable.
    #[error("the instance certificate from instance metadata is unusable: {0}")]
    InstanceCertificate(&'static str),
    /// A session key could not be generated, or a key not loaded.
    #[error("cannot create a session key")]
    SessionKey(#[source] KeyError),
    /// An unexpected internal failure (a background task died).
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// The mount's deadline passed while establishing its identity.
    #[error("the deadline passed while {0}")]
    DeadlineExceeded(&'static str),
    /// Other private keys were being loaded for longer than the wait allows.
    #[error(
        "too many private keys are being loaded on this node: the key of a user principal in \
         namespace {namespace} waited {waited:?} for its turn; the driver will retry"
    )]
    KeyLoadsBusy {
        /// The namespace whose key waited.
        namespace: String,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// The identity domain or the proxymux definitely refused this service account's
    /// exchange moments ago: the refusal is answered again, without a TokenRequest, a key or
    /// an exchange, until `auth.workload.refusal_memory_seconds` have passed.
    #[error(
        "{refusal} (this refusal is remembered: the service account's exchange is tried again \
         in {retry_in_secs}s, auth.workload.refusal_memory_seconds)"
    )]
    RefusalRemembered {
        /// The refusal as it was answered (names, status, error code; never a token): a
        /// detail of this error, rendered in its message (so not its `source()`).
        refusal: std::sync::Arc<AuthError>,
        /// Seconds until the next mount of the service account is exchanged again.
        retry_in_secs: u64,
    },
    /// The namespace's exchanges are past their pace, and its next turn comes after the
    /// mount's deadline.
    #[error("{}", paced_message(namespace, *wait, *per_minute, *burst))]
    ExchangesPaced {
        /// The namespace.
        namespace: String,
        /// How long until its next turn.
        wait: std::time::Duration,
        /// `auth.workload.namespace_exchanges_per_minute`.
        per_minute: u32,
        /// `auth.workload.namespace_exchange_burst`.
        burst: u32,
    },
    /// The error of a credential fetch this call led or joined (one fetch per identity,
    /// its error handed to every mount that waited for it).
    #[error(transparent)]
    Shared(std::sync::Arc<AuthError>),
}

impl cache::JoinError for AuthError {
    fn from_shared(shared: std::sync::Arc<Self>) -> Self {
        AuthError::Shared(shared)
    }

    fn waited_too_long(what: &'static str) -> Self {
        AuthError::DeadlineExceeded(what)
    }

    /// The leader's deadline ran out, or its namespace's next turn comes after it: a waiter
    /// with a later deadline tries again.
    fn is_leaders_own(&self) -> bool {
        match self {
            AuthError::ExchangesPaced { .. } => true,
            AuthError::Shared(shared) => shared.is_leaders_own(),
            _ => self.kind() == ErrorKind::DeadlineExceeded,
        }
    }
}

impl AuthError {
    /// The kind of failure, for mapping to gRPC codes.
    pub fn kind(&self) -> ErrorKind {
        match self {
            AuthError::MissingSession
            | AuthError::MissingHost
            | AuthError::InvalidKeyId { .. }
            | AuthError::Sign(_)
            | AuthError::SessionKey(_)
            | AuthError::Internal(_) => ErrorKind::Internal,
            AuthError::Unauthorized { .. }
            | AuthError::RenewedMomentsAgo { .. }
            | AuthError::RefusedInRegion { .. }
            | AuthError::CannotRenew { .. }
            | AuthError::InvalidServiceAccountToken { .. }
            | AuthError::NoServiceAccountToken { .. } => ErrorKind::Unauthenticated,
            AuthError::SecretForbidden { .. } => ErrorKind::PermissionDenied,
            AuthError::Config(_)
            | AuthError::Region(_)
            | AuthError::MissingRequestField(_)
            | AuthError::UserSecret { .. } => ErrorKind::InvalidArgument,
            AuthError::UserSecretNotFound { .. } => ErrorKind::NotFound,
            AuthError::Status { status, .. } => ErrorKind::from_http_status(*status),
            // The identity could not be established: the driver retries, the operator reads
            // what to fix; throttling and failures of the domain are what they are.
            AuthError::TokenExchange { status, .. } => match ErrorKind::from_http_status(*status) {
                kind @ (ErrorKind::ResourceExhausted | ErrorKind::Unavailable) => kind,
                _ => ErrorKind::Unauthenticated,
            },
            AuthError::ClientSecret { .. } => ErrorKind::Unavailable,
            AuthError::MalformedResponse { .. }
            | AuthError::TokenFile { .. }
            | AuthError::InstanceCertificate(_) => ErrorKind::Unavailable,
            AuthError::Transport { source, .. } => ErrorKind::from_transport(source.kind()),
            AuthError::DeadlineExceeded(_) => ErrorKind::DeadlineExceeded,
            AuthError::KeyLoadsBusy { .. } => ErrorKind::Unavailable,
            AuthError::Shared(shared) => shared.kind(),
            AuthError::RefusalRemembered { refusal, .. } => refusal.kind(),
            AuthError::ExchangesPaced { .. } => ErrorKind::ResourceExhausted,
            // The tenant's token is not at fault: what failed is the provider's reading of
            // the cluster's keys (its RBAC, the API server, its configuration).
            AuthError::IssuerKeys { source, .. } => match source.kind() {
                kind @ (ErrorKind::PermissionDenied
                | ErrorKind::DeadlineExceeded
                | ErrorKind::InvalidArgument) => kind,
                _ => ErrorKind::Unavailable,
            },
        }
    }
}

fn no_token_message(
    namespace: &str,
    service_account: &str,
    audience: &str,
    caller: crate::Caller,
    sent: &[String],
    token_requests: bool,
) -> String {
    let sent = if sent.is_empty() {
        String::new()
    } else {
        format!(" (it sent tokens for {sent:?} only)")
    };
    match caller {
        crate::Caller::Driver if token_requests => format!(
            "no service-account token for audience {audience:?} was supplied by the driver for \
             {namespace}/{service_account}{sent}, and the mount names no pod a requested token \
             could be bound to (csi.storage.k8s.io/pod.name and pod.uid; is podInfoOnMount \
             enabled on the CSIDriver?)"
        ),
        crate::Caller::Driver => format!(
            "no service-account token for audience {audience:?} was supplied by the driver for \
             {namespace}/{service_account}{sent} and token requests are disabled"
        ),
        // The controller asks only for named audiences: "" (the API server's default) is
        // what it cannot send.
        crate::Caller::SyncController if audience.is_empty() => format!(
            "the secrets-store-sync-controller sent no service-account token for \
             {namespace}/{service_account}{sent}, and it cannot send one for this provider's \
             audience, the API server's default (auth.workload_audience is empty): set \
             auth.workload_audience of this sidecar to an audience your API server accepts \
             (without --api-audiences, its service-account issuer) and start the controller \
             with --token-request-audience set to the same (its chart's tokenRequestAudience)"
        ),
        crate::Caller::SyncController => format!(
            "the secrets-store-sync-controller sent no service-account token for audience \
             {audience:?} for {namespace}/{service_account}{sent}: start it with \
             --token-request-audience={audience} (its chart's tokenRequestAudience); the \
             provider does not request tokens for the controller, which mounts for no pod"
        ),
    }
}

/// What an identity domain's answer to a token exchange means, and what to fix: by its
/// OAuth `error` (what the emulator answers, `ARCHITECTURE.md`), else by its status.
fn exchange_message(
    namespace: &str,
    service_account: &str,
    status: u16,
    error: Option<&str>,
    description: Option<&str>,
) -> String {
    const SETTINGS: &str = "auth.workload.federation";
    let advice = match (error, status) {
        (Some("invalid_client"), _) => format!(
            "the domain did not accept the provider's client authentication: check \
             {SETTINGS}.client_id and its client secret (the confidential application must be \
             activated, allow the client credentials grant and be listed in the identity \
             propagation trust's oauthClients); with use_instance_principal, the node must be \
             in a dynamic group the domain lets exchange tokens"
        ),
        (Some("invalid_grant"), _) => format!(
            "the domain did not accept the service-account token for its identity propagation \
             trust: the trust must be active, its issuer the cluster's service-account issuer \
             (kubectl get --raw /.well-known/openid-configuration), its publicKeyEndpoint or \
             publicCertificate the cluster's current keys (copy a publicCertificate again \
             after a key rotation), its clientClaimValues hold auth.workload_audience, and an \
             impersonation rule match sub system:serviceaccount:{namespace}:{service_account} \
             (UPST) or its impersonatingResource be {SETTINGS}.resource_type (RPST)"
        ),
        (Some("unauthorized_client"), _) => "the confidential application may not use the \
             token exchange grant: allow it in the application's OAuth configuration"
            .to_owned(),
        (Some("unsupported_grant_type"), _) => format!(
            "the endpoint does not do RFC 8693 token exchange: is {SETTINGS}.domain_url the \
             identity domain's URL (https://idcs-<id>.identity.oraclecloud.com)?"
        ),
        (Some("invalid_request"), _) => format!(
            "the domain found the request malformed: an RPST needs {SETTINGS}.resource_type \
             (res_type); report it if that is set"
        ),
        (_, 404) => format!(
            "there is no token endpoint at {SETTINGS}.domain_url: it is the domain's base URL, \
             without a path"
        ),
        (_, 429) => "the domain throttled the exchange; the driver retries the mount".to_owned(),
        (_, 500..=599) => "the domain failed on every attempt within the mount's deadline; \
             the driver retries the mount"
            .to_owned(),
        _ => "an answer this provider does not expect".to_owned(),
    };
    let code = match (error, description) {
        (Some(e), Some(d)) => format!(", {e}: {d}"),
        (Some(e), None) => format!(", {e}"),
        (None, Some(d)) => format!(": {d}"),
        (None, None) => String::new(),
    };
    format!(
        "the oci identity domain refused the token exchange of service account \
         {namespace}/{service_account} (http {status}{code}): {advice}"
    )
}

fn paced_message(
    namespace: &str,
    wait: std::time::Duration,
    per_minute: u32,
    burst: u32,
) -> String {
    format!(
        "the token exchanges of namespace {} are past their pace ({per_minute} a minute after \
         a burst of {burst}: auth.workload.namespace_exchanges_per_minute and \
         namespace_exchange_burst): its next turn is in {} ms, after the mount's deadline; the \
         driver retries",
        bounded::quote(namespace),
        wait.as_millis()
    )
}

fn issuer_keys_message(namespace: &str, service_account: &str, kind: ErrorKind) -> String {
    use crate::oidc::{DISCOVERY_PATH, JWKS_PATH};
    let grant = match kind {
        ErrorKind::PermissionDenied | ErrorKind::NotFound => format!(
            ": grant the provider's service account the ClusterRole \
             system:service-account-issuer-discovery, or a ClusterRole rule for nonResourceURLs \
             [\"{DISCOVERY_PATH}\", \"{JWKS_PATH}\"] with verb get"
        ),
        _ => String::new(),
    };
    format!(
        "cannot verify the service-account token supplied for {namespace}/{service_account}: \
         the cluster's service-account issuer keys (GET {DISCOVERY_PATH} and {JWKS_PATH} on the \
         kubernetes api) cannot be read, and a supplied token is not served unverified{grant}"
    )
}

fn secret_forbidden_message(namespace: &str, name: &str, caller: crate::Caller) -> String {
    match caller {
        crate::Caller::Driver => format!(
            "the provider's service account may not get Secret {namespace}/{name} \
             (Kubernetes 403): grant it get on Secrets in {namespace}"
        ),
        crate::Caller::SyncController => format!(
            "the provider may not get Secret {namespace}/{name} (Kubernetes 403): as the \
             secrets-store-sync-controller's sidecar it runs as the controller's service \
             account, which may create and patch Secrets but not get them; bind it a Role with \
             get on this Secret in {namespace}, or use authType workload or instance"
        ),
    }
}

#[cfg(test)]
mod status_tests {
    use super::ErrorKind;

    #[test]
    fn one_classification_of_http_statuses() {
        for (status, kind) in [
            (400, ErrorKind::InvalidArgument),
            (422, ErrorKind::InvalidArgument),
            (401, ErrorKind::Unauthenticated),
            (403, ErrorKind::PermissionDenied),
            (404, ErrorKind::NotFound),
            (429, ErrorKind::ResourceExhausted),
            (409, ErrorKind::Unavailable),
            (500, ErrorKind::Unavailable),
            (503, ErrorKind::Unavailable),
            (599, ErrorKind::Unavailable),
            (405, ErrorKind::Internal),
            (302, ErrorKind::Internal),
            (200, ErrorKind::Internal),
        ] {
            assert_eq!(ErrorKind::from_http_status(status), kind, "{status}");
        }
    }
}
