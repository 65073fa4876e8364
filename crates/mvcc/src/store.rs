//! The store: key index + pending batch + redb file, and the read path.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use api::etcdserverpb::{RangeRequest, RangeResponse, TxnRequest, TxnResponse};
use api::mvccpb::KeyValue;
use bytes::Bytes;
use parking_lot::{Mutex, RwLock, RwLockUpgradableReadGuard};
use prost::Message;
use redb::{Database, ReadOnlyTable, ReadTransaction, ReadableDatabase};

use crate::backend::{self, backend_error, Batch, SideTable, KEY_TABLE};
use crate::key_index::{KeyIndexTree, RangeEnd};
use crate::parts::ReadParts;
use crate::range;
use crate::revision::{Revision, RevisionKey};
use crate::txn::TxnWrite;
use crate::MvccError;

/// etcd starts a fresh store at revision 1, so the first write is revision 2.
pub(crate) const INITIAL_REVISION: i64 = 1;
/// Compaction revision before any compaction: every revision is readable and
/// `compact(0)` is accepted, as etcd's initial compactMainRev of -1.
pub(crate) const NO_COMPACTION: i64 = -1;

/// Index and revision window, changed together under one lock so that a reader
/// never walks an index compacted past the revision it validated.
pub(crate) struct IndexState {
    pub tree: KeyIndexTree,
    pub current_revision: i64,
    pub compact_revision: i64,
}

/// Applied but not yet committed to redb.
#[derive(Default)]
pub(crate) struct Pending {
    /// revision → (is_tombstone, encoded KeyValue)
    pub records: BTreeMap<Revision, (bool, Bytes)>,
    /// Records dropped by compaction, deleted at the next commit.
    pub deletions: Vec<RevisionKey>,
    /// A compaction to record as scheduled (etcd's scheduledCompactRev).
    pub compact_revision: Option<i64>,
    /// A compaction whose last deletions are in `deletions`
    /// (finishedCompactRev).
    pub finished_compact_revision: Option<i64>,
    /// Side-table records changed since the last commit (None: removed).
    pub side: BTreeMap<(SideTable, u64), Option<Vec<u8>>>,
    pub consistent_index: u64,
    /// The consistent index (or anything else) differs from the file.
    pub dirty: bool,
}

/// An etcd v3 MVCC key-value store over one redb file. Readers on any thread;
/// writes (`write`, `compact`, `commit`, `set_consistent_index`) from one
/// thread, serialized by an internal writer lock.
pub struct Store {
    /// The redb file. Swapped (under the writer and pending locks) only by a
    /// defragmentation; take it with [`Store::db`] at the moment a read
    /// transaction begins, after an overlay miss.
    db: RwLock<Arc<Database>>,
    path: PathBuf,
    pub(crate) state: RwLock<IndexState>,
    pub(crate) pending: RwLock<Pending>,
    pub(crate) writer: Mutex<()>,
    pub(crate) consistent_index: AtomicU64,
    pub(crate) durable_consistent_index: AtomicU64,
    pub(crate) size_in_use: backend::InUseBytes,
    /// The file's size, read after every commit, defragmentation and
    /// install (the only times it changes), so that asking for it (the
    /// quota check before every write) costs no system call.
    file_size: AtomicI64,

    /// Whether a lease exists, asked before a put that names one (the lessor
    /// lives above mvcc). None: every lease is taken as existing.
    pub(crate) lease_lookup: RwLock<Option<LeaseLookup>>,
    /// Watchers, notified by `TxnWrite::end` (see [`crate::watch`]).
    pub(crate) watch: crate::watch::WatchHub,
    /// Told how long each backend commit took (metrics live above mvcc).
    commit_observer: std::sync::OnceLock<CommitObserver>,
    pub(crate) compaction_observer: std::sync::OnceLock<Arc<dyn crate::CompactionObserver>>,
    /// When the compaction whose deletions the next commit carries began.
    pub(crate) compacting_since: Mutex<Option<std::time::Instant>>,
    /// Read transactions open on the file (range reads, hashes, watch
    /// catch-up).
    pub(crate) open_reads: crate::stats::OpenReads,
    corruption_observer: std::sync::OnceLock<CorruptionObserver>,
    /// Set while a defragmentation copies the file: commits are deferred.
    pub(crate) defragmenting: AtomicBool,
    /// Set by [`Store::close`] once the file holds a key index checkpoint:
    /// the next commit deletes it first (see [`crate::index_checkpoint`]).
    pub(crate) index_saved: AtomicBool,
    /// Opened without redb's page check, not yet made up by
    /// [`Store::check_deferred`].
    pub(crate) check_deferred: AtomicBool,
    /// Serializes defragmentation with backups and snapshot installs.
    pub(crate) defrag_lock: Mutex<()>,
    /// Leased live keys found by the last load, until the lessor takes them.
    pub(crate) loaded_leased_keys: Mutex<Vec<(Bytes, i64)>>,
    pub(crate) ops: crate::stats::OpCounters,
    /// HashKV at each of the last compactions' revisions, computed as it
    /// stood before the compaction (etcd's hashStorage; see `hash`).
    pub(crate) compaction_hashes: Arc<crate::hash::CompactionHashes>,
    /// Compactions whose records are still being deleted (lock order:
    /// writer, then this, then pending).
    pub(crate) compaction_backlog: Mutex<crate::compaction::Backlog>,
    /// The finished compaction revision in the file.
    pub(crate) finished_compact: AtomicI64,
    /// A batch commit wrote pages not yet fsynced (see `flush`).
    pub(crate) unflushed: AtomicBool,
    /// A commit without fsync went in since the last durable one.
    pub(crate) not_durable: AtomicBool,
    /// Held by a durable commit throughout (see [`Store::commit`]); a
    /// plain [`Store::commit`] waits for it.
    sync_lock: Mutex<()>,
    /// A durable commit's sync is under way outside the writer lock: other
    /// commits under the writer lock are deferred until it is done.
    pub(crate) syncing: AtomicBool,
    /// Runs as a durable commit's sync begins (tests: the sync held open).
    #[cfg(test)]
    pub(crate) before_sync: Mutex<Option<Box<dyn Fn() + Send>>>,
}

/// What [`Store::commit_as`] writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CommitKind {
    /// without fsync
    Batch,
    /// with fsync, under the writer lock throughout
    Durable,
    /// without fsync, as the first step of a durable commit: writes the
    /// consistent index too when only that is not yet durable
    Staged,
}

/// Receives the duration of every backend commit that wrote something
/// (etcd's etcd_disk_backend_commit_duration_seconds; a durable commit's
/// two steps count as one). Called by the committing thread: it must be
/// cheap and must not block.
pub type CommitObserver = std::sync::Arc<dyn Fn(std::time::Duration) + Send + Sync>;

/// The lessor's answer to "does lease N exist?".
pub type LeaseLookup = std::sync::Arc<dyn Fn(i64) -> bool + Send + Sync>;

/// From this many keys on, a dropped store's key index is freed on a thread
/// of its own.
const FREE_APART_KEYS: usize = 100_000;

impl Drop for Store {
    /// The file closes here (redb's last commit), and a large key index is
    /// freed on a thread of its own: a member that stops exits once its file
    /// is closed, without waiting for the index's allocations to be given
    /// back one by one (524,288 keys: ~70 ms, a fifth of a stop).
    fn drop(&mut self) {
        let tree = std::mem::take(&mut self.state.get_mut().tree);
        if tree.len() >= FREE_APART_KEYS {
            // on a failed spawn the closure, and the index with it, is
            // dropped here
            let _ = std::thread::Builder::new()
                .name("index-free".into())
                .spawn(move || drop(tree));
        }
    }
}

impl Store {
    /// Creates or opens the file and rebuilds the key index from it, every
    /// page of it checked first.
    pub fn open(path: &Path) -> Result<Store, MvccError> {
        Store::open_with(path, false)
    }

    /// [`Store::open`] for a member: the file a clean stop left opens
    /// without redb's check of every page, which [`Store::check_deferred`]
    /// then makes while the member serves (see [`crate::deferred_check`]).
    pub fn open_deferring_check(path: &Path) -> Result<Store, MvccError> {
        Store::open_with(path, true)
    }

    fn open_with(path: &Path, defer_check: bool) -> Result<Store, MvccError> {
        crate::defrag::remove_leftover(path);
        crate::snapshot::remove_leftover(path);
        let (db, loaded, deferred) = backend::without_panics(path, || {
            // a clean stop's checkpoint: no scan
            if let Some(loaded) = crate::index_checkpoint::load(path)? {
                tracing::info!(
                    keys = loaded.index.len(),
                    "read the key index checkpoint of a clean stop"
                );
                let deferred = defer_check && crate::deferred_check::begin(path);
                let db = backend::open_database_with(path, !deferred)?;
                return Ok((db, loaded, deferred));
            }
            let db = backend::open_database(path)?;
            let loaded = backend::load(&db)?;
            Ok((db, loaded, false))
        })?;
        if !deferred {
            // every page checked (and, without a checkpoint, every record)
            crate::deferred_check::done(path);
        }
        let compact_revision = loaded.compact_revision.max(NO_COMPACTION);
        let scheduled = loaded.scheduled_compact_revision;
        let size = stored_size(path).map_or(0, |(_, stored)| stored);
        let store = Store {
            db: RwLock::new(Arc::new(db)),
            defragmenting: AtomicBool::new(false),
            index_saved: AtomicBool::new(false),
            check_deferred: AtomicBool::new(deferred),
            defrag_lock: Mutex::new(()),
            compaction_hashes: Arc::default(),
            compaction_backlog: Mutex::default(),
            finished_compact: AtomicI64::new(compact_revision),
            unflushed: AtomicBool::new(false),
            not_durable: AtomicBool::new(false),
            sync_lock: Mutex::new(()),
            syncing: AtomicBool::new(false),
            #[cfg(test)]
            before_sync: Mutex::new(None),
            path: path.to_path_buf(),
            state: RwLock::new(IndexState {
                tree: loaded.index,
                current_revision: loaded.current_revision.max(INITIAL_REVISION),
                compact_revision,
            }),
            pending: RwLock::new(Pending {
                consistent_index: loaded.consistent_index,
                ..Pending::default()
            }),
            writer: Mutex::new(()),
            consistent_index: AtomicU64::new(loaded.consistent_index),
            durable_consistent_index: AtomicU64::new(loaded.consistent_index),
            size_in_use: backend::InUseBytes::new(size),
            file_size: AtomicI64::new(size),
            commit_observer: std::sync::OnceLock::new(),
            compaction_observer: std::sync::OnceLock::new(),
            compacting_since: Mutex::new(None),
            open_reads: Default::default(),
            corruption_observer: std::sync::OnceLock::new(),
            lease_lookup: RwLock::new(None),
            loaded_leased_keys: Mutex::new(loaded.leased_keys),
            ops: Default::default(),
            watch: crate::watch::WatchHub::default(),
        };
        if let Some(revision) = scheduled {
            // etcd's restore: "resume scheduled compaction"
            {
                let _writer = store.writer.lock();
                store.compact_locked_hashing(revision, false)?;
            }
            store.commit(true)?;
            tracing::info!(
                "scheduled-compact-revision" = revision,
                "resume scheduled compaction"
            );
        }
        Ok(store)
    }

    /// The current redb file handle.
    pub(crate) fn db(&self) -> Arc<Database> {
        self.db.read().clone()
    }

    /// Replaces the file handle (defragmentation); the caller holds the
    /// writer and pending locks, and drops the old handle after releasing
    /// them (closing a redb file writes its allocator state: not under locks).
    pub(crate) fn swap_db(&self, db: Database) -> Arc<Database> {
        std::mem::replace(&mut *self.db.write(), Arc::new(db))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Last raft index recorded, committed or not.
    pub fn consistent_index(&self) -> u64 {
        self.consistent_index.load(Ordering::Acquire)
    }

    /// Raft index covered by the last `Durability::Immediate` commit (or what
    /// the file held when opened). WAL entries up to it may be released.
    pub fn durable_consistent_index(&self) -> u64 {
        self.durable_consistent_index.load(Ordering::Acquire)
    }

    /// Records the index of a raft entry that changes no key.
    pub fn set_consistent_index(&self, index: u64) {
        let _writer = self.writer.lock();
        self.record_consistent_index(index);
    }

    pub(crate) fn record_consistent_index(&self, index: u64) {
        let mut pending = self.pending.write();
        if pending.consistent_index != index {
            pending.consistent_index = index;
            pending.dirty = true;
        }
        self.consistent_index.store(index, Ordering::Release);
    }

    pub fn current_revision(&self) -> i64 {
        self.state.read().current_revision
    }

    /// The finished compaction revision, 0 if none.
    pub fn compact_revision(&self) -> i64 {
        self.state.read().compact_revision.max(0)
    }

    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        self.ops.range();
        let fetch_limit = range::fetch_limit(req);
        let (revisions, count, read_revision, current) = {
            let state = self.state.read();
            let current = state.current_revision;
            let read_revision =
                range::resolve_revision(req.revision, current, state.compact_revision)?;
            let (revisions, count) = state.tree.revisions(
                &req.key,
                RangeEnd::from_request(&req.range_end),
                read_revision,
                fetch_limit,
                req.count_only,
            );
            (revisions, count, read_revision, current)
        };
        let kvs = ValueReader::new(self).get_many(&revisions, read_revision, |_| None)?;
        Ok(range::finish(req, kvs, count, current))
    }

    /// Installs the lessor's lookup: puts (plain or in the chosen branch of
    /// a txn) naming an unknown lease then fail with `LeaseNotFound` and
    /// change nothing.
    pub fn set_lease_lookup(&self, lookup: LeaseLookup) {
        *self.lease_lookup.write() = Some(lookup);
    }

    pub(crate) fn lease_exists(&self, lease: i64) -> bool {
        lease == 0
            || self
                .lease_lookup
                .read()
                .as_ref()
                .is_none_or(|lookup| lookup(lease))
    }

    /// Records a cluster member (or removes it with None) as part of the
    /// apply of raft entry `consistent_index`: it reaches the file in the
    /// same transaction as that index.
    pub fn put_member(&self, id: u64, record: Option<Vec<u8>>, consistent_index: u64) {
        self.put_side(SideTable::Members, id, record, consistent_index);
    }

    /// Every member record: the file's, with applied-but-uncommitted changes.
    pub fn members(&self) -> Result<BTreeMap<u64, Vec<u8>>, MvccError> {
        self.side_records(SideTable::Members)
    }

    /// Writes (or with None removes) a record of a side table as part of the
    /// apply of raft entry `consistent_index`: it reaches the file in the
    /// same transaction as that index.
    pub fn put_side(
        &self,
        side: SideTable,
        id: u64,
        record: Option<Vec<u8>>,
        consistent_index: u64,
    ) {
        let _writer = self.writer.lock();
        {
            let mut pending = self.pending.write();
            pending.side.insert((side, id), record);
            pending.dirty = true;
        }
        self.record_consistent_index(consistent_index);
    }

    /// Every record of a side table: the file's, with applied-but-uncommitted
    /// changes.
    pub fn side_records(&self, side: SideTable) -> Result<BTreeMap<u64, Vec<u8>>, MvccError> {
        let mut records = backend::load_side(&self.db(), side)?;
        let pending = self.pending.read();
        for ((_, id), record) in pending.side.range((side, 0)..=(side, u64::MAX)) {
            match record {
                Some(bytes) => records.insert(*id, bytes.clone()),
                None => records.remove(id),
            };
        }
        Ok(records)
    }

    /// The live keys with a lease as the last open (or snapshot install)
    /// found them; taken once by the lessor when it rebuilds.
    pub fn take_loaded_leased_keys(&self) -> Vec<(Bytes, i64)> {
        std::mem::take(&mut *self.loaded_leased_keys.lock())
    }

    /// Begins the one write transaction; blocks while another is alive, so
    /// never call `commit`/`compact` on the same thread while holding one.
    /// Ranges, puts, deletes and txns seen so far (for metrics).
    pub fn op_counts(&self) -> crate::OpCounts {
        self.ops.read()
    }

    pub fn write(&self, consistent_index: u64) -> TxnWrite<'_> {
        let writer = self.writer.lock();
        let begin_revision = self.current_revision();
        TxnWrite::new(self, writer, begin_revision, consistent_index)
    }

    /// Evaluates a txn whose every op is a range (etcd serves those without
    /// raft). It runs under the writer lock, so it sees one revision, and
    /// records no consistent index: it is not a raft entry.
    pub fn read_txn(&self, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
        debug_assert!(crate::is_txn_read_only(req));
        let writer = self.writer.lock();
        let begin_revision = self.current_revision();
        let mut txn = TxnWrite::new(self, writer, begin_revision, 0);
        let resp = txn.txn(req);
        txn.discard();
        resp
    }

    /// Compacts the history at `revision`: reads below it fail with
    /// Compacted afterwards. The dropped records leave the file at the next
    /// commit, in the same transaction as finishedCompactRev.
    pub fn compact(&self, revision: i64, consistent_index: u64) -> Result<(), MvccError> {
        let _writer = self.writer.lock();
        self.compact_locked(revision)?;
        self.record_consistent_index(consistent_index);
        Ok(())
    }

    /// [`Store::compact`] without the index, under the caller's writer lock.
    pub(crate) fn compact_locked(&self, revision: i64) -> Result<(), MvccError> {
        self.compact_locked_hashing(revision, true)
    }

    /// [`Store::compact_locked`]; `hash` false skips etcd's compaction
    /// hash, as etcd skips it when the previous compaction was interrupted
    /// (a resumed one: etcd-io/etcd#15919).
    pub(crate) fn compact_locked_hashing(
        &self,
        revision: i64,
        hash: bool,
    ) -> Result<(), MvccError> {
        // The file as it stands before the compaction (the caller holds the
        // writer lock: nothing changes it meanwhile), for etcd's
        // compaction hash, hashed off this thread.
        let before = {
            let state = self.state.read();
            (hash && revision > state.compact_revision && revision <= state.current_revision)
                .then_some(state.compact_revision)
        };
        let pending_hash =
            before.and_then(|previous| crate::hash::before_compaction(self, revision, previous));
        let since = std::time::Instant::now();
        // A member's compactor compacts the key index in steps (see
        // compaction::IndexWork); without one, it is done here.
        let stepped = self.compaction_backlog.lock().wake.is_some();
        let dropped = {
            let mut state = self.state.write();
            if revision <= state.compact_revision {
                if let Some(pending_hash) = pending_hash {
                    crate::hash::abandon(self, pending_hash);
                }
                return Err(MvccError::Compacted);
            }
            if revision > state.current_revision {
                if let Some(pending_hash) = pending_hash {
                    crate::hash::abandon(self, pending_hash);
                }
                return Err(MvccError::FutureRev);
            }
            state.compact_revision = revision;
            tracing::info!(revision, "compact tree index");
            (!stepped).then(|| {
                let started = std::time::Instant::now();
                let dropped = state.tree.compact(revision);
                if let Some(observer) = self.compaction_observer.get() {
                    observer.index_compacted(started.elapsed());
                }
                dropped
            })
        };
        let Some(dropped) = dropped else {
            {
                let mut pending = self.pending.write();
                pending.compact_revision = Some(revision);
                pending.dirty = true;
            }
            self.schedule_index_compaction(revision, pending_hash, since);
            return Ok(());
        };
        self.ops.compacted(dropped.len());
        if let Some(pending_hash) = pending_hash {
            let dropped = dropped.iter().map(|(revision, _)| *revision).collect();
            crate::hash::hash_at_compaction(self, pending_hash, dropped);
        }
        {
            let mut pending = self.pending.write();
            pending.compact_revision = Some(revision);
            pending.dirty = true;
        }
        let dropped = dropped
            .into_iter()
            .map(|(revision, tombstone)| RevisionKey::new(revision, tombstone))
            .collect();
        self.schedule_deletions(revision, dropped, since);
        Ok(())
    }

    /// Writes the pending batch and the consistent index to redb in one
    /// transaction, durably when `durable`.
    ///
    /// A durable commit goes in two steps: the batch without fsync under
    /// the writer lock, then, with the lock released, an empty durable
    /// transaction, which makes it durable (redb's durable commit persists
    /// the commits before it, and writes out the pages they freed: after a
    /// compaction at 8 GiB, ~100 ms that writes would otherwise wait).
    /// Writes go on meanwhile into the overlay; other commits wait for the
    /// sync ([`Store::commit`]) or are deferred ([`Store::commit_or_defer`],
    /// a compaction's batches).
    pub fn commit(&self, durable: bool) -> Result<(), MvccError> {
        let _sync = self.sync_lock.lock();
        if !durable {
            let _writer = self.writer.lock();
            return self.commit_locked(false);
        }
        let (consistent_index, staged) = {
            let _writer = self.writer.lock();
            let started = std::time::Instant::now();
            let Some(consistent_index) = self.commit_as(CommitKind::Staged)? else {
                return Ok(());
            };
            // from here until the sync is done, commits under the writer
            // lock are deferred (a redb write transaction would wait for it)
            self.syncing.store(true, Ordering::Release);
            (consistent_index, started.elapsed())
        };
        #[cfg(test)]
        if let Some(hook) = &*self.before_sync.lock() {
            hook();
        }
        let started = std::time::Instant::now();
        let synced = backend::sync_commits(&self.db());
        self.syncing.store(false, Ordering::Release);
        synced?;
        // one commit to the metric, as etcd's: its batch and its sync
        if let Some(observer) = self.commit_observer.get() {
            observer(staged + started.elapsed());
        }
        // (no commit went in since the first step: they wait or defer)
        self.unflushed.store(false, Ordering::Release);
        self.not_durable.store(false, Ordering::Release);
        // (max: a snapshot installed meanwhile moved it past this one)
        self.durable_consistent_index
            .fetch_max(consistent_index, Ordering::AcqRel);
        Ok(())
    }

    /// A commit without fsync, deferred (`Err(Deferred)`) rather than
    /// waited for while a durable commit syncs or a defragmentation copies:
    /// the apply side's periodic commits, which writes would wait behind.
    pub fn commit_or_defer(&self) -> Result<(), MvccError> {
        let _writer = self.writer.lock();
        self.commit_locked(false)
    }

    /// [`Store::commit`] for a caller that holds the writer lock (a commit
    /// without fsync is deferred while a durable commit syncs).
    pub(crate) fn commit_locked(&self, durable: bool) -> Result<(), MvccError> {
        if durable {
            self.commit_as(CommitKind::Durable)
        } else {
            if self.syncing.load(Ordering::Acquire) {
                return Err(MvccError::Deferred);
            }
            self.commit_as(CommitKind::Batch)
        }
        .map(|_| ())
    }

    /// Records that every commit up to `consistent_index` is durable (a
    /// durable commit's, or one that syncs the commits before it).
    pub(crate) fn mark_durable(&self, consistent_index: u64) {
        self.durable_consistent_index
            .store(consistent_index, Ordering::Release);
        self.not_durable.store(false, Ordering::Release);
    }

    /// A durable commit; the caller holds the writer lock. True when it
    /// committed (then every commit before it is durable too), false when
    /// there was nothing to write.
    pub(crate) fn commit_durable_locked(&self) -> Result<bool, MvccError> {
        self.commit_as(CommitKind::Durable)
            .map(|index| index.is_some())
    }

    /// The commit itself; the caller holds the writer lock. Returns the
    /// consistent index it wrote, or None when there was nothing to write.
    fn commit_as(&self, kind: CommitKind) -> Result<Option<u64>, MvccError> {
        let durable = kind == CommitKind::Durable;
        if self.defragmenting.load(Ordering::Acquire) {
            return Err(MvccError::Deferred);
        }
        // Only the writer changes `pending`, so an upgradable read keeps it
        // stable while readers go on reading the overlay during the commit.
        let pending = self.pending.upgradable_read();
        let consistent_index = pending.consistent_index;
        let nothing_pending = !pending.dirty
            && pending.records.is_empty()
            && pending.deletions.is_empty()
            && pending.compact_revision.is_none()
            && pending.finished_compact_revision.is_none()
            && pending.side.is_empty();
        let index_durable = self.durable_consistent_index() == consistent_index;
        let nothing_to_do = nothing_pending
            && match kind {
                CommitKind::Batch => true,
                CommitKind::Durable => index_durable,
                CommitKind::Staged => index_durable && !self.not_durable.load(Ordering::Acquire),
            };
        if nothing_to_do {
            return Ok(None);
        }
        // etcd commits a compaction's scheduled revision on its own, then
        // its deletions in batches; here each goes with whatever else is
        // pending, and etcd's failpoints fire around the commit that
        // carries it.
        let schedules = pending.compact_revision.is_some();
        let deletes = !pending.deletions.is_empty() || pending.finished_compact_revision.is_some();
        let finished_revision = pending.finished_compact_revision;
        if schedules {
            crate::fail_point!("compactBeforeCommitScheduledCompact");
        }
        if deletes {
            crate::fail_point!("compactBeforeCommitBatch");
        }
        crate::fail_point!("beforeCommit");
        // a plain load on every commit; the swap only after a close
        if self.index_saved.load(Ordering::Acquire)
            && self.index_saved.swap(false, Ordering::AcqRel)
        {
            // a commit after [`Store::close`]: its checkpoint goes first
            let txn = self.db().begin_write().map_err(backend::backend_error)?;
            crate::index_checkpoint::drop_in(&txn)?;
            txn.commit().map_err(backend::backend_error)?;
        }
        let started = std::time::Instant::now();
        let in_use = backend::commit_batch(
            &self.db(),
            &Batch {
                records: &pending.records,
                deletions: &pending.deletions,
                consistent_index,
                compact_revision: pending.compact_revision,
                finished_compact_revision: pending.finished_compact_revision,
                side: &pending.side,
                durable,
            },
        )?;
        // a durable commit wrote everything back; a batch leaves it to the
        // flusher
        self.unflushed.store(!durable, Ordering::Release);
        // (a staged commit is counted with its sync, by `commit`)
        if let Some(observer) = self
            .commit_observer
            .get()
            .filter(|_| kind != CommitKind::Staged)
        {
            observer(started.elapsed());
        }
        let compacted_since = if finished_revision.is_some() {
            let since = self.compacting_since.lock().take();
            if let (Some(observer), Some(since)) = (self.compaction_observer.get(), since) {
                observer.db_compacted(since.elapsed());
            }
            since
        } else {
            None
        };
        crate::fail_point!("afterCommit");
        if schedules {
            crate::fail_point!("compactAfterCommitScheduledCompact");
        }
        if deletes {
            crate::fail_point!("compactAfterCommitBatch");
        }
        // Overlay entries go only after redb has them (see the crate doc).
        let mut pending = RwLockUpgradableReadGuard::upgrade(pending);
        pending.records.clear();
        pending.deletions.clear();
        pending.compact_revision = None;
        pending.finished_compact_revision = None;
        pending.side.clear();
        pending.dirty = false;
        drop(pending);
        self.size_in_use.add(in_use, Ordering::Relaxed);
        self.refresh_file_size();
        if durable {
            self.mark_durable(consistent_index);
        } else {
            self.not_durable.store(true, Ordering::Release);
        }
        if let Some(revision) = finished_revision {
            self.finished_compact.fetch_max(revision, Ordering::AcqRel);
        }
        if let (Some(revision), Some(since)) = (finished_revision, compacted_since) {
            let (size, in_use) = (self.db_size().max(0), self.db_size_in_use().max(0));
            // etcd's line; its compaction hash is logged as "storing new hash"
            tracing::info!(
                "compact-revision" = revision,
                took = ?since.elapsed(),
                "current-db-size-bytes" = size,
                "current-db-size" = %crate::snapshot_file::humanize_bytes(size as u64),
                "current-db-size-in-use-bytes" = in_use,
                "current-db-size-in-use" = %crate::snapshot_file::humanize_bytes(in_use as u64),
                "finished scheduled compaction"
            );
        }
        Ok(Some(consistent_index))
    }

    /// Reports later compactions to `observer`; only the first observer set
    /// is kept.
    pub fn set_compaction_observer(&self, observer: Arc<dyn crate::CompactionObserver>) {
        let _ = self.compaction_observer.set(observer);
    }

    /// Read transactions open on the file now.
    pub fn open_read_transactions(&self) -> i64 {
        self.open_reads.get()
    }

    /// (watch events the server took from stream queues, events waiting in
    /// them), for etcd's etcd_debugging_mvcc_{events,pending_events}_total.
    pub fn watch_event_counts(&self) -> (u64, u64) {
        self.watch.events.read()
    }

    /// Reports the duration of each later commit to `observer`; only the
    /// first observer set is kept.
    pub fn set_commit_observer(&self, observer: CommitObserver) {
        let _ = self.commit_observer.set(observer);
    }

    /// Operations applied but not committed (records plus compaction deletions).
    pub fn pending_ops(&self) -> usize {
        let pending = self.pending.read();
        pending.records.len() + pending.deletions.len()
    }

    /// Size of the file on disk (etcd's backend Size, bbolt's high-water
    /// mark of pages): the blocks it holds, not its length. redb grows a
    /// file by doubling it up to 4 GiB and by 4 GiB beyond, and the grown
    /// part stays a hole until pages are written there: counted, it would
    /// raise the NOSPACE alarm gigabytes before etcd does (a 4.1 GB
    /// database in an 8 GiB file), and show a defragmented file twice its
    /// size after the first commit. The pages of commits since the last
    /// durable one may still wait in redb's write buffer (at most half of
    /// [`backend::CACHE_BYTES`]): those count once written, or as the bytes
    /// in use if that is more.
    pub fn db_size(&self) -> i64 {
        self.file_size.load(Ordering::Relaxed)
    }

    /// Re-reads the file's size after something wrote the file: the bytes
    /// it holds on disk, at least the pages in use (a commit's pages may
    /// still be in redb's write buffer), at most its length.
    pub(crate) fn refresh_file_size(&self) {
        if let Some((len, stored)) = stored_size(&self.path) {
            let in_use = self.size_in_use.load(Ordering::Relaxed);
            self.file_size
                .store(stored.max(in_use).min(len), Ordering::Relaxed);
        }
    }

    /// Bytes of allocated pages as of open, the last compaction commit or
    /// defragmentation (counting them walks the whole file, too costly for
    /// every batch), changed since by the bytes each later commit wrote and
    /// removed (see [`backend::InUseBytes`]).
    pub fn db_size_in_use(&self) -> i64 {
        self.size_in_use.load(Ordering::Relaxed)
    }

    /// Number of keys in the index (live or with history).
    pub fn index_len(&self) -> usize {
        self.state.read().tree.len()
    }
}

/// Looks values up by revision: the caller's own uncommitted changes, then
/// the pending overlay, then redb, whose read transaction is begun only after
/// an overlay miss (the writer drops overlay entries only after redb has
/// committed them, so a miss means redb has them).
type KeyTable = ReadOnlyTable<&'static [u8], &'static [u8]>;

pub(crate) struct ValueReader<'s> {
    store: &'s Store,
    /// The table, its read transaction and the file handle they were read
    /// from (kept alive with them).
    table: Option<(KeyTable, ReadTransaction, Arc<Database>)>,
    /// The parts table, opened at the first long record (most reads
    /// meet none).
    parts: std::cell::OnceCell<ReadParts>,
    /// Counts the read transaction as open while the table lives.
    _open: Option<crate::stats::OpenRead<'s>>,
}

impl<'s> ValueReader<'s> {
    pub(crate) fn new(store: &'s Store) -> ValueReader<'s> {
        ValueReader {
            store,
            table: None,
            parts: std::cell::OnceCell::new(),
            _open: None,
        }
    }

    fn table(&mut self) -> Result<&KeyTable, MvccError> {
        if self.table.is_none() {
            let db = self.store.db();
            let txn = db.begin_read().map_err(backend_error)?;
            let table = txn.open_table(KEY_TABLE).map_err(backend_error)?;
            self.table = Some((table, txn, db));
            self._open = Some(self.store.open_reads.open());
        }
        match &self.table {
            Some((table, _, _)) => Ok(table),
            None => unreachable!("table opened above"),
        }
    }

    /// The whole record of `stored`, the table's value under `key` (see
    /// [`ReadParts::join`]), the parts table opened if it is a head.
    fn join<'v>(&self, key: &[u8], stored: &'v [u8]) -> Result<Cow<'v, [u8]>, MvccError> {
        if crate::parts::parts_of(stored).is_none() {
            return Ok(Cow::Borrowed(stored));
        }
        let Some((_, txn, _)) = &self.table else {
            unreachable!("a stored value was read from the table")
        };
        if self.parts.get().is_none() {
            let _ = self.parts.set(ReadParts::open(txn)?);
        }
        match self.parts.get() {
            Some(parts) => parts.join(key, stored),
            None => unreachable!("set above"),
        }
    }

    /// Values of live revisions (never tombstones), in the given order.
    pub(crate) fn get_many(
        &mut self,
        revisions: &[Revision],
        read_revision: i64,
        local: impl Fn(Revision) -> Option<Bytes>,
    ) -> Result<Vec<KeyValue>, MvccError> {
        let mut kvs: Vec<Option<KeyValue>> = Vec::with_capacity(revisions.len());
        let mut misses = Vec::new();
        {
            let pending = self.store.pending.read();
            for (i, revision) in revisions.iter().enumerate() {
                let encoded = local(*revision)
                    .or_else(|| pending.records.get(revision).map(|(_, v)| v.clone()));
                match encoded {
                    Some(encoded) => kvs.push(Some(self.store.decode_record(*revision, &encoded)?)),
                    None => {
                        kvs.push(None);
                        misses.push(i);
                    }
                }
            }
        }
        if !misses.is_empty() {
            for i in misses {
                let key = RevisionKey::new(revisions[i], false);
                let found = self.table()?.get(key.as_slice()).map_err(backend_error)?;
                let kv = match found {
                    Some(stored) => {
                        let record = self
                            .join(key.as_slice(), stored.value())
                            .map_err(|e| self.store.damaged(e))?;
                        self.store.decode_record(revisions[i], &record)?
                    }
                    None => return Err(self.missing(revisions[i], read_revision)),
                };
                kvs[i] = Some(kv);
            }
        }
        Ok(kvs.into_iter().flatten().collect())
    }

    fn missing(&self, revision: Revision, read_revision: i64) -> MvccError {
        // A compaction may have dropped it after the index walk.
        if read_revision < self.store.state.read().compact_revision {
            MvccError::Compacted
        } else {
            MvccError::Corrupt(format!("no record for revision {revision:?}"))
        }
    }
}

impl Store {
    /// The KeyValue a stored record holds; a record that fails its checksum
    /// or does not decode is reported to the corruption observer and
    /// refused, never served.
    pub(crate) fn decode_record(
        &self,
        revision: Revision,
        record: &[u8],
    ) -> Result<KeyValue, MvccError> {
        let payload = self.unseal_record(revision, record)?;
        KeyValue::decode(payload).map_err(|e| {
            self.damaged(MvccError::Corrupt(format!(
                "the record of revision {}/{} does not decode: {e}",
                revision.main, revision.sub
            )))
        })
    }

    /// The encoded KeyValue of a stored record, checked.
    pub(crate) fn unseal_record<'r>(
        &self,
        revision: Revision,
        record: &'r [u8],
    ) -> Result<&'r [u8], MvccError> {
        backend::unseal(record).map_err(|e| self.damaged(e.at(revision)))
    }

    /// [`Store::unseal_record`] of a shared buffer, without copying.
    pub(crate) fn unseal_record_bytes(
        &self,
        revision: Revision,
        record: &Bytes,
    ) -> Result<Bytes, MvccError> {
        backend::unseal_bytes(record).map_err(|e| self.damaged(e.at(revision)))
    }

    /// Tells the corruption observer, if any, and hands the error back.
    pub(crate) fn damaged(&self, error: MvccError) -> MvccError {
        if let Some(observer) = self.corruption_observer.get() {
            observer(&error);
        }
        error
    }

    /// Replaces the first occurrence of `from` in the stored record of
    /// `revision` (sub-revision 0) by `to`, bypassing its checksum: what a
    /// bad disk or a stray write does. For tests of damaged data only; the
    /// record must be committed.
    #[doc(hidden)]
    pub fn overwrite_stored_bytes_for_tests(&self, revision: i64, from: &[u8], to: &[u8]) {
        assert_eq!(from.len(), to.len(), "a same-size overwrite");
        let db = self.db();
        let txn = db.begin_write().expect("write transaction");
        {
            let mut table = crate::parts::Records::open(&txn).expect("key table");
            let key = RevisionKey::new(Revision::new(revision, 0), false);
            let mut record = table
                .get(key.as_slice())
                .expect("read")
                .expect("the record is committed");
            let at = record
                .windows(from.len())
                .position(|w| w == from)
                .expect("the bytes are in the record");
            record[at..at + to.len()].copy_from_slice(to);
            table.insert(key.as_slice(), &record).expect("write");
        }
        txn.commit().expect("commit");
    }

    /// Called with every damaged record a read meets (the server raises
    /// the CORRUPT alarm). Set once.
    pub fn set_corruption_observer(&self, observer: CorruptionObserver) {
        let _ = self.corruption_observer.set(observer);
    }
}

/// Told of damaged data a read met: see [`Store::set_corruption_observer`].
pub type CorruptionObserver = Arc<dyn Fn(&MvccError) + Send + Sync>;

/// The length of the file at `path` and the bytes it holds on disk (its
/// allocated blocks, at most its length; the length where the file system
/// reports no blocks).
pub(crate) fn stored_size(path: &Path) -> Option<(i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let len = meta.len() as i64;
    let blocks = (meta.blocks() as i64).saturating_mul(512);
    Some((len, if blocks > 0 { blocks.min(len) } else { len }))
}
