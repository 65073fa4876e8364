//! Turns of the raft loop on a client thread (`consensus::allow_client_turns`):
//! while a member leads alone, a thread that allows it turns the loop for
//! its own proposals (one turn, one fdatasync for all it queued); otherwise
//! the raft thread does, as before.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use consensus::raft::eraftpb::{ConfChange, ConfChangeType};
use consensus::wal::WalOptions;
use consensus::{
    start_with_options, ConsensusError, NoopTransport, RaftConfig, RaftHandle, StartOptions,
};
use parking_lot::Mutex;

const ID: u64 = 0x8e9e05c52164694d;

/// A heartbeat far longer than any test: the raft thread never ticks, so
/// only a wake-up (a proposal it must take, a conf change) turns it there.
fn config(dir: &Path) -> RaftConfig {
    RaftConfig {
        id: ID,
        member_dir: dir.join("member"),
        wal_dir: dir.join("member").join("wal"),
        voters: vec![ID],
        heartbeat: Duration::from_secs(60),
        election_timeout: Duration::from_secs(600),
        applied: 0,
        cluster_id: 0xcdf818194e3a8c32,
        force_new_cluster: false,
    }
}

/// What the inline apply hook saw: per batch, the thread that applied it
/// and its entries' data (the leader's empty entry left out).
#[derive(Default)]
struct Applied {
    batches: Mutex<Vec<(String, Vec<Vec<u8>>)>>,
}

impl Applied {
    fn threads_of(&self, data: &[u8]) -> Vec<String> {
        self.batches
            .lock()
            .iter()
            .filter(|(_, entries)| entries.iter().any(|e| e == data))
            .map(|(thread, _)| thread.clone())
            .collect()
    }

    fn count(&self) -> usize {
        self.batches.lock().iter().map(|(_, e)| e.len()).sum()
    }
}

/// Applies every batch on the spot, where raft hands it out, and records
/// the thread.
fn record_applies(handle: &RaftHandle) -> Arc<Applied> {
    let applied = Arc::new(Applied::default());
    let (record, reporter) = (applied.clone(), handle.clone());
    handle.set_inline_apply(Box::new(move |batch| {
        let thread = std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string();
        if let Some(last) = batch.entries.last() {
            reporter.report_applied(last.index);
        }
        let entries = batch
            .entries
            .iter()
            .filter(|e| !e.data.is_empty())
            .map(|e| e.data.to_vec())
            .collect::<Vec<_>>();
        if !entries.is_empty() {
            record.batches.lock().push((thread, entries));
        }
        Ok(())
    }));
    applied
}

/// Runs `task` on a thread of its own named `name` (a current-thread
/// runtime, as a `grpc-client-N` thread), allowing client turns or not.
fn on_client_thread<F, T>(name: &str, allow: bool, task: impl FnOnce() -> F + Send + 'static) -> T
where
    F: Future<Output = T>,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            if allow {
                consensus::allow_client_turns();
            }
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(task())
        })
        .unwrap()
        .join()
        .unwrap()
}

/// A started member, idle: it leads, its first entry is committed and
/// handed out (to the channel, whose batches a thread acknowledges), and
/// its first turn is over.
fn start(dir: &Path, options: StartOptions) -> RaftHandle {
    let (handle, mut rx) =
        start_with_options(config(dir), Arc::new(NoopTransport), options).expect("start member");
    let acknowledger = handle.clone();
    std::thread::spawn(move || {
        while let Some(batch) = rx.blocking_recv() {
            if let Some(last) = batch.entries.last() {
                acknowledger.report_applied(last.index);
            }
            acknowledger.batch_applied();
        }
    });
    wait_for("the first entry committed", || {
        handle.status().commit_index >= 1
    });
    // a turn in progress holds the loop: this waits for it
    drop(handle.hold_loop_for_test());
    handle
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `n` proposals from `n` tasks of one client thread, each waiting until
/// its entry is applied.
fn propose_from_client_thread(
    handle: &RaftHandle,
    applied: &Arc<Applied>,
    thread: &str,
    allow: bool,
    prefix: &'static str,
    n: usize,
) {
    let (handle, applied) = (handle.clone(), applied.clone());
    on_client_thread(thread, allow, move || async move {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let (handle, applied) = (handle.clone(), applied.clone());
                tokio::spawn(async move {
                    let data = format!("{prefix}-{i}").into_bytes();
                    let _refusal = handle.propose_detached(data.clone()).await.unwrap();
                    let until = Instant::now() + Duration::from_secs(20);
                    while applied.threads_of(&data).is_empty() {
                        assert!(Instant::now() < until, "{prefix}-{i} applied in time");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

#[test]
fn a_lone_leaders_proposals_are_turned_on_the_proposing_thread_in_one_fdatasync() {
    let dir = tempfile::tempdir().unwrap();
    let handle = start(dir.path(), StartOptions::default());
    let applied = record_applies(&handle);

    let syncs = handle.wal_sync_count();
    propose_from_client_thread(&handle, &applied, "client-0", true, "put", 50);
    assert_eq!(applied.count(), 50);
    for i in 0..50 {
        assert_eq!(
            applied.threads_of(format!("put-{i}").as_bytes()),
            vec!["client-0".to_string()],
            "put-{i} applied on the proposing thread"
        );
    }
    // the 50 tasks queued theirs before the thread's turn: one Ready, one
    // fdatasync (a turn of the raft thread cannot come in: it never ticks)
    assert_eq!(handle.wal_sync_count() - syncs, 1);

    // A thread that does not allow it wakes the raft thread, as before.
    propose_from_client_thread(&handle, &applied, "other", false, "plain", 3);
    for i in 0..3 {
        let threads = applied.threads_of(format!("plain-{i}").as_bytes());
        assert_eq!(threads.len(), 1);
        assert!(threads[0].starts_with("raft-"), "{threads:?}");
    }
    handle.stop();
}

#[test]
fn with_a_learner_the_raft_thread_turns_the_loop() {
    let dir = tempfile::tempdir().unwrap();
    let handle = start(dir.path(), StartOptions::default());
    let applied = record_applies(&handle);
    propose_from_client_thread(&handle, &applied, "client-0", true, "alone", 1);
    assert_eq!(applied.threads_of(b"alone-0"), vec!["client-0".to_string()]);

    // A learner's log must be sent to it: not a member alone any more.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let change = ConfChange {
        change_type: ConfChangeType::AddLearnerNode,
        node_id: 2,
        ..Default::default()
    };
    runtime
        .block_on(handle.propose_conf_change(change))
        .expect("conf change accepted");
    wait_for("the conf change applied", || applied.count() == 2);
    // and the turn that applied it over
    drop(handle.hold_loop_for_test());
    propose_from_client_thread(&handle, &applied, "client-0", true, "learner", 2);
    for i in 0..2 {
        let threads = applied.threads_of(format!("learner-{i}").as_bytes());
        assert_eq!(threads.len(), 1);
        assert!(threads[0].starts_with("raft-"), "{threads:?}");
    }
    handle.stop();
}

/// A client thread that finds the loop busy (its lock held) leaves the
/// turn to the raft thread, which takes it once the lock is free.
#[test]
fn a_busy_loop_leaves_the_turn_to_the_raft_thread() {
    let dir = tempfile::tempdir().unwrap();
    let handle = start(dir.path(), StartOptions::default());
    let applied = record_applies(&handle);
    let release = handle.hold_loop_for_test();
    let proposer = {
        let (handle, applied) = (handle.clone(), applied.clone());
        std::thread::spawn(move || {
            propose_from_client_thread(&handle, &applied, "client-0", true, "busy", 5)
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(applied.count(), 0, "nothing turns while the loop is held");
    drop(release);
    proposer.join().unwrap();
    for i in 0..5 {
        let threads = applied.threads_of(format!("busy-{i}").as_bytes());
        assert_eq!(threads.len(), 1);
        assert!(threads[0].starts_with("raft-"), "{threads:?}");
    }
    handle.stop();
}

/// A client thread's turn that cannot write the WAL (ENOSPC, segments of
/// 256 KiB on a 1 MiB volume) stops the loop as the raft thread's would:
/// the member's fatal error is raised and later proposals answer `Stopped`.
#[test]
fn a_wal_failure_in_a_client_turn_raises_the_fatal_error() {
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
    let handle = start(volume.path(), options);
    let applied = record_applies(&handle);
    let fatal = handle.fatal();
    let outcome = {
        let (handle, applied) = (handle.clone(), applied.clone());
        on_client_thread("client-0", true, move || async move {
            for i in 0..1000u32 {
                let mut data = vec![7u8; 32 * 1024];
                data[..4].copy_from_slice(&i.to_be_bytes());
                match handle.propose_detached(data.clone()).await {
                    Err(e) => return Some(e),
                    Ok(refusal) => {
                        tokio::select! {
                            e = refusal.refused() => return Some(e),
                            _ = async {
                                while applied.threads_of(&data).is_empty() {
                                    tokio::time::sleep(Duration::from_millis(1)).await;
                                }
                            } => {}
                            _ = tokio::time::sleep(Duration::from_secs(2)) => {
                                // never applied: the loop stopped under it
                            }
                        }
                    }
                }
            }
            None
        })
    };
    let cause = fatal.cause().expect("the fatal error is raised");
    assert!(cause.contains("No space left on device"), "{cause}");
    assert!(
        matches!(outcome, Some(ConsensusError::Stopped)),
        "{outcome:?}"
    );
    handle.stop();
}
