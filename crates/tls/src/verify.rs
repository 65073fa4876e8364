//! Client certificate checks beyond the chain: the CRL (etcd compares
//! serial numbers only, of every certificate presented, re-reading the CRL
//! file per connection), and the subject's Common Name. A refused client
//! certificate gets the `bad_certificate` alert whatever the reason, as
//! from a Go server; the reason is logged (`rejected client certificate`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

/// A chain verifier (rustls's WebPKI one) plus etcd's checks: the CRL,
/// and the allowed Common Names or hostnames of the leaf.
#[derive(Debug)]
pub struct CrlClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    crl_file: Option<PathBuf>,
    allowed: Allowed,
}

/// etcd's `AllowedCNs` / `AllowedHostnames` (at most one of them set).
#[derive(Debug, Default, Clone)]
pub struct Allowed {
    pub cns: Vec<String>,
    pub hostnames: Vec<String>,
}

impl Allowed {
    /// Whether the verified leaf passes (etcd's verifyCertificate).
    pub(crate) fn admits(&self, leaf: &CertificateDer<'_>) -> bool {
        if !self.cns.is_empty() {
            let cn = client_common_name(leaf).unwrap_or_default();
            return self.cns.contains(&cn);
        }
        if !self.hostnames.is_empty() {
            return self.hostnames.iter().any(|h| valid_for_host(leaf, h));
        }
        true
    }
}

/// Go's `Certificate.VerifyHostname`: an IP address against the IP SANs,
/// a name against the DNS SANs (case-insensitive, `*.` matching one label).
pub fn valid_for_host(cert: &CertificateDer<'_>, host: &str) -> bool {
    let Ok((_, parsed)) = X509Certificate::from_der(cert.as_ref()) else {
        return false;
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return false;
    };
    let ip: Option<std::net::IpAddr> = host.trim_matches(['[', ']']).parse().ok();
    san.value.general_names.iter().any(|name| match name {
        GeneralName::IPAddress(bytes) => match (ip, bytes.len()) {
            (Some(std::net::IpAddr::V4(v4)), 4) => v4.octets() == **bytes,
            (Some(std::net::IpAddr::V6(v6)), 16) => v6.octets() == **bytes,
            _ => false,
        },
        GeneralName::DNSName(pattern) if ip.is_none() => dns_matches(pattern, host),
        _ => false,
    })
}

fn dns_matches(pattern: &str, host: &str) -> bool {
    let (pattern, host) = (pattern.to_ascii_lowercase(), host.to_ascii_lowercase());
    let host = host.trim_end_matches('.');
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == suffix),
        None => pattern == host,
    }
}

impl CrlClientVerifier {
    pub fn new(
        inner: Arc<dyn ClientCertVerifier>,
        crl_file: Option<PathBuf>,
        allowed: Allowed,
    ) -> Self {
        CrlClientVerifier {
            inner,
            crl_file,
            allowed,
        }
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

impl CrlClientVerifier {
    /// The chain, the allowed names, then the CRL; a refusal's reason in
    /// Go's and etcd's words.
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, String> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
            .map_err(|e| crate::go_error_text(&e))?;
        if !self.allowed.admits(end_entity) {
            return Err(AuthenticationFailed.to_string());
        }
        let revoked = match self.revoked() {
            Ok(None) => return Ok(verified),
            Ok(Some(revoked)) => revoked,
            Err(e) => return Err(format!("cannot read the CRL file: {e}")),
        };
        for cert in std::iter::once(end_entity).chain(intermediates) {
            if let Some(serial) = serial(cert).filter(|s| revoked.contains(s)) {
                let hex: String = serial.iter().map(|b| format!("{b:02x}")).collect();
                return Err(format!("transport: certificate serial {hex} revoked"));
            }
        }
        Ok(verified)
    }
}

/// What rustls turns into the `bad_certificate` alert (the variant itself
/// says nothing: the reason is logged where the refusal is made).
fn bad_certificate() -> Error {
    Error::InvalidCertificate(CertificateError::BadEncoding)
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

    /// Every refusal is `bad_certificate` on the wire, as Go's servers send
    /// it whatever the reason (the refused member logs `remote error: tls:
    /// bad certificate`, which etcd's tests wait for); the reason itself is
    /// logged here.
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.check(end_entity, intermediates, now)
            .map_err(|reason| {
                tracing::warn!(error = %reason, "rejected client certificate");
                bad_certificate()
            })
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

/// etcd's refusal of a certificate outside the allowed CNs or hostnames.
pub(crate) fn authentication_failed() -> Error {
    Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
        AuthenticationFailed,
    ))))
}

/// etcd's error for a certificate outside the allowed CNs or hostnames
/// (its Debug form is what rustls's error shows, so it says the same).
pub(crate) struct AuthenticationFailed;

impl std::fmt::Debug for AuthenticationFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for AuthenticationFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("client certificate authentication failed")
    }
}

impl std::error::Error for AuthenticationFailed {}

/// etcd's `checkCertSAN` on the peer port: a connecting member's address
/// must be one its certificate names, as an IP SAN or as a DNS SAN that
/// resolves to it. A certificate without SANs passes. (etcd also tries a
/// reverse lookup for wildcard names; here a wildcard never matches.)
pub async fn check_cert_san(
    cert: &CertificateDer<'_>,
    remote: std::net::IpAddr,
) -> Result<(), String> {
    let Ok((_, parsed)) = X509Certificate::from_der(cert.as_ref()) else {
        return Err("cannot parse the certificate".into());
    };
    let names = match parsed.subject_alternative_name() {
        Ok(Some(san)) => san.value.general_names.clone(),
        _ => return Ok(()),
    };
    let dns: Vec<String> = names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(name) => Some(name.to_string()),
            _ => None,
        })
        .collect();
    let has_ip = names.iter().any(|n| matches!(n, GeneralName::IPAddress(_)));
    if !has_ip && dns.is_empty() {
        return Ok(());
    }
    if has_ip && valid_for_host(cert, &remote.to_string()) {
        return Ok(());
    }
    for name in dns.iter().filter(|n| !n.starts_with("*.")) {
        if let Ok(addrs) = tokio::net::lookup_host((name.as_str(), 0)).await {
            if addrs.map(|a| a.ip()).any(|ip| ip == remote) {
                return Ok(());
            }
        }
    }
    if dns.is_empty() {
        return Err(format!(
            "x509: certificate is not valid for any names, but wanted to match {remote}"
        ));
    }
    Err(format!(
        "tls: {:?} does not match any of DNSNames {dns:?}",
        remote.to_string()
    ))
}
