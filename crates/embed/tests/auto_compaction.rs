//! Auto-compaction as etcd's compactors do it: `periodic` keeps a time
//! window of history, `revision` a number of revisions.

mod common;
use common::member;

use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use etcdserver::compactor::AutoCompaction;

async fn readable_at(c: &mut Client, revision: i64) -> bool {
    match c
        .get("k", Some(GetOptions::new().with_revision(revision)))
        .await
    {
        Ok(_) => true,
        Err(etcd_client::Error::GRpcStatus(s)) => {
            assert_eq!(
                s.message(),
                "etcdserver: mvcc: required revision has been compacted"
            );
            false
        }
        Err(e) => panic!("get at {revision}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_compaction_keeps_the_retention_window() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |cfg| {
        cfg.auto_compaction = Some(AutoCompaction::Periodic(Duration::from_secs(2)));
    })
    .await;
    let started = Instant::now();
    let mut history: Vec<(Instant, i64)> = Vec::new();
    let compacted = loop {
        let rev = c
            .put("k", "v", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        history.push((Instant::now(), rev));
        if !readable_at(&mut c, 2).await {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never compacted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Not before one period has passed.
    assert!(
        compacted >= Duration::from_secs(2),
        "compacted after {compacted:?}"
    );
    // What was written within the last period (minus a sampling step) is
    // still readable.
    let recent = history
        .iter()
        .find(|(at, _)| at.elapsed() < Duration::from_millis(1700))
        .map(|(_, rev)| *rev)
        .unwrap();
    assert!(
        readable_at(&mut c, recent).await,
        "revision {recent} compacted too early"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_compaction_keeps_the_last_n_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |cfg| {
        cfg.auto_compaction = Some(AutoCompaction::Revision(10));
        cfg.auto_compaction_revision_interval = Duration::from_millis(200);
    })
    .await;
    let mut last = 0;
    for _ in 0..50 {
        last = c
            .put("k", "v", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while readable_at(&mut c, last - 11).await {
        assert!(Instant::now() < deadline, "never compacted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(readable_at(&mut c, last - 10).await);
    m.stop().await;
}
