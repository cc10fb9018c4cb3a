//! The emulator's certificate authority, its TLS server certificate and the instance identity.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, RsaKeySize,
};
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::Error;
use crate::crypto::pem_encode;

/// All certificate material generated at start.
#[derive(Debug)]
pub(crate) struct Pki {
    /// CA certificate PEM (trust anchor for every HTTPS endpoint).
    pub(crate) ca_pem: String,
    /// TLS config offering `h2` and `http/1.1`.
    pub(crate) tls_h2: Arc<ServerConfig>,
    /// TLS config offering only `http/1.1`.
    pub(crate) tls_h1: Arc<ServerConfig>,
    /// Instance identity.
    pub(crate) instance: InstanceIdentity,
}

/// What instance metadata serves, and what federation needs to recognise the leaf.
#[derive(Debug, Clone)]
pub(crate) struct InstanceIdentity {
    pub(crate) cert_pem: String,
    pub(crate) cert_der: Vec<u8>,
    pub(crate) key_pem: String,
    pub(crate) intermediate_pem: String,
    pub(crate) leaf_spki: Vec<u8>,
}

fn rc(e: rcgen::Error) -> Error {
    Error::Certificate(e.to_string())
}

impl Pki {
    pub(crate) fn generate(instance_tenancy: &str, instance_id: &str) -> Result<Self, Error> {
        // The CA and the server certificate use P-256: fast to generate, and every rustls
        // client supports it. The instance leaf must be RSA because OCI signs with RSA.
        let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(rc)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "oci-csi-testkit emulator CA");
        ca_params.distinguished_name = dn;
        let ca_cert = ca_params.self_signed(&ca_key).map_err(rc)?;
        let ca = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(rc)?;
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .map_err(rc)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "localhost");
        server_params.distinguished_name = dn;
        server_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server_params.signed_by(&server_key, &ca).map_err(rc)?;

        let chain = vec![
            CertificateDer::from(server_cert.der().to_vec()),
            CertificateDer::from(ca_cert.der().to_vec()),
        ];
        let key_der = server_key.serialize_der();
        let tls_h2 = server_config(chain.clone(), &key_der, &[b"h2", b"http/1.1"])?;
        let tls_h1 = server_config(chain, &key_der, &[b"http/1.1"])?;

        // Instance identity: an intermediate CA and an RSA leaf whose subject carries the
        // tenancy the way OCI does.
        let inter_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(rc)?;
        let mut inter_params = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
        inter_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        inter_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "PKISVC Identity Intermediate emulator");
        inter_params.distinguished_name = dn;
        let inter_cert = inter_params.signed_by(&inter_key, &ca).map_err(rc)?;
        let inter = Issuer::new(inter_params, inter_key);

        let leaf_key =
            KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_2048).map_err(rc)?;
        let mut leaf_params = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, instance_id);
        // rcgen keeps one value per attribute type, so the instance OU is written with the
        // OU object identifier as a custom type; both end up as OU attributes on the wire.
        dn.push(
            DnType::CustomDnType(vec![2, 5, 4, 11]),
            format!("opc-instance:{instance_id}"),
        );
        dn.push(
            DnType::OrganizationalUnitName,
            format!("opc-tenant:{instance_tenancy}"),
        );
        leaf_params.distinguished_name = dn;
        leaf_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let leaf_cert = leaf_params.signed_by(&leaf_key, &inter).map_err(rc)?;

        let instance = InstanceIdentity {
            cert_pem: pem_encode("CERTIFICATE", leaf_cert.der()),
            cert_der: leaf_cert.der().to_vec(),
            key_pem: pem_encode("PRIVATE KEY", &leaf_key.serialize_der()),
            intermediate_pem: pem_encode("CERTIFICATE", inter_cert.der()),
            leaf_spki: leaf_key.subject_public_key_info(),
        };

        Ok(Self {
            ca_pem: pem_encode("CERTIFICATE", ca_cert.der()),
            tls_h2,
            tls_h1,
            instance,
        })
    }
}

fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key_der: &[u8],
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Certificate(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(
            chain,
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der.to_vec())),
        )
        .map_err(|e| Error::Certificate(e.to_string()))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
