//! The Secrets and Certificates client: one attempt of a request, signed, sent and read;
//! retries are the layer above it ([`crate::RetryLayer`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use auth::BoxError;
use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderValue, RETRY_AFTER, USER_AGENT};
use http::{HeaderName, Request, Response};
use tokio::time::Instant;
use tower::{Service, ServiceExt as _};

use crate::Backoff;
use crate::bundle::{self, MalformedBundle, SecretBundle};
use crate::certificate::{self, CertificateBundle, CertificateRequest};
use crate::error::{OciError, Subject, VaultError};
use crate::list::{ListKind, Page, PageRequest};
use crate::request::SecretRequest;

/// The request id header OCI reads and echoes.
const OPC_REQUEST_ID: HeaderName = HeaderName::from_static("opc-request-id");
/// The page token of a listing's next page.
const OPC_NEXT_PAGE: HeaderName = HeaderName::from_static("opc-next-page");
/// Tells OCI whether the client retries (spec 2.4).
const OPC_CLIENT_RETRIES: HeaderName = HeaderName::from_static("opc-client-retries");

/// The default `User-Agent`: this library's name and version; an application sets its own
/// with [`VaultClient::with_user_agent`].
pub const DEFAULT_USER_AGENT: &str = concat!("oci-csi-vault/", env!("CARGO_PKG_VERSION"));

/// The OCI Secrets and Certificates APIs as a tower service: an [`Attempt`] of a
/// [`SecretRequest`] or a [`CertificateRequest`] in, a [`SecretBundle`] or a
/// [`CertificateBundle`] out. One attempt is one HTTP exchange; [`crate::RetryLayer`] above
/// it makes the attempts of a request.
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
/// use oci_csi_vault::{
///     Backoff, RetryLayer, RetryPolicy, SecretRef, SecretRequest, Selector, Stage, VaultClient,
/// };
/// use tower::{Layer as _, ServiceExt as _};
///
/// let signed = auth::SigningLayer::new(Arc::new(clock::SystemClock)).layer(http);
/// let client = RetryLayer::new(RetryPolicy::default()).layer(VaultClient::new(signed));
/// let bundle = client
///     .oneshot(SecretRequest {
///         base_url: "https://secrets.vaults.us-ashburn-1.oci.oraclecloud.com".into(),
///         session,
///         secret: SecretRef::ByName { vault_id: "ocid1.vault.oc1..v".into(), name: "db".into() },
///         selector: Selector::Stage(Stage::Current),
///         deadline: tokio::time::Instant::now() + Duration::from_secs(10),
///         backoff: Backoff::none(),
///     })
///     .await?;
/// println!("version {}", bundle.version_number);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct VaultClient<S> {
    http: S,
    user_agent: HeaderValue,
    max_body_bytes: Option<usize>,
}

impl<S> fmt::Debug for VaultClient<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VaultClient")
            .field("user_agent", &self.user_agent)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish_non_exhaustive()
    }
}

impl<S> VaultClient<S> {
    /// A client sending through `http` (which must sign).
    pub fn new(http: S) -> Self {
        Self {
            http,
            user_agent: HeaderValue::from_static(DEFAULT_USER_AGENT),
            max_body_bytes: None,
        }
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
}

/// One attempt of a request, as [`crate::Retry`] sends it to the client: the request, the
/// attempt's number (from 1) and whether the caller retries failures (OCI's
/// `opc-client-retries` header says so).
#[derive(Debug)]
pub struct Attempt<R> {
    /// The request, shared by its attempts.
    pub request: Arc<R>,
    /// 1 for the first attempt.
    pub number: u32,
    /// Whether a failure of this attempt may be retried.
    pub retries: bool,
}

impl<R> Attempt<R> {
    /// The only attempt of `request`: number 1, not retried.
    pub fn once(request: R) -> Self {
        Self {
            request: Arc::new(request),
            number: 1,
            retries: false,
        }
    }
}

impl<R> Clone for Attempt<R> {
    fn clone(&self) -> Self {
        Self {
            request: Arc::clone(&self.request),
            number: self.number,
            retries: self.retries,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::SecretRequest {}
    impl Sealed for crate::CertificateRequest {}
    impl Sealed for crate::PageRequest {}
}

/// A request of the Secrets, Certificates or Vault API (sealed): where, as whom, by when,
/// and how its answer parses. The APIs share everything else (signing, retries, errors).
pub trait Call: sealed::Sealed + Send + Sync + 'static {
    /// What a successful answer is.
    type Answer: Send + 'static;
    /// Which API the call is to, as logs name it.
    const API: &'static str;
    /// When the request must be over, retries included.
    fn deadline(&self) -> Instant;
    /// Told of the sleeps between its attempts ([`crate::Retry`] tells it).
    fn backoff(&self) -> &Backoff;
    /// As whom (names only).
    fn identity(&self) -> auth::Identity;
    /// The session it is signed with.
    fn session(&self) -> &auth::Session;
    /// What is asked for, as errors and logs name it.
    fn describe(&self) -> String;
    /// The IAM grant a 404 names.
    fn grant(&self) -> &'static str;
    /// Where the API is.
    fn base_url(&self) -> &str;
    /// The HTTP method and URI (spec 2.2, 2.3).
    fn method_and_uri(&self) -> (http::Method, String);
    /// The answer of a successful response (`next_page`: its `opc-next-page`).
    fn parse(
        &self,
        body: &[u8],
        opc_request_id: Option<String>,
        next_page: Option<&str>,
    ) -> Result<Self::Answer, MalformedBundle>;
}

impl Call for SecretRequest {
    type Answer = SecretBundle;
    const API: &'static str = "secrets";
    fn deadline(&self) -> Instant {
        self.deadline
    }
    fn backoff(&self) -> &Backoff {
        &self.backoff
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
    fn parse(
        &self,
        body: &[u8],
        id: Option<String>,
        _: Option<&str>,
    ) -> Result<SecretBundle, MalformedBundle> {
        bundle::parse(body, id)
    }
}

impl Call for CertificateRequest {
    type Answer = CertificateBundle;
    const API: &'static str = "certificates";
    fn deadline(&self) -> Instant {
        self.deadline
    }
    fn backoff(&self) -> &Backoff {
        &self.backoff
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
            crate::CertificateRef::CertificateAuthority(_) => Subject::CA_GRANT,
            crate::CertificateRef::CaBundle(_) => Subject::CA_BUNDLE_GRANT,
        }
    }
    fn base_url(&self) -> &str {
        &self.base_url
    }
    fn method_and_uri(&self) -> (http::Method, String) {
        CertificateRequest::method_and_uri(self)
    }
    fn parse(
        &self,
        body: &[u8],
        id: Option<String>,
        _: Option<&str>,
    ) -> Result<CertificateBundle, MalformedBundle> {
        certificate::parse(&self.target, body, id)
    }
}

impl Call for PageRequest {
    type Answer = Page;
    const API: &'static str = "listings";
    fn deadline(&self) -> Instant {
        self.list.deadline
    }
    fn backoff(&self) -> &Backoff {
        &self.list.backoff
    }
    fn identity(&self) -> auth::Identity {
        PageRequest::identity(self)
    }
    fn session(&self) -> &auth::Session {
        &self.list.session
    }
    fn describe(&self) -> String {
        self.list.describe()
    }
    fn grant(&self) -> &'static str {
        match self.list.kind {
            ListKind::Versions { .. } => Subject::SECRETS_GRANT,
            ListKind::Secrets { .. } => Subject::LIST_GRANT,
        }
    }
    fn base_url(&self) -> &str {
        &self.list.base_url
    }
    fn method_and_uri(&self) -> (http::Method, String) {
        PageRequest::method_and_uri(self)
    }
    fn parse(
        &self,
        body: &[u8],
        _: Option<String>,
        next_page: Option<&str>,
    ) -> Result<Page, MalformedBundle> {
        PageRequest::parse(self, body, next_page)
    }
}

/// What errors say a request was: the secret or certificate, the principal and the IAM grant
/// a 404 names.
pub(crate) fn subject<R: Call>(request: &R) -> Box<Subject> {
    Box::new(Subject {
        object: request.describe(),
        principal: request.identity(),
        grant: request.grant(),
    })
}

impl<S, E, R> Service<Attempt<R>> for VaultClient<S>
where
    R: Call,
    S: Service<Request<Bytes>, Response = Response<Bytes>, Error = E> + Clone + Send + 'static,
    S::Future: Send + 'static,
    E: Into<BoxError> + 'static,
{
    type Response = R::Answer;
    type Error = VaultError;
    type Future = Pin<Box<dyn Future<Output = Result<R::Answer, VaultError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), VaultError>> {
        // Each attempt drives its own clone of the inner service to readiness within the
        // request's deadline (the signing layer below may exchange a token first), so the
        // client itself is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, attempt: Attempt<R>) -> Self::Future {
        let attempt = OneAttempt {
            http: self.http.clone(),
            user_agent: self.user_agent.clone(),
            max_body_bytes: self.max_body_bytes,
            attempt,
        };
        Box::pin(attempt.run())
    }
}

/// One attempt in progress.
struct OneAttempt<S, R> {
    http: S,
    user_agent: HeaderValue,
    max_body_bytes: Option<usize>,
    attempt: Attempt<R>,
}

impl<S, E, R: Call> OneAttempt<S, R>
where
    S: Service<Request<Bytes>, Response = Response<Bytes>, Error = E> + Clone + Send + 'static,
    S::Future: Send + 'static,
    E: Into<BoxError> + 'static,
{
    fn subject(&self) -> Box<Subject> {
        subject(&*self.attempt.request)
    }

    async fn run(mut self) -> Result<R::Answer, VaultError> {
        let attempt = self.attempt.number;
        let deadline = self.attempt.request.deadline();
        if Instant::now() >= deadline {
            return Err(VaultError::DeadlineExceeded {
                subject: self.subject(),
                attempts: attempt - 1,
            });
        }
        let request_id = new_request_id();
        let http_request = self.build(request_id.as_deref())?;
        let method = http_request.method().clone();
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
            secret = %self.attempt.request.describe(),
            principal = %self.attempt.request.identity(),
            %method,
            attempt,
            status = status.as_u16(),
            opc_request_id = opc_request_id.as_deref().unwrap_or(""),
            "OCI call answered"
        );
        if status.is_success() {
            let next_page = header_str(headers, &OPC_NEXT_PAGE);
            return self
                .attempt
                .request
                .parse(response.body(), opc_request_id.clone(), next_page)
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
    fn build(&self, request_id: Option<&str>) -> Result<Request<Bytes>, VaultError> {
        let request = &self.attempt.request;
        let (method, uri) = request.method_and_uri();
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(USER_AGENT, self.user_agent.clone())
            .header(
                OPC_CLIENT_RETRIES,
                HeaderValue::from_static(if self.attempt.retries {
                    "true"
                } else {
                    "false"
                }),
            )
            .extension(request.session().clone())
            .extension(transport::Deadline(request.deadline()));
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
                reason: format!("{e} (base URL {:?})", request.base_url()),
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
    use std::time::Duration;

    use auth::Identity;
    use tower::service_fn;

    use tower::Layer as _;

    use super::*;
    use crate::error::ErrorKind;
    use crate::request::{SecretRef, Selector, Stage};
    use crate::{Retry, RetryLayer, RetryPolicy, RetryReason, Stopped, WithBackoff as _};

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

        fn client(&self, retry: RetryPolicy) -> Retry<VaultClient<Script>> {
            RetryLayer::new(retry).layer(VaultClient::new(self.clone()))
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
            backoff: Backoff::none(),
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
            backoff: Backoff::none(),
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

    impl crate::BackoffHook for Recorder {
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
        let request = request(Duration::from_secs(60)).with_backoff(Backoff::new(recorder.clone()));
        let err = client.oneshot(request).await.unwrap_err();
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
    fn failing_signer(
        error: fn() -> auth::AuthError,
    ) -> (Retry<VaultClient<Boxed>>, Arc<Mutex<u32>>) {
        let calls = Arc::new(Mutex::new(0));
        let counter = calls.clone();
        let service =
            tower::util::BoxCloneSyncService::new(service_fn(move |_: Request<Bytes>| {
                *counter.lock().unwrap() += 1;
                async move { Err::<Response<Bytes>, BoxError>(Box::new(error())) }
            }));
        (
            RetryLayer::new(no_jitter()).layer(VaultClient::new(service)),
            calls,
        )
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
