//! `snapshot status` and `snapshot restore`.
//!
//! # What restore writes (a data dir for a member of a NEW cluster)
//!
//! * `member/snap/db`: every table of the snapshot's backend (key history,
//!   compaction marks, leases, alarms) except the old membership, which is
//!   replaced by the members of `--initial-cluster` with etcd's member IDs
//!   (sha1 of sorted peer URLs + token); and no consistent index, so the
//!   new cluster's raft log applies from its first entry.
//! * `member/wal`: a new, empty WAL whose metadata names this member, the
//!   new cluster ID and the voters, exactly as a new member's first start
//!   writes it. The member then starts as a restarted member with an empty
//!   log: its identity comes from the WAL (as etcd's restored WAL
//!   carries it), raft bootstraps with those voters, and the revision goes
//!   on from the snapshot's.
//!
//! etcd's restore instead writes the bootstrap conf-change entries into its
//! WAL and a raft snapshot at their index, and sets the consistent index to
//! that index; our raft bootstraps its voters from the WAL metadata, so no
//! entry and no raft snapshot is needed.

use std::io::Write;
use std::path::{Path, PathBuf};

use mvcc::snapshot_file::humanize_bytes;
use mvcc::snapshot_file::{SnapshotFile, SnapshotStatus};
use schema::members::{self as membership, Member};

use crate::{CliError, OutputFormat};

/// Reads a snapshot file's status (no hash check, as etcdutl's status).
pub fn status(path: &Path) -> Result<SnapshotStatus, CliError> {
    if !path.exists() {
        return Err(CliError::Failed(format!(
            "stat {}: no such file or directory",
            path.display()
        )));
    }
    let file = SnapshotFile::open(path, true)?;
    Ok(file.status()?)
}

/// etcdutl's printers for `snapshot status`.
pub fn format_status(status: &SnapshotStatus, format: OutputFormat) -> String {
    let hash = format!("{:x}", status.hash);
    let size = humanize_bytes(status.total_size);
    match format {
        OutputFormat::Simple => format!(
            "{hash}, {}, {}, {size}\n",
            status.revision, status.total_key
        ),
        OutputFormat::Json => format!(
            "{{\"hash\":{},\"revision\":{},\"totalKey\":{},\"totalSize\":{}}}\n",
            status.hash, status.revision, status.total_key, status.total_size
        ),
        OutputFormat::Fields => format!(
            "\"Hash\" : {}\n\"Revision\" : {}\n\"Keys\" : {}\n\"Size\" : {}\n",
            status.hash, status.revision, status.total_key, status.total_size
        ),
        OutputFormat::Table => table(
            &["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"],
            &[
                hash,
                status.revision.to_string(),
                status.total_key.to_string(),
                size,
            ],
        ),
    }
}

/// One row, as tablewriter draws it for etcdctl: headers centered, cells
/// right-aligned, one space of padding.
pub(crate) fn table(headers: &[&str], row: &[String]) -> String {
    let widths: Vec<usize> = headers
        .iter()
        .zip(row)
        .map(|(h, c)| h.len().max(c.len()))
        .collect();
    let border: String = widths
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+\n";
    let mut out = border.clone();
    for (h, w) in headers.iter().zip(&widths) {
        let gap = w - h.len();
        let left = gap / 2;
        out += &format!("| {}{h}{} ", " ".repeat(left), " ".repeat(gap - left));
    }
    out += "|\n";
    out += &border;
    for (c, w) in row.iter().zip(&widths) {
        out += &format!("| {c:>w$} ");
    }
    out += "|\n";
    out += &border;
    out
}

pub struct RestoreConfig {
    pub snapshot_path: PathBuf,
    pub name: String,
    pub data_dir: PathBuf,
    pub peer_urls: Vec<String>,
    pub initial_cluster: String,
    pub initial_cluster_token: String,
    pub skip_hash_check: bool,
    /// The WAL's own directory (etcd's `--wal-dir`); None: `member/wal`.
    pub wal_dir: Option<PathBuf>,
    /// `--bump-revision` (with `--mark-compacted`): 0 for none.
    pub bump_revision: u64,
}

fn log(msg: &str, fields: &[(&str, String)]) {
    let mut line = serde_json::Map::new();
    line.insert("level".into(), "info".into());
    line.insert("msg".into(), msg.into());
    for (k, v) in fields {
        line.insert((*k).into(), v.clone().into());
    }
    let _ = writeln!(std::io::stderr(), "{}", serde_json::Value::Object(line));
}

/// The new cluster's members, checked as etcd's VerifyBootstrap checks
/// them: this member is named in `--initial-cluster` with exactly its
/// advertised peer URLs.
fn new_members(cfg: &RestoreConfig) -> Result<(Member, Vec<Member>), CliError> {
    let cluster =
        membership::parse_initial_cluster(&cfg.initial_cluster).map_err(CliError::Failed)?;
    let members: Vec<Member> = cluster
        .into_iter()
        .map(|(name, urls)| Member {
            id: membership::member_id(&urls, &cfg.initial_cluster_token),
            name,
            peer_urls: urls,
            client_urls: Vec::new(),
            is_learner: false,
        })
        .collect();
    let Some(own) = members.iter().find(|m| m.name == cfg.name).cloned() else {
        return Err(CliError::Failed(format!(
            "couldn't find local name {:?} in the initial cluster configuration",
            cfg.name
        )));
    };
    let mut advertised = cfg.peer_urls.clone();
    advertised.sort();
    let mut listed = own.peer_urls.clone();
    listed.sort();
    if advertised != listed {
        return Err(CliError::Failed(format!(
            "--initial-cluster has {}={} but missing from --initial-advertise-peer-urls={}",
            own.name,
            listed.join(","),
            advertised.join(","),
        )));
    }
    Ok((own, members))
}

/// Builds a new data dir from a snapshot file (see the module doc).
pub fn restore(cfg: &RestoreConfig) -> Result<(), CliError> {
    let (own, members) = new_members(cfg)?;
    let empty = |dir: &Path| std::fs::read_dir(dir).is_ok_and(|mut rd| rd.next().is_none());
    if cfg.data_dir.exists() && !empty(&cfg.data_dir) {
        return Err(CliError::Failed(format!(
            "data-dir {:?} not empty or could not be read",
            cfg.data_dir.display().to_string()
        )));
    }
    if let Some(wal_dir) = cfg.wal_dir.as_ref().filter(|w| w.exists()) {
        return Err(CliError::Failed(format!(
            "wal-dir {:?} exists",
            wal_dir.display().to_string()
        )));
    }
    let member_dir = cfg.data_dir.join("member");
    let snap_dir = member_dir.join("snap");
    let wal_dir = cfg
        .wal_dir
        .clone()
        .unwrap_or_else(|| member_dir.join("wal"));
    log(
        "restoring snapshot",
        &[
            ("path", cfg.snapshot_path.display().to_string()),
            ("wal-dir", wal_dir.display().to_string()),
            ("data-dir", cfg.data_dir.display().to_string()),
            ("snap-dir", snap_dir.display().to_string()),
        ],
    );
    // Check the file before creating anything.
    let snapshot = SnapshotFile::open(&cfg.snapshot_path, cfg.skip_hash_check)?;
    // Built beside the data dir and renamed into place once durable: a
    // failure, or a crash, never leaves a half-made data dir to start on.
    let staging = staging_dir(&cfg.data_dir);
    let _ = std::fs::remove_dir_all(&staging);
    let staged_member = staging.join("member");
    // a WAL of its own is staged beside its final place (another disk,
    // perhaps: a rename does not cross file systems)
    let staged_wal = match &cfg.wal_dir {
        Some(wal_dir) => staging_dir(wal_dir),
        None => staged_member.join("wal"),
    };
    let _ = std::fs::remove_dir_all(&staged_wal);
    let result = write_data_dir(
        &snapshot,
        &own,
        &members,
        &staged_member.join("snap"),
        &staged_wal,
        cfg.bump_revision,
    )
    .and_then(|()| {
        sync_dir(&staged_member.join("snap"))?;
        sync_dir(&staged_wal)?;
        sync_dir(&staged_member)?;
        sync_dir(&staging)?;
        if let Some(wal_dir) = &cfg.wal_dir {
            std::fs::rename(&staged_wal, wal_dir)?;
            sync_parent(wal_dir)?;
        }
        std::fs::rename(&staging, &cfg.data_dir)?;
        sync_parent(&cfg.data_dir)?;
        Ok(())
    });
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&staging);
        if cfg.wal_dir.is_some() {
            let _ = std::fs::remove_dir_all(&staged_wal);
        }
        return Err(e);
    }
    log(
        "restored snapshot",
        &[
            ("path", cfg.snapshot_path.display().to_string()),
            ("wal-dir", wal_dir.display().to_string()),
            ("data-dir", cfg.data_dir.display().to_string()),
            ("snap-dir", snap_dir.display().to_string()),
        ],
    );
    Ok(())
}

/// Where a restore builds the data dir before renaming it into place.
fn staging_dir(data_dir: &Path) -> PathBuf {
    let name = data_dir
        .file_name()
        .map_or_else(|| "data".into(), |n| n.to_string_lossy().into_owned());
    data_dir.with_file_name(format!(".{name}.restoring"))
}

fn sync_parent(path: &Path) -> Result<(), CliError> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => sync_dir(Path::new(".")),
    }
}

fn sync_dir(dir: &Path) -> Result<(), CliError> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

fn write_data_dir(
    snapshot: &SnapshotFile,
    own: &Member,
    members: &[Member],
    snap_dir: &Path,
    wal_dir: &Path,
    bump_revision: u64,
) -> Result<(), CliError> {
    // 0700 as etcdutl's (client/pkg/fileutil.PrivateDirMode)
    consensus::fileutil::create_private_dir_all(snap_dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Some(data_dir) = snap_dir.parent().and_then(Path::parent) {
            std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    let records: Vec<(u64, Vec<u8>)> = members
        .iter()
        .map(|m| (m.id, membership::encode(m)))
        .collect();
    let summary = snapshot.restore_to(&snap_dir.join("db"), &records)?;
    if bump_revision > 0 {
        let (latest, bumped) =
            mvcc::snapshot_file::bump_revision(&snap_dir.join("db"), bump_revision)
                .map_err(|e| CliError::Failed(format!("cannot bump the revision: {e}")))?;
        log(
            "bumping latest revision",
            &[
                ("latest-revision", latest.to_string()),
                ("bump-amount", bump_revision.to_string()),
                ("new-latest-revision", bumped.to_string()),
            ],
        );
        log(
            "marking revision compacted",
            &[("revision", bumped.to_string())],
        );
    }
    let voters: Vec<u64> = members.iter().map(|m| m.id).collect();
    let cluster_id = membership::cluster_id(&voters);
    let metadata = consensus::wal::Metadata {
        node_id: own.id,
        cluster_id,
        initial_voters: voters,
    };
    consensus::wal::Wal::create(wal_dir, metadata, consensus::wal::WalOptions::default())
        .map_err(|e| CliError::Failed(format!("cannot create the WAL: {e}")))?;
    log(
        "restored backend",
        &[
            ("revision", summary.revision.to_string()),
            ("leases", summary.leases.to_string()),
            ("local-member-id", format!("{:x}", own.id)),
            ("cluster-id", format!("{cluster_id:x}")),
        ],
    );
    Ok(())
}
