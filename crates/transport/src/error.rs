use std::time::Duration;

/// What kind of failure, for retry decisions and error mapping upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request cannot be sent as written (bad URI, plain HTTP to a TLS-only host).
    Request,
    /// No connection could be made (refused, unreachable, DNS, TLS handshake, proxy).
    Connect,
    /// The connection broke while sending or receiving (retryable for idempotent calls).
    Io,
    /// The deadline passed before the whole response was read.
    Timeout,
    /// The response body was larger than allowed.
    TooLarge,
}

/// A failed exchange. Messages name the destination authority, never headers or bodies.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The URI has no scheme or host, or uses a scheme other than http/https.
    #[error("cannot send to {uri}: {reason}")]
    InvalidUri {
        /// The URI without its query.
        uri: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Plain HTTP to an authority that was not allowed it.
    #[error("refusing plain http to {0}: only the instance metadata endpoint may use http://")]
    PlainHttpRefused(String),
    /// Connecting, the TLS handshake or the proxy tunnel failed.
    #[error("cannot connect to {authority}")]
    Connect {
        /// host:port.
        authority: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The HTTP exchange failed after connecting.
    #[error("request to {authority} failed")]
    Http {
        /// host:port.
        authority: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The deadline passed.
    #[error("request to {authority} did not complete within {after:?}")]
    Timeout {
        /// host:port.
        authority: String,
        /// The budget that ran out.
        after: Duration,
    },
    /// The body exceeded the cap.
    #[error("response from {authority} is larger than {limit} bytes")]
    TooLarge {
        /// host:port.
        authority: String,
        /// The cap.
        limit: usize,
    },
}

impl TransportError {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            TransportError::InvalidUri { .. } | TransportError::PlainHttpRefused(_) => {
                ErrorKind::Request
            }
            TransportError::Connect { .. } => ErrorKind::Connect,
            TransportError::Http { .. } => ErrorKind::Io,
            TransportError::Timeout { .. } => ErrorKind::Timeout,
            TransportError::TooLarge { .. } => ErrorKind::TooLarge,
        }
    }
}
