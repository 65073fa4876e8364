//! Failpoints in a real member (built only with `--features failpoints`:
//! `cargo test -p oxcd --features failpoints --test failpoints`): a crash
//! at the WAL save loses no acknowledged write, `sleep` stalls the write
//! path, the HTTP API and OXCD_FAILPOINTS arm and disarm, and
//! `brokenLinearizableRead` makes a partitioned follower answer stale
//! "linearizable" reads (what the linearizability checker must catch).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use testkit::{http, Cluster, Process};

/// `panic` aborts the process (Linux's SIGABRT).
const SIGABRT: i32 = 6;

/// Members inherit this process's environment: the test that sets
/// OXCD_FAILPOINTS holds this lock from setting it to removing it, and
/// every other test holds it while it starts members.
static ENVIRONMENT: Mutex<()> = Mutex::new(());

fn start(dir: &Path) -> Process {
    let _env = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    Process::start_oxcd(&testkit::oxcd_bin(), dir, &[])
}

fn start_with_failpoints(dir: &Path, specs: &str) -> Process {
    let _env = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("OXCD_FAILPOINTS", specs);
    let member = std::panic::catch_unwind(|| Process::start_oxcd(&testkit::oxcd_bin(), dir, &[]));
    std::env::remove_var("OXCD_FAILPOINTS");
    member.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

async fn connect(endpoint: &str) -> Client {
    Client::connect([endpoint], None).await.expect("connect")
}

fn arm(endpoint: &str, name: &str, action: &str) -> http::Response {
    http::request(
        endpoint,
        "PUT",
        &format!("/debug/failpoints/{name}"),
        Some(action),
    )
    .expect("PUT /debug/failpoints")
}

fn armed(endpoint: &str) -> String {
    let listed = http::get(endpoint, "/debug/failpoints").expect("GET /debug/failpoints");
    assert_eq!(listed.status, 200, "{listed:?}");
    listed.body
}

async fn value_of(client: &mut Client, key: &str) -> Option<String> {
    let resp = client.get(key, None).await.expect("get");
    resp.kvs()
        .first()
        .map(|kv| kv.value_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_the_wal_save_loses_no_acknowledged_write() {
    // (failpoint, whether the write in flight is in the WAL when it fires)
    for (name, durable) in [("raftBeforeSave", false), ("raftAfterSave", true)] {
        let dir = tempfile::tempdir().unwrap();
        let mut member = start(dir.path());
        let mut client = connect(&member.endpoint).await;
        let mut acknowledged = Vec::new();
        for i in 0..50 {
            let (key, value) = (format!("k{i:02}"), format!("v{i}"));
            client.put(key.clone(), value.clone(), None).await.unwrap();
            acknowledged.push((key, value));
        }

        assert_eq!(arm(&member.endpoint, name, "panic").status, 204);
        let put =
            tokio::time::timeout(Duration::from_secs(10), client.put("in-flight", "x", None)).await;
        assert!(
            !matches!(put, Ok(Ok(_))),
            "{name}=panic: the put was answered"
        );
        let status = member
            .wait_exit(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{name}=panic: the member did not die"));
        assert_eq!(status.signal(), Some(SIGABRT), "{name}: {status:?}");
        assert!(
            member
                .wait_for_log(
                    &format!("failpoint {name} triggered: panic"),
                    Duration::from_secs(5)
                )
                .is_some(),
            "{}",
            member.log_text()
        );
        drop(member);

        let member = start(dir.path());
        let mut client = connect(&member.endpoint).await;
        for (key, value) in &acknowledged {
            assert_eq!(
                value_of(&mut client, key).await.as_deref(),
                Some(value.as_str()),
                "{name}: acknowledged {key} lost"
            );
        }
        // Before the save the entry never reached the WAL; after it, the
        // entry is durable and the restarted member commits it.
        assert_eq!(
            value_of(&mut client, "in-flight").await.is_some(),
            durable,
            "{name}: the write in flight"
        );
        // The failpoint lives in memory: the restarted member is not armed.
        assert_eq!(armed(&member.endpoint), "");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleep_stalls_a_put_and_failpoints_arm_from_env_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let member = start_with_failpoints(dir.path(), "raftAfterSave=sleep(200)");
    let endpoint = member.endpoint.clone();
    assert_eq!(armed(&endpoint), "raftAfterSave=sleep(200)\n");
    let mut client = connect(&endpoint).await;
    let started = Instant::now();
    client.put("slow", "1", None).await.unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(200), "put took {took:?}");

    let deleted = http::request(&endpoint, "DELETE", "/debug/failpoints/raftAfterSave", None);
    assert_eq!(deleted.unwrap().status, 204);
    assert_eq!(armed(&endpoint), "");
    let again = http::request(&endpoint, "DELETE", "/debug/failpoints/raftAfterSave", None);
    assert_eq!(again.unwrap().status, 404);

    // Over HTTP, counted: one stalled save, then disarmed by itself.
    assert_eq!(arm(&endpoint, "raftBeforeSave", "1*sleep(300)").status, 204);
    let one = http::get(&endpoint, "/debug/failpoints/raftBeforeSave").unwrap();
    assert_eq!((one.status, one.body.as_str()), (200, "1*sleep(300)\n"));
    let started = Instant::now();
    client.put("slower", "2", None).await.unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "put took {took:?}");
    assert_eq!(armed(&endpoint), "");

    let bad = arm(&endpoint, "raftBeforeSave", "explode");
    assert_eq!(bad.status, 400, "{bad:?}");
    let unknown = arm(&endpoint, "noSuchFailpoint", "panic");
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert_eq!(armed(&endpoint), "");
}

#[test]
fn a_wrong_oxcd_failpoints_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let _env = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("OXCD_FAILPOINTS", "raftAfterSave=explode");
    let mut member = Process::launch_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    std::env::remove_var("OXCD_FAILPOINTS");
    let status = member.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(2), "{}", member.log_text());
    assert!(
        member.log_text().contains("OXCD_FAILPOINTS"),
        "{}",
        member.log_text()
    );
}

/// A follower that has not applied what the leader committed (its raft
/// thread stalled by `raftBeforeSave=sleep`, as a partition would leave it)
/// answers a linearizable read with its stale value only when
/// `brokenLinearizableRead` is armed; disarmed, the read waits for
/// ReadIndex and sees the latest write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_linearizable_read_lets_a_lagging_follower_answer_stale() {
    let cluster = {
        let _env = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
        Cluster::start(3, &[])
    };
    let leader = common::leader(&cluster).await;
    let follower = (leader + 1) % 3;
    let mut through_leader = connect(&cluster.endpoint(leader)).await;
    through_leader.put("k", "v1", None).await.unwrap();
    let endpoint = cluster.endpoint(follower);
    let mut on_follower = Client::connect(
        [endpoint.as_str()],
        Some(ConnectOptions::new().with_timeout(Duration::from_secs(20))),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while value_of(&mut on_follower, "k").await.as_deref() != Some("v1") {
        assert!(Instant::now() < deadline, "the follower never applied v1");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    assert_eq!(
        arm(&endpoint, "brokenLinearizableRead", "return").status,
        204
    );
    assert_eq!(arm(&endpoint, "raftBeforeSave", "sleep(3000)").status, 204);
    // Committed by the leader and the other follower; this one holds the
    // entry unsaved for 3 s.
    through_leader.put("k", "v2", None).await.unwrap();
    let started = Instant::now();
    let stale = value_of(&mut on_follower, "k").await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the broken read waited: {:?}",
        started.elapsed()
    );
    assert_eq!(
        stale.as_deref(),
        Some("v1"),
        "brokenLinearizableRead serves the follower's own, stale, value"
    );

    for name in ["brokenLinearizableRead", "raftBeforeSave"] {
        let path = format!("/debug/failpoints/{name}");
        let deleted = http::request(&endpoint, "DELETE", &path, None);
        assert_eq!(deleted.unwrap().status, 204);
    }
    assert_eq!(
        value_of(&mut on_follower, "k").await.as_deref(),
        Some("v2"),
        "a linearizable read sees the committed write"
    );
}

/// Every crash point a lone member reaches: the member dies there (not
/// before: the writes that precede the trigger are answered), and restarted
/// it has every write it acknowledged, the WAL replaying what the backend
/// had not committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_storage_crash_point_restarts_with_every_acknowledged_write() {
    // a snapshot every 10 entries, so that the snapshot sites are reached
    let args = ["--snapshot-count", "10"];
    for name in [
        "beforeCommit",
        "afterCommit",
        "compactBeforeCommitScheduledCompact",
        "compactAfterCommitScheduledCompact",
        "compactBeforeCommitBatch",
        "compactAfterCommitBatch",
        "defragBeforeCopy",
        "defragBeforeRename",
        "raftBeforeSaveSnap",
        "raftAfterSaveSnap",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut member = {
            let _env = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
            Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &args)
        };
        let mut client = connect(&member.endpoint).await;
        let mut acknowledged = Vec::new();
        for i in 0..20 {
            let (key, value) = (format!("before/{i:02}"), format!("v{i}"));
            client.put(key.clone(), value.clone(), None).await.unwrap();
            acknowledged.push((key, value));
        }
        assert_eq!(arm(&member.endpoint, name, "panic").status, 204);
        let trigger = async {
            if name.starts_with("compact") {
                let revision = client.get("before/10", None).await.unwrap().kvs()[0].mod_revision();
                let _ = client.compact(revision, None).await;
            } else if name.starts_with("defrag") {
                let _ = client.defragment().await;
            }
            // Writes go on (and make commits and snapshots) until it dies.
            for i in 0.. {
                let (key, value) = (format!("after/{i:05}"), format!("v{i}"));
                match client.put(key.clone(), value.clone(), None).await {
                    Ok(_) => acknowledged.push((key, value)),
                    Err(_) => break,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), trigger)
            .await
            .unwrap_or_else(|_| panic!("{name}=panic: the member did not die"));
        let status = member.wait_exit(Duration::from_secs(10));
        assert_eq!(
            status.and_then(|s| s.signal()),
            Some(SIGABRT),
            "{name}: {status:?}"
        );
        assert!(
            member
                .log_text()
                .contains(&format!("failpoint {name} triggered: panic")),
            "{name}:\n{}",
            member.log_text()
        );
        drop(member);

        let member = {
            let _env = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
            Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &args)
        };
        let mut client = connect(&member.endpoint).await;
        for (key, value) in &acknowledged {
            assert_eq!(
                value_of(&mut client, key).await.as_deref(),
                Some(value.as_str()),
                "{name}: acknowledged {key} lost"
            );
        }
    }
}

/// A member that catches up by snapshot: the leader's first send breaks off
/// after part of the file (`raftDuringSendSnapshot=1*return`) and is sent
/// again; the member crashes once raft saved the snapshot, before or after
/// the received backend replaces its own, and restarted it has every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_around_installing_a_snapshot_restarts_with_every_key() {
    // Snapshot every 100 entries and keep only 10 below it: a member that
    // misses a few hundred writes can only catch up from a snapshot.
    let args = [
        "--snapshot-count",
        "100",
        "--experimental-snapshot-catchup-entries",
        "10",
    ];
    // (failpoint, the stream the member takes: its leader's file image, or
    // as an older oxcd would, its records or a copy of its file)
    for (name, stream) in [
        ("raftAfterApplySnap", "image"),
        ("raftBeforeApplySnap", "file"),
        ("raftAfterSaveSnap", "records"),
    ] {
        let mut cluster = {
            let _env = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
            Cluster::start(3, &args)
        };
        let leader = common::leader(&cluster).await;
        let lagging = (leader + 1) % 3;
        cluster.kill9(lagging);
        let to_leader = cluster.endpoint(leader);
        assert_eq!(
            arm(&to_leader, "raftDuringSendSnapshot", "1*return").status,
            204
        );
        let mut client = connect(&to_leader).await;
        for i in 0..400 {
            client
                .put(format!("k{i:03}"), format!("v{i}"), None)
                .await
                .unwrap();
        }
        // a member that answers as an oxcd without SnapshotImage (and
        // SnapshotRecords) does gets the leader's records (a copy of its
        // file) instead
        let armed = match stream {
            "file" => format!(
                "{name}=panic;snapshotImageUnimplemented=return;snapshotRecordsUnimplemented=return"
            ),
            "records" => format!("{name}=panic;snapshotImageUnimplemented=return"),
            _ => format!("{name}=panic"),
        };
        {
            let _env = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
            std::env::set_var("OXCD_FAILPOINTS", armed);
            cluster.spawn_with(lagging, &[]);
            std::env::remove_var("OXCD_FAILPOINTS");
        }
        let member = cluster.members[lagging].as_mut().unwrap();
        let status = member.wait_exit(Duration::from_secs(30));
        assert_eq!(
            status.and_then(|s| s.signal()),
            Some(SIGABRT),
            "{name}: {status:?}\n{}",
            member.log_text()
        );
        assert!(member
            .log_text()
            .contains(&format!("failpoint {name} triggered: panic")));
        assert!(
            member
                .log_text()
                .contains(&format!(r#""stream":"{stream}""#)),
            "{name}: no {stream} received:\n{}",
            member.log_text()
        );
        let leader_log = cluster.members[leader].as_ref().unwrap().log_text();
        assert!(
            leader_log.contains("failpoint raftDuringSendSnapshot"),
            "the first send did not break off:\n{leader_log}"
        );
        cluster.kill9(lagging);

        {
            let _env = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
            cluster.restart(lagging);
        }
        let mut lag = connect(&cluster.endpoint(lagging)).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = lag
                .get(
                    "k",
                    Some(
                        etcd_client::GetOptions::new()
                            .with_prefix()
                            .with_serializable()
                            .with_count_only(),
                    ),
                )
                .await
                .unwrap();
            if got.count() == 400 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: the restarted member has {} of 400 keys",
                got.count()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(value_of(&mut lag, "k399").await.as_deref(), Some("v399"));
        // Raft saved the snapshot before the crash: the restart installs the
        // received backend, which raft needs to start at all.
        let log = cluster.members[lagging].as_ref().unwrap().log_text();
        assert_eq!(
            log.contains("installed the database snapshot received before a restart"),
            name != "raftAfterApplySnap",
            "{name}:\n{log}"
        );
    }
}
