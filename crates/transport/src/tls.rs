use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// Why trust could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrustError {
    /// A CA file cannot be read or is not PEM.
    #[error("cannot read CA file {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A CA file holds no certificate rustls accepts.
    #[error("CA file {0} holds no usable certificate")]
    Empty(String),
    /// Neither configured files nor the platform give any root.
    #[error(
        "no trusted root certificates for OCI hosts: the platform has none; set SSL_CERT_FILE or endpoints.oci_ca_files"
    )]
    NoRoots,
    /// rustls refused the configuration.
    #[error("cannot build the TLS configuration")]
    Tls(#[from] rustls::Error),
}

fn add_file(roots: &mut RootCertStore, path: &Path) -> Result<(), TrustError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect())
        .map_err(|source| TrustError::Read {
            path: path.display().to_string(),
            source,
        })?;
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(TrustError::Empty(path.display().to_string()));
    }
    Ok(())
}

/// Roots for OCI hosts: `ssl_cert_file` alone when given (as Go does with `SSL_CERT_FILE`),
/// else the platform's; plus `extra`.
pub(crate) fn oci_roots(
    ssl_cert_file: Option<&Path>,
    extra: &[impl AsRef<Path>],
) -> Result<RootCertStore, TrustError> {
    let mut roots = RootCertStore::empty();
    match ssl_cert_file {
        Some(file) => add_file(&mut roots, file)?,
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    for file in extra {
        add_file(&mut roots, file.as_ref())?;
    }
    if roots.is_empty() {
        return Err(TrustError::NoRoots);
    }
    Ok(roots)
}

/// Roots holding only the certificates of `file`.
pub(crate) fn file_roots(file: &Path) -> Result<RootCertStore, TrustError> {
    let mut roots = RootCertStore::empty();
    add_file(&mut roots, file)?;
    Ok(roots)
}

/// A client configuration on [`crate::crypto_provider`] offering HTTP/2 and HTTP/1.1 by ALPN.
// The one place in the workspace that builds a TLS client configuration: one transport per
// process (ARCHITECTURE.md, invariant 1).
#[allow(clippy::disallowed_methods)] // reason: this crate is the transport
pub(crate) fn client_config(roots: RootCertStore) -> Result<Arc<ClientConfig>, TrustError> {
    let provider = Arc::new(crate::crypto_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
