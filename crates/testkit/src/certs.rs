//! The Certificates retrieval API (`docs/oci-certificates.md` of the provider): a private
//! CA hierarchy generated at start (a root and an issuing intermediate), leaf certificates
//! with RSA or ECDSA keys, optionally passphrase-protected, versions that renew and revoke.

use std::fmt;
use std::time::SystemTime;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, RsaKeySize,
};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::crypto::pem_encode;
use crate::seed::Access;
use crate::state::Principal;

/// The key of a seeded certificate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyKind {
    /// ECDSA P-256 (the default: quick to generate).
    #[default]
    EcdsaP256,
    /// ECDSA P-384.
    EcdsaP384,
    /// RSA 2048.
    Rsa,
}

/// A leaf certificate of the emulator's issuing CA.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CertificateSeed {
    /// Certificate OCID (`ocid1.certificate.…`).
    pub id: String,
    /// Its name.
    pub name: String,
    /// Subject alternative names (the first is also the common name).
    pub dns_names: Vec<String>,
    /// The key type.
    pub key: KeyKind,
    /// When set, `privateKeyPem` is encrypted PKCS#8 and this is `privateKeyPemPassphrase`.
    pub passphrase: Option<String>,
    /// `false`: OCI does not hold the key (asked for one, the answer has none).
    pub no_private_key: bool,
    /// Who may read it (`read leaf-certificate-bundles`).
    pub access: Access,
}

/// The issuing CA as a certificate authority (`ocid1.certificateauthority.…`), or a CA
/// bundle (`ocid1.cabundle.…`) of the root and the issuing CA.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CaSeed {
    /// OCID.
    pub id: String,
    /// Name.
    pub name: String,
    /// Who may read it (`read certificate-authority-bundles`).
    pub access: Access,
}

/// One Certificates call, as the emulator saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateCall {
    /// Who made it (`None` when authentication failed).
    pub identity: Option<Principal>,
    /// Raw path and query.
    pub target: String,
    /// The `certificateBundleType` asked for (certificates only; `None` when not sent).
    pub bundle_type: Option<String>,
    /// The version answered.
    pub version_number: Option<i64>,
    /// Response status.
    pub status: u16,
}

pub(crate) struct CertPki {
    pub(crate) root_pem: String,
    pub(crate) intermediate_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertPki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertPki").finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub(crate) struct CertState {
    pub(crate) seed: CertificateSeed,
    pub(crate) versions: Vec<CertVersion>,
}

#[derive(Debug, Clone)]
pub(crate) struct CertVersion {
    pub(crate) number: i64,
    pub(crate) stages: Vec<String>,
    pub(crate) leaf_pem: String,
    pub(crate) key_pem: String,
    pub(crate) not_before: SystemTime,
    pub(crate) not_after: SystemTime,
    pub(crate) revoked: Option<String>,
}

fn rc(e: rcgen::Error) -> Error {
    Error::Certificate(e.to_string())
}

fn ca_params(name: &str) -> Result<CertificateParams, Error> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    Ok(params)
}

impl CertPki {
    pub(crate) fn generate() -> Result<Self, Error> {
        let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(rc)?;
        let root_params = ca_params("oci-csi-testkit Certificates root CA")?;
        let root = root_params.self_signed(&root_key).map_err(rc)?;
        let root_issuer = Issuer::new(root_params, root_key);
        let inter_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(rc)?;
        let inter_params = ca_params("oci-csi-testkit Certificates issuing CA")?;
        let inter = inter_params
            .signed_by(&inter_key, &root_issuer)
            .map_err(rc)?;
        Ok(Self {
            root_pem: pem_encode("CERTIFICATE", root.der()),
            intermediate_pem: pem_encode("CERTIFICATE", inter.der()),
            issuer: Issuer::new(inter_params, inter_key),
        })
    }

    /// A new leaf for `seed`, valid from `now` for 90 days (plus a day per version, so
    /// every renewal changes `notAfter`).
    pub(crate) fn issue(
        &self,
        seed: &CertificateSeed,
        number: i64,
        now: SystemTime,
    ) -> Result<CertVersion, Error> {
        let key = match seed.key {
            KeyKind::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
            KeyKind::EcdsaP384 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
            KeyKind::Rsa => KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_2048),
        }
        .map_err(rc)?;
        let mut params = CertificateParams::new(seed.dns_names.clone()).map_err(rc)?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            seed.dns_names
                .first()
                .cloned()
                .unwrap_or_else(|| seed.name.clone()),
        );
        params.distinguished_name = dn;
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let not_before = now - std::time::Duration::from_secs(3600);
        let not_after = now
            + std::time::Duration::from_secs(86_400 * (90 + u64::try_from(number).unwrap_or(0)));
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        // A serial per version, so two versions never look alike.
        params.serial_number = Some(rcgen::SerialNumber::from(
            u64::try_from(number).unwrap_or(1).to_be_bytes().to_vec(),
        ));
        let leaf = params.signed_by(&key, &self.issuer).map_err(rc)?;
        let pkcs8 = key.serialize_der();
        let key_pem = match &seed.passphrase {
            None => pem_encode("PRIVATE KEY", &pkcs8),
            Some(passphrase) => {
                use pkcs8::der::Decode as _;
                let info = pkcs8::PrivateKeyInfoRef::from_der(&pkcs8)
                    .map_err(|e| Error::Certificate(e.to_string()))?;
                let params = pkcs8::pkcs5::pbes2::Parameters::generate_pbkdf2_sha256_aes256cbc(
                    2048,
                    &number.to_be_bytes(),
                    [0x5a; 16],
                )
                .map_err(|e| Error::Certificate(e.to_string()))?;
                let encrypted = info
                    .encrypt_with_params(params, passphrase.as_bytes())
                    .map_err(|e| Error::Certificate(e.to_string()))?;
                pem_encode("ENCRYPTED PRIVATE KEY", encrypted.as_bytes())
            }
        };
        Ok(CertVersion {
            number,
            stages: vec!["CURRENT".into(), "LATEST".into()],
            leaf_pem: pem_encode("CERTIFICATE", leaf.der()),
            key_pem,
            not_before,
            not_after,
            revoked: None,
        })
    }
}

/// `GET /20210224/{collection}/{id}`: which collection and id, when the path is one.
pub(crate) fn route(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/20210224/")?;
    let (collection, id) = rest.split_once('/')?;
    if id.is_empty() || id.contains('/') {
        return None;
    }
    matches!(
        collection,
        "certificateBundles" | "certificateAuthorityBundles" | "caBundles"
    )
    .then_some((collection, id))
}

impl CertState {
    /// A new CURRENT version; the former CURRENT becomes PREVIOUS.
    pub(crate) fn renew(&mut self, pki: &CertPki, now: SystemTime) -> Result<i64, Error> {
        let number = self.versions.iter().map(|v| v.number).max().unwrap_or(0) + 1;
        let version = pki.issue(&self.seed, number, now)?;
        for v in &mut self.versions {
            if v.stages.iter().any(|s| s == "CURRENT") {
                v.stages = vec!["PREVIOUS".into()];
            } else {
                v.stages.retain(|s| s != "LATEST" && s != "PREVIOUS");
                if v.stages.is_empty() {
                    v.stages.push("DEPRECATED".into());
                }
            }
        }
        self.versions.push(version);
        Ok(number)
    }
}

/// What a TLS client trusting only `ca_crt` (PEM) decides about a server presenting
/// `tls_crt` (PEM: leaf first, then intermediates) for `name`: rustls's own verifier, for
/// tests that check mounted certificate files the way a client would.
pub fn verify_server_chain(tls_crt: &[u8], ca_crt: &[u8], name: &str) -> Result<(), String> {
    use rustls::client::danger::ServerCertVerifier as _;
    let certs = |pem: &[u8]| -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, String> {
        rustls_pemfile::certs(&mut &pem[..])
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs(ca_crt)? {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        provider,
    )
    .build()
    .map_err(|e| e.to_string())?;
    let chain = certs(tls_crt)?;
    let (leaf, intermediates) = chain.split_first().ok_or("no certificate in tls.crt")?;
    let name =
        rustls_pki_types::ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
    verifier
        .verify_server_cert(
            leaf,
            intermediates,
            &name,
            &[],
            rustls_pki_types::UnixTime::now(),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
}
