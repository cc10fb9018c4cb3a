//! Integration tests of the CSI provider gRPC edge, through real Unix sockets.
// Test helpers are shared between modules of this one test binary; they are not an API.
#![allow(clippy::disallowed_methods)] // reason: tests parse what they build; the budgets are the code's
#![allow(unreachable_pub, missing_debug_implementations)]

mod support;

mod edge;
mod frames;
mod grpc_go;
mod lifecycle;
mod mount;
mod socket;
