//! etcd's metrics of operations the server times or counts as they happen:
//! applies (etcdserver/metrics.go applySec, slowApplies), defragmentation
//! and snapshots (mvcc/backend/metrics.go), hashes (mvcc/metrics.go), failed
//! and slow read indexes, snapshot installs, and the lessor's counters and
//! TTLs (lease/metrics.go).

use std::time::{Duration, Instant};

use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntGauge, Registry,
};

use super::{counter, gauge};

pub struct OpsMetrics {
    /// By request kind (`apply::Request::KINDS`, etcd's op labels), then
    /// [failed, succeeded].
    apply: Vec<[Histogram; 2]>,
    slow_applies: IntCounter,
    defrag: Histogram,
    defrag_inflight: IntGauge,
    snapshot: Histogram,
    hash: Histogram,
    hash_rev: Histogram,
    pub lease_granted: IntCounter,
    pub lease_revoked: IntCounter,
    pub lease_renewed: IntCounter,
    pub lease_expired: IntCounter,
    pub read_indexes_failed: IntCounter,
    /// Read index requests that timed out (etcd also counts answers to an
    /// earlier, abandoned request; ours carry no such mix-up).
    pub slow_read_indexes: IntCounter,
    /// TTLs of granted leases, in seconds.
    pub lease_ttl: Histogram,
    snapshot_apply_in_progress: IntGauge,
    /// etcd_network_server_stream_failures_total{Type, API}.
    stream_failures: prometheus::IntCounterVec,
}

fn histogram(r: &Registry, name: &str, help: &str, start: f64, count: usize) -> Histogram {
    let buckets = exponential_buckets(start, 2.0, count).expect("valid buckets");
    let histogram =
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid");
    r.register(Box::new(histogram.clone()))
        .expect("metric registered once");
    histogram
}

impl OpsMetrics {
    pub(super) fn new(r: &Registry) -> OpsMetrics {
        let apply = HistogramVec::new(
            HistogramOpts::new(
                "etcd_server_apply_duration_seconds",
                "The latency distributions of v2 apply called by backend.",
            )
            .buckets(exponential_buckets(0.0001, 2.0, 20).expect("valid buckets")),
            &["version", "op", "success"],
        )
        .expect("valid metric");
        r.register(Box::new(apply.clone()))
            .expect("metric registered once");
        OpsMetrics {
            apply: crate::apply::Request::KINDS
                .iter()
                .map(|op| ["false", "true"].map(|ok| apply.with_label_values(&["v3", op, ok])))
                .collect(),
            slow_applies: counter(
                r,
                "etcd_server_slow_apply_total",
                "The total number of slow apply requests (likely overloaded from slow disk).",
            ),
            defrag: histogram(
                r,
                "etcd_disk_backend_defrag_duration_seconds",
                "The latency distribution of backend defragmentation.",
                0.1,
                13,
            ),
            defrag_inflight: gauge(
                r,
                "etcd_disk_defrag_inflight",
                "Whether or not defrag is active on the member. 1 means active, 0 means not.",
            ),
            snapshot: histogram(
                r,
                "etcd_disk_backend_snapshot_duration_seconds",
                "The latency distribution of backend snapshots.",
                0.01,
                17,
            ),
            hash: histogram(
                r,
                "etcd_mvcc_hash_duration_seconds",
                "The latency distribution of storage hash operation.",
                0.01,
                15,
            ),
            hash_rev: histogram(
                r,
                "etcd_mvcc_hash_rev_duration_seconds",
                "The latency distribution of storage hash by revision operation.",
                0.01,
                15,
            ),
            lease_granted: counter(
                r,
                "etcd_debugging_lease_granted_total",
                "The total number of granted leases.",
            ),
            lease_revoked: counter(
                r,
                "etcd_debugging_lease_revoked_total",
                "The total number of revoked leases.",
            ),
            lease_renewed: counter(
                r,
                "etcd_debugging_lease_renewed_total",
                "The number of renewed leases seen by the leader.",
            ),
            lease_expired: counter(
                r,
                "etcd_debugging_server_lease_expired_total",
                "The total number of expired leases.",
            ),
            read_indexes_failed: counter(
                r,
                "etcd_server_read_indexes_failed_total",
                "The total number of failed read indexes seen.",
            ),
            slow_read_indexes: counter(
                r,
                "etcd_server_slow_read_indexes_total",
                "The total number of pending read indexes not in sync with leader's or timed out read index requests.",
            ),
            lease_ttl: histogram(
                r,
                "etcd_debugging_lease_ttl_total",
                "Bucketed histogram of lease TTLs.",
                1.0,
                24,
            ),
            snapshot_apply_in_progress: gauge(
                r,
                "etcd_server_snapshot_apply_in_progress_total",
                "1 if the server is applying the incoming snapshot. 0 if none.",
            ),
            stream_failures: {
                let vec = prometheus::IntCounterVec::new(
                    prometheus::Opts::new(
                        "etcd_network_server_stream_failures_total",
                        "The total number of stream failures from the local server.",
                    ),
                    &["Type", "API"],
                )
                .expect("valid metric");
                r.register(Box::new(vec.clone()))
                    .expect("metric registered once");
                vec
            },
        }
    }

    /// An apply of a request of kind `kind` (`apply::Request::kind`) that
    /// took `took`.
    pub(crate) fn applied(&self, kind: usize, succeeded: bool, took: Duration) {
        self.apply[kind][usize::from(succeeded)].observe(took.as_secs_f64());
    }

    /// A request slower than `--experimental-warning-apply-duration`
    /// (`crate::expensive`).
    pub(crate) fn slow_apply(&self) {
        self.slow_applies.inc();
    }

    #[cfg(test)]
    pub(crate) fn slow_applies(&self) -> u64 {
        self.slow_applies.get()
    }

    /// Times a defragmentation, with etcd_disk_defrag_inflight set meanwhile.
    pub fn defrag_started(&self) -> Timer<'_> {
        self.defrag_inflight.set(1);
        Timer {
            histogram: &self.defrag,
            started: Instant::now(),
            inflight: Some(&self.defrag_inflight),
        }
    }

    /// A watch or keep-alive stream (`api`: "watch", "lease-keepalive")
    /// failed to receive a request for another reason than the client
    /// canceling it (etcd's isClientCtxErr).
    pub fn stream_receive_failed(&self, api: &str, status: &tonic::Status) {
        if status.code() != tonic::Code::Cancelled {
            self.stream_failures
                .with_label_values(&["receive", api])
                .inc();
        }
    }

    /// A snapshot from the leader is being installed until the guard drops.
    pub(crate) fn snapshot_apply_started(&self) -> InProgress<'_> {
        self.snapshot_apply_in_progress.inc();
        InProgress(&self.snapshot_apply_in_progress)
    }

    pub fn snapshot_started(&self) -> Timer<'_> {
        Timer::new(&self.snapshot)
    }

    pub fn hash_started(&self) -> Timer<'_> {
        Timer::new(&self.hash)
    }

    pub fn hash_rev_started(&self) -> Timer<'_> {
        Timer::new(&self.hash_rev)
    }
}

/// Observes the time from its creation to [`Timer::finish`]; dropped
/// unfinished (the operation failed), it observes nothing.
pub struct Timer<'a> {
    histogram: &'a Histogram,
    started: Instant,
    inflight: Option<&'a IntGauge>,
}

impl<'a> Timer<'a> {
    fn new(histogram: &'a Histogram) -> Timer<'a> {
        Timer {
            histogram,
            started: Instant::now(),
            inflight: None,
        }
    }

    pub fn finish(self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        if let Some(inflight) = self.inflight {
            inflight.set(0);
        }
    }
}

/// Keeps a gauge raised while it lives.
pub(crate) struct InProgress<'a>(&'a IntGauge);

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_canceled_by_its_client_is_no_failure() {
        let registry = Registry::new();
        let ops = OpsMetrics::new(&registry);
        ops.stream_receive_failed("watch", &tonic::Status::cancelled("client went away"));
        assert!(ops
            .stream_failures
            .get_metric_with_label_values(&["receive", "watch"])
            .is_ok_and(|c| c.get() == 0));
        ops.stream_receive_failed("watch", &tonic::Status::internal("bad message"));
        ops.stream_receive_failed(
            "lease-keepalive",
            &tonic::Status::unknown("h2 protocol error"),
        );
        let count = |api: &str| {
            ops.stream_failures
                .with_label_values(&["receive", api])
                .get()
        };
        assert_eq!((count("watch"), count("lease-keepalive")), (1, 1));
    }
}
