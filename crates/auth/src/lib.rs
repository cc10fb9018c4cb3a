//! OCI request signing, RSA private keys, identities and the clock shared by the principals
//! and the test emulator.
//!
//! - [`SigningLayer`] signs every outgoing `http::Request<Bytes>` per the OCI profile of
//!   HTTP signatures (spec section 1), with the key id and private key of the [`Session`]
//!   the request carries, and renews a refused security token through it once.
//! - [`PrivateKey`] loads RSA keys in every PEM form the Go provider accepts (PKCS#1,
//!   PKCS#8, OpenSSL's legacy encryption) plus encrypted PKCS#8, generates session keys,
//!   and signs.
//! - [`Identity`] is the key under which every credential and every cached value is stored;
//!   a [`clock::Clock`] is the source of "now" for token expiry and the signed `date`
//!   header, which tests replace with a [`clock::ManualClock`].
//!
//! - [`Principals`] is the façade over the three principals (user API key from a Kubernetes
//!   Secret, instance principal, workload identity by OKE's proxymux or by an identity
//!   domain's token exchange, [`WorkloadMechanism`]): [`Principals::establish`] readies
//!   one mount's identity and answers with its [`Session`], from per-identity caches.
//!   A service-account token a mount supplies is verified against the cluster's
//!   service-account issuer keys before any cached session is served to it. Every call it
//!   makes goes through the one transport.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod error;
#[cfg(test)]
mod fuzz;
mod identity;
mod issuer;
mod jwt;
mod key;
mod kube;
mod node;
mod oidc;
mod principals;
mod remote;
mod session;
mod signing;
mod tenant_keys;

pub use error::{AuthError, BoxError, Endpoint, ErrorKind, UserSecretError};
pub use identity::{Credential, Identity};
pub use key::{KeyError, PrivateKey};
pub use node::{NodeTaint, TaintRemoval};
#[cfg(feature = "test-support")]
pub use principals::load_user_secret_for_tests;
pub use principals::{
    Caller, ClientAuth, ClientSecret, DEFAULT_INSTANCE_METADATA, DEFAULT_NAMESPACE_EXCHANGE_BURST,
    DEFAULT_NAMESPACE_EXCHANGES_PER_MINUTE, DEFAULT_REFRESH_RETRY, DEFAULT_REFUSAL_MEMORY,
    DEFAULT_SERVICE_ACCOUNT_TOKEN_FILE, Established, ExchangeGuards, FederationConfig,
    INSTANCE_RENEWAL_COOL_DOWN, IdentityRequest, PrincipalKind, Principals, PrincipalsConfig,
    SESSION_KEYS_AHEAD, TokenType, WorkloadMechanism,
};
pub use remote::opc_request_id;
pub use session::{Invalidated, Session};
pub use signing::{BoxFuture, KeyId, SignedResponse, Signing, SigningKey, SigningLayer};
pub use tenant_keys::{CertificateKey, TenantKeys};

/// The OCI request signature itself (draft-cavage-http-signatures as OCI profiles it), for
/// callers that sign outside [`SigningLayer`] and for checking against the spec's vectors.
pub mod signature {
    pub use crate::signing::{
        EMPTY_BODY_SHA256, SignatureProfile, SigningString, X_CONTENT_SHA256, authorization,
        prepare_request, sign_request, signing_string,
    };
}

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
