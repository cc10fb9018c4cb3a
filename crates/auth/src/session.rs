//! An established identity as a capability: what signs a mount's requests and, after OCI
//! refuses it, how to renew it within the request's deadline. [`crate::Principals`] hands one
//! out with every [`crate::Established`]; the provider puts it in the extensions of each of
//! the mount's requests (never in a cache key: a cached answer is keyed by its
//! [`Credential`]), and the signing layer signs with it.

use std::fmt;
use std::sync::Arc;

use crate::signing::{BoxFuture, KeyId, SigningKey};
use crate::{AuthError, Credential, Identity};

/// What renews a session (the principal that established it).
pub(crate) trait Renew: Send + Sync + fmt::Debug + 'static {
    /// OCI refused `rejected`: stop handing it out (only that key: several requests refused
    /// at once must not discard a key another of them already renewed).
    fn invalidate<'a>(&'a self, rejected: &'a KeyId) -> BoxFuture<'a, ()>;

    /// A fresh key for the same identity by `deadline`; `None` when this principal does not
    /// renew within a request (a user key: the next mount reads the Secret again) or the
    /// identity is gone (a recreated service account).
    fn renew(
        &self,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'_, Result<Option<SigningKey>, AuthError>>;
}

/// One mount's established credential and its signing key. Cheap to clone.
#[derive(Clone)]
pub struct Session {
    credential: Credential,
    key: SigningKey,
    renewal: Option<Arc<dyn Renew>>,
}

impl Session {
    /// A session signing with `key` that is never renewed (a refused key stays refused):
    /// a caller's own fixed key, or tests.
    pub fn fixed(credential: Credential, key: SigningKey) -> Self {
        Self {
            credential,
            key,
            renewal: None,
        }
    }

    pub(crate) fn renewable(
        credential: Credential,
        key: SigningKey,
        renewal: Arc<dyn Renew>,
    ) -> Self {
        Self {
            credential,
            key,
            renewal: Some(renewal),
        }
    }

    /// Exactly which credential this is (what cached answers are keyed by).
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// Who the requests are made as.
    pub fn identity(&self) -> Identity {
        self.credential.identity()
    }

    /// The key id and private key requests are signed with.
    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// OCI refused `rejected`: the principal stops handing it out.
    pub async fn invalidate(&self, rejected: &KeyId) {
        if let Some(renewal) = &self.renewal {
            renewal.invalidate(rejected).await;
        }
    }

    /// A fresh key for this identity, by `deadline`: `Ok(None)` when it cannot be renewed
    /// within a request (a fixed key, a user key, a recreated service account).
    pub async fn renew(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Option<SigningKey>, AuthError> {
        let Some(renewal) = &self.renewal else {
            return Ok(None);
        };
        tokio::time::timeout_at(deadline, renewal.renew(deadline))
            .await
            .map_err(|_| AuthError::DeadlineExceeded("renewing credentials after a 401"))?
    }

    /// A session of `credential` with a process-wide test key (RSA, loaded once), for tests
    /// of services that carry a session but never reach OCI.
    #[cfg(any(test, feature = "test-support"))]
    pub fn for_tests(credential: Credential) -> Self {
        static KEY: std::sync::OnceLock<Arc<crate::PrivateKey>> = std::sync::OnceLock::new();
        let key = KEY.get_or_init(|| {
            let pem = include_bytes!("../tests/data/rsa-pkcs1.pem");
            #[allow(clippy::expect_used)] // reason: a key in the crate's own test data
            Arc::new(crate::PrivateKey::from_pem(pem, None).expect("the test key parses"))
        });
        Self::fixed(
            credential,
            SigningKey::new(KeyId::new("test/test/test"), key.clone()),
        )
    }
}

impl PartialEq for Session {
    /// The same credential with the same key.
    fn eq(&self, other: &Self) -> bool {
        self.credential == other.credential
            && self.key.key_id().expose_secret() == other.key.key_id().expose_secret()
    }
}

impl Eq for Session {}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key id's Debug redacts security tokens; the private key is never shown.
        f.debug_struct("Session")
            .field("credential", &self.credential)
            .field("key_id", self.key.key_id())
            .field("renewable", &self.renewal.is_some())
            .finish()
    }
}
