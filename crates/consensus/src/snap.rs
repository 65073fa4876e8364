//! Raft snapshot files: `<member_dir>/snap/<term %016x>-<index %016x>.snap`.
//!
//! A snapshot file records raft's view of a snapshot — index, term and
//! configuration — not the state machine: the backend db (`snap/db`) is the
//! state and is handled elsewhere, so `Snapshot.data` is empty here.
//!
//! # File layout, format version 1 (integers little-endian)
//!
//! | offset | size | field                                          |
//! |-------:|-----:|------------------------------------------------|
//! |      0 |    8 | magic `"oxcdsnap"`                             |
//! |      8 |    4 | `format_version` u32 (= 1)                     |
//! |     12 |    4 | `body_len` u32                                 |
//! |     16 |    4 | `body_crc`: CRC-32 (IEEE) of the body          |
//! |     20 |    n | body: raft-rs `eraftpb::Snapshot`, protobuf    |
//!
//! Files are written as `.snap.tmp`, synced, renamed and the directory synced,
//! so a `.snap` file is either complete or absent. A file that still fails to
//! decode is renamed to `.snap.broken` (as etcd does) and the next newest is
//! used. The newest [`KEEP_SNAPSHOTS`] files are kept (etcd's `--max-snapshots`;
//! 0 keeps all); older ones are deleted, as are received backends
//! (`<index>.snap.db`) beyond as many, or older than a saved snapshot.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfState, Snapshot};

use crate::wal::sync_dir;

/// Snapshot files kept on disk (etcd's `--max-snapshots` default is 5).
pub(crate) const KEEP_SNAPSHOTS: usize = 5;

pub(crate) const SNAP_MAGIC: &[u8; 8] = b"oxcdsnap";
pub(crate) const SNAP_FORMAT_VERSION: u32 = 1;
const SNAP_HEADER_LEN: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum SnapError {
    #[error("snap: {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("snap: {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SnapError + '_ {
    move |source| SnapError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn snap_name(term: u64, index: u64) -> String {
    format!("{term:016x}-{index:016x}.snap")
}

fn parse_snap_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".snap")?;
    let (term, index) = stem.split_once('-')?;
    if term.len() != 16 || index.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(term, 16).ok()?,
        u64::from_str_radix(index, 16).ok()?,
    ))
}

/// Encodes a snapshot file.
pub(crate) fn encode(snapshot: &Snapshot) -> Vec<u8> {
    let body = snapshot.write_to_bytes().expect("encode raft snapshot");
    let mut out = Vec::with_capacity(SNAP_HEADER_LEN + body.len());
    out.extend_from_slice(SNAP_MAGIC);
    out.extend_from_slice(&SNAP_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes a snapshot file.
pub(crate) fn decode(bytes: &[u8]) -> Result<Snapshot, String> {
    if bytes.len() < SNAP_HEADER_LEN {
        return Err("shorter than the header".into());
    }
    if &bytes[0..8] != SNAP_MAGIC {
        return Err("bad magic".into());
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != SNAP_FORMAT_VERSION {
        return Err(format!("unsupported format version {version}"));
    }
    let len = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let body = &bytes[SNAP_HEADER_LEN..];
    if body.len() != len {
        return Err(format!("body is {} bytes, header says {len}", body.len()));
    }
    if crc32fast::hash(body) != crc {
        return Err("crc mismatch".into());
    }
    let snapshot = Snapshot::parse_from_bytes(body).map_err(|e| e.to_string())?;
    let conf_state = snapshot.get_metadata().get_conf_state();
    if !restorable(conf_state) {
        return Err(format!("configuration raft cannot restore: {conf_state:?}"));
    }
    Ok(snapshot)
}

/// Whether raft can start from `conf_state` as it is. raft-rs rebuilds a
/// snapshot's configuration change by change (`confchange::restore`) and
/// panics ("invalid restore") when what it built differs from what the
/// snapshot says: a learner that is also a voter, a `learners_next` that
/// is not an outgoing voter, `auto_leave` outside a joint configuration.
/// raft never writes such a state, so a file holding one is damaged; the
/// same rebuild is run here, with raft's own `Changer`, so that it is
/// refused like any damaged file instead of stopping the member.
pub(crate) fn restorable(conf_state: &ConfState) -> bool {
    let change = |node_id: u64, change_type: ConfChangeType| {
        let mut change = ConfChangeSingle {
            node_id,
            ..Default::default()
        };
        change.set_change_type(change_type);
        change
    };
    let outgoing = conf_state.get_voters_outgoing();
    let incoming: Vec<ConfChangeSingle> = (outgoing.iter())
        .map(|id| change(*id, ConfChangeType::RemoveNode))
        .chain(
            conf_state
                .get_voters()
                .iter()
                .map(|id| change(*id, ConfChangeType::AddNode)),
        )
        .chain(
            (conf_state.get_learners().iter())
                .chain(conf_state.get_learners_next())
                .map(|id| change(*id, ConfChangeType::AddLearnerNode)),
        )
        .collect();
    let mut tracker = raft::ProgressTracker::new(1);
    let mut apply = |joint: bool, changes: &[ConfChangeSingle]| {
        let mut changer = raft::Changer::new(&tracker);
        let changed = if joint {
            changer.enter_joint(conf_state.auto_leave, changes)
        } else {
            changer.simple(changes)
        };
        changed.map(|(conf, map)| tracker.apply_conf(conf, map, 1))
    };
    let rebuilt = if outgoing.is_empty() {
        incoming
            .iter()
            .try_for_each(|c| apply(false, std::slice::from_ref(c)))
    } else {
        (outgoing.iter())
            .try_for_each(|id| apply(false, &[change(*id, ConfChangeType::AddNode)]))
            .and_then(|()| apply(true, &incoming))
    };
    rebuilt.is_ok() && same_configuration(&tracker.conf().to_conf_state(), conf_state)
}

/// raft-rs's `conf_state_eq`: the same members in each role, in any order.
fn same_configuration(a: &ConfState, b: &ConfState) -> bool {
    let same = |x: &[u64], y: &[u64]| {
        x.iter().all(|id| y.contains(id)) && y.iter().all(|id| x.contains(id))
    };
    same(a.get_voters(), b.get_voters())
        && same(a.get_learners(), b.get_learners())
        && same(a.get_voters_outgoing(), b.get_voters_outgoing())
        && same(a.get_learners_next(), b.get_learners_next())
        && a.auto_leave == b.auto_leave
}

/// The newest snapshot file of `dir` that decodes (its metadata: index,
/// term, conf state), for offline tools; broken files are set aside as a
/// start sets them aside.
pub fn load_newest(dir: &Path) -> Result<Option<Snapshot>, SnapError> {
    if !dir.exists() {
        return Ok(None);
    }
    Snapshotter::new(dir)?.load_newest()
}

/// Reads and writes the snapshot files of one member.
pub(crate) struct Snapshotter {
    dir: PathBuf,
    /// `.snap` files kept at a save (etcd's `--max-snapshots`; 0: all).
    keep: usize,
}

impl Snapshotter {
    pub fn new(dir: &Path) -> Result<Snapshotter, SnapError> {
        crate::fileutil::create_private_dir_all(dir).map_err(io_err(dir))?;
        Ok(Snapshotter {
            dir: dir.to_path_buf(),
            keep: KEEP_SNAPSHOTS,
        })
    }

    /// Keeps the newest `keep` `.snap` files at each save (0: all of them).
    pub(crate) fn set_retention(&mut self, keep: usize) {
        self.keep = keep;
    }

    /// Snapshot files as (term, index, path), newest (highest index) first.
    pub(crate) fn list(&self) -> Result<Vec<(u64, u64, PathBuf)>, SnapError> {
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let entry = entry.map_err(io_err(&self.dir))?;
            let name = entry.file_name();
            if let Some((term, index)) = name.to_str().and_then(parse_snap_name) {
                files.push((term, index, entry.path()));
            }
        }
        files.sort_by_key(|f| std::cmp::Reverse((f.1, f.0)));
        Ok(files)
    }

    /// Durably writes `snapshot` and deletes all but the newest few (the
    /// retention, [`KEEP_SNAPSHOTS`] unless set). Received backends above
    /// `applied` stay whatever their age: the apply side has yet to install
    /// them (raft runs ahead of apply here, where etcd's raft loop waits for
    /// it before it saves the next snapshot).
    /// Tells `observer` how long encoding, fsync and the whole save took.
    pub(crate) fn save(
        &self,
        snapshot: &Snapshot,
        applied: u64,
        observer: Option<&crate::Observer>,
    ) -> Result<PathBuf, SnapError> {
        let started = std::time::Instant::now();
        let meta = snapshot.get_metadata();
        let path = self.dir.join(snap_name(meta.term, meta.index));
        let tmp = path.with_extension("snap.tmp");
        let (marshalling, fsync) = {
            let encoded = encode(snapshot);
            let marshalling = started.elapsed();
            let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
            f.write_all(&encoded).map_err(io_err(&tmp))?;
            let syncing = std::time::Instant::now();
            f.sync_all().map_err(io_err(&tmp))?;
            (marshalling, syncing.elapsed())
        };
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        sync_dir(&self.dir).map_err(io_err(&self.dir))?;
        if let Some(observer) = observer {
            observer.0.snap_saved(marshalling, fsync, started.elapsed());
        }
        self.release_snap_dbs(meta.index, applied);
        self.purge(applied);
        Ok(path)
    }

    /// etcd's `ReleaseSnapDBs`, run when a snapshot at `index` is saved:
    /// a backend received for an older snapshot (`<index>.snap.db`) will
    /// never be installed, unless it is above `applied` (queued for
    /// install: see [`Snapshotter::save`]).
    fn release_snap_dbs(&self, index: u64, applied: u64) {
        for (db_index, path) in self.received_dbs() {
            if db_index < index && db_index <= applied {
                tracing::info!(path = %path.display(), "found orphaned .snap.db file; deleting");
                if let Err(e) = fs::remove_file(&path) {
                    if e.kind() != io::ErrorKind::NotFound {
                        tracing::error!(path = %path.display(), error = %e,
                            "failed to remove orphaned .snap.db file");
                    }
                }
            }
        }
    }

    /// Received backends (`<index %016x>.snap.db`) as (index, path),
    /// oldest first.
    fn received_dbs(&self) -> Vec<(u64, PathBuf)> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut dbs: Vec<(u64, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let hex = name.to_str()?.strip_suffix(".snap.db")?;
                Some((u64::from_str_radix(hex, 16).ok()?, e.path()))
            })
            .collect();
        dbs.sort();
        dbs
    }

    /// etcd's start lines for its purges of this directory (only with a
    /// limit, as etcd starts them only then).
    pub(crate) fn log_purge_start(&self) {
        if self.keep == 0 {
            return;
        }
        for suffix in ["snap.db", "snap"] {
            tracing::info!(dir = %self.dir.display(), suffix, max = self.keep, "started to purge file");
        }
    }

    /// etcd's purges of the snap dir with `--max-snapshots`: the oldest
    /// `.snap` files, and the oldest received `.snap.db` files, go while
    /// there are more than `keep` of them (0: none goes). A file that
    /// cannot be removed is left, with a warning. A received backend above
    /// `applied` is never purged (queued for install).
    pub(crate) fn purge(&self, applied: u64) {
        if self.keep == 0 {
            return;
        }
        let remove = |path: &Path| match fs::remove_file(path) {
            Ok(()) => tracing::info!(path = %path.display(), "purged"),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "failed to remove file"),
        };
        let dbs = self.received_dbs();
        for (index, path) in dbs.iter().take(dbs.len().saturating_sub(self.keep)) {
            if *index <= applied {
                remove(path);
            }
        }
        match self.list() {
            Ok(snaps) => {
                for (_, _, path) in snaps.iter().skip(self.keep) {
                    remove(path);
                }
            }
            Err(e) => tracing::warn!(error = %e, "failed to list the snapshot files to purge"),
        }
    }

    /// The newest snapshot file that decodes; broken files are set aside.
    pub(crate) fn load_newest(&self) -> Result<Option<Snapshot>, SnapError> {
        for (term, index, path) in self.list()? {
            let bytes = fs::read(&path).map_err(io_err(&path))?;
            match decode(&bytes) {
                Ok(s) if s.get_metadata().index == index && s.get_metadata().term == term => {
                    return Ok(Some(s))
                }
                Ok(_) => self.set_aside(&path, "file name does not match its content"),
                Err(reason) => self.set_aside(&path, &reason),
            }
        }
        Ok(None)
    }

    fn set_aside(&self, path: &Path, reason: &str) {
        let broken = path.with_extension("snap.broken");
        tracing::warn!(file = %path.display(), reason, "snap: unreadable snapshot file, renaming to .broken");
        if let Err(e) = fs::rename(path, &broken) {
            tracing::warn!(file = %path.display(), error = %e, "snap: failed to rename broken snapshot");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(term: u64, index: u64, voters: Vec<u64>) -> Snapshot {
        let mut s = Snapshot::default();
        s.mut_metadata().term = term;
        s.mut_metadata().index = index;
        s.mut_metadata().mut_conf_state().voters = voters;
        s
    }

    #[test]
    fn snap_file_round_trips_metadata_and_conf_state() {
        let dir = tempfile::tempdir().unwrap();
        let snapper = Snapshotter::new(dir.path()).unwrap();
        let s = snapshot(3, 10_000, vec![1, 2, 3]);
        let path = snapper.save(&s, u64::MAX, None).unwrap();
        assert_eq!(
            path.file_name().unwrap().to_str().unwrap(),
            "0000000000000003-0000000000002710.snap"
        );
        let loaded = snapper.load_newest().unwrap().unwrap();
        assert_eq!(loaded, s);
        assert_eq!(loaded.get_metadata().get_conf_state().voters, vec![1, 2, 3]);
    }

    #[test]
    fn snap_keeps_the_newest_few_and_loads_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let snapper = Snapshotter::new(dir.path()).unwrap();
        fs::write(dir.path().join("db"), b"backend").unwrap();
        for i in 1..=8u64 {
            snapper
                .save(&snapshot(2, i * 100, vec![1]), u64::MAX, None)
                .unwrap();
        }
        let files = snapper.list().unwrap();
        assert_eq!(files.len(), KEEP_SNAPSHOTS);
        assert_eq!(files[0].1, 800);
        assert_eq!(
            snapper.load_newest().unwrap().unwrap().get_metadata().index,
            800
        );
        assert!(
            dir.path().join("db").exists(),
            "only .snap files are purged"
        );
    }

    #[test]
    fn max_snapshots_sets_how_many_are_kept_and_zero_keeps_all() {
        for (keep, left) in [(2, 2), (0, 8)] {
            let dir = tempfile::tempdir().unwrap();
            let mut snapper = Snapshotter::new(dir.path()).unwrap();
            snapper.set_retention(keep);
            for i in 1..=8u64 {
                snapper
                    .save(&snapshot(2, i * 100, vec![1]), u64::MAX, None)
                    .unwrap();
            }
            assert_eq!(snapper.list().unwrap().len(), left, "keep {keep}");
        }
    }

    #[test]
    fn a_received_backend_not_yet_applied_stays_when_a_newer_snapshot_is_saved() {
        // Two snapshots from the leader in a row: raft saves the second
        // before the apply side installed the first (it runs ahead of
        // apply). The first one's backend must stay until it is installed.
        let dir = tempfile::tempdir().unwrap();
        let mut snapper = Snapshotter::new(dir.path()).unwrap();
        snapper.set_retention(1);
        let db = |index: u64| dir.path().join(format!("{index:016x}.snap.db"));
        for index in [100, 1254, 1261] {
            fs::write(db(index), b"backend").unwrap();
        }
        snapper
            .save(&snapshot(1, 1261, vec![1]), 497, None)
            .unwrap();
        assert!(
            !db(100).exists(),
            "below applied and the snapshot: orphaned"
        );
        assert!(db(1254).exists() && db(1261).exists());
        // once applied, an older one goes
        snapper
            .save(&snapshot(1, 1300, vec![1]), 1261, None)
            .unwrap();
        assert!(!db(1254).exists());
    }

    #[test]
    fn received_backends_older_than_a_saved_snapshot_or_beyond_max_snapshots_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut snapper = Snapshotter::new(dir.path()).unwrap();
        let db = |index: u64| dir.path().join(format!("{index:016x}.snap.db"));
        for index in [100, 200, 300] {
            fs::write(db(index), b"backend").unwrap();
        }
        // etcd's ReleaseSnapDBs: below the saved snapshot, never installed
        snapper
            .save(&snapshot(2, 200, vec![1]), u64::MAX, None)
            .unwrap();
        assert!(!db(100).exists());
        assert!(db(200).exists() && db(300).exists());
        // and its purge: the newest --max-snapshots of them stay
        snapper.set_retention(1);
        snapper.purge(u64::MAX);
        assert!(!db(200).exists() && db(300).exists());
        assert!(dir.path().join(snap_name(2, 200)).exists());
        // 0 keeps all
        fs::write(db(400), b"backend").unwrap();
        snapper.set_retention(0);
        snapper
            .save(&snapshot(2, 250, vec![1]), u64::MAX, None)
            .unwrap();
        snapper.purge(u64::MAX);
        assert!(db(300).exists() && db(400).exists());
        assert_eq!(snapper.list().unwrap().len(), 2);
    }

    #[test]
    fn snap_broken_newest_file_falls_back_to_the_previous() {
        let dir = tempfile::tempdir().unwrap();
        let snapper = Snapshotter::new(dir.path()).unwrap();
        snapper
            .save(&snapshot(1, 100, vec![1]), u64::MAX, None)
            .unwrap();
        let newest = snapper
            .save(&snapshot(1, 200, vec![1]), u64::MAX, None)
            .unwrap();
        let mut bytes = fs::read(&newest).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&newest, &bytes).unwrap();
        let loaded = snapper.load_newest().unwrap().unwrap();
        assert_eq!(loaded.get_metadata().index, 100);
        assert!(newest.with_extension("snap.broken").exists());
    }

    #[test]
    fn snap_file_with_a_configuration_raft_cannot_restore_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let snapper = Snapshotter::new(dir.path()).unwrap();
        snapper
            .save(&snapshot(1, 100, vec![1]), u64::MAX, None)
            .unwrap();
        // sound bytes, CRC and all, but a learner that is also a voter:
        // raft-rs's restore panics on it ("invalid restore")
        let mut bad = snapshot(1, 200, vec![1, 2]);
        bad.mut_metadata().mut_conf_state().learners = vec![2];
        let newest = snapper.save(&bad, u64::MAX, None).unwrap();
        assert!(decode(&encode(&bad))
            .unwrap_err()
            .starts_with("configuration raft cannot restore"));
        let loaded = snapper.load_newest().unwrap().unwrap();
        assert_eq!(loaded.get_metadata().index, 100);
        assert!(newest.with_extension("snap.broken").exists());
        // what raft writes passes: joint, learners, learners_next, none
        let mut joint = ConfState {
            voters: vec![1, 2, 3],
            learners: vec![5],
            voters_outgoing: vec![1, 2, 4, 6],
            learners_next: vec![4],
            auto_leave: true,
            ..Default::default()
        };
        assert!(restorable(&joint));
        joint.learners_next = vec![7];
        assert!(!restorable(&joint), "learners_next must be outgoing voters");
        assert!(restorable(&ConfState::default()));
        let auto_leave_alone = ConfState {
            voters: vec![1],
            auto_leave: true,
            ..Default::default()
        };
        assert!(!restorable(&auto_leave_alone));
    }

    #[test]
    fn snap_decoder_rejects_every_truncation() {
        let bytes = encode(&snapshot(1, 5, vec![1]));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
