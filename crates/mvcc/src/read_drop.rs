//! A defrag's reads of the old file leave the page cache as they go.
//!
//! A defrag reads every record of the store's file once, in key order, and
//! writes it into a new file, which then replaces the old one. Both files
//! sit in the page cache meanwhile: the new one grows by the size of the
//! copy (4.3 GB at 8 GiB) while the old one, read once and deleted at the
//! swap, keeps all of its pages. Here the pages the copy has read are
//! dropped from the cache as it goes (`POSIX_FADV_DONTNEED`), so the copy's
//! new pages take the memory of those it has read: the cache of a defrag
//! stays the size of the old file, and ends as the new file, warm.
//!
//! Where this matters most is a VM that gives its free memory back to its
//! host (virtio-balloon's free page reporting, as on the machine these
//! figures come from): a page cache that grows into long-free memory waits
//! for the host to back it, page by page, and the 8 GiB defrag's copy took
//! 21–34 s there instead of 8 s (README, "A large database").
//!
//! Only the thread that runs a defrag's copy drops what it reads, and only
//! from the store's own file: [`DroppingReads`] names the file (by device
//! and inode) for the thread while the copy runs, and the file's backend
//! ([`crate::copy_file::CombiningFile`]) notes each read of it there.
//! Requests reading the old file meanwhile read a dropped page back from
//! the disk. Reads of the copy's own new file are never dropped.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A file by its device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The open `file`'s.
    pub(crate) fn of(file: &std::fs::File) -> Option<FileId> {
        Self::from(file.metadata())
    }

    /// The file's now at `path`.
    fn at(path: &Path) -> Option<FileId> {
        Self::from(std::fs::metadata(path))
    }

    fn from(metadata: std::io::Result<std::fs::Metadata>) -> Option<FileId> {
        metadata.ok().map(|m| FileId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// Reads noted before they are dropped together (sorted, adjacent ones
/// merged): 16 MiB of 4 KiB pages.
const NOTED_READS: usize = 4096;

/// Runs of pages read that are remembered at most (merged runs of the
/// copy so far: one, or a few, while it reads the file in order).
const KEPT_RUNS: usize = 1 << 16;

/// The reads this thread drops: whose file, and those noted so far.
struct Dropping {
    id: FileId,
    /// A descriptor on that file, taken at the first read noted.
    file: Option<std::fs::File>,
    noted: Vec<(u64, u64)>,
    /// What was read so far, in merged runs (start → end). The page cache
    /// holds a file in folios of up to 2 MiB (ext4, kernel 6.18) and drops
    /// only a folio a call covers whole: a run grown by later reads is
    /// dropped again, whole, to reach the folios its parts only touched.
    runs: BTreeMap<u64, u64>,
}

thread_local! {
    static DROPPING: RefCell<Option<Dropping>> = const { RefCell::new(None) };
}

/// While it lives, this thread's reads of one file leave the page cache.
pub(crate) struct DroppingReads(());

impl DroppingReads {
    /// This thread's reads of the file now at `path` are dropped until the
    /// guard goes (nothing happens if the file cannot be found).
    pub(crate) fn of(path: &Path) -> DroppingReads {
        if let Some(id) = FileId::at(path) {
            DROPPING.with(|d| {
                *d.borrow_mut() = Some(Dropping {
                    id,
                    file: None,
                    noted: Vec::with_capacity(NOTED_READS),
                    runs: BTreeMap::new(),
                })
            });
        }
        DroppingReads(())
    }
}

impl Drop for DroppingReads {
    fn drop(&mut self) {
        if let Some(mut dropping) = DROPPING.with(|d| d.borrow_mut().take()) {
            drop_noted(&mut dropping);
        }
    }
}

/// Notes a read of `len` bytes at `offset` of `file` (whose id is `id`),
/// to be dropped if this thread drops that file's reads.
pub(crate) fn note_read(id: Option<FileId>, file: &std::fs::File, offset: u64, len: usize) {
    let Some(id) = id else { return };
    DROPPING.with(|d| {
        let mut d = d.borrow_mut();
        let Some(dropping) = d.as_mut().filter(|d| d.id == id) else {
            return;
        };
        if dropping.file.is_none() {
            dropping.file = file.try_clone().ok();
        }
        dropping.noted.push((offset, offset + len as u64));
        if dropping.noted.len() >= NOTED_READS {
            drop_noted(dropping);
        }
    });
}

/// Drops the noted reads from the page cache: each run of pages read so
/// far that they grew, in one call.
fn drop_noted(dropping: &mut Dropping) {
    let Some(file) = &dropping.file else {
        dropping.noted.clear();
        return;
    };
    if dropping.runs.len() > KEPT_RUNS {
        dropping.runs.clear();
    }
    let mut grown = Vec::new();
    for (from, to) in dropping.noted.drain(..) {
        grown.push(merge(&mut dropping.runs, from, to));
    }
    grown.sort_unstable();
    grown.dedup();
    for start in grown {
        // a later read may have merged it into a run before it
        if let Some(&end) = dropping.runs.get(&start) {
            drop_cached(file, (start, end));
        }
    }
}

/// Adds `[from, to)` to `runs`, merged with the runs it meets or adjoins;
/// the start of the run it is now part of.
fn merge(runs: &mut BTreeMap<u64, u64>, mut from: u64, mut to: u64) -> u64 {
    while let Some((&start, &end)) = runs.range(..=to).next_back() {
        if end < from {
            break;
        }
        runs.remove(&start);
        from = from.min(start);
        to = to.max(end);
    }
    runs.insert(from, to);
    from
}

/// `POSIX_FADV_DONTNEED` of `[from, to)`: the kernel drops the clean pages
/// there no one has mapped (dirty ones stay). Only a hint: a failure
/// changes nothing but the memory.
fn drop_cached(file: &std::fs::File, (from, to): (u64, u64)) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor for the call's duration.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                from as libc::off_t,
                (to - from) as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, from, to);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    const PAGE: usize = 4096;

    /// A file of `pages` pages in `dir`, written back (its pages clean)
    /// and read once (in the cache).
    fn cached_file(dir: &tempfile::TempDir, name: &str, pages: usize) -> std::fs::File {
        let file = crate::test_util::new_file(&dir.path().join(name));
        let bytes: Vec<u8> = (0..pages * PAGE).map(|i| (i % 251) as u8).collect();
        file.write_all_at(&bytes, 0).unwrap();
        file.sync_all().unwrap();
        let mut back = vec![0; bytes.len()];
        file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, bytes);
        file
    }

    /// Which of `file`'s first `pages` pages are in the page cache
    /// (`mincore` of a mapping, which faults nothing in).
    fn cached(file: &std::fs::File, pages: usize) -> Vec<bool> {
        use std::os::fd::AsRawFd;
        assert_eq!(
            unsafe { libc::sysconf(libc::_SC_PAGESIZE) },
            PAGE as libc::c_long
        );
        let len = pages * PAGE;
        // SAFETY: a read-only shared mapping of a file we hold, unmapped
        // before return; mincore writes one byte per page into `resident`.
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            let mut resident = vec![0u8; pages];
            let status = libc::mincore(map, len, resident.as_mut_ptr());
            libc::munmap(map, len);
            assert_eq!(status, 0);
            resident.into_iter().map(|r| r & 1 == 1).collect()
        }
    }

    /// Reads pages `pages` of `file` (in that order), noting each read.
    fn read_pages(file: &std::fs::File, pages: impl IntoIterator<Item = usize>) {
        let mut page = [0u8; PAGE];
        for at in pages {
            let offset = (at * PAGE) as u64;
            file.read_exact_at(&mut page, offset).unwrap();
            assert_eq!(page[0], ((at * PAGE) % 251) as u8);
            note_read(FileId::of(file), file, offset, PAGE);
        }
    }

    /// Pages `from..to` out of order: every 7th, then the rest.
    fn shuffled(from: usize, to: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (from..to).step_by(7).collect();
        order.extend((from..to).filter(|p| !(p - from).is_multiple_of(7)).rev());
        order
    }

    /// Whether `dir` is on a tmpfs, whose pages are the files: dropping
    /// them from a cache does nothing there.
    fn on_tmpfs(dir: &tempfile::TempDir) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path and a statfs for the call to fill.
        unsafe {
            let mut fs: libc::statfs = std::mem::zeroed();
            libc::statfs(path.as_ptr(), &mut fs) == 0 && fs.f_type == libc::TMPFS_MAGIC
        }
    }

    #[test]
    fn pages_the_thread_read_leave_the_cache_and_the_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        if on_tmpfs(&dir) {
            eprintln!("skipped: {} is on a tmpfs", dir.path().display());
            return;
        }
        // more reads than are noted at once: some go while reading
        let pages = NOTED_READS * 2 + 500;
        let file = cached_file(&dir, "db", pages);
        assert!(
            cached(&file, pages).iter().all(|c| *c),
            "the file is cached"
        );
        // whole folios (of up to 2 MiB: 512 pages) are read
        let read = NOTED_READS + 1024;
        let guard = DroppingReads::of(&dir.path().join("db"));
        read_pages(&file, shuffled(0, read));
        drop(guard);
        let now = cached(&file, pages);
        let dropped: Vec<usize> = (0..pages).filter(|p| !now[*p]).collect();
        assert_eq!(dropped, (0..read).collect::<Vec<_>>());
        // read again, all of it, and no guard: it stays
        read_pages(&file, 0..pages);
        assert!(cached(&file, pages).iter().all(|c| *c));
    }

    #[test]
    fn other_threads_and_other_files_keep_their_pages() {
        let dir = tempfile::tempdir().unwrap();
        let pages = 256;
        let (file, other) = (
            cached_file(&dir, "db", pages),
            cached_file(&dir, "copy", pages),
        );
        let guard = DroppingReads::of(&dir.path().join("db"));
        // another thread reads the store's file
        std::thread::scope(|s| {
            s.spawn(|| read_pages(&file, 0..pages));
        });
        // this thread reads another file (a copy's)
        read_pages(&other, 0..pages);
        drop(guard);
        assert!(cached(&file, pages).iter().all(|c| *c));
        assert!(cached(&other, pages).iter().all(|c| *c));
        // and once the guard is gone, this thread's reads stay too
        read_pages(&file, 0..pages);
        assert!(cached(&file, pages).iter().all(|c| *c));
    }

    #[test]
    fn runs_merge_with_those_they_meet_or_adjoin() {
        let mut runs = BTreeMap::new();
        assert_eq!(merge(&mut runs, 8, 12), 8);
        assert_eq!(merge(&mut runs, 20, 24), 20);
        assert_eq!(merge(&mut runs, 0, 4), 0);
        // adjoins the run before it and the one after it
        assert_eq!(merge(&mut runs, 4, 8), 0);
        assert_eq!(runs, BTreeMap::from([(0, 12), (20, 24)]));
        // inside a run
        assert_eq!(merge(&mut runs, 2, 6), 0);
        // over two runs and past them
        assert_eq!(merge(&mut runs, 10, 30), 0);
        assert_eq!(runs, BTreeMap::from([(0, 30)]));
        assert_eq!(merge(&mut runs, 40, 44), 40);
        assert_eq!(runs, BTreeMap::from([(0, 30), (40, 44)]));
    }

    #[test]
    fn a_missing_file_drops_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = cached_file(&dir, "db", 16);
        let guard = DroppingReads::of(&dir.path().join("gone"));
        read_pages(&file, 0..16);
        drop(guard);
        assert!(cached(&file, 16).iter().all(|c| *c));
    }
}
