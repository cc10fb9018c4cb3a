//! One HTTPS client for the whole process.
//!
//! Every outbound call of the provider (OCI Secrets, x509 federation, instance metadata,
//! the OKE proxymux and the Kubernetes API) goes through one [`Transport`]: a pooled
//! hyper client with
//!
//! - a strict bound on open connections per host (a permit held by each connection for its
//!   whole life) and on requests in flight per host, so no number of mounts, identities or
//!   failures can open more sockets than configured;
//! - a bound on idle connections per host and an idle timeout that really closes them;
//! - connect and request timeouts (the request timeout covers reading the body), TCP
//!   keepalive, and a byte cap on response bodies (bodies are read whole: every response
//!   here is small JSON or PEM);
//! - trust chosen per destination and never merged: OCI hosts trust the platform roots (or
//!   only `SSL_CERT_FILE` when set) plus configured CA files; an authority registered with
//!   [`TransportConfig::trust_only`] (proxymux, Kubernetes API) trusts only its CA file;
//!   plain `http://` only for the one authority registered with
//!   [`TransportConfig::allow_plain_http`] (instance metadata);
//! - `HTTPS_PROXY`-style tunnelling for OCI hosts only;
//! - counters of connections opened, closed and open now, per host.
//!
//! Its service ([`Transport::service`], an [`HttpService`]) is a cloneable
//! `tower::Service<http::Request<Bytes>>` built of one layer per concern over the
//! [`Exchange`] (outermost first): [`ObserveLayer`] (a span and the metrics per
//! exchange), [`TimeoutLayer`] (the request timeout, or a request's [`Deadline`]),
//! [`HostLimitLayer`] (requests in flight per host). That stack is composed once, when the
//! transport is built, and [`Transport::service`] hands out clones of it: the binary's wiring
//! and the tests take it, nothing else stacks these layers ([`Transport::exchange`], the bare
//! exchange, is for tests of a layer alone). Clones share the pool and the bounds.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod client;
mod config;
mod connector;
mod error;
mod exchange;
mod layers;
mod stats;
mod tls;

pub use client::{HttpService, Transport, TransportBuildError};
pub use config::{Proxy, TransportConfig};
pub use connector::authority_of;
pub use error::{ErrorKind, TransportError};
pub use exchange::{Exchange, MaxBodyBytes};
pub use layers::{
    Deadline, HostLimit, HostLimitLayer, Observe, ObserveLayer, Timeout, TimeoutLayer, Untraced,
};
pub use stats::{ExchangeObserver, HostStats, Outcome};
pub use tls::TrustError;

/// The rustls crypto provider of every TLS client this crate builds: aws-lc-rs, or with the
/// `fips` feature AWS-LC's FIPS module with only the algorithms FIPS approves
/// ([`rustls::crypto::CryptoProvider::fips`] is then true).
pub fn crypto_provider() -> rustls::crypto::CryptoProvider {
    #[cfg(feature = "fips")]
    {
        rustls::crypto::default_fips_provider()
    }
    #[cfg(not(feature = "fips"))]
    {
        rustls::crypto::aws_lc_rs::default_provider()
    }
}

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
