use std::fmt;

/// Who a request to OCI is made as.
///
/// Every credential (security token, user key) and every cached secret bundle is stored
/// under the identity that obtained it, so that a value fetched for one identity is never
/// served to another (invariant 3). The identity travels with each outgoing request in the
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
}
