//! Client certificate checks beyond the chain: the CRL (etcd compares
//! serial numbers only, of every certificate presented, re-reading the CRL
//! file per connection), and the subject's Common Name.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

/// A chain verifier (rustls's WebPKI one) plus etcd's CRL check.
#[derive(Debug)]
pub struct CrlClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    crl_file: Option<PathBuf>,
}

impl CrlClientVerifier {
    pub fn new(inner: Arc<dyn ClientCertVerifier>, crl_file: Option<PathBuf>) -> Self {
        CrlClientVerifier { inner, crl_file }
    }

    /// The serial numbers the CRL file lists (PEM or DER); a file that
    /// cannot be read refuses every certificate, as etcd's does.
    fn revoked(&self) -> Result<Option<HashSet<Vec<u8>>>, String> {
        let Some(path) = &self.crl_file else {
            return Ok(None);
        };
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let der = match x509_parser::pem::parse_x509_pem(&bytes) {
            Ok((_, pem)) => pem.contents,
            Err(_) => bytes,
        };
        let (_, crl) = CertificateRevocationList::from_der(&der)
            .map_err(|e| format!("{}: not a CRL: {e}", path.display()))?;
        Ok(Some(
            crl.iter_revoked_certificates()
                .map(|r| r.raw_serial().to_vec())
                .collect(),
        ))
    }
}

fn serial(cert: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let (_, parsed) = X509Certificate::from_der(cert.as_ref()).ok()?;
    Some(parsed.raw_serial().to_vec())
}

/// The subject Common Name of a certificate (etcd takes it as the user
/// name of a client that sends no token, with `--client-cert-auth`).
pub fn client_common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = X509Certificate::from_der(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

impl ClientCertVerifier for CrlClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let revoked = match self.revoked() {
            Ok(None) => return Ok(verified),
            Ok(Some(revoked)) => revoked,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the CRL file; refusing the certificate");
                return Err(Error::InvalidCertificate(
                    CertificateError::UnknownRevocationStatus,
                ));
            }
        };
        for cert in std::iter::once(end_entity).chain(intermediates) {
            if let Some(serial) = serial(cert).filter(|s| revoked.contains(s)) {
                let hex: String = serial.iter().map(|b| format!("{b:02x}")).collect();
                tracing::warn!("transport: certificate serial {hex} revoked");
                return Err(Error::InvalidCertificate(CertificateError::Revoked));
            }
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
