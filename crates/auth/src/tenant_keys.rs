//! Tenants' private keys: the one gate every key a tenant supplies passes through.
//!
//! A user principal's API key comes from a Secret the namespace controls, and a
//! certificate's key from OCI, where the tenant imported it: both may be encrypted PKCS#8,
//! whose key derivation (PBKDF2 or scrypt) the tenant chooses. So every such key is
//! decoded here, by one decryption function with one set of cost limits
//! (`key::decrypt_pkcs8`), on the blocking pool, at most `max_concurrent` at a time
//! process-wide, handed out in arrival order with at most one waiter per namespace in that
//! queue (the others of the namespace wait on their namespace's turn), each waiting at most
//! `wait`. The permit and the turn travel into the blocking job: a mount that stops waiting
//! (its deadline passed, the driver hung up) does not give them back while its derivation
//! still runs, so the bound counts derivations, not waiters.
//!
//! [`CertificateKey`] can only be made here, and `vault::TlsFiles` takes one: certificate
//! material cannot be written with a key that skipped the gate.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_lc_rs::signature::{self, KeyPair as _};
use der::asn1::ObjectIdentifier;
use pkcs8::PrivateKeyInfoRef;
use pkcs8::der::{self, Decode as _, Encode as _};
use tokio::sync::Semaphore;
use zeroize::Zeroizing;

use crate::error::AuthError;
use crate::key::{self, KeyError, MAX_RSA_BITS, PemBlock};

const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const P521: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.35");

/// The process-wide gate of tenant key loads; clones share it.
#[derive(Clone)]
pub struct TenantKeys {
    inner: Arc<Gate>,
}

struct Gate {
    permits: Arc<Semaphore>,
    max: usize,
    loads: AtomicU64,
    namespaces: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    wait: Duration,
}

impl fmt::Debug for TenantKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantKeys")
            .field("max_concurrent", &self.inner.max)
            .field("running", &self.running())
            .field("wait", &self.inner.wait)
            .finish()
    }
}

impl TenantKeys {
    /// A gate running at most `max_concurrent` key loads at once, each waiting at most
    /// `wait` for its turn.
    pub fn new(max_concurrent: usize, wait: Duration) -> Self {
        let max = max_concurrent.max(1);
        Self {
            inner: Arc::new(Gate {
                permits: Arc::new(Semaphore::new(max)),
                max,
                loads: AtomicU64::new(0),
                namespaces: Mutex::new(HashMap::new()),
                wait,
            }),
        }
    }

    /// Key loads started so far (user keys and certificate keys).
    pub fn loads(&self) -> u64 {
        self.inner.loads.load(Ordering::Relaxed)
    }

    /// Key loads running right now, on the blocking pool.
    pub fn running(&self) -> usize {
        self.inner.max - self.inner.permits.available_permits()
    }

    /// Namespaces with a load running or waiting (the turn table's size).
    #[cfg(test)]
    fn namespaces_waiting(&self) -> usize {
        self.inner
            .namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn namespace_turn(&self, namespace: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self
            .inner
            .namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Entries nobody holds or waits for are dropped, so the map is bounded by the
        // namespaces loading a key right now.
        map.retain(|_, turn| Arc::strong_count(turn) > 1);
        map.entry(namespace.to_owned()).or_default().clone()
    }

    /// Runs `load` on the blocking pool when it is `namespace`'s turn and a permit is free,
    /// waiting at most the configured time (and never past `deadline`). The turn and the
    /// permit are released when `load` returns, whether or not anybody still waits for it.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        namespace: &str,
        deadline: tokio::time::Instant,
        load: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, AuthError> {
        let wait = self.inner.wait;
        let until = deadline.min(tokio::time::Instant::now() + wait);
        let busy = || AuthError::KeyLoadsBusy {
            namespace: namespace.to_owned(),
            waited: wait,
        };
        let turn = self.namespace_turn(namespace);
        let turn = tokio::time::timeout_at(until, turn.lock_owned())
            .await
            .map_err(|_| busy())?;
        let permit = tokio::time::timeout_at(until, self.inner.permits.clone().acquire_owned())
            .await
            .map_err(|_| busy())?
            .map_err(|_| AuthError::Internal("the key load gate is closed"))?;
        self.inner.loads.fetch_add(1, Ordering::Relaxed);
        tokio::task::spawn_blocking(move || {
            let value = load();
            drop(permit);
            drop(turn);
            value
        })
        .await
        .map_err(|_| AuthError::Internal("the key loading task failed"))
    }

    /// Decodes the private key of a certificate a tenant mounts (`pem` as OCI returned it,
    /// with OCI's `passphrase` for an encrypted one) into unencrypted PKCS#8, through the
    /// gate, in `namespace`'s turn. The outer error is the gate's (busy: Unavailable); the
    /// inner one says why the key cannot be used (the tenant's to fix).
    pub async fn certificate_key(
        &self,
        namespace: &str,
        deadline: tokio::time::Instant,
        pem: Zeroizing<Vec<u8>>,
        passphrase: Option<Zeroizing<Vec<u8>>>,
    ) -> Result<Result<CertificateKey, KeyError>, AuthError> {
        self.run(namespace, deadline, move || {
            CertificateKey::decode(&pem, passphrase.as_ref().map(|p| p.as_slice()))
        })
        .await
    }
}

/// A certificate's private key as unencrypted PKCS#8 DER (RSA up to 4096 bits, ECDSA
/// P-256/P-384/P-521), with the public key it implies. Made only by
/// [`TenantKeys::certificate_key`]; the DER is wiped when dropped and `Debug` hides it.
pub struct CertificateKey {
    pkcs8: Zeroizing<Vec<u8>>,
    public_key: Vec<u8>,
}

impl fmt::Debug for CertificateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateKey")
            .field("pkcs8", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl CertificateKey {
    /// The unencrypted PKCS#8 DER.
    pub fn pkcs8_der(&self) -> &[u8] {
        &self.pkcs8
    }

    /// The public key, as an X.509 SubjectPublicKeyInfo's bit string carries it (PKCS#1
    /// RSAPublicKey for RSA, the uncompressed point for ECDSA).
    pub fn public_key(&self) -> &[u8] {
        &self.public_key
    }

    /// `PRIVATE KEY` as is, `ENCRYPTED PRIVATE KEY` decrypted by the one PKCS#8 decryption
    /// (with its cost limits), `RSA PRIVATE KEY` (PKCS#1) and `EC PRIVATE KEY` (SEC1)
    /// wrapped. Blocking CPU work: only [`TenantKeys::run`] calls it.
    pub(crate) fn decode(pem: &[u8], passphrase: Option<&[u8]>) -> Result<Self, KeyError> {
        let block = PemBlock::first(pem)?;
        if block.legacy_encryption()?.is_some() {
            return Err(KeyError::UnsupportedEncryption(
                "OpenSSL's legacy PEM encryption (Proc-Type/DEK-Info); store the key as PKCS#8 \
                 (ENCRYPTED PRIVATE KEY)"
                    .into(),
            ));
        }
        let pkcs8 = match block.label.as_str() {
            "PRIVATE KEY" => Zeroizing::new(block.der.to_vec()),
            "ENCRYPTED PRIVATE KEY" => {
                key::decrypt_pkcs8(&block.der, passphrase.unwrap_or_default())?
            }
            "RSA PRIVATE KEY" => wrap(RSA_ENCRYPTION, None, &block.der)?,
            "EC PRIVATE KEY" => {
                let sec1 =
                    sec1::EcPrivateKey::from_der(&block.der).map_err(|_| KeyError::NotAKey {
                        label: "EC PRIVATE KEY".into(),
                    })?;
                let curve = sec1
                    .parameters
                    .and_then(|p| p.named_curve())
                    .ok_or_else(|| {
                        KeyError::UnsupportedAlgorithm("EC without a named curve".into())
                    })?;
                wrap(EC_PUBLIC_KEY, Some(curve), &block.der)?
            }
            other => {
                return Err(KeyError::NotAKey {
                    label: key::truncate(other),
                });
            }
        };
        let public_key = public_key(&pkcs8)?;
        Ok(Self { pkcs8, public_key })
    }
}

/// A PrivateKeyInfo around a PKCS#1 or SEC1 key.
fn wrap(
    algorithm: ObjectIdentifier,
    curve: Option<ObjectIdentifier>,
    key: &[u8],
) -> Result<Zeroizing<Vec<u8>>, KeyError> {
    let unparseable = |_| KeyError::NotAKey {
        label: "PRIVATE KEY".into(),
    };
    let parameters = match &curve {
        Some(oid) => Some(der::asn1::AnyRef::from(oid)),
        None => Some(der::asn1::AnyRef::NULL),
    };
    let info = PrivateKeyInfoRef::new(
        pkcs8::AlgorithmIdentifierRef {
            oid: algorithm,
            parameters,
        },
        der::asn1::OctetStringRef::new(key).map_err(unparseable)?,
    );
    Ok(Zeroizing::new(info.to_der().map_err(unparseable)?))
}

/// The public key a PKCS#8 key implies; RSA keys above [`MAX_RSA_BITS`] are refused.
fn public_key(pkcs8: &[u8]) -> Result<Vec<u8>, KeyError> {
    let info = PrivateKeyInfoRef::try_from(pkcs8).map_err(|_| KeyError::NotAKey {
        label: "PRIVATE KEY".into(),
    })?;
    let oid = info.algorithm.oid;
    if oid == RSA_ENCRYPTION {
        let pair = signature::RsaKeyPair::from_pkcs8(pkcs8).map_err(KeyError::Rejected)?;
        let bits = pair.public_modulus_len() * 8;
        if bits > MAX_RSA_BITS {
            return Err(KeyError::RsaTooLarge(bits));
        }
        return Ok(pair.public_key().as_ref().to_vec());
    }
    if oid == EC_PUBLIC_KEY {
        let curve = info
            .algorithm
            .parameters_oid()
            .map_err(|_| KeyError::UnsupportedAlgorithm("EC without a named curve".into()))?;
        let alg = match curve {
            c if c == P256 => &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            c if c == P384 => &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
            c if c == P521 => &signature::ECDSA_P521_SHA512_ASN1_SIGNING,
            other => {
                return Err(KeyError::UnsupportedAlgorithm(format!(
                    "EC on curve {other}"
                )));
            }
        };
        let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8).map_err(KeyError::Rejected)?;
        return Ok(pair.public_key().as_ref().to_vec());
    }
    Err(KeyError::UnsupportedAlgorithm(key::algorithm_name(oid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn turns_go_round_the_namespaces_and_waits_are_bounded() {
        let gate = TenantKeys::new(1, Duration::from_secs(30));
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        // Namespace a's first load holds the only permit until released.
        let first = {
            let (gate, order) = (gate.clone(), order.clone());
            tokio::spawn(async move {
                gate.run("a", far(), move || {
                    blocked.recv().unwrap();
                    order.lock().unwrap().push("a1");
                })
                .await
            })
        };
        while gate.running() == 0 {
            tokio::task::yield_now().await;
        }
        // Then four more of namespace a, and one of namespace b.
        let mut later = Vec::new();
        for name in ["a2", "a3", "a4", "a5"] {
            let (gate, order) = (gate.clone(), order.clone());
            later.push(tokio::spawn(async move {
                gate.run("a", far(), move || order.lock().unwrap().push(name))
                    .await
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let b = {
            let (gate, order) = (gate.clone(), order.clone());
            tokio::spawn(async move {
                gate.run("b", far(), move || order.lock().unwrap().push("b1"))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        for task in later {
            task.await.unwrap().unwrap();
        }
        let order = order.lock().unwrap().clone();
        // b came after four loads of a, and is served right after the one running.
        assert_eq!(order[..2], ["a1", "b1"], "{order:?}");
        assert_eq!(gate.loads(), 6);
        // Namespaces nobody waits for are swept at the next load.
        gate.run("c", far(), || ()).await.unwrap();
        assert_eq!(gate.namespaces_waiting(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_load_that_cannot_get_a_turn_in_time_is_unavailable() {
        let gate = TenantKeys::new(1, Duration::from_millis(100));
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let holder = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.run("a", far(), move || blocked.recv().unwrap()).await })
        };
        while gate.running() == 0 {
            tokio::task::yield_now().await;
        }
        let error = gate.run("b", far(), || ()).await.unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Unavailable);
        assert!(error.to_string().contains("namespace b waited"), "{error}");
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        // With the permit back, b gets its turn.
        gate.run("b", far(), || ()).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_permit_is_held_until_the_derivation_ends_not_until_the_waiter_gives_up() {
        let gate = TenantKeys::new(1, Duration::from_secs(30));
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
        // A load whose mount stops waiting (a deadline, a hung-up driver) while the
        // derivation goes on.
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move {
                gate.run("a", far(), move || {
                    let _ = started_tx.send(());
                    blocked.recv().unwrap();
                })
                .await
            })
        };
        started.await.unwrap();
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        // The derivation still runs: its permit and its namespace's turn are still taken.
        assert_eq!(gate.running(), 1);
        let error = tokio::time::timeout(
            Duration::from_secs(5),
            gate.run(
                "b",
                tokio::time::Instant::now() + Duration::from_millis(100),
                || (),
            ),
        )
        .await
        .unwrap()
        .unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Unavailable, "{error}");
        release.send(()).unwrap();
        while gate.running() == 1 {
            tokio::task::yield_now().await;
        }
        gate.run("b", far(), || ()).await.unwrap();
    }
}
