use std::fmt;

/// What went wrong in a mount, as the driver should see it.
///
/// Each kind maps to one gRPC status code. The driver shows the status message in the
/// pod's events, so messages must name the problem specifically, and must never contain
/// secret bytes, keys or tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request or the SecretProviderClass is malformed; retrying will not help.
    InvalidArgument,
    /// A secret, version or credential source does not exist (or is not visible).
    NotFound,
    /// The identity is known but not allowed.
    PermissionDenied,
    /// The identity could not be established or was refused.
    Unauthenticated,
    /// A dependency is unreachable or not ready; retrying may help.
    Unavailable,
    /// The mount did not finish within its deadline.
    DeadlineExceeded,
    /// A bound was hit (in-flight mounts, response size, upstream throttling).
    ResourceExhausted,
    /// A bug or an impossible state in the provider.
    Internal,
}

impl ErrorKind {
    /// The gRPC status code of this kind.
    pub fn code(self) -> tonic::Code {
        match self {
            ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::PermissionDenied => tonic::Code::PermissionDenied,
            ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorKind::Unavailable => tonic::Code::Unavailable,
            ErrorKind::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            ErrorKind::ResourceExhausted => tonic::Code::ResourceExhausted,
            ErrorKind::Internal => tonic::Code::Internal,
        }
    }

    /// A stable lower-case label, for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NotFound => "not_found",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::DeadlineExceeded => "deadline_exceeded",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed mount: a kind and a message for the driver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct MountError {
    kind: ErrorKind,
    message: String,
}

impl MountError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// Shorthand for [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// Shorthand for [`ErrorKind::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message shown to the user.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<MountError> for tonic::Status {
    fn from(err: MountError) -> Self {
        tonic::Status::new(err.kind.code(), err.message)
    }
}
