//! The transport's layers, one concern each, composed over [`crate::Exchange`] (outermost
//! first): [`ObserveLayer`] (a span and the observer per exchange), [`TimeoutLayer`] (the
//! request timeout or the request's [`crate::Deadline`]), [`HostLimitLayer`] (requests in
//! flight per host).

mod host_limit;
mod observe;
mod timeout;

pub use host_limit::{HostLimit, HostLimitLayer};
pub use observe::{Observe, ObserveLayer, Untraced};
pub use timeout::{Deadline, Timeout, TimeoutLayer};

/// What every layer's future is: boxed, since each does async work around the call.
pub(crate) type BoxResponse = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<http::Response<bytes::Bytes>, crate::TransportError>,
            > + Send,
    >,
>;
