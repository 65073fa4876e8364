//! etcd's peer network metrics (etcd 3.5's rafthttp/metrics.go), fed by the
//! peer transport through [`consensus::transport::NetworkObserver`]:
//! round-trip times of the transport's probes, raft bytes each way, send
//! failures and the state of each peer's connection. Peers are labeled by
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

pub struct NetworkMetrics {
    local: String,
    round_trip: HistogramVec,
    sent: IntCounterVec,
    received: IntCounterVec,
    send_failures: IntCounterVec,
    active: IntGaugeVec,
    disconnected: IntCounterVec,
    peers: RwLock<HashMap<u64, PeerSeries>>,
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
}
