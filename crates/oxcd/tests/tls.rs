//! TLS on the client port, against the real binary: etcdctl 3.4 and 3.5
//! with `--cacert/--cert/--key`, curl over https, refusals (no client
//! certificate, another CA's, a revoked one, plaintext, garbage), an
//! `https://` URL without a certificate, and a certificate rotated by
//! replacing its files.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::pki::{CertFiles, TestCa, Usage};
use testkit::{oxcd_bin, Process, ETCD_35};

/// A CA, the server's certificate and a client's, in `dir`.
struct Pki {
    ca: TestCa,
    server: CertFiles,
    client: CertFiles,
}

fn pki(dir: &Path) -> Pki {
    let mut ca = TestCa::new(dir, "ca");
    let server = ca.issue("server", "oxcd", &["localhost", "127.0.0.1"], Usage::Server);
    let client = ca.issue("client", "root", &[], Usage::Client);
    Pki { ca, server, client }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The server flags: its certificate, and client certificates required.
fn server_flags(pki: &Pki) -> Vec<String> {
    vec![
        "--cert-file".into(),
        path(&pki.server.cert).into(),
        "--key-file".into(),
        path(&pki.server.key).into(),
        "--trusted-ca-file".into(),
        path(&pki.ca.ca_file()).into(),
        "--client-cert-auth".into(),
    ]
}

fn start(data: &Path, flags: &[String]) -> Process {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Process::start_oxcd_secure(&oxcd_bin(), data, &flags)
}

/// etcdctl (`bin`) over TLS with the client certificate `cert` (None: no
/// certificate); (success, output).
fn etcdctl(
    bin: &str,
    endpoint: &str,
    ca: &Path,
    cert: Option<&CertFiles>,
    args: &[&str],
) -> (bool, String) {
    let mut cmd = Command::new(bin);
    cmd.env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            endpoint,
            "--dial-timeout",
            "3s",
            "--command-timeout",
            "4s",
        ])
        .args(["--cacert", path(ca)]);
    if let Some(cert) = cert {
        cmd.args(["--cert", path(&cert.cert), "--key", path(&cert.key)]);
    }
    let out = cmd.args(args).output().expect("etcdctl runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn curl(url: &str, pki: &Pki, cert: bool) -> (bool, String) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "--cacert",
        path(&pki.ca.ca_file()),
    ]);
    if cert {
        cmd.args([
            "--cert",
            path(&pki.client.cert),
            "--key",
            path(&pki.client.key),
        ]);
    }
    let out = cmd.arg(url).output().expect("curl runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn etcdctl_34_and_35_and_curl_work_over_tls_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let member = start(&dir.path().join("data"), &server_flags(&pki));
    assert!(
        member.endpoint.starts_with("https://"),
        "{}",
        member.endpoint
    );
    let ca = pki.ca.ca_file();
    let endpoint = member.host_port().to_string();

    let (ok, out) = etcdctl(
        "etcdctl",
        &endpoint,
        &ca,
        Some(&pki.client),
        &["put", "k", "over tls"],
    );
    assert!(ok, "etcdctl 3.4 put: {out}");
    let (ok, out) = etcdctl(
        "etcdctl",
        &endpoint,
        &ca,
        Some(&pki.client),
        &["get", "k", "--print-value-only"],
    );
    assert!(ok && out.contains("over tls"), "etcdctl 3.4 get: {out}");
    if Path::new(ETCD_35.1).exists() {
        let (ok, out) = etcdctl(
            ETCD_35.1,
            &endpoint,
            &ca,
            Some(&pki.client),
            &["get", "k", "--print-value-only"],
        );
        assert!(ok && out.contains("over tls"), "etcdctl 3.5 get: {out}");
        let (ok, out) = etcdctl(
            ETCD_35.1,
            &endpoint,
            &ca,
            Some(&pki.client),
            &["endpoint", "status", "-w", "table"],
        );
        assert!(
            ok && out.contains(&endpoint),
            "etcdctl 3.5 endpoint status: {out}"
        );
    }

    let (ok, out) = curl(&format!("{}/health", member.endpoint), &pki, true);
    assert!(
        ok && out.contains("\"health\":\"true\""),
        "curl /health: {out}"
    );
    let (ok, out) = curl(&format!("{}/metrics", member.endpoint), &pki, true);
    assert!(
        ok && out.contains("etcd_server_has_leader 1"),
        "curl /metrics: {out}"
    );
    let (ok, out) = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert", path(&ca)])
        .args([
            "--cert",
            path(&pki.client.cert),
            "--key",
            path(&pki.client.key),
        ])
        .args(["-X", "POST", "-d", r#"{"key":"aw=="}"#])
        .arg(format!("{}/v3/kv/range", member.endpoint))
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
            )
        })
        .unwrap();
    assert!(ok && out.contains("\"kvs\""), "gateway over https: {out}");
}

/// A member's PKI, plus a revoked client certificate (in the CRL the flags
/// name) and one from another CA.
struct Refusals {
    pki: Pki,
    revoked: CertFiles,
    stranger: CertFiles,
    flags: Vec<String>,
    _other_dir: tempfile::TempDir,
}

fn refusals(dir: &Path) -> Refusals {
    let mut pki = pki(dir);
    let revoked = pki.ca.issue("revoked", "bob", &[], Usage::Client);
    let crl = pki.ca.revoke("crl", &[revoked.serial]);
    let other_dir = tempfile::tempdir().unwrap();
    let mut other_ca = TestCa::new(other_dir.path(), "other");
    let stranger = other_ca.issue("stranger", "mallory", &[], Usage::Client);
    let mut flags = server_flags(&pki);
    flags.extend(["--client-crl-file".to_string(), path(&crl).to_string()]);
    Refusals {
        pki,
        revoked,
        stranger,
        flags,
        _other_dir: other_dir,
    }
}

#[test]
fn clients_without_a_good_certificate_are_refused_and_logged_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let Refusals {
        pki,
        revoked,
        stranger,
        flags,
        _other_dir,
    } = refusals(dir.path());
    let member = start(&dir.path().join("data"), &flags);
    let ca = pki.ca.ca_file();
    let endpoint = member.host_port().to_string();

    // a client that connects and never speaks holds up nobody
    let silent = TcpStream::connect(&endpoint).unwrap();
    // garbage and plaintext HTTP on the TLS port
    let mut garbage = TcpStream::connect(&endpoint).unwrap();
    garbage
        .write_all(&[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3, 4])
        .unwrap();
    let (ok, out) = Command::new("curl")
        .args(["-sS", "--max-time", "5"])
        .arg(format!("http://{endpoint}/health"))
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap();
    assert!(!ok, "plaintext HTTP on a TLS port: {out}");

    for (who, cert) in [
        ("no certificate", None),
        ("another CA's", Some(&stranger)),
        ("a revoked one", Some(&revoked)),
    ] {
        let (ok, out) = etcdctl("etcdctl", &endpoint, &ca, cert, &["get", "k"]);
        assert!(!ok, "{who} was let in: {out}");
    }
    let (ok, out) = etcdctl(
        "etcdctl",
        &endpoint,
        &ca,
        Some(&pki.client),
        &["put", "k", "v"],
    );
    assert!(ok, "a good client after the refusals: {out}");
    assert!(
        member
            .wait_for_log(
                "rejected connection on client endpoint",
                Duration::from_secs(10)
            )
            .is_some(),
        "refusals are logged as etcd logs them"
    );
    // the garbage connection was answered (an alert at most) and closed
    garbage
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    let closed = match garbage.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(
        closed,
        "a connection sending garbage is closed ({} bytes)",
        rest.len()
    );
    drop(silent);
}

#[test]
fn an_https_url_without_a_certificate_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut member = Process::launch_oxcd_with(&oxcd_bin(), &dir.path().join("data"), "https", &[]);
    let status = member.wait_exit(Duration::from_secs(30)).expect("exits");
    assert!(!status.success());
    let log = member.log_text();
    assert!(
        log.contains("TLS key/cert (--cert-file, --key-file) must be provided for client url https://127.0.0.1:0 with HTTPS scheme"),
        "{log}"
    );

    let pki = pki(dir.path());
    let mut member = Process::launch_oxcd_with(
        &oxcd_bin(),
        &dir.path().join("data2"),
        "https",
        &[
            "--cert-file",
            path(&pki.server.cert),
            "--key-file",
            path(&pki.server.key),
            "--cipher-suites",
            "TLS_BOGUS",
        ],
    );
    let status = member.wait_exit(Duration::from_secs(30)).expect("exits");
    assert!(!status.success());
    let log = member.log_text();
    assert!(
        log.contains(r#"unexpected TLS cipher suite \"TLS_BOGUS\""#)
            || log.contains(r#"unexpected TLS cipher suite "TLS_BOGUS""#),
        "{log}"
    );
}

#[test]
fn replacing_the_certificate_files_rotates_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut pki = pki(dir.path());
    let member = start(&dir.path().join("data"), &server_flags(&pki));
    let ca = pki.ca.ca_file();
    let endpoint = member.host_port().to_string();
    let served_serial = || {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl s_client -connect {endpoint} -CAfile {} -cert {} -key {} </dev/null 2>/dev/null | openssl x509 -noout -serial",
                path(&ca),
                path(&pki.client.cert),
                path(&pki.client.key)
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(served_serial(), format!("serial={:02X}", pki.server.serial));

    let next = pki
        .ca
        .issue("next", "oxcd", &["localhost", "127.0.0.1"], Usage::Server);
    // key first, then the certificate: a handshake in between sees a pair
    // that does not match and keeps the old one
    std::fs::copy(&next.key, &pki.server.key).unwrap();
    std::fs::copy(&next.cert, &pki.server.cert).unwrap();
    assert_eq!(served_serial(), format!("serial={:02X}", next.serial));
    let (ok, out) = etcdctl(
        "etcdctl",
        &endpoint,
        &ca,
        Some(&pki.client),
        &["put", "k", "rotated"],
    );
    assert!(ok, "{out}");

    std::fs::write(&pki.server.cert, "not a certificate").unwrap();
    assert_eq!(
        served_serial(),
        format!("serial={:02X}", next.serial),
        "the last good one is kept"
    );
    assert!(member
        .wait_for_log("failed to reload the certificate", Duration::from_secs(10))
        .is_some());
}

#[test]
fn auto_tls_makes_a_self_signed_certificate_once_and_reuses_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut member = Process::start_oxcd_secure(&oxcd_bin(), &data, &["--auto-tls"]);
    assert!(member
        .wait_for_log(
            "automatically generate certificates",
            Duration::from_secs(5)
        )
        .is_some());
    let fixtures = data.join("fixtures").join("client");
    let cert = std::fs::read(fixtures.join("cert.pem")).unwrap();
    let mode = std::fs::metadata(fixtures.join("key.pem"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the key is private");
    let text = Command::new("openssl")
        .args([
            "x509",
            "-noout",
            "-subject",
            "-ext",
            "subjectAltName,extendedKeyUsage",
            "-in",
        ])
        .arg(fixtures.join("cert.pem"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("O = etcd") || text.contains("O=etcd"),
        "{text}"
    );
    assert!(text.contains("IP Address:127.0.0.1"), "{text}");
    assert!(text.contains("TLS Web Server Authentication"), "{text}");

    // a client that skips verification (as etcd's own auto-TLS clients do)
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            member.host_port(),
            "--insecure-transport=false",
        ])
        .args([
            "--insecure-skip-tls-verify",
            "--command-timeout",
            "5s",
            "put",
            "k",
            "v",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    member.terminate(Duration::from_secs(10));
    let again = Process::start_oxcd_secure(&oxcd_bin(), &data, &["--auto-tls"]);
    assert_eq!(
        std::fs::read(fixtures.join("cert.pem")).unwrap(),
        cert,
        "reused on restart"
    );
    assert!(again
        .wait_for_log(
            "automatically generate certificates",
            Duration::from_millis(200)
        )
        .is_none());
}

/// A 3-member cluster with TLS between members (`https://` peer URLs,
/// member certificates required and verified) and on the client port.
#[test]
fn a_three_member_cluster_replicates_over_peer_tls_with_client_certificates() {
    let mut cluster = testkit::Cluster::prepare_with(3, "https", "https", &[]);
    let mut ca = TestCa::new(cluster.dir(), "ca");
    // members dial from 127.0.0.1 on loopback: their certificates name it
    // too, as a real member's names the address it dials from
    let mut owned_ips = cluster.ips.clone();
    owned_ips.push("127.0.0.1".into());
    let ips: Vec<&str> = owned_ips.iter().map(String::as_str).collect();
    let member = ca.issue("member", "etcd-member", &ips, Usage::Peer);
    let intruder = ca.issue("intruder", "intruder", &ips, Usage::Peer);
    let elsewhere = ca.issue("elsewhere", "etcd-member", &["10.9.9.9"], Usage::Peer);
    let revoked = ca.issue("revoked", "etcd-member", &ips, Usage::Peer);
    let crl = ca.revoke("crl", &[revoked.serial]);
    let client = ca.issue("client", "root", &[], Usage::Client);
    let ca_file = ca.ca_file();
    let (cert, key, ca_path) = (path(&member.cert), path(&member.key), path(&ca_file));
    cluster.add_flags(&[
        "--cert-file",
        cert,
        "--key-file",
        key,
        "--trusted-ca-file",
        ca_path,
        "--client-cert-auth",
        "--peer-cert-file",
        cert,
        "--peer-key-file",
        key,
        "--peer-trusted-ca-file",
        ca_path,
        "--peer-client-cert-auth",
        "--peer-cert-allowed-cn",
        "etcd-member,other-member",
        "--peer-crl-file",
        path(&crl),
    ]);
    cluster.start_all();
    let endpoint = |i: usize| {
        cluster
            .endpoint(i)
            .trim_start_matches("https://")
            .to_string()
    };

    // a watch on m3 over TLS sees the put made on m1
    let mut watch = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &endpoint(2), "--cacert", path(&ca_file)])
        .args(["--cert", path(&client.cert), "--key", path(&client.key)])
        // from revision 1: the put is seen however late the watch starts
        .args(["watch", "k", "--rev", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (ok, out) = etcdctl(
        "etcdctl",
        &endpoint(0),
        &ca_file,
        Some(&client),
        &["put", "k", "over peer tls"],
    );
    assert!(ok, "put: {out}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out) = etcdctl(
            "etcdctl",
            &endpoint(2),
            &ca_file,
            Some(&client),
            &["get", "k", "--print-value-only"],
        );
        if ok && out.contains("over peer tls") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not replicated to m3: {out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // the watch prints the event line by line: read until the value (or
    // until the process is killed at the deadline)
    let stdout = watch.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut seen = String::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("over peer tls") {
                break;
            }
        }
        seen
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !reader.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = reader.join().unwrap_or_default();
    assert!(
        seen.contains("PUT") && seen.contains("over peer tls"),
        "watch over TLS saw {seen:?}"
    );
    if Path::new(ETCD_35.1).exists() {
        let (ok, out) = etcdctl(
            ETCD_35.1,
            &endpoint(0),
            &ca_file,
            Some(&client),
            &["endpoint", "status", "--cluster", "-w", "table"],
        );
        assert!(
            ok && out.matches("https://").count() == 3,
            "etcdctl 3.5 endpoint status --cluster: {out}"
        );
    }
    let all = (0..3).map(endpoint).collect::<Vec<_>>().join(",");
    let (ok, out) = etcdctl(
        "etcdctl",
        &all,
        &ca_file,
        Some(&client),
        &["endpoint", "status", "-w", "table"],
    );
    assert!(
        ok && out.matches("true").count() == 1,
        "one leader among three: {out}"
    );
    let (ok, out) = etcdctl(
        "etcdctl",
        &endpoint(1),
        &ca_file,
        Some(&client),
        &["member", "list"],
    );
    assert!(
        ok && out.matches("https://").count() == 6,
        "member list: {out}"
    );

    // a member with a certificate from another CA is refused on the peer port
    let other_dir = tempfile::tempdir().unwrap();
    let mut other_ca = TestCa::new(other_dir.path(), "other");
    let stranger = other_ca.issue("stranger", "m2", &ips, Usage::Peer);
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-k"])
        .args(["--cert", path(&stranger.cert), "--key", path(&stranger.key)])
        .arg(format!("{}/members", cluster.peer_url(0)))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a stranger's certificate was accepted"
    );
    assert!(cluster.members[0]
        .as_ref()
        .unwrap()
        .wait_for_log(
            "rejected connection on peer endpoint",
            Duration::from_secs(10)
        )
        .is_some());

    // the same CA, but a Common Name outside --peer-cert-allowed-cn, and a
    // certificate that does not name the address it connects from
    for (who, cert) in [
        ("an intruder's CN", &intruder),
        ("a certificate for 10.9.9.9", &elsewhere),
        ("a revoked member certificate", &revoked),
    ] {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "5", "--cacert", ca_path])
            .args(["--cert", path(&cert.cert), "--key", path(&cert.key)])
            .arg(format!("{}/members", cluster.peer_url(0)))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{who} was accepted");
    }
    let first = cluster.members[0].as_ref().unwrap();
    assert!(first
        .wait_for_log(
            "client certificate authentication failed",
            Duration::from_secs(10)
        )
        .is_some());
    assert!(
        first
            .wait_for_log("wanted to match", Duration::from_secs(10))
            .is_some(),
        "the SAN check refused the certificate for 10.9.9.9"
    );
}

/// `--peer-auto-tls`: each member makes its own certificate and verifies
/// no peer's (etcd's InsecureSkipVerify), the links are encrypted all the
/// same.
#[test]
fn a_peer_auto_tls_cluster_replicates() {
    let mut cluster = testkit::Cluster::prepare_with(3, "http", "https", &["--peer-auto-tls"]);
    cluster.start_all();
    let (ok, out) = common_etcdctl(&cluster.endpoint(0), &["put", "k", "auto"]);
    assert!(ok, "{out}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out) = common_etcdctl(&cluster.endpoint(2), &["get", "k", "--print-value-only"]);
        if ok && out.contains("auto") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not replicated: {out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(cluster
        .dir()
        .join("m1")
        .join("fixtures")
        .join("peer")
        .join("cert.pem")
        .exists());
}

fn common_etcdctl(endpoint: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "--command-timeout", "5s"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// etcd 3.5.16 where `REF_ETCD=3.5.16 ../shared/tools/ref-etcd` installed
/// it, else 3.5.1 (which CI installs).
fn reference_etcd() -> &'static str {
    const ETCD_3516: &str = "/opt/etcd-3.5.16/etcd";
    if Path::new(ETCD_3516).exists() {
        ETCD_3516
    } else {
        ETCD_35.0
    }
}

/// The same certificates and flags against etcd 3.5: every client that
/// etcd lets in, oxcd lets in, and every one etcd refuses, oxcd refuses.
#[test]
fn refusals_match_etcd_35_with_the_same_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let Refusals {
        pki,
        revoked,
        stranger,
        flags,
        _other_dir,
    } = refusals(dir.path());
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let Some(etcd) = testkit::start_reference_etcd_with(
        reference_etcd(),
        &dir.path().join("etcd"),
        "https",
        &flag_refs,
    ) else {
        eprintln!("skipped: no etcd 3.5 at {}", reference_etcd());
        return;
    };
    let oxcd = start(&dir.path().join("oxcd"), &flags);
    let ca = pki.ca.ca_file();
    let cases: [(&str, Option<&CertFiles>); 4] = [
        ("a good certificate", Some(&pki.client)),
        ("no certificate", None),
        ("another CA's", Some(&stranger)),
        ("a revoked one", Some(&revoked)),
    ];
    for (who, cert) in cases {
        let (etcd_ok, etcd_out) =
            etcdctl("etcdctl", etcd.host_port(), &ca, cert, &["put", "k", "v"]);
        let (oxcd_ok, oxcd_out) =
            etcdctl("etcdctl", oxcd.host_port(), &ca, cert, &["put", "k", "v"]);
        assert_eq!(
            oxcd_ok, etcd_ok,
            "{who}: etcd {etcd_out:?}, oxcd {oxcd_out:?}"
        );
    }
    for (name, member) in [("etcd", &etcd), ("oxcd", &oxcd)] {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "5"])
            .arg(format!("http://{}/health", member.host_port()))
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{name} answered plaintext on its TLS port"
        );
    }
}

#[test]
fn a_tls_client_on_a_plaintext_port_is_refused_and_the_port_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let member = Process::start_oxcd(&oxcd_bin(), &dir.path().join("data"), &[]);
    let endpoint = member.host_port().to_string();
    let (ok, out) = curl(&format!("https://{endpoint}/health"), &pki, true);
    assert!(!ok, "TLS on a plaintext port: {out}");
    let (ok, out) = etcdctl(
        "etcdctl",
        &endpoint,
        &pki.ca.ca_file(),
        Some(&pki.client),
        &["get", "k"],
    );
    assert!(!ok, "etcdctl over TLS on a plaintext port: {out}");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5"])
        .arg(format!("http://{endpoint}/health"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"health\":\"true\""),
        "plaintext still served"
    );
}

/// `--listen-client-http-urls` (etcd 3.5.8+): HTTP alone there, gRPC alone
/// on the client URLs.
#[test]
fn listen_client_http_urls_split_http_from_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let http_port = testkit::free_port();
    let http_url = format!("http://127.0.0.1:{http_port}");
    let member = Process::start_oxcd(
        &oxcd_bin(),
        &dir.path().join("data"),
        &["--listen-client-http-urls", &http_url],
    );
    let grpc = member.host_port().to_string();
    let (ok, out) = common_etcdctl(&grpc, &["put", "k", "v"]);
    assert!(ok, "gRPC on the client URL: {out}");
    let (ok, _) = common_etcdctl(&format!("127.0.0.1:{http_port}"), &["get", "k"]);
    assert!(!ok, "gRPC on the HTTP-only URL");
    let health = |base: &str| {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "5"])
            .arg(format!("{base}/health"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(health(&http_url).contains("\"health\":\"true\""));
    assert!(
        !health(&format!("http://{grpc}")).contains("health"),
        "no HTTP on the gRPC URL"
    );

    let mut clash = Process::launch_oxcd_with(
        &oxcd_bin(),
        &dir.path().join("data2"),
        "http",
        &["--listen-client-http-urls", "http://127.0.0.1:0"],
    );
    assert!(!clash.wait_exit(Duration::from_secs(30)).unwrap().success());
    assert!(clash.log_text().contains(
        "cannot bind both --client-listen-urls and --client-listen-http-urls on the same url"
    ));
}

/// `--tls-min-version`, `--tls-max-version` and `--cipher-suites` refused
/// as etcd 3.5.16 refuses them (3.5.1 has no version flags: skipped there).
#[test]
fn tls_version_refusals_match_etcd_3516() {
    const ETCD_3516: &str = "/opt/etcd-3.5.16/etcd";
    if !Path::new(ETCD_3516).exists() {
        eprintln!("skipped: no etcd 3.5.16 at {ETCD_3516}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let cases: [&[&str]; 3] = [
        &["--tls-min-version", "TLS1.1"],
        &["--tls-min-version", "TLS1.3", "--tls-max-version", "TLS1.2"],
        &[
            "--tls-min-version",
            "TLS1.3",
            "--cipher-suites",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        ],
    ];
    let expected = [
        r#"unexpected TLS version \"TLS1.1\" (must be one of: TLS1.2, TLS1.3)"#,
        "min version (TLS1.3) is greater than max version (TLS1.2)",
        "cipher suites cannot be configured when only TLS1.3 is enabled",
    ];
    for (i, (case, want)) in cases.iter().zip(expected).enumerate() {
        let mut flags = vec![
            "--cert-file",
            path(&pki.server.cert),
            "--key-file",
            path(&pki.server.key),
        ];
        flags.extend_from_slice(case);
        let port = testkit::free_port();
        let url = format!("https://127.0.0.1:{port}");
        let etcd = Command::new(ETCD_3516)
            .arg("--data-dir")
            .arg(dir.path().join(format!("etcd{i}")))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args([
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", testkit::free_port()),
            ])
            .args(&flags)
            .output()
            .unwrap();
        let etcd_said = String::from_utf8_lossy(&etcd.stderr).into_owned();
        assert!(!etcd.status.success(), "etcd started with {case:?}");
        let mut oxcd = Process::launch_oxcd_with(
            &oxcd_bin(),
            &dir.path().join(format!("oxcd{i}")),
            "https",
            &flags,
        );
        assert!(
            !oxcd.wait_exit(Duration::from_secs(30)).unwrap().success(),
            "oxcd started with {case:?}"
        );
        let unquoted = want.replace("\\\"", "\"");
        assert!(
            etcd_said.contains(want) || etcd_said.contains(&unquoted),
            "etcd 3.5.16 said {etcd_said}"
        );
        let log = oxcd.log_text();
        assert!(
            log.contains(want) || log.contains(&unquoted),
            "{case:?}: oxcd said {log}"
        );
    }
}
