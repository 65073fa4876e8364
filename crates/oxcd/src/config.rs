//! The flags' values to the member's configuration, with etcd's checks
//! (embed/config.go `Validate`, etcdmain's) in etcd's words, and the
//! start-up warnings for flags that do nothing in oxcd.

use std::path::PathBuf;
use std::time::Duration;

use embed::ServerConfig;

use crate::discovery_srv::DiscoverySrv;
use crate::flags::{self, Effect, Flags, Level, Note};

/// etcd's maxElectionMs.
const MAX_ELECTION_MS: u64 = 50_000;
/// etcd's rafthttp DefaultConnReadTimeout / DefaultConnWriteTimeout: the
/// least `--raft-read-timeout` and `--raft-write-timeout` are raised to.
const MIN_RAFT_CONN_TIMEOUT: Duration = Duration::from_secs(5);
/// etcd's recommendedMaxRequestBytes (10 MiB): above it, a warning.
const RECOMMENDED_MAX_REQUEST_BYTES: u64 = 10 * 1024 * 1024;
/// etcd's ErrUnsetAdvertiseClientURLsFlag.
const UNSET_ADVERTISE_CLIENT_URLS: &str =
    "--advertise-client-urls is required when --listen-client-urls is set explicitly";
/// etcd's maxSamplingRatePerMillion.
const MAX_SAMPLING_RATE_PER_MILLION: i64 = 1_000_000;

/// The member's configuration and the lines to log before it starts.
#[derive(Debug)]
pub struct Config {
    pub server: ServerConfig,
    pub notes: Vec<Note>,
    /// `--discovery-srv`: the initial cluster is to come from DNS SRV
    /// records (`DiscoverySrv::bootstrap`, which asks the network).
    pub discovery_srv: Option<DiscoverySrv>,
}

/// The configuration `flags` ask for, or etcd's error for them.
pub fn config_from(flags: &Flags) -> Result<Config, String> {
    if let (Some(path), false) = (flags.config_file(), flags.loaded_from_file()) {
        return Err(format!(
            "the config file {path:?} must be read first (oxcd::config_file::load)"
        ));
    }
    let mut notes = Vec::new();
    // etcd's own checks first: what etcd refuses, oxcd refuses in etcd's
    // words (`--discovery` with `--initial-cluster` is etcd's conflict)
    validate(flags, &mut notes)?;
    for spec in flags::specs() {
        if !flags.is_set(spec.name) {
            continue;
        }
        match spec.effect {
            Effect::Effective => {}
            Effect::NoEffect(reason) => notes.push(Note {
                level: Level::Warn,
                msg: "flag has no effect in oxcd",
                fields: vec![
                    ("flag", format!("--{}", spec.name)),
                    ("reason", reason.to_string()),
                ],
            }),
            Effect::Refused(reason) => {
                let default = flags::set_default(spec);
                if *flags.value(spec.name) != default {
                    return Err(format!(
                        "--{} is not supported by oxcd: {reason}",
                        spec.name
                    ));
                }
            }
        }
    }
    let name = flags.str("name").to_string();
    let advertise_peer = flags.list("initial-advertise-peer-urls").to_vec();
    let initial_cluster = flags.str("initial-cluster").to_string();
    let discovery = ["discovery", "discovery-srv", "discovery-srv-name"]
        .iter()
        .any(|name| !flags.str(name).is_empty());
    // etcd's default initial cluster names the member by --name; a config
    // file keeps embed.NewConfig's, named "default"
    let initial_cluster = if flags.is_set("initial-cluster") || flags.loaded_from_file() {
        initial_cluster
    } else if discovery {
        // etcdmain: a discovery flag clears the default initial cluster
        String::new()
    } else {
        advertise_peer
            .iter()
            .map(|u| format!("{name}={u}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let data_dir = match flags.str("data-dir") {
        "" => PathBuf::from(format!("{name}.oxcd")),
        dir => PathBuf::from(dir),
    };
    let auto_compaction = etcdserver::compactor::parse(
        flags.str("auto-compaction-mode"),
        flags.str("auto-compaction-retention"),
        go_duration,
    )?;
    let keepalive = (flags.nanos("grpc-keepalive-interval") > 0
        && flags.nanos("grpc-keepalive-timeout") > 0)
        .then(|| {
            (
                flags.duration("grpc-keepalive-interval"),
                flags.duration("grpc-keepalive-timeout"),
            )
        });
    let lease_checkpoint = flags.bool("experimental-enable-lease-checkpoint");
    let server = ServerConfig {
        data_dir,
        name,
        listen_client_urls: flags.list("listen-client-urls").to_vec(),
        listen_client_http_urls: flags.list("listen-client-http-urls").to_vec(),
        advertise_client_urls: flags.list("advertise-client-urls").to_vec(),
        listen_peer_urls: flags.list("listen-peer-urls").to_vec(),
        initial_advertise_peer_urls: advertise_peer,
        initial_cluster,
        initial_cluster_state: flags.str("initial-cluster-state").to_string(),
        initial_cluster_token: flags.str("initial-cluster-token").to_string(),
        strict_reconfig_check: flags.bool("strict-reconfig-check"),
        pre_vote: flags.bool("pre-vote"),
        force_new_cluster: flags.bool("force-new-cluster"),
        snapshot_count: flags.uint("snapshot-count"),
        max_snapshots: usize::try_from(flags.uint("max-snapshots")).unwrap_or(usize::MAX),
        max_wals: usize::try_from(flags.uint("max-wals")).unwrap_or(usize::MAX),
        dedicated_wal_dir: match flags.str("wal-dir") {
            "" => None,
            dir => Some(PathBuf::from(dir)),
        },
        // etcd: 0 is the default (100ms, 10000 operations)
        backend_batch: etcdserver::apply::BackendBatch::new(
            flags.duration("backend-batch-interval"),
            usize::try_from(flags.int("backend-batch-limit").max(0)).unwrap_or(usize::MAX),
        ),
        // etcd's NewStore: 0 (either) is its default; a negative limit
        // ranges without a limit, one batch
        compaction_batches: {
            let default = etcdserver::config::CompactionBatches::default();
            etcdserver::config::CompactionBatches {
                limit: match flags.int("experimental-compaction-batch-limit") {
                    0 => default.limit,
                    n => usize::try_from(n).unwrap_or(usize::MAX),
                },
                sleep: match flags.duration("experimental-compaction-sleep-interval") {
                    d if d.is_zero() => default.sleep,
                    d => d,
                },
            }
        },
        heartbeat: Duration::from_millis(flags.uint("heartbeat-interval")),
        election_timeout: Duration::from_millis(flags.uint("election-timeout")),
        max_request_bytes: usize::try_from(flags.uint("max-request-bytes")).unwrap_or(usize::MAX),
        max_txn_ops: usize::try_from(flags.uint("max-txn-ops")).unwrap_or(usize::MAX),
        quota_backend_bytes: etcdserver::alarms::backend_quota(flags.int("quota-backend-bytes")),
        snapshot_catch_up_entries: flags.uint("experimental-snapshot-catchup-entries").max(1),
        max_concurrent_streams: match flags.uint("max-concurrent-streams") {
            n if n >= u64::from(u32::MAX) => None,
            n => Some(n as u32),
        },
        grpc_keepalive: keepalive,
        // etcd sets no enforcement policy for 0 or less: grpc-go's own
        grpc_keepalive_min_time: match flags.nanos("grpc-keepalive-min-time") {
            n if n > 0 => flags.duration("grpc-keepalive-min-time"),
            _ => embed::ping_policy::DEFAULT_MIN_TIME,
        },
        cors: flags.list("cors").to_vec(),
        host_whitelist: flags.list("host-whitelist").to_vec(),
        enable_grpc_gateway: flags.bool("enable-grpc-gateway"),
        socket_reuse_port: flags.bool("socket-reuse-port"),
        watch_progress_notify_interval: flags
            .duration("experimental-watch-progress-notify-interval"),
        listen_metrics_urls: flags.list("listen-metrics-urls").to_vec(),
        metrics_extensive: flags.str("metrics") == "extensive",
        // as etcd: --enable-pprof, or a debug log level
        enable_pprof: flags.bool("enable-pprof") || flags.str("log-level") == "debug",
        lease_checkpoint_interval: lease_checkpoint
            .then(|| flags.duration("experimental-lease-checkpoint-interval"))
            .filter(|interval| !interval.is_zero()),
        auto_compaction,
        initial_corrupt_check: flags.bool("experimental-initial-corrupt-check"),
        corrupt_check_time: flags.duration("experimental-corrupt-check-time"),
        compact_hash_check: flags
            .bool("experimental-compact-hash-check-enabled")
            .then(|| flags.duration("experimental-compact-hash-check-time")),
        // etcd's uint arithmetic (wraps)
        bootstrap_defrag_threshold_bytes: flags
            .uint("experimental-bootstrap-defrag-threshold-megabytes")
            .wrapping_mul(1024 * 1024),
        unsafe_no_fsync: flags.bool("unsafe-no-fsync"),
        client_tls: client_tls(flags),
        auto_tls: flags.bool("auto-tls"),
        peer_tls: peer_tls(flags),
        peer_auto_tls: flags.bool("peer-auto-tls"),
        peer_skip_client_san_verification: flags
            .bool("experimental-peer-skip-client-san-verification"),
        self_signed_cert_validity: u32::try_from(flags.uint("self-signed-cert-validity"))
            .unwrap_or(u32::MAX),
        auth: etcdserver::auth::AuthConfig {
            token: flags.str("auth-token").to_string(),
            token_ttl: Duration::from_secs(flags.uint("auth-token-ttl")),
            bcrypt_cost: u32::try_from(flags.uint("bcrypt-cost")).unwrap_or(u32::MAX),
        },
        distributed_tracing: distributed_tracing(flags),
        warning_apply_duration: flags.duration("experimental-warning-apply-duration"),
        initial_election_tick_advance: flags.bool("initial-election-tick-advance"),
        ..ServerConfig::default()
    };
    let discovery_srv = match flags.str("discovery-srv") {
        "" => None,
        domain => Some(DiscoverySrv {
            domain: domain.to_string(),
            service_name: flags.str("discovery-srv-name").to_string(),
        }),
    };
    Ok(Config {
        server,
        notes,
        discovery_srv,
    })
}

/// `--experimental-enable-distributed-tracing` and its settings (the rate
/// already checked by [`validate`]); None when off.
fn distributed_tracing(flags: &Flags) -> Option<embed::DistributedTracing> {
    if !flags.bool("experimental-enable-distributed-tracing") {
        return None;
    }
    let rate = flags.int("experimental-distributed-tracing-sampling-rate");
    Some(embed::DistributedTracing {
        address: flags
            .str("experimental-distributed-tracing-address")
            .to_string(),
        service_name: flags
            .str("experimental-distributed-tracing-service-name")
            .to_string(),
        service_instance_id: flags
            .str("experimental-distributed-tracing-instance-id")
            .to_string(),
        sampling_rate_per_million: u32::try_from(rate.clamp(0, MAX_SAMPLING_RATE_PER_MILLION))
            .unwrap_or(0),
    })
}

/// A Go duration as the compactor takes it.
fn go_duration(text: &str) -> Result<Duration, String> {
    let nanos = etcdserver::go_duration_nanos(text)?;
    Ok(Duration::from_nanos(nanos.max(0) as u64))
}

/// etcd's checks of values each flag's type lets through.
/// (The logging flags are etcd's first check: `embed::logutil::setup`.)
fn validate(flags: &Flags, notes: &mut Vec<Note>) -> Result<(), String> {
    for name in [
        "listen-peer-urls",
        "listen-client-urls",
        "listen-client-http-urls",
        "listen-metrics-urls",
    ] {
        check_bind_urls(flags.list(name))?;
    }
    if flags.list("listen-client-http-urls").is_empty() {
        notes.push(Note {
            level: Level::Warn,
            msg: "Running http and grpc server on single port. This is not recommended for production.",
            fields: Vec::new(),
        });
    }
    for (name, urls) in [
        (
            "initial-advertise-peer-urls",
            flags.list("initial-advertise-peer-urls"),
        ),
        ("advertise-client-urls", flags.list("advertise-client-urls")),
    ] {
        if let Err(e) = check_host_urls(urls) {
            return Err(format!(
                "--{name} {:?} must be \"host:port\" ({e})",
                urls.join(",")
            ));
        }
    }
    match flags.str("initial-cluster-state") {
        "new" | "existing" => {}
        other => return Err(format!("unexpected clusterState {other:?}")),
    }
    // etcd counts a non-empty --initial-cluster, its default being
    // cleared by a discovery flag
    let initial_cluster_explicit = !flags.str("initial-cluster").is_empty()
        && (flags.loaded_from_file() || flags.is_set("initial-cluster"));
    let bootstrap_ways = [
        !flags.str("discovery").is_empty(),
        initial_cluster_explicit,
        !flags.str("discovery-srv").is_empty(),
    ];
    if bootstrap_ways.iter().filter(|set| **set).count() > 1 {
        return Err("multiple discovery or bootstrap flags are set. Choose one of \"initial-cluster\", \"discovery\" or \"discovery-srv\"".into());
    }
    let (tick, election) = (
        flags.uint("heartbeat-interval"),
        flags.uint("election-timeout"),
    );
    if tick == 0 {
        return Err(format!("--heartbeat-interval must be >0 (set to {tick}ms)"));
    }
    if election == 0 {
        return Err(format!(
            "--election-timeout must be >0 (set to {election}ms)"
        ));
    }
    if 5 * tick > election {
        return Err(format!(
            "--election-timeout[{election}ms] should be at least as 5 times as --heartbeat-interval[{tick}ms]"
        ));
    }
    if election > MAX_ELECTION_MS {
        return Err(format!(
            "--election-timeout[{election}ms] is too long, and should be set less than {MAX_ELECTION_MS}ms"
        ));
    }
    // etcdmain drops the default advertised client URL when the listening
    // ones are given, and embed refuses to run without one (a config file
    // keeps the default one)
    if !flags.loaded_from_file()
        && flags.is_set("listen-client-urls")
        && !flags.is_set("advertise-client-urls")
    {
        notes.push(Note {
            level: Level::Warn,
            msg: "advertise client URLs are not set",
            fields: vec![("error", UNSET_ADVERTISE_CLIENT_URLS.to_string())],
        });
        return Err(UNSET_ADVERTISE_CLIENT_URLS.into());
    }
    match flags.str("auto-compaction-mode") {
        "" | "periodic" | "revision" => {}
        other => return Err(format!("unknown auto-compaction-mode {other:?}")),
    }
    let checkpoint = flags.bool("experimental-enable-lease-checkpoint");
    let persist = flags.bool("experimental-enable-lease-checkpoint-persist");
    if checkpoint && !persist {
        notes.push(Note {
            level: Level::Warn,
            msg: "Detected that checkpointing is enabled without persistence. Consider enabling experimental-enable-lease-checkpoint-persist",
            fields: Vec::new(),
        });
    }
    if persist && !checkpoint {
        return Err("setting experimental-enable-lease-checkpoint-persist requires experimental-enable-lease-checkpoint".into());
    }
    let hash_check = flags.nanos("experimental-compact-hash-check-time");
    if hash_check <= 0 {
        return Err(format!(
            "--experimental-compact-hash-check-time must be >0 (set to {})",
            go_duration_string(hash_check)
        ));
    }
    if flags.bool("experimental-enable-distributed-tracing") {
        let rate = flags.int("experimental-distributed-tracing-sampling-rate");
        let problem = if rate < 0 {
            Some("tracing sampling rate must be positive".to_string())
        } else if rate > MAX_SAMPLING_RATE_PER_MILLION {
            Some(format!(
                "tracing sampling rate must be less than {MAX_SAMPLING_RATE_PER_MILLION}"
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(format!(
                "distributed tracing configurition is not valid: ({problem})"
            ));
        }
    }
    if flags.str("metrics") != "basic" && flags.str("metrics") != "extensive" {
        return Err(format!(
            "unknown metrics option {:?} (only 'basic' and 'extensive' are supported)",
            flags.str("metrics")
        ));
    }
    // etcdmain's configFromCmdLine only: a config file has no such keys
    for name in ["raft-read-timeout", "raft-write-timeout"] {
        if !flags.loaded_from_file() && flags.duration(name) < MIN_RAFT_CONN_TIMEOUT {
            notes.push(Note {
                level: Level::Info,
                msg: if name == "raft-read-timeout" {
                    "raft-read-timeout increased to minimum value: 5s"
                } else {
                    "raft-write-timeout increased to minimum value: 5s"
                },
                fields: Vec::new(),
            });
        }
    }
    let max_request = flags.uint("max-request-bytes");
    if max_request > RECOMMENDED_MAX_REQUEST_BYTES {
        notes.push(Note {
            level: Level::Warn,
            msg: "exceeded recommended request limit",
            fields: vec![
                ("max-request-bytes", max_request.to_string()),
                (
                    "recommended-request-bytes",
                    RECOMMENDED_MAX_REQUEST_BYTES.to_string(),
                ),
            ],
        });
    }
    Ok(())
}

/// etcd's `checkBindURLs`: a listener's host is an IP or `localhost`.
fn check_bind_urls(urls: &[String]) -> Result<(), String> {
    for url in urls {
        if url.starts_with("unix://") || url.starts_with("unixs://") {
            continue;
        }
        let Some(host_port) = url.split_once("://").map(|(_, rest)| rest) else {
            continue;
        };
        let Some((host, _)) = flags::split_host_port(host_port) else {
            return Err(format!("missing port in address {host_port:?}"));
        };
        if host == "localhost" {
            continue;
        }
        if host.parse::<std::net::IpAddr>().is_err() {
            return Err(format!("expected IP in URL for binding ({url})"));
        }
    }
    Ok(())
}

/// etcd's `checkHostURLs`: an advertised URL names a host.
fn check_host_urls(urls: &[String]) -> Result<(), String> {
    for url in urls {
        if url.starts_with("unix://") || url.starts_with("unixs://") {
            continue;
        }
        let host_port = url.split_once("://").map_or("", |(_, rest)| rest);
        match flags::split_host_port(host_port) {
            None => return Err(format!("missing port in address {host_port:?}")),
            Some(("", _)) => return Err(format!("unexpected empty host ({url})")),
            Some(_) => {}
        }
    }
    Ok(())
}

/// Go's `Duration.String` for the few values an error names.
fn go_duration_string(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let abs = nanos.unsigned_abs();
    if abs < 1_000_000_000 {
        return format!("{sign}{abs}ns");
    }
    let secs = abs / 1_000_000_000;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let frac = abs % 1_000_000_000;
    let s = if frac == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{frac:09}").trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => format!("{sign}{s}"),
        (0, m) => format!("{sign}{m}m{s}"),
        (h, m) => format!("{sign}{h}h{m}m{s}"),
    }
}

/// A path flag; empty is none.
fn path(value: &str) -> Option<PathBuf> {
    (!value.is_empty()).then(|| PathBuf::from(value))
}

/// The client port's TLS flags (validated when a listener needs them).
fn client_tls(flags: &Flags) -> tls::TlsInfo {
    tls::TlsInfo {
        client_cert_file: path(flags.str("client-cert-file")),
        client_key_file: path(flags.str("client-key-file")),
        allowed_cns: flags.client_allowed_cns.clone(),
        allowed_hostnames: flags.list("client-cert-allowed-hostname").to_vec(),
        ..tls_info(
            flags,
            [
                "cert-file",
                "key-file",
                "trusted-ca-file",
                "client-crl-file",
            ],
            "client-cert-auth",
        )
    }
}

/// The peer port's TLS flags.
fn peer_tls(flags: &Flags) -> tls::TlsInfo {
    tls::TlsInfo {
        client_cert_file: path(flags.str("peer-client-cert-file")),
        client_key_file: path(flags.str("peer-client-key-file")),
        allowed_cns: flags.list("peer-cert-allowed-cn").to_vec(),
        allowed_hostnames: flags.list("peer-cert-allowed-hostname").to_vec(),
        ..tls_info(
            flags,
            [
                "peer-cert-file",
                "peer-key-file",
                "peer-trusted-ca-file",
                "peer-crl-file",
            ],
            "peer-client-cert-auth",
        )
    }
}

/// One side's TLS flags: [cert, key, trusted CA, CRL] files, client
/// certificate auth, and the cipher suites and versions both sides share.
fn tls_info(flags: &Flags, files: [&str; 4], client_cert_auth: &str) -> tls::TlsInfo {
    let [cert, key, ca, crl] = files.map(|name| path(flags.str(name)));
    tls::TlsInfo {
        cert_file: cert,
        key_file: key,
        trusted_ca_file: ca,
        client_cert_auth: flags.bool(client_cert_auth),
        crl_file: crl,
        cipher_suites: flags.list("cipher-suites").to_vec(),
        min_version: Some(flags.str("tls-min-version").to_string()),
        max_version: Some(flags.str("tls-max-version").to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Result<Config, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match flags::parse(&args, &[]).map_err(|e| e.message)? {
            flags::Parsed::Run(flags) => config_from(&flags),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_tracing_flags_make_the_tracing_config_only_when_enabled() {
        assert_eq!(config(&[]).unwrap().server.distributed_tracing, None);
        // etcd checks the rate only with tracing on
        let off = config(&["--experimental-distributed-tracing-sampling-rate", "-5"]).unwrap();
        assert_eq!(off.server.distributed_tracing, None);
        let defaults = config(&["--experimental-enable-distributed-tracing"]).unwrap();
        assert_eq!(
            defaults.server.distributed_tracing,
            Some(embed::DistributedTracing {
                address: "localhost:4317".into(),
                service_name: "etcd".into(),
                service_instance_id: String::new(),
                sampling_rate_per_million: 0,
            })
        );
        let set = config(&[
            "--experimental-enable-distributed-tracing",
            "--experimental-distributed-tracing-address=collector:4317",
            "--experimental-distributed-tracing-service-name=kv",
            "--experimental-distributed-tracing-instance-id=m1",
            "--experimental-distributed-tracing-sampling-rate=1000000",
        ])
        .unwrap();
        assert_eq!(
            set.server.distributed_tracing,
            Some(embed::DistributedTracing {
                address: "collector:4317".into(),
                service_name: "kv".into(),
                service_instance_id: "m1".into(),
                sampling_rate_per_million: 1_000_000,
            })
        );
        // effective now: no "has no effect" note
        assert!(!set
            .notes
            .iter()
            .any(|n| n.msg == "flag has no effect in oxcd"));
    }

    #[test]
    fn defaults_match_etcd_except_the_data_dir() {
        let cfg = config(&[]).unwrap().server;
        assert_eq!(cfg.data_dir, PathBuf::from("default.oxcd"));
        assert_eq!(cfg.initial_cluster, "default=http://localhost:2380");
        assert_eq!(cfg.max_request_bytes, 1536 * 1024);
        assert_eq!(cfg.max_concurrent_streams, None);
        assert!(cfg.pre_vote && cfg.strict_reconfig_check);
        assert_eq!(
            cfg.grpc_keepalive,
            Some((Duration::from_secs(7200), Duration::from_secs(20)))
        );
        assert_eq!(cfg.watch_progress_notify_interval, Duration::from_secs(600));
        assert_eq!(
            cfg.backend_batch,
            etcdserver::apply::BackendBatch {
                interval: Duration::from_millis(100),
                limit: 10_000
            }
        );
        let cfg = config(&["--name", "m1"]).unwrap().server;
        assert_eq!(cfg.data_dir, PathBuf::from("m1.oxcd"));
        assert_eq!(cfg.initial_cluster, "m1=http://localhost:2380");
    }

    #[test]
    fn a_quota_above_8_gib_reaches_the_member_uncapped() {
        let cfg = config(&["--quota-backend-bytes", "17179869184"])
            .unwrap()
            .server;
        assert_eq!(cfg.quota_backend_bytes, 17_179_869_184);
        let cfg = config(&["--quota-backend-bytes", "-1"]).unwrap().server;
        assert_eq!(cfg.quota_backend_bytes, 0, "disabled");
        let cfg = config(&[]).unwrap().server;
        assert_eq!(cfg.quota_backend_bytes, 2 * 1024 * 1024 * 1024);
    }

    #[test]
    fn election_timeout_must_be_five_heartbeats() {
        let err =
            config(&["--heartbeat-interval", "300", "--election-timeout", "1000"]).unwrap_err();
        assert_eq!(
            err,
            "--election-timeout[1000ms] should be at least as 5 times as --heartbeat-interval[300ms]"
        );
        let err = config(&["--election-timeout", "60000"]).unwrap_err();
        assert!(err.contains("is too long"), "{err}");
    }

    #[test]
    fn pre_vote_false_turns_it_off_and_keepalive_zero_disables() {
        let cfg = config(&[
            "--pre-vote=false",
            "--grpc-keepalive-interval=0",
            "--backend-batch-interval=10ms",
            "--backend-batch-limit=5",
        ])
        .unwrap()
        .server;
        assert!(!cfg.pre_vote);
        assert_eq!(cfg.grpc_keepalive, None);
        assert_eq!(
            cfg.backend_batch,
            etcdserver::apply::BackendBatch {
                interval: Duration::from_millis(10),
                limit: 5
            }
        );
    }

    #[test]
    fn no_effect_flags_are_noted_once_and_refused_ones_refused() {
        let cfg = config(&["--enable-v2=true", "--backend-bbolt-freelist-type", "array"]).unwrap();
        let flagged: Vec<&str> = cfg
            .notes
            .iter()
            .filter(|n| n.msg == "flag has no effect in oxcd")
            .map(|n| n.fields[0].1.as_str())
            .collect();
        assert_eq!(flagged, ["--backend-bbolt-freelist-type", "--enable-v2"]);
        let err = config(&["--proxy", "on"]).unwrap_err();
        assert!(err.starts_with("--proxy is not supported by oxcd"), "{err}");
        assert!(config(&["--proxy", "off"]).is_ok());
    }

    #[test]
    fn wal_dir_and_max_wals_reach_the_member() {
        let cfg = config(&[]).unwrap().server;
        assert_eq!(cfg.dedicated_wal_dir, None);
        assert_eq!(cfg.wal_dir(), PathBuf::from("default.oxcd/member/wal"));
        assert_eq!((cfg.max_wals, cfg.max_snapshots), (5, 5));
        let cfg = config(&[
            "--data-dir",
            "/d",
            "--wal-dir",
            "/fast/wal",
            "--max-wals",
            "0",
        ])
        .unwrap();
        assert!(
            !cfg.notes
                .iter()
                .any(|n| n.msg == "flag has no effect in oxcd"),
            "{:?}",
            cfg.notes
        );
        let cfg = cfg.server;
        assert_eq!(cfg.dedicated_wal_dir, Some(PathBuf::from("/fast/wal")));
        assert_eq!(cfg.wal_dir(), PathBuf::from("/fast/wal"));
        assert_eq!(cfg.max_wals, 0);
        // --wal-dir '' is the default: member/wal
        let cfg = config(&["--data-dir", "/d", "--wal-dir", ""])
            .unwrap()
            .server;
        assert_eq!(cfg.wal_dir(), PathBuf::from("/d/member/wal"));
        // etcd's variables and config file keys
        let env = [("ETCD_WAL_DIR", "/e/wal"), ("ETCD_MAX_WALS", "3")]
            .map(|(k, v)| (k.to_string(), v.to_string()));
        let flags = match flags::parse(&[], &env).unwrap() {
            flags::Parsed::Run(flags) => flags,
            other => panic!("{other:?}"),
        };
        let cfg = config_from(&flags).unwrap().server;
        assert_eq!(cfg.wal_dir(), PathBuf::from("/e/wal"));
        assert_eq!(cfg.max_wals, 3);
        let file = "wal-dir: /f/wal\nmax-wals: 0\n";
        let flags = crate::config_file::load(&flags, "etcd.conf.yml", file).unwrap();
        let cfg = config_from(&flags).unwrap().server;
        assert_eq!(cfg.wal_dir(), PathBuf::from("/f/wal"));
        assert_eq!(cfg.max_wals, 0);
    }

    #[test]
    fn etcds_cross_flag_checks() {
        let err = config(&["--experimental-enable-lease-checkpoint-persist"]).unwrap_err();
        assert_eq!(err, "setting experimental-enable-lease-checkpoint-persist requires experimental-enable-lease-checkpoint");
        let err = config(&["--experimental-compact-hash-check-time", "0s"]).unwrap_err();
        assert_eq!(
            err,
            "--experimental-compact-hash-check-time must be >0 (set to 0s)"
        );
        let err = config(&["--listen-client-urls", "http://127.0.0.1:2379"]).unwrap_err();
        assert_eq!(err, UNSET_ADVERTISE_CLIENT_URLS);
        let err = config(&[
            "--listen-client-urls",
            "http://example.com:2379",
            "--advertise-client-urls",
            "http://example.com:2379",
        ])
        .unwrap_err();
        assert_eq!(
            err,
            "expected IP in URL for binding (http://example.com:2379)"
        );
        let err = config(&["--auto-compaction-mode", "sometimes"]).unwrap_err();
        assert_eq!(err, "unknown auto-compaction-mode \"sometimes\"");
        assert!(config(&[
            "--experimental-enable-distributed-tracing",
            "--experimental-distributed-tracing-sampling-rate=2000000"
        ])
        .is_err());
    }

    #[test]
    fn bootstrap_flags_combine_as_etcds() {
        const CONFLICT: &str = "multiple discovery or bootstrap flags are set. Choose one of \"initial-cluster\", \"discovery\" or \"discovery-srv\"";
        let cfg = config(&["--name", "m1", "--discovery-srv", "example.com"]).unwrap();
        // etcdmain: a discovery flag clears the default initial cluster
        assert_eq!(cfg.server.initial_cluster, "");
        assert_eq!(
            cfg.discovery_srv,
            Some(DiscoverySrv {
                domain: "example.com".into(),
                service_name: String::new()
            })
        );
        let args = [
            "--discovery-srv",
            "example.com",
            "--discovery-srv-name",
            "c1",
        ];
        let cfg = config(&args).unwrap();
        assert_eq!(cfg.discovery_srv.unwrap().service_name, "c1");
        let cfg = config(&["--discovery-srv-name", "c1"]).unwrap();
        assert_eq!(
            (cfg.server.initial_cluster.as_str(), cfg.discovery_srv),
            ("", None)
        );
        let both = ["--discovery-srv", "x", "--initial-cluster", "m=http://a:1"];
        assert_eq!(config(&both).unwrap_err(), CONFLICT);
        // an empty --initial-cluster is not one
        assert!(config(&["--discovery-srv", "x", "--initial-cluster", ""]).is_ok());
        // etcd's conflict before oxcd's refusal of --discovery
        let both = [
            "--discovery",
            "https://d.example/t",
            "--initial-cluster",
            "m=http://a:1",
        ];
        assert_eq!(config(&both).unwrap_err(), CONFLICT);
        let err = config(&["--discovery", "https://d.example/t"]).unwrap_err();
        assert!(
            err.starts_with("--discovery is not supported by oxcd"),
            "{err}"
        );
        assert!(
            err.ends_with(
                "bootstrap with --initial-cluster, or from DNS SRV records with --discovery-srv"
            ),
            "{err}"
        );
        let env = [("ETCD_DISCOVERY_SRV".to_string(), "example.org".to_string())];
        let flags = match flags::parse(&[], &env).unwrap() {
            flags::Parsed::Run(flags) => flags,
            other => panic!("{other:?}"),
        };
        let cfg = config_from(&flags).unwrap();
        assert_eq!(cfg.discovery_srv.unwrap().domain, "example.org");
    }

    #[test]
    fn go_durations_print_as_go() {
        assert_eq!(go_duration_string(90 * 1_000_000_000), "1m30s");
        assert_eq!(go_duration_string(-1_500_000_000), "-1.5s");
        assert_eq!(go_duration_string(3_600 * 1_000_000_000), "1h0m0s");
    }
}
