//! oxctl: offline tools for oxcd data dirs and snapshot files, the role of
//! etcd's `etcdutl` (same subcommands, flags, defaults, output formats and
//! error lines).
//!
//! * `oxctl snapshot status FILE [-w simple|table|json|fields]`
//! * `oxctl snapshot restore FILE --name N --data-dir D --initial-cluster ...
//!   --initial-cluster-token T --initial-advertise-peer-urls U [--skip-hash-check]`
//! * `oxctl defrag --data-dir D`, `oxctl version`
//! * `oxctl backup --data-dir D --backup-dir B` (etcdutl's legacy backup:
//!   a copy to start with `--force-new-cluster`, [`backup`])
//! * `oxctl migrate --data-dir D`: a stopped etcd member's data dir becomes
//!   an oxcd one in place, etcd's files kept beside it ([`migrate`])
//! * beyond etcdutl 3.5: `oxctl hashkv --data-dir D [--rev R]` (3.6 has it)
//!   and `oxctl check --data-dir D` (the WAL's and backend's checksums, and
//!   what a start would do)
//!
//! It never talks to a running member: `etcdctl snapshot save` (or any
//! client of Maintenance.Snapshot) makes the file. What a snapshot file
//! holds is fixed in [`mvcc::snapshot_file`]; what restore writes is in
//! [`snapshot::restore`].

pub mod backup;
pub mod datadir;
pub mod etcd_dir;
pub mod migrate;
pub mod snapshot;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad arguments, or --help: clap's own message.
    #[error("{0}")]
    Usage(#[from] clap::Error),
    #[error("{0}")]
    Failed(String),
}

impl From<mvcc::snapshot_file::SnapshotFileError> for CliError {
    fn from(e: mvcc::snapshot_file::SnapshotFileError) -> Self {
        CliError::Failed(e.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError::Failed(e.to_string())
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "oxctl",
    about = "A simple command line client for oxcd data (etcdutl's offline commands)."
)]
struct Cli {
    /// Set the output format (fields, json, simple, table).
    #[arg(
        short = 'w',
        long = "write-out",
        global = true,
        default_value = "simple"
    )]
    write_out: OutputFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Simple,
    Table,
    Json,
    Fields,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Manages oxcd node snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Defragments the storage of a stopped member (its data dir).
    Defrag {
        /// Data directory of the member.
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Prints the hash of the key history of a stopped member (etcdutl 3.6's
    /// hashkv; `etcdctl endpoint hashkv` gives the same on a running one).
    Hashkv {
        #[arg(long)]
        data_dir: PathBuf,
        /// Revision to hash (0: the latest).
        #[arg(long, default_value_t = 0)]
        rev: i64,
    },
    /// Checks a stopped member's data dir: WAL and backend checksums, and
    /// what a start would do.
    Check {
        #[arg(long)]
        data_dir: PathBuf,
        /// The member's dedicated WAL directory (its --wal-dir), if any.
        #[arg(long)]
        wal_dir: Option<PathBuf>,
    },
    /// Converts a stopped etcd 3.4 or 3.5 member's data dir into an oxcd data
    /// dir for the same member, in place; etcd's files are kept in
    /// member.etcd for the way back.
    Migrate {
        /// Data directory of the etcd member (stop etcd first).
        #[arg(long)]
        data_dir: PathBuf,
        /// etcd's dedicated WAL directory, if it had one: oxcd's WAL takes
        /// its place (start oxcd with the same --wal-dir), etcd's is kept
        /// beside it as <wal-dir>.etcd.
        #[arg(long)]
        wal_dir: Option<PathBuf>,
    },
    /// [legacy] offline backup of an oxcd directory (prefer: `etcdctl
    /// snapshot save`): a copy with new IDs, to start with --force-new-cluster.
    Backup {
        /// Path to the oxcd data dir.
        #[arg(long)]
        data_dir: PathBuf,
        /// Path to the backup dir.
        #[arg(long)]
        backup_dir: PathBuf,
        /// Path to the member's WAL dir (its --wal-dir, if it has one).
        #[arg(long)]
        wal_dir: Option<PathBuf>,
        /// Path to the backup's WAL dir (default: the backup dir's
        /// member/wal).
        #[arg(long)]
        backup_wal_dir: Option<PathBuf>,
        /// Backup v3 backend data.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        with_v3: bool,
    },
    /// Prints the version of oxctl.
    Version,
}

#[derive(Subcommand, Debug)]
enum SnapshotCommand {
    /// Gets backend snapshot status of a given file.
    Status { filename: PathBuf },
    /// Restores an oxcd member snapshot to an oxcd directory.
    Restore {
        filename: PathBuf,
        /// Path to the data directory (default "${name}.oxcd").
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Human-readable name for this member.
        #[arg(long, default_value = "default")]
        name: String,
        /// Initial cluster configuration for restore bootstrap.
        #[arg(long, default_value = "default=http://localhost:2380")]
        initial_cluster: String,
        /// Initial cluster token for the cluster during restore bootstrap.
        #[arg(long, default_value = "etcd-cluster")]
        initial_cluster_token: String,
        /// List of this member's peer URLs to advertise to the rest of the cluster.
        #[arg(long, default_value = "http://localhost:2380")]
        initial_advertise_peer_urls: String,
        /// Ignore snapshot integrity hash value (required if copied from data directory).
        #[arg(long)]
        skip_hash_check: bool,
        /// Path to the WAL directory (use --data-dir if none given).
        #[arg(long)]
        wal_dir: Option<PathBuf>,
        /// Initial memory map size of the database in bytes (accepted for
        /// etcdutl's sake: oxcd's backend maps no memory).
        #[arg(long, default_value_t = 0)]
        initial_memory_map_size: u64,
        /// How much to increase the latest revision after restore.
        #[arg(long, default_value_t = 0)]
        bump_revision: u64,
        /// Mark the latest revision after restore as the point of scheduled
        /// compaction (required if --bump-revision > 0, disallowed otherwise).
        #[arg(long)]
        mark_compacted: bool,
    },
}

/// Runs one oxctl command line (`args[0]` is the program name), writing
/// its output to `out`; logs go to stderr as etcdutl's do.
pub fn run<I, T>(args: I, out: &mut dyn Write) -> Result<(), CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    match cli.command {
        Command::Defrag { data_dir } => out.write_all(datadir::defrag(&data_dir)?.as_bytes())?,
        Command::Hashkv { data_dir, rev } => {
            out.write_all(datadir::hashkv(&data_dir, rev, cli.write_out)?.as_bytes())?
        }
        Command::Check { data_dir, wal_dir } => {
            out.write_all(datadir::check(&data_dir, wal_dir.as_deref())?.as_bytes())?
        }
        Command::Backup {
            data_dir,
            backup_dir,
            wal_dir,
            backup_wal_dir,
            with_v3,
        } => {
            let dirs = backup::BackupDirs {
                data_dir: &data_dir,
                wal_dir: wal_dir.as_deref(),
                backup_dir: &backup_dir,
                backup_wal_dir: backup_wal_dir.as_deref(),
            };
            let done = backup::backup(&dirs, with_v3)?;
            out.write_all(
                format!(
                    "backed up {} to {} as member {:x} of cluster {:x} ({} entries, {} membership entries emptied); \
                     start it with --force-new-cluster\n",
                    data_dir.display(),
                    backup_dir.display(),
                    done.member_id,
                    done.cluster_id,
                    done.entries,
                    done.emptied
                )
                .as_bytes(),
            )?
        }
        Command::Migrate { data_dir, wal_dir } => {
            let migrated = migrate::migrate(&data_dir, wal_dir.as_deref())?;
            out.write_all(migrate::report(&data_dir, &migrated).as_bytes())?
        }
        Command::Version => out.write_all(
            format!(
                "oxctl version: {}\nAPI version: 3.5\n",
                env!("CARGO_PKG_VERSION")
            )
            .as_bytes(),
        )?,
        Command::Snapshot(SnapshotCommand::Status { filename }) => {
            let status = snapshot::status(&filename)?;
            out.write_all(snapshot::format_status(&status, cli.write_out).as_bytes())?;
        }
        Command::Snapshot(SnapshotCommand::Restore {
            filename,
            data_dir,
            name,
            initial_cluster,
            initial_cluster_token,
            initial_advertise_peer_urls,
            skip_hash_check,
            wal_dir,
            initial_memory_map_size: _,
            bump_revision,
            mark_compacted,
        }) => {
            if (bump_revision == 0) == mark_compacted {
                return Err(CliError::Failed(
                    "--mark-compacted required if --revision-bump > 0".into(),
                ));
            }
            let data_dir = data_dir.unwrap_or_else(|| PathBuf::from(format!("{name}.oxcd")));
            snapshot::restore(&snapshot::RestoreConfig {
                snapshot_path: filename,
                name,
                data_dir,
                peer_urls: split_urls(&initial_advertise_peer_urls),
                initial_cluster,
                initial_cluster_token,
                skip_hash_check,
                wal_dir,
                bump_revision,
            })?;
        }
    }
    Ok(())
}

fn split_urls(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect()
}
