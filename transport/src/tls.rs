//! `tls://`: the `tcp://` wire format inside TLS (rustls, ring), with mutual authentication.
//!
//! Every member of a cluster presents a certificate and checks the peer's against the
//! cluster's certificate authority, both ways. [`TlsConfig::from_pem_files`] takes them from
//! PEM files; [`ClusterCertificate::generate`] makes a self-signed pair for a cluster (one
//! certificate every member presents and trusts), to write to files the members read.
//! The server name checked is the host of the address connected to, unless
//! [`TlsConfig::with_server_name`] fixes one (a cluster certificate names `localhost`,
//! loopback and what [`ClusterCertificate::generate`] was given).
//!
//! A TLS handshake runs like the shared-secret challenge: a listener handshakes with its
//! accepted connections concurrently, within [`crate::Options::connect_timeout`], and drops
//! those that fail.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> transport::Result<()> {
//! use transport::tls::{ClusterCertificate, TlsConfig};
//! let pair = ClusterCertificate::generate(&[])?;
//! let opts = transport::Options { tls: Some(TlsConfig::cluster(&pair)?), ..Default::default() };
//! let mut l = transport::listen_with(&"tls://127.0.0.1:0".parse()?, &opts).await?;
//! let addr = l.local_addr().clone();
//! let (server, client) = tokio::join!(l.accept(), transport::connect_with(&addr, &opts));
//! let (server, client) = (server?, client?);
//! client.send(1, vec![b"sealed".to_vec()].into()).await?;
//! assert_eq!(server.recv().await?.1.len(), 6);
//! // Another cluster's certificate is refused.
//! let other = ClusterCertificate::generate(&[])?;
//! let stranger = transport::Options { tls: Some(TlsConfig::cluster(&other)?), ..Default::default() };
//! assert!(transport::connect_with(&addr, &stranger).await.is_err());
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Why TLS could not be set up, or a handshake failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("reading {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// PEM text with no certificate where one belongs.
    #[error("no certificate in the {what} PEM")]
    NoCertificate {
        /// Which: "certificate" or "authority".
        what: &'static str,
    },
    /// PEM text with no private key (PKCS#8, PKCS#1 or SEC1), or one that does not parse.
    #[error("no private key in the key PEM")]
    NoKey,
    /// A server name that is neither a DNS name nor an IP address.
    #[error("`{0}` is not a server name")]
    ServerName(String),
    /// rustls refused the configuration, or the handshake failed (an unknown authority, a
    /// certificate for another name, a peer that is not TLS).
    #[error("TLS: {0}")]
    Rustls(rustls::Error),
    /// The client-certificate verifier could not be built from the authority.
    #[error("TLS: the authority does not make a verifier: {0}")]
    Verifier(String),
    /// Generating a certificate failed.
    #[error("generating a certificate: {0}")]
    Generate(String),
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        TlsError::Rustls(e)
    }
}

/// A self-signed certificate and its key, in PEM, for every member of a cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterCertificate {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PKCS#8 PEM). Keep it like a password.
    pub key_pem: String,
}

impl fmt::Debug for ClusterCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCertificate")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"..")
            .finish()
    }
}

impl ClusterCertificate {
    /// A fresh ECDSA P-256 certificate for `localhost`, `127.0.0.1`, `::1` and `names` (host
    /// names or IP addresses of the cluster's machines), usable as server and client.
    pub fn generate(names: &[&str]) -> Result<ClusterCertificate, TlsError> {
        let gen = |e: rcgen::Error| TlsError::Generate(e.to_string());
        let mut all: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .iter()
            .chain(names)
            .map(|s| s.to_string())
            .collect();
        all.dedup();
        let mut params = rcgen::CertificateParams::new(all).map_err(gen)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "transport cluster");
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().map_err(gen)?;
        let cert = params.self_signed(&key).map_err(gen)?;
        Ok(ClusterCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Both sides' TLS settings: what this process presents and whom it trusts.
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) server: Arc<rustls::ServerConfig>,
    pub(crate) client: Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl PartialEq for TlsConfig {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.server, &other.server)
            && Arc::ptr_eq(&self.client, &other.client)
            && self.server_name == other.server_name
    }
}

impl Eq for TlsConfig {}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn certs(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what });
    }
    Ok(certs)
}

impl TlsConfig {
    /// From PEM text: this process's certificate chain and private key, and the authority
    /// (one or more certificates) peers' certificates must chain to, both ways.
    pub fn from_pem(cert: &[u8], key: &[u8], authority: &[u8]) -> Result<TlsConfig, TlsError> {
        let chain = certs(cert, "certificate")?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| TlsError::NoKey)?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(authority, "authority")? {
            roots.add(c)?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::clone(&roots),
            Arc::clone(&provider),
        )
        .build()
        .map_err(|e| TlsError::Verifier(e.to_string()))?;
        let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(TlsConfig {
            server: Arc::new(server),
            client: Arc::new(client),
            server_name: None,
        })
    }

    /// From PEM files (see [`TlsConfig::from_pem`]).
    pub fn from_pem_files(
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
        authority: impl AsRef<Path>,
    ) -> Result<TlsConfig, TlsError> {
        TlsConfig::from_pem(
            &read(cert.as_ref())?,
            &read(key.as_ref())?,
            &read(authority.as_ref())?,
        )
    }

    /// Every member presents `pair` and trusts only it.
    pub fn cluster(pair: &ClusterCertificate) -> Result<TlsConfig, TlsError> {
        TlsConfig::from_pem(
            pair.cert_pem.as_bytes(),
            pair.key_pem.as_bytes(),
            pair.cert_pem.as_bytes(),
        )
    }

    /// Checks servers' certificates against `name` rather than the host connected to.
    pub fn with_server_name(mut self, name: &str) -> Result<TlsConfig, TlsError> {
        let n = ServerName::try_from(name.to_string())
            .map_err(|_| TlsError::ServerName(name.to_string()))?;
        self.server_name = Some(n);
        Ok(self)
    }

    /// The rustls configuration this side's connects use (for other clients of the same
    /// cluster, e.g. a hand-written one).
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.client)
    }

    /// The rustls configuration this side's listeners use.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.server)
    }

    /// The name a server connected to at `host` must have a certificate for.
    pub(crate) fn server_name_for(&self, host: &str) -> Result<ServerName<'static>, TlsError> {
        if let Some(n) = &self.server_name {
            return Ok(n.clone());
        }
        ServerName::try_from(host.to_string()).map_err(|_| TlsError::ServerName(host.to_string()))
    }
}

/// The TLS error inside an I/O error from a handshake, if that is what it is.
pub(crate) fn handshake_error(e: std::io::Error) -> crate::Error {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .cloned();
    match tls {
        Some(t) => crate::Error::Tls(TlsError::Rustls(t)),
        None => e.into(),
    }
}
