//! The layers every mount passes at the edge, one concern each, composed around the mount
//! service (outermost first): [`AdmissionLayer`] (the node's slots for mounts, a share per
//! namespace, and bounded queues served in turn for the mounts waiting), [`DeadlineLayer`]
//! (the request's deadline), [`CatchPanicLayer`] (a panic becomes Internal for that mount). [`crate::CsiProvider`] translates the wire request
//! and answer around them.

mod admission;
mod catch_panic;
mod deadline;

pub use admission::{Admission, AdmissionLayer};
pub use catch_panic::{CatchPanic, CatchPanicLayer};
pub use deadline::{DeadlineLayer, WithinDeadline};

/// The future of every edge layer: boxed, since each does async work around the call.
pub(crate) type BoxMount = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<crate::MountResponse, crate::MountError>> + Send>,
>;
