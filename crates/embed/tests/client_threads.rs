//! Client connections are spread over per-CPU connection threads, each with
//! its own runtime. Connections on different threads see each other's
//! writes, and stopping the member ends every thread even while clients
//! hold streams open. One test in its own binary: it counts this process's
//! threads.

mod common;

use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions};

/// Names of this process's client connection threads.
fn client_threads() -> Vec<String> {
    let mut names = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(name) = std::fs::read_to_string(task.path().join("comm")) {
            if name.starts_with("grpc-client-") {
                names.push(name.trim().to_string());
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_on_every_thread_share_the_store_and_stop_with_the_member() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut writer) = common::member(dir.path(), |_| {}).await;
    // (a thread takes its name once it runs)
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while client_threads().len() != cpus && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let threads = client_threads();
    assert_eq!(
        threads.len(),
        cpus,
        "one connection thread per CPU: {threads:?}"
    );

    // More connections than threads, each with its own watch: round-robin
    // puts some on every thread.
    let mut watchers = Vec::new();
    for _ in 0..2 * cpus + 1 {
        let mut client = Client::connect([common::endpoint(&m)], None).await.unwrap();
        let mut stream = client
            .watch("k", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        let created = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the watch is created")
            .unwrap()
            .expect("the stream is open");
        assert!(created.created());
        watchers.push((client, stream));
    }
    writer.put("k1", "v1", None).await.unwrap();
    for (client, stream) in &mut watchers {
        let resp = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the event arrives")
            .unwrap()
            .expect("the stream is open");
        let event = &resp.events()[0];
        assert_eq!(event.event_type(), EventType::Put);
        assert_eq!(event.kv().unwrap().value(), b"v1");
        // and each connection reads what another one wrote
        let got = client.get("k1", None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"v1");
    }

    // Stopping ends the threads although every watch stream is still open.
    tokio::time::timeout(Duration::from_secs(30), m.stop())
        .await
        .expect("the member stops with streams open");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !client_threads().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "client connection threads still running: {:?}",
            client_threads()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(watchers);
}
