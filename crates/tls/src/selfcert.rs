//! `--auto-tls` / `--peer-auto-tls`: a self-signed certificate made at
//! start, as etcd's `transport.SelfCert` makes it, kept in the data dir and
//! reused as it is on restart.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use p521::elliptic_curve::rand_core::OsRng;
use p521::pkcs8::LineEnding;

use p521::elliptic_curve::zeroize::Zeroizing;

use crate::x509::{sec1_p521, sign_p521, Name, Purpose, Template};
use crate::{file_error, TlsError, TlsInfo};

/// etcd's `SelfCert`: `<dir>/cert.pem` and `<dir>/key.pem` (mode 0600) for
/// `hosts` (IP addresses as IP SANs, other names as DNS SANs), an ECDSA
/// P-521 key (a SEC1 "EC PRIVATE KEY", as Go's `MarshalECPrivateKey`
/// writes it), subject `O=etcd` with no Common Name, for server
/// authentication, valid for `validity_years` × 365 days. Files already
/// there are reused as they are (etcd checks neither their hosts nor their
/// expiry), so a data dir etcd wrote keeps its certificates.
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
    let mut unique: Vec<String> = Vec::with_capacity(hosts.len());
    for host in hosts {
        if !unique.contains(host) {
            unique.push(host.clone());
        }
    }
    let key = p521::SecretKey::random(&mut OsRng);
    let subject = Name {
        organization: Some("etcd".into()),
        common_name: None,
    };
    let not_before = time::OffsetDateTime::now_utc();
    let not_after = not_before + time::Duration::days(365 * i64::from(validity_years.max(1)));
    let template = Template {
        subject: subject.clone(),
        not_before,
        not_after,
        is_ca: false,
        purposes: &[Purpose::ServerAuth],
        hosts: &unique,
    };
    tracing::warn!(
        "certificate-validity-bound-not-after" = %not_after,
        "automatically generate certificates"
    );
    let der = sign_p521(&template, &key.public_key(), (&subject, &key))?;
    let cert_pem = p521::pkcs8::der::pem::encode_string("CERTIFICATE", LineEnding::LF, &der)
        .map_err(|e| TlsError::Config(format!("cannot encode the certificate: {e}")))?;
    std::fs::write(&cert_path, cert_pem).map_err(|e| file_error(&cert_path, e))?;
    tracing::info!(path = %cert_path.display(), "created cert file");
    let key_der = Zeroizing::new(sec1_p521(&key));
    let key_pem = p521::pkcs8::der::pem::encode_string("EC PRIVATE KEY", LineEnding::LF, &key_der)
        .map(Zeroizing::new)
        .map_err(|e| TlsError::Config(format!("cannot encode the key: {e}")))?;
    write_private(&key_path, key_pem.as_bytes())?;
    tracing::info!(path = %key_path.display(), "created key file");
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
