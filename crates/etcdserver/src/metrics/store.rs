//! etcd's store metrics that count what mvcc has seen (mvcc/metrics.go):
//! ops, put bytes, compacted keys and the watch hub's sizes. mvcc keeps
//! plain atomics; these series are brought up to date at scrape time.

use mvcc::Store;
use prometheus::{IntCounter, IntGauge, Registry};

use super::{counter, gauge};

pub(crate) struct StoreMetrics {
    ranges: IntCounter,
    debugging_ranges: IntCounter,
    puts: IntCounter,
    deletes: IntCounter,
    txns: IntCounter,
    put_bytes: IntGauge,
    compacted_keys: IntCounter,
    watch_streams: IntGauge,
    watchers: IntGauge,
    slow_watchers: IntGauge,
}

/// Moves a counter up to `total` (counters only grow; refreshes are
/// serialized by the caller).
fn advance(counter: &IntCounter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}

impl StoreMetrics {
    pub(super) fn new(r: &Registry) -> StoreMetrics {
        StoreMetrics {
            ranges: counter(
                r,
                "etcd_mvcc_range_total",
                "Total number of ranges seen by this member.",
            ),
            debugging_ranges: counter(
                r,
                "etcd_debugging_mvcc_range_total",
                "Total number of ranges seen by this member.",
            ),
            puts: counter(
                r,
                "etcd_mvcc_put_total",
                "Total number of puts seen by this member.",
            ),
            deletes: counter(
                r,
                "etcd_mvcc_delete_total",
                "Total number of deletes seen by this member.",
            ),
            txns: counter(
                r,
                "etcd_mvcc_txn_total",
                "Total number of txns seen by this member.",
            ),
            put_bytes: gauge(
                r,
                "etcd_debugging_mvcc_total_put_size_in_bytes",
                "The total size of put kv pairs seen by this member.",
            ),
            compacted_keys: counter(
                r,
                "etcd_debugging_mvcc_db_compaction_keys_total",
                "Total number of db keys compacted.",
            ),
            watch_streams: gauge(
                r,
                "etcd_debugging_mvcc_watch_stream_total",
                "Total number of watch streams.",
            ),
            watchers: gauge(
                r,
                "etcd_debugging_mvcc_watcher_total",
                "Total number of watchers.",
            ),
            slow_watchers: gauge(
                r,
                "etcd_debugging_mvcc_slow_watcher_total",
                "Total number of unsynced slow watchers.",
            ),
        }
    }

    pub(super) fn refresh(&self, store: &Store) {
        let ops = store.op_counts();
        advance(&self.ranges, ops.ranges);
        advance(&self.debugging_ranges, ops.ranges);
        advance(&self.puts, ops.puts);
        advance(&self.deletes, ops.deletes);
        advance(&self.txns, ops.txns);
        self.put_bytes.set(ops.put_bytes as i64);
        advance(&self.compacted_keys, ops.compacted_keys);
        let (streams, watchers, unsynced) = store.watch_counts();
        self.watch_streams.set(streams as i64);
        self.watchers.set(watchers as i64);
        self.slow_watchers.set(unsynced as i64);
    }
}
