//! Operation counters behind etcd's etcd_mvcc_{range,put,delete,txn}_total,
//! etcd_debugging_mvcc_total_put_size_in_bytes and
//! etcd_debugging_mvcc_db_compaction_keys_total. Plain relaxed atomics: the
//! server reads them at scrape time (mvcc knows no metrics).
//!
//! Counted as etcd's metricsTxnWrite counts them: one per Range, Put and
//! DeleteRange op (inside a txn too, whatever its outcome), a txn when a
//! transaction ran more than one op, the key and value bytes of every put.

use std::sync::atomic::{AtomicU64, Ordering};

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
