//! The initial state of an emulator: vaults, secrets, principals and policies.
//!
//! A [`Seed`] is plain data: build it in Rust with the helper methods, or write it in TOML
//! for the `oci-emulator` binary (see the crate README for an example).

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// The stages a secret version can carry (spec 2.2).
pub const STAGES: [&str; 5] = ["CURRENT", "PENDING", "LATEST", "PREVIOUS", "DEPRECATED"];

/// The compartment of a secret that names none.
pub const DEFAULT_COMPARTMENT: &str = "ocid1.compartment.oc1..aaaaaaaaemulatorcompartment";

/// A secret's lifecycle states of the Vault API (ListSecrets filters on them).
pub const LIFECYCLE_STATES: [&str; 9] = [
    "CREATING",
    "ACTIVE",
    "UPDATING",
    "DELETING",
    "DELETED",
    "SCHEDULING_DELETION",
    "PENDING_DELETION",
    "CANCELLING_DELETION",
    "FAILED",
];

/// Everything an emulator starts with.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Seed {
    /// Region reported by instance metadata, e.g. `us-ashburn-1`.
    pub region: String,
    /// Tenancy of workload identities (the `res_tenant` claim of RPSTs).
    pub workload_tenancy: String,
    /// Vaults (only their ids matter to the Secrets API).
    pub vaults: Vec<VaultSeed>,
    /// Secrets with their versions and access policy.
    pub secrets: Vec<SecretSeed>,
    /// Users with API keys.
    pub users: Vec<UserSeed>,
    /// The compute instance whose identity instance metadata serves.
    pub instance: InstanceSeed,
    /// Kubernetes service accounts TokenRequest may issue tokens for.
    pub service_accounts: Vec<ServiceAccountSeed>,
    /// Kubernetes Secrets readable through the Kubernetes API.
    pub kube_secrets: Vec<KubeSecretSeed>,
    /// The provider's own service account, whose token the emulator writes to a file.
    pub provider_service_account: ServiceAccountSeed,
    /// Token lifetimes.
    pub lifetimes: Lifetimes,
    /// Leaf certificates of the Certificates API.
    pub certificates: Vec<crate::certs::CertificateSeed>,
    /// Certificate authorities (each is the emulator's issuing CA).
    pub certificate_authorities: Vec<crate::certs::CaSeed>,
    /// CA bundles (each holds the emulator's issuing CA and root).
    pub ca_bundles: Vec<crate::certs::CaSeed>,
    /// The OCI identity domain of workload identity federation: its confidential
    /// applications and identity propagation trusts.
    pub identity_domain: IdentityDomainSeed,
    /// Compartments and who may list their secrets (`inspect secrets`).
    pub compartments: Vec<CompartmentSeed>,
    /// Kubernetes Nodes (their taints), readable and patchable through the Kubernetes API.
    pub nodes: Vec<crate::nodes::NodeSeed>,
}

impl Default for Seed {
    fn default() -> Self {
        Self {
            region: "us-ashburn-1".into(),
            workload_tenancy: "ocid1.tenancy.oc1..aaaaaaaaworkloadtenancy".into(),
            vaults: Vec::new(),
            secrets: Vec::new(),
            users: Vec::new(),
            instance: InstanceSeed::default(),
            service_accounts: Vec::new(),
            kube_secrets: Vec::new(),
            provider_service_account: ServiceAccountSeed {
                namespace: "kube-system".into(),
                name: "oci-secrets-store-provider".into(),
                uid: "00000000-0000-4000-8000-000000000001".into(),
            },
            lifetimes: Lifetimes::default(),
            certificates: Vec::new(),
            certificate_authorities: Vec::new(),
            ca_bundles: Vec::new(),
            identity_domain: IdentityDomainSeed::default(),
            compartments: Vec::new(),
            nodes: Vec::new(),
        }
    }
}

impl Seed {
    /// Adds a vault.
    pub fn vault(mut self, id: impl Into<String>) -> Self {
        self.vaults.push(VaultSeed { id: id.into() });
        self
    }

    /// Adds a secret.
    pub fn secret(mut self, secret: SecretSeed) -> Self {
        self.secrets.push(secret);
        self
    }

    /// Adds a user API key.
    pub fn user(mut self, user: UserSeed) -> Self {
        self.users.push(user);
        self
    }

    /// Adds a Kubernetes service account; its uid is derived from the name when empty.
    pub fn service_account(mut self, namespace: &str, name: &str) -> Self {
        self.service_accounts.push(ServiceAccountSeed {
            namespace: namespace.into(),
            name: name.into(),
            uid: String::new(),
        });
        self
    }

    /// Adds a Kubernetes Node.
    pub fn node(mut self, node: crate::nodes::NodeSeed) -> Self {
        self.nodes.push(node);
        self
    }

    /// Adds a leaf certificate.
    pub fn certificate(mut self, certificate: crate::certs::CertificateSeed) -> Self {
        self.certificates.push(certificate);
        self
    }

    /// Adds a certificate authority.
    pub fn certificate_authority(mut self, ca: crate::certs::CaSeed) -> Self {
        self.certificate_authorities.push(ca);
        self
    }

    /// Adds a CA bundle.
    pub fn ca_bundle(mut self, bundle: crate::certs::CaSeed) -> Self {
        self.ca_bundles.push(bundle);
        self
    }

    /// Adds a compartment and who may list its secrets.
    pub fn compartment(mut self, compartment: CompartmentSeed) -> Self {
        self.compartments.push(compartment);
        self
    }

    /// Adds a Kubernetes Secret.
    pub fn kube_secret(mut self, secret: KubeSecretSeed) -> Self {
        self.kube_secrets.push(secret);
        self
    }
}

/// A compartment: who may list its secrets with the Vault API (the IAM statement
/// `inspect secrets in compartment ...`). Reading a secret's bundles is its own `access`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompartmentSeed {
    /// Compartment OCID.
    pub id: String,
    /// Who may list its secrets.
    pub inspect: Access,
}

impl CompartmentSeed {
    /// A compartment nobody may list.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            inspect: Access::default(),
        }
    }

    /// Lets a user OCID list its secrets.
    pub fn allow_user(mut self, user: impl Into<String>) -> Self {
        self.inspect.users.push(user.into());
        self
    }

    /// Lets a workload (namespace + service account) list its secrets.
    pub fn allow_workload(mut self, namespace: &str, service_account: &str) -> Self {
        self.inspect.workloads.push(WorkloadRef {
            namespace: namespace.into(),
            service_account: service_account.into(),
        });
        self
    }

    /// Lets the instances of a tenancy list its secrets.
    pub fn allow_instance_tenancy(mut self, tenancy: impl Into<String>) -> Self {
        self.inspect.instance_tenancies.push(tenancy.into());
        self
    }
}

/// A vault.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VaultSeed {
    /// Vault OCID.
    pub id: String,
}

/// A secret with versions and the principals allowed to read it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecretSeed {
    /// Secret OCID.
    pub id: String,
    /// Name, unique in its vault.
    pub name: String,
    /// Vault OCID.
    pub vault_id: String,
    /// Versions; numbers must be unique.
    pub versions: Vec<VersionSeed>,
    /// Who may read it.
    pub access: Access,
    /// Its compartment (empty: [`DEFAULT_COMPARTMENT`]).
    pub compartment_id: String,
    /// Its freeform tags.
    pub freeform_tags: BTreeMap<String, String>,
    /// Its lifecycle state (empty: `ACTIVE`), one of [`LIFECYCLE_STATES`].
    pub lifecycle_state: String,
}

impl SecretSeed {
    /// A secret without versions and without access.
    pub fn new(
        id: impl Into<String>,
        vault_id: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            vault_id: vault_id.into(),
            ..Self::default()
        }
    }

    /// Adds a version with the given stages.
    pub fn version(mut self, number: i64, content: impl Into<Vec<u8>>, stages: &[&str]) -> Self {
        self.versions.push(VersionSeed {
            number,
            name: None,
            stages: stages.iter().map(|s| (*s).to_owned()).collect(),
            content: Content(content.into()),
        });
        self
    }

    /// Puts it in a compartment.
    pub fn in_compartment(mut self, compartment_id: impl Into<String>) -> Self {
        self.compartment_id = compartment_id.into();
        self
    }

    /// Adds a freeform tag.
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.freeform_tags.insert(key.into(), value.into());
        self
    }

    /// Sets its lifecycle state, e.g. `PENDING_DELETION`.
    pub fn lifecycle(mut self, state: impl Into<String>) -> Self {
        self.lifecycle_state = state.into();
        self
    }

    /// Allows a user OCID.
    pub fn allow_user(mut self, user: impl Into<String>) -> Self {
        self.access.users.push(user.into());
        self
    }

    /// Allows a workload (namespace + service account).
    pub fn allow_workload(mut self, namespace: &str, service_account: &str) -> Self {
        self.access.workloads.push(WorkloadRef {
            namespace: namespace.into(),
            service_account: service_account.into(),
        });
        self
    }

    /// Allows instances of a tenancy.
    pub fn allow_instance_tenancy(mut self, tenancy: impl Into<String>) -> Self {
        self.access.instance_tenancies.push(tenancy.into());
        self
    }

    /// Allows a federated principal by name: a service user's id (the sessions the
    /// identity domain answers as UPSTs) or a service account's subject
    /// `system:serviceaccount:<ns>:<sa>` (as RPSTs).
    pub fn allow_federated(mut self, name: impl Into<String>) -> Self {
        self.access.federated.push(name.into());
        self
    }
}

/// One secret version.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionSeed {
    /// Version number (> 0).
    pub number: i64,
    /// Optional version name.
    #[serde(default)]
    pub name: Option<String>,
    /// Stages, e.g. `["CURRENT", "LATEST"]`.
    #[serde(default)]
    pub stages: Vec<String>,
    /// Content bytes: in TOML either `content = { text = "..." }` or `{ base64 = "..." }`.
    pub content: Content,
}

/// Secret content bytes; serialised as `{ text = "..." }` or `{ base64 = "..." }`.
#[derive(Clone, PartialEq, Eq)]
pub struct Content(pub Vec<u8>);

impl std::fmt::Debug for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Content({} bytes)", self.0.len())
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContentRepr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base64: Option<String>,
}

impl Serialize for Content {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ContentRepr {
            text: None,
            base64: Some(STANDARD.encode(&self.0)),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let repr = ContentRepr::deserialize(d)?;
        match (repr.text, repr.base64) {
            (Some(t), None) => Ok(Content(t.into_bytes())),
            (None, Some(b)) => STANDARD
                .decode(b.trim())
                .map(Content)
                .map_err(serde::de::Error::custom),
            _ => Err(serde::de::Error::custom(
                "content needs exactly one of `text` or `base64`",
            )),
        }
    }
}

/// Who may read a secret.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Access {
    /// User OCIDs.
    pub users: Vec<String>,
    /// Workloads.
    pub workloads: Vec<WorkloadRef>,
    /// Tenancies whose instances may read.
    pub instance_tenancies: Vec<String>,
    /// Federated principals by name (`request.principal.name` in an OCI policy): service
    /// user ids (UPST sessions) and service-account subjects (RPST sessions).
    pub federated: Vec<String>,
}

/// A Kubernetes workload identity.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadRef {
    /// Namespace.
    pub namespace: String,
    /// Service account name.
    pub service_account: String,
}

/// A user with an API key.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSeed {
    /// Tenancy OCID.
    pub tenancy: String,
    /// User OCID.
    pub user: String,
    /// Public key PEM (`PUBLIC KEY` or `RSA PUBLIC KEY`); its fingerprint is computed.
    pub public_key_pem: String,
}

/// The emulated compute instance.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstanceSeed {
    /// Tenancy OCID put in the leaf certificate (`OU=opc-tenant:...`).
    pub tenancy: String,
    /// Instance OCID.
    pub instance_id: String,
}

impl Default for InstanceSeed {
    fn default() -> Self {
        Self {
            tenancy: "ocid1.tenancy.oc1..aaaaaaaainstancetenancy".into(),
            instance_id: "ocid1.instance.oc1.iad.aaaaaaaaemulatedinstance".into(),
        }
    }
}

/// A Kubernetes service account.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceAccountSeed {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID; derived from namespace and name when empty.
    pub uid: String,
}

/// A Kubernetes Secret.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubeSecretSeed {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Data keys and their bytes.
    pub data: BTreeMap<String, Content>,
}

impl KubeSecretSeed {
    /// An empty Secret.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            data: BTreeMap::new(),
        }
    }

    /// Adds a data key.
    pub fn data(mut self, key: &str, value: impl Into<Vec<u8>>) -> Self {
        self.data.insert(key.into(), Content(value.into()));
        self
    }
}

/// Token lifetimes in seconds.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Lifetimes {
    /// RPST lifetime from proxymux.
    pub rpst_secs: u64,
    /// Instance principal session token lifetime from federation.
    pub instance_token_secs: u64,
    /// Default TokenRequest lifetime when the request gives none.
    pub kube_token_default_secs: u64,
    /// Lifetime of the provider's own service-account token.
    pub provider_token_secs: u64,
    /// Lifetime of the identity domain's session tokens (UPST and RPST).
    pub federated_token_secs: u64,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Self {
            rpst_secs: 1200,
            instance_token_secs: 1200,
            kube_token_default_secs: 3600,
            provider_token_secs: 365 * 24 * 3600,
            federated_token_secs: 3600,
        }
    }
}

/// The identity domain: confidential applications and identity propagation trusts
/// (`spec/oci-workload-identity-federation.md` section 4).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdentityDomainSeed {
    /// Confidential applications (client credentials grant).
    pub clients: Vec<OAuthClientSeed>,
    /// Identity propagation trusts, in order (the first that applies decides).
    pub trusts: Vec<TrustSeed>,
}

impl IdentityDomainSeed {
    /// A domain with one confidential application and one active trust of the emulator's
    /// cluster (its issuer and current keys) for tokens of `audience`, which answers RPSTs
    /// for `res_type` `k8sworkload`; [`IdentityDomainSeed::rule`] adds UPST mappings.
    pub fn new(client_id: &str, client_secret: &str, audience: &str) -> Self {
        Self {
            clients: vec![OAuthClientSeed {
                id: client_id.into(),
                secret: client_secret.into(),
            }],
            trusts: vec![TrustSeed {
                oauth_clients: vec![client_id.into()],
                client_claim_values: vec![audience.into()],
                ..TrustSeed::default()
            }],
        }
    }

    /// Adds an impersonation rule (`sub eq system:serviceaccount:ns:sa`) to the first trust.
    pub fn rule(mut self, rule: &str, service_user: &str) -> Self {
        if let Some(trust) = self.trusts.first_mut() {
            trust.impersonation_service_users.push(ImpersonationRule {
                rule: rule.into(),
                value: service_user.into(),
            });
        }
        self
    }
}

/// A confidential application.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OAuthClientSeed {
    /// Its client id.
    pub id: String,
    /// Its client secret.
    pub secret: String,
}

/// Where a trust takes the cluster's service-account keys from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrustKeys {
    /// `publicKeyEndpoint`: the cluster's JWKS as it is now (a rotation is seen at once).
    #[default]
    Endpoint,
    /// `publicCertificate`: the keys the cluster had when the emulator started (a rotation
    /// is not seen until the trust is updated).
    Pinned,
}

/// An identity propagation trust of type JWT.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrustSeed {
    /// Its name.
    pub name: String,
    /// `issuer`: the `iss` its tokens must carry.
    pub issuer: String,
    /// `active` (a real trust defaults to false; here true).
    pub active: bool,
    /// `publicKeyEndpoint` or `publicCertificate`.
    pub public_keys: TrustKeys,
    /// `oauthClients`: the confidential applications that may exchange.
    pub oauth_clients: Vec<String>,
    /// Tenancies whose instances may exchange with their instance principal signature (the
    /// stand-in for a dynamic group's policy).
    pub instance_tenancies: Vec<String>,
    /// `clientClaimValues` of `clientClaimName: aud`: the token's `aud` must hold one.
    pub client_claim_values: Vec<String>,
    /// `impersonationServiceUsers`: `<claim> eq|co <value>` rules to service user ids, for
    /// UPSTs (`subjectType: User`).
    pub impersonation_service_users: Vec<ImpersonationRule>,
    /// `impersonatingResource`: the `res_type` RPSTs are asked for (`subjectType:
    /// Resource`); none: no RPSTs.
    pub impersonating_resource: Option<String>,
    /// `clockSkewSeconds` allowed on `exp` and `nbf`.
    pub clock_skew_secs: u64,
}

impl Default for TrustSeed {
    fn default() -> Self {
        Self {
            name: "k8s".into(),
            issuer: crate::SERVICE_ACCOUNT_ISSUER.into(),
            active: true,
            public_keys: TrustKeys::Endpoint,
            oauth_clients: Vec::new(),
            instance_tenancies: Vec::new(),
            client_claim_values: Vec::new(),
            impersonation_service_users: Vec::new(),
            impersonating_resource: Some("k8sworkload".into()),
            clock_skew_secs: 0,
        }
    }
}

/// One rule of `impersonationServiceUsers`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImpersonationRule {
    /// `<claim> eq <value>` (`*` in the value matches anything) or `<claim> co <value>`; the
    /// value bare or in single quotes.
    pub rule: String,
    /// The service user's id.
    pub value: String,
}
