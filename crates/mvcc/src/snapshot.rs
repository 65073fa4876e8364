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

pub(crate) fn copy_table<K, V>(
    from: &redb::ReadTransaction,
    to: &redb::WriteTransaction,
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
    let mut dest = to.open_table(table).map_err(backend_error)?;
    for row in source.iter().map_err(backend_error)? {
        let (k, v) = row.map_err(backend_error)?;
        dest.insert(k.value(), v.value()).map_err(backend_error)?;
    }
    Ok(())
}

/// The `key` table and its parts, as stored (a copy keeps the source's
/// format version, in meta, with them).
pub(crate) fn copy_records(
    from: &redb::ReadTransaction,
    to: &redb::WriteTransaction,
) -> Result<(), MvccError> {
    copy_table(from, to, KEY_TABLE)?;
    copy_table(from, to, PART_TABLE)
}

pub(crate) fn copy_all(
    from: &redb::ReadTransaction,
    to: &redb::WriteTransaction,
) -> Result<(), MvccError> {
    copy_records(from, to)?;
    copy_table(from, to, META_TABLE)?;
    for side in SideTable::ALL {
        copy_table(from, to, side.definition())?;
    }
    Ok(())
}

/// A new file at `dest` (0600, replacing any) for a copy of a store, with
/// the copy cache, and its one durable write transaction.
pub(crate) fn new_copy(dest: &Path) -> Result<(redb::Database, redb::WriteTransaction), MvccError> {
    let _ = std::fs::remove_file(dest);
    let copy = crate::backend::create_private(
        redb::Builder::new().set_cache_size(crate::snapshot_file::COPY_CACHE_BYTES),
        dest,
    )?;
    let mut txn = copy.begin_write().map_err(backend_error)?;
    txn.set_durability(Durability::Immediate)
        .map_err(backend_error)?;
    Ok((copy, txn))
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
        let (_copy, txn) = new_copy(dest)?;
        copy_all(&snapshot, &txn)?;
        txn.commit().map_err(backend_error)?;
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
        if let Err(e) = std::thread::Builder::new()
            .name("close-old-db".into())
            .spawn({
                let old = old.clone();
                move || crate::defrag::close_when_unused(old)
            })
        {
            tracing::warn!(error = %e, "cannot start a thread to close the replaced file");
        }
        drop(old);
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
}
