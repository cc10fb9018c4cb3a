//! The Secrets client: one request per attempt, retries with backoff, decoding.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use auth::BoxError;
use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderValue, RETRY_AFTER, USER_AGENT};
use http::{HeaderName, Request, Response};
use tokio::time::Instant;
use tower::{Service, ServiceExt as _};

use crate::bundle::{self, MalformedBundle, SecretBundle};
use crate::certificate::{self, CertificateBundle, CertificateRequest};
use crate::error::{OciError, Stopped, Subject, VaultError};
use crate::request::SecretRequest;
use crate::retry::{RetryPolicy, unit_random};

/// The request id header OCI reads and echoes.
const OPC_REQUEST_ID: HeaderName = HeaderName::from_static("opc-request-id");
/// Tells OCI whether the client retries (spec 2.4).
const OPC_CLIENT_RETRIES: HeaderName = HeaderName::from_static("opc-client-retries");

/// The default `User-Agent`: this library's name and version; an application sets its own
/// with [`VaultClient::with_user_agent`].
pub const DEFAULT_USER_AGENT: &str = concat!("oci-csi-vault/", env!("CARGO_PKG_VERSION"));

/// The OCI Secrets API client as a tower service: a [`SecretRequest`] in, a
/// [`SecretBundle`] out.
///
/// `S` sends signed requests: in production `auth::Signing<transport::HttpService>` (the
/// signing layer over the one transport). Each attempt builds a fresh request (new
/// `opc-request-id`, and the signing layer below sets a fresh `date`), carrying the
/// request's [`auth::Session`] and a [`transport::Deadline`] in its extensions.
///
/// ```no_run
/// # async fn example(http: transport::HttpService, session: auth::Session)
/// # -> Result<(), oci_csi_vault::VaultError> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use oci_csi_vault::{RetryPolicy, SecretRef, SecretRequest, Selector, Stage, VaultClient};
/// use tower::{Layer as _, ServiceExt as _};
///
/// let signed = auth::SigningLayer::new(Arc::new(clock::SystemClock)).layer(http);
/// let client = VaultClient::new(signed, RetryPolicy::default());
/// let bundle = client
///     .oneshot(SecretRequest {
///         base_url: "https://secrets.vaults.us-ashburn-1.oci.oraclecloud.com".into(),
///         session,
///         secret: SecretRef::ByName { vault_id: "ocid1.vault.oc1..v".into(), name: "db".into() },
///         selector: Selector::Stage(Stage::Current),
///         deadline: tokio::time::Instant::now() + Duration::from_secs(10),
///     })
///     .await?;
/// println!("version {}", bundle.version_number);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct VaultClient<S> {
    http: S,
    retry: RetryPolicy,
    user_agent: HeaderValue,
    max_body_bytes: Option<usize>,
    retries: Arc<Retries>,
}

/// Retries made by a client (and its clones), by reason, and the calls that failed after
/// their retries, by the reason of the last failure.
#[derive(Debug, Default)]
pub struct Retries {
    counts: [AtomicU64; RetryReason::ALL.len()],
    gave_up: [AtomicU64; RetryReason::ALL.len()],
}

/// Why an attempt was retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// 429 TooManyRequests.
    Throttled,
    /// 500, 502, 503, 504 (and 501 unless `MethodNotImplemented`).
    ServerError,
    /// 409 `IncorrectState`.
    Conflict,
    /// No connection could be made.
    Connect,
    /// The exchange timed out.
    Timeout,
    /// The connection broke mid-exchange.
    Io,
    /// A token exchange failed transiently (proxymux or federation unavailable).
    Credentials,
}

impl RetryReason {
    /// Every reason, in a fixed order.
    pub const ALL: [RetryReason; 7] = [
        RetryReason::Throttled,
        RetryReason::ServerError,
        RetryReason::Conflict,
        RetryReason::Connect,
        RetryReason::Timeout,
        RetryReason::Io,
        RetryReason::Credentials,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Throttled => "throttled",
            RetryReason::ServerError => "server_error",
            RetryReason::Conflict => "conflict",
            RetryReason::Connect => "connect",
            RetryReason::Timeout => "timeout",
            RetryReason::Io => "io",
            RetryReason::Credentials => "credentials",
        }
    }

    fn of(error: &VaultError) -> Self {
        match error {
            VaultError::Status { oci, .. } if oci.status == 429 => RetryReason::Throttled,
            VaultError::Status { oci, .. } if oci.status == 409 => RetryReason::Conflict,
            VaultError::Status { .. } => RetryReason::ServerError,
            VaultError::Transport { source, .. } => match source.kind() {
                transport::ErrorKind::Connect => RetryReason::Connect,
                transport::ErrorKind::Timeout => RetryReason::Timeout,
                _ => RetryReason::Io,
            },
            _ => RetryReason::Credentials,
        }
    }
}

impl Retries {
    /// Retries so far, by reason.
    pub fn snapshot(&self) -> Vec<(RetryReason, u64)> {
        Self::read(&self.counts)
    }

    /// Calls that failed after retrying, by the reason of their last failure: `throttled`
    /// is a 429 the retries did not outlast.
    pub fn gave_up_snapshot(&self) -> Vec<(RetryReason, u64)> {
        Self::read(&self.gave_up)
    }

    fn read(counts: &[AtomicU64; RetryReason::ALL.len()]) -> Vec<(RetryReason, u64)> {
        RetryReason::ALL
            .iter()
            .zip(counts)
            .map(|(reason, n)| (*reason, n.load(Ordering::Relaxed)))
            .collect()
    }

    fn count(&self, reason: RetryReason) {
        Self::add(&self.counts, reason);
    }

    fn count_gave_up(&self, reason: RetryReason) {
        Self::add(&self.gave_up, reason);
    }

    fn add(counts: &[AtomicU64; RetryReason::ALL.len()], reason: RetryReason) {
        if let Some(i) = RetryReason::ALL.iter().position(|r| *r == reason) {
            counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<S> fmt::Debug for VaultClient<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VaultClient")
            .field("retry", &self.retry)
            .field("user_agent", &self.user_agent)
            .finish_non_exhaustive()
    }
}

impl<S> VaultClient<S> {
    /// A client sending through `http` (which must sign) with this retry policy.
    pub fn new(http: S, retry: RetryPolicy) -> Self {
        Self {
            http,
            retry,
            user_agent: HeaderValue::from_static(DEFAULT_USER_AGENT),
            max_body_bytes: None,
            retries: Arc::new(Retries::default()),
        }
    }

    /// The retries this client and its clones made, by reason (for metrics).
    pub fn retries(&self) -> Arc<Retries> {
        Arc::clone(&self.retries)
    }

    /// Reads at most `bytes` of each answer (a [`transport::MaxBodyBytes`] extension on
    /// every request), so that what a fetch may buffer is known before it starts.
    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = Some(bytes);
        self
    }

    /// Replaces the `User-Agent` (e.g. to append `OCI_SDK_APPEND_USER_AGENT`). A value that
    /// is not a valid header keeps the default.
    pub fn with_user_agent(mut self, user_agent: &str) -> Self {
        if let Ok(value) = HeaderValue::from_str(user_agent) {
            self.user_agent = value;
        }
        self
    }

    /// The retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }
}

/// A request the client sends: where, as whom, by when, and how its answer parses. The
/// Secrets and the Certificates APIs share everything else (signing, retries, errors).
pub(crate) trait Call: Send + 'static {
    type Answer: Send + 'static;
    /// Which API the call is to, as logs name it.
    const API: &'static str;
    fn deadline(&self) -> Instant;
    fn identity(&self) -> auth::Identity;
    fn session(&self) -> &auth::Session;
    fn describe(&self) -> String;
    /// The IAM grant a 404 names.
    fn grant(&self) -> &'static str;
    fn base_url(&self) -> &str;
    fn method_and_uri(&self) -> (http::Method, String);
    fn parse(
        &self,
        body: &[u8],
        opc_request_id: Option<String>,
    ) -> Result<Self::Answer, MalformedBundle>;
}

impl Call for SecretRequest {
    type Answer = SecretBundle;
    const API: &'static str = "secrets";
    fn deadline(&self) -> Instant {
        self.deadline
    }
    fn identity(&self) -> auth::Identity {
        SecretRequest::identity(self)
    }
    fn session(&self) -> &auth::Session {
        &self.session
    }
    fn describe(&self) -> String {
        SecretRequest::describe(self)
    }
    fn grant(&self) -> &'static str {
        Subject::SECRETS_GRANT
    }
    fn base_url(&self) -> &str {
        &self.base_url
    }
    fn method_and_uri(&self) -> (http::Method, String) {
        SecretRequest::method_and_uri(self)
    }
    fn parse(&self, body: &[u8], id: Option<String>) -> Result<SecretBundle, MalformedBundle> {
        bundle::parse(body, id)
    }
}

impl Call for CertificateRequest {
    type Answer = CertificateBundle;
    const API: &'static str = "certificates";
    fn deadline(&self) -> Instant {
        self.deadline
    }
    fn identity(&self) -> auth::Identity {
        CertificateRequest::identity(self)
    }
    fn session(&self) -> &auth::Session {
        &self.session
    }
    fn describe(&self) -> String {
        CertificateRequest::describe(self)
    }
    fn grant(&self) -> &'static str {
        match self.target {
            crate::CertificateRef::Certificate(_) => Subject::CERTIFICATES_GRANT,
            _ => Subject::CA_GRANT,
        }
    }
    fn base_url(&self) -> &str {
        &self.base_url
    }
    fn method_and_uri(&self) -> (http::Method, String) {
        CertificateRequest::method_and_uri(self)
    }
    fn parse(&self, body: &[u8], id: Option<String>) -> Result<CertificateBundle, MalformedBundle> {
        certificate::parse(&self.target, body, id)
    }
}

impl<S> VaultClient<S> {
    fn fetch<R: Call>(&self, request: R) -> Fetch<S, R>
    where
        S: Clone,
    {
        Fetch {
            http: self.http.clone(),
            retry: self.retry.clone(),
            user_agent: self.user_agent.clone(),
            max_body_bytes: self.max_body_bytes,
            retries: Arc::clone(&self.retries),
            secret: request.describe(),
            request,
        }
    }
}

impl<S, E> Service<CertificateRequest> for VaultClient<S>
where
    S: Service<Request<Bytes>, Response = Response<Bytes>, Error = E> + Clone + Send + 'static,
    S::Future: Send + 'static,
    E: Into<BoxError> + 'static,
{
    type Response = CertificateBundle;
    type Error = VaultError;
    type Future = Pin<Box<dyn Future<Output = Result<CertificateBundle, VaultError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), VaultError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: CertificateRequest) -> Self::Future {
        Box::pin(self.fetch(request).run())
    }
}

impl<S, E> Service<SecretRequest> for VaultClient<S>
where
    S: Service<Request<Bytes>, Response = Response<Bytes>, Error = E> + Clone + Send + 'static,
    S::Future: Send + 'static,
    E: Into<BoxError> + 'static,
{
    type Response = SecretBundle;
    type Error = VaultError;
    type Future = Pin<Box<dyn Future<Output = Result<SecretBundle, VaultError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), VaultError>> {
        // Each call drives its own clone of the inner service to readiness before every
        // attempt, so the client itself is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: SecretRequest) -> Self::Future {
        Box::pin(self.fetch(request).run())
    }
}

/// One fetch in progress.
struct Fetch<S, R> {
    http: S,
    retry: RetryPolicy,
    user_agent: HeaderValue,
    max_body_bytes: Option<usize>,
    retries: Arc<Retries>,
    secret: String,
    request: R,
}

impl<S, E, R: Call> Fetch<S, R>
where
    S: Service<Request<Bytes>, Response = Response<Bytes>, Error = E> + Clone + Send + 'static,
    S::Future: Send + 'static,
    E: Into<BoxError> + 'static,
{
    async fn run(mut self) -> Result<R::Answer, VaultError> {
        let deadline = self.request.deadline();
        let max_attempts = self.retry.max_attempts.max(1);
        let mut attempts = 0u32;
        loop {
            if Instant::now() >= deadline {
                return Err(VaultError::DeadlineExceeded {
                    subject: self.subject(),
                    attempts,
                });
            }
            attempts += 1;
            let error = match self.attempt(attempts, max_attempts).await {
                Ok(bundle) => return Ok(bundle),
                Err(error) => error,
            };
            let now = Instant::now();
            if !error.is_retryable() || (now >= deadline && attempts == 1) {
                return Err(error);
            }
            if attempts >= max_attempts {
                return Err(self.give_up(attempts, Stopped::MaxAttempts, error));
            }
            let retry_after = error.retry_after_secs().map(Duration::from_secs);
            let delay = self.retry.delay(attempts, retry_after, unit_random());
            // A Retry-After near u64::MAX seconds cannot be added to a clock: it is past
            // any deadline.
            if now.checked_add(delay).is_none_or(|at| at >= deadline) {
                return Err(self.give_up(attempts, Stopped::Deadline, error));
            }
            tracing::debug!(
                secret = %self.secret,
                principal = %self.request.identity(),
                attempt = attempts,
                error = %crate::ErrorChain(&error),
                delay_ms = delay.as_millis() as u64,
                api = R::API,
                "retrying OCI call"
            );
            self.retries.count(RetryReason::of(&error));
            // No answer is held while sleeping: the caller's reservation goes back meanwhile.
            crate::backoff::pausing();
            tokio::time::sleep(delay).await;
            if !crate::backoff::resuming() {
                return Err(VaultError::BudgetFull {
                    subject: self.subject(),
                    last: Box::new(error),
                });
            }
        }
    }

    fn subject(&self) -> Box<Subject> {
        Box::new(Subject {
            secret: self.secret.clone(),
            principal: self.request.identity(),
            grant: self.request.grant(),
        })
    }

    fn give_up(&self, attempts: u32, stopped: Stopped, last: VaultError) -> VaultError {
        self.retries.count_gave_up(RetryReason::of(&last));
        tracing::debug!(
            secret = %self.secret,
            principal = %self.request.identity(),
            attempts,
            ?stopped,
            "giving up on OCI secrets call"
        );
        VaultError::Exhausted {
            attempts,
            stopped,
            last: Box::new(last),
        }
    }

    async fn attempt(&mut self, attempt: u32, max_attempts: u32) -> Result<R::Answer, VaultError> {
        let request_id = new_request_id();
        let http_request = self.build(request_id.as_deref(), max_attempts > 1)?;
        let method = http_request.method().clone();
        let deadline = self.request.deadline();
        // The transport bounds the exchange by the deadline; this outer bound also covers
        // the signing layer, which may have to exchange a token first.
        let exchange = async {
            let service = self.http.ready().await.map_err(Into::into)?;
            service.call(http_request).await.map_err(Into::into)
        };
        let response = match tokio::time::timeout_at(deadline, exchange).await {
            Err(_) => {
                return Err(VaultError::DeadlineExceeded {
                    subject: self.subject(),
                    attempts: attempt,
                });
            }
            Ok(Err(error)) => {
                return Err(VaultError::from_inner(self.subject(), error, request_id));
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        let headers = response.headers();
        let opc_request_id = header_str(headers, &OPC_REQUEST_ID)
            .map(str::to_owned)
            .or(request_id);
        tracing::debug!(
            secret = %self.secret,
            principal = %self.request.identity(),
            %method,
            attempt,
            status = status.as_u16(),
            opc_request_id = opc_request_id.as_deref().unwrap_or(""),
            "OCI secrets call answered"
        );
        if status.is_success() {
            return self
                .request
                .parse(response.body(), opc_request_id.clone())
                .map_err(|reason| VaultError::Malformed {
                    subject: self.subject(),
                    reason,
                    opc_request_id,
                });
        }
        let retry_after_secs =
            header_str(headers, &RETRY_AFTER).and_then(|v| v.trim().parse::<u64>().ok());
        let oci = OciError::from_body(
            status.as_u16(),
            header_str(headers, &CONTENT_TYPE),
            response.body(),
        );
        Err(VaultError::from_status(
            self.subject(),
            oci,
            opc_request_id,
            retry_after_secs,
        ))
    }

    /// The HTTP request of one attempt (spec 2.4).
    fn build(&self, request_id: Option<&str>, retries: bool) -> Result<Request<Bytes>, VaultError> {
        let (method, uri) = self.request.method_and_uri();
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(USER_AGENT, self.user_agent.clone())
            .header(
                OPC_CLIENT_RETRIES,
                HeaderValue::from_static(if retries { "true" } else { "false" }),
            )
            .extension(self.request.session().clone())
            .extension(transport::Deadline(self.request.deadline()));
        if let Some(id) = request_id {
            builder = builder.header(OPC_REQUEST_ID, id);
        }
        if let Some(limit) = self.max_body_bytes {
            builder = builder.extension(transport::MaxBodyBytes(limit));
        }
        builder
            .body(Bytes::new())
            .map_err(|e| VaultError::InvalidRequest {
                subject: self.subject(),
                reason: format!("{e} (base URL {:?})", self.request.base_url()),
            })
    }
}

fn header_str<'a>(headers: &'a http::HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A fresh `opc-request-id`: 32 lower-case hex characters, like the SDK (auth's generator).
fn new_request_id() -> Option<String> {
    auth::opc_request_id(1)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use auth::Identity;
    use tower::service_fn;

    use super::*;
    use crate::error::ErrorKind;
    use crate::request::{SecretRef, Selector, Stage};

    const BUNDLE: &str = r#"{"secretId":"ocid1.vaultsecret.oc1..s","versionNumber":1,
        "secretBundleContent":{"contentType":"BASE64","content":"aGk="},"stages":["CURRENT"]}"#;

    fn reply(status: u16, headers: &[(&str, &str)], body: &str) -> Response<Bytes> {
        let mut builder = Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Bytes::from(body.to_owned())).unwrap()
    }

    fn oci(status: u16, code: &str) -> Response<Bytes> {
        reply(
            status,
            &[
                ("content-type", "application/json"),
                ("opc-request-id", "RID"),
            ],
            &format!(r#"{{"code":"{code}","message":"m"}}"#),
        )
    }

    /// A request the fake received, and when.
    type Seen = (Instant, Request<Bytes>);

    /// A fake inner service answering from a script, recording each request and the
    /// virtual time it arrived.
    #[derive(Clone, Default)]
    struct Script {
        answers: Arc<Mutex<Vec<Response<Bytes>>>>,
        seen: Arc<Mutex<Vec<Seen>>>,
    }

    impl Script {
        fn new(answers: Vec<Response<Bytes>>) -> Self {
            Self {
                answers: Arc::new(Mutex::new(answers.into_iter().rev().collect())),
                seen: Arc::default(),
            }
        }

        fn client(&self, retry: RetryPolicy) -> VaultClient<Script> {
            VaultClient::new(self.clone(), retry)
        }

        fn times(&self) -> Vec<Instant> {
            self.seen.lock().unwrap().iter().map(|(t, _)| *t).collect()
        }
    }

    impl Service<Request<Bytes>> for Script {
        type Response = Response<Bytes>;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Response<Bytes>, BoxError>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<Bytes>) -> Self::Future {
            self.seen.lock().unwrap().push((Instant::now(), request));
            let answer = self.answers.lock().unwrap().pop();
            Box::pin(async move { Ok(answer.unwrap_or_else(|| reply(200, &[], BUNDLE))) })
        }
    }

    fn request(deadline: Duration) -> SecretRequest {
        SecretRequest {
            base_url: "https://secrets.example.com".into(),
            session: auth::Session::for_tests(auth::Credential::Instance {
                tenancy: "ocid1.tenancy.oc1..t".into(),
                instance: "ocid1.instance.oc1..i".into(),
            }),
            secret: SecretRef::ByName {
                vault_id: "ocid1.vault.oc1..v".into(),
                name: "db".into(),
            },
            selector: Selector::Stage(Stage::Current),
            deadline: Instant::now() + deadline,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn certificates_go_through_the_same_signing_retries_and_errors() {
        let cert = r#"{"certificateBundleType":"CERTIFICATE_CONTENT_PUBLIC_ONLY","certificateId":"ocid1.certificate.oc1..c","certificateName":"web","versionNumber":2,"stages":["CURRENT"],"certificatePem":"LEAF"}"#;
        let script = Script::new(vec![oci(503, "ServiceUnavailable"), reply(200, &[], cert)]);
        let request = crate::CertificateRequest {
            base_url: "https://certificates.example.com".into(),
            session: request(Duration::from_secs(30)).session,
            target: crate::CertificateRef::Certificate("ocid1.certificate.oc1..c".into()),
            selector: Selector::Stage(Stage::Current),
            private_key: false,
            deadline: Instant::now() + Duration::from_secs(30),
        };
        let bundle = script
            .client(no_jitter())
            .oneshot(request.clone())
            .await
            .unwrap();
        assert_eq!(
            (bundle.id.as_str(), bundle.version_number),
            ("ocid1.certificate.oc1..c", Some(2))
        );
        let seen: Vec<Request<Bytes>> = script
            .seen
            .lock()
            .unwrap()
            .drain(..)
            .map(|(_, r)| r)
            .collect();
        assert_eq!(seen.len(), 2, "the 503 was retried");
        let sent = &seen[1];
        assert_eq!(sent.method(), http::Method::GET);
        assert_eq!(
            sent.uri().to_string(),
            "https://certificates.example.com/20210224/certificateBundles/ocid1.certificate.oc1..c?certificateBundleType=CERTIFICATE_CONTENT_PUBLIC_ONLY&stage=CURRENT"
        );
        assert!(
            sent.extensions().get::<auth::Session>().is_some(),
            "carries the session to sign with"
        );
        drop(seen);

        let script = Script::new(vec![oci(404, "NotAuthorizedOrNotFound")]);
        let err = script
            .client(no_jitter())
            .oneshot(request)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(
            err.to_string()
                .contains("certificate ocid1.certificate.oc1..c"),
            "{err}"
        );
        assert!(
            err.to_string().contains("read leaf-certificate-bundles"),
            "{err}"
        );
    }

    fn no_jitter() -> RetryPolicy {
        RetryPolicy {
            jitter: false,
            ..RetryPolicy::default()
        }
    }

    /// Records what a caller's backoff hook was told, and refuses the second resumption.
    struct Recorder {
        events: std::sync::Mutex<Vec<&'static str>>,
        resumptions_allowed: std::sync::atomic::AtomicUsize,
    }

    impl crate::Backoff for Recorder {
        fn pausing(&self) {
            self.events.lock().unwrap().push("pausing");
        }
        fn resuming(&self) -> bool {
            self.events.lock().unwrap().push("resuming");
            self.resumptions_allowed
                .fetch_update(
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                    |n| n.checked_sub(1),
                )
                .is_ok()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_caller_is_told_of_each_backoff_and_may_stop_the_retries() {
        // Two retryable failures; the hook lets the fetch resume once, then refuses.
        let script = Script::new(vec![
            oci(503, "ServiceUnavailable"),
            oci(503, "ServiceUnavailable"),
        ]);
        let client = script.client(no_jitter());
        let recorder = Arc::new(Recorder {
            events: std::sync::Mutex::new(Vec::new()),
            resumptions_allowed: std::sync::atomic::AtomicUsize::new(1),
        });
        let err = crate::with_backoff(
            recorder.clone(),
            client.oneshot(request(Duration::from_secs(60))),
        )
        .await
        .unwrap_err();
        assert_eq!(
            *recorder.events.lock().unwrap(),
            ["pausing", "resuming", "pausing", "resuming"]
        );
        assert!(matches!(err, VaultError::BudgetFull { .. }), "{err}");
        assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
        assert!(
            err.to_string().contains("server.max_in_flight_bytes"),
            "{err}"
        );
        assert_eq!(
            script.times().len(),
            2,
            "no third attempt without the bytes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retries_with_exponential_backoff_then_succeeds() {
        let script = Script::new(vec![
            oci(503, "ServiceUnavailable"),
            oci(500, "X"),
            oci(409, "IncorrectState"),
        ]);
        let start = Instant::now();
        let client = script.client(no_jitter());
        let retries = client.retries();
        let bundle = client
            .oneshot(request(Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(bundle.content.expose(), b"hi");
        let counted: Vec<_> = retries
            .snapshot()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(reason, n)| (reason.as_str(), n))
            .collect();
        assert_eq!(counted, [("server_error", 2), ("conflict", 1)]);
        let offsets: Vec<_> = script
            .times()
            .iter()
            .map(|t| (*t - start).as_millis())
            .collect();
        assert_eq!(offsets, [0, 200, 600, 1400]);
    }

    #[tokio::test(start_paused = true)]
    async fn each_attempt_carries_fresh_headers_identity_and_deadline() {
        let script = Script::new(vec![oci(503, "ServiceUnavailable")]);
        let req = request(Duration::from_secs(60));
        let deadline = req.deadline;
        script.client(no_jitter()).oneshot(req).await.unwrap();
        let seen = script.seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        let ids: Vec<_> = seen
            .iter()
            .map(|(_, r)| r.headers()["opc-request-id"].to_str().unwrap().to_owned())
            .collect();
        assert_ne!(ids[0], ids[1]);
        for (_, r) in seen.iter() {
            let id = r.headers()["opc-request-id"].to_str().unwrap();
            assert_eq!(id.len(), 32);
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            );
            assert_eq!(r.method(), http::Method::POST);
            assert!(r.body().is_empty());
            assert_eq!(r.headers()["accept"], "application/json");
            assert_eq!(r.headers()["content-type"], "application/json");
            assert_eq!(r.headers()["opc-client-retries"], "true");
            assert!(
                r.headers()["user-agent"]
                    .to_str()
                    .unwrap()
                    .starts_with("oci-csi-vault/")
            );
            assert_eq!(
                r.extensions()
                    .get::<auth::Session>()
                    .map(auth::Session::identity),
                Some(Identity::Instance)
            );
            assert_eq!(
                r.extensions().get::<transport::Deadline>().map(|d| d.0),
                Some(deadline)
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_honoured() {
        let throttled = reply(
            429,
            &[("retry-after", "3")],
            r#"{"code":"TooManyRequests","message":"slow down"}"#,
        );
        let script = Script::new(vec![throttled]);
        let start = Instant::now();
        script
            .client(RetryPolicy::default())
            .oneshot(request(Duration::from_secs(60)))
            .await
            .unwrap();
        let times = script.times();
        assert_eq!(times.len(), 2);
        assert!(times[1] - start >= Duration::from_secs(3));
        assert!(times[1] - start < Duration::from_millis(3300));
    }

    #[tokio::test(start_paused = true)]
    async fn stops_before_a_sleep_that_would_cross_the_deadline() {
        let script = Script::new(vec![oci(503, "ServiceUnavailable"); 10]);
        let start = Instant::now();
        // Waits of 200 and 400 ms fit in 1 s; the third (800 ms, at 600 ms) would not.
        let error = script
            .client(no_jitter())
            .oneshot(request(Duration::from_secs(1)))
            .await
            .unwrap_err();
        assert_eq!(script.times().len(), 3);
        assert!(Instant::now() - start < Duration::from_secs(1));
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert!(matches!(
            error,
            VaultError::Exhausted {
                attempts: 3,
                stopped: Stopped::Deadline,
                ..
            }
        ));
        assert!(
            error
                .to_string()
                .contains("the next attempt would start after the deadline"),
            "{error}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_beyond_any_clock_gives_up_instead_of_overflowing() {
        let throttled = reply(
            429,
            &[("retry-after", "18446744073709551615")],
            r#"{"code":"TooManyRequests","message":"slow down"}"#,
        );
        let script = Script::new(vec![throttled]);
        let error = script
            .client(RetryPolicy::default())
            .oneshot(request(Duration::from_secs(60)))
            .await
            .unwrap_err();
        assert_eq!(script.times().len(), 1);
        assert_eq!(error.kind(), ErrorKind::ResourceExhausted, "{error}");
        assert!(matches!(
            error,
            VaultError::Exhausted {
                stopped: Stopped::Deadline,
                ..
            }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_retry_after_ends_in_resource_exhausted_without_sleeping() {
        let throttled = reply(
            429,
            &[("retry-after", "30")],
            r#"{"code":"TooManyRequests","message":"m"}"#,
        );
        let script = Script::new(vec![throttled]);
        let start = Instant::now();
        let error = script
            .client(RetryPolicy::default())
            .oneshot(request(Duration::from_secs(5)))
            .await
            .unwrap_err();
        assert_eq!(Instant::now(), start);
        assert_eq!(script.times().len(), 1);
        assert_eq!(error.kind(), ErrorKind::ResourceExhausted);
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_the_retries_did_not_outlast_is_counted_once_as_given_up() {
        let throttled = reply(
            429,
            &[("retry-after", "1")],
            r#"{"code":"TooManyRequests","message":"m"}"#,
        );
        let script = Script::new(vec![throttled; 10]);
        let client = script.client(RetryPolicy::default());
        let retries = client.retries();
        let nonzero = |counts: Vec<(RetryReason, u64)>| -> Vec<(&'static str, u64)> {
            counts
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .map(|(r, n)| (r.as_str(), n))
                .collect()
        };
        let error = client
            .oneshot(request(Duration::from_secs(60)))
            .await
            .unwrap_err();
        assert!(matches!(error, VaultError::Exhausted { .. }), "{error}");
        let attempts = script.times().len() as u64;
        assert!(attempts > 1);
        assert_eq!(nonzero(retries.snapshot()), [("throttled", attempts - 1)]);
        assert_eq!(nonzero(retries.gave_up_snapshot()), [("throttled", 1)]);
        // A call that succeeds after retries gave nothing up.
        let script = Script::new(vec![oci(503, "ServiceUnavailable")]);
        let client = script.client(no_jitter());
        let retries = client.retries();
        client
            .oneshot(request(Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(nonzero(retries.gave_up_snapshot()), []);
    }

    #[tokio::test(start_paused = true)]
    async fn max_attempts_bounds_the_retries() {
        let script = Script::new(vec![oci(502, "BadGateway"); 10]);
        let policy = RetryPolicy {
            max_attempts: 3,
            ..no_jitter()
        };
        let error = script
            .client(policy)
            .oneshot(request(Duration::from_secs(600)))
            .await
            .unwrap_err();
        assert_eq!(script.times().len(), 3);
        assert!(matches!(
            error,
            VaultError::Exhausted {
                attempts: 3,
                stopped: Stopped::MaxAttempts,
                ..
            }
        ));
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert_eq!(error.opc_request_id(), Some("RID"));
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried() {
        for (status, code) in [
            (400, "InvalidParameter"),
            (401, "NotAuthenticated"),
            (404, "NotAuthorizedOrNotFound"),
            (501, "MethodNotImplemented"),
            (409, "Conflict"),
        ] {
            let script = Script::new(vec![oci(status, code)]);
            let error = script
                .client(RetryPolicy::default())
                .oneshot(request(Duration::from_secs(60)))
                .await
                .unwrap_err();
            assert_eq!(script.times().len(), 1, "{status}");
            assert!(!matches!(error, VaultError::Exhausted { .. }), "{status}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_passed_deadline_sends_nothing() {
        let script = Script::new(vec![]);
        let error = script
            .client(RetryPolicy::default())
            .oneshot(request(Duration::ZERO))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::DeadlineExceeded);
        assert!(script.times().is_empty());
    }

    type Boxed = tower::util::BoxCloneSyncService<Request<Bytes>, Response<Bytes>, BoxError>;

    /// A client whose signer always fails with `error`, and a count of its calls.
    fn failing_signer(error: fn() -> auth::AuthError) -> (VaultClient<Boxed>, Arc<Mutex<u32>>) {
        let calls = Arc::new(Mutex::new(0));
        let counter = calls.clone();
        let service =
            tower::util::BoxCloneSyncService::new(service_fn(move |_: Request<Bytes>| {
                *counter.lock().unwrap() += 1;
                async move { Err::<Response<Bytes>, BoxError>(Box::new(error())) }
            }));
        (VaultClient::new(service, no_jitter()), calls)
    }

    #[tokio::test(start_paused = true)]
    async fn signing_errors_follow_auths_classification() {
        let (client, calls) = failing_signer(|| auth::AuthError::Unauthorized {
            identity: Identity::Instance,
            code: Some("NotAuthenticated".into()),
            hint: None,
        });
        let error = client
            .oneshot(request(Duration::from_secs(60)))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unauthenticated);
        let message = crate::ErrorChain(&error).to_string();
        assert!(message.contains("NotAuthenticated"), "{message}");
        assert_eq!(*calls.lock().unwrap(), 1);

        let (client, calls) = failing_signer(|| auth::AuthError::MissingSession);
        let error = client
            .oneshot(request(Duration::from_secs(60)))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Internal);
        let message = crate::ErrorChain(&error).to_string();
        assert!(
            message.contains("carries no established session"),
            "{message}"
        );
        assert_eq!(*calls.lock().unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_credential_failures_are_retried() {
        // Renewing a refused token failed: the proxymux answered 503.
        let (client, calls) = failing_signer(|| auth::AuthError::Status {
            endpoint: auth::Endpoint::Proxymux,
            operation: "the proxymux is down".into(),
            status: 503,
            detail: None,
        });
        let error = client
            .oneshot(request(Duration::from_secs(60)))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert!(
            matches!(error, VaultError::Exhausted { attempts: 5, .. }),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("the proxymux is down"),
            "{error}"
        );
        assert_eq!(*calls.lock().unwrap(), 5);
    }

    #[test]
    fn request_ids_are_32_lower_case_hex_characters() {
        let a = new_request_id().unwrap();
        let b = new_request_id().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| b"0123456789abcdef".contains(&c)));
        assert_ne!(a, b);
    }
}
