//! A test PKI: a CA and certificates it signs, written as PEM files, for
//! tests of TLS listeners (what etcd's tests keep under
//! tests/fixtures, made fresh here).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
    SerialNumber,
};

/// A CA and the directory its files go to.
pub struct TestCa {
    dir: PathBuf,
    name: String,
    cert: rcgen::Certificate,
    key: KeyPair,
    next_serial: u64,
}

/// The files of one certificate.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub serial: u64,
}

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
    /// Both, as a peer's certificate (it serves and dials).
    Peer,
}

impl TestCa {
    /// A new CA named `name`, its certificate at `<dir>/<name>.crt`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).expect("write CA");
        TestCa {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            cert,
            key,
            next_serial: 1,
        }
    }

    /// The CA certificate file (`--trusted-ca-file`, `--cacert`).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}.crt", self.name))
    }

    /// A certificate for `hosts` (DNS names or IP addresses) with Common
    /// Name `cn` (none if empty), written as `<dir>/<file>.crt` and `.key`.
    pub fn issue(&mut self, file: &str, cn: &str, hosts: &[&str], usage: Usage) -> CertFiles {
        let key = KeyPair::generate().expect("key");
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        let mut params = CertificateParams::new(hosts).expect("params");
        if !cn.is_empty() {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.extended_key_usages = match usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::Peer => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        let serial = self.next_serial;
        self.next_serial += 1;
        params.serial_number = Some(SerialNumber::from(serial));
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signed certificate");
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
            serial,
        };
        std::fs::write(&files.cert, cert.pem()).expect("write certificate");
        std::fs::write(&files.key, key.serialize_pem()).expect("write key");
        files
    }

    /// A CRL revoking `serials`, written as `<dir>/<file>.crl` (PEM).
    pub fn revoke(&self, file: &str, serials: &[u64]) -> PathBuf {
        let now = rcgen::date_time_ymd(2024, 1, 1);
        let params = CertificateRevocationListParams {
            this_update: now,
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from(*s),
                    revocation_time: now,
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.cert, &self.key).expect("signed CRL");
        let path = self.dir.join(format!("{file}.crl"));
        std::fs::write(&path, crl.pem().expect("CRL PEM")).expect("write CRL");
        path
    }
}
