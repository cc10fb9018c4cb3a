//! What a secret bundle is cached under: everything its content depends on, the credential
//! that fetched it first.

use auth::Credential;
use tokio::time::Instant;

use crate::{SecretBundle, SecretRef, SecretRequest, Selector};

/// The OCI API a bundle comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// The Secrets retrieval API (`secrets.vaults.{region}...`).
    Secrets,
}

/// The representation OCI was asked for (`secretBundleType`; the Secrets API has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BundleType {
    /// Base64 content (the API's default and only type for secrets).
    Base64,
}

/// The cache key of one [`SecretRequest`]: two requests with equal keys get the same
/// bytes. It contains the credential (for a user principal the Secret's resourceVersion
/// and the loaded key's fingerprint; for workload identity the service account's uid; for
/// the instance principal tenancy and instance), so a value fetched with one credential is
/// never served to another, even when both may read the secret.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BundleKey {
    /// Who fetched it.
    pub credential: std::sync::Arc<Credential>,
    /// Which API.
    pub api: Api,
    /// The endpoint, which names the region (`https://secrets.vaults.{region}...`).
    pub endpoint: String,
    /// The vault and name, or the secret OCID.
    pub secret: SecretRef,
    /// Stage, version number or version name.
    pub selector: Selector,
    /// The bundle type asked for.
    pub bundle_type: BundleType,
}

impl cache::CacheKey for SecretRequest {
    type Key = BundleKey;

    fn cache_key(&self) -> BundleKey {
        // Destructured without `..`: a field added to the request must be placed in the
        // key (or named here as not part of it) before this compiles.
        let SecretRequest {
            base_url,
            session,
            secret,
            selector,
            deadline: _,
            // The hook is the caller's budget, not what is asked: requests that differ only
            // in it get one answer, and a joined caller waits on the first caller's fetch,
            // whose hook is the one told of its backoffs.
            backoff: _,
        } = self;
        BundleKey {
            credential: session.shared_credential().clone(),
            api: Api::Secrets,
            endpoint: base_url.trim_end_matches('/').to_owned(),
            secret: secret.clone(),
            selector: selector.clone(),
            bundle_type: BundleType::Base64,
        }
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl cache::CacheValue for SecretBundle {
    /// The secret bytes, and the names beside them.
    fn bytes(&self) -> usize {
        let SecretBundle {
            secret_id,
            version_number: _,
            version_name,
            stages,
            content,
            opc_request_id,
        } = self;
        content.len()
            + secret_id.len()
            + version_name.as_ref().map_or(0, String::len)
            + stages.len() * 16
            + opc_request_id.as_ref().map_or(0, String::len)
    }
}

#[cfg(test)]
mod tests {
    use cache::CacheKey as _;

    use super::*;
    use crate::Stage;

    fn user(field: usize) -> Credential {
        let mut values = [
            "ns",
            "secret",
            "7",
            "aa:bb",
            "ocid1.user..u",
            "ocid1.tenancy..t",
        ]
        .map(String::from);
        if let Some(v) = values.get_mut(field) {
            v.push('x');
        }
        let [
            namespace,
            secret_name,
            resource_version,
            key_fingerprint,
            user,
            tenancy,
        ] = values;
        Credential::User {
            namespace,
            secret_name,
            resource_version,
            key_fingerprint,
            user,
            tenancy,
        }
    }

    fn workload(field: usize) -> Credential {
        let mut values = ["ns", "sa", "uid-1"].map(String::from);
        if let Some(v) = values.get_mut(field) {
            v.push('x');
        }
        let [namespace, service_account, uid] = values;
        Credential::Workload {
            namespace,
            service_account,
            service_account_uid: Some(uid),
        }
    }

    fn instance(field: usize) -> Credential {
        let mut values = ["ocid1.tenancy..t", "ocid1.instance..i"].map(String::from);
        if let Some(v) = values.get_mut(field) {
            v.push('x');
        }
        let [tenancy, instance] = values;
        Credential::Instance { tenancy, instance }
    }

    struct NoHook;

    impl crate::BackoffHook for NoHook {
        fn pausing(&self) {}
        fn resuming(&self) -> bool {
            true
        }
    }

    fn request(credential: Credential) -> SecretRequest {
        SecretRequest {
            base_url: "https://secrets.vaults.us-ashburn-1.oci.oraclecloud.com".into(),
            session: auth::Session::for_tests(credential),
            secret: SecretRef::ByName {
                vault_id: "ocid1.vault..v".into(),
                name: "db".into(),
            },
            selector: Selector::Stage(Stage::Current),
            deadline: Instant::now(),
            backoff: crate::Backoff::none(),
        }
    }

    /// Every field of every credential kind is in the key: changing any one of them gives
    /// another key. (A field added to `Credential` without being set here fails to
    /// compile in the destructuring constructors above.)
    #[test]
    fn every_identity_field_of_every_principal_kind_is_in_the_key() {
        for (kind, make, fields) in [
            ("user", user as fn(usize) -> Credential, 6),
            ("workload", workload, 3),
            ("instance", instance, 2),
        ] {
            let base = request(make(usize::MAX)).cache_key();
            for field in 0..fields {
                let changed = request(make(field)).cache_key();
                assert_ne!(base, changed, "{kind} field {field} is not in the key");
            }
        }
        let no_uid = Credential::Workload {
            namespace: "ns".into(),
            service_account: "sa".into(),
            service_account_uid: None,
        };
        assert_ne!(
            request(workload(usize::MAX)).cache_key(),
            request(no_uid).cache_key()
        );
        // Two kinds never collide.
        assert_ne!(
            request(user(usize::MAX)).cache_key(),
            request(instance(usize::MAX)).cache_key()
        );
    }

    #[test]
    fn every_request_field_but_the_deadline_and_the_backoff_hook_is_in_the_key() {
        let base = request(workload(usize::MAX));
        let key = base.cache_key();
        let mut other = base.clone();
        other.base_url = "https://secrets.vaults.eu-frankfurt-1.oci.oraclecloud.com".into();
        assert_ne!(other.cache_key(), key, "the region");
        let mut other = base.clone();
        other.secret = SecretRef::ByName {
            vault_id: "ocid1.vault..w".into(),
            name: "db".into(),
        };
        assert_ne!(other.cache_key(), key, "the vault");
        let mut other = base.clone();
        other.secret = SecretRef::ByName {
            vault_id: "ocid1.vault..v".into(),
            name: "db2".into(),
        };
        assert_ne!(other.cache_key(), key, "the name");
        let mut other = base.clone();
        other.secret = SecretRef::ById {
            secret_id: "ocid1.vaultsecret..s".into(),
        };
        assert_ne!(other.cache_key(), key, "by id");
        for selector in [
            Selector::Stage(Stage::Previous),
            Selector::VersionNumber(2),
            Selector::VersionName("v2".into()),
        ] {
            let mut other = base.clone();
            other.selector = selector.clone();
            assert_ne!(other.cache_key(), key, "{selector:?}");
        }
        let mut other = base.clone();
        other.deadline += std::time::Duration::from_secs(5);
        assert_eq!(other.cache_key(), key, "the deadline is not");
        let mut other = base.clone();
        other.backoff = crate::Backoff::new(std::sync::Arc::new(NoHook));
        assert_eq!(other.cache_key(), key, "the backoff hook is not");
        let mut other = base;
        other.base_url.push('/');
        assert_eq!(other.cache_key(), key, "a trailing slash is not");
    }
}
