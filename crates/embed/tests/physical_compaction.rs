//! A compaction deletes its records in batches off the request path
//! (`--experimental-compaction-batch-limit` and
//! `--experimental-compaction-sleep-interval`), and a physical Compact
//! answers only once they are all gone, as etcd's `<-physc` does.

mod common;
use common::member;

use std::time::{Duration, Instant};

use etcd_client::CompactionOptions;
use mvcc::CompactionBatches;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physical_compact_waits_for_the_batches_and_writes_go_on_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    // 2 records per batch, 1 s apart: each compaction below drops 10
    // records, 5 batches, at least 4 s (a wide margin on a loaded machine)
    let (m, mut c) = member(dir.path(), |cfg| {
        cfg.compaction_batches = CompactionBatches {
            limit: 2,
            sleep: Duration::from_secs(1),
        };
    })
    .await;
    let store = m.server.store.clone();
    let mut last = 0;
    for round in 0..3 {
        for k in 0..10 {
            last = c
                .put(format!("k{k}"), format!("v{round}"), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
        }
    }
    let first = last - 10;
    // Not physical: the answer comes before the batches are done, and
    // reads below the revision fail at once.
    c.compact(first, None).await.unwrap();
    assert!(
        store.finished_compact_revision() < first,
        "10 records at 2 per second cannot be gone already"
    );
    let err = c
        .get(
            "k0",
            Some(etcd_client::GetOptions::new().with_revision(first - 1)),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("required revision has been compacted"),
        "{err}"
    );
    // Writes are not held up by the batches.
    let started = Instant::now();
    let during = c
        .put("other", "v", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        store.finished_compact_revision() < first,
        "the put came after the batches"
    );
    // Physical: answered once this compaction and the earlier one are
    // done (they finish in order).
    c.compact(last, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    assert!(store.finished_compact_revision() >= last);
    assert!(during > last);
    // Nothing to resume after a restart: the finished mark is durable.
    m.stop().await;
    drop(store);
    let reopened = mvcc::Store::open(&dir.path().join("member/snap/db")).unwrap();
    assert_eq!(reopened.finished_compact_revision(), last);
    assert_eq!(reopened.compact_revision(), last);
}
