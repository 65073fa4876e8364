//! End-to-end tests of one member: start, group commit, restart replay,
//! snapshot + WAL release.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use consensus::raft::eraftpb::{ConfChange, ConfChangeType, Entry, EntryType};
use consensus::wal::WalOptions;
use consensus::{
    start_with_options, CommittedBatch, ConsensusError, NoopTransport, RaftConfig, RaftHandle,
    StartOptions,
};
use protobuf::Message as _;
use tokio::sync::mpsc::Receiver;

const ID: u64 = 0x8e9e05c52164694d;

fn config(dir: &Path, applied: u64) -> RaftConfig {
    RaftConfig {
        id: ID,
        member_dir: dir.join("member"),
        wal_dir: dir.join("member").join("wal"),
        voters: vec![ID],
        heartbeat: Duration::from_millis(100),
        election_timeout: Duration::from_millis(1000),
        applied,
        cluster_id: 0xcdf818194e3a8c32,
        force_new_cluster: false,
    }
}

/// 2 KiB segments, and (`--max-wals 1`) every released one deleted.
fn small_segments() -> StartOptions {
    StartOptions {
        wal: WalOptions {
            segment_bytes: 2 * 1024,
            max_files: 1,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn start(dir: &Path, applied: u64) -> (RaftHandle, Receiver<CommittedBatch>) {
    start_with_options(
        config(dir, applied),
        Arc::new(NoopTransport),
        small_segments(),
    )
    .expect("start member")
}

async fn wait_for(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Receives batches until a data entry at `last_index` arrives; reports
/// applied as it goes, like the apply loop does.
async fn receive_until(
    handle: &RaftHandle,
    rx: &mut Receiver<CommittedBatch>,
    last_index: u64,
) -> Vec<Entry> {
    let mut all = Vec::new();
    let deadline = Duration::from_secs(20);
    loop {
        let batch = tokio::time::timeout(deadline, rx.recv())
            .await
            .expect("committed entries in time")
            .expect("committed channel open");
        let last = batch.entries.last().expect("batches are never empty").index;
        all.extend(batch.entries);
        handle.report_applied(last);
        if last >= last_index {
            return all;
        }
    }
}

fn assert_contiguous(entries: &[Entry]) {
    for pair in entries.windows(2) {
        assert_eq!(
            pair[1].index,
            pair[0].index + 1,
            "entries in index order, no gaps"
        );
    }
}

fn segment_count(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("member/wal"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .ends_with(".wal")
        })
        .count()
}

/// Proposes `n` values concurrently from `n` tasks; all must be accepted.
async fn propose_concurrently(handle: &RaftHandle, prefix: &str, n: usize) {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let h = handle.clone();
            let data = format!("{prefix}-{i}").into_bytes();
            tokio::spawn(async move { h.propose(data).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().expect("proposal accepted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_member_group_commits_and_replays_above_applied_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (handle, mut rx) = start(dir.path(), 0);
    wait_for("leader", Duration::from_secs(5), || {
        handle.status().is_leader
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a new single member is leader at once, took {:?}",
        started.elapsed()
    );
    let status = handle.status();
    assert_eq!(status.leader, ID);
    assert_eq!(status.leader_changes, 1);

    let syncs_before = handle.wal_sync_count();
    propose_concurrently(&handle, "put", 1000).await;
    // index 1 is the new leader's empty entry; the proposals are 2..=1001
    let entries = receive_until(&handle, &mut rx, 1001).await;
    assert_contiguous(&entries);
    assert_eq!(entries.first().unwrap().index, 1);
    let data: Vec<_> = entries.iter().filter(|e| !e.data.is_empty()).collect();
    assert_eq!(data.len(), 1000);
    let syncs = handle.wal_sync_count() - syncs_before;
    eprintln!("fsyncs for 1000 concurrent proposals: {syncs}");
    assert!(
        syncs < 250,
        "group commit: {syncs} fsyncs for 1000 concurrent proposals"
    );
    wait_for("applied published", Duration::from_secs(5), || {
        handle.status().applied_index == 1001
    })
    .await;
    assert_eq!(handle.status().commit_index, 1001);
    assert!(segment_count(dir.path()) > 1, "small segments were cut");
    handle.stop();
    assert!(
        rx.recv().await.is_none(),
        "committed channel closes on stop"
    );
    assert!(matches!(
        handle.propose(b"late".to_vec()).await,
        Err(ConsensusError::Stopped)
    ));

    // Restart: the backend says 500 is durable; everything above comes back.
    let (handle, mut rx) = start(dir.path(), 500);
    let entries = receive_until(&handle, &mut rx, 1001).await;
    assert!(
        entries.iter().all(|e| e.index > 500),
        "nothing at or below applied"
    );
    assert_eq!(entries.first().unwrap().index, 501);
    assert_contiguous(&entries);
    let redelivered: Vec<_> = entries.iter().filter(|e| e.index <= 1001).collect();
    assert_eq!(redelivered.len(), 501);
    assert_eq!(
        redelivered.last().unwrap().data.as_ref(),
        data.last().unwrap().data.as_ref()
    );
    wait_for("leader after restart", Duration::from_secs(5), || {
        handle.status().is_leader
    })
    .await;
    assert!(handle.status().term >= 2);
    handle.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_releases_wal_and_restart_resumes_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut rx) = start(dir.path(), 0);
    wait_for("leader", Duration::from_secs(5), || {
        handle.status().is_leader
    })
    .await;
    // rounds of writes, so that several syncs (and segment cuts) happen
    let mut last = 1;
    for round in 0..10 {
        propose_concurrently(&handle, &format!("a{round}"), 30).await;
        let entries = receive_until(&handle, &mut rx, last + 30).await;
        last = entries.last().unwrap().index;
    }
    assert_eq!(last, 301);
    let segments_before = segment_count(dir.path());
    assert!(segments_before > 2, "{segments_before} segments");

    // apply side: backend commit covering `last` is durable
    handle.snapshot(last);
    let snap_file = dir
        .path()
        .join(format!("member/snap/{:016x}-{:016x}.snap", 1u64, last));
    wait_for("snapshot file", Duration::from_secs(5), || {
        snap_file.exists()
    })
    .await;
    wait_for("WAL release", Duration::from_secs(5), || {
        segment_count(dir.path()) < segments_before
    })
    .await;

    // more writes after the snapshot
    propose_concurrently(&handle, "b", 50).await;
    let after = receive_until(&handle, &mut rx, last + 50).await;
    let newest = after.last().unwrap().index;
    handle.stop();

    // Restart at the snapshot: only entries after it come back.
    let (handle, mut rx) = start(dir.path(), last);
    let replayed = receive_until(&handle, &mut rx, newest).await;
    assert_eq!(replayed.first().unwrap().index, last + 1);
    assert_contiguous(&replayed);
    wait_for("leader", Duration::from_secs(5), || {
        handle.status().is_leader
    })
    .await;
    propose_concurrently(&handle, "c", 10).await;
    let more = receive_until(&handle, &mut rx, newest + 11).await;
    assert!(more.iter().filter(|e| !e.data.is_empty()).count() >= 10);
    handle.stop();

    // A backend behind the snapshot breaks the release invariant: refuse.
    let err = start_with_options(
        config(dir.path(), last - 1),
        Arc::new(NoopTransport),
        small_segments(),
    )
    .err()
    .expect("applied below snapshot must refuse");
    assert!(matches!(err, ConsensusError::Corrupt(_)), "{err}");
}

fn wal_files(wal_dir: &Path) -> usize {
    std::fs::read_dir(wal_dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .ends_with(".wal")
        })
        .count()
}

/// A member whose WAL is in its own directory (etcd's --wal-dir) and
/// keeps `max_files` segments (etcd's --max-wals).
fn start_in(
    dir: &Path,
    wal_dir: &Path,
    applied: u64,
    max_files: usize,
) -> Result<(RaftHandle, Receiver<CommittedBatch>), ConsensusError> {
    let mut cfg = config(dir, applied);
    cfg.wal_dir = wal_dir.to_path_buf();
    let mut options = small_segments();
    options.wal.max_files = max_files;
    start_with_options(cfg, Arc::new(NoopTransport), options)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_wals_keeps_that_many_segments_of_a_dedicated_wal_dir_and_zero_keeps_all() {
    for max_files in [2, 0] {
        let dir = tempfile::tempdir().unwrap();
        let wal_dir = dir.path().join("dedicated").join("wal");
        let (handle, mut rx) = start_in(dir.path(), &wal_dir, 0, max_files).unwrap();
        wait_for("leader", Duration::from_secs(5), || {
            handle.status().is_leader
        })
        .await;
        let mut last = 1;
        for round in 0..10 {
            propose_concurrently(&handle, &format!("a{round}"), 30).await;
            last = receive_until(&handle, &mut rx, last + 30)
                .await
                .last()
                .unwrap()
                .index;
        }
        let before = wal_files(&wal_dir);
        assert!(before > 2, "{before} segments");
        let names_before: Vec<std::ffi::OsString> = std::fs::read_dir(&wal_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            !dir.path().join("member/wal").exists(),
            "the WAL lives in the dedicated dir only"
        );
        // nothing is released before a snapshot: nothing goes
        assert_eq!(wal_files(&wal_dir), before);

        handle.snapshot(last);
        let snap_file = dir
            .path()
            .join(format!("member/snap/{:016x}-{:016x}.snap", 1u64, last));
        wait_for("snapshot file", Duration::from_secs(5), || {
            snap_file.exists()
        })
        .await;
        if max_files == 2 {
            wait_for("purge to 2 segments", Duration::from_secs(5), || {
                wal_files(&wal_dir) == 2
            })
            .await;
        }
        propose_concurrently(&handle, "b", 30).await;
        let newest = receive_until(&handle, &mut rx, last + 30)
            .await
            .last()
            .unwrap()
            .index;
        handle.stop();

        // a restart from the dedicated dir replays what follows the snapshot
        let (handle, mut rx) = start_in(dir.path(), &wal_dir, last, max_files).unwrap();
        let replayed = receive_until(&handle, &mut rx, newest).await;
        assert_eq!(replayed.first().unwrap().index, last + 1);
        assert_contiguous(&replayed);
        handle.stop();
        if max_files == 0 {
            for name in &names_before {
                assert!(
                    wal_dir.join(name).exists(),
                    "--max-wals 0 keeps every segment: {name:?}"
                );
            }
        }

        // the WAL is not looked for anywhere else: another dir refuses
        let err = start_in(dir.path(), &dir.path().join("elsewhere"), last, max_files)
            .err()
            .expect("a snapshot without its WAL must refuse");
        assert!(
            matches!(&err, ConsensusError::Corrupt(reason) if reason.contains("holds no WAL")),
            "{err}"
        );
        assert!(!dir
            .path()
            .join("elsewhere")
            .join("0000000000000000-0000000000000000.wal")
            .exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_index_batches_concurrent_reads_and_sees_committed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut rx) = start(dir.path(), 0);
    wait_for("leader", Duration::from_secs(5), || {
        handle.status().is_leader
    })
    .await;
    propose_concurrently(&handle, "k", 20).await;
    let entries = receive_until(&handle, &mut rx, 21).await;
    let committed = entries.last().unwrap().index;
    // The only voter answers from its published commit index.
    assert!(handle
        .status()
        .local_read_index
        .is_some_and(|index| index >= committed));
    let reads: Vec<_> = (0..200)
        .map(|_| {
            let h = handle.clone();
            tokio::spawn(async move { h.read_index().await })
        })
        .collect();
    for r in reads {
        let index = r.await.unwrap().expect("read index");
        assert!(
            index >= committed,
            "read index {index} < committed {committed}"
        );
    }
    handle.stop();
    assert!(matches!(
        handle.read_index().await,
        Err(ConsensusError::Stopped)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_refuses_applied_index_beyond_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut rx) = start(dir.path(), 0);
    wait_for("leader", Duration::from_secs(5), || {
        handle.status().is_leader
    })
    .await;
    propose_concurrently(&handle, "x", 5).await;
    receive_until(&handle, &mut rx, 6).await;
    handle.stop();
    let err = start_with_options(
        config(dir.path(), 1000),
        Arc::new(NoopTransport),
        small_segments(),
    )
    .err()
    .expect("must refuse");
    assert!(matches!(err, ConsensusError::Corrupt(_)), "{err}");
    // a WAL belongs to one member
    let mut other = config(dir.path(), 0);
    other.id = 42;
    let err = start_with_options(other, Arc::new(NoopTransport), small_segments())
        .err()
        .expect("must refuse");
    assert!(matches!(err, ConsensusError::Config(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conf_change_is_committed_delivered_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut rx) = start(dir.path(), 0);
    wait_for("leader", Duration::from_secs(5), || {
        handle.status().is_leader
    })
    .await;
    let mut change = ConfChange::default();
    change.set_change_type(ConfChangeType::AddLearnerNode);
    change.node_id = 2;
    change.id = 77;
    change.context = b"member-2".to_vec().into();
    handle
        .propose_conf_change(change)
        .await
        .expect("conf change accepted");
    let entries = receive_until(&handle, &mut rx, 2).await;
    let cc = entries.iter().find(|e| e.index == 2).unwrap();
    assert_eq!(cc.get_entry_type(), EntryType::EntryConfChange);
    let decoded = ConfChange::parse_from_bytes(&cc.data).unwrap();
    assert_eq!(
        (decoded.id, decoded.context.as_ref()),
        (77, &b"member-2"[..])
    );
    // the leader tracks the learner's log
    let progress = handle.progress().await.unwrap().expect("leader");
    assert!(progress
        .iter()
        .any(|p| p.id == 2 && p.is_learner && p.matched == 0));
    // a learner does not change the quorum: writes still commit
    handle.propose(b"after".to_vec()).await.unwrap();
    let entries = receive_until(&handle, &mut rx, 3).await;
    assert_eq!(entries.last().unwrap().data.as_ref(), b"after");
    handle.snapshot(3);
    wait_for("snapshot", Duration::from_secs(5), || {
        dir.path()
            .join(format!("member/snap/{:016x}-{:016x}.snap", 1u64, 3u64))
            .exists()
    })
    .await;
    handle.stop();

    // restart from the snapshot (conf state holds the learner) and keep going
    let (handle, mut rx) = start(dir.path(), 3);
    wait_for("leader", Duration::from_secs(5), || {
        handle.status().is_leader
    })
    .await;
    handle.propose(b"again".to_vec()).await.unwrap();
    let entries = receive_until(&handle, &mut rx, 5).await;
    assert!(entries.iter().all(|e| e.index > 3));
    assert_eq!(entries.last().unwrap().data.as_ref(), b"again");
    handle.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_proposal_reports_only_a_refusal() {
    // A member of three voters alone never has a leader: refused at once.
    let lonely = tempfile::tempdir().unwrap();
    let mut cfg = config(lonely.path(), 0);
    cfg.voters = vec![ID, 2, 3];
    let (handle, _rx) =
        start_with_options(cfg, Arc::new(NoopTransport), StartOptions::default()).unwrap();
    let refusal = handle.propose_detached(b"nobody".to_vec()).await.unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), refusal.refused())
        .await
        .expect("a refusal is told");
    assert!(matches!(refused, ConsensusError::NoLeader), "{refused:?}");
    handle.stop();

    // An accepted proposal commits, and its refusal never resolves.
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut rx) = start(dir.path(), 0);
    wait_for("leader", Duration::from_secs(10), || {
        handle.status().is_leader
    })
    .await;
    let refusal = handle.propose_detached(b"accepted".to_vec()).await.unwrap();
    let mut found = false;
    while !found {
        let batch = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("committed in time")
            .expect("channel open");
        found = batch.entries.iter().any(|e| e.data.as_ref() == b"accepted");
        handle.report_applied(batch.entries.last().unwrap().index);
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), refusal.refused())
            .await
            .is_err(),
        "an accepted proposal is not refused"
    );
    handle.stop();
    assert!(matches!(
        handle.propose_detached(b"late".to_vec()).await,
        Err(ConsensusError::Stopped)
    ));
}

/// etcd's lg.Fatal on "failed to save Raft hard state and entries": a WAL
/// that cannot be written (here ENOSPC, segments of 256 KiB on a 1 MiB
/// volume) stops the raft loop and raises the member's fatal error, which
/// its owner turns into an exit; requests answer `Stopped`, never hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_that_cannot_be_written_raises_the_fatal_error_and_stops_the_loop() {
    let Some(volume) = testkit::tmpfs::Tmpfs::mount("1m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let options = StartOptions {
        wal: WalOptions {
            segment_bytes: 256 * 1024,
            ..Default::default()
        },
        ..Default::default()
    };
    let (handle, mut rx) =
        start_with_options(config(volume.path(), 0), Arc::new(NoopTransport), options).unwrap();
    let applier = {
        let handle = handle.clone();
        tokio::spawn(async move {
            while let Some(batch) = rx.recv().await {
                if let Some(last) = batch.entries.last() {
                    handle.report_applied(last.index);
                }
            }
        })
    };
    wait_for("leader", Duration::from_secs(5), || {
        handle.status().is_leader
    })
    .await;
    let fatal = handle.fatal();
    let mut refused = None;
    for _ in 0..1000 {
        if let Err(e) = handle.propose(vec![7u8; 32 * 1024]).await {
            refused = Some(e);
            break;
        }
    }
    assert!(
        matches!(refused, Some(ConsensusError::Stopped)),
        "{refused:?}"
    );
    let cause = tokio::time::timeout(Duration::from_secs(10), fatal.raised())
        .await
        .expect("the fatal error is raised");
    assert!(cause.contains("No space left on device"), "{cause}");
    assert!(matches!(
        handle.read_index().await,
        Err(ConsensusError::Stopped)
    ));
    handle.stop();
    applier.await.unwrap();
}
