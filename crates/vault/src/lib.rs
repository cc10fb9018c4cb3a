//! The OCI Secrets API client (spec section 2) as a tower service, and the two listings a
//! mount makes (the versions of a secret, the secrets of a vault: [`ListerLayer`]).
//!
//! [`VaultClient`] turns an [`Attempt`] of a [`SecretRequest`] (which secret, which version,
//! as which [`auth::Identity`], from which endpoint, by when) into a [`SecretBundle`], and
//! [`RetryLayer`] above it makes the attempts of a request:
//!
//! - GetSecretBundleByName (`POST .../secretbundles/actions/getByName`, parameters in the
//!   query, empty body) or GetSecretBundle (`GET .../secretbundles/{secretId}`), with a
//!   stage, a version number or a version name, sent exactly as the Go SDK sends them;
//! - through an inner service that signs and sends (`auth::Signing<transport::HttpService>`
//!   in production), each attempt carrying the identity and a [`transport::Deadline`];
//! - transient failures (409 `IncorrectState`, 429, 5xx but 501 `MethodNotImplemented`,
//!   connection errors) retried with exponential backoff and jitter per [`RetryPolicy`],
//!   honouring `Retry-After`, never sleeping past the deadline;
//! - the answer validated and its content base64-decoded into zeroizing bytes
//!   ([`SecretContent`], redacted in `Debug`);
//! - every failure a [`VaultError`] with an [`ErrorKind`], naming the secret, the principal
//!   and OCI's `opc-request-id`, never the secret bytes.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod backoff;
mod bundle;
mod cache_key;
mod certificate;
mod client;
mod error;
#[cfg(test)]
mod fuzz;
mod list;
mod lister;
mod request;
mod retry;
mod tls_files;

pub use backoff::{Backoff, BackoffHook, WithBackoff};
pub use bundle::{MalformedBundle, SecretBundle, SecretContent};
pub use cache_key::{Api, BundleKey, BundleType};
pub use certificate::{CertificateBundle, CertificateRef, CertificateRequest};
pub use client::{Attempt, Call, DEFAULT_USER_AGENT, VaultClient};
pub use error::{ErrorChain, ErrorKind, OciError, Stopped, Subject, VaultError};
pub use list::{
    ListKind, ListRequest, ListedSecret, MAX_PAGES, Page, PageRequest, Pages, SECRETS_PAGE_LIMIT,
    SecretFilter, TagFilter,
};
pub use lister::{ListKey, ListStop, Lister, ListerLayer, Listing};
pub use request::{SecretRef, SecretRequest, Selector, Stage, UnknownStage};
pub use retry::{Retries, Retry, RetryLayer, RetryPolicy, RetryReason};
pub use tls_files::{TlsError, TlsFiles, unix};

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
