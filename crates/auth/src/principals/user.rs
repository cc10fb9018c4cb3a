//! The user principal (spec 5): an API key from a Kubernetes Secret in the pod's namespace,
//! cached for a TTL and dropped after a 401.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use zeroize::Zeroizing;

use super::{IdentityRequest, Inner};
use crate::error::{AuthError, UserSecretError};
use crate::session::Invalidated;
use crate::signing::{BoxFuture, KeyId, SigningKey};
use crate::{Credential, PrivateKey};
use regions::Region;

/// A loaded user key and where its calls go.
#[derive(Clone, Debug)]
pub(crate) struct UserKey {
    key: SigningKey,
    region: Region,
    credential: Arc<Credential>,
}

impl cache::CacheValue for UserKey {
    /// What the entry really holds: the key, and every string kept beside it (the
    /// credential's names, the key id, the rejection hint, the region), each bounded when
    /// the Secret was read.
    fn bytes(&self) -> usize {
        let Credential::User {
            namespace,
            secret_name,
            resource_version,
            key_fingerprint,
            user,
            tenancy,
        } = &*self.credential
        else {
            return super::CREDENTIAL_BYTES;
        };
        super::CREDENTIAL_BYTES
            + [
                namespace,
                secret_name,
                resource_version,
                key_fingerprint,
                user,
                tenancy,
            ]
            .iter()
            .map(|s| s.len())
            .sum::<usize>()
            + self.key.key_id().expose_secret().len()
            + self.key.rejection_hint().map_or(0, str::len)
            + self.region.id().len()
            + self.region.domain().map_or(0, str::len)
    }
}

/// The largest `config` member a user Secret may have (the four required lines and a
/// passphrase take a few hundred bytes).
const MAX_CONFIG_BYTES: usize = 16 * 1024;

/// The longest value of a `config` member, refused as it is read.
const MAX_MEMBER_BYTES: usize = 1024;

/// How the refusal of a long member begins.
const TOO_LONG: &str = "a value of";

/// The longest OCID (user, tenancy).
const MAX_OCID_BYTES: usize = 255;

/// A scalar YAML value as text (`fingerprint: 12:bf:...` is a string, but `region: 1`
/// would be a number); mappings and sequences are refused.
struct Scalar(Zeroizing<String>);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        impl Visitor<'_> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar string value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                if v.len() > MAX_MEMBER_BYTES {
                    return Err(E::custom(format_args!(
                        "{TOO_LONG} {} bytes, longer than the {MAX_MEMBER_BYTES} a member takes",
                        v.len()
                    )));
                }
                Ok(Scalar(Zeroizing::new(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
                let v = Zeroizing::new(v);
                self.visit_str(&v)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(Zeroizing::new(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(Zeroizing::new(v.to_string())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(Zeroizing::new(v.to_string())))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(Zeroizing::new(v.to_string())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar(Zeroizing::new(String::new())))
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}

#[derive(Deserialize)]
struct Config {
    auth: Option<BTreeMap<String, Scalar>>,
}

pub(super) async fn establish(
    inner: &Arc<Inner>,
    request: &IdentityRequest,
    secret_name: &str,
) -> Result<super::Established, AuthError> {
    let namespace = request.namespace()?;
    if secret_name.is_empty() {
        return Err(AuthError::MissingRequestField("authSecretName"));
    }
    let loaded = cached_or_load(inner, namespace, secret_name, request.deadline)
        .await
        .map_err(|e| {
            // The Secret read is the only Kubernetes call here; its 403 says whose RBAC to
            // change, which depends on who runs the provider. (A waiter of the single
            // flight gets the loader's error shared.)
            let status = match &e {
                AuthError::Shared(shared) => shared.as_ref(),
                other => other,
            };
            if matches!(
                status,
                AuthError::Status {
                    endpoint: crate::Endpoint::Kubernetes,
                    status: 403,
                    ..
                }
            ) {
                AuthError::SecretForbidden {
                    namespace: namespace.to_owned(),
                    name: secret_name.to_owned(),
                    caller: request.caller,
                }
            } else {
                e
            }
        })?;
    Ok(super::Established {
        region: Some(loaded.region.clone()),
        session: crate::Session::renewable(
            loaded.credential.clone(),
            loaded.key.clone(),
            Arc::new(Renewal {
                inner: Arc::clone(inner),
                secret: (namespace.to_owned(), secret_name.to_owned()),
            }),
            Some(loaded.region.clone()),
        ),
    })
}

/// What a user key does after OCI refuses it: the cached key is dropped (if it is still the
/// refused one), so the next mount reads the Secret again; it is not renewed within a
/// request (a new key means someone edited the Secret, which a retry would not wait for).
pub(super) struct Renewal {
    inner: Arc<Inner>,
    /// The Secret's namespace and name.
    secret: (String, String),
}

impl fmt::Debug for Renewal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("user::Renewal")
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

impl crate::session::Renew for Renewal {
    fn invalidate<'a>(&'a self, rejected: &'a KeyId) -> BoxFuture<'a, Invalidated> {
        Box::pin(async move {
            let same =
                |user: &UserKey| user.key.key_id().expose_secret() == rejected.expose_secret();
            if !self.inner.users.invalidate_if(&self.secret, same).await {
                return Invalidated::Replaced;
            }
            tracing::debug!(namespace = %self.secret.0, secret = %self.secret.1,
                "user key dropped after a 401 from oci");
            Invalidated::Dropped
        })
    }

    fn renew(
        &self,
        _deadline: tokio::time::Instant,
    ) -> BoxFuture<'_, Result<Option<SigningKey>, AuthError>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    fn count(&self, invalidated: &Invalidated) {
        self.inner.count_renewal("user", invalidated);
    }
}

/// The key of `namespace/secret_name`: the cached one while younger than the TTL, else the
/// Secret read again (single flight per Secret).
async fn cached_or_load(
    inner: &Inner,
    namespace: &str,
    secret_name: &str,
    deadline: tokio::time::Instant,
) -> Result<UserKey, AuthError> {
    // The cache's TTL is `user_secret_ttl`: a key older than that is read again.
    let (loaded, _) = inner
        .users
        .get_or_fetch(
            &(namespace.to_owned(), secret_name.to_owned()),
            deadline,
            |_| true,
            |stale| {
                inner.counted(
                    "user",
                    super::op(&stale),
                    load(inner, namespace, secret_name, deadline),
                )
            },
        )
        .await?;
    Ok(loaded)
}

/// Reads the user principal's Secret and loads its key: the Secret's members
/// ([`UserConfig::parse`]), the key behind the failed-key cache and the key gate
/// ([`load_key`]), then the signing key with its fingerprint check ([`signing_key`]).
async fn load(
    inner: &Inner,
    namespace: &str,
    name: &str,
    deadline: tokio::time::Instant,
) -> Result<UserKey, AuthError> {
    let secret = inner
        .kube()?
        .secret(namespace, name, deadline)
        .await?
        .ok_or_else(|| AuthError::UserSecretNotFound {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })?;
    let malformed = |problem: UserSecretError| AuthError::UserSecret {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        problem,
    };
    let config = UserConfig::parse(&secret.data).map_err(malformed)?;
    // The Secret is the tenant's: only a region the provider knows (never a host).
    let region = inner
        .regions
        .resolve_known(&config.region)
        .map_err(|e| malformed(UserSecretError::Region(e)))?;
    let version = secret.resource_version.clone();
    let key = load_key(
        inner,
        (namespace, name),
        version.as_deref(),
        &config,
        deadline,
    )
    .await?
    .map_err(|e| malformed(UserSecretError::Key(e)))?;
    let actual = key.fingerprint();
    Ok(UserKey {
        key: signing_key(key, &config, (namespace, name)),
        region,
        credential: Arc::new(Credential::User {
            namespace: namespace.to_owned(),
            secret_name: name.to_owned(),
            resource_version: version.unwrap_or_default(),
            key_fingerprint: actual,
            user: config.user,
            tenancy: config.tenancy,
        }),
    })
}

/// What a user principal's Secret holds, checked (spec 5.1): `config` is YAML with an
/// `auth` mapping of the four required members, and `private-key` is not empty.
struct UserConfig {
    tenancy: String,
    region: String,
    fingerprint: String,
    user: String,
    passphrase: Option<Zeroizing<Vec<u8>>>,
    pem: Zeroizing<Vec<u8>>,
}

impl UserConfig {
    const REQUIRED: [(&'static str, &'static str); 4] = [
        (
            "tenancy",
            "Auth.Tenancy: Required value: Tenancy is required for user principal",
        ),
        (
            "region",
            "Auth.Region: Required value: Region is required for user principal",
        ),
        (
            "fingerprint",
            "Auth.Fingerprint: Required value: Fingerprint is required for user principal",
        ),
        (
            "user",
            "Auth.UserID: Required value: UserID is required for user principal",
        ),
    ];

    fn parse(data: &BTreeMap<String, Zeroizing<Vec<u8>>>) -> Result<Self, UserSecretError> {
        let config = data
            .get("config")
            .filter(|c| !c.is_empty())
            .ok_or(UserSecretError::EmptyConfig)?;
        // The tenant's document: parsed within a budget (aliases cannot multiply it), its
        // values bounded as they are read. Errors give the position only: the text around
        // it may be a passphrase.
        let budget = bounded::ParseBudget::new(MAX_CONFIG_BYTES);
        let config: Config = bounded::yaml::from_slice(config, &budget).map_err(|e| {
            UserSecretError::InvalidConfig(match e {
                bounded::ParseError::TooLarge { len, max } => {
                    format!(
                        "it is {len} bytes, more than the {max} a user principal's config may have"
                    )
                }
                bounded::ParseError::NotUtf8 { .. } => "it is not utf-8".into(),
                e if e.is_budget() => e.to_string(),
                // Our own refusal of a long value names its length, never its text.
                bounded::ParseError::Invalid { detail, .. } if detail.starts_with(TOO_LONG) => {
                    detail
                }
                e => match e.position() {
                    Some((line, column)) => format!(
                        "not a yaml mapping of strings under auth at line {line} column {column}"
                    ),
                    None => "not a yaml mapping of strings under auth".to_owned(),
                },
            })
        })?;
        let auth = config
            .auth
            .ok_or_else(|| UserSecretError::InvalidConfig("there is no auth mapping".into()))?;
        let get = |key: &str| {
            auth.get(key)
                .map(|v| v.0.as_str())
                .filter(|v| !v.is_empty())
        };
        // Checked before the members, as in the Go provider (spec 5.1 step 4).
        let pem = data
            .get("private-key")
            .filter(|k| !k.is_empty())
            .ok_or(UserSecretError::EmptyPrivateKey)?;
        let missing: Vec<&'static str> = Self::REQUIRED
            .iter()
            .filter(|(key, _)| get(key).is_none())
            .map(|(_, message)| *message)
            .collect();
        let (Some(tenancy), Some(region), Some(fingerprint), Some(user)) = (
            get("tenancy"),
            get("region"),
            get("fingerprint"),
            get("user"),
        ) else {
            return Err(UserSecretError::Missing(missing));
        };
        check_ocid("tenancy", tenancy)?;
        check_ocid("user", user)?;
        let fingerprint = fingerprint.trim();
        check_fingerprint(fingerprint)?;
        Ok(Self {
            tenancy: tenancy.to_owned(),
            region: region.to_owned(),
            fingerprint: fingerprint.to_owned(),
            user: user.to_owned(),
            passphrase: get("passphrase").map(|p| Zeroizing::new(p.as_bytes().to_vec())),
            pem: Zeroizing::new(pem.to_vec()),
        })
    }
}

/// Decrypts the Secret's key through the node's key gate, unless this Secret version
/// already failed within the TTL (the same broken version is not decrypted again). The
/// outer error is the gate's (busy, deadline); the inner one the key's.
async fn load_key(
    inner: &Inner,
    (namespace, name): (&str, &str),
    version: Option<&str>,
    config: &UserConfig,
    deadline: tokio::time::Instant,
) -> Result<Result<PrivateKey, Arc<crate::KeyError>>, AuthError> {
    let cache_key = (namespace.to_owned(), name.to_owned());
    let ttl = inner.config.user_secret_ttl;
    if let Some(version) = version
        && let Some(error) = inner.failed_keys.get(&cache_key, version, inner.now(), ttl)
    {
        return Ok(Err(error));
    }
    let pem = config.pem.clone();
    let passphrase = config.passphrase.clone();
    let loaded = inner
        .key_gate
        .run(namespace, deadline, move || {
            PrivateKey::from_pem(&pem, passphrase.as_ref().map(|p| p.as_slice()))
        })
        .await?;
    Ok(match loaded {
        Ok(key) => {
            inner.failed_keys.remove(&cache_key);
            Ok(key)
        }
        Err(error) => {
            let error = Arc::new(error);
            if let Some(version) = version {
                inner.failed_keys.insert(
                    cache_key,
                    version.to_owned(),
                    inner.now(),
                    ttl,
                    error.clone(),
                );
            }
            Err(error)
        }
    })
}

/// The signing key, with the Secret's key id. A configured fingerprint that differs from
/// the key's is used as given (as the Go provider does), with a warning and a hint for
/// the 401 that will likely follow.
fn signing_key(
    key: PrivateKey,
    config: &UserConfig,
    (namespace, name): (&str, &str),
) -> SigningKey {
    let actual = key.fingerprint();
    let (tenancy, user, fingerprint) = (&config.tenancy, &config.user, &config.fingerprint);
    let signing = SigningKey::new(
        KeyId::new(format!("{tenancy}/{user}/{fingerprint}")),
        Arc::new(key),
    );
    if actual.eq_ignore_ascii_case(fingerprint) {
        return signing;
    }
    tracing::warn!(
        namespace,
        secret = name,
        configured = %fingerprint,
        key = %actual,
        "the configured fingerprint does not match the private key; using it as given"
    );
    signing.with_rejection_hint(format!(
        "the configured fingerprint {fingerprint} differs from the private key's fingerprint {actual}"
    ))
}

/// An OCID of the Secret's `config` (`user`, `tenancy`): at most 255 characters of the
/// OCID alphabet, starting `ocid1.`, checked before anything keeps it. Its value is not
/// echoed (only its length): it may not be an OCID at all.
fn check_ocid(member: &'static str, value: &str) -> Result<(), UserSecretError> {
    let alphabet = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':');
    if value.len() <= MAX_OCID_BYTES && value.starts_with("ocid1.") && value.bytes().all(alphabet) {
        return Ok(());
    }
    Err(UserSecretError::InvalidMember {
        member,
        expected: "an OCID (ocid1.…, at most 255 letters, digits, dots, hyphens, underscores \
                   or colons)",
        len: value.len(),
    })
}

/// The `fingerprint` of the Secret's `config`: an API key's MD5 fingerprint, sixteen
/// colon-separated pairs of hex digits.
fn check_fingerprint(value: &str) -> Result<(), UserSecretError> {
    let pairs: Vec<&str> = value.split(':').collect();
    let valid = pairs.len() == 16
        && pairs
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    if valid {
        return Ok(());
    }
    Err(UserSecretError::InvalidMember {
        member: "fingerprint",
        expected: "an API key fingerprint (16 colon-separated pairs of hex digits, e.g. \
                   12:bf:...:9c)",
        len: value.len(),
    })
}

/// Loads a user principal's Secret from the API server's answer as a mount would (the
/// Secret's JSON, its `config`, the checks of its members, the key decoded) and answers
/// the bytes the cached key would be weighed at: for the peak-heap tests of other crates,
/// which measure what a tenant's Secret may make the provider allocate.
#[cfg(feature = "test-support")]
pub fn load_user_secret_for_tests(body: &[u8]) -> Result<usize, String> {
    let secret = crate::kube::secret_from_body(body, "ns", "secret").map_err(|e| e.to_string())?;
    let config = UserConfig::parse(&secret.data).map_err(|e| e.to_string())?;
    let region = regions::Regions::default()
        .resolve_known(&config.region)
        .map_err(|e| e.to_string())?;
    let key = PrivateKey::from_pem(
        &config.pem,
        config.passphrase.as_ref().map(|p| p.as_slice()),
    )
    .map_err(|e| e.to_string())?;
    let fingerprint = key.fingerprint();
    let loaded = UserKey {
        key: signing_key(key, &config, ("ns", "secret")),
        region,
        credential: Arc::new(Credential::User {
            namespace: "ns".into(),
            secret_name: "secret".into(),
            resource_version: secret.resource_version.unwrap_or_default(),
            key_fingerprint: fingerprint,
            user: config.user,
            tenancy: config.tenancy,
        }),
    };
    Ok(cache::CacheValue::bytes(&loaded))
}
