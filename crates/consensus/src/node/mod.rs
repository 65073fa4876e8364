//! The raft thread: owns the RawNode, the WAL and the snapshotter.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, ConfState, Entry, EntryType, Snapshot};
use raft::storage::MemStorage;
use raft::{Config, RawNode, ReadOnlyOption, StateRole, Storage, INVALID_ID};
use tokio::sync::mpsc;

use crate::snap::Snapshotter;
use crate::wal::{Metadata, SnapshotMarker, Wal};
use crate::{
    CommittedBatch, ConsensusError, Input, RaftConfig, RaftStatus, Shared, StartOptions, Transport,
    INPUT_QUEUE_CAPACITY, MAX_INFLIGHT_MSGS, MAX_SIZE_PER_MSG, SNAPSHOT_CATCH_UP_ENTRIES,
};

mod conf;
mod reads;

use conf::ConfHistory;
use reads::ReadRounds;

pub(crate) struct Node {
    id: u64,
    raw: RawNode<MemStorage>,
    wal: Wal,
    snapper: Snapshotter,
    transport: Arc<dyn Transport>,
    input: mpsc::Receiver<Input>,
    committed: mpsc::Sender<CommittedBatch>,
    shared: Arc<Shared>,
    /// Built on the raft thread in `run`: a runtime must not be dropped in
    /// the caller's async context if starting the thread fails.
    runtime: Option<tokio::runtime::Runtime>,
    heartbeat: Duration,
    next_tick: Instant,
    reads: ReadRounds,
    last_leader: u64,
    leader_changes: u64,
    snapshot_index: u64,
    /// Entries kept in memory below a snapshot for slow followers.
    catch_up_entries: u64,
    conf_history: ConfHistory,
}

enum Wake {
    Input(Option<Input>),
    Notified,
    Tick,
}

fn corrupt(msg: String) -> ConsensusError {
    ConsensusError::Corrupt(msg)
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
        if cfg.id == INVALID_ID {
            return Err(ConsensusError::Config("member id must not be 0".into()));
        }
        if cfg.heartbeat.is_zero() || cfg.election_timeout < cfg.heartbeat * 2 {
            return Err(ConsensusError::Config(format!(
                "election timeout {:?} must be at least twice the heartbeat {:?}",
                cfg.election_timeout, cfg.heartbeat
            )));
        }
        std::fs::create_dir_all(&cfg.member_dir)?;
        let snapper = Snapshotter::new(&cfg.member_dir.join("snap"))?;
        let wal_dir = cfg.member_dir.join("wal");
        let snapshot = snapper.load_newest()?;
        let (wal, contents) = if Wal::exists(&wal_dir) {
            let (wal, contents) = Wal::open(&wal_dir, options.wal.clone())?;
            (wal, Some(contents))
        } else {
            if let Some(s) = &snapshot {
                return Err(corrupt(format!(
                    "snapshot at index {} exists but {} holds no WAL",
                    s.get_metadata().index,
                    wal_dir.display()
                )));
            }
            let metadata = Metadata {
                node_id: cfg.id,
                cluster_id: cfg.cluster_id,
                initial_voters: cfg.voters.clone(),
            };
            (Wal::create(&wal_dir, metadata, options.wal.clone())?, None)
        };
        let mut wal = wal;
        if let Some(observer) = &options.wal_sync_observer {
            wal.set_sync_observer(observer.clone());
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

        let storage = MemStorage::new();
        let (snap_index, base_conf) = match &snapshot {
            Some(s) => {
                storage.wl().apply_snapshot(s.clone())?;
                (
                    s.get_metadata().index,
                    s.get_metadata().get_conf_state().clone(),
                )
            }
            None => {
                let cs = ConfState {
                    voters: metadata.initial_voters.clone(),
                    ..Default::default()
                };
                storage.wl().set_conf_state(cs.clone());
                (0, cs)
            }
        };
        let (mut hard_state, entries) = match contents {
            Some(c) => {
                let entries: Vec<Entry> = c
                    .entries
                    .into_iter()
                    .filter(|e| e.index > snap_index)
                    .collect();
                (c.hard_state, entries)
            }
            None => Default::default(),
        };
        if let Some(first) = entries.first() {
            if first.index != snap_index + 1 {
                return Err(corrupt(format!(
                    "WAL entries resume at index {} but the newest snapshot is at {}",
                    first.index, snap_index
                )));
            }
        }
        let last_index = entries.last().map_or(snap_index, |e| e.index);
        storage.wl().append(&entries)?;

        let applied = cfg.applied;
        if applied < snap_index {
            return Err(corrupt(format!(
                "backend applied index {applied} is below the snapshot index {snap_index}"
            )));
        }
        if applied > last_index {
            return Err(corrupt(format!(
                "backend applied index {applied} is beyond the WAL's last index {last_index}"
            )));
        }
        // The commit index in the WAL lags (it is written lazily); what was
        // applied was committed.
        hard_state.commit = hard_state.commit.max(snap_index).max(applied);
        if hard_state.commit > last_index {
            return Err(corrupt(format!(
                "WAL commit index {} is beyond its last index {last_index}",
                hard_state.commit
            )));
        }
        storage.wl().set_hardstate(hard_state.clone());

        let election_tick =
            (cfg.election_timeout.as_millis() / cfg.heartbeat.as_millis().max(1)).max(2) as usize;
        let config = Config {
            id: cfg.id,
            election_tick,
            heartbeat_tick: 1,
            applied,
            max_size_per_msg: MAX_SIZE_PER_MSG,
            max_inflight_msgs: MAX_INFLIGHT_MSGS,
            check_quorum: true,
            pre_vote: true,
            read_only_option: ReadOnlyOption::Safe,
            ..Default::default()
        };
        let mut raw = RawNode::new(&config, storage, &crate::logger::raft_logger())?;

        // Conf changes at or below `applied` will not be handed out again;
        // replay them into raft now. Those above come back through the loop.
        let mut conf_history = ConfHistory::new(snap_index, base_conf);
        for e in entries.iter().filter(|e| e.index <= applied) {
            if let Some(cs) = apply_conf_change_entry(&mut raw, e)? {
                conf_history.push(e.index, cs);
            }
        }

        let voters = raw.raft.prs().conf().voters().ids();
        let single_voter = voters.len() == 1 && voters.contains(cfg.id);
        tracing::info!(
            id = %format!("{:x}", cfg.id),
            snapshot_index = snap_index,
            applied,
            commit = hard_state.commit,
            last_index,
            term = hard_state.term,
            "raft: starting member"
        );
        if single_voter {
            // A single voter needs nobody's vote: skip the election timeout,
            // as etcd fast-forwards ticks for a one-member cluster.
            raw.campaign()?;
        }

        let node = Node {
            id: cfg.id,
            raw,
            wal,
            snapper,
            transport,
            input,
            committed,
            shared,
            runtime: None,
            heartbeat: cfg.heartbeat,
            next_tick: Instant::now() + cfg.heartbeat,
            // etcd: request timeout 5s + 2 × election timeout
            reads: ReadRounds::new(Duration::from_secs(5) + cfg.election_timeout * 2),
            last_leader: INVALID_ID,
            leader_changes: 0,
            snapshot_index: snap_index,
            catch_up_entries: if options.snapshot_catch_up_entries == 0 {
                SNAPSHOT_CATCH_UP_ENTRIES
            } else {
                options.snapshot_catch_up_entries
            },
            conf_history,
        };
        let mut node = node;
        let leader = node.raw.raft.leader_id;
        node.on_leader_change(leader);
        node.publish_status();
        Ok(node)
    }

    pub(crate) fn run(mut self) {
        match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .enable_io()
            .build()
        {
            Ok(runtime) => {
                let _ = self.shared.io.set(runtime.handle().clone());
                self.transport.start(runtime.handle());
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
            self.loop_exit(&e);
            self.shutdown();
            return;
        }
        loop {
            let wake = self.wait();
            let closed = matches!(wake, Wake::Input(None));
            if let Wake::Input(Some(input)) = wake {
                self.handle_input(input);
            }
            if let Err(e) = self.turn() {
                self.loop_exit(&e);
                break;
            }
            if closed || self.shared.stopping.load(Ordering::Acquire) {
                break;
            }
        }
        self.shutdown();
    }

    fn wait(&mut self) -> Wake {
        let input = &mut self.input;
        let shared = &self.shared;
        let deadline = tokio::time::Instant::from_std(self.next_tick);
        self.runtime
            .as_ref()
            .expect("runtime built in run")
            .block_on(async {
                tokio::select! {
                    biased;
                    _ = shared.wake.notified() => Wake::Notified,
                    msg = input.recv() => Wake::Input(msg),
                    _ = tokio::time::sleep_until(deadline) => Wake::Tick,
                }
            })
    }

    /// One turn of the loop after a wake-up.
    fn turn(&mut self) -> Result<(), ConsensusError> {
        for _ in 0..INPUT_QUEUE_CAPACITY {
            match self.input.try_recv() {
                Ok(input) => self.handle_input(input),
                Err(_) => break,
            }
        }
        let now = Instant::now();
        if now >= self.next_tick {
            self.raw.tick();
            // one tick per wake-up: a stalled loop must not fire a burst of
            // election timeouts when it resumes
            self.next_tick = now + self.heartbeat;
        }
        self.advance_applied();
        self.maybe_snapshot()?;
        self.reads.start(&mut self.raw, now);
        self.reads.expire(&mut self.raw, now);
        self.handle_readies()?;
        self.publish_status();
        Ok(())
    }

    fn handle_input(&mut self, input: Input) {
        match input {
            Input::Propose { data, reply } => {
                let result = if self.raw.raft.leader_id == INVALID_ID {
                    Err(ConsensusError::NoLeader)
                } else {
                    self.raw
                        .propose(Vec::new(), data)
                        .map_err(|_| ConsensusError::ProposalDropped)
                };
                reply.send(result);
            }
            Input::ProposeConfChange {
                context,
                change,
                reply,
            } => {
                let result = if self.raw.raft.leader_id == INVALID_ID {
                    Err(ConsensusError::NoLeader)
                } else {
                    self.raw
                        .propose_conf_change(context, change)
                        .map_err(|_| ConsensusError::ProposalDropped)
                };
                let _ = reply.send(result);
            }
            Input::ReadIndex { reply } => self.reads.queue(reply),
            Input::ReportSnapshot { to, finished } => {
                let status = if finished {
                    raft::SnapshotStatus::Finish
                } else {
                    raft::SnapshotStatus::Failure
                };
                self.raw.report_snapshot(to, status);
            }
            Input::TransferLeader(transferee) => self.raw.transfer_leader(transferee),
            Input::Step(msg) => {
                if let Err(e) = self.raw.step(msg) {
                    tracing::debug!(error = %e, "raft: dropped a peer message");
                }
            }
        }
    }

    fn advance_applied(&mut self) {
        let reported = self.shared.applied.load(Ordering::Acquire);
        let log = &self.raw.raft.raft_log;
        let target = reported.min(log.committed).min(log.persisted);
        if target > log.applied {
            self.raw.advance_apply_to(target);
        }
    }

    fn on_leader_change(&mut self, leader: u64) {
        if leader == self.last_leader {
            return;
        }
        let term = self.raw.raft.term;
        if leader != INVALID_ID {
            self.leader_changes += 1;
            tracing::info!(target: "raft", "raft.node: {:x} elected leader {:x} at term {}", self.id, leader, term);
        } else {
            tracing::info!(target: "raft", "raft.node: {:x} lost leader {:x} at term {}", self.id, self.last_leader, term);
        }
        // Rounds in flight die with the old leadership: etcd answers them
        // "leader changed" (the client retries on the new leader).
        self.reads.fail_in_flight(|| ConsensusError::LeaderChanged);
        self.last_leader = leader;
    }

    fn handle_readies(&mut self) -> Result<(), ConsensusError> {
        while self.raw.has_ready() {
            let mut rd = self.raw.ready();
            if let Some(ss) = rd.ss() {
                let leader = ss.leader_id;
                self.on_leader_change(leader);
            }
            // A leader sends before persisting (raft thesis 10.2.1).
            if !rd.messages().is_empty() {
                self.send_now(rd.take_messages());
            }
            if !rd.snapshot().is_empty() {
                let snapshot = rd.snapshot().clone();
                self.persist_received_snapshot(snapshot.clone())?;
                self.send_to_apply(CommittedBatch {
                    snapshot: Some(snapshot),
                    entries: Vec::new(),
                })?;
            }
            let committed = rd.take_committed_entries();
            self.wal.append(rd.entries(), rd.hs());
            if rd.must_sync() {
                self.wal.sync()?;
                self.shared
                    .wal_syncs
                    .store(self.wal.sync_count(), Ordering::Release);
            } else {
                self.wal.flush()?;
            }
            {
                let store = self.raw.mut_store();
                store.wl().append(rd.entries())?;
                if let Some(hs) = rd.hs() {
                    store.wl().set_hardstate(hs.clone());
                }
            }
            for state in rd.take_read_states() {
                self.reads.on_read_state(state);
            }
            let persisted = rd.take_persisted_messages();
            if !persisted.is_empty() {
                self.send_now(persisted);
            }
            let mut light = self.raw.advance_append(rd);
            if let Some(commit) = light.commit_index() {
                let hs = {
                    let store = self.raw.mut_store();
                    let mut core = store.wl();
                    core.mut_hard_state().commit = commit;
                    core.hard_state().clone()
                };
                // The commit index need not be durable (raft recovers it);
                // it rides along with the next sync.
                self.wal.append(&[], Some(&hs));
            }
            let msgs = light.take_messages();
            if !msgs.is_empty() {
                self.send_now(msgs);
            }
            // Publish the commit index before the apply side can apply up
            // to it: applied must never be seen ahead of committed.
            self.publish_status();
            self.deliver(committed)?;
            self.deliver(light.take_committed_entries())?;
        }
        Ok(())
    }

    /// Sends, and lets the peer links on this thread's runtime write the
    /// messages now rather than at the next wait: the leader's appends must
    /// be on the wire while it fdatasyncs.
    fn send_now(&self, msgs: Vec<raft::eraftpb::Message>) {
        self.transport.send(msgs);
        if let Some(runtime) = &self.runtime {
            runtime.block_on(tokio::task::yield_now());
        }
    }

    /// A snapshot from the leader: raft's view is replaced wholesale.
    fn persist_received_snapshot(&mut self, snapshot: Snapshot) -> Result<(), ConsensusError> {
        let meta = snapshot.get_metadata();
        self.snapper.save(&snapshot)?;
        self.wal.save_snapshot(SnapshotMarker {
            term: meta.term,
            index: meta.index,
        });
        self.wal.sync()?;
        self.raw.mut_store().wl().apply_snapshot(snapshot.clone())?;
        self.snapshot_index = meta.index;
        self.conf_history = ConfHistory::new(meta.index, meta.get_conf_state().clone());
        Ok(())
    }

    /// Hands committed entries to the apply side, applying conf changes to
    /// raft first so the next Ready reflects them.
    fn deliver(&mut self, entries: Vec<Entry>) -> Result<(), ConsensusError> {
        if entries.is_empty() {
            return Ok(());
        }
        for e in &entries {
            if let Some(cs) = apply_conf_change_entry(&mut self.raw, e)? {
                self.conf_history.push(e.index, cs);
            }
        }
        self.send_to_apply(CommittedBatch {
            snapshot: None,
            entries,
        })
    }

    fn send_to_apply(&mut self, batch: CommittedBatch) -> Result<(), ConsensusError> {
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
        self.runtime
            .as_ref()
            .expect("runtime built in run")
            .block_on(async {
                tokio::select! {
                    sent = tx.send(batch) => sent.map_err(|_| ConsensusError::Stopped),
                    _ = wait_for_stop(shared) => Err(ConsensusError::Stopped),
                }
            })
    }

    /// Writes a snapshot at the durable index the apply side gave us, then
    /// compacts the in-memory log and releases WAL segments below it.
    fn maybe_snapshot(&mut self) -> Result<(), ConsensusError> {
        let requested = self.shared.snapshot_request.load(Ordering::Acquire);
        let log = &self.raw.raft.raft_log;
        let index = requested.min(log.committed).min(log.persisted);
        if index <= self.snapshot_index {
            return Ok(());
        }
        let term = match self.raw.store().term(index) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(index, error = %e, "raft: cannot snapshot, term unknown");
                return Ok(());
            }
        };
        let conf_state = self.conf_history.at(index);
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().index = index;
        snapshot.mut_metadata().term = term;
        snapshot.mut_metadata().set_conf_state(conf_state);
        // Order matters: snapshot file, then WAL marker, then release. A crash
        // between steps leaves more WAL than needed, never less.
        let path = self.snapper.save(&snapshot)?;
        self.wal.save_snapshot(SnapshotMarker { term, index });
        self.wal.sync()?;
        self.shared
            .wal_syncs
            .store(self.wal.sync_count(), Ordering::Release);
        let compact_to = index.saturating_sub(self.catch_up_entries);
        if compact_to > self.raw.store().first_index()? {
            self.raw.mut_store().wl().compact(compact_to)?;
        }
        self.wal.release_to(index)?;
        self.snapshot_index = index;
        self.conf_history.release_below(index);
        tracing::info!(index, term, file = %path.display(), "raft: saved snapshot and released WAL");
        Ok(())
    }

    fn publish_status(&self) {
        let raft = &self.raw.raft;
        // raft hands out only persisted, committed entries (a follower's
        // commit index may run ahead of its own log: committed ≤ persisted
        // does not hold, so it is not asserted).
        assert!(
            raft.raft_log.applied <= raft.raft_log.committed.min(raft.raft_log.persisted),
            "applied {} beyond committed {} or persisted {}",
            raft.raft_log.applied,
            raft.raft_log.committed,
            raft.raft_log.persisted
        );
        let status = RaftStatus {
            id: self.id,
            leader: raft.leader_id,
            term: raft.term,
            commit_index: raft.raft_log.committed,
            applied_index: raft.raft_log.applied,
            is_leader: raft.state == StateRole::Leader,
            leader_changes: self.leader_changes,
            local_read_index: (raft.state == StateRole::Leader
                && raft.prs().is_singleton()
                && raft.commit_to_current_term())
            .then_some(raft.raft_log.committed),
        };
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

    fn shutdown(mut self) {
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
                Input::Step(_) | Input::ReportSnapshot { .. } | Input::TransferLeader(_) => {}
            }
        }
        self.reads.fail_all(|| ConsensusError::Stopped);
        tracing::info!(id = %format!("{:x}", self.id), "raft: stopped");
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

/// Applies a committed conf-change entry to raft; returns the new ConfState.
/// A change raft rejects is logged and skipped (raft ignores it too, as
/// etcd's raft does); an entry that cannot be decoded stops the member (etcd:
/// MustUnmarshal panics): skipping it would let members diverge.
fn apply_conf_change_entry(
    raw: &mut RawNode<MemStorage>,
    entry: &Entry,
) -> Result<Option<ConfState>, ConsensusError> {
    let undecodable = |e: protobuf::ProtobufError| {
        corrupt(format!(
            "cannot decode the committed conf change at index {}: {e}",
            entry.index
        ))
    };
    let result = match entry.get_entry_type() {
        EntryType::EntryNormal => return Ok(None),
        EntryType::EntryConfChange => {
            let cc = ConfChange::parse_from_bytes(&entry.data).map_err(undecodable)?;
            raw.apply_conf_change(&cc)
        }
        EntryType::EntryConfChangeV2 => {
            let cc = ConfChangeV2::parse_from_bytes(&entry.data).map_err(undecodable)?;
            raw.apply_conf_change(&cc)
        }
    };
    match result {
        Ok(cs) => {
            raw.mut_store().wl().set_conf_state(cs.clone());
            Ok(Some(cs))
        }
        Err(e) => {
            tracing::warn!(index = entry.index, error = %e, "raft: ignoring conf change raft rejected");
            Ok(None)
        }
    }
}
