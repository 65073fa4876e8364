//! HashKV as etcd 3.5.16 computes it: the same history on an etcd member
//! and an oxcd member gives the same `etcdctl endpoint hashkv`, at every
//! revision, before and after a compaction (one that lands on a tombstone
//! included: 3.5.16 keeps it and leaves it out of the hash).

use std::path::Path;

use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, LeaseGrantOptions, PutOptions, Txn, TxnOp,
};
use testkit::{oxcd_bin, Process};

const ETCD_3516: &str = "/opt/etcd-3.5.16/etcd";

/// The same history on any server; the revision of its last write.
async fn history(c: &mut Client) -> i64 {
    for i in 0..5 {
        c.put(format!("k{i}"), format!("v{i}"), None).await.unwrap();
    }
    c.put("k1", "again", None).await.unwrap();
    c.delete("k2", None).await.unwrap();
    // the lease ID is in the leased key's record: the same on both
    let lease = c
        .lease_grant(600, Some(LeaseGrantOptions::new().with_id(0x1234)))
        .await
        .unwrap()
        .id();
    c.put("leased", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    let txn = Txn::new()
        .when([Compare::value("k0", CompareOp::Equal, "v0")])
        .and_then([
            TxnOp::put("k0", "txn", None),
            TxnOp::put("t", "", None),
            TxnOp::delete("k3", None),
        ]);
    c.txn(txn).await.unwrap();
    c.delete("k4", None).await.unwrap();
    c.put("k4", "back", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

/// HashKV at every revision from 1 to `last` (compacted ones answer an
/// error, kept as its message).
async fn hashes(c: &mut Client, last: i64) -> Vec<Result<(u32, i64), String>> {
    let mut all = Vec::new();
    for rev in 0..=last {
        all.push(
            c.hash_kv(rev)
                .await
                .map(|r| (r.hash(), r.compact_version()))
                .map_err(|e| {
                    e.to_string()
                        .rsplit("message: ")
                        .next()
                        .unwrap_or("")
                        .to_string()
                }),
        );
    }
    all
}

async fn run(endpoint: &str) -> Vec<Vec<Result<(u32, i64), String>>> {
    let mut c = Client::connect([endpoint], None).await.unwrap();
    let last = history(&mut c).await;
    let before = hashes(&mut c, last).await;
    // the delete of k4 is at last-1: compact right on that tombstone
    c.compact(last - 1, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    // etcd answers HashKV at exactly a compaction's revision with the hash
    // it recorded while compacting (hash.go hashStorage, with the previous
    // compact revision); it is computed off the write path: wait for it
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while c.hash_kv(last - 1).await.map(|r| r.compact_version()).ok() != Some(-1) {
        assert!(
            std::time::Instant::now() < deadline,
            "no compaction hash recorded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let after = hashes(&mut c, last).await;
    c.put("after", "1", None).await.unwrap();
    let later = hashes(&mut c, last + 1).await;
    vec![before, after, later]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashkv_equals_etcd_3_5_16s_for_the_same_history() {
    if !Path::new(ETCD_3516).exists() {
        eprintln!(
            "etcd 3.5.16 is not installed (REF_ETCD=3.5.16 ../shared/tools/ref-etcd): skipped"
        );
        return;
    }
    let etcd_dir = tempfile::tempdir().unwrap();
    let etcd = testkit::start_reference_etcd(ETCD_3516, etcd_dir.path()).expect("etcd 3.5.16");
    let ox_dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&oxcd_bin(), ox_dir.path(), &[]);
    let theirs = run(&etcd.endpoint).await;
    let ours = run(&oxcd.endpoint).await;
    for (phase, (t, o)) in ["before", "after compaction", "a write later"]
        .iter()
        .zip(theirs.iter().zip(&ours))
    {
        assert_eq!(
            o, t,
            "{phase}: oxcd (left) and etcd 3.5.16 (right) per revision"
        );
    }
    assert!(theirs[0].iter().all(Result::is_ok));
}
