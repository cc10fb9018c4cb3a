//! The Secrets Store CSI driver's provider contract (`v1alpha1.CSIDriverProvider`) as a
//! reusable server for any provider.
//!
//! The driver calls a provider over gRPC on a Unix socket. This crate owns everything on
//! that edge and nothing behind it:
//!
//! - the wire contract, compiled at build time from `proto/service.proto` ([`proto`]);
//! - translation of the driver's stringly `MountRequest` into a typed [`MountRequest`]:
//!   attributes, pod, service-account tokens (as secret values), NodePublish secrets,
//!   file mode, current object versions and a deadline;
//! - validation of what the inner service answers ([`MountResponse`]): file paths that the
//!   driver would accept, at least one object version, a bounded size;
//! - mapping of a typed [`MountError`] to a gRPC status with a specific message;
//! - the bounds of every mount as layers around the inner service: the bytes the requests
//!   held on the node and per namespace ([`RequestBytesLayer`]), the node's slots for
//!   mounts, a share per namespace and bounded queues served in turn ([`AdmissionLayer`]),
//!   the deadline ([`DeadlineLayer`]), panic
//!   containment ([`CatchPanicLayer`]);
//! - the socket's life cycle ([`Listener`], [`serve`]).
//!
//! The inner service is any `tower::Service<MountRequest, Response = MountResponse,
//! Error = MountError>`; this crate knows nothing of any cloud.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[cfg(feature = "client")]
pub mod client;
mod edge;
mod error;
#[cfg(test)]
mod fuzz;
mod listener;
mod path;
mod request;
mod response;
mod server;

/// Code generated from the driver's `provider/v1alpha1/service.proto`.
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all
)] // reason: generated code
pub mod proto {
    tonic::include_proto!("v1alpha1");
}

pub use edge::{
    Admission, AdmissionLayer, CatchPanic, CatchPanicLayer, DeadlineLayer, DecodingBytes,
    DecodingBytesLayer, RequestBytes, RequestBytesLayer, WithinDeadline,
};
pub use error::{ErrorKind, MountError};
pub use listener::{BindError, Endpoint, EndpointParseError, Listener};
pub use path::{FilePath, PathError, validate_file_set};
pub use request::{
    Caller, Deadline, FileMode, MAX_REQUEST_BYTES, MountRequest, ObjectVersion, Pod,
    SERVICE_ACCOUNT_TOKENS_KEY, SYNC_CONTROLLER_TARGET_PATH, ServiceAccountToken,
    ServiceAccountTokens,
};
pub use response::{File, FileContents, MountResponse};
pub use server::{
    CsiProvider, MountLimits, MountObserver, MountService, ServeError, ServerInfo, WaitOutcome,
    serve,
};

/// The only API version of the provider contract.
pub const API_VERSION: &str = "v1alpha1";

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
