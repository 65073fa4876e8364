//! Records longer than a page, stored in page-sized parts.
//!
//! redb gives a leaf that holds one pair too long for a 4 KiB page a
//! power-of-two number of pages: a record of an 8,192 B value took 16 KiB
//! of file, twice its length (bbolt counts its overflow pages one by one:
//! 12 KiB). Every step that writes the whole file (a load, a defrag, a new
//! member's copy) paid for the waste. A record longer than [`PART_BYTES`]
//! is therefore stored in two places:
//!
//! * its first bytes, in parts of exactly [`PART_BYTES`], in the table
//!   `key_parts` under the record's key followed by the part's number (u32
//!   big-endian): a leaf holding one part fills one page;
//! * its last 1 to [`PART_BYTES`] bytes in the `key` table (the *head*),
//!   followed by 5 bytes: `0x75` (protobuf field 14 as a fixed32) and the
//!   number of parts (u32 little-endian). Heads are short and share leaves.
//!
//! A whole record ends with its seal (`0x7d` and a CRC-32, see
//! `backend::seal`), a head with `0x75`: a reader tells them apart by the
//! fifth byte from the end, and joins the parts and the head's bytes into
//! the sealed record, whose checksum then covers every part. Writes go in
//! revision order, so each table's leaves fill up as redb appends to its
//! right edge. Shorter records are stored whole, as before: a file holds
//! both kinds (files of format 2 hold only whole records).

use std::borrow::Cow;

use redb::{ReadTransaction, ReadableTable, Table, TableDefinition, WriteTransaction};

use crate::backend::{backend_error, read_varint, KeyValueFields, CHECKSUM_LEN, CHECKSUM_TAG};
use crate::revision::RevisionKey;
use crate::MvccError;

/// Parts of long records: the record's key and the part's number → the part.
pub(crate) const PART_TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("key_parts");

/// A part's length: a redb leaf holding one pair needs 12 bytes besides
/// the pair (a 4-byte header, the end of the key and of the value), the
/// longest part key is 22 bytes (a tombstone's 18 and the number): the
/// leaf of one part then fits one 4,096-byte page.
pub(crate) const PART_BYTES: usize = 4096 - 12 - (18 + 4);

/// The head's last five bytes start with this tag.
const HEAD_TAG: u8 = (14 << 3) | 5;
const HEAD_TRAILER: usize = 5;

/// The number of parts a value of the `key` table refers to; None for a
/// whole record.
pub(crate) fn parts_of(stored: &[u8]) -> Option<u32> {
    let at = stored.len().checked_sub(HEAD_TRAILER)?;
    if stored[at] != HEAD_TAG {
        return None;
    }
    let count: [u8; 4] = stored[at + 1..].try_into().ok()?;
    Some(u32::from_le_bytes(count))
}

/// The length of the whole record a value of the `key` table holds or
/// refers to, its parts unread.
pub(crate) fn whole_len(stored: &[u8]) -> usize {
    match parts_of(stored) {
        Some(count) => count as usize * PART_BYTES + stored.len() - HEAD_TRAILER,
        None => stored.len(),
    }
}

/// Whether a record of this length is stored in parts.
pub(crate) fn is_long(record_len: usize) -> bool {
    record_len > PART_BYTES
}

/// Keys [`Records::remove_all`] removes in one pass over their range, at
/// the least: below, the pass's setup outweighs one removal per key.
const DENSE_RUN: usize = 8;

/// The main revision of a revision key (17 or 18 bytes).
fn main_of(key: &[u8]) -> u64 {
    key.get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

fn part_key(key: &[u8], part: u32) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(key.len() + 4);
    bytes.extend_from_slice(key);
    bytes.extend_from_slice(&part.to_be_bytes());
    bytes
}

/// A `key` record with missing or extra parts: damage, named like a
/// checksum failure.
fn damaged(key: &[u8], what: String) -> MvccError {
    match RevisionKey::parse(key) {
        Ok((revision, _)) => MvccError::Corrupt(format!(
            "the record of revision {}/{} {what}",
            revision.main, revision.sub
        )),
        Err(e) => e,
    }
}

/// The parts table of a read transaction, for joining long records
/// (absent in a file no writer of this format opened: its records are all
/// whole).
pub(crate) struct ReadParts(Option<redb::ReadOnlyTable<&'static [u8], &'static [u8]>>);

impl ReadParts {
    pub(crate) fn open(txn: &ReadTransaction) -> Result<ReadParts, MvccError> {
        match txn.open_table(PART_TABLE) {
            Ok(table) => Ok(ReadParts(Some(table))),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(ReadParts(None)),
            Err(e) => Err(backend_error(e)),
        }
    }

    /// The whole (sealed) record of `stored`, the `key` table's value under
    /// `key`: itself, or its parts and its head joined.
    pub(crate) fn join<'v>(
        &self,
        key: &[u8],
        stored: &'v [u8],
    ) -> Result<Cow<'v, [u8]>, MvccError> {
        join(self.0.as_ref(), key, stored)
    }
}

impl ReadParts {
    /// The fields the key index needs of the long record whose head is
    /// `stored` (the `key` table's value under `key`), read from its first
    /// part and its head only, the parts between them unread, and handed
    /// to `f`. None for a whole record, and for one not laid out as a
    /// `mvccpb.KeyValue` is encoded (fields in their order: the key and
    /// revisions in the first part, nothing but the lease after the value,
    /// all of it in the head), which the caller joins instead. The
    /// record's checksum is not checked (its other parts are not read).
    pub(crate) fn long_fields<T>(
        &self,
        key: &[u8],
        stored: &[u8],
        f: impl FnOnce(&KeyValueFields<'_>) -> T,
    ) -> Result<Option<T>, MvccError> {
        let (Some(count), Some(table)) = (parts_of(stored), self.0.as_ref()) else {
            return Ok(None);
        };
        let head = &stored[..stored.len() - HEAD_TRAILER];
        if count == 0
            || head.len() < CHECKSUM_LEN
            || head[head.len() - CHECKSUM_LEN] != CHECKSUM_TAG
        {
            return Ok(None);
        }
        let Some(first) = table
            .get(part_key(key, 0).as_slice())
            .map_err(backend_error)?
        else {
            return Ok(None);
        };
        let first = first.value();
        if first.len() != PART_BYTES {
            return Ok(None);
        }
        let mut fields = KeyValueFields::default();
        let mut pos = 0;
        let value_end = loop {
            let Ok(tag) = read_varint(first, &mut pos) else {
                return Ok(None);
            };
            let Ok(v) = read_varint(first, &mut pos) else {
                return Ok(None);
            };
            match (tag >> 3, tag & 7) {
                (1, 2) => match pos.checked_add(v as usize) {
                    Some(end) if end <= first.len() => {
                        fields.key = &first[pos..end];
                        pos = end;
                    }
                    _ => return Ok(None),
                },
                (2, 0) => fields.create_revision = v as i64,
                (3, 0) => fields.mod_revision = v as i64,
                (4, 0) => fields.version = v as i64,
                (5, 2) => match pos.checked_add(v as usize) {
                    Some(end) => break end,
                    None => return Ok(None),
                },
                _ => return Ok(None),
            }
        };
        // the record's bytes after the value: in the head, before its seal
        let head_start = count as usize * PART_BYTES;
        let proto_end = head_start + head.len() - CHECKSUM_LEN;
        if value_end < head_start || value_end > proto_end {
            return Ok(None);
        }
        let tail = &head[value_end - head_start..proto_end - head_start];
        let mut pos = 0;
        while pos < tail.len() {
            match read_varint(tail, &mut pos) {
                Ok(tag) if tag == 6 << 3 => {}
                _ => return Ok(None),
            }
            let Ok(lease) = read_varint(tail, &mut pos) else {
                return Ok(None);
            };
            fields.lease = lease as i64;
        }
        Ok(Some(f(&fields)))
    }
}

/// [`ReadParts::join`] with the parts table of any transaction.
fn join<'v>(
    table: Option<&impl ReadableTable<&'static [u8], &'static [u8]>>,
    key: &[u8],
    stored: &'v [u8],
) -> Result<Cow<'v, [u8]>, MvccError> {
    let Some(count) = parts_of(stored) else {
        return Ok(Cow::Borrowed(stored));
    };
    let head = &stored[..stored.len() - HEAD_TRAILER];
    let count = count as usize;
    let Some(table) = table else {
        return Err(damaged(key, format!("misses its {count} parts")));
    };
    // (a damaged count reserves no more than a few parts' worth)
    let mut record = Vec::with_capacity(count.min(64) * PART_BYTES + head.len());
    let (first, last) = (part_key(key, 0), part_key(key, u32::MAX));
    let mut found = 0;
    for row in table
        .range::<&[u8]>(first.as_slice()..=last.as_slice())
        .map_err(backend_error)?
    {
        let (k, v) = row.map_err(backend_error)?;
        if k.value() != part_key(key, found as u32).as_slice() || v.value().len() != PART_BYTES {
            return Err(damaged(key, format!("has a damaged part {found}")));
        }
        record.extend_from_slice(v.value());
        found += 1;
        if found > count {
            break;
        }
    }
    if found != count {
        return Err(damaged(key, format!("has {found} of its {count} parts")));
    }
    record.extend_from_slice(head);
    Ok(Cow::Owned(record))
}

/// The `key` table and the parts table of a write transaction.
pub(crate) struct Records<'txn> {
    pub(crate) table: Table<'txn, &'static [u8], &'static [u8]>,
    parts: Table<'txn, &'static [u8], &'static [u8]>,
}

impl<'txn> Records<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction) -> Result<Records<'txn>, MvccError> {
        Ok(Records {
            table: txn
                .open_table(crate::backend::KEY_TABLE)
                .map_err(backend_error)?,
            parts: txn.open_table(PART_TABLE).map_err(backend_error)?,
        })
    }

    /// Writes a sealed `record` under `key`, whole or in parts. Returns the
    /// bytes written (keys and values) and those of a record it replaced.
    pub(crate) fn insert(
        &mut self,
        key: &[u8],
        record: &[u8],
    ) -> Result<(usize, usize), MvccError> {
        let count = if is_long(record.len()) {
            (record.len() - 1) / PART_BYTES
        } else {
            0
        };
        let (parts, tail) = record.split_at(count * PART_BYTES);
        let head: Cow<[u8]> = if count == 0 {
            Cow::Borrowed(record)
        } else {
            let mut head = Vec::with_capacity(tail.len() + HEAD_TRAILER);
            head.extend_from_slice(tail);
            head.push(HEAD_TAG);
            head.extend_from_slice(&(count as u32).to_le_bytes());
            Cow::Owned(head)
        };
        // One descent for the head and whatever it replaces (a commit's
        // keys are new but in tests), then the old parts out, the new in.
        let old = self
            .table
            .insert(key, &head[..])
            .map_err(backend_error)?
            .map(|old| (old.value().len(), parts_of(old.value())));
        let replaced = match old {
            Some((len, old_parts)) => key.len() + len + self.remove_parts(key, old_parts)?,
            None => 0,
        };
        let mut written = key.len() + head.len();
        for (i, part) in parts.chunks_exact(PART_BYTES).enumerate() {
            let part_key = part_key(key, i as u32);
            self.parts
                .insert(part_key.as_slice(), part)
                .map_err(backend_error)?;
            written += part_key.len() + part.len();
        }
        Ok((written, replaced))
    }

    /// Removes the record under `key` and its parts; the bytes they held
    /// (keys and values), 0 if there was none.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Result<usize, MvccError> {
        let (len, count) = match self.table.remove(key).map_err(backend_error)? {
            Some(old) => (old.value().len(), parts_of(old.value())),
            None => return Ok(0),
        };
        Ok(key.len() + len + self.remove_parts(key, count)?)
    }

    /// Removes the records under `keys` (revision keys, in any order) and
    /// their parts; the bytes they held. Runs of keys whose revisions
    /// follow one another (a compaction's batch of a key space written over
    /// and over) go in one pass over their range of each table, which
    /// removes entries a leaf at a time; scattered keys one by one.
    pub(crate) fn remove_all(&mut self, keys: &[RevisionKey]) -> Result<usize, MvccError> {
        let mut sorted: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        sorted.sort_unstable();
        sorted.dedup();
        let mut removed = 0;
        for run in sorted.chunk_by(|a, b| main_of(b) <= main_of(a).saturating_add(1)) {
            if run.len() < DENSE_RUN {
                for key in run {
                    removed += self.remove(key)?;
                }
                continue;
            }
            let (first, last) = (run[0], run[run.len() - 1]);
            let mut with_parts = false;
            self.table
                .retain_in::<&[u8], _>(first..=last, |k, v| {
                    if run.binary_search(&k).is_err() {
                        return true;
                    }
                    removed += k.len() + v.len();
                    with_parts |= parts_of(v).is_some();
                    false
                })
                .map_err(backend_error)?;
            if with_parts {
                let (from, to) = (part_key(first, 0), part_key(last, u32::MAX));
                self.parts
                    .retain_in::<&[u8], _>(from.as_slice()..=to.as_slice(), |k, v| {
                        let record = &k[..k.len().saturating_sub(4)];
                        if run.binary_search(&record).is_err() {
                            return true;
                        }
                        removed += k.len() + v.len();
                        false
                    })
                    .map_err(backend_error)?;
            }
        }
        Ok(removed)
    }

    /// Removes the first `count` parts of the record under `key`, up to the
    /// first one missing (a damaged count removes no more than there is);
    /// the bytes they held.
    fn remove_parts(&mut self, key: &[u8], count: Option<u32>) -> Result<usize, MvccError> {
        let mut removed = 0;
        for i in 0..count.unwrap_or(0) {
            let part_key = part_key(key, i);
            match self
                .parts
                .remove(part_key.as_slice())
                .map_err(backend_error)?
            {
                Some(part) => removed += part_key.len() + part.value().len(),
                None => break,
            }
        }
        Ok(removed)
    }

    /// The whole record under `key`, if any.
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MvccError> {
        let Some(stored) = self.table.get(key).map_err(backend_error)? else {
            return Ok(None);
        };
        let joined = join(Some(&self.parts), key, stored.value())?;
        Ok(Some(joined.into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{seal, unseal, KEY_TABLE};
    use crate::revision::Revision;
    use redb::{ReadableDatabase, ReadableTableMetadata};

    fn key(main: i64) -> RevisionKey {
        RevisionKey::new(Revision::new(main, 0), false)
    }

    #[test]
    fn records_of_every_length_around_the_part_length_come_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("db")).unwrap();
        let lengths = [
            0,
            1,
            PART_BYTES - 6,
            PART_BYTES - 5,
            PART_BYTES - 1,
            PART_BYTES,
            PART_BYTES + 1,
            2 * PART_BYTES - 1,
            2 * PART_BYTES,
            2 * PART_BYTES + 1,
            8192,
            1 << 20,
        ];
        let records: Vec<_> = lengths
            .iter()
            .enumerate()
            .map(|(i, len)| seal((0..*len).map(|b| (b * 7 + i) as u8).collect()))
            .collect();
        let txn = db.begin_write().unwrap();
        {
            let mut table = Records::open(&txn).unwrap();
            for (i, record) in records.iter().enumerate() {
                let (written, replaced) =
                    table.insert(key(i as i64 + 2).as_slice(), record).unwrap();
                assert_eq!(replaced, 0);
                assert!(
                    written >= record.len() + 17,
                    "{written} for {}",
                    record.len()
                );
            }
        }
        txn.commit().unwrap();
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(KEY_TABLE).unwrap();
        let parts = ReadParts::open(&txn).unwrap();
        for (i, record) in records.iter().enumerate() {
            let k = key(i as i64 + 2);
            let stored = table.get(k.as_slice()).unwrap().unwrap();
            assert_eq!(
                parts_of(stored.value()).is_some(),
                is_long(record.len()),
                "record {i}"
            );
            assert!(stored.value().len() <= PART_BYTES + HEAD_TRAILER);
            assert_eq!(whole_len(stored.value()), record.len(), "record {i}");
            let joined = parts.join(k.as_slice(), stored.value()).unwrap();
            assert_eq!(&joined[..], &record[..], "record {i}");
            assert!(unseal(&joined).is_ok());
        }
    }

    #[test]
    fn an_eight_kib_value_takes_about_its_length_of_file() {
        // 2,000 records of 8,192 B values (with a KeyValue's other fields):
        // 16 KiB each whole, about 8.3 KiB in parts.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let db = redb::Database::create(&path).unwrap();
        let n = 2000;
        for batch in 0..(n / 100) {
            let txn = db.begin_write().unwrap();
            {
                let mut table = Records::open(&txn).unwrap();
                for i in 0..100 {
                    let main = 2 + batch * 100 + i;
                    let record = seal(vec![main as u8; 8192 + 40]);
                    table.insert(key(main).as_slice(), &record).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let txn = db.begin_write().unwrap();
        let stats = txn.stats().unwrap();
        let allocated = stats.allocated_pages() * stats.page_size() as u64;
        txn.abort().unwrap();
        let per_record = allocated / n as u64;
        eprintln!("{per_record} B of pages per record");
        assert!(
            per_record < 9 * 1024,
            "{per_record} B of pages per record of ~8.2 KiB"
        );
    }

    #[test]
    fn replacing_or_removing_a_long_record_removes_its_parts() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("db")).unwrap();
        let long = seal(vec![1; 3 * PART_BYTES]);
        let short = seal(vec![2; 100]);
        let txn = db.begin_write().unwrap();
        {
            let mut table = Records::open(&txn).unwrap();
            let k = key(2);
            let (written, _) = table.insert(k.as_slice(), &long).unwrap();
            assert_eq!(table.parts.len().unwrap(), 3);
            let (_, replaced) = table.insert(k.as_slice(), &short).unwrap();
            assert_eq!(
                replaced, written,
                "the replaced record's bytes, parts and all"
            );
            assert_eq!(table.parts.len().unwrap(), 0);
            assert_eq!(table.get(k.as_slice()).unwrap().unwrap(), &short[..]);
            table.insert(k.as_slice(), &long).unwrap();
            assert_eq!(table.get(k.as_slice()).unwrap().unwrap(), &long[..]);
            assert_eq!(table.remove(k.as_slice()).unwrap(), written);
            assert_eq!(table.parts.len().unwrap(), 0);
            assert_eq!(table.remove(k.as_slice()).unwrap(), 0);
        }
        txn.commit().unwrap();
    }

    #[test]
    fn removing_runs_and_scattered_keys_removes_them_and_their_parts_only() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("db")).unwrap();
        // revisions 2..=200, each with sub 0 and 1, long and short records
        // mixed; a tombstone at every tenth
        let key = |main: i64, sub: i64| RevisionKey::new(Revision::new(main, sub), main % 10 == 0);
        let record = |main: i64, sub: i64| {
            let len = if (main + sub) % 3 == 0 { 9000 } else { 50 };
            seal(vec![(main + sub) as u8; len])
        };
        // dropped: sub 0 of 20..=120 (a run with kept sub 1 records inside
        // its range), and sub 1 of 150, 160, 170 (scattered)
        let dropped: Vec<RevisionKey> = (20..=120)
            .map(|m| key(m, 0))
            .chain([150, 160, 170].map(|m| key(m, 1)))
            .rev()
            .collect();
        let txn = db.begin_write().unwrap();
        {
            let mut table = Records::open(&txn).unwrap();
            let mut expected = 0;
            for main in 2..=200 {
                for sub in 0..2 {
                    let (written, _) = table
                        .insert(key(main, sub).as_slice(), &record(main, sub))
                        .unwrap();
                    if dropped.contains(&key(main, sub)) {
                        expected += written;
                    }
                }
            }
            assert_eq!(table.remove_all(&dropped).unwrap(), expected);
            for main in 2..=200 {
                for sub in 0..2 {
                    let k = key(main, sub);
                    let got = table.get(k.as_slice()).unwrap();
                    if dropped.contains(&k) {
                        assert_eq!(got, None, "{main}/{sub}");
                    } else {
                        assert_eq!(got.unwrap(), &record(main, sub)[..], "{main}/{sub}");
                    }
                }
            }
            // only the kept long records' parts are left
            let kept_long = (2..=200)
                .flat_map(|m| (0..2).map(move |s| (m, s)))
                .filter(|(m, s)| (m + s) % 3 == 0 && !dropped.contains(&key(*m, *s)))
                .count() as u64;
            assert_eq!(table.parts.len().unwrap(), 2 * kept_long);
        }
        txn.commit().unwrap();
    }

    #[test]
    fn a_missing_or_damaged_part_is_reported_as_damage_of_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("db")).unwrap();
        let long = seal(vec![3; 2 * PART_BYTES + 10]);
        let k = key(5);
        let txn = db.begin_write().unwrap();
        {
            let mut table = Records::open(&txn).unwrap();
            table.insert(k.as_slice(), &long).unwrap();
            // part 1 goes missing
            table
                .parts
                .remove(part_key(k.as_slice(), 1).as_slice())
                .unwrap();
            let err = table.get(k.as_slice()).unwrap_err();
            assert!(
                err.to_string()
                    .contains("revision 5/0 has 1 of its 2 parts"),
                "{err}"
            );
            // part 1 comes back a byte short
            table
                .parts
                .insert(
                    part_key(k.as_slice(), 1).as_slice(),
                    &[3u8; PART_BYTES - 1][..],
                )
                .unwrap();
            let err = table.get(k.as_slice()).unwrap_err();
            assert!(err.to_string().contains("damaged part 1"), "{err}");
            // part 1 whole but changed: the joined record fails its seal
            table
                .parts
                .insert(part_key(k.as_slice(), 1).as_slice(), &[4u8; PART_BYTES][..])
                .unwrap();
            let joined = table.get(k.as_slice()).unwrap().unwrap();
            assert!(unseal(&joined).is_err());
        }
        // a head whose count is damaged: refused, and removed with the
        // parts there are, without allocating or looking up its count
        let mut head = vec![0u8; 10];
        head.push(HEAD_TAG);
        head.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut table = Records::open(&txn).unwrap();
        let damaged = key(6);
        table
            .table
            .insert(damaged.as_slice(), head.as_slice())
            .unwrap();
        table
            .parts
            .insert(
                part_key(damaged.as_slice(), 0).as_slice(),
                &[1u8; PART_BYTES][..],
            )
            .unwrap();
        let err = table.get(damaged.as_slice()).unwrap_err();
        assert!(
            err.to_string().contains("has 1 of its 4294967295 parts"),
            "{err}"
        );
        let removed = table.remove(damaged.as_slice()).unwrap();
        assert_eq!(removed, 17 + head.len() + 21 + PART_BYTES);
        drop(table);
        txn.commit().unwrap();
        // a file without the parts table
        let read = db.begin_read().unwrap();
        let head = read
            .open_table(KEY_TABLE)
            .unwrap()
            .get(k.as_slice())
            .unwrap()
            .unwrap();
        let err = ReadParts(None)
            .join(k.as_slice(), head.value())
            .unwrap_err();
        assert!(err.to_string().contains("misses its 2 parts"), "{err}");
    }
}
