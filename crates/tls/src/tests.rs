use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use testkit::pki::{CertFiles, TestCa, Usage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

mod alerts;
mod nist_p521;

/// A client of `ca`'s server certificate, presenting `cert` if given.
fn client(ca: &Path, cert: Option<&CertFiles>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(ca).unwrap() {
        roots.add(c).unwrap();
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let mut config = match cert {
        Some(c) => builder
            .with_client_auth_cert(read_certs(&c.cert).unwrap(), read_key(&c.key).unwrap())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// One handshake and one byte each way; the server's certificate serial
/// and the negotiated ALPN protocol, or the error either side saw.
async fn handshake(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let connector = tokio_rustls::TlsConnector::from(client);
    let serve = async move {
        let mut tls = acceptor.accept(a).await.map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        tls.write_all(&byte).await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    };
    let dial = async move {
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = connector
            .connect(name, b)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(b"x").await.map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        let (_, conn) = tls.get_ref();
        let leaf = conn.peer_certificates().unwrap()[0].clone();
        let serial = {
            use x509_parser::prelude::{FromDer, X509Certificate};
            X509Certificate::from_der(leaf.as_ref())
                .unwrap()
                .1
                .raw_serial()
                .to_vec()
        };
        Ok::<_, String>((serial, conn.alpn_protocol().map(<[u8]>::to_vec)))
    };
    let (served, dialed) = tokio::join!(serve, dial);
    let dialed = dialed?;
    served?;
    Ok(dialed)
}

struct Pki {
    _dir: tempfile::TempDir,
    ca: TestCa,
    server: CertFiles,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = TestCa::new(dir.path(), "ca");
    let server = ca.issue(
        "server",
        "server",
        &["localhost", "127.0.0.1"],
        Usage::Server,
    );
    Pki {
        _dir: dir,
        ca,
        server,
    }
}

fn info(pki: &Pki) -> TlsInfo {
    TlsInfo {
        cert_file: Some(pki.server.cert.clone()),
        key_file: Some(pki.server.key.clone()),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_server_certificate_alone_serves_h2_to_any_client() {
    let pki = pki();
    let server = info(&pki).server_config().unwrap();
    let (serial, alpn) = handshake(server, client(&pki.ca.ca_file(), None))
        .await
        .unwrap();
    assert_eq!(serial, vec![pki.server.serial as u8]);
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
}

#[tokio::test]
async fn a_trusted_ca_requires_a_client_certificate_it_signed() {
    let mut pki = pki();
    let good = pki.ca.issue("good", "alice", &[], Usage::Client);
    let dir = tempfile::tempdir().unwrap();
    let mut other_ca = TestCa::new(dir.path(), "other");
    let stranger = other_ca.issue("stranger", "mallory", &[], Usage::Client);
    let server = TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        ..info(&pki)
    }
    .server_config()
    .unwrap();
    let ca = pki.ca.ca_file();
    assert!(handshake(server.clone(), client(&ca, Some(&good)))
        .await
        .is_ok());
    let none = handshake(server.clone(), client(&ca, None)).await;
    assert!(none.is_err(), "no client certificate: {none:?}");
    let wrong = handshake(server, client(&ca, Some(&stranger))).await;
    assert!(wrong.is_err(), "a certificate of another CA: {wrong:?}");
    assert_eq!(
        client_common_name(&read_certs(&good.cert).unwrap()[0]).as_deref(),
        Some("alice")
    );
}

#[tokio::test]
async fn a_revoked_client_certificate_is_refused() {
    let mut pki = pki();
    let good = pki.ca.issue("good", "alice", &[], Usage::Client);
    let revoked = pki.ca.issue("revoked", "bob", &[], Usage::Client);
    let crl = pki.ca.revoke("crl", &[revoked.serial]);
    let server = TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        client_cert_auth: true,
        crl_file: Some(crl),
        ..info(&pki)
    }
    .server_config()
    .unwrap();
    let ca = pki.ca.ca_file();
    assert!(handshake(server.clone(), client(&ca, Some(&good)))
        .await
        .is_ok());
    let refused = handshake(server, client(&ca, Some(&revoked))).await;
    assert!(refused.is_err(), "{refused:?}");
}

#[tokio::test]
async fn replacing_the_files_rotates_the_certificate_and_a_broken_one_is_ignored() {
    let mut pki = pki();
    let server = info(&pki).server_config().unwrap();
    let ca = pki.ca.ca_file();
    let (first, _) = handshake(server.clone(), client(&ca, None)).await.unwrap();
    assert_eq!(first, vec![pki.server.serial as u8]);

    let next = pki
        .ca
        .issue("next", "server", &["localhost"], Usage::Server);
    std::fs::copy(&next.cert, &pki.server.cert).unwrap();
    std::fs::copy(&next.key, &pki.server.key).unwrap();
    let (rotated, _) = handshake(server.clone(), client(&ca, None)).await.unwrap();
    assert_eq!(
        rotated,
        vec![next.serial as u8],
        "new handshakes use the new files"
    );

    std::fs::write(&pki.server.cert, "-----BEGIN CERTIFICATE-----\nbroken").unwrap();
    let (kept, _) = handshake(server, client(&ca, None)).await.unwrap();
    assert_eq!(
        kept,
        vec![next.serial as u8],
        "the last good certificate is kept"
    );
}

#[test]
fn versions_and_cipher_suites_are_validated_in_etcds_words() {
    let refused = |info: TlsInfo| info.provider().err().unwrap().to_string();
    assert_eq!(
        refused(TlsInfo {
            min_version: Some("TLS1.1".into()),
            ..Default::default()
        }),
        r#"unexpected TLS version "TLS1.1" (must be one of: TLS1.2, TLS1.3)"#
    );
    assert_eq!(
        refused(TlsInfo {
            min_version: Some("TLS1.3".into()),
            max_version: Some("TLS1.2".into()),
            ..Default::default()
        }),
        "min version (TLS1.3) is greater than max version (TLS1.2)"
    );
    assert_eq!(
        refused(TlsInfo {
            min_version: Some("TLS1.3".into()),
            cipher_suites: vec!["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()],
            ..Default::default()
        }),
        "cipher suites cannot be configured when only TLS1.3 is enabled"
    );
    assert_eq!(
        refused(TlsInfo {
            cipher_suites: vec!["TLS_BOGUS".into()],
            ..Default::default()
        }),
        r#"unexpected TLS cipher suite "TLS_BOGUS""#
    );
    assert!(refused(TlsInfo {
        cipher_suites: vec!["TLS_RSA_WITH_AES_128_CBC_SHA".into()],
        ..Default::default()
    })
    .contains("not supported by oxcd"));
    let (provider, versions) = TlsInfo {
        cipher_suites: vec!["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into()],
        ..Default::default()
    }
    .provider()
    .unwrap();
    assert_eq!(versions, vec![TlsVersion::Tls12, TlsVersion::Tls13]);
    // the three TLS 1.3 suites and the one chosen
    assert_eq!(provider.cipher_suites.len(), 4);
}

#[test]
fn a_key_that_does_not_go_with_its_certificate_refuses_to_start() {
    let mut pki = pki();
    let other = pki.ca.issue("other", "x", &["localhost"], Usage::Server);
    let error = TlsInfo {
        key_file: Some(other.key.clone()),
        ..info(&pki)
    }
    .server_config()
    .err()
    .unwrap()
    .to_string();
    assert!(error.contains("does not go with"), "{error}");
}

#[tokio::test]
async fn the_dialer_verifies_the_server_for_the_uris_host_and_presents_the_client_certificate() {
    use tower_service::Service;
    let mut pki = pki();
    let alice = pki.ca.issue("alice", "alice", &[], Usage::Client);
    let server = TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        ..info(&pki)
    }
    .server_config()
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let served = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
        let (_, session) = tls.get_ref();
        let cn = session
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(client_common_name);
        Ok::<_, String>(cn)
    });
    let client = TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        cert_file: Some(alice.cert.clone()),
        key_file: Some(alice.key.clone()),
        ..Default::default()
    }
    .client_config()
    .unwrap();
    let mut dialer = TlsDialer::new(client);
    let uri: http::Uri = format!("https://127.0.0.1:{port}").parse().unwrap();
    let connection = dialer.call(uri).await.unwrap();
    let (_, session) = connection.inner().get_ref();
    assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(served.await.unwrap().unwrap().as_deref(), Some("alice"));

    let half = TlsInfo {
        cert_file: Some(alice.cert.clone()),
        ..Default::default()
    };
    assert_eq!(
        half.client_config().err().unwrap().to_string(),
        "ClientKeyFile and ClientCertFile must both be present or both absent"
    );
}

#[tokio::test]
async fn only_the_allowed_common_names_or_hostnames_get_in() {
    let mut pki = pki();
    let alice = pki
        .ca
        .issue("alice", "alice", &["m1.example.com"], Usage::Peer);
    let bob = pki.ca.issue("bob", "bob", &["10.0.0.2"], Usage::Peer);
    let ca = pki.ca.ca_file();
    let with = |cns: &[&str], hostnames: &[&str]| TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        allowed_cns: cns.iter().map(|s| s.to_string()).collect(),
        allowed_hostnames: hostnames.iter().map(|s| s.to_string()).collect(),
        ..info(&pki)
    };
    let by_cn = with(&["alice", "carol"], &[]).server_config().unwrap();
    assert!(handshake(by_cn.clone(), client(&ca, Some(&alice)))
        .await
        .is_ok());
    let refused = handshake(by_cn, client(&ca, Some(&bob))).await;
    assert!(refused.is_err(), "bob is not an allowed CN: {refused:?}");

    let by_host = with(&[], &["M1.example.com"]).server_config().unwrap();
    assert!(handshake(by_host.clone(), client(&ca, Some(&alice)))
        .await
        .is_ok());
    assert!(handshake(by_host, client(&ca, Some(&bob))).await.is_err());
    let by_ip = with(&[], &["10.0.0.2"]).server_config().unwrap();
    assert!(handshake(by_ip.clone(), client(&ca, Some(&bob)))
        .await
        .is_ok());
    assert!(handshake(by_ip, client(&ca, Some(&alice))).await.is_err());

    let both = with(&["a"], &["b", "c"]).server_config().err().unwrap();
    assert_eq!(
        both.to_string(),
        r#"AllowedCNs and AllowedHostnames are mutually exclusive (cns=["a"], hostnames=["b" "c"])"#
    );
}

#[test]
fn hostnames_match_as_go_matches_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = TestCa::new(dir.path(), "ca");
    let cert = ca.issue(
        "x",
        "x",
        &["*.example.com", "exact.org", "127.0.0.7"],
        Usage::Server,
    );
    let der = &read_certs(&cert.cert).unwrap()[0];
    assert!(valid_for_host(der, "a.example.com"));
    assert!(
        !valid_for_host(der, "a.b.example.com"),
        "a wildcard is one label"
    );
    assert!(!valid_for_host(der, "example.com"));
    assert!(valid_for_host(der, "EXACT.org"));
    assert!(valid_for_host(der, "127.0.0.7"));
    assert!(!valid_for_host(der, "127.0.0.8"));
}

#[tokio::test]
async fn outgoing_connections_present_the_client_files_when_given() {
    let mut pki = pki();
    let alice = pki.ca.issue("alice", "alice", &[], Usage::Client);
    let server = TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        allowed_cns: vec!["alice".into()],
        ..info(&pki)
    }
    .server_config()
    .unwrap();
    let member = TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        ..info(&pki)
    };
    // the listener's own certificate (CN "server") is not an allowed CN...
    let own = member.client_config().unwrap();
    assert!(handshake(server.clone(), own).await.is_err());
    // ...the explicit client certificate is
    let explicit = TlsInfo {
        client_cert_file: Some(alice.cert.clone()),
        client_key_file: Some(alice.key.clone()),
        ..member.clone()
    };
    assert!(handshake(server, explicit.client_config().unwrap())
        .await
        .is_ok());
    let half = TlsInfo {
        client_cert_file: Some(alice.cert.clone()),
        ..member
    };
    assert_eq!(
        half.outgoing_identity().err().unwrap().to_string(),
        "ClientKeyFile and ClientCertFile must both be present or both absent"
    );
}

#[tokio::test]
async fn outgoing_connections_present_the_certificate_as_its_files_are_now() {
    let mut pki = pki();
    let alice = pki.ca.issue("alice", "alice", &[], Usage::Client);
    let carol = pki.ca.issue("carol", "carol", &[], Usage::Client);
    let server = TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        allowed_cns: vec!["carol".into()],
        ..info(&pki)
    }
    .server_config()
    .unwrap();
    let client = TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        cert_file: Some(alice.cert.clone()),
        key_file: Some(alice.key.clone()),
        ..Default::default()
    }
    .client_config()
    .unwrap();
    assert!(handshake(server.clone(), client.clone()).await.is_err());
    std::fs::copy(&carol.key, &alice.key).unwrap();
    std::fs::copy(&carol.cert, &alice.cert).unwrap();
    assert!(
        handshake(server, client).await.is_ok(),
        "the same client configuration presents the replaced files"
    );
}

#[tokio::test]
async fn a_member_dials_only_servers_with_an_allowed_common_name() {
    let mut pki = pki();
    let alice = pki.ca.issue("alice", "alice", &[], Usage::Client);
    let server = info(&pki).server_config().unwrap();
    let dialing = |cns: &[&str]| {
        TlsInfo {
            trusted_ca_file: Some(pki.ca.ca_file()),
            cert_file: Some(alice.cert.clone()),
            key_file: Some(alice.key.clone()),
            allowed_cns: cns.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
        .client_config()
        .unwrap()
    };
    // the server's certificate has CN "server"
    assert!(handshake(server.clone(), dialing(&["server"]))
        .await
        .is_ok());
    let refused = handshake(server, dialing(&["someone-else"])).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("client certificate authentication failed")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_server_name_is_what_a_dialed_server_is_verified_for() {
    let mut pki = pki();
    let for_domain = pki
        .ca
        .issue("domain", "domain", &["oxcd.test"], Usage::Server);
    let server_for = |cert: &CertFiles| {
        TlsInfo {
            cert_file: Some(cert.cert.clone()),
            key_file: Some(cert.key.clone()),
            ..Default::default()
        }
        .server_config()
        .unwrap()
    };
    let dialer = TlsInfo {
        trusted_ca_file: Some(pki.ca.ca_file()),
        server_name: Some("oxcd.test".into()),
        ..Default::default()
    };
    // "localhost" is dialed; the certificate must be valid for the domain
    let client = dialer.client_config().unwrap();
    assert!(handshake(server_for(&for_domain), client.clone())
        .await
        .is_ok());
    assert!(handshake(server_for(&pki.server), client).await.is_err());
    let without = TlsInfo {
        server_name: None,
        ..dialer.clone()
    }
    .client_config()
    .unwrap();
    assert!(handshake(server_for(&pki.server), without.clone())
        .await
        .is_ok());
    assert!(handshake(server_for(&for_domain), without).await.is_err());
    let bad = TlsInfo {
        server_name: Some("not a name".into()),
        ..dialer
    };
    assert!(bad.client_config().is_err());
}
