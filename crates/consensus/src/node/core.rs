//! The raft core, free of I/O as raft-rs keeps its own: the RawNode over an
//! in-memory log and what the member decides around it (read rounds, the
//! conf-state history, the snapshot policy, leader changes). The driver
//! ([`super::Node`]) feeds it input and the clock, and carries out what it
//! asks: between [`Core::ready`] and [`Core::advance`] it sends, writes the
//! WAL (and a received snapshot) and syncs; after `advance` it sends again
//! and hands the committed entries to apply.

use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeV2, ConfState, Entry, EntryType, HardState, Message, Snapshot,
};
use raft::storage::MemStorage;
use raft::{Config, RawNode, Ready, StateRole, Storage, INVALID_ID};

use super::conf::ConfHistory;
use super::log_storage::LogStorage;
use super::reads::ReadRounds;
use crate::{ConsensusError, Input, RaftStatus};

fn corrupt(msg: String) -> ConsensusError {
    ConsensusError::Corrupt(msg)
}

/// What the core is restored from: the newest snapshot and the WAL behind it.
pub(crate) struct Restore {
    pub(crate) snapshot: Option<Snapshot>,
    /// Voters of a new cluster (the WAL's metadata), used without a snapshot.
    pub(crate) initial_voters: Vec<u64>,
    pub(crate) hard_state: HardState,
    pub(crate) entries: Vec<Entry>,
    /// The backend's applied index.
    pub(crate) applied: u64,
    /// Entries kept in memory below a snapshot for slow followers.
    pub(crate) catch_up_entries: u64,
    /// How long a read round may wait for its quorum.
    pub(crate) read_timeout: Duration,
}

pub(crate) struct Core {
    id: u64,
    raw: RawNode<LogStorage>,
    reads: ReadRounds,
    last_leader: u64,
    leader_changes: u64,
    snapshot_index: u64,
    catch_up_entries: u64,
    conf_history: ConfHistory,
}

/// One Ready: what must be sent and made durable, in this order, before
/// [`Core::advance`]: `messages` (a leader sends before persisting, raft
/// thesis 10.2.1), then `snapshot` (its file, the WAL marker, a sync, then
/// [`Core::install_snapshot`] and apply), then the entries and hard state
/// (synced when [`Persist::must_sync`]).
pub(crate) struct Persist {
    ready: Ready,
    pub(crate) messages: Vec<Message>,
    pub(crate) snapshot: Option<Snapshot>,
    committed: Vec<Entry>,
}

impl Persist {
    pub(crate) fn entries(&self) -> &[Entry] {
        self.ready.entries()
    }

    pub(crate) fn hard_state(&self) -> Option<&HardState> {
        self.ready.hs()
    }

    pub(crate) fn must_sync(&self) -> bool {
        self.ready.must_sync()
    }
}

/// What follows once a Ready is durable, to carry out in this order.
pub(crate) struct Advanced {
    /// Messages that wait for the persist (votes, append responses).
    pub(crate) persisted_messages: Vec<Message>,
    /// The hard state with the new commit index: it need not be durable
    /// (raft recovers it), so it rides along with the next WAL sync.
    pub(crate) commit: Option<HardState>,
    pub(crate) messages: Vec<Message>,
    /// Committed entries for apply, in index order; conf changes among them
    /// are already applied to raft, so the next Ready reflects them.
    pub(crate) committed: Vec<Entry>,
}

impl Core {
    /// Rebuilds raft's state from a snapshot and the WAL, checking that they
    /// and the backend's applied index agree.
    pub(crate) fn restore(config: &Config, restore: Restore) -> Result<Core, ConsensusError> {
        let catch_up_entries = restore.catch_up_entries;
        let read_timeout = restore.read_timeout;
        let log = Rebuilt::from(restore)?;
        let applied = log.applied;
        let config = Config {
            applied,
            ..config.clone()
        };
        let mut raw = RawNode::new(
            &config,
            LogStorage::in_memory(log.storage),
            &crate::logger::raft_logger(),
        )?;

        // Conf changes at or below `applied` will not be handed out again;
        // replay them into raft now. Those above come back through the loop.
        let mut conf_history = ConfHistory::new(log.snap_index, log.base_conf);
        for e in log.entries.iter().filter(|e| e.index <= applied) {
            if let ConfApplied::Changed(cs) = apply_conf_change_entry(&mut raw, e)? {
                conf_history.push(e.index, cs);
            }
        }
        tracing::info!(
            id = %format!("{:x}", config.id),
            snapshot_index = log.snap_index,
            applied,
            commit = log.hard_state.commit,
            last_index = log.last_index,
            term = log.hard_state.term,
            "raft: starting member"
        );
        let voters = raw.raft.prs().conf().voters().ids();
        if voters.len() == 1 && voters.contains(config.id) {
            // A single voter needs nobody's vote: skip the election timeout,
            // as etcd fast-forwards ticks for a one-member cluster.
            raw.campaign()?;
        }
        let mut core = Core {
            id: config.id,
            raw,
            reads: ReadRounds::new(config.id, read_timeout),
            last_leader: INVALID_ID,
            leader_changes: 0,
            snapshot_index: log.snap_index,
            catch_up_entries,
            conf_history,
        };
        let leader = core.raw.raft.leader_id;
        core.on_leader_change(leader);
        Ok(core)
    }

    pub(crate) fn input(&mut self, input: Input) {
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
            Input::ProposeConfChange { change, reply } => {
                let result = if self.raw.raft.leader_id == INVALID_ID {
                    Err(ConsensusError::NoLeader)
                } else {
                    self.raw
                        .propose_conf_change(Vec::new(), change)
                        .map_err(|_| ConsensusError::ProposalDropped)
                };
                let _ = reply.send(result);
            }
            Input::Progress { reply } => {
                let _ = reply.send(self.progress());
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
            Input::AdvanceTicks(ticks) => {
                for _ in 0..ticks {
                    self.raw.tick();
                }
            }
            Input::Step(msg) => {
                if let Err(e) = self.raw.step(msg) {
                    tracing::debug!(error = %e, "raft: dropped a peer message");
                }
            }
        }
    }

    /// The leader's view of every member's log; None on a follower.
    fn progress(&self) -> Option<Vec<crate::PeerProgress>> {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader {
            return None;
        }
        let learners = raft.prs().conf().learners();
        let mut all: Vec<crate::PeerProgress> = raft
            .prs()
            .iter()
            .map(|(id, pr)| crate::PeerProgress {
                id: *id,
                matched: pr.matched,
                is_learner: learners.contains(id),
                recent_active: pr.recent_active || *id == self.id,
                next: pr.next_idx,
                state: match pr.state {
                    raft::ProgressState::Probe => "StateProbe",
                    raft::ProgressState::Replicate => "StateReplicate",
                    raft::ProgressState::Snapshot => "StateSnapshot",
                },
            })
            .collect();
        all.sort_by_key(|p| p.id);
        Some(all)
    }

    /// One heartbeat interval passed.
    pub(crate) fn tick(&mut self) {
        self.raw.tick();
    }

    /// The apply side reports `reported` applied: raft learns it, bounded by
    /// what it has committed and persisted.
    pub(crate) fn applied_to(&mut self, reported: u64) {
        let log = &self.raw.raft.raft_log;
        let target = reported.min(log.committed).min(log.persisted);
        if target > log.applied {
            self.raw.advance_apply_to(target);
        }
    }

    /// Applied entries may leave memory from now on, read back from the
    /// segments in `wal_dir` when a follower needs them (see
    /// `log_storage`).
    pub(crate) fn spill_to(&mut self, wal_dir: std::path::PathBuf) {
        self.raw.mut_store().spill_to(wal_dir);
    }

    /// Moves applied entries beyond the hot window out of memory.
    pub(crate) fn spill_applied(&mut self) {
        let applied = self.raw.raft.raft_log.applied;
        self.raw.mut_store().spill_applied(applied);
    }

    /// Starts a read round for waiting reads, expires one that waited too
    /// long.
    pub(crate) fn reads(&mut self, now: Instant) {
        self.reads.start(&mut self.raw, now);
        self.reads.expire(&mut self.raw, now);
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

    /// The next Ready, if raft has one.
    pub(crate) fn ready(&mut self) -> Option<Persist> {
        if !self.raw.has_ready() {
            return None;
        }
        let mut ready = self.raw.ready();
        if let Some(ss) = ready.ss() {
            let leader = ss.leader_id;
            self.on_leader_change(leader);
        }
        let messages = ready.take_messages();
        let snapshot = (!ready.snapshot().is_empty()).then(|| ready.snapshot().clone());
        let committed = ready.take_committed_entries();
        Some(Persist {
            ready,
            messages,
            snapshot,
            committed,
        })
    }

    /// A snapshot from the leader, now durable: raft's view is replaced
    /// wholesale.
    pub(crate) fn install_snapshot(&mut self, snapshot: Snapshot) -> Result<(), ConsensusError> {
        let index = snapshot.get_metadata().index;
        let conf = snapshot.get_metadata().get_conf_state().clone();
        self.raw.mut_store().apply_snapshot(snapshot)?;
        self.snapshot_index = index;
        self.conf_history = ConfHistory::new(index, conf);
        Ok(())
    }

    /// The Ready is durable: raft goes on.
    pub(crate) fn advance(&mut self, persist: Persist) -> Result<Advanced, ConsensusError> {
        let Persist {
            mut ready,
            mut committed,
            ..
        } = persist;
        {
            let store = self.raw.mut_store();
            store.wl().append(ready.entries())?;
            if let Some(hs) = ready.hs() {
                store.wl().set_hardstate(hs.clone());
            }
        }
        for state in ready.take_read_states() {
            self.reads.on_read_state(state);
        }
        let persisted_messages = ready.take_persisted_messages();
        let mut light = self.raw.advance_append(ready);
        let commit = light.commit_index().map(|commit| {
            let store = self.raw.mut_store();
            let mut core = store.wl();
            core.mut_hard_state().commit = commit;
            core.hard_state().clone()
        });
        let messages = light.take_messages();
        committed.extend(light.take_committed_entries());
        for e in &mut committed {
            match apply_conf_change_entry(&mut self.raw, e)? {
                ConfApplied::NotConfChange => {}
                ConfApplied::Changed(cs) => {
                    self.step_down_if_removed(&cs);
                    self.conf_history.push(e.index, cs);
                }
                // The apply side must follow raft's configuration: a change
                // raft refused reaches it as what it was for raft, nothing.
                ConfApplied::Refused => {
                    e.set_entry_type(EntryType::EntryNormal);
                    e.data = Vec::new().into();
                    e.context = Vec::new().into();
                }
            }
        }
        Ok(Advanced {
            persisted_messages,
            commit,
            messages,
            committed,
        })
    }

    /// A leader that applied its own removal steps down (keeping its
    /// term): raft-rs would otherwise go on leading a configuration it is
    /// not in, and panic counting its own progress. The others elect a new
    /// leader after an election timeout, as in etcd.
    fn step_down_if_removed(&mut self, cs: &ConfState) {
        let raft = &mut self.raw.raft;
        if raft.state == StateRole::Leader
            && !cs.voters.contains(&self.id)
            && !cs.learners.contains(&self.id)
        {
            let term = raft.term;
            raft.become_follower(term, INVALID_ID);
            tracing::info!(id = %format!("{:x}", self.id), term, "raft: removed from the cluster: stepped down");
        }
    }

    /// The snapshot to write when apply asks for one at `requested` (its
    /// durable index): at most what raft committed and persisted, past the
    /// last one, with the conf state at its index.
    pub(crate) fn snapshot_due(&self, requested: u64) -> Option<Snapshot> {
        let log = &self.raw.raft.raft_log;
        let index = requested.min(log.committed).min(log.persisted);
        if index <= self.snapshot_index {
            return None;
        }
        let term = match self.raw.store().term(index) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(index, error = %e, "raft: cannot snapshot, term unknown");
                return None;
            }
        };
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().index = index;
        snapshot.mut_metadata().term = term;
        snapshot
            .mut_metadata()
            .set_conf_state(self.conf_history.at(index));
        Some(snapshot)
    }

    /// A snapshot at `index` is durable (file and WAL marker): the in-memory
    /// log is compacted, keeping the catch-up entries below it.
    pub(crate) fn snapshot_saved(&mut self, index: u64) -> Result<(), ConsensusError> {
        let compact_to = index.saturating_sub(self.catch_up_entries);
        if compact_to > self.raw.store().first_index()? {
            self.raw.mut_store().compact(compact_to)?;
            tracing::info!("compact-index" = compact_to, "compacted Raft logs");
        }
        self.snapshot_index = index;
        self.conf_history.release_below(index);
        Ok(())
    }

    pub(crate) fn status(&self) -> RaftStatus {
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
        RaftStatus {
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
            vote: raft.vote,
            raft_state: match raft.state {
                StateRole::Follower => "StateFollower",
                StateRole::Candidate => "StateCandidate",
                StateRole::Leader => "StateLeader",
                StateRole::PreCandidate => "StatePreCandidate",
            },
            lead_transferee: raft.lead_transferee.unwrap_or(0),
        }
    }

    /// This member leads a configuration of one voter and no learners:
    /// nobody else's message is needed to commit, so a client thread may
    /// turn the loop for its own proposals (`crate::turns`).
    pub(crate) fn leads_alone(&self) -> bool {
        let raft = &self.raw.raft;
        raft.state == StateRole::Leader && raft.prs().is_singleton() && raft.prs().iter().len() == 1
    }

    /// The member stops: every read still waiting fails.
    pub(crate) fn stop(&mut self) {
        self.reads.fail_all(|| ConsensusError::Stopped);
    }
}

/// raft's in-memory log as the snapshot and the WAL leave it, checked
/// against each other and against the backend's applied index.
struct Rebuilt {
    storage: MemStorage,
    snap_index: u64,
    base_conf: ConfState,
    /// The WAL's entries after the snapshot.
    entries: Vec<Entry>,
    last_index: u64,
    hard_state: HardState,
    /// What raft starts from as applied: the backend's index, or the WAL's
    /// last one when a leader's backend is ahead of it.
    applied: u64,
}

impl Rebuilt {
    fn from(restore: Restore) -> Result<Rebuilt, ConsensusError> {
        let storage = MemStorage::new();
        let (snap_index, base_conf) = match &restore.snapshot {
            // raft's log starts at the index after it: only damage puts it here
            Some(s) if s.get_metadata().index == u64::MAX => {
                return Err(corrupt(format!(
                    "snapshot index {} leaves no next index",
                    s.get_metadata().index
                )));
            }
            Some(s) => {
                storage.wl().apply_snapshot(s.clone())?;
                (
                    s.get_metadata().index,
                    s.get_metadata().get_conf_state().clone(),
                )
            }
            None => {
                let cs = ConfState {
                    voters: restore.initial_voters.clone(),
                    ..Default::default()
                };
                storage.wl().set_conf_state(cs.clone());
                (0, cs)
            }
        };
        let entries: Vec<Entry> = restore
            .entries
            .into_iter()
            .filter(|e| e.index > snap_index)
            .collect();
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

        let mut applied = restore.applied;
        if applied < snap_index {
            return Err(corrupt(format!(
                "backend applied index {applied} is below the snapshot index {snap_index}"
            )));
        }
        // A leader's backend can cover more than the raft snapshot it came
        // with (the leader's copy is taken when it is sent): until the
        // entries after the snapshot arrive, the backend is ahead of the
        // WAL. raft starts from what the WAL has; the leader sends those
        // entries again and apply skips what the backend already holds, as
        // etcd's does. A snapshot received from a leader carries the path of
        // its backend file; one the member took itself carries nothing, and
        // then a backend ahead of the WAL means the WAL lost entries.
        let received = restore
            .snapshot
            .as_ref()
            .is_some_and(|s| s.get_metadata().index == snap_index && !s.get_data().is_empty());
        if applied > last_index && received {
            tracing::info!(
                "backend-applied-index" = applied,
                "wal-last-index" = last_index,
                "snapshot-index" = snap_index,
                "the leader's database snapshot is ahead of the WAL: the entries up to the backend's index come again and are skipped"
            );
            applied = last_index;
        }
        if applied > last_index {
            return Err(corrupt(format!(
                "backend applied index {applied} is beyond the WAL's last index {last_index}"
            )));
        }
        // The commit index in the WAL lags (it is written lazily); what was
        // applied was committed.
        let mut hard_state = restore.hard_state;
        if hard_state.term == u64::MAX {
            // raft campaigns at term + 1: only a damaged WAL holds this
            return Err(corrupt(format!(
                "WAL hard state term {} leaves no next term",
                hard_state.term
            )));
        }
        hard_state.commit = hard_state.commit.max(snap_index).max(applied);
        if hard_state.commit > last_index {
            return Err(corrupt(format!(
                "WAL commit index {} is beyond its last index {last_index}",
                hard_state.commit
            )));
        }
        storage.wl().set_hardstate(hard_state.clone());

        Ok(Rebuilt {
            storage,
            snap_index,
            base_conf,
            entries,
            last_index,
            hard_state,
            applied,
        })
    }
}

/// What a committed entry did to raft's configuration.
enum ConfApplied {
    NotConfChange,
    Changed(ConfState),
    /// raft refused the change (it would leave no voter, say): it is as if
    /// the entry were empty.
    Refused,
}

/// Applies a committed conf-change entry to raft; returns the new ConfState.
/// A change raft rejects is logged and skipped (raft ignores it too, as
/// etcd's raft does); an entry that cannot be decoded stops the member (etcd:
/// MustUnmarshal panics): skipping it would let members diverge.
fn apply_conf_change_entry(
    raw: &mut RawNode<LogStorage>,
    entry: &Entry,
) -> Result<ConfApplied, ConsensusError> {
    let undecodable = |e: protobuf::ProtobufError| {
        corrupt(format!(
            "cannot decode the committed conf change at index {}: {e}",
            entry.index
        ))
    };
    let result = match entry.get_entry_type() {
        EntryType::EntryNormal => return Ok(ConfApplied::NotConfChange),
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
            Ok(ConfApplied::Changed(cs))
        }
        Err(e) => {
            tracing::warn!(index = entry.index, error = %e, "raft: ignoring conf change raft rejected");
            Ok(ConfApplied::Refused)
        }
    }
}

#[cfg(test)]
mod tests;
