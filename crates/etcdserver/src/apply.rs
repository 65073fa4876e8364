//! The apply loop: committed raft entries, in index order, become mvcc
//! changes; the proposer's waiter is woken by request ID.
//!
//! Invariants: an entry at or below the store's consistent index was applied
//! before (a restart replays the WAL above the durable consistent index), so
//! it is skipped: apply is idempotent by index. The backend commits in
//! batches without fsync; a snapshot (which lets raft release WAL) is taken
//! only right after a durable commit that covers it.
//!
//! A committed entry is applied whole or not at all, and never skipped. An
//! entry apply cannot carry out (it cannot be decoded, it asks for something
//! this member does not know, the backend fails under it, a snapshot cannot
//! be installed) halts apply right there, as etcd's `lg.Panic`/`lg.Fatal`
//! do: nothing of it is published, its index is not recorded, no later
//! entry is applied, and the member's [`Fatal`] is raised so that the
//! process stops and exits non-zero. A restart meets the same entry again
//! and stops the same way, rather than members diverging.

use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::{
    alarm_request::AlarmAction, AlarmRequest, AlarmResponse, AlarmType, CompactionRequest,
    CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, InternalRaftRequest,
    LeaseCheckpointRequest, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, PutRequest, PutResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use api::rpctypes::{self, EtcdError};
use consensus::{CommittedBatch, Fatal, RaftHandle};
use mvcc::{SideTable, Store, TxnWrite};
use raft::eraftpb::{Entry, EntryType};
use tokio::sync::{mpsc, watch};

use crate::alarms::{self, Alarms, Restriction};
use crate::errors;
use crate::membership::ClusterMembers;
use crate::metrics::ops::ApplyOp;
use crate::wait::Wait;
use lease::Lessor;

/// etcd's backend batch limits: commit at least every 100 ms or 10k ops.
pub(crate) const BACKEND_BATCH_INTERVAL: Duration = Duration::from_millis(100);
pub(crate) const BACKEND_BATCH_LIMIT: usize = 10_000;
/// The largest batch applied inline on the raft thread: more entries would
/// hold up its next Ready (heartbeats, the next fdatasync) for too long.
pub(crate) const INLINE_APPLY_MAX_ENTRIES: usize = 16;

#[derive(Debug, Clone)]
pub enum ApplyResponse {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compaction(CompactionResponse),
    Alarm(AlarmResponse),
    LeaseGrant(LeaseGrantResponse),
    LeaseRevoke(LeaseRevokeResponse),
    LeaseCheckpoint,
    MemberAttrSet,
}

pub type ApplyOutcome = Result<ApplyResponse, EtcdError>;

pub struct Applier {
    pub store: Arc<Store>,
    pub raft: RaftHandle,
    pub wait: Arc<Wait<ApplyOutcome>>,
    pub applied: watch::Sender<u64>,
    pub snapshot_count: u64,
    pub members: Arc<ClusterMembers>,
    pub lessor: Arc<Lessor>,
    pub alarms: Arc<Alarms>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Consistent index of the last raft snapshot asked for.
    pub last_snapshot: std::sync::atomic::AtomicU64,
    /// Held while a batch is applied or the backend committed: by the apply
    /// thread, or by the raft thread applying inline (see consensus's
    /// "Inline apply").
    pub busy: parking_lot::Mutex<()>,
    /// Raised (and apply halted for good) when an entry cannot be applied.
    pub fatal: Arc<Fatal>,
    pub halted: std::sync::atomic::AtomicBool,
}

/// Apply stopped at an entry it cannot carry out; the member's [`Fatal`]
/// holds the cause.
#[derive(Debug)]
pub(crate) struct Halted;

/// Why a request was not carried out.
enum ApplyError {
    /// The request's own error, for its proposer; every member gives it
    /// alike (the entry is applied: its index is recorded).
    Refused(EtcdError),
    /// Apply cannot carry the entry out: it halts (see the module doc).
    Halt(String),
}

impl From<EtcdError> for ApplyError {
    fn from(e: EtcdError) -> Self {
        ApplyError::Refused(e)
    }
}

impl From<mvcc::MvccError> for ApplyError {
    fn from(e: mvcc::MvccError) -> Self {
        if backend_failed(&e) {
            ApplyError::Halt(format!("the backend failed under it: {e}"))
        } else {
            ApplyError::Refused(errors::from_mvcc(&e))
        }
    }
}

/// Whether a backend error under a write means the member cannot go on
/// (the backend failed or holds bad data) rather than a request's own error
/// (a compacted revision, a missing lease), which every member gives alike.
fn backend_failed(e: &mvcc::MvccError) -> bool {
    matches!(e, mvcc::MvccError::Backend(_) | mvcc::MvccError::Corrupt(_))
}

impl Applier {
    /// The raft thread's offer to apply a batch at once (nothing is queued
    /// for the apply thread). Refused when the apply thread is busy (a
    /// commit on its ticker), for snapshots and large batches, and when the
    /// batch would call for a backend commit or a raft snapshot: those stay
    /// off the raft thread.
    pub fn try_apply_inline(&self, batch: CommittedBatch) -> Result<(), CommittedBatch> {
        if batch.snapshot.is_some() || batch.entries.len() > INLINE_APPLY_MAX_ENTRIES {
            return Err(batch);
        }
        let Some(_busy) = self.busy.try_lock() else {
            return Err(batch);
        };
        let last = batch.entries.last().map_or(0, |e| e.index);
        let snapshot_due = last
            >= self
                .last_snapshot
                .load(std::sync::atomic::Ordering::Relaxed)
                + self.snapshot_count;
        if snapshot_due || self.store.pending_ops() + batch.entries.len() >= BACKEND_BATCH_LIMIT {
            return Err(batch);
        }
        if self.is_halted() {
            // Handed to the apply thread, which has stopped: the raft loop
            // stops too.
            return Err(batch);
        }
        let _ = self.apply_batch(batch);
        Ok(())
    }

    fn is_halted(&self) -> bool {
        self.halted.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops apply for good at an entry it cannot carry out.
    fn halt(&self, cause: String) -> Halted {
        self.halted
            .store(true, std::sync::atomic::Ordering::Release);
        self.fatal.raise(cause);
        self.wait.close();
        Halted
    }

    /// Applies one batch from the channel, then commits the backend or asks
    /// for a raft snapshot when due.
    fn process(&self, batch: CommittedBatch) -> Result<(), Halted> {
        use std::sync::atomic::Ordering::Relaxed;
        let _busy = self.busy.lock();
        if self.is_halted() {
            return Err(Halted);
        }
        self.apply_batch(batch)?;
        if self.store.pending_ops() >= BACKEND_BATCH_LIMIT {
            self.commit(false)?;
        }
        let applied = *self.applied.borrow();
        if applied >= self.last_snapshot.load(Relaxed) + self.snapshot_count {
            // Durable first: raft may release WAL up to `applied`.
            if self.commit(true)? {
                self.raft.snapshot(applied);
                self.last_snapshot.store(applied, Relaxed);
            }
        }
        Ok(())
    }

    /// Runs until the raft side closes the committed-entries channel.
    pub fn run(self: Arc<Self>, mut committed: mpsc::Receiver<CommittedBatch>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the apply loop");
                return;
            }
        };
        runtime.block_on(async {
            let mut ticker = tokio::time::interval(BACKEND_BATCH_INTERVAL);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    batch = committed.recv() => {
                        let Some(batch) = batch else { break };
                        let processed = self.process(batch);
                        self.raft.batch_applied();
                        if processed.is_err() {
                            break;
                        }
                    }
                    _ = ticker.tick() => {
                        let _busy = self.busy.lock();
                        if self.is_halted() {
                            break;
                        }
                        if self.store.pending_ops() > 0 && self.commit(false).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        // Everything applied before a halt is whole: keep it (the WAL
        // replays the rest after a restart). After a backend failure this
        // fails again, which changes nothing.
        let _busy = self.busy.lock();
        if let Err(e) = self.store.commit(true) {
            tracing::warn!(error = %e, "final backend commit failed");
        }
    }

    /// Commits the backend. Ok(false): deferred by a defragmentation that is
    /// copying the file (the batch stays in memory and goes to the new file
    /// after the swap; no snapshot, which would release WAL, until then).
    /// A failed commit halts apply (etcd: "failed to commit tx"); the WAL
    /// still holds every entry, so stopping loses nothing.
    fn commit(&self, durable: bool) -> Result<bool, Halted> {
        match self.store.commit(durable) {
            Ok(()) => Ok(true),
            Err(mvcc::MvccError::Deferred) => Ok(false),
            Err(e) => Err(self.halt(format!("failed to commit the backend: {e}"))),
        }
    }

    /// Applies a batch in order, stopping at the first entry apply cannot
    /// carry out; only the entries before it are reported applied.
    fn apply_batch(&self, batch: CommittedBatch) -> Result<(), Halted> {
        if let Some(snapshot) = &batch.snapshot {
            self.install_snapshot(snapshot)?;
        }
        let mut last = None;
        let mut result = Ok(());
        for entry in &batch.entries {
            if let Err(halted) = self.apply_entry(entry) {
                result = Err(halted);
                break;
            }
            last = Some(entry.index);
        }
        if let Some(index) = last {
            self.applied.send_replace(index);
            self.raft.report_applied(index);
        }
        result
    }

    /// A snapshot from the leader: its backend replaces ours (the leader's
    /// copy covers at least the snapshot's index), then apply goes on from
    /// there. The WAL and snap dir already hold its raft metadata.
    ///
    /// The member cannot go on without the state the snapshot holds, and
    /// raft already moved past it: a failure halts apply. The raft metadata
    /// is durable, and the leader sends a new snapshot after the restart.
    fn install_snapshot(&self, snapshot: &raft::eraftpb::Snapshot) -> Result<(), Halted> {
        let index = snapshot.get_metadata().index;
        let path =
            std::path::PathBuf::from(String::from_utf8_lossy(snapshot.get_data()).into_owned());
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            self.halt(format!(
                "failed to {what} (raft snapshot at index {index}, file {}): {e}",
                path.display()
            ))
        };
        if let Err(e) = self.store.restore_from(&path) {
            return Err(failed("install the database snapshot", &e));
        }
        let members = self
            .store
            .members()
            .map_err(|e| failed("read members from the database snapshot", &e))?;
        self.members.replace(
            members
                .values()
                .filter_map(|b| schema::members::decode(b))
                .collect(),
        );
        crate::bootstrap::recover_alarms(&self.alarms, &self.store)
            .map_err(|e| failed("rebuild alarms from the database snapshot", &e))?;
        crate::bootstrap::recover_lessor(&self.lessor, &self.store)
            .map_err(|e| failed("rebuild leases from the database snapshot", &e))?;
        let applied = self.store.consistent_index().max(index);
        tracing::info!(
            index,
            "consistent-index" = self.store.consistent_index(),
            "applied database snapshot"
        );
        let _ = std::fs::remove_file(&path);
        self.applied.send_replace(applied);
        self.raft.report_applied(applied);
        Ok(())
    }

    fn apply_entry(&self, entry: &Entry) -> Result<(), Halted> {
        if entry.index <= self.store.consistent_index() {
            return Ok(());
        }
        if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
            self.store.set_consistent_index(entry.index);
            return Ok(());
        }
        let request =
            api::codec::decode_internal_raft_request(entry.data.as_ref()).map_err(|e| {
                self.halt(format!(
                    "cannot decode the committed entry at index {} (term {}): {e}",
                    entry.index, entry.term
                ))
            })?;
        let id = request.header.as_ref().map(|h| h.id).unwrap_or(request.id);
        let op = apply_op(&request);
        let started = std::time::Instant::now();
        let outcome = match self.apply_request(request, entry.index) {
            Ok(response) => Ok(response),
            Err(ApplyError::Refused(e)) => Err(e),
            Err(ApplyError::Halt(cause)) => {
                return Err(self.halt(format!(
                    "cannot apply the committed entry at index {} (term {}): {cause}",
                    entry.index, entry.term
                )))
            }
        };
        self.metrics.ops.applied(op, outcome.is_ok(), started);
        self.wait.trigger(id, outcome);
        Ok(())
    }

    fn apply_request(
        &self,
        request: InternalRaftRequest,
        index: u64,
    ) -> Result<ApplyResponse, ApplyError> {
        if let Err(e) = self.check_alarms(&request) {
            self.store.set_consistent_index(index);
            return Err(e.into());
        }
        if let Some(alarm) = request.alarm {
            return Ok(ApplyResponse::Alarm(self.apply_alarm(&alarm, index)));
        }
        if let Some(put) = request.put {
            return self.apply_put(&put, index).map(ApplyResponse::Put);
        }
        if let Some(delete) = request.delete_range {
            return self
                .write(index, |w| w.delete_range(&delete))
                .map(ApplyResponse::DeleteRange);
        }
        if let Some(grant) = request.lease_grant {
            return self
                .apply_lease_grant(&grant, index)
                .map(ApplyResponse::LeaseGrant);
        }
        if let Some(revoke) = request.lease_revoke {
            return self
                .apply_lease_revoke(&revoke, index)
                .map(ApplyResponse::LeaseRevoke);
        }
        if let Some(checkpoint) = request.lease_checkpoint {
            self.apply_lease_checkpoint(&checkpoint, index);
            return Ok(ApplyResponse::LeaseCheckpoint);
        }
        if let Some(txn) = request.txn {
            return self.apply_txn(&txn, index).map(ApplyResponse::Txn);
        }
        if let Some(set) = request.cluster_member_attr_set {
            let attributes = set.member_attributes.unwrap_or_default();
            match self.members.set_attributes(
                set.member_id,
                &attributes.name,
                &attributes.client_urls,
            ) {
                Some(member) => {
                    self.store
                        .put_member(member.id, Some(schema::members::encode(&member)), index)
                }
                None => {
                    tracing::warn!(member = %format!("{:x}", set.member_id), "attributes of an unknown member ignored");
                    self.store.set_consistent_index(index);
                }
            }
            return Ok(ApplyResponse::MemberAttrSet);
        }
        if let Some(compaction) = request.compaction {
            return self
                .apply_compaction(&compaction, index)
                .map(ApplyResponse::Compaction);
        }
        // A request this member does not know (a newer member proposed it,
        // or the entry is damaged): etcd panics ("not implemented apply").
        // Skipping it would let members diverge.
        Err(ApplyError::Halt(
            "it carries no request this member can apply".to_string(),
        ))
    }

    /// What a raised alarm refuses (etcd's capped and corrupt appliers).
    fn check_alarms(&self, request: &InternalRaftRequest) -> Result<(), EtcdError> {
        match self.alarms.restriction() {
            Restriction::None => Ok(()),
            Restriction::Capped => {
                let grows = request.put.is_some()
                    || request.lease_grant.is_some()
                    || request
                        .txn
                        .as_ref()
                        .is_some_and(|t| alarms::cost_txn(t) > 0);
                if grows {
                    Err(rpctypes::NO_SPACE)
                } else {
                    Ok(())
                }
            }
            Restriction::Corrupt => {
                let writes = request.put.is_some()
                    || request.delete_range.is_some()
                    || request.txn.is_some()
                    || request.compaction.is_some()
                    || request.lease_grant.is_some()
                    || request.lease_revoke.is_some();
                if writes {
                    Err(rpctypes::CORRUPT)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// etcd's applierV3backend.Alarm: GET lists; ACTIVATE/DEACTIVATE change
    /// the set (persisted with this entry's index) and answer with the alarm
    /// changed, if any.
    fn apply_alarm(&self, req: &AlarmRequest, index: u64) -> AlarmResponse {
        let mut resp = AlarmResponse::default();
        let changed = match AlarmAction::try_from(req.action) {
            Ok(AlarmAction::Get) => {
                resp.alarms = self.alarms.get(req.alarm);
                None
            }
            Ok(AlarmAction::Activate) => self
                .alarms
                .activate(req.member_id, req.alarm)
                .map(|m| (m, true)),
            Ok(AlarmAction::Deactivate) => self
                .alarms
                .deactivate(req.member_id, req.alarm)
                .map(|m| (m, false)),
            Err(_) => None,
        };
        match changed {
            Some((member, raised)) => {
                let name = AlarmType::try_from(member.alarm)
                    .map(|a| a.as_str_name())
                    .unwrap_or("UNKNOWN");
                if raised {
                    tracing::warn!(alarm = name, "from" = %format!("{:x}", member.member_id), "alarm raised");
                } else {
                    tracing::info!(alarm = name, "from" = %format!("{:x}", member.member_id), "alarm disarmed");
                }
                self.store.put_side(
                    SideTable::Alarms,
                    schema::alarms::record_key(member.member_id, member.alarm),
                    raised.then(|| schema::alarms::encode(member.member_id, member.alarm)),
                    index,
                );
                resp.alarms.push(member);
            }
            None => self.store.set_consistent_index(index),
        }
        resp
    }

    fn apply_put(&self, put: &PutRequest, index: u64) -> Result<PutResponse, ApplyError> {
        self.write(index, |w| w.put(put))
    }

    fn apply_txn(&self, txn: &TxnRequest, index: u64) -> Result<TxnResponse, ApplyError> {
        self.write(index, |w| w.txn(txn))
    }

    /// One write transaction; its events attach and detach leased keys. A
    /// backend failure under it publishes nothing (the dropped transaction
    /// rolls back) and halts apply.
    fn write<T>(
        &self,
        index: u64,
        op: impl FnOnce(&mut TxnWrite<'_>) -> Result<T, mvcc::MvccError>,
    ) -> Result<T, ApplyError> {
        let mut w = self.store.write(index);
        let result = op(&mut w);
        if let Err(e) = &result {
            if backend_failed(e) {
                drop(w);
                return Err(ApplyError::Halt(format!(
                    "the backend failed under it: {e}"
                )));
            }
        }
        let written = w.end();
        self.lessor.on_events(&written.events);
        result.map_err(ApplyError::from)
    }

    fn apply_lease_grant(
        &self,
        req: &LeaseGrantRequest,
        index: u64,
    ) -> Result<LeaseGrantResponse, ApplyError> {
        match self.lessor.grant(req.id, req.ttl, Instant::now()) {
            Ok((ttl, record)) => {
                self.metrics.ops.lease_granted.inc();
                self.store
                    .put_side(SideTable::Leases, req.id as u64, Some(record), index);
                Ok(LeaseGrantResponse {
                    header: None,
                    id: req.id,
                    ttl,
                    error: String::new(),
                })
            }
            Err(e) => {
                self.store.set_consistent_index(index);
                Err(e.into())
            }
        }
    }

    /// Deletes every key of the lease in one revision (in key order, as
    /// etcd) and the lease record in the same batch.
    fn apply_lease_revoke(
        &self,
        req: &LeaseRevokeRequest,
        index: u64,
    ) -> Result<LeaseRevokeResponse, ApplyError> {
        let Some(keys) = self.lessor.keys_to_revoke(req.id) else {
            self.store.set_consistent_index(index);
            return Err(rpctypes::LEASE_NOT_FOUND.into());
        };
        let mut w = self.store.write(index);
        for key in keys {
            let deleted = w.delete_range(&DeleteRangeRequest {
                key,
                ..Default::default()
            });
            if let Err(e) = deleted {
                // Only a backend failure gets here; the dropped transaction
                // publishes nothing.
                drop(w);
                return Err(ApplyError::Halt(format!(
                    "the backend failed under it: {e}"
                )));
            }
        }
        self.store
            .stage_side(SideTable::Leases, req.id as u64, None);
        let written = w.end();
        self.lessor.remove(req.id);
        self.lessor.on_events(&written.events);
        self.metrics.ops.lease_revoked.inc();
        Ok(LeaseRevokeResponse {
            header: Some(ResponseHeader {
                revision: written.revision,
                ..Default::default()
            }),
        })
    }

    fn apply_lease_checkpoint(&self, req: &LeaseCheckpointRequest, index: u64) {
        let records = self.lessor.checkpoint(&req.checkpoints, Instant::now());
        for (id, record) in records {
            self.store
                .put_side(SideTable::Leases, id as u64, Some(record), index);
        }
        self.store.set_consistent_index(index);
    }

    fn apply_compaction(
        &self,
        req: &CompactionRequest,
        index: u64,
    ) -> Result<CompactionResponse, ApplyError> {
        let result = self.store.compact(req.revision, index);
        if let Err(e) = &result {
            if backend_failed(e) {
                return Err(ApplyError::Halt(format!(
                    "the backend failed under it: {e}"
                )));
            }
            self.store.set_consistent_index(index);
        }
        result.map_err(ApplyError::from)?;
        let header = ResponseHeader {
            revision: self.store.current_revision(),
            ..Default::default()
        };
        Ok(CompactionResponse {
            header: Some(header),
        })
    }
}

/// The kind of request an entry carries, for etcd_server_apply_duration_seconds.
fn apply_op(request: &InternalRaftRequest) -> ApplyOp {
    if request.put.is_some() {
        ApplyOp::Put
    } else if request.txn.is_some() {
        ApplyOp::Txn
    } else if request.delete_range.is_some() {
        ApplyOp::DeleteRange
    } else if request.lease_grant.is_some() {
        ApplyOp::LeaseGrant
    } else if request.lease_revoke.is_some() {
        ApplyOp::LeaseRevoke
    } else if request.lease_checkpoint.is_some() {
        ApplyOp::LeaseCheckpoint
    } else if request.compaction.is_some() {
        ApplyOp::Compaction
    } else if request.alarm.is_some() {
        ApplyOp::Alarm
    } else if request.cluster_member_attr_set.is_some() {
        ApplyOp::ClusterMemberAttrSet
    } else {
        ApplyOp::Other
    }
}
