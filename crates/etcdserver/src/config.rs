//! The member's configuration, as etcd's embed.Config names it.

pub use mvcc::CompactionBatches;
use std::path::PathBuf;
use std::time::Duration;

/// Extra bytes gRPC accepts above `max_request_bytes`, so that an oversized
/// request reaches our own check and gets etcd's "request is too large"
/// (etcd's grpcOverheadBytes).
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    /// `--auth-token`, `--auth-token-ttl`, `--bcrypt-cost`.
    pub auth: crate::auth::AuthConfig,
    pub data_dir: PathBuf,
    pub listen_client_urls: Vec<String>,
    /// `--listen-client-http-urls` (etcd 3.5.8+): URLs serving HTTP alone
    /// (the gateway, /health, /version, /metrics); when set, the client
    /// URLs serve gRPC alone.
    pub listen_client_http_urls: Vec<String>,
    pub advertise_client_urls: Vec<String>,
    pub listen_peer_urls: Vec<String>,
    pub initial_advertise_peer_urls: Vec<String>,
    pub initial_cluster: String,
    pub initial_cluster_state: String,
    pub initial_cluster_token: String,
    /// etcd's --strict-reconfig-check (default on): refuse membership
    /// changes that could cause quorum loss.
    pub strict_reconfig_check: bool,
    /// etcd's --pre-vote (default on): a candidate first asks whether it
    /// could win, so a member rejoining after a partition does not disrupt
    /// the leader with a higher term.
    pub pre_vote: bool,
    /// etcd's --force-new-cluster.
    pub force_new_cluster: bool,
    pub snapshot_count: u64,
    /// `--max-snapshots`: `.snap` files kept (0: all).
    pub max_snapshots: usize,
    /// `--wal-dir` (etcd's DedicatedWALDir): the directory the WAL
    /// segments live in; None: `<data-dir>/member/wal` ([`Self::wal_dir`]).
    pub dedicated_wal_dir: Option<PathBuf>,
    /// `--max-wals`: WAL segment files kept (0: all); only those a snapshot
    /// released are ever deleted.
    pub max_wals: usize,
    /// `--backend-batch-interval` and `--backend-batch-limit`.
    pub backend_batch: crate::apply::BackendBatch,
    /// `--experimental-compaction-batch-limit` and
    /// `--experimental-compaction-sleep-interval`.
    pub compaction_batches: mvcc::CompactionBatches,
    pub heartbeat: Duration,
    pub election_timeout: Duration,
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    pub quota_backend_bytes: i64,
    /// Raft entries kept below a snapshot for slow followers (etcd's
    /// --experimental-snapshot-catchup-entries); further behind, a follower
    /// gets the backend as a snapshot.
    pub snapshot_catch_up_entries: u64,
    /// HTTP/2 streams per client connection; None = unlimited, as etcd.
    pub max_concurrent_streams: Option<u32>,
    /// `--enable-grpc-gateway` (default on): the JSON gateway (`/v3/...`)
    /// on the client URLs.
    pub enable_grpc_gateway: bool,
    /// `--socket-reuse-port`: SO_REUSEPORT on the TCP listeners.
    pub socket_reuse_port: bool,
    /// --grpc-keepalive-interval and --grpc-keepalive-timeout: how often the
    /// server pings an idle client connection, and how long it waits for
    /// the answer; None (either flag 0) disables the pings, as etcd.
    pub grpc_keepalive: Option<(Duration, Duration)>,
    /// --grpc-keepalive-min-time: how far apart a client's pings must be
    /// on a connection with a stream open (grpc-go's enforcement policy,
    /// `embed::ping_policy`); grpc-go's 5 minutes when the flag is 0 or
    /// less, as etcd then sets no policy.
    pub grpc_keepalive_min_time: Duration,
    /// `--cors`: the origins given the CORS headers on the client URLs
    /// (`*`, the default, or none: all).
    pub cors: Vec<String>,
    /// `--host-whitelist`: the Host names a plain client URL serves HTTP
    /// to (`*`, the default, or none: all).
    pub host_whitelist: Vec<String>,
    /// How often an idle progress_notify watcher gets an empty response
    /// with the current revision (etcd's
    /// --experimental-watch-progress-notify-interval; 0 disables).
    pub watch_progress_notify_interval: Duration,
    /// Extra listeners serving only /metrics and /health (etcd's
    /// --listen-metrics-urls).
    pub listen_metrics_urls: Vec<String>,
    /// `--metrics extensive`: also the gRPC handling time histograms.
    pub metrics_extensive: bool,
    /// `--enable-pprof`: serve profiles under /debug/pprof on client URLs.
    pub enable_pprof: bool,
    /// How often the leader checkpoints remaining lease TTLs through raft
    /// (etcd's --experimental-lease-checkpoint-interval, used when
    /// --experimental-enable-lease-checkpoint is set); None: no checkpoints.
    pub lease_checkpoint_interval: Option<Duration>,
    /// --auto-compaction-mode and --auto-compaction-retention; None: off.
    pub auto_compaction: Option<crate::compactor::AutoCompaction>,
    /// How often the revision compactor looks (etcd: 5 minutes; tests shrink it).
    pub auto_compaction_revision_interval: Duration,
    /// --experimental-initial-corrupt-check: compare hashes with the peers
    /// before serving, refusing to start on a mismatch.
    pub initial_corrupt_check: bool,
    /// --experimental-corrupt-check-time: the leader's periodic hash
    /// comparison (zero: off).
    pub corrupt_check_time: Duration,
    /// --experimental-compact-hash-check-enabled and
    /// --experimental-compact-hash-check-time: the leader's periodic check
    /// of the hashes stored at compactions (None: off).
    pub compact_hash_check: Option<Duration>,
    /// --experimental-bootstrap-defrag-threshold-megabytes, in bytes: at
    /// start, defragment the backend when at least this much is free (0: off).
    pub bootstrap_defrag_threshold_bytes: u64,
    /// --unsafe-no-fsync: the WAL is never fdatasync'ed (data loss on an OS
    /// crash or power failure; a process crash loses nothing).
    pub unsafe_no_fsync: bool,
    /// The client port's TLS (`--cert-file`, `--key-file`,
    /// `--trusted-ca-file`, `--client-cert-auth`, `--client-crl-file`,
    /// `--cipher-suites`, `--tls-min-version`, `--tls-max-version`), used by
    /// `https://` client and metrics URLs.
    pub client_tls: tls::TlsInfo,
    /// `--auto-tls`: without `--cert-file`/`--key-file`, a self-signed
    /// certificate made at start under `<data-dir>/fixtures/client`.
    pub auto_tls: bool,
    /// The peer port's TLS (`--peer-cert-file`, `--peer-key-file`,
    /// `--peer-trusted-ca-file`, `--peer-client-cert-auth`,
    /// `--peer-crl-file`), used by `https://` peer URLs, both listening and
    /// dialing.
    pub peer_tls: tls::TlsInfo,
    /// `--peer-auto-tls`: a self-signed peer certificate under
    /// `<data-dir>/fixtures/peer`; peers' certificates are then not verified.
    pub peer_auto_tls: bool,
    /// `--experimental-peer-skip-client-san-verification`.
    pub peer_skip_client_san_verification: bool,
    /// `--self-signed-cert-validity`: years an auto-TLS certificate is
    /// valid for.
    pub self_signed_cert_validity: u32,
    /// `--experimental-enable-distributed-tracing` and its settings: an
    /// OpenTelemetry span for every gRPC request, sent to an OTLP
    /// collector; None: off (nothing is installed).
    pub distributed_tracing: Option<DistributedTracing>,
    /// `--experimental-warning-apply-duration`: an apply (or a read-only
    /// range or txn) slower than this is logged ("apply request took too
    /// long") and counted in etcd_server_slow_apply_total.
    pub warning_apply_duration: Duration,
    /// `--initial-election-tick-advance`: a member of a larger cluster
    /// fast-forwards its election ticks once its peers are connected.
    pub initial_election_tick_advance: bool,
}

/// etcd's `--experimental-distributed-tracing-*` flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedTracing {
    /// The collector's `host:port`, spoken to over plain-text gRPC.
    pub address: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// The `service.instance.id` resource attribute; empty: none.
    pub service_instance_id: String,
    /// Root spans sampled per million (0..=1,000,000); a request whose
    /// `traceparent` names a parent follows the parent's decision.
    pub sampling_rate_per_million: u32,
}

impl ServerConfig {
    pub fn member_dir(&self) -> PathBuf {
        self.data_dir.join("member")
    }

    pub fn backend_path(&self) -> PathBuf {
        self.member_dir().join("snap").join("db")
    }

    /// Where the WAL segments live (etcd's `WALDir()`): `--wal-dir`, else
    /// `<data-dir>/member/wal`.
    pub fn wal_dir(&self) -> PathBuf {
        self.dedicated_wal_dir
            .clone()
            .unwrap_or_else(|| self.member_dir().join("wal"))
    }

    /// etcd's ReqTimeout: 5 s plus two election timeouts for the expected
    /// leader election.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(5) + 2 * self.election_timeout
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            name: "default".into(),
            auth: crate::auth::AuthConfig::default(),
            data_dir: PathBuf::from("default.oxcd"),
            listen_client_urls: vec!["http://localhost:2379".into()],
            listen_client_http_urls: Vec::new(),
            advertise_client_urls: vec!["http://localhost:2379".into()],
            listen_peer_urls: vec!["http://localhost:2380".into()],
            initial_advertise_peer_urls: vec!["http://localhost:2380".into()],
            initial_cluster: "default=http://localhost:2380".into(),
            initial_cluster_state: "new".into(),
            initial_cluster_token: "etcd-cluster".into(),
            strict_reconfig_check: true,
            pre_vote: true,
            force_new_cluster: false,
            snapshot_count: 100_000,
            max_snapshots: 5,
            dedicated_wal_dir: None,
            max_wals: 5,
            backend_batch: crate::apply::BackendBatch::default(),
            compaction_batches: mvcc::CompactionBatches::default(),
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(1000),
            max_request_bytes: 1536 * 1024,
            max_txn_ops: 128,
            quota_backend_bytes: 2 * 1024 * 1024 * 1024,
            max_concurrent_streams: None,
            enable_grpc_gateway: true,
            socket_reuse_port: false,
            grpc_keepalive: Some((Duration::from_secs(2 * 60 * 60), Duration::from_secs(20))),
            grpc_keepalive_min_time: Duration::from_secs(5),
            cors: vec!["*".into()],
            host_whitelist: vec!["*".into()],
            snapshot_catch_up_entries: 5000,
            watch_progress_notify_interval: Duration::from_secs(10 * 60),
            listen_metrics_urls: Vec::new(),
            metrics_extensive: false,
            enable_pprof: false,
            lease_checkpoint_interval: None,
            auto_compaction: None,
            auto_compaction_revision_interval: crate::compactor::REVISION_CHECK_INTERVAL,
            initial_corrupt_check: false,
            corrupt_check_time: Duration::ZERO,
            compact_hash_check: None,
            bootstrap_defrag_threshold_bytes: 0,
            unsafe_no_fsync: false,
            client_tls: tls::TlsInfo::default(),
            auto_tls: false,
            peer_tls: tls::TlsInfo::default(),
            peer_auto_tls: false,
            peer_skip_client_san_verification: false,
            self_signed_cert_validity: 1,
            distributed_tracing: None,
            warning_apply_duration: Duration::from_millis(100),
            initial_election_tick_advance: true,
        }
    }
}
