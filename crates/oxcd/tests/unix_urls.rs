//! `unix://` and `unixs://` client URLs, against the real binary, as etcd
//! 3.5.16 serves them (server/embed/etcd.go `resolveUrl`,
//! client/pkg/transport/unix_listener.go): the socket file is the URL's
//! host with its port, then its path (`unix://localhost:2379` is the file
//! `localhost:2379` in the working directory); a file already there is
//! removed before listening, and the socket file when the member stops;
//! `unixs://` is TLS over the socket with the `https://` certificate flags.
//! Clients: etcdctl 3.4 and 3.5 (`--endpoints unix://localhost:2379`), curl
//! (`--unix-socket`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use testkit::pki::{CertFiles, TestCa, Usage};
use testkit::{oxcd_bin, Process, ETCD_34, ETCD_35};

/// etcd 3.5.16, for the refusal compared; skipped without it.
const ETCD_3516: &str = "/opt/etcd-3.5.16/etcd";

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The etcdctl binaries installed: 3.4 always, 3.5 when present.
fn etcdctls() -> Vec<&'static str> {
    let mut bins = vec![ETCD_34.1];
    if Path::new(ETCD_35.1).exists() {
        bins.push(ETCD_35.1);
    } else {
        eprintln!("etcdctl 3.5 not at {}: only 3.4 runs", ETCD_35.1);
    }
    bins
}

/// A client's TLS files: the CA to trust and its own certificate.
struct ClientTls<'a> {
    ca: &'a Path,
    cert: &'a CertFiles,
}

fn etcdctl_command(bin: &str, cwd: &Path, endpoint: &str, tls: Option<&ClientTls>) -> Command {
    let mut cmd = Command::new(bin);
    cmd.current_dir(cwd).env("ETCDCTL_API", "3").args([
        "--endpoints",
        endpoint,
        "--dial-timeout",
        "5s",
    ]);
    if let Some(tls) = tls {
        cmd.arg("--cacert")
            .arg(tls.ca)
            .arg("--cert")
            .arg(&tls.cert.cert)
            .arg("--key")
            .arg(&tls.cert.key);
    }
    cmd
}

/// etcdctl `bin` run in `cwd`; (success, stdout and stderr).
fn etcdctl(
    bin: &str,
    cwd: &Path,
    endpoint: &str,
    tls: Option<&ClientTls>,
    args: &[&str],
) -> (bool, String) {
    let out = etcdctl_command(bin, cwd, endpoint, tls)
        .args(["--command-timeout", "10s"])
        .args(args)
        .output()
        .expect("run etcdctl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Put, get, and a watch that replays the first put and sees a second one
/// live, with etcdctl `bin` on `endpoint`.
fn put_get_watch(bin: &str, cwd: &Path, endpoint: &str, tls: Option<&ClientTls>, key: &str) {
    let (ok, out) = etcdctl(bin, cwd, endpoint, tls, &["put", key, "first"]);
    assert!(ok && out.contains("OK"), "{bin} put on {endpoint}: {out}");
    let (ok, out) = etcdctl(bin, cwd, endpoint, tls, &["get", key]);
    assert!(
        ok && out.contains("first"),
        "{bin} get on {endpoint}: {out}"
    );
    let (ok, out) = etcdctl(bin, cwd, endpoint, tls, &["get", key, "-w", "json"]);
    assert!(ok, "{bin} get -w json: {out}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    let created = json["kvs"][0]["create_revision"]
        .as_i64()
        .expect("revision");

    let mut watch = etcdctl_command(bin, cwd, endpoint, tls)
        .args(["watch", key, "--rev", &created.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run etcdctl watch");
    let (lines_tx, lines) = mpsc::channel();
    let stdout = watch.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let wait_for = |value: &str, seen: &mut Vec<String>| {
        let end = Instant::now() + Duration::from_secs(20);
        while !seen.iter().any(|l| l == value) {
            let left = end.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => seen.push(line),
                Err(_) => panic!("{bin} watch on {endpoint}: no {value:?}; saw {seen:?}"),
            }
        }
    };
    // The replayed event proves the stream is up before the live put.
    wait_for("first", &mut seen);
    let (ok, out) = etcdctl(bin, cwd, endpoint, tls, &["put", key, "second"]);
    assert!(ok, "{bin} second put: {out}");
    wait_for("second", &mut seen);
    let _ = watch.kill();
    let _ = watch.wait();
}

#[test]
fn unix_url_listens_on_the_host_port_file_in_the_working_directory_for_etcdctl_34_and_35() {
    let dir = tempfile::tempdir().unwrap();
    let member = Process::start_oxcd_on(
        &oxcd_bin(),
        &dir.path().join("data"),
        dir.path(),
        "unix://localhost:12345",
        &[],
    );
    assert_eq!(member.endpoint, "unix://localhost:12345");
    let socket = dir.path().join("localhost:12345");
    let kind = std::fs::symlink_metadata(&socket)
        .expect("socket file")
        .file_type();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&kind), "{kind:?}");
    for (i, bin) in etcdctls().into_iter().enumerate() {
        // relative, as etcd's docs write it: the client runs in the same dir
        put_get_watch(
            bin,
            dir.path(),
            "unix://localhost:12345",
            None,
            &format!("k{i}"),
        );
    }
}

#[test]
fn unixs_url_is_tls_over_the_socket_with_client_certificates_and_their_cn_for_auth() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = TestCa::new(dir.path(), "ca");
    // etcd's clients check a unixs socket's certificate against the file
    // name before its ':' (client/v3/internal/endpoint: `localhost`); 3.4's
    // check the whole path of an absolute one (which no certificate names:
    // it fails against etcd 3.5.16 as well), so the socket is relative.
    let server = ca.issue("server", "oxcd", &["localhost"], Usage::Server);
    let root = ca.issue("root", "root", &[], Usage::Client);
    let stranger = ca.issue("stranger", "stranger", &[], Usage::Client);
    let ca_file = ca.ca_file();
    let url = "unixs://localhost:2379";
    let member = Process::start_oxcd_on(
        &oxcd_bin(),
        &dir.path().join("data"),
        dir.path(),
        url,
        &[
            "--cert-file",
            path(&server.cert),
            "--key-file",
            path(&server.key),
            "--trusted-ca-file",
            path(&ca_file),
            "--client-cert-auth",
        ],
    );
    assert_eq!(member.endpoint, url);
    assert!(member
        .wait_for_log("serving client traffic securely", Duration::ZERO)
        .is_some());
    let as_root = ClientTls {
        ca: &ca_file,
        cert: &root,
    };
    for (i, bin) in etcdctls().into_iter().enumerate() {
        put_get_watch(bin, dir.path(), url, Some(&as_root), &format!("k{i}"));
    }

    // Without a client certificate the handshake is refused.
    let (ok, out) = Command::new(ETCD_34.1)
        .current_dir(dir.path())
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", url, "--dial-timeout", "3s", "--cacert"])
        .arg(&ca_file)
        .args(["get", "k0"])
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .expect("run etcdctl");
    assert!(!ok, "a client without a certificate got through: {out}");
    let rejected = member
        .wait_for_log(
            "rejected connection on client endpoint",
            Duration::from_secs(10),
        )
        .expect("the refusal is logged");
    // Go's name for a Unix socket's unnamed client
    assert_eq!(
        testkit::json_field(&rejected, "remote-addr").as_deref(),
        Some("@"),
        "{rejected}"
    );

    // With auth on, the certificate's CN is the user (etcd's
    // --client-cert-auth): root may write, a CN that is no user may not.
    let bin = ETCD_34.1;
    for args in [
        &["user", "add", "root:secret"][..],
        &["auth", "enable"][..],
        &["put", "after-auth", "root-wrote"][..],
    ] {
        let (ok, out) = etcdctl(bin, dir.path(), url, Some(&as_root), args);
        assert!(ok, "{args:?} as root's certificate: {out}");
    }
    let as_stranger = ClientTls {
        ca: &ca_file,
        cert: &stranger,
    };
    let (ok, out) = etcdctl(bin, dir.path(), url, Some(&as_stranger), &["put", "x", "y"]);
    assert!(!ok, "a certificate of no user wrote: {out}");
    let (ok, out) = etcdctl(bin, dir.path(), url, Some(&as_root), &["get", "after-auth"]);
    assert!(ok && out.contains("root-wrote"), "{out}");
}

/// curl over a Unix socket: (HTTP status, body).
fn curl_unix(socket: &Path, url_path: &str) -> (String, String) {
    let out = Command::new("curl")
        .args(["-s", "-m", "10", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(socket)
        .arg(format!("http://localhost{url_path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.to_string(), body.to_string())
}

#[test]
fn http_and_unix_listeners_mix_and_http_urls_may_be_unix_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("etcd.sock");
    let unix_url = format!("unix://{}", path(&socket));
    let member = Process::start_oxcd_on(
        &oxcd_bin(),
        &dir.path().join("data"),
        dir.path(),
        &format!("http://127.0.0.1:0,{unix_url}"),
        &[],
    );
    let addresses = member.client_addresses();
    assert_eq!(addresses.len(), 2, "{addresses:?}");
    assert_eq!(addresses[1], path(&socket));
    let tcp = format!("http://{}", addresses[0]);
    let bin = ETCD_34.1;
    let (ok, out) = etcdctl(
        bin,
        dir.path(),
        &unix_url,
        None,
        &["put", "mixed", "over-unix"],
    );
    assert!(ok, "{out}");
    let (ok, out) = etcdctl(bin, dir.path(), &tcp, None, &["get", "mixed"]);
    assert!(ok && out.contains("over-unix"), "{out}");
    // gRPC and HTTP share a listener by default, on a socket too
    let (status, body) = curl_unix(&socket, "/health");
    assert_eq!(status, "200", "{body}");
    assert!(body.contains("\"health\":\"true\""), "{body}");
    drop(member);

    // --listen-client-http-urls on a socket: HTTP alone there, gRPC alone
    // on the client URL's socket.
    let grpc_socket = dir.path().join("grpc.sock");
    let http_socket = dir.path().join("http.sock");
    let grpc_url = format!("unix://{}", path(&grpc_socket));
    let http_url = format!("unix://{}", path(&http_socket));
    let member = Process::start_oxcd_on(
        &oxcd_bin(),
        &dir.path().join("data2"),
        dir.path(),
        &grpc_url,
        &["--listen-client-http-urls", &http_url],
    );
    assert_eq!(member.client_addresses().len(), 2);
    let (ok, out) = etcdctl(bin, dir.path(), &grpc_url, None, &["put", "split", "v"]);
    assert!(ok, "{out}");
    let (status, body) = curl_unix(&http_socket, "/health");
    assert_eq!(status, "200", "{body}");
    let (status, _) = curl_unix(&grpc_socket, "/health");
    assert_eq!(status, "404", "HTTP on the gRPC-only socket");
}

#[test]
fn the_socket_file_is_removed_when_the_member_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut member = Process::start_oxcd_on(
        &oxcd_bin(),
        &dir.path().join("data"),
        dir.path(),
        "unix://localhost:2379",
        &[],
    );
    let socket = dir.path().join("localhost:2379");
    assert!(socket.exists());
    let status = member.terminate(Duration::from_secs(30)).expect("exits");
    assert!(status.success(), "{status:?}: {}", member.log_text());
    assert!(!socket.exists(), "the socket file outlived the member");
}

#[test]
fn a_stale_socket_file_is_replaced_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("localhost:2379");
    // A socket file whose listener is gone (a member killed with -9).
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind"));
    assert!(socket.exists());
    // A process that another test forks meanwhile holds the listener until
    // it execs (close-on-exec): the socket goes stale once it has.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the stale socket still answers"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _member = Process::start_oxcd_on(
        &oxcd_bin(),
        &dir.path().join("data"),
        dir.path(),
        "unix://localhost:2379",
        &[],
    );
    let (ok, out) = etcdctl(
        ETCD_34.1,
        dir.path(),
        "unix://localhost:2379",
        None,
        &["put", "k", "v"],
    );
    assert!(ok, "{out}");
}

/// etcd's refusal of a TLS client URL without a certificate.
fn no_certificate_message(url: &str) -> String {
    format!(
        "TLS key/cert (--cert-file, --key-file) must be provided for client url {url} with HTTPS scheme"
    )
}

#[test]
fn an_unixs_url_without_certificates_refuses_to_start_as_etcd_does() {
    let dir = tempfile::tempdir().unwrap();
    let url = "unixs://localhost:2379";
    let mut member =
        Process::launch_oxcd_on(&oxcd_bin(), &dir.path().join("data"), dir.path(), url, &[]);
    let status = member.wait_exit(Duration::from_secs(30)).expect("exits");
    assert!(!status.success());
    let log = member.log_text();
    assert!(log.contains(&no_certificate_message(url)), "{log}");
    assert!(!dir.path().join("localhost:2379").exists());

    if !Path::new(ETCD_3516).exists() {
        eprintln!("skipped the comparison: no etcd 3.5.16 at {ETCD_3516}");
        return;
    }
    let peer = format!("http://127.0.0.1:{}", testkit::free_port());
    let etcd = Command::new(ETCD_3516)
        .current_dir(dir.path())
        .arg("--data-dir")
        .arg(dir.path().join("etcd-data"))
        .args(["--listen-client-urls", url, "--advertise-client-urls", url])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("default={peer}")])
        .output()
        .expect("run etcd");
    assert!(!etcd.status.success());
    let etcd_log = String::from_utf8_lossy(&etcd.stderr);
    assert!(
        etcd_log.contains(&format!("\"error\":\"{}\"", no_certificate_message(url))),
        "etcd 3.5.16 said: {etcd_log}"
    );
    assert!(
        log.contains(&format!("\"error\":\"{}\"", no_certificate_message(url))),
        "{log}"
    );
}
