//! etcd's store metrics that count what mvcc has seen (mvcc/metrics.go):
//! ops, put bytes, compacted keys, the watch hub's sizes and events, open
//! read transactions; and the compaction timings ([`CompactionMetrics`]). mvcc keeps
//! plain atomics; these series are brought up to date at scrape time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mvcc::Store;
use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounter, IntGauge, Registry};

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
    events: IntCounter,
    pending_events: IntGauge,
    open_read_transactions: IntGauge,
}

/// etcd's compaction timings (mvcc/kvstore_compaction.go), fed by mvcc
/// through [`mvcc::CompactionObserver`]. etcd deletes a compaction's
/// revisions in batches, each pausing writers; here they all go in the next
/// backend commit, so the db pause is that commit's duration and there is
/// one per compaction.
pub struct CompactionMetrics {
    index_pause: Histogram,
    db_pause: Histogram,
    db_total: Histogram,
    last: prometheus::Gauge,
}

fn histogram(r: &Registry, name: &str, help: &str, start: f64, count: usize) -> Histogram {
    let buckets = exponential_buckets(start, 2.0, count).expect("valid buckets");
    let histogram =
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid");
    r.register(Box::new(histogram.clone()))
        .expect("metric registered once");
    histogram
}

/// Whole milliseconds, as etcd observes them (a Go Duration divided by
/// time.Millisecond).
fn whole_millis(took: Duration) -> f64 {
    took.as_millis() as f64
}

impl CompactionMetrics {
    pub(super) fn new(r: &Registry) -> CompactionMetrics {
        let last = prometheus::Gauge::new(
            "etcd_debugging_mvcc_db_compaction_last",
            "The unix time of the last db compaction. Resets to 0 on start.",
        )
        .expect("valid metric");
        r.register(Box::new(last.clone()))
            .expect("metric registered once");
        CompactionMetrics {
            index_pause: histogram(
                r,
                "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
                "Bucketed histogram of index compaction pause duration.",
                0.5,
                14,
            ),
            db_pause: histogram(
                r,
                "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds",
                "Bucketed histogram of db compaction pause duration.",
                1.0,
                13,
            ),
            db_total: histogram(
                r,
                "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
                "Bucketed histogram of db compaction total duration.",
                100.0,
                14,
            ),
            last,
        }
    }
}

impl mvcc::CompactionObserver for CompactionMetrics {
    fn index_compacted(&self, pause: Duration) {
        self.index_pause.observe(whole_millis(pause));
    }

    fn db_compaction_batch(&self, pause: Duration) {
        self.db_pause.observe(whole_millis(pause));
    }

    fn db_compacted(&self, total: Duration) {
        self.db_total.observe(whole_millis(total));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.last.set(now as f64);
    }
}

/// Moves a counter up to `total` (counters only grow; refreshes are
/// serialized by the caller).
pub(crate) fn advance(counter: &IntCounter, total: u64) {
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
            events: counter(
                r,
                "etcd_debugging_mvcc_events_total",
                "Total number of events sent by this member.",
            ),
            pending_events: gauge(
                r,
                "etcd_debugging_mvcc_pending_events_total",
                "Total number of pending events to be sent.",
            ),
            open_read_transactions: gauge(
                r,
                "etcd_mvcc_db_open_read_transactions",
                "The number of currently open read transactions",
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
        let (sent, pending) = store.watch_event_counts();
        advance(&self.events, sent);
        self.pending_events.set(pending as i64);
        self.open_read_transactions
            .set(store.open_read_transactions());
    }
}
