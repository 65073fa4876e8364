//! `--experimental-bootstrap-defrag-threshold-megabytes` (etcd's
//! maybeDefragBackend at start) and `--experimental-compact-hash-check-*`
//! (etcd's leader-side CompactHashCheck), with etcd 3.5.16's log lines.

use std::path::Path;
use std::time::{Duration, Instant};

use etcd_client::{Client, CompactionOptions};
use testkit::{oxcd_bin, Cluster, Process};

const STOP: Duration = Duration::from_secs(20);

/// A field of one JSON log line, as text (strings unquoted).
fn field(line: &str, name: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    match v.get(name)? {
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The backend file's bytes on disk, as the member counts its size (the
/// blocks it holds: redb's grown part is a hole).
fn db_size(data_dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(data_dir.join("member/snap/db")).expect("backend file");
    (meta.blocks() * 512).min(meta.len())
}

#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_defrag_runs_only_past_its_threshold() {
    let bin = oxcd_bin();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    // ~32 MiB written, then deleted and compacted: mostly free space
    // (more than redb's write buffer holds: pages freed before they
    // reached the file would leave a hole, not free space, in it)
    let mut m = Process::start_oxcd(&bin, &data, &[]);
    let mut c = Client::connect([m.endpoint.clone()], None).await.unwrap();
    // incompressible values
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..64 {
        let value: Vec<u8> = (0..512 * 1024)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 56) as u8
            })
            .collect();
        c.put(format!("big{i}"), value, None).await.unwrap();
        // kept between them: the freed pages stay inside the file
        c.put(format!("keep{i}"), vec![b'k'; 4096], None)
            .await
            .unwrap();
    }
    let deleted = c
        .delete("big", Some(etcd_client::DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    let revision = deleted.header().unwrap().revision();
    c.compact(revision, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    drop(c);
    m.terminate(STOP).expect("member stops");

    // 0 (the default): no defragmentation, not even looked at
    let mut m = Process::start_oxcd(&bin, &data, &[]);
    m.terminate(STOP).expect("member stops");
    let log = m.log_text();
    assert!(!log.contains("defragmenting"), "{log}");
    assert!(!log.contains("Skipping defragmentation"), "{log}");

    // a threshold above the free space: etcd's line, nothing done
    let mut m = Process::start_oxcd(
        &bin,
        &data,
        &[
            "--experimental-bootstrap-defrag-threshold-megabytes",
            "100000",
        ],
    );
    m.terminate(STOP).expect("member stops");
    let skipped = m
        .wait_for_log("Skipping defragmentation", Duration::ZERO)
        .unwrap_or_else(|| panic!("no skip line:\n{}", m.log_text()));
    assert_eq!(
        field(&skipped, "experimental-bootstrap-defrag-threshold-bytes").as_deref(),
        Some("104857600000")
    );
    let size: i64 = field(&skipped, "current-db-size-bytes")
        .unwrap()
        .parse()
        .unwrap();
    let in_use: i64 = field(&skipped, "current-db-size-in-use-bytes")
        .unwrap()
        .parse()
        .unwrap();
    assert!(size - in_use > 1024 * 1024, "{skipped}");
    assert!(!m.log_text().contains("defragmenting"));
    let before = db_size(&data);

    // 1 MiB: the free space is more, defragmented before serving
    let m = Process::start_oxcd(
        &bin,
        &data,
        &["--experimental-bootstrap-defrag-threshold-megabytes", "1"],
    );
    let lines = m.log_lines();
    let position = |needle: &str| lines.iter().position(|l| l.contains(needle));
    let finished = position("finished defragmenting directory")
        .unwrap_or_else(|| panic!("no defragmentation:\n{}", m.log_text()));
    assert!(position("\"defragmenting\"").is_some_and(|p| p < finished));
    assert!(finished < position("ready to serve client requests").unwrap());
    let after = db_size(&data);
    assert!(after < before, "db {before} bytes, {after} after");
    // as logged, give or take what the commits since wrote
    let logged: u64 = field(&lines[finished], "current-db-size-bytes")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        logged.abs_diff(after) < 256 * 1024,
        "logged {logged}, file {after}"
    );
    // the data is still served
    let mut c = Client::connect([m.endpoint.clone()], None).await.unwrap();
    let status = c.status().await.unwrap();
    assert_eq!(status.header().unwrap().revision(), revision);
}

/// The first line containing `needle` any member logged, polled until
/// `deadline`: (member index, line).
fn wait_any(cluster: &Cluster, needle: &str, deadline: Duration) -> Option<(usize, String)> {
    let end = Instant::now() + deadline;
    loop {
        for (i, m) in cluster.members.iter().enumerate() {
            let Some(m) = m else { continue };
            if let Some(line) = m.log_lines().into_iter().find(|l| l.contains(needle)) {
                return Some((i, line));
            }
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_checks_the_compaction_hashes_of_the_whole_cluster() {
    let cluster = Cluster::start(
        3,
        &[
            "--experimental-compact-hash-check-enabled",
            "--experimental-compact-hash-check-time",
            "1s",
        ],
    );
    let mut c = Client::connect(cluster.endpoints(), None).await.unwrap();
    for i in 0..10 {
        c.put(format!("k{i}"), format!("v{i}"), None).await.unwrap();
    }
    c.delete("k3", None).await.unwrap();
    let revision = c
        .put("k0", "again", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    c.compact(revision, None).await.unwrap();

    let (leader, ok) = wait_any(
        &cluster,
        "successfully checked hash on whole cluster",
        Duration::from_secs(30),
    )
    .unwrap_or_else(|| {
        let logs: Vec<String> = cluster
            .members
            .iter()
            .flatten()
            .map(|m| m.log_text())
            .collect();
        panic!(
            "no member checked the compaction hash:\n{}",
            logs.join("\n\n")
        )
    });
    assert_eq!(field(&ok, "revision"), Some(revision.to_string()));
    assert_eq!(field(&ok, "number-of-peers-checked").as_deref(), Some("2"));
    let log = cluster.members[leader].as_ref().unwrap().log_lines();
    assert!(log
        .iter()
        .any(|l| l.contains("starting compact hash check")));
    let at = log.iter().position(|l| *l == ok).unwrap();
    // the same check's last line follows
    let end = Instant::now() + Duration::from_secs(10);
    let finished = loop {
        let log = cluster.members[leader].as_ref().unwrap().log_lines();
        if let Some(l) = log[at..]
            .iter()
            .find(|l| l.contains("finished compaction hash check"))
        {
            break l.clone();
        }
        assert!(
            Instant::now() < end,
            "no finished line after the success line"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        field(&finished, "number-of-hashes-checked").as_deref(),
        Some("1")
    );
    assert!(
        log.iter()
            .filter(|l| l.contains("successfully checked hash on follower"))
            .count()
            >= 2
    );
    // no alarm
    let alarms = c
        .alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await
        .unwrap();
    assert!(alarms.alarms().is_empty());
}
