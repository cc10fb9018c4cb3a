//! Where the cluster's service-account issuer publishes its documents (OIDC discovery, and
//! the keys it signs tokens with). A leaf: the issuer reads them, the errors name them.

/// The issuer's OIDC discovery document.
pub(crate) const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// The issuer's signing keys (a JWKS).
pub(crate) const JWKS_PATH: &str = "/openid/v1/jwks";
