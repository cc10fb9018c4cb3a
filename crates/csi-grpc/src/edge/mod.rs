//! The layers every mount passes at the edge, one concern each, composed around the mount
//! service (outermost first): [`RequestBytesLayer`] (the bytes the requests of the mounts
//! in flight and waiting hold, on the node and per namespace), [`AdmissionLayer`] (the node's slots for mounts, a share per
//! namespace, and bounded queues served in turn for the mounts waiting), [`DeadlineLayer`]
//! (the request's deadline), [`CatchPanicLayer`] (a panic becomes Internal for that mount). [`crate::CsiProvider`] translates the wire request
//! and answer around them.

mod admission;
mod catch_panic;
mod deadline;
mod request_bytes;

pub use admission::{Admission, AdmissionLayer};
pub use catch_panic::{CatchPanic, CatchPanicLayer};
pub use deadline::{DeadlineLayer, WithinDeadline};
pub use request_bytes::{DecodingBytes, DecodingBytesLayer, RequestBytes, RequestBytesLayer};

/// A mount refused at once with ResourceExhausted and `message` (the driver retries).
fn exhausted(message: String) -> BoxMount {
    Box::pin(std::future::ready(Err(crate::MountError::new(
        crate::ErrorKind::ResourceExhausted,
        message,
    ))))
}

/// The future of every edge layer: boxed, since each does async work around the call.
pub(crate) type BoxMount = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<crate::MountResponse, crate::MountError>> + Send>,
>;
