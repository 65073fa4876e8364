//! What the client URLs let a client do, checked against etcd 3.5.16 run
//! beside oxcd in the same test (etcd 3.5.1, which answers alike, where
//! 3.5.16 is not installed):
//!
//! * `--grpc-keepalive-min-time`: grpc-go's keepalive enforcement policy.
//!   A raw HTTP/2 client counts the frames: the fourth ping in a row (the
//!   third strike) is ACKed, then GOAWAY ENHANCE_YOUR_CALM "too_many_pings"
//!   naming the last stream, then the connection ends; without a stream
//!   pings must be 2 h apart; pings spaced beyond the minimum are fine. On a
//!   TLS URL that also serves HTTP there is no policy (Go's HTTP/2 server
//!   carries etcd's gRPC there); on a TLS URL serving gRPC alone there is.
//! * `--host-whitelist`: 421 and etcd's text for another Host on a plain
//!   URL, any Host over TLS, never for gRPC on a plain URL.
//! * `--cors`: the CORS headers for a listed Origin, none for another;
//!   OPTIONS answered 200 on any path; over TLS on gRPC answers too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::pki::{CertFiles, TestCa, Usage};
use testkit::{oxcd_bin, Process};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const ETCD_3516: &str = "/opt/etcd-3.5.16/etcd";

/// The etcd to compare with, if one is installed.
fn reference_etcd() -> Option<&'static str> {
    [ETCD_3516, testkit::ETCD_35.0]
        .into_iter()
        .find(|bin| Path::new(bin).exists())
}

const MIN_TIME: &str = "200ms";
/// Twice the minimum: pings this far apart never strike, however late one
/// of them is read.
const SPACED: Duration = Duration::from_millis(400);
/// How long a test waits for any one frame.
const FRAME_DEADLINE: Duration = Duration::from_secs(10);

// ---- a raw HTTP/2 client ----

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK literal header field, neither indexed nor Huffman-coded.
fn literal(name: &str, value: &str) -> Vec<u8> {
    let mut out = vec![0, name.len() as u8];
    out.extend(name.as_bytes());
    out.push(value.len() as u8);
    out.extend(value.as_bytes());
    out
}

/// What the server said after a ping.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Ack,
    GoAway {
        last_stream: u32,
        code: u32,
        debug: String,
    },
    Closed,
}

/// HTTP/2 spoken frame by frame, so that every frame the server sends is
/// seen as it is.
struct RawH2 {
    io: Box<dyn Io>,
    buf: Vec<u8>,
}

impl RawH2 {
    /// Connects to `endpoint` (`http://` or `https://`, trusting `ca`) and
    /// sends the preface and SETTINGS.
    async fn connect(endpoint: &str, ca: Option<&Path>) -> RawH2 {
        let io: Box<dyn Io> = match endpoint.strip_prefix("https://") {
            Some(_) => {
                use tonic::codegen::Service;
                let info = tls::TlsInfo {
                    trusted_ca_file: ca.map(Path::to_path_buf),
                    ..Default::default()
                };
                let mut dialer = tls::TlsDialer::new(info.client_config().unwrap());
                let uri: tonic::codegen::http::Uri = endpoint.parse().unwrap();
                Box::new(dialer.call(uri).await.unwrap().into_inner())
            }
            None => Box::new(
                tokio::net::TcpStream::connect(endpoint.trim_start_matches("http://"))
                    .await
                    .unwrap(),
            ),
        };
        let mut conn = RawH2 {
            io,
            buf: Vec::new(),
        };
        let mut opening = PREFACE.to_vec();
        opening.extend(frame(SETTINGS, 0, 0, &[]));
        conn.io.write_all(&opening).await.unwrap();
        conn
    }

    /// Opens stream 1, a Range call whose request never comes: a stream
    /// that stays open, on which neither server sends anything.
    async fn open_stream(&mut self, scheme: &str) {
        let mut block = literal(":method", "POST");
        block.extend(literal(":scheme", scheme));
        block.extend(literal(":path", "/etcdserverpb.KV/Range"));
        block.extend(literal(":authority", "localhost"));
        block.extend(literal("content-type", "application/grpc"));
        block.extend(literal("te", "trailers"));
        let headers = frame(HEADERS, END_HEADERS, 1, &block);
        self.io.write_all(&headers).await.unwrap();
    }

    /// The next frame: (type, flags, payload); None once the connection
    /// ends.
    async fn next_frame(&mut self) -> Option<(u8, u8, Vec<u8>)> {
        loop {
            if self.buf.len() >= 9 {
                let length =
                    u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() >= 9 + length {
                    let frame: Vec<u8> = self.buf.drain(..9 + length).collect();
                    return Some((frame[3], frame[4], frame[9..].to_vec()));
                }
            }
            let mut chunk = [0u8; 4096];
            let read = tokio::time::timeout(FRAME_DEADLINE, self.io.read(&mut chunk))
                .await
                .expect("the server answers within the deadline");
            match read {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Pings with payload `n` and reads until its ACK, a GOAWAY or the end
    /// (the server's SETTINGS are acknowledged on the way).
    async fn ping(&mut self, n: u8) -> Answer {
        // the server may have closed already: its GOAWAY is still to be read
        let _ = self.io.write_all(&frame(PING, 0, 0, &[n; 8])).await;
        loop {
            match self.next_frame().await {
                None => return Answer::Closed,
                Some((SETTINGS, flags, _)) if flags & ACK == 0 => {
                    let _ = self.io.write_all(&frame(SETTINGS, ACK, 0, &[])).await;
                }
                Some((PING, ACK, payload)) if payload == [n; 8] => return Answer::Ack,
                Some((GOAWAY, _, payload)) => {
                    return Answer::GoAway {
                        last_stream: u32::from_be_bytes(payload[..4].try_into().unwrap()),
                        code: u32::from_be_bytes(payload[4..8].try_into().unwrap()),
                        debug: String::from_utf8_lossy(&payload[8..]).into_owned(),
                    }
                }
                Some(_) => {}
            }
        }
    }

    /// Whether the server ends the connection (reading what it still
    /// sends).
    async fn ends(&mut self) -> bool {
        let deadline = Instant::now() + FRAME_DEADLINE;
        while Instant::now() < deadline {
            if self.next_frame().await.is_none() {
                return true;
            }
        }
        false
    }
}

/// Pings back to back, at most `max` times, until an answer is not an ACK:
/// the pings ACKed and that answer (None: all were ACKed).
async fn ping_flood(conn: &mut RawH2, max: u8) -> (u8, Option<Answer>) {
    for n in 1..=max {
        match conn.ping(n).await {
            Answer::Ack => {}
            other => return (n - 1, Some(other)),
        }
    }
    (max, None)
}

fn too_many_pings(last_stream: u32) -> Option<Answer> {
    Some(Answer::GoAway {
        last_stream,
        code: 0xb, // ENHANCE_YOUR_CALM
        debug: "too_many_pings".into(),
    })
}

/// What a server does with ping floods, with and without a stream, and
/// with pings spaced beyond the minimum.
async fn ping_behaviour(endpoint: &str, ca: Option<&Path>) -> Vec<(u8, Option<Answer>)> {
    let scheme = endpoint.split("://").next().unwrap();
    let mut seen = Vec::new();

    let mut conn = RawH2::connect(endpoint, ca).await;
    conn.open_stream(scheme).await;
    let flood = ping_flood(&mut conn, 8).await;
    if flood.1.is_some() {
        assert!(
            conn.ends().await,
            "{endpoint}: the connection ends after GOAWAY"
        );
    }
    seen.push(flood);

    let mut conn = RawH2::connect(endpoint, ca).await;
    let flood = ping_flood(&mut conn, 8).await;
    if flood.1.is_some() {
        assert!(
            conn.ends().await,
            "{endpoint}: the connection ends after GOAWAY"
        );
    }
    seen.push(flood);

    let mut conn = RawH2::connect(endpoint, ca).await;
    conn.open_stream(scheme).await;
    let mut acked = 0;
    let mut ended = None;
    for n in 1..=5 {
        match conn.ping(n).await {
            Answer::Ack => acked = n,
            other => {
                ended = Some(other);
                break;
            }
        }
        tokio::time::sleep(SPACED).await;
    }
    seen.push((acked, ended));
    seen
}

/// A watch kept open on an etcd-client connection that pings every 400 ms
/// still sees a put made afterwards, and the connection serves on.
async fn etcd_client_with_keepalive_works(endpoint: &str) {
    let options = etcd_client::ConnectOptions::new()
        .with_keep_alive(SPACED, Duration::from_secs(5))
        .with_keep_alive_while_idle(false);
    let mut client = etcd_client::Client::connect([endpoint], Some(options))
        .await
        .unwrap();
    let mut watch = client.watch("keepalive", None).await.unwrap();
    // some of the client's pings pass while the watch waits
    tokio::time::sleep(4 * SPACED).await;
    client.put("keepalive", "v", None).await.unwrap();
    let events = tokio::time::timeout(FRAME_DEADLINE, async {
        loop {
            let response = watch.message().await.unwrap().expect("the watch goes on");
            if !response.events().is_empty() {
                return response.events().len();
            }
        }
    })
    .await
    .expect("the put is seen");
    assert_eq!(events, 1, "{endpoint}");
    let got = client.get("keepalive", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"v");
}

#[test]
fn pinging_faster_than_min_time_gets_goaway_too_many_pings_as_from_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--grpc-keepalive-min-time", MIN_TIME];
    let oxcd = Process::start_oxcd(&oxcd_bin(), dir.path(), &flags);
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = reference_etcd()
        .and_then(|bin| testkit::start_reference_etcd_with(bin, ref_dir.path(), "http", &flags));
    let runtime = tokio::runtime::Runtime::new().unwrap();

    let expected = vec![
        // with a stream: the first ping is free, the fourth the third strike
        (4, too_many_pings(1)),
        // without one, pings must be 2 h apart, whatever the minimum
        (4, too_many_pings(0)),
        // spaced beyond the minimum: kept
        (5, None),
    ];
    let ours = runtime.block_on(ping_behaviour(&oxcd.endpoint, None));
    assert_eq!(ours, expected, "oxcd");
    if let Some(etcd) = &etcd {
        let theirs = runtime.block_on(ping_behaviour(&etcd.endpoint, None));
        assert_eq!(theirs, expected, "etcd");
    }

    runtime.block_on(etcd_client_with_keepalive_works(&oxcd.endpoint));
    if let Some(etcd) = &etcd {
        runtime.block_on(etcd_client_with_keepalive_works(&etcd.endpoint));
    }
}

// ---- HTTP through curl ----

/// An answer as curl saw it: status, headers (names lowercased), body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// What must match etcd's: the status, the access headers and those
    /// of an error, and (`with_body`) the body.
    fn essentials(&self, with_body: bool) -> (u16, Vec<(String, String)>, String) {
        let mut headers: Vec<(String, String)> = self
            .headers
            .iter()
            .filter(|(name, _)| {
                name.starts_with("access-control-")
                    || (with_body
                        && ["content-type", "x-content-type-options", "content-length"]
                            .contains(&name.as_str()))
            })
            .cloned()
            .collect();
        headers.sort();
        let body = if with_body {
            self.body.clone()
        } else {
            String::new()
        };
        (self.status, headers, body)
    }
}

/// curl (HTTP/1.1, or HTTP/2 with `--http2*` in `args`), trusting `ca`
/// for https.
fn curl(url: &str, ca: Option<&Path>, args: &[&str]) -> Seen {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-i"]).args(args);
    if let Some(ca) = ca {
        cmd.arg("--cacert").arg(ca);
    }
    let out = cmd.arg(url).output().expect("curl runs");
    assert!(out.status.success(), "curl {args:?} {url}: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {text}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Seen {
        status,
        headers,
        body: body.to_string(),
    }
}

/// A gRPC Range call (key "a") through curl: its headers and trailers.
fn grpc_range(url: &str, ca: Option<&Path>, request: &Path, args: &[&str]) -> Seen {
    let data = format!("@{}", request.display());
    let mut all = vec![
        "-X",
        "POST",
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        "--data-binary",
        &data,
        "-o",
        "/dev/null",
        "-D",
        "-",
    ];
    all.extend_from_slice(args);
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10"]).args(&all);
    if let Some(ca) = ca {
        cmd.arg("--cacert").arg(ca);
    }
    let out = cmd
        .arg(format!("{url}/etcdserverpb.KV/Range"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {text} {out:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Seen {
        status,
        headers,
        body: String::new(),
    }
}

/// A gRPC RangeRequest{key: "a"} in gRPC's framing, in a file for curl.
fn range_request(dir: &Path) -> PathBuf {
    let path = dir.join("range.bin");
    std::fs::write(&path, [0, 0, 0, 0, 3, 0x0a, 0x01, b'a']).unwrap();
    path
}

const ACCESS_FLAGS: [&str; 4] = [
    "--host-whitelist",
    "localhost,127.0.0.1",
    "--cors",
    "http://a.com:80,https://b.org:443",
];

/// (what, path, curl arguments, whether the whole answer must match).
fn plain_cases() -> Vec<(&'static str, &'static str, Vec<&'static str>, bool)> {
    vec![
        (
            "unlisted host",
            "/version",
            vec!["-H", "Host: evil.example"],
            true,
        ),
        (
            "unlisted host:port",
            "/version",
            vec!["-H", "Host: evil.example:2379"],
            true,
        ),
        (
            "IPv6 host",
            "/version",
            vec!["-H", "Host: [::1]:2379"],
            true,
        ),
        ("not host:port", "/version", vec!["-H", "Host: a:b:c"], true),
        ("empty host", "/version", vec!["-H", "Host: "], true),
        (
            "listed host",
            "/version",
            vec!["-H", "Host: localhost:1"],
            false,
        ),
        (
            "listed origin",
            "/version",
            vec!["-H", "Origin: https://b.org:443"],
            false,
        ),
        (
            "unlisted origin",
            "/health",
            vec!["-H", "Origin: https://c.org:443"],
            false,
        ),
        (
            "OPTIONS, unlisted host",
            "/anything",
            vec!["-X", "OPTIONS", "-H", "Host: evil"],
            true,
        ),
        (
            "preflight",
            "/anything",
            vec!["-X", "OPTIONS", "-H", "Origin: http://a.com:80"],
            true,
        ),
        (
            "HTTP/1.1 to gRPC, unlisted host",
            "/etcdserverpb.KV/Range",
            vec!["-X", "POST", "-H", "Host: evil"],
            true,
        ),
        (
            "HTTP/1.1 to gRPC",
            "/etcdserverpb.KV/Range",
            vec!["-X", "POST", "-H", "Origin: http://a.com:80"],
            true,
        ),
    ]
}

#[test]
fn a_plain_url_checks_the_host_and_answers_cors_as_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&oxcd_bin(), dir.path(), &ACCESS_FLAGS);
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = reference_etcd().and_then(|bin| {
        testkit::start_reference_etcd_with(bin, ref_dir.path(), "http", &ACCESS_FLAGS)
    });

    for (what, path, args, whole) in plain_cases() {
        let ours = curl(&format!("{}{path}", oxcd.endpoint), None, &args);
        if let Some(etcd) = &etcd {
            let theirs = curl(&format!("{}{path}", etcd.endpoint), None, &args);
            assert_eq!(
                ours.essentials(whole),
                theirs.essentials(whole),
                "{what}: oxcd {ours:#?}\netcd {theirs:#?}"
            );
        }
        match what {
            "unlisted host" => {
                assert_eq!(ours.status, 421);
                assert!(ours
                    .body
                    .contains("etcd --host-whitelist \"evil.example\"\n"));
                assert_eq!(ours.header("access-control-allow-origin"), None);
            }
            "listed origin" => {
                assert_eq!(ours.status, 200);
                assert_eq!(
                    ours.header("access-control-allow-origin"),
                    Some("https://b.org:443")
                );
                assert_eq!(
                    ours.header("access-control-allow-methods"),
                    Some("POST, GET, OPTIONS, PUT, DELETE")
                );
                assert_eq!(
                    ours.header("access-control-allow-headers"),
                    Some("accept, content-type, authorization")
                );
            }
            "unlisted origin" => {
                assert_eq!(ours.status, 200);
                assert_eq!(ours.header("access-control-allow-origin"), None);
            }
            "preflight" => {
                assert_eq!((ours.status, ours.body.as_str()), (200, ""));
                assert_eq!(
                    ours.header("access-control-allow-origin"),
                    Some("http://a.com:80")
                );
            }
            _ => {}
        }
    }
    let line = oxcd
        .wait_for_log(
            "rejecting HTTP request to prevent DNS rebinding attacks",
            Duration::from_secs(5),
        )
        .expect("the refusal is logged");
    assert!(line.contains("\"host\":\"evil.example\""), "{line}");

    // gRPC on a plain URL is grpc-go's, behind neither check
    let request = range_request(dir.path());
    let h2c = [
        "--http2-prior-knowledge",
        "-H",
        "Host: evil.example",
        "-H",
        "Origin: http://a.com:80",
    ];
    let ours = grpc_range(&oxcd.endpoint, None, &request, &h2c);
    assert_eq!(ours.status, 200);
    assert_eq!(ours.header("grpc-status"), Some("0"), "{ours:#?}");
    assert_eq!(ours.header("access-control-allow-origin"), None);
    if let Some(etcd) = &etcd {
        let theirs = grpc_range(&etcd.endpoint, None, &request, &h2c);
        assert_eq!(ours.essentials(false), theirs.essentials(false));
    }
}

/// A TLS client URL with a ping minimum, one listed host and one origin.
fn tls_flags(server: &CertFiles) -> Vec<String> {
    [
        "--cert-file",
        server.cert.to_str().unwrap(),
        "--key-file",
        server.key.to_str().unwrap(),
        "--grpc-keepalive-min-time",
        MIN_TIME,
        "--host-whitelist",
        "localhost",
        "--cors",
        "http://a.com:80",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn over_tls_any_host_is_served_grpc_gets_cors_and_pings_are_policed_only_on_grpc_alone_urls() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = TestCa::new(dir.path(), "ca");
    let server = ca.issue("server", "oxcd", &["localhost", "127.0.0.1"], Usage::Server);
    let ca_file = ca.ca_file();
    let flags = tls_flags(&server);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let request = range_request(dir.path());

    let data = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd_secure(&oxcd_bin(), data.path(), &flags);
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = reference_etcd()
        .and_then(|bin| testkit::start_reference_etcd_with(bin, ref_dir.path(), "https", &flags));
    let mut endpoints = vec![("oxcd", oxcd.endpoint.clone())];
    if let Some(etcd) = &etcd {
        endpoints.push(("etcd", etcd.endpoint.clone()));
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut answers = Vec::new();
    for (who, endpoint) in &endpoints {
        // any Host over TLS; the listed origin gets the CORS headers
        let version = curl(
            &format!("{endpoint}/version"),
            Some(&ca_file),
            &["-H", "Host: evil.example", "-H", "Origin: http://a.com:80"],
        );
        assert_eq!(version.status, 200, "{who}");
        assert_eq!(
            version.header("access-control-allow-origin"),
            Some("http://a.com:80"),
            "{who}"
        );
        // gRPC answers too, and OPTIONS to a gRPC path is the controller's
        let grpc = grpc_range(
            endpoint,
            Some(&ca_file),
            &request,
            &["--http2", "-H", "Origin: http://a.com:80"],
        );
        assert_eq!(grpc.header("grpc-status"), Some("0"), "{who}: {grpc:#?}");
        assert_eq!(
            grpc.header("access-control-allow-origin"),
            Some("http://a.com:80"),
            "{who}"
        );
        let options = curl(
            &format!("{endpoint}/etcdserverpb.KV/Range"),
            Some(&ca_file),
            &[
                "--http2",
                "-X",
                "OPTIONS",
                "-H",
                "content-type: application/grpc",
            ],
        );
        // HTTP/2 over TLS, a listener serving HTTP too: Go's HTTP/2 server,
        // no ping policy
        let pings = runtime.block_on(async {
            let mut conn = RawH2::connect(endpoint, Some(&ca_file)).await;
            conn.open_stream("https").await;
            ping_flood(&mut conn, 8).await
        });
        assert_eq!(pings, (8, None), "{who}");
        answers.push((
            version.essentials(false),
            grpc.essentials(false),
            options.essentials(true),
        ));
    }
    assert_eq!((answers[0].2 .0, answers[0].2 .2.as_str()), (200, ""));
    if answers.len() == 2 {
        assert_eq!(answers[0], answers[1]);
    }

    // --listen-client-http-urls: the client URL serves gRPC alone, as
    // grpc-go's own server (the policy, no access controller)
    let split_data = tempfile::tempdir().unwrap();
    let http_url = format!("https://127.0.0.1:{}", testkit::free_port());
    let mut split_flags = flags.clone();
    split_flags.extend(["--listen-client-http-urls", &http_url]);
    let split = Process::start_oxcd_on(
        &oxcd_bin(),
        split_data.path(),
        split_data.path(),
        "https://127.0.0.1:0",
        &split_flags,
    );
    let grpc_url = split.endpoint.clone();
    let grpc = grpc_range(
        &grpc_url,
        Some(&ca_file),
        &request,
        &["--http2", "-H", "Origin: http://a.com:80"],
    );
    assert_eq!(grpc.header("grpc-status"), Some("0"), "{grpc:#?}");
    assert_eq!(grpc.header("access-control-allow-origin"), None);
    runtime.block_on(async {
        let mut conn = RawH2::connect(&grpc_url, Some(&ca_file)).await;
        conn.open_stream("https").await;
        assert_eq!(ping_flood(&mut conn, 8).await, (4, too_many_pings(1)));
        assert!(conn.ends().await);
        let mut conn = RawH2::connect(&http_url, Some(&ca_file)).await;
        assert_eq!(ping_flood(&mut conn, 8).await, (8, None));
    });
}

/// etcd's access controller, over TLS with `--client-cert-auth`: once auth
/// is on, a gateway request with a client certificate that names a user is
/// refused (the gateway would not act as that user); other paths are not.
#[test]
fn with_client_cert_auth_a_gateway_request_naming_a_user_is_refused_once_auth_is_on_as_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = TestCa::new(dir.path(), "ca");
    // etcd's gateway dials its own server with this certificate: a client's too
    let server = ca.issue("server", "oxcd", &["localhost", "127.0.0.1"], Usage::Peer);
    let client = ca.issue("client", "root", &[], Usage::Client);
    let ca_file = ca.ca_file();
    let flags = [
        "--cert-file",
        server.cert.to_str().unwrap(),
        "--key-file",
        server.key.to_str().unwrap(),
        "--trusted-ca-file",
        ca_file.to_str().unwrap(),
        "--client-cert-auth",
    ];
    let data = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd_secure(&oxcd_bin(), data.path(), &flags);
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = reference_etcd()
        .and_then(|bin| testkit::start_reference_etcd_with(bin, ref_dir.path(), "https", &flags));
    let mut endpoints = vec![oxcd.endpoint.clone()];
    endpoints.extend(etcd.iter().map(|etcd| etcd.endpoint.clone()));
    let (cert, key) = (client.cert.to_str().unwrap(), client.key.to_str().unwrap());
    let mut seen = Vec::new();
    for endpoint in &endpoints {
        let post = |path: &str, body: &str| {
            let seen = curl(
                &format!("{endpoint}{path}"),
                Some(&ca_file),
                &["--cert", cert, "--key", key, "-X", "POST", "-d", body],
            );
            (seen.status, seen.essentials(true))
        };
        let range = r#"{"key":"YQ=="}"#;
        let before = post("/v3/kv/range", range);
        assert_eq!(before.0, 200, "{endpoint}: {before:?}");
        for (path, body) in [
            ("/v3/auth/user/add", r#"{"name":"root","password":"pw"}"#),
            ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
            ("/v3/auth/enable", "{}"),
        ] {
            assert_eq!(post(path, body).0, 200, "{endpoint}{path}");
        }
        let refused = post("/v3/kv/range", range);
        let beta = post("/v3beta/kv/range", range);
        let version = curl(
            &format!("{endpoint}/version"),
            Some(&ca_file),
            &["--cert", cert, "--key", key],
        );
        assert_eq!(version.status, 200, "{endpoint}");
        assert_eq!(refused, beta, "{endpoint}");
        seen.push(refused);
    }
    let (status, (_, headers, body)) = &seen[0];
    assert_eq!(*status, 400);
    assert_eq!(
        body,
        "CommonName of client sending a request against gateway will be ignored and not used as expected\n"
    );
    // refused before the CORS headers are written
    assert!(headers
        .iter()
        .all(|(name, _)| !name.starts_with("access-control-")));
    if seen.len() == 2 {
        assert_eq!(seen[0], seen[1]);
    }
}
