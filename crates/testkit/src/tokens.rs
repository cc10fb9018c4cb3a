//! Kubernetes service-account tokens made to order: the genuine ones the kubelet or a
//! TokenRequest would hand out, and forgeries (another key, an unknown key id, no
//! signature, another audience or issuer, expired) for tests of token verification.

use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::crypto::JwtSigner;
use crate::seed::WorkloadRef;
use crate::state::{Principal, Shared, TokenKind, secs};
use crate::{Error, SERVICE_ACCOUNT_ISSUER};

/// Who signs a [`TokenSpec`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Signer {
    /// The emulator's current service-account issuer key (what `/openid/v1/jwks` publishes):
    /// a genuine token, which the proxymux accepts.
    #[default]
    Issuer,
    /// A fresh key, under the issuer key's `kid`: a forgery that names a known key.
    OtherKeySameKid,
    /// A fresh key with a `kid` of its own, which the issuer does not publish.
    OtherKey,
    /// No signature: the issuer key's `kid` in the header, `AAAA` as the signature.
    Unsigned,
}

/// A service-account token to mint with [`crate::EmulatorHandle::mint_service_account_token`].
/// [`TokenSpec::new`] is what `issue_service_account_token` returns: the issuer's
/// signature, its `iss`, the API server's default audience, one hour, bound to no pod.
#[derive(Clone, Debug)]
pub struct TokenSpec {
    /// Namespace (`kubernetes.io.namespace`).
    pub namespace: String,
    /// Service account (`kubernetes.io.serviceaccount.name`).
    pub service_account: String,
    /// The service account's uid; `None`: the emulator's for it.
    pub uid: Option<String>,
    /// The pod `(name, uid)` it is bound to.
    pub pod: Option<(String, String)>,
    /// `aud`.
    pub audiences: Vec<String>,
    /// `iss`.
    pub issuer: String,
    /// `iat` and `nbf`; `None`: the emulator's now.
    pub issued_at: Option<SystemTime>,
    /// `exp` is `issued_at` plus this.
    pub lifetime: Duration,
    /// Who signs it.
    pub signer: Signer,
}

impl TokenSpec {
    /// A genuine one-hour token of `namespace/service_account`, bound to no pod.
    pub fn new(namespace: &str, service_account: &str) -> Self {
        Self {
            namespace: namespace.into(),
            service_account: service_account.into(),
            uid: None,
            pod: None,
            audiences: vec![SERVICE_ACCOUNT_ISSUER.into()],
            issuer: SERVICE_ACCOUNT_ISSUER.into(),
            issued_at: None,
            lifetime: Duration::from_secs(3600),
            signer: Signer::Issuer,
        }
    }

    /// Bound to the pod `(name, uid)`.
    pub fn bound_to(mut self, name: &str, uid: &str) -> Self {
        self.pod = Some((name.into(), uid.into()));
        self
    }

    /// For these audiences.
    pub fn audiences(mut self, audiences: &[&str]) -> Self {
        self.audiences = audiences.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    /// With this `iss`.
    pub fn issuer(mut self, issuer: &str) -> Self {
        self.issuer = issuer.into();
        self
    }

    /// Claiming another service-account uid (a recreated service account).
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.into());
        self
    }

    /// Valid for `lifetime` from its issue.
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// Issued (and valid from) `at`: in the past for an expired token, in the future for one
    /// not valid yet.
    pub fn issued_at(mut self, at: SystemTime) -> Self {
        self.issued_at = Some(at);
        self
    }

    /// Signed by `signer`.
    pub fn signed_by(mut self, signer: Signer) -> Self {
        self.signer = signer;
        self
    }
}

/// Mints `spec`. Tokens the issuer signs now for the service account's own uid are
/// recorded, so the proxymux and the Kubernetes endpoint accept them while they are valid;
/// the others (forgeries, other times or uids) are not.
pub(crate) fn mint(shared: &Shared, spec: &TokenSpec) -> Result<String, Error> {
    let workload = WorkloadRef {
        namespace: spec.namespace.clone(),
        service_account: spec.service_account.clone(),
    };
    let principal = shared.workload_of(&workload).ok_or_else(|| {
        Error::NotFound(format!(
            "service account {}/{}",
            spec.namespace, spec.service_account
        ))
    })?;
    let Principal::Workload {
        service_account_uid,
        ..
    } = &principal
    else {
        return Err(Error::NotFound(format!(
            "service account {}/{}",
            spec.namespace, spec.service_account
        )));
    };
    let uid = spec
        .uid
        .clone()
        .unwrap_or_else(|| service_account_uid.clone());
    let mut kio = json!({
        "namespace": spec.namespace,
        "serviceaccount": {"name": spec.service_account, "uid": uid},
    });
    if let Some((pod, pod_uid)) = &spec.pod {
        kio["pod"] = json!({"name": pod, "uid": pod_uid});
    }
    let claims = json!({
        "aud": spec.audiences,
        "iss": spec.issuer,
        "sub": format!("system:serviceaccount:{}:{}", spec.namespace, spec.service_account),
        "kubernetes.io": kio,
    });
    let issued_at = spec.issued_at.unwrap_or_else(|| shared.now());
    if spec.signer == Signer::Issuer && spec.issued_at.is_none() && spec.uid.is_none() {
        return Ok(shared
            .issue_token(TokenKind::Kube, principal, claims, spec.lifetime, None)?
            .0);
    }
    let mut claims = claims;
    claims["iat"] = secs(issued_at).into();
    claims["nbf"] = secs(issued_at).into();
    claims["exp"] = secs(issued_at + spec.lifetime).into();
    claims["jti"] = crate::crypto::random_hex(16).into();
    let issuer = shared.issuer_key();
    match spec.signer {
        // A genuine signature over claims the emulator did not choose (another time or
        // uid): not recorded, so only a verifier that reads signatures accepts it.
        Signer::Issuer => issuer.sign(&claims),
        Signer::OtherKeySameKid => JwtSigner::generate()?.sign_as(issuer.kid(), &claims),
        Signer::OtherKey => JwtSigner::generate()?.sign(&claims),
        Signer::Unsigned => {
            let signed = issuer.sign(&claims)?;
            let input = signed.rsplit_once('.').map_or("", |(input, _)| input);
            Ok(format!("{input}.AAAA"))
        }
    }
}
