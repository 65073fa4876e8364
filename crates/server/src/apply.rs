//! The apply loop: committed raft entries, in index order, become mvcc
//! changes; the proposer's waiter is woken by request ID.
//!
//! Invariants: an entry at or below the store's consistent index was applied
//! before (a restart replays the WAL above the durable consistent index), so
//! it is skipped: apply is idempotent by index. The backend commits in
//! batches without fsync; a snapshot (which lets raft release WAL) is taken
//! only right after a durable commit that covers it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::{
    alarm_request::AlarmAction, AlarmRequest, AlarmResponse, AlarmType, CompactionRequest,
    CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, InternalRaftRequest,
    LeaseCheckpointRequest, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, PutRequest, PutResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use api::rpctypes::{self, EtcdError};
use consensus::{CommittedBatch, RaftHandle};
use mvcc::{SideTable, Store, TxnWrite};
use prost::Message;
use raft::eraftpb::{Entry, EntryType};
use tokio::sync::{mpsc, watch};

use crate::alarms::{self, Alarms, Restriction};
use crate::errors;
use crate::lease::Lessor;
use crate::membership::{encode_member, ClusterMembers};
use crate::metrics::ops::ApplyOp;
use crate::wait::Wait;

/// etcd's backend batch limits: commit at least every 100 ms or 10k ops.
pub const BACKEND_BATCH_INTERVAL: Duration = Duration::from_millis(100);
pub const BACKEND_BATCH_LIMIT: usize = 10_000;
/// The largest batch applied inline on the raft thread: more entries would
/// hold up its next Ready (heartbeats, the next fdatasync) for too long.
pub const INLINE_APPLY_MAX_ENTRIES: usize = 16;

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
        self.apply_batch(batch);
        Ok(())
    }

    /// Applies one batch from the channel, then commits the backend or asks
    /// for a raft snapshot when due.
    fn process(&self, batch: CommittedBatch) {
        use std::sync::atomic::Ordering::Relaxed;
        let _busy = self.busy.lock();
        self.apply_batch(batch);
        if self.store.pending_ops() >= BACKEND_BATCH_LIMIT {
            self.commit(false);
        }
        let applied = *self.applied.borrow();
        if applied >= self.last_snapshot.load(Relaxed) + self.snapshot_count {
            // Durable first: raft may release WAL up to `applied`.
            if self.commit(true) {
                self.raft.snapshot(applied);
                self.last_snapshot.store(applied, Relaxed);
            }
        }
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
                        self.process(batch);
                        self.raft.batch_applied();
                    }
                    _ = ticker.tick() => {
                        let _busy = self.busy.lock();
                        if self.store.pending_ops() > 0 {
                            self.commit(false);
                        }
                    }
                }
            }
        });
        let _busy = self.busy.lock();
        self.commit(true);
    }

    fn commit(&self, durable: bool) -> bool {
        match self.store.commit(durable) {
            Ok(()) => true,
            // A defragmentation is copying the file: the batch stays in
            // memory and goes to the new file after the swap; no snapshot
            // (which would release WAL) until then.
            Err(mvcc::MvccError::Deferred) => false,
            Err(e) => {
                // Without its backend the member cannot make progress; the WAL
                // still holds every entry, so stopping loses nothing.
                tracing::error!(error = %e, "failed to commit the backend");
                false
            }
        }
    }

    fn apply_batch(&self, batch: CommittedBatch) {
        if let Some(snapshot) = &batch.snapshot {
            self.install_snapshot(snapshot);
        }
        let mut last = None;
        for entry in &batch.entries {
            self.apply_entry(entry);
            last = Some(entry.index);
        }
        if let Some(index) = last {
            self.applied.send_replace(index);
            self.raft.report_applied(index);
        }
    }

    /// A snapshot from the leader: its backend replaces ours (the leader's
    /// copy covers at least the snapshot's index), then apply goes on from
    /// there. The WAL and snap dir already hold its raft metadata.
    fn install_snapshot(&self, snapshot: &raft::eraftpb::Snapshot) {
        let index = snapshot.get_metadata().index;
        let path =
            std::path::PathBuf::from(String::from_utf8_lossy(snapshot.get_data()).into_owned());
        if let Err(e) = self.store.restore_from(&path) {
            // The member cannot go on without the state the snapshot holds,
            // and raft already moved past it: stop the process. The raft
            // metadata is durable and the leader sends a new snapshot after
            // the restart.
            tracing::error!(index, file = %path.display(), error = %e, "failed to install the database snapshot; exiting");
            std::process::exit(1);
        }
        self.members.replace(
            self.store
                .members()
                .unwrap_or_default()
                .values()
                .filter_map(|b| crate::membership::decode_member(b))
                .collect(),
        );
        if let Err(e) = crate::startup::recover_alarms(&self.alarms, &self.store) {
            tracing::error!(index, error = %e, "failed to rebuild alarms from the database snapshot; exiting");
            std::process::exit(1);
        }
        if let Err(e) = crate::startup::recover_lessor(&self.lessor, &self.store) {
            tracing::error!(index, error = %e, "failed to rebuild leases from the database snapshot; exiting");
            std::process::exit(1);
        }
        let applied = self.store.consistent_index().max(index);
        tracing::info!(
            index,
            "consistent-index" = self.store.consistent_index(),
            "applied database snapshot"
        );
        let _ = std::fs::remove_file(&path);
        self.applied.send_replace(applied);
        self.raft.report_applied(applied);
    }

    fn apply_entry(&self, entry: &Entry) {
        if entry.index <= self.store.consistent_index() {
            return;
        }
        if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
            self.store.set_consistent_index(entry.index);
            return;
        }
        let request = match InternalRaftRequest::decode(entry.data.as_ref()) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(index = entry.index, error = %e, "cannot decode a committed entry; skipping it");
                self.store.set_consistent_index(entry.index);
                return;
            }
        };
        let id = request.header.as_ref().map(|h| h.id).unwrap_or(request.id);
        let op = apply_op(&request);
        let started = std::time::Instant::now();
        let outcome = self.apply_request(request, entry.index);
        self.metrics.ops.applied(op, outcome.is_ok(), started);
        self.wait.trigger(id, outcome);
    }

    fn apply_request(&self, request: InternalRaftRequest, index: u64) -> ApplyOutcome {
        if let Err(e) = self.check_alarms(&request) {
            self.store.set_consistent_index(index);
            return Err(e);
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
                        .put_member(member.id, Some(encode_member(&member)), index)
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
        // Requests of services not built yet are never proposed; record the
        // index so that replay stays idempotent.
        self.store.set_consistent_index(index);
        Err(rpctypes::NOT_CAPABLE)
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
                    alarms::record_key(member.member_id, member.alarm),
                    raised.then(|| alarms::encode(member.member_id, member.alarm)),
                    index,
                );
                resp.alarms.push(member);
            }
            None => self.store.set_consistent_index(index),
        }
        resp
    }

    fn apply_put(&self, put: &PutRequest, index: u64) -> Result<PutResponse, EtcdError> {
        self.write(index, |w| w.put(put))
    }

    fn apply_txn(&self, txn: &TxnRequest, index: u64) -> Result<TxnResponse, EtcdError> {
        self.write(index, |w| w.txn(txn))
    }

    /// One write transaction; its events attach and detach leased keys.
    fn write<T>(
        &self,
        index: u64,
        op: impl FnOnce(&mut TxnWrite<'_>) -> Result<T, mvcc::MvccError>,
    ) -> Result<T, EtcdError> {
        let mut w = self.store.write(index);
        let result = op(&mut w);
        let written = w.end();
        self.lessor.on_events(&written.events);
        result.map_err(|e| errors::from_mvcc(&e))
    }

    fn apply_lease_grant(
        &self,
        req: &LeaseGrantRequest,
        index: u64,
    ) -> Result<LeaseGrantResponse, EtcdError> {
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
                Err(e)
            }
        }
    }

    /// Deletes every key of the lease in one revision (in key order, as
    /// etcd) and the lease record in the same batch.
    fn apply_lease_revoke(
        &self,
        req: &LeaseRevokeRequest,
        index: u64,
    ) -> Result<LeaseRevokeResponse, EtcdError> {
        let Some(keys) = self.lessor.keys_to_revoke(req.id) else {
            self.store.set_consistent_index(index);
            return Err(rpctypes::LEASE_NOT_FOUND);
        };
        let mut w = self.store.write(index);
        for key in keys {
            let deleted = w.delete_range(&DeleteRangeRequest {
                key,
                ..Default::default()
            });
            if let Err(e) = deleted {
                // Only a backend failure gets here; nothing was published.
                drop(w);
                self.store.set_consistent_index(index);
                return Err(errors::from_mvcc(&e));
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
    ) -> Result<CompactionResponse, EtcdError> {
        let result = self.store.compact(req.revision, index);
        if result.is_err() {
            self.store.set_consistent_index(index);
        }
        result.map_err(|e| errors::from_mvcc(&e))?;
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
