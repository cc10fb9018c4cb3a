//! Session keys no token was bound to. Every workload exchange sends the public half of a
//! fresh RSA-2048 key (about 100 ms of CPU to generate); when the answer is not a token (a
//! refusal, a failure of the domain), no session was bound to that key, so it is kept and
//! the next exchange of any identity uses it instead of generating one. At most
//! [`MAX_SPARE_KEYS`] are kept; their private halves live in aws-lc, which clears them
//! when a key is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::PrivateKey;
use crate::error::{AuthError, Endpoint};

/// The most keys kept for later exchanges.
pub(super) const MAX_SPARE_KEYS: usize = 4;

#[derive(Default)]
pub(super) struct SpareKeys {
    keys: std::sync::Mutex<Vec<PrivateKey>>,
    generated: AtomicU64,
    reused: AtomicU64,
}

/// Session keys of workload exchanges generated, and spare ones used instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct KeyCounts {
    pub(super) generated: u64,
    pub(super) reused: u64,
}

impl SpareKeys {
    /// A spare key if there is one, else a new one.
    pub(super) async fn take(&self) -> Result<Arc<PrivateKey>, AuthError> {
        if let Some(key) = super::lock(&self.keys).pop() {
            self.reused.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::new(key));
        }
        let key = super::session_key().await?;
        self.generated.fetch_add(1, Ordering::Relaxed);
        Ok(key)
    }

    /// Keeps the key of an exchange that `error` ended, if the endpoint answered other than
    /// with a token (so no session is bound to it) and nothing else holds it.
    pub(super) fn give_back(&self, key: Arc<PrivateKey>, error: &AuthError) {
        if !answered_without_a_token(error) {
            return;
        }
        let Some(key) = Arc::into_inner(key) else {
            return;
        };
        let mut keys = super::lock(&self.keys);
        if keys.len() < MAX_SPARE_KEYS {
            keys.push(key);
        }
    }

    pub(super) fn counts(&self) -> KeyCounts {
        KeyCounts {
            generated: self.generated.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
        }
    }
}

/// Whether the identity domain or the proxymux answered the exchange with an error status:
/// it issued nothing. A broken connection or a timeout may have lost a token bound to the
/// key, and an unusable 200 may hold one; those keys are dropped.
fn answered_without_a_token(error: &AuthError) -> bool {
    match error {
        AuthError::TokenExchange { .. }
        | AuthError::Status {
            endpoint: Endpoint::Proxymux,
            ..
        } => true,
        AuthError::Shared(shared) => answered_without_a_token(shared),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal() -> AuthError {
        AuthError::TokenExchange {
            namespace: "a".into(),
            service_account: "b".into(),
            status: 400,
            error: Some("invalid_grant".into()),
            description: None,
        }
    }

    #[tokio::test]
    async fn a_refused_exchanges_key_is_used_by_the_next_and_a_lost_ones_is_not() {
        let keys = SpareKeys::default();
        let first = keys.take().await.unwrap();
        let spki = first.public_key_spki_der().to_vec();
        keys.give_back(first, &refusal());
        let second = keys.take().await.unwrap();
        assert_eq!(second.public_key_spki_der(), spki.as_slice());
        // Held elsewhere (bound to a session): not spare.
        keys.give_back(Arc::clone(&second), &refusal());
        keys.give_back(second, &AuthError::DeadlineExceeded("exchanging"));
        let third = keys.take().await.unwrap();
        assert_ne!(third.public_key_spki_der(), spki.as_slice());
        assert_eq!(
            keys.counts(),
            KeyCounts {
                generated: 2,
                reused: 1
            }
        );
    }
}
