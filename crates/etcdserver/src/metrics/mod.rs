//! Prometheus metrics with etcd's names, help strings, labels and buckets
//! (etcd 3.5's etcdserver/metrics.go, mvcc/metrics.go, wal/metrics.go,
//! mvcc/backend/metrics.go), served on /metrics.
//!
//! The hot path pays only atomics: histograms and counters are prometheus
//! atomics observed by the WAL's and the backend's observers, the proposal
//! path and the gRPC layer ([`grpc`]). Everything that is a state (leader,
//! indexes, sizes, key count) is read at scrape time by [`Metrics::refresh`]
//! from `RaftHandle::status()` and the store, so it costs nothing between
//! scrapes.
//!
//! One registry per member (tests run several members in one process).

pub mod disk;
pub mod grpc;
pub(crate) mod network;
pub(crate) mod ops;
pub mod process;
pub mod store;
pub mod text;

use std::time::Duration;

use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, IntCounter, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use crate::server::EtcdServer;
use crate::server::{CLUSTER_VERSION, ETCD_VERSION};

/// What promhttp answers with for the text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub struct Metrics {
    registry: Registry,
    pub wal_fsync: Histogram,
    pub backend_commit: Histogram,
    pub proposals_pending: IntGauge,
    pub proposals_failed: IntCounter,
    pub health_success: IntCounter,
    pub health_failures: IntCounter,
    /// etcd_server_healthcheck{type,name}: 1 if the last /livez or
    /// /readyz check of that name passed, else 0.
    pub healthcheck: IntGaugeVec,
    /// etcd_server_healthchecks_total{type,name,status}.
    pub healthchecks: prometheus::IntCounterVec,
    /// etcd_debugging_auth_revision (set by the auth store).
    pub auth_revision: IntGauge,
    /// etcd_server_learner_promote_successes (etcd's name has no `_total`).
    pub learner_promote_successes: IntCounter,
    /// etcd_server_learner_promote_failures{Reason}: the error's text.
    pub learner_promote_failures: prometheus::IntCounterVec,
    pub grpc: grpc::GrpcMetrics,
    pub network: std::sync::Arc<network::NetworkMetrics>,
    pub ops: ops::OpsMetrics,
    /// WAL writes, `.snap` saves, late heartbeats (fed by consensus).
    pub disk: std::sync::Arc<disk::DiskMetrics>,
    store: store::StoreMetrics,
    /// Compaction timings (fed by mvcc).
    pub compaction: std::sync::Arc<store::CompactionMetrics>,
    process: process::ProcessMetrics,
    /// client_golang's promhttp scrape metrics: scrapes being served and
    /// served, by status code (only 200 is ever answered: encoding into
    /// memory cannot fail).
    scrapes_in_flight: IntGauge,
    scrapes_ok: IntCounter,
    has_leader: IntGauge,
    is_leader: IntGauge,
    is_learner: IntGauge,
    leader_changes: IntCounter,
    proposals_committed: IntGauge,
    proposals_applied: IntGauge,
    db_total_size: IntGauge,
    db_total_size_in_use: IntGauge,
    debugging_db_total_size: IntGauge,
    keys_total: IntGauge,
    current_revision: IntGauge,
    compact_revision: IntGauge,
    quota_backend_bytes: IntGauge,
    /// Serializes refreshes: the leader-change counter advances by deltas.
    refresh: parking_lot::Mutex<()>,
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let gauge = IntGauge::new(name, help).expect("valid metric");
    registry
        .register(Box::new(gauge.clone()))
        .expect("metric registered once");
    gauge
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let counter = IntCounter::new(name, help).expect("valid metric");
    registry
        .register(Box::new(counter.clone()))
        .expect("metric registered once");
    counter
}

/// etcd's disk latency buckets: 1 ms doubling 14 times (to ~8 s).
fn disk_histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let buckets = exponential_buckets(0.001, 2.0, 14).expect("valid buckets");
    let histogram =
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid");
    registry
        .register(Box::new(histogram.clone()))
        .expect("metric registered once");
    histogram
}

/// A gauge set to 1 with one label, as etcd's version and ID gauges.
fn info_gauge(registry: &Registry, name: &str, help: &str, label: &str, value: &str) {
    let vec = IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric");
    vec.with_label_values(&[value]).set(1);
    registry
        .register(Box::new(vec))
        .expect("metric registered once");
}

impl Metrics {
    /// `extensive`: `--metrics extensive` (gRPC handling time histograms).
    pub fn new(member_id: u64, extensive: bool) -> Metrics {
        let registry = Registry::new();
        #[cfg(target_os = "linux")]
        {
            let process = prometheus::process_collector::ProcessCollector::for_self();
            if let Err(e) = registry.register(Box::new(process)) {
                tracing::warn!(error = %e, "process metrics unavailable");
            }
        }
        let r = &registry;
        info_gauge(
            r,
            "etcd_server_version",
            "Which version is running. 1 for 'server_version' label with current version.",
            "server_version",
            ETCD_VERSION,
        );
        info_gauge(
            r,
            "etcd_cluster_version",
            "Which version is running. 1 for 'cluster_version' label with current cluster version",
            "cluster_version",
            CLUSTER_VERSION,
        );
        info_gauge(
            r,
            "etcd_server_id",
            "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
            "server_id",
            &format!("{member_id:x}"),
        );
        Metrics {
            wal_fsync: disk_histogram(
                r,
                "etcd_disk_wal_fsync_duration_seconds",
                "The latency distributions of fsync called by WAL.",
            ),
            backend_commit: disk_histogram(
                r,
                "etcd_disk_backend_commit_duration_seconds",
                "The latency distributions of commit called by backend.",
            ),
            has_leader: gauge(
                r,
                "etcd_server_has_leader",
                "Whether or not a leader exists. 1 is existence, 0 is not.",
            ),
            is_leader: gauge(
                r,
                "etcd_server_is_leader",
                "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            ),
            is_learner: gauge(
                r,
                "etcd_server_is_learner",
                "Whether or not this member is a learner. 1 if is, 0 otherwise.",
            ),
            learner_promote_successes: counter(
                r,
                "etcd_server_learner_promote_successes",
                "The total number of successful learner promotions while this member is leader.",
            ),
            learner_promote_failures: {
                let vec = prometheus::IntCounterVec::new(
                    prometheus::Opts::new(
                        "etcd_server_learner_promote_failures",
                        "The total number of failed learner promotions (likely learner not ready) while this member is leader.",
                    ),
                    &["Reason"],
                )
                .expect("valid metric");
                r.register(Box::new(vec.clone()))
                    .expect("metric registered once");
                vec
            },
            leader_changes: counter(
                r,
                "etcd_server_leader_changes_seen_total",
                "The number of leader changes seen.",
            ),
            proposals_committed: gauge(
                r,
                "etcd_server_proposals_committed_total",
                "The total number of consensus proposals committed.",
            ),
            proposals_applied: gauge(
                r,
                "etcd_server_proposals_applied_total",
                "The total number of consensus proposals applied.",
            ),
            proposals_pending: gauge(
                r,
                "etcd_server_proposals_pending",
                "The current number of pending proposals to commit.",
            ),
            proposals_failed: counter(
                r,
                "etcd_server_proposals_failed_total",
                "The total number of failed proposals seen.",
            ),
            health_success: counter(
                r,
                "etcd_server_health_success",
                "The total number of successful health checks",
            ),
            health_failures: counter(
                r,
                "etcd_server_health_failures",
                "The total number of failed health checks",
            ),
            healthcheck: {
                let vec = IntGaugeVec::new(
                    Opts::new(
                        "etcd_server_healthcheck",
                        "The result of each kind of healthcheck.",
                    ),
                    &["type", "name"],
                )
                .expect("valid metric");
                r.register(Box::new(vec.clone()))
                    .expect("metric registered once");
                vec
            },
            healthchecks: {
                let vec = prometheus::IntCounterVec::new(
                    Opts::new(
                        "etcd_server_healthchecks_total",
                        "The total number of each kind of healthcheck.",
                    ),
                    &["type", "name", "status"],
                )
                .expect("valid metric");
                r.register(Box::new(vec.clone()))
                    .expect("metric registered once");
                vec
            },
            auth_revision: gauge(
                r,
                "etcd_debugging_auth_revision",
                "The current revision of auth store.",
            ),
            quota_backend_bytes: gauge(
                r,
                "etcd_server_quota_backend_bytes",
                "Current backend storage quota size in bytes.",
            ),
            db_total_size: gauge(
                r,
                "etcd_mvcc_db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
            ),
            db_total_size_in_use: gauge(
                r,
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "Total size of the underlying database logically in use in bytes.",
            ),
            current_revision: gauge(
                r,
                "etcd_debugging_mvcc_current_revision",
                "The current revision of store.",
            ),
            compact_revision: gauge(
                r,
                "etcd_debugging_mvcc_compact_revision",
                "The revision of the last compaction in store.",
            ),
            // etcd 3.4's name for the db size (3.5 dropped it); 3.4-era
            // dashboards still read it.
            debugging_db_total_size: gauge(
                r,
                "etcd_debugging_mvcc_db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
            ),
            keys_total: gauge(r, "etcd_debugging_mvcc_keys_total", "Total number of keys."),
            grpc: grpc::GrpcMetrics::new(r, extensive),
            network: std::sync::Arc::new(network::NetworkMetrics::new(r, member_id)),
            ops: ops::OpsMetrics::new(r),
            disk: std::sync::Arc::new(disk::DiskMetrics::new(r)),
            store: store::StoreMetrics::new(r),
            compaction: std::sync::Arc::new(store::CompactionMetrics::new(r)),
            process: process::ProcessMetrics::new(r),
            scrapes_in_flight: gauge(
                r,
                "promhttp_metric_handler_requests_in_flight",
                "Current number of scrapes being served.",
            ),
            scrapes_ok: {
                let vec = prometheus::IntCounterVec::new(
                    Opts::new(
                        "promhttp_metric_handler_requests_total",
                        "Total number of scrapes by HTTP status code.",
                    ),
                    &["code"],
                )
                .expect("valid metric");
                r.register(Box::new(vec.clone()))
                    .expect("metric registered once");
                // promhttp shows these three from the start
                vec.with_label_values(&["500"]);
                vec.with_label_values(&["503"]);
                vec.with_label_values(&["200"])
            },
            refresh: parking_lot::Mutex::new(()),
            registry,
        }
    }

    /// The WAL's fdatasync observer.
    pub fn wal_sync_observer(&self) -> consensus::wal::SyncObserver {
        let histogram = self.wal_fsync.clone();
        consensus::wal::SyncObserver(std::sync::Arc::new(move |took: Duration| {
            histogram.observe(took.as_secs_f64())
        }))
    }

    /// What consensus reports of WAL writes, `.snap` saves and heartbeats.
    pub fn raft_observer(&self) -> consensus::Observer {
        consensus::Observer(self.disk.clone())
    }

    /// The backend's commit observer.
    pub fn backend_commit_observer(&self) -> mvcc::CommitObserver {
        let histogram = self.backend_commit.clone();
        std::sync::Arc::new(move |took: Duration| histogram.observe(took.as_secs_f64()))
    }

    /// Reads the member's state into the gauges (at scrape time).
    pub(crate) fn refresh(&self, server: &EtcdServer) {
        let _serialized = self.refresh.lock();
        let status = server.raft.status();
        self.has_leader.set(i64::from(status.leader != 0));
        self.is_leader.set(i64::from(status.is_leader));
        self.is_learner.set(i64::from(server.is_learner()));
        let seen = self.leader_changes.get();
        if status.leader_changes > seen {
            self.leader_changes.inc_by(status.leader_changes - seen);
        }
        self.proposals_committed.set(status.commit_index as i64);
        self.proposals_applied.set(server.applied_index() as i64);
        self.quota_backend_bytes.set(server.cfg.quota_backend_bytes);
        let size = server.store.db_size();
        self.db_total_size.set(size);
        self.debugging_db_total_size.set(size);
        self.db_total_size_in_use.set(server.store.db_size_in_use());
        self.keys_total.set(server.store.index_len() as i64);
        self.current_revision.set(server.store.current_revision());
        self.compact_revision.set(server.store.compact_revision());
        self.store.refresh(&server.store);
        self.process.refresh();
    }

    /// The text exposition of every metric, refreshed first, with etcd's
    /// number formatting ([`text`]).
    pub fn render(&self, server: &EtcdServer) -> Vec<u8> {
        self.scrapes_in_flight.inc();
        self.refresh(server);
        let out = text::encode(&self.registry.gather()).into_bytes();
        self.scrapes_in_flight.dec();
        // counted once served, as promhttp: a scrape does not see itself
        self.scrapes_ok.inc();
        out
    }
}
