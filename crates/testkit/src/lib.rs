//! An in-process emulator of every remote endpoint the OCI Vault provider talks to: the OCI
//! Secrets API, the Vault API's ListSecrets, the OCI Auth x509 federation endpoint, OKE proxymux, a Kubernetes API subset
//! and instance metadata.
//!
//! Every HTTPS endpoint is real TLS on `127.0.0.1` (ephemeral ports) with a certificate from a
//! CA generated at start; instance metadata is plain HTTP like the real one. The emulator
//! verifies OCI request signatures (spec 1.6), issues and checks tokens, counts connections
//! and requests, and injects scripted faults. It runs on its own runtime thread, so its tasks
//! never count as the caller's.
//!
//! ```no_run
//! # async fn demo() -> Result<(), oci_csi_testkit::Error> {
//! use std::sync::Arc;
//! use oci_csi_testkit::{Emulator, Endpoint, Fault, SecretSeed, Seed};
//!
//! let seed = Seed::default()
//!     .vault("ocid1.vault.oc1..v")
//!     .service_account("app", "app-sa")
//!     .secret(
//!         SecretSeed::new("ocid1.vaultsecret.oc1..s", "ocid1.vault.oc1..v", "db-password")
//!             .version(1, "hunter2", &["CURRENT", "LATEST"])
//!             .allow_workload("app", "app-sa"),
//!     );
//! let emu = Emulator::start(seed, Arc::new(clock::SystemClock)).await?;
//! let secrets_url = emu.url(Endpoint::Secrets);
//! let ca_pem = emu.ca_pem();
//! emu.script(Endpoint::Secrets, [Fault::Status(503), Fault::Status(503)]);
//! let stats = emu
//!     .wait_for(std::time::Duration::from_secs(5), |s| s.responses(Endpoint::Secrets, 200) == 1)
//!     .await;
//! # let _ = (secrets_url, ca_pem, stats);
//! # Ok(()) }
//! ```
// The emulator parses what the provider under test sends it; the budgets are the provider's
// (clippy.toml refuses unbudgeted parsers elsewhere).
#![allow(clippy::disallowed_methods)]

mod certs;
mod crypto;
mod domain;
mod driver;
mod faults;
mod handlers;
mod listing;
mod nodes;
mod pki;
mod seed;
mod server;
mod sig;
mod state;
mod stats;
mod tokens;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use serde_json::json;
use tokio::sync::oneshot;

use clock::SharedClock;

pub use crate::certs::{CaSeed, CertificateCall, CertificateSeed, KeyKind, verify_server_chain};
pub use crate::crypto::api_key_fingerprint;
pub use crate::driver::{DriverClient, DriverError, GOPATH, fnv1a};
pub use crate::faults::Fault;
pub use crate::nodes::{NodeSeed, TaintSeed};
pub use crate::seed::{
    Access, CompartmentSeed, Content, DEFAULT_COMPARTMENT, IdentityDomainSeed, ImpersonationRule,
    InstanceSeed, KubeSecretSeed, LIFECYCLE_STATES, Lifetimes, OAuthClientSeed, STAGES, SecretSeed,
    Seed, ServiceAccountSeed, TrustKeys, TrustSeed, UserSeed, VaultSeed, VersionSeed, WorkloadRef,
};
pub use crate::state::{Principal, Revoke, SecretsCall, VaultsCall};
pub use crate::stats::{Endpoint, ListenerStats, Stats, WaitTimeout};
pub use crate::tokens::{Signer, TokenSpec};

/// The issuer of the emulator's service-account tokens (`iss`, and the `issuer` of its
/// `/.well-known/openid-configuration`): like a real cluster's, not the URL of its
/// Kubernetes endpoint. Also the default audience of its tokens.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

use crate::server::Reply;
use crate::state::{Shared, VersionState};

/// Errors of the emulator's API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Key generation or signing failed.
    #[error("crypto failure: {0}")]
    Crypto(&'static str),
    /// Certificate generation failed.
    #[error("certificate generation failed: {0}")]
    Certificate(String),
    /// The seed is inconsistent.
    #[error("invalid seed: {0}")]
    Seed(String),
    /// Binding, threads or files.
    #[error("i/o error")]
    Io(#[from] std::io::Error),
    /// The emulator thread stopped before it was ready.
    #[error("emulator thread stopped during start")]
    Stopped,
    /// No such secret, version or service account.
    #[error("not found: {0}")]
    NotFound(String),
}

pub(crate) fn oci_error(status: StatusCode, code: &str, message: &str) -> Reply {
    Reply::json(status, &json!({"code": code, "message": message}))
}

pub(crate) fn kube_status(status: StatusCode, reason: &str, message: &str) -> Reply {
    Reply::json(
        status,
        &json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": status.as_u16(),
        }),
    )
}

/// Paths of the files the emulator writes for a provider.
#[derive(Debug, Clone)]
pub struct Files {
    /// Directory holding them.
    pub dir: PathBuf,
    /// The CA certificate (PEM) to trust for every HTTPS endpoint.
    pub ca: PathBuf,
    /// The provider's own service-account token.
    pub provider_token: PathBuf,
    /// A kubeconfig pointing at the Kubernetes endpoint with that token.
    pub kubeconfig: PathBuf,
    /// A provider configuration file with an `[endpoints]` table.
    pub provider_config: PathBuf,
    /// The same with workload identity federation at the emulator's identity domain, when
    /// the seed has a confidential application and a trust (else not written).
    pub federation_config: PathBuf,
    /// The first confidential application's client secret (written with the above).
    pub client_secret: PathBuf,
}

#[derive(Debug)]
struct Info {
    addrs: BTreeMap<Endpoint, SocketAddr>,
    files: Files,
    provider_token: String,
}

/// A cheap, cloneable handle to a running emulator: URLs, counters, state changes, faults.
#[derive(Debug, Clone)]
pub struct EmulatorHandle {
    shared: Arc<Shared>,
    info: Arc<Info>,
}

/// A running emulator. Dropping it stops every listener.
#[derive(Debug)]
pub struct Emulator {
    handle: EmulatorHandle,
    _dir: Option<tempfile::TempDir>,
}

impl std::ops::Deref for Emulator {
    type Target = EmulatorHandle;
    fn deref(&self) -> &EmulatorHandle {
        &self.handle
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.handle.shared.shutdown.send_replace(true);
    }
}

type Started = (EmulatorHandle, Option<tempfile::TempDir>);

impl Emulator {
    /// Starts an emulator on its own thread and runtime, writing its files to a temporary
    /// directory removed on drop.
    pub async fn start(seed: Seed, clock: SharedClock) -> Result<Emulator, Error> {
        Self::start_in(seed, clock, None).await
    }

    /// Like [`Emulator::start`], writing the files to `dir` (kept after drop).
    pub async fn start_in(
        seed: Seed,
        clock: SharedClock,
        dir: Option<PathBuf>,
    ) -> Result<Emulator, Error> {
        let (tx, rx) = oneshot::channel();
        spawn_thread(seed, clock, dir, tx)?;
        let (handle, dir) = rx.await.map_err(|_| Error::Stopped)??;
        Ok(Emulator { handle, _dir: dir })
    }

    /// Starts from synchronous code (e.g. a `main` without a runtime).
    pub fn start_blocking(
        seed: Seed,
        clock: SharedClock,
        dir: Option<PathBuf>,
    ) -> Result<Emulator, Error> {
        let (tx, rx) = oneshot::channel();
        spawn_thread(seed, clock, dir, tx)?;
        let (handle, dir) = rx.blocking_recv().map_err(|_| Error::Stopped)??;
        Ok(Emulator { handle, _dir: dir })
    }

    /// A cloneable handle.
    pub fn handle(&self) -> EmulatorHandle {
        self.handle.clone()
    }
}

fn spawn_thread(
    seed: Seed,
    clock: SharedClock,
    dir: Option<PathBuf>,
    tx: oneshot::Sender<Result<Started, Error>>,
) -> Result<(), Error> {
    std::thread::Builder::new()
        .name("oci-emulator".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("oci-emulator-worker")
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e.into()));
                    return;
                }
            };
            rt.block_on(async move {
                let shared = match start_inner(seed, clock, dir).await {
                    Ok((handle, dir)) => {
                        let shared = handle.shared.clone();
                        if tx.send(Ok((handle, dir))).is_err() {
                            return;
                        }
                        shared
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let mut rx = shared.shutdown.subscribe();
                let _ = rx.wait_for(|s| *s).await;
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        })?;
    Ok(())
}

async fn start_inner(
    seed: Seed,
    clock: SharedClock,
    dir: Option<PathBuf>,
) -> Result<Started, Error> {
    let shared = Arc::new(Shared::new(&seed, clock)?);
    let mut addrs = BTreeMap::new();
    for endpoint in Endpoint::ALL {
        let listener = server::bind().await?;
        addrs.insert(endpoint, listener.local_addr()?);
        tokio::spawn(server::serve(shared.clone(), endpoint, listener));
    }
    let psa = &seed.provider_service_account;
    let provider_token = issue_sa_token(
        &shared,
        &psa.namespace,
        &psa.name,
        Duration::from_secs(seed.lifetimes.provider_token_secs),
        None,
    )?;
    let (tmp, dir) = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            (None, d)
        }
        None => {
            let t = tempfile::Builder::new().prefix("oci-emulator").tempdir()?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    };
    let files = Files {
        ca: dir.join("ca.pem"),
        provider_token: dir.join("token"),
        kubeconfig: dir.join("kubeconfig"),
        provider_config: dir.join("provider.toml"),
        federation_config: dir.join("provider-federation.toml"),
        client_secret: dir.join("client-secret"),
        dir,
    };
    let info = Arc::new(Info {
        addrs,
        files,
        provider_token,
    });
    let handle = EmulatorHandle { shared, info };
    handle.write_files(&seed.region, &seed.provider_service_account.namespace)?;
    Ok((handle, tmp))
}

fn issue_sa_token(
    shared: &Shared,
    namespace: &str,
    name: &str,
    lifetime: Duration,
    pod: Option<(&str, &str)>,
) -> Result<String, Error> {
    let mut spec = TokenSpec::new(namespace, name).lifetime(lifetime);
    if let Some((pod, uid)) = pod {
        spec = spec.bound_to(pod, uid);
    }
    tokens::mint(shared, &spec)
}

impl EmulatorHandle {
    /// The socket address of an endpoint (always 127.0.0.1).
    pub fn addr(&self, endpoint: Endpoint) -> SocketAddr {
        self.info.addrs[&endpoint]
    }

    /// The base URL of an endpoint, e.g. `https://127.0.0.1:40123`. For instance metadata
    /// this is `http://127.0.0.1:port/opc/v2`, like `OCI_METADATA_BASE_URL`.
    pub fn url(&self, endpoint: Endpoint) -> String {
        let addr = self.addr(endpoint);
        match endpoint {
            Endpoint::Imds => format!("http://{addr}/opc/v2"),
            _ => format!("https://{addr}"),
        }
    }

    /// The CA certificate (PEM) to trust for every HTTPS endpoint.
    pub fn ca_pem(&self) -> &str {
        &self.shared.pki.ca_pem
    }

    /// The files written for a provider.
    pub fn files(&self) -> &Files {
        &self.info.files
    }

    /// The provider's own service-account token (also in [`Files::provider_token`]).
    pub fn provider_token(&self) -> &str {
        &self.info.provider_token
    }

    /// The instance leaf certificate PEM that instance metadata serves.
    pub fn instance_cert_pem(&self) -> &str {
        &self.shared.pki.instance.cert_pem
    }

    /// The instance leaf private key PEM (PKCS#8) that instance metadata serves.
    pub fn instance_key_pem(&self) -> &str {
        &self.shared.pki.instance.key_pem
    }

    /// A copy of every counter.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// Waits (without sleeping) until `pred` holds for the counters, or times out.
    ///
    /// The timeout runs on the caller's runtime; with `tokio::time::pause` use a real-time
    /// wrapper instead, since the emulator does not advance paused time.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl FnMut(&Stats) -> bool,
    ) -> Result<Stats, WaitTimeout> {
        stats::wait_for(self.shared.counters.subscribe(), timeout, pred).await
    }

    /// Every Secrets API call so far, in order, with the identity it was made as.
    pub fn secrets_calls(&self) -> Vec<SecretsCall> {
        self.shared.state().secrets_calls.clone()
    }

    /// Every Vault API call (ListSecrets) so far, in order.
    pub fn vaults_calls(&self) -> Vec<VaultsCall> {
        self.shared.state().vaults_calls.clone()
    }

    /// The most items one list page answers (ListSecrets, ListSecretBundleVersions),
    /// whatever its `limit` asks: a listing of more takes several pages.
    pub fn set_list_page_size(&self, items: usize) {
        self.shared.state().list_page_size = items.max(1);
    }

    /// Sets a secret's lifecycle state (one of [`LIFECYCLE_STATES`]), e.g. to schedule its
    /// deletion: ListSecrets filters on it, bundles are still served.
    pub fn set_secret_lifecycle(&self, secret_id: &str, state: &str) -> Result<(), Error> {
        if !LIFECYCLE_STATES.contains(&state) {
            return Err(Error::Seed(format!("unknown lifecycle state {state}")));
        }
        let mut st = self.shared.state();
        let secret = st
            .secrets
            .iter_mut()
            .find(|s| s.id == secret_id)
            .ok_or_else(|| Error::NotFound(secret_id.into()))?;
        secret.lifecycle_state = state.to_owned();
        Ok(())
    }

    /// Sets (or, with `None`, removes) a freeform tag of a secret.
    pub fn set_secret_tag(
        &self,
        secret_id: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), Error> {
        let mut st = self.shared.state();
        let secret = st
            .secrets
            .iter_mut()
            .find(|s| s.id == secret_id)
            .ok_or_else(|| Error::NotFound(secret_id.into()))?;
        match value {
            Some(value) => secret
                .freeform_tags
                .insert(key.to_owned(), value.to_owned()),
            None => secret.freeform_tags.remove(key),
        };
        Ok(())
    }

    /// Appends faults consumed one per request at `endpoint`, before any persistent fault.
    pub fn script(&self, endpoint: Endpoint, faults: impl IntoIterator<Item = Fault>) {
        self.shared
            .state()
            .faults
            .entry(endpoint)
            .or_default()
            .script
            .extend(faults);
    }

    /// Sets (or clears) a fault applied to every request at `endpoint` once its script is
    /// exhausted.
    pub fn set_fault(&self, endpoint: Endpoint, fault: Option<Fault>) {
        self.shared
            .state()
            .faults
            .entry(endpoint)
            .or_default()
            .persistent = fault;
    }

    /// Appends faults consumed one per request sent to `host` at `endpoint` (its `Host`
    /// without the port, e.g. `localhost` while another region's URL names `127.0.0.1`),
    /// before any fault of the endpoint's own; once they and the host's persistent fault
    /// are exhausted, the endpoint's own apply. One listener then answers as two regions.
    pub fn script_host(
        &self,
        endpoint: Endpoint,
        host: &str,
        faults: impl IntoIterator<Item = Fault>,
    ) {
        self.shared
            .state()
            .host_faults
            .entry((endpoint, host.to_owned()))
            .or_default()
            .script
            .extend(faults);
    }

    /// Sets (or clears) a fault applied to every request sent to `host` at `endpoint` once
    /// its host script is exhausted.
    pub fn set_host_fault(&self, endpoint: Endpoint, host: &str, fault: Option<Fault>) {
        self.shared
            .state()
            .host_faults
            .entry((endpoint, host.to_owned()))
            .or_default()
            .persistent = fault;
    }

    /// Removes every scripted and persistent fault of `endpoint`, its hosts' included.
    pub fn clear_faults(&self, endpoint: Endpoint) {
        let mut state = self.shared.state();
        state.faults.remove(&endpoint);
        state.host_faults.retain(|(e, _), _| *e != endpoint);
    }

    /// Releases every request held by a stall fault.
    pub fn release_stalls(&self) {
        self.shared.stall_release.send_modify(|g| *g += 1);
    }

    /// Holds every request at `endpoint` (counted in [`Stats::held`]) until
    /// [`EmulatorHandle::open_gate`].
    pub fn close_gate(&self, endpoint: Endpoint) {
        if let Some(g) = self.shared.gates.get(&endpoint) {
            g.send_replace(true);
        }
    }

    /// Lets requests held at `endpoint` proceed.
    pub fn open_gate(&self, endpoint: Endpoint) {
        if let Some(g) = self.shared.gates.get(&endpoint) {
            g.send_replace(false);
        }
    }

    /// Offers only HTTP/1.1 by ALPN on new connections to `endpoint`.
    pub fn set_http1_only(&self, endpoint: Endpoint, on: bool) {
        let mut st = self.shared.state();
        if on {
            st.http1_only.insert(endpoint);
        } else {
            st.http1_only.remove(&endpoint);
        }
    }

    /// Closes connections to `endpoint` that have had no request in flight for `timeout`
    /// (`None`: keep them open).
    pub fn set_idle_timeout(&self, endpoint: Endpoint, timeout: Option<Duration>) {
        {
            let mut st = self.shared.state();
            match timeout {
                Some(t) => st.idle_timeout.insert(endpoint, t),
                None => st.idle_timeout.remove(&endpoint),
            };
        }
        self.shared.settings_changed.send_modify(|g| *g += 1);
    }

    /// Adds a new version of a secret and makes it `CURRENT` and `LATEST` (rotation): the old
    /// `CURRENT` becomes `PREVIOUS`, the old `PREVIOUS` becomes `DEPRECATED`. Returns the new
    /// version number.
    pub fn rotate_secret(
        &self,
        secret_id: &str,
        content: impl Into<Vec<u8>>,
    ) -> Result<i64, Error> {
        self.push_version(
            secret_id,
            content.into(),
            None,
            &["CURRENT", "LATEST"],
            |versions| {
                for v in versions {
                    let was_current = v.stages.iter().any(|s| s == "CURRENT");
                    let was_previous = v.stages.iter().any(|s| s == "PREVIOUS");
                    v.stages
                        .retain(|s| s != "CURRENT" && s != "LATEST" && s != "PREVIOUS");
                    if was_current {
                        v.stages.push("PREVIOUS".into());
                    } else if was_previous && !v.stages.iter().any(|s| s == "DEPRECATED") {
                        v.stages.push("DEPRECATED".into());
                    }
                }
            },
        )
    }

    /// Deletes and recreates a Kubernetes service account of the same name: it gets `uid`,
    /// and tokens issued from now on carry it (policies name service accounts, so the new
    /// one may read what the old one could).
    pub fn recreate_service_account(&self, namespace: &str, name: &str, uid: &str) {
        self.shared
            .state()
            .service_accounts
            .insert((namespace.to_owned(), name.to_owned()), uid.to_owned());
    }

    /// Creates or replaces a Kubernetes Secret, as `kubectl apply` would: its
    /// `resourceVersion` changes.
    pub fn put_kube_secret(&self, secret: KubeSecretSeed) {
        let key = (secret.namespace.clone(), secret.name.clone());
        let mut st = self.shared.state();
        let data = secret.data.into_iter().map(|(k, v)| (k, v.0)).collect();
        st.kube_secrets.insert(key.clone(), data);
        let next = st.kube_secret_versions.values().max().copied().unwrap_or(1) + 1;
        st.kube_secret_versions.insert(key, next);
    }

    /// Adds a version with explicit stages (removing those stages from other versions).
    pub fn add_secret_version(
        &self,
        secret_id: &str,
        content: impl Into<Vec<u8>>,
        name: Option<&str>,
        stages: &[&str],
    ) -> Result<i64, Error> {
        self.push_version(secret_id, content.into(), name, stages, |versions| {
            for v in versions {
                v.stages.retain(|s| !stages.contains(&s.as_str()));
            }
        })
    }

    /// Restages the existing versions of a secret with `restage`, then adds the next
    /// version with `stages`. Returns its number.
    fn push_version(
        &self,
        secret_id: &str,
        content: Vec<u8>,
        name: Option<&str>,
        stages: &[&str],
        restage: impl FnOnce(&mut [VersionState]),
    ) -> Result<i64, Error> {
        let now = self.shared.now();
        let mut st = self.shared.state();
        let secret = st
            .secrets
            .iter_mut()
            .find(|s| s.id == secret_id)
            .ok_or_else(|| Error::NotFound(secret_id.into()))?;
        let number = secret.versions.iter().map(|v| v.number).max().unwrap_or(0) + 1;
        restage(&mut secret.versions);
        secret.versions.push(VersionState {
            number,
            name: name.map(str::to_owned),
            stages: stages.iter().map(|s| (*s).to_owned()).collect(),
            content,
            time_created: now,
        });
        Ok(number)
    }

    /// Revokes a principal: its keys and tokens get 401 and no new tokens are issued.
    pub fn revoke(&self, principal: Revoke) {
        self.shared.revoke(&principal);
    }

    /// Undoes [`EmulatorHandle::revoke`].
    pub fn restore(&self, principal: Revoke) {
        self.shared.restore(&principal);
    }

    /// Makes every token issued so far expired (Kubernetes tokens, RPSTs, instance tokens),
    /// except the provider's own service-account token.
    pub fn expire_all_tokens(&self) {
        let keep = self.info.provider_token.clone();
        for (t, rec) in self.shared.state().tokens.iter_mut() {
            if *t != keep {
                rec.force_expired = true;
            }
        }
    }

    /// The emulator's current time (the shared clock plus any offset set here).
    pub fn now(&self) -> SystemTime {
        self.shared.now()
    }

    /// Sets the emulator's time, as an offset over the shared clock.
    pub fn set_time(&self, t: SystemTime) {
        let base = self.shared.clock.now();
        let offset = match t.duration_since(base) {
            Ok(d) => (true, d),
            Err(e) => (false, e.duration()),
        };
        self.shared.state().clock_offset = offset;
    }

    /// Moves the emulator's time forward by `by`.
    pub fn advance_time(&self, by: Duration) {
        let now = self.now();
        self.set_time(now + by);
    }

    /// Renews a certificate: a new version (CURRENT, LATEST) with a new key and leaf; the
    /// former CURRENT becomes PREVIOUS. Returns the new version number.
    pub fn renew_certificate(&self, id: &str) -> Result<i64, Error> {
        let now = self.now();
        let mut st = self.shared.state();
        let st = &mut *st;
        let cert = st
            .certificates
            .iter_mut()
            .find(|c| c.seed.id == id)
            .ok_or_else(|| Error::NotFound(format!("certificate {id}")))?;
        cert.renew(&st.cert_pki, now)
    }

    /// Marks a certificate version revoked with `reason` (e.g. `KEY_COMPROMISE`).
    pub fn revoke_certificate_version(
        &self,
        id: &str,
        number: i64,
        reason: &str,
    ) -> Result<(), Error> {
        let mut st = self.shared.state();
        let version = st
            .certificates
            .iter_mut()
            .find(|c| c.seed.id == id)
            .and_then(|c| c.versions.iter_mut().find(|v| v.number == number))
            .ok_or_else(|| Error::NotFound(format!("certificate {id} version {number}")))?;
        version.revoked = Some(reason.to_owned());
        Ok(())
    }

    /// Every Certificates call so far.
    pub fn certificate_calls(&self) -> Vec<CertificateCall> {
        self.shared.state().certificate_calls.clone()
    }

    /// The root of the Certificates API's private CA hierarchy (PEM).
    pub fn certificates_root_pem(&self) -> String {
        self.shared.state().cert_pki.root_pem.clone()
    }

    /// Issues a Kubernetes service-account token directly (what kubelet would hand the
    /// driver), optionally bound to a pod `(name, uid)`.
    pub fn issue_service_account_token(
        &self,
        namespace: &str,
        name: &str,
        lifetime: Duration,
        pod: Option<(&str, &str)>,
    ) -> Result<String, Error> {
        issue_sa_token(&self.shared, namespace, name, lifetime, pod)
    }

    /// Mints a service-account token to order: genuine, or forged (another key, an unknown
    /// key id, no signature), for another audience or issuer, expired or not valid yet.
    pub fn mint_service_account_token(&self, spec: &TokenSpec) -> Result<String, Error> {
        tokens::mint(&self.shared, spec)
    }

    /// Rotates the service-account issuer's signing key: tokens issued from now on name a
    /// new key id, and `/openid/v1/jwks` publishes the new key beside the old ones (which
    /// still verify the tokens they signed).
    pub fn rotate_issuer_key(&self) -> Result<(), Error> {
        let key = Arc::new(crate::crypto::JwtSigner::generate()?);
        self.shared.state().issuer_keys.push(key);
        Ok(())
    }

    /// Appends faults consumed one per request for the service-account issuer's documents
    /// (`/.well-known/openid-configuration`, `/openid/v1/jwks`), apart from the Kubernetes
    /// endpoint's own faults, which do not apply to them.
    pub fn script_issuer(&self, faults: impl IntoIterator<Item = Fault>) {
        self.shared.state().issuer_faults.script.extend(faults);
    }

    /// Sets (or clears) a fault applied to every request for the issuer's documents once
    /// their script is exhausted.
    pub fn set_issuer_fault(&self, fault: Option<Fault>) {
        self.shared.state().issuer_faults.persistent = fault;
    }

    /// A node's taints now (`None`: no such node; empty: no taints).
    pub fn node_taints(&self, name: &str) -> Option<Vec<serde_json::Value>> {
        self.shared.state().nodes.taints(name)
    }

    /// Refuses the provider's `verbs` (`get`, `patch`) on nodes with 403, as RBAC without
    /// the rule does; an empty list allows them again.
    pub fn forbid_node_verbs(&self, verbs: &[&str]) {
        self.shared.state().nodes.forbidden = verbs.iter().map(|v| (*v).to_owned()).collect();
    }

    /// Adds `taint` (key, effect) to node `name` right after the next read of it, as
    /// another controller racing the provider would: a patch made from that read is stale.
    pub fn taint_node_after_next_read(&self, name: &str, key: &str, effect: &str) {
        let taint = crate::nodes::taint(
            &TaintSeed {
                key: key.to_owned(),
                value: None,
                effect: effect.to_owned(),
            },
            self.now(),
        );
        self.shared
            .state()
            .nodes
            .after_next_read
            .entry(name.to_owned())
            .or_default()
            .push(taint);
    }

    /// The provider configuration file content: `[endpoints]`, CA and token paths.
    pub fn provider_config(&self, region: &str) -> String {
        let f = &self.info.files;
        format!(
            "# Written by the OCI emulator (oci-csi-testkit). Every endpoint is on loopback.\n\
             # The provider's configuration schema: bin/src/config.rs and bin/src/endpoints.rs.\n\
             region = {region:?}\n\n\
             [endpoints]\n\
             secrets = {:?}\n\
             certificates = {:?}\n\
             vaults = {:?}\n\
             federation = {:?}\n\
             proxymux = {:?}\n\
             kubernetes_api = {:?}\n\
             instance_metadata = {:?}\n\
             kubeconfig = {:?}\n\
             service_account_token_file = {:?}\n\
             kubernetes_ca_file = {:?}\n\
             proxymux_ca_file = {:?}\n\
             oci_ca_files = [{:?}]\n",
            self.url(Endpoint::Secrets),
            self.url(Endpoint::Certificates),
            self.url(Endpoint::Vaults),
            self.url(Endpoint::Auth),
            self.url(Endpoint::Proxymux),
            self.url(Endpoint::Kube),
            self.url(Endpoint::Imds),
            path_str(&f.kubeconfig),
            path_str(&f.provider_token),
            path_str(&f.ca),
            path_str(&f.ca),
            path_str(&f.ca),
        )
    }

    fn write_files(&self, region: &str, namespace: &str) -> Result<(), Error> {
        let f = &self.info.files;
        std::fs::write(&f.ca, self.ca_pem())?;
        std::fs::write(&f.provider_token, &self.info.provider_token)?;
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: provider\n  user:\n    tokenFile: {}\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: provider\n    namespace: {}\ncurrent-context: emulator\n",
            self.url(Endpoint::Kube),
            path_str(&f.ca),
            path_str(&f.provider_token),
            namespace,
        );
        std::fs::write(&f.kubeconfig, kubeconfig)?;
        std::fs::write(&f.provider_config, self.provider_config(region))?;
        if let Some((config, secret)) = self.federation_config(region) {
            std::fs::write(&f.client_secret, secret)?;
            std::fs::write(&f.federation_config, config)?;
        }
        Ok(())
    }

    /// [`EmulatorHandle::provider_config`] with `[auth.workload]` set to federation at the
    /// emulator's identity domain as its first application (secret in
    /// [`Files::client_secret`]) for UPSTs, the audience its first trust expects; and that
    /// client secret. `None` when the seed has no application or trust.
    pub fn federation_config(&self, region: &str) -> Option<(String, String)> {
        let domain = self.shared.state().identity_domain.clone();
        let client = domain.clients.first()?;
        let audience = domain.trusts.first()?.client_claim_values.first()?.clone();
        let f = &self.info.files;
        let config = format!(
            "{}\n[auth]\nworkload_audience = {audience:?}\n\n[auth.workload]\n\
             mechanism = \"federation\"\n\n[auth.workload.federation]\n\
             domain_url = {:?}\nclient_id = {:?}\nclient_secret_file = {:?}\n",
            self.provider_config(region),
            self.url(Endpoint::IdentityDomain),
            client.id,
            path_str(&f.client_secret),
        );
        Some((config, client.secret.clone()))
    }
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}
