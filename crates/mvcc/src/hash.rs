//! The hashes of the store.
//!
//! HashKV ([`Store::hash_kv`]) is etcd 3.5.16's (server/mvcc/hash.go), to
//! the bit: CRC-32C (Castagnoli) over the bucket name `key` and every
//! (revision key, marshalled `mvccpb.KeyValue`) record up to a revision, in
//! revision order, leaving out a tombstone at exactly the compact revision
//! (3.5.16 keeps it where older etcds deleted it, and skips it in the hash
//! so that both agree). Compacted-away revisions are gone from the table
//! here (etcd filters them with its key index's keep set: the same
//! records). And like etcd, each compaction records the hash at its
//! revision as the file stood before it (with the previous compact
//! revision), and HashKV at exactly such a revision answers that one: the
//! last [`COMPACTION_HASHES_KEPT`]. An etcd member and an oxcd member
//! holding the same history give the same numbers.
//!
//! The hash of the whole backend (etcd's Maintenance.Hash, backend.Hash):
//! CRC-32 over every table's name and records, in table and key order,
//! except the consistent index (which differs between members that applied
//! the same entries at different raft indexes after a restore). Equal on
//! members that applied the same entries.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use redb::{ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use crate::backend::{backend_error, SideTable, KEY_TABLE, META_CONSISTENT_INDEX, META_TABLE};
use crate::parts::ReadParts;
use crate::revision::{Revision, RevisionKey};
use crate::{MvccError, Store};

fn hash_table<K, V>(
    txn: &redb::ReadTransaction,
    table: TableDefinition<K, V>,
    hasher: &mut crc32fast::Hasher,
    mut include: impl FnMut(&[u8]) -> bool,
) -> Result<(), MvccError>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
{
    let source = match txn.open_table(table) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(backend_error(e)),
    };
    hasher.update(table.name().as_bytes());
    for row in source.iter().map_err(backend_error)? {
        let (k, v) = row.map_err(backend_error)?;
        let key_value = k.value();
        let key = K::as_bytes(&key_value);
        if include(key.as_ref()) {
            hasher.update(key.as_ref());
            let value = v.value();
            hasher.update(V::as_bytes(&value).as_ref());
        }
    }
    Ok(())
}

/// [`hash_table`] of the `key` table, long records joined from their parts
/// (the hash does not depend on how a record is stored).
fn hash_records_table(
    txn: &redb::ReadTransaction,
    hasher: &mut crc32fast::Hasher,
) -> Result<(), MvccError> {
    let table = txn.open_table(KEY_TABLE).map_err(backend_error)?;
    let parts = ReadParts::open(txn)?;
    hasher.update(KEY_TABLE.name().as_bytes());
    for row in table.iter().map_err(backend_error)? {
        let (k, v) = row.map_err(backend_error)?;
        hasher.update(k.value());
        hasher.update(&parts.join(k.value(), v.value())?);
    }
    Ok(())
}

impl Store {
    /// Commits what is pending, then hashes the file as of that commit.
    /// Returns (hash, the store's revision at the hash).
    pub fn hash(&self) -> Result<(u32, i64), MvccError> {
        let _defrag = self.defrag_lock.lock();
        let _open = self.open_reads.open();
        let (txn, revision) = {
            let _writer = self.writer.lock();
            self.commit_locked(false)?;
            let txn = self.db().begin_read().map_err(backend_error)?;
            (txn, self.current_revision())
        };
        let mut hasher = crc32fast::Hasher::new();
        hash_records_table(&txn, &mut hasher)?;
        hash_table(&txn, META_TABLE, &mut hasher, |key| {
            key != META_CONSISTENT_INDEX.as_bytes()
        })?;
        for side in SideTable::ALL {
            hash_table(&txn, side.definition(), &mut hasher, |_| true)?;
        }
        Ok((hasher.finalize(), revision))
    }
}

/// etcd's hashStorageMaxSize.
pub(crate) const COMPACTION_HASHES_KEPT: usize = 10;

/// A HashKV result (etcd's KeyValueHash).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvHash {
    pub hash: u32,
    pub compact_revision: i64,
    pub revision: i64,
}

/// The hashes compactions recorded (etcd's hashStorage).
#[derive(Default)]
pub(crate) struct CompactionHashes {
    /// Ordered by revision, the newest [`COMPACTION_HASHES_KEPT`].
    hashes: Mutex<Vec<KvHash>>,
    /// One compaction hash at a time is computed; a compaction meanwhile
    /// records none (etcd: when the previous compaction did not complete).
    hashing: AtomicBool,
}

impl CompactionHashes {
    fn get(&self, revision: i64) -> Option<KvHash> {
        self.hashes
            .lock()
            .iter()
            .find(|h| h.revision == revision)
            .copied()
    }

    fn store(&self, hash: KvHash) {
        let mut hashes = self.hashes.lock();
        hashes.push(hash);
        hashes.sort_by_key(|h| h.revision);
        let excess = hashes.len().saturating_sub(COMPACTION_HASHES_KEPT);
        hashes.drain(..excess);
    }
}

/// What a HashKV reads: the committed table and the pending overlay, as of
/// one moment (begun under the pending lock).
struct HashSource {
    overlay: Vec<(RevisionKey, Bytes)>,
    deleted: HashSet<RevisionKey>,
    table: ReadOnlyTable<&'static [u8], &'static [u8]>,
    parts: ReadParts,
    upper: RevisionKey,
}

impl Store {
    /// The hashes recorded at the latest compactions (etcd's
    /// hashStorage.Hashes), oldest first.
    pub fn compaction_hashes(&self) -> Vec<KvHash> {
        self.compaction_hashes.hashes.lock().clone()
    }

    /// HashKV at `revision` (0 = current): (hash, compact revision, hashed
    /// revision). Pending records and pending compaction deletions count as
    /// committed, so members that applied the same entries agree whatever
    /// their commit timing.
    pub fn hash_kv(&self, revision: i64) -> Result<(u32, i64, i64), MvccError> {
        // etcd looks at the recorded hashes first, compacted or not
        if let Some(h) = self
            .compaction_hashes
            .get(revision)
            .filter(|_| revision > 0)
        {
            return Ok((h.hash, h.compact_revision, h.revision));
        }
        let (current, compacted) = {
            let state = self.state.read();
            (state.current_revision, state.compact_revision)
        };
        if revision > 0 && revision < compacted {
            return Err(MvccError::Compacted);
        }
        if revision > current {
            return Err(MvccError::FutureRev);
        }
        let hash_revision = if revision <= 0 { current } else { revision };
        // the compacted revisions etcd counts: what a compaction at the
        // hashed revision would keep (its key index's Keep)
        let keep = if compacted > 0 {
            Compacted::KeepOnly(self.state.read().tree.keep(hash_revision))
        } else {
            Compacted::All
        };
        let source = self.hash_source(hash_revision)?;
        let hash = hash_records(source, compacted, &keep, |r, record| {
            self.unseal_record(r, record)
        })?;
        Ok((hash, compacted, hash_revision))
    }

    fn hash_source(&self, revision: i64) -> Result<HashSource, MvccError> {
        let upper = RevisionKey::new(Revision::new(revision + 1, 0), false);
        // Records a compaction dropped count as deleted, whether or not its
        // batches have reached them (taken before the pending lock, as in
        // watch_sync).
        let backlog = self.backlog_dropped_from(Revision::new(0, 0));
        let pending = self.pending.read();
        let overlay: Vec<(RevisionKey, Bytes)> = pending
            .records
            .range(..upper.revision())
            .map(|(r, (tombstone, v))| (RevisionKey::new(*r, *tombstone), v.clone()))
            .collect();
        let mut deleted = backlog;
        deleted.extend(pending.deletions.iter().copied());
        // Begun under the pending lock: whatever redb lacks is in `overlay`.
        let txn = self.db().begin_read().map_err(backend_error)?;
        let table = txn.open_table(KEY_TABLE).map_err(backend_error)?;
        Ok(HashSource {
            overlay,
            deleted,
            table,
            parts: ReadParts::open(&txn)?,
            upper,
        })
    }
}

/// Which records at or below the compact revision a HashKV counts (etcd
/// filters them with a key index keep set, when it has one).
pub(crate) enum Compacted {
    All,
    /// Only these revisions (or all, when empty, as etcd).
    KeepOnly(HashSet<Revision>),
    /// All but these (the ones a compaction drops).
    AllBut(HashSet<Revision>),
}

/// A compaction's hash, ready to be computed: the store as it stood before
/// the compaction.
pub(crate) struct PendingCompactionHash {
    source: HashSource,
    revision: i64,
    previous: i64,
}

/// The store as it stands before the compaction at `revision` applies
/// (`previous`: the compact revision until then), for its hash; None while
/// the previous compaction's hash is still being computed (etcd: when the
/// previous compaction did not complete).
pub(crate) fn before_compaction(
    store: &Store,
    revision: i64,
    previous: i64,
) -> Option<PendingCompactionHash> {
    let hashes = &store.compaction_hashes;
    if hashes.hashing.swap(true, Ordering::AcqRel) {
        tracing::info!(
            revision,
            "previous compaction hash still computing, skip storing compaction hash value"
        );
        return None;
    }
    match store.hash_source(revision) {
        Ok(source) => Some(PendingCompactionHash {
            source,
            revision,
            previous,
        }),
        Err(e) => {
            tracing::warn!(revision, error = %e, "cannot hash the store at a compaction");
            hashes.hashing.store(false, Ordering::Release);
            None
        }
    }
}

/// Records the compaction's hash (etcd's scheduleCompaction: the records
/// up to its revision, those at or below the previous compaction only if
/// this one keeps them), on a thread of its own (a full pass over the
/// history below it). `dropped`: what the compaction drops (its set is
/// built on that thread too: 89 ms for 524,288 revisions, which the apply
/// thread and every write waited for).
pub(crate) fn hash_at_compaction(
    store: &Store,
    pending: PendingCompactionHash,
    dropped: Vec<Revision>,
) {
    let hashes = store.compaction_hashes.clone();
    let PendingCompactionHash {
        source,
        revision,
        previous,
    } = pending;
    let worker = hashes.clone();
    let spawned = std::thread::Builder::new()
        .name("compaction-hash".into())
        .spawn(move || {
            crate::idle_io_priority();
            let filter = Compacted::AllBut(dropped.into_iter().collect());
            match hash_records(source, previous, &filter, unseal_off_thread) {
                Ok(hash) => {
                    tracing::info!(
                        hash,
                        revision,
                        "compact-revision" = previous,
                        "storing new hash"
                    );
                    worker.store(KvHash {
                        hash,
                        compact_revision: previous,
                        revision,
                    });
                }
                Err(e) => {
                    tracing::warn!(revision, error = %e, "cannot hash the store at a compaction")
                }
            }
            worker.hashing.store(false, Ordering::Release);
        });
    if spawned.is_err() {
        hashes.hashing.store(false, Ordering::Release);
    }
}

/// Gives up a compaction's hash before it started (its compaction was
/// dropped): the next compaction hashes again.
pub(crate) fn abandon(store: &Store, pending: PendingCompactionHash) {
    drop(pending);
    store
        .compaction_hashes
        .hashing
        .store(false, Ordering::Release);
}

/// A record's payload, off the store's threads (a damaged record fails the
/// compaction hash; the store reports it when it reads it itself).
fn unseal_off_thread(_: Revision, record: &[u8]) -> Result<&[u8], MvccError> {
    crate::backend::unseal(record)
        .map_err(|_| MvccError::Corrupt("a record's checksum does not match".into()))
}

/// etcd's kvHasher over `source`.
fn hash_records<U>(
    source: HashSource,
    compacted: i64,
    filter: &Compacted,
    unseal: U,
) -> Result<u32, MvccError>
where
    U: for<'r> Fn(Revision, &'r [u8]) -> Result<&'r [u8], MvccError>,
{
    let HashSource {
        overlay,
        deleted,
        table,
        parts,
        upper,
    } = source;
    let mut crc = crc32c::crc32c(b"key");
    let counted = |key: &RevisionKey| {
        let revision = key.revision();
        if revision.main > compacted {
            return true;
        }
        if key.is_tombstone() && revision.main == compacted {
            return false;
        }
        match filter {
            Compacted::All => true,
            Compacted::KeepOnly(keep) => keep.is_empty() || keep.contains(&revision),
            Compacted::AllBut(dropped) => !dropped.contains(&revision),
        }
    };
    let mut record = |key: &RevisionKey, value: &[u8]| {
        if counted(key) {
            crc = crc32c::crc32c_append(crc, key.as_slice());
            crc = crc32c::crc32c_append(crc, value);
        }
    };
    // The encoded KeyValues are hashed, not the sealed records: the hash
    // does not depend on the file format, and it checks every record.
    let mut overlay = overlay.into_iter().peekable();
    for entry in table.range(..upper.as_slice()).map_err(backend_error)? {
        let (k, v) = entry.map_err(backend_error)?;
        let key = k.value();
        while let Some((pending_key, value)) = overlay.next_if(|(pk, _)| pk.as_slice() <= key) {
            if pending_key.as_slice() != key && !deleted.contains(&pending_key) {
                record(&pending_key, unseal(pending_key.revision(), &value)?);
            }
        }
        let (parsed, tombstone) = RevisionKey::parse(key)?;
        let revision_key = RevisionKey::new(parsed, tombstone);
        if !deleted.contains(&revision_key) {
            let whole = parts.join(key, v.value())?;
            record(&revision_key, unseal(parsed, &whole)?);
        }
    }
    for (pending_key, value) in overlay {
        if !deleted.contains(&pending_key) {
            record(&pending_key, unseal(pending_key.revision(), &value)?);
        }
    }
    Ok(crc)
}

#[cfg(test)]
mod tests {
    use crate::test_util::put_at;
    use crate::Store;

    #[test]
    fn same_writes_same_hash_whatever_the_raft_indexes_and_commit_timing() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(&dir.path().join("a")).unwrap();
        let b = Store::open(&dir.path().join("b")).unwrap();
        for (i, key) in ["x", "y", "z"].iter().enumerate() {
            put_at(&a, i as u64 + 1, key, "v", 0);
            put_at(&b, i as u64 + 10, key, "v", 0);
            b.commit(false).unwrap();
        }
        let (ha, ra) = a.hash().unwrap();
        let (hb, rb) = b.hash().unwrap();
        assert_eq!((ha, ra), (hb, rb));
        put_at(&b, 20, "w", "v", 0);
        assert_ne!(b.hash().unwrap().0, ha);
    }
}
