use std::task::{Context, Poll};

use tower::{Layer, Service};

use super::BoxMount;
use crate::error::{ErrorKind, MountError};
use crate::request::MountRequest;
use crate::response::MountResponse;

/// Ends a mount that is not done by its [`MountRequest::deadline`] with DeadlineExceeded
/// (naming the time the caller granted), dropping the mount service's future.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeadlineLayer;

impl<S> Layer<S> for DeadlineLayer {
    type Service = WithinDeadline<S>;

    fn layer(&self, inner: S) -> WithinDeadline<S> {
        WithinDeadline { inner }
    }
}

/// The service of [`DeadlineLayer`].
#[derive(Clone, Debug)]
pub struct WithinDeadline<S> {
    inner: S,
}

impl<S> Service<MountRequest> for WithinDeadline<S>
where
    S: Service<MountRequest, Response = MountResponse, Error = MountError>,
    S::Future: Send + 'static,
{
    type Response = MountResponse;
    type Error = MountError;
    type Future = BoxMount;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), MountError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: MountRequest) -> BoxMount {
        let (at, granted) = (request.deadline, request.timeout);
        let mount = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout_at(at, mount).await {
                Ok(result) => result,
                Err(_) => Err(MountError::new(
                    ErrorKind::DeadlineExceeded,
                    format!("mount did not finish within its deadline of {granted:?}"),
                )),
            }
        })
    }
}
