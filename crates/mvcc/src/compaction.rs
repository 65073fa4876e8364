//! A compaction's deletions, in batches off the request path.
//!
//! Compacting moves the compact revision at once (reads below it fail from
//! then on), records etcd's `scheduledCompactRev` with the next commit, and
//! leaves the dropped records in the file. Without a compactor
//! ([`Store::start_compactor`]: tools that open a store offline, unit
//! tests) it drops the revisions from the key index there and then, and
//! the next commit deletes their records and records `finishedCompactRev`
//! in the same transaction. With one (a serving member), a thread of its
//! own first compacts the key index in steps ([`IndexWork`]), then deletes
//! the records as etcd's scheduleCompaction does: at most `limit` records
//! per commit (`--experimental-compaction-batch-limit`; fewer when a batch
//! holds the writer lock past 5 ms), each commit under the writer lock, a
//! pause (`--experimental-compaction-sleep-interval`, its share for a
//! batch cut short) between two, and `finishedCompactRev` with the last
//! batch. Writes and reads go on between the steps and batches; one
//! transaction deleting half of an 8 GiB file would stall every write for
//! seconds.
//!
//! A member stopped mid-way resumes at its next start: the file's
//! scheduled revision is above its finished one ([`Store::open`]).
//! Compactions run in the order they were applied, each finished before
//! the next one's deletions start.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::revision::{Revision, RevisionKey};
use crate::store::Store;
use crate::MvccError;

/// etcd's defaults: `--experimental-compaction-batch-limit` 1000 and
/// `--experimental-compaction-sleep-interval` 10ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactionBatches {
    /// Records deleted per commit (0 is taken as 1).
    pub limit: usize,
    /// Pause between two commits.
    pub sleep: Duration,
}

impl CompactionBatches {
    /// The pause after a batch of `records` that held the writer lock for
    /// `held`: the configured sleep per `limit` records, as etcd pauses
    /// after each batch of `limit`, so a batch cut short by
    /// [`BATCH_HOLD_TARGET`] pauses its share of it (a full pause after
    /// each cut batch made a compaction of large values wait mostly on its
    /// pauses: 8 GiB, 524,288 records, 78 s where etcd takes 11); and at
    /// least as long as the batch held the lock, so that writes get half
    /// of it at worst.
    fn pause(&self, records: usize, held: Duration) -> Duration {
        let limit = self.limit.max(1);
        let share = self.sleep.mul_f64(records.min(limit) as f64 / limit as f64);
        share.max(held.min(self.sleep))
    }
}

impl Default for CompactionBatches {
    fn default() -> Self {
        CompactionBatches {
            limit: 1000,
            sleep: Duration::from_millis(10),
        }
    }
}

/// How long one batch should hold the writer lock: every write waits for
/// it. Large values make a deletion cost far more than etcd's 1000 per
/// batch assume (a 1000-record batch of 8 KiB values: ~40 ms here).
const BATCH_HOLD_TARGET: Duration = Duration::from_millis(5);

/// The compactor's batch size: at most the configured limit, halved after
/// a batch that held the writer lock past [`BATCH_HOLD_TARGET`], doubled
/// back after one well within it.
struct BatchSize {
    limit: usize,
    current: usize,
}

impl BatchSize {
    const MIN: usize = 16;

    fn new(limit: usize) -> BatchSize {
        let limit = limit.max(1);
        BatchSize {
            limit,
            current: limit,
        }
    }

    fn next(&self) -> usize {
        self.current
    }

    fn took(&mut self, held: Duration) {
        if held > BATCH_HOLD_TARGET {
            self.current = (self.current / 2).max(Self::MIN.min(self.limit));
        } else if held < BATCH_HOLD_TARGET / 2 {
            self.current = self.current.saturating_mul(2).min(self.limit);
        }
    }
}

/// One compaction whose records are not all deleted yet.
pub(crate) struct Job {
    pub revision: i64,
    /// What the key index dropped, in revision order (once `index` is
    /// done; in the order of its steps until then).
    pub dropped: Vec<RevisionKey>,
    /// How many of `dropped` have gone to a commit.
    pub next: usize,
    pub since: Instant,
    /// The key index's part, while the compactor has it to do.
    pub index: Option<IndexWork>,
}

/// Keys of the key index one step of a compaction compacts (~2 ms).
const INDEX_STEP_KEYS: usize = 10_000;

/// A compaction's key index work, made by the compactor in steps of
/// [`INDEX_STEP_KEYS`] before its deletions: the apply thread, and so every
/// write, waited for a walk of every key (524,288 keys: 93 ms, and 89 more
/// to hand the dropped revisions to the hash), where etcd's treeIndex
/// compacts a clone, one key at a time under its lock.
pub(crate) struct IndexWork {
    /// The last key compacted; None: none yet.
    after: Option<Vec<u8>>,
    /// The compaction's hash, computed once the dropped revisions are known.
    hash: Option<crate::hash::PendingCompactionHash>,
    /// The steps' time under the lock (etcd's index compaction pause).
    held: Duration,
}

/// The compactions waiting for their deletions, oldest first, and the
/// compactor thread's wake-up (None: no compactor, commits delete at once).
#[derive(Default)]
pub(crate) struct Backlog {
    pub jobs: VecDeque<Job>,
    pub wake: Option<std::sync::mpsc::Sender<()>>,
}

impl Backlog {
    /// The revisions at or above `lower` still in the file but dropped,
    /// which readers of history must skip as they skip pending deletions.
    pub fn dropped_from(&self, lower: Revision) -> impl Iterator<Item = RevisionKey> + '_ {
        self.jobs.iter().flat_map(move |job| {
            let rest = &job.dropped[job.next..];
            // sorted once the key index is done; until then in step order
            let from = match job.index {
                None => rest.partition_point(|k| k.revision() < lower),
                Some(_) => 0,
            };
            rest[from..]
                .iter()
                .copied()
                .filter(move |k| k.revision() >= lower)
        })
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

impl Store {
    /// Hands a compaction's dropped records to the compactor, or, without
    /// one, to the next commit with the finished mark. The caller holds the
    /// writer lock and has recorded the scheduled revision.
    pub(crate) fn schedule_deletions(
        &self,
        revision: i64,
        mut dropped: Vec<RevisionKey>,
        since: Instant,
    ) {
        let mut backlog = self.compaction_backlog.lock();
        let Some(wake) = backlog.wake.clone() else {
            let mut pending = self.pending.write();
            pending.deletions.extend(dropped);
            pending.finished_compact_revision = Some(revision);
            pending.dirty = true;
            self.compacting_since.lock().get_or_insert(since);
            return;
        };
        dropped.sort_unstable_by_key(|k| k.revision());
        backlog.jobs.push_back(Job {
            revision,
            dropped,
            next: 0,
            since,
            index: None,
        });
        let _ = wake.send(());
    }

    /// Starts the thread that deletes compacted records in batches (see
    /// the module doc); it ends when the store is dropped.
    pub fn start_compactor(self: &Arc<Self>, batches: CompactionBatches) -> std::io::Result<()> {
        let (wake, woken) = std::sync::mpsc::channel::<()>();
        let store: Weak<Store> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("compactor".into())
            .spawn(move || {
                let mut size = BatchSize::new(batches.limit);
                // Each wake-up is one job at least; the loop drains them all.
                while woken.recv().is_ok() {
                    loop {
                        let Some(store) = store.upgrade() else { return };
                        let started = Instant::now();
                        if store.compact_index_step() {
                            // writes get the lock for as long at least
                            let held = started.elapsed();
                            drop(store);
                            std::thread::sleep(held.min(batches.sleep));
                            continue;
                        }
                        let records = size.next();
                        let more = store.delete_compacted_batch(records);
                        let held = started.elapsed();
                        size.took(held);
                        match more {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(e) => {
                                // the apply side's commits fail the same way
                                // and halt the member; a restart resumes
                                tracing::warn!(error = %e, "compaction batch failed");
                                return;
                            }
                        }
                        drop(store);
                        std::thread::sleep(batches.pause(records, held));
                    }
                }
            })?;
        self.compaction_backlog.lock().wake = Some(wake);
        Ok(())
    }

    /// Deletes the next `limit` records of the oldest compaction in one
    /// commit (with the finished mark when they are its last). Ok(true)
    /// while deletions remain. A commit deferred by a defragmentation
    /// keeps the batch pending for the commit after the swap.
    pub(crate) fn delete_compacted_batch(&self, limit: usize) -> Result<bool, MvccError> {
        let started = Instant::now();
        let _writer = self.writer.lock();
        if self.index_step_due().is_some() {
            // the compactor makes those first (compact_index_step)
            return Ok(true);
        }
        let finished = {
            let mut backlog = self.compaction_backlog.lock();
            let Some(job) = backlog.jobs.front_mut() else {
                return Ok(false);
            };
            let end = (job.next + limit.max(1)).min(job.dropped.len());
            let finished = end == job.dropped.len();
            let mut pending = self.pending.write();
            pending
                .deletions
                .extend_from_slice(&job.dropped[job.next..end]);
            job.next = end;
            if finished {
                pending.finished_compact_revision = Some(job.revision);
                *self.compacting_since.lock() = Some(job.since);
                backlog.jobs.pop_front();
            }
            pending.dirty = true;
            finished
        };
        match self.commit_locked(false) {
            Ok(()) | Err(MvccError::Deferred) => {}
            Err(e) => return Err(e),
        }
        if !finished {
            if let Some(observer) = self.compaction_observer.get() {
                observer.db_compaction_batch(started.elapsed());
            }
        }
        Ok(!self.compaction_backlog.lock().is_empty())
    }

    /// The oldest compaction's key index work, if it has some: its
    /// revision and the last key compacted.
    fn index_step_due(&self) -> Option<(i64, Option<Vec<u8>>)> {
        let backlog = self.compaction_backlog.lock();
        let job = backlog.jobs.front()?;
        let work = job.index.as_ref()?;
        Some((job.revision, work.after.clone()))
    }

    /// One step of the oldest compaction's key index work, if it has some
    /// (true then); the last one sorts what it dropped for the deletions
    /// and starts the hash.
    pub(crate) fn compact_index_step(&self) -> bool {
        let (revision, done) = {
            let _writer = self.writer.lock();
            // Under the writer lock the oldest job stays (compactions are
            // applied, and installs clear the backlog, under it too).
            let Some((revision, after)) = self.index_step_due() else {
                return false;
            };
            (
                revision,
                self.compact_index_step_locked(revision, after.as_deref()),
            )
        };
        if let Some(mut dropped) = done {
            // The sort, of every revision the compaction drops, without
            // the writer lock (under it, a put waited 51-79 ms at 524,288
            // keys): readers take the list unsorted while the key index
            // work is open, and no batch deletes before it is closed.
            dropped.sort_unstable_by_key(|k| k.revision());
            let _writer = self.writer.lock();
            self.close_index_work(revision, dropped);
        }
        true
    }

    /// One step; after the last, a copy of the job's dropped revisions to
    /// sort (the job's key index work stays open until
    /// [`Store::close_index_work`]).
    fn compact_index_step_locked(
        &self,
        revision: i64,
        after: Option<&[u8]>,
    ) -> Option<Vec<RevisionKey>> {
        let step = Instant::now();
        let mut dropped = Vec::new();
        let next =
            self.state
                .write()
                .tree
                .compact_from(revision, after, INDEX_STEP_KEYS, &mut dropped);
        let held = step.elapsed();
        let mut backlog = self.compaction_backlog.lock();
        let job = backlog.jobs.front_mut()?;
        let work = job.index.as_mut()?;
        work.held += held;
        job.dropped.extend(
            dropped
                .into_iter()
                .map(|(revision, tombstone)| RevisionKey::new(revision, tombstone)),
        );
        if next.is_some() {
            work.after = next;
            return None;
        }
        Some(job.dropped.clone())
    }

    /// Closes the oldest job's key index work with its dropped revisions
    /// sorted (unless an install cleared it meanwhile), and starts its hash.
    /// The caller holds the writer lock.
    fn close_index_work(&self, revision: i64, sorted: Vec<RevisionKey>) {
        let mut backlog = self.compaction_backlog.lock();
        let Some(job) = backlog.jobs.front_mut() else {
            return;
        };
        if job.revision != revision || job.index.is_none() || job.dropped.len() != sorted.len() {
            return;
        }
        let Some(work) = job.index.take() else {
            return;
        };
        job.dropped = sorted;
        self.ops.compacted(job.dropped.len());
        if let Some(observer) = self.compaction_observer.get() {
            observer.index_compacted(work.held);
        }
        if let Some(hash) = work.hash {
            let revisions = job.dropped.iter().map(|k| k.revision()).collect();
            drop(backlog);
            crate::hash::hash_at_compaction(self, hash, revisions);
        }
    }

    /// Hands a compaction whose key index is still to compact to the
    /// compactor (see [`IndexWork`]); the caller holds the writer lock, has
    /// recorded the scheduled revision and moved the compact revision.
    pub(crate) fn schedule_index_compaction(
        &self,
        revision: i64,
        hash: Option<crate::hash::PendingCompactionHash>,
        since: Instant,
    ) {
        let mut backlog = self.compaction_backlog.lock();
        backlog.jobs.push_back(Job {
            revision,
            dropped: Vec::new(),
            next: 0,
            since,
            index: Some(IndexWork {
                after: None,
                hash,
                held: Duration::ZERO,
            }),
        });
        if let Some(wake) = &backlog.wake {
            let _ = wake.send(());
        }
    }

    /// Drops the compactions still under way (a snapshot install replaced
    /// the file and the index), with any hash they were to compute.
    pub(crate) fn clear_compaction_jobs(&self) {
        let mut backlog = self.compaction_backlog.lock();
        for job in backlog.jobs.drain(..) {
            if let Some(IndexWork {
                hash: Some(hash), ..
            }) = job.index
            {
                crate::hash::abandon(self, hash);
            }
        }
    }

    /// The last compaction whose records are all deleted from the file
    /// (etcd's finishedCompactRev; 0 if none).
    pub fn finished_compact_revision(&self) -> i64 {
        self.finished_compact.load(Ordering::Acquire).max(0)
    }

    /// Revisions dropped but not yet deleted, at or above `lower`.
    pub(crate) fn backlog_dropped_from(&self, lower: Revision) -> HashSet<RevisionKey> {
        self.compaction_backlog.lock().dropped_from(lower).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use redb::{ReadableDatabase, ReadableTableMetadata};

    use super::CompactionBatches;
    use crate::backend::{self, KEY_TABLE};
    use crate::test_util::put_at;
    use crate::Store;

    /// Records in the file (committed ones only).
    fn records_in_file(store: &Store) -> u64 {
        let txn = store.db().begin_read().unwrap();
        txn.open_table(KEY_TABLE).unwrap().len().unwrap()
    }

    /// (scheduled and not finished, finished) compact revisions as the
    /// file has them.
    fn marks(store: &Store) -> (Option<i64>, i64) {
        let loaded = backend::load(&store.db()).unwrap();
        (loaded.scheduled_compact_revision, loaded.compact_revision)
    }

    /// 10 keys written twice (revisions 2..=21), committed.
    fn loaded(path: &std::path::Path) -> Arc<Store> {
        let store = Arc::new(Store::open(path).unwrap());
        for round in 0..2u64 {
            for k in 0..10u64 {
                put_at(
                    &store,
                    1 + round * 10 + k,
                    &format!("k{k}"),
                    [round as u8; 8],
                    0,
                );
            }
        }
        store.commit(true).unwrap();
        store
    }

    fn start_compactor(store: &Arc<Store>, limit: usize, sleep: Duration) {
        store
            .start_compactor(CompactionBatches { limit, sleep })
            .unwrap();
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_key_index_compacted_in_steps_with_writes_between_ends_as_one_walk() {
        use api::etcdserverpb::DeleteRangeRequest;
        let dir = tempfile::tempdir().unwrap();
        let stepped = Arc::new(Store::open(&dir.path().join("stepped")).unwrap());
        let whole = Arc::new(Store::open(&dir.path().join("whole")).unwrap());
        let keys = 2 * super::INDEX_STEP_KEYS + 500;
        // every key written twice (each put its own entry), every tenth
        // deleted and written again
        let history = |store: &Store| {
            let mut index = 0;
            for round in 0..2 {
                for k in 0..keys {
                    index += 1;
                    put_at(store, index, &format!("k{k:06}"), format!("r{round}"), 0);
                }
            }
            for k in (0..keys).step_by(10) {
                index += 1;
                let mut w = store.write(index);
                w.delete_range(&DeleteRangeRequest {
                    key: format!("k{k:06}").into_bytes().into(),
                    ..Default::default()
                })
                .unwrap();
                w.end();
                index += 1;
                put_at(store, index, &format!("k{k:06}"), "again", 0);
            }
            store.commit(true).unwrap();
            index
        };
        let index = history(&stepped);
        assert_eq!(history(&whole), index);
        let revision = stepped.current_revision() - 5;
        // the compactor's steps made here, one at a time (a compactor
        // thread could finish them before a loaded test thread writes)
        let (wake, _woken) = std::sync::mpsc::channel();
        stepped.compaction_backlog.lock().wake = Some(wake);
        stepped.compact(revision, index + 1).unwrap();
        // a write before every step (and the same after the one-walk
        // compaction: above its revision, the order does not matter)
        let mut during = Vec::new();
        let mut next = index + 1;
        loop {
            next += 1;
            let key = format!("k{:06}", (next * 7) as usize % keys);
            put_at(&stepped, next, &key, "during", 0);
            during.push((next, key));
            if !stepped.compact_index_step() {
                break;
            }
        }
        assert!(during.len() > 2, "no write between the steps");
        while stepped.delete_compacted_batch(1000).unwrap() {}
        whole.compact(revision, index + 1).unwrap();
        for (next, key) in &during {
            put_at(&whole, *next, key, "during", 0);
        }
        wait_for("the deletions", || {
            stepped.finished_compact_revision() == revision
        });
        stepped.commit(true).unwrap();
        whole.commit(true).unwrap();
        assert_eq!(records_in_file(&stepped), records_in_file(&whole));
        assert_eq!(stepped.index_len(), whole.index_len());
        assert_eq!(stepped.hash_kv(0).unwrap(), whole.hash_kv(0).unwrap());
        wait_for("the compaction hash", || {
            !stepped.compaction_hashes().is_empty()
        });
        assert_eq!(stepped.compaction_hashes(), whole.compaction_hashes());
        // the index itself: as one walk left it
        assert_eq!(
            format!("{:?}", stepped.state.read().tree),
            format!("{:?}", whole.state.read().tree)
        );
    }

    #[test]
    fn a_compactor_deletes_in_batches_and_marks_the_compaction_finished_with_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = loaded(&dir.path().join("db"));
        start_compactor(&store, 3, Duration::from_millis(1));
        assert_eq!(records_in_file(&store), 20);
        let hash_before = store.hash_kv(0).unwrap();
        store.compact(21, 21).unwrap();
        // Reads below the compact revision fail at once, and the hash does
        // not depend on how far the batches have got.
        assert_eq!(store.compact_revision(), 21);
        assert_eq!(store.hash_kv(0).unwrap().0, {
            let other = tempfile::tempdir().unwrap();
            let reference = loaded(&other.path().join("db"));
            reference.compact(21, 21).unwrap();
            reference.commit(true).unwrap();
            reference.hash_kv(0).unwrap().0
        });
        assert_ne!(hash_before.1, 21);
        wait_for("the compaction to finish", || {
            store.finished_compact_revision() == 21
        });
        assert_eq!(records_in_file(&store), 10);
        assert_eq!(marks(&store), (None, 21));
        // writes went on meanwhile and still do
        put_at(&store, 30, "k0", b"after", 0);
        store.commit(true).unwrap();
        assert_eq!(records_in_file(&store), 11);
    }

    #[test]
    fn every_batch_but_the_last_is_observed_as_a_pause_and_the_last_as_the_total() {
        #[derive(Default)]
        struct Seen {
            pauses: std::sync::atomic::AtomicUsize,
            totals: std::sync::atomic::AtomicUsize,
        }
        impl crate::CompactionObserver for Seen {
            fn index_compacted(&self, _: Duration) {}
            fn db_compaction_batch(&self, _: Duration) {
                self.pauses
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            fn db_compacted(&self, _: Duration) {
                self.totals
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let store = loaded(&dir.path().join("db"));
        let seen = Arc::new(Seen::default());
        store.set_compaction_observer(seen.clone());
        start_compactor(&store, 3, Duration::from_millis(1));
        // 10 records dropped: batches of 3, 3, 3 and the last 1 (etcd
        // observes the pause of each batch but the one that finishes)
        store.compact(21, 21).unwrap();
        wait_for("the compaction to finish", || {
            store.finished_compact_revision() == 21
        });
        let count =
            |a: &std::sync::atomic::AtomicUsize| a.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!((count(&seen.pauses), count(&seen.totals)), (3, 1));
    }

    #[test]
    fn a_compaction_stopped_between_batches_resumes_at_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = loaded(&path);
        start_compactor(&store, 4, Duration::from_secs(3600));
        store.compact(21, 21).unwrap();
        // the first batch goes at once, then the compactor sleeps
        wait_for("the first batch", || records_in_file(&store) == 16);
        store.commit(true).unwrap();
        assert_eq!(marks(&store), (Some(21), -1));
        assert_eq!(store.finished_compact_revision(), 0);
        drop(store);
        let reopened = Store::open(&path).unwrap();
        assert_eq!(records_in_file(&reopened), 10);
        assert_eq!(marks(&reopened), (None, 21));
        assert_eq!(reopened.compact_revision(), 21);
        assert_eq!(reopened.finished_compact_revision(), 21);
    }

    #[test]
    fn without_a_compactor_the_next_commit_deletes_everything() {
        let dir = tempfile::tempdir().unwrap();
        let store = loaded(&dir.path().join("db"));
        store.compact(21, 21).unwrap();
        assert_eq!(store.finished_compact_revision(), 0);
        store.commit(false).unwrap();
        assert_eq!(store.finished_compact_revision(), 21);
        assert_eq!(records_in_file(&store), 10);
        assert_eq!(marks(&store), (None, 21));
    }

    #[test]
    fn batches_shrink_when_they_hold_the_writer_too_long_and_grow_back() {
        let mut size = super::BatchSize::new(1000);
        assert_eq!(size.next(), 1000);
        size.took(Duration::from_millis(40));
        assert_eq!(size.next(), 500);
        for _ in 0..10 {
            size.took(Duration::from_millis(40));
        }
        assert_eq!(size.next(), 16, "never below 16");
        size.took(Duration::from_millis(4));
        assert_eq!(size.next(), 16, "within the target: unchanged");
        for _ in 0..10 {
            size.took(Duration::from_millis(1));
        }
        assert_eq!(size.next(), 1000, "never above the limit");
        let mut small = super::BatchSize::new(4);
        small.took(Duration::from_secs(1));
        assert_eq!(small.next(), 4, "a limit below 16 is the floor");
        assert_eq!(super::BatchSize::new(0).next(), 1);
    }

    #[test]
    fn a_cut_batch_pauses_its_share_of_the_sleep_and_at_least_its_hold() {
        let ms = Duration::from_millis;
        let etcd = super::CompactionBatches::default();
        assert_eq!(etcd.pause(1000, ms(2)), ms(10), "a full batch: etcd's");
        assert_eq!(etcd.pause(100, ms(0)), ms(1), "a tenth of one");
        assert_eq!(etcd.pause(100, ms(5)), ms(5), "as long as it held");
        assert_eq!(etcd.pause(16, ms(400)), ms(10), "never past the sleep");
        let none = super::CompactionBatches {
            limit: 1000,
            sleep: ms(0),
        };
        assert_eq!(none.pause(10, ms(5)), ms(0));
    }

    #[test]
    fn compactions_finish_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = loaded(&dir.path().join("db"));
        start_compactor(&store, 1, Duration::from_millis(1));
        store.compact(8, 8).unwrap();
        store.compact(21, 21).unwrap();
        let mut seen = Vec::new();
        wait_for("both compactions", || {
            let finished = store.finished_compact_revision();
            if seen.last() != Some(&finished) {
                seen.push(finished);
            }
            finished == 21
        });
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert_eq!(records_in_file(&store), 10);
    }
}
