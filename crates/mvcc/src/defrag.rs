//! Defragmentation: rewrites the redb file compactly and returns the freed
//! space to the filesystem (etcd's backend.Defrag).
//!
//! etcd blocks every read and write for the whole defrag. Here neither
//! waits: the copy is made from one read transaction while commits are
//! deferred (applied writes stay in the pending overlay, where readers find
//! them), then the new file replaces the old by an atomic rename and the
//! handle is swapped under the writer and pending locks, a step that lasts
//! no longer than a rename and an fsync of the directory. The deferred batch
//! is committed to the new file right after.
//!
//! Crash safety: the copy is written to `db.defrag.tmp` next to the file
//! and made durable before the rename; a crash before the rename leaves the
//! old file intact and the temporary file is removed at the next open.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase};

use crate::backend::backend_error;
use crate::snapshot::copy_all;
use crate::{MvccError, Store};

/// What a defragmentation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefragStats {
    pub size_before: i64,
    pub size_after: i64,
    /// How long commits were deferred (reads and applies went on).
    pub copy_time: Duration,
    /// How long the swap held the writer lock (applies waited this long).
    pub swap_time: Duration,
}

/// `path` with `suffix` appended to its file name (a scratch file next to
/// the store's: defrag's copy, a staged snapshot).
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

pub(crate) fn temporary_path(path: &Path) -> PathBuf {
    sibling(path, ".defrag.tmp")
}

/// Removes the copy a defragmentation interrupted by a crash left behind.
pub(crate) fn remove_leftover(path: &Path) {
    let tmp = temporary_path(path);
    if tmp.exists() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// How long the defragmentation waits for readers of the old file before
/// leaving its closing to the last of them.
const OLD_FILE_GRACE: Duration = Duration::from_secs(5);

/// Closes a replaced file on a thread of its own, once the readers that
/// still use it are done, so that neither the caller nor a request pays
/// for closing it: the kernel drops the unlinked file's cached pages then
/// (0.3 s for 1.1 GB). Without a thread, the last holder closes it.
pub(crate) fn close_off_thread(old: std::sync::Arc<Database>) {
    let spawned = std::thread::Builder::new()
        .name("close-old-db".into())
        .spawn({
            let old = old.clone();
            move || close_when_unused(old)
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a thread to close the replaced file");
    }
    drop(old);
}

/// Closes the replaced file here, once the readers that still use it are
/// done, so that no request pays for closing it.
fn close_when_unused(old: std::sync::Arc<Database>) {
    let deadline = Instant::now() + OLD_FILE_GRACE;
    while std::sync::Arc::strong_count(&old) > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(old);
}

pub(crate) fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

impl Store {
    /// Rewrites the file compactly. Reads, writes and their apply go on
    /// meanwhile; only commits wait, in memory, until the copy is in place.
    pub fn defragment(&self) -> Result<DefragStats, MvccError> {
        let _defrag = self.defrag_lock.lock();
        let size_before = self.db_size();
        // Everything applied so far goes to the old file; from here on the
        // overlay holds what is applied during the copy.
        self.commit(false)?;
        {
            let _writer = self.writer.lock();
            self.defragmenting.store(true, Ordering::Release);
        }
        let started = Instant::now();
        let tmp = temporary_path(self.path());
        crate::fail_point!("defragBeforeCopy");
        let copied = self.copy_compactly(&tmp);
        let copy_time = started.elapsed();
        let swap_started = Instant::now();
        let swapped = copied.and_then(|copy| {
            // The copy is durable, the old file still in place (and no lock
            // held: a sleep here stalls no write).
            crate::fail_point!("defragBeforeRename");
            let _writer = self.writer.lock();
            let _pending = self.pending.write();
            std::fs::rename(&tmp, self.path())
                .and_then(|()| sync_dir(self.path()))
                .map_err(backend_error)?;
            Ok(self.swap_db(copy))
        });
        let swap_time = swap_started.elapsed();
        self.defragmenting.store(false, Ordering::Release);
        let old = match swapped {
            Ok(old) => old,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        self.refresh_file_size();
        // The deferred batch, now into the new file.
        self.commit(false)?;
        close_off_thread(old);
        Ok(DefragStats {
            size_before,
            size_after: self.db_size(),
            copy_time,
            swap_time,
        })
    }

    /// Counts the pages in use now (a walk over the file's allocator
    /// state), for [`Store::db_size_in_use`]; after open that is otherwise
    /// the file's size until the next commit.
    pub fn measure_size_in_use(&self) -> Result<i64, MvccError> {
        let _writer = self.writer.lock();
        let in_use = crate::backend::count_in_use(&self.db())?;
        self.size_in_use.store(in_use, Ordering::Relaxed);
        Ok(in_use)
    }

    fn copy_compactly(&self, tmp: &Path) -> Result<Database, MvccError> {
        let _ = std::fs::remove_file(tmp);
        let snapshot = self.db().begin_read().map_err(backend_error)?;
        let mut write = crate::snapshot::SteppedWrite::create(crate::backend::CACHE_BYTES, tmp)?;
        // the old file's pages leave the cache as the copy reads them
        // (see crate::read_drop); the file goes at the swap anyway
        let dropping = crate::read_drop::DroppingReads::of(self.path());
        copy_all(&snapshot, &mut write)?;
        drop(dropping);
        let copy = write.finish()?;
        drop(snapshot);
        // No redb compact() of the copy: records written in order leave
        // nothing to move, and the file's grown part is a hole the size
        // counts not (Store::db_size). It rewrote the whole copy: at
        // 835 MB, 7.6 s of a 17.4 s defrag, for the same size held.
        //
        // The bytes in use: the copy's blocks on disk. It wrote its pages
        // once each, in order, and the few a step's commit freed (the right
        // edge of each tree) the next step took again, so they are its
        // pages in use, as a defragmented bbolt file's size is etcd's. redb's
        // count walks every page of the file: 19% of the defrag of 2 GiB,
        // while commits are deferred.
        let in_use = match crate::store::stored_size(tmp) {
            Some((_, stored)) => stored,
            None => crate::backend::count_in_use(&copy)?,
        };
        self.size_in_use.store(in_use, Ordering::Relaxed);
        Ok(copy)
    }
}

#[cfg(test)]
mod tests {
    use api::etcdserverpb::RangeRequest;

    use crate::test_util::{delete_range_at, put_at};

    use crate::Store;

    /// This process's descriptors on unlinked files in `dir`.
    fn open_deleted_files_in(dir: &std::path::Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .filter(|target| {
                let target = target.to_string_lossy();
                target.starts_with(&*dir.to_string_lossy()) && target.ends_with(" (deleted)")
            })
            .count()
    }

    #[test]
    fn defrag_returns_space_and_keeps_every_key_and_later_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Store::open(&path).unwrap();
        let mut index = 0;
        for i in 0..400 {
            index += 1;
            put_at(&store, index, &format!("k{i:03}"), vec![7; 10_000], 0);
        }
        store.commit(true).unwrap();
        index += 1;
        delete_range_at(&store, index, "k1", "k4");
        index += 1;
        store.compact(store.current_revision(), index).unwrap();
        store.commit(true).unwrap();
        let before = store.range(&RangeRequest {
            key: vec![0].into(),
            range_end: vec![0].into(),
            ..Default::default()
        });

        let stats = store.defragment().unwrap();
        assert!(
            stats.size_after < stats.size_before / 2,
            "{stats:?}: the space of 300 deleted 10 KB values comes back"
        );
        // the bytes in use, as the copy's blocks, are what redb counts
        let in_use = store.db_size_in_use();
        let counted = store.measure_size_in_use().unwrap();
        assert!(
            (in_use - counted).abs() <= counted / 50 + 64 * 1024,
            "{in_use} B in use after the defrag, {counted} B counted"
        );
        let after = store.range(&RangeRequest {
            key: vec![0].into(),
            range_end: vec![0].into(),
            ..Default::default()
        });
        assert_eq!(before, after);
        assert!(!dir.path().join("db.defrag.tmp").exists());
        // the replaced file is closed off the defrag's thread, once unused:
        // no descriptor of this process is left on it (not yet: a thread
        // closes it)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while open_deleted_files_in(dir.path()) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the old file stays open"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }

        index += 1;
        put_at(&store, index, "later", vec![1], 0);
        store.commit(true).unwrap();
        // redb grows the compact file by doubling its length on the first
        // commit; the size reported is what it holds (etcd's high-water
        // mark), not the hole past it
        let len = std::fs::metadata(&path).unwrap().len() as i64;
        assert!(
            store.db_size() < stats.size_after + 256 * 1024 && store.db_size() < len,
            "size {} after a put, {} after the defrag, file length {len}",
            store.db_size(),
            stats.size_after
        );
        let revision = store.current_revision();
        drop(store);
        let reopened = Store::open(&path).unwrap();
        assert_eq!(reopened.current_revision(), revision);
        assert_eq!(reopened.consistent_index(), index);
        let all = reopened
            .range(&RangeRequest {
                key: vec![0].into(),
                range_end: vec![0].into(),
                count_only: true,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(all.count, 101);
    }

    #[test]
    fn writes_applied_during_a_defrag_are_readable_and_committed_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(Store::open(&dir.path().join("db")).unwrap());
        for i in 0..200u64 {
            put_at(&store, i + 1, &format!("k{i:03}"), vec![3; 5_000], 0);
        }
        store.commit(true).unwrap();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..2_000u64 {
                    put_at(&store, 201 + i, &format!("w{i:04}"), vec![5; 100], 0);
                    let got = store
                        .range(&RangeRequest {
                            key: format!("w{i:04}").into_bytes().into(),
                            ..Default::default()
                        })
                        .unwrap();
                    assert_eq!(got.count, 1);
                    match store.commit(false) {
                        Ok(()) | Err(crate::MvccError::Deferred) => {}
                        Err(e) => panic!("commit failed: {e}"),
                    }
                }
            })
        };
        for _ in 0..3 {
            store.defragment().unwrap();
        }
        writer.join().unwrap();
        store.commit(true).unwrap();
        assert_eq!(store.consistent_index(), 2_200);
        let path = dir.path().join("db");
        drop(std::sync::Arc::try_unwrap(store).ok().unwrap());
        let reopened = Store::open(&path).unwrap();
        let all = reopened
            .range(&RangeRequest {
                key: vec![0].into(),
                range_end: vec![0].into(),
                count_only: true,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(all.count, 2_200);
    }
}
