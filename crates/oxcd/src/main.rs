//! oxcd: an etcd v3 member. Takes etcd's flags (`--name`, `--data-dir`,
//! ...) and their `ETCD_*` environment variables, with etcd's defaults,
//! except that the default data dir is `${name}.oxcd`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use embed::ServerConfig;

/// mimalloc instead of glibc's malloc: under 100 concurrent clients glibc's
/// arena locks showed up in profiles (futex waits in malloc/free), and
/// mimalloc's thread-local free lists avoid them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "oxcd",
    about = "oxcd: a distributed, reliable key-value store (etcd v3 API)",
    disable_version_flag = true
)]
struct Flags {
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    name: String,
    /// Path to the data directory (default "${name}.oxcd").
    #[arg(long, env = "ETCD_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// List of URLs to listen on for client traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    listen_client_urls: String,
    /// List of URLs to listen on for http only client traffic. Enabling this flag removes http services from --listen-client-urls.
    #[arg(long, env = "ETCD_LISTEN_CLIENT_HTTP_URLS", default_value = "")]
    listen_client_http_urls: String,
    /// List of this member's client URLs to advertise to the public.
    #[arg(
        long,
        env = "ETCD_ADVERTISE_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    advertise_client_urls: String,
    /// List of additional URLs to listen on that will respond to both the /metrics and /health endpoints.
    #[arg(long, env = "ETCD_LISTEN_METRICS_URLS", default_value = "")]
    listen_metrics_urls: String,
    /// Set level of detail for exported metrics, specify 'extensive' to include server side grpc histogram metrics.
    #[arg(long, env = "ETCD_METRICS", default_value = "basic")]
    metrics: String,
    /// List of URLs to listen on for peer traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    listen_peer_urls: String,
    /// List of this member's peer URLs to advertise to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping (default "${name}=http://localhost:2380").
    #[arg(long, env = "ETCD_INITIAL_CLUSTER")]
    initial_cluster: Option<String>,
    /// Initial cluster state ('new' or 'existing').
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_STATE", default_value = "new")]
    initial_cluster_state: String,
    /// Initial cluster token for the etcd cluster during bootstrap.
    #[arg(
        long,
        env = "ETCD_INITIAL_CLUSTER_TOKEN",
        default_value = "etcd-cluster"
    )]
    initial_cluster_token: String,
    /// Reject reconfiguration requests that would cause quorum loss.
    #[arg(long, env = "ETCD_STRICT_RECONFIG_CHECK", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    strict_reconfig_check: bool,
    /// Force to create a new one member cluster.
    #[arg(long, env = "ETCD_FORCE_NEW_CLUSTER", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    force_new_cluster: bool,
    /// Number of committed transactions to trigger a snapshot to disk.
    #[arg(long, env = "ETCD_SNAPSHOT_COUNT", default_value_t = 100_000)]
    snapshot_count: u64,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, env = "ETCD_HEARTBEAT_INTERVAL", default_value_t = 100)]
    heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, env = "ETCD_ELECTION_TIMEOUT", default_value_t = 1000)]
    election_timeout: u64,
    /// Maximum client request size in bytes the server will accept.
    #[arg(long, env = "ETCD_MAX_REQUEST_BYTES", default_value_t = 1572864)]
    max_request_bytes: u64,
    /// Maximum number of operations permitted in a transaction.
    #[arg(long, env = "ETCD_MAX_TXN_OPS", default_value_t = 128)]
    max_txn_ops: u64,
    /// Raise alarms when backend size exceeds the given quota (0 defaults to low space quota).
    #[arg(long, env = "ETCD_QUOTA_BACKEND_BYTES", default_value_t = 0)]
    quota_backend_bytes: i64,
    /// Number of entries for a slow follower to catch up after compacting the raft storage entries.
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_SNAPSHOT_CATCHUP_ENTRIES",
        default_value_t = 5000
    )]
    experimental_snapshot_catchup_entries: u64,
    /// Maximum concurrent streams that each client can open at a time (default unlimited).
    #[arg(long, env = "ETCD_MAX_CONCURRENT_STREAMS", default_value_t = u32::MAX)]
    max_concurrent_streams: u32,
    /// Duration of periodic watch progress notifications (Go duration, e.g. "10m0s", "500ms").
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL",
        default_value = "10m0s",
        value_parser = parse_go_duration
    )]
    experimental_watch_progress_notify_interval: Duration,
    /// Interpret 'auto-compaction-retention' one of: periodic|revision. 'periodic' for duration based retention, defaulting to hours if no time unit is provided (e.g. '5m'). 'revision' for revision number based retention.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_MODE", default_value = "periodic")]
    auto_compaction_mode: String,
    /// Auto compaction retention for mvcc key value store. 0 means disable auto compaction.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    auto_compaction_retention: String,
    /// Enable to check data corruption before serving any client/peer traffic.
    #[arg(long, env = "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    experimental_initial_corrupt_check: bool,
    /// Duration of time between cluster corruption check passes (Go duration; 0s disables).
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME",
        default_value = "0s",
        value_parser = parse_go_duration
    )]
    experimental_corrupt_check_time: Duration,
    /// Enable leader to send regular checkpoints to other members to prevent reset of remaining TTL on leader change.
    #[arg(long, env = "ETCD_EXPERIMENTAL_ENABLE_LEASE_CHECKPOINT", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    experimental_enable_lease_checkpoint: bool,
    /// Enable persisting remainingTTL to prevent indefinite auto-renewal of long lived leases (oxcd always persists checkpoints).
    #[arg(long, env = "ETCD_EXPERIMENTAL_ENABLE_LEASE_CHECKPOINT_PERSIST", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    experimental_enable_lease_checkpoint_persist: bool,
    /// Duration of time between two lease checkpoints (Go duration).
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_LEASE_CHECKPOINT_INTERVAL",
        default_value = "5m0s",
        value_parser = parse_go_duration
    )]
    experimental_lease_checkpoint_interval: Duration,
    /// Disables fsync, unsafe, will cause data loss.
    #[arg(long, env = "ETCD_UNSAFE_NO_FSYNC", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    unsafe_no_fsync: bool,
    /// Path to the client server TLS cert file.
    #[arg(long, env = "ETCD_CERT_FILE", default_value = "")]
    cert_file: String,
    /// Path to the client server TLS key file.
    #[arg(long, env = "ETCD_KEY_FILE", default_value = "")]
    key_file: String,
    /// Enable client cert authentication.
    #[arg(long, env = "ETCD_CLIENT_CERT_AUTH", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    client_cert_auth: bool,
    /// Path to the client certificate revocation list file.
    #[arg(long, env = "ETCD_CLIENT_CRL_FILE", default_value = "")]
    client_crl_file: String,
    /// Path to the client server TLS trusted CA cert file.
    #[arg(long, env = "ETCD_TRUSTED_CA_FILE", default_value = "")]
    trusted_ca_file: String,
    /// Path to the peer server TLS cert file.
    #[arg(long, env = "ETCD_PEER_CERT_FILE", default_value = "")]
    peer_cert_file: String,
    /// Path to the peer server TLS key file.
    #[arg(long, env = "ETCD_PEER_KEY_FILE", default_value = "")]
    peer_key_file: String,
    /// Enable peer client cert authentication.
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_AUTH", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    peer_client_cert_auth: bool,
    /// Path to the peer server TLS trusted CA file.
    #[arg(long, env = "ETCD_PEER_TRUSTED_CA_FILE", default_value = "")]
    peer_trusted_ca_file: String,
    /// Path to the peer certificate revocation list file.
    #[arg(long, env = "ETCD_PEER_CRL_FILE", default_value = "")]
    peer_crl_file: String,
    /// Path to an explicit peer client TLS cert file otherwise cert file will be used when client auth is required.
    #[arg(long, env = "ETCD_CLIENT_CERT_FILE", default_value = "")]
    client_cert_file: String,
    /// Path to an explicit peer client TLS key file otherwise key file will be used when client auth is required.
    #[arg(long, env = "ETCD_CLIENT_KEY_FILE", default_value = "")]
    client_key_file: String,
    /// Path to an explicit peer client TLS cert file otherwise peer cert file will be used when client auth is required.
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_FILE", default_value = "")]
    peer_client_cert_file: String,
    /// Path to an explicit peer client TLS key file otherwise peer key file will be used when client auth is required.
    #[arg(long, env = "ETCD_PEER_CLIENT_KEY_FILE", default_value = "")]
    peer_client_key_file: String,
    /// Comma-separated list of allowed CNs for inter-peer TLS authentication.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_CN", default_value = "")]
    peer_cert_allowed_cn: String,
    /// Comma-separated list of allowed SAN hostnames for inter-peer TLS authentication.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_HOSTNAME", default_value = "")]
    peer_cert_allowed_hostname: String,
    /// Comma-separated list of allowed SAN hostnames for client cert authentication.
    #[arg(long, env = "ETCD_CLIENT_CERT_ALLOWED_HOSTNAME", default_value = "")]
    client_cert_allowed_hostname: String,
    /// Skip verification of SAN field in client certificate for peer connections.
    #[arg(long, env = "ETCD_EXPERIMENTAL_PEER_SKIP_CLIENT_SAN_VERIFICATION", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    experimental_peer_skip_client_san_verification: bool,
    /// Peer TLS using generated certificates.
    #[arg(long, env = "ETCD_PEER_AUTO_TLS", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    peer_auto_tls: bool,
    /// Client TLS using generated certificates.
    #[arg(long, env = "ETCD_AUTO_TLS", default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    auto_tls: bool,
    /// The validity period of the client and peer certificates, unit is year.
    #[arg(long, env = "ETCD_SELF_SIGNED_CERT_VALIDITY", default_value_t = 1)]
    self_signed_cert_validity: u32,
    /// Comma-separated list of supported TLS cipher suites between client/server and peers (empty will be auto-populated by Go).
    #[arg(long, env = "ETCD_CIPHER_SUITES", default_value = "")]
    cipher_suites: String,
    /// Minimum TLS version supported by etcd. Possible values: TLS1.2, TLS1.3.
    #[arg(long, env = "ETCD_TLS_MIN_VERSION", default_value = "TLS1.2")]
    tls_min_version: String,
    /// Maximum TLS version supported by etcd. Possible values: TLS1.2, TLS1.3 (empty defers to Go).
    #[arg(long, env = "ETCD_TLS_MAX_VERSION", default_value = "")]
    tls_max_version: String,
    /// Specify auth token type and options, e.g. "simple" or "jwt,pub-key=<path>,priv-key=<path>,sign-method=<alg>,ttl=<duration>".
    #[arg(long, env = "ETCD_AUTH_TOKEN", default_value = "simple")]
    auth_token: String,
    /// The lifetime in seconds of the auth token.
    #[arg(long, env = "ETCD_AUTH_TOKEN_TTL", default_value_t = 300)]
    auth_token_ttl: u64,
    /// Specify bcrypt algorithm cost factor for auth password hashing.
    #[arg(long, env = "ETCD_BCRYPT_COST", default_value_t = 10)]
    bcrypt_cost: u32,
    /// Configures log level. Only supports debug, info, warn, error, panic, or fatal.
    #[arg(long, env = "ETCD_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Specify 'zap' for structured logging (the only logger oxcd has).
    #[arg(long, env = "ETCD_LOGGER", default_value = "zap")]
    logger: String,
    /// Specify 'stdout' or 'stderr' to skip journald logging even when running under systemd.
    #[arg(long, env = "ETCD_LOG_OUTPUTS", default_value = "default")]
    log_outputs: String,
    /// Print the version and exit.
    #[arg(long)]
    version: bool,
}

/// etcd (Go's flag package) takes `-name` as well as `--name`.
fn normalize_args(args: impl Iterator<Item = String>) -> Vec<String> {
    args.enumerate()
        .map(|(i, a)| {
            let single_dash_long =
                i > 0 && a.starts_with('-') && !a.starts_with("--") && a.len() > 2;
            if single_dash_long {
                format!("-{a}")
            } else {
                a
            }
        })
        .collect()
}

/// Parses a Go `time.Duration` string ("1m30s", "100ms", "1.5h", "0").
fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("time: invalid duration {text:?}");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// etcd's comma-separated list flags (URLs, names): empty items dropped.
fn split_urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .collect()
}

fn config_from(flags: Flags) -> Result<ServerConfig, String> {
    let client_tls = client_tls(&flags);
    let peer_tls = tls::TlsInfo {
        client_cert_file: path(&flags.peer_client_cert_file),
        client_key_file: path(&flags.peer_client_key_file),
        allowed_cns: split_urls(&flags.peer_cert_allowed_cn),
        allowed_hostnames: split_urls(&flags.peer_cert_allowed_hostname),
        ..tls_info(
            [
                &flags.peer_cert_file,
                &flags.peer_key_file,
                &flags.peer_trusted_ca_file,
                &flags.peer_crl_file,
            ],
            flags.peer_client_cert_auth,
            &flags,
        )
    };
    if flags.heartbeat_interval == 0 || flags.election_timeout == 0 {
        return Err("--heartbeat-interval and --election-timeout must be greater than 0".into());
    }
    if 5 * flags.heartbeat_interval > flags.election_timeout {
        return Err(format!(
            "--election-timeout[{}ms] should be at least as 5 times as --heartbeat-interval[{}ms]",
            flags.election_timeout, flags.heartbeat_interval
        ));
    }
    if flags.initial_cluster_state != "new" && flags.initial_cluster_state != "existing" {
        return Err(format!(
            "invalid value {:?} for flag -initial-cluster-state: valid values are \"new\", \"existing\"",
            flags.initial_cluster_state
        ));
    }
    if flags.metrics != "basic" && flags.metrics != "extensive" {
        return Err(format!(
            "unknown metrics option {:?} (only 'basic' and 'extensive' are supported)",
            flags.metrics
        ));
    }
    let auto_compaction = etcdserver::compactor::parse(
        &flags.auto_compaction_mode,
        &flags.auto_compaction_retention,
        parse_go_duration,
    )?;
    if flags.logger != "zap" {
        return Err(format!(
            "unknown logger option {:?} (only 'zap' is supported)",
            flags.logger
        ));
    }
    let advertise_peer = split_urls(&flags.initial_advertise_peer_urls);
    let initial_cluster = flags.initial_cluster.unwrap_or_else(|| {
        advertise_peer
            .iter()
            .map(|u| format!("{}={}", flags.name, u))
            .collect::<Vec<_>>()
            .join(",")
    });
    Ok(ServerConfig {
        data_dir: flags
            .data_dir
            .unwrap_or_else(|| PathBuf::from(format!("{}.oxcd", flags.name))),
        name: flags.name,
        listen_client_urls: split_urls(&flags.listen_client_urls),
        listen_client_http_urls: split_urls(&flags.listen_client_http_urls),
        advertise_client_urls: split_urls(&flags.advertise_client_urls),
        listen_peer_urls: split_urls(&flags.listen_peer_urls),
        initial_advertise_peer_urls: advertise_peer,
        initial_cluster,
        initial_cluster_state: flags.initial_cluster_state,
        initial_cluster_token: flags.initial_cluster_token,
        strict_reconfig_check: flags.strict_reconfig_check,
        force_new_cluster: flags.force_new_cluster,
        snapshot_count: flags.snapshot_count,
        heartbeat: Duration::from_millis(flags.heartbeat_interval),
        election_timeout: Duration::from_millis(flags.election_timeout),
        max_request_bytes: flags.max_request_bytes as usize,
        max_txn_ops: flags.max_txn_ops as usize,
        quota_backend_bytes: quota_backend_bytes(flags.quota_backend_bytes),
        snapshot_catch_up_entries: flags.experimental_snapshot_catchup_entries.max(1),
        max_concurrent_streams: if flags.max_concurrent_streams == u32::MAX {
            None
        } else {
            Some(flags.max_concurrent_streams)
        },
        watch_progress_notify_interval: flags.experimental_watch_progress_notify_interval,
        listen_metrics_urls: split_urls(&flags.listen_metrics_urls),
        metrics_extensive: flags.metrics == "extensive",
        lease_checkpoint_interval: (flags.experimental_enable_lease_checkpoint
            || flags.experimental_enable_lease_checkpoint_persist)
            .then_some(flags.experimental_lease_checkpoint_interval)
            .filter(|interval| !interval.is_zero()),
        auto_compaction,
        initial_corrupt_check: flags.experimental_initial_corrupt_check,
        corrupt_check_time: flags.experimental_corrupt_check_time,
        unsafe_no_fsync: flags.unsafe_no_fsync,
        client_tls,
        auto_tls: flags.auto_tls,
        peer_tls,
        peer_auto_tls: flags.peer_auto_tls,
        peer_skip_client_san_verification: flags.experimental_peer_skip_client_san_verification,
        self_signed_cert_validity: flags.self_signed_cert_validity,
        auth: etcdserver::auth::AuthConfig {
            token: flags.auth_token,
            token_ttl: Duration::from_secs(flags.auth_token_ttl),
            bcrypt_cost: flags.bcrypt_cost,
        },
        ..ServerConfig::default()
    })
}

/// The client port's TLS flags (validated when a listener needs them).
fn client_tls(flags: &Flags) -> tls::TlsInfo {
    tls::TlsInfo {
        client_cert_file: path(&flags.client_cert_file),
        client_key_file: path(&flags.client_key_file),
        allowed_hostnames: split_urls(&flags.client_cert_allowed_hostname),
        ..tls_info(
            [
                &flags.cert_file,
                &flags.key_file,
                &flags.trusted_ca_file,
                &flags.client_crl_file,
            ],
            flags.client_cert_auth,
            flags,
        )
    }
}

/// A path flag; empty is none.
fn path(value: &str) -> Option<std::path::PathBuf> {
    (!value.is_empty()).then(|| std::path::PathBuf::from(value))
}

/// One side's TLS flags: [cert, key, trusted CA, CRL] files, client
/// certificate auth, and the cipher suites and versions both sides share.
fn tls_info(files: [&String; 4], client_cert_auth: bool, flags: &Flags) -> tls::TlsInfo {
    let [cert, key, ca, crl] = files;
    tls::TlsInfo {
        cert_file: path(cert),
        key_file: path(key),
        trusted_ca_file: path(ca),
        client_cert_auth,
        crl_file: path(crl),
        cipher_suites: split_urls(&flags.cipher_suites),
        min_version: Some(flags.tls_min_version.clone()),
        max_version: Some(flags.tls_max_version.clone()),
        ..Default::default()
    }
}

/// etcd's quota rules: 0 is the default (2 GiB), negative disables the
/// quota, and anything above 8 GiB is capped there with a warning.
fn quota_backend_bytes(flag: i64) -> i64 {
    match flag {
        0 => ServerConfig::default().quota_backend_bytes,
        q if q < 0 => 0,
        q if q > etcdserver::alarms::MAX_QUOTA_BYTES => {
            tracing::warn!(
                "quota-size-bytes" = q,
                "quota-maximum-size-bytes" = etcdserver::alarms::MAX_QUOTA_BYTES,
                "quota exceeds the maximum value"
            );
            etcdserver::alarms::MAX_QUOTA_BYTES
        }
        q => q,
    }
}

fn print_version() {
    println!("oxcd Version: {}", env!("CARGO_PKG_VERSION"));
    println!("etcd API Version: {}", etcdserver::ETCD_VERSION);
    println!(
        "Git SHA: {}",
        option_env!("OXCD_GIT_SHA").unwrap_or("unknown")
    );
    println!(
        "OS/Arch: {}/{}",
        std::env::consts::OS,
        std::env::consts::ARCH
    );
}

/// SIGTERM and SIGINT, installed before the member starts so that a signal
/// sent as soon as it is ready is never lost.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "terminated",
            _ = self.int.recv() => "interrupt",
        }
    }
}

/// Arms what OXCD_FAILPOINTS names (etcd's GOFAIL_FAILPOINTS) before
/// anything starts, so that a failpoint can fire during start-up too. A
/// wrong value is refused like a wrong flag: a test must not run believing
/// a failpoint is armed.
#[cfg(feature = "failpoints")]
fn arm_failpoints() -> Result<(), ExitCode> {
    match failpoint::arm_from_env() {
        Ok(names) => {
            for (name, action) in failpoint::list() {
                if names.contains(&name) {
                    tracing::warn!(failpoint = %name, %action, "failpoint armed from {}", failpoint::ENV);
                }
            }
            Ok(())
        }
        Err(e) => {
            eprintln!("oxcd: {}: {e}", failpoint::ENV);
            Err(ExitCode::from(2))
        }
    }
}

fn main() -> ExitCode {
    let flags = Flags::parse_from(normalize_args(std::env::args()));
    if flags.version {
        print_version();
        return ExitCode::SUCCESS;
    }
    if let Err(e) = embed::logutil::init(&flags.log_level) {
        eprintln!("oxcd: {e}");
        return ExitCode::from(2);
    }
    #[cfg(feature = "failpoints")]
    if let Err(code) = arm_failpoints() {
        return code;
    }
    let cfg = match config_from(flags) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("oxcd: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oxcd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let mut signals = match Signals::install() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("oxcd: cannot install signal handlers: {e}");
                return ExitCode::FAILURE;
            }
        };
        let member = match embed::start(cfg).await {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "failed to start etcd server");
                eprintln!("oxcd: {e}");
                return ExitCode::FAILURE;
            }
        };
        let fatal = tokio::select! {
            signal = signals.recv() => {
                tracing::info!(signal, "received signal; shutting down");
                None
            }
            cause = member.fatal() => Some(cause),
            // etcd: a removed member stops and exits with status 0
            _ = member.removed() => None,
        };
        member.stop().await;
        match fatal {
            None => ExitCode::SUCCESS,
            Some(cause) => {
                // etcd's lg.Fatal: the cause is the last line, the exit code 1.
                tracing::error!(cause = %cause, "stopped on a fatal error; exiting");
                eprintln!("oxcd: {cause}");
                ExitCode::FAILURE
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_dash_flags_are_accepted_like_go_flags() {
        let args = normalize_args(
            ["oxcd", "-name", "x", "--data-dir", "d", "-"]
                .iter()
                .map(|s| s.to_string()),
        );
        assert_eq!(args, vec!["oxcd", "--name", "x", "--data-dir", "d", "-"]);
    }

    #[test]
    fn defaults_match_etcd_except_the_data_dir() {
        let cfg = config_from(Flags::parse_from(["oxcd"])).unwrap();
        assert_eq!(cfg.data_dir, PathBuf::from("default.oxcd"));
        assert_eq!(cfg.initial_cluster, "default=http://localhost:2380");
        assert_eq!(cfg.max_request_bytes, 1536 * 1024);
        assert_eq!(cfg.max_concurrent_streams, None);
        let cfg = config_from(Flags::parse_from(["oxcd", "--name", "m1"])).unwrap();
        assert_eq!(cfg.data_dir, PathBuf::from("m1.oxcd"));
    }

    #[test]
    fn watch_progress_notify_interval_takes_go_durations() {
        let cfg = config_from(Flags::parse_from(["oxcd"])).unwrap();
        assert_eq!(cfg.watch_progress_notify_interval, Duration::from_secs(600));
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert!(parse_go_duration("10").is_err());
        assert!(parse_go_duration("5x").is_err());
        let flags = Flags::parse_from([
            "oxcd",
            "--experimental-watch-progress-notify-interval",
            "2s",
        ]);
        assert_eq!(
            config_from(flags).unwrap().watch_progress_notify_interval,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn election_timeout_must_be_five_heartbeats() {
        let flags = Flags::parse_from([
            "oxcd",
            "--heartbeat-interval",
            "300",
            "--election-timeout",
            "1000",
        ]);
        assert!(config_from(flags).unwrap_err().contains("5 times"));
    }
}
