//! OCI HTTP request signing (spec section 1): the signing string, the `Authorization`
//! header, and a tower layer that signs every request with the key of the [`Session`] it
//! carries.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, DATE, HOST};
use http::{HeaderName, HeaderValue, Method, Request};
use secrecy::{ExposeSecret as _, SecretString};
use zeroize::Zeroizing;

use clock::SharedClock;

use crate::{AuthError, BoxError, Identity, PrivateKey, Session};

/// The `x-content-sha256` header name.
pub const X_CONTENT_SHA256: HeaderName = HeaderName::from_static("x-content-sha256");

/// Base64 of the SHA-256 of an empty body, which every bodiless POST carries.
pub const EMPTY_BODY_SHA256: &str = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=";

/// The prefix OCI puts before a security token in a key id.
const SECURITY_TOKEN_PREFIX: &str = "ST$";

/// The last second httpdate can format (9999-12-31T23:59:59Z).
const LAST_HTTP_DATE: u64 = 253_402_300_799;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Which headers a signature covers (spec 1.1).
///
/// The layer uses [`SignatureProfile::Standard`] unless the request's extensions hold a
/// different profile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SignatureProfile {
    /// Every OCI API call: `date (request-target) host`, plus the body headers for POST,
    /// PUT and PATCH.
    #[default]
    Standard,
    /// The x509 federation call of the instance principal (spec 4.4): as standard but
    /// without `host`.
    Federation,
}

impl SignatureProfile {
    /// The value of `headers=` for a request with this method.
    pub fn signed_headers(self, method: &Method) -> &'static str {
        match (self, signs_body(method)) {
            (Self::Standard, false) => "date (request-target) host",
            (Self::Standard, true) => {
                "date (request-target) host content-length content-type x-content-sha256"
            }
            (Self::Federation, false) => "date (request-target)",
            (Self::Federation, true) => {
                "date (request-target) content-length content-type x-content-sha256"
            }
        }
    }
}

/// Whether OCI signs the body headers for this method: only POST, PUT and PATCH.
fn signs_body(method: &Method) -> bool {
    *method == Method::POST || *method == Method::PUT || *method == Method::PATCH
}

/// The `keyId` of an OCI signature (spec 1.4).
///
/// A key id of the form `ST$<token>` carries a bearer security token and is a secret: it
/// is held in a zeroizing string and `Debug` shows only `ST$<redacted>`. Other key ids
/// (`tenancy/user/fingerprint`, `tenancy/fed-x509/...`) name public things and are shown,
/// which helps when OCI answers 401.
#[derive(Clone)]
pub struct KeyId(SecretString);

impl KeyId {
    /// A key id used verbatim, e.g. `ocid1.tenancy.../ocid1.user.../12:bf:...`.
    pub fn new(key_id: impl Into<String>) -> Self {
        Self(SecretString::from(key_id.into()))
    }

    /// The key id for a security token: `ST$` followed by the token.
    pub fn security_token(token: &str) -> Self {
        let mut key_id = Zeroizing::new(String::with_capacity(token.len() + 3));
        key_id.push_str(SECURITY_TOKEN_PREFIX);
        key_id.push_str(token);
        Self(SecretString::from(key_id.as_str()))
    }

    /// Whether this key id carries a security token.
    pub fn is_security_token(&self) -> bool {
        self.0.expose_secret().starts_with(SECURITY_TOKEN_PREFIX)
    }

    /// The key id as it goes on the wire. Do not log it: it may hold a security token.
    pub fn expose_secret(&self) -> &str {
        self.0.expose_secret()
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_security_token() {
            f.write_str("KeyId(\"ST$<redacted>\")")
        } else {
            f.debug_tuple("KeyId")
                .field(&self.0.expose_secret())
                .finish()
        }
    }
}

/// What a request is signed with: the key id OCI resolves and the matching private key.
#[derive(Clone, Debug)]
pub struct SigningKey {
    key_id: KeyId,
    key: Arc<PrivateKey>,
    rejection_hint: Option<Arc<str>>,
}

impl SigningKey {
    /// Pairs a key id with its private key.
    pub fn new(key_id: KeyId, key: Arc<PrivateKey>) -> Self {
        Self {
            key_id,
            key,
            rejection_hint: None,
        }
    }

    /// Adds a likely cause to report if OCI refuses this key (e.g. a configured
    /// fingerprint that differs from the key's). It must not contain secrets.
    pub fn with_rejection_hint(mut self, hint: impl Into<Arc<str>>) -> Self {
        self.rejection_hint = Some(hint.into());
        self
    }

    /// The hint set by [`SigningKey::with_rejection_hint`].
    pub fn rejection_hint(&self) -> Option<&str> {
        self.rejection_hint.as_deref()
    }

    /// The key id.
    pub fn key_id(&self) -> &KeyId {
        &self.key_id
    }

    /// The private key.
    pub fn key(&self) -> &Arc<PrivateKey> {
        &self.key
    }
}

/// What the signing layer needs to see of a response: whether OCI refused the
/// credential (HTTP 401), and its error code for the message.
pub trait SignedResponse {
    /// Whether the response is a 401.
    fn is_unauthorized(&self) -> bool;
    /// OCI's error `code`, if the body says.
    fn error_code(&self) -> Option<String> {
        None
    }
}

impl SignedResponse for http::Response<Bytes> {
    fn is_unauthorized(&self) -> bool {
        self.status() == http::StatusCode::UNAUTHORIZED
    }

    fn error_code(&self) -> Option<String> {
        crate::remote::error_detail(self.body())
    }
}

/// The text that gets signed, with the list of header names it covers.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningString {
    headers: &'static str,
    bytes: Vec<u8>,
}

impl SigningString {
    /// The space-separated header names, the value of `headers=`.
    pub fn headers(&self) -> &'static str {
        self.headers
    }

    /// The bytes to sign: `name: value` lines joined by `\n`, no trailing newline.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for SigningString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Dates, paths, hosts and body hashes: nothing secret.
        f.debug_struct("SigningString")
            .field("headers", &self.headers)
            .field("text", &String::from_utf8_lossy(&self.bytes))
            .finish()
    }
}

/// Sets the headers a signature needs: `date` (always, fresh, like the SDK on every
/// attempt) and, for POST/PUT/PATCH, `content-length` and `x-content-sha256` computed from
/// the body and `content-type: application/json` unless one is already set.
///
/// `host` is not added: HTTP/1.1 clients derive it from the URI and HTTP/2 sends the
/// authority instead, and [`signing_string`] signs that same authority.
pub fn prepare_request(request: &mut Request<Bytes>, date: SystemTime) {
    // httpdate panics outside 1970..=9999; a clock that far off is a bug, not a reason to
    // take the process down.
    let date = date.clamp(UNIX_EPOCH, UNIX_EPOCH + Duration::from_secs(LAST_HTTP_DATE));
    if let Ok(date) = HeaderValue::from_str(&httpdate::fmt_http_date(date)) {
        request.headers_mut().insert(DATE, date);
    }
    if !signs_body(request.method()) {
        return;
    }
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, request.body());
    let hash = STANDARD.encode(digest.as_ref());
    let length = HeaderValue::from(request.body().len());
    let headers = request.headers_mut();
    headers.insert(CONTENT_LENGTH, length);
    // Base64 is always a valid header value.
    if let Ok(hash) = HeaderValue::from_str(&hash) {
        headers.insert(X_CONTENT_SHA256, hash);
    }
    headers
        .entry(CONTENT_TYPE)
        .or_insert(HeaderValue::from_static("application/json"));
}

/// Builds the signing string of a prepared request (spec 1.2).
///
/// `(request-target)` is the lower-case method and the path and query exactly as the URI
/// holds them (so exactly as they go on the request line); `host` is the `Host` header if
/// set, else the URI authority without a default port. A header named in the list but
/// absent from the request is signed with an empty value, as the Go SDK does.
pub fn signing_string<B>(
    request: &Request<B>,
    profile: SignatureProfile,
) -> Result<SigningString, AuthError> {
    let headers = profile.signed_headers(request.method());
    let mut bytes = Vec::with_capacity(256);
    for (i, name) in headers.split(' ').enumerate() {
        if i > 0 {
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(b": ");
        match name {
            "(request-target)" => {
                bytes.extend_from_slice(request.method().as_str().to_ascii_lowercase().as_bytes());
                bytes.push(b' ');
                let target = request
                    .uri()
                    .path_and_query()
                    .map_or("/", |path_and_query| path_and_query.as_str());
                bytes.extend_from_slice(target.as_bytes());
            }
            "host" => bytes.extend_from_slice(&host(request)?),
            other => {
                if let Some(value) = request.headers().get(other) {
                    bytes.extend_from_slice(value.as_bytes());
                }
            }
        }
    }
    Ok(SigningString { headers, bytes })
}

/// The value of `host` in the signing string.
fn host<B>(request: &Request<B>) -> Result<Bytes, AuthError> {
    if let Some(host) = request.headers().get(HOST) {
        return Ok(Bytes::copy_from_slice(host.as_bytes()));
    }
    let uri = request.uri();
    let host = uri.host().ok_or(AuthError::MissingHost)?;
    let default_port = match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    };
    Ok(match uri.port_u16() {
        Some(port) if Some(port) != default_port => Bytes::from(format!("{host}:{port}")),
        _ => Bytes::copy_from_slice(host.as_bytes()),
    })
}

/// The `Authorization` header value (spec 1.3), in the SDK's exact layout:
/// `Signature version="1",headers="...",keyId="...",algorithm="rsa-sha256",signature="..."`.
///
/// It contains the key id, so it is returned in a zeroizing string.
pub fn authorization(key_id: &KeyId, headers: &str, signature: &[u8]) -> Zeroizing<String> {
    let signature = STANDARD.encode(signature);
    let key_id = key_id.expose_secret();
    let mut value = Zeroizing::new(String::with_capacity(
        key_id.len() + headers.len() + signature.len() + 80,
    ));
    value.push_str("Signature version=\"1\",headers=\"");
    value.push_str(headers);
    value.push_str("\",keyId=\"");
    value.push_str(key_id);
    value.push_str("\",algorithm=\"rsa-sha256\",signature=\"");
    value.push_str(&signature);
    value.push('"');
    value
}

/// Signs `request` in place: [`prepare_request`], [`signing_string`], RSA-SHA256, and
/// the `Authorization` header, marked sensitive so HTTP/2 never indexes it and `Debug`
/// of the header map hides it.
///
/// `identity` only names the request in errors.
pub fn sign_request(
    request: &mut Request<Bytes>,
    identity: &Identity,
    key: &SigningKey,
    date: SystemTime,
    profile: SignatureProfile,
) -> Result<(), AuthError> {
    prepare_request(request, date);
    let to_sign = signing_string(request, profile)?;
    let signature = key
        .key()
        .sign_pkcs1_sha256(to_sign.as_bytes())
        .map_err(AuthError::Sign)?;
    let value = authorization(key.key_id(), to_sign.headers(), &signature);
    let mut value = HeaderValue::from_str(&value).map_err(|_| AuthError::InvalidKeyId {
        identity: identity.clone(),
    })?;
    value.set_sensitive(true);
    request.headers_mut().insert(AUTHORIZATION, value);
    Ok(())
}

/// A layer that signs every request with the key of the [`Session`] in its extensions.
///
/// Requests are `http::Request<bytes::Bytes>`: OCI requests and bodies are small, and the
/// body has to be hashed before it is sent, so it is buffered anyway. Put the transport's
/// body conversion (e.g. to `http_body_util::Full`) below this layer and any retry layer
/// above it, so each attempt gets a fresh `date` like the SDK's.
///
/// Each request must carry its [`Session`] in its extensions; it may also carry a
/// [`SignatureProfile`] (default: standard) and a [`transport::Deadline`], within which a
/// security token OCI refuses (HTTP 401) is renewed once through the session, unless the
/// session keeps it ([`crate::Invalidated`]: a 401 from a region other than the principal's
/// own, or within the instance principal's cool-down), and then the request fails. Errors
/// are boxed, as with other tower layers: this layer's own are [`AuthError`]; the inner
/// service's pass through.
#[derive(Clone, Debug)]
pub struct SigningLayer {
    clock: SharedClock,
}

impl SigningLayer {
    /// A layer signing with dates from `clock`.
    pub fn new(clock: SharedClock) -> Self {
        Self { clock }
    }
}

impl<S> tower::Layer<S> for SigningLayer {
    type Service = Signing<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Signing {
            inner,
            clock: Arc::clone(&self.clock),
        }
    }
}

/// The service [`SigningLayer`] builds: signs, then calls the inner service.
#[derive(Clone, Debug)]
pub struct Signing<S> {
    inner: S,
    clock: SharedClock,
}

impl<S> tower::Service<Request<Bytes>> for Signing<S>
where
    S: tower::Service<Request<Bytes>> + Clone + Send + 'static,
    S::Response: SignedResponse + Send,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        // The service that was polled ready goes into the future; a clone stays behind
        // to be polled for the next request (tower's usual pattern for async work
        // before the inner call).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let clock = Arc::clone(&self.clock);
        Box::pin(async move {
            let session = request
                .extensions()
                .get::<Session>()
                .cloned()
                .ok_or(AuthError::MissingSession)?;
            let identity = session.identity();
            let profile = request
                .extensions()
                .get::<SignatureProfile>()
                .copied()
                .unwrap_or_default();
            let deadline = request
                .extensions()
                .get::<transport::Deadline>()
                .map(|d| d.0);
            // Kept for a retry: a request is consumed by the call.
            let retry = copy_request(&request);
            let key = session.key().clone();
            let response =
                sign_and_call(&mut inner, request, &identity, &key, &clock, profile).await?;
            if !response.is_unauthorized() {
                return Ok(response);
            }
            let refused = |key: &SigningKey, response: &S::Response| AuthError::Unauthorized {
                identity: identity.clone(),
                code: response.error_code(),
                hint: key.rejection_hint().map(str::to_owned),
            };
            // The session decides what a 401 does to the credential it shares with other
            // mounts: nothing when the request went to another region than the principal's
            // own, or when the principal renewed it moments ago (then the request fails).
            let invalidated = session.invalidate(key.key_id()).await;
            if let Some(kept) = invalidated.refusal(&identity, response.error_code()) {
                return Err(kept.into());
            }
            // A security token may have been revoked or expired early: retry once with a
            // fresh one, within the request's deadline. A user key is not retried (the
            // Secret is read again by the next mount), nor a request without a deadline.
            let Some(deadline) = deadline.filter(|d| tokio::time::Instant::now() < *d) else {
                return Err(refused(&key, &response).into());
            };
            if !key.key_id().is_security_token() {
                return Err(refused(&key, &response).into());
            }
            let Some(fresh) = session.renew(deadline).await? else {
                return Err(refused(&key, &response).into());
            };
            tracing::debug!(%identity, "retrying once with a fresh security token after a 401");
            tower::ServiceExt::ready(&mut inner)
                .await
                .map_err(Into::<BoxError>::into)?;
            let response =
                sign_and_call(&mut inner, retry, &identity, &fresh, &clock, profile).await?;
            if response.is_unauthorized() {
                // Refused right after a renewal: within the cool-down, the renewed key is
                // kept and the error says it was renewed moments ago.
                let invalidated = session.invalidate(fresh.key_id()).await;
                return Err(invalidated
                    .refusal(&identity, response.error_code())
                    .unwrap_or_else(|| refused(&fresh, &response))
                    .into());
            }
            Ok(response)
        })
    }
}

/// Signs with `key` and a fresh date, then calls `inner`.
async fn sign_and_call<S>(
    inner: &mut S,
    mut request: Request<Bytes>,
    identity: &Identity,
    key: &SigningKey,
    clock: &SharedClock,
    profile: SignatureProfile,
) -> Result<S::Response, BoxError>
where
    S: tower::Service<Request<Bytes>>,
    S::Error: Into<BoxError>,
{
    // The date is taken after the key is obtained, which may have taken a token
    // exchange, so that it is as fresh as possible when OCI checks the skew.
    sign_request(&mut request, identity, key, clock.now(), profile)?;
    tracing::trace!(
        %identity,
        key_id = ?key.key_id(),
        method = %request.method(),
        "signed OCI request"
    );
    inner.call(request).await.map_err(Into::into)
}

/// A copy of a request (method, URI, version, headers, body, extensions).
fn copy_request(request: &Request<Bytes>) -> Request<Bytes> {
    let mut copy = Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, uri: &str) -> Request<Bytes> {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(Bytes::new())
            .unwrap()
    }

    #[test]
    fn host_drops_default_port_and_keeps_others() {
        let cases = [
            ("https://example.com:443/a", "example.com"),
            ("http://example.com:80/a", "example.com"),
            ("https://127.0.0.1:8443/a", "127.0.0.1:8443"),
            ("http://example.com:443/a", "example.com:443"),
            ("https://[::1]:8443/a", "[::1]:8443"),
        ];
        for (uri, expected) in cases {
            let host = host(&request(Method::GET, uri)).unwrap();
            assert_eq!(host, expected.as_bytes(), "{uri}");
        }
    }

    #[test]
    fn relative_uri_without_host_header_is_an_error() {
        let err = signing_string(&request(Method::GET, "/a"), SignatureProfile::Standard);
        assert!(matches!(err, Err(AuthError::MissingHost)));
        // The federation profile does not sign the host, so it does not need one.
        assert!(signing_string(&request(Method::GET, "/a"), SignatureProfile::Federation).is_ok());
    }

    #[test]
    fn methods_other_than_post_put_patch_sign_no_body_headers() {
        for method in [Method::GET, Method::HEAD, Method::DELETE, Method::OPTIONS] {
            assert_eq!(
                SignatureProfile::Standard.signed_headers(&method),
                "date (request-target) host"
            );
        }
        for method in [Method::POST, Method::PUT, Method::PATCH] {
            assert!(
                SignatureProfile::Standard
                    .signed_headers(&method)
                    .ends_with("content-length content-type x-content-sha256")
            );
        }
    }

    #[test]
    fn prepare_keeps_an_existing_content_type_and_fixes_the_length() {
        let mut req = Request::builder()
            .method(Method::PUT)
            .uri("https://h/x")
            .header(CONTENT_TYPE, "text/plain")
            .header(CONTENT_LENGTH, "99")
            .body(Bytes::from_static(b"abc"))
            .unwrap();
        prepare_request(&mut req, SystemTime::UNIX_EPOCH);
        assert_eq!(req.headers()[CONTENT_TYPE], "text/plain");
        assert_eq!(req.headers()[CONTENT_LENGTH], "3");
        assert_eq!(req.headers()[DATE], "Thu, 01 Jan 1970 00:00:00 GMT");
    }

    #[test]
    fn security_token_key_ids_are_redacted() {
        let key_id = KeyId::security_token("eyJhbGciOi.secret.sig");
        assert!(key_id.is_security_token());
        assert_eq!(key_id.expose_secret(), "ST$eyJhbGciOi.secret.sig");
        assert_eq!(format!("{key_id:?}"), "KeyId(\"ST$<redacted>\")");
        let user = KeyId::new("t/u/fp");
        assert_eq!(format!("{user:?}"), "KeyId(\"t/u/fp\")");
    }
}
