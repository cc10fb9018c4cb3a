use crate::{Identity, KeyError};

/// A boxed error, as tower layers pass them around.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request could not be signed.
///
/// Messages name identities and headers, never key ids that hold a security token, private
/// keys or passphrases.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The request has no [`Identity`] in its extensions, so there is no key to sign with.
    #[error("the request carries no identity to sign it with")]
    MissingIdentity,
    /// Neither the URI nor a `Host` header says which host the request goes to, and the
    /// signature must cover it.
    #[error(
        "the request has no host to sign: its URI has no authority and there is no Host header"
    )]
    MissingHost,
    /// The key id cannot be put in a header (control characters or non-ASCII).
    #[error("the key id for {identity} is not a valid header value")]
    InvalidKeyId {
        /// Whose key id it is.
        identity: Identity,
    },
    /// Signing failed inside the crypto library.
    #[error("cannot sign the request")]
    Sign(#[source] KeyError),
    /// The principal could not supply a key id and private key for the identity.
    #[error("cannot obtain credentials for {identity}")]
    Credentials {
        /// Whose credentials were asked for.
        identity: Identity,
        /// What went wrong; it must not contain credentials either.
        #[source]
        source: BoxError,
    },
}
