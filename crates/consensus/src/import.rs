//! Raft state brought in from another system's log (`oxctl migrate`): a
//! member dir seeded so that the member starts as a restarted one.

use std::path::Path;

use raft::eraftpb::{Entry, HardState, Snapshot};

use crate::snap::Snapshotter;
use crate::wal::{Metadata, SnapshotMarker, Wal, WalOptions};
use crate::ConsensusError;

/// Writes into `member_dir` a snapshot file for `base` (its metadata:
/// index, term, conf state; the data is the backend's, kept beside it) and
/// into `wal_dir` (`<member_dir>/wal`, or the member's `--wal-dir`; it
/// must hold no WAL) a new WAL holding `metadata`, a marker for `base`,
/// `entries` and `hard_state`; durable on return.
///
/// `entries` must follow `base` without a gap. On start, raft restores
/// `base`, takes `entries` as its log, and the entries above the
/// backend's consistent index are applied, as after any restart.
pub fn import_log(
    member_dir: &Path,
    wal_dir: &Path,
    metadata: Metadata,
    base: &Snapshot,
    entries: &[Entry],
    hard_state: &HardState,
) -> Result<(), ConsensusError> {
    let base_index = base.get_metadata().index;
    let mut expected = base_index + 1;
    for e in entries {
        if e.index != expected {
            return Err(ConsensusError::Corrupt(format!(
                "imported entries: index {} where {expected} was expected (the base is at {base_index})",
                e.index
            )));
        }
        expected += 1;
    }
    let last = expected - 1;
    if hard_state.commit > last {
        return Err(ConsensusError::Corrupt(format!(
            "imported hard state commits {} beyond the last entry {last}",
            hard_state.commit
        )));
    }
    if Wal::exists(wal_dir) {
        return Err(ConsensusError::Config(format!(
            "{} already holds a WAL",
            wal_dir.display()
        )));
    }
    if base_index > 0 {
        Snapshotter::new(&member_dir.join("snap"))?.save(base, u64::MAX, None)?;
    }
    let mut wal = Wal::create(wal_dir, metadata, WalOptions::default())?;
    if base_index > 0 {
        wal.save_snapshot(SnapshotMarker {
            term: base.get_metadata().term,
            index: base_index,
        });
    }
    // in batches: a record is bounded, a log is not
    for chunk in entries.chunks(1024) {
        wal.append(chunk, None);
        wal.sync()?;
    }
    wal.append(&[], Some(hard_state));
    wal.sync()?;
    Ok(())
}
