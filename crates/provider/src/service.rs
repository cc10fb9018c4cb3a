use std::future::{Ready, ready};
use std::task::{Context, Poll};

use csi_grpc::{MountError, MountRequest, MountResponse};

use crate::params::MountParameters;

/// The OCI mount service that `csi-grpc` calls.
///
/// Today it validates the SecretProviderClass parameters and the pod identity they need,
/// and then answers `Unavailable`: the principals (crates/auth) and the Secrets API client
/// (crates/vault) are not wired into it yet. It never pretends to have mounted anything.
#[derive(Clone, Debug, Default)]
pub struct OciMount {
    _private: (),
}

impl OciMount {
    /// A mount service.
    pub fn new() -> Self {
        Self::default()
    }

    fn mount(&self, request: &MountRequest) -> Result<MountResponse, MountError> {
        let params = MountParameters::parse(&request.attributes, &request.pod)?;
        tracing::debug!(
            secrets = params.secrets.len(),
            auth = ?params.auth,
            "parameters are valid"
        );
        Err(MountError::unavailable(
            "the SecretProviderClass is valid, but this build cannot fetch from OCI Vault yet: \
             the auth principals and the Secrets API client are not wired into the provider",
        ))
    }
}

impl tower::Service<MountRequest> for OciMount {
    type Response = MountResponse;
    type Error = MountError;
    type Future = Ready<Result<MountResponse, MountError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), MountError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: MountRequest) -> Self::Future {
        ready(self.mount(&request))
    }
}
