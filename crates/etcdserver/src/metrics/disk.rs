//! etcd's metrics of the raft thread's files and heartbeats, fed by
//! consensus through [`consensus::RaftObserver`]: WAL writes
//! (wal/metrics.go: etcd_disk_wal_write_bytes_total, a gauge in etcd, and
//! etcd_disk_wal_write_duration_seconds), `.snap` saves (snap/metrics.go:
//! etcd_debugging_snap_save_{marshalling,total}_duration_seconds,
//! etcd_snap_fsync_duration_seconds) and late leader heartbeats
//! (etcd_server_heartbeat_send_failures_total).
//!
//! Our WAL writes a group commit's records with one pwrite where etcd's
//! encoder writes each record into a buffered writer: a write here is that
//! pwrite, its bytes every record of the batch (etcd counts the same bytes,
//! frame headers and padding included).

use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntGauge, Registry};

use super::{counter, disk_histogram, gauge};

pub struct DiskMetrics {
    wal_write_bytes: IntGauge,
    wal_write: Histogram,
    snap_marshalling: Histogram,
    snap_save: Histogram,
    snap_fsync: Histogram,
    heartbeat_send_failures: IntCounter,
}

impl DiskMetrics {
    pub(super) fn new(r: &Registry) -> DiskMetrics {
        DiskMetrics {
            wal_write_bytes: gauge(
                r,
                "etcd_disk_wal_write_bytes_total",
                "Total number of bytes written in WAL.",
            ),
            wal_write: disk_histogram(
                r,
                "etcd_disk_wal_write_duration_seconds",
                "The latency distributions of write called by WAL.",
            ),
            snap_marshalling: disk_histogram(
                r,
                "etcd_debugging_snap_save_marshalling_duration_seconds",
                "The marshalling cost distributions of save called by snapshot.",
            ),
            snap_save: disk_histogram(
                r,
                "etcd_debugging_snap_save_total_duration_seconds",
                "The total latency distributions of save called by snapshot.",
            ),
            snap_fsync: disk_histogram(
                r,
                "etcd_snap_fsync_duration_seconds",
                "The latency distributions of fsync called by snap.",
            ),
            heartbeat_send_failures: counter(
                r,
                "etcd_server_heartbeat_send_failures_total",
                "The total number of leader heartbeat send failures (likely overloaded from slow disk).",
            ),
        }
    }
}

impl consensus::RaftObserver for DiskMetrics {
    fn wal_written(&self, bytes: u64, took: Duration) {
        self.wal_write_bytes.add(bytes as i64);
        self.wal_write.observe(took.as_secs_f64());
    }

    fn snap_saved(&self, marshalling: Duration, fsync: Duration, total: Duration) {
        self.snap_marshalling.observe(marshalling.as_secs_f64());
        self.snap_fsync.observe(fsync.as_secs_f64());
        self.snap_save.observe(total.as_secs_f64());
    }

    fn heartbeat_late(&self, _to: u64, _exceeded: Duration) {
        self.heartbeat_send_failures.inc();
    }
}
