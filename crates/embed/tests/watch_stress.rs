//! 1,000 watchers of one prefix and a concurrent writer: every watcher gets
//! every event exactly once, in revision order (etcd's watch guarantee).

mod common;

use std::time::Duration;

use etcd_client::{TxnOp, WatchOptions};

const STREAMS: usize = 100;
const WATCHERS_PER_STREAM: usize = 10;
const WRITES: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_watchers_of_one_prefix_get_every_event_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (m, client) = common::member(dir.path(), |_| {}).await;

    // Some history before the watchers: half of them start in the past.
    let mut writer = client.clone();
    writer.put("s/0", "before", None).await.unwrap(); // 2
    let mut watch_client = client.watch_client();
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        let start = if s % 2 == 0 { 2 } else { 0 };
        let options = WatchOptions::new().with_prefix().with_start_revision(start);
        let mut stream = watch_client
            .watch("s/", Some(options.clone()))
            .await
            .unwrap();
        for _ in 1..WATCHERS_PER_STREAM {
            stream.watch("s/", Some(options.clone())).await.unwrap();
        }
        streams.push((start, stream));
    }

    // Each stream's reader: per watch ID, the revisions and keys seen.
    let mut readers = Vec::new();
    for (start, mut stream) in streams {
        readers.push(tokio::spawn(async move {
            let mut seen: std::collections::HashMap<i64, Vec<(i64, String)>> = Default::default();
            let mut created = 0;
            let want_last = (WRITES + 2) as i64;
            loop {
                let done = created == WATCHERS_PER_STREAM
                    && seen.len() == WATCHERS_PER_STREAM
                    && seen
                        .values()
                        .all(|v| v.last().is_some_and(|l| l.0 == want_last));
                if done {
                    break;
                }
                let resp = stream.message().await.unwrap().expect("stream open");
                if resp.created() {
                    created += 1;
                    continue;
                }
                for ev in resp.events() {
                    let kv = ev.kv().unwrap();
                    seen.entry(resp.watch_id())
                        .or_default()
                        .push((kv.mod_revision(), kv.key_str().unwrap().to_string()));
                }
            }
            (start, seen)
        }));
    }

    // The writer: puts and two-key txns, concurrently with the readers.
    let mut expected = vec![(2, "s/0".to_string())];
    for i in 0..WRITES {
        let revision = (i + 3) as i64;
        if i % 10 == 0 {
            let txn = etcd_client::Txn::new().and_then([
                TxnOp::put(format!("s/{i}/a"), "t", None),
                TxnOp::put(format!("s/{i}/b"), "t", None),
            ]);
            writer.txn(txn).await.unwrap();
            expected.push((revision, format!("s/{i}/a")));
            expected.push((revision, format!("s/{i}/b")));
        } else {
            writer.put(format!("s/{i}"), "v", None).await.unwrap();
            expected.push((revision, format!("s/{i}")));
        }
    }

    for reader in readers {
        let (start, seen) = tokio::time::timeout(Duration::from_secs(60), reader)
            .await
            .expect("every watcher caught up in time")
            .unwrap();
        assert_eq!(seen.len(), WATCHERS_PER_STREAM);
        for (id, got) in seen {
            // Live watchers start after whatever revision they were created at.
            let want: Vec<&(i64, String)> = if start == 2 {
                expected.iter().collect()
            } else {
                let first = got.first().map(|e| e.0).unwrap_or(i64::MAX);
                expected.iter().filter(|e| e.0 >= first).collect()
            };
            let got: Vec<&(i64, String)> = got.iter().collect();
            assert_eq!(got, want, "watcher {id} (start {start})");
        }
    }
    m.stop().await;
}
