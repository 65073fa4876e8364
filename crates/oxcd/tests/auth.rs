//! Auth against the real binary: simple tokens valid on every member of a
//! 3-member cluster (and on a member that caught up by snapshot), the
//! store after a restart and after `oxctl snapshot restore`, token expiry
//! (a watch opened with the token keeps running), the client certificate's
//! Common Name as the user, the gateway's `/v3/auth/*` and `Authorization`
//! header, `/health` and the auth revision metric with auth on, watch
//! creation refused as etcd refuses it, and no password or token in the
//! log.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use api::etcdserverpb::auth_client::AuthClient;
use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::watch_client::WatchClient;
use api::etcdserverpb::{
    watch_request, AuthenticateRequest, PutRequest, RangeRequest, WatchCreateRequest, WatchRequest,
};
use testkit::{oxcd_bin, Cluster, Process};
use tonic::transport::Channel;
use tonic::{Code, Request};

const ROOT_PASSWORD: &str = "rootpw";

async fn channel(endpoint: &str) -> Channel {
    Channel::from_shared(endpoint.to_string())
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

/// etcdctl 3.4 against `endpoint`; (success, output without retry warnings).
fn etcdctl(endpoint: &str, args: &[&str]) -> (bool, String) {
    common::etcdctl(endpoint, args, None)
}

fn must(endpoint: &str, args: &[&str]) -> String {
    let (ok, out) = etcdctl(endpoint, args);
    assert!(ok, "etcdctl {args:?}: {out}");
    out
}

/// root with the root role, alice with read on `foo` and read-write on
/// `a/`, then auth enabled.
fn set_up_auth(endpoint: &str) {
    let root = format!("root:{ROOT_PASSWORD}");
    must(endpoint, &["user", "add", &root]);
    must(endpoint, &["user", "grant-role", "root", "root"]);
    must(endpoint, &["role", "add", "reader"]);
    must(
        endpoint,
        &["role", "grant-permission", "reader", "read", "foo"],
    );
    must(
        endpoint,
        &[
            "role",
            "grant-permission",
            "reader",
            "readwrite",
            "a/",
            "--prefix",
        ],
    );
    must(endpoint, &["user", "add", "alice:alicepw"]);
    must(endpoint, &["user", "grant-role", "alice", "reader"]);
    must(endpoint, &["auth", "enable"]);
}

async fn token(endpoint: &str, name: &str, password: &str) -> Result<String, tonic::Status> {
    let mut auth = AuthClient::new(channel(endpoint).await);
    auth.authenticate(AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    })
    .await
    .map(|r| r.into_inner().token)
}

fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("token", token.parse().expect("ascii token"));
    request
}

async fn put_as(endpoint: &str, token: &str, key: &str, value: &str) -> Result<i64, tonic::Status> {
    let mut kv = KvClient::new(channel(endpoint).await);
    let put = PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: value.as_bytes().to_vec().into(),
        ..Default::default()
    };
    kv.put(with_token(put, token))
        .await
        .map(|r| r.into_inner().header.unwrap().revision)
}

async fn get_as(
    endpoint: &str,
    token: &str,
    key: &str,
    serializable: bool,
) -> Result<Option<String>, tonic::Status> {
    let mut kv = KvClient::new(channel(endpoint).await);
    let get = RangeRequest {
        key: key.as_bytes().to_vec().into(),
        serializable,
        ..Default::default()
    };
    kv.range(with_token(get, token)).await.map(|r| {
        r.into_inner()
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
    })
}

fn assert_status(result: Result<impl std::fmt::Debug, tonic::Status>, code: Code, message: &str) {
    match result {
        Ok(v) => panic!("expected {message}, got {v:?}"),
        Err(s) => assert_eq!((s.code(), s.message()), (code, message)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_tokens_are_valid_on_every_member_and_a_member_catches_up_by_snapshot() {
    // Snapshots every 20 entries, 5 kept for catch-up: a member down for
    // 100 writes comes back by snapshot.
    let mut cluster = Cluster::start(
        3,
        &[
            "--snapshot-count",
            "20",
            "--experimental-snapshot-catchup-entries",
            "5",
            "--bcrypt-cost",
            "4",
        ],
    );
    common::leader(&cluster).await;
    let e0 = cluster.endpoint(0);
    set_up_auth(&e0);
    let root = token(&e0, "root", ROOT_PASSWORD).await.unwrap();
    let alice = token(&cluster.endpoint(1), "alice", "alicepw")
        .await
        .unwrap();
    for i in 0..3 {
        let e = cluster.endpoint(i);
        put_as(&e, &root, "foo", &format!("v{i}")).await.unwrap();
        // A token made on member 1 is valid on all three (serializable reads
        // are served by each member itself).
        assert!(get_as(&e, &alice, "foo", true).await.unwrap().is_some());
        assert_status(
            put_as(&e, &alice, "foo", "x").await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        put_as(&e, &alice, &format!("a/{i}"), "mine").await.unwrap();
    }

    // Member 2 misses an auth change and 100 writes, then catches up.
    cluster.stop(2);
    // if it led, the change below would meet the election ("leader changed")
    common::leader(&cluster).await;
    let e1 = cluster.endpoint(1);
    must(
        &e1,
        &[
            "--user",
            &format!("root:{ROOT_PASSWORD}"),
            "user",
            "add",
            "bob:bobpw",
        ],
    );
    must(
        &e1,
        &[
            "--user",
            &format!("root:{ROOT_PASSWORD}"),
            "role",
            "revoke-permission",
            "reader",
            "foo",
        ],
    );
    for i in 0..100 {
        put_as(&e0, &root, &format!("fill/{i}"), "x").await.unwrap();
    }
    cluster.restart(2);
    let e2 = cluster.endpoint(2);
    let deadline = Instant::now() + Duration::from_secs(30);
    let bob = loop {
        match token(&e2, "bob", "bobpw").await {
            Ok(t) => break t,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "bob never authenticated on member 2: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(!bob.is_empty());
    let alice = token(&e2, "alice", "alicepw").await.unwrap();
    assert_status(
        get_as(&e2, &alice, "foo", true).await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    assert!(
        cluster.members[2]
            .as_ref()
            .unwrap()
            .log_text()
            .contains("applied database snapshot"),
        "member 2 caught up by snapshot"
    );
}

fn start_single(dir: &Path, extra: &[&str]) -> Process {
    let mut flags = vec!["--bcrypt-cost", "4"];
    flags.extend_from_slice(extra);
    Process::start_oxcd(&oxcd_bin(), dir, &flags)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_survives_a_restart_but_tokens_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m");
    let mut member = start_single(&data, &[]);
    set_up_auth(&member.endpoint);
    let old = token(&member.endpoint, "alice", "alicepw").await.unwrap();
    member.terminate(Duration::from_secs(10));
    let member = start_single(&data, &[]);
    let e = &member.endpoint;
    assert_status(
        get_as(e, &old, "foo", false).await,
        Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
    let alice = token(e, "alice", "alicepw").await.unwrap();
    assert_eq!(get_as(e, &alice, "foo", false).await.unwrap(), None);
    assert_status(
        token(e, "alice", "wrong").await,
        Code::InvalidArgument,
        "etcdserver: authentication failed, invalid user ID or password",
    );
    let log = member.log_text();
    assert!(
        !log.contains("alicepw") && !log.contains(ROOT_PASSWORD),
        "a password in the log"
    );
    assert!(!log.contains(&alice), "a token in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_token_expires_but_a_watch_opened_with_it_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    let member = start_single(&dir.path().join("m"), &["--auth-token-ttl", "2"]);
    let e = &member.endpoint;
    set_up_auth(e);
    let alice = token(e, "alice", "alicepw").await.unwrap();
    let root = token(e, "root", ROOT_PASSWORD).await.unwrap();

    let mut watch = WatchClient::new(channel(e).await);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let create = |key: &str| WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(
            WatchCreateRequest {
                key: key.as_bytes().to_vec().into(),
                ..Default::default()
            },
        )),
    };
    tx.send(create("foo")).await.unwrap();
    // A watch on a key alice cannot read is created and canceled at once.
    tx.send(create("secret")).await.unwrap();
    let mut responses = watch
        .watch(with_token(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    let first = responses.message().await.unwrap().unwrap();
    assert!(first.created && !first.canceled);
    let denied = responses.message().await.unwrap().unwrap();
    assert!(denied.created && denied.canceled, "{denied:?}");
    assert_eq!(denied.watch_id, -1);
    assert_eq!(
        denied.cancel_reason,
        "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
    );

    // Idle past its TTL, the token is gone; the watch is not.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_status(
        get_as(e, &alice, "foo", false).await,
        Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
    assert!(
        put_as(e, &root, "foo", "x").await.is_err(),
        "root's idle token expired too"
    );
    let root = token(e, "root", ROOT_PASSWORD).await.unwrap();
    put_as(e, &root, "foo", "after").await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .expect("the event in time")
        .unwrap()
        .unwrap();
    assert_eq!(&event.events[0].kv.as_ref().unwrap().value[..], b"after");
    // A used token lives on.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        put_as(e, &root, "foo", "again").await.unwrap();
    }
}

/// A request with `Authorization` through the gateway; (status, body).
fn gateway(endpoint: &str, path: &str, body: &str, authorization: Option<&str>) -> (u16, String) {
    let endpoint = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(endpoint).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let auth = authorization
        .map(|t| format!("Authorization: {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_authenticates_and_health_and_metrics_need_no_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let member = start_single(&dir.path().join("m"), &[]);
    let e = &member.endpoint;
    // Auth off: etcd's answer, which Patroni relies on.
    let (status, body) = gateway(
        e,
        "/v3/auth/authenticate",
        r#"{"name":"root","password":"x"}"#,
        None,
    );
    assert_eq!(status, 400);
    assert_eq!(
        body,
        r#"{"error":"etcdserver: authentication is not enabled","code":9,"message":"etcdserver: authentication is not enabled"}"#
    );
    set_up_auth(e);
    let (status, body) = gateway(
        e,
        "/v3/auth/authenticate",
        &format!(r#"{{"name":"root","password":"{ROOT_PASSWORD}"}}"#),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let token = json["token"].as_str().unwrap().to_string();
    // base64("k") = "aw==", base64("v") = "dg=="
    let (status, body) = gateway(
        e,
        "/v3/kv/put",
        r#"{"key":"aw==","value":"dg=="}"#,
        Some(&token),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = gateway(e, "/v3/kv/put", r#"{"key":"aw==","value":"dg=="}"#, None);
    assert_eq!(
        (status, body.contains("etcdserver: user name is empty")),
        (400, true),
        "{body}"
    );
    let (status, body) = gateway(e, "/v3/kv/range", r#"{"key":"aw=="}"#, Some("nonsense"));
    assert_eq!(
        (status, body.contains("etcdserver: invalid auth token")),
        (401, true),
        "{body}"
    );
    let (status, body) = gateway(e, "/v3/auth/status", "{}", Some(&token));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""enabled":true"#), "{body}");
    // /health runs its read as the member itself.
    let health = testkit::http::get(e, "/health").unwrap();
    assert_eq!(health.status, 200, "{}", health.body);
    assert!(
        health.body.contains(r#""health":"true""#),
        "{}",
        health.body
    );
    let metrics = testkit::http::get(e, "/metrics").unwrap().body;
    let revision = metrics
        .lines()
        .find(|l| l.starts_with("etcd_debugging_auth_revision "))
        .expect("etcd_debugging_auth_revision");
    // fresh 1, then user add, grant, role add, 2 grants, user add, grant.
    assert_eq!(revision, "etcd_debugging_auth_revision 8");
    assert!(member.log_text().contains("enabled authentication"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_needs_root_and_a_restored_snapshot_keeps_auth() {
    let dir = tempfile::tempdir().unwrap();
    let member = start_single(&dir.path().join("m"), &[]);
    let e = &member.endpoint;
    set_up_auth(e);
    let (ok, out) = etcdctl(e, &["--user", "alice:alicepw", "defrag"]);
    assert!(!ok && out.contains("permission denied"), "{out}");
    let (ok, out) = etcdctl(e, &["defrag"]);
    assert!(!ok && out.contains("user name is empty"), "{out}");
    // The Lock service runs its recipe with the caller's credentials:
    // alice may write under a/ only.
    let alice = token(e, "alice", "alicepw").await.unwrap();
    let mut lock = api::v3lockpb::lock_client::LockClient::new(channel(e).await);
    let request = |name: &str| api::v3lockpb::LockRequest {
        name: name.as_bytes().to_vec().into(),
        lease: 0,
    };
    // etcd's v3lock answers a client error with code Unknown.
    assert_status(
        lock.lock(with_token(request("l"), &alice)).await,
        Code::Unknown,
        "etcdserver: permission denied",
    );
    let held = lock.lock(with_token(request("a/l"), &alice)).await.unwrap();
    assert!(held.into_inner().key.starts_with(b"a/l/"));
    // etcdctl's own recipes (client side) meet the same checks.
    let (ok, out) = etcdctl(e, &["--user", "alice:alicepw", "lock", "l", "true"]);
    assert!(!ok && out.contains("permission denied"), "{out}");
    let snapshot = dir.path().join("snap.db");
    let snapshot = snapshot.to_str().unwrap();
    let (ok, out) = etcdctl(
        e,
        &["--user", "alice:alicepw", "snapshot", "save", snapshot],
    );
    assert!(!ok && out.contains("permission denied"), "{out}");
    must(
        e,
        &[
            "--user",
            &format!("root:{ROOT_PASSWORD}"),
            "snapshot",
            "save",
            snapshot,
        ],
    );
    let restored = dir.path().join("restored");
    let mut out = Vec::new();
    oxctl::run(
        [
            "oxctl",
            "snapshot",
            "restore",
            snapshot,
            "--data-dir",
            restored.to_str().unwrap(),
        ]
        .into_iter(),
        &mut out,
    )
    .expect("restore");
    drop(member);
    let member = start_single(&restored, &[]);
    let e = &member.endpoint;
    let (ok, out) = etcdctl(e, &["get", "foo"]);
    assert!(
        !ok && out.contains("user name is empty"),
        "auth still on: {out}"
    );
    let alice = token(e, "alice", "alicepw").await.unwrap();
    put_as(e, &alice, "a/x", "1").await.unwrap();
}

/// etcdctl 3.4 over TLS with the client certificate `cert`, plus `args`.
fn etcdctl_tls(
    endpoint: &str,
    ca: &Path,
    cert: &testkit::pki::CertFiles,
    args: &[&str],
) -> (bool, String) {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            endpoint,
            "--dial-timeout",
            "3s",
            "--command-timeout",
            "5s",
        ])
        .args(["--cacert", ca.to_str().unwrap()])
        .args([
            "--cert",
            cert.cert.to_str().unwrap(),
            "--key",
            cert.key.to_str().unwrap(),
        ])
        .args(args)
        .output()
        .expect("etcdctl runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn with_client_cert_auth_the_certificate_common_name_is_the_user() {
    use testkit::pki::{TestCa, Usage};
    let dir = tempfile::tempdir().unwrap();
    let mut ca = TestCa::new(dir.path(), "ca");
    let server = ca.issue("server", "oxcd", &["localhost", "127.0.0.1"], Usage::Server);
    let root_cert = ca.issue("root", "root", &[], Usage::Client);
    let alice_cert = ca.issue("alice", "alice", &[], Usage::Client);
    let nobody = ca.issue("nobody", "", &[], Usage::Client);
    let ca_file = ca.ca_file();
    let flags = [
        "--bcrypt-cost",
        "4",
        "--cert-file",
        server.cert.to_str().unwrap(),
        "--key-file",
        server.key.to_str().unwrap(),
        "--trusted-ca-file",
        ca_file.to_str().unwrap(),
        "--client-cert-auth",
    ];
    let member = Process::start_oxcd_secure(&oxcd_bin(), &dir.path().join("m"), &flags);
    let e = &member.endpoint;
    let run = |cert, args: &[&str]| etcdctl_tls(e, &ca_file, cert, args);
    let must = |cert, args: &[&str]| {
        let (ok, out) = run(cert, args);
        assert!(ok, "{args:?}: {out}");
    };
    must(&root_cert, &["user", "add", "root:rootpw"]);
    must(&root_cert, &["user", "grant-role", "root", "root"]);
    must(&root_cert, &["user", "add", "alice:alicepw"]);
    must(&root_cert, &["role", "add", "reader"]);
    must(
        &root_cert,
        &["role", "grant-permission", "reader", "read", "foo"],
    );
    must(&root_cert, &["user", "grant-role", "alice", "reader"]);
    must(&root_cert, &["auth", "enable"]);
    // No token: the certificate's CN is the user.
    must(&root_cert, &["put", "foo", "bar"]);
    must(&alice_cert, &["get", "foo"]);
    let (ok, out) = run(&alice_cert, &["put", "foo", "x"]);
    assert!(
        !ok && out.contains("etcdserver: permission denied"),
        "{out}"
    );
    // etcd: a verified certificate without a CN is the user "", unknown.
    let (ok, out) = run(&nobody, &["get", "foo"]);
    assert!(
        !ok && out.contains("etcdserver: permission denied"),
        "{out}"
    );
    // A token wins over the certificate.
    let (ok, out) = run(&root_cert, &["--user", "alice:alicepw", "put", "foo", "x"]);
    assert!(
        !ok && out.contains("etcdserver: permission denied"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_tokens_verify_on_every_member_go_stale_with_the_auth_revision_and_expire() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap(); // ECDSA P-256
    let private = dir.path().join("jwt.key");
    let public = dir.path().join("jwt.pub");
    std::fs::write(&private, key.serialize_pem()).unwrap();
    std::fs::write(&public, key.public_key_pem()).unwrap();
    let token_flag = format!(
        "jwt,pub-key={},priv-key={},sign-method=ES256,ttl=8s",
        public.display(),
        private.display()
    );
    let mut cluster = Cluster::start(3, &["--auth-token", &token_flag, "--bcrypt-cost", "4"]);
    common::leader(&cluster).await;
    let e0 = cluster.endpoint(0);
    set_up_auth(&e0);
    let alice = token(&e0, "alice", "alicepw").await.unwrap();
    assert_eq!(alice.split('.').count(), 3, "a JWS: {alice}");
    // Signed on member 0, checked by signature on all three, and after a
    // restart (nothing is kept per token).
    cluster.stop(1);
    cluster.restart(1);
    for i in 0..3 {
        let e = cluster.endpoint(i);
        put_as(&e, &alice, &format!("a/{i}"), "v").await.unwrap();
        assert_status(
            put_as(&e, &alice, "foo", "x").await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
    }
    // A JWT carries the auth revision it was signed at: after any auth
    // change it is stale, and a fresh one works.
    let root = token(&e0, "root", ROOT_PASSWORD).await.unwrap();
    let mut auth = AuthClient::new(channel(&e0).await);
    auth.role_add(with_token(
        api::etcdserverpb::AuthRoleAddRequest {
            name: "later".into(),
        },
        &root,
    ))
    .await
    .unwrap();
    assert_status(
        put_as(&cluster.endpoint(2), &alice, "a/x", "v").await,
        Code::InvalidArgument,
        "etcdserver: revision of auth store is old",
    );
    let alice = token(&cluster.endpoint(2), "alice", "alicepw")
        .await
        .unwrap();
    put_as(&cluster.endpoint(2), &alice, "a/x", "v")
        .await
        .unwrap();
    // Past its ttl it is refused everywhere.
    tokio::time::sleep(Duration::from_secs(9)).await;
    for i in 0..3 {
        assert_status(
            get_as(&cluster.endpoint(i), &alice, "a/x", true).await,
            Code::Unauthenticated,
            "etcdserver: invalid auth token",
        );
    }
}
