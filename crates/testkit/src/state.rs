//! The emulator's mutable state and the identity model.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clock::SharedClock;
use serde::Serialize;
use tokio::sync::watch;

use crate::Error;
use crate::crypto::{JwtSigner, api_key_fingerprint, pem_decode};
use crate::faults::FaultPlan;
use crate::pki::Pki;
use crate::seed::{Access, Lifetimes, Seed, WorkloadRef};
use crate::stats::{Counters, Endpoint};

/// The identity a request was authenticated as.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Principal {
    /// A user API key.
    User {
        /// Tenancy OCID.
        tenancy: String,
        /// User OCID.
        user: String,
    },
    /// A Kubernetes workload (via proxymux RPST, or a Kubernetes service-account token).
    Workload {
        /// Namespace.
        namespace: String,
        /// Service account name.
        service_account: String,
        /// Service account uid.
        service_account_uid: String,
        /// Tenancy (`res_tenant`).
        tenancy: String,
    },
    /// A compute instance (via x509 federation).
    Instance {
        /// Tenancy OCID.
        tenancy: String,
        /// Instance OCID.
        instance_id: String,
    },
    /// A Kubernetes service account federated by the identity domain (a session token of
    /// its token exchange).
    Federated {
        /// Namespace (from the subject token's `sub`).
        namespace: String,
        /// Service account name.
        service_account: String,
        /// `upst` or `rpst`.
        token_type: String,
        /// What policies name: the service user's id (UPST) or the subject (RPST).
        name: String,
        /// Who exchanged: the confidential application's id, or `instance:<ocid>`.
        client: String,
    },
}

impl Principal {
    fn revocation_key(&self) -> String {
        match self {
            Principal::User { user, .. } => format!("user:{user}"),
            Principal::Workload {
                namespace,
                service_account,
                ..
            } => format!("sa:{namespace}/{service_account}"),
            Principal::Instance { instance_id, .. } => format!("instance:{instance_id}"),
            Principal::Federated {
                namespace,
                service_account,
                ..
            } => format!("sa:{namespace}/{service_account}"),
        }
    }

    fn allowed_by(&self, access: &Access) -> bool {
        match self {
            Principal::User { user, .. } => access.users.iter().any(|u| u == user),
            Principal::Workload {
                namespace,
                service_account,
                ..
            } => access
                .workloads
                .iter()
                .any(|w| &w.namespace == namespace && &w.service_account == service_account),
            Principal::Instance { tenancy, .. } => {
                access.instance_tenancies.iter().any(|t| t == tenancy)
            }
            Principal::Federated { name, .. } => access.federated.iter().any(|f| f == name),
        }
    }
}

/// A principal to revoke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Revoke {
    /// A user OCID: its API keys stop working.
    User(String),
    /// A service account: its Kubernetes tokens and RPSTs stop working, and no new ones are
    /// issued.
    ServiceAccount {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// An instance OCID: its session tokens stop working and federation refuses it.
    Instance(String),
}

impl Revoke {
    fn key(&self) -> String {
        match self {
            Revoke::User(u) => format!("user:{u}"),
            Revoke::ServiceAccount { namespace, name } => format!("sa:{namespace}/{name}"),
            Revoke::Instance(i) => format!("instance:{i}"),
        }
    }
}

/// One recorded Secrets API call.
#[derive(Clone, Debug, Serialize)]
pub struct SecretsCall {
    /// Who made it (`None` when authentication failed).
    pub identity: Option<Principal>,
    /// `GET` or `POST`.
    pub method: String,
    /// Raw path and query.
    pub target: String,
    /// The secret answered, when one was found.
    pub secret_id: Option<String>,
    /// The version answered, when one was found.
    pub version_number: Option<i64>,
    /// Response status.
    pub status: u16,
    /// `opc-request-id` of the response.
    pub request_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    Kube,
    Rpst,
    Instance,
    /// The identity domain's session tokens: verified with their own `jwk` claim.
    Federated,
}

#[derive(Debug, Clone)]
pub(crate) struct TokenRecord {
    pub(crate) kind: TokenKind,
    pub(crate) principal: Principal,
    pub(crate) exp: SystemTime,
    pub(crate) session_spki: Option<Vec<u8>>,
    pub(crate) force_expired: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct VersionState {
    pub(crate) number: i64,
    pub(crate) name: Option<String>,
    pub(crate) stages: Vec<String>,
    pub(crate) content: Vec<u8>,
    pub(crate) time_created: SystemTime,
}

#[derive(Debug, Clone)]
pub(crate) struct SecretState {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) vault_id: String,
    pub(crate) versions: Vec<VersionState>,
    pub(crate) access: Access,
    pub(crate) compartment_id: String,
    pub(crate) freeform_tags: BTreeMap<String, String>,
    pub(crate) lifecycle_state: String,
    pub(crate) time_created: SystemTime,
}

/// One recorded Vault API call (ListSecrets).
#[derive(Clone, Debug, Serialize)]
pub struct VaultsCall {
    /// Who made it (`None` when authentication failed).
    pub identity: Option<Principal>,
    /// Raw path and query.
    pub target: String,
    /// Secrets in the page answered.
    pub items: usize,
    /// Response status.
    pub status: u16,
}

#[derive(Debug, Clone)]
pub(crate) struct UserKey {
    pub(crate) tenancy: String,
    pub(crate) user: String,
    pub(crate) fingerprint: String,
    pub(crate) spki: Vec<u8>,
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) secrets: Vec<SecretState>,
    pub(crate) users: Vec<UserKey>,
    pub(crate) service_accounts: BTreeMap<(String, String), String>,
    pub(crate) kube_secrets: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
    /// `metadata.resourceVersion` of each Secret; bumped when a test replaces it.
    pub(crate) kube_secret_versions: BTreeMap<(String, String), u64>,
    pub(crate) tokens: HashMap<String, TokenRecord>,
    pub(crate) revoked: BTreeSet<String>,
    pub(crate) secrets_calls: Vec<SecretsCall>,
    pub(crate) vaults_calls: Vec<VaultsCall>,
    /// Who may list the secrets of each compartment.
    pub(crate) compartments: BTreeMap<String, Access>,
    /// The most items a list page answers, whatever `limit` asks.
    pub(crate) list_page_size: usize,
    pub(crate) cert_pki: crate::certs::CertPki,
    pub(crate) certificates: Vec<crate::certs::CertState>,
    pub(crate) certificate_authorities: Vec<crate::certs::CaSeed>,
    pub(crate) ca_bundles: Vec<crate::certs::CaSeed>,
    pub(crate) certificate_calls: Vec<crate::certs::CertificateCall>,
    pub(crate) faults: BTreeMap<Endpoint, FaultPlan>,
    /// Faults of the requests to one host name of an endpoint (its `Host`, without the
    /// port), before the endpoint's own: one listener answering as several regions.
    pub(crate) host_faults: BTreeMap<(Endpoint, String), FaultPlan>,
    /// Faults of the service-account issuer's two documents at the Kubernetes endpoint,
    /// apart from the endpoint's own.
    pub(crate) issuer_faults: FaultPlan,
    /// The service-account issuer's keys, oldest first: the last signs new Kubernetes
    /// tokens, all are published (as an API server verifying with old keys does).
    pub(crate) issuer_keys: Vec<Arc<JwtSigner>>,
    /// The issuer's keys at start: what a trust with a `publicCertificate` knows.
    pub(crate) pinned_issuer_keys: Vec<Arc<JwtSigner>>,
    /// The identity domain's applications and trusts.
    pub(crate) identity_domain: crate::seed::IdentityDomainSeed,
    pub(crate) http1_only: BTreeSet<Endpoint>,
    /// Kubernetes Nodes, what the provider may not do to them, edits pending.
    pub(crate) nodes: crate::nodes::Nodes,
    pub(crate) idle_timeout: BTreeMap<Endpoint, Duration>,
    /// Emulator time = base clock + offset (`true` = ahead).
    pub(crate) clock_offset: (bool, Duration),
    pub(crate) lifetimes: Lifetimes,
    pub(crate) region: String,
    pub(crate) workload_tenancy: String,
    pub(crate) instance_tenancy: String,
    pub(crate) instance_id: String,
}

/// Everything the emulator's tasks share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) clock: SharedClock,
    state: Mutex<State>,
    pub(crate) counters: Counters,
    /// Signs OCI's tokens (RPSTs, instance tokens) and, until a rotation, Kubernetes ones.
    pub(crate) jwt: Arc<JwtSigner>,
    pub(crate) pki: Pki,
    pub(crate) gates: BTreeMap<Endpoint, watch::Sender<bool>>,
    pub(crate) stall_release: watch::Sender<u64>,
    pub(crate) settings_changed: watch::Sender<u64>,
    pub(crate) shutdown: watch::Sender<bool>,
}

/// A uid derived from a name, formatted like a Kubernetes uid.
pub(crate) fn derived_uid(namespace: &str, name: &str) -> String {
    let d = aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        format!("{namespace}/{name}").as_bytes(),
    );
    let h: String = d.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl Shared {
    pub(crate) fn new(seed: &Seed, clock: SharedClock) -> Result<Self, Error> {
        let pki = Pki::generate(&seed.instance.tenancy, &seed.instance.instance_id)?;
        let jwt = Arc::new(JwtSigner::generate()?);
        let now = clock.now();
        let mut users = Vec::new();
        for u in &seed.users {
            let spki = pem_decode(&u.public_key_pem, &["PUBLIC KEY", "RSA PUBLIC KEY"])
                .ok_or_else(|| Error::Seed(format!("user {} has no PEM public key", u.user)))?;
            if !crate::crypto::is_rsa_public_key(&spki) {
                return Err(Error::Seed(format!("user {} key is not RSA", u.user)));
            }
            users.push(UserKey {
                tenancy: u.tenancy.clone(),
                user: u.user.clone(),
                fingerprint: api_key_fingerprint(&spki),
                spki,
            });
        }
        let mut secrets = Vec::new();
        for s in &seed.secrets {
            let mut numbers = BTreeSet::new();
            for v in &s.versions {
                if v.number <= 0 || !numbers.insert(v.number) {
                    return Err(Error::Seed(format!(
                        "secret {} has a duplicate or non-positive version {}",
                        s.id, v.number
                    )));
                }
                for st in &v.stages {
                    if !crate::seed::STAGES.contains(&st.as_str()) {
                        return Err(Error::Seed(format!("unknown stage {st}")));
                    }
                }
            }
            let state = match s.lifecycle_state.as_str() {
                "" => "ACTIVE",
                other if crate::seed::LIFECYCLE_STATES.contains(&other) => other,
                other => return Err(Error::Seed(format!("unknown lifecycle state {other}"))),
            };
            let compartment = match s.compartment_id.as_str() {
                "" => crate::seed::DEFAULT_COMPARTMENT,
                other => other,
            };
            secrets.push(SecretState {
                compartment_id: compartment.to_owned(),
                freeform_tags: s.freeform_tags.clone(),
                lifecycle_state: state.to_owned(),
                time_created: now,
                id: s.id.clone(),
                name: s.name.clone(),
                vault_id: s.vault_id.clone(),
                versions: s
                    .versions
                    .iter()
                    .map(|v| VersionState {
                        number: v.number,
                        name: v.name.clone(),
                        stages: v.stages.clone(),
                        content: v.content.0.clone(),
                        time_created: now,
                    })
                    .collect(),
                access: s.access.clone(),
            });
        }
        let mut service_accounts = BTreeMap::new();
        for sa in seed
            .service_accounts
            .iter()
            .chain(std::iter::once(&seed.provider_service_account))
        {
            let uid = if sa.uid.is_empty() {
                derived_uid(&sa.namespace, &sa.name)
            } else {
                sa.uid.clone()
            };
            service_accounts.insert((sa.namespace.clone(), sa.name.clone()), uid);
        }
        let kube_secrets = seed
            .kube_secrets
            .iter()
            .map(|k| {
                (
                    (k.namespace.clone(), k.name.clone()),
                    k.data
                        .iter()
                        .map(|(a, b)| (a.clone(), b.0.clone()))
                        .collect(),
                )
            })
            .collect();
        let cert_pki = crate::certs::CertPki::generate()?;
        let mut certificates = Vec::new();
        for c in &seed.certificates {
            certificates.push(crate::certs::CertState {
                versions: vec![cert_pki.issue(c, 1, now)?],
                seed: c.clone(),
            });
        }
        let state = State {
            cert_pki,
            certificates,
            certificate_authorities: seed.certificate_authorities.clone(),
            ca_bundles: seed.ca_bundles.clone(),
            certificate_calls: Vec::new(),
            secrets,
            users,
            service_accounts,
            kube_secret_versions: BTreeMap::new(),
            kube_secrets,
            tokens: HashMap::new(),
            revoked: BTreeSet::new(),
            secrets_calls: Vec::new(),
            vaults_calls: Vec::new(),
            compartments: seed
                .compartments
                .iter()
                .map(|c| (c.id.clone(), c.inspect.clone()))
                .collect(),
            list_page_size: 1000,
            faults: BTreeMap::new(),
            host_faults: BTreeMap::new(),
            issuer_faults: FaultPlan::default(),
            issuer_keys: vec![jwt.clone()],
            pinned_issuer_keys: vec![jwt.clone()],
            identity_domain: seed.identity_domain.clone(),
            http1_only: BTreeSet::new(),
            nodes: crate::nodes::Nodes::new(&seed.nodes, now),
            idle_timeout: BTreeMap::new(),
            clock_offset: (true, Duration::ZERO),
            lifetimes: seed.lifetimes.clone(),
            region: seed.region.clone(),
            workload_tenancy: seed.workload_tenancy.clone(),
            instance_tenancy: seed.instance.tenancy.clone(),
            instance_id: seed.instance.instance_id.clone(),
        };
        let gates = Endpoint::ALL
            .iter()
            .map(|e| (*e, watch::channel(false).0))
            .collect();
        Ok(Self {
            clock,
            state: Mutex::new(state),
            counters: Counters::new(),
            jwt,
            pki,
            gates,
            stall_release: watch::channel(0).0,
            settings_changed: watch::channel(0).0,
            shutdown: watch::channel(false).0,
        })
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters to a test emulator, so poisoning is ignored.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The emulator's notion of now.
    pub(crate) fn now(&self) -> SystemTime {
        let base = self.clock.now();
        let (ahead, off) = self.state().clock_offset;
        if ahead {
            base + off
        } else {
            base.checked_sub(off).unwrap_or(UNIX_EPOCH)
        }
    }

    pub(crate) fn is_revoked(&self, principal: &Principal) -> bool {
        self.state().revoked.contains(&principal.revocation_key())
    }

    pub(crate) fn revoke(&self, r: &Revoke) {
        self.state().revoked.insert(r.key());
    }

    pub(crate) fn restore(&self, r: &Revoke) {
        self.state().revoked.remove(&r.key());
    }

    /// Issues and records a JWT.
    pub(crate) fn issue_token(
        &self,
        kind: TokenKind,
        principal: Principal,
        mut claims: serde_json::Value,
        lifetime: Duration,
        session_spki: Option<Vec<u8>>,
    ) -> Result<(String, SystemTime), Error> {
        let now = self.now();
        let exp = now + lifetime;
        let iat = secs(now);
        if let Some(obj) = claims.as_object_mut() {
            obj.insert("iat".into(), iat.into());
            obj.insert("nbf".into(), iat.into());
            obj.insert("exp".into(), secs(exp).into());
            obj.insert("jti".into(), crate::crypto::random_hex(16).into());
        }
        let token = match kind {
            TokenKind::Kube => self.issuer_key().sign(&claims)?,
            TokenKind::Rpst | TokenKind::Instance | TokenKind::Federated => {
                self.jwt.sign(&claims)?
            }
        };
        self.state().tokens.insert(
            token.clone(),
            TokenRecord {
                kind,
                principal,
                exp: UNIX_EPOCH + Duration::from_secs(secs(exp)),
                session_spki,
                force_expired: false,
            },
        );
        Ok((token, exp))
    }

    /// Looks up a token this emulator issued and checks it is of an accepted kind, unexpired
    /// and not revoked.
    pub(crate) fn check_token(
        &self,
        token: &str,
        kinds: &[TokenKind],
    ) -> Result<TokenRecord, String> {
        let record = self
            .state()
            .tokens
            .get(token)
            .cloned()
            .ok_or("token was not issued by this emulator")?;
        if !kinds.contains(&record.kind) {
            return Err("token is of the wrong kind for this endpoint".into());
        }
        let verified = match record.kind {
            TokenKind::Kube => self.state().issuer_keys.iter().any(|k| k.verify(token)),
            TokenKind::Rpst | TokenKind::Instance | TokenKind::Federated => self.jwt.verify(token),
        };
        if !verified {
            return Err("token signature is invalid".into());
        }
        if record.force_expired || record.exp <= self.now() {
            return Err("token has expired".into());
        }
        if self.is_revoked(&record.principal) {
            return Err("principal has been revoked".into());
        }
        Ok(record)
    }

    /// The key that signs new Kubernetes tokens.
    pub(crate) fn issuer_key(&self) -> Arc<JwtSigner> {
        let st = self.state();
        st.issuer_keys
            .last()
            .cloned()
            .unwrap_or_else(|| self.jwt.clone())
    }

    pub(crate) fn workload_of(&self, w: &WorkloadRef) -> Option<Principal> {
        let st = self.state();
        let uid = st
            .service_accounts
            .get(&(w.namespace.clone(), w.service_account.clone()))?;
        Some(Principal::Workload {
            namespace: w.namespace.clone(),
            service_account: w.service_account.clone(),
            service_account_uid: uid.clone(),
            tenancy: st.workload_tenancy.clone(),
        })
    }

    pub(crate) fn allowed(&self, principal: &Principal, access: &Access) -> bool {
        principal.allowed_by(access)
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// RFC 3339 UTC with milliseconds, e.g. `2020-03-18T16:51:38.851Z`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let total = d.as_secs();
    let days = (total / 86_400) as i64;
    let rem = total % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        d.subsec_millis()
    )
}
