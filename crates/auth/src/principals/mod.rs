//! The three principals behind one façade: [`Principals::establish`] finds (or renews) the
//! credential of one mount's identity and answers with a [`Session`] that signs the mount's
//! requests and renews itself through the principal that made it. Workload identity has two
//! mechanisms, the node's choice: OKE's proxymux, or an identity domain's token exchange.

mod ahead;
mod federation;
mod instance;
mod keyload;
mod pace;
mod proxymux;
mod refusals;
mod session_keys;
mod user;

pub use federation::{ClientAuth, ClientSecret, FederationConfig, TokenType, WorkloadMechanism};
pub use session_keys::SESSION_KEYS_AHEAD;

#[cfg(feature = "test-support")]
pub use user::load_user_secret_for_tests;
mod workload;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cache::{Cache, CacheConfig, CacheStats};
use regions::{Region, Regions};

use secrecy::SecretString;
use transport::HttpService;

use crate::kube::KubeApi;
use crate::signing::BoxFuture;
use clock::SharedClock;

use crate::{AuthError, Identity, Session};

/// A token is renewed when it expires within this margin (spec 3.5, 4.5), and a
/// service-account token is only sent if it is valid for longer.
pub(crate) const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// The default first wait before a failed refresh ahead of expiry is tried again: doubled
/// after each failure up to a minute, jittered, while the session still serves.
pub const DEFAULT_REFRESH_RETRY: Duration = Duration::from_secs(1);

/// The least time between two renewals of the instance principal's session after a 401: a
/// renewal costs three instance metadata calls, an RSA key and a federation, and every mount
/// of the node shares the session, so a token OCI keeps refusing is renewed at most twice a
/// minute (the mounts in between fail `Unauthenticated` saying so). Expiry renews regardless.
pub const INSTANCE_RENEWAL_COOL_DOWN: Duration = Duration::from_secs(30);

/// The default instance metadata base URL (spec 4.1). Tests must never use it.
pub const DEFAULT_INSTANCE_METADATA: &str = "http://169.254.169.254/opc/v2";

/// The in-cluster token of the provider's own service account.
pub const DEFAULT_SERVICE_ACCOUNT_TOKEN_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// How long a refused exchange is remembered by default: a trust rule fixed after a
/// refusal takes effect within a minute, and a refused identity costs one exchange a minute
/// however many pods mount it.
pub const DEFAULT_REFUSAL_MEMORY: Duration = Duration::from_secs(60);

/// The default pace of one namespace's exchanges: two a second after a burst of twenty (a
/// node's pods of one namespace starting at once; a session lasts half an hour or more).
pub const DEFAULT_NAMESPACE_EXCHANGES_PER_MINUTE: u32 = 120;
/// See [`DEFAULT_NAMESPACE_EXCHANGES_PER_MINUTE`].
pub const DEFAULT_NAMESPACE_EXCHANGE_BURST: u32 = 20;

/// The proxymux port (spec 3.3; the SDK does not read `KUBERNETES_SERVICE_PORT` for it).
const PROXYMUX_PORT: u16 = 12250;

/// Configuration of the principals: where every endpoint is, and the knobs of the token
/// caches. Build it with struct update syntax over [`PrincipalsConfig::default`].
#[derive(Clone, Debug)]
pub struct PrincipalsConfig {
    /// The region of workload identity (`OCI_RESOURCE_PRINCIPAL_REGION`) and of the
    /// instance principal (else instance metadata says): short code, full id or domain.
    pub region: Option<String>,
    /// The regions the process knows: the built-in table and the operator's region
    /// metadata. The same [`Regions`] resolve the regions of SecretProviderClasses.
    pub regions: Regions,
    /// Federation base URL (`OCI_SDK_AUTH_CLIENT_REGION_URL`; `https://` assumed).
    pub federation_endpoint: Option<String>,
    /// Instance metadata base URL, e.g. `http://169.254.169.254/opc/v2`.
    pub instance_metadata: String,
    /// Proxymux base URL; default `https://<kubernetes_service_host>:12250`.
    pub proxymux: Option<String>,
    /// Kubernetes API base URL; default from the kubeconfig or the service host and port.
    pub kubernetes_api: Option<String>,
    /// `KUBERNETES_SERVICE_HOST`.
    pub kubernetes_service_host: Option<String>,
    /// `KUBERNETES_SERVICE_PORT`.
    pub kubernetes_service_port: Option<u16>,
    /// An explicit kubeconfig (server and user); never an implicit `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// The provider's own service-account token, re-read on every Kubernetes call.
    pub service_account_token_file: PathBuf,
    /// How long a user principal's Secret is used before it is read again.
    pub user_secret_ttl: Duration,
    /// The audience of the service-account token exchanged at the proxymux (`""`: the
    /// API server's default).
    pub workload_audience: String,
    /// Whether to make a TokenRequest when the driver supplied no token for the audience.
    pub token_request: bool,
    /// `expirationSeconds` of those TokenRequests (the Go provider asks for 900).
    pub token_request_expiration: Duration,
    /// What serves `authType: workload`: OKE's proxymux, or an identity domain.
    pub workload_mechanism: WorkloadMechanism,
    /// User principals' private keys loaded (decrypted) at once, process-wide.
    pub max_concurrent_key_loads: usize,
    /// How long a key load waits for its turn before the mount gets `Unavailable`.
    pub key_load_wait: Duration,
    /// How long a definite refusal of a service account's exchange (by the identity domain
    /// or the proxymux) is remembered and answered without asking again; zero: never.
    pub refusal_memory: Duration,
    /// Workload exchanges (TokenRequest, key and exchange) of one namespace per minute,
    /// after a burst of `namespace_exchange_burst`.
    pub namespace_exchanges_per_minute: u32,
    /// Workload exchanges one namespace may make at once before its pace applies.
    pub namespace_exchange_burst: u32,
    /// The first wait before a failed refresh ahead of a session's expiry is tried again
    /// (doubled after each failure up to a minute, jittered).
    pub refresh_retry: Duration,
    /// Session keys (RSA-2048) kept generated ahead of the exchanges that need them: a
    /// node's new identities up to this many wait for no key. Zero keeps none.
    pub session_keys_ahead: usize,
}

impl Default for PrincipalsConfig {
    fn default() -> Self {
        Self {
            region: None,
            regions: Regions::default(),
            federation_endpoint: None,
            instance_metadata: DEFAULT_INSTANCE_METADATA.to_owned(),
            proxymux: None,
            kubernetes_api: None,
            kubernetes_service_host: None,
            kubernetes_service_port: None,
            kubeconfig: None,
            service_account_token_file: PathBuf::from(DEFAULT_SERVICE_ACCOUNT_TOKEN_FILE),
            user_secret_ttl: Duration::from_secs(60),
            workload_audience: String::new(),
            token_request: true,
            token_request_expiration: Duration::from_secs(900),
            workload_mechanism: WorkloadMechanism::Oke,
            max_concurrent_key_loads: 1,
            key_load_wait: Duration::from_secs(10),
            refusal_memory: DEFAULT_REFUSAL_MEMORY,
            namespace_exchanges_per_minute: DEFAULT_NAMESPACE_EXCHANGES_PER_MINUTE,
            namespace_exchange_burst: DEFAULT_NAMESPACE_EXCHANGE_BURST,
            refresh_retry: DEFAULT_REFRESH_RETRY,
            session_keys_ahead: SESSION_KEYS_AHEAD,
        }
    }
}

impl PrincipalsConfig {
    /// The proxymux base URL: configured, else `https://<KUBERNETES_SERVICE_HOST>:12250`
    /// (an IPv6 host bracketed); `None` when neither is known.
    pub fn proxymux_url(&self) -> Option<String> {
        if let Some(url) = &self.proxymux {
            return Some(url.trim_end_matches('/').to_owned());
        }
        let host = self
            .kubernetes_service_host
            .as_deref()
            .filter(|h| !h.is_empty())?;
        Some(format!(
            "https://{}:{PROXYMUX_PORT}",
            crate::remote::url_host(host)
        ))
    }

    /// The Kubernetes API base URL and, when an explicit kubeconfig names one, its
    /// `certificate-authority` file; `None` when no API is configured. The binary gives the
    /// transport this trust for the API's authority.
    pub fn kubernetes_target(&self) -> Result<Option<(String, Option<PathBuf>)>, AuthError> {
        crate::kube::target(
            self.kubernetes_api.as_deref(),
            self.kubernetes_service_host.as_deref(),
            self.kubernetes_service_port,
            self.kubeconfig.as_deref(),
        )
    }
}

/// Which principal a mount uses (`authType`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrincipalKind {
    /// A user API key from the Kubernetes Secret `secret_name` in the pod's namespace.
    User {
        /// `authSecretName`.
        secret_name: String,
    },
    /// The node's instance principal.
    Instance,
    /// OKE workload identity of the pod's service account.
    Workload,
}

/// Who asks for a mount's identity, which decides what the pod attributes mean.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Caller {
    /// The CSI driver, for a pod on this node: a token the provider requests is bound to
    /// that pod.
    #[default]
    Driver,
    /// The secrets-store-sync-controller, for a `SecretSync`: the pod attributes name the
    /// controller's own pod, so the identity is the service account alone. Its tokens
    /// (`--token-request-audience`) are bound to no pod; the provider never requests one
    /// for it (the request could not be bound to a pod of that namespace).
    SyncController,
}

/// What [`Principals::establish`] needs to know of one mount.
pub struct IdentityRequest {
    /// The principal.
    pub kind: PrincipalKind,
    /// The pod's namespace.
    pub namespace: Option<String>,
    /// The pod's name (binds TokenRequests to the pod).
    pub pod_name: Option<String>,
    /// The pod's uid.
    pub pod_uid: Option<String>,
    /// The pod's service account.
    pub service_account: Option<String>,
    /// Tokens the driver supplied, by audience (spec 3.7).
    pub service_account_tokens: BTreeMap<String, SecretString>,
    /// The mount's deadline.
    pub deadline: tokio::time::Instant,
    /// Who sent the mount.
    pub caller: Caller,
}

impl fmt::Debug for IdentityRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityRequest")
            .field("kind", &self.kind)
            .field("namespace", &self.namespace)
            .field("pod_name", &self.pod_name)
            .field("pod_uid", &self.pod_uid)
            .field("service_account", &self.service_account)
            .field(
                "service_account_tokens",
                &self.service_account_tokens.keys().collect::<Vec<_>>(),
            )
            .field("deadline", &self.deadline)
            .field("caller", &self.caller)
            .finish()
    }
}

impl IdentityRequest {
    fn namespace(&self) -> Result<&str, AuthError> {
        self.namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(AuthError::MissingRequestField("pod namespace"))
    }

    fn service_account(&self) -> Result<&str, AuthError> {
        self.service_account
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(AuthError::MissingRequestField("service account name"))
    }

    /// The pod a token the provider requests would be bound to: only the driver's mounts
    /// are for a pod.
    fn pod_to_bind(&self) -> Option<(&str, &str)> {
        match self.caller {
            Caller::Driver => self.pod(),
            Caller::SyncController => None,
        }
    }

    /// The pod the attributes name (for the sync controller, its own pod).
    fn pod(&self) -> Option<(&str, &str)> {
        match (self.pod_name.as_deref(), self.pod_uid.as_deref()) {
            (Some(name), Some(uid)) if !name.is_empty() && !uid.is_empty() => Some((name, uid)),
            _ => None,
        }
    }
}

/// The identity a mount's OCI calls are made as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Established {
    /// The credential as a capability: it goes in the extensions of every request of this
    /// mount (the signing layer signs with it), and anything fetched with it is cached
    /// under its [`Session::credential`].
    pub session: Session,
    /// The principal's region, when known: where its calls go unless the class names a
    /// region, and its realm bounds where they may go.
    pub region: Option<Region>,
}

impl Established {
    /// Who the mount's requests are made as.
    pub fn identity(&self) -> Identity {
        self.session.identity()
    }

    /// Exactly which credential was established.
    pub fn credential(&self) -> &crate::Credential {
        self.session.credential()
    }
}

/// What the credential caches hold at most (identities seen at once on one node), and
/// how long a credential nobody asked for is kept: longer than any token or user-key
/// lifetime, so a dropped entry never held anything still useful.
const CREDENTIAL_ENTRIES: u64 = 10_000;
const CREDENTIAL_IDLE: Duration = Duration::from_secs(3600);

/// What one cached credential is counted at by the byte bound: a 2048-bit private key with
/// its CRT parts, the token and the bookkeeping around them.
pub(crate) const CREDENTIAL_BYTES: usize = 4096;

fn credential_cache<K, V>(
    kind: &'static str,
    ttl: Option<Duration>,
    clock: &SharedClock,
) -> Cache<K, V>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: cache::CacheValue,
{
    Cache::new(
        CacheConfig {
            ttl,
            max_entries: CREDENTIAL_ENTRIES,
            max_bytes: CREDENTIAL_ENTRIES * CREDENTIAL_BYTES as u64,
            idle: Some(CREDENTIAL_IDLE),
            ..CacheConfig::new(kind)
        },
        clock.clone(),
    )
}

/// What guarded the node's workload exchanges ([`Principals::exchange_guards`]): the
/// identity domain or the proxymux is shared by every tenant, so a refused identity is not
/// asked about again for [`PrincipalsConfig::refusal_memory`], a namespace's exchanges keep
/// to its pace; and the session keys of every exchange (and of the instance principal's
/// federations), generated ahead ([`SESSION_KEYS_AHEAD`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExchangeGuards {
    /// Definite refusals remembered.
    pub refusals_remembered: u64,
    /// Mounts answered with a remembered refusal: no TokenRequest, key or exchange.
    pub refusals_served: u64,
    /// Refusals not remembered: every entry was another namespace's, live.
    pub refusals_unkept: u64,
    /// Exchanges that waited for their namespace's turn.
    pub paced_waited: u64,
    /// Mounts failed at once: their namespace's turn came after their deadline.
    pub paced_refused: u64,
    /// Session keys generated, all in the background.
    pub keys_generated: u64,
    /// Session keys taken at once, generated ahead.
    pub keys_ready: u64,
    /// Session keys a mount waited for: it found none ready and waited for the one being
    /// generated.
    pub keys_waited: u64,
    /// Keys of exchanges answered without a token, back for a later exchange.
    pub keys_reused: u64,
    /// The most keys held ready at once (at most [`PrincipalsConfig::session_keys_ahead`]).
    pub keys_most_held: u64,
    /// The keys held ready now.
    pub keys_held: u64,
}

/// The principals of the process: user keys, workload RPSTs and the instance token,
/// each cached per [`Identity`].
///
/// Cloning is cheap and clones share the caches. Each [`Established`] it answers carries
/// the [`Session`] the mount's requests are signed with.
#[derive(Clone)]
pub struct Principals {
    inner: Arc<Inner>,
    /// Held by the principals' clones alone (not by the sessions they hand out): when the
    /// last is dropped, every background task (key refills, refreshes ahead) ends.
    _open: Arc<tokio::sync::watch::Sender<()>>,
}

struct Inner {
    /// Itself, for the background tasks it starts (they hold it only while they work).
    this: std::sync::Weak<Inner>,
    config: PrincipalsConfig,
    http: HttpService,
    clock: SharedClock,
    regions: Regions,
    /// The configured region, resolved once.
    region: Option<Region>,
    kube: Option<KubeApi>,
    users: Cache<(String, String), user::UserKey>,
    key_gate: crate::tenant_keys::TenantKeys,
    failed_keys: keyload::FailedLoads,
    workloads: Cache<(String, String), workload::Session>,
    /// The kind of workload session tokens (`rpst`, or the identity domain's `upst`): the
    /// `kind` of their cache and counters.
    workload_kind: &'static str,
    /// Definite refusals of workload exchanges, per namespace and service account.
    refusals: refusals::Refusals,
    /// The pace of workload exchanges per namespace.
    pace: pace::ExchangePace,
    /// Session keys generated ahead, and those of refused exchanges.
    session_keys: Arc<session_keys::SessionKeys>,
    /// Workload sessions being refreshed ahead of their expiry.
    workload_ahead: Arc<ahead::Ahead<(String, String), workload::Session>>,
    /// The instance session being refreshed ahead of its expiry.
    instance_ahead: Arc<ahead::Ahead<(), instance::Session>>,
    /// The cluster's service-account issuer, which proves the tokens mounts supply.
    issuer: crate::issuer::Issuer,
    instance: Cache<(), instance::Session>,
    instance_region: tokio::sync::OnceCell<Region>,
    /// When a 401 last dropped the instance session: the cool-down runs from here.
    instance_renewed: std::sync::Mutex<Option<SystemTime>>,
    /// Credential fetches by (kind, exchange | refresh | ahead, ok | error).
    fetches: std::sync::Mutex<BTreeMap<(&'static str, &'static str, &'static str), u64>>,
    /// What became of 401s by (kind, outcome): [`crate::session::Invalidated::label`].
    renewals: std::sync::Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl fmt::Debug for Principals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Principals")
            .field("config", &self.inner.config)
            .field("region", &self.inner.region)
            .finish_non_exhaustive()
    }
}

impl Principals {
    /// The counters of the three credential caches, by kind (`user`, `rpst` or `upst`,
    /// `instance`).
    pub fn cache_stats(&self) -> [(&'static str, CacheStats); 3] {
        let inner = &self.inner;
        [
            ("user", inner.users.stats()),
            (inner.workload_kind, inner.workloads.stats()),
            ("instance", inner.instance.stats()),
        ]
    }

    /// Credential fetches so far: (kind `rpst` | `upst` | `instance` | `user`, op, `ok` |
    /// `error`) → count. The op is `exchange` (a new identity), `refresh` (a mount waited
    /// for a credential past serving, or renewing after a 401, to be replaced) or `ahead` (a
    /// refresh in the background while the credential still served; each attempt counted).
    pub fn credential_fetches(&self) -> Vec<((&'static str, &'static str, &'static str), u64)> {
        lock(&self.inner.fetches)
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// What became of the 401s OCI answered to established sessions: (kind `rpst` |
    /// `instance` | `user`, outcome) → count. The outcome is `renewed` (the 401 dropped the
    /// credential: renewed at once, a user key read again by the next mount), `joined`
    /// (another request's renewal served it), `cooling_down` (the instance session was
    /// renewed within [`INSTANCE_RENEWAL_COOL_DOWN`]: kept, the request failed) or
    /// `other_region` (a region other than the principal's own: kept, the request failed).
    pub fn credential_renewals(&self) -> Vec<((&'static str, &'static str), u64)> {
        lock(&self.inner.renewals)
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// Starts generating the session keys kept ahead (in the background, one at a time, at
    /// the lowest CPU priority), so that the first exchanges of a node wait for none. Each
    /// take refills the pool in any case; this fills it before the first.
    pub fn fill_session_keys(&self) {
        self.inner.session_keys.fill();
    }

    /// What guarded the workload exchanges so far: refusals remembered and served, turns of
    /// the namespaces' pace, session keys generated, taken and reused.
    pub fn exchange_guards(&self) -> ExchangeGuards {
        let inner = &self.inner;
        let (refusals, pace, keys) = (
            inner.refusals.counts(),
            inner.pace.counts(),
            inner.session_keys.counts(),
        );
        ExchangeGuards {
            refusals_remembered: refusals.remembered,
            refusals_served: refusals.served,
            refusals_unkept: refusals.unkept,
            paced_waited: pace.waited,
            paced_refused: pace.refused,
            keys_generated: keys.generated,
            keys_ready: keys.ready,
            keys_waited: keys.waited,
            keys_reused: keys.returned,
            keys_most_held: keys.most_held,
            keys_held: keys.held,
        }
    }

    /// Verifications of the service-account tokens mounts supplied: (result `ok` |
    /// `refused` | `unavailable`, reason) → count. The reason of `ok` is `verified` or
    /// `cached`; of `refused`, the check that failed (`signature`, `unknown_key`,
    /// `algorithm`, `issuer`, `audience`, `expired`, `not_yet_valid`, `claims`,
    /// `malformed`) or `cached` (a verdict kept from an identical token); of `unavailable`,
    /// `issuer_keys` (the cluster's keys could not be read).
    pub fn token_verifications(&self) -> Vec<((&'static str, &'static str), u64)> {
        self.inner.issuer.outcomes()
    }

    /// Drops expired credentials (and verdicts on tokens) every `every`, until the
    /// principals are dropped.
    pub fn spawn_purgers(&self, every: Duration) -> Vec<tokio::task::JoinHandle<()>> {
        let inner = &self.inner;
        vec![
            inner.users.spawn_purger(every),
            inner.workloads.spawn_purger(every),
            inner.instance.spawn_purger(every),
            inner.issuer.spawn_purger(every),
        ]
    }

    /// Tenant private keys loaded (decrypted) so far, user keys and certificate keys; a
    /// failed load answered from memory is not counted.
    pub fn key_loads(&self) -> u64 {
        self.inner.key_gate.loads()
    }

    /// The one gate of tenant private keys, shared with whatever else decodes keys a
    /// tenant supplies (certificate keys): the same concurrency bound and namespace turns.
    pub fn tenant_keys(&self) -> crate::tenant_keys::TenantKeys {
        self.inner.key_gate.clone()
    }

    /// Checks the configuration (region, kubeconfig) and sets up empty
    /// caches. Nothing is contacted yet.
    pub fn new(
        config: PrincipalsConfig,
        http: HttpService,
        clock: SharedClock,
    ) -> Result<Self, AuthError> {
        let regions = config.regions.clone();
        let region = config
            .region
            .as_deref()
            .map(|r| regions.resolve(r))
            .transpose()?;
        let kube = KubeApi::new(
            http.clone(),
            config.kubernetes_api.as_deref(),
            config.kubernetes_service_host.as_deref(),
            config.kubernetes_service_port,
            config.kubeconfig.as_deref(),
            &config.service_account_token_file,
        )?;
        let key_gate = crate::tenant_keys::TenantKeys::new(
            config.max_concurrent_key_loads,
            config.key_load_wait,
        );
        let issuer = crate::issuer::Issuer::new(
            kube.clone(),
            config.workload_audience.clone(),
            clock.clone(),
        );
        let users = credential_cache("user", Some(config.user_secret_ttl), &clock);
        let workload_kind = config.workload_mechanism.kind();
        let workloads = credential_cache(workload_kind, None, &clock);
        let instance = credential_cache("instance", None, &clock);
        let refusals = refusals::Refusals::new(config.refusal_memory);
        let pace = pace::ExchangePace::new(
            config.namespace_exchanges_per_minute,
            config.namespace_exchange_burst,
        );
        let (open, closed) = tokio::sync::watch::channel(());
        let retry = config.refresh_retry;
        let keys_ahead = config.session_keys_ahead;
        Ok(Self {
            _open: Arc::new(open),
            inner: Arc::new_cyclic(|this| Inner {
                this: this.clone(),
                key_gate,
                failed_keys: keyload::FailedLoads::default(),
                config,
                http,
                clock,
                regions,
                region,
                kube,
                users,
                workloads,
                workload_kind,
                refusals,
                pace,
                session_keys: Arc::new(session_keys::SessionKeys::new(closed.clone(), keys_ahead)),
                workload_ahead: Arc::new(ahead::Ahead::new(retry, closed.clone())),
                instance_ahead: Arc::new(ahead::Ahead::new(retry, closed)),
                issuer,
                instance,
                instance_region: tokio::sync::OnceCell::new(),
                instance_renewed: std::sync::Mutex::new(None),
                fetches: std::sync::Mutex::new(BTreeMap::new()),
                renewals: std::sync::Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// Establishes the identity of one mount before any OCI call: proves the mount's own
    /// service-account token (workload: its claims, and its signature against the
    /// cluster's issuer keys), loads or renews what is needed (one exchange per identity
    /// however many mounts ask at once), and says in which region it is.
    pub async fn establish(&self, request: &IdentityRequest) -> Result<Established, AuthError> {
        let deadline = request.deadline;
        let work = async {
            match &request.kind {
                PrincipalKind::User { secret_name } => {
                    user::establish(&self.inner, request, secret_name).await
                }
                PrincipalKind::Workload => workload::establish(&self.inner, request).await,
                PrincipalKind::Instance => instance::establish(&self.inner, deadline).await,
            }
        };
        tokio::time::timeout_at(deadline, work)
            .await
            .map_err(|_| AuthError::DeadlineExceeded("establishing the mount's identity"))?
    }
}

impl Inner {
    fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// Runs one credential fetch (`kind`: `rpst`, `upst`, `instance`, `user`), counting it
    /// under `op` ([`Principals::credential_fetches`]) with its result.
    async fn counted<T>(
        &self,
        kind: &'static str,
        op: &'static str,
        work: impl std::future::Future<Output = Result<T, AuthError>>,
    ) -> Result<T, AuthError> {
        let result = work.await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        *lock(&self.fetches).entry((kind, op, outcome)).or_default() += 1;
        result
    }

    /// Counts what became of a 401 of a `kind` session.
    fn count_renewal(&self, kind: &'static str, invalidated: &crate::session::Invalidated) {
        *lock(&self.renewals)
            .entry((kind, invalidated.label()))
            .or_default() += 1;
    }

    fn kube(&self) -> Result<&KubeApi, AuthError> {
        self.kube.as_ref().ok_or_else(|| {
            AuthError::Config(
                "no kubernetes api is configured (kubernetes_api, kubeconfig or kubernetes_service_host)"
                    .into(),
            )
        })
    }
}

/// Establishing identities as a tower service: what the mount service calls, so it can be
/// tested against a `tower-test` mock. Always ready (each call waits only on its own
/// identity's single flight); clones share the caches.
impl tower::Service<IdentityRequest> for Principals {
    type Response = Established;
    type Error = AuthError;
    type Future = BoxFuture<'static, Result<Established, AuthError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), AuthError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: IdentityRequest) -> Self::Future {
        let principals = self.clone();
        Box::pin(async move { principals.establish(&request).await })
    }
}

/// A counter map's lock: a panic while one was held leaves counts, which stay usable.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What an exchange of a workload's service-account token answers: the session token, its
/// expiry, from when it is refreshed, and the session key it is bound to.
pub(super) struct Exchanged {
    pub(super) token: zeroize::Zeroizing<String>,
    pub(super) exp: SystemTime,
    pub(super) refresh_at: SystemTime,
    pub(super) key: Arc<crate::PrivateKey>,
}

/// Whether a token expiring at `exp` (seconds since the epoch) is still good at `now`.
pub(crate) fn fresh(exp: SystemTime, now: SystemTime) -> bool {
    exp > now + REFRESH_MARGIN
}

/// Until when a token expiring at `exp` serves mounts: five minutes before it expires (the
/// end of [`fresh`]).
pub(crate) fn serves_until(exp: SystemTime) -> SystemTime {
    exp.checked_sub(REFRESH_MARGIN).unwrap_or(exp)
}

/// The principals' clock, or the system's once they are dropped (a refresh outliving them).
fn now_of(inner: &std::sync::Weak<Inner>) -> SystemTime {
    inner
        .upgrade()
        .map_or_else(SystemTime::now, |inner| inner.now())
}

/// The op a fetch of the cache counts as: `refresh` when it replaces a `stale` credential.
fn op<T>(stale: &Option<T>) -> &'static str {
    if stale.is_some() {
        "refresh"
    } else {
        "exchange"
    }
}

/// When a session token issued at `issued` and expiring at `exp` is refreshed (in the
/// background, while it serves on): at the earlier of five minutes before `exp` and half
/// its lifetime.
pub(crate) fn refresh_at(issued: SystemTime, exp: SystemTime) -> SystemTime {
    let lifetime = exp.duration_since(issued).unwrap_or_default();
    let margin = exp.checked_sub(REFRESH_MARGIN).unwrap_or(issued);
    (issued + lifetime / 2).min(margin).max(issued)
}

/// Spawns `task` to run until it ends or the principals are dropped (`open`'s sender goes),
/// whichever comes first. `false` when they are gone already: nothing is spawned.
fn spawn_until_closed(
    open: &tokio::sync::watch::Receiver<()>,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) -> bool {
    if open.has_changed().is_err() {
        return false;
    }
    let mut open = open.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = open.changed() => {}
            () = task => {}
        }
    });
    true
}

/// The pure parsers of this module, for the property tests in `crate::fuzz`.
#[cfg(test)]
pub(crate) fn fuzz_check_token(
    token: &secrecy::SecretString,
    namespace: &str,
    service_account: &str,
    now: std::time::SystemTime,
) -> bool {
    workload::check_token(token, namespace, service_account, None, now).is_ok()
}

#[cfg(test)]
pub(crate) fn fuzz_proxymux_reply(body: &[u8]) -> Result<(), &'static str> {
    proxymux::parse_proxymux_reply(body, SystemTime::UNIX_EPOCH).map(|_| ())
}

#[cfg(test)]
pub(crate) fn fuzz_exchange_answer(body: &[u8], now: SystemTime) -> Result<(), &'static str> {
    federation::answer(body, now).map(|_| ())
}

#[cfg(test)]
pub(crate) use federation::fuzz_refusal as fuzz_exchange_refusal;

#[cfg(test)]
pub(crate) fn fuzz_tenancy(der: &[u8]) -> Option<String> {
    instance::tenancy(der)
}
