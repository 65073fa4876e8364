//! ECDSA P-521, etcd's auto-TLS curve, which ring lacks: keys in both PEM
//! forms, chains signed with it, handshakes signed with it, and the
//! certificate auto-TLS makes.

use std::path::PathBuf;

use p521::elliptic_curve::rand_core::OsRng;
use p521::pkcs8::{EncodePrivateKey, LineEnding};
use rustls::crypto::CryptoProvider;
use rustls::SignatureScheme;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::*;
use crate::x509::{sign_p521, Name, Purpose, Template};

const SECP521R1: &str = "1.3.132.0.35";
const ECDSA_WITH_SHA512: &str = "1.2.840.10045.4.3.4";

/// A P-521 CA that signs P-521 certificates, written as PEM files.
struct P521Ca {
    dir: PathBuf,
    name: Name,
    key: p521::SecretKey,
    file: PathBuf,
}

/// Which PEM form a key is written in.
#[derive(Clone, Copy)]
enum KeyForm {
    /// "EC PRIVATE KEY", as Go (and so etcd) writes it.
    Sec1,
    /// "PRIVATE KEY".
    Pkcs8,
}

fn write_cert(path: &Path, der: &[u8]) {
    let pem = p521::pkcs8::der::pem::encode_string("CERTIFICATE", LineEnding::LF, der).unwrap();
    std::fs::write(path, pem).unwrap();
}

impl P521Ca {
    fn new(dir: &Path, cn: &str) -> P521Ca {
        let key = p521::SecretKey::random(&mut OsRng);
        let name = Name {
            organization: None,
            common_name: Some(cn.into()),
        };
        let now = time::OffsetDateTime::now_utc();
        let template = Template {
            subject: name.clone(),
            not_before: now - time::Duration::hours(1),
            not_after: now + time::Duration::days(1),
            is_ca: true,
            purposes: &[],
            hosts: &[],
        };
        let der = sign_p521(&template, &key.public_key(), (&name, &key)).unwrap();
        let file = dir.join(format!("{cn}.crt"));
        write_cert(&file, &der);
        P521Ca {
            dir: dir.to_path_buf(),
            name,
            key,
            file,
        }
    }

    /// A certificate for `hosts` with Common Name `cn`, for server and
    /// client authentication: `(cert file, key file)`.
    fn issue(&self, cn: &str, hosts: &[&str], form: KeyForm) -> (PathBuf, PathBuf) {
        let key = p521::SecretKey::random(&mut OsRng);
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        let now = time::OffsetDateTime::now_utc();
        let template = Template {
            subject: Name {
                organization: None,
                common_name: Some(cn.into()),
            },
            not_before: now - time::Duration::hours(1),
            not_after: now + time::Duration::days(1),
            is_ca: false,
            purposes: &[Purpose::ServerAuth, Purpose::ClientAuth],
            hosts: &hosts,
        };
        let der = sign_p521(&template, &key.public_key(), (&self.name, &self.key)).unwrap();
        let (cert, key_file) = (
            self.dir.join(format!("{cn}.crt")),
            self.dir.join(format!("{cn}.key")),
        );
        write_cert(&cert, &der);
        let pem = match form {
            KeyForm::Sec1 => p521::pkcs8::der::pem::encode_string(
                "EC PRIVATE KEY",
                LineEnding::LF,
                &crate::x509::sec1_p521(&key),
            )
            .unwrap(),
            KeyForm::Pkcs8 => key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
        };
        std::fs::write(&key_file, pem).unwrap();
        (cert, key_file)
    }
}

/// The algorithms that verify handshake signatures of `scheme`.
fn for_scheme(
    provider: &CryptoProvider,
    scheme: SignatureScheme,
) -> &'static [&'static dyn rustls_pki_types::SignatureVerificationAlgorithm] {
    provider
        .signature_verification_algorithms
        .mapping
        .iter()
        .find(|(s, _)| *s == scheme)
        .map(|(_, algorithms)| *algorithms)
        .unwrap_or_default()
}

fn versions(max: &str) -> TlsInfo {
    TlsInfo {
        max_version: Some(max.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_p521_chain_serves_and_authenticates_clients_over_tls12_and_tls13() {
    let dir = tempfile::tempdir().unwrap();
    let ca = P521Ca::new(dir.path(), "p521-ca");
    let (server_cert, server_key) = ca.issue("server", &["localhost"], KeyForm::Sec1);
    let (client_cert, client_key) = ca.issue("alice", &[], KeyForm::Pkcs8);
    let other = tempfile::tempdir().unwrap();
    let stranger_ca = P521Ca::new(other.path(), "stranger-ca");
    let (stranger_cert, stranger_key) = stranger_ca.issue("mallory", &[], KeyForm::Sec1);
    for max in ["TLS1.2", "TLS1.3"] {
        let server = TlsInfo {
            cert_file: Some(server_cert.clone()),
            key_file: Some(server_key.clone()),
            trusted_ca_file: Some(ca.file.clone()),
            client_cert_auth: true,
            ..versions(max)
        }
        .server_config()
        .unwrap();
        let dialing = |cert: &PathBuf, key: &PathBuf| {
            TlsInfo {
                trusted_ca_file: Some(ca.file.clone()),
                cert_file: Some(cert.clone()),
                key_file: Some(key.clone()),
                ..versions(max)
            }
            .client_config()
            .unwrap()
        };
        let dialed = handshake(server.clone(), dialing(&client_cert, &client_key)).await;
        assert!(dialed.is_ok(), "{max}: {dialed:?}");
        let refused = handshake(server, dialing(&stranger_cert, &stranger_key)).await;
        assert!(refused.is_err(), "{max}: another P-521 CA's client");
    }
}

#[tokio::test]
async fn a_client_refuses_a_p521_server_of_another_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = P521Ca::new(dir.path(), "p521-ca");
    let other = P521Ca::new(dir.path(), "other-ca");
    let (cert, key) = ca.issue("server", &["localhost"], KeyForm::Sec1);
    let server = TlsInfo {
        cert_file: Some(cert),
        key_file: Some(key),
        ..Default::default()
    }
    .server_config()
    .unwrap();
    let trusting = |file: &PathBuf| {
        TlsInfo {
            trusted_ca_file: Some(file.clone()),
            ..Default::default()
        }
        .client_config()
        .unwrap()
    };
    assert!(handshake(server.clone(), trusting(&ca.file)).await.is_ok());
    let refused = handshake(server, trusting(&other.file)).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("UnknownIssuer")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn etcds_own_auto_tls_files_load_and_serve_as_they_are() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/etcd-auto-tls");
    let key = std::fs::read_to_string(fixture.join("key.pem")).unwrap();
    assert!(key.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    let member = |max: &str| TlsInfo {
        cert_file: Some(fixture.join("cert.pem")),
        key_file: Some(fixture.join("key.pem")),
        ..versions(max)
    };
    for max in ["TLS1.2", "TLS1.3"] {
        // as two auto-TLS members: no CA, the dialer verifies nothing but
        // the handshake's signature, and presents the same files
        let server = member(max).server_config().unwrap();
        let client = member(max).insecure_client_config().unwrap();
        let dialed = handshake(server, client).await;
        assert!(dialed.is_ok(), "{max}: {dialed:?}");
    }
}

#[test]
fn a_sec1_p521_key_signs_with_ecdsa_secp521r1_sha512_and_verifies() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/etcd-auto-tls");
    let der = read_key(&fixture.join("key.pem")).unwrap();
    assert!(matches!(der, PrivateKeyDer::Sec1(_)));
    let (provider, _) = TlsInfo::default().provider().unwrap();
    let key = provider.key_provider.load_private_key(der).unwrap();
    assert_eq!(key.algorithm(), rustls::SignatureAlgorithm::ECDSA);
    assert!(
        key.choose_scheme(&[SignatureScheme::ECDSA_NISTP384_SHA384])
            .is_none(),
        "a P-521 key signs with P-521's scheme only"
    );
    let signer = key
        .choose_scheme(&[
            SignatureScheme::ED25519,
            SignatureScheme::ECDSA_NISTP521_SHA512,
        ])
        .unwrap();
    assert_eq!(signer.scheme(), SignatureScheme::ECDSA_NISTP521_SHA512);
    let signature = signer.sign(b"handshake transcript").unwrap();

    let cert = read_certs(&fixture.join("cert.pem")).unwrap().remove(0);
    let (_, parsed) = X509Certificate::from_der(cert.as_ref()).unwrap();
    let point = parsed.public_key().subject_public_key.data.to_vec();
    let verify = |message: &[u8], provider: &CryptoProvider| {
        for_scheme(provider, SignatureScheme::ECDSA_NISTP521_SHA512)[0]
            .verify_signature(&point, message, &signature)
    };
    assert!(verify(b"handshake transcript", &provider).is_ok());
    assert!(verify(b"another transcript", &provider).is_err());
    // the certificate etcd signed (SHA-512) verifies with its own key
    let self_signed = provider
        .signature_verification_algorithms
        .all
        .iter()
        .filter(|a| a.public_key_alg_id() == rustls_pki_types::alg_id::ECDSA_P521)
        .any(|a| {
            a.verify_signature(
                &point,
                parsed.tbs_certificate.as_ref(),
                &parsed.signature_value.data,
            )
            .is_ok()
        });
    assert!(self_signed);
    assert_eq!(
        key.public_key().unwrap().as_ref(),
        parsed.public_key().raw,
        "the key goes with its certificate"
    );
}

#[test]
fn p521_signatures_over_sha256_and_sha384_verify_too() {
    use p521::ecdsa::signature::hazmat::PrehashSigner;
    use sha2::Digest;
    let key = p521::ecdsa::SigningKey::random(&mut OsRng);
    let point = p521::ecdsa::VerifyingKey::from(&key)
        .to_encoded_point(false)
        .as_bytes()
        .to_vec();
    let (provider, _) = TlsInfo::default().provider().unwrap();
    let message = b"tbs";
    // a digest taken whole as the integer: left-padded, as Go signs it
    let mut sha256 = [0u8; 64];
    sha256[32..].copy_from_slice(&sha2::Sha256::digest(message));
    let mut sha384 = [0u8; 64];
    sha384[16..].copy_from_slice(&sha2::Sha384::digest(message));
    for (scheme, digest) in [
        (SignatureScheme::ECDSA_NISTP256_SHA256, sha256),
        (SignatureScheme::ECDSA_NISTP384_SHA384, sha384),
    ] {
        let signature: p521::ecdsa::Signature = key.sign_prehash(&digest).unwrap();
        let der = signature.to_der();
        let verified = for_scheme(&provider, scheme)
            .iter()
            .filter(|a| a.public_key_alg_id() == rustls_pki_types::alg_id::ECDSA_P521)
            .any(|a| a.verify_signature(&point, message, der.as_bytes()).is_ok());
        assert!(verified, "{scheme:?} with a P-521 key (TLS 1.2)");
    }
}

#[tokio::test]
async fn auto_tls_makes_etcds_certificate_p521_o_etcd_no_cn_server_auth_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fixtures = dir.path().join("fixtures").join("peer");
    let hosts = ["127.0.0.1", "localhost", "::1", "localhost"].map(String::from);
    let info = self_signed(&fixtures, &hosts, 3).unwrap();
    let cert_file = info.cert_file.clone().unwrap();
    let key_file = info.key_file.clone().unwrap();
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the key is private");
    let key = std::fs::read_to_string(&key_file).unwrap();
    assert!(
        key.starts_with("-----BEGIN EC PRIVATE KEY-----\n"),
        "SEC1, as etcd writes it: {key}"
    );

    let der = read_certs(&cert_file).unwrap().remove(0);
    let (_, cert) = X509Certificate::from_der(der.as_ref()).unwrap();
    let curve = cert
        .public_key()
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .map(|o| o.to_id_string());
    assert_eq!(curve.as_deref(), Some(SECP521R1));
    assert_eq!(
        cert.signature_algorithm.algorithm.to_id_string(),
        ECDSA_WITH_SHA512
    );
    assert_eq!(cert.subject().to_string(), "O=etcd");
    assert_eq!(cert.subject().iter_common_name().count(), 0);
    assert_eq!(cert.issuer(), cert.subject(), "self-signed");
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth && eku.other.is_empty());
    let usage = cert.key_usage().unwrap().unwrap();
    assert!(usage.critical);
    assert!(usage.value.digital_signature() && usage.value.key_encipherment());
    assert!(!usage.value.key_cert_sign());
    let constraints = cert.basic_constraints().unwrap().unwrap();
    assert!(constraints.critical && !constraints.value.ca);
    let validity = cert.validity();
    assert_eq!(
        validity.not_after.timestamp() - validity.not_before.timestamp(),
        3 * 365 * 24 * 3600
    );
    let names: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => format!("DNS:{d}"),
            GeneralName::IPAddress(ip) => format!("IP:{}", ip.len()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(names, ["DNS:localhost", "IP:4", "IP:16"], "Go's order");
    assert!(valid_for_host(&der, "::1") && valid_for_host(&der, "127.0.0.1"));

    // it serves (P-521 signs the handshake) ...
    let server = info.server_config().unwrap();
    let client = info.insecure_client_config().unwrap();
    assert!(handshake(server, client).await.is_ok());
    // ... and is reused as it is
    let before = std::fs::read(&cert_file).unwrap();
    self_signed(&fixtures, &["10.0.0.1".to_string()], 1).unwrap();
    assert_eq!(std::fs::read(&cert_file).unwrap(), before);
}
