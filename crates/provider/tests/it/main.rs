//! Parameter validation of the OCI mount service.

mod params;
mod proptests;
