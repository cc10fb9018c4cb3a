//! Scripted faults, per endpoint.

use std::collections::VecDeque;
use std::time::Duration;

/// One fault, applied to one request (when scripted) or to every request (when persistent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer normally (useful inside a script, e.g. 503, pass, 503).
    Pass,
    /// Wait, then answer normally.
    Latency(Duration),
    /// Answer with this status and the usual OCI error body for it
    /// (e.g. 409 `IncorrectState`, 500 `InternalServerError`, 503 `ServiceUnavailable`).
    Status(u16),
    /// Answer with an explicit OCI error body.
    Error {
        /// HTTP status.
        status: u16,
        /// OCI error code.
        code: String,
        /// Message.
        message: String,
    },
    /// 429 `TooManyRequests` with a `Retry-After` header (seconds).
    TooManyRequests {
        /// Value of `Retry-After` in seconds.
        retry_after_secs: u64,
    },
    /// An error status with a body that is not JSON.
    NonJsonError(u16),
    /// Send the headers (with the full `content-length`) and half of the body, then drop the
    /// connection.
    DropMidResponse,
    /// Hold the request before sending any header, until [`crate::EmulatorHandle::release_stalls`].
    StallBeforeHeaders,
    /// Send the headers, then hold the body until [`crate::EmulatorHandle::release_stalls`].
    StallAfterHeaders,
    /// Answer normally but remove `secretId` from a SecretBundle body.
    MissingSecretId,
    /// Answer normally but remove `versionNumber` from a SecretBundle body.
    MissingVersionNumber,
    /// Answer normally but set `secretBundleContent.contentType` to an unknown value.
    UnknownContentType,
    /// Answer 200 with this exact body (`application/json`).
    Body(String),
    /// Answer with an OAuth error body (RFC 6749 5.2): `{"error": ..., "error_description":
    /// "injected fault"}`, as the identity domain refuses a token exchange.
    OAuth {
        /// HTTP status.
        status: u16,
        /// The `error` code, e.g. `invalid_grant`.
        error: String,
    },
}

impl Fault {
    /// The identity domain refuses the subject token: 400 `invalid_grant`.
    pub fn invalid_grant() -> Self {
        Fault::OAuth {
            status: 400,
            error: "invalid_grant".into(),
        }
    }

    /// The identity domain refuses the client: 401 `invalid_client`.
    pub fn invalid_client() -> Self {
        Fault::OAuth {
            status: 401,
            error: "invalid_client".into(),
        }
    }
}

impl Fault {
    /// The OCI error code used for a bare status.
    pub(crate) fn default_code(status: u16) -> &'static str {
        match status {
            400 => "InvalidParameter",
            401 => "NotAuthenticated",
            403 => "NotAuthorized",
            404 => "NotAuthorizedOrNotFound",
            409 => "IncorrectState",
            429 => "TooManyRequests",
            500 => "InternalServerError",
            501 => "MethodNotImplemented",
            503 => "ServiceUnavailable",
            _ => "InternalServerError",
        }
    }
}

/// The faults configured for one endpoint.
#[derive(Debug, Default)]
pub(crate) struct FaultPlan {
    /// Consumed one per request, in order.
    pub(crate) script: VecDeque<Fault>,
    /// Applied to every request once the script is exhausted.
    pub(crate) persistent: Option<Fault>,
}

impl FaultPlan {
    pub(crate) fn next(&mut self) -> Fault {
        self.scheduled().unwrap_or(Fault::Pass)
    }

    /// The next scripted fault, else the persistent one; `None` when the plan has neither.
    pub(crate) fn scheduled(&mut self) -> Option<Fault> {
        self.script.pop_front().or_else(|| self.persistent.clone())
    }
}
