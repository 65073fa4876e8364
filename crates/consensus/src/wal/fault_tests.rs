//! The WAL under failing file operations ([`FileOps`] replaced): a crash at
//! any call of the write path loses no entry whose sync succeeded, and a
//! failed write or fdatasync is never followed by a success.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;

fn meta() -> Metadata {
    Metadata {
        node_id: 1,
        cluster_id: 2,
        initial_voters: vec![1],
    }
}

fn entry(index: u64) -> Entry {
    Entry {
        index,
        term: 1,
        data: format!("value-{index}").into_bytes().into(),
        ..Default::default()
    }
}

fn hard_state(commit: u64) -> HardState {
    HardState {
        term: 1,
        vote: 1,
        commit,
        ..Default::default()
    }
}

/// The process dies at call number `crash_at` of the write path: that
/// call is torn (a write puts half its bytes in the file; any other call
/// does nothing) and fails, as does every later call.
#[derive(Debug)]
struct Crashing {
    calls: AtomicUsize,
    crash_at: usize,
}

impl Crashing {
    fn new(crash_at: usize) -> Arc<Crashing> {
        Arc::new(Crashing {
            calls: AtomicUsize::new(0),
            crash_at,
        })
    }

    /// Whether this call happens; `torn` is set for the crashing call.
    fn call(&self) -> Result<(), bool> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        match n.cmp(&self.crash_at) {
            std::cmp::Ordering::Less => Ok(()),
            std::cmp::Ordering::Equal => Err(true),
            std::cmp::Ordering::Greater => Err(false),
        }
    }

    fn crashed(&self) -> bool {
        self.calls.load(Ordering::SeqCst) > self.crash_at
    }
}

fn died() -> io::Error {
    io::Error::other("the process died")
}

impl FileOps for Crashing {
    fn create(&self, path: &Path) -> io::Result<File> {
        self.call().map_err(|_| died())?;
        OsFileOps.create(path)
    }

    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.call() {
            Ok(()) => OsFileOps.write_at(file, buf, offset),
            Err(torn) => {
                if torn {
                    OsFileOps.write_at(file, &buf[..buf.len() / 2], offset)?;
                }
                Err(died())
            }
        }
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        self.call().map_err(|_| died())?;
        OsFileOps.sync_data(file)
    }

    fn sync_all(&self, file: &File) -> io::Result<()> {
        self.call().map_err(|_| died())?;
        OsFileOps.sync_all(file)
    }

    fn set_len(&self, file: &File, len: u64) -> io::Result<()> {
        self.call().map_err(|_| died())?;
        OsFileOps.set_len(file, len)
    }

    fn preallocate(&self, file: &File, len: u64) -> io::Result<bool> {
        self.call().map_err(|_| died())?;
        OsFileOps.preallocate(file, len)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.call().map_err(|_| died())?;
        OsFileOps.rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.call().map_err(|_| died())?;
        OsFileOps.remove(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.call().map_err(|_| died())?;
        OsFileOps.sync_dir(dir)
    }
}

/// What one run wrote before its crash.
struct Run {
    /// The last entry whose sync succeeded.
    acknowledged: u64,
    /// The index passed to the last release begun (a crash may cut one
    /// short: what it removed is below it all the same).
    released: u64,
}

const ENTRIES: u64 = 120;

/// Appends and syncs entries one by one on small segments (cuts), releasing
/// older segments as a member does after a snapshot, until the crash.
fn run(dir: &Path, ops: Arc<Crashing>) -> Run {
    // one file at most: every release removes what it covers, so crashes
    // land in removals too
    let options = WalOptions {
        segment_bytes: 1024,
        max_files: 1,
        ops,
        ..Default::default()
    };
    let mut run = Run {
        acknowledged: 0,
        released: 0,
    };
    let Ok(mut wal) = Wal::create(dir, meta(), options) else {
        return run;
    };
    for i in 1..=ENTRIES {
        wal.append(&[entry(i)], Some(&hard_state(i)));
        if wal.sync().is_err() {
            return run;
        }
        run.acknowledged = i;
        if i % 25 == 0 {
            run.released = i - 10;
            if wal.release_to(run.released).is_err() {
                return run;
            }
        }
    }
    run
}

#[test]
fn a_crash_at_any_call_of_the_write_path_loses_no_synced_entry() {
    let mut crash_at = 0;
    loop {
        let dir = tempfile::tempdir().unwrap();
        let ops = Crashing::new(crash_at);
        let run = run(dir.path(), ops.clone());
        if !ops.crashed() {
            assert_eq!(run.acknowledged, ENTRIES);
            assert!(
                crash_at > 200,
                "only {crash_at} calls: the test exercises too little"
            );
            break;
        }
        if !Wal::exists(dir.path()) {
            assert_eq!(run.acknowledged, 0, "crash at call {crash_at}");
            crash_at += 1;
            continue;
        }
        let (_, contents) = Wal::open(dir.path(), WalOptions::default())
            .unwrap_or_else(|e| panic!("crash at call {crash_at}: reopen failed: {e}"));
        let indexes: Vec<u64> = contents.entries.iter().map(|e| e.index).collect();
        assert!(
            indexes.windows(2).all(|w| w[1] == w[0] + 1),
            "crash at call {crash_at}: entries not contiguous: {indexes:?}"
        );
        let first = indexes.first().copied().unwrap_or(1);
        let last = indexes.last().copied().unwrap_or(0);
        assert!(
            first <= run.released.max(1),
            "crash at call {crash_at}: entries from {} but releases were only below {}",
            first,
            run.released
        );
        assert!(
            last >= run.acknowledged,
            "crash at call {crash_at}: acknowledged {} but the WAL ends at {last}",
            run.acknowledged
        );
        for e in &contents.entries {
            assert_eq!(e.data, entry(e.index).data, "crash at call {crash_at}");
        }
        crash_at += 1;
    }
}

/// Fails one fdatasync, then lets everything through.
#[derive(Debug, Default)]
struct FailsOneSync {
    failed: AtomicUsize,
}

impl FileOps for FailsOneSync {
    fn create(&self, path: &Path) -> io::Result<File> {
        OsFileOps.create(path)
    }
    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        OsFileOps.write_at(file, buf, offset)
    }
    fn sync_data(&self, file: &File) -> io::Result<()> {
        if self.failed.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        OsFileOps.sync_data(file)
    }
    fn sync_all(&self, file: &File) -> io::Result<()> {
        OsFileOps.sync_all(file)
    }
    fn set_len(&self, file: &File, len: u64) -> io::Result<()> {
        OsFileOps.set_len(file, len)
    }
    fn preallocate(&self, file: &File, len: u64) -> io::Result<bool> {
        OsFileOps.preallocate(file, len)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        OsFileOps.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        OsFileOps.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        OsFileOps.sync_dir(dir)
    }
}

#[test]
fn after_a_failed_fdatasync_no_sync_succeeds_again() {
    let dir = tempfile::tempdir().unwrap();
    let options = WalOptions {
        ops: Arc::new(FailsOneSync::default()),
        ..Default::default()
    };
    let mut wal = Wal::create(dir.path(), meta(), options).unwrap();
    wal.append(&[entry(1)], Some(&hard_state(1)));
    let error = wal.sync().unwrap_err().to_string();
    assert!(error.contains("Input/output error"), "{error}");
    // the pages may be gone: a later sync must not vouch for them
    wal.append(&[entry(2)], Some(&hard_state(2)));
    let error = wal.sync().unwrap_err().to_string();
    assert!(error.contains("an earlier write failed"), "{error}");
    assert!(wal.sync().is_err(), "not even with nothing pending");
}
