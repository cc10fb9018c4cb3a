//! The layers every mount passes at the edge, one concern each, composed around the mount
//! service (outermost first): [`InFlightLimitLayer`] (mounts in flight, with a share per
//! namespace), [`DeadlineLayer`] (the request's deadline), [`CatchPanicLayer`] (a panic
//! becomes Internal for that mount). [`crate::CsiProvider`] translates the wire request
//! and answer around them.

mod catch_panic;
mod deadline;
mod in_flight;

pub use catch_panic::{CatchPanic, CatchPanicLayer};
pub use deadline::{DeadlineLayer, WithinDeadline};
pub use in_flight::{InFlightLimit, InFlightLimitLayer};

/// The future of every edge layer: boxed, since each does async work around the call.
pub(crate) type BoxMount = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<crate::MountResponse, crate::MountError>> + Send>,
>;
