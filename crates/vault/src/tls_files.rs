//! Certificate material as a pod's TLS files: `tls.crt` (the leaf, then its intermediates,
//! ordered by issuer), `ca.crt` (the issuing chain up to the root, ordered by issuer) and
//! `tls.key` (unencrypted PKCS#8 PEM, RSA or ECDSA, checked against the leaf).
//!
//! What OCI returns is not trusted to be in order (its `certChainPem` is documented as "the
//! certificate chain", not as ordered; `docs/oci-certificates.md`): the chain is ordered by
//! matching each certificate's issuer to the next one's subject (raw DER names), and
//! certificates that are not part of the leaf's path are kept after it, in OCI's order.

use std::fmt;
use std::time::SystemTime;

use der::{Decode as _, Encode as _};
use x509_cert::Certificate;
use zeroize::Zeroizing;

/// Why certificate material cannot be written. Never holds key bytes or a passphrase.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// The leaf or a chain certificate is not PEM X.509.
    #[error("{what} is not a PEM X.509 certificate ({reason})")]
    Certificate {
        /// `certificatePem`, `certChainPem` or `caBundlePem`.
        what: &'static str,
        /// der's reason.
        reason: String,
    },
    /// The key is not the leaf's.
    #[error("the private key does not match the certificate's public key")]
    Mismatch,
}

/// One certificate: its PEM and what ordering and expiry need.
#[derive(Clone)]
struct Cert {
    der: Vec<u8>,
    subject: Vec<u8>,
    issuer: Vec<u8>,
    spki_bits: Vec<u8>,
    not_after: SystemTime,
}

impl Cert {
    fn parse(der: &[u8], what: &'static str) -> Result<Self, TlsError> {
        let bad = |e: der::Error| TlsError::Certificate {
            what,
            reason: e.to_string(),
        };
        let cert = Certificate::from_der(der).map_err(bad)?;
        let tbs = cert.tbs_certificate();
        Ok(Self {
            der: der.to_vec(),
            subject: tbs.subject().to_der().map_err(bad)?,
            issuer: tbs.issuer().to_der().map_err(bad)?,
            spki_bits: tbs
                .subject_public_key_info()
                .subject_public_key
                .raw_bytes()
                .to_vec(),
            not_after: tbs.validity().not_after.to_system_time(),
        })
    }

    fn self_signed(&self) -> bool {
        self.subject == self.issuer
    }

    fn pem(&self) -> String {
        pem_block("CERTIFICATE", &self.der)
    }
}

/// The files of one certificate, ready to write.
pub struct TlsFiles {
    /// The leaf, then each intermediate that issued it (no self-signed root), PEM.
    pub tls_crt: String,
    /// The chain above the leaf, ordered by issuer up to the root, PEM (empty when OCI
    /// returned no chain).
    pub ca_crt: String,
    /// The key as unencrypted PKCS#8 PEM, when asked for.
    pub tls_key: Option<Zeroizing<String>>,
    /// The leaf's `notAfter`.
    pub not_after: SystemTime,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsFiles")
            .field("tls_crt_bytes", &self.tls_crt.len())
            .field("ca_crt_bytes", &self.ca_crt.len())
            .field("tls_key", &self.tls_key.as_ref().map(|_| "<redacted>"))
            .field("not_after", &self.not_after)
            .finish()
    }
}

impl TlsFiles {
    /// Orders the leaf and its chain, and writes the key as PKCS#8 PEM after checking it
    /// belongs to the leaf. The key is decoded (and decrypted) only by the gate of tenant
    /// keys, [`auth::TenantKeys::certificate_key`], the one way to get an
    /// [`auth::CertificateKey`].
    pub fn new(
        certificate_pem: &str,
        chain_pem: Option<&str>,
        key: Option<&auth::CertificateKey>,
    ) -> Result<Self, TlsError> {
        let leaf = first_cert(certificate_pem, "certificatePem")?;
        let chain = chain_pem
            .map(|pem| certs(pem, "certChainPem"))
            .transpose()?
            .unwrap_or_default();
        // The chain may repeat the leaf; it is the leaf.
        let chain: Vec<Cert> = chain.into_iter().filter(|c| c.der != leaf.der).collect();
        let ordered = order(&leaf, chain);
        let mut tls_crt = leaf.pem();
        for cert in ordered.iter().take_while(|c| !c.self_signed()) {
            tls_crt.push_str(&cert.pem());
        }
        let ca_crt: String = ordered.iter().map(Cert::pem).collect();
        let tls_key = key
            .map(|key| {
                if key.public_key() != leaf.spki_bits {
                    return Err(TlsError::Mismatch);
                }
                Ok(Zeroizing::new(pem_block("PRIVATE KEY", key.pkcs8_der())))
            })
            .transpose()?;
        Ok(Self {
            tls_crt,
            ca_crt,
            tls_key,
            not_after: leaf.not_after,
        })
    }

    /// A CA bundle or a CA's chain as `ca.crt` alone: every certificate, ordered by issuer
    /// from the first one when they form a path.
    pub fn ca_only(pem: &str, what: &'static str) -> Result<(String, SystemTime), TlsError> {
        let mut all = certs(pem, what)?;
        if all.is_empty() {
            return Err(TlsError::Certificate {
                what,
                reason: "no CERTIFICATE block".into(),
            });
        }
        let first = all.remove(0);
        let not_after = first.not_after;
        let mut out = first.pem();
        for cert in order(&first, all) {
            out.push_str(&cert.pem());
        }
        Ok((out, not_after))
    }

    /// Seconds since the Unix epoch of the leaf's `notAfter` (for the expiry gauge).
    pub fn not_after_unix(&self) -> i64 {
        unix(self.not_after)
    }
}

/// Seconds since the Unix epoch (negative before it).
pub fn unix(time: SystemTime) -> i64 {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// From `start`, each next certificate is the one whose subject is the current one's
/// issuer, until the root or a gap; the rest follow in their order.
fn order(start: &Cert, mut rest: Vec<Cert>) -> Vec<Cert> {
    let mut ordered = Vec::with_capacity(rest.len());
    let mut issuer = start.issuer.clone();
    let mut at_root = start.self_signed();
    while !at_root {
        let Some(next) = rest.iter().position(|c| c.subject == issuer) else {
            break;
        };
        let cert = rest.remove(next);
        issuer = cert.issuer.clone();
        at_root = cert.self_signed();
        ordered.push(cert);
    }
    ordered.extend(rest);
    ordered
}

fn first_cert(pem: &str, what: &'static str) -> Result<Cert, TlsError> {
    certs(pem, what)?
        .into_iter()
        .next()
        .ok_or_else(|| TlsError::Certificate {
            what,
            reason: "no CERTIFICATE block".into(),
        })
}

fn certs(pem: &str, what: &'static str) -> Result<Vec<Cert>, TlsError> {
    let bad = |e: der::Error| TlsError::Certificate {
        what,
        reason: e.to_string(),
    };
    let Some(start) = pem.find("-----BEGIN ") else {
        return Ok(Vec::new());
    };
    Certificate::load_pem_chain(pem[start..].trim_end().as_bytes())
        .map_err(bad)?
        .iter()
        .map(|cert| Cert::parse(&cert.to_der().map_err(bad)?, what))
        .collect()
}

fn pem_block(label: &str, der: &[u8]) -> String {
    pem_rfc7468::encode_string(label, pem_rfc7468::LineEnding::LF, der).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use auth::{CertificateKey, KeyError, TenantKeys};
    use pkcs8::PrivateKeyInfoRef;
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    use rustls_pki_types::CertificateDer;

    use super::*;

    /// A root, an intermediate and a leaf for `web.example.com` (the leaf's key as given).
    struct Pki {
        root: String,
        intermediate: String,
        leaf: String,
        leaf_key: KeyPair,
    }

    fn ca(name: &str) -> CertificateParams {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params
    }

    fn pki(leaf_key: KeyPair) -> Pki {
        let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let root_params = ca("test root");
        let root = root_params.self_signed(&root_key).unwrap();
        let root_issuer = Issuer::new(root_params, root_key);
        let inter_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let inter_params = ca("test intermediate");
        let inter = inter_params.signed_by(&inter_key, &root_issuer).unwrap();
        let inter_issuer = Issuer::new(inter_params, inter_key);
        let mut leaf_params = CertificateParams::new(vec!["web.example.com".to_owned()]).unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "web.example.com");
        leaf_params.distinguished_name = dn;
        leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = leaf_params.signed_by(&leaf_key, &inter_issuer).unwrap();
        Pki {
            root: root.pem(),
            intermediate: inter.pem(),
            leaf: leaf.pem(),
            leaf_key,
        }
    }

    const RSA_ENCRYPTION: pkcs8::ObjectIdentifier =
        pkcs8::ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

    /// The key as the mount decodes it: through the gate of tenant keys.
    fn decoded(pem: &str, passphrase: Option<&[u8]>) -> Result<CertificateKey, KeyError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime
            .block_on(
                TenantKeys::new(1, std::time::Duration::from_secs(5)).certificate_key(
                    "tenant",
                    tokio::time::Instant::now() + std::time::Duration::from_secs(5),
                    Zeroizing::new(pem.as_bytes().to_vec()),
                    passphrase.map(|p| Zeroizing::new(p.to_vec())),
                ),
            )
            .unwrap()
    }

    fn ders(pem: &str) -> Vec<CertificateDer<'static>> {
        Certificate::load_pem_chain(pem.trim_end().as_bytes())
            .unwrap()
            .iter()
            .map(|c| CertificateDer::from(c.to_der().unwrap()))
            .collect()
    }

    /// rustls with only `ca_crt` as its roots accepts `tls_crt` for the name.
    fn verifies(files: &TlsFiles, name: &str) -> Result<(), String> {
        testkit::verify_server_chain(files.tls_crt.as_bytes(), files.ca_crt.as_bytes(), name)
    }

    fn labels(pem: &str) -> Vec<String> {
        ders(pem)
            .iter()
            .map(|d| {
                let cert = Certificate::from_der(d).unwrap();
                cert.tbs_certificate().subject().to_string()
            })
            .collect()
    }

    #[test]
    fn the_chain_is_ordered_by_issuer_whatever_order_oci_returns_it_in() {
        let p = pki(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap());
        // Root first, as OCI may return it, and the leaf repeated in the chain.
        let chain = format!("{}{}{}", p.root, p.leaf, p.intermediate);
        let files = TlsFiles::new(&p.leaf, Some(&chain), None).unwrap();
        assert_eq!(
            labels(&files.tls_crt),
            ["CN=web.example.com", "CN=test intermediate"],
            "leaf then intermediate, no root"
        );
        assert_eq!(
            labels(&files.ca_crt),
            ["CN=test intermediate", "CN=test root"]
        );
        assert!(files.tls_key.is_none());
        verifies(&files, "web.example.com").unwrap();
        assert!(
            verifies(&files, "other.example.com").is_err(),
            "the name is checked"
        );
        // notAfter is the leaf's (rcgen's default: 4096-01-01).
        assert!(files.not_after_unix() > 4_000_000_000);
    }

    #[test]
    fn ecdsa_and_rsa_keys_come_out_as_pkcs8_matching_the_leaf() {
        let rsa =
            KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048).unwrap();
        for key in [
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap(),
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap(),
            rsa,
        ] {
            let p = pki(key);
            let pkcs8 = p.leaf_key.serialize_der();
            let info = PrivateKeyInfoRef::try_from(pkcs8.as_slice()).unwrap();
            let inner = info.private_key.as_bytes().to_vec();
            let traditional = if info.algorithm.oid == RSA_ENCRYPTION {
                pem_block("RSA PRIVATE KEY", &inner)
            } else {
                // rcgen's SEC1 inside PKCS#8 carries no curve; name it, as OpenSSL writes it.
                sec1_with_curve(&inner, info.algorithm.parameters_oid().unwrap())
            };
            for (form, pem) in [
                ("PKCS#8", p.leaf_key.serialize_pem()),
                ("traditional", traditional),
            ] {
                let chain = format!("{}{}", p.intermediate, p.root);
                let files =
                    TlsFiles::new(&p.leaf, Some(&chain), Some(&decoded(&pem, None).unwrap()))
                        .unwrap();
                let key = files.tls_key.as_ref().unwrap();
                assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{form}");
                let (_, der) = pem_rfc7468::decode_vec(key.as_bytes()).unwrap();
                if form == "PKCS#8" || info.algorithm.oid == RSA_ENCRYPTION {
                    assert_eq!(der, pkcs8, "{form}: the same bytes");
                } else {
                    // The SEC1 key now names its curve; the same key all the same.
                    let pem = |der: &[u8]| pem_block("PRIVATE KEY", der);
                    assert_eq!(
                        decoded(&pem(&der), None).unwrap().public_key(),
                        decoded(&pem(&pkcs8), None).unwrap().public_key()
                    );
                }
                verifies(&files, "web.example.com").unwrap();
            }
        }
    }

    fn sec1_with_curve(sec1_der: &[u8], curve: pkcs8::ObjectIdentifier) -> String {
        let mut key = sec1::EcPrivateKey::from_der(sec1_der).unwrap();
        key.parameters = Some(sec1::EcParameters::NamedCurve(curve));
        pem_block("EC PRIVATE KEY", &key.to_der().unwrap())
    }

    #[test]
    fn an_encrypted_key_is_written_decrypted_with_the_passphrase_oci_returns() {
        let p = pki(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap());
        let pkcs8 = p.leaf_key.serialize_der();
        let params = pkcs8::pkcs5::pbes2::Parameters::generate_pbkdf2_sha256_aes256cbc(
            2048, &[7; 16], [9; 16],
        )
        .unwrap();
        let encrypted = PrivateKeyInfoRef::try_from(pkcs8.as_slice())
            .unwrap()
            .encrypt_with_params(params, b"correct horse")
            .unwrap();
        let pem = pem_block("ENCRYPTED PRIVATE KEY", encrypted.as_bytes());
        let decrypted = decoded(&pem, Some(b"correct horse".as_slice())).unwrap();
        let files = TlsFiles::new(&p.leaf, None, Some(&decrypted)).unwrap();
        let (label, der) =
            pem_rfc7468::decode_vec(files.tls_key.as_ref().unwrap().as_bytes()).unwrap();
        assert_eq!((label, der), ("PRIVATE KEY", pkcs8.clone()));

        for (passphrase, expected) in [
            (None, "PassphraseRequired"),
            (Some(b"".as_slice()), "PassphraseRequired"),
            (Some(b"guess-1234".as_slice()), "WrongPassphrase"),
        ] {
            let err = decoded(&pem, passphrase).unwrap_err();
            assert_eq!(format!("{err:?}"), expected);
            assert!(
                !err.to_string().contains("guess-1234"),
                "the passphrase is never quoted"
            );
        }
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let p = pki(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap());
        let other = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let other = decoded(&other.serialize_pem(), None).unwrap();
        let err = TlsFiles::new(&p.leaf, None, Some(&other)).unwrap_err();
        assert_eq!(err, TlsError::Mismatch);
    }

    #[test]
    fn unusable_keys_and_certificates_are_named_without_their_bytes() {
        let p = pki(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap());
        let ed = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let err = decoded(&ed.serialize_pem(), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the private key's algorithm is Ed25519; RSA and ECDSA (P-256, P-384, P-521) are supported"
        );
        let legacy = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00112233445566778899AABBCCDDEEFF\n\nAAAA\n-----END RSA PRIVATE KEY-----\n";
        let err = decoded(legacy, None).unwrap_err();
        assert!(err.to_string().contains("legacy PEM encryption"), "{err}");
        let secret =
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n";
        let err = decoded(secret, None).unwrap_err();
        assert!(!err.to_string().contains("c2VjcmV0"), "{err}");
        assert!(matches!(err, KeyError::NotAKey { .. }), "{err}");
        let err = TlsFiles::new("not a certificate", None, None).unwrap_err();
        assert!(err.to_string().contains("certificatePem"), "{err}");
        let err = TlsFiles::new(
            &p.leaf,
            Some("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("certChainPem"), "{err}");
        let leaf_key = decoded(&p.leaf_key.serialize_pem(), None).unwrap();
        assert!(
            !format!("{leaf_key:?}").contains("PRIVATE"),
            "Debug redacts the key"
        );
        let files = TlsFiles::new(&p.leaf, None, Some(&leaf_key)).unwrap();
        assert!(
            !format!("{files:?}").contains("PRIVATE KEY"),
            "Debug redacts the key"
        );
    }

    #[test]
    fn a_ca_bundle_is_ordered_from_its_first_certificate() {
        let p = pki(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap());
        let (pem, _) =
            TlsFiles::ca_only(&format!("{}{}", p.intermediate, p.root), "caBundlePem").unwrap();
        assert_eq!(labels(&pem), ["CN=test intermediate", "CN=test root"]);
        let (pem, _) =
            TlsFiles::ca_only(&format!("{}{}", p.root, p.intermediate), "caBundlePem").unwrap();
        assert_eq!(
            labels(&pem),
            ["CN=test root", "CN=test intermediate"],
            "a root starts no path"
        );
        assert!(TlsFiles::ca_only("", "caBundlePem").is_err());
    }
}
