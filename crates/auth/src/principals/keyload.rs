//! User keys that failed to load. The loads themselves go through the one gate of tenant
//! keys (`crate::tenant_keys::TenantKeys`); a load that failed is remembered per Secret
//! and `resourceVersion` for the user-secret TTL: the same broken Secret is not decrypted
//! again on every mount, and a changed Secret is tried at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::key::KeyError;

/// A key that failed to load, for the Secret version it came from.
#[derive(Clone, Debug)]
struct Failure {
    resource_version: String,
    at: SystemTime,
    error: Arc<KeyError>,
}

/// Most failures remembered; past it the oldest is forgotten (a tenant with many broken
/// Secrets only loses the shortcut, never memory).
const MAX_FAILURES: usize = 1024;

/// Failed key loads per (namespace, Secret name).
#[derive(Default)]
pub(crate) struct FailedLoads {
    map: Mutex<HashMap<(String, String), Failure>>,
}

impl FailedLoads {
    /// The remembered failure of this Secret at this version, if younger than `ttl`.
    pub(crate) fn get(
        &self,
        key: &(String, String),
        resource_version: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Option<Arc<KeyError>> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(key)
            .filter(|f| f.resource_version == resource_version && now < f.at + ttl)
            .map(|f| f.error.clone())
    }

    pub(crate) fn insert(
        &self,
        key: (String, String),
        resource_version: String,
        now: SystemTime,
        ttl: Duration,
        error: Arc<KeyError>,
    ) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, f| now < f.at + ttl);
        if map.len() >= MAX_FAILURES
            && let Some(oldest) = map.iter().min_by_key(|(_, f)| f.at).map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            key,
            Failure {
                resource_version,
                at: now,
                error,
            },
        );
    }

    pub(crate) fn remove(&self, key: &(String, String)) {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}
