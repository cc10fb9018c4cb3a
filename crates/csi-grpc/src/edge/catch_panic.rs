use std::panic::AssertUnwindSafe;
use std::task::{Context, Poll};

use futures_util::FutureExt as _;
use tower::{Layer, Service};

use super::BoxMount;
use crate::error::MountError;
use crate::request::MountRequest;
use crate::response::MountResponse;

/// Contains a panic of the mount service, in its readiness, its `call` or its future: that one mount
/// fails with Internal, and the connection and the process go on serving. The panic's
/// message is not logged (it could quote what the service was handling).
#[derive(Clone, Copy, Debug, Default)]
pub struct CatchPanicLayer;

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;

    fn layer(&self, inner: S) -> CatchPanic<S> {
        CatchPanic { inner }
    }
}

/// The service of [`CatchPanicLayer`].
#[derive(Clone, Debug)]
pub struct CatchPanic<S> {
    inner: S,
}

fn panicked() -> MountError {
    tracing::error!("mount service panicked");
    MountError::internal("internal error: the mount service panicked")
}

impl<S> Service<MountRequest> for CatchPanic<S>
where
    S: Service<MountRequest, Response = MountResponse, Error = MountError>,
    S::Future: Send + 'static,
{
    type Response = MountResponse;
    type Error = MountError;
    type Future = BoxMount;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), MountError>> {
        // A panic here fails the mount that asked (the caller drops this clone).
        std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.poll_ready(cx)))
            .unwrap_or_else(|_| Poll::Ready(Err(panicked())))
    }

    fn call(&mut self, request: MountRequest) -> BoxMount {
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(request))) {
            Ok(mount) => Box::pin(async move {
                AssertUnwindSafe(mount)
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| Err(panicked()))
            }),
            Err(_) => Box::pin(std::future::ready(Err(panicked()))),
        }
    }
}
