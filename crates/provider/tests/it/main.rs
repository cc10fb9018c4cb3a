//! The OCI mount service: parameter validation, and fetching with fake identity and vault
//! services (the emulator-backed end-to-end tests live in the binary's crate).
// Test helpers are shared between modules of this one test binary; they are not an API.
#![allow(unreachable_pub, missing_debug_implementations)]

mod cache;
mod costs;
mod fakes;
mod fanout;
mod features;
mod identity;
mod kinds;
mod layers;
mod memory;
mod params;
mod proptests;
mod templates;
mod tenancy;
