//! What a refused client sees, in Go's words: Go's servers send
//! `bad_certificate` whatever was wrong with a client certificate, and Go
//! prints a received alert as `remote error: tls: <name>`; etcd's e2e
//! tests wait for a refused member to log `remote error: tls: bad
//! certificate`.

use rustls::AlertDescription;

use super::*;

/// The error the client's side of a handshake with `server` ends with:
/// at the handshake (TLS 1.2: the server refuses before its Finished) or
/// at the first read (TLS 1.3: the client is done before the server has
/// looked at its certificate).
async fn client_error(server: Arc<ServerConfig>, client: Arc<ClientConfig>) -> std::io::Error {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let serve = async move {
        let _ = tokio_rustls::TlsAcceptor::from(server).accept(a).await;
    };
    let dial = async move {
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client)
            .connect(name, b)
            .await?;
        tls.write_all(b"x").await?;
        tls.flush().await?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await?;
        Ok::<_, std::io::Error>(())
    };
    let (_, dialed) = tokio::join!(serve, dial);
    dialed.expect_err("the server refuses this client")
}

fn received_alert(error: &std::io::Error) -> Option<AlertDescription> {
    match error.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::AlertReceived(alert) => Some(*alert),
        _ => None,
    }
}

#[tokio::test]
async fn every_refused_client_certificate_gets_bad_certificate_as_from_go() {
    let mut pki = pki();
    let alice = pki
        .ca
        .issue("alice", "alice", &["m1.example.com"], Usage::Client);
    let revoked = pki.ca.issue("revoked", "bob", &[], Usage::Client);
    let crl = pki.ca.revoke("crl", &[revoked.serial]);
    let dir = tempfile::tempdir().unwrap();
    let mut other_ca = TestCa::new(dir.path(), "other");
    let stranger = other_ca.issue("stranger", "alice", &[], Usage::Client);
    let requiring = |max: &str| TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        client_cert_auth: true,
        max_version: Some(max.into()),
        ..info(&pki)
    };
    for max in ["TLS1.2", "TLS1.3"] {
        let cases = [
            ("another CA's certificate", requiring(max), &stranger),
            (
                "a revoked certificate",
                TlsInfo {
                    crl_file: Some(crl.clone()),
                    ..requiring(max)
                },
                &revoked,
            ),
            (
                "a CN not allowed",
                TlsInfo {
                    allowed_cns: vec!["carol".into()],
                    ..requiring(max)
                },
                &alice,
            ),
            (
                "a hostname not allowed",
                TlsInfo {
                    allowed_hostnames: vec!["m2.example.com".into()],
                    ..requiring(max)
                },
                &alice,
            ),
            (
                "an unreadable CRL",
                TlsInfo {
                    crl_file: Some(dir.path().join("missing.crl")),
                    ..requiring(max)
                },
                &alice,
            ),
        ];
        for (why, server, cert) in cases {
            let error = client_error(
                server.server_config().unwrap(),
                client(&pki.ca.ca_file(), Some(cert)),
            )
            .await;
            assert_eq!(
                received_alert(&error),
                Some(AlertDescription::BadCertificate),
                "{max}, {why}: {error}"
            );
            assert_eq!(
                go_error_chain_text(&error),
                "remote error: tls: bad certificate",
                "{max}, {why}"
            );
        }
    }
}

#[test]
fn alerts_and_verification_failures_read_as_gos() {
    let alert = |a| go_error_text(&rustls::Error::AlertReceived(a));
    assert_eq!(
        alert(AlertDescription::BadCertificate),
        "remote error: tls: bad certificate"
    );
    assert_eq!(
        alert(AlertDescription::UnknownCA),
        "remote error: tls: unknown certificate authority"
    );
    assert_eq!(
        alert(AlertDescription::CertificateRevoked),
        "remote error: tls: revoked certificate"
    );
    assert_eq!(
        alert(AlertDescription::ProtocolVersion),
        "remote error: tls: protocol version not supported"
    );
    assert_eq!(
        alert(AlertDescription::NoCertificate),
        "remote error: tls: alert(41)",
        "an alert Go has no name for"
    );
    assert_eq!(
        go_error_text(&rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer
        )),
        "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    );
    // through the I/O error tokio-rustls wraps it in
    let io = std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        rustls::Error::AlertReceived(AlertDescription::HandshakeFailure),
    );
    assert_eq!(
        go_error_chain_text(&io),
        "remote error: tls: handshake failure"
    );
    let plain = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert_eq!(go_error_chain_text(&plain), plain.to_string());
}
