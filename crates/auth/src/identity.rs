use std::fmt;

/// Who a request to OCI is made as.
///
/// Every credential (security token, user key) and every cached secret bundle is stored
/// under the identity that obtained it, so that a value fetched for one identity is never
/// served to another (invariant 5: a cached value is served only to the credential that
/// fetched it). The identity travels with each outgoing request in the
/// request's extensions, so the signing layer can pick the matching key.
///
/// It holds names only, never credentials, so it is safe to log.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Identity {
    /// A user API key read from a Kubernetes Secret (`authSecretName`) in the pod's namespace.
    User {
        /// Namespace of the pod, and of the Secret.
        namespace: String,
        /// Name of the Kubernetes Secret that holds `config` and `private-key`.
        secret_name: String,
    },
    /// The node's instance principal (one per process).
    Instance,
    /// OKE workload identity: the pod's Kubernetes service account.
    Workload {
        /// Namespace of the pod.
        namespace: String,
        /// Name of the pod's service account.
        service_account: String,
        /// UID of the service account when known (from its token), so that a deleted and
        /// recreated service account of the same name is a different identity.
        service_account_uid: Option<String>,
    },
}

impl Identity {
    /// The principal kind as users write it in `authType`.
    pub fn kind(&self) -> &'static str {
        match self {
            Identity::User { .. } => "user",
            Identity::Instance => "instance",
            Identity::Workload { .. } => "workload",
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::User {
                namespace,
                secret_name,
            } => write!(f, "user principal from secret {namespace}/{secret_name}"),
            Identity::Instance => f.write_str("instance principal"),
            Identity::Workload {
                namespace,
                service_account,
                ..
            } => write!(
                f,
                "workload identity of service account {namespace}/{service_account}"
            ),
        }
    }
}

/// Exactly which credential of an [`Identity`] a mount's calls are made with: the
/// identity plus what tells one credential of it from another. Anything fetched with a
/// credential is cached under it (the secret-bundle cache keys by it), so that two
/// credentials never share a cached value, even when both are allowed to read it.
///
/// Names, versions and public fingerprints only: safe to log.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Credential {
    /// A user API key as loaded from its Kubernetes Secret.
    User {
        /// Namespace of the pod and of the Secret.
        namespace: String,
        /// Name of the Secret.
        secret_name: String,
        /// The Secret's `resourceVersion` the key was loaded from (empty when the API
        /// server did not say).
        resource_version: String,
        /// The OCI fingerprint computed from the loaded private key (not the one the
        /// Secret's config claims).
        key_fingerprint: String,
        /// The user OCID the Secret's config names.
        user: String,
        /// The tenancy OCID the Secret's config names.
        tenancy: String,
    },
    /// OKE workload identity: a service account, told from a recreated one by its uid.
    Workload {
        /// Namespace of the pod.
        namespace: String,
        /// Name of the service account.
        service_account: String,
        /// UID of the service account, from its token.
        service_account_uid: Option<String>,
    },
    /// The node's instance principal, by its certificate.
    Instance {
        /// The tenancy of the instance certificate (`opc-tenant:`).
        tenancy: String,
        /// The instance OCID of the certificate (`opc-instance:`).
        instance: String,
    },
}

impl Credential {
    /// The identity this credential belongs to.
    pub fn identity(&self) -> Identity {
        match self {
            Credential::User {
                namespace,
                secret_name,
                ..
            } => Identity::User {
                namespace: namespace.clone(),
                secret_name: secret_name.clone(),
            },
            Credential::Workload {
                namespace,
                service_account,
                service_account_uid,
            } => Identity::Workload {
                namespace: namespace.clone(),
                service_account: service_account.clone(),
                service_account_uid: service_account_uid.clone(),
            },
            Credential::Instance { .. } => Identity::Instance,
        }
    }
}

impl fmt::Display for Credential {
    /// The identity's words (as [`Identity`] writes them), then what tells this credential
    /// from another of it; written straight, without making the identity first.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::User {
                namespace,
                secret_name,
                resource_version,
                key_fingerprint,
                ..
            } => write!(
                f,
                "user principal from secret {namespace}/{secret_name} \
                 (resourceVersion {resource_version}, key {key_fingerprint})"
            ),
            Credential::Workload {
                namespace,
                service_account,
                service_account_uid,
            } => write!(
                f,
                "workload identity of service account {namespace}/{service_account} (uid {})",
                service_account_uid.as_deref().unwrap_or("unknown")
            ),
            Credential::Instance { tenancy, instance } => {
                write!(f, "instance principal {instance} of tenancy {tenancy}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_of_different_service_account_uids_differ() {
        let a = Identity::Workload {
            namespace: "ns".into(),
            service_account: "sa".into(),
            service_account_uid: Some("1".into()),
        };
        let b = Identity::Workload {
            namespace: "ns".into(),
            service_account: "sa".into(),
            service_account_uid: Some("2".into()),
        };
        assert_ne!(a, b);
        assert_eq!(a.kind(), "workload");
        assert_eq!(a.to_string(), "workload identity of service account ns/sa");
    }

    #[test]
    fn a_credential_is_written_as_its_identity_then_what_tells_it_apart() {
        let credentials = [
            Credential::User {
                namespace: "ns".into(),
                secret_name: "key".into(),
                resource_version: "7".into(),
                key_fingerprint: "aa:bb".into(),
                user: "ocid1.user.oc1..u".into(),
                tenancy: "ocid1.tenancy.oc1..t".into(),
            },
            Credential::Workload {
                namespace: "ns".into(),
                service_account: "sa".into(),
                service_account_uid: None,
            },
        ];
        let suffixes = [" (resourceVersion 7, key aa:bb)", " (uid unknown)"];
        for (credential, suffix) in credentials.iter().zip(suffixes) {
            assert_eq!(
                credential.to_string(),
                format!("{}{suffix}", credential.identity())
            );
        }
    }
}
