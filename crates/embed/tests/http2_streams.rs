//! etcd puts no limit on concurrent HTTP/2 streams per client connection
//! (--max-concurrent-streams defaults to unlimited); hyper's default of 200
//! would stall clients that multiplex many watches on one connection.

use std::future::Future;
use std::time::Duration;

use embed::ServerConfig;

async fn open_streams(max_concurrent_streams: Option<u32>, want: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen_client_urls: vec!["http://127.0.0.1:0".into()],
        listen_peer_urls: vec!["http://127.0.0.1:0".into()],
        max_concurrent_streams,
        ..Default::default()
    };
    let m = embed::start(cfg).await.unwrap();
    let tcp = tokio::net::TcpStream::connect(m.client_addrs()[0])
        .await
        .unwrap();
    let (client, mut connection) = h2::client::handshake(tcp).await.unwrap();
    // The limit the server announced, as the client connection sees it.
    let announced = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = announced.clone();
    tokio::spawn(std::future::poll_fn(move |cx| {
        let polled = std::pin::Pin::new(&mut connection).poll(cx);
        seen.store(
            connection.max_concurrent_send_streams(),
            std::sync::atomic::Ordering::SeqCst,
        );
        polled.map(|_| ())
    }));
    // One complete call first, so that the server's SETTINGS (with its
    // stream limit) have arrived before the streams are opened.
    let request = grpc_request(m.client_addrs()[0], "etcdserverpb.Maintenance/Status");
    let (response, mut body) = client
        .clone()
        .ready()
        .await
        .unwrap()
        .send_request(request, false)
        .unwrap();
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    assert_eq!(response.await.unwrap().status(), 200);
    let limit = announced.load(std::sync::atomic::Ordering::SeqCst);
    // No SETTINGS_MAX_CONCURRENT_STREAMS at all means unlimited.
    assert_eq!(
        limit,
        max_concurrent_streams.map_or(usize::MAX, |m| m as usize),
        "announced stream limit"
    );
    let mut open = Vec::new();
    for _ in 0..want {
        // A stream whose request body never ends stays open on the server.
        let Ok(Ok(mut ready)) =
            tokio::time::timeout(Duration::from_secs(2), client.clone().ready()).await
        else {
            break;
        };
        let request = grpc_request(m.client_addrs()[0], "etcdserverpb.KV/Range");
        let (response, body) = ready.send_request(request, false).unwrap();
        open.push((response, body));
    }
    let opened = open.len();
    drop(open);
    m.stop().await;
    opened
}

fn grpc_request(addr: std::net::SocketAddr, method: &str) -> http::Request<()> {
    http::Request::post(format!("http://{addr}/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

#[tokio::test]
async fn more_than_200_streams_per_connection_by_default() {
    assert_eq!(open_streams(None, 300).await, 300);
}

#[tokio::test]
async fn max_concurrent_streams_flag_is_announced() {
    // The limit is checked inside (the client queues streams past it itself).
    open_streams(Some(10), 5).await;
}
