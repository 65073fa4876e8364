//! Dialing over TLS: the client side of [`TlsInfo`] and a connector that
//! tonic channels use to reach an `https://` endpoint.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use std::path::PathBuf;

use crate::verify::authentication_failed;
use crate::{file_error, Allowed, ReloadingCert, TlsError, TlsInfo};

impl TlsInfo {
    /// The certificate and key an outgoing connection presents: the client
    /// files if given (both or neither, etcd's rule), else the listener's.
    pub fn outgoing_identity(&self) -> Result<(Option<&PathBuf>, Option<&PathBuf>), TlsError> {
        let pair = |cert: &Option<PathBuf>, key: &Option<PathBuf>| match (cert, key) {
            (Some(_), None) | (None, Some(_)) => Err(TlsError::Config(
                "ClientKeyFile and ClientCertFile must both be present or both absent".into(),
            )),
            _ => Ok(()),
        };
        pair(&self.client_cert_file, &self.client_key_file)?;
        if self.client_cert_file.is_some() {
            return Ok((
                self.client_cert_file.as_ref(),
                self.client_key_file.as_ref(),
            ));
        }
        pair(&self.cert_file, &self.key_file)?;
        Ok((self.cert_file.as_ref(), self.key_file.as_ref()))
    }

    /// The configuration of an outgoing connection (etcdctl's `--cacert`,
    /// `--cert`, `--key`): the server must chain to the trusted CA file (or
    /// the system's roots), and the certificate, if any, is presented.
    /// Offers ALPN `h2`.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let (cert, key) = self.outgoing_identity()?;
        let (provider, versions) = self.provider()?;
        let versions: Vec<_> = versions.iter().map(|v| v.rustls()).collect();
        let (ca, roots) = self.trusted_roots()?;
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let allowed = Allowed {
            cns: self.allowed_cns.clone(),
            hostnames: self.allowed_hostnames.clone(),
        };
        let server_name = match &self.server_name {
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|e| TlsError::Config(format!("invalid server name {name:?}: {e}")))?,
            ),
            None => None,
        };
        let builder =
            if allowed.cns.is_empty() && allowed.hostnames.is_empty() && server_name.is_none() {
                builder.with_root_certificates(roots)
            } else {
                // etcd's VerifyPeerCertificate checks the servers it dials too
                let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    roots,
                    provider.clone(),
                )
                .build()
                .map_err(|e| file_error(&ca, e))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AllowedServer {
                        inner,
                        allowed,
                        server_name,
                    }))
            };
        let mut config = match (cert, key) {
            (Some(cert), Some(key)) => builder.with_client_cert_resolver(Arc::new(
                ReloadingCert::load(cert, key, provider.clone())?,
            )),
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Connects tonic channels over TLS: TCP to the URI's host and port (with
/// TCP_NODELAY), then the handshake, verifying the server's certificate
/// for that host (a DNS name or an IP address).
#[derive(Clone)]
pub struct TlsDialer {
    config: Arc<ClientConfig>,
}

impl TlsDialer {
    pub fn new(config: Arc<ClientConfig>) -> TlsDialer {
        TlsDialer { config }
    }
}

type Dialing = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<TlsStream<TcpStream>>>> + Send>>;

impl tower_service::Service<http::Uri> for TlsDialer {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Dialing;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let config = self.config.clone();
        Box::pin(async move {
            let invalid = |what: &str| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{what}: {uri}"))
            };
            let host = uri
                .host()
                .ok_or_else(|| invalid("no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let name = ServerName::try_from(host.clone()).map_err(|_| invalid("bad host"))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// The WebPKI verification of a server's certificate (for the configured
/// server name if there is one, else the dialed host), then etcd's allowed
/// Common Names or hostnames.
#[derive(Debug)]
struct AllowedServer {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    allowed: Allowed,
    server_name: Option<ServerName<'static>>,
}

impl rustls::client::danger::ServerCertVerifier for AllowedServer {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let server_name = self.server_name.as_ref().unwrap_or(server_name);
        let verified =
            self.inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)?;
        if !self.allowed.admits(end_entity) {
            return Err(authentication_failed());
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Accepts any server certificate (etcd's `InsecureSkipVerify`, used by
/// auto-TLS members for their outgoing connections, where every member's
/// certificate is self-signed); handshake signatures are still checked.
#[derive(Debug)]
struct SkipVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for SkipVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl TlsInfo {
    /// [`TlsInfo::client_config`] that verifies no server certificate
    /// (etcd's auto-TLS clients), presenting this side's certificate.
    pub fn insecure_client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let (provider, versions) = self.provider()?;
        let versions: Vec<_> = versions.iter().map(|v| v.rustls()).collect();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipVerification(provider.clone())));
        let mut config = match self.outgoing_identity()? {
            (Some(cert), Some(key)) => builder.with_client_cert_resolver(Arc::new(
                ReloadingCert::load(cert, key, provider.clone())?,
            )),
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}
