//! Fake identity and vault services for the mount service's own logic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use oci_csi_provider::{
    Budget, BudgetLayer, ByteBudget, Failover, FailoverLayer, MountContext, NoCertificates,
    OciMount,
};
use tower::Layer as _;

/// Establishes every request as the workload identity of its pod (in `region`, when set).
#[derive(Clone, Debug, Default)]
pub struct Auth {
    pub calls: Arc<AtomicUsize>,
    pub region: Option<regions::Region>,
}

impl tower::Service<auth::IdentityRequest> for Auth {
    type Response = auth::Established;
    type Error = auth::AuthError;
    type Future = BoxFuture<'static, Result<auth::Established, auth::AuthError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: auth::IdentityRequest) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let region = self.region.clone();
        Box::pin(async move {
            Ok(auth::Established {
                region,
                session: auth::Session::for_tests(auth::Credential::Workload {
                    namespace: request.namespace.clone().unwrap_or_default(),
                    service_account: request.service_account.clone().unwrap_or_default(),
                    service_account_uid: None,
                }),
            })
        })
    }
}

/// What the fake vault does for a secret name.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Answer with this content, secret id and version.
    Bundle {
        content: Vec<u8>,
        secret_id: String,
        version: u64,
    },
    /// Fail with this HTTP status (404, 401, 403, 400, 429, 503).
    Status(u16),
    /// Never answer (until dropped).
    Hang,
    /// Like the inner behaviour, 50 ms later than the others.
    Late(Box<Behaviour>),
}

/// A vault service answering per secret name; by default every secret exists, with its
/// name as content.
#[derive(Clone, Debug, Default)]
pub struct Vault {
    pub behaviours: Arc<Mutex<BTreeMap<String, Behaviour>>>,
    pub in_flight: Arc<AtomicUsize>,
    pub max_in_flight: Arc<AtomicUsize>,
    pub dropped_unfinished: Arc<AtomicUsize>,
    pub requests: Arc<Mutex<Vec<vault::SecretRequest>>>,
}

impl Vault {
    pub fn with(self, name: &str, behaviour: Behaviour) -> Self {
        self.behaviours
            .lock()
            .unwrap()
            .insert(name.into(), behaviour);
        self
    }
}

struct Flight(Arc<AtomicUsize>, Arc<AtomicUsize>, bool);

impl Drop for Flight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        if !self.2 {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn subject(request: &vault::SecretRequest) -> Box<vault::Subject> {
    Box::new(vault::Subject {
        object: format!("{:?}", request.secret),
        principal: request.identity(),
        grant: vault::Subject::SECRETS_GRANT,
    })
}

fn status_error(request: &vault::SecretRequest, status: u16) -> vault::VaultError {
    let oci = vault::OciError {
        status,
        code: format!("Code{status}"),
        message: format!("status {status}"),
    };
    let subject = subject(request);
    match status {
        404 => vault::VaultError::NotFound {
            subject,
            oci,
            opc_request_id: Some("rid".into()),
        },
        401 => vault::VaultError::Unauthenticated {
            subject,
            oci,
            opc_request_id: None,
        },
        403 => vault::VaultError::PermissionDenied {
            subject,
            oci,
            opc_request_id: None,
        },
        400 => vault::VaultError::InvalidArgument {
            subject,
            oci,
            opc_request_id: None,
        },
        _ => vault::VaultError::Status {
            subject,
            oci,
            opc_request_id: None,
            retry_after_secs: None,
        },
    }
}

impl tower::Service<vault::SecretRequest> for Vault {
    type Response = vault::SecretBundle;
    type Error = vault::VaultError;
    type Future = BoxFuture<'static, Result<vault::SecretBundle, vault::VaultError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: vault::SecretRequest) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let now = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            me.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let mut flight = Flight(me.in_flight.clone(), me.dropped_unfinished.clone(), false);
            me.requests.lock().unwrap().push(request.clone());
            let name = match &request.secret {
                vault::SecretRef::ByName { name, .. } => name.clone(),
                vault::SecretRef::ById { secret_id } => secret_id.clone(),
            };
            let mut behaviour = me.behaviours.lock().unwrap().get(&name).cloned();
            // Let other fetches start, so concurrency is observable.
            tokio::time::sleep(Duration::from_millis(5)).await;
            if let Some(Behaviour::Late(inner)) = behaviour {
                tokio::time::sleep(Duration::from_millis(50)).await;
                behaviour = Some(*inner);
            }
            let result = match behaviour {
                None => Ok(vault::SecretBundle {
                    secret_id: format!("ocid1.vaultsecret.oc1..{name}"),
                    version_number: 1,
                    version_name: None,
                    stages: vec![vault::Stage::Current],
                    content: vault::SecretContent::new(zeroize::Zeroizing::new(
                        name.clone().into_bytes(),
                    )),
                    opc_request_id: None,
                }),
                Some(Behaviour::Bundle {
                    content,
                    secret_id,
                    version,
                }) => Ok(vault::SecretBundle {
                    secret_id,
                    version_number: version,
                    version_name: None,
                    stages: vec![],
                    content: vault::SecretContent::new(zeroize::Zeroizing::new(content)),
                    opc_request_id: None,
                }),
                Some(Behaviour::Status(status)) => Err(status_error(&request, status)),
                Some(Behaviour::Hang) => std::future::pending().await,
                Some(Behaviour::Late(_)) => unreachable!("unwrapped above"),
            };
            flight.2 = true;
            result
        })
    }
}

/// The mount service of these tests: the fetch services under the layers the binary puts
/// over its fetch stacks (the failover region over the byte budget for secrets, the byte
/// budget for certificates).
pub type Mount<A, V, C = NoCertificates> = OciMount<A, Failover<Budget<V>>, Budget<C>>;

/// What each fetch reserves from the budget: the binary's default body limit.
pub const RESERVE: usize = 256 * 1024;

/// `auth`, `vault` and `certificates` as a mount service, its fetches reserving [`RESERVE`]
/// bytes of `budget` (when there is one).
pub fn mount<A, V, C>(
    auth: A,
    vault: V,
    certificates: C,
    config: MountContext,
    budget: Option<ByteBudget>,
) -> Mount<A, V, C> {
    let budget = BudgetLayer::new(budget, RESERVE);
    OciMount::new(
        auth,
        FailoverLayer::default().layer(budget.layer(vault)),
        budget.layer(certificates),
        config,
    )
}

pub fn mount_service(vault: Vault) -> Mount<Auth, Vault> {
    mount(Auth::default(), vault, NoCertificates, config(), None)
}

/// The mount bounds of these tests, with every call going to `https://secrets.example`
/// and `https://certificates.example` (the fake vault answers; nothing connects).
pub fn config() -> MountContext {
    MountContext {
        endpoints: std::sync::Arc::new(endpoints(
            "https://secrets.example",
            "https://certificates.example",
        )),
        ..MountContext::default()
    }
}

/// Endpoints sending every region's calls to these URLs.
pub fn endpoints(secrets: &str, certificates: &str) -> oci_csi_provider::Endpoints {
    let overrides = oci_csi_provider::EndpointOverrides {
        secrets: Some(secrets.into()),
        certificates: Some(certificates.into()),
        ..oci_csi_provider::EndpointOverrides::default()
    };
    oci_csi_provider::Endpoints::new(regions::Regions::default(), None, overrides).unwrap()
}
