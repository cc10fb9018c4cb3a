//! An established identity as a capability: what signs a mount's requests and, after OCI
//! refuses it, how to renew it within the request's deadline. [`crate::Principals`] hands one
//! out with every [`crate::Established`]; the provider puts it in the extensions of each of
//! the mount's requests (never in a cache key: a cached answer is keyed by its
//! [`Credential`]), and the signing layer signs with it.
//!
//! A session also knows the principal's own region (where it was established) and the region
//! its requests go to ([`Session::toward`]): only a 401 from the principal's own region may
//! act on the credential the principals share. A tenant names the other regions, and a 401
//! there (a tenancy not subscribed to the region, say) says nothing about the credential.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use regions::Region;

use crate::signing::{BoxFuture, KeyId, SigningKey};
use crate::{AuthError, Credential, Identity};

/// What renews a session (the principal that established it).
pub(crate) trait Renew: Send + Sync + fmt::Debug + 'static {
    /// OCI refused `rejected` in the principal's own region: stop handing it out, unless
    /// another request already did (only that key: several requests refused at once must
    /// not discard a key another of them already renewed) or the principal renewed moments
    /// ago.
    fn invalidate<'a>(&'a self, rejected: &'a KeyId) -> BoxFuture<'a, Invalidated>;

    /// A fresh key for the same identity by `deadline`; `None` when this principal does not
    /// renew within a request (a user key: the next mount reads the Secret again) or the
    /// identity is gone (a recreated service account).
    fn renew(
        &self,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'_, Result<Option<SigningKey>, AuthError>>;

    /// Counts what became of a 401 (`oci_provider_credential_renewals_total`).
    fn count(&self, invalidated: &Invalidated);
}

/// What became of a key OCI refused (HTTP 401), as [`Session::invalidate`] answers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Invalidated {
    /// Dropped by this 401: the principal renews it (federation, exchange; a user key is
    /// read again from its Secret by the next mount).
    Dropped,
    /// Another request's 401 dropped it already, or its renewal replaced it: renewing joins
    /// that renewal.
    Replaced,
    /// Kept: the principal renewed it `ago`, within its `cool_down`, and does not renew it
    /// again before the cool-down is over; the request fails.
    CoolingDown {
        /// Since the last renewal after a 401.
        ago: Duration,
        /// The principal's cool-down between two renewals after a 401.
        cool_down: Duration,
    },
    /// Kept: the request went to `region`, not to the principal's own region `home`; the
    /// request fails and the credential serves on.
    OtherRegion {
        /// Where the refused request went.
        region: Region,
        /// The principal's own region.
        home: Region,
    },
    /// A fixed key: nothing to drop or renew.
    Fixed,
}

impl Invalidated {
    /// The `outcome` label of the renewal counter.
    pub fn label(&self) -> &'static str {
        match self {
            Invalidated::Dropped => "renewed",
            Invalidated::Replaced => "joined",
            Invalidated::CoolingDown { .. } => "cooling_down",
            Invalidated::OtherRegion { .. } => "other_region",
            Invalidated::Fixed => "fixed",
        }
    }

    /// The error the request fails with when the key was kept: within the cool-down or in
    /// another region. `None` when renewing may go on.
    pub(crate) fn refusal(&self, identity: &Identity, code: Option<String>) -> Option<AuthError> {
        match self {
            Invalidated::CoolingDown { ago, cool_down } => Some(AuthError::RenewedMomentsAgo {
                identity: identity.clone(),
                code,
                ago_secs: ago.as_secs(),
                cool_down_secs: cool_down.as_secs(),
            }),
            Invalidated::OtherRegion { region, home } => Some(AuthError::RefusedInRegion {
                identity: identity.clone(),
                code,
                regions: Box::new((region.clone(), home.clone())),
            }),
            Invalidated::Dropped | Invalidated::Replaced | Invalidated::Fixed => None,
        }
    }
}

/// One mount's established credential and its signing key. Cheap to clone.
#[derive(Clone)]
pub struct Session {
    credential: Arc<Credential>,
    key: SigningKey,
    renewal: Option<Arc<dyn Renew>>,
    /// The principal's own region, where the credential was established: `None` when not
    /// known (workload identity without a configured region, a fixed key).
    home: Option<Region>,
    /// Where the requests signed with this session go, when [`Session::toward`] said it is
    /// another region than `home`.
    abroad: Option<Region>,
}

impl Session {
    /// A session signing with `key` that is never renewed (a refused key stays refused):
    /// a caller's own fixed key, or tests.
    pub fn fixed(credential: Credential, key: SigningKey) -> Self {
        Self {
            credential: Arc::new(credential),
            key,
            renewal: None,
            home: None,
            abroad: None,
        }
    }

    pub(crate) fn renewable(
        credential: Arc<Credential>,
        key: SigningKey,
        renewal: Arc<dyn Renew>,
        home: Option<Region>,
    ) -> Self {
        Self {
            credential,
            key,
            renewal: Some(renewal),
            home,
            abroad: None,
        }
    }

    /// This session for requests to `region` (`None`: the principal's own, as its region is
    /// not known). The caller that builds a request's URL from a region says which: the
    /// signing layer sees only a host, and an operator's endpoint overrides may map regions
    /// to any host. A request to a region other than the principal's own gets
    /// [`Invalidated::OtherRegion`] for a 401: it fails, and the credential the principal
    /// shares with every other mount is kept. When the principal's own region is not known,
    /// every region counts as its own.
    pub fn toward(&self, region: Option<&Region>) -> Self {
        let abroad = match (&self.home, region) {
            (Some(home), Some(region)) if home.id() != region.id() => Some(region.clone()),
            _ => None,
        };
        Self {
            abroad,
            ..self.clone()
        }
    }

    /// Exactly which credential this is (what cached answers are keyed by).
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// The credential, shared: what a cache key holds (a reference count, not a copy).
    pub fn shared_credential(&self) -> &Arc<Credential> {
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

    /// OCI refused `rejected`: the principal stops handing it out, unless the request went
    /// to another region than the principal's own or the principal renewed it moments ago.
    pub async fn invalidate(&self, rejected: &KeyId) -> Invalidated {
        let Some(renewal) = &self.renewal else {
            return Invalidated::Fixed;
        };
        let invalidated = match (&self.abroad, &self.home) {
            (Some(region), Some(home)) => Invalidated::OtherRegion {
                region: region.clone(),
                home: home.clone(),
            },
            _ => renewal.invalidate(rejected).await,
        };
        renewal.count(&invalidated);
        invalidated
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
            .field("home", &self.home.as_ref().map(Region::id))
            .field("abroad", &self.abroad.as_ref().map(Region::id))
            .finish()
    }
}
