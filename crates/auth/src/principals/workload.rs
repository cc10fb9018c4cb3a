//! Workload identity: the pod's service-account token (the mount's own, proven, or one the
//! provider requests bound to the pod), exchanged for a session token bound to a fresh
//! session key by the node's mechanism (OKE's proxymux, spec 3, or an identity domain's
//! token exchange, `federation`); one session per (namespace, service account), cached,
//! single flight, refreshed ahead of its expiry in the background (`ahead`), renewed after a
//! 401.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use secrecy::{ExposeSecret as _, SecretString};

use super::ahead::{ATTEMPT_TIMEOUT, Refresh};
use super::{IdentityRequest, Inner, WorkloadMechanism, fresh, now_of, serves_until};
use crate::error::AuthError;
use crate::issuer::{NBF_LEEWAY, Refusal, Unverified};
use crate::session::Invalidated;
use crate::signing::{BoxFuture, KeyId, SigningKey};
use crate::{Credential, Identity, jwt};

/// A workload's session token (an RPST, or the identity domain's UPST or RPST) with its
/// session key, and what is needed to renew it. Shared: every mount of the identity takes
/// a clone from the cache, one reference count, not the names and tokens copied.
#[derive(Clone, Debug)]
pub(crate) struct Session(Arc<SessionState>);

impl std::ops::Deref for Session {
    type Target = SessionState;
    fn deref(&self) -> &SessionState {
        &self.0
    }
}

/// What a [`Session`] holds.
#[derive(Debug)]
pub(crate) struct SessionState {
    pub(crate) identity: Identity,
    credential: Arc<Credential>,
    key: SigningKey,
    exp: SystemTime,
    /// From when it is refreshed in the background (the mechanism says); it serves on
    /// meanwhile.
    refresh_at: SystemTime,
    /// The service-account token last exchanged, reused for a renewal while it is valid.
    sa_token: SecretString,
    sa_exp: SystemTime,
    /// The pod a TokenRequest is bound to, for renewals.
    pod: Option<(String, String)>,
    /// Set when OCI refused the RPST: the session stays cached (its service-account token
    /// renews it) but is not used to sign again.
    pub(crate) invalidated: Arc<AtomicBool>,
}

impl cache::CacheValue for Session {
    fn bytes(&self) -> usize {
        super::CREDENTIAL_BYTES
    }

    /// Kept while the RPST or the service-account token can still serve (to sign, or to
    /// renew without a TokenRequest).
    fn expires(&self) -> Option<SystemTime> {
        Some(self.exp.max(self.sa_exp))
    }
}

impl SessionState {
    /// Still good to sign with (OCI has not refused it, and it expires more than five
    /// minutes from now), though perhaps due for a refresh: it serves mounts.
    fn valid(&self, now: SystemTime) -> bool {
        !self.invalidated.load(Ordering::Relaxed) && fresh(self.exp, now)
    }

    /// Due for its refresh ahead.
    fn due(&self, now: SystemTime) -> bool {
        now >= self.refresh_at
    }

    /// The same session: the same token (a successor has another).
    fn same(&self, other: &Session) -> bool {
        self.key.key_id().expose_secret() == other.key.key_id().expose_secret()
    }
}

/// What we read of a service-account token's claims.
#[derive(Clone)]
pub(super) struct TokenInfo {
    exp: SystemTime,
    uid: Option<String>,
}

/// The local checks of spec 3.3 (three-part JWT, Base64url JSON, `exp` more than five
/// minutes away), plus: not before its `nbf`, and the token belongs to this namespace and
/// service account (and pod, when it names one). Its signature is not checked here.
pub(super) fn check_token(
    token: &SecretString,
    namespace: &str,
    service_account: &str,
    pod: Option<(&str, &str)>,
    now: SystemTime,
) -> Result<TokenInfo, AuthError> {
    read_token(token, namespace, service_account, pod, now)
        .map_err(|refusal| invalid_token(namespace, service_account, refusal))
}

fn invalid_token(namespace: &str, service_account: &str, refusal: Refusal) -> AuthError {
    AuthError::InvalidServiceAccountToken {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        reason: refusal.message(),
    }
}

fn read_token(
    token: &SecretString,
    namespace: &str,
    service_account: &str,
    pod: Option<(&str, &str)>,
    now: SystemTime,
) -> Result<TokenInfo, Refusal> {
    let claims = jwt::claims(token.expose_secret()).map_err(Refusal::Malformed)?;
    let exp = jwt::exp(&claims).map_err(Refusal::Malformed)?;
    if !fresh(exp, now) {
        return Err(Refusal::Expired);
    }
    let nbf = jwt::nbf(&claims).map_err(Refusal::Malformed)?;
    if nbf.is_some_and(|nbf| nbf > now + NBF_LEEWAY) {
        return Err(Refusal::NotYetValid);
    }
    // Bound tokens (TokenRequest, the kubelet's projected tokens) carry the nested
    // `kubernetes.io` claims; a token without them (a legacy Secret-based token) cannot be
    // tied to this pod's service account.
    let (Some(claimed_ns), Some(claimed_sa)) = (
        jwt::string_at(&claims, &["kubernetes.io", "namespace"]),
        jwt::string_at(&claims, &["kubernetes.io", "serviceaccount", "name"]),
    ) else {
        return Err(Refusal::Claims(
            "it carries no kubernetes.io namespace and service-account claims (a legacy \
             Secret-based token?); workload identity needs a bound token",
        ));
    };
    if claimed_ns != namespace || claimed_sa != service_account {
        return Err(Refusal::Claims("it belongs to another service account"));
    }
    // A token bound to a pod must be bound to this one.
    if let Some((pod_name, pod_uid)) = pod {
        let claimed_name = jwt::string_at(&claims, &["kubernetes.io", "pod", "name"]);
        let claimed_uid = jwt::string_at(&claims, &["kubernetes.io", "pod", "uid"]);
        if claimed_name.is_some_and(|n| n != pod_name) || claimed_uid.is_some_and(|u| u != pod_uid)
        {
            return Err(Refusal::Claims("it is bound to another pod"));
        }
    }
    let uid = jwt::string_at(&claims, &["kubernetes.io", "serviceaccount", "uid"]);
    Ok(TokenInfo { exp, uid })
}

/// A token the mount supplied, proven before anything cached is served to it
/// (ARCHITECTURE.md, invariant 12): its claims checked here, then its signature verified
/// against the cluster's issuer keys. A refused token never reaches the cache, so it cannot
/// evict a valid session.
async fn prove_supplied(
    inner: &Inner,
    token: &SecretString,
    (namespace, service_account): (&str, &str),
    pod: Option<(&str, &str)>,
    deadline: tokio::time::Instant,
) -> Result<TokenInfo, AuthError> {
    let info =
        read_token(token, namespace, service_account, pod, inner.now()).map_err(|refusal| {
            inner.issuer.count("refused", refusal.label());
            invalid_token(namespace, service_account, refusal)
        })?;
    match inner.issuer.verify(token, deadline).await {
        Ok(()) => Ok(info),
        Err(Unverified::Refused(refusal)) => {
            Err(invalid_token(namespace, service_account, refusal))
        }
        Err(Unverified::Unavailable(source)) => Err(AuthError::IssuerKeys {
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            source: Box::new(source),
        }),
    }
}

/// Where an establishment's service-account token comes from.
#[derive(Clone)]
enum Source {
    /// The mount supplied it (proven: claims checked, signature verified).
    Supplied(SecretString, TokenInfo),
    /// The provider requests one bound to this pod.
    Request((String, String)),
}

pub(super) async fn establish(
    inner: &Arc<Inner>,
    request: &IdentityRequest,
) -> Result<super::Established, AuthError> {
    let namespace = request.namespace()?;
    let service_account = request.service_account()?;
    // What the session remembers to renew with: the pod a TokenRequest may bind to.
    let pod = request
        .pod_to_bind()
        .map(|(n, u)| (n.to_owned(), u.to_owned()));
    let source = token_source(inner, request, pod.as_ref()).await?;
    let key = (namespace.to_owned(), service_account.to_owned());
    let matches = |session: &Session| match &source {
        // A token of a recreated service account (another uid) is another identity.
        Source::Supplied(_, TokenInfo { uid: Some(uid), .. }) => matches!(
            &session.identity,
            Identity::Workload { service_account_uid: Some(cached), .. } if cached == uid
        ),
        _ => true,
    };
    // A session serves while it is valid, due for its refresh or not: only one past serving
    // makes the mount wait, for the refresh ahead in flight or its own exchange.
    let (session, lookup) = inner
        .workloads
        .get_or_fetch(
            &key,
            request.deadline,
            |s| s.valid(inner.now()) && matches(s),
            |stale| {
                let (source, pod, key) = (source.clone(), pod.clone(), &key);
                let (op, who) = (super::op(&stale), (namespace, service_account));
                async move {
                    if let Some(session) = inner.workload_ahead.join(key).await.filter(matches) {
                        return Ok(session);
                    }
                    before_exchange(inner, who, request.deadline).await?;
                    let fetch = exchange_from(inner, who, source, pod, request.deadline);
                    inner.counted(inner.workload_kind, op, fetch).await
                }
            },
        )
        .await?;
    if lookup == cache::Lookup::Hit && session.due(inner.now()) {
        let supplied = match source {
            Source::Supplied(token, info) => Some((token, info)),
            Source::Request(_) => None,
        };
        inner.workload_ahead.start(AheadRefresh {
            inner: Arc::downgrade(inner),
            key,
            current: session.clone(),
            supplied,
            pod,
        });
    }
    Ok(super::Established {
        region: inner.region.clone(),
        session: crate::Session::renewable(
            session.credential.clone(),
            session.key.clone(),
            Arc::new(Renewal {
                inner: Arc::clone(inner),
                current: session,
            }),
            inner.region.clone(),
        ),
    })
}

/// Before a workload exchange of `who`: a refusal remembered for exactly this namespace and
/// service account fails the mount at once (no TokenRequest, no key, no exchange); else the
/// exchange waits for its namespace's turn, or fails at once if that comes after `deadline`.
async fn before_exchange(
    inner: &Inner,
    (namespace, service_account): (&str, &str),
    deadline: tokio::time::Instant,
) -> Result<(), AuthError> {
    inner
        .refusals
        .check(namespace, service_account, inner.now())?;
    inner.pace.admit(namespace, deadline).await
}

/// One exchange of the token `source` gives (the mount's own, or a TokenRequest's).
async fn exchange_from(
    inner: &Inner,
    (namespace, service_account): (&str, &str),
    source: Source,
    pod: Option<(String, String)>,
    deadline: tokio::time::Instant,
) -> Result<Session, AuthError> {
    let (token, info) = match source {
        Source::Supplied(token, info) => (token, info),
        Source::Request(bind_to) => {
            request_token(inner, namespace, service_account, &bind_to, deadline).await?
        }
    };
    exchange(
        inner,
        (namespace, service_account),
        token,
        info,
        pod,
        deadline,
    )
    .await
}

/// Which service-account token the exchange uses: the mount's own (proven first,
/// whatever the cache holds), or one the provider requests bound to the pod.
async fn token_source(
    inner: &Inner,
    request: &IdentityRequest,
    pod: Option<&(String, String)>,
) -> Result<Source, AuthError> {
    // The mount's own token is proven first, whatever the cache holds: a mount whose
    // token is invalid is refused even if its identity has a valid RPST.
    let (namespace, service_account) = (request.namespace()?, request.service_account()?);
    let token = request
        .service_account_tokens
        .get(&inner.config.workload_audience);
    match (token, pod) {
        (Some(token), _) => {
            let info = prove_supplied(
                inner,
                token,
                (namespace, service_account),
                request.pod(),
                request.deadline,
            )
            .await?;
            Ok(Source::Supplied(token.clone(), info))
        }
        // A token the provider requests is bound to the pod it mounts for; a mount for no
        // pod (the sync controller's) must bring its own.
        (None, Some(pod)) if inner.config.token_request => Ok(Source::Request(pod.clone())),
        (None, _) => Err(AuthError::NoServiceAccountToken {
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            audience: inner.config.workload_audience.clone(),
            caller: request.caller,
            sent: request.service_account_tokens.keys().cloned().collect(),
            token_requests: inner.config.token_request,
        }),
    }
}

/// How an established workload session renews after OCI refuses its RPST.
pub(super) struct Renewal {
    inner: Arc<Inner>,
    /// The session as the mount established it.
    current: Session,
}

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("workload::Renewal")
            .field("identity", &self.current.identity)
            .finish_non_exhaustive()
    }
}

impl crate::session::Renew for Renewal {
    /// The cached session stays (its service-account token renews it), marked unusable, if
    /// it still signs with the refused key. No cool-down: the session is this identity's
    /// alone, so a renewal costs only the tenant whose token OCI refused (one exchange per
    /// refused request at most).
    fn invalidate<'a>(&'a self, rejected: &'a KeyId) -> BoxFuture<'a, Invalidated> {
        Box::pin(async move {
            let identity = &self.current.identity;
            let Identity::Workload {
                namespace,
                service_account,
                ..
            } = identity
            else {
                return Invalidated::Replaced;
            };
            let key = (namespace.clone(), service_account.clone());
            match self.inner.workloads.get(&key).await {
                Some(session)
                    if &session.identity == identity
                        && session.key.key_id().expose_secret() == rejected.expose_secret() =>
                {
                    if session.invalidated.swap(true, Ordering::Relaxed) {
                        return Invalidated::Replaced;
                    }
                    tracing::debug!(%identity, "workload session invalidated after a 401 from oci");
                    Invalidated::Dropped
                }
                _ => Invalidated::Replaced,
            }
        })
    }

    fn renew(
        &self,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'_, Result<Option<SigningKey>, AuthError>> {
        Box::pin(async move { renew(&self.inner, &self.current, deadline).await.map(Some) })
    }

    fn count(&self, invalidated: &Invalidated) {
        self.inner
            .count_renewal(self.inner.workload_kind, invalidated);
    }
}

/// A fresh key for the identity `current` was established as: the cached session if another
/// request renewed it already, else the refresh ahead in flight, else one exchange (single
/// flight) with the last service-account token while it is valid, else a TokenRequest bound
/// to the same pod.
async fn renew(
    inner: &Inner,
    current: &Session,
    deadline: tokio::time::Instant,
) -> Result<SigningKey, AuthError> {
    let identity = &current.identity;
    let Identity::Workload {
        namespace,
        service_account,
        ..
    } = identity
    else {
        return Err(AuthError::Internal(
            "a workload session of another identity",
        ));
    };
    let key = (namespace.clone(), service_account.clone());
    let who = (namespace.as_str(), service_account.as_str());
    let (session, _) = inner
        .workloads
        .get_or_fetch(
            &key,
            deadline,
            |s| &s.identity == identity && s.valid(inner.now()),
            |stale| {
                let current = stale
                    .filter(|s| &s.identity == identity)
                    .unwrap_or_else(|| current.clone());
                let key = &key;
                async move {
                    if let Some(session) = inner.workload_ahead.join(key).await {
                        return Ok(session);
                    }
                    before_exchange(inner, who, deadline).await?;
                    inner
                        .counted(inner.workload_kind, "refresh", async {
                            let pod = current.pod.clone();
                            let (token, info) =
                                renewal_token(inner, who, &current, None, pod.as_ref(), deadline)
                                    .await?;
                            exchange(inner, who, token, info, pod, deadline).await
                        })
                        .await
                }
            },
        )
        .await?;
    if &session.identity != identity {
        return Err(AuthError::CannotRenew {
            identity: identity.clone(),
            reason: "the service account was recreated since the mount established it",
        });
    }
    Ok(session.key.clone())
}

/// The service-account token a renewal exchanges: `supplied` (a mount's own, proven) while
/// it is valid, else the session's own while it is valid (proven when it was established, or
/// from a TokenRequest: its claims are read again), else a TokenRequest bound to `pod`.
async fn renewal_token(
    inner: &Inner,
    (namespace, service_account): (&str, &str),
    current: &Session,
    supplied: Option<&(SecretString, TokenInfo)>,
    pod: Option<&(String, String)>,
    deadline: tokio::time::Instant,
) -> Result<(SecretString, TokenInfo), AuthError> {
    let now = inner.now();
    if let Some((token, info)) = supplied.filter(|(_, info)| fresh(info.exp, now)) {
        return Ok((token.clone(), info.clone()));
    }
    if fresh(current.sa_exp, now) {
        let bound = current.pod.as_ref().map(|(n, u)| (n.as_str(), u.as_str()));
        let info = check_token(&current.sa_token, namespace, service_account, bound, now)?;
        return Ok((current.sa_token.clone(), info));
    }
    match (inner.config.token_request, pod) {
        (true, Some(pod)) => request_token(inner, namespace, service_account, pod, deadline).await,
        _ => Err(AuthError::CannotRenew {
            identity: current.identity.clone(),
            reason: "its service-account token expired and no TokenRequest can replace it \
                     (token requests off, or no pod to bind one to)",
        }),
    }
}

/// A workload session's refresh ahead of its expiry, started by the mount that found it
/// due: with that mount's token (proven) while it is valid, else the session's own, else a
/// TokenRequest bound to that mount's pod.
struct AheadRefresh {
    inner: std::sync::Weak<Inner>,
    key: (String, String),
    /// The session refreshed.
    current: Session,
    supplied: Option<(SecretString, TokenInfo)>,
    pod: Option<(String, String)>,
}

impl Refresh for AheadRefresh {
    type Key = (String, String);
    type Session = Session;

    fn key(&self) -> &(String, String) {
        &self.key
    }

    fn identity(&self) -> Identity {
        self.current.identity.clone()
    }

    fn now(&self) -> SystemTime {
        now_of(&self.inner)
    }

    fn serves_until(&self) -> SystemTime {
        serves_until(self.current.exp)
    }

    async fn serves(&self) -> bool {
        let Some(inner) = self.inner.upgrade() else {
            return false;
        };
        let cached = inner.workloads.get(&self.key).await;
        cached.is_some_and(|s| s.same(&self.current) && s.valid(inner.now()))
    }

    async fn attempt(&self) -> Result<Session, AuthError> {
        let inner = self
            .inner
            .upgrade()
            .ok_or(AuthError::Internal("the principals are gone"))?;
        let who = (self.key.0.as_str(), self.key.1.as_str());
        // Its namespace's turn within the attempt, as a mount's: a refresh takes no turn
        // far ahead of the new identities' mounts. Without one it is tried again later
        // while the session serves on: the pace delays a refresh, it fails no mount.
        let deadline = tokio::time::Instant::now() + ATTEMPT_TIMEOUT;
        before_exchange(&inner, who, deadline).await?;
        let pod = self.pod.clone().or_else(|| self.current.pod.clone());
        let refresh = async {
            let supplied = self.supplied.as_ref();
            let (token, info) =
                renewal_token(&inner, who, &self.current, supplied, pod.as_ref(), deadline).await?;
            exchange(&inner, who, token, info, pod, deadline).await
        };
        inner.counted(inner.workload_kind, "ahead", refresh).await
    }

    async fn store(&self, session: &Session) {
        if let Some(inner) = self.inner.upgrade() {
            let current = &self.current;
            (inner.workloads)
                .replace_if(&self.key, session.clone(), |s| s.same(current))
                .await;
        }
    }
}

/// A token of the provider's own TokenRequest: proven by where it came from (the API
/// server over TLS, answering the provider's credentials), so only its claims are read.
async fn request_token(
    inner: &Inner,
    namespace: &str,
    service_account: &str,
    (pod_name, pod_uid): &(String, String),
    deadline: tokio::time::Instant,
) -> Result<(SecretString, TokenInfo), AuthError> {
    let token = inner
        .kube()?
        .token_request(
            namespace,
            service_account,
            &inner.config.workload_audience,
            (pod_name, pod_uid),
            inner.config.token_request_expiration.as_secs(),
            deadline,
        )
        .await?;
    let info = check_token(
        &token,
        namespace,
        service_account,
        Some((pod_name, pod_uid)),
        inner.now(),
    )?;
    Ok((token, info))
}

/// One exchange of `token` by the node's mechanism, with a session key no token is bound to
/// (generated ahead, or a refused exchange's); a definite refusal is remembered.
async fn exchange(
    inner: &Inner,
    who: (&str, &str),
    token: SecretString,
    info: TokenInfo,
    pod: Option<(String, String)>,
    deadline: tokio::time::Instant,
) -> Result<Session, AuthError> {
    let (namespace, service_account) = who;
    let key = inner.session_keys.take().await?;
    let exchanged = match &inner.config.workload_mechanism {
        WorkloadMechanism::Oke => {
            super::proxymux::exchange(inner, who, &token, &key, deadline).await
        }
        WorkloadMechanism::Federation(config) => {
            super::federation::exchange(inner, config, who, &token, &key, deadline).await
        }
    };
    let exchanged = match exchanged {
        Ok(exchanged) => exchanged,
        Err(error) => {
            inner.session_keys.give_back(key, &error);
            let error = inner
                .refusals
                .remember(namespace, service_account, error, inner.now());
            return Err(error);
        }
    };
    inner.refusals.forget(namespace, service_account);
    let credential = Credential::Workload {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        service_account_uid: info.uid,
    };
    Ok(Session(Arc::new(SessionState {
        identity: credential.identity(),
        credential: Arc::new(credential),
        key: SigningKey::new(KeyId::security_token(&exchanged.token), exchanged.key),
        exp: exchanged.exp,
        refresh_at: exchanged.refresh_at,
        sa_token: token,
        sa_exp: info.exp,
        pod,
        invalidated: Arc::new(AtomicBool::new(false)),
    })))
}
