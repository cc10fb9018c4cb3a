//! OCI identities and the clock shared by the principals and the test emulator.
//!
//! This crate will hold OCI request signing (a tower `Layer`) and the three principals
//! (user API key, instance principal, OKE workload identity). The contracts other crates
//! build on are already here: [`Identity`], the key under which every credential and every
//! cached value is stored, and [`Clock`], the source of "now" for token expiry and the
//! signed `date` header, which tests replace with a [`ManualClock`].
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod clock;
mod identity;

pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use identity::Identity;
