//! Snapshots end to end: Maintenance.Snapshot as etcdctl 3.4 and 3.5 save
//! it, consistency under a writer, `oxctl snapshot restore` into a new
//! cluster, and refusal of a damaged file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{GetOptions, PutOptions};
use testkit::{oxcd_bin, Cluster, Process, ETCD_34, ETCD_35};

mod common;
use common::client;

/// Runs `oxctl` in process; stdout on success, the error line on failure.
fn oxctl(args: &[&str]) -> Result<String, String> {
    let mut out = Vec::new();
    let argv = std::iter::once("oxctl").chain(args.iter().copied());
    match oxctl::run(argv, &mut out) {
        Ok(()) => Ok(String::from_utf8(out).expect("utf-8 output")),
        Err(e) => Err(e.to_string()),
    }
}

/// `etcdctl snapshot save` with the given etcdctl against `endpoint`.
fn etcdctl_save(etcdctl: &str, endpoint: &str, path: &Path) -> std::process::Output {
    Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "snapshot", "save"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {etcdctl}: {e}"))
}

fn status_json(path: &Path) -> serde_json::Value {
    let out = oxctl(&["snapshot", "status", path.to_str().unwrap(), "-w", "json"])
        .unwrap_or_else(|e| panic!("snapshot status: {e}"));
    serde_json::from_str(out.trim()).unwrap()
}

/// Every key, value, mod revision and lease, read serializably from one member.
async fn everything(endpoint: &str) -> (i64, BTreeMap<String, (String, i64, i64)>) {
    let mut c = client(&[endpoint.to_string()]).await;
    let r = c
        .get(
            "",
            Some(GetOptions::new().with_all_keys().with_serializable()),
        )
        .await
        .unwrap();
    let kvs = r
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                (
                    kv.value_str().unwrap().to_string(),
                    kv.mod_revision(),
                    kv.lease(),
                ),
            )
        })
        .collect();
    (r.header().unwrap().revision(), kvs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_34_and_35_snapshot_save_against_oxcd_pass_their_own_checks() {
    let dir = tempfile::tempdir().unwrap();
    let member = Process::start_oxcd(&oxcd_bin(), &dir.path().join("data"), &[]);
    let mut c = client(std::slice::from_ref(&member.endpoint)).await;
    // Enough data for many 32 KiB chunks.
    for i in 0..300 {
        c.put(format!("key-{i:04}"), "x".repeat(1024), None)
            .await
            .unwrap();
    }
    let revision = c
        .get("key-0000", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();

    let mut saved = 0;
    for (version, etcdctl) in [("3.4", ETCD_34.1), ("3.5", ETCD_35.1)] {
        if !Path::new(etcdctl).exists() {
            eprintln!("etcdctl {version} not installed: skipped");
            continue;
        }
        let path = dir.path().join(format!("snap-{version}.db"));
        let out = etcdctl_save(etcdctl, member.host_port(), &path);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("Snapshot saved at"),
            "etcdctl {version} snapshot save failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len % 512, 32, "etcdctl {version}: size {len}");
        assert!(len > 300 * 1024, "holds the values: {len}");
        let status = status_json(&path);
        assert_eq!(status["revision"], revision, "etcdctl {version}: {status}");
        // that etcdctl's own `snapshot status` reads the file alike
        let out = Command::new(etcdctl)
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "status", path.to_str().unwrap(), "-w", "json"])
            .output()
            .unwrap();
        let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "etcdctl {version} snapshot status: {e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(theirs, status, "etcdctl {version} (left) and oxctl (right)");
        saved += 1;
    }
    assert!(saved > 0, "no etcdctl installed");

    // A copy left by an earlier oxcd (which wrote copies to files first)
    // is swept up.
    let stale = dir
        .path()
        .join("data/member/snap/client-snapshot-999999999-0.db.tmp");
    std::fs::write(&stale, b"partial copy").unwrap();

    // The stream itself: remaining bytes count down, the first message has
    // a header, the last one is the sha256 of everything before it.
    let mut stream = c.maintenance_client().snapshot().await.unwrap();
    let mut body = Vec::new();
    let mut messages = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        messages.push((m.header().is_some(), m.remaining_bytes(), m.blob().len()));
        body.extend_from_slice(m.blob());
    }
    assert!(messages[0].0, "first message carries a header");
    assert!(messages.iter().all(|m| m.2 <= 32 * 1024), "32 KiB chunks");
    let (_, last_remaining, last_len) = *messages.last().unwrap();
    assert_eq!((last_remaining, last_len), (0, 32), "sha256 last");
    assert_eq!(body.len() % 512, 32);
    let first_remaining = messages[0].1 as usize + messages[0].2;
    assert_eq!(first_remaining, body.len() - 32);
    let path = dir.path().join("via-client.db");
    std::fs::write(&path, &body).unwrap();
    assert_eq!(status_json(&path)["revision"], revision);
    // its last 32 bytes are the sha256 of the rest: a restore checks it
    let restored = dir.path().join("via-client-restored");
    oxctl(&[
        "snapshot",
        "restore",
        path.to_str().unwrap(),
        "--data-dir",
        restored.to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("restore of the streamed copy: {e}"));
    // Nothing is left in the snap dir.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("data/member/snap"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.contains("client-snapshot"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Restores `snapshot` as a single new member and returns it running.
fn restore_single(dir: &Path, snapshot: &Path) -> Process {
    let data = dir.join("restored");
    oxctl(&[
        "snapshot",
        "restore",
        snapshot.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("restore: {e}"));
    Process::start_oxcd(&oxcd_bin(), &data, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_under_a_writer_holds_exactly_the_keys_of_its_revision() {
    let dir = tempfile::tempdir().unwrap();
    let member = Process::start_oxcd(&oxcd_bin(), &dir.path().join("data"), &[]);
    let endpoint = member.endpoint.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let writer = {
        let (stop, acknowledged, endpoint) = (stop.clone(), acknowledged.clone(), endpoint.clone());
        tokio::spawn(async move {
            let mut c = client(&[endpoint]).await;
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                let key = format!("w-{i:06}");
                let r = c.put(key.clone(), format!("{i}"), None).await.unwrap();
                acknowledged
                    .lock()
                    .unwrap()
                    .push((key, r.header().unwrap().revision()));
                i += 1;
            }
        })
    };
    // Let the writer get going, then snapshot while it runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    while acknowledged.lock().unwrap().len() < 200 {
        assert!(Instant::now() < deadline, "writer made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let path = dir.path().join("snap.db");
    let save = {
        let (endpoint, path) = (member.host_port().to_string(), path.clone());
        tokio::task::spawn_blocking(move || etcdctl_save(ETCD_34.1, &endpoint, &path))
    };
    let out = save.await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Keep writing a little longer, so revisions after the snapshot's exist.
    let after = acknowledged.lock().unwrap().len() + 20;
    let deadline = Instant::now() + Duration::from_secs(30);
    while acknowledged.lock().unwrap().len() < after {
        assert!(Instant::now() < deadline, "writer stalled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Release);
    writer.await.unwrap();
    let acknowledged = acknowledged.lock().unwrap().clone();

    let restored = restore_single(dir.path(), &path);
    let (revision, kvs) = everything(&restored.endpoint).await;
    assert!(
        acknowledged.iter().any(|(_, rev)| *rev > revision),
        "the writer went on after the snapshot"
    );
    let expected: Vec<&String> = acknowledged
        .iter()
        .filter(|(_, rev)| *rev <= revision)
        .map(|(k, _)| k)
        .collect();
    let got: Vec<&String> = kvs.keys().collect();
    assert_eq!(got, expected, "keys of revision {revision}");
    // And they equal the source's history at that revision, values and all.
    let mut source = client(&[endpoint]).await;
    let at = source
        .get(
            "",
            Some(GetOptions::new().with_all_keys().with_revision(revision)),
        )
        .await
        .unwrap();
    let source_kvs: BTreeMap<String, (String, i64, i64)> = at
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                (
                    kv.value_str().unwrap().to_string(),
                    kv.mod_revision(),
                    kv.lease(),
                ),
            )
        })
        .collect();
    assert_eq!(kvs, source_kvs);
}

fn member_ids(status: &[(u64, u64)]) -> Vec<u64> {
    status.iter().map(|s| s.0).collect()
}

async fn ids(endpoint: &str) -> (u64, u64) {
    let mut c = client(&[endpoint.to_string()]).await;
    let s = c.status().await.unwrap();
    let h = s.header().unwrap();
    (h.member_id(), h.cluster_id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restored_into_three_data_dirs_starts_a_new_cluster_with_identical_data() {
    let dir = tempfile::tempdir().unwrap();
    let source = Process::start_oxcd(&oxcd_bin(), &dir.path().join("source"), &[]);
    let mut c = client(std::slice::from_ref(&source.endpoint)).await;
    let lease = c.lease_grant(3600, None).await.unwrap().id();
    for i in 0..50 {
        c.put(format!("k{i:02}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.put("leased", "yes", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    // History and a compaction travel too.
    c.put("k00", "v0-again", None).await.unwrap();
    let compact_at = c
        .get("k00", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
        - 1;
    c.compact(compact_at, None).await.unwrap();
    c.put("k01", "v1-again", None).await.unwrap();
    let (source_revision, source_kvs) = everything(&source.endpoint).await;
    let source_ids = ids(&source.endpoint).await;

    let path = dir.path().join("snap.db");
    let out = etcdctl_save(ETCD_34.1, source.host_port(), &path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut cluster = Cluster::prepare(3, &[]);
    for i in 0..3 {
        let args = cluster.restore_args(i, &path);
        oxctl(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .unwrap_or_else(|e| panic!("restore m{i}: {e}"));
    }
    cluster.start_all();

    let mut statuses = Vec::new();
    let mut hashes = Vec::new();
    for endpoint in cluster.endpoints() {
        let (revision, kvs) = everything(&endpoint).await;
        assert_eq!(revision, source_revision, "{endpoint}");
        assert_eq!(kvs, source_kvs, "{endpoint}");
        let mut c = client(std::slice::from_ref(&endpoint)).await;
        let h = c.hash_kv(0).await.unwrap();
        hashes.push((h.hash(), h.compact_version()));
        statuses.push(ids(&endpoint).await);
        // The lease came along: it is known and keeps its key.
        let ttl = c
            .lease_time_to_live(
                lease,
                Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
            )
            .await
            .unwrap();
        assert!(ttl.ttl() > 0, "{endpoint}: lease {lease:x} lost");
        assert_eq!(ttl.keys(), [b"leased".to_vec()]);
    }
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{hashes:?}");
    assert_eq!(hashes[0].1, compact_at, "compaction preserved");
    // New identities: three distinct members of one new cluster.
    let cluster_ids: Vec<u64> = statuses.iter().map(|s| s.1).collect();
    assert!(cluster_ids.iter().all(|id| *id == cluster_ids[0]));
    assert_ne!(cluster_ids[0], source_ids.1, "new cluster ID");
    let mut members = member_ids(&statuses);
    assert!(!members.contains(&source_ids.0), "new member IDs");
    members.dedup();
    assert_eq!(members.len(), 3);
    let list = client(&[cluster.endpoint(0)])
        .await
        .member_list()
        .await
        .unwrap();
    assert_eq!(list.members().len(), 3);

    // The new cluster goes on from the snapshot's revision, on every member.
    let mut c = client(&[cluster.endpoint(1)]).await;
    let put = c.put("after-restore", "1", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), source_revision + 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    for endpoint in cluster.endpoints() {
        loop {
            let (revision, _) = everything(&endpoint).await;
            if revision == source_revision + 1 {
                break;
            }
            assert!(Instant::now() < deadline, "{endpoint} stuck at {revision}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[test]
fn restore_refuses_a_snapshot_with_a_flipped_byte() {
    let dir = tempfile::tempdir().unwrap();
    let member = Process::start_oxcd(&oxcd_bin(), &dir.path().join("data"), &[]);
    let put = Command::new(ETCD_34.1)
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", member.host_port(), "put", "foo", "bar"])
        .output()
        .unwrap();
    assert!(put.status.success());
    let path = dir.path().join("snap.db");
    assert!(etcdctl_save(ETCD_34.1, member.host_port(), &path)
        .status
        .success());
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0x20;
    let damaged = dir.path().join("damaged.db");
    std::fs::write(&damaged, &bytes).unwrap();
    let data: PathBuf = dir.path().join("restored");
    let err = oxctl(&[
        "snapshot",
        "restore",
        damaged.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ])
    .unwrap_err();
    assert!(err.starts_with("expected sha256 ["), "{err}");
    assert!(!data.exists(), "nothing written for a damaged snapshot");
    // A restore into an existing data dir is refused as etcdutl refuses it.
    let err = oxctl(&[
        "snapshot",
        "restore",
        path.to_str().unwrap(),
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
    ])
    .unwrap_err();
    assert!(
        err.starts_with("data-dir \"") && err.ends_with("\" not empty or could not be read"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_snapshot_client_does_not_hold_up_writes() {
    let dir = tempfile::tempdir().unwrap();
    let member = Process::start_oxcd(&oxcd_bin(), &dir.path().join("data"), &[]);
    let mut c = client(std::slice::from_ref(&member.endpoint)).await;
    // Several MiB: far more than the stream's queue and HTTP/2 windows.
    let value = "v".repeat(4096);
    for i in 0..1500 {
        c.put(format!("big-{i:05}"), value.clone(), None)
            .await
            .unwrap();
    }
    let mut stream = c.maintenance_client().snapshot().await.unwrap();
    let first = stream.message().await.unwrap().expect("a first chunk");
    let total = first.remaining_bytes() as usize + first.blob().len();
    assert!(total > 4 * 1024 * 1024, "{total}");
    // The client reads nothing more for a while; writes go on meanwhile.
    let mut writer = client(std::slice::from_ref(&member.endpoint)).await;
    let started = Instant::now();
    for i in 0..200 {
        let put = tokio::time::timeout(
            Duration::from_secs(5),
            writer.put(format!("during-{i}"), "x", None),
        )
        .await;
        assert!(
            matches!(put, Ok(Ok(_))),
            "put {i} during a stalled snapshot: {put:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(20));
    // The copy is unlinked while it is being sent: nothing to clean up later.
    let leftovers = std::fs::read_dir(dir.path().join("data/member/snap"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("client-snapshot"))
        .count();
    assert_eq!(leftovers, 0);
    // The stream then completes, with the state of when it began.
    let mut body = first.blob().to_vec();
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Some(m) = stream.message().await.unwrap() {
        body.extend_from_slice(m.blob());
        assert!(Instant::now() < deadline);
    }
    assert_eq!(body.len(), total + 32);
    let path = dir.path().join("snap.db");
    std::fs::write(&path, &body).unwrap();
    let status = status_json(&path);
    let end = writer
        .get("during-0", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert_eq!(status["revision"].as_i64().unwrap(), end - 200);
}

/// The value of the sample `series` of /metrics (name and labels as
/// printed).
fn metric(endpoint: &str, series: &str) -> Option<f64> {
    let response = testkit::http::get(endpoint, "/metrics").expect("GET /metrics");
    assert_eq!(response.status, 200, "{}", response.body);
    testkit::http::sample(&response.body, series)
}

/// The client port frames Snapshot's messages itself (not through tonic):
/// every message decodes, the first has the header, `remaining_bytes`
/// counts down to 0, the last is the sha256 of the others, the call ends
/// OK, and the gRPC metrics count it as any streamed call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_stream_is_etcds_messages_counted_and_ended_ok() {
    use sha2::{Digest, Sha256};
    let dir = tempfile::tempdir().unwrap();
    let member = Process::start_oxcd(&oxcd_bin(), &dir.path().join("data"), &[]);
    let mut c = client(std::slice::from_ref(&member.endpoint)).await;
    for i in 0..100 {
        c.put(format!("k{i:03}"), "v".repeat(3000), None)
            .await
            .unwrap();
    }
    let sent = "grpc_server_msg_sent_total{grpc_method=\"Snapshot\",grpc_service=\"etcdserverpb.Maintenance\",grpc_type=\"server_stream\"}";
    let ok = "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Snapshot\",grpc_service=\"etcdserverpb.Maintenance\",grpc_type=\"server_stream\"}";
    let sent_before = metric(&member.endpoint, sent).unwrap_or(0.0);
    let ok_before = metric(&member.endpoint, ok).unwrap_or(0.0);

    let mut stream = c.maintenance_client().snapshot().await.unwrap();
    let mut messages = Vec::new();
    while let Some(message) = stream.message().await.unwrap() {
        messages.push(message);
    }
    assert!(messages.len() > 3, "{} messages", messages.len());
    let header = messages[0].header().expect("the first message's header");
    assert_ne!(header.cluster_id(), 0);
    assert!(messages[1..].iter().all(|m| m.header().is_none()));
    let (last, chunks) = messages.split_last().unwrap();
    let body: Vec<u8> = chunks.iter().flat_map(|m| m.blob().to_vec()).collect();
    let mut left = body.len() as u64;
    for chunk in chunks {
        left -= chunk.blob().len() as u64;
        assert_eq!(chunk.remaining_bytes(), left);
    }
    assert_eq!(last.remaining_bytes(), 0);
    assert_eq!(last.blob(), Sha256::digest(&body).as_slice());
    let path = dir.path().join("snap.db");
    std::fs::write(&path, [body.as_slice(), last.blob()].concat()).unwrap();
    // the 100 puts of a new member: revision 101
    assert_eq!(status_json(&path)["revision"].as_i64(), Some(101));

    // the handled count lands when the trailers go out: poll for it
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&member.endpoint, ok).unwrap_or(0.0) < ok_before + 1.0 {
        assert!(Instant::now() < deadline, "Snapshot not counted as OK");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(&member.endpoint, sent),
        Some(sent_before + messages.len() as f64)
    );
}
