//! The Kubernetes API calls auth needs (TokenRequest, reading a Secret, and the
//! service-account issuer's discovery document and keys), made directly over the one
//! transport; see ARCHITECTURE.md for why not kube-rs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, StatusCode};
use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;
use transport::HttpService;
use zeroize::Zeroizing;

use crate::error::{AuthError, Endpoint};
use crate::remote::{build, error_detail, segment, send};

/// Where the provider's own bearer token comes from.
#[derive(Clone)]
enum Bearer {
    /// Re-read on every call: projected tokens rotate.
    File(PathBuf),
    /// Inline in an explicit kubeconfig.
    Inline(SecretString),
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bearer::File(path) => f.debug_tuple("File").field(path).finish(),
            Bearer::Inline(_) => f.write_str("Inline(<redacted>)"),
        }
    }
}

/// A Kubernetes API client for TokenRequest and Secret reads.
#[derive(Clone, Debug)]
pub(crate) struct KubeApi {
    http: HttpService,
    base: String,
    bearer: Bearer,
}

/// The subset of a kubeconfig we read (explicit path only).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
struct Kubeconfig {
    clusters: Vec<Named<Cluster>>,
    users: Vec<Named<User>>,
    contexts: Vec<Named<Context>>,
    current_context: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Cluster {
    server: String,
    #[serde(rename = "certificate-authority")]
    certificate_authority: Option<PathBuf>,
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct User {
    token: Option<String>,
    token_file: Option<PathBuf>,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .finish()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Context {
    cluster: String,
    user: String,
}

impl KubeApi {
    /// From the explicit settings: `api` (base URL) or the in-cluster service host/port,
    /// or an explicit kubeconfig; the bearer from the kubeconfig user or `token_file`.
    pub(crate) fn new(
        http: HttpService,
        api: Option<&str>,
        service_host: Option<&str>,
        service_port: Option<u16>,
        kubeconfig: Option<&Path>,
        token_file: &Path,
    ) -> Result<Option<Self>, AuthError> {
        let mut bearer = Bearer::File(token_file.to_owned());
        if let Some(path) = kubeconfig {
            let (_, _, user) = read_kubeconfig(path)?;
            if let Some(token) = user.token.filter(|t| !t.is_empty()) {
                bearer = Bearer::Inline(SecretString::from(token));
            } else if let Some(file) = user.token_file {
                bearer = Bearer::File(file);
            }
        }
        let target = target(api, service_host, service_port, kubeconfig)?;
        Ok(target.map(|(base, _)| Self { http, base, bearer }))
    }

    fn bearer(&self) -> Result<HeaderValue, AuthError> {
        let token = match &self.bearer {
            Bearer::Inline(token) => Zeroizing::new(token.expose_secret().to_owned()),
            Bearer::File(path) => {
                Zeroizing::new(std::fs::read_to_string(path).map_err(|source| {
                    AuthError::TokenFile {
                        path: path.display().to_string(),
                        source,
                    }
                })?)
            }
        };
        let value = Zeroizing::new(format!("Bearer {}", token.trim()));
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            AuthError::Config("the provider's bearer token is not a valid header".into())
        })?;
        value.set_sensitive(true);
        Ok(value)
    }

    /// Sends one request with the provider's bearer token; answers whatever status came.
    async fn call(
        &self,
        method: Method,
        uri: String,
        json_body: Option<String>,
        operation: &str,
        deadline: tokio::time::Instant,
    ) -> Result<http::Response<bytes::Bytes>, AuthError> {
        let request = self.request(method, uri, json_body)?;
        self.send(request, operation, deadline).await
    }

    /// The API's base URL, without a trailing `/`.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// Sends `request` (made by [`KubeApi::request`]) within `deadline`; any status.
    pub(crate) async fn send(
        &self,
        request: Request<bytes::Bytes>,
        operation: &str,
        deadline: tokio::time::Instant,
    ) -> Result<http::Response<bytes::Bytes>, AuthError> {
        send(
            &self.http,
            request,
            deadline,
            Endpoint::Kubernetes,
            operation,
        )
        .await
    }

    /// A request with the provider's bearer token, accepting JSON (and sending it, with
    /// `json_body`).
    pub(crate) fn request(
        &self,
        method: Method,
        uri: String,
        json_body: Option<String>,
    ) -> Result<Request<bytes::Bytes>, AuthError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(AUTHORIZATION, self.bearer()?)
            .header(ACCEPT, "application/json");
        let body = match json_body {
            Some(body) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                bytes::Bytes::from(body)
            }
            None => bytes::Bytes::new(),
        };
        build(builder, body)
    }

    /// `GET {path}` of the cluster's service-account issuer (`/.well-known/openid-configuration`
    /// or `/openid/v1/jwks`), with the provider's bearer token like every other call, the
    /// body read under `max_bytes` (and the transport's own limit). Any answer but 200 is an
    /// error naming the status. The discovery document's `jwks_uri` is not followed: it
    /// names the API server's external address, which a node need not reach or trust.
    pub(crate) async fn issuer_document(
        &self,
        path: &str,
        max_bytes: usize,
        deadline: tokio::time::Instant,
    ) -> Result<bytes::Bytes, AuthError> {
        let operation = format!("reading the service-account issuer's {path}");
        let mut request = self.request(Method::GET, format!("{}{path}", self.base), None)?;
        request
            .extensions_mut()
            .insert(transport::MaxBodyBytes(max_bytes));
        let response = send(
            &self.http,
            request,
            deadline,
            Endpoint::Kubernetes,
            &operation,
        )
        .await?;
        if response.status() != StatusCode::OK {
            return Err(status_error(operation, &response));
        }
        Ok(response.into_body())
    }

    /// `POST .../serviceaccounts/{sa}/token` (spec 3.6): a token for `audience` (`""`:
    /// the API server's default), always bound to the pod it is for: the provider mints no
    /// token a pod on this node does not hold.
    pub(crate) async fn token_request(
        &self,
        namespace: &str,
        service_account: &str,
        audience: &str,
        (pod_name, pod_uid): (&str, &str),
        expiration_seconds: u64,
        deadline: tokio::time::Instant,
    ) -> Result<SecretString, AuthError> {
        let operation =
            format!("the token request for service account {namespace}/{service_account}");
        let audiences: Vec<&str> = if audience.is_empty() {
            Vec::new()
        } else {
            vec![audience]
        };
        let spec = serde_json::json!({
            "audiences": audiences,
            "expirationSeconds": expiration_seconds,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod_name, "uid": pod_uid},
        });
        let body = serde_json::json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {},
            "spec": spec,
        });
        let uri = format!(
            "{}/api/v1/namespaces/{}/serviceaccounts/{}/token",
            self.base,
            segment(namespace),
            segment(service_account)
        );
        let response = self
            .call(
                Method::POST,
                uri,
                Some(body.to_string()),
                &operation,
                deadline,
            )
            .await?;
        let status = response.status();
        if status != StatusCode::CREATED && status != StatusCode::OK {
            return Err(status_error(operation, &response));
        }
        #[derive(Deserialize)]
        struct TokenRequest {
            status: TokenStatus,
        }
        #[derive(Deserialize)]
        struct TokenStatus {
            token: String,
        }
        let parsed: TokenRequest = parse(&response, operation)?;
        Ok(SecretString::from(parsed.status.token))
    }

    /// `GET .../secrets/{name}`: the members of its `data` a user principal reads
    /// ([`KEPT_MEMBERS`]), decoded (the others are skipped as they are read, never kept),
    /// and `resourceVersion`; `None` when the Secret does not exist.
    pub(crate) async fn secret(
        &self,
        namespace: &str,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Option<KubeSecret>, AuthError> {
        match self.get_secret(namespace, name, deadline).await? {
            Some(body) => secret_from_body(&body, namespace, name).map(Some),
            None => Ok(None),
        }
    }

    /// `GET .../secrets/{name}`: the body of a 200, `None` for a 404, else the error.
    async fn get_secret(
        &self,
        namespace: &str,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Option<bytes::Bytes>, AuthError> {
        let operation = format!("reading secret {namespace}/{name}");
        let uri = format!(
            "{}/api/v1/namespaces/{}/secrets/{}",
            self.base,
            segment(namespace),
            segment(name)
        );
        let response = self
            .call(Method::GET, uri, None, &operation, deadline)
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::OK => Ok(Some(response.into_body())),
            _ => Err(status_error(operation, &response)),
        }
    }

    /// One data member of a Secret of the operator's choosing (the identity domain's client
    /// secret, in the provider's own namespace), decoded; `None` when the Secret or the
    /// member does not exist. Its other members are read and dropped (wiped) at once.
    pub(crate) async fn secret_member(
        &self,
        namespace: &str,
        name: &str,
        member: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Zeroizing<Vec<u8>>>, AuthError> {
        #[derive(Deserialize)]
        struct Secret {
            #[serde(default)]
            data: BTreeMap<String, String>,
        }
        let Some(body) = self.get_secret(namespace, name, deadline).await? else {
            return Ok(None);
        };
        let parsed: Secret = parse_body(&body, format!("reading secret {namespace}/{name}"))?;
        // Each value moved into a buffer wiped when dropped, the wanted one decoded.
        let data: BTreeMap<String, Zeroizing<String>> = parsed
            .data
            .into_iter()
            .map(|(k, v)| (k, Zeroizing::new(v)))
            .collect();
        let Some(value) = data.get(member) else {
            return Ok(None);
        };
        STANDARD
            .decode(value.trim())
            .map(|bytes| Some(Zeroizing::new(bytes)))
            .map_err(|_| AuthError::ClientSecret {
                place: format!("member {member} of Secret {namespace}/{name}"),
                problem: "it is not base64".into(),
            })
    }
}

/// A Secret's JSON as the API server answers it, into the members a user principal reads,
/// decoded.
pub(crate) fn secret_from_body(
    body: &[u8],
    namespace: &str,
    name: &str,
) -> Result<KubeSecret, AuthError> {
    #[derive(Deserialize, Default)]
    struct Metadata {
        #[serde(rename = "resourceVersion", default)]
        resource_version: Option<String>,
    }
    #[derive(Deserialize)]
    struct Secret {
        #[serde(default)]
        metadata: Metadata,
        #[serde(default)]
        data: Members,
    }
    let parsed: Secret = parse_body(body, format!("reading secret {namespace}/{name}"))?;
    let mut data = BTreeMap::new();
    for (key, value) in parsed.data.0 {
        let bytes = STANDARD
            .decode(value.trim())
            .map_err(|_| AuthError::UserSecret {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                problem: crate::error::UserSecretError::NotBase64(key.clone()),
            })?;
        data.insert(key, Zeroizing::new(bytes));
    }
    Ok(KubeSecret {
        data,
        resource_version: parsed.metadata.resource_version,
    })
}

/// A Secret's `data` as read: every member's name, but only the value of the members the
/// provider uses (`config`, `private-key`); a tenant's other members are skipped unread.
#[derive(Default)]
struct Members(Vec<(String, Zeroizing<String>)>);

/// The members whose values are kept: a user principal's `config` and `private-key`.
const KEPT_MEMBERS: [&str; 2] = ["config", "private-key"];

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of base64 strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Members, A::Error> {
                let mut kept = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if KEPT_MEMBERS.contains(&key.as_str()) {
                        let value: String = map.next_value()?;
                        kept.push((key, Zeroizing::new(value)));
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(Members(kept))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// A Secret as read: its data and, when the API server says, its `resourceVersion`.
pub(crate) struct KubeSecret {
    pub(crate) data: BTreeMap<String, Zeroizing<Vec<u8>>>,
    pub(crate) resource_version: Option<String>,
}

/// A Kubernetes answer with an unexpected status; only its short `code`/`reason` is kept.
pub(crate) fn status_error(
    operation: String,
    response: &http::Response<bytes::Bytes>,
) -> AuthError {
    AuthError::Status {
        endpoint: Endpoint::Kubernetes,
        operation,
        status: response.status().as_u16(),
        detail: error_detail(response.body()),
    }
}

/// Decodes a JSON answer, reporting a failure by position only (bodies hold tokens and
/// Secret data).
fn parse<T: serde::de::DeserializeOwned>(
    response: &http::Response<bytes::Bytes>,
    operation: String,
) -> Result<T, AuthError> {
    parse_body(response.body(), operation)
}

/// Decodes a JSON body within its own length (the transport's limit bounds it already).
fn parse_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    operation: String,
) -> Result<T, AuthError> {
    let budget = bounded::ParseBudget::new(body.len());
    bounded::json::from_slice(body, &budget).map_err(|e| AuthError::MalformedResponse {
        endpoint: Endpoint::Kubernetes,
        operation,
        reason: e.to_string(),
    })
}

/// The API base URL (explicit, else the kubeconfig's server, else the in-cluster service
/// host and port) and the kubeconfig's CA file, if any.
pub(crate) fn target(
    api: Option<&str>,
    service_host: Option<&str>,
    service_port: Option<u16>,
    kubeconfig: Option<&Path>,
) -> Result<Option<(String, Option<PathBuf>)>, AuthError> {
    let mut base = api.map(str::to_owned);
    let mut ca = None;
    if let Some(path) = kubeconfig {
        let (server, certificate_authority, _) = read_kubeconfig(path)?;
        base = base.or(Some(server));
        ca = certificate_authority;
    }
    if base.is_none() {
        base = service_host.filter(|h| !h.is_empty()).map(|host| {
            format!(
                "https://{}:{}",
                crate::remote::url_host(host),
                service_port.unwrap_or(443)
            )
        });
    }
    Ok(base.map(|base| (base.trim_end_matches('/').to_owned(), ca)))
}

fn read_kubeconfig(path: &Path) -> Result<(String, Option<PathBuf>, User), AuthError> {
    let invalid =
        |reason: String| AuthError::Config(format!("kubeconfig {}: {reason}", path.display()));
    let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?);
    // The operator's file, but read within a budget like every document.
    let budget = bounded::ParseBudget::new(4 * 1024 * 1024);
    let config: Kubeconfig = bounded::yaml::from_str(&text, &budget)
        .map_err(|e| invalid(format!("not a kubeconfig yaml document: {e}")))?;
    let context = config
        .contexts
        .into_iter()
        .find(|c| c.name == config.current_context)
        .ok_or_else(|| invalid(format!("no context named {:?}", config.current_context)))?
        .value;
    let cluster = config
        .clusters
        .into_iter()
        .find(|c| c.name == context.cluster)
        .ok_or_else(|| invalid(format!("no cluster named {:?}", context.cluster)))?
        .value;
    let user = config
        .users
        .into_iter()
        .find(|u| u.name == context.user)
        .map(|u| u.value)
        .unwrap_or_default();
    if cluster.server.is_empty() {
        return Err(invalid("the cluster has no server".into()));
    }
    Ok((cluster.server, cluster.certificate_authority, user))
}
