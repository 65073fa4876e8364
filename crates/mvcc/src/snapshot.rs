//! Backend snapshots for raft: a consistent copy of the store for a
//! follower that is too far behind, and installing such a copy in place.
//!
//! Both are logical copies of the tables (key, meta and the side tables) between redb
//! files, so the live `Database` handle never changes and a copy is a
//! cleanly closed redb file. A backup is taken from one read transaction:
//! it holds exactly the state of one consistent index (stored with it).

use std::path::Path;
use std::sync::atomic::Ordering;

use redb::{Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::backend::{self, backend_error, SideTable, KEY_TABLE, META_TABLE};
use crate::parts::PART_TABLE;
use crate::store::{IndexState, Pending, INITIAL_REVISION, NO_COMPACTION};
use crate::{MvccError, Store};

/// A copy written to a new file in one durable commit at its end, in
/// steps committed without a sync before that: redb checksums a
/// transaction's dirty pages when it commits, and pages that spilled from
/// its cache to the file by then are read back, checksummed and written
/// again (a 2 GiB copy in one transaction: 3.3 s of commit, 80% of it
/// that). A step of [`step_bytes`] still has its pages in memory when it
/// commits. Until [`SteppedWrite::finish`] the file is not a copy: a
/// crash leaves it empty or partial, and every caller writes it under a
/// name of its own and removes or replaces it before the next try.
pub(crate) struct SteppedWrite {
    db: redb::Database,
    /// The file's gathered writes (see [`crate::copy_file`]), turned off
    /// once the copy is whole.
    combining: crate::copy_file::Combining,
    txn: Option<redb::WriteTransaction>,
    unstepped: std::cell::Cell<usize>,
    /// Bytes a step holds.
    step_bytes: usize,
    /// Steps committed so far.
    steps: usize,
}

/// Bytes a step holds with a redb cache of `cache_bytes`: a quarter, so
/// that its pages stay in redb's write buffer (half the cache), branch
/// pages and all, until it commits. (The defrag's copy, with the store's
/// 16 MiB cache, had steps of 8 MiB: two thirds of its pages spilled and
/// were read back at the commit.)
pub(crate) fn step_bytes(cache_bytes: usize) -> usize {
    cache_bytes / 4
}

impl SteppedWrite {
    /// A new copy at `dest` (0600; an existing file is opened as it is),
    /// with a redb cache of `cache_bytes`, in steps of
    /// [`step_bytes`]`(cache_bytes)`.
    pub(crate) fn create(cache_bytes: usize, dest: &Path) -> Result<SteppedWrite, MvccError> {
        let (db, combining) =
            crate::backend::create_copy(redb::Builder::new().set_cache_size(cache_bytes), dest)?;
        let txn = Self::step_txn(&db)?;
        Ok(SteppedWrite {
            db,
            combining,
            step_bytes: step_bytes(cache_bytes),
            txn: Some(txn),
            unstepped: std::cell::Cell::new(0),
            steps: 0,
        })
    }

    fn step_txn(db: &redb::Database) -> Result<redb::WriteTransaction, MvccError> {
        let mut txn = db.begin_write().map_err(backend_error)?;
        txn.set_durability(Durability::None)
            .map_err(backend_error)?;
        Ok(txn)
    }

    /// The current step's transaction.
    pub(crate) fn txn(&self) -> &redb::WriteTransaction {
        self.txn
            .as_ref()
            .expect("a stepped write's transaction until finish")
    }

    /// Counts `bytes` written in the current step; true once it is full
    /// (the caller closes its tables and calls [`SteppedWrite::step`]).
    pub(crate) fn wrote(&self, bytes: usize) -> bool {
        let total = self.unstepped.get() + bytes;
        self.unstepped.set(total);
        total >= self.step_bytes
    }

    #[cfg(test)]
    pub(crate) fn steps(&self) -> usize {
        self.steps
    }

    /// Commits the current step without a sync and begins the next.
    pub(crate) fn step(&mut self) -> Result<(), MvccError> {
        let txn = self
            .txn
            .take()
            .expect("a stepped write's transaction until finish");
        txn.commit().map_err(backend_error)?;
        self.txn = Some(Self::step_txn(&self.db)?);
        self.unstepped.set(0);
        self.steps += 1;
        Ok(())
    }

    /// Commits the last step durably: the copy is whole.
    pub(crate) fn finish(mut self) -> Result<redb::Database, MvccError> {
        let mut txn = self.txn.take().expect("finished once");
        txn.set_durability(Durability::Immediate)
            .map_err(backend_error)?;
        txn.commit().map_err(backend_error)?;
        // the durable commit synced what waited: nothing does now
        self.combining
            .pass_through()
            .map_err(|e| MvccError::Backend(format!("cannot write the copy: {e}")))?;
        tracing::debug!(steps = self.steps + 1, "copy committed");
        Ok(self.db)
    }
}

pub(crate) fn copy_table<K, V>(
    from: &redb::ReadTransaction,
    to: &mut SteppedWrite,
    table: TableDefinition<K, V>,
) -> Result<(), MvccError>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
    for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
{
    let source = match from.open_table(table) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(backend_error(e)),
    };
    let mut rows = source.iter().map_err(backend_error)?;
    loop {
        let mut dest = to.txn().open_table(table).map_err(backend_error)?;
        let mut full = false;
        for row in rows.by_ref() {
            let (k, v) = row.map_err(backend_error)?;
            let (k, v) = (k.value(), v.value());
            dest.insert(&k, &v).map_err(backend_error)?;
            let bytes = K::as_bytes(&k).as_ref().len() + V::as_bytes(&v).as_ref().len();
            if to.wrote(bytes) {
                full = true;
                break;
            }
        }
        drop(dest);
        if !full {
            return Ok(());
        }
        to.step()?;
    }
}

/// The `key` table and its parts, as stored (a copy keeps the source's
/// format version, in meta, with them).
pub(crate) fn copy_records(
    from: &redb::ReadTransaction,
    to: &mut SteppedWrite,
) -> Result<(), MvccError> {
    copy_table(from, to, KEY_TABLE)?;
    copy_table(from, to, PART_TABLE)
}

pub(crate) fn copy_all(
    from: &redb::ReadTransaction,
    to: &mut SteppedWrite,
) -> Result<(), MvccError> {
    copy_records(from, to)?;
    copy_table(from, to, META_TABLE)?;
    for side in SideTable::ALL {
        copy_table(from, to, side.definition())?;
    }
    Ok(())
}

/// A new file at `dest` (0600, replacing any) for a copy of a store, with
/// the copy cache, written in steps.
pub(crate) fn new_copy(dest: &Path) -> Result<SteppedWrite, MvccError> {
    let _ = std::fs::remove_file(dest);
    SteppedWrite::create(crate::snapshot_file::COPY_CACHE_BYTES, dest)
}

/// The consistent index `snapshot` holds (0 if none).
pub(crate) fn consistent_index_in(snapshot: &redb::ReadTransaction) -> Result<u64, MvccError> {
    let meta = snapshot.open_table(META_TABLE).map_err(backend_error)?;
    match meta
        .get(backend::META_CONSISTENT_INDEX)
        .map_err(backend_error)?
    {
        Some(v) => Ok(u64::from_be_bytes(v.value().try_into().map_err(|_| {
            MvccError::Corrupt("consistent_index is not 8 bytes".into())
        })?)),
        None => Ok(0),
    }
}

impl Store {
    /// Writes a consistent copy of the store to a new file at `dest` and
    /// returns the consistent index it holds. Applied-but-uncommitted
    /// changes are committed first, so the copy covers everything applied
    /// before the call.
    pub fn backup_to(&self, dest: &Path) -> Result<u64, MvccError> {
        let _defrag = self.defrag_lock.lock();
        self.commit(false)?;
        let snapshot = self.db().begin_read().map_err(backend_error)?;
        let consistent_index = consistent_index_in(&snapshot)?;
        let mut copy = new_copy(dest)?;
        copy_all(&snapshot, &mut copy)?;
        copy.finish()?;
        Ok(consistent_index)
    }

    /// Replaces the whole store with the snapshot file at `source` (a
    /// `backup_to` of another member), durably, and rebuilds the key index
    /// from it. Pending changes are discarded: the snapshot supersedes them.
    ///
    /// The file itself becomes the store's file, as etcd renames a received
    /// database into place: it is opened where it is (every page's checksum
    /// verified, its format brought up to date), its key index rebuilt, then
    /// it is renamed over the store's file and the handle swapped, as a
    /// defragmentation swaps its copy. A `source` in another directory (a
    /// file system of its own, maybe) is first copied next to the store's
    /// file. `source` is gone afterwards, except when the install failed.
    pub fn restore_from(&self, source: &Path) -> Result<(), MvccError> {
        let _defrag = self.defrag_lock.lock();
        let staged = if source.parent() == self.path().parent() {
            source.to_path_buf()
        } else {
            let staged = staging_path(self.path());
            std::fs::copy(source, &staged).map_err(|e| {
                let _ = std::fs::remove_file(&staged);
                MvccError::Backend(format!("cannot copy {}: {e}", source.display()))
            })?;
            staged
        };
        // a staged copy is ours to remove when the install fails
        let discard = || {
            if staged != source {
                let _ = std::fs::remove_file(&staged);
            }
        };
        let opened = backend::without_panics(source, || {
            // A file built here from the leader's record stream comes with
            // its key index, every record checked as it arrived (see
            // crate::record_stream): nothing to read again.
            if let Some(loaded) = crate::index_checkpoint::load(&staged)? {
                let db = backend::open_database_with(&staged, false)?;
                return Ok((db, loaded));
            }
            // A copy of another member's file: redb's integrity check at
            // open refuses a damaged one (see backend::open_database) before
            // anything commits to it.
            let db = backend::open_database(&staged)?;
            let loaded = backend::load(&db)?;
            Ok((db, loaded))
        });
        let (db, loaded) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                discard();
                return Err(e);
            }
        };
        let _writer = self.writer.lock();
        let old = {
            let _pending = self.pending.write();
            if let Err(e) = std::fs::rename(&staged, self.path()) {
                discard();
                return Err(backend_error(e));
            }
            // The old file is gone from the directory: from here on the
            // received state is the store's, whatever the directory's fsync
            // says (a crash before it is durable leaves the old file, and
            // the raft snapshot is installed again at the restart).
            if let Err(e) = crate::defrag::sync_dir(self.path()) {
                tracing::warn!(error = %e, "cannot sync the directory of the restored file");
            }
            self.swap_db(db)
        };
        // The revision jumps here without a write transaction, so no watcher
        // was notified of the revisions in between: synced watchers go back
        // to unsynced and catch up from the restored file (etcd's
        // watchableStore.Restore). Hub lock first (lock order), so no write
        // or new watcher slips between the jump and the move.
        let mut watchers = self.watch.lock();
        let previous_revision = {
            let mut state = self.state.write();
            let previous = state.current_revision;
            *state = IndexState {
                tree: loaded.index,
                current_revision: loaded.current_revision.max(INITIAL_REVISION),
                compact_revision: loaded.compact_revision.max(NO_COMPACTION),
            };
            previous
        };
        let restored_revision = self.state.read().current_revision;
        let moved = watchers.unsync_after_jump(previous_revision, restored_revision);
        drop(watchers);
        if moved {
            self.watch.signal.wake();
        }
        *self.loaded_leased_keys.lock() = loaded.leased_keys;
        // The received file's own compaction state replaces ours: batches
        // of a compaction here are moot, and one the sender had not
        // finished resumes (its records are still in the file).
        self.clear_compaction_jobs();
        *self.pending.write() = Pending {
            consistent_index: loaded.consistent_index,
            ..Pending::default()
        };
        self.finished_compact.store(
            loaded.compact_revision.max(NO_COMPACTION),
            Ordering::Release,
        );
        if let Some(revision) = loaded.scheduled_compact_revision {
            self.compact_locked_hashing(revision, false)?;
            tracing::info!(
                "scheduled-compact-revision" = revision,
                "resume scheduled compaction"
            );
        }
        self.consistent_index
            .store(loaded.consistent_index, Ordering::Release);
        self.durable_consistent_index
            .store(loaded.consistent_index, Ordering::Release);
        self.refresh_file_size();
        drop(_writer);
        // off the apply thread: closing waits for the old file's readers
        crate::defrag::close_off_thread(old);
        Ok(())
    }
}

/// Removes the copy an install interrupted by a crash left behind.
pub(crate) fn remove_leftover(path: &Path) {
    let _ = std::fs::remove_file(staging_path(path));
}

/// Where [`Store::restore_from`] copies a snapshot file that is not next to
/// the store's file.
fn staging_path(path: &Path) -> std::path::PathBuf {
    crate::defrag::sibling(path, ".restore.tmp")
}

#[cfg(test)]
mod tests {
    use api::etcdserverpb::{PutRequest, RangeRequest};

    use crate::test_util::put_at;

    use crate::Store;

    fn all(store: &Store) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
        let r = store
            .range(&RangeRequest {
                key: vec![0].into(),
                range_end: vec![0].into(),
                ..Default::default()
            })
            .unwrap();
        r.kvs
            .iter()
            .map(|kv| (kv.key.to_vec(), kv.value.to_vec(), kv.mod_revision))
            .collect()
    }

    #[test]
    fn a_backup_restored_elsewhere_holds_the_same_state_and_index() {
        let dir = tempfile::tempdir().unwrap();
        let leader = Store::open(&dir.path().join("leader.db")).unwrap();
        for i in 0..50 {
            put_at(&leader, i + 1, &format!("k{i:02}"), format!("v{i}"), 0);
        }
        leader.put_member(7, Some(b"m".to_vec()), 51);
        // Applied, never committed: the backup still carries it.
        let index = leader.backup_to(&dir.path().join("snap.db")).unwrap();
        assert_eq!(index, 51);

        let follower = Store::open(&dir.path().join("follower.db")).unwrap();
        put_at(&follower, 1, "stale", "x", 0);
        follower.restore_from(&dir.path().join("snap.db")).unwrap();
        assert_eq!(all(&follower), all(&leader));
        assert_eq!(follower.current_revision(), leader.current_revision());
        assert_eq!(follower.consistent_index(), 51);
        assert_eq!(follower.durable_consistent_index(), 51);
        assert!(follower.members().unwrap().contains_key(&7));
        // Writes go on from the restored revision, and survive a reopen.
        put_at(&follower, 52, "after", "y", 0);
        follower.commit(true).unwrap();
        let rev = follower.current_revision();
        drop(follower);
        let reopened = Store::open(&dir.path().join("follower.db")).unwrap();
        assert_eq!(reopened.current_revision(), rev);
        assert_eq!(all(&reopened).len(), 51);
    }

    #[test]
    fn a_received_file_next_to_the_store_becomes_its_file_by_rename() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let leader = Store::open(&dir.path().join("leader.db")).unwrap();
        for i in 0..20 {
            put_at(&leader, i + 1, &format!("k{i:02}"), vec![b'v'; 3_000], 0);
        }
        let member_dir = dir.path().join("member");
        std::fs::create_dir(&member_dir).unwrap();
        let received = member_dir.join("0000000000000014.snap.db");
        leader.backup_to(&received).unwrap();
        let inode = std::fs::metadata(&received).unwrap().ino();

        let follower = Store::open(&member_dir.join("db")).unwrap();
        put_at(&follower, 1, "stale", "x", 0);
        follower.restore_from(&received).unwrap();
        assert!(!received.exists(), "renamed, not copied");
        let db = member_dir.join("db");
        assert_eq!(std::fs::metadata(&db).unwrap().ino(), inode);
        assert_eq!(all(&follower), all(&leader));
        // the swapped handle takes writes, and they are in the file
        put_at(&follower, 21, "after", "y", 0);
        follower.commit(true).unwrap();
        let revision = follower.current_revision();
        drop(follower);
        let reopened = Store::open(&db).unwrap();
        assert_eq!(reopened.current_revision(), revision);
        assert_eq!(all(&reopened).len(), 21);
        assert_eq!(reopened.consistent_index(), 21);
    }

    #[test]
    fn a_received_file_elsewhere_is_copied_next_to_the_store_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let leader = Store::open(&dir.path().join("leader.db")).unwrap();
        for i in 0..5 {
            put_at(&leader, i + 1, &format!("k{i}"), "v", 0);
        }
        let received = dir.path().join("snap.db");
        leader.backup_to(&received).unwrap();
        let member_dir = dir.path().join("member");
        std::fs::create_dir(&member_dir).unwrap();
        let follower = Store::open(&member_dir.join("db")).unwrap();
        follower.restore_from(&received).unwrap();
        assert!(received.exists(), "the caller's file stays");
        let mut names: Vec<_> = std::fs::read_dir(&member_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["db"], "no staging copy left behind");
        assert_eq!(all(&follower), all(&leader));
    }

    #[test]
    fn a_damaged_received_file_is_refused_and_the_store_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let leader = Store::open(&dir.path().join("leader.db")).unwrap();
        for i in 0..20 {
            put_at(&leader, i + 1, &format!("k{i:02}"), vec![b'v'; 3_000], 0);
        }
        let received = dir.path().join("received.db");
        leader.backup_to(&received).unwrap();
        let mut bytes = std::fs::read(&received).unwrap();
        // a value's bytes: redb's page checksum refuses the file at open
        let at = bytes
            .windows(64)
            .position(|w| w.iter().all(|b| *b == b'v'))
            .unwrap();
        bytes[at + 10] ^= 0xff;
        std::fs::write(&received, &bytes).unwrap();

        let follower = Store::open(&dir.path().join("follower.db")).unwrap();
        put_at(&follower, 1, "mine", "x", 0);
        let refused = follower.restore_from(&received).unwrap_err();
        assert!(refused.to_string().contains("is damaged"), "{refused}");
        assert!(received.exists(), "a refused file is not installed");
        assert_eq!(all(&follower).len(), 1);
        put_at(&follower, 2, "more", "y", 0);
        follower.commit(true).unwrap();
        drop(follower);
        let reopened = Store::open(&dir.path().join("follower.db")).unwrap();
        assert_eq!(all(&reopened).len(), 2);
    }

    #[test]
    fn leases_and_leased_keys_travel_with_a_backup_and_a_reopen() {
        use crate::SideTable;
        let dir = tempfile::tempdir().unwrap();
        let leader = Store::open(&dir.path().join("leader.db")).unwrap();
        leader.put_side(SideTable::Leases, 5, Some(b"lease-5".to_vec()), 1);
        let mut w = leader.write(2);
        for (key, lease) in [("a", 5), ("b", 5), ("c", 0)] {
            w.put(&PutRequest {
                key: key.as_bytes().to_vec().into(),
                lease,
                ..Default::default()
            })
            .unwrap();
        }
        w.end();
        // Re-put without a lease, then deleted: neither is leased any more.
        put_at(&leader, 3, "b", "plain", 0);
        let mut w = leader.write(4);
        w.put(&PutRequest {
            key: b"gone".to_vec().into(),
            lease: 5,
            ..Default::default()
        })
        .unwrap();
        w.end();
        let mut w = leader.write(5);
        w.delete_range(&api::etcdserverpb::DeleteRangeRequest {
            key: b"gone".to_vec().into(),
            ..Default::default()
        })
        .unwrap();
        w.end();
        leader.backup_to(&dir.path().join("snap.db")).unwrap();

        let follower = Store::open(&dir.path().join("follower.db")).unwrap();
        follower.restore_from(&dir.path().join("snap.db")).unwrap();
        assert_eq!(
            follower.side_records(SideTable::Leases).unwrap().get(&5),
            Some(&b"lease-5".to_vec())
        );
        let leased = follower.take_loaded_leased_keys();
        assert_eq!(leased, vec![(bytes::Bytes::from("a"), 5)]);
        assert!(follower.take_loaded_leased_keys().is_empty(), "taken once");

        leader.commit(true).unwrap();
        drop(leader);
        let reopened = Store::open(&dir.path().join("leader.db")).unwrap();
        assert_eq!(reopened.take_loaded_leased_keys(), leased);
        assert_eq!(reopened.side_records(SideTable::Leases).unwrap().len(), 1);
    }

    /// A copy of more than a step commits in steps, the last one durably,
    /// and comes out whole: every record and part, the side tables.
    #[test]
    fn a_copy_larger_than_a_step_is_written_in_steps_and_comes_out_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        store.put_side(crate::SideTable::Leases, 5, Some(b"lease-5".to_vec()), 1);
        let mut index = 1;
        for i in 0..(3 * super::step_bytes(crate::snapshot_file::COPY_CACHE_BYTES) / (1 << 20)) {
            index += 1;
            put_at(
                &store,
                index,
                &format!("k{i:03}"),
                vec![i as u8; 1 << 20],
                0,
            );
        }
        store.commit(true).unwrap();
        let dest = dir.path().join("copy.db");
        let snapshot = redb::ReadableDatabase::begin_read(&*store.db()).unwrap();
        let mut copy = super::new_copy(&dest).unwrap();
        super::copy_all(&snapshot, &mut copy).unwrap();
        assert!(copy.steps() >= 2, "{} steps", copy.steps());
        drop(copy.finish().unwrap());

        let other = Store::open(&dir.path().join("other.db")).unwrap();
        other.restore_from(&dest).unwrap();
        let range = |s: &Store| {
            s.range(&RangeRequest {
                key: vec![0].into(),
                range_end: vec![0].into(),
                ..Default::default()
            })
            .unwrap()
            .kvs
        };
        assert_eq!(
            range(&other).len(),
            3 * super::step_bytes(crate::snapshot_file::COPY_CACHE_BYTES) / (1 << 20)
        );
        assert_eq!(range(&other), range(&store));
        assert_eq!(other.hash().unwrap(), store.hash().unwrap());
        assert_eq!(
            other
                .side_records(crate::SideTable::Leases)
                .unwrap()
                .get(&5),
            Some(&b"lease-5".to_vec())
        );
    }
}
