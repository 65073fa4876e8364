//! The raft thread: the driver around the I/O-free [`core::Core`]. The
//! [`Engine`] (the core, the WAL, the `.snap` files, the transport and the
//! queues to and from the member) carries out what each Ready asks: send,
//! persist, sync, hand to apply. It sits behind a lock: the raft thread
//! takes it for each turn (input, a tick, a wake-up), and a client thread
//! may take it for a turn of its own (`crate::turns`) when the member leads
//! alone and nobody holds it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use raft::eraftpb::{Entry, Snapshot};
use raft::{Config, ReadOnlyOption, INVALID_ID};
use tokio::sync::mpsc;

use crate::snap::Snapshotter;
use crate::wal::{Metadata, SnapshotMarker, Wal};
use crate::{
    CommittedBatch, ConsensusError, Input, RaftConfig, Shared, StartOptions, Transport,
    INPUT_QUEUE_CAPACITY, MAX_INFLIGHT_MSGS, MAX_SIZE_PER_MSG, SNAPSHOT_CATCH_UP_ENTRIES,
};

mod conf;
mod core;
mod force_new_cluster;
mod log_storage;
mod reads;

use self::core::{Core, Restore};

/// The raft thread's side: its runtime, its clock, and the engine it
/// shares with client threads' turns.
pub(crate) struct Node {
    engine: Arc<parking_lot::Mutex<Engine>>,
    shared: Arc<Shared>,
    /// Built on the raft thread in `run`: a runtime must not be dropped in
    /// the caller's async context if starting the thread fails.
    runtime: Option<tokio::runtime::Runtime>,
    heartbeat: Duration,
    next_tick: Instant,
}

/// Everything a turn touches. Whoever holds the lock may turn it.
pub(crate) struct Engine {
    core: Core,
    wal: Wal,
    snapper: Snapshotter,
    transport: Arc<dyn Transport>,
    input: mpsc::Receiver<Input>,
    committed: mpsc::Sender<CommittedBatch>,
    shared: Arc<Shared>,
    /// The server's metrics hook (WAL writes, `.snap` saves, late heartbeats).
    observer: Option<crate::Observer>,
    heartbeats: crate::observer::HeartbeatWatch,
    heartbeat: Duration,
    /// What stopped a client thread's turn (a WAL write failing, a panic):
    /// the raft thread takes it at its next wake-up and stops the loop.
    failed: Option<ConsensusError>,
}

/// Where a turn runs: the raft thread may block on its own runtime (to let
/// its peer links write, or to wait for room in the committed queue); a
/// client thread, inside its own runtime, may not.
#[derive(Clone, Copy)]
enum Place<'a> {
    RaftThread(&'a tokio::runtime::Runtime),
    ClientThread,
}

enum Wake {
    Notified,
    Tick,
}

impl Node {
    /// Builds the node from disk (or bootstraps a new member).
    pub(crate) fn load(
        cfg: &RaftConfig,
        options: &StartOptions,
        transport: Arc<dyn Transport>,
        input: mpsc::Receiver<Input>,
        committed: mpsc::Sender<CommittedBatch>,
        shared: Arc<Shared>,
    ) -> Result<Node, ConsensusError> {
        let config = raft_config(cfg, !options.disable_pre_vote)?;
        crate::fileutil::create_private_dir_all(&cfg.member_dir)?;
        let mut snapper = Snapshotter::new(&cfg.member_dir.join("snap"))?;
        if let Some(keep) = options.max_snapshots {
            snapper.set_retention(keep);
        }
        let wal_dir = &cfg.wal_dir;
        let snapshot = snapper.load_newest()?;
        let (mut wal, contents) = open_wal(cfg, options, wal_dir, snapshot.as_ref())?;
        if let Some(observer) = &options.wal_sync_observer {
            wal.set_sync_observer(observer.clone());
        }
        if let Some(observer) = &options.observer {
            wal.set_write_observer(observer.clone());
        }
        let metadata = wal.metadata().clone();
        if metadata.node_id != cfg.id {
            return Err(ConsensusError::Config(format!(
                "WAL in {} belongs to member {:x}, not {:x}",
                wal_dir.display(),
                metadata.node_id,
                cfg.id
            )));
        }
        let _ = shared.initial_voters.set(metadata.initial_voters.clone());
        // etcd's --force-new-cluster acts only on a member with a WAL.
        let existed = contents.is_some();
        let (mut hard_state, mut entries) = contents
            .map(|c| (c.hard_state, c.entries))
            .unwrap_or_default();
        if cfg.force_new_cluster && existed {
            let forced = force_new_cluster::rewrite(
                cfg,
                snapshot.as_ref(),
                &metadata.initial_voters,
                &mut hard_state,
                &mut entries,
            )?;
            wal.append(&forced, Some(&hard_state));
            wal.sync()?;
            entries.extend(forced);
        }
        let mut core = Core::restore(
            &config,
            Restore {
                snapshot,
                initial_voters: metadata.initial_voters,
                hard_state,
                entries,
                applied: cfg.applied,
                catch_up_entries: match options.snapshot_catch_up_entries {
                    0 => SNAPSHOT_CATCH_UP_ENTRIES,
                    n => n,
                },
                // etcd: request timeout 5s + 2 × election timeout
                read_timeout: Duration::from_secs(5) + cfg.election_timeout * 2,
            },
        )?;
        core.spill_to(wal_dir.clone());
        // etcd's purge loops start with the member (their first round at
        // once), each only with a limit: raft took the snapshot, so what
        // precedes it may go.
        snapper.log_purge_start();
        if options.wal.max_files > 0 {
            tracing::info!(dir = %wal_dir.display(), suffix = "wal", max = options.wal.max_files,
                "started to purge file");
        }
        snapper.purge(cfg.applied);
        wal.purge()?;
        let engine = Engine {
            core,
            wal,
            snapper,
            transport,
            input,
            committed,
            shared: shared.clone(),
            observer: options.observer.clone(),
            heartbeats: crate::observer::HeartbeatWatch::new(cfg.heartbeat),
            heartbeat: cfg.heartbeat,
            failed: None,
        };
        engine.publish_status();
        Ok(Node {
            engine: Arc::new(parking_lot::Mutex::new(engine)),
            shared,
            runtime: None,
            heartbeat: cfg.heartbeat,
            next_tick: Instant::now() + cfg.heartbeat,
        })
    }

    /// The engine, for the handle's client-thread turns: it goes with the
    /// raft thread (and with it the committed queue's sender, which ends
    /// the apply loop).
    pub(crate) fn engine(&self) -> std::sync::Weak<parking_lot::Mutex<Engine>> {
        Arc::downgrade(&self.engine)
    }

    pub(crate) fn run(mut self) {
        match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .enable_io()
            .build()
        {
            Ok(runtime) => {
                let _ = self.shared.io.set(runtime.handle().clone());
                self.engine.lock().transport.start(runtime.handle());
                self.runtime = Some(runtime);
            }
            Err(e) => {
                tracing::error!(error = %e, "raft: cannot build the raft thread's timer runtime");
                self.shutdown();
                return;
            }
        }
        // Persist what loading produced (a campaign's vote) before waiting.
        if let Err(e) = self.turn() {
            self.engine.lock().loop_exit(&e);
            self.shutdown();
            return;
        }
        loop {
            self.wait();
            if let Err(e) = self.turn() {
                self.engine.lock().loop_exit(&e);
                break;
            }
            if self.shared.stopping.load(Ordering::Acquire) {
                break;
            }
        }
        self.shutdown();
    }

    /// Until a wake-up (input queued, a snapshot asked for, stop) or the
    /// next tick.
    fn wait(&mut self) -> Wake {
        let shared = &self.shared;
        let deadline = tokio::time::Instant::from_std(self.next_tick);
        self.runtime
            .as_ref()
            .expect("runtime built in run")
            .block_on(async {
                tokio::select! {
                    biased;
                    _ = shared.wake.notified() => Wake::Notified,
                    _ = tokio::time::sleep_until(deadline) => Wake::Tick,
                }
            })
    }

    /// One turn of the loop after a wake-up.
    fn turn(&mut self) -> Result<(), ConsensusError> {
        let runtime = self.runtime.as_ref().expect("runtime built in run");
        let mut engine = self.engine.lock();
        if let Some(e) = engine.failed.take() {
            return Err(e);
        }
        let now = Instant::now();
        let tick = now >= self.next_tick;
        if tick {
            // one tick per wake-up: a stalled loop must not fire a burst of
            // election timeouts when it resumes
            self.next_tick = now + self.heartbeat;
        }
        let closed = engine.turn(Place::RaftThread(runtime), tick)?;
        if closed {
            // every handle is gone
            self.shared.stopping.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn shutdown(self) {
        let mut engine = self.engine.lock();
        engine.shutdown();
    }
}

impl Engine {
    /// One turn: the queued input, a tick if due, then every Ready. Returns
    /// whether the input queue is closed (every handle dropped).
    fn turn(&mut self, place: Place<'_>, tick: bool) -> Result<bool, ConsensusError> {
        // raft learns what was applied before it judges a proposal: a conf
        // change right after the last one applied must not be taken for a
        // second pending one
        self.core
            .applied_to(self.shared.applied.load(Ordering::Acquire));
        let mut closed = false;
        for _ in 0..INPUT_QUEUE_CAPACITY {
            match self.input.try_recv() {
                Ok(input) => self.core.input(input),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if tick {
            self.core.tick();
        }
        self.core
            .applied_to(self.shared.applied.load(Ordering::Acquire));
        self.core.spill_applied();
        if let Place::RaftThread(_) = place {
            // a snapshot file is the raft thread's to write
            self.maybe_snapshot()?;
        }
        self.core.reads(Instant::now());
        self.handle_readies(place)?;
        self.publish_status();
        Ok(closed)
    }

    /// A client thread's turn (`crate::turns`): what its proposals need,
    /// unless the raft thread should do it: stopping, stopped on an error,
    /// no longer leading alone, or the apply side busy (batches queued: the
    /// turn's batch would queue too, and only the raft thread may wait for
    /// room in a full queue). Returns whether it turned.
    pub(crate) fn client_turn(&mut self) -> bool {
        if self.failed.is_some()
            || self.shared.stopping.load(Ordering::Acquire)
            || !self.shared.leads_alone.load(Ordering::Acquire)
            || self.shared.queued_batches.load(Ordering::Acquire) > 0
        {
            return false;
        }
        let turned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.turn(Place::ClientThread, false)
        }));
        let failure = match turned {
            Ok(Ok(_)) => return true,
            Ok(Err(e)) => e,
            Err(panic) => ConsensusError::Corrupt(format!(
                "a raft turn panicked: {}",
                crate::fatal::panic_message(panic.as_ref())
            )),
        };
        // The raft thread stops the loop, as if the turn had been its own.
        self.failed = Some(failure);
        self.shared.wake.notify_one();
        true
    }

    fn handle_readies(&mut self, place: Place<'_>) -> Result<(), ConsensusError> {
        while let Some(mut persist) = self.core.ready() {
            self.send_now(place, std::mem::take(&mut persist.messages));
            if let Some(snapshot) = persist.snapshot.take() {
                self.save_snapshot(&snapshot)?;
                self.core.install_snapshot(snapshot.clone())?;
                self.send_to_apply(
                    place,
                    CommittedBatch {
                        snapshot: Some(snapshot),
                        entries: Vec::new(),
                    },
                )?;
            }
            // The save failpoints fire only on a Ready that writes something
            // (a heartbeat or a read round alone does not).
            let saves = !persist.entries().is_empty() || persist.hard_state().is_some();
            if saves {
                crate::fail_point!("raftBeforeSave");
            }
            self.wal.append(persist.entries(), persist.hard_state());
            if persist.must_sync() {
                self.sync_wal()?;
            } else {
                self.wal.flush()?;
            }
            // Durable now, and nothing that depends on it has gone out yet:
            // no append response (advance), no commit, no apply, no answer.
            if saves {
                crate::fail_point!("raftAfterSave");
            }
            let advanced = self.core.advance(persist)?;
            self.send_now(place, advanced.persisted_messages);
            if let Some(hs) = &advanced.commit {
                self.wal.append(&[], Some(hs));
            }
            self.send_now(place, advanced.messages);
            // Publish the commit index before the apply side can apply up
            // to it: applied must never be seen ahead of committed.
            self.publish_status();
            self.deliver(place, advanced.committed)?;
        }
        Ok(())
    }

    fn sync_wal(&mut self) -> Result<(), ConsensusError> {
        self.wal.sync()?;
        self.shared
            .wal_syncs
            .store(self.wal.sync_count(), Ordering::Release);
        Ok(())
    }

    /// Sends, and on the raft thread lets the peer links on its runtime
    /// write the messages now rather than at the next wait: the leader's
    /// appends must be on the wire while it fdatasyncs. (A client thread's
    /// send wakes the raft thread's runtime, whose links write them.)
    fn send_now(&mut self, place: Place<'_>, msgs: Vec<raft::eraftpb::Message>) {
        if msgs.is_empty() {
            return;
        }
        self.watch_heartbeats(&msgs);
        self.transport.send(msgs);
        if let Place::RaftThread(runtime) = place {
            runtime.block_on(tokio::task::yield_now());
        }
    }

    /// etcd's heartbeat send check: a heartbeat going out more than two
    /// intervals after the previous one to the same peer means this leader
    /// was too busy (a slow disk, most likely) to keep its followers calm.
    fn watch_heartbeats(&mut self, msgs: &[raft::eraftpb::Message]) {
        let Some(observer) = &self.observer else {
            return;
        };
        let now = Instant::now();
        for msg in msgs {
            if msg.get_msg_type() != raft::eraftpb::MessageType::MsgHeartbeat {
                continue;
            }
            if let Some(exceeded) = self.heartbeats.sent(msg.to, msg.term, now) {
                tracing::warn!(
                    to = %format!("{:x}", msg.to),
                    "heartbeat-interval" = ?self.heartbeat,
                    "expected-duration" = ?(2 * self.heartbeat),
                    "exceeded-duration" = ?exceeded,
                    "leader failed to send out heartbeat on time; took too long, leader is overloaded likely from slow disk"
                );
                observer.0.heartbeat_late(msg.to, exceeded);
            }
        }
    }

    /// A raft snapshot to disk (one from the leader, or our own): its file,
    /// then its WAL marker, synced. A crash between steps leaves more WAL
    /// than needed, never less.
    fn save_snapshot(&mut self, snapshot: &Snapshot) -> Result<std::path::PathBuf, ConsensusError> {
        let meta = snapshot.get_metadata();
        crate::fail_point!("raftBeforeSaveSnap");
        let applied = self.shared.applied.load(Ordering::Acquire);
        let path = self
            .snapper
            .save(snapshot, applied, self.observer.as_ref())?;
        self.wal.save_snapshot(SnapshotMarker {
            term: meta.term,
            index: meta.index,
        });
        self.sync_wal()?;
        crate::fail_point!("raftAfterSaveSnap");
        Ok(path)
    }

    /// Hands committed entries to the apply side.
    fn deliver(&mut self, place: Place<'_>, entries: Vec<Entry>) -> Result<(), ConsensusError> {
        if entries.is_empty() {
            return Ok(());
        }
        self.send_to_apply(
            place,
            CommittedBatch {
                snapshot: None,
                entries,
            },
        )
    }

    fn send_to_apply(
        &mut self,
        place: Place<'_>,
        batch: CommittedBatch,
    ) -> Result<(), ConsensusError> {
        // Nothing queued or being applied: the hook may apply it right here.
        let batch = match self.shared.inline_apply.get() {
            Some(apply) if self.shared.queued_batches.load(Ordering::Acquire) == 0 => {
                match apply(batch) {
                    Ok(()) => return Ok(()),
                    Err(batch) => batch,
                }
            }
            _ => batch,
        };
        self.shared.queued_batches.fetch_add(1, Ordering::AcqRel);
        let tx = &self.committed;
        let shared = &self.shared;
        match place {
            Place::RaftThread(runtime) => runtime.block_on(async {
                tokio::select! {
                    sent = tx.send(batch) => sent.map_err(|_| ConsensusError::Stopped),
                    _ = wait_for_stop(shared) => Err(ConsensusError::Stopped),
                }
            }),
            // A client thread cannot wait on a runtime. It turns only while
            // nothing is queued, and one turn queues a few batches at most:
            // should the queue still be full, it waits for room as the raft
            // thread would, a millisecond at a time.
            Place::ClientThread => {
                let mut batch = batch;
                loop {
                    match tx.try_send(batch) {
                        Ok(()) => return Ok(()),
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            return Err(ConsensusError::Stopped)
                        }
                        Err(mpsc::error::TrySendError::Full(back)) => {
                            if shared.stopping.load(Ordering::Acquire) {
                                return Err(ConsensusError::Stopped);
                            }
                            batch = back;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                }
            }
        }
    }

    /// Writes a snapshot at the durable index the apply side gave us, then
    /// compacts the in-memory log and releases WAL segments below it.
    fn maybe_snapshot(&mut self) -> Result<(), ConsensusError> {
        let requested = self.shared.snapshot_request.load(Ordering::Acquire);
        let Some(snapshot) = self.core.snapshot_due(requested) else {
            return Ok(());
        };
        let (index, term) = (snapshot.get_metadata().index, snapshot.get_metadata().term);
        // Order matters: snapshot file and WAL marker, then release.
        let path = self.save_snapshot(&snapshot)?;
        self.core.snapshot_saved(index)?;
        self.wal.release_to(index)?;
        // etcd's line, with the term and file besides
        tracing::info!("snapshot-index" = index, term, file = %path.display(), "saved snapshot");
        Ok(())
    }

    fn publish_status(&self) {
        self.shared
            .leads_alone
            .store(self.core.leads_alone(), Ordering::Release);
        let status = self.core.status();
        let role = crate::Role {
            is_leader: status.is_leader,
            term: status.term,
        };
        *self.shared.status.lock() = status;
        self.shared.role.send_if_modified(|current| {
            let changed = *current != role;
            *current = role;
            changed
        });
    }

    fn loop_exit(&self, e: &ConsensusError) {
        match e {
            // stop() interrupted a hand-off to the apply side: not a failure
            ConsensusError::Stopped => {}
            // etcd's lg.Fatal ("failed to save Raft hard state and
            // entries", ...): the loop stops, handles answer `Stopped`, and
            // the process owner stops the member and exits non-zero.
            _ => self.shared.fatal.raise(format!("raft: {e}")),
        }
    }

    fn shutdown(&mut self) {
        if let Err(e) = self.wal.sync() {
            tracing::error!(error = %e, "raft: final WAL sync failed");
        }
        self.shared
            .wal_syncs
            .store(self.wal.sync_count(), Ordering::Release);
        self.shared.stopping.store(true, Ordering::Release);
        self.input.close();
        while let Ok(input) = self.input.try_recv() {
            match input {
                Input::Propose { reply, .. } => reply.send(Err(ConsensusError::Stopped)),
                Input::ProposeConfChange { reply, .. } => {
                    let _ = reply.send(Err(ConsensusError::Stopped));
                }
                Input::ReadIndex { reply } => {
                    let _ = reply.send(Err(ConsensusError::Stopped));
                }
                Input::Progress { reply } => {
                    let _ = reply.send(None);
                }
                Input::Step(_)
                | Input::ReportSnapshot { .. }
                | Input::TransferLeader(_)
                | Input::AdvanceTicks(_) => {}
            }
        }
        self.core.stop();
        tracing::info!(id = %format!("{:x}", self.core.status().id), "raft: stopped");
    }
}

async fn wait_for_stop(shared: &Shared) {
    loop {
        let notified = shared.stop_wake.notified();
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }
}

/// raft's configuration from the member's: one tick per heartbeat, etcd's
/// flow control, CheckQuorum, PreVote (unless `--pre-vote=false`) and
/// ReadIndex confirmed by a quorum.
fn raft_config(cfg: &RaftConfig, pre_vote: bool) -> Result<Config, ConsensusError> {
    if cfg.id == INVALID_ID {
        return Err(ConsensusError::Config("member id must not be 0".into()));
    }
    if cfg.heartbeat.is_zero() || cfg.election_timeout < cfg.heartbeat * 2 {
        return Err(ConsensusError::Config(format!(
            "election timeout {:?} must be at least twice the heartbeat {:?}",
            cfg.election_timeout, cfg.heartbeat
        )));
    }
    let election_tick =
        (cfg.election_timeout.as_millis() / cfg.heartbeat.as_millis().max(1)).max(2) as usize;
    Ok(Config {
        id: cfg.id,
        election_tick,
        heartbeat_tick: 1,
        applied: cfg.applied,
        max_size_per_msg: MAX_SIZE_PER_MSG,
        max_inflight_msgs: MAX_INFLIGHT_MSGS,
        check_quorum: true,
        pre_vote,
        read_only_option: ReadOnlyOption::Safe,
        ..Default::default()
    })
}

/// The member's WAL: opened at the snapshot and read back, or created for
/// a new member. Refused, before anything is created, when a snapshot or
/// a backend that applied entries exists without it: their log is
/// elsewhere (another `--wal-dir`) or lost, and a new log under them would
/// have its first entries skipped as applied already.
fn open_wal(
    cfg: &RaftConfig,
    options: &StartOptions,
    wal_dir: &std::path::Path,
    snapshot: Option<&Snapshot>,
) -> Result<(Wal, Option<crate::wal::WalContents>), ConsensusError> {
    if Wal::exists(wal_dir) {
        let index = snapshot.map_or(0, |s| s.get_metadata().index);
        let (mut wal, contents) = Wal::open_at(wal_dir, index, options.wal.clone())?;
        if let Some(s) = snapshot.filter(|_| index > wal.last_index()) {
            // A crash between a leader's snapshot file and its WAL marker:
            // the file is durable, the marker is written now, so that the
            // entries raft appends after the snapshot do not follow a gap
            // the WAL cannot account for (a restart would refuse it).
            tracing::warn!(
                "snapshot-index" = index,
                "wal-last-index" = wal.last_index(),
                "the newest snapshot file has no WAL marker; recording it"
            );
            wal.save_snapshot(SnapshotMarker {
                term: s.get_metadata().term,
                index,
            });
            wal.sync()?;
        }
        return Ok((wal, Some(contents)));
    }
    if let Some(s) = snapshot {
        return Err(ConsensusError::Corrupt(format!(
            "snapshot at index {} exists but {} holds no WAL (was the member started with another --wal-dir?)",
            s.get_metadata().index,
            wal_dir.display()
        )));
    }
    if cfg.applied > 0 {
        return Err(ConsensusError::Corrupt(format!(
            "the backend holds entries up to index {} but {} holds no WAL (was the member started with another --wal-dir?)",
            cfg.applied,
            wal_dir.display()
        )));
    }
    let metadata = Metadata {
        node_id: cfg.id,
        cluster_id: cfg.cluster_id,
        initial_voters: cfg.voters.clone(),
    };
    Ok((Wal::create(wal_dir, metadata, options.wal.clone())?, None))
}

#[cfg(test)]
mod raft_config_tests {
    use super::*;

    #[test]
    fn pre_vote_is_on_unless_the_member_turns_it_off() {
        let cfg = RaftConfig {
            id: 1,
            member_dir: Default::default(),
            wal_dir: Default::default(),
            voters: vec![1],
            heartbeat: std::time::Duration::from_millis(100),
            election_timeout: std::time::Duration::from_millis(1000),
            applied: 0,
            cluster_id: 1,
            force_new_cluster: false,
        };
        let on = raft_config(&cfg, true).unwrap();
        assert!(on.pre_vote && on.check_quorum);
        assert!(!raft_config(&cfg, false).unwrap().pre_vote);
    }
}
