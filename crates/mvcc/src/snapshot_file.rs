//! Snapshot files: what `oxctl snapshot status|restore` read.
//!
//! `Maintenance.Snapshot` streams etcd's own format: a bbolt file with
//! etcd's buckets and a trailing sha256 ([`crate::etcd_backend`]), which
//! etcdctl, etcdutl and etcd read, and which this module reads too (as it
//! reads the snapshots of etcd 3.4 and 3.5 themselves). Earlier oxcd
//! versions streamed a redb file instead, laid out as below; such files
//! are still read.
//!
//! # Layout (snapshot file format version 1)
//!
//! | bytes | content |
//! |---|---|
//! | 0..db_len | a cleanly closed redb file, the output of [`Store::backup_to`](crate::Store::backup_to) |
//! | db_len..body_len | padding (see below); `body_len % 512 == 0` |
//! | body_len..body_len+32 | sha256 of bytes 0..body_len |
//!
//! So the whole file is `512 * n + 32` bytes: the check etcdctl makes
//! (`size % 512 == sha256.Size`) before it keeps a downloaded snapshot, and
//! the one etcdutl makes before it trusts the trailing sha256.
//!
//! Padding: none when `db_len % 512 == 0`, which is always the case with
//! redb's 4 KiB pages (etcd's bbolt files are page-aligned too, so etcd
//! never pads). Otherwise zeros, then a 16-byte trailer ending the body:
//! `b"oxcdpad1"` and `db_len` as u64 big-endian, the body being the next
//! multiple of 512 with room for the trailer. A reader takes `db_len` from
//! such a trailer when it is consistent with the body length, else the
//! whole body is the redb file. The redb file is read in place through a
//! bounded read-only view, so nothing is copied to find it.
//!
//! # Status hash
//!
//! etcd's `snapshot status` hash is a CRC-32C over every bucket's name,
//! keys and values of the bbolt file. Ours is the same walk over our redb
//! tables in a fixed order (`key`, `meta`, `members`, `lease`, `alarm`):
//! CRC-32 (IEEE) over each table's name, then each record's key bytes
//! (u64 keys big-endian) and value bytes. Total keys counts every record
//! of every table, as etcd's counts every bucket entry; revision is the
//! main revision of the last record of the `key` table; total size is
//! `db_len`, the redb file's size (etcd: the bbolt file's size).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use redb::{
    Builder, Durability, ReadOnlyDatabase, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    StorageBackend, TableDefinition, TableHandle,
};
use sha2::{Digest, Sha256};

use crate::backend::{backend_error, SideTable, KEY_TABLE, META_CONSISTENT_INDEX, META_TABLE};
use crate::revision::RevisionKey;
use crate::snapshot::{copy_records, copy_table};
use crate::MvccError;

/// The body of a snapshot file is a multiple of this (a disk sector; the
/// unit of etcdctl's check).
pub(crate) const SNAPSHOT_ALIGN: u64 = 512;
/// Length of the trailing sha256.
pub(crate) const SHA256_LEN: u64 = 32;
/// Chunk size of Maintenance.Snapshot responses (etcd's snapshotSendBufferSize).
pub const SNAPSHOT_SEND_BUFFER_SIZE: usize = 32 * 1024;
/// Page cache of a copy being written or read (redb's default is 1 GiB):
/// a copy's dirty pages spill to its file past this, so copying a large
/// backend (a raft snapshot, a client's Maintenance.Snapshot, a restore)
/// needs little memory of its own.
pub(crate) const COPY_CACHE_BYTES: usize = 32 * 1024 * 1024;
const PAD_TRAILER_MAGIC: &[u8; 8] = b"oxcdpad1";
const PAD_TRAILER_LEN: u64 = 16;
/// Reads while hashing a file go in blocks of this size.
const HASH_READ_BLOCK: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// etcdutl's message.
    #[error("snapshot missing hash but --skip-hash-check=false")]
    MissingHash,
    /// etcdutl's message, byte slices printed as Go prints them.
    #[error("expected sha256 {expected:?}, got {got:?}")]
    HashMismatch { expected: Vec<u8>, got: Vec<u8> },
    #[error("snapshot file is not an oxcd snapshot (its database does not open: {0})")]
    NotADatabase(String),
    /// A backend file copied from a member that was running or crashed.
    #[error("snapshot file holds a database that was not closed cleanly (copied from a running member?): stop the member first, or take a snapshot with `etcdctl snapshot save`")]
    NotClosedCleanly,
    /// redb asserts its own invariants: on a damaged file it may panic,
    /// which reading an untrusted file turns into this error.
    #[error("snapshot file is damaged (its database cannot be read: {0})")]
    Damaged(String),
    #[error(transparent)]
    Mvcc(#[from] MvccError),
}

fn bbolt_damaged(e: bbolt::ReadError) -> SnapshotFileError {
    SnapshotFileError::Damaged(e.to_string())
}

/// Runs `read` over an untrusted file's database, turning a panic of redb
/// (its invariant checks on damaged pages) into an error.
fn guarded<T>(read: impl FnOnce() -> Result<T, SnapshotFileError>) -> Result<T, SnapshotFileError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)) {
        Ok(result) => result,
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "redb panicked".to_string());
            Err(SnapshotFileError::Damaged(reason))
        }
    }
}

/// The padding that follows a redb file of `db_len` bytes in a snapshot body.
pub fn padding_for(db_len: u64) -> Vec<u8> {
    if db_len.is_multiple_of(SNAPSHOT_ALIGN) {
        return Vec::new();
    }
    let body_len = (db_len + PAD_TRAILER_LEN).div_ceil(SNAPSHOT_ALIGN) * SNAPSHOT_ALIGN;
    let mut pad = vec![0u8; (body_len - db_len) as usize];
    let at = pad.len() - PAD_TRAILER_LEN as usize;
    pad[at..at + 8].copy_from_slice(PAD_TRAILER_MAGIC);
    pad[at + 8..].copy_from_slice(&db_len.to_be_bytes());
    pad
}

/// Writes the snapshot file of the redb file `db_file` to `out` (body,
/// padding, sha256), streaming; returns the bytes written. Maintenance.Snapshot
/// sends the same bytes in chunks.
pub fn write_snapshot(db_file: &Path, out: &mut dyn std::io::Write) -> std::io::Result<u64> {
    let mut file = File::open(db_file)?;
    let db_len = file.metadata()?.len();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; HASH_READ_BLOCK];
    let mut left = db_len;
    while left > 0 {
        let n = (left as usize).min(buf.len());
        file.read_exact(&mut buf[..n])?;
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    let padding = padding_for(db_len);
    hasher.update(&padding);
    out.write_all(&padding)?;
    out.write_all(&hasher.finalize())?;
    Ok(db_len + padding.len() as u64 + SHA256_LEN)
}

/// Whether a file of `len` bytes ends with a sha256 (etcd's hasChecksum).
pub(crate) fn has_checksum(len: u64) -> bool {
    len % SNAPSHOT_ALIGN == SHA256_LEN
}

/// A snapshot file, checked and located: where its redb file ends.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    path: std::path::PathBuf,
    /// An etcd (bbolt) backend rather than a redb one.
    pub is_etcd_backend: bool,
    /// Bytes of the body (file length without the sha256, if any).
    pub body_len: u64,
    /// Bytes of the redb file at the start of the body.
    pub db_len: u64,
    pub has_hash: bool,
}

/// What `snapshot status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotStatus {
    pub hash: u32,
    pub revision: i64,
    pub total_key: u64,
    pub total_size: u64,
}

/// What a restore carried over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreSummary {
    pub revision: i64,
    pub keys_records: u64,
    pub leases: u64,
}

fn sha256_of(file: &mut File, len: u64) -> std::io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; HASH_READ_BLOCK];
    let mut left = len;
    while left > 0 {
        let n = (left as usize).min(buf.len());
        file.read_exact(&mut buf[..n])?;
        hasher.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(hasher.finalize().to_vec())
}

impl SnapshotFile {
    /// Opens a snapshot file: checks its trailing sha256 (unless
    /// `skip_hash_check`, as etcdutl's flag) and finds its redb file.
    pub fn open(path: &Path, skip_hash_check: bool) -> Result<SnapshotFile, SnapshotFileError> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        let has_hash = has_checksum(len);
        let body_len = if has_hash { len - SHA256_LEN } else { len };
        if !has_hash && !skip_hash_check {
            return Err(SnapshotFileError::MissingHash);
        }
        if has_hash && !skip_hash_check {
            let mut expected = vec![0u8; SHA256_LEN as usize];
            file.seek(SeekFrom::Start(body_len))?;
            file.read_exact(&mut expected)?;
            let got = sha256_of(&mut file, body_len)?;
            if got != expected {
                return Err(SnapshotFileError::HashMismatch { expected, got });
            }
        }
        let is_etcd_backend = crate::etcd_backend::is_bbolt(path);
        let db_len = if is_etcd_backend {
            body_len
        } else {
            Self::db_len_of_body(&mut file, body_len)?
        };
        Ok(SnapshotFile {
            path: path.to_path_buf(),
            is_etcd_backend,
            body_len,
            db_len,
            has_hash,
        })
    }

    fn db_len_of_body(file: &mut File, body_len: u64) -> std::io::Result<u64> {
        if body_len < PAD_TRAILER_LEN || !body_len.is_multiple_of(SNAPSHOT_ALIGN) {
            return Ok(body_len);
        }
        let mut trailer = [0u8; PAD_TRAILER_LEN as usize];
        file.seek(SeekFrom::Start(body_len - PAD_TRAILER_LEN))?;
        file.read_exact(&mut trailer)?;
        if &trailer[..8] != PAD_TRAILER_MAGIC {
            return Ok(body_len);
        }
        let db_len = u64::from_be_bytes(trailer[8..].try_into().expect("8 bytes"));
        // Only a trailer that padding_for would have written counts.
        let consistent = db_len % SNAPSHOT_ALIGN != 0
            && db_len < body_len
            && padding_for(db_len).len() as u64 == body_len - db_len;
        Ok(if consistent { db_len } else { body_len })
    }

    /// The redb file inside, opened read-only in place. Reading a damaged
    /// file through it may panic (redb's checks): [`Self::status`] and
    /// [`Self::restore_to`] turn that into [`SnapshotFileError::Damaged`].
    pub(crate) fn open_database(&self) -> Result<ReadOnlyDatabase, SnapshotFileError> {
        let view = BoundedFile {
            file: File::open(&self.path)?,
            len: self.db_len,
        };
        Builder::new()
            .set_cache_size(COPY_CACHE_BYTES)
            .open_read_only_with_backend(view)
            .map_err(|e| match e {
                redb::DatabaseError::RepairAborted => SnapshotFileError::NotClosedCleanly,
                e => SnapshotFileError::NotADatabase(e.to_string()),
            })
    }

    /// Hash, revision, total keys and size, as `snapshot status` prints them.
    pub fn status(&self) -> Result<SnapshotStatus, SnapshotFileError> {
        if self.is_etcd_backend {
            // etcdutl's: bbolt's consistency check, then the walk
            let mut reader = bbolt::Reader::open(&self.path).map_err(bbolt_damaged)?;
            let status = bbolt::snapshot_status(&mut reader).map_err(bbolt_damaged)?;
            return Ok(SnapshotStatus {
                hash: status.hash,
                revision: status.revision,
                total_key: status.total_key,
                total_size: status.total_size,
            });
        }
        guarded(|| self.status_unguarded())
    }

    fn status_unguarded(&self) -> Result<SnapshotStatus, SnapshotFileError> {
        let db = self.open_database()?;
        let txn = db.begin_read().map_err(backend_error)?;
        let mut hasher = crc32fast::Hasher::new();
        let mut total_key = 0u64;
        let mut revision = 0i64;
        if let Some(table) = open_optional(&txn, KEY_TABLE)? {
            hasher.update(b"key");
            let parts = crate::parts::ReadParts::open(&txn)?;
            for row in table.iter().map_err(backend_error)? {
                let (k, v) = row.map_err(backend_error)?;
                hasher.update(k.value());
                // long records joined: the hash does not depend on the format
                hasher.update(&parts.join(k.value(), v.value())?);
                total_key += 1;
                if let Ok((rev, _)) = RevisionKey::parse(k.value()) {
                    revision = rev.main;
                }
            }
        }
        if let Some(table) = open_optional(&txn, META_TABLE)? {
            hasher.update(b"meta");
            for row in table.iter().map_err(backend_error)? {
                let (k, v) = row.map_err(backend_error)?;
                hasher.update(k.value().as_bytes());
                hasher.update(v.value());
                total_key += 1;
            }
        }
        for side in SideTable::ALL {
            let definition = side.definition();
            if let Some(table) = open_optional(&txn, definition)? {
                hasher.update(definition.name().as_bytes());
                for row in table.iter().map_err(backend_error)? {
                    let (k, v) = row.map_err(backend_error)?;
                    hasher.update(&k.value().to_be_bytes());
                    hasher.update(v.value());
                    total_key += 1;
                }
            }
        }
        Ok(SnapshotStatus {
            hash: hasher.finalize(),
            revision,
            total_key,
            total_size: self.db_len,
        })
    }

    /// Writes a new backend at `dest` for a member of a NEW cluster: every
    /// table of the snapshot except `members`, which gets `members`
    /// (ID → encoded record), and no consistent index, so the new cluster's
    /// raft log applies from its first entry (etcd's restore resets it the
    /// same way, to the index of its bootstrap entries). Durable on return.
    pub fn restore_to(
        &self,
        dest: &Path,
        members: &[(u64, Vec<u8>)],
    ) -> Result<RestoreSummary, SnapshotFileError> {
        if self.is_etcd_backend {
            let restored = crate::etcd_backend::restore_from_bbolt(&self.path, dest, members)
                .map_err(|e| SnapshotFileError::Damaged(e.to_string()))?;
            return Ok(RestoreSummary {
                revision: restored.revision,
                keys_records: restored.keys_records,
                leases: restored.leases,
            });
        }
        guarded(|| self.restore_unguarded(dest, members))
    }

    fn restore_unguarded(
        &self,
        dest: &Path,
        members: &[(u64, Vec<u8>)],
    ) -> Result<RestoreSummary, SnapshotFileError> {
        let source = self.open_database()?;
        let from = source.begin_read().map_err(backend_error)?;
        let mut write = crate::snapshot::SteppedWrite::create(COPY_CACHE_BYTES, dest)?;
        copy_records(&from, &mut write)?;
        copy_table(&from, &mut write, META_TABLE)?;
        // membership comes from the restore's flags: a restored cluster is
        // new, its old members (and removed ones) are not copied
        for side in SideTable::ALL {
            if !matches!(side, SideTable::Members | SideTable::MembersRemoved) {
                copy_table(&from, &mut write, side.definition())?;
            }
        }
        let txn = write.txn();
        let summary = {
            let mut meta = txn.open_table(META_TABLE).map_err(backend_error)?;
            meta.remove(META_CONSISTENT_INDEX).map_err(backend_error)?;
            let mut table = txn
                .open_table(SideTable::Members.definition())
                .map_err(backend_error)?;
            for (id, record) in members {
                table
                    .insert(*id, record.as_slice())
                    .map_err(backend_error)?;
            }
            let keys = txn.open_table(KEY_TABLE).map_err(backend_error)?;
            let revision = match keys.last().map_err(backend_error)? {
                Some((k, _)) => RevisionKey::parse(k.value()).map_or(0, |(r, _)| r.main),
                None => 0,
            };
            let leases = txn
                .open_table(SideTable::Leases.definition())
                .map_err(backend_error)?;
            RestoreSummary {
                revision,
                keys_records: keys.len().map_err(backend_error)?,
                leases: leases.len().map_err(backend_error)?,
            }
        };
        write.finish()?;
        Ok(summary)
    }
}

/// etcdutl 3.5.16's `snapshot restore --bump-revision N --mark-compacted`
/// on a restored backend at `path`: an empty record at revision latest + N
/// in the key table (etcd puts an empty value under that revision key)
/// and a compaction scheduled at it, which the member's first open
/// carries out (as etcd's start resumes it). Clients that watched or read
/// the old cluster then see revisions go on increasing and are told their
/// old revisions are compacted. Returns (latest, new latest).
pub fn bump_revision(path: &Path, amount: u64) -> Result<(i64, i64), MvccError> {
    let amount = i64::try_from(amount)
        .map_err(|_| MvccError::Corrupt(format!("a revision bump of {amount} overflows")))?;
    let db = crate::backend::open_database(path)?;
    let mut txn = db.begin_write().map_err(backend_error)?;
    txn.set_durability(Durability::Immediate)
        .map_err(backend_error)?;
    let (latest, bumped) = {
        let mut keys = txn.open_table(KEY_TABLE).map_err(backend_error)?;
        let latest = match keys.last().map_err(backend_error)? {
            Some((k, _)) => RevisionKey::parse(k.value())?.0.main,
            None => 0,
        };
        let bumped = latest
            .checked_add(amount)
            .ok_or_else(|| MvccError::Corrupt(format!("revision {latest} + {amount} overflows")))?;
        let key = RevisionKey::new(crate::revision::Revision::new(bumped, 0), false);
        let record = crate::backend::seal(Vec::new());
        keys.insert(key.as_slice(), &record[..])
            .map_err(backend_error)?;
        let mut meta = txn.open_table(META_TABLE).map_err(backend_error)?;
        meta.insert(
            crate::backend::META_SCHEDULED_COMPACT_REV,
            &bumped.to_be_bytes()[..],
        )
        .map_err(backend_error)?;
        (latest, bumped)
    };
    txn.commit().map_err(backend_error)?;
    Ok((latest, bumped))
}

fn open_optional<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, MvccError> {
    match txn.open_table(table) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(backend_error(e)),
    }
}

/// A read-only view of the first `len` bytes of a file: the redb file at
/// the start of a snapshot body, without copying it out.
#[derive(Debug)]
struct BoundedFile {
    file: File,
    len: u64,
}

fn read_only() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        "snapshot file is opened read-only",
    )
}

impl StorageBackend for BoundedFile {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        use std::os::unix::fs::FileExt;
        if offset + out.len() as u64 > self.len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end of the snapshot's database",
            ));
        }
        self.file.read_exact_at(out, offset)
    }

    fn set_len(&self, _len: u64) -> Result<(), std::io::Error> {
        Err(read_only())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        Ok(())
    }

    fn write(&self, _offset: u64, _data: &[u8]) -> Result<(), std::io::Error> {
        Err(read_only())
    }
    // No lock methods: redb then opens it in its default ExclusiveWriter
    // mode without locking, and the view is private to one reader anyway.
}

/// go-humanize's Bytes (SI units), as etcd logs and etcdutl print sizes.
pub fn humanize_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if bytes < 10 {
        return format!("{bytes} B");
    }
    let exponent = ((bytes as f64).ln() / 1000f64.ln()).floor() as usize;
    let exponent = exponent.min(UNITS.len() - 1);
    let value = ((bytes as f64) / 1000f64.powi(exponent as i32) * 10.0 + 0.5).floor() / 10.0;
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[exponent])
    } else {
        format!("{value:.0} {}", UNITS[exponent])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_print_as_go_humanize_prints_them() {
        use super::humanize_bytes;
        assert_eq!(humanize_bytes(0), "0 B");
        assert_eq!(humanize_bytes(9), "9 B");
        assert_eq!(humanize_bytes(24576), "25 kB");
        assert_eq!(humanize_bytes(2_097_152), "2.1 MB");
        assert_eq!(humanize_bytes(1000), "1.0 kB");
        assert_eq!(humanize_bytes(999_999), "1000 kB");
    }

    use api::etcdserverpb::RangeRequest;

    use super::*;
    use crate::test_util::put_at;
    use crate::Store;

    fn all(store: &Store) -> Vec<(Vec<u8>, Vec<u8>, i64, i64)> {
        let r = store
            .range(&RangeRequest {
                key: vec![0].into(),
                range_end: vec![0].into(),
                ..Default::default()
            })
            .unwrap();
        r.kvs
            .iter()
            .map(|kv| {
                (
                    kv.key.to_vec(),
                    kv.value.to_vec(),
                    kv.mod_revision,
                    kv.lease,
                )
            })
            .collect()
    }

    /// A store with keys, a lease and a member, and its snapshot file.
    fn source(dir: &Path) -> (Store, std::path::PathBuf) {
        let store = Store::open(&dir.join("source.db")).unwrap();
        store.put_side(SideTable::Leases, 9, Some(b"lease-9".to_vec()), 1);
        store.put_member(1, Some(b"old-member".to_vec()), 1);
        for i in 0..100u64 {
            put_at(
                &store,
                i + 2,
                &format!("k{i:03}"),
                "v".repeat(100),
                if i < 3 { 9 } else { 0 },
            );
        }
        let copy = dir.join("copy.db");
        store.backup_to(&copy).unwrap();
        let snap = dir.join("snapshot.db");
        let mut out = File::create(&snap).unwrap();
        let written = write_snapshot(&copy, &mut out).unwrap();
        assert_eq!(written, std::fs::metadata(&snap).unwrap().len());
        (store, snap)
    }

    #[test]
    fn a_snapshot_file_is_512_aligned_plus_a_sha256_as_etcdctl_checks() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, snap) = source(dir.path());
        let len = std::fs::metadata(&snap).unwrap().len();
        assert!(has_checksum(len), "{len} % 512 != 32");
        let file = SnapshotFile::open(&snap, false).unwrap();
        assert!(file.has_hash);
        assert_eq!(file.db_len, file.body_len, "redb files need no padding");
    }

    #[test]
    fn padding_records_the_database_length_and_is_stripped() {
        assert!(padding_for(4096).is_empty());
        for db_len in [1u64, 495, 496, 497, 511, 513, 1000] {
            let pad = padding_for(db_len);
            assert_eq!((db_len + pad.len() as u64) % SNAPSHOT_ALIGN, 0, "{db_len}");
            let dir = tempfile::tempdir().unwrap();
            let raw = dir.path().join("raw");
            std::fs::write(&raw, vec![7u8; db_len as usize]).unwrap();
            let snap = dir.path().join("snap");
            write_snapshot(&raw, &mut File::create(&snap).unwrap()).unwrap();
            let file = SnapshotFile::open(&snap, false).unwrap();
            assert_eq!(file.db_len, db_len);
        }
    }

    #[test]
    fn status_counts_every_record_and_reads_the_last_revision() {
        let dir = tempfile::tempdir().unwrap();
        let (store, snap) = source(dir.path());
        let status = SnapshotFile::open(&snap, false).unwrap().status().unwrap();
        assert_eq!(status.revision, store.current_revision());
        // 100 key records, meta (consistent index, format version), 1 member, 1 lease.
        assert_eq!(status.total_key, 100 + 2 + 1 + 1);
        assert_eq!(status.total_size % 4096, 0);
        // Deterministic: the same content hashes the same.
        let again = SnapshotFile::open(&snap, false).unwrap().status().unwrap();
        assert_eq!(again, status);
    }

    #[test]
    fn restore_keeps_keys_and_leases_and_replaces_members_and_the_consistent_index() {
        let dir = tempfile::tempdir().unwrap();
        let (store, snap) = source(dir.path());
        let restored = dir.path().join("restored.db");
        let summary = SnapshotFile::open(&snap, false)
            .unwrap()
            .restore_to(&restored, &[(77, b"new-member".to_vec())])
            .unwrap();
        assert_eq!(summary.revision, store.current_revision());
        assert_eq!(summary.leases, 1);
        let reopened = Store::open(&restored).unwrap();
        assert_eq!(all(&reopened), all(&store));
        assert_eq!(reopened.current_revision(), store.current_revision());
        assert_eq!(reopened.consistent_index(), 0);
        let members = reopened.members().unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(members.get(&77), Some(&b"new-member".to_vec()));
        assert_eq!(
            reopened.side_records(SideTable::Leases).unwrap().get(&9),
            Some(&b"lease-9".to_vec())
        );
        assert_eq!(reopened.take_loaded_leased_keys().len(), 3);
        // The new cluster applies from its first raft entry.
        put_at(&reopened, 1, "after", "x", 0);
        assert_eq!(reopened.current_revision(), store.current_revision() + 1);
    }

    #[test]
    fn a_backend_file_of_a_running_member_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _snap) = source(dir.path());
        store.commit(true).unwrap();
        // Still open: redb marks the file as needing recovery until closed.
        let live = SnapshotFile::open(&dir.path().join("source.db"), true).unwrap();
        assert!(matches!(
            live.status(),
            Err(SnapshotFileError::NotClosedCleanly)
        ));
        drop(store);
        let closed = SnapshotFile::open(&dir.path().join("source.db"), true).unwrap();
        assert_eq!(closed.status().unwrap().total_key, 104);
    }

    #[test]
    fn a_flipped_byte_or_a_missing_hash_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, snap) = source(dir.path());
        let mut bytes = std::fs::read(&snap).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        let flipped = dir.path().join("flipped");
        std::fs::write(&flipped, &bytes).unwrap();
        match SnapshotFile::open(&flipped, false) {
            Err(e @ SnapshotFileError::HashMismatch { .. }) => {
                assert!(e.to_string().starts_with("expected sha256 ["), "{e}")
            }
            other => panic!("flipped byte accepted: {other:?}"),
        }
        let truncated = dir.path().join("truncated");
        std::fs::write(&truncated, &bytes[..bytes.len() - 32]).unwrap();
        let err = SnapshotFile::open(&truncated, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "snapshot missing hash but --skip-hash-check=false"
        );
        // With --skip-hash-check a bare redb file (a copied member/snap/db) restores.
        let bare = SnapshotFile::open(&truncated, true).unwrap();
        assert!(!bare.has_hash);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever bytes a file holds, opening and reading it fails
        /// cleanly: never a panic, never a database length past the body.
        #[test]
        fn any_file_is_refused_or_read_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
            trailer_len in proptest::prelude::any::<u64>(),
            with_trailer in proptest::prelude::any::<bool>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            let mut bytes = bytes;
            if with_trailer && bytes.len() >= 16 {
                let at = bytes.len() - 16;
                bytes[at..at + 8].copy_from_slice(PAD_TRAILER_MAGIC);
                bytes[at + 8..].copy_from_slice(&trailer_len.to_be_bytes());
            }
            std::fs::write(&path, &bytes).unwrap();
            let _ = SnapshotFile::open(&path, false);
            let file = SnapshotFile::open(&path, true).unwrap();
            proptest::prop_assert!(file.db_len <= file.body_len);
            proptest::prop_assert!(file.status().is_err());
        }
    }

    #[test]
    fn damaged_databases_read_with_skip_hash_check_fail_without_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, snap) = source(dir.path());
        let original = std::fs::read(&snap).unwrap();
        let damaged = dir.path().join("damaged");
        let mut rng = 0x9e3779b97f4a7c15u64;
        let mut panics = 0;
        for _ in 0..200 {
            let mut bytes = original.clone();
            for _ in 0..4 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let at = (rng % (bytes.len() as u64 - 32)) as usize;
                bytes[at] ^= (rng >> 32) as u8 | 1;
            }
            std::fs::write(&damaged, &bytes).unwrap();
            let result = std::panic::catch_unwind(|| {
                let file = SnapshotFile::open(&damaged, true).unwrap();
                let _ = file.status();
                let _ = file.restore_to(&dir.path().join("out.db"), &[]);
            });
            if result.is_err() {
                panics += 1;
            }
        }
        assert_eq!(panics, 0, "a panic escaped on damaged input");
    }
}
