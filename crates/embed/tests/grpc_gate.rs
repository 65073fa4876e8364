//! Only gRPC reaches the gRPC services, with grpc-go's answers otherwise
//! (checked against etcd 3.5.16): a browser's "simple request" (HTTP/1.1,
//! text/plain) to /etcdserverpb.KV/Put used to write a key.

mod common;
use common::member;

use std::io::{Read, Write};

use api::etcdserverpb::PutRequest;
use prost::Message;

/// A gRPC-framed PutRequest body.
fn framed_put(key: &str) -> Vec<u8> {
    let put = PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: b"written".to_vec().into(),
        ..Default::default()
    };
    let message = put.encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(&message);
    body
}

/// An HTTP/1.1 POST; the whole response as text.
fn http1_post(addr: std::net::SocketAddr, path: &str, content_type: &str, body: &[u8]) -> String {
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).unwrap();
    tcp.write_all(body).unwrap();
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// An HTTP/2 POST: (status, headers and trailers).
async fn http2_post(
    addr: std::net::SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, http::HeaderMap) {
    http2_call(addr, path, content_type, None, body).await
}

async fn http2_call(
    addr: std::net::SocketAddr,
    path: &str,
    content_type: &str,
    grpc_timeout: Option<&str>,
    body: Vec<u8>,
) -> (u16, http::HeaderMap) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers");
    if let Some(timeout) = grpc_timeout {
        request = request.header("grpc-timeout", timeout);
    }
    let request = request.body(()).unwrap();
    let (response, mut send) = client
        .ready()
        .await
        .unwrap()
        .send_request(request, false)
        .unwrap();
    // The server may answer (415, an unknown method) and end the stream
    // before the body goes out: then the body has nowhere to go.
    let _ = send.send_data(body.into(), true);
    let response = response.await.unwrap();
    let status = response.status().as_u16();
    let mut headers = response.headers().clone();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        if chunk.is_err() {
            break;
        }
    }
    if let Ok(Some(trailers)) = body.trailers().await {
        headers.extend(trailers);
    }
    (status, headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_grpc_reaches_the_grpc_services() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let addr = m.client_addrs()[0];

    // HTTP/1.1, whatever the content type: etcd's HTTP mux answers 404.
    for content_type in ["text/plain", "application/grpc"] {
        let response = tokio::task::spawn_blocking(move || {
            http1_post(
                addr,
                "/etcdserverpb.KV/Put",
                content_type,
                &framed_put("h1"),
            )
        })
        .await
        .unwrap();
        assert!(response.starts_with("HTTP/1.1 404"), "{response}");
        assert!(response.ends_with("404 page not found\n"), "{response}");
    }
    // HTTP/2 without a gRPC content type: grpc-go's 415.
    let (status, headers) =
        http2_post(addr, "/etcdserverpb.KV/Put", "text/plain", framed_put("h2")).await;
    assert_eq!(status, 415);
    assert_eq!(headers["grpc-status"], "3");
    assert_eq!(
        headers["grpc-message"],
        "invalid gRPC request content-type \"text/plain\""
    );
    let (status, _) = http2_post(
        addr,
        "/etcdserverpb.KV/Put",
        "application/grpcx",
        framed_put("h2"),
    )
    .await;
    assert_eq!(status, 415);
    // Nothing was written by any of them.
    for key in ["h1", "h2"] {
        assert_eq!(
            c.get(key, None).await.unwrap().count(),
            0,
            "{key} was written"
        );
    }

    // gRPC proper, with a subtype: served.
    let (status, headers) = http2_post(
        addr,
        "/etcdserverpb.KV/Put",
        "application/grpc+proto",
        framed_put("grpc"),
    )
    .await;
    assert_eq!(
        (status, &headers["grpc-status"]),
        (200, &"0".parse::<http::HeaderValue>().unwrap())
    );
    assert_eq!(c.get("grpc", None).await.unwrap().count(), 1);

    // Unknown methods and services: grpc-go's Unimplemented messages.
    for (path, message) in [
        (
            "/etcdserverpb.KV/Foo",
            "unknown method Foo for service etcdserverpb.KV",
        ),
        ("/foo.Bar/Baz", "unknown service foo.Bar"),
    ] {
        let (status, headers) = http2_post(addr, path, "application/grpc", vec![0; 5]).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(headers["grpc-status"], "12", "{path}");
        assert_eq!(headers["grpc-message"], message, "{path}");
    }
    m.stop().await;
}

/// gRPC framing of a message.
fn framed(message: &impl Message) -> Vec<u8> {
    let bytes = message.encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    body.extend_from_slice(&bytes);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_gets_deadline_exceeded_as_from_etcd() {
    use api::v3lockpb::LockRequest;
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let addr = m.client_addrs()[0];
    // A lock held by someone else: the second Lock waits past its deadline.
    let holder = c.lease_grant(60, None).await.unwrap().id();
    c.lock(
        "l",
        Some(etcd_client::LockOptions::new().with_lease(holder)),
    )
    .await
    .unwrap();
    let waiter = c.lease_grant(60, None).await.unwrap().id();
    let request = framed(&LockRequest {
        name: b"l".to_vec().into(),
        lease: waiter,
    });
    let started = std::time::Instant::now();
    let (status, headers) = http2_call(
        addr,
        "/v3lockpb.Lock/Lock",
        "application/grpc",
        Some("300m"),
        request.clone(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["grpc-status"], "4", "{headers:?}");
    assert_eq!(headers["grpc-message"], "context deadline exceeded");
    assert!(started.elapsed() >= std::time::Duration::from_millis(250));
    // A deadline below the timer's resolution is exceeded at once.
    let (_, headers) = http2_call(
        addr,
        "/v3lockpb.Lock/Lock",
        "application/grpc",
        Some("100u"),
        request,
    )
    .await;
    assert_eq!(headers["grpc-status"], "4", "{headers:?}");
    // A call that ends in time is answered as usual.
    let range = framed(&api::etcdserverpb::RangeRequest {
        key: b"l".to_vec().into(),
        ..Default::default()
    });
    let (_, headers) = http2_call(
        addr,
        "/etcdserverpb.KV/Range",
        "application/grpc",
        Some("5S"),
        range,
    )
    .await;
    assert_eq!(headers["grpc-status"], "0", "{headers:?}");
    m.stop().await;
}
