//! The OCI Certificates retrieval API (`docs/oci-certificates.md`): GetCertificateBundle,
//! GetCertificateAuthorityBundle and GetCaBundle, with the same client, signing, retries and
//! error handling as the Secrets API.

use std::fmt;

use auth::Identity;
use serde::{Deserialize, Deserializer};
use tokio::time::Instant;
use zeroize::Zeroizing;

use crate::Backoff;
use crate::bundle::{MalformedBundle, SecretContent};
use crate::request::{Selector, encode_path_segment};

/// The API version prefix of every Certificates path.
const API_PREFIX: &str = "/20210224";

/// What to read from the Certificates service.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CertificateRef {
    /// A certificate (`ocid1.certificate.…`): GetCertificateBundle.
    Certificate(String),
    /// A certificate authority (`ocid1.certificateauthority.…`): its certificate and chain.
    CertificateAuthority(String),
    /// A CA bundle (`ocid1.cabundle.…`): GetCaBundle, unversioned.
    CaBundle(String),
}

impl CertificateRef {
    /// The OCID.
    pub fn id(&self) -> &str {
        match self {
            CertificateRef::Certificate(id)
            | CertificateRef::CertificateAuthority(id)
            | CertificateRef::CaBundle(id) => id,
        }
    }
}

/// One certificate bundle to fetch, as whom, from where, by when.
#[derive(Clone, Debug)]
pub struct CertificateRequest {
    /// The Certificates endpoint, e.g. `https://certificates.us-ashburn-1.oci.oraclecloud.com`.
    pub base_url: String,
    /// The established credential it is fetched with (as [`crate::SecretRequest::session`]).
    pub session: auth::Session,
    /// The certificate, CA or CA bundle.
    pub target: CertificateRef,
    /// The version (not sent for CA bundles, which have none).
    pub selector: Selector,
    /// Ask for the private key (`CERTIFICATE_CONTENT_WITH_PRIVATE_KEY`); certificates only.
    pub private_key: bool,
    /// Every attempt ends by then.
    pub deadline: Instant,
    /// Told of the sleeps between attempts (as [`crate::SecretRequest::backoff`]).
    pub backoff: Backoff,
}

impl CertificateRequest {
    /// Who the request is made as.
    pub fn identity(&self) -> Identity {
        self.session.identity()
    }

    /// The bundle type asked for, as sent.
    pub fn bundle_type(&self) -> &'static str {
        if self.private_key {
            "CERTIFICATE_CONTENT_WITH_PRIVATE_KEY"
        } else {
            "CERTIFICATE_CONTENT_PUBLIC_ONLY"
        }
    }

    pub(crate) fn describe(&self) -> String {
        match &self.target {
            CertificateRef::Certificate(id) => format!("certificate {id} ({})", self.selector),
            CertificateRef::CertificateAuthority(id) => {
                format!("certificate authority {id} ({})", self.selector)
            }
            CertificateRef::CaBundle(id) => format!("CA bundle {id}"),
        }
    }

    /// `GET` and the absolute URI: the version parameter and, for certificates, the bundle
    /// type, keys in sorted order.
    pub(crate) fn method_and_uri(&self) -> (http::Method, String) {
        let base = self.base_url.trim_end_matches('/');
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        let (collection, version_name_key) = match &self.target {
            CertificateRef::Certificate(_) => ("certificateBundles", "certificateVersionName"),
            CertificateRef::CertificateAuthority(_) => (
                "certificateAuthorityBundles",
                "certificateAuthorityVersionName",
            ),
            CertificateRef::CaBundle(_) => ("caBundles", ""),
        };
        if !matches!(self.target, CertificateRef::CaBundle(_)) {
            // Sorted: certificate(Authority)BundleType, ...VersionName, stage, versionNumber.
            if matches!(self.target, CertificateRef::Certificate(_)) {
                query.append_pair("certificateBundleType", self.bundle_type());
            }
            match &self.selector {
                Selector::VersionName(name) => {
                    query.append_pair(version_name_key, name);
                }
                Selector::Stage(stage) => {
                    query.append_pair("stage", stage.as_str());
                }
                Selector::VersionNumber(n) => {
                    query.append_pair("versionNumber", &n.to_string());
                }
            }
        }
        let query = query.finish();
        let path = format!(
            "{API_PREFIX}/{collection}/{}",
            encode_path_segment(self.target.id())
        );
        let uri = if query.is_empty() {
            format!("{base}{path}")
        } else {
            format!("{base}{path}?{query}")
        };
        (http::Method::GET, uri)
    }
}

/// A certificate, CA or CA bundle as OCI returned it. The key and its passphrase are
/// redacted in `Debug` and wiped on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct CertificateBundle {
    /// The OCID.
    pub id: String,
    /// The certificate's (CA's, bundle's) name.
    pub name: String,
    /// The version number (`None` for CA bundles).
    pub version_number: Option<u64>,
    /// The version name.
    pub version_name: Option<String>,
    /// The stages this version holds, as OCI spells them.
    pub stages: Vec<String>,
    /// The leaf (or the CA's own certificate); for a CA bundle, every certificate of it.
    pub certificate_pem: String,
    /// The issuing chain.
    pub chain_pem: Option<String>,
    /// The private key PEM (with `CERTIFICATE_CONTENT_WITH_PRIVATE_KEY`).
    pub private_key_pem: Option<SecretContent>,
    /// The key's passphrase, when OCI returns one.
    pub private_key_passphrase: Option<SecretContent>,
    /// `revocationStatus.revocationReason` when this version is revoked.
    pub revoked: Option<String>,
    /// `certificateBundleType` as returned (certificates only).
    pub bundle_type: Option<String>,
    /// OCI's `opc-request-id` of the successful attempt.
    pub opc_request_id: Option<String>,
}

impl fmt::Debug for CertificateBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateBundle")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("version_number", &self.version_number)
            .field("stages", &self.stages)
            .field(
                "private_key",
                &self.private_key_pem.as_ref().map(|_| "<redacted>"),
            )
            .field("revoked", &self.revoked)
            .field("opc_request_id", &self.opc_request_id)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    // GetCertificateBundle / GetCertificateAuthorityBundle / GetCaBundle spellings.
    certificate_id: Option<String>,
    certificate_authority_id: Option<String>,
    id: Option<String>,
    certificate_name: Option<String>,
    certificate_authority_name: Option<String>,
    name: Option<String>,
    version_number: Option<i64>,
    version_name: Option<String>,
    #[serde(default)]
    stages: Vec<String>,
    certificate_pem: Option<String>,
    cert_chain_pem: Option<String>,
    ca_bundle_pem: Option<String>,
    #[serde(default, deserialize_with = "secret")]
    private_key_pem: Option<Zeroizing<String>>,
    #[serde(default, deserialize_with = "secret")]
    private_key_pem_passphrase: Option<Zeroizing<String>>,
    revocation_status: Option<RawRevocation>,
    certificate_bundle_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRevocation {
    revocation_reason: Option<String>,
}

fn secret<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Zeroizing<String>>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(Zeroizing::new))
}

/// Parses a Certificates answer of the kind `target` asked for.
pub(crate) fn parse(
    target: &CertificateRef,
    body: &[u8],
    opc_request_id: Option<String>,
) -> Result<CertificateBundle, MalformedBundle> {
    let raw: Raw = crate::bundle::from_json(body)?;
    let missing = |field: &'static str| MalformedBundle::MissingField(field);
    let (id, name, certificate_pem) = match target {
        CertificateRef::Certificate(_) => (
            raw.certificate_id.ok_or(missing("certificateId"))?,
            raw.certificate_name.unwrap_or_default(),
            raw.certificate_pem.ok_or(missing("certificatePem"))?,
        ),
        CertificateRef::CertificateAuthority(_) => (
            raw.certificate_authority_id
                .ok_or(missing("certificateAuthorityId"))?,
            raw.certificate_authority_name.unwrap_or_default(),
            raw.certificate_pem.ok_or(missing("certificatePem"))?,
        ),
        CertificateRef::CaBundle(_) => (
            raw.id.ok_or(missing("id"))?,
            raw.name.unwrap_or_default(),
            raw.ca_bundle_pem.ok_or(missing("caBundlePem"))?,
        ),
    };
    let version_number = match (target, raw.version_number) {
        (CertificateRef::CaBundle(_), _) => None,
        (_, None) => return Err(MalformedBundle::MissingVersionNumber),
        (_, Some(n)) if n < 1 => return Err(MalformedBundle::InvalidVersionNumber(n)),
        (_, Some(n)) => Some(n.unsigned_abs()),
    };
    let content = |s: Zeroizing<String>| SecretContent::new(Zeroizing::new(s.as_bytes().to_vec()));
    Ok(CertificateBundle {
        id,
        name,
        version_number,
        version_name: raw.version_name,
        stages: raw.stages,
        certificate_pem,
        chain_pem: raw.cert_chain_pem.filter(|c| !c.trim().is_empty()),
        private_key_pem: raw.private_key_pem.filter(|k| !k.is_empty()).map(content),
        private_key_passphrase: raw
            .private_key_pem_passphrase
            .filter(|p| !p.is_empty())
            .map(content),
        revoked: raw.revocation_status.map(|r| {
            r.revocation_reason
                .unwrap_or_else(|| "UNSPECIFIED".to_owned())
        }),
        bundle_type: raw.certificate_bundle_type,
        opc_request_id,
    })
}

impl cache::CacheValue for CertificateBundle {
    fn bytes(&self) -> usize {
        self.certificate_pem.len()
            + self.chain_pem.as_ref().map_or(0, String::len)
            + self.private_key_pem.as_ref().map_or(0, SecretContent::len)
            + self.id.len()
            + self.name.len()
            + 64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Call, Stage, Subject};

    fn request(
        target: CertificateRef,
        selector: Selector,
        private_key: bool,
    ) -> CertificateRequest {
        CertificateRequest {
            base_url: "https://certificates.us-ashburn-1.oci.oraclecloud.com/".into(),
            session: auth::Session::for_tests(auth::Credential::Instance {
                tenancy: "ocid1.tenancy.oc1..t".into(),
                instance: "ocid1.instance.oc1..i".into(),
            }),
            target,
            selector,
            private_key,
            deadline: Instant::now(),
            backoff: Backoff::none(),
        }
    }

    #[test]
    fn requests_are_sent_as_the_sdk_documents_them() {
        let cert = CertificateRef::Certificate("ocid1.certificate.oc1..c".into());
        let cases = [
            (
                request(cert.clone(), Selector::Stage(Stage::Current), false),
                "/20210224/certificateBundles/ocid1.certificate.oc1..c?certificateBundleType=CERTIFICATE_CONTENT_PUBLIC_ONLY&stage=CURRENT",
            ),
            (
                request(cert.clone(), Selector::VersionNumber(3), true),
                "/20210224/certificateBundles/ocid1.certificate.oc1..c?certificateBundleType=CERTIFICATE_CONTENT_WITH_PRIVATE_KEY&versionNumber=3",
            ),
            (
                request(cert, Selector::VersionName("blue green".into()), false),
                "/20210224/certificateBundles/ocid1.certificate.oc1..c?certificateBundleType=CERTIFICATE_CONTENT_PUBLIC_ONLY&certificateVersionName=blue+green",
            ),
            (
                request(
                    CertificateRef::CertificateAuthority(
                        "ocid1.certificateauthority.oc1..a".into(),
                    ),
                    Selector::VersionName("v2".into()),
                    false,
                ),
                "/20210224/certificateAuthorityBundles/ocid1.certificateauthority.oc1..a?certificateAuthorityVersionName=v2",
            ),
            (
                request(
                    CertificateRef::CaBundle("ocid1.cabundle.oc1..b".into()),
                    Selector::Stage(Stage::Current),
                    true,
                ),
                "/20210224/caBundles/ocid1.cabundle.oc1..b",
            ),
        ];
        let grants: Vec<_> = cases.iter().map(|(r, _)| r.grant()).collect();
        assert_eq!(
            grants,
            [
                Subject::CERTIFICATES_GRANT,
                Subject::CERTIFICATES_GRANT,
                Subject::CERTIFICATES_GRANT,
                Subject::CA_GRANT,
                Subject::CA_BUNDLE_GRANT,
            ],
            "a 404 names the resource type OCI's policy reference gives each call"
        );
        for (request, path) in cases {
            let (method, uri) = request.method_and_uri();
            assert_eq!(method, http::Method::GET);
            assert_eq!(
                uri,
                format!("https://certificates.us-ashburn-1.oci.oraclecloud.com{path}")
            );
        }
        let odd = request(
            CertificateRef::Certificate("../secretbundles/x?y".into()),
            Selector::default(),
            false,
        );
        assert!(
            odd.method_and_uri()
                .1
                .contains("/certificateBundles/..%2Fsecretbundles%2Fx%3Fy?")
        );
    }

    #[test]
    fn answers_parse_with_their_keys_redacted() {
        let cert = CertificateRef::Certificate("ocid1.certificate.oc1..c".into());
        let body = br#"{"certificateBundleType":"CERTIFICATE_CONTENT_WITH_PRIVATE_KEY","certificateId":"ocid1.certificate.oc1..c","certificateName":"web","versionNumber":4,"stages":["CURRENT","LATEST"],"certificatePem":"LEAF","certChainPem":"CHAIN","privateKeyPem":"-----BEGIN PRIVATE KEY-----secret","privateKeyPemPassphrase":"hunter2","validity":{"timeOfValidityNotBefore":"2026-01-01T00:00:00Z","timeOfValidityNotAfter":"2027-01-01T00:00:00Z"}}"#;
        let bundle = parse(&cert, body, Some("rid".into())).unwrap();
        assert_eq!(bundle.id, "ocid1.certificate.oc1..c");
        assert_eq!(bundle.version_number, Some(4));
        assert_eq!(bundle.chain_pem.as_deref(), Some("CHAIN"));
        assert_eq!(
            bundle.private_key_passphrase.as_ref().unwrap().expose(),
            b"hunter2"
        );
        assert_eq!(bundle.revoked, None);
        let debug = format!("{bundle:?}");
        assert!(
            !debug.contains("secret") && !debug.contains("hunter2"),
            "{debug}"
        );

        let revoked = br#"{"certificateId":"c","versionNumber":2,"certificatePem":"LEAF","revocationStatus":{"timeRevoked":"2026-06-01T00:00:00Z","revocationReason":"KEY_COMPROMISE"}}"#;
        assert_eq!(
            parse(&cert, revoked, None).unwrap().revoked.as_deref(),
            Some("KEY_COMPROMISE")
        );
        let ca_bundle = CertificateRef::CaBundle("b".into());
        let b = parse(
            &ca_bundle,
            br#"{"id":"b","name":"roots","caBundlePem":"PEMS"}"#,
            None,
        )
        .unwrap();
        assert_eq!(
            (b.version_number, b.certificate_pem.as_str()),
            (None, "PEMS")
        );

        assert_eq!(
            parse(&cert, br#"{"certificateId":"c","versionNumber":1}"#, None).unwrap_err(),
            MalformedBundle::MissingField("certificatePem")
        );
        assert_eq!(
            parse(
                &cert,
                br#"{"certificateId":"c","certificatePem":"x"}"#,
                None
            )
            .unwrap_err(),
            MalformedBundle::MissingVersionNumber
        );
        let err = parse(&cert, br#"{"privateKeyPem": "secret-key"#, None).unwrap_err();
        assert!(!err.to_string().contains("secret-key"), "{err}");
    }
}
