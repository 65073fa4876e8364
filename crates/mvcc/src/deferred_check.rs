//! The check of a file a clean stop left, made while the member serves.
//!
//! redb's check of every page at open reads the whole file twice (its
//! checksums, then its allocator state): after the key index checkpoint
//! (see [`crate::index_checkpoint`]) it was nearly all of a restart (8 GiB:
//! 32.8 s, etcd 3.5.16 8.9 s), and it grows with the file, where the
//! issue's goal is a restart under 10 s at 32 GiB. etcd checks nothing of
//! its bbolt file at start (bbolt has no checksums).
//!
//! So a member's open of a file with a valid checkpoint (which only a clean
//! stop writes, in a file redb closed cleanly) skips redb's check, and
//! [`Store::check_deferred`] reads every record afterwards, off the
//! request path, verifying each record's own checksum and decoding it; the
//! walk reads every page of the record table (a page redb cannot read is an
//! error, or a panic turned into one) and the small tables. What it finds
//! stops the member with the message a refused start gives.
//!
//! While that check has not finished, the file `<db>.unchecked` exists: it
//! is made (durably) before the open that skips the check and removed once
//! a check of either kind has passed. A start that finds it checks every
//! page at open, as after an unclean stop. So damage the deferred check
//! could not see in time (a stop or crash before it finished, or damage in
//! redb's own tables that aborts the first commit) is refused by the next
//! start, never trusted twice.
//!
//! What a deferred check does not see: damage confined to redb's system
//! pages (its allocator state and freed-page lists), which only redb's
//! check reads; the first commit walks them, and the next start refuses
//! the file.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use redb::ReadableDatabase;

use crate::backend::{self, backend_error, KEY_TABLE};
use crate::parts::ReadParts;
use crate::revision::RevisionKey;
use crate::{MvccError, Store};

/// Records read per read transaction (a long one would pin the pages the
/// writes free meanwhile).
const CHUNK_RECORDS: usize = 4096;

/// How often a check waiting for a compaction's deletions looks again.
const COMPACTION_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

fn marker(path: &Path) -> PathBuf {
    crate::defrag::sibling(path, ".unchecked")
}

/// Whether the open of `path` may skip redb's page check: no check was
/// deferred before without finishing, and the marker saying one is now
/// deferred is on disk.
pub(crate) fn begin(path: &Path) -> bool {
    let marker = marker(path);
    if marker.exists() {
        tracing::warn!(
            path = %path.display(),
            "the check of the last start did not finish; checking every page"
        );
        return false;
    }
    let made = std::fs::File::create(&marker)
        .and_then(|f| f.sync_all())
        .and_then(|()| crate::defrag::sync_dir(&marker));
    match made {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(path = %marker.display(), error = %e,
                "cannot record a deferred check; checking every page");
            let _ = std::fs::remove_file(&marker);
            false
        }
    }
}

/// Removes the marker: the file passed a check.
pub(crate) fn done(path: &Path) {
    let marker = marker(path);
    match std::fs::remove_file(&marker) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %marker.display(), error = %e,
            "cannot remove the marker of a deferred check"),
    }
}

impl Store {
    /// Whether the open deferred a check [`Store::check_deferred`] is to
    /// make.
    pub fn has_deferred_check(&self) -> bool {
        self.check_deferred.load(Ordering::Acquire)
    }

    /// Makes the check the open deferred (see [`crate::deferred_check`]):
    /// Some(records read) once it passed, None if there was none to make or
    /// `stop` said to give up (then the next start checks every page).
    /// An error names the file and what is damaged.
    pub fn check_deferred(&self, stop: &dyn Fn() -> bool) -> Result<Option<u64>, MvccError> {
        if !self.check_deferred.load(Ordering::Acquire) {
            return Ok(None);
        }
        let checked = backend::without_panics(self.path(), || {
            let Some(records) = self.read_every_record(stop)? else {
                return Ok(None);
            };
            backend::read_small_tables(&*self.db())?;
            Ok(Some(records))
        })?;
        if checked.is_some() {
            self.check_deferred.store(false, Ordering::Release);
            done(self.path());
        }
        Ok(checked)
    }

    /// Reads and verifies every record, a chunk per read transaction, on
    /// whichever file the store has at the time (a defragmentation or an
    /// installed snapshot replaces it with one written or checked anew).
    fn read_every_record(&self, stop: &dyn Fn() -> bool) -> Result<Option<u64>, MvccError> {
        let mut after: Option<Vec<u8>> = None;
        let mut records = 0u64;
        loop {
            // A compaction's deletions go first: both read the file, and
            // together they share the 2 cores and redb's cache (8 GiB,
            // compacted at once after a restart: 20.1 s, 12.0 s once the
            // check was done). The check is a background one; it resumes
            // where it stopped.
            while !self.compaction_backlog.lock().jobs.is_empty() {
                if stop() {
                    return Ok(None);
                }
                std::thread::sleep(COMPACTION_WAIT);
            }
            if stop() {
                return Ok(None);
            }
            let db = self.db();
            let txn = db.begin_read().map_err(backend_error)?;
            let table = txn.open_table(KEY_TABLE).map_err(backend_error)?;
            let parts = ReadParts::open(&txn)?;
            let lower = match &after {
                Some(key) => Bound::Excluded(key.as_slice()),
                None => Bound::Unbounded,
            };
            let mut read = 0;
            for entry in table
                .range::<&[u8]>((lower, Bound::Unbounded))
                .map_err(backend_error)?
            {
                let (key, value) = entry.map_err(backend_error)?;
                let (revision, _) = RevisionKey::parse(key.value())?;
                let whole = parts.join(key.value(), value.value())?;
                let record = backend::unseal(&whole).map_err(|e| e.at(revision))?;
                backend::scan_key_value(record)?;
                read += 1;
                if read == CHUNK_RECORDS {
                    after = Some(key.value().to_vec());
                    break;
                }
            }
            records += read as u64;
            if read < CHUNK_RECORDS {
                return Ok(Some(records));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::test_util::put_at;
    use crate::Store;

    /// A store of `n` records, closed as a member stops (checkpoint
    /// written); the index of its next entry.
    fn closed_store(path: &Path, n: u64) -> u64 {
        let store = Store::open(path).unwrap();
        for i in 1..=n {
            put_at(
                &store,
                i,
                &format!("k{i:05}"),
                format!("value-{i:05}-end"),
                0,
            );
        }
        store.close(&[]).unwrap();
        n + 1
    }

    fn never() -> bool {
        false
    }

    #[test]
    fn a_clean_stop_opens_without_the_page_check_then_every_record_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        // more records than a chunk: the walk resumes after the last key
        let n = super::CHUNK_RECORDS as u64 + 10;
        let next = closed_store(&path, n);
        let store = Store::open_deferring_check(&path).unwrap();
        assert!(super::marker(&path).exists(), "the deferral is on disk");
        assert_eq!(store.check_deferred(&never).unwrap(), Some(n));
        assert!(!super::marker(&path).exists());
        assert_eq!(store.check_deferred(&never).unwrap(), None, "made once");
        // writes go on; the next clean stop defers again
        put_at(&store, next, "later", "v", 0);
        store.close(&[]).unwrap();
        drop(store);
        let store = Store::open_deferring_check(&path).unwrap();
        assert_eq!(store.check_deferred(&never).unwrap(), Some(n + 1));
    }

    #[test]
    fn a_value_damaged_after_a_clean_stop_stops_the_check_and_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        closed_store(&path, 300);
        // every copy of one value overwritten (copy-on-write leaves stale
        // ones in free pages)
        let mut bytes = std::fs::read(&path).unwrap();
        let needle = b"value-00150-";
        let mut copies = 0;
        while let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            bytes[at..at + needle.len()].copy_from_slice(b"0123456789ab");
            copies += 1;
        }
        assert!(copies > 0);
        std::fs::write(&path, &bytes).unwrap();

        let store = Store::open_deferring_check(&path).expect("the page check is deferred");
        let found = store.check_deferred(&never).unwrap_err().to_string();
        assert!(
            found.contains(path.to_str().unwrap()) && found.contains("fails its checksum"),
            "{found}"
        );
        assert!(super::marker(&path).exists(), "the next start checks");
        drop(store);
        let refused = Store::open_deferring_check(&path).err().expect("refused");
        assert!(refused.to_string().contains("is damaged"), "{refused}");
    }

    #[test]
    fn a_check_given_up_leaves_the_next_open_checking_every_page() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let next = closed_store(&path, 50);
        let store = Store::open_deferring_check(&path).unwrap();
        assert_eq!(store.check_deferred(&|| true).unwrap(), None);
        assert!(super::marker(&path).exists());
        put_at(&store, next, "later", "v", 0);
        store.close(&[]).unwrap();
        drop(store);
        // the checkpoint is used, the page check is not skipped
        let store = Store::open_deferring_check(&path).unwrap();
        assert_eq!(store.check_deferred(&never).unwrap(), None);
        assert!(!super::marker(&path).exists(), "checked at open");
        assert_eq!(store.current_revision(), 52);
    }

    #[test]
    fn a_check_waits_while_a_compaction_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let mut next = closed_store(&path, 50);
        let store = std::sync::Arc::new(Store::open_deferring_check(&path).unwrap());
        for round in 0..10 {
            put_at(&store, next, "k00001", format!("again-{round}"), 0);
            next += 1;
        }
        store.commit(true).unwrap();
        // a compaction whose deletions stay under way (an hour between
        // batches of one record: 10 records to delete)
        store
            .start_compactor(crate::CompactionBatches {
                limit: 1,
                sleep: std::time::Duration::from_secs(3600),
            })
            .unwrap();
        store.compact(store.current_revision(), next).unwrap();
        assert!(!store.compaction_backlog.lock().jobs.is_empty());
        // it waits, and gives up when told to, without reading
        let asked = std::sync::atomic::AtomicU32::new(0);
        let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 3;
        assert_eq!(store.check_deferred(&stop).unwrap(), None);
        assert!(asked.load(std::sync::atomic::Ordering::Relaxed) > 3);
        assert!(super::marker(&path).exists(), "not checked");
        // once the deletions are done, the check runs
        store.compaction_backlog.lock().jobs.clear();
        assert!(store.check_deferred(&never).unwrap().is_some());
        assert!(!super::marker(&path).exists());
    }

    #[test]
    fn a_plain_open_never_defers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        closed_store(&path, 20);
        let store = Store::open(&path).unwrap();
        assert!(!super::marker(&path).exists());
        assert_eq!(store.check_deferred(&never).unwrap(), None);
    }
}
