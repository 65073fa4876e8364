//! Every flag etcd 3.5 takes (etcdmain/config.go `newConfig`), with etcd's
//! name, type, default and help text, grouped as etcd's `--help`
//! (etcdmain/help.go) groups them, and what each does in oxcd.

use super::{Effect, Group, Kind, Spec};

use Effect::{Effective, NoEffect, Refused};
use Group::*;
use Kind::*;

const fn flag(
    name: &'static str,
    kind: Kind,
    default: &'static str,
    shown: Option<&'static str>,
    group: Group,
    usage: &'static str,
    effect: Effect,
) -> Spec {
    Spec {
        name,
        kind,
        default,
        shown,
        group,
        usage,
        effect,
    }
}

const NO_V2: &str = "oxcd serves the v3 API only; there is no v2 API or v2 store";
const NO_V2_PROXY: &str = "oxcd has no v2 proxy mode";

/// etcd 3.5's flags in its `--help` order, then those it takes without
/// listing them.
pub(crate) static FLAGS: &[Spec] = &[
    // Member
    flag("name", Str, "default", Some("'default'"), Member, "Human-readable name for this member.", Effective),
    flag("data-dir", Str, "", Some("'${name}.oxcd'"), Member, "Path to the data directory.", Effective),
    flag("wal-dir", Str, "", Some("''"), Member, "Path to the dedicated wal directory.", Effective),
    flag("snapshot-count", Uint, "100000", Some("'100000'"), Member, "Number of committed transactions to trigger a snapshot to disk.", Effective),
    flag("heartbeat-interval", Uint, "100", Some("'100'"), Member, "Time (in milliseconds) of a heartbeat interval.", Effective),
    flag("election-timeout", Uint, "1000", Some("'1000'"), Member, "Time (in milliseconds) for an election to timeout. See tuning documentation for details.", Effective),
    flag("initial-election-tick-advance", Bool, "true", Some("'true'"), Member, "Whether to fast-forward initial election ticks on boot for faster election.", Effective),
    flag("listen-peer-urls", Urls(&[""]), "http://localhost:2380", Some("'http://localhost:2380'"), Member, "List of URLs to listen on for peer traffic.", Effective),
    flag("listen-client-urls", Urls(&[""]), "http://localhost:2379", Some("'http://localhost:2379'"), Member, "List of URLs to listen on for client grpc traffic and http as long as --listen-client-http-urls is not specified.", Effective),
    flag("listen-client-http-urls", Urls(&[""]), "", Some("''"), Member, "List of URLs to listen on for http only client traffic. Enabling this flag removes http services from --listen-client-urls.", Effective),
    flag("max-snapshots", Uint, "5", Some("'5'"), Member, "Maximum number of snapshot files to retain (0 is unlimited).", Effective),
    flag("max-wals", Uint, "5", Some("'5'"), Member, "Maximum number of wal files to retain (0 is unlimited).", Effective),
    flag("quota-backend-bytes", Int, "0", Some("'0'"), Member, "Raise alarms when backend size exceeds the given quota (0 defaults to low space quota).", Effective),
    flag("backend-bbolt-freelist-type", Str, "map", Some("'map'"), Member, "BackendFreelistType specifies the type of freelist that boltdb backend uses(array and map are supported types).", NoEffect("oxcd's backend is redb, which has no bbolt freelist")),
    flag("backend-batch-interval", Duration, "0s", Some("''"), Member, "BackendBatchInterval is the maximum time before commit the backend transaction.", Effective),
    flag("backend-batch-limit", Int, "0", Some("'0'"), Member, "BackendBatchLimit is the maximum operations before commit the backend transaction.", Effective),
    flag("max-txn-ops", Uint, "128", Some("'128'"), Member, "Maximum number of operations permitted in a transaction.", Effective),
    flag("max-request-bytes", Uint, "1572864", Some("'1572864'"), Member, "Maximum client request size in bytes the server will accept.", Effective),
    flag("max-concurrent-streams", Uint32, "4294967295", Some("'math.MaxUint32'"), Member, "Maximum concurrent streams that each client can open at a time.", Effective),
    flag("enable-grpc-gateway", Bool, "true", None, Member, "Enable GRPC gateway.", Effective),
    flag("grpc-keepalive-min-time", Duration, "5s", Some("'5s'"), Member, "Minimum duration interval that a client should wait before pinging server.", Effective),
    flag("grpc-keepalive-interval", Duration, "2h", Some("'2h'"), Member, "Frequency duration of server-to-client ping to check if a connection is alive (0 to disable).", Effective),
    flag("grpc-keepalive-timeout", Duration, "20s", Some("'20s'"), Member, "Additional duration of wait before closing a non-responsive connection (0 to disable).", Effective),
    flag("socket-reuse-port", Bool, "false", Some("'false'"), Member, "Enable to set socket option SO_REUSEPORT on listeners allowing rebinding of a port already in use.", Effective),
    flag("socket-reuse-address", Bool, "false", Some("'false'"), Member, "Enable to set socket option SO_REUSEADDR on listeners allowing binding to an address in TIME_WAIT state.", NoEffect("oxcd's listeners always set SO_REUSEADDR")),
    flag("raft-read-timeout", Duration, "5s", Some("'5s'"), Member, "Read timeout set on each rafthttp connection", NoEffect("oxcd's peer links are long-lived gRPC streams, not rafthttp connections")),
    flag("raft-write-timeout", Duration, "5s", Some("'5s'"), Member, "Write timeout set on each rafthttp connection", NoEffect("oxcd's peer links are long-lived gRPC streams, not rafthttp connections")),
    // Clustering
    flag("initial-advertise-peer-urls", Urls(&[""]), "http://localhost:2380", Some("'http://localhost:2380'"), Clustering, "List of this member's peer URLs to advertise to the rest of the cluster.", Effective),
    flag("initial-cluster", Str, "default=http://localhost:2380", Some("'default=http://localhost:2380'"), Clustering, "Initial cluster configuration for bootstrapping.", Effective),
    flag("initial-cluster-state", OneOf(&["new", "existing"]), "new", Some("'new'"), Clustering, "Initial cluster state ('new' when bootstrapping a new cluster or 'existing' when adding new members to an existing cluster).\nAfter successful initialization (bootstrapping or adding), flag is ignored on restarts.", Effective),
    flag("initial-cluster-token", Str, "etcd-cluster", Some("'etcd-cluster'"), Clustering, "Initial cluster token for the etcd cluster during bootstrap.\nSpecifying this can protect you from unintended cross-cluster interaction when running multiple clusters.", Effective),
    flag("advertise-client-urls", Urls(&[""]), "http://localhost:2379", Some("'http://localhost:2379'"), Clustering, "List of this member's client URLs to advertise to the public.\nThe client URLs advertised should be accessible to machines that talk to etcd cluster. etcd client libraries parse these URLs to connect to the cluster.", Effective),
    flag("discovery", Str, "", Some("''"), Clustering, "Discovery URL used to bootstrap the cluster.", Refused("oxcd does not support etcd's v2 discovery service (a discovery URL); bootstrap with --initial-cluster, or from DNS SRV records with --discovery-srv")),
    flag("discovery-fallback", OneOf(&["proxy", "exit"]), "proxy", Some("'proxy'"), Clustering, "Expected behavior ('exit' or 'proxy') when discovery services fails.\n\"proxy\" supports v2 API only.", NoEffect("it only matters with --discovery, which oxcd does not support")),
    flag("discovery-proxy", Str, "", Some("''"), Clustering, "HTTP proxy to use for traffic to discovery service.", NoEffect("it only matters with --discovery, which oxcd does not support")),
    flag("discovery-srv", Str, "", Some("''"), Clustering, "DNS srv domain used to bootstrap the cluster.", Effective),
    flag("discovery-srv-name", Str, "", Some("''"), Clustering, "Suffix to the dns srv name queried when bootstrapping.", Effective),
    flag("strict-reconfig-check", Bool, "true", Some("'true'"), Clustering, "Reject reconfiguration requests that would cause quorum loss.", Effective),
    flag("pre-vote", Bool, "true", Some("'true'"), Clustering, "Enable to run an additional Raft election phase.", Effective),
    flag("auto-compaction-retention", Str, "0", Some("'0'"), Clustering, "Auto compaction retention length. 0 means disable auto compaction.", Effective),
    flag("auto-compaction-mode", Str, "periodic", Some("'periodic'"), Clustering, "Interpret 'auto-compaction-retention' one of: periodic|revision. 'periodic' for duration based retention, defaulting to hours if no time unit is provided (e.g. '5m'). 'revision' for revision number based retention.", Effective),
    flag("enable-v2", Bool, "false", Some("'false'"), Clustering, "Accept etcd V2 client requests. Deprecated and to be decommissioned in v3.6.", NoEffect(NO_V2)),
    flag("v2-deprecation", SomeOf(&["not-yet", "write-only", "write-only-drop-data", "gone"]), "not-yet", Some("'not-yet'"), Clustering, "Phase of v2store deprecation. Allows to opt-in for higher compatibility mode.\nSupported values:\n  'not-yet'                // Issues a warning if v2store have meaningful content (default in v3.5)\n  'write-only'             // Custom v2 state is not allowed (planned default in v3.6)\n  'write-only-drop-data'   // Custom v2 state will get DELETED !\n  'gone'                   // v2store is not maintained any longer. (planned default in v3.7)", NoEffect(NO_V2)),
    // Security
    flag("cert-file", Str, "", Some("''"), Security, "Path to the client server TLS cert file.", Effective),
    flag("key-file", Str, "", Some("''"), Security, "Path to the client server TLS key file.", Effective),
    flag("client-cert-auth", Bool, "false", Some("'false'"), Security, "Enable client cert authentication.", Effective),
    flag("client-cert-file", Str, "", Some("''"), Security, "Path to an explicit peer client TLS cert file otherwise cert file will be used when client auth is required.", Effective),
    flag("client-key-file", Str, "", Some("''"), Security, "Path to an explicit peer client TLS key file otherwise key file will be used when client auth is required.", Effective),
    flag("client-crl-file", Str, "", Some("''"), Security, "Path to the client certificate revocation list file.", Effective),
    flag("client-cert-allowed-hostname", Strings, "", Some("''"), Security, "Comma-separated list of SAN hostnames for client cert authentication.", Effective),
    flag("trusted-ca-file", Str, "", Some("''"), Security, "Path to the client server TLS trusted CA cert file.", Effective),
    flag("auto-tls", Bool, "false", Some("'false'"), Security, "Client TLS using generated certificates.", Effective),
    flag("peer-cert-file", Str, "", Some("''"), Security, "Path to the peer server TLS cert file.", Effective),
    flag("peer-key-file", Str, "", Some("''"), Security, "Path to the peer server TLS key file.", Effective),
    flag("peer-client-cert-auth", Bool, "false", Some("'false'"), Security, "Enable peer client cert authentication.", Effective),
    flag("peer-trusted-ca-file", Str, "", Some("''"), Security, "Path to the peer server TLS trusted CA file.", Effective),
    flag("peer-cert-allowed-cn", Strings, "", Some("''"), Security, "Comma-separated list of allowed CNs for inter-peer TLS authentication.", Effective),
    flag("peer-cert-allowed-hostname", Strings, "", Some("''"), Security, "Comma-separated list of allowed SAN hostnames for inter-peer TLS authentication.", Effective),
    flag("peer-auto-tls", Bool, "false", Some("'false'"), Security, "Peer TLS using self-generated certificates if --peer-key-file and --peer-cert-file are not provided.", Effective),
    flag("peer-client-cert-file", Str, "", Some("''"), Security, "Path to an explicit peer client TLS cert file otherwise peer cert file will be used when client auth is required.", Effective),
    flag("peer-client-key-file", Str, "", Some("''"), Security, "Path to an explicit peer client TLS key file otherwise peer key file will be used when client auth is required.", Effective),
    flag("self-signed-cert-validity", Uint, "1", Some("'1'"), Security, "The validity period of the client and peer certificates that are automatically generated by etcd when you specify ClientAutoTLS and PeerAutoTLS, the unit is year, and the default is 1.", Effective),
    flag("peer-crl-file", Str, "", Some("''"), Security, "Path to the peer certificate revocation list file.", Effective),
    flag("cipher-suites", Strings, "", Some("''"), Security, "Comma-separated list of supported TLS cipher suites between client/server and peers (empty will be auto-populated by Go).", Effective),
    flag("cors", Urls(&["*"]), "*", Some("'*'"), Security, "Comma-separated whitelist of origins for CORS, or cross-origin resource sharing, (empty or * means allow all).", Effective),
    flag("host-whitelist", UniqueStrings, "*", Some("'*'"), Security, "Acceptable hostnames from HTTP client requests, if server is not secure (empty or * means allow all).", Effective),
    flag("tls-min-version", Str, "TLS1.2", Some("'TLS1.2'"), Security, "Minimum TLS version supported by etcd. Possible values: TLS1.2, TLS1.3.", Effective),
    flag("tls-max-version", Str, "", Some("''"), Security, "Maximum TLS version supported by etcd. Possible values: TLS1.2, TLS1.3 (empty will be auto-populated by Go).", Effective),
    // Auth
    flag("auth-token", Str, "simple", Some("'simple'"), Auth, "Specify a v3 authentication token type and its options ('simple' or 'jwt').", Effective),
    flag("bcrypt-cost", Uint, "10", Some("10"), Auth, "Specify the cost / strength of the bcrypt algorithm for hashing auth passwords. Valid values are between 4 and 31.", Effective),
    flag("auth-token-ttl", Uint, "300", Some("300"), Auth, "Time (in seconds) of the auth-token-ttl.", Effective),
    // Profiling and Monitoring
    flag("enable-pprof", Bool, "false", Some("'false'"), Profiling, "Enable runtime profiling data via HTTP server. Address is at client URL + \"/debug/pprof/\"", Effective),
    flag("metrics", Str, "basic", Some("'basic'"), Profiling, "Set level of detail for exported metrics, specify 'extensive' to include server side grpc histogram metrics.", Effective),
    flag("listen-metrics-urls", Urls(&[""]), "", Some("''"), Profiling, "List of URLs to listen on for the /metrics and /health endpoints. For https, the client URL TLS info is used.", Effective),
    // Logging
    flag("logger", Str, "zap", Some("'zap'"), Logging, "Currently only supports 'zap' for structured logging.", Effective),
    flag("log-outputs", UniqueStrings, "default", Some("'default'"), Logging, "Specify 'stdout' or 'stderr' to skip journald logging even when running under systemd, or list of comma separated output targets.", Effective),
    flag("log-level", Str, "info", Some("'info'"), Logging, "Configures log level. Only supports debug, info, warn, error, panic, or fatal.", Effective),
    flag("enable-log-rotation", Bool, "false", Some("'false'"), Logging, "Enable log rotation of a single log-outputs file target.", Effective),
    flag("log-rotation-config-json", Str, r#"{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}"#, Some(r#"'{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}'"#), Logging, "Configures log rotation if enabled with a JSON logger config. MaxSize(MB), MaxAge(days,0=no limit), MaxBackups(0=no limit), LocalTime(use computers local time), Compress(gzip)\". ", Effective),
    // Experimental distributed tracing
    flag("experimental-enable-distributed-tracing", Bool, "false", Some("'false'"), Tracing, "Enable experimental distributed tracing.", Effective),
    flag("experimental-distributed-tracing-address", Str, "localhost:4317", Some("'localhost:4317'"), Tracing, "Distributed tracing collector address.", Effective),
    flag("experimental-distributed-tracing-service-name", Str, "etcd", Some("'etcd'"), Tracing, "Distributed tracing service name, must be same across all etcd instances.", Effective),
    flag("experimental-distributed-tracing-instance-id", Str, "", Some("''"), Tracing, "Distributed tracing instance ID, must be unique per each etcd instance.", Effective),
    flag("experimental-distributed-tracing-sampling-rate", Int, "0", Some("'0'"), Tracing, "Number of samples to collect per million spans for distributed tracing. Disabled by default.", Effective),
    // v2 Proxy
    flag("proxy", OneOf(&["off", "readonly", "on"]), "off", Some("'off'"), Proxy, "Proxy mode setting ('off', 'readonly' or 'on').", Refused(NO_V2_PROXY)),
    flag("proxy-failure-wait", Uint, "5000", Some("5000"), Proxy, "Time (in milliseconds) an endpoint will be held in a failed state.", NoEffect(NO_V2_PROXY)),
    flag("proxy-refresh-interval", Uint, "30000", Some("30000"), Proxy, "Time (in milliseconds) of the endpoints refresh interval.", NoEffect(NO_V2_PROXY)),
    flag("proxy-dial-timeout", Uint, "1000", Some("1000"), Proxy, "Time (in milliseconds) for a dial to timeout.", NoEffect(NO_V2_PROXY)),
    flag("proxy-write-timeout", Uint, "5000", Some("5000"), Proxy, "Time (in milliseconds) for a write to timeout.", NoEffect(NO_V2_PROXY)),
    flag("proxy-read-timeout", Uint, "0", Some("0"), Proxy, "Time (in milliseconds) for a read to timeout.", NoEffect(NO_V2_PROXY)),
    // Experimental feature
    flag("experimental-initial-corrupt-check", Bool, "false", Some("'false'"), Experimental, "Enable to check data corruption before serving any client/peer traffic.", Effective),
    flag("experimental-corrupt-check-time", Duration, "0s", Some("'0s'"), Experimental, "Duration of time between cluster corruption check passes.", Effective),
    flag("experimental-compact-hash-check-enabled", Bool, "false", Some("'false'"), Experimental, "Enable leader to periodically check followers compaction hashes.", Effective),
    flag("experimental-compact-hash-check-time", Duration, "1m", Some("'1m'"), Experimental, "Duration of time between leader checks followers compaction hashes.", Effective),
    flag("experimental-enable-v2v3", Str, "", Some("''"), Experimental, "Serve v2 requests through the v3 backend under a given prefix. Deprecated and to be decommissioned in v3.6.", NoEffect(NO_V2)),
    flag("experimental-enable-lease-checkpoint", Bool, "false", Some("'false'"), Experimental, "ExperimentalEnableLeaseCheckpoint enables primary lessor to persist lease remainingTTL to prevent indefinite auto-renewal of long lived leases.", Effective),
    flag("experimental-enable-lease-checkpoint-persist", Bool, "false", Some("'false'"), Experimental, "Enable persisting remainingTTL to prevent indefinite auto-renewal of long lived leases. Always enabled in v3.6. Should be used to ensure smooth upgrade from v3.5 clusters with this feature enabled. Requires experimental-enable-lease-checkpoint to be enabled.", Effective),
    flag("experimental-compaction-batch-limit", Int, "1000", Some("1000"), Experimental, "ExperimentalCompactionBatchLimit sets the maximum revisions deleted in each compaction batch.", Effective),
    flag("experimental-compaction-sleep-interval", Duration, "10ms", Some("'10ms'"), Experimental, "ExperimentalCompactionSleepInterval sets the sleep interval between each compaction batch.", Effective),
    flag("experimental-peer-skip-client-san-verification", Bool, "false", Some("'false'"), Experimental, "Skip verification of SAN field in client certificate for peer connections.", Effective),
    flag("experimental-watch-progress-notify-interval", Duration, "10m", Some("'10m'"), Experimental, "Duration of periodical watch progress notification.", Effective),
    flag("experimental-downgrade-check-time", Duration, "5s", None, Experimental, "Duration of time between two downgrade status checks.", NoEffect("oxcd does not support cluster downgrades")),
    flag("experimental-memory-mlock", Bool, "false", None, Experimental, "Enable to enforce etcd pages (in particular bbolt) to stay in RAM.", NoEffect("oxcd's backend reads through the page cache; there is no bbolt mmap to lock")),
    flag("experimental-warning-apply-duration", Duration, "100ms", Some("'100ms'"), Experimental, "Warning is generated if requests take more than this duration.", Effective),
    flag("experimental-txn-mode-write-with-shared-buffer", Bool, "true", Some("'true'"), Experimental, "Enable the write transaction to use a shared buffer in its readonly check operations.", NoEffect("a bbolt read buffer detail that oxcd's backend does not have")),
    flag("experimental-bootstrap-defrag-threshold-megabytes", Uint, "0", None, Experimental, "Enable the defrag during etcd server bootstrap on condition that it will free at least the provided threshold of disk space. Needs to be set to non-zero value to take effect.", Effective),
    flag("experimental-stop-grpc-service-on-defrag", Bool, "false", None, Experimental, "Enable etcd gRPC service to stop serving client requests on defragmentation.", NoEffect("oxcd keeps serving during a defragmentation")),
    flag("experimental-snapshot-catchup-entries", Uint64, "5000", Some("'5000'"), Experimental, "(WARNING: Use this flag with caution!) Number of entries for a slow follower to catch up after compacting the raft storage entries.", Effective),
    flag("experimental-lease-checkpoint-interval", Duration, "5m", Some("'5m'"), Experimental, "Duration of time between two lease checkpoints (oxcd; etcd 3.5 sets it only in its embed config).", Effective),
    // Unsafe feature
    flag("force-new-cluster", Bool, "false", Some("'false'"), Unsafe, "Force to create a new one-member cluster.", Effective),
    flag("unsafe-no-fsync", Bool, "false", Some("'false'"), Unsafe, "Disables fsync, unsafe, will cause data loss.", Effective),
    // not in the flag groups of etcd's help
    flag("config-file", Str, "", None, Hidden, "Path to the server configuration file.", Effective),
    flag("version", Bool, "false", None, Hidden, "Print the version and exit.", Effective),
    // etcdmain's `ignored`: flags of old releases, warned about and ignored
    flag("cluster-active-size", Ignored, "", None, Hidden, "", Effective),
    flag("cluster-remove-delay", Ignored, "", None, Hidden, "", Effective),
    flag("cluster-sync-interval", Ignored, "", None, Hidden, "", Effective),
    flag("config", Ignored, "", None, Hidden, "", Effective),
    flag("force", Ignored, "", None, Hidden, "", Effective),
    flag("max-result-buffer", Ignored, "", None, Hidden, "", Effective),
    flag("max-retry-attempts", Ignored, "", None, Hidden, "", Effective),
    flag("peer-heartbeat-interval", Ignored, "", None, Hidden, "", Effective),
    flag("peer-election-timeout", Ignored, "", None, Hidden, "", Effective),
    flag("retry-interval", Ignored, "", None, Hidden, "", Effective),
    flag("snapshot", Ignored, "", None, Hidden, "", Effective),
    flag("v", Ignored, "", None, Hidden, "", Effective),
    flag("vv", Ignored, "", None, Hidden, "", Effective),
];
