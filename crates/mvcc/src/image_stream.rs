//! A store's file as it is, for a new member (a raft snapshot): the leader
//! sends the bytes of its redb file that one read transaction reaches, as
//! etcd sends its bbolt file, and the new member writes them as they come.
//! A [`crate::record_stream`] has the member insert every record into a new
//! file instead: at 8 GiB of values that cost more than etcd's copy (the
//! inserts, a B-tree leaf per 4 KiB part, were the catch-up's bound).
//!
//! The leader makes every commit durable, then takes a read transaction:
//! every page it reaches is in the file from then on, and no later commit
//! frees or rewrites one while it lives. It sends the file's first bytes
//! up to the length of its layout with, in place of redb's header, one that
//! names that transaction's root alone and asks for recovery (the vendored
//! redb's `ReadTransaction::image_header`): opening the copy rebuilds its
//! allocator from that root and checks every page's checksum on the way,
//! as after a crash. The other bytes (free pages, pages later commits
//! wrote) are whatever they were, and no page reaches them.
//!
//! While the pages go, a thread of the leader reads the key index of the
//! same transaction from its `key` table (a long record's fields from its
//! first part and its head) and sends it at the end as a key index
//! checkpoint ([`crate::index_checkpoint`]), so that the new member does
//! not read every record again to rebuild its index.
//!
//! # Format
//!
//! | bytes | content |
//! |---|---|
//! | 8 | [`MAGIC`] |
//! | 8 | the file's length `L` (u64) |
//! | `L` | the file |
//! | 8 | the checkpoint's length `C` (u64; 0: none) |
//! | `C` | the checkpoint (`index_checkpoint::encode`) |
//! | 4 | CRC-32C of the preamble and the checkpoint's length and bytes |
//!
//! integers big-endian. The file's bytes are not in the CRC: the pages that
//! matter carry redb's checksums, which the open checks. A stream is taken
//! only whole: nothing may follow its CRC.

use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use redb::{ReadTransaction, ReadableDatabase, ReadableTable};

use crate::backend::{self, backend_error, Indexer, KEY_TABLE, META_TABLE};
use crate::parts::ReadParts;
use crate::revision::RevisionKey;
use crate::{MvccError, Store};

/// The stream's first bytes (its format's version in the last).
pub const MAGIC: [u8; 8] = *b"oxcdimg1";
/// Bytes of the file read and handed to the sink at a time.
pub const PIECE_BYTES: usize = 1 << 20;
/// The largest checkpoint a receiver takes: far above any index that fits
/// a member's memory (tens of bytes per key), and what bounds its buffer.
const MAX_CHECKPOINT_BYTES: u64 = 4 << 30;
/// A received file's bytes are sent to the disk every this many bytes, so
/// that its sync at the end has little left to write.
const WRITE_BACK_BYTES: u64 = 32 << 20;

fn gone() -> MvccError {
    MvccError::Backend("the snapshot's receiver went away".into())
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> MvccError {
    MvccError::Backend(format!("cannot {what} {}: {e}", path.display()))
}

/// The key index checkpoint of `snapshot`'s records; None while a
/// compaction's deletions are unfinished in it (the member that installs
/// it resumes them from the records, and rebuilds its index from them), or
/// once `stop` is set.
fn checkpoint_of(
    snapshot: &ReadTransaction,
    stop: &AtomicBool,
) -> Result<Option<Vec<u8>>, MvccError> {
    let meta = {
        let table = snapshot.open_table(META_TABLE).map_err(backend_error)?;
        backend::meta_of(&table)?
    };
    if meta.scheduled_compact_revision.is_some() {
        return Ok(None);
    }
    let table = snapshot.open_table(KEY_TABLE).map_err(backend_error)?;
    let parts = ReadParts::open(snapshot)?;
    let mut indexer = Indexer::default();
    for (n, row) in table.iter().map_err(backend_error)?.enumerate() {
        if n % 4096 == 0 && stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let (k, v) = row.map_err(backend_error)?;
        let (key, stored) = (k.value(), v.value());
        let (revision, tombstone) = RevisionKey::parse(key)?;
        let added = parts.long_fields(key, stored, |fields| {
            indexer.add_fields(revision, tombstone, fields)
        })?;
        if added.is_none() {
            indexer.add(key, &parts.join(key, stored)?)?;
        }
    }
    Ok(Some(crate::index_checkpoint::encode(&indexer.finish(meta))))
}

/// Hands `out` the file's first `len` bytes in pieces, `header` in place of
/// its first bytes, zeros past its end.
fn send_file(
    file: &std::fs::File,
    path: &Path,
    header: &[u8],
    len: u64,
    out: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<(), MvccError> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; PIECE_BYTES];
    let mut at = 0u64;
    while at < len {
        let want = (len - at).min(PIECE_BYTES as u64) as usize;
        let piece = &mut buf[..want];
        let mut filled = 0;
        while filled < want {
            match file.read_at(&mut piece[filled..], at + filled as u64) {
                Ok(0) => {
                    // the tail later commits freed: no page of ours there
                    piece[filled..].fill(0);
                    filled = want;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error("read", path, e)),
            }
        }
        if at == 0 {
            piece[..header.len()].copy_from_slice(header);
        }
        if !out(piece) {
            return Err(gone());
        }
        at += want as u64;
    }
    Ok(())
}

impl Store {
    /// Writes the store's file as of one read transaction to `out` in the
    /// image format (see [`crate::image_stream`]), in pieces of at most
    /// [`PIECE_BYTES`]; `out` answers false to give up. Returns the
    /// consistent index the image holds. Everything applied before the
    /// call is in it, as in [`Store::write_records`]'s stream.
    pub fn write_image(&self, out: &mut dyn FnMut(&[u8]) -> bool) -> Result<u64, MvccError> {
        // no defragmentation swaps the file while it is read
        let _defrag = self.defrag_lock.lock();
        let snapshot = {
            // every commit durable, so every page the transaction reaches
            // is in the file (a commit without fsync leaves its pages in
            // redb's write buffer), and none between the sync and it
            let _writer = self.writer.lock();
            if !self.commit_durable_locked()? {
                // nothing left to write: commits without fsync before it
                // may still be in redb's write buffer
                backend::sync_commits(&self.db())?;
            }
            self.db().begin_read().map_err(backend_error)?
        };
        let consistent_index = crate::snapshot::consistent_index_in(&snapshot)?;
        let (header, len) = snapshot.image_header();
        let path = self.path().to_path_buf();
        let file = std::fs::File::open(&path).map_err(|e| io_error("open", &path, e))?;
        let stop = AtomicBool::new(false);
        let mut crc = 0u32;
        // the bytes the CRC covers
        let send = |out: &mut dyn FnMut(&[u8]) -> bool, bytes: &[u8], crc: &mut u32| {
            *crc = crc32c::crc32c_append(*crc, bytes);
            if out(bytes) {
                Ok(())
            } else {
                Err(gone())
            }
        };
        std::thread::scope(|scope| {
            let checkpoint = std::thread::Builder::new()
                .name("image-index".into())
                .spawn_scoped(scope, || checkpoint_of(&snapshot, &stop))
                .map_err(|e| MvccError::Backend(format!("cannot start a thread: {e}")))?;
            let sent = (|| {
                let mut preamble = MAGIC.to_vec();
                preamble.extend_from_slice(&len.to_be_bytes());
                send(out, &preamble, &mut crc)?;
                send_file(&file, &path, &header, len, out)
            })();
            if sent.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            let checkpoint = checkpoint
                .join()
                .map_err(|_| MvccError::Backend("the key index thread panicked".into()))?;
            sent?;
            let checkpoint = checkpoint?.unwrap_or_default();
            send(out, &(checkpoint.len() as u64).to_be_bytes(), &mut crc)?;
            send(out, &checkpoint, &mut crc)?;
            if out(&crc.to_be_bytes()) {
                Ok(consistent_index)
            } else {
                Err(gone())
            }
        })
    }
}

/// Where an image stream is in its parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The magic and the file's length.
    Preamble,
    /// The file's bytes, this many still to come.
    File(u64),
    /// The checkpoint's length.
    CheckpointLen,
    /// The checkpoint's bytes, this many still to come.
    Checkpoint(u64),
    /// The CRC.
    Crc,
    /// The whole stream checked out.
    Ended,
}

fn damaged(what: impl std::fmt::Display) -> MvccError {
    MvccError::Corrupt(format!("the snapshot stream is damaged: {what}"))
}

/// Writes a received image stream (see [`crate::image_stream`]) into a
/// file as it arrives; [`ImageBuilder::finish`] makes it a store's file
/// (durable, redb's recovery done, the checkpoint in it) once the whole
/// stream checked out. Dropped before that, the file is not a copy (the
/// caller removes it).
pub struct ImageBuilder {
    path: PathBuf,
    file: std::fs::File,
    phase: Phase,
    /// The bytes of a fixed field received so far.
    field: Vec<u8>,
    len: u64,
    written: u64,
    /// Written bytes before this went to the disk already.
    written_back: u64,
    checkpoint: Vec<u8>,
    crc: u32,
}

impl ImageBuilder {
    /// Creates the file at `path` (0600), replacing any.
    pub fn create(path: &Path) -> Result<ImageBuilder, MvccError> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options
            .open(path)
            .map_err(|e| io_error("create", path, e))?;
        Ok(ImageBuilder {
            path: path.to_path_buf(),
            file,
            phase: Phase::Preamble,
            field: Vec::new(),
            len: 0,
            written: 0,
            written_back: 0,
            checkpoint: Vec::new(),
            crc: 0,
        })
    }

    /// Takes the next bytes of the stream.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), MvccError> {
        self.feed_parts(&[data])
    }

    /// [`ImageBuilder::feed`] of the parts one after the other.
    pub fn feed_parts(&mut self, parts: &[impl AsRef<[u8]>]) -> Result<(), MvccError> {
        let mut file_bytes: Vec<IoSlice<'_>> = Vec::new();
        for part in parts {
            let mut data = part.as_ref();
            while !data.is_empty() {
                data = match self.phase {
                    Phase::File(left) => {
                        let take = data.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                        file_bytes.push(IoSlice::new(&data[..take]));
                        self.phase = match left - take as u64 {
                            0 => Phase::CheckpointLen,
                            left => Phase::File(left),
                        };
                        &data[take..]
                    }
                    Phase::Checkpoint(left) => {
                        let take = data.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                        self.checkpoint.extend_from_slice(&data[..take]);
                        self.crc = crc32c::crc32c_append(self.crc, &data[..take]);
                        self.phase = match left - take as u64 {
                            0 => Phase::Crc,
                            left => Phase::Checkpoint(left),
                        };
                        &data[take..]
                    }
                    Phase::Ended => return Err(damaged("bytes after its end")),
                    Phase::Preamble | Phase::CheckpointLen | Phase::Crc => {
                        self.fixed_field(data)?
                    }
                };
            }
        }
        self.write(&mut file_bytes)
    }

    /// Takes the bytes of the fixed field `self.phase` expects from the
    /// front of `data`; the bytes after it.
    fn fixed_field<'d>(&mut self, data: &'d [u8]) -> Result<&'d [u8], MvccError> {
        let want = match self.phase {
            Phase::Preamble => 16,
            Phase::CheckpointLen => 8,
            _ => 4,
        };
        let take = (want - self.field.len()).min(data.len());
        self.field.extend_from_slice(&data[..take]);
        if self.field.len() < want {
            return Ok(&data[take..]);
        }
        let field = std::mem::take(&mut self.field);
        let u64_at = |at: usize| u64::from_be_bytes(field[at..at + 8].try_into().unwrap());
        match self.phase {
            Phase::Preamble => {
                if field[..8] != MAGIC {
                    return Err(damaged("it does not start as an image"));
                }
                self.crc = crc32c::crc32c_append(self.crc, &field);
                self.len = u64_at(8);
                self.phase = match self.len {
                    0 => Phase::CheckpointLen,
                    len => Phase::File(len),
                };
            }
            Phase::CheckpointLen => {
                self.crc = crc32c::crc32c_append(self.crc, &field);
                let len = u64_at(0);
                if len > MAX_CHECKPOINT_BYTES {
                    return Err(damaged(format!("a key index checkpoint of {len} bytes")));
                }
                self.phase = match len {
                    0 => Phase::Crc,
                    len => Phase::Checkpoint(len),
                };
            }
            _ => {
                let crc = u32::from_be_bytes(field[..4].try_into().unwrap());
                if crc != self.crc {
                    return Err(damaged(format!(
                        "it ends with CRC-32C {crc:08x}, {:08x} received",
                        self.crc
                    )));
                }
                self.phase = Phase::Ended;
            }
        }
        Ok(&data[take..])
    }

    /// Writes the file's bytes gathered so far, and starts the disk writes
    /// of what is written once there is enough of it.
    ///
    /// In small writes ([`crate::flush::write_all_at`]): in writes of 64
    /// KiB to 1 MiB, a new member's catch-up of 1.1 GB took 12 s instead
    /// of 4 on this machine, the kernel's copy into large page cache
    /// folios three quarters of it.
    fn write(&mut self, slices: &mut Vec<IoSlice<'_>>) -> Result<(), MvccError> {
        for slice in slices.iter() {
            crate::flush::write_all_at(&self.file, slice, self.written)
                .map_err(|e| io_error("write", &self.path, e))?;
            self.written += slice.len() as u64;
        }
        slices.clear();
        if self.written - self.written_back >= WRITE_BACK_BYTES {
            crate::flush::start_write_back(&self.file, self.written_back, self.written);
            self.written_back = self.written;
        }
        Ok(())
    }

    /// Makes the file a store's file once the stream ended whole: synced,
    /// opened once (redb rebuilds its allocator and checks every page the
    /// image's root reaches), the key index checkpoint written in it, and
    /// closed cleanly. The file's length.
    pub fn finish(self) -> Result<u64, MvccError> {
        if self.phase != Phase::Ended {
            return Err(damaged("it ended early"));
        }
        self.file
            .sync_all()
            .map_err(|e| io_error("sync", &self.path, e))?;
        drop(self.file);
        let path = self.path;
        let checkpoint = self.checkpoint;
        backend::without_panics(&path, || {
            let db = backend::builder()
                .open(&path)
                .map_err(backend::database_error)?;
            if !checkpoint.is_empty() {
                let mut txn = db.begin_write().map_err(backend_error)?;
                txn.set_durability(redb::Durability::Immediate)
                    .map_err(backend_error)?;
                crate::index_checkpoint::write_encoded_in(&txn, &checkpoint)?;
                txn.commit().map_err(backend_error)?;
            }
            // the image holds a store's tables (a file of anything else
            // is refused here, not at its install)
            backend::read_meta(&db)?;
            Ok(())
        })?;
        Ok(self.len)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::ImageBuilder;
    use crate::backend::{self, Loaded};
    use crate::test_util::put_at;
    use crate::{SideTable, Store};

    /// A store with a history, compacted, deleted keys, leases, a member,
    /// and long records (stored in parts) of many lengths, some leased.
    fn source(path: &Path) -> (Store, u64) {
        let store = Store::open(path).unwrap();
        let mut index = crate::test_util::three_rounds(&store);
        // long records whose heads are of every length around a part's,
        // so that some leases lie in the last part, not the head
        let part = crate::parts::PART_BYTES;
        for (n, len) in (part - 40..part + 40)
            .chain(2 * part - 40..2 * part + 40)
            .chain([8192, 3 << 20])
            .enumerate()
        {
            index += 1;
            let lease = if n % 3 == 0 { 0 } else { 5 + n as i64 };
            put_at(
                &store,
                index,
                &format!("long{n:03}"),
                vec![n as u8; len],
                lease,
            );
        }
        index += 1;
        let mut w = store.write(index);
        w.delete_range(&api::etcdserverpb::DeleteRangeRequest {
            key: b"k1".to_vec().into(),
            range_end: b"k2".to_vec().into(),
            ..Default::default()
        })
        .unwrap();
        w.end();
        index += 1;
        store.compact(300, index).unwrap();
        for n in (0..40).step_by(4) {
            index += 1;
            put_at(&store, index, &format!("long{n:03}"), vec![7; 9000], 0);
        }
        index += 1;
        crate::test_util::delete_range_at(&store, index, "long001", "long004");
        store.commit(false).unwrap();
        (store, index)
    }

    fn image_of(store: &Store, during: &mut dyn FnMut()) -> (Vec<u8>, u64) {
        let mut bytes = Vec::new();
        let mut pieces = 0;
        let index = store
            .write_image(&mut |piece| {
                assert!(piece.len() <= super::PIECE_BYTES, "{}", piece.len());
                bytes.extend_from_slice(piece);
                pieces += 1;
                if pieces == 2 {
                    during();
                }
                true
            })
            .unwrap();
        (bytes, index)
    }

    /// Feeds `bytes` in slices of random sizes, then finishes.
    fn build(path: &Path, bytes: &[u8], rng: &mut fastrand::Rng) -> Result<u64, crate::MvccError> {
        let mut builder = ImageBuilder::create(path)?;
        let mut at = 0;
        while at < bytes.len() {
            let n = rng.usize(1..=(300_000).min(bytes.len() - at));
            // in a few parts, as a receiver hands its chunks
            let (a, b) = bytes[at..at + n].split_at(n / 3);
            builder.feed_parts(&[a, b])?;
            at += n;
        }
        builder.finish()
    }

    /// `loaded` as bytes, its leased keys in order.
    fn canonical(mut loaded: Loaded) -> Vec<u8> {
        loaded.leased_keys.sort();
        crate::index_checkpoint::encode(&loaded)
    }

    fn range(s: &Store, revision: i64) -> Vec<api::mvccpb::KeyValue> {
        s.range(&api::etcdserverpb::RangeRequest {
            key: vec![0].into(),
            range_end: vec![0].into(),
            revision,
            ..Default::default()
        })
        .unwrap()
        .kvs
    }

    #[test]
    fn an_image_installs_as_the_store_it_was_taken_of() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mut index) = source(&dir.path().join("leader.db"));
        let (revision, before) = (store.current_revision(), range(&store, 0));
        let leader_records = {
            let mut bytes = Vec::new();
            store
                .write_records(&mut |piece| {
                    bytes.extend_from_slice(piece);
                    true
                })
                .unwrap();
            bytes
        };
        // writes go on while the image is read: commits with and without
        // a sync reuse free pages and grow the file; none is in the image
        let (bytes, image_index) = image_of(&store, &mut || {
            for i in 0..300 {
                index += 1;
                put_at(&store, index, &format!("k{i:03}"), vec![9; 5000], 0);
                if i % 50 == 0 {
                    store.commit(i % 100 == 0).unwrap();
                }
            }
            store.commit(false).unwrap();
        });
        assert_eq!(image_index, index - 300);
        let built = dir.path().join("built.db");
        let len = build(&built, &bytes, &mut fastrand::Rng::with_seed(7)).unwrap();
        assert!(len > 3 << 20, "{len}");

        // it comes with the key index of its records, as a load of every
        // record builds it
        let checkpoint = crate::index_checkpoint::load(&built)
            .unwrap()
            .expect("a checkpoint");
        assert_eq!(checkpoint.consistent_index, image_index);
        let loaded = {
            let db = backend::open_database(&built).unwrap();
            backend::load(&db).unwrap()
        };
        assert_eq!(canonical(checkpoint), canonical(loaded));

        let follower = Store::open(&dir.path().join("follower.db")).unwrap();
        follower.restore_from(&built).unwrap();
        assert_eq!(follower.consistent_index(), image_index);
        assert_eq!(follower.current_revision(), revision);
        assert_eq!(follower.compact_revision(), 300);
        assert_eq!(range(&follower, 0), before);
        assert_eq!(range(&follower, 350), range(&store, 350));
        assert_eq!(
            follower.side_records(SideTable::Members).unwrap().get(&7),
            Some(&b"member-7".to_vec())
        );
        // the same records, table by table, as the leader's then
        let mut records = Vec::new();
        follower
            .write_records(&mut |piece| {
                records.extend_from_slice(piece);
                true
            })
            .unwrap();
        assert!(records == leader_records, "the records differ");
        let leased = follower.take_loaded_leased_keys();
        assert!(leased.len() > 100, "{}", leased.len());
        // it takes writes, and a restart finds them
        put_at(&follower, image_index + 1, "after", "x", 0);
        follower.commit(true).unwrap();
        drop(follower);
        let reopened = Store::open(&dir.path().join("follower.db")).unwrap();
        assert_eq!(reopened.current_revision(), revision + 1);
    }

    #[test]
    fn the_fields_of_a_long_record_from_its_first_part_and_head_are_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = source(&dir.path().join("leader.db"));
        store.commit(true).unwrap();
        let db = store.db();
        let txn = redb::ReadableDatabase::begin_read(&*db).unwrap();
        let table = txn.open_table(backend::KEY_TABLE).unwrap();
        let parts = crate::parts::ReadParts::open(&txn).unwrap();
        let (mut long, mut fast) = (0, 0);
        for row in redb::ReadableTable::iter(&table).unwrap() {
            let (k, v) = row.unwrap();
            let (key, stored) = (k.value(), v.value());
            let whole = parts.join(key, stored).unwrap();
            let want = backend::scan_key_value(backend::unseal(&whole).unwrap()).unwrap();
            let want = format!("{want:?}");
            let got = parts
                .long_fields(key, stored, |fields| format!("{fields:?}"))
                .unwrap();
            if crate::parts::parts_of(stored).is_some() {
                long += 1;
            }
            if let Some(got) = got {
                assert_eq!(got, want);
                fast += 1;
            }
        }
        // every long record but those whose lease lies in a part
        assert!(long > 150, "{long}");
        assert!(fast + 12 >= long && fast < long, "{fast} of {long}");
    }

    #[test]
    fn a_damaged_truncated_or_extended_image_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = source(&dir.path().join("leader.db"));
        let (bytes, _) = image_of(&store, &mut || {});
        let path = dir.path().join("built.db");
        let mut rng = fastrand::Rng::with_seed(11);
        let refused = |bytes: &[u8], rng: &mut fastrand::Rng| {
            build(&path, bytes, rng).expect_err("refused").to_string()
        };
        let n = bytes.len();

        // a value in a page the image's root reaches: redb's checksums
        let mut value = bytes.clone();
        let at = value.windows(6).position(|w| w == b"r2-150").unwrap();
        value[at] ^= 1;
        let why = refused(&value, &mut rng);
        assert!(why.contains("orrupt"), "{why}");

        let mut crc = bytes.clone();
        crc[n - 1] ^= 1;
        assert!(refused(&crc, &mut rng).contains("it ends with CRC-32C"));
        // the checkpoint is in the CRC
        let mut checkpoint = bytes.clone();
        checkpoint[n - 20] ^= 1;
        assert!(refused(&checkpoint, &mut rng).contains("it ends with CRC-32C"));

        assert!(refused(&bytes[..n - 1], &mut rng).contains("ended early"));
        assert!(refused(&bytes[..n / 2], &mut rng).contains("ended early"));
        assert!(refused(&bytes[..10], &mut rng).contains("ended early"));

        let mut longer = bytes.clone();
        longer.push(0);
        assert!(refused(&longer, &mut rng).contains("after its end"));

        let mut magic = bytes.clone();
        magic[0] = b'x';
        assert!(refused(&magic, &mut rng).contains("does not start as an image"));

        let mut huge = bytes.clone();
        let len = u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize;
        huge[16 + len..24 + len].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(refused(&huge, &mut rng).contains("checkpoint of"));

        // the whole stream is taken
        build(&path, &bytes, &mut rng).unwrap();
    }

    #[test]
    fn random_damage_is_refused_or_taken_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("leader.db")).unwrap();
        store.put_side(SideTable::Auth, 1, Some(b"auth".to_vec()), 1);
        for i in 0..50 {
            put_at(&store, i + 2, &format!("k{i}"), format!("v{i}"), 0);
        }
        put_at(&store, 60, "long", vec![3; 9000], 0);
        let (bytes, _) = image_of(&store, &mut || {});
        let path = dir.path().join("built.db");
        let mut rng = fastrand::Rng::with_seed(3);
        for round in 0..100 {
            let mut damaged = bytes.clone();
            for _ in 0..rng.usize(1..4) {
                // most of the file is free pages: damage where it counts
                let at = if round % 2 == 0 {
                    rng.usize(..damaged.len())
                } else {
                    rng.usize(..damaged.len().min(64 << 10))
                };
                damaged[at] = rng.u8(..);
            }
            if build(&path, &damaged, &mut rng).is_ok() {
                // taken: it installs or is refused, never a panic
                let follower = Store::open(&dir.path().join(format!("f{round}.db"))).unwrap();
                let _ = follower.restore_from(&path);
            }
        }
    }
}
