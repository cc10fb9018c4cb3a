//! Errors of the Secrets client and their classification (spec 2.6 and 2.7).

use std::fmt;

use auth::{AuthError, BoxError, Identity};
use transport::TransportError;

use crate::bundle::MalformedBundle;

/// The kind of failure: auth's, shared by every crate below the gRPC edge.
pub use auth::ErrorKind;

/// An OCI error body (`{"code": "...", "message": "..."}`), or what stands for it when the
/// body is not one (code `BadErrorResponse`, as the Go SDK synthesises).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciError {
    /// The HTTP status.
    pub status: u16,
    /// OCI's error code, e.g. `NotAuthorizedOrNotFound`.
    pub code: String,
    /// OCI's message.
    pub message: String,
}

/// The longest OCI message we keep; the rest is cut so one answer cannot flood a log line.
const MAX_MESSAGE_CHARS: usize = 512;

impl OciError {
    /// Reads an error body. A body that is not an OCI error JSON object is never quoted
    /// (an HTML page from a proxy says nothing useful and may be large).
    pub(crate) fn from_body(status: u16, content_type: Option<&str>, body: &[u8]) -> Self {
        #[derive(serde::Deserialize)]
        struct Body {
            code: Option<String>,
            message: Option<String>,
        }
        match bounded::json::from_slice::<Body>(body, &bounded::ParseBudget::new(body.len())) {
            Ok(Body {
                code: Some(code),
                message,
            }) if !code.is_empty() => OciError {
                status,
                code: truncate(code),
                message: truncate(message.unwrap_or_default()),
            },
            _ => OciError {
                status,
                code: "BadErrorResponse".to_owned(),
                message: format!(
                    "HTTP {status} with a body that is not an OCI error ({} bytes of {})",
                    body.len(),
                    content_type.unwrap_or("unknown content type")
                ),
            },
        }
    }
}

fn truncate(mut text: String) -> String {
    if let Some((cut, _)) = text.char_indices().nth(MAX_MESSAGE_CHARS) {
        text.truncate(cut);
        text.push('…');
    }
    text
}

impl fmt::Display for OciError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {} {}: {}", self.status, self.code, self.message)
    }
}

/// Renders an optional request id.
struct Rid<'a>(&'a Option<String>);

impl fmt::Display for Rid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(f, "opc-request-id {id}"),
            None => f.write_str("no opc-request-id"),
        }
    }
}

/// Renders an error and its sources, `a: b: c`, so a message that goes to the driver or
/// a log line carries the root cause (a refused connection, an unknown API key). Every
/// `Display` of this workspace's errors prints its own level only — never its
/// `source()` — so each cause appears once here without de-duplication (the
/// `display_never_repeats_the_source` test holds the error types to it).
#[derive(Debug)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'a));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {error}")?;
            source = error.source();
        }
        Ok(())
    }
}

/// What a failed request was about: which secret or certificate (name and vault, or OCID,
/// and the version selector, rendered) as which principal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// The secret or certificate, e.g. `secret "db" (stage CURRENT) in vault
    /// ocid1.vault...` or `certificate ocid1.certificate...`.
    pub object: String,
    /// Who asked.
    pub principal: Identity,
    /// The IAM grant a 404 points at, e.g. [`Subject::SECRETS_GRANT`].
    pub grant: &'static str,
}

impl Subject {
    /// What reading a secret needs.
    pub const SECRETS_GRANT: &'static str = "\"read secret-bundles\" on the vault's compartment";
    /// What reading a certificate needs.
    pub const CERTIFICATES_GRANT: &'static str =
        "\"read leaf-certificate-bundles\" on the certificate's compartment";
    /// What listing the secrets of a vault needs.
    pub const LIST_GRANT: &'static str = "\"inspect secrets\" on the vault's compartment";
    /// What reading a CA needs.
    pub const CA_GRANT: &'static str =
        "\"read certificate-authority-bundles\" on the CA's compartment";
    /// What reading a CA bundle needs (`cabundles`, in OCI's `leaf-certificate-family`).
    pub const CA_BUNDLE_GRANT: &'static str = "\"read cabundles\" on the CA bundle's compartment";
}

/// Why a secret bundle could not be fetched.
///
/// Messages name the secret (name and vault, or OCID, and the version selector), the
/// principal and OCI's `opc-request-id`; never secret bytes or credentials. Where a cause
/// is chained (`Signing`, `Transport`, `Other`), the message already includes it, so callers
/// can show `to_string()` alone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VaultError {
    /// HTTP 404: unknown name, vault or version, or no IAM permission (OCI does not say
    /// which).
    #[error(
        "{secret} not found, or the principal may not read it: check the IAM policy grants {grant} (principal: {principal}; {oci}; {})",
        Rid(.opc_request_id)
    , secret = .subject.object, principal = .subject.principal, grant = .subject.grant)]
    NotFound {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// OCI's answer.
        oci: OciError,
        /// OCI's request id.
        opc_request_id: Option<String>,
    },
    /// HTTP 401: OCI did not accept the signature, key or token.
    #[error("OCI did not authenticate {principal} reading {secret}: {oci} ({})", Rid(.opc_request_id), secret = .subject.object, principal = .subject.principal)]
    Unauthenticated {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// OCI's answer.
        oci: OciError,
        /// OCI's request id.
        opc_request_id: Option<String>,
    },
    /// HTTP 403.
    #[error("OCI denied {principal} access to {secret}: {oci} ({})", Rid(.opc_request_id), secret = .subject.object, principal = .subject.principal)]
    PermissionDenied {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// OCI's answer.
        oci: OciError,
        /// OCI's request id.
        opc_request_id: Option<String>,
    },
    /// HTTP 400.
    #[error("OCI rejected the request for {secret} as {principal}: {oci} ({})", Rid(.opc_request_id), secret = .subject.object, principal = .subject.principal)]
    InvalidArgument {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// OCI's answer.
        oci: OciError,
        /// OCI's request id.
        opc_request_id: Option<String>,
    },
    /// Any other error status: 429 (ResourceExhausted), 409 and 5xx (Unavailable; retried
    /// when spec 2.7 says so), other 4xx (Internal).
    #[error("OCI could not serve {secret} to {principal}: {oci} ({})", Rid(.opc_request_id), secret = .subject.object, principal = .subject.principal)]
    Status {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// OCI's answer.
        oci: OciError,
        /// OCI's request id.
        opc_request_id: Option<String>,
        /// `Retry-After`, in seconds, if OCI sent one.
        retry_after_secs: Option<u64>,
    },
    /// A 200 answer that is not a usable SecretBundle.
    #[error("malformed response from OCI for {secret} as {principal}: {reason} ({})", Rid(.opc_request_id), secret = .subject.object, principal = .subject.principal)]
    Malformed {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// What is wrong: a detail of this error, rendered in its message (so not its
        /// `source()`).
        reason: MalformedBundle,
        /// OCI's request id.
        opc_request_id: Option<String>,
    },
    /// The signing layer failed: no credentials for the principal (a missing user Secret,
    /// a failed token exchange), or OCI refused them (a 401 the layer turned into an
    /// error). The kind follows auth's classification.
    #[error("authentication failed for {secret} as {principal}", secret = .subject.object, principal = .subject.principal)]
    Signing {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// The signing layer's error.
        #[source]
        source: Box<AuthError>,
    },
    /// The exchange failed below HTTP: connect, TLS, broken connection, timeout.
    #[error("the request to OCI for {secret} as {principal} failed (sent {})", Rid(.opc_request_id), secret = .subject.object, principal = .subject.principal)]
    Transport {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// The transport's error.
        #[source]
        source: TransportError,
        /// The request id we sent (no answer carried OCI's).
        opc_request_id: Option<String>,
    },
    /// The deadline passed outside the transport (while signing, or before a first
    /// attempt could start).
    #[error("deadline exceeded fetching {secret} as {principal} after {attempts} {}", attempt_word(*.attempts), secret = .subject.object, principal = .subject.principal)]
    DeadlineExceeded {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// Attempts started.
        attempts: u32,
    },
    /// The request could not be built (a bad base URL).
    #[error("cannot build the request for {secret}: {reason}", secret = .subject.object)]
    InvalidRequest {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// What is wrong.
        reason: String,
    },
    /// The inner service failed with an error of no known type.
    #[error("fetching {secret} as {principal} failed", secret = .subject.object, principal = .subject.principal)]
    Other {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// The error.
        #[source]
        source: BoxError,
    },
    /// A transient failure persisted: the retries ran out, or the next sleep would have
    /// passed the deadline. The kind is the last failure's (ResourceExhausted after 429,
    /// Unavailable after 5xx or connection errors), not DeadlineExceeded: it says why the
    /// fetch failed rather than that we stopped waiting.
    #[error("{}; gave up after {attempts} {}: {stopped}", ErrorChain(.last.as_ref()), attempt_word(*.attempts))]
    Exhausted {
        /// Attempts made.
        attempts: u32,
        /// Why retrying stopped.
        stopped: Stopped,
        /// The last attempt's failure, with its causes: rendered first in the message (it
        /// is what went wrong; the retries are the annotation), so not its `source()`.
        last: Box<VaultError>,
    },
    /// The failure of a fetch this one joined: the same secret, version and credential
    /// asked for by several mounts at once is fetched once, and its error handed to each.
    #[error(transparent)]
    Shared(std::sync::Arc<VaultError>),
    /// The deadline passed while this mount waited for the same fetch by another mount.
    #[error("the deadline passed while {0}")]
    Waited(&'static str),
    /// After a retry backoff, the caller's byte budget could not hold the next attempt's
    /// answer (other mounts took it meanwhile).
    #[error(
        "{secret}: the bytes for the next attempt could not be reserved after a retry backoff \
         (server.max_in_flight_bytes is in use by other mounts); {}",
        ErrorChain(.last.as_ref()),
        secret = .subject.object
    )]
    BudgetFull {
        /// The secret and the principal.
        subject: Box<Subject>,
        /// The failure the backoff followed, rendered with its causes in the message (so
        /// not its `source()`).
        last: Box<VaultError>,
    },
    /// A listing stopped: its caller's allowance of pages (a mount's) was spent.
    #[error(
        "{listing} stopped after {read} pages: the mount has sent all the listing pages a mount may (principal: {principal})",
        listing = .subject.object,
        principal = .subject.principal
    )]
    PagesSpent {
        /// The listing and the principal.
        subject: Box<Subject>,
        /// Pages this listing read before.
        read: u32,
    },
}

impl cache::JoinError for VaultError {
    fn from_shared(shared: std::sync::Arc<Self>) -> Self {
        VaultError::Shared(shared)
    }

    fn waited_too_long(what: &'static str) -> Self {
        VaultError::Waited(what)
    }

    /// A timeout is the leader's (its deadline, or its transport timeout): a waiter with
    /// time left fetches itself rather than fail with it.
    fn is_leaders_own(&self) -> bool {
        self.kind() == ErrorKind::DeadlineExceeded
    }
}

fn attempt_word(attempts: u32) -> &'static str {
    if attempts == 1 { "attempt" } else { "attempts" }
}

/// Why the client stopped retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// [`crate::RetryPolicy::max_attempts`] attempts were made.
    MaxAttempts,
    /// The next attempt would have started after the deadline.
    Deadline,
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stopped::MaxAttempts => "the retry limit was reached",
            Stopped::Deadline => "the next attempt would start after the deadline",
        })
    }
}

impl VaultError {
    /// The class of the failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            VaultError::NotFound { .. } => ErrorKind::NotFound,
            VaultError::Unauthenticated { .. } => ErrorKind::Unauthenticated,
            VaultError::Signing { source, .. } => source.kind(),
            VaultError::PermissionDenied { .. } => ErrorKind::PermissionDenied,
            VaultError::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            VaultError::Status { oci, .. } => ErrorKind::from_http_status(oci.status),
            VaultError::Malformed { .. }
            | VaultError::InvalidRequest { .. }
            | VaultError::Other { .. } => ErrorKind::Internal,
            VaultError::Transport { source, .. } => ErrorKind::from_transport(source.kind()),
            VaultError::DeadlineExceeded { .. } => ErrorKind::DeadlineExceeded,
            VaultError::Exhausted { last, .. } => last.kind(),
            VaultError::Shared(shared) => shared.kind(),
            VaultError::Waited(_) => ErrorKind::DeadlineExceeded,
            VaultError::BudgetFull { .. } | VaultError::PagesSpent { .. } => {
                ErrorKind::ResourceExhausted
            }
        }
    }

    /// Whether the failure is transient, per the Go SDK's default policy (spec 2.7):
    /// 409 `IncorrectState`, 429, 500-504 except 501 `MethodNotImplemented`, and
    /// connection failures; also a signing failure auth classifies as Unavailable. The client retries these itself; an [`VaultError::Exhausted`]
    /// error is transient but already retried. A transport timeout counts as transient
    /// (the client only retries it while the deadline has not passed).
    pub fn is_retryable(&self) -> bool {
        match self {
            VaultError::Status { oci, .. } => match oci.status {
                409 => oci.code == "IncorrectState",
                429 | 500 | 502..=504 => true,
                501 => oci.code != "MethodNotImplemented",
                _ => false,
            },
            VaultError::Transport { source, .. } => matches!(
                source.kind(),
                transport::ErrorKind::Connect
                    | transport::ErrorKind::Io
                    | transport::ErrorKind::Timeout
            ),
            // A token exchange that failed transiently (proxymux or federation down) is
            // worth another attempt: auth does not retry its own calls.
            VaultError::Signing { source, .. } => source.kind() == auth::ErrorKind::Unavailable,
            VaultError::Exhausted { last, .. } => last.is_retryable(),
            VaultError::Shared(shared) => shared.is_retryable(),
            _ => false,
        }
    }

    /// OCI's `opc-request-id` of the answer (or, with no answer, the one we sent).
    pub fn opc_request_id(&self) -> Option<&str> {
        match self {
            VaultError::NotFound { opc_request_id, .. }
            | VaultError::Unauthenticated { opc_request_id, .. }
            | VaultError::PermissionDenied { opc_request_id, .. }
            | VaultError::InvalidArgument { opc_request_id, .. }
            | VaultError::Status { opc_request_id, .. }
            | VaultError::Malformed { opc_request_id, .. }
            | VaultError::Transport { opc_request_id, .. } => opc_request_id.as_deref(),
            VaultError::Exhausted { last, .. } => last.opc_request_id(),
            VaultError::Shared(shared) => shared.opc_request_id(),
            _ => None,
        }
    }

    /// OCI's error body, when OCI answered with an error status.
    pub fn oci_error(&self) -> Option<&OciError> {
        match self {
            VaultError::NotFound { oci, .. }
            | VaultError::Unauthenticated { oci, .. }
            | VaultError::PermissionDenied { oci, .. }
            | VaultError::InvalidArgument { oci, .. }
            | VaultError::Status { oci, .. } => Some(oci),
            VaultError::Exhausted { last, .. } => last.oci_error(),
            VaultError::Shared(shared) => shared.oci_error(),
            _ => None,
        }
    }

    /// `Retry-After` of a throttling or unavailable answer.
    pub(crate) fn retry_after_secs(&self) -> Option<u64> {
        match self {
            VaultError::Status {
                retry_after_secs, ..
            } => *retry_after_secs,
            _ => None,
        }
    }

    /// Classifies an error status answer.
    pub(crate) fn from_status(
        subject: Box<Subject>,
        oci: OciError,
        opc_request_id: Option<String>,
        retry_after_secs: Option<u64>,
    ) -> Self {
        match oci.status {
            400 => VaultError::InvalidArgument {
                subject,
                oci,
                opc_request_id,
            },
            401 => VaultError::Unauthenticated {
                subject,
                oci,
                opc_request_id,
            },
            403 => VaultError::PermissionDenied {
                subject,
                oci,
                opc_request_id,
            },
            404 => VaultError::NotFound {
                subject,
                oci,
                opc_request_id,
            },
            _ => VaultError::Status {
                subject,
                oci,
                opc_request_id,
                retry_after_secs,
            },
        }
    }

    /// Classifies an error of the inner (signing + transport) service.
    pub(crate) fn from_inner(
        subject: Box<Subject>,
        error: BoxError,
        sent_request_id: Option<String>,
    ) -> Self {
        let error = match error.downcast::<TransportError>() {
            Ok(source) => {
                return VaultError::Transport {
                    subject,
                    source: *source,
                    opc_request_id: sent_request_id,
                };
            }
            Err(other) => other,
        };
        match error.downcast::<AuthError>() {
            Ok(source) => VaultError::Signing { subject, source },
            Err(source) => VaultError::Other { subject, source },
        }
    }

    /// The secret and principal the failed request was about (`None` for a mount that
    /// gave up waiting for another's fetch: the caller knows what it asked for).
    pub fn subject(&self) -> Option<&Subject> {
        match self {
            VaultError::NotFound { subject, .. }
            | VaultError::Unauthenticated { subject, .. }
            | VaultError::PermissionDenied { subject, .. }
            | VaultError::InvalidArgument { subject, .. }
            | VaultError::Status { subject, .. }
            | VaultError::Malformed { subject, .. }
            | VaultError::Signing { subject, .. }
            | VaultError::Transport { subject, .. }
            | VaultError::DeadlineExceeded { subject, .. }
            | VaultError::InvalidRequest { subject, .. }
            | VaultError::Other { subject, .. }
            | VaultError::BudgetFull { subject, .. }
            | VaultError::PagesSpent { subject, .. } => Some(subject),
            VaultError::Exhausted { last, .. } => last.subject(),
            VaultError::Shared(shared) => shared.subject(),
            VaultError::Waited(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, code: &str) -> VaultError {
        VaultError::from_status(
            Box::new(Subject {
                object: "secret \"s\" (stage CURRENT) in vault v".into(),
                principal: Identity::Instance,
                grant: Subject::SECRETS_GRANT,
            }),
            OciError {
                status,
                code: code.into(),
                message: "m".into(),
            },
            Some("RID".into()),
            None,
        )
    }

    /// One mapping from a transport failure to a kind: the same failure is the same kind
    /// whether a Secrets call or one of auth's calls (proxymux, IMDS) met it.
    #[test]
    fn a_transport_failure_is_the_same_kind_in_vault_and_in_auth() {
        let failures = || {
            [
                transport::TransportError::TooLarge {
                    authority: "h:443".into(),
                    limit: 10,
                },
                transport::TransportError::Timeout {
                    authority: "h:443".into(),
                    after: std::time::Duration::from_secs(1),
                },
                transport::TransportError::PlainHttpRefused("h:80".into()),
            ]
        };
        for (vault_side, auth_side) in failures().into_iter().zip(failures()) {
            let expected = ErrorKind::from_transport(vault_side.kind());
            let vault = VaultError::Transport {
                subject: Box::new(Subject {
                    object: "secret s".into(),
                    principal: Identity::Instance,
                    grant: Subject::SECRETS_GRANT,
                }),
                source: vault_side,
                opc_request_id: None,
            };
            let auth = auth::AuthError::Transport {
                endpoint: auth::Endpoint::Proxymux,
                operation: "exchange".into(),
                source: auth_side,
            };
            assert_eq!(vault.kind(), expected, "{vault}");
            assert_eq!(auth.kind(), expected, "{auth}");
        }
        assert_eq!(
            ErrorKind::from_transport(transport::ErrorKind::TooLarge),
            ErrorKind::Internal
        );
    }

    #[test]
    fn statuses_map_to_kinds_and_retryability_like_the_sdk() {
        let cases = [
            (400, "InvalidParameter", ErrorKind::InvalidArgument, false),
            (401, "NotAuthenticated", ErrorKind::Unauthenticated, false),
            (403, "NotAuthorized", ErrorKind::PermissionDenied, false),
            (404, "NotAuthorizedOrNotFound", ErrorKind::NotFound, false),
            (409, "IncorrectState", ErrorKind::Unavailable, true),
            (409, "Conflict", ErrorKind::Unavailable, false),
            (429, "TooManyRequests", ErrorKind::ResourceExhausted, true),
            (500, "InternalServerError", ErrorKind::Unavailable, true),
            (501, "MethodNotImplemented", ErrorKind::Unavailable, false),
            (501, "Other", ErrorKind::Unavailable, true),
            (502, "BadGateway", ErrorKind::Unavailable, true),
            (503, "ServiceUnavailable", ErrorKind::Unavailable, true),
            (504, "GatewayTimeout", ErrorKind::Unavailable, true),
            (505, "HttpVersion", ErrorKind::Unavailable, false),
            (405, "MethodNotAllowed", ErrorKind::Internal, false),
        ];
        for (code, oci_code, kind, retryable) in cases {
            let error = status(code, oci_code);
            assert_eq!(error.kind(), kind, "{code} {oci_code}");
            assert_eq!(error.is_retryable(), retryable, "{code} {oci_code}");
            assert_eq!(error.opc_request_id(), Some("RID"));
        }
    }

    #[test]
    fn non_json_error_bodies_become_bad_error_response_without_quoting() {
        let oci = OciError::from_body(502, Some("text/html"), b"<html>secret page</html>");
        assert_eq!(oci.code, "BadErrorResponse");
        assert!(!oci.message.contains("secret page"), "{}", oci.message);
        let oci = OciError::from_body(400, None, br#"{"code":"X","message":"y"}"#);
        assert_eq!((oci.code.as_str(), oci.message.as_str()), ("X", "y"));
    }

    #[test]
    fn long_messages_are_cut() {
        let long = format!(r#"{{"code":"X","message":"{}"}}"#, "é".repeat(2000));
        let oci = OciError::from_body(400, None, long.as_bytes());
        assert_eq!(oci.message.chars().count(), MAX_MESSAGE_CHARS + 1);
    }

    /// Each level of an error says its own part once: no `Display` repeats its
    /// `source()`, so `ErrorChain` prints every cause exactly once.
    #[test]
    fn display_never_repeats_the_source() {
        let subject = || {
            Box::new(Subject {
                object: "secret s".into(),
                principal: Identity::Instance,
                grant: Subject::SECRETS_GRANT,
            })
        };
        let refused = || transport::TransportError::Connect {
            authority: "h:443".into(),
            source: Box::new(std::io::Error::other("root cause: refused")),
        };
        let transport = || VaultError::Transport {
            subject: subject(),
            source: refused(),
            opc_request_id: Some("RID".into()),
        };
        let errors: Vec<Box<dyn std::error::Error>> = vec![
            Box::new(transport()),
            Box::new(VaultError::Signing {
                subject: subject(),
                source: Box::new(auth::AuthError::Transport {
                    endpoint: auth::Endpoint::Proxymux,
                    operation: "exchange".into(),
                    source: refused(),
                }),
            }),
            Box::new(VaultError::Other {
                subject: subject(),
                source: Box::new(refused()),
            }),
            Box::new(VaultError::Exhausted {
                attempts: 3,
                stopped: Stopped::MaxAttempts,
                last: Box::new(transport()),
            }),
            Box::new(VaultError::BudgetFull {
                subject: subject(),
                last: Box::new(transport()),
            }),
            Box::new(VaultError::Shared(std::sync::Arc::new(transport()))),
            Box::new(auth::AuthError::Transport {
                endpoint: auth::Endpoint::InstanceMetadata,
                operation: "region".into(),
                source: refused(),
            }),
        ];
        for error in &errors {
            let mut level: Option<&dyn std::error::Error> = Some(error.as_ref());
            while let Some(outer) = level {
                if let Some(inner) = outer.source() {
                    let (outer_text, inner_text) = (outer.to_string(), inner.to_string());
                    assert!(
                        !outer_text.contains(&inner_text),
                        "{outer_text:?} repeats its source {inner_text:?}"
                    );
                }
                level = outer.source();
            }
            let chain = ErrorChain(error.as_ref()).to_string();
            assert_eq!(chain.matches("root cause: refused").count(), 1, "{chain}");
            assert_eq!(
                chain.matches("cannot connect to h:443").count(),
                1,
                "{chain}"
            );
        }
    }

    #[test]
    fn exhausted_keeps_the_last_kind() {
        let error = VaultError::Exhausted {
            attempts: 5,
            stopped: Stopped::MaxAttempts,
            last: Box::new(status(429, "TooManyRequests")),
        };
        assert_eq!(error.kind(), ErrorKind::ResourceExhausted);
        assert!(
            error
                .to_string()
                .ends_with("gave up after 5 attempts: the retry limit was reached")
        );
        assert_eq!(error.opc_request_id(), Some("RID"));
    }
}
