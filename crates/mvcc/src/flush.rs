//! Writes the file's dirty pages back between durable commits.
//!
//! Batches commit to redb without an fsync (`--backend-batch-interval`);
//! only a durable commit (a raft snapshot's, a physical compaction's, a
//! stopping member's) fsyncs, under the writer lock, and it must then write
//! back everything the batches left in the page cache since the last one:
//! after loading 500 MB that took a second, and every write waited for it.
//! etcd's bbolt fsyncs every batch and never piles that up. Here a thread
//! writes the file's dirty pages back through a descriptor of its own every
//! interval while batches have written to it, holding no lock: the durable
//! commit finds little left to write. On Linux it is `sync_file_range`
//! (write and wait, no journal commit or disk cache flush), which leaves
//! the WAL's fdatasync alone: a full fsync every 250 ms slowed a 100-client
//! load of 8 KiB values by a quarter.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::store::Store;

/// How often the flusher looks for written batches.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(250);

impl Store {
    /// Starts the flusher thread (see the module doc); it ends when the
    /// store is dropped.
    pub fn start_flusher(self: &Arc<Self>, interval: Duration) -> std::io::Result<()> {
        let store: Weak<Store> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("backend-flush".into())
            .spawn(move || loop {
                std::thread::sleep(interval);
                let Some(store) = store.upgrade() else { return };
                if store.unflushed.swap(false, Ordering::AcqRel) {
                    store.write_back(store.path());
                }
                if store.defragmenting.load(Ordering::Acquire) {
                    store.write_back(&crate::defrag::temporary_path(store.path()));
                }
            })?;
        Ok(())
    }

    /// Writes the file at `path` back (the store's, by its path: a
    /// defragmentation may have replaced it; or a defragmentation's copy,
    /// whose durable commit would otherwise write gigabytes at once, which
    /// the WAL's fdatasync then queued behind: puts stalled 1.2 s in the
    /// defrag of 8 GiB); a failure is left to the next durable commit,
    /// which fails too.
    fn write_back(&self, path: &std::path::Path) {
        let flushed = std::fs::File::open(path).and_then(|f| write_back(&f));
        if let Err(e) = flushed {
            tracing::debug!(error = %e, "cannot write the backend's pages back");
        }
    }
}

/// A copy being built (a new member's file from its leader's records),
/// written back as it grows by a thread of its own every
/// [`FLUSH_INTERVAL`], so that its durable commit finds little left to
/// write and the build does not wait for the disk meanwhile. Only a
/// speed-up: without a descriptor or a thread it does nothing. The thread
/// ends when this is dropped.
pub(crate) struct WriteBehind {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WriteBehind {
    pub(crate) fn start(path: &std::path::Path) -> WriteBehind {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::fs::File::open(path).and_then(|file| {
            std::thread::Builder::new()
                .name("copy-flush".into())
                .spawn(move || {
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        stopped.recv_timeout(FLUSH_INTERVAL)
                    {
                        if let Err(e) = write_back(&file) {
                            tracing::debug!(error = %e, "cannot write a copy's pages back");
                            return;
                        }
                    }
                })
        });
        WriteBehind {
            stop: Some(stop),
            thread: thread.ok(),
        }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `sync_file_range` of `len` bytes of `file` from `from` (length 0: to
/// the end of the file).
#[cfg(target_os = "linux")]
fn sync_file_range(
    file: &std::fs::File,
    from: u64,
    len: u64,
    flags: libc::c_uint,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor for the call's duration.
    match unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            from as libc::off64_t,
            len as libc::off64_t,
            flags,
        )
    } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Writes the whole file's dirty pages back and waits for them.
#[cfg(target_os = "linux")]
fn write_back(file: &std::fs::File) -> std::io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    sync_file_range(file, 0, 0, flags)
}

#[cfg(not(target_os = "linux"))]
fn write_back(file: &std::fs::File) -> std::io::Result<()> {
    file.sync_data()
}

/// The longest write to a new file's page cache. A longer write has the
/// kernel (6.18, ext4) put the bytes in large page cache folios, and in a
/// VM that gives its free memory back to its host (virtio-balloon's free
/// page reporting, as on this machine) those come from blocks the host
/// must back again, page by page: 1.1 GB written in writes of 1 MiB took
/// 6.6–8.9 s, in writes of 16 KiB 0.44 s, of 4 KiB 0.6–0.8 s (a C probe,
/// each after the last file was removed and 6 s had passed; two writes of
/// the same size right after a removal take 0.23 s either way).
pub(crate) const WRITE_BYTES: usize = 16 << 10;

/// The bytes a write at `offset` takes at most: up to the end of its
/// aligned block of [`WRITE_BYTES`].
pub(crate) fn write_room(offset: u64) -> usize {
    WRITE_BYTES - (offset % WRITE_BYTES as u64) as usize
}

/// Writes `data` at `offset` of `file` in writes of at most
/// [`WRITE_BYTES`], each within one aligned block of that size.
pub(crate) fn write_all_at(file: &std::fs::File, data: &[u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let (mut data, mut offset) = (data, offset);
    while !data.is_empty() {
        let (now, later) = data.split_at(write_room(offset).min(data.len()));
        file.write_all_at(now, offset)?;
        offset += now.len() as u64;
        data = later;
    }
    Ok(())
}

/// Starts the disk writes of `[from, to)` of `file`, without waiting for
/// them: a copy's batch goes to the disk as it lands rather than all at
/// once at the write-back's next round (every [`FLUSH_INTERVAL`]), when a
/// member's WAL fdatasync queued behind it (a put's p99 during a defrag
/// 85 ms at 2 GiB). Only a hint: its failure is ignored (the sync before
/// the copy is used reports any).
#[cfg(target_os = "linux")]
pub(crate) fn start_write_back(file: &std::fs::File, from: u64, to: u64) {
    let _ = sync_file_range(
        file,
        from,
        to.saturating_sub(from),
        libc::SYNC_FILE_RANGE_WRITE,
    );
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn start_write_back(_: &std::fs::File, _: u64, _: u64) {}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::test_util::put_at;
    use crate::Store;

    /// A copy's write-back thread runs while its guard lives and ends
    /// with it; without a file there is none.
    #[test]
    fn a_write_behind_ends_with_its_guard() {
        let dir = tempfile::tempdir().unwrap();
        let missing = super::WriteBehind::start(&dir.path().join("missing"));
        assert!(missing.thread.is_none());
        let path = dir.path().join("copy");
        std::fs::write(&path, vec![1; 1 << 20]).unwrap();
        let behind = super::WriteBehind::start(&path);
        let thread = behind.thread.as_ref().expect("a thread");
        assert!(!thread.is_finished());
        std::thread::sleep(super::FLUSH_INTERVAL * 2);
        assert!(!thread.is_finished(), "it runs until dropped");
        drop(behind); // joins it
    }

    /// A durable commit syncs with the writer lock released: a write goes
    /// through meanwhile, a periodic commit is deferred (not waited for),
    /// and the durable index is the one the commit wrote before its sync.
    #[test]
    fn writes_go_on_while_a_durable_commit_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Arc::new(Store::open(&path).unwrap());
        put_at(&store, 1, "a", b"1", 0);
        store.commit(false).unwrap();
        put_at(&store, 2, "b", b"2", 0);
        let (entered, in_sync) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = std::sync::Mutex::new(released);
        *store.before_sync.lock() = Some(Box::new(move || {
            let _ = entered.send(());
            let _ = released.lock().unwrap().recv();
        }));
        let durable = {
            let store = store.clone();
            std::thread::spawn(move || store.commit(true))
        };
        in_sync.recv().unwrap();
        // the sync is held open: writes and reads go on
        put_at(&store, 3, "c", b"3", 0);
        assert!(matches!(
            store.commit_or_defer(),
            Err(crate::MvccError::Deferred)
        ));
        assert_eq!(store.durable_consistent_index(), 0);
        release.send(()).unwrap();
        durable.join().unwrap().unwrap();
        *store.before_sync.lock() = None;
        assert_eq!(store.durable_consistent_index(), 2);
        // the deferred batch goes with the next commit
        store.commit(true).unwrap();
        assert_eq!(store.durable_consistent_index(), 3);
        drop(store);
        let reopened = Store::open(&path).unwrap();
        assert_eq!(reopened.consistent_index(), 3);
        for key in ["a", "b", "c"] {
            let got = reopened
                .range(&api::etcdserverpb::RangeRequest {
                    key: key.as_bytes().to_vec().into(),
                    ..Default::default()
                })
                .unwrap();
            assert_eq!(got.kvs.len(), 1, "{key} is in the file");
        }
    }

    /// A durable commit with nothing new since the last one writes nothing;
    /// one after commits without fsync makes them durable.
    #[test]
    fn a_durable_commit_makes_earlier_batches_durable() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        put_at(&store, 1, "a", b"1", 0);
        store.commit(false).unwrap();
        assert_eq!(store.durable_consistent_index(), 0);
        store.commit(true).unwrap();
        assert_eq!(store.durable_consistent_index(), 1);
        assert!(!store.not_durable.load(Ordering::Acquire));
        store.commit(true).unwrap();
        assert_eq!(store.durable_consistent_index(), 1);
    }

    #[test]
    fn the_flusher_clears_the_mark_a_batch_commit_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
        put_at(&store, 1, "a", b"1", 0);
        store.commit(true).unwrap();
        assert!(
            !store.unflushed.load(Ordering::Acquire),
            "a durable commit needs no write-back"
        );
        put_at(&store, 2, "a", b"2", 0);
        store.commit(false).unwrap();
        assert!(store.unflushed.load(Ordering::Acquire));
        store.start_flusher(Duration::from_millis(5)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while store.unflushed.load(Ordering::Acquire) {
            assert!(Instant::now() < deadline, "the flusher never ran");
            std::thread::sleep(Duration::from_millis(5));
        }
        // the thread does not keep the store alive (it may hold it for
        // the write-back under way: not yet)
        let weak = Arc::downgrade(&store);
        drop(store);
        while weak.strong_count() > 0 {
            assert!(Instant::now() < deadline, "the flusher keeps the store");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// etcd_disk_backend_commit_duration_seconds counts a durable commit
    /// once, its batch and its sync together, as etcd's commit.
    #[test]
    fn a_durable_commit_is_one_commit_duration() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let commits = Arc::new(AtomicUsize::new(0));
        let counted = commits.clone();
        store.set_commit_observer(Arc::new(move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
        }));
        let count = || commits.load(Ordering::Relaxed);
        put_at(&store, 1, "a", b"1", 0);
        store.commit(true).unwrap();
        assert_eq!(count(), 1, "durable");
        put_at(&store, 2, "a", b"2", 0);
        store.commit(false).unwrap();
        assert_eq!(count(), 2, "without fsync");
        store.commit(true).unwrap();
        assert_eq!(count(), 3, "the sync of what is not durable yet");
        store.commit(true).unwrap();
        store.commit(false).unwrap();
        assert_eq!(count(), 3, "nothing to write");
    }
}
