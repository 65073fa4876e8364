//! The apply loop: committed raft entries, in index order, go through the
//! [`machine::StateMachine`]; the proposer's waiter is woken by request ID.
//! The requests an entry can carry are listed once, in [`request`].
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
use std::time::Duration;

use api::rpctypes::EtcdError;
use consensus::{CommittedBatch, Fatal, RaftHandle};
use raft::eraftpb::{Entry, EntryType};
use tokio::sync::{mpsc, watch};

use crate::wait::Wait;

#[cfg(test)]
mod auth_tests;
pub(crate) mod machine;
pub mod request;
#[cfg(test)]
mod tests;

pub use machine::StateMachine;
pub use request::{ApplyResponse, Proposal, Request};

/// etcd's backend batch limits: commit at least every 100 ms or 10k ops.
pub(crate) const BACKEND_BATCH_INTERVAL: Duration = Duration::from_millis(100);
pub(crate) const BACKEND_BATCH_LIMIT: usize = 10_000;

/// When apply commits the backend (etcd's `--backend-batch-interval` and
/// `--backend-batch-limit`): every `interval`, or once `limit` operations
/// are pending, whichever comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendBatch {
    pub interval: Duration,
    pub limit: usize,
}

impl BackendBatch {
    /// etcd's rule: a zero interval or limit takes the default.
    pub fn new(interval: Duration, limit: usize) -> BackendBatch {
        BackendBatch {
            interval: if interval.is_zero() {
                BACKEND_BATCH_INTERVAL
            } else {
                interval
            },
            limit: if limit == 0 {
                BACKEND_BATCH_LIMIT
            } else {
                limit
            },
        }
    }
}

impl Default for BackendBatch {
    fn default() -> BackendBatch {
        BackendBatch::new(Duration::ZERO, 0)
    }
}
/// The largest batch applied inline on the raft thread: more entries would
/// hold up its next Ready (heartbeats, the next fdatasync) for too long.
pub(crate) const INLINE_APPLY_MAX_ENTRIES: usize = 16;

pub type ApplyOutcome = Result<ApplyResponse, EtcdError>;

/// What a conf change's proposer learns once it applied: the members then.
pub type ConfChangeOutcome = Vec<crate::membership::Member>;

struct Applier {
    pub(crate) machine: StateMachine,
    pub(crate) raft: RaftHandle,
    pub(crate) wait: Arc<Wait<ApplyOutcome>>,
    pub(crate) conf_wait: Arc<Wait<ConfChangeOutcome>>,
    pub(crate) applied: watch::Sender<u64>,
    pub(crate) snapshot_count: u64,
    pub(crate) backend_batch: BackendBatch,
    /// Consistent index of the last raft snapshot asked for.
    pub(crate) last_snapshot: std::sync::atomic::AtomicU64,
    /// Held while a batch is applied or the backend committed: by the apply
    /// thread, or by the raft thread applying inline (see consensus's
    /// "Inline apply").
    pub(crate) busy: parking_lot::Mutex<()>,
    /// Raised (and apply halted for good) when an entry cannot be applied.
    pub(crate) fatal: Arc<Fatal>,
    pub(crate) halted: std::sync::atomic::AtomicBool,
}

/// The apply thread, and the proposal waiters and applied index it feeds.
pub struct ApplyLoop {
    pub thread: std::thread::JoinHandle<()>,
    pub wait: Arc<Wait<ApplyOutcome>>,
    pub conf_wait: Arc<Wait<ConfChangeOutcome>>,
    pub applied: watch::Receiver<u64>,
}

/// Starts the apply thread for `machine`, fed by raft's committed batches,
/// and offers raft to apply small batches inline (see consensus's "Inline
/// apply"); a raft snapshot is asked for every `snapshot_count` entries,
/// the backend committed as `backend_batch` says.
pub fn start(
    machine: StateMachine,
    raft: &RaftHandle,
    snapshot_count: u64,
    backend_batch: BackendBatch,
    committed: mpsc::Receiver<CommittedBatch>,
) -> std::io::Result<ApplyLoop> {
    let wait = Arc::new(Wait::default());
    let conf_wait = Arc::new(Wait::default());
    let (applied_tx, applied) = watch::channel(machine.store.consistent_index());
    let last_snapshot = machine.store.consistent_index().into();
    let applier = Arc::new(Applier {
        machine,
        raft: raft.clone(),
        wait: wait.clone(),
        conf_wait: conf_wait.clone(),
        applied: applied_tx,
        snapshot_count: snapshot_count.max(1),
        backend_batch,
        last_snapshot,
        busy: parking_lot::Mutex::new(()),
        fatal: raft.fatal(),
        halted: false.into(),
    });
    // Weak: the apply thread owns the applier (which holds the raft handle);
    // the hook must not keep it, and the store in it, alive past shutdown.
    let inline = Arc::downgrade(&applier);
    raft.set_inline_apply(Box::new(move |batch| match inline.upgrade() {
        Some(applier) => applier.try_apply_inline(batch),
        None => Err(batch),
    }));
    let fatal = raft.fatal();
    let thread = std::thread::Builder::new()
        .name("apply".into())
        .stack_size(api::codec::REQUEST_THREAD_STACK_BYTES)
        .spawn(move || fatal.run_thread("apply", move || applier.run(committed)))?;
    Ok(ApplyLoop {
        thread,
        wait,
        conf_wait,
        applied,
    })
}

/// Apply stopped at an entry it cannot carry out; the member's [`Fatal`]
/// holds the cause.
#[derive(Debug)]
pub struct Halted;

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
        if snapshot_due
            || self.machine.store.pending_ops() + batch.entries.len() >= self.backend_batch.limit
        {
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
        self.conf_wait.close();
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
        if self.machine.store.pending_ops() >= self.backend_batch.limit {
            self.commit(false)?;
        }
        let applied = *self.applied.borrow();
        if applied >= self.last_snapshot.load(Relaxed) + self.snapshot_count {
            tracing::info!(
                "local-member-id" = %format!("{:x}", self.raft.status().id),
                "local-member-applied-index" = applied,
                "local-member-snapshot-index" = self.last_snapshot.load(Relaxed),
                "local-member-snapshot-count" = self.snapshot_count,
                "triggering snapshot"
            );
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
            let mut ticker = tokio::time::interval(self.backend_batch.interval);
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
                        if self.machine.store.pending_ops() > 0 && self.commit(false).is_err() {
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
        let closed = if self.is_halted() {
            self.machine.store.commit(true)
        } else {
            // with the key index, which the next start reads instead of
            // every record
            let leased = self.machine.lessor.leased_keys();
            self.machine.store.close(&leased)
        };
        if let Err(e) = closed {
            tracing::warn!(error = %e, "final backend commit failed");
        }
    }

    /// Commits the backend. Ok(false): deferred by a defragmentation that is
    /// copying the file (the batch stays in memory and goes to the new file
    /// after the swap; no snapshot, which would release WAL, until then),
    /// or, without fsync, by a durable commit's sync under way (the next
    /// commit carries the batch; writes do not wait for the sync).
    /// A failed commit halts apply (etcd: "failed to commit tx"); the WAL
    /// still holds every entry, so stopping loses nothing.
    fn commit(&self, durable: bool) -> Result<bool, Halted> {
        let store = &self.machine.store;
        let committed = if durable {
            store.commit(true)
        } else {
            store.commit_or_defer()
        };
        match committed {
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
        // Entries cross from the raft thread in index order, contiguous and
        // right after what was applied (a restart replays from the durable
        // index, below it): anything else would apply a gap.
        let applied = *self.applied.borrow();
        for pair in batch.entries.windows(2) {
            assert_eq!(
                pair[1].index,
                pair[0].index + 1,
                "committed entries are contiguous"
            );
        }
        if let Some(first) = batch.entries.first() {
            assert!(
                first.index <= applied.max(self.machine.store.consistent_index()) + 1,
                "committed entry {} after applied index {applied}: a gap",
                first.index
            );
        }
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
        let _in_progress = self.machine.metrics.ops.snapshot_apply_started();
        crate::fail_point!("raftBeforeApplySnap");
        if let Err(e) = self.machine.store.restore_from(&path) {
            return Err(failed("install the database snapshot", &e));
        }
        self.machine.recover().map_err(|e| {
            failed(
                "rebuild leases, alarms and members from the database snapshot",
                &e,
            )
        })?;
        // The leader's backend is ours now; nothing is reported applied yet.
        crate::fail_point!("raftAfterApplySnap");
        let applied = self.machine.store.consistent_index().max(index);
        tracing::info!(
            index,
            "consistent-index" = self.machine.store.consistent_index(),
            "applied database snapshot"
        );
        let _ = std::fs::remove_file(&path);
        self.applied.send_replace(applied);
        self.raft.report_applied(applied);
        Ok(())
    }

    /// A membership change raft's configuration took: the member list
    /// follows, and its proposer learns the members after it.
    fn apply_conf_change_entry(&self, entry: &Entry) -> Result<(), Halted> {
        use protobuf::Message as _;
        let cc = match raft::eraftpb::ConfChange::parse_from_bytes(&entry.data) {
            Ok(cc) => cc,
            Err(e) => {
                return Err(self.halt(format!(
                    "cannot decode the committed conf change at index {} (term {}): {e}",
                    entry.index, entry.term
                )))
            }
        };
        match self.machine.apply_conf_change(entry.index, &cc) {
            Ok(Some(members)) => {
                self.wait_conf_trigger(cc.id, members);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(cause) => Err(self.halt(format!(
                "cannot apply the committed conf change at index {} (term {}): {cause}",
                entry.index, entry.term
            ))),
        }
    }

    fn wait_conf_trigger(&self, id: u64, members: ConfChangeOutcome) {
        if id != 0 {
            self.conf_wait.trigger(id, members);
        }
    }

    fn apply_entry(&self, entry: &Entry) -> Result<(), Halted> {
        if entry.get_entry_type() == EntryType::EntryConfChange {
            return self.apply_conf_change_entry(entry);
        }
        let request = if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
            None
        } else {
            let decoded = api::codec::decode_internal_raft_request(entry.data.as_ref())
                .map_err(|e| e.to_string())
                .and_then(|raft_request| {
                    // A request this member does not know (a newer member
                    // proposed it, or the entry is damaged): etcd panics
                    // ("not implemented apply"). Skipping it would let
                    // members diverge.
                    Request::from_entry(raft_request)
                        .ok_or_else(|| "it carries no request this member can apply".to_string())
                });
            match decoded {
                Ok(request) => Some(request),
                Err(e) => {
                    return Err(self.halt(format!(
                        "cannot decode the committed entry at index {} (term {}): {e}",
                        entry.index, entry.term
                    )))
                }
            }
        };
        let (id, request) = match request {
            Some((id, user, request)) => (Some(id), Some((user, request))),
            None => (None, None),
        };
        match self
            .machine
            .apply_logged(entry.index, request, entry.data.as_ref())
        {
            Ok(Some(outcome)) => {
                if let Some(id) = id {
                    self.wait.trigger(id, outcome);
                }
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(cause) => Err(self.halt(format!(
                "cannot apply the committed entry at index {} (term {}): {cause}",
                entry.index, entry.term
            ))),
        }
    }
}
