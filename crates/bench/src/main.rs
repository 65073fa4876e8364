//! `oxbench`: the command line of etcd's `benchmark` tool.

use std::time::Duration;

use bench::auth::{ask_password, credentials_from_flags};
use bench::client::Settings;
use bench::report::Precision;
use bench::workloads::{
    failover, health, lease, lease_expire, put, range, snapshot, txn_put, watch, watch_latency,
};
use clap::{ArgAction, Parser, Subcommand};

/// mimalloc, as oxcd: with glibc's malloc a third of oxbench's CPU went to
/// malloc/free and their arena locks (perf, range 100 clients), and the
/// client shares the 2 cores with the server it measures.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "oxbench",
    about = "A low-level benchmark tool for etcd3 (etcd's `benchmark`, for oxcd)",
    long_about = "oxbench is a low-level benchmark tool for etcd3.\n\
                  It uses gRPC clients directly and does not depend on\n\
                  an etcd client library."
)]
struct Cli {
    /// gRPC endpoints
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "127.0.0.1:2379"
    )]
    endpoints: Vec<String>,
    /// Total number of gRPC connections
    #[arg(long, global = true, default_value_t = 1)]
    conns: usize,
    /// Total number of gRPC clients
    #[arg(long, global = true, default_value_t = 1)]
    clients: usize,
    /// use full floating point precision
    #[arg(long, global = true, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_value_t = false, default_missing_value = "true")]
    precise: bool,
    /// Print the summary as one JSON object (for scripts)
    #[arg(long, global = true, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_value_t = false, default_missing_value = "true")]
    json: bool,
    /// dial timeout for client connections (e.g. 2s, 500ms; 0 waits as long as the OS does)
    #[arg(long, global = true, default_value = "0", value_parser = parse_duration)]
    dial_timeout: Duration,
    /// verify certificates of TLS-enabled secure servers using this CA bundle
    #[arg(long = "cacert", id = "tls_cacert", global = true, default_value = "")]
    cacert: String,
    /// identify secure client using this TLS certificate file
    #[arg(long = "cert", id = "tls_cert", global = true, default_value = "")]
    cert: String,
    /// identify secure client using this TLS key file
    #[arg(long = "key", id = "tls_key", global = true, default_value = "")]
    key: String,
    /// provide username[:password] and prompt if password is not supplied.
    #[arg(long, global = true, default_value = "")]
    user: String,
    /// password for authentication (if this option is used, --user option shouldn't include password)
    #[arg(long, global = true, default_value = "")]
    password: String,
    /// Runtime worker threads for the client (0: one per CPU)
    #[arg(long, global = true, default_value_t = 0)]
    client_threads: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmark put
    Put {
        /// Key size of put request
        #[arg(long, default_value_t = 8)]
        key_size: usize,
        /// Value size of put request
        #[arg(long, default_value_t = 8)]
        val_size: usize,
        /// Maximum puts per second (0 is no limit)
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Total number of put requests
        #[arg(long, default_value_t = 10000)]
        total: u64,
        /// Maximum possible keys
        #[arg(long, default_value_t = 1)]
        key_space_size: u64,
        /// Use sequential keys
        #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
              default_value_t = false, default_missing_value = "true")]
        sequential_keys: bool,
    },
    /// Benchmark range
    Range {
        key: String,
        end: Option<String>,
        /// Maximum range requests per second (0 is no limit)
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Total number of range requests
        #[arg(long, default_value_t = 10000)]
        total: u64,
        /// Linearizable(l) or Serializable(s)
        #[arg(long, default_value = "l")]
        consistency: String,
        /// Maximum number of results to return from range request (0 is no limit)
        #[arg(long, default_value_t = 0)]
        limit: i64,
    },
    /// Benchmark txn-put
    #[command(name = "txn-put")]
    TxnPut {
        /// Key size of txn put
        #[arg(long, default_value_t = 8)]
        key_size: usize,
        /// Value size of txn put
        #[arg(long, default_value_t = 8)]
        val_size: usize,
        /// Number of puts per txn
        #[arg(long, default_value_t = 1)]
        txn_ops: u64,
        /// Maximum txns per second (0 is no limit)
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Total number of txn requests
        #[arg(long, default_value_t = 10000)]
        total: u64,
        /// Maximum possible keys
        #[arg(long, default_value_t = 1)]
        key_space_size: u64,
    },
    /// Benchmark watch
    Watch {
        /// Total watch streams
        #[arg(long, default_value_t = 10)]
        streams: usize,
        /// Total watchers per stream
        #[arg(long, default_value_t = 100)]
        watch_per_stream: usize,
        /// Total number of keys to be watched
        #[arg(long, default_value_t = 1)]
        watched_key_total: usize,
        /// Number of keys to put per second (0 is no limit)
        #[arg(long, default_value_t = 0)]
        put_rate: u64,
        /// Number of put requests
        #[arg(long, default_value_t = 1000)]
        put_total: u64,
        /// Key size of watch request
        #[arg(long, default_value_t = 32)]
        key_size: usize,
        /// Maximum possible keys
        #[arg(long, default_value_t = 1)]
        key_space_size: u64,
        /// Use sequential keys
        #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
              default_value_t = false, default_missing_value = "true")]
        sequential_keys: bool,
    },
    /// Benchmark watch latency
    #[command(name = "watch-latency")]
    WatchLatency {
        /// Total watch streams
        #[arg(long, default_value_t = 10)]
        streams: usize,
        /// Total watchers per stream
        #[arg(long, default_value_t = 10)]
        watchers_per_stream: usize,
        /// PrevKV enabled on watch requests
        #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
              default_value_t = false, default_missing_value = "true")]
        prevkv: bool,
        /// Total number of put requests
        #[arg(long, default_value_t = 1000)]
        put_total: u64,
        /// Number of keys to put per second
        #[arg(long, default_value_t = 100)]
        put_rate: u64,
        /// Puts that may go at once before the rate applies (0: --put-rate, as
        /// etcd's; oxbench's own: 1 spaces every put)
        #[arg(long, default_value_t = 0)]
        put_burst: u64,
        /// Key size of watch response
        #[arg(long, default_value_t = 32)]
        key_size: usize,
        /// Value size of watch response
        #[arg(long, default_value_t = 32)]
        val_size: usize,
        /// Once every watcher is created, create this file and wait until it is
        /// removed before the first put (oxbench's own: bench/watch-scale.sh
        /// reads the server's memory then)
        #[arg(long)]
        pause_file: Option<std::path::PathBuf>,
    },
    /// One client putting continuously through the endpoints (a deadline per
    /// put, retried on another endpoint), every endpoint's Status polled;
    /// each acknowledged put, failed put and leader change goes to --timeline.
    /// Not an etcd benchmark command: bench/failover.sh kills the leader under it.
    Failover {
        /// Where the timeline goes (one line per fact; see the module doc)
        #[arg(long)]
        timeline: std::path::PathBuf,
        /// Deadline of each put and each Status poll
        #[arg(long, default_value = "100ms", value_parser = parse_duration)]
        request_timeout: Duration,
        /// Stop after this long (else at SIGTERM or SIGINT)
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        duration: Duration,
        /// Put through a follower (follower) or keep an endpoint until it fails (any)
        #[arg(long, default_value = "follower")]
        via: failover::Via,
    },
    /// Many leases (one key each) expiring together under a steady writer
    #[command(name = "lease-expire")]
    LeaseExpire {
        /// Leases to grant, each with one key
        #[arg(long, default_value_t = 10000)]
        leases: u64,
        /// TTL of every lease, in seconds
        #[arg(long, default_value_t = 5)]
        ttl: i64,
        /// Puts per second of the writer during the expiry
        #[arg(long, default_value_t = 200)]
        put_rate: u64,
    },
    /// Benchmark lease keepalive
    #[command(name = "lease-keepalive")]
    LeaseKeepalive {
        /// Total number of lease keepalive requests
        #[arg(long, default_value_t = 10000)]
        total: u64,
    },
    /// Wait until the first endpoint is healthy (Status has a leader and a
    /// linearizable read succeeds) and print how long it took. Not an etcd
    /// benchmark command: bench/compare.sh times restarts with it.
    Health {
        /// Give up after this long
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Stream one Maintenance.Snapshot from the first endpoint, discarding
    /// it, and print its size, time and rate. Not an etcd benchmark command:
    /// bench/large-db.sh times the member's side of a snapshot save with it.
    Snapshot {
        /// Also check the sha256 etcd appends (costs the client CPU)
        #[arg(long)]
        verify: bool,
    },
}

/// Go-style durations as flags take them: `500ms`, `2s`, `1m`, or bare seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}"))?;
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("invalid duration unit in {text:?}")),
    };
    Ok(Duration::from_secs_f64(number * scale))
}

/// TLS to the endpoints when any of `--cacert`, `--cert`, `--key` is given
/// (etcdctl's flags; without `--cacert`, the system's roots).
fn client_tls(
    cacert: &str,
    cert: &str,
    key: &str,
) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, String> {
    if cacert.is_empty() && cert.is_empty() && key.is_empty() {
        return Ok(None);
    }
    let path = |p: &str| (!p.is_empty()).then(|| std::path::PathBuf::from(p));
    tls::TlsInfo {
        trusted_ca_file: path(cacert),
        cert_file: path(cert),
        key_file: path(key),
        ..Default::default()
    }
    .client_config()
    .map(Some)
    .map_err(|e| e.to_string())
}

async fn run(cli: Cli) -> Result<(), String> {
    let settings = Settings {
        endpoints: cli.endpoints,
        conns: cli.conns,
        clients: cli.clients,
        precision: if cli.precise {
            Precision::Shortest
        } else {
            Precision::Fixed4
        },
        json: cli.json,
        dial_timeout: (!cli.dial_timeout.is_zero()).then_some(cli.dial_timeout),
        tls: client_tls(&cli.cacert, &cli.cert, &cli.key)?,
        credentials: credentials_from_flags(&cli.user, &cli.password, ask_password)?,
    };
    if settings.endpoints.is_empty() {
        return Err("no --endpoints given".into());
    }
    match cli.command {
        Command::Put {
            key_size,
            val_size,
            rate,
            total,
            key_space_size,
            sequential_keys,
        } => {
            let opts = put::PutOptions {
                key_size,
                val_size,
                total,
                rate,
                key_space_size,
                sequential_keys,
            };
            put::run(&settings, &opts).await
        }
        Command::Range {
            key,
            end,
            rate,
            total,
            consistency,
            limit,
        } => {
            let opts = range::RangeOptions {
                key,
                end,
                consistency,
                total,
                rate,
                limit,
            };
            range::run(&settings, &opts).await
        }
        Command::TxnPut {
            key_size,
            val_size,
            txn_ops,
            rate,
            total,
            key_space_size,
        } => {
            let opts = txn_put::TxnPutOptions {
                key_size,
                val_size,
                total,
                rate,
                txn_ops,
                key_space_size,
            };
            txn_put::run(&settings, &opts).await
        }
        Command::Watch {
            streams,
            watch_per_stream,
            watched_key_total,
            put_rate,
            put_total,
            key_size,
            key_space_size,
            sequential_keys,
        } => {
            let opts = watch::WatchOptions {
                streams,
                watch_per_stream,
                watched_key_total,
                put_rate,
                put_total,
                key_size,
                key_space_size,
                sequential_keys,
            };
            watch::run(&settings, &opts).await
        }
        Command::WatchLatency {
            streams,
            watchers_per_stream,
            prevkv,
            put_total,
            put_rate,
            put_burst,
            key_size,
            val_size,
            pause_file,
        } => {
            let opts = watch_latency::WatchLatencyOptions {
                streams,
                watchers_per_stream,
                prevkv,
                put_total,
                put_rate,
                put_burst,
                key_size,
                val_size,
                pause_file,
            };
            watch_latency::run(&settings, &opts).await
        }
        Command::Failover {
            timeline,
            request_timeout,
            duration,
            via,
        } => {
            let opts = failover::FailoverOptions {
                timeline,
                request_timeout,
                duration,
                via,
            };
            failover::run(&settings, &opts).await
        }
        Command::LeaseKeepalive { total } => lease::run(&settings, total).await,
        Command::LeaseExpire {
            leases,
            ttl,
            put_rate,
        } => {
            let opts = lease_expire::LeaseExpireOptions {
                leases,
                ttl,
                put_rate,
            };
            lease_expire::run(&settings, &opts).await
        }
        Command::Health { timeout } => health::run(&settings, timeout).await,
        Command::Snapshot { verify } => snapshot::run(&settings, verify).await,
    }
}

fn main() {
    let cli = Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if cli.client_threads > 0 {
        runtime.worker_threads(cli.client_threads);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("oxbench: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(message) = runtime.block_on(run(cli)) {
        eprintln!("{message}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(args).expect("valid command line")
    }

    #[test]
    fn user_and_password_are_global_flags() {
        let cli = parse(&["oxbench", "put", "--user", "bench:pw", "--total", "1"]);
        assert_eq!((cli.user.as_str(), cli.password.as_str()), ("bench:pw", ""));
        let cli = parse(&[
            "oxbench",
            "--user",
            "bench",
            "--password",
            "pw",
            "range",
            "foo",
        ]);
        assert_eq!((cli.user.as_str(), cli.password.as_str()), ("bench", "pw"));
        let cli = parse(&["oxbench", "range", "foo"]);
        assert_eq!((cli.user.as_str(), cli.password.as_str()), ("", ""));
    }
}
