//! raft's log storage: raft-rs's `MemStorage` for the recent entries, and
//! the WAL's segments for the applied ones below them.
//!
//! etcd keeps every entry since its last snapshot in memory (up to
//! `--snapshot-count`, 100,000 by default, plus the catch-up entries): at
//! ~470 B per put of 256 B that was 47 MB of a member's 140 MB after 100k
//! puts. Here only the last [`HOT_ENTRIES`] applied entries (and what is not
//! applied yet) stay in memory; older ones keep only their term (8 B) and are
//! read back from the WAL when a follower needs them, as far back as etcd
//! would have them. A follower behind what the WAL still holds gets a
//! snapshot, as it would from etcd behind its memory.
//!
//! Nothing unapplied is ever read from disk: apply takes its entries from
//! memory, so a read failure (a purged segment, a damaged record) costs a
//! follower a snapshot, never the member.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::RwLockWriteGuard;

use parking_lot::Mutex;
use raft::eraftpb::{Entry, Snapshot};
use raft::storage::{MemStorage, MemStorageCore};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::wal::{read_entries, Cursor};

/// Applied entries kept in memory below the applied index: what a follower a
/// little behind asks for, sent without a disk read.
pub(crate) const HOT_ENTRIES: u64 = 1024;

/// raft's log: [`MemStorage`] plus the applied entries moved out of it.
pub(crate) struct LogStorage {
    mem: MemStorage,
    cold: Option<Cold>,
}

/// The entries below `mem`'s first, read back from the WAL.
struct Cold {
    wal_dir: PathBuf,
    /// Index of `terms[0]`; `first + terms.len()` is `mem`'s first index
    /// whenever `terms` is not empty.
    first: u64,
    terms: VecDeque<u64>,
    cursor: Mutex<Option<Cursor>>,
}

impl LogStorage {
    /// Every entry in memory, as raft-rs's storage (tests, and a member
    /// before its WAL is known).
    pub(crate) fn in_memory(mem: MemStorage) -> LogStorage {
        LogStorage { mem, cold: None }
    }

    /// Applied entries may leave memory from now on, to be read back from
    /// the segments in `wal_dir`.
    pub(crate) fn spill_to(&mut self, wal_dir: PathBuf) {
        self.cold = Some(Cold {
            wal_dir,
            first: 0,
            terms: VecDeque::new(),
            cursor: Mutex::new(None),
        });
    }

    /// The in-memory part, as raft-rs's `MemStorage::wl`.
    pub(crate) fn wl(&self) -> RwLockWriteGuard<'_, MemStorageCore> {
        self.mem.wl()
    }

    fn mem_first(&self) -> u64 {
        // MemStorage's first index never fails
        Storage::first_index(&self.mem).unwrap_or(0)
    }

    /// Entries in memory below `applied + 1 - HOT_ENTRIES` leave it, once
    /// there are twice that many (so the move runs once per HOT_ENTRIES
    /// entries, not per entry). Only applied entries: they are in the WAL's
    /// files (written, if not yet synced).
    pub(crate) fn spill_applied(&mut self, applied: u64) {
        let mem_first = self.mem_first();
        let Some(cold) = &mut self.cold else { return };
        if applied < mem_first + 2 * HOT_ENTRIES {
            return;
        }
        let to = applied + 1 - HOT_ENTRIES;
        let Ok(terms) = (mem_first..to)
            .map(|index| Storage::term(&self.mem, index))
            .collect::<raft::Result<Vec<u64>>>()
        else {
            // cannot happen (mem_first..to is in memory): leave both tiers
            return;
        };
        if cold.terms.is_empty() {
            cold.first = mem_first;
        }
        cold.terms.extend(terms);
        // `to` ≤ applied + 1 ≤ last index: memory keeps HOT_ENTRIES entries
        let _ = self.mem.wl().compact(to);
    }

    /// Drops the log below `index` from both tiers (a snapshot's
    /// compaction).
    pub(crate) fn compact(&mut self, index: u64) -> raft::Result<()> {
        if let Some(cold) = &mut self.cold {
            if !cold.terms.is_empty() && index > cold.first {
                let drop = (index - cold.first).min(cold.terms.len() as u64);
                cold.terms.drain(..drop as usize);
                cold.first += drop;
                *cold.cursor.lock() = None;
            }
        }
        if index > self.mem_first() {
            self.mem.wl().compact(index)?;
        }
        Ok(())
    }

    /// A snapshot from the leader replaces the whole log.
    pub(crate) fn apply_snapshot(&mut self, snapshot: Snapshot) -> raft::Result<()> {
        if let Some(cold) = &mut self.cold {
            cold.terms.clear();
            *cold.cursor.lock() = None;
        }
        self.mem.wl().apply_snapshot(snapshot)
    }

    /// The cold tier's range, when it holds any entry.
    fn cold_range(&self) -> Option<(&Cold, u64, u64)> {
        let cold = self.cold.as_ref()?;
        (!cold.terms.is_empty()).then(|| (cold, cold.first, cold.first + cold.terms.len() as u64))
    }

    /// Entries in memory (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn in_memory_entries(&self) -> u64 {
        self.mem.last_index().unwrap_or(0) + 1 - self.mem_first()
    }
}

impl Storage for LogStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into();
        let Some((cold, first, mem_first)) = self.cold_range() else {
            return self.mem.entries(low, high, max_size, context);
        };
        if low >= mem_first {
            return self.mem.entries(low, high, max_size, context);
        }
        if low < first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        let cold_high = high.min(mem_first);
        let terms: Vec<u64> = cold
            .terms
            .range((low - first) as usize..(cold_high - first) as usize)
            .copied()
            .collect();
        let read = read_entries(
            &cold.wal_dir,
            low,
            &terms,
            max_size,
            &mut cold.cursor.lock(),
        );
        let mut entries = match read {
            Ok(Some(entries)) => entries,
            Ok(None) => {
                tracing::warn!(low, "raft: the WAL no longer holds the entries a follower needs; it gets a snapshot");
                return Err(raft::Error::Store(StorageError::Compacted));
            }
            Err(e) => {
                tracing::warn!(low, error = %e, "raft: cannot read entries back from the WAL; the follower gets a snapshot");
                return Err(raft::Error::Store(StorageError::Compacted));
            }
        };
        // all of the cold part, and room left: the rest from memory
        let whole = entries.len() as u64 == cold_high - low;
        if whole && high > cold_high {
            let size: u64 = entries
                .iter()
                .map(|e| u64::from(protobuf::Message::compute_size(e)))
                .sum();
            if max_size.is_none_or(|max| size < max) {
                entries.extend(self.mem.entries(cold_high, high, max_size, context)?);
                raft::util::limit_size(&mut entries, max_size);
            }
        }
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        match self.cold_range() {
            Some((cold, first, mem_first)) if idx >= first && idx < mem_first => {
                Ok(cold.terms[(idx - first) as usize])
            }
            _ => self.mem.term(idx),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        match self.cold_range() {
            Some((_, first, _)) => Ok(first),
            None => self.mem.first_index(),
        }
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        self.mem.snapshot(request_index, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::{Metadata, Wal, WalOptions};
    use raft::eraftpb::HardState;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: format!(
                "entry {index} of term {term} {}",
                "x".repeat((index % 50) as usize)
            )
            .into_bytes()
            .into(),
            ..Default::default()
        }
    }

    fn any() -> GetEntriesContext {
        GetEntriesContext::empty(false)
    }

    /// A WAL over small segments holding 1..=n, with 3001..=3200 written
    /// twice (term 1, then overwritten at term 2 in a later segment, as a
    /// follower's conflicting log is), and the same log in memory.
    fn log(dir: &std::path::Path, n: u64) -> (Vec<Entry>, LogStorage) {
        let options = WalOptions {
            segment_bytes: 64 * 1024,
            max_files: 0,
            ..Default::default()
        };
        let meta = Metadata {
            node_id: 1,
            cluster_id: 2,
            initial_voters: vec![1],
        };
        let mut wal = Wal::create(dir, meta, options).unwrap();
        let stale: Vec<Entry> = (3001..=3200).map(|i| entry(i, 1)).collect();
        let mut log: Vec<Entry> = Vec::new();
        for i in 1..=n {
            let term = if i > 3000 { 2 } else { 1 };
            if i == 3001 {
                wal.append(&stale, None);
                wal.sync().unwrap();
            }
            log.push(entry(i, term));
            wal.append(&log[log.len() - 1..], None);
            if i % 100 == 0 {
                wal.sync().unwrap();
            }
        }
        wal.append(
            &[],
            Some(&HardState {
                term: 2,
                vote: 1,
                commit: n,
                ..Default::default()
            }),
        );
        wal.sync().unwrap();
        assert!(wal.segment_paths().len() > 3, "the log spans segments");
        let mem = MemStorage::new();
        mem.wl().append(&log).unwrap();
        let mut storage = LogStorage::in_memory(mem);
        storage.spill_to(dir.to_path_buf());
        (log, storage)
    }

    #[test]
    fn applied_entries_leave_memory_and_come_back_from_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let n = 6000;
        let (log, mut storage) = log(dir.path(), n);
        storage.spill_applied(5500);
        assert_eq!(
            storage.in_memory_entries(),
            n - (5500 + 1 - HOT_ENTRIES) + 1
        );
        assert_eq!(storage.first_index().unwrap(), 1);
        assert_eq!(storage.last_index().unwrap(), n);
        for index in [1, 2999, 3000, 3001, 3100, 3200, 3201, 4476, 4477, 6000] {
            assert_eq!(
                storage.term(index).unwrap(),
                log[index as usize - 1].term,
                "{index}"
            );
        }
        // every range, across the segments, the overwritten records and the
        // edge between the tiers, read back as written
        for (low, high) in [
            (1, 2),
            (1, 500),
            (2990, 3010),
            (3150, 3250),
            (4400, 4600),
            (4477, 4478),
            (1, 6001),
        ] {
            let got = storage.entries(low, high, None, any()).unwrap();
            assert_eq!(
                got,
                log[low as usize - 1..high as usize - 1].to_vec(),
                "{low}..{high}"
            );
        }
        // a follower catching up reads forward: the cursor serves each call
        for low in (1..4400).step_by(137) {
            let got = storage.entries(low, low + 137, None, any()).unwrap();
            assert_eq!(
                got,
                log[low as usize - 1..low as usize + 136].to_vec(),
                "{low}"
            );
        }
        // the size limit as raft's: the first entry always, then what fits
        let one = storage.entries(10, 20, 1, any()).unwrap();
        assert_eq!(one, log[9..10].to_vec());
        let mut limited = log[4470..4490].to_vec();
        raft::util::limit_size(&mut limited, Some(700));
        assert_eq!(storage.entries(4471, 4491, 700, any()).unwrap(), limited);
        assert!(limited.len() > 1 && limited.len() < 20);
    }

    #[test]
    fn a_compaction_drops_both_tiers_and_a_purged_segment_means_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut storage) = log(dir.path(), 6000);
        storage.spill_applied(5500);
        storage.compact(2000).unwrap();
        assert_eq!(storage.first_index().unwrap(), 2000);
        assert!(matches!(
            storage.entries(1999, 2001, None, any()),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert_eq!(
            storage.entries(2000, 2002, None, any()).unwrap(),
            log[1999..2001].to_vec()
        );
        // the segments below 4000 gone: what they held comes as Compacted
        // (raft sends a snapshot), what memory holds is still served
        let mut segments: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        segments.sort();
        std::fs::remove_file(&segments[0]).unwrap();
        std::fs::remove_file(&segments[1]).unwrap();
        assert!(matches!(
            storage.entries(2000, 2100, None, any()),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert_eq!(
            storage.entries(5000, 5010, None, any()).unwrap(),
            log[4999..5009].to_vec()
        );
        // beyond memory's first index the tiers end where they did
        storage.compact(5000).unwrap();
        assert_eq!(storage.first_index().unwrap(), 5000);
        assert_eq!(storage.term(5000).unwrap(), 2);
    }

    #[test]
    fn a_snapshot_from_the_leader_empties_the_cold_tier() {
        let dir = tempfile::tempdir().unwrap();
        let (_, mut storage) = log(dir.path(), 6000);
        storage.spill_applied(5500);
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().index = 9000;
        snapshot.mut_metadata().term = 3;
        storage.apply_snapshot(snapshot).unwrap();
        assert_eq!(storage.first_index().unwrap(), 9001);
        assert_eq!(storage.last_index().unwrap(), 9000);
        assert_eq!(storage.term(9000).unwrap(), 3);
        assert!(storage.term(100).is_err());
    }
}
