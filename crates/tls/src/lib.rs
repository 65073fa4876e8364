//! # tls: etcd's TLS settings on rustls (etcd's client/pkg/transport and
//! tlsutil)
//!
//! [`TlsInfo`] is etcd's `transport.TLSInfo`: the certificate and key of a
//! listener, the CA that client certificates must chain to, the CRL, the
//! cipher suites and TLS versions, each with etcd's validation and
//! messages. [`TlsInfo::server_config`] turns it into a rustls server
//! configuration (ring provider, with ECDSA P-521 added from RustCrypto for
//! etcd's auto-TLS keys: see `nistp521`; no OpenSSL) that:
//! - offers ALPN `h2` and `http/1.1` (etcd offers only `h2`, but Go lets a
//!   client offering only `http/1.1` through, which rustls would refuse);
//! - re-reads the certificate and key when their files change, for new
//!   handshakes (rotation without restart, as etcd, which re-reads them on
//!   every handshake); beyond etcd, a broken replacement keeps the last good
//!   certificate and logs an error, where etcd fails the handshakes;
//! - requires and verifies a client certificate whenever a trusted CA file
//!   is set, with or without `--client-cert-auth` (etcd's listener.go), and
//!   refuses a certificate whose serial (or any in its chain) the CRL file
//!   lists, re-reading that file per connection as etcd does; a refusal is
//!   the `bad_certificate` alert, as from Go, whose clients print it as
//!   `remote error: tls: bad certificate` ([`go_error_text`] words rustls's
//!   errors so).
//!
//! [`TlsInfo::client_config`] and [`TlsDialer`] are the client side, for
//! tools and tonic channels that dial `https://` endpoints.
//!
//! Owns: parsing PEM files, building rustls configurations, the TLS names of
//! etcd's flags, dialing a TLS connection. Never: listeners (embed and the
//! transport own them), the member.

mod alert;
mod dial;
mod nistp521;
mod reload;
mod selfcert;
mod verify;
mod versions;
mod x509;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use alert::{go_alert_text, go_error_chain_text, go_error_text};
pub use dial::TlsDialer;
pub use reload::ReloadingCert;
pub use selfcert::self_signed;
pub use verify::{check_cert_san, client_common_name, valid_for_host, Allowed, CrlClientVerifier};
pub use versions::{cipher_suite, parse_version, TlsVersion};

/// Errors in TLS settings, in etcd's words where etcd has them.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{0}")]
    Config(String),
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// The TLS settings of one side (client or peer) of a member: etcd's
/// `transport.TLSInfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsInfo {
    /// `--cert-file` / `--peer-cert-file`.
    pub cert_file: Option<PathBuf>,
    /// `--key-file` / `--peer-key-file`.
    pub key_file: Option<PathBuf>,
    /// `--trusted-ca-file` / `--peer-trusted-ca-file`: when set, every
    /// connecting client must present a certificate that chains to it.
    pub trusted_ca_file: Option<PathBuf>,
    /// `--client-cert-auth` / `--peer-client-cert-auth`.
    pub client_cert_auth: bool,
    /// `--client-crl-file` / `--peer-crl-file`.
    pub crl_file: Option<PathBuf>,
    /// `--peer-cert-allowed-cn`: a connecting member's certificate must
    /// carry one of these Common Names.
    pub allowed_cns: Vec<String>,
    /// `--client-cert-allowed-hostname` / `--peer-cert-allowed-hostname`:
    /// its certificate must be valid for one of these hostnames.
    pub allowed_hostnames: Vec<String>,
    /// `--client-cert-file` / `--peer-client-cert-file` and the key files:
    /// the certificate outgoing connections present, when it must differ
    /// from the listener's (both or neither).
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// `--cipher-suites`: etcd's (Go's) names; empty: rustls's defaults.
    pub cipher_suites: Vec<String>,
    /// `--tls-min-version` (default TLS1.2) and `--tls-max-version`.
    pub min_version: Option<String>,
    pub max_version: Option<String>,
    /// etcd's `TLSInfo.ServerName`: the name a dialed server's certificate
    /// must be valid for, whatever host was dialed (etcd sets the
    /// `--discovery-srv` domain for `https` peers when no peer CA is
    /// given); None: the dialed host.
    pub server_name: Option<String>,
}

impl TlsInfo {
    /// Whether a certificate is configured.
    pub fn has_cert(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }

    /// The cipher suites and versions, validated as etcd does
    /// (server/embed/config.go, client/pkg/tlsutil): a provider with only
    /// the chosen TLS 1.2 suites (TLS 1.3's are not configurable, as in Go)
    /// and the protocol versions.
    pub fn provider(&self) -> Result<(Arc<CryptoProvider>, Vec<TlsVersion>), TlsError> {
        let min = match &self.min_version {
            Some(v) if !v.is_empty() => parse_version(v)?,
            _ => TlsVersion::Tls12,
        };
        let max = match &self.max_version {
            Some(v) if !v.is_empty() => parse_version(v)?,
            _ => TlsVersion::Tls13,
        };
        if min > max {
            return Err(TlsError::Config(format!(
                "min version ({min}) is greater than max version ({max})"
            )));
        }
        let mut provider = nistp521::with_p521(rustls::crypto::ring::default_provider());
        if !self.cipher_suites.is_empty() {
            if min == TlsVersion::Tls13 {
                return Err(TlsError::Config(
                    "cipher suites cannot be configured when only TLS1.3 is enabled".into(),
                ));
            }
            let mut suites: Vec<_> = provider
                .cipher_suites
                .iter()
                .filter(|s| s.version() == &rustls::version::TLS13)
                .copied()
                .collect();
            for name in &self.cipher_suites {
                suites.extend(cipher_suite(name)?);
            }
            provider.cipher_suites = suites;
        }
        let versions = [TlsVersion::Tls12, TlsVersion::Tls13]
            .into_iter()
            .filter(|v| (min..=max).contains(v))
            .collect();
        Ok((Arc::new(provider), versions))
    }

    /// The listener's rustls configuration; errors name the file or flag
    /// at fault.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) else {
            let shown = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
            return Err(TlsError::Config(format!(
                "KeyFile and CertFile must both be present[key: {}, cert: {}]",
                shown(&self.key_file).unwrap_or_default(),
                shown(&self.cert_file).unwrap_or_default()
            )));
        };
        if !self.allowed_cns.is_empty() && !self.allowed_hostnames.is_empty() {
            return Err(TlsError::Config(format!(
                "AllowedCNs and AllowedHostnames are mutually exclusive (cns={}, hostnames={})",
                go_quoted(&self.allowed_cns),
                go_quoted(&self.allowed_hostnames)
            )));
        }
        let (provider, versions) = self.provider()?;
        let resolver = Arc::new(ReloadingCert::load(cert, key, provider.clone())?);
        let versions: Vec<_> = versions.iter().map(|v| v.rustls()).collect();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match self.client_verifier(&provider)? {
            Some(verifier) => builder.with_client_cert_verifier(verifier),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(resolver);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The trusted CA file (the system's roots without one) and its
    /// certificates as a root store.
    fn trusted_roots(&self) -> Result<(PathBuf, Arc<RootCertStore>), TlsError> {
        let ca = self
            .trusted_ca_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(SYSTEM_ROOTS));
        let mut roots = RootCertStore::empty();
        for cert in read_certs(&ca)? {
            roots
                .add(cert)
                .map_err(|e| file_error(&ca, format!("not a CA certificate: {e}")))?;
        }
        Ok((ca, Arc::new(roots)))
    }

    /// etcd: `if TrustedCAFile != "" || ClientCertAuth { RequireAndVerifyClientCert }`;
    /// without a CA file, the system's roots.
    fn client_verifier(
        &self,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Option<Arc<dyn ClientCertVerifier>>, TlsError> {
        if self.trusted_ca_file.is_none() && !self.client_cert_auth {
            return Ok(None);
        }
        let (ca, roots) = self.trusted_roots()?;
        let inner = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| file_error(&ca, e))?;
        Ok(Some(Arc::new(CrlClientVerifier::new(
            inner,
            self.crl_file.clone(),
            Allowed {
                cns: self.allowed_cns.clone(),
                hostnames: self.allowed_hostnames.clone(),
            },
        ))))
    }
}

/// A list as Go's `%q` prints a `[]string`: `["a" "b"]`.
fn go_quoted(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// Debian's bundle of the system's trusted roots.
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The certificates of a PEM file, in order; none is an error.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no certificate found"));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, e))
}

#[cfg(test)]
mod tests;
