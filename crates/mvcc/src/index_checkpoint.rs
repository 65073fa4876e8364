//! The key index saved at a clean stop, so that the next open does not
//! read every record of the file to rebuild it. etcd rebuilds its index from
//! every record at each start (and oxcd did too): the time to restart grows
//! with the database, 11 s for etcd 3.5.16 at 8 GiB. With a checkpoint the
//! open reads the index (tens of bytes per key) and the small tables, not
//! every record.
//!
//! Table `oxcd_index_checkpoint` (`u64` → `&[u8]`): key 0 the header, keys
//! 1.. the body in chunks. The header: the checkpoint format (u32), the
//! consistent index, current revision and finished compaction revision the
//! index holds (u64, i64, i64), the body's length (u64) and its CRC-32C
//! (u32), all big-endian. The body: the key index
//! ([`KeyIndexTree::encode`]), then the leased keys (count, then key and
//! lease per key).
//!
//! Only a file whose every record the index covers gets one: written by
//! [`Store::close`] in a durable transaction right after the final commit,
//! under the writer lock, never while a compaction's deletions are still
//! under way (its records are in the file, not in the index). Whatever
//! commits after it deletes it first, and the open that uses it deletes it
//! in its own first transaction: a checkpoint never outlives the state it
//! describes. It is also refused unless its consistent index and revisions
//! match the file's meta table (a file written since by a build that does
//! not know the table), and unless its checksum holds.
//!
//! A member's open of a file with a checkpoint also skips redb's check of
//! every page, which reads the whole file twice (a checksum walk, then the
//! rebuild of its allocator state; 2.3 GB: 3.2 s with the checkpoint, 4.8 s
//! with the scan, 0.5 s without both), and makes up for it while it
//! serves: see [`crate::deferred_check`].

use bytes::Bytes;
use redb::{Database, Durability, ReadableDatabase, TableDefinition};

use crate::backend::{self, backend_error, Loaded};
use crate::key_index::{put_signed, put_varint, KeyIndexTree, Reader};
use crate::store::NO_COMPACTION;
use crate::{MvccError, Store};

pub(crate) const INDEX_TABLE: TableDefinition<u64, &[u8]> =
    TableDefinition::new("oxcd_index_checkpoint");

const HEADER_KEY: u64 = 0;
/// 2: keys after the prefix they share with the key before them; 1: whole
/// keys (read still).
const CHECKPOINT_FORMAT: u32 = 2;
const WHOLE_KEYS_FORMAT: u32 = 1;
const HEADER_LEN: usize = 4 + 8 + 8 + 8 + 8 + 4;
/// A chunk and its leaf's own bytes fit a page of
/// [`crate::flush::WRITE_BYTES`] (16 KiB), which redb writes in one write:
/// a chunk of 1 MiB was a 1 MiB page, whose write takes large page cache
/// folios, slow on this machine (see `flush::WRITE_BYTES`). A reader
/// joins the chunks whatever their length.
const CHUNK_BYTES: usize = crate::flush::WRITE_BYTES - 64;

/// What a checkpoint describes.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    format: u32,
    consistent_index: u64,
    current_revision: i64,
    compact_revision: i64,
    body_len: u64,
    body_crc: u32,
}

impl Header {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN);
        out.extend_from_slice(&self.format.to_be_bytes());
        out.extend_from_slice(&self.consistent_index.to_be_bytes());
        out.extend_from_slice(&self.current_revision.to_be_bytes());
        out.extend_from_slice(&self.compact_revision.to_be_bytes());
        out.extend_from_slice(&self.body_len.to_be_bytes());
        out.extend_from_slice(&self.body_crc.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Header, String> {
        if bytes.len() != HEADER_LEN {
            return Err(format!("a header of {} bytes", bytes.len()));
        }
        let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
        let format = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
        if format != CHECKPOINT_FORMAT && format != WHOLE_KEYS_FORMAT {
            return Err(format!("checkpoint format {format}"));
        }
        Ok(Header {
            format,
            consistent_index: u64_at(4),
            current_revision: u64_at(12) as i64,
            compact_revision: u64_at(20) as i64,
            body_len: u64_at(28),
            body_crc: u32::from_be_bytes(bytes[36..40].try_into().unwrap()),
        })
    }
}

/// Deletes the checkpoint of the file, if any, in `txn`.
pub(crate) fn drop_in(txn: &redb::WriteTransaction) -> Result<(), MvccError> {
    txn.delete_table(INDEX_TABLE).map_err(backend_error)?;
    Ok(())
}

/// Writes the checkpoint of `tree` (and `leased`) durably, in a
/// transaction of its own, which makes every commit before it durable too.
fn save(
    db: &Database,
    tree: &KeyIndexTree,
    leased: &[(Bytes, i64)],
    consistent_index: u64,
    current_revision: i64,
    compact_revision: i64,
) -> Result<u64, MvccError> {
    let mut txn = db.begin_write().map_err(backend_error)?;
    txn.set_durability(Durability::Immediate)
        .map_err(backend_error)?;
    let bytes = write_in(
        &txn,
        tree,
        leased,
        consistent_index,
        current_revision,
        compact_revision,
    )?;
    txn.commit().map_err(backend_error)?;
    Ok(bytes)
}

/// Writes the checkpoint of `tree` (and `leased`) in `txn`; the body's
/// length.
pub(crate) fn write_in(
    txn: &redb::WriteTransaction,
    tree: &KeyIndexTree,
    leased: &[(Bytes, i64)],
    consistent_index: u64,
    current_revision: i64,
    compact_revision: i64,
) -> Result<u64, MvccError> {
    let mut body = Body {
        table: txn.open_table(INDEX_TABLE).map_err(backend_error)?,
        chunk: Vec::with_capacity(CHUNK_BYTES),
        chunks: 0,
        len: 0,
        crc: 0,
    };
    tree.encode(&mut |bytes| body.write(bytes))?;
    body.write(&encode_leased(leased))?;
    body.flush()?;
    let header = Header {
        format: CHECKPOINT_FORMAT,
        consistent_index,
        current_revision,
        compact_revision,
        body_len: body.len,
        body_crc: body.crc,
    };
    body.table
        .insert(HEADER_KEY, header.encode().as_slice())
        .map_err(backend_error)?;
    Ok(header.body_len)
}

/// The checkpoint of `loaded` as bytes, its header then its body, for a
/// file written elsewhere (a new member's, from its leader's pages: see
/// [`crate::image_stream`]), which [`write_encoded_in`] puts in its table.
pub(crate) fn encode(loaded: &Loaded) -> Vec<u8> {
    let mut body = Vec::new();
    let encoded: Result<(), std::convert::Infallible> = loaded.index.encode(&mut |bytes| {
        body.extend_from_slice(bytes);
        Ok(())
    });
    let Ok(()) = encoded;
    body.extend_from_slice(&encode_leased(&loaded.leased_keys));
    let header = Header {
        format: CHECKPOINT_FORMAT,
        consistent_index: loaded.consistent_index,
        current_revision: loaded.current_revision,
        compact_revision: loaded.compact_revision.max(NO_COMPACTION),
        body_len: body.len() as u64,
        body_crc: crc32c::crc32c(&body),
    };
    let mut out = header.encode();
    out.extend_from_slice(&body);
    out
}

/// Writes a checkpoint [`encode`] made in `txn`. Only its header's length
/// is checked here: [`load`] checks the rest (its format, that it matches
/// the file, its checksum) and ignores a checkpoint that does not hold.
pub(crate) fn write_encoded_in(
    txn: &redb::WriteTransaction,
    encoded: &[u8],
) -> Result<(), MvccError> {
    let Some((header, body)) = encoded.split_at_checked(HEADER_LEN) else {
        return Err(MvccError::Corrupt(format!(
            "a key index checkpoint of {} bytes",
            encoded.len()
        )));
    };
    let mut table = txn.open_table(INDEX_TABLE).map_err(backend_error)?;
    for (n, chunk) in body.chunks(CHUNK_BYTES).enumerate() {
        table.insert(n as u64 + 1, chunk).map_err(backend_error)?;
    }
    table.insert(HEADER_KEY, header).map_err(backend_error)?;
    Ok(())
}

/// The body's tail: the leased keys (count, then key and lease per key).
fn encode_leased(leased: &[(Bytes, i64)]) -> Vec<u8> {
    let mut tail = Vec::new();
    put_varint(&mut tail, leased.len() as u64);
    for (key, lease) in leased {
        put_varint(&mut tail, key.len() as u64);
        tail.extend_from_slice(key);
        put_signed(&mut tail, *lease);
    }
    tail
}

/// A checkpoint's body on its way into the table: whole chunks as it
/// grows, its length and CRC-32C as it goes.
struct Body<'txn> {
    table: redb::Table<'txn, u64, &'static [u8]>,
    /// The chunk being filled, written once it holds `CHUNK_BYTES`.
    chunk: Vec<u8>,
    chunks: u64,
    len: u64,
    crc: u32,
}

impl Body<'_> {
    fn write(&mut self, mut bytes: &[u8]) -> Result<(), MvccError> {
        self.len += bytes.len() as u64;
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        while !bytes.is_empty() {
            let take = bytes.len().min(CHUNK_BYTES - self.chunk.len());
            self.chunk.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.chunk.len() == CHUNK_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Writes the chunk filled so far, if any.
    fn flush(&mut self) -> Result<(), MvccError> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        self.chunks += 1;
        self.table
            .insert(self.chunks, self.chunk.as_slice())
            .map_err(backend_error)?;
        self.chunk.clear();
        Ok(())
    }
}

/// What the checkpoint of the file at `path` holds, when it has a usable
/// one: Ok(None) without one, or when it does not match the file (the
/// reason logged), so that the caller scans the file instead.
pub(crate) fn load(path: &std::path::Path) -> Result<Option<Loaded>, MvccError> {
    // Read-only: a file that needs redb's repair (not closed cleanly) is
    // refused here, and scanned by the caller.
    let Ok(db) = backend::builder().open_read_only(path) else {
        return Ok(None);
    };
    let txn = db.begin_read().map_err(backend_error)?;
    let table = match txn.open_table(INDEX_TABLE) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(backend_error(e)),
    };
    let refused = |why: String| {
        tracing::warn!(
            path = %path.display(),
            reason = %why,
            "ignored the key index checkpoint; rebuilding the index from every record"
        );
        Ok(None)
    };
    let Some(header) = table.get(HEADER_KEY).map_err(backend_error)? else {
        return refused("no header".into());
    };
    let header = match Header::decode(header.value()) {
        Ok(header) => header,
        Err(why) => return refused(why),
    };
    let meta = backend::read_meta(&db)?;
    if meta.consistent_index != header.consistent_index
        || meta.compact_revision != header.compact_revision
        || meta.scheduled_compact_revision.is_some()
    {
        return refused(format!(
            "it holds consistent index {} and compaction {}, the file {} and {} (scheduled {:?})",
            header.consistent_index,
            header.compact_revision,
            meta.consistent_index,
            meta.compact_revision,
            meta.scheduled_compact_revision
        ));
    }
    let Ok(body_len) = usize::try_from(header.body_len) else {
        return refused(format!("a body of {} bytes", header.body_len));
    };
    let mut body = Vec::with_capacity(body_len.min(1 << 30));
    for row in table.range(1..).map_err(backend_error)? {
        let (_, chunk) = row.map_err(backend_error)?;
        body.extend_from_slice(chunk.value());
        if body.len() > body_len {
            break;
        }
    }
    if body.len() != body_len || crc32c::crc32c(&body) != header.body_crc {
        return refused("its checksum does not match".into());
    }
    let mut reader = Reader::new(&body);
    let whole_keys = header.format == WHOLE_KEYS_FORMAT;
    let decoded = KeyIndexTree::decode(&mut reader, whole_keys).and_then(|index| {
        let n = reader.count()?;
        let mut leased = Vec::with_capacity(n);
        for _ in 0..n {
            let key = Bytes::copy_from_slice(reader.slice()?);
            leased.push((key, reader.signed()?));
        }
        if !reader.is_done() {
            return Err("bytes after the leased keys".into());
        }
        Ok((index, leased))
    });
    let (index, leased_keys) = match decoded {
        Ok(decoded) => decoded,
        Err(why) => return refused(why),
    };
    drop(table);
    drop(txn);
    // the small tables are read through as a scan reads them (redb
    // panics on some damage: refused here, not in a later read)
    backend::read_small_tables(&db)?;
    Ok(Some(Loaded {
        index,
        current_revision: header.current_revision,
        compact_revision: header.compact_revision,
        scheduled_compact_revision: None,
        consistent_index: header.consistent_index,
        leased_keys,
    }))
}

impl Store {
    /// The last commit of a member that stops: everything applied goes to
    /// the file durably, then the key index with `leased` (every live key
    /// attached to a lease, and its lease) as the file's checkpoint, which
    /// the next open reads instead of every record. No checkpoint while a
    /// compaction's deletions are under way (the next open resumes it from
    /// the records).
    pub fn close(&self, leased: &[(Bytes, i64)]) -> Result<(), MvccError> {
        let _defrag = self.defrag_lock.lock();
        let _writer = self.writer.lock();
        let started = std::time::Instant::now();
        // The last batch without a sync of its own: the checkpoint's
        // durable commit syncs both (one fsync, not two).
        match self.commit_locked(false) {
            // another commit's sync under way: this one syncs itself
            Err(MvccError::Deferred) => self.commit_locked(true)?,
            committed => committed?,
        }
        let compaction_done = self.compaction_backlog.lock().jobs.is_empty();
        let state = self.state.read();
        let finished = self
            .finished_compact
            .load(std::sync::atomic::Ordering::Acquire);
        if !compaction_done || finished != state.compact_revision {
            // no checkpoint: the last batch's own sync
            return self.commit_locked(true);
        }
        let consistent_index = self.consistent_index();
        let bytes = save(
            &self.db(),
            &state.tree,
            leased,
            consistent_index,
            state.current_revision,
            state.compact_revision.max(NO_COMPACTION),
        )?;
        // the checkpoint's commit made every commit before it durable
        self.mark_durable(consistent_index);
        self.index_saved
            .store(true, std::sync::atomic::Ordering::Release);
        tracing::info!(
            keys = state.tree.len(),
            bytes,
            took = ?started.elapsed(),
            "saved the key index checkpoint"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use redb::{ReadableDatabase, ReadableTable};

    use super::{Header, CHECKPOINT_FORMAT, HEADER_KEY, INDEX_TABLE, WHOLE_KEYS_FORMAT};
    use crate::backend;
    use crate::compaction::CompactionBatches;
    use crate::test_util::{delete_range_at, put_at};
    use crate::Store;

    /// A history with every shape of key: written once, many times, deleted,
    /// deleted and written again, compacted, leased, long keys.
    fn history(store: &Store) -> u64 {
        let mut index = 0;
        let mut next = || {
            index += 1;
            index
        };
        for i in 0..300 {
            put_at(store, next(), &format!("once/{i:04}"), "v", 0);
        }
        for round in 0..5 {
            for i in 0..40 {
                put_at(
                    store,
                    next(),
                    &format!("many/{i:02}"),
                    format!("r{round}"),
                    0,
                );
            }
        }
        let long = "l".repeat(300);
        put_at(store, next(), &long, "long key", 7);
        for i in 0..20 {
            put_at(store, next(), &format!("leased/{i:02}"), "v", 7 + i % 3);
        }
        delete_range_at(store, next(), "many/00", "many/10");
        put_at(store, next(), "many/03", "back", 0);
        let revision = store.current_revision();
        store.compact(revision - 100, next()).unwrap();
        store.commit(false).unwrap();
        delete_range_at(store, next(), "once/0000", "once/0050");
        put_at(store, next(), "after", "v", 0);
        next()
    }

    /// Everything a load yields, leased keys in order.
    fn described(mut loaded: super::Loaded) -> String {
        loaded.leased_keys.sort();
        format!(
            "{:?} {} {} {} {:?}",
            loaded.index,
            loaded.current_revision,
            loaded.compact_revision,
            loaded.consistent_index,
            loaded.leased_keys
        )
    }

    /// The index, revisions and leased keys a scan of the file builds.
    fn scanned(path: &Path) -> String {
        let db = backend::builder().open_read_only(path).unwrap();
        described(backend::load_from(&db).unwrap())
    }

    fn has_checkpoint(store: &Store) -> bool {
        let txn = store.db().begin_read().unwrap();
        txn.open_table(INDEX_TABLE).is_ok()
    }

    fn leased(store: &Store) -> Vec<(Bytes, i64)> {
        // as the lessor holds them: live keys with a lease
        let mut leased = Vec::new();
        for kv in store
            .range(&api::etcdserverpb::RangeRequest {
                key: vec![0].into(),
                range_end: vec![0].into(),
                ..Default::default()
            })
            .unwrap()
            .kvs
        {
            if kv.lease != 0 {
                leased.push((kv.key.clone(), kv.lease));
            }
        }
        leased
    }

    #[test]
    fn a_closed_store_reopens_from_its_checkpoint_with_the_index_a_scan_builds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Store::open(&path).unwrap();
        let index = history(&store);
        let revision = store.current_revision();
        store.close(&leased(&store)).unwrap();
        assert!(has_checkpoint(&store));
        drop(store);

        let expected = scanned(&path);
        let loaded = super::load(&path).unwrap().expect("a usable checkpoint");
        assert_eq!(loaded.leased_keys.len(), 21);
        assert_eq!(described(loaded), expected);

        let reopened = Store::open(&path).unwrap();
        assert!(!has_checkpoint(&reopened), "the open deletes it");
        assert_eq!(reopened.current_revision(), revision);
        assert_eq!(reopened.consistent_index(), index - 1);
        assert_eq!(reopened.take_loaded_leased_keys().len(), 21);
        put_at(&reopened, index, "later", "v", 0);
        reopened.commit(true).unwrap();
        drop(reopened);
        // killed: no checkpoint, the scan finds the later write
        let again = Store::open(&path).unwrap();
        assert_eq!(again.current_revision(), revision + 1);
    }

    #[test]
    fn a_commit_after_close_deletes_the_checkpoint_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Store::open(&path).unwrap();
        let index = history(&store);
        store.close(&[]).unwrap();
        assert!(has_checkpoint(&store));
        put_at(&store, index, "late", "v", 0);
        store.commit(false).unwrap();
        store.commit(true).unwrap();
        assert!(!has_checkpoint(&store));
        let revision = store.current_revision();
        drop(store);
        let reopened = Store::open(&path).unwrap();
        assert_eq!(reopened.current_revision(), revision);
        assert_eq!(
            reopened
                .range(&api::etcdserverpb::RangeRequest {
                    key: b"late".to_vec().into(),
                    ..Default::default()
                })
                .unwrap()
                .count,
            1
        );
    }

    #[test]
    fn a_checkpoint_that_does_not_match_the_file_or_its_checksum_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Store::open(&path).unwrap();
        history(&store);
        store.close(&[]).unwrap();
        drop(store);
        let expected = scanned(&path);
        let pristine = std::fs::read(&path).unwrap();

        // one transaction on the file, as a build that knows no checkpoint
        let rewrite = |change: &dyn Fn(&redb::WriteTransaction)| {
            let db = backend::builder().create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            change(&txn);
            txn.commit().unwrap();
        };
        // the meta moved on
        rewrite(&|txn| {
            let mut meta = txn.open_table(backend::META_TABLE).unwrap();
            meta.insert(backend::META_CONSISTENT_INDEX, &10_000u64.to_be_bytes()[..])
                .unwrap();
        });
        assert!(super::load(&path).unwrap().is_none());
        assert_eq!(Store::open(&path).unwrap().consistent_index(), 10_000);

        // a body whose bytes changed
        std::fs::write(&path, &pristine).unwrap();
        rewrite(&|txn| {
            let mut table = txn.open_table(INDEX_TABLE).unwrap();
            let mut chunk = table.get(1).unwrap().unwrap().value().to_vec();
            chunk[10] ^= 1;
            table.insert(1, chunk.as_slice()).unwrap();
        });
        assert!(super::load(&path).unwrap().is_none());
        let reopened = Store::open(&path).unwrap();
        drop(reopened);
        assert_eq!(scanned(&path), expected);
    }

    #[test]
    fn no_checkpoint_while_a_compaction_is_still_deleting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Arc::new(Store::open(&path).unwrap());
        let index = history(&store);
        store
            .start_compactor(CompactionBatches {
                limit: 1,
                sleep: Duration::from_secs(3600),
            })
            .unwrap();
        store.compact(store.current_revision(), index).unwrap();
        store.close(&[]).unwrap();
        assert!(!has_checkpoint(&store));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_or_are_refused_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)
        ) {
            for whole_keys in [false, true] {
                let _ = crate::key_index::KeyIndexTree::decode(
                    &mut crate::key_index::Reader::new(&bytes),
                    whole_keys,
                );
            }
        }
    }

    #[test]
    fn a_checkpoint_of_whole_keys_from_an_earlier_build_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Store::open(&path).unwrap();
        history(&store);
        let leased = leased(&store);
        store.close(&leased).unwrap();
        // the body format 1 wrote: whole keys, then the leased keys
        let mut body = store.state.read().tree.encode_whole_keys();
        body.extend_from_slice(&super::encode_leased(&leased));
        drop(store);
        let expected = scanned(&path);

        let db = backend::builder().create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(INDEX_TABLE).unwrap();
            let header = table.get(HEADER_KEY).unwrap().unwrap().value().to_vec();
            let header = Header::decode(&header).unwrap();
            assert_eq!(header.format, CHECKPOINT_FORMAT);
            table.retain(|_, _| false).unwrap();
            let whole = Header {
                format: WHOLE_KEYS_FORMAT,
                body_len: body.len() as u64,
                body_crc: crc32c::crc32c(&body),
                ..header
            };
            table.insert(HEADER_KEY, whole.encode().as_slice()).unwrap();
            table.insert(1, body.as_slice()).unwrap();
        }
        txn.commit().unwrap();
        drop(db);

        let loaded = super::load(&path).unwrap().expect("a usable checkpoint");
        assert_eq!(loaded.leased_keys.len(), 21);
        assert_eq!(described(loaded), expected);
    }

    #[test]
    fn a_large_index_is_encoded_on_two_threads_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Store::open(&path).unwrap();
        let first = history(&store);
        // past PARALLEL_ENCODE_KEYS, in shapes of each kind
        for batch in 0..120u64 {
            let mut txn = store.write(first + batch);
            for i in 0..1_000 {
                // 110,000 keys, the first 10,000 written twice
                let key = format!("bulk/{:03}/{i:04}", batch % 110);
                txn.put(&api::etcdserverpb::PutRequest {
                    key: key.into(),
                    value: Bytes::from_static(b"v"),
                    ..Default::default()
                })
                .unwrap();
            }
            txn.end();
        }
        store.commit(true).unwrap();
        let keys = store.index_len();
        assert!(keys >= 100_000, "{keys} keys");
        store.close(&leased(&store)).unwrap();
        // freed on a thread of its own, past 100,000 keys
        drop(store);

        let expected = scanned(&path);
        let loaded = super::load(&path).unwrap().expect("a usable checkpoint");
        assert_eq!(loaded.index.len(), keys);
        assert_eq!(described(loaded), expected);
    }
}
