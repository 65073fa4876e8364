//! Offline commands on a stopped member's data dir: `defrag` (etcdutl's),
//! `hashkv` (etcdutl 3.6's, beyond 3.5) and `check` (ours): never on a
//! running member (its backend is open: redb refuses a second writer, and
//! the commands say so).

use std::path::{Path, PathBuf};

use crate::{CliError, OutputFormat};

/// `<data-dir>/member/snap/db`, the backend.
fn backend_path(data_dir: &Path) -> PathBuf {
    data_dir.join("member").join("snap").join("db")
}

fn open_store(data_dir: &Path) -> Result<mvcc::Store, CliError> {
    let path = backend_path(data_dir);
    if !path.exists() {
        return Err(CliError::Failed(format!(
            "open {}: no such file or directory",
            path.display()
        )));
    }
    mvcc::Store::open(&path).map_err(|e| {
        CliError::Failed(format!(
            "cannot open the backend {} (is the member still running?): {e}",
            path.display()
        ))
    })
}

/// etcdutl's `defrag --data-dir`: rewrites the backend compactly; its
/// lines.
pub fn defrag(data_dir: &Path) -> Result<String, CliError> {
    let store = open_store(data_dir)?;
    store
        .defragment()
        .map_err(|e| CliError::Failed(format!("Failed to defragment etcd data[0] ({e})")))?;
    Ok(format!(
        "Finished defragmenting etcd data[0] ({})\n",
        data_dir.display()
    ))
}

/// etcdutl 3.6's `hashkv --data-dir [--rev]`: the member's HashKV, as
/// etcdctl endpoint hashkv shows it.
pub fn hashkv(data_dir: &Path, rev: i64, format: OutputFormat) -> Result<String, CliError> {
    let store = open_store(data_dir)?;
    let (hash, compact, revision) = store
        .hash_kv(rev)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    Ok(match format {
        OutputFormat::Json => format!(
            "{{\"hash\":{hash},\"hashRevision\":{revision},\"compactRevision\":{compact}}}\n"
        ),
        OutputFormat::Fields => format!(
            "\"Hash\" : {hash}\n\"Hash revision\" : {revision}\n\"Compact revision\" : {compact}\n"
        ),
        OutputFormat::Table => crate::snapshot::table(
            &["HASH", "HASH REVISION", "COMPACT REVISION"],
            &[hash.to_string(), revision.to_string(), compact.to_string()],
        ),
        OutputFormat::Simple => format!("{hash}, {revision}, {compact}\n"),
    })
}

/// `oxctl check --data-dir [--wal-dir]` (beyond etcdutl): reads the WAL
/// (in `member/wal`, or the member's dedicated `wal_dir`) through (every
/// record's CRC), opens the backend (every record's checksum is checked
/// as the index is rebuilt) and tells what a start would do: the entries
/// it would replay above the backend's consistent index, or why it would
/// refuse to start.
pub fn check(data_dir: &Path, wal_dir: Option<&Path>) -> Result<String, CliError> {
    let wal_dir = wal_dir.map_or_else(|| data_dir.join("member").join("wal"), Path::to_path_buf);
    let contents = consensus::wal::Wal::read(&wal_dir)
        .map_err(|e| CliError::Failed(format!("WAL in {}: {e}", wal_dir.display())))?;
    let store = open_store(data_dir)?;
    let consistent_index = store.consistent_index();
    let last = contents.entries.last().map_or(0, |e| e.index);
    let first = contents.entries.first().map_or(0, |e| e.index);
    let snapshot = contents.snapshot.map_or(0, |s| s.index);
    let mut out = String::new();
    out.push_str(&format!(
        "member {:x} of cluster {:x}\n",
        contents.metadata.node_id, contents.metadata.cluster_id
    ));
    out.push_str(&format!(
        "WAL: entries {first}..{last}, commit {}, term {}, snapshot at {snapshot}\n",
        contents.hard_state.commit, contents.hard_state.term
    ));
    out.push_str(&format!(
        "backend: revision {}, compacted at {}, consistent index {consistent_index}\n",
        store.current_revision(),
        store.compact_revision()
    ));
    if consistent_index < snapshot {
        return Err(CliError::Failed(format!(
            "{out}a start would refuse: the backend's consistent index {consistent_index} is below the WAL's snapshot at {snapshot}"
        )));
    }
    if consistent_index > last.max(snapshot) {
        return Err(CliError::Failed(format!(
            "{out}a start would refuse: the backend's consistent index {consistent_index} is beyond the WAL's last index {last}"
        )));
    }
    if contents.repaired_bytes > 0 {
        out.push_str(&format!(
            "WAL: a start cuts a torn tail of {} bytes (a record half-written by a crash; nothing acknowledged)\n",
            contents.repaired_bytes
        ));
    }
    let replay = last.saturating_sub(consistent_index);
    out.push_str(&format!(
        "ok: a start replays {replay} entries above the consistent index\n"
    ));
    Ok(out)
}
