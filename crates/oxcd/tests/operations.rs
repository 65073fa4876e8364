//! Operating a member as an etcd operator would: the space quota and the
//! documented recovery runbook with etcdctl, alarms that survive a restart,
//! and defragmentation under a concurrent read/write load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use testkit::Process;

mod common;
use common::etcdctl;

const NOSPACE: &str = "etcdserver: mvcc: database space exceeded";

fn status_json(endpoint: &str) -> serde_json::Value {
    let (ok, out) = etcdctl(endpoint, &["endpoint", "status", "-w", "json"], None);
    assert!(ok, "{out}");
    let all: serde_json::Value = serde_json::from_str(out.trim()).expect("status JSON");
    all[0]["Status"].clone()
}

#[test]
fn a_quota_above_8_gib_is_kept_with_etcds_warning() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--quota-backend-bytes", "17179869184"];
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &flags);
    let warning = oxcd
        .wait_for_log("quota exceeds the maximum value", Duration::from_secs(10))
        .expect("etcd's warning");
    for field in [
        r#""level":"warn""#,
        r#""quota-name":"v3-applier""#,
        r#""quota-size-bytes":17179869184"#,
        r#""quota-size":"17 GB""#,
        r#""quota-maximum-size-bytes":8589934592"#,
        r#""quota-maximum-size":"8.6 GB""#,
    ] {
        assert!(warning.contains(field), "{field} not in {warning}");
    }
    let metrics = testkit::http::get(oxcd.host_port(), "/metrics")
        .unwrap()
        .body;
    let quota = metrics
        .lines()
        .find_map(|l| l.strip_prefix("etcd_server_quota_backend_bytes "))
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(quota, Some(17_179_869_184.0), "{metrics}");
    let (ok, out) = etcdctl(oxcd.host_port(), &["put", "k", "v"], None);
    assert!(ok, "{out}");
}

#[test]
fn quota_exhaustion_and_the_recovery_runbook_with_etcdctl() {
    let dir = tempfile::tempdir().unwrap();
    let quota = (8 * 1024 * 1024).to_string();
    let flags = ["--quota-backend-bytes", quota.as_str()];
    let mut oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &flags);
    let endpoint = oxcd.host_port().to_string();
    let value = vec![b'x'; 400 * 1024];

    // Fill the database until the quota refuses a put.
    let mut refused = None;
    for i in 0..100 {
        let (ok, out) = etcdctl(&endpoint, &["put", &format!("big{i:03}")], Some(&value));
        if !ok {
            refused = Some(out);
            break;
        }
    }
    let refused = refused.expect("the quota refused a put");
    assert!(refused.contains(NOSPACE), "{refused}");

    // NOSPACE is raised for this member, shown by alarm list and status.
    let (_, alarms) = etcdctl(&endpoint, &["alarm", "list"], None);
    assert!(
        alarms.starts_with("memberID:") && alarms.contains("alarm:NOSPACE"),
        "{alarms}"
    );
    let status = status_json(&endpoint);
    assert!(
        status["errors"].to_string().contains("alarm:NOSPACE"),
        "{status}"
    );
    // Writes that grow the database are refused; reads, deletes and txns
    // without a put still work.
    let (ok, out) = etcdctl(&endpoint, &["put", "small", "v"], None);
    assert!(!ok && out.contains(NOSPACE), "{out}");
    let (ok, out) = etcdctl(&endpoint, &["lease", "grant", "60"], None);
    assert!(!ok && out.contains(NOSPACE), "{out}");
    let (ok, out) = etcdctl(&endpoint, &["get", "big000", "--keys-only"], None);
    assert!(ok && out.contains("big000"), "{out}");

    // The alarm survives a restart.
    oxcd.terminate(Duration::from_secs(10));
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &flags);
    let endpoint = oxcd.host_port().to_string();
    let (ok, out) = etcdctl(&endpoint, &["put", "small", "v"], None);
    assert!(!ok && out.contains(NOSPACE), "after restart: {out}");

    // The runbook: delete, compact, defrag, disarm.
    let (ok, out) = etcdctl(&endpoint, &["del", "big", "--prefix"], None);
    assert!(ok, "{out}");
    let revision = status_json(&endpoint)["header"]["revision"]
        .as_i64()
        .unwrap();
    let (ok, out) = etcdctl(&endpoint, &["compact", &revision.to_string()], None);
    assert!(ok, "{out}");
    let before = status_json(&endpoint)["dbSize"].as_i64().unwrap();
    let (ok, out) = etcdctl(&endpoint, &["defrag"], None);
    assert!(
        ok && out.contains("Finished defragmenting etcd member"),
        "{out}"
    );
    let after = status_json(&endpoint);
    let after_size = after["dbSize"].as_i64().unwrap();
    assert!(after_size < before / 2, "defrag: {before} -> {after_size}");
    assert!(after["dbSizeInUse"].as_i64().unwrap() <= after_size);
    // Still refused until disarmed.
    let (ok, _) = etcdctl(&endpoint, &["put", "small", "v"], None);
    assert!(!ok);
    let (ok, out) = etcdctl(&endpoint, &["alarm", "disarm"], None);
    assert!(ok && out.contains("alarm:NOSPACE"), "{out}");
    let (_, alarms) = etcdctl(&endpoint, &["alarm", "list"], None);
    assert_eq!(alarms, "");
    let (ok, out) = etcdctl(&endpoint, &["put", "small", "v"], None);
    assert!(ok, "writes are back: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_under_read_write_load_fails_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let endpoint = oxcd.host_port().to_string();
    let mut c = Client::connect([endpoint.clone()], None).await.unwrap();
    let value = vec![b'v'; 2048];
    for i in 0..3000 {
        c.put(format!("fill/{i:05}"), value.clone(), None)
            .await
            .unwrap();
    }
    c.delete(
        "fill/00",
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    let revision = c.get("x", None).await.unwrap().header().unwrap().revision();
    c.compact(revision, None).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let slowest = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for worker in 0..6 {
        let (stop, failures, done, slowest) = (
            stop.clone(),
            failures.clone(),
            done.clone(),
            slowest.clone(),
        );
        let mut c = c.clone();
        load.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let outcome = if worker % 2 == 0 {
                    c.put(format!("load/{worker}/{}", i % 500), "v", None)
                        .await
                        .map(|_| ())
                } else {
                    c.get(
                        "fill/01",
                        Some(GetOptions::new().with_prefix().with_limit(50)),
                    )
                    .await
                    .map(|r| assert_eq!(r.kvs().len(), 50))
                };
                if let Err(e) = outcome {
                    if failures.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("first failure: {e}");
                    }
                }
                slowest.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    let before = c.status().await.unwrap().db_size();
    for _ in 0..3 {
        let at = done.load(Ordering::Relaxed);
        c.defragment().await.unwrap();
        // The load went on during the defrag (the client waited for it).
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.load(Ordering::Relaxed) < at + 100 {
            assert!(Instant::now() < deadline, "load stalled after a defrag");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let after = c.status().await.unwrap().db_size();
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "requests failed during defrag"
    );
    // The fill's 3000 records take a 4 KiB page each; a third of them is
    // gone. (`before` may not count up to 8 MiB of the fill's pages: the
    // size is the blocks the file holds, and recent commits' pages wait in
    // redb's write buffer until a durable commit.)
    assert!(
        after < 3000 * 4096,
        "defrag freed nothing: {before} -> {after}"
    );
    eprintln!(
        "defrag under load: {} requests, slowest {} us, db {before} -> {after} bytes",
        done.load(Ordering::Relaxed),
        slowest.load(Ordering::Relaxed)
    );
    // Every write acknowledged during the defrags is there.
    let written = c
        .get(
            "load/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap()
        .count();
    assert!(written > 0);
}
