//! The OCI Vault mount service for the Secrets Store CSI driver.
//!
//! `csi-grpc` hands this crate a typed [`csi_grpc::MountRequest`]; this crate reads the
//! SecretProviderClass parameters of OCI ([`MountParameters`]), establishes the identity
//! (`auth`), resolves where its calls go ([`Endpoints`]), fetches the secret bundles
//! concurrently (`vault`; with the listings a version history or a selection needs), and
//! assembles the files and object versions. It is the only crate that knows both the CSI request and OCI.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod budget;
mod classes;
mod contract;
mod endpoints;
mod entries;
mod extract;
mod failure;
#[doc(hidden)]
pub mod fuzzing;
mod layers;
mod params;
mod service;
pub mod template;

pub use budget::{ByteBudget, Refusal, Reservation, Weigh};
pub use classes::ParsedClasses;
pub use contract::{
    BundleResponse, CertificateExpiry, CertificateService, IdentityService, ListingResponse,
    ListingService, MountContext, NoCertificates, NoListings, SecretsService,
};
pub use endpoints::{EndpointError, EndpointOverrides, Endpoints, RegionEndpoints};
pub use entries::{
    CertificateSpec, Entry, FileDescription, KINDS, SecretSpec, SelectionSpec, TemplateSpec,
};
pub use extract::{Format, KeySpec};
pub use layers::{
    Budget, BudgetLayer, Failover, FailoverLayer, Held, Metered, Refused, RegionStats, ServedBy,
    WithFailover,
};
pub use params::{
    AuthSpec, AuthType, CertificateKind, DEFAULT_MAX_FILES, DEFAULT_MAX_SECRETS, Encoding,
    MAX_PROBLEMS, MAX_SECRETS_BYTES, MAX_VERSIONS, MountParameters, ParamError, ParseLimits,
    SecretSource, Stage, VersionSelector,
};
pub use service::OciMount;

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
