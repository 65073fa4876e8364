//! A store's records as a byte stream, for a follower that needs the whole
//! backend from the leader (a raft snapshot): the leader writes the records
//! of one read transaction as they are read ([`Store::write_records`]) and
//! the follower writes them into a new redb file as they arrive
//! ([`RecordsBuilder`]), where the leader used to write a copy of its file
//! first, send the copy once written, and the follower to read the whole
//! received file back (8 GiB of values: 85 s before the follower had the
//! file; etcd sends its bbolt file as it is).
//!
//! # Format
//!
//! Frames, every table's records in key order, tables in a fixed order
//! (`key`, `meta`, then the side tables):
//!
//! | bytes | content |
//! |---|---|
//! | 1 | the table's tag (see [`TABLES`]) |
//! | varint, then that many | the key as redb encodes it |
//! | varint, then that many | the value as redb encodes it |
//!
//! then the end: the tag [`END`], the number of frames (u64) and the
//! CRC-32C of every byte before the end tag (u32), big-endian. A stream is
//! taken only whole: its count and checksum match, nothing follows the
//! end, and every `key` record's own checksum holds.

use std::path::Path;

use redb::{ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use crate::backend::{self, backend_error, SideTable, KEY_TABLE, META_TABLE};
use crate::parts::{ReadParts, Records};
use crate::{MvccError, Store};

/// Bytes handed to the writer's sink at a time, at most (a record longer
/// than that goes alone).
pub const PIECE_BYTES: usize = 1 << 20;
/// The end frame's tag.
const END: u8 = 0xff;
/// The largest key or value a frame may declare: far above any record
/// (etcd's requests are at most `--max-request-bytes`), and what bounds the
/// builder's buffer.
const MAX_FIELD_BYTES: u64 = 256 << 20;

/// A table's tag in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    Key,
    Meta,
    Side(SideTable),
}

/// Every table, in stream order, and its tag byte.
const TABLES: [(u8, Tag); 7] = [
    (0, Tag::Key),
    (1, Tag::Meta),
    (2, Tag::Side(SideTable::Members)),
    (3, Tag::Side(SideTable::MembersRemoved)),
    (4, Tag::Side(SideTable::Leases)),
    (5, Tag::Side(SideTable::Alarms)),
    (6, Tag::Side(SideTable::Auth)),
];

fn tag_of(byte: u8) -> Option<Tag> {
    TABLES.iter().find(|(b, _)| *b == byte).map(|(_, tag)| *tag)
}

fn gone() -> MvccError {
    MvccError::Backend("the snapshot's receiver went away".into())
}

/// Frames written so far and the sink they go to in pieces.
/// Frames records into pieces in one buffer, reused: a piece is handed to
/// `out` and its bytes are not needed after. (A new buffer per piece, grown
/// past its capacity by the frame that crossed [`PIECE_BYTES`], had the
/// leader's reading thread spend half its time copying and faulting in
/// fresh memory.)
struct Encoder<'a> {
    out: &'a mut dyn FnMut(&[u8]) -> bool,
    buf: Vec<u8>,
    crc: u32,
    frames: u64,
}

impl Encoder<'_> {
    fn frame(&mut self, tag: u8, key: &[u8], value: &[u8]) -> Result<(), MvccError> {
        use prost::encoding::encoded_len_varint;
        let len = 1
            + encoded_len_varint(key.len() as u64)
            + key.len()
            + encoded_len_varint(value.len() as u64)
            + value.len();
        if !self.buf.is_empty() && self.buf.len() + len > PIECE_BYTES {
            self.flush()?;
        }
        // grows only for a frame longer than a piece
        self.buf.reserve(len);
        self.buf.push(tag);
        prost::encoding::encode_varint(key.len() as u64, &mut self.buf);
        self.buf.extend_from_slice(key);
        prost::encoding::encode_varint(value.len() as u64, &mut self.buf);
        self.buf.extend_from_slice(value);
        self.frames += 1;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), MvccError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.crc = crc32c::crc32c_append(self.crc, &self.buf);
        let taken = (self.out)(&self.buf);
        self.buf.clear();
        if taken {
            Ok(())
        } else {
            Err(gone())
        }
    }

    fn table<K, V>(
        &mut self,
        from: &ReadTransaction,
        tag: u8,
        table: TableDefinition<K, V>,
    ) -> Result<(), MvccError>
    where
        K: redb::Key + 'static,
        V: redb::Value + 'static,
    {
        let source = match from.open_table(table) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(backend_error(e)),
        };
        for row in source.iter().map_err(backend_error)? {
            let (k, v) = row.map_err(backend_error)?;
            let (key, value) = (k.value(), v.value());
            self.frame(
                tag,
                K::as_bytes(&key).as_ref(),
                V::as_bytes(&value).as_ref(),
            )?;
        }
        Ok(())
    }

    /// The `key` table's records, long ones joined from their parts (the
    /// stream carries whole records, however a file stores them).
    fn records(&mut self, from: &ReadTransaction, tag: u8) -> Result<(), MvccError> {
        let table = from.open_table(KEY_TABLE).map_err(backend_error)?;
        let parts = ReadParts::open(from)?;
        for row in table.iter().map_err(backend_error)? {
            let (k, v) = row.map_err(backend_error)?;
            self.frame(tag, k.value(), &parts.join(k.value(), v.value())?)?;
        }
        Ok(())
    }

    fn end(mut self) -> Result<(), MvccError> {
        self.flush()?;
        let mut end = Vec::with_capacity(13);
        end.push(END);
        end.extend_from_slice(&self.frames.to_be_bytes());
        end.extend_from_slice(&self.crc.to_be_bytes());
        if (self.out)(&end) {
            Ok(())
        } else {
            Err(gone())
        }
    }
}

impl Store {
    /// Writes every record of one read transaction to `out` in the stream
    /// format (see [`crate::record_stream`]), in pieces of about
    /// [`PIECE_BYTES`]; `out` answers false to give up. Returns the
    /// consistent index the records hold. Applied-but-uncommitted changes
    /// are committed first, so the stream covers everything applied before
    /// the call, as [`Store::backup_to`]'s copy does.
    pub fn write_records(&self, out: &mut dyn FnMut(&[u8]) -> bool) -> Result<u64, MvccError> {
        let _defrag = self.defrag_lock.lock();
        self.commit(false)?;
        let snapshot = self.db().begin_read().map_err(backend_error)?;
        let consistent_index = crate::snapshot::consistent_index_in(&snapshot)?;
        let mut encoder = Encoder {
            out,
            buf: Vec::with_capacity(PIECE_BYTES),
            crc: 0,
            frames: 0,
        };
        for (byte, tag) in TABLES {
            match tag {
                Tag::Key => encoder.records(&snapshot, byte)?,
                Tag::Meta => encoder.table(&snapshot, byte, META_TABLE)?,
                Tag::Side(side) => encoder.table(&snapshot, byte, side.definition())?,
            }
        }
        encoder.end()?;
        Ok(consistent_index)
    }
}

/// Where a frame's fields are in the builder's buffer.
struct Frame {
    tag: Tag,
    key: std::ops::Range<usize>,
    value: std::ops::Range<usize>,
}

/// What parsing the buffer from a position found.
enum Parsed {
    Frame(Frame, usize),
    End {
        frames: u64,
        crc: u32,
        next: usize,
    },
    /// The buffer ends inside a frame.
    More,
}

fn damaged(what: impl std::fmt::Display) -> MvccError {
    MvccError::Corrupt(format!("the received snapshot stream is damaged: {what}"))
}

/// A varint at `pos`: None if the buffer ends first.
fn varint(buf: &[u8], pos: &mut usize) -> Result<Option<u64>, MvccError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&byte) = buf.get(*pos) else {
            return Ok(None);
        };
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(Some(value));
        }
    }
    Err(damaged("an overlong varint"))
}

/// A field's range at `pos`: None if the buffer ends first.
fn field(buf: &[u8], pos: &mut usize) -> Result<Option<std::ops::Range<usize>>, MvccError> {
    let Some(len) = varint(buf, pos)? else {
        return Ok(None);
    };
    if len > MAX_FIELD_BYTES {
        return Err(damaged(format!("a field of {len} bytes")));
    }
    let start = *pos;
    let end = start + len as usize;
    if end > buf.len() {
        return Ok(None);
    }
    *pos = end;
    Ok(Some(start..end))
}

fn parse(buf: &[u8], at: usize) -> Result<Parsed, MvccError> {
    let Some(&byte) = buf.get(at) else {
        return Ok(Parsed::More);
    };
    if byte == END {
        let Some(end) = buf.get(at + 1..at + 13) else {
            return Ok(Parsed::More);
        };
        return Ok(Parsed::End {
            frames: u64::from_be_bytes(end[..8].try_into().unwrap()),
            crc: u32::from_be_bytes(end[8..].try_into().unwrap()),
            next: at + 13,
        });
    }
    let tag = tag_of(byte).ok_or_else(|| damaged(format!("an unknown table tag {byte}")))?;
    let mut pos = at + 1;
    let Some(key) = field(buf, &mut pos)? else {
        return Ok(Parsed::More);
    };
    let Some(value) = field(buf, &mut pos)? else {
        return Ok(Parsed::More);
    };
    Ok(Parsed::Frame(Frame { tag, key, value }, pos))
}

/// Builds a redb file from a record stream as it arrives (see
/// [`crate::record_stream`]): written in steps committed without a sync
/// ([`crate::snapshot::SteppedWrite`]), the last one durably by
/// [`RecordsBuilder::finish`] once the whole stream checked out. Dropped
/// before that, the file is not a copy (the caller removes it).
pub struct RecordsBuilder {
    write: Option<crate::snapshot::SteppedWrite>,
    /// Bytes received and not yet parsed (the start of a frame).
    buf: Vec<u8>,
    crc: u32,
    frames: u64,
    /// The end frame's count and checksum, once met.
    ended: bool,
    /// The key index of the records so far, which the file gets as its
    /// checkpoint (see [`crate::index_checkpoint`]).
    indexer: backend::Indexer,
    /// The file's pages, sent to the disk as it grows (a guard: its
    /// thread ends when the builder is dropped).
    _behind: crate::flush::WriteBehind,
}

impl RecordsBuilder {
    /// Creates the file at `path` (0600), replacing any.
    pub fn create(path: &Path) -> Result<RecordsBuilder, MvccError> {
        Ok(RecordsBuilder {
            write: Some(crate::snapshot::new_copy(path)?),
            buf: Vec::new(),
            crc: 0,
            frames: 0,
            ended: false,
            indexer: backend::Indexer::default(),
            _behind: crate::flush::WriteBehind::start(path),
        })
    }

    /// Takes the next bytes of the stream; writes the whole frames they
    /// complete.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), MvccError> {
        self.feed_parts(&[data])
    }

    /// [`RecordsBuilder::feed`] of the parts one after the other, parsed
    /// at once (a receiver hands the chunks it received as they came).
    pub fn feed_parts(&mut self, parts: &[impl AsRef<[u8]>]) -> Result<(), MvccError> {
        if self.ended {
            return Err(damaged("bytes after its end"));
        }
        let mut fed = 0;
        for part in parts {
            self.buf.extend_from_slice(part.as_ref());
            fed += part.as_ref().len();
        }
        let mut frames = Vec::new();
        let mut at = 0;
        loop {
            match parse(&self.buf, at)? {
                Parsed::Frame(frame, next) => {
                    frames.push(frame);
                    at = next;
                }
                Parsed::End {
                    frames: n,
                    crc,
                    next,
                } => {
                    self.crc = crc32c::crc32c_append(self.crc, &self.buf[..at]);
                    self.frames += frames.len() as u64;
                    if n != self.frames || crc != self.crc {
                        return Err(damaged(format!(
                            "it ends with {n} records and CRC-32C {crc:08x}, {} and {:08x} received",
                            self.frames, self.crc
                        )));
                    }
                    if next != self.buf.len() {
                        return Err(damaged("bytes after its end"));
                    }
                    self.write(&frames)?;
                    self.ended = true;
                    self.buf = Vec::new();
                    return Ok(());
                }
                Parsed::More => break,
            }
        }
        self.crc = crc32c::crc32c_append(self.crc, &self.buf[..at]);
        self.frames += frames.len() as u64;
        self.write(&frames)?;
        self.buf.drain(..at);
        let write = self.write.as_mut().expect("a builder's copy until finish");
        if write.wrote(fed) {
            write.step()?;
        }
        Ok(())
    }

    /// Inserts `frames` (ranges into the buffer), a table opened per run
    /// of frames of one table.
    fn write(&mut self, frames: &[Frame]) -> Result<(), MvccError> {
        let txn = self
            .write
            .as_ref()
            .expect("a builder's copy until finish")
            .txn();
        let mut rest = frames;
        while let Some(first) = rest.first() {
            let run = rest.iter().take_while(|f| f.tag == first.tag).count();
            let (now, later) = rest.split_at(run);
            match first.tag {
                Tag::Key => {
                    // every record checked (its checksum) and indexed
                    for frame in now {
                        self.indexer
                            .add(&self.buf[frame.key.clone()], &self.buf[frame.value.clone()])
                            .map_err(damaged)?;
                    }
                    let mut records = Records::open(txn)?;
                    for frame in now {
                        records
                            .insert(&self.buf[frame.key.clone()], &self.buf[frame.value.clone()])?;
                    }
                }
                Tag::Meta => {
                    // redb decodes a `&str` key without checking it
                    for frame in now {
                        std::str::from_utf8(&self.buf[frame.key.clone()])
                            .map_err(|_| damaged("a meta key that is not UTF-8"))?;
                    }
                    insert_run(txn, META_TABLE, now, &self.buf)?
                }
                Tag::Side(side) => {
                    // nor the length of a `u64` one
                    if now.iter().any(|frame| frame.key.len() != 8) {
                        return Err(damaged(format!("a {side:?} key that is not 8 bytes")));
                    }
                    insert_run(txn, side.definition(), now, &self.buf)?
                }
            }
            rest = later;
        }
        Ok(())
    }

    /// Commits the file durably once the stream ended whole, with the key
    /// index of its records as its checkpoint (so that installing it reads
    /// no record again; none while a compaction is unfinished, which the
    /// install resumes from the records); the number of records it holds.
    pub fn finish(mut self) -> Result<u64, MvccError> {
        if !self.ended {
            return Err(damaged("it ended early"));
        }
        let write = self.write.take().expect("finished once");
        let txn = write.txn();
        let meta = {
            let table = txn.open_table(META_TABLE).map_err(backend_error)?;
            backend::meta_of(&table)?
        };
        if meta.scheduled_compact_revision.is_none() {
            let loaded = std::mem::take(&mut self.indexer).finish(meta);
            crate::index_checkpoint::write_in(
                txn,
                &loaded.index,
                &loaded.leased_keys,
                loaded.consistent_index,
                loaded.current_revision,
                loaded.compact_revision.max(crate::store::NO_COMPACTION),
            )?;
        }
        write.finish()?;
        Ok(self.frames)
    }
}

fn insert_run<K, V>(
    txn: &WriteTransaction,
    table: TableDefinition<K, V>,
    frames: &[Frame],
    buf: &[u8],
) -> Result<(), MvccError>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
    for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
{
    let mut dest = txn.open_table(table).map_err(backend_error)?;
    for frame in frames {
        let key = K::from_bytes(&buf[frame.key.clone()]);
        let value = V::from_bytes(&buf[frame.value.clone()]);
        dest.insert(key, value).map_err(backend_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::RecordsBuilder;
    use crate::test_util::put_at;
    use crate::{SideTable, Store};

    /// A store with a history, compacted, deleted keys, a lease, a member,
    /// values larger than a piece.
    fn source(path: &Path) -> Store {
        let store = Store::open(path).unwrap();
        let mut index = crate::test_util::three_rounds(&store);
        index += 1;
        put_at(&store, index, "big", vec![b'b'; 3 << 20], 0);
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
        store.commit(true).unwrap();
        store
    }

    fn stream_of(store: &Store) -> (Vec<u8>, u64) {
        let mut bytes = Vec::new();
        let index = store
            .write_records(&mut |piece| {
                assert!(!piece.is_empty());
                // pieces fill up to PIECE_BYTES; a longer record goes
                // alone: the 1 MiB values of one store (their keys and
                // lengths past it), the 3 MiB one of another
                assert!(
                    piece.len() <= super::PIECE_BYTES + 64 || piece.len() > 3 << 20,
                    "a piece of {} B",
                    piece.len()
                );
                bytes.extend_from_slice(piece);
                true
            })
            .unwrap();
        (bytes, index)
    }

    /// Feeds `bytes` in slices of random sizes, then finishes.
    fn build(path: &Path, bytes: &[u8], rng: &mut fastrand::Rng) -> Result<u64, crate::MvccError> {
        let mut builder = RecordsBuilder::create(path)?;
        let mut at = 0;
        while at < bytes.len() {
            let n = rng.usize(1..=(200_000).min(bytes.len() - at));
            builder.feed(&bytes[at..at + n])?;
            at += n;
        }
        builder.finish()
    }

    #[test]
    fn a_built_file_holds_every_record_of_every_table() {
        let dir = tempfile::tempdir().unwrap();
        let store = source(&dir.path().join("leader.db"));
        let (bytes, index) = stream_of(&store);
        assert_eq!(index, store.consistent_index());
        let built = dir.path().join("built.db");
        let records = build(&built, &bytes, &mut fastrand::Rng::with_seed(7)).unwrap();
        assert!(records > 400, "{records}");

        // it comes with the index of its records, so its install reads
        // none of them again
        let checkpoint = crate::index_checkpoint::load(&built)
            .unwrap()
            .expect("a checkpoint");
        assert_eq!(checkpoint.consistent_index, index);
        let follower = Store::open(&dir.path().join("follower.db")).unwrap();
        follower.restore_from(&built).unwrap();
        // installed, it streams back the same bytes, and holds what the
        // leader holds
        assert_eq!(stream_of(&follower), (bytes, index));
        assert_eq!(follower.current_revision(), store.current_revision());
        assert_eq!(follower.compact_revision(), 300);
        assert_eq!(
            follower.side_records(SideTable::Members).unwrap().get(&7),
            Some(&b"member-7".to_vec())
        );
        let range = |s: &Store| {
            s.range(&api::etcdserverpb::RangeRequest {
                key: vec![0].into(),
                range_end: vec![0].into(),
                ..Default::default()
            })
            .unwrap()
            .kvs
        };
        assert_eq!(range(&follower), range(&store));
        assert_eq!(follower.take_loaded_leased_keys().len(), 100);
    }

    /// A stream of more than a step is built in steps (committed without
    /// a sync, the last one durably) and installs whole.
    #[test]
    fn a_stream_larger_than_a_step_is_built_in_steps() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("leader.db")).unwrap();
        let values =
            3 * crate::snapshot::step_bytes(crate::snapshot_file::COPY_CACHE_BYTES) / (1 << 20);
        for i in 0..values {
            put_at(
                &store,
                i as u64 + 1,
                &format!("k{i:03}"),
                vec![i as u8; 1 << 20],
                0,
            );
        }
        store.commit(true).unwrap();
        let (bytes, index) = stream_of(&store);
        let built = dir.path().join("built.db");
        let mut builder = RecordsBuilder::create(&built).unwrap();
        for piece in bytes.chunks(super::PIECE_BYTES) {
            builder.feed(piece).unwrap();
        }
        let steps = builder.write.as_ref().unwrap().steps();
        assert!(steps >= 2, "{steps} steps");
        let frames = builder.finish().unwrap();
        assert!(
            frames > values as u64,
            "{frames} frames: the records and meta"
        );

        let follower = Store::open(&dir.path().join("follower.db")).unwrap();
        follower.restore_from(&built).unwrap();
        assert_eq!(stream_of(&follower), (bytes, index));
        assert_eq!(follower.hash().unwrap(), store.hash().unwrap());
    }

    #[test]
    fn a_damaged_truncated_or_extended_stream_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = source(&dir.path().join("leader.db"));
        let (bytes, _) = stream_of(&store);
        let path = dir.path().join("built.db");
        let mut rng = fastrand::Rng::with_seed(11);
        let refused = |bytes: &[u8], rng: &mut fastrand::Rng| {
            build(&path, bytes, rng).expect_err("refused").to_string()
        };

        let mut value = bytes.clone();
        let at = value.windows(6).position(|w| w == b"r1-150").unwrap();
        value[at] ^= 1;
        assert!(refused(&value, &mut rng).contains("fails its checksum"));

        let mut count = bytes.clone();
        let n = count.len();
        count[n - 5] ^= 1;
        assert!(refused(&count, &mut rng).contains("it ends with"));

        assert!(refused(&bytes[..n - 1], &mut rng).contains("ended early"));
        assert!(refused(&bytes[..n / 2], &mut rng).contains("ended early"));

        let mut longer = bytes.clone();
        longer.push(0);
        assert!(refused(&longer, &mut rng).contains("after its end"));

        let mut tag = bytes.clone();
        tag[0] = 0x42;
        assert!(refused(&tag, &mut rng).contains("unknown table tag"));
    }

    #[test]
    fn random_damage_is_refused_or_taken_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("leader.db")).unwrap();
        store.put_side(SideTable::Auth, 1, Some(b"auth".to_vec()), 1);
        for i in 0..50 {
            put_at(&store, i + 2, &format!("k{i}"), format!("v{i}"), 0);
        }
        let (bytes, _) = stream_of(&store);
        let path = dir.path().join("built.db");
        let mut rng = fastrand::Rng::with_seed(3);
        let mut taken = 0;
        for _ in 0..300 {
            let mut damaged = bytes.clone();
            for _ in 0..rng.usize(1..4) {
                let at = rng.usize(..damaged.len());
                damaged[at] = rng.u8(..);
            }
            if build(&path, &damaged, &mut rng).is_ok() {
                taken += 1;
            }
        }
        // a changed byte almost always breaks the checksum
        assert!(taken < 10, "{taken}");
    }
}
