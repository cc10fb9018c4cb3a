//! The instance principal (spec 4): the leaf certificate and key from instance metadata,
//! federated for a session token bound to a fresh session key; one per process, refreshed
//! ahead of its expiry in the background (`ahead`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{Method, Request, StatusCode};
use zeroize::Zeroizing;

use super::ahead::{ATTEMPT_TIMEOUT, Refresh};
use super::{INSTANCE_RENEWAL_COOL_DOWN, Inner, fresh, now_of, refresh_at, serves_until};
use crate::error::{AuthError, Endpoint};
use crate::remote::{build, error_detail, send};
use crate::session::Invalidated;
use crate::signing::{BoxFuture, KeyId, SignatureProfile, SigningKey, sign_request};
use crate::{Credential, Identity, PrivateKey, jwt};
use regions::Region;

/// The instance's session token and key.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    key: SigningKey,
    exp: SystemTime,
    /// From when it is refreshed in the background; it serves on meanwhile.
    refresh_at: SystemTime,
    /// The tenancy and instance of the certificate that was federated.
    credential: Arc<Credential>,
    /// Set when OCI refused the token, so the next signing federates again.
    pub(crate) invalidated: Arc<AtomicBool>,
}

impl cache::CacheValue for Session {
    fn bytes(&self) -> usize {
        super::CREDENTIAL_BYTES
    }

    fn expires(&self) -> Option<SystemTime> {
        Some(self.exp)
    }
}

impl Session {
    /// Not refused, and expiring more than five minutes from now: it serves.
    fn valid(&self, now: SystemTime) -> bool {
        !self.invalidated.load(Ordering::Relaxed) && fresh(self.exp, now)
    }

    /// The same session: the same token.
    fn same(&self, other: &Session) -> bool {
        self.key.key_id().expose_secret() == other.key.key_id().expose_secret()
    }

    /// What it signs with (also the identity domain's token exchanges, when the instance
    /// principal authenticates them).
    pub(super) fn key(&self) -> &SigningKey {
        &self.key
    }
}

pub(super) async fn establish(
    inner: &Arc<Inner>,
    deadline: tokio::time::Instant,
) -> Result<super::Established, AuthError> {
    let region = region(inner, deadline).await?;
    let session = session(inner, deadline).await?;
    Ok(super::Established {
        region: Some(region.clone()),
        session: crate::Session::renewable(
            session.credential,
            session.key,
            Arc::new(Renewal(Arc::clone(inner))),
            Some(region.clone()),
        ),
    })
}

/// How an established instance session renews after OCI refuses its token in the
/// principal's own region: the node has one, federated again (single flight) unless
/// another request already did, at most once per [`INSTANCE_RENEWAL_COOL_DOWN`].
pub(super) struct Renewal(Arc<Inner>);

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("instance::Renewal")
    }
}

impl crate::session::Renew for Renewal {
    fn invalidate<'a>(&'a self, rejected: &'a KeyId) -> BoxFuture<'a, Invalidated> {
        Box::pin(invalidate(&self.0, rejected))
    }

    fn renew(
        &self,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'_, Result<Option<SigningKey>, AuthError>> {
        Box::pin(async move { Ok(Some(session(&self.0, deadline).await?.key)) })
    }

    fn count(&self, invalidated: &Invalidated) {
        self.0.count_renewal("instance", invalidated);
    }
}

/// OCI (or an identity domain) refused `rejected`: the node's instance session is dropped,
/// unless another request already did or it was renewed within the cool-down.
pub(super) async fn invalidate(inner: &Inner, rejected: &KeyId) -> Invalidated {
    // No session cached: a renewal dropped it and is federating (the cache's single
    // flight joins it), or it expired (then the renewal is the one any mount makes).
    let Some(session) = inner.instance.get(&()).await else {
        return Invalidated::Replaced;
    };
    if session.key.key_id().expose_secret() != rejected.expose_secret() {
        return Invalidated::Replaced;
    }
    let now = inner.now();
    // The check and the drop under one lock: of a burst of 401s for one token, exactly
    // one drops it and the others join its renewal.
    let mut renewed = super::lock(&inner.instance_renewed);
    if session.invalidated.load(Ordering::Relaxed) {
        return Invalidated::Replaced;
    }
    if let Some(ago) = renewed.and_then(|at| now.duration_since(at).ok())
        && ago < INSTANCE_RENEWAL_COOL_DOWN
    {
        tracing::debug!(
            ?ago,
            "instance session kept after a 401: renewed moments ago"
        );
        return Invalidated::CoolingDown {
            ago,
            cool_down: INSTANCE_RENEWAL_COOL_DOWN,
        };
    }
    *renewed = Some(now);
    session.invalidated.store(true, Ordering::Relaxed);
    tracing::debug!("instance session invalidated after a 401");
    Invalidated::Dropped
}

/// The cached session while it serves (a refresh ahead started once it is due), else the
/// refresh ahead in flight, else one federation (single flight).
pub(super) async fn session(
    inner: &Inner,
    deadline: tokio::time::Instant,
) -> Result<Session, AuthError> {
    let (session, lookup) = inner
        .instance
        .get_or_fetch(
            &(),
            deadline,
            |s| s.valid(inner.now()),
            |stale| async move {
                if let Some(session) = inner.instance_ahead.join(&()).await {
                    return Ok(session);
                }
                let op = super::op(&stale);
                inner
                    .counted("instance", op, federate(inner, deadline))
                    .await
            },
        )
        .await?;
    if lookup == cache::Lookup::Hit && inner.now() >= session.refresh_at {
        inner.instance_ahead.start(AheadRefresh {
            inner: inner.this.clone(),
            current: session.clone(),
        });
    }
    Ok(session)
}

/// The instance session's refresh ahead of its expiry: one federation.
struct AheadRefresh {
    inner: std::sync::Weak<Inner>,
    /// The session refreshed.
    current: Session,
}

impl Refresh for AheadRefresh {
    type Key = ();
    type Session = Session;

    fn key(&self) -> &() {
        &()
    }

    fn identity(&self) -> Identity {
        Identity::Instance
    }

    fn now(&self) -> SystemTime {
        now_of(&self.inner)
    }

    fn serves_until(&self) -> SystemTime {
        serves_until(self.current.exp)
    }

    async fn serves(&self) -> bool {
        let Some(inner) = self.inner.upgrade() else {
            return false;
        };
        let cached = inner.instance.get(&()).await;
        cached.is_some_and(|s| s.same(&self.current) && s.valid(inner.now()))
    }

    async fn attempt(&self) -> Result<Session, AuthError> {
        let inner = self
            .inner
            .upgrade()
            .ok_or(AuthError::Internal("the principals are gone"))?;
        let deadline = tokio::time::Instant::now() + ATTEMPT_TIMEOUT;
        inner
            .counted("instance", "ahead", federate(&inner, deadline))
            .await
    }

    async fn store(&self, session: &Session) {
        if let Some(inner) = self.inner.upgrade() {
            let current = &self.current;
            (inner.instance)
                .replace_if(&(), session.clone(), |s| s.same(current))
                .await;
        }
    }
}

/// The configured region, else the one instance metadata reports (asked once).
async fn region(inner: &Inner, deadline: tokio::time::Instant) -> Result<&Region, AuthError> {
    if let Some(region) = &inner.region {
        return Ok(region);
    }
    inner
        .instance_region
        .get_or_try_init(|| async {
            let text = metadata(inner, "instance/region", deadline).await?;
            let text =
                String::from_utf8(text.to_vec()).map_err(|_| AuthError::MalformedResponse {
                    endpoint: Endpoint::InstanceMetadata,
                    operation: "instance/region".into(),
                    reason: "the region is not utf-8".into(),
                })?;
            Ok(inner.regions.resolve(&text)?)
        })
        .await
}

/// `GET <base>/<path>` with `Authorization: Bearer Oracle` (spec 4.1).
async fn metadata(
    inner: &Inner,
    path: &str,
    deadline: tokio::time::Instant,
) -> Result<Zeroizing<Vec<u8>>, AuthError> {
    let base = inner.config.instance_metadata.trim_end_matches('/');
    let request = build(
        Request::builder()
            .method(Method::GET)
            .uri(format!("{base}/{path}"))
            .header(AUTHORIZATION, "Bearer Oracle"),
        bytes::Bytes::new(),
    )?;
    let response = send(
        &inner.http,
        request,
        deadline,
        Endpoint::InstanceMetadata,
        path,
    )
    .await?;
    if response.status() != StatusCode::OK {
        return Err(AuthError::Status {
            endpoint: Endpoint::InstanceMetadata,
            operation: path.to_owned(),
            status: response.status().as_u16(),
            detail: None,
        });
    }
    Ok(Zeroizing::new(response.into_body().to_vec()))
}

fn federation_url(inner: &Inner, region: &Region) -> String {
    match &inner.config.federation_endpoint {
        Some(url) if url.contains("://") => url.trim_end_matches('/').to_owned(),
        Some(url) => format!("https://{}", url.trim_end_matches('/')),
        None => federation_endpoint(region),
    }
}

/// `https://auth.<region>.<domain>` (spec 4.3); for a dotted region `https://auth.<region>`.
fn federation_endpoint(region: &Region) -> String {
    match region.domain() {
        Some(domain) => format!("https://auth.{region}.{domain}"),
        None => format!("https://auth.{region}"),
    }
}

/// One federation (spec 4.2 step 4, 4.4): cert, key, intermediate, a session key generated
/// ahead, `POST /v1/x509` signed with the leaf key. The key of a federation answered with an
/// error status goes back to the pool.
async fn federate(inner: &Inner, deadline: tokio::time::Instant) -> Result<Session, AuthError> {
    let region = region(inner, deadline).await?;
    let leaf = Leaf::read(inner, deadline).await?;
    let session = inner.session_keys.take().await?;
    let (token, exp, issued) = match x509(inner, region, &leaf, &session, deadline).await {
        Ok(answer) => answer,
        Err(error) => {
            inner.session_keys.give_back(session, &error);
            return Err(error);
        }
    };
    tracing::info!("federated the instance principal for a session token");
    Ok(Session {
        key: SigningKey::new(KeyId::security_token(&token), session),
        exp,
        refresh_at: refresh_at(issued, exp),
        credential: Arc::new(Credential::Instance {
            tenancy: leaf.tenancy,
            instance: leaf.instance,
        }),
        invalidated: Arc::new(AtomicBool::new(false)),
    })
}

/// The federation call for `session`'s public key: its session token, expiry and issue.
async fn x509(
    inner: &Inner,
    region: &Region,
    leaf: &Leaf,
    session: &PrivateKey,
    deadline: tokio::time::Instant,
) -> Result<(String, SystemTime, SystemTime), AuthError> {
    let mut body = serde_json::json!({
        "certificate": leaf.certificate,
        "publicKey": session.public_key_base64(),
        "fingerprintAlgorithm": "SHA256",
    });
    if !leaf.intermediate.is_empty() {
        body["intermediateCertificates"] = serde_json::json!([leaf.intermediate]);
    }
    let mut request = build(
        Request::builder()
            .method(Method::POST)
            .uri(format!("{}/v1/x509", federation_url(inner, region)))
            .header(CONTENT_TYPE, "application/json"),
        body.to_string(),
    )?;
    sign_request(
        &mut request,
        &Identity::Instance,
        &leaf.key,
        inner.now(),
        SignatureProfile::Federation,
    )?;
    let operation = "the x509 federation of the instance principal";
    let response = send(
        &inner.http,
        request,
        deadline,
        Endpoint::Federation,
        operation,
    )
    .await?;
    federation_token(&response, operation, inner.now())
}

/// The instance's leaf certificate and key from instance metadata (spec 4.2 step 4):
/// what federation sends and signs with.
struct Leaf {
    /// The federation signing key: the leaf key, as `{tenancy}/fed-x509-sha256/{fp}`.
    key: SigningKey,
    /// The leaf certificate's DER, Base64.
    certificate: String,
    /// The intermediate chain, Base64 (empty when instance metadata has none).
    intermediate: String,
    tenancy: String,
    instance: String,
}

impl Leaf {
    async fn read(inner: &Inner, deadline: tokio::time::Instant) -> Result<Self, AuthError> {
        let cert_pem = metadata(inner, "identity/cert.pem", deadline).await?;
        let key_pem = metadata(inner, "identity/key.pem", deadline).await?;
        let intermediate_pem = metadata(inner, "identity/intermediate.pem", deadline).await?;
        let leaf_key = tokio::task::spawn_blocking(move || PrivateKey::from_pem(&key_pem, None))
            .await
            .map_err(|_| AuthError::Internal("the key loading task failed"))?
            .map_err(|_| {
                AuthError::InstanceCertificate(
                    "the key from instance metadata is not an rsa private key",
                )
            })?;
        let certs = crate::key::pem_ders(&cert_pem)
            .map_err(|_| AuthError::InstanceCertificate("the certificate is not pem"))?;
        let der = certs
            .first()
            .ok_or(AuthError::InstanceCertificate("the certificate is not pem"))?;
        let tenancy = subject_value(der, "opc-tenant:").unwrap_or_default();
        let instance = subject_value(der, "opc-instance:").unwrap_or_default();
        let fingerprint =
            colon_hex(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der).as_ref());
        let intermediate = if intermediate_pem.iter().all(u8::is_ascii_whitespace) {
            String::new()
        } else {
            let chain = crate::key::pem_ders(&intermediate_pem).map_err(|_| {
                AuthError::InstanceCertificate("the intermediate certificate is not pem")
            })?;
            pem_base64(&chain)
        };
        Ok(Self {
            key: SigningKey::new(
                KeyId::new(format!("{tenancy}/fed-x509-sha256/{fingerprint}")),
                Arc::new(leaf_key),
            ),
            certificate: pem_base64(&certs),
            intermediate,
            tenancy,
            instance,
        })
    }
}

/// The session token of a federation answer, its expiry and when it was issued (its `iat`,
/// no later than `now`; `now` without one).
fn federation_token(
    response: &http::Response<bytes::Bytes>,
    operation: &str,
    now: SystemTime,
) -> Result<(String, SystemTime, SystemTime), AuthError> {
    if response.status() != StatusCode::OK {
        return Err(AuthError::Status {
            endpoint: Endpoint::Federation,
            operation: operation.to_owned(),
            status: response.status().as_u16(),
            detail: error_detail(response.body()),
        });
    }
    let malformed = |reason: &str| AuthError::MalformedResponse {
        endpoint: Endpoint::Federation,
        operation: operation.to_owned(),
        reason: reason.to_owned(),
    };
    let body = response.body();
    let object: serde_json::Map<String, serde_json::Value> =
        bounded::json::from_slice(body, &bounded::ParseBudget::new(body.len()))
            .map_err(|_| malformed("the body is not a json object"))?;
    let token = object
        .get("token")
        .and_then(|t| t.as_str())
        .ok_or_else(|| malformed("no token member"))?;
    let claims = jwt::claims(token).map_err(malformed)?;
    let exp = jwt::exp(&claims).map_err(malformed)?;
    let issued = jwt::iat(&claims)
        .map_err(malformed)?
        .map_or(now, |iat| iat.min(now));
    Ok((token.to_owned(), exp, issued))
}

/// The Base64 of a chain's DER blocks, concatenated into one string as the SDK sends them
/// (spec 4.4: several certificates are concatenated).
fn pem_base64(ders: &[zeroize::Zeroizing<Vec<u8>>]) -> String {
    ders.iter()
        .map(|der| STANDARD.encode(der.as_slice()))
        .collect()
}

fn colon_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// One DER TLV: tag, content, rest.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b))
    };
    if rest.len() < len {
        return None;
    }
    let (content, rest) = rest.split_at(len);
    Some((tag, content, rest))
}

/// The tenancy from the leaf certificate's subject: the first attribute value starting
/// with `opc-tenant:` (spec 4.2 step 3).
#[cfg(test)]
pub(super) fn tenancy(der: &[u8]) -> Option<String> {
    subject_value(der, "opc-tenant:")
}

/// The rest of the first subject attribute value of the certificate that starts with
/// `prefix` (`opc-tenant:`, `opc-instance:`).
fn subject_value(der: &[u8], prefix: &str) -> Option<String> {
    const SEQUENCE: u8 = 0x30;
    let (SEQUENCE, certificate, _) = tlv(der)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = tlv(certificate)? else {
        return None;
    };
    let mut fields = tbs;
    let mut index = 0;
    let mut subject = None;
    while let Some((tag, content, rest)) = tlv(fields) {
        fields = rest;
        // [0] version is optional and not counted.
        if tag == 0xa0 {
            continue;
        }
        // serial, signature, issuer, validity, subject
        if index == 4 {
            subject = Some(content);
            break;
        }
        index += 1;
    }
    let mut rdns = subject?;
    while let Some((_, set, rest)) = tlv(rdns) {
        rdns = rest;
        let mut attributes = set;
        while let Some((_, attribute, rest)) = tlv(attributes) {
            attributes = rest;
            let (_, _oid, value) = tlv(attribute)?;
            let (_, value, _) = tlv(value)?;
            if let Some(found) = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.strip_prefix(prefix))
            {
                return Some(found.to_owned());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_federation_endpoint_is_the_regions_auth_host() {
        let regions = regions::Regions::default();
        for (input, url) in [
            ("iad", "https://auth.us-ashburn-1.oraclecloud.com"),
            ("ltn", "https://auth.uk-gov-london-1.oraclegovcloud.uk"),
            (
                "eu-frankfurt-2",
                "https://auth.eu-frankfurt-2.oraclecloud.eu",
            ),
            ("region.example.com", "https://auth.region.example.com"),
        ] {
            let region = regions.resolve(input).unwrap();
            assert_eq!(federation_endpoint(&region), url, "{input}");
        }
    }

    #[test]
    fn truncated_der_yields_no_tenancy() {
        assert_eq!(tenancy(&[]), None);
        assert_eq!(tenancy(&[0x30, 0x82, 0xff]), None);
        assert_eq!(tenancy(&[0x30, 0x03, 0x30, 0x01]), None);
    }

    #[test]
    fn a_chain_is_sent_as_the_concatenated_base64_of_its_blocks() {
        let pem = b"-----BEGIN CERTIFICATE-----\nQUJD\nREVG\n-----END CERTIFICATE-----\n\
                    -----BEGIN CERTIFICATE-----\nR0g=\n-----END CERTIFICATE-----\n";
        let ders = crate::key::pem_ders(pem).unwrap();
        assert_eq!(ders.len(), 2);
        assert_eq!(pem_base64(&ders), "QUJDREVGR0g=");
        assert!(crate::key::pem_ders(b"not pem").is_err());
    }
}
