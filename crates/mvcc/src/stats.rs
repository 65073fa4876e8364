//! Operation counters behind etcd's etcd_mvcc_{range,put,delete,txn}_total,
//! etcd_debugging_mvcc_total_put_size_in_bytes and
//! etcd_debugging_mvcc_db_compaction_keys_total. Plain relaxed atomics: the
//! server reads them at scrape time (mvcc knows no metrics).
//!
//! Counted as etcd's metricsTxnWrite counts them: one per Range, Put and
//! DeleteRange op (inside a txn too, whatever its outcome), a txn when a
//! transaction ran more than one op, the key and value bytes of every put.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Told of compactions as they happen (etcd's
/// etcd_debugging_mvcc_{index,db}_compaction_* histograms live above mvcc).
/// Called by the compacting or committing thread: cheap, never blocking.
pub trait CompactionObserver: Send + Sync {
    /// The key index was compacted, holding the index's lock for `pause`.
    fn index_compacted(&self, pause: Duration);
    /// A batch of a compaction's deletions that is not its last committed,
    /// holding writes up for `pause` (waiting for the writer lock, the
    /// deletes and their commit: etcd observes its pause for each such
    /// batch, not for the last one).
    fn db_compaction_batch(&self, pause: Duration);
    /// A compaction's last deletions committed, `total` since the
    /// compaction began (a later compaction before that commit shares it
    /// and is not reported on its own).
    fn db_compacted(&self, total: Duration);
}

/// Watch events handed to streams' queues and taken from them by the
/// server (etcd's etcd_debugging_mvcc_{events,pending_events}_total).
#[derive(Default)]
pub(crate) struct EventCounts {
    queued: AtomicU64,
    taken: AtomicU64,
    /// Left in the queue of a stream that closed.
    discarded: AtomicU64,
}

impl EventCounts {
    pub(crate) fn queued(&self, events: usize) {
        add(&self.queued, events as u64);
    }

    pub(crate) fn taken(&self, events: usize) {
        add(&self.taken, events as u64);
    }

    pub(crate) fn discarded(&self, events: usize) {
        add(&self.discarded, events as u64);
    }

    /// (events taken by the server, events waiting in queues).
    pub(crate) fn read(&self) -> (u64, u64) {
        // taken and discarded first: a concurrent push can only make the
        // pending count too high for a moment, never negative
        let taken = self.taken.load(Ordering::Relaxed);
        let discarded = self.discarded.load(Ordering::Relaxed);
        let queued = self.queued.load(Ordering::Relaxed);
        (taken, queued.saturating_sub(taken + discarded))
    }
}

/// Read transactions open on the file (etcd's
/// etcd_mvcc_db_open_read_transactions): counted while a guard lives.
#[derive(Default)]
pub(crate) struct OpenReads(AtomicI64);

impl OpenReads {
    pub(crate) fn open(&self) -> OpenRead<'_> {
        self.0.fetch_add(1, Ordering::Relaxed);
        OpenRead(&self.0)
    }

    pub(crate) fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub(crate) struct OpenRead<'a>(&'a AtomicI64);

impl Drop for OpenRead<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
pub(crate) struct OpCounters {
    ranges: AtomicU64,
    puts: AtomicU64,
    deletes: AtomicU64,
    txns: AtomicU64,
    put_bytes: AtomicU64,
    compacted_keys: AtomicU64,
}

/// The counters at one moment.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub ranges: u64,
    pub puts: u64,
    pub deletes: u64,
    pub txns: u64,
    pub put_bytes: u64,
    pub compacted_keys: u64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl OpCounters {
    pub fn range(&self) {
        add(&self.ranges, 1);
    }

    pub fn put(&self, bytes: usize) {
        add(&self.puts, 1);
        add(&self.put_bytes, bytes as u64);
    }

    pub(crate) fn delete(&self) {
        add(&self.deletes, 1);
    }

    /// A transaction ended after `ops` ops.
    pub(crate) fn ended(&self, ops: u32) {
        if ops > 1 {
            add(&self.txns, 1);
        }
    }

    pub(crate) fn compacted(&self, keys: usize) {
        add(&self.compacted_keys, keys as u64);
    }

    pub(crate) fn read(&self) -> OpCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OpCounts {
            ranges: get(&self.ranges),
            puts: get(&self.puts),
            deletes: get(&self.deletes),
            txns: get(&self.txns),
            put_bytes: get(&self.put_bytes),
            compacted_keys: get(&self.compacted_keys),
        }
    }
}
