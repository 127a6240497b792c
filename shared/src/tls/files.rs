//! The PEM files of one side of TLS, and the rustls configurations built
//! from their bytes. Building takes bytes, not paths, so that
//! [`reload`](super::reload) can compare what it read with what it last
//! built from.

use super::provider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why TLS files could not be used; the message names the file.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {why}")]
    Read { path: PathBuf, why: String },
    #[error("{path}: {why}")]
    Pem { path: PathBuf, why: String },
    #[error("{what}: {why}")]
    Config { what: String, why: String },
}

/// A listener's files: its certificate chain and key, and the CA that
/// signs the client certificates it accepts (when it asks for them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub trusted_ca: Option<PathBuf>,
}

/// A client side's files: the CA that signs the servers it dials, and its
/// own certificate and key when it presents one (mutual TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFiles {
    pub trusted_ca: PathBuf,
    pub cert_and_key: Option<(PathBuf, PathBuf)>,
}

impl ServerFiles {
    /// The files in the order [`server_config`] takes their bytes.
    pub(crate) fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.cert.clone(), self.key.clone()];
        paths.extend(self.trusted_ca.clone());
        paths
    }
}

impl ClientFiles {
    /// The files in the order [`client_config`] takes their bytes.
    pub(crate) fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.trusted_ca.clone()];
        if let Some((cert, key)) = &self.cert_and_key {
            paths.push(cert.clone());
            paths.push(key.clone());
        }
        paths
    }
}

/// Reads every file of `paths`.
pub(crate) fn read_all(paths: &[PathBuf]) -> Result<Vec<Vec<u8>>, TlsError> {
    paths
        .iter()
        .map(|path| {
            std::fs::read(path).map_err(|e| TlsError::Read {
                path: path.clone(),
                why: e.to_string(),
            })
        })
        .collect()
}

fn pem_error(path: &Path, why: impl ToString) -> TlsError {
    TlsError::Pem {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// The certificates of a PEM file, at least one.
pub(crate) fn certificates(
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(pem_error(path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

fn private_key(path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| pem_error(path, e))
}

fn roots(path: &Path, bytes: &[u8]) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path, bytes)? {
        roots.add(cert).map_err(|e| pem_error(path, e))?;
    }
    Ok(Arc::new(roots))
}

fn config_error(what: &str, why: impl ToString) -> TlsError {
    TlsError::Config {
        what: what.to_string(),
        why: why.to_string(),
    }
}

/// A listener's configuration from the bytes of [`ServerFiles::paths`]:
/// client certificates required (and verified against the trusted CA)
/// when `require_client_certs`, offering `alpn`.
pub(crate) fn server_config(
    files: &ServerFiles,
    bytes: &[Vec<u8>],
    require_client_certs: bool,
    alpn: &[&[u8]],
) -> Result<ServerConfig, TlsError> {
    let what = files.cert.display().to_string();
    let chain = certificates(&files.cert, &bytes[0])?;
    let key = private_key(&files.key, &bytes[1])?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(&what, e))?;
    let builder = if require_client_certs {
        let (Some(path), Some(ca)) = (&files.trusted_ca, bytes.get(2)) else {
            return Err(config_error(
                &what,
                "client certificates are required, and no trusted CA file says who signs them",
            ));
        };
        let verifier = WebPkiClientVerifier::builder_with_provider(roots(path, ca)?, provider())
            .build()
            .map_err(|e| config_error(&path.display().to_string(), e))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| config_error(&format!("{what} with {}", files.key.display()), e))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client side's configuration from the bytes of [`ClientFiles::paths`],
/// speaking HTTP/2 (every latchkey connection is gRPC).
pub(crate) fn client_config(
    files: &ClientFiles,
    bytes: &[Vec<u8>],
) -> Result<ClientConfig, TlsError> {
    let what = files.trusted_ca.display().to_string();
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(&what, e))?
        .with_root_certificates(roots(&files.trusted_ca, &bytes[0])?);
    let mut config = match &files.cert_and_key {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(certificates(cert, &bytes[1])?, private_key(key, &bytes[2])?)
            .map_err(|e| config_error(&format!("{} with {}", cert.display(), key.display()), e))?,
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
