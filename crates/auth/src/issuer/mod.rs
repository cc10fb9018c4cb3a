//! The cluster's service-account issuer: its discovery document and signing keys, read
//! from the Kubernetes API through the one transport and cached, and the verification of
//! the service-account tokens mounts supply against them.
//!
//! ARCHITECTURE.md, invariant 12: a token a request supplies is proven before any cached
//! session is served to it. A supplied token arrives in the `csi.storage.k8s.io/serviceAccount.tokens`
//! attribute, which a tenant can also set (a SecretProviderClass parameter of that name
//! survives into the attributes when the CSIDriver requests no tokens, and the sync
//! controller copies class parameters), so its claims alone prove nothing. Its signature is
//! verified here rather than the token exchanged: the kubelet hands every pod its own
//! token, and an exchange per token would cost one proxymux exchange per pod start where
//! there is one per identity.
//!
//! Tokens the provider obtains itself with a TokenRequest are proven by where they came
//! from (the API server, over TLS, answering the provider's own credentials) and are not
//! verified here.
//!
//! Three bounds keep the cost of verification flat whatever a tenant sends: the issuer and
//! its keys are read once an hour ([`KEYS_TTL`]), and again for a key id they lack at most
//! once per [`REFETCH_COOL_DOWN`] (a key rotation); every verdict on a token is kept by the
//! token's SHA-256 for [`VERDICT_TTL`] (never the token), so a flood of one forgery costs
//! one verification, and identical tokens verified at once share one.

mod jwks;
mod jws;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use cache::{Cache, CacheConfig};
use clock::SharedClock;
use secrecy::{ExposeSecret as _, SecretString};

use crate::error::{AuthError, Endpoint};
use crate::jwt;
use crate::kube::KubeApi;
use crate::oidc::{DISCOVERY_PATH, JWKS_PATH};

/// How long the issuer and its keys are used before they are read again.
const KEYS_TTL: Duration = Duration::from_secs(3600);
/// A token naming a key id the cached keys lack makes them be read again (the issuer may
/// have rotated its key), at most once in this long however many such tokens come.
const REFETCH_COOL_DOWN: Duration = Duration::from_secs(30);
/// How long a verdict on one token is kept.
const VERDICT_TTL: Duration = Duration::from_secs(60);
/// The most verdicts kept (distinct tokens seen within [`VERDICT_TTL`]).
const MAX_VERDICTS: u64 = 4096;
/// The most bytes read of either document: 64 keys of 8192 bits take about 90 KiB.
const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// How far in the future a token's `nbf` may be (the clocks of the node and of the API
/// server differ a little).
pub(crate) const NBF_LEEWAY: Duration = Duration::from_secs(60);

/// Why a service-account token was refused: the check that failed. Its message goes in the
/// mount's error (never the token, never a value from it); its label in the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not a token this provider reads (three Base64url parts, JSON header and claims).
    Malformed(&'static str),
    /// `exp` is past or within five minutes.
    Expired,
    /// `nbf` is further in the future than [`NBF_LEEWAY`].
    NotYetValid,
    /// The claims name another namespace, service account or pod, or none.
    Claims(&'static str),
    /// `alg` is not RS256 or ES256 (`none` included), or not the named key's.
    Algorithm,
    /// `kid` names no key the issuer publishes.
    UnknownKey,
    /// The signature does not verify with the key the token names.
    Signature,
    /// `iss` is not the cluster's issuer.
    Issuer,
    /// `aud` lacks `auth.workload_audience`.
    Audience,
}

impl Refusal {
    /// What failed, as the mount's error says it.
    pub(crate) fn message(self) -> &'static str {
        match self {
            Refusal::Malformed(why) | Refusal::Claims(why) => why,
            Refusal::Expired => "it expires within five minutes or has expired",
            Refusal::NotYetValid => "it is not valid yet (its nbf claim is in the future)",
            Refusal::Algorithm => {
                "its signature algorithm (alg) is not RS256 or ES256, or not its key's"
            }
            Refusal::UnknownKey => {
                "its key id (kid) names no key the cluster's service-account issuer publishes \
                 (/openid/v1/jwks): signed by another key?"
            }
            Refusal::Signature => {
                "its signature does not verify with the cluster's service-account issuer key \
                 it names: signed by another key?"
            }
            Refusal::Issuer => {
                "its issuer (iss) is not the cluster's service-account issuer \
                 (/.well-known/openid-configuration)"
            }
            Refusal::Audience => {
                "its audience (aud) does not include the provider's (auth.workload_audience)"
            }
        }
    }

    /// The metrics' `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::Claims(_) => "claims",
            Refusal::Algorithm => "algorithm",
            Refusal::UnknownKey => "unknown_key",
            Refusal::Signature => "signature",
            Refusal::Issuer => "issuer",
            Refusal::Audience => "audience",
        }
    }
}

/// Why a token was not accepted.
#[derive(Debug)]
pub(crate) enum Unverified {
    /// A check failed.
    Refused(Refusal),
    /// The issuer's keys could not be read: the token is neither accepted nor refused, and
    /// not served.
    Unavailable(AuthError),
}

/// The issuer and its keys as last read.
#[derive(Clone, Debug)]
struct IssuerKeys {
    issuer: Arc<str>,
    keys: Arc<[jwks::Key]>,
    /// When they were last read, or a re-read failed: the cool-down runs from here.
    checked: SystemTime,
    expires: SystemTime,
}

impl cache::CacheValue for IssuerKeys {
    fn bytes(&self) -> usize {
        self.issuer.len() + self.keys.len() * jwks::KEY_BYTES
    }

    fn expires(&self) -> Option<SystemTime> {
        Some(self.expires)
    }
}

impl IssuerKeys {
    /// Whether a token naming `kid` can be checked with these keys.
    fn knows(&self, kid: Option<&str>) -> bool {
        match kid {
            Some(kid) => self.keys.iter().any(|k| k.kid() == Some(kid)),
            None => self.keys.len() == 1,
        }
    }

    /// The key a token names: by its `kid`, or the only one when it names none.
    fn find(&self, token: &jws::Jws<'_>) -> Result<&jwks::Key, Refusal> {
        let key = match token.kid() {
            Some(kid) => self.keys.iter().find(|k| k.kid() == Some(kid)),
            None if self.keys.len() == 1 => self.keys.first(),
            None => None,
        }
        .ok_or(Refusal::UnknownKey)?;
        if key.alg() != token.alg() {
            return Err(Refusal::Algorithm);
        }
        Ok(key)
    }
}

/// What was decided of one token (kept by its SHA-256): accepted, or refused and why.
#[derive(Clone, Copy, Debug)]
struct Verdict {
    refusal: Option<Refusal>,
    expires: SystemTime,
}

impl cache::CacheValue for Verdict {
    fn bytes(&self) -> usize {
        64
    }

    fn expires(&self) -> Option<SystemTime> {
        Some(self.expires)
    }
}

/// The cluster's service-account issuer, as the provider sees it: cached keys, cached
/// verdicts, and counters of verifications by outcome.
pub(crate) struct Issuer {
    kube: Option<KubeApi>,
    clock: SharedClock,
    /// `auth.workload_audience`: a token must be for it, unless it is `""`.
    audience: String,
    keys: Cache<(), IssuerKeys>,
    verdicts: Cache<[u8; 32], Verdict>,
    /// Verifications by (result, reason).
    outcomes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl fmt::Debug for Issuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issuer")
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// Nothing is read until the first token comes.
    pub(crate) fn new(kube: Option<KubeApi>, audience: String, clock: SharedClock) -> Self {
        let keys = Cache::new(
            CacheConfig {
                max_entries: 1,
                max_bytes: 1 << 20,
                ..CacheConfig::new("issuer_keys")
            },
            clock.clone(),
        );
        let verdicts = Cache::new(
            CacheConfig {
                max_entries: MAX_VERDICTS,
                max_bytes: MAX_VERDICTS * 64,
                idle: Some(VERDICT_TTL * 2),
                ..CacheConfig::new("token_verdicts")
            },
            clock.clone(),
        );
        Self {
            kube,
            clock,
            audience,
            keys,
            verdicts,
            outcomes: Mutex::new(BTreeMap::new()),
        }
    }

    /// Verifies a supplied token: a JWS of the cluster's issuer (RS256 or ES256, a key it
    /// publishes), for the provider's audience. Its claims (expiry, namespace, service
    /// account, pod) are the caller's to check.
    pub(crate) async fn verify(
        &self,
        token: &SecretString,
        deadline: tokio::time::Instant,
    ) -> Result<(), Unverified> {
        let digest = digest(token);
        let answer = self
            .verdicts
            .get_or_fetch(
                &digest,
                deadline,
                |_| true,
                |_| self.decide(token.expose_secret(), deadline),
            )
            .await;
        match answer {
            Ok((verdict, lookup)) => {
                let result = if verdict.refusal.is_some() {
                    "refused"
                } else {
                    "ok"
                };
                let reason = match verdict.refusal {
                    _ if lookup.is_shared() => "cached",
                    Some(refusal) => refusal.label(),
                    None => "verified",
                };
                self.count(result, reason);
                verdict
                    .refusal
                    .map_or(Ok(()), |r| Err(Unverified::Refused(r)))
            }
            Err(error) => {
                self.count("unavailable", "issuer_keys");
                Err(Unverified::Unavailable(error))
            }
        }
    }

    /// Counts one verification (`ok`, `refused` or `unavailable`, and why).
    pub(crate) fn count(&self, result: &'static str, reason: &'static str) {
        *self
            .outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((result, reason))
            .or_default() += 1;
    }

    /// Verifications so far by (result, reason).
    pub(crate) fn outcomes(&self) -> Vec<((&'static str, &'static str), u64)> {
        self.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// Drops expired verdicts every `every`.
    pub(crate) fn spawn_purger(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        self.verdicts.spawn_purger(every)
    }

    /// One token's verdict. An error is no verdict (the keys could not be read): it is not
    /// kept, and the next mount tries again.
    async fn decide(
        &self,
        token: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Verdict, AuthError> {
        let now = self.clock.now();
        let refused = |refusal| Verdict {
            refusal: Some(refusal),
            expires: now + VERDICT_TTL,
        };
        let jws = match jws::Jws::parse(token) {
            Ok(jws) => jws,
            Err(refusal) => return Ok(refused(refusal)),
        };
        let claims = match jwt::claims(token) {
            Ok(claims) => claims,
            Err(why) => return Ok(refused(Refusal::Malformed(why))),
        };
        let keys = self.keys(jws.kid(), deadline).await?;
        let key = match keys.find(&jws) {
            Ok(key) => key,
            // Refused only until the keys may be read again: a token signed with a key the
            // issuer published meanwhile is accepted once the cool-down is over.
            Err(refusal) => {
                return Ok(Verdict {
                    refusal: Some(refusal),
                    expires: (now + VERDICT_TTL).min(keys.checked + REFETCH_COOL_DOWN),
                });
            }
        };
        if let Err(refusal) = jws.verify(key) {
            return Ok(refused(refusal));
        }
        // The issuer, not the API's URL: a real cluster's issuer is whatever its
        // --service-account-issuer says.
        if jwt::string_at(&claims, &["iss"]).as_deref() != Some(&*keys.issuer) {
            return Ok(refused(Refusal::Issuer));
        }
        // With auth.workload_audience "" the token was asked for the API server's default
        // audiences (its --api-audiences, else its issuer), which nothing the API serves
        // tells: the audience is left to the proxymux's TokenReview, and the issuer check
        // above still ties the token to this cluster.
        if !self.audience.is_empty() && !jwt::has_audience(&claims, &self.audience) {
            return Ok(refused(Refusal::Audience));
        }
        Ok(Verdict {
            refusal: None,
            expires: now + VERDICT_TTL,
        })
    }

    /// The issuer's keys: cached for [`KEYS_TTL`]; read again (one read for all waiting)
    /// when a token names a key id they lack and the last read is older than
    /// [`REFETCH_COOL_DOWN`].
    async fn keys(
        &self,
        kid: Option<&str>,
        deadline: tokio::time::Instant,
    ) -> Result<IssuerKeys, AuthError> {
        let kube = self.kube.as_ref().ok_or_else(|| {
            AuthError::Config(
                "verifying the service-account tokens mounts supply needs the kubernetes api \
                 (the service-account issuer's keys): set kubernetes_api, kubeconfig or \
                 KUBERNETES_SERVICE_HOST"
                    .into(),
            )
        })?;
        let now = self.clock.now();
        let (keys, _) = self
            .keys
            .get_or_fetch(
                &(),
                deadline,
                |keys| keys.knows(kid) || now < keys.checked + REFETCH_COOL_DOWN,
                |stale| self.read(kube, stale, deadline),
            )
            .await?;
        Ok(keys)
    }

    /// Reads the discovery document and the keys. A failed re-read within the keys' life
    /// keeps them (and restarts the cool-down): a key rotation that cannot be seen now does
    /// not take away the keys that still verify every other token.
    async fn read(
        &self,
        kube: &KubeApi,
        stale: Option<IssuerKeys>,
        deadline: tokio::time::Instant,
    ) -> Result<IssuerKeys, AuthError> {
        let malformed = |path: &str, reason: String| AuthError::MalformedResponse {
            endpoint: Endpoint::Kubernetes,
            operation: format!("reading the service-account issuer's {path}"),
            reason,
        };
        let read = async {
            let discovery = kube
                .issuer_document(DISCOVERY_PATH, MAX_DOCUMENT_BYTES, deadline)
                .await?;
            let issuer = jwks::issuer(&discovery).map_err(|r| malformed(DISCOVERY_PATH, r))?;
            let jwks = kube
                .issuer_document(JWKS_PATH, MAX_DOCUMENT_BYTES, deadline)
                .await?;
            let keys = jwks::keys(&jwks).map_err(|r| malformed(JWKS_PATH, r))?;
            Ok::<_, AuthError>((issuer, keys))
        };
        let result = read.await;
        let now = self.clock.now();
        match (result, stale) {
            (Ok((issuer, keys)), _) => {
                tracing::info!(
                    issuer = ?issuer,
                    keys = keys.len(),
                    "read the cluster's service-account issuer keys"
                );
                Ok(IssuerKeys {
                    issuer: issuer.into(),
                    keys: keys.into(),
                    checked: now,
                    expires: now + KEYS_TTL,
                })
            }
            (Err(error), Some(stale)) if now < stale.expires => {
                tracing::warn!(
                    %error,
                    "re-reading the service-account issuer keys failed; the keys read before \
                     serve until they expire"
                );
                Ok(IssuerKeys {
                    checked: now,
                    ..stale
                })
            }
            (Err(error), _) => Err(error),
        }
    }
}

/// The SHA-256 of a token: what its verdict is kept by.
fn digest(token: &SecretString) -> [u8; 32] {
    let digest =
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.expose_secret().as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// The pure parsers of this module, for the property tests in `crate::fuzz`.
#[cfg(test)]
pub(crate) fn fuzz_documents(body: &[u8]) {
    let _ = jwks::issuer(body);
    let _ = jwks::keys(body);
}

#[cfg(test)]
pub(crate) fn fuzz_documents_are_valid(discovery: &[u8], jwks: &[u8]) -> bool {
    jwks::issuer(discovery).is_ok() && jwks::keys(jwks).is_ok_and(|keys| keys.len() == 2)
}

#[cfg(test)]
pub(crate) fn fuzz_jws(token: &str) {
    let _ = jws::Jws::parse(token).map(|jws| (jws.alg(), jws.kid().map(str::len)));
}
