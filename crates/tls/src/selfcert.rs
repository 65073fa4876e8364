//! `--auto-tls` / `--peer-auto-tls`: a self-signed certificate made at
//! start, as etcd's `transport.SelfCert` makes it, kept in the data dir and
//! reused as it is on restart.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, SanType};

use crate::{file_error, TlsError, TlsInfo};

/// etcd's `SelfCert`: `<dir>/cert.pem` and `<dir>/key.pem` (mode 0600) for
/// `hosts` (IP addresses as IP SANs, other names as DNS SANs), subject
/// `O=etcd` with no Common Name, for server authentication, valid for
/// `validity_years` × 365 days. Files already there are reused as they are
/// (etcd checks neither their hosts nor their expiry).
///
/// One difference: the key is ECDSA P-384 where etcd's is P-521, which the
/// ring provider (as every TLS stack built on it) cannot sign or verify.
pub fn self_signed(dir: &Path, hosts: &[String], validity_years: u32) -> Result<TlsInfo, TlsError> {
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    let info = TlsInfo {
        cert_file: Some(cert_path.clone()),
        key_file: Some(key_path.clone()),
        ..Default::default()
    };
    if cert_path.exists() && key_path.exists() {
        return Ok(info);
    }
    std::fs::create_dir_all(dir).map_err(|e| file_error(dir, e))?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384)
        .map_err(|e| TlsError::Config(format!("cannot generate a key: {e}")))?;
    let mut params = CertificateParams::new(Vec::<String>::new())
        .map_err(|e| TlsError::Config(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "etcd");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyEncipherment,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    for host in hosts {
        let san = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.clone()
                    .try_into()
                    .map_err(|e| TlsError::Config(format!("host {host:?}: {e}")))?,
            ),
        };
        if !params.subject_alt_names.contains(&san) {
            params.subject_alt_names.push(san);
        }
    }
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now;
    let not_after = now + time::Duration::days(365 * i64::from(validity_years.max(1)));
    params.not_after = not_after;
    let cert = params
        .self_signed(&key)
        .map_err(|e| TlsError::Config(format!("cannot sign the certificate: {e}")))?;
    write_private(&key_path, key.serialize_pem().as_bytes())?;
    std::fs::write(&cert_path, cert.pem()).map_err(|e| file_error(&cert_path, e))?;
    tracing::warn!(
        "cert-file" = %cert_path.display(),
        "key-file" = %key_path.display(),
        "certificate-validity-bound-not-after" = %not_after,
        "automatically generate certificates"
    );
    Ok(info)
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| file_error(path, e))?;
    file.write_all(bytes).map_err(|e| file_error(path, e))
}
