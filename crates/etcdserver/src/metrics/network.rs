//! etcd's peer network metrics (etcd 3.5's rafthttp/metrics.go), fed by the
//! peer transport through [`consensus::transport::NetworkObserver`]:
//! round-trip times of the transport's probes, raft bytes each way, send
//! failures, the state of each peer's connection and backend snapshots
//! sent and received (with etcd's etcd_snap_db_* of a received one). Peers are labeled by
//! their member ID in hex, as etcd labels them.

use std::collections::HashMap;
use std::time::Duration;

use consensus::transport::NetworkObserver;
use parking_lot::RwLock;
use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry,
};

/// One peer's series, resolved once (a label lookup hashes its values).
struct PeerSeries {
    round_trip: Histogram,
    sent: IntCounter,
    received: IntCounter,
    send_failures: IntCounter,
    active: IntGauge,
    disconnected: IntCounter,
}

/// The snapshot series of one peer, by direction (label To or From).
struct SnapshotSeries {
    success: IntCounter,
    failures: IntCounter,
    in_flight: IntGauge,
    took: Histogram,
}

/// etcd's etcd_network_snapshot_{send,receive}_* families of one direction.
struct SnapshotFamilies {
    success: IntCounterVec,
    failures: IntCounterVec,
    in_flight: IntGaugeVec,
    took: HistogramVec,
}

impl SnapshotFamilies {
    /// `direction`: "send" (label To) or "receive" (label From).
    fn new(registry: &Registry, direction: &str, label: &str) -> SnapshotFamilies {
        let (sends, past) = match direction {
            "send" => ("sends", "snapshot send"),
            _ => ("receives", "snapshot receive"),
        };
        let success = IntCounterVec::new(
            Opts::new(
                format!("etcd_network_snapshot_{direction}_success"),
                format!("Total number of successful snapshot {sends}"),
            ),
            &[label],
        )
        .expect("valid metric");
        register(registry, &success);
        let in_flight = IntGaugeVec::new(
            Opts::new(
                format!("etcd_network_snapshot_{direction}_inflights_total"),
                format!("Total number of inflight snapshot {sends}"),
            ),
            &[label],
        )
        .expect("valid metric");
        register(registry, &in_flight);
        let failures = IntCounterVec::new(
            Opts::new(
                format!("etcd_network_snapshot_{direction}_failures"),
                format!("Total number of {past} failures"),
            ),
            &[label],
        )
        .expect("valid metric");
        register(registry, &failures);
        let took = HistogramVec::new(
            HistogramOpts::new(
                format!("etcd_network_snapshot_{direction}_total_duration_seconds"),
                format!("Total latency distributions of v3 snapshot {sends}"),
            )
            .buckets(exponential_buckets(0.1, 2.0, 10).expect("valid buckets")),
            &[label],
        )
        .expect("valid metric");
        register(registry, &took);
        SnapshotFamilies {
            success,
            failures,
            in_flight,
            took,
        }
    }

    fn series(&self, peer: &str) -> SnapshotSeries {
        SnapshotSeries {
            success: self.success.with_label_values(&[peer]),
            failures: self.failures.with_label_values(&[peer]),
            in_flight: self.in_flight.with_label_values(&[peer]),
            took: self.took.with_label_values(&[peer]),
        }
    }
}

impl SnapshotSeries {
    fn ended(&self, took: Option<Duration>) {
        match took {
            Some(took) => {
                self.success.inc();
                self.took.observe(took.as_secs_f64());
            }
            None => self.failures.inc(),
        }
    }

    fn in_flight(&self, in_flight: bool) {
        if in_flight {
            self.in_flight.inc();
        } else {
            self.in_flight.dec();
        }
    }
}

pub struct NetworkMetrics {
    local: String,
    round_trip: HistogramVec,
    sent: IntCounterVec,
    received: IntCounterVec,
    send_failures: IntCounterVec,
    active: IntGaugeVec,
    disconnected: IntCounterVec,
    peers: RwLock<HashMap<u64, PeerSeries>>,
    snapshot_send: SnapshotFamilies,
    snapshot_receive: SnapshotFamilies,
    /// Snapshot series are made on first use: a member that never sends or
    /// receives one shows none, as etcd.
    snapshot_peers: RwLock<HashMap<(u64, bool), SnapshotSeries>>,
    snap_db_fsync: Histogram,
    snap_db_save: Histogram,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: &T) {
    registry
        .register(Box::new(metric.clone()))
        .expect("metric registered once");
}

impl NetworkMetrics {
    pub(super) fn new(registry: &Registry, member_id: u64) -> NetworkMetrics {
        let counter = |name: &str, help: &str, label: &str| {
            let vec = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric");
            register(registry, &vec);
            vec
        };
        // 0.1 ms doubling to 3.2768 s, as etcd 3.5.
        let buckets = exponential_buckets(0.0001, 2.0, 16).expect("valid buckets");
        let round_trip = HistogramVec::new(
            HistogramOpts::new(
                "etcd_network_peer_round_trip_time_seconds",
                "Round-Trip-Time histogram between peers",
            )
            .buckets(buckets),
            &["To"],
        )
        .expect("valid metric");
        register(registry, &round_trip);
        let active = IntGaugeVec::new(
            Opts::new(
                "etcd_network_active_peers",
                "The current number of active peer connections.",
            ),
            &["Local", "Remote"],
        )
        .expect("valid metric");
        register(registry, &active);
        let disconnected = IntCounterVec::new(
            Opts::new(
                "etcd_network_disconnected_peers_total",
                "The total number of disconnected peers.",
            ),
            &["Local", "Remote"],
        )
        .expect("valid metric");
        register(registry, &disconnected);
        NetworkMetrics {
            local: format!("{member_id:x}"),
            round_trip,
            sent: counter(
                "etcd_network_peer_sent_bytes_total",
                "The total number of bytes sent to peers.",
                "To",
            ),
            received: counter(
                "etcd_network_peer_received_bytes_total",
                "The total number of bytes received from peers.",
                "From",
            ),
            send_failures: counter(
                "etcd_network_peer_sent_failures_total",
                "The total number of send failures from peers.",
                "To",
            ),
            active,
            disconnected,
            peers: RwLock::new(HashMap::new()),
            snapshot_send: SnapshotFamilies::new(registry, "send", "To"),
            snapshot_receive: SnapshotFamilies::new(registry, "receive", "From"),
            snapshot_peers: RwLock::new(HashMap::new()),
            snap_db_fsync: {
                let histogram = Histogram::with_opts(
                    HistogramOpts::new(
                        "etcd_snap_db_fsync_duration_seconds",
                        "The latency distributions of fsyncing .snap.db file",
                    )
                    .buckets(exponential_buckets(0.001, 2.0, 14).expect("valid buckets")),
                )
                .expect("valid metric");
                register(registry, &histogram);
                histogram
            },
            snap_db_save: {
                let histogram = Histogram::with_opts(
                    HistogramOpts::new(
                        "etcd_snap_db_save_total_duration_seconds",
                        "The total latency distributions of v3 snapshot save",
                    )
                    .buckets(exponential_buckets(0.1, 2.0, 10).expect("valid buckets")),
                )
                .expect("valid metric");
                register(registry, &histogram);
                histogram
            },
        }
    }

    fn with_peer(&self, peer: u64, observe: impl FnOnce(&PeerSeries)) {
        if let Some(series) = self.peers.read().get(&peer) {
            return observe(series);
        }
        let mut peers = self.peers.write();
        let series = peers.entry(peer).or_insert_with(|| {
            let remote = format!("{peer:x}");
            PeerSeries {
                round_trip: self.round_trip.with_label_values(&[&remote]),
                sent: self.sent.with_label_values(&[&remote]),
                received: self.received.with_label_values(&[&remote]),
                send_failures: self.send_failures.with_label_values(&[&remote]),
                active: self.active.with_label_values(&[&self.local, &remote]),
                disconnected: self.disconnected.with_label_values(&[&self.local, &remote]),
            }
        });
        observe(series);
    }

    /// `sending`: to `peer` (true) or from it (false).
    fn with_snapshot_peer(&self, peer: u64, sending: bool, observe: impl FnOnce(&SnapshotSeries)) {
        if let Some(series) = self.snapshot_peers.read().get(&(peer, sending)) {
            return observe(series);
        }
        let mut peers = self.snapshot_peers.write();
        let series = peers.entry((peer, sending)).or_insert_with(|| {
            let families = match sending {
                true => &self.snapshot_send,
                false => &self.snapshot_receive,
            };
            families.series(&format!("{peer:x}"))
        });
        observe(series);
    }
}

impl NetworkObserver for NetworkMetrics {
    fn round_trip(&self, to: u64, rtt: Duration) {
        self.with_peer(to, |s| s.round_trip.observe(rtt.as_secs_f64()));
    }

    fn sent(&self, to: u64, bytes: u64) {
        self.with_peer(to, |s| s.sent.inc_by(bytes));
    }

    fn received(&self, from: u64, bytes: u64) {
        self.with_peer(from, |s| s.received.inc_by(bytes));
    }

    fn send_failed(&self, to: u64, messages: u64) {
        self.with_peer(to, |s| s.send_failures.inc_by(messages));
    }

    fn connection(&self, peer: u64, active: bool) {
        self.with_peer(peer, |s| {
            s.active.set(i64::from(active));
            if !active {
                s.disconnected.inc();
            }
        });
    }

    fn snapshot_sending(&self, to: u64, in_flight: bool) {
        self.with_snapshot_peer(to, true, |s| s.in_flight(in_flight));
    }

    fn snapshot_sent(&self, to: u64, took: Option<Duration>) {
        self.with_snapshot_peer(to, true, |s| s.ended(took));
    }

    fn snapshot_receiving(&self, from: u64, in_flight: bool) {
        self.with_snapshot_peer(from, false, |s| s.in_flight(in_flight));
    }

    fn snapshot_received(&self, from: u64, took: Option<Duration>) {
        self.with_snapshot_peer(from, false, |s| s.ended(took));
    }

    fn snapshot_db_saved(&self, fsync: Duration, total: Duration) {
        self.snap_db_fsync.observe(fsync.as_secs_f64());
        self.snap_db_save.observe(total.as_secs_f64());
    }
}
