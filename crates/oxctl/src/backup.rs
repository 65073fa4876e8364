//! `oxctl backup --data-dir D --backup-dir B [--wal-dir W]
//! [--backup-wal-dir BW]`: etcdutl's legacy offline backup, for a stopped
//! oxcd member (its WAL read from W when it has a dedicated WAL dir, the
//! copy's written to BW when given). The copy is a data dir for a member
//! of no cluster yet, meant to be started with `--force-new-cluster`:
//!
//! - the backend, copied consistently, with its membership replaced by one
//!   member with a new ID, named `etcdctl-v2-backup`, peer URL
//!   `http://use-flag--force-new-cluster:2080` (etcd's placeholders);
//! - the raft log from the newest snapshot on, under a new member and
//!   cluster ID, whose conf changes and member-attribute updates become
//!   empty entries at the same index and term (so the consistent index
//!   still matches), with the new member as the only voter.
//!
//! As etcd's, the new IDs come from the clock (etcd's idutil generator
//! with member prefix 0); keys, leases, auth and alarms are unchanged.

use std::path::Path;

use consensus::raft::eraftpb::{ConfState, Entry, EntryType, Snapshot};
use schema::members::{self as membership, Member};

use crate::CliError;

fn failed(msg: impl Into<String>) -> CliError {
    CliError::Failed(msg.into())
}

/// etcd's idutil.NewGenerator(0, now): the low 40 bits of the Unix time in
/// milliseconds, shifted by 8, then a counter; the member ID is its first
/// value and the cluster ID its second.
fn new_ids() -> (u64, u64) {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let prefix = (ms & 0xFF_FFFF_FFFF) << 8;
    (prefix + 1, prefix + 2)
}

/// Whether an entry touches membership: a conf change, or a request that
/// sets a member's attributes.
fn membership_entry(e: &Entry) -> bool {
    match e.get_entry_type() {
        EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => true,
        EntryType::EntryNormal if e.data.is_empty() => false,
        EntryType::EntryNormal => api::codec::decode_internal_raft_request(e.data.as_ref())
            .map(|r| r.cluster_member_attr_set.is_some())
            .unwrap_or(false),
    }
}

/// What a backup wrote, for the report.
pub struct BackedUp {
    pub member_id: u64,
    pub cluster_id: u64,
    pub entries: usize,
    pub emptied: usize,
}

/// Where a backup is read from and written to (etcdutl backup's flags).
pub struct BackupDirs<'a> {
    /// `--data-dir`.
    pub data_dir: &'a Path,
    /// `--wal-dir`: the member's dedicated WAL dir; None: `member/wal`.
    pub wal_dir: Option<&'a Path>,
    /// `--backup-dir`.
    pub backup_dir: &'a Path,
    /// `--backup-wal-dir`: the copy's WAL dir; None: the copy's
    /// `member/wal`.
    pub backup_wal_dir: Option<&'a Path>,
}

/// The staging dir for `dir`: `.<name>.backing-up` beside it (a rename
/// into place never crosses file systems).
fn staging_beside(dir: &Path) -> std::path::PathBuf {
    let name = dir
        .file_name()
        .map_or_else(|| "wal".into(), |n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!(".{name}.backing-up"))
}

/// Backs up the stopped member of `dirs.data_dir` into `dirs.backup_dir`.
pub fn backup(dirs: &BackupDirs, with_v3: bool) -> Result<BackedUp, CliError> {
    let (data_dir, backup_dir) = (dirs.data_dir, dirs.backup_dir);
    if !with_v3 {
        return Err(failed(
            "--with-v3=false backs up only etcd's v2 store, which oxcd does not keep",
        ));
    }
    let member = data_dir.join("member");
    let db = member.join("snap").join("db");
    if !db.exists() {
        return Err(failed(format!(
            "open {}: no such file or directory",
            db.display()
        )));
    }
    if mvcc::etcd_backend::is_bbolt(&db) {
        return Err(failed(format!(
            "{} is an etcd data dir: use etcdutl backup, or convert it with oxctl migrate first",
            data_dir.display()
        )));
    }
    let dest_member = backup_dir.join("member");
    if dest_member.exists() {
        return Err(failed(format!("{} exists", dest_member.display())));
    }
    if let Some(dest_wal) = dirs.backup_wal_dir {
        if consensus::wal::Wal::exists(dest_wal) {
            return Err(failed(format!("{} holds a WAL", dest_wal.display())));
        }
    }
    let wal_dir = dirs
        .wal_dir
        .map_or_else(|| member.join("wal"), Path::to_path_buf);
    let contents = consensus::wal::Wal::read(&wal_dir)
        .map_err(|e| failed(format!("WAL in {}: {e}", wal_dir.display())))?;
    let snapshot = consensus::snap::load_newest(&member.join("snap"))
        .map_err(|e| failed(format!("snapshot files in {}: {e}", member.display())))?;
    let base_index = snapshot.as_ref().map_or(0, |s| s.get_metadata().index);
    let (member_id, cluster_id) = new_ids();

    let staging = backup_dir.join(".member.backing-up");
    let _ = std::fs::remove_dir_all(&staging);
    consensus::fileutil::create_private_dir_all(&staging.join("snap"))?;
    let staged_wal = dirs
        .backup_wal_dir
        .map_or_else(|| staging.join("wal"), staging_beside);
    if dirs.backup_wal_dir.is_some() {
        let _ = std::fs::remove_dir_all(&staged_wal);
    }
    let result = (|| -> Result<BackedUp, CliError> {
        let store = mvcc::Store::open(&db).map_err(|e| {
            failed(format!(
                "cannot open the backend {} (is the member still running?): {e}",
                db.display()
            ))
        })?;
        let copy = staging.join("snap").join("db");
        store
            .backup_to(&copy)
            .map_err(|e| failed(format!("cannot copy the backend: {e}")))?;
        drop(store);
        let copied = mvcc::Store::open(&copy)
            .map_err(|e| failed(format!("cannot open the copy {}: {e}", copy.display())))?;
        let ci = copied.consistent_index();
        let removed = copied
            .side_records(mvcc::SideTable::MembersRemoved)
            .map_err(|e| failed(e.to_string()))?;
        for id in removed.keys() {
            copied.put_side(mvcc::SideTable::MembersRemoved, *id, None, ci);
        }
        let members = copied.members().map_err(|e| failed(e.to_string()))?;
        for id in members.keys() {
            copied.put_member(*id, None, ci);
        }
        let placeholder = Member {
            id: member_id,
            name: "etcdctl-v2-backup".into(),
            peer_urls: vec!["http://use-flag--force-new-cluster:2080".into()],
            client_urls: Vec::new(),
            is_learner: false,
        };
        copied.put_member(member_id, Some(membership::encode(&placeholder)), ci);
        copied
            .commit(true)
            .map_err(|e| failed(format!("cannot write the copy: {e}")))?;
        drop(copied);

        let conf = ConfState {
            voters: vec![member_id],
            ..Default::default()
        };
        let mut base = snapshot.clone().unwrap_or_else(Snapshot::default);
        base.mut_metadata().set_conf_state(conf);
        if contents
            .entries
            .iter()
            .find(|e| e.index > base_index)
            .is_some_and(|e| e.index != base_index + 1)
        {
            return Err(failed(format!(
                "the WAL's entries do not follow the newest snapshot at {base_index}"
            )));
        }
        let mut emptied = 0;
        let entries: Vec<Entry> = contents
            .entries
            .iter()
            .filter(|e| e.index > base_index)
            .map(|e| {
                if membership_entry(e) {
                    emptied += 1;
                    Entry {
                        term: e.term,
                        index: e.index,
                        ..Default::default()
                    }
                } else {
                    e.clone()
                }
            })
            .collect();
        let mut hard_state = contents.hard_state.clone();
        hard_state.vote = 0;
        hard_state.commit = hard_state
            .commit
            .max(base_index)
            .min(entries.last().map_or(base_index, |e| e.index));
        consensus::import_log(
            &staging,
            &staged_wal,
            consensus::wal::Metadata {
                node_id: member_id,
                cluster_id,
                initial_voters: vec![member_id],
            },
            &base,
            &entries,
            &hard_state,
        )
        .map_err(|e| failed(format!("cannot write the raft log: {e}")))?;
        for dir in [staging.join("snap"), staged_wal.clone(), staging.clone()] {
            std::fs::File::open(&dir)?.sync_all()?;
        }
        Ok(BackedUp {
            member_id,
            cluster_id,
            entries: entries.len(),
            emptied,
        })
    })();
    let result = result.and_then(|done| {
        if let Some(dest_wal) = dirs.backup_wal_dir {
            std::fs::rename(&staged_wal, dest_wal)?;
            sync_parent(dest_wal)?;
        }
        std::fs::rename(&staging, &dest_member)?;
        std::fs::File::open(backup_dir)?.sync_all()?;
        Ok(done)
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
        if dirs.backup_wal_dir.is_some() {
            let _ = std::fs::remove_dir_all(&staged_wal);
        }
    }
    result
}

fn sync_parent(path: &Path) -> Result<(), CliError> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(parent)?.sync_all()?;
    Ok(())
}
