//! An in-process member on loopback for integration tests, with a client.

use std::time::Duration;

use embed::ServerConfig;
use etcd_client::Client;

/// Starts a member on `dir` with client and peer listeners on port 0 (tests
/// run in parallel: none may take a default port), waits until it is
/// ready, and connects a client to it.
pub async fn member(
    dir: &std::path::Path,
    tweak: impl FnOnce(&mut ServerConfig),
) -> (embed::RunningMember, Client) {
    let mut cfg = ServerConfig {
        data_dir: dir.to_path_buf(),
        listen_client_urls: vec!["http://127.0.0.1:0".into()],
        listen_peer_urls: vec!["http://127.0.0.1:0".into()],
        ..Default::default()
    };
    tweak(&mut cfg);
    let m = embed::start(cfg).await.expect("member starts");
    tokio::time::timeout(Duration::from_secs(30), m.ready())
        .await
        .expect("member becomes ready");
    let client = Client::connect([endpoint(&m)], None)
        .await
        .expect("connect");
    (m, client)
}

pub fn endpoint(m: &embed::RunningMember) -> String {
    format!("http://{}", m.client_addrs()[0])
}
