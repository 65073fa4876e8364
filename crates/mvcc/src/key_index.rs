//! The in-memory key index: for every key, its generations of revisions, as
//! etcd's `mvcc/key_index.go`. Values never live here; only revisions.
//!
//! A generation is a key's life from creation to deletion. Every generation but
//! the last one is non-empty and ends with its tombstone; the last one is empty
//! right after a delete. A key whose only generation is empty is removed.
//!
//! # Memory
//!
//! The index holds every key, so its size per key is most of what a member
//! needs per key beyond the redb cache. Most keys have one generation of one
//! revision (written once, or compacted down to their latest put): such a key
//! index is held inline ([`KeyIndex`] is 32 bytes, no allocation), and a key of
//! up to [`INLINE_KEY_BYTES`] bytes is held inline in its map entry (24 bytes).
//! A key with more history gets etcd's generations. The shape is canonical
//! (inline whenever it can be), so equal histories compare equal.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

use crate::revision::Revision;

/// Keys up to this many bytes live inside the map entry, without an allocation.
pub(crate) const INLINE_KEY_BYTES: usize = 22;

/// A key's bytes as the index owns them (never a slice of a request buffer,
/// which would pin the whole buffer): inline when short, boxed otherwise.
#[derive(Clone)]
enum IndexKey {
    Inline {
        len: u8,
        bytes: [u8; INLINE_KEY_BYTES],
    },
    Boxed(Box<[u8]>),
}

impl IndexKey {
    fn new(key: &[u8]) -> IndexKey {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE_KEY_BYTES => {
                let mut bytes = [0u8; INLINE_KEY_BYTES];
                bytes[..key.len()].copy_from_slice(key);
                IndexKey::Inline { len, bytes }
            }
            _ => IndexKey::Boxed(key.into()),
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            IndexKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            IndexKey::Boxed(bytes) => bytes,
        }
    }
}

// Eq, Ord and Borrow all go through the bytes, so that the map can be
// searched with a `&[u8]` and orders keys as etcd does (bytewise).
impl Borrow<[u8]> for IndexKey {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for IndexKey {
    fn eq(&self, other: &IndexKey) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for IndexKey {}

impl PartialOrd for IndexKey {
    fn partial_cmp(&self, other: &IndexKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for IndexKey {
    fn cmp(&self, other: &IndexKey) -> std::cmp::Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl std::fmt::Debug for IndexKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", Bytes::copy_from_slice(self.as_slice()))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Generation {
    /// Main revision of the put that created this generation.
    created: i64,
    /// Number of puts in this generation, including those compacted away.
    version: i64,
    revisions: Vec<Revision>,
}

/// What the index knows of a key at a revision.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyAt {
    pub modified: Revision,
    pub created: i64,
    pub version: i64,
}

/// One key's history. Always in its canonical shape (see [`KeyIndex::normalize`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyIndex {
    repr: Repr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Repr {
    /// One live generation holding one revision whose sub fits 32 bits.
    Single {
        main: i64,
        created: i64,
        version: i64,
        sub: u32,
    },
    /// Every other shape, as etcd's keyIndex: never one generation of exactly
    /// one revision with a small sub.
    Generations(Vec<Generation>),
}

impl KeyIndex {
    /// A key whose only generation holds `revision` (created at `created`,
    /// `version` puts in all).
    fn with_revision(revision: Revision, created: i64, version: i64) -> KeyIndex {
        let repr = match u32::try_from(revision.sub) {
            Ok(sub) => Repr::Single {
                main: revision.main,
                created,
                version,
                sub,
            },
            Err(_) => Repr::Generations(vec![Generation {
                created,
                version,
                revisions: vec![revision],
            }]),
        };
        KeyIndex { repr }
    }

    /// Back to the inline shape when the history fits it: after every change.
    fn normalize(&mut self) {
        let Repr::Generations(generations) = &self.repr else {
            return;
        };
        if let [generation] = generations.as_slice() {
            if let [revision] = generation.revisions.as_slice() {
                if let Ok(sub) = u32::try_from(revision.sub) {
                    self.repr = Repr::Single {
                        main: revision.main,
                        created: generation.created,
                        version: generation.version,
                        sub,
                    };
                }
            }
        }
    }

    /// The generations to change; an inline key is unpacked first (the
    /// caller normalizes afterwards).
    fn generations_mut(&mut self) -> &mut Vec<Generation> {
        if let Repr::Single {
            main,
            created,
            version,
            sub,
        } = self.repr
        {
            self.repr = Repr::Generations(vec![Generation {
                created,
                version,
                revisions: vec![Revision::new(main, i64::from(sub))],
            }]);
        }
        match &mut self.repr {
            Repr::Generations(generations) => generations,
            Repr::Single { .. } => unreachable!("unpacked above"),
        }
    }

    fn last_revision(&self) -> Option<Revision> {
        match &self.repr {
            Repr::Single { main, sub, .. } => Some(Revision::new(*main, i64::from(*sub))),
            Repr::Generations(generations) => generations
                .iter()
                .rev()
                .find_map(|g| g.revisions.last().copied()),
        }
    }

    fn put(&mut self, revision: Revision) {
        if let Some(last) = self.last_revision() {
            assert!(
                revision > last,
                "revisions only grow: put {revision:?} after {last:?}"
            );
        }
        let Some(generation) = self.generations_mut().last_mut() else {
            unreachable!("a key index always has a generation");
        };
        if generation.revisions.is_empty() {
            generation.created = revision.main;
            generation.version = 0;
        }
        generation.revisions.push(revision);
        generation.version += 1;
        self.normalize();
    }

    /// Whether the last generation is open (the key exists now).
    fn is_live(&self) -> bool {
        match &self.repr {
            Repr::Single { .. } => true,
            Repr::Generations(generations) => {
                generations.last().is_some_and(|g| !g.revisions.is_empty())
            }
        }
    }

    /// Appends a tombstone and opens an empty generation. Returns false (and
    /// changes nothing) when the key is not live.
    fn tombstone(&mut self, revision: Revision) -> bool {
        if !self.is_live() {
            return false;
        }
        self.put(revision);
        self.generations_mut().push(Generation::default());
        true
    }

    fn is_empty(&self) -> bool {
        match &self.repr {
            Repr::Single { .. } => false,
            Repr::Generations(generations) => {
                generations.len() == 1 && generations[0].revisions.is_empty()
            }
        }
    }

    /// The generation alive at `at_rev`, as etcd's findGeneration.
    fn find_generation(generations: &[Generation], at_rev: i64) -> Option<&Generation> {
        let last = generations.len() - 1;
        for (i, generation) in generations.iter().enumerate().rev() {
            let (Some(first), Some(tail)) =
                (generation.revisions.first(), generation.revisions.last())
            else {
                continue;
            };
            if i != last && tail.main <= at_rev {
                // Deleted at or before `at_rev`.
                return None;
            }
            if first.main <= at_rev {
                return Some(generation);
            }
        }
        None
    }

    pub(crate) fn get(&self, at_rev: i64) -> Option<KeyAt> {
        let generations = match &self.repr {
            Repr::Single {
                main,
                created,
                version,
                sub,
            } => {
                return (*main <= at_rev).then(|| KeyAt {
                    modified: Revision::new(*main, i64::from(*sub)),
                    created: *created,
                    version: *version,
                })
            }
            Repr::Generations(generations) => generations,
        };
        let generation = Self::find_generation(generations, at_rev)?;
        let n = generation
            .revisions
            .iter()
            .rposition(|r| r.main <= at_rev)?;
        let newer = (generation.revisions.len() - n - 1) as i64;
        Some(KeyAt {
            modified: generation.revisions[n],
            created: generation.created,
            version: generation.version - newer,
        })
    }

    /// Drops what a compaction at `at_rev` makes unreachable, pushing each
    /// dropped record's (revision, is_tombstone) onto `dropped`. Returns true
    /// when nothing of the key remains.
    fn compact(&mut self, at_rev: i64, dropped: &mut Vec<(Revision, bool)>) -> bool {
        // A single live revision is always kept: it is the key's latest.
        let Repr::Generations(generations) = &mut self.repr else {
            return false;
        };
        let mut first_kept = 0;
        while first_kept + 1 < generations.len() {
            let generation = &generations[first_kept];
            let tombstone = generation.revisions[generation.revisions.len() - 1];
            // etcd 3.5.16 keeps a tombstone at exactly the compact
            // revision (3.5.15 and older dropped it): a watch from there
            // still sees the delete, and a later compaction drops it
            if tombstone.main >= at_rev {
                break;
            }
            let n = generation.revisions.len();
            for (i, r) in generation.revisions.iter().enumerate() {
                dropped.push((*r, i + 1 == n));
            }
            first_kept += 1;
        }
        generations.drain(..first_kept);
        let generation = &mut generations[0];
        if let Some(keep) = generation.revisions.iter().rposition(|r| r.main <= at_rev) {
            dropped.extend(generation.revisions.drain(..keep).map(|r| (r, false)));
        }
        self.normalize();
        self.is_empty()
    }

    /// etcd's keyIndex.keep: the revision of this key a compaction at
    /// `at_rev` would keep, for HashKV; none when that is the tombstone
    /// ending an older generation (etcd skips it so that old and new
    /// versions hash alike).
    fn keep(&self, at_rev: i64) -> Option<Revision> {
        let generations = match &self.repr {
            Repr::Single { main, sub, .. } => {
                return (*main <= at_rev).then_some(Revision::new(*main, i64::from(*sub)))
            }
            Repr::Generations(generations) => generations,
        };
        let mut at = 0;
        while at + 1 < generations.len() {
            let tail = generations[at].revisions.last()?;
            if tail.main >= at_rev {
                break;
            }
            at += 1;
        }
        let generation = &generations[at];
        let n = generation
            .revisions
            .iter()
            .rposition(|r| r.main <= at_rev)?;
        if n + 1 == generation.revisions.len() && at + 1 != generations.len() {
            return None;
        }
        Some(generation.revisions[n])
    }

    /// Undoes every change at or after `from` (an aborted write). Returns true
    /// when nothing of the key remains.
    fn rollback(&mut self, from: Revision) -> bool {
        let generations = self.generations_mut();
        loop {
            let len = generations.len();
            let generation = &mut generations[len - 1];
            if generation.revisions.last().is_some_and(|r| *r >= from) {
                generation.revisions.pop();
                generation.version -= 1;
                continue;
            }
            if generation.revisions.is_empty()
                && len > 1
                && generations[len - 2]
                    .revisions
                    .last()
                    .is_some_and(|r| *r >= from)
            {
                generations.pop();
                continue;
            }
            break;
        }
        self.normalize();
        self.is_empty()
    }
}

/// Where a range ends, after etcd's conventions are decoded.
#[derive(Copy, Clone, Debug)]
pub(crate) enum RangeEnd<'a> {
    /// No range_end: the single key.
    Single,
    /// range_end == "\0": every key >= key.
    Unbounded,
    /// [key, end)
    Before(&'a [u8]),
}

impl<'a> RangeEnd<'a> {
    pub(crate) fn from_request(range_end: &'a [u8]) -> RangeEnd<'a> {
        match range_end {
            [] => RangeEnd::Single,
            [0] => RangeEnd::Unbounded,
            end => RangeEnd::Before(end),
        }
    }
}

/// All keys, ordered.
#[derive(Debug, Default)]
pub(crate) struct KeyIndexTree {
    keys: BTreeMap<IndexKey, KeyIndex>,
}

impl KeyIndexTree {
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Rebuilds the map with full nodes. Keys inserted one at a time leave
    /// nodes about half full (keys written in order: each split keeps half a
    /// node behind it), ~108 B per short key; a map built from sorted
    /// entries packs them (~64 B). The rebuild holds the entries twice for a
    /// moment. Called after the start's rebuild of the index.
    pub(crate) fn repack(&mut self) {
        self.keys = std::mem::take(&mut self.keys).into_iter().collect();
    }

    pub(crate) fn get(&self, key: &[u8], at_rev: i64) -> Option<KeyAt> {
        self.keys.get(key)?.get(at_rev)
    }

    pub fn put(&mut self, key: &[u8], revision: Revision) {
        match self.keys.get_mut(key) {
            Some(index) => index.put(revision),
            None => {
                let index = KeyIndex::with_revision(revision, revision.main, 1);
                self.keys.insert(IndexKey::new(key), index);
            }
        }
    }

    /// Rebuild path: the first record seen of a key after compaction may be in
    /// the middle of a generation, so its created revision and version come
    /// from the record itself.
    pub(crate) fn restore(&mut self, key: &[u8], revision: Revision, created: i64, version: i64) {
        match self.keys.get_mut(key) {
            Some(index) => index.put(revision),
            None => {
                let index = KeyIndex::with_revision(revision, created, version);
                self.keys.insert(IndexKey::new(key), index);
            }
        }
    }

    /// Rebuild path for a tombstone: it ends the key's generation; one of
    /// a key with no record before it (a compaction at exactly its
    /// revision kept only the tombstone, as etcd 3.5.16 does) is kept the
    /// same way, so that the next compaction drops it from the file.
    pub(crate) fn restore_tombstone(&mut self, key: &[u8], revision: Revision) {
        if self.tombstone(key, revision) || self.keys.contains_key(key) {
            return;
        }
        let ended = Generation {
            created: revision.main,
            version: 1,
            revisions: vec![revision],
        };
        let index = KeyIndex {
            repr: Repr::Generations(vec![ended, Generation::default()]),
        };
        self.keys.insert(IndexKey::new(key), index);
    }

    /// Returns false when the key is not live (nothing changes).
    pub(crate) fn tombstone(&mut self, key: &[u8], revision: Revision) -> bool {
        self.keys
            .get_mut(key)
            .is_some_and(|index| index.tombstone(revision))
    }

    fn walk<'s>(
        &'s self,
        key: &'s [u8],
        end: RangeEnd<'s>,
    ) -> Box<dyn Iterator<Item = (&'s IndexKey, &'s KeyIndex)> + 's> {
        match end {
            RangeEnd::Single => Box::new(self.keys.get_key_value(key).into_iter()),
            RangeEnd::Unbounded => Box::new(
                self.keys
                    .range::<[u8], _>((Bound::Included(key), Bound::Unbounded)),
            ),
            RangeEnd::Before(end) if end <= key => Box::new(std::iter::empty()),
            RangeEnd::Before(end) => Box::new(
                self.keys
                    .range::<[u8], _>((Bound::Included(key), Bound::Excluded(end))),
            ),
        }
    }

    /// Revisions of the keys live at `at_rev` in the range, in key order: at
    /// most `limit` of them (0 = all), plus the count of all live keys.
    pub(crate) fn revisions(
        &self,
        key: &[u8],
        end: RangeEnd<'_>,
        at_rev: i64,
        limit: usize,
        count_only: bool,
    ) -> (Vec<Revision>, usize) {
        let mut revisions = Vec::new();
        let mut count = 0;
        for (_, index) in self.walk(key, end) {
            if let Some(at) = index.get(at_rev) {
                count += 1;
                if !count_only && (limit == 0 || revisions.len() < limit) {
                    revisions.push(at.modified);
                }
            }
        }
        (revisions, count)
    }

    /// Keys live at `at_rev` in the range, in key order.
    pub(crate) fn live_keys(&self, key: &[u8], end: RangeEnd<'_>, at_rev: i64) -> Vec<Bytes> {
        self.walk(key, end)
            .filter(|(_, index)| index.get(at_rev).is_some())
            .map(|(key, _)| Bytes::copy_from_slice(key.as_slice()))
            .collect()
    }

    /// etcd's keyIndex Keep over every key: what a compaction at `at_rev`
    /// would keep, as HashKV filters compacted revisions with it.
    pub(crate) fn keep(&self, at_rev: i64) -> std::collections::HashSet<Revision> {
        self.keys
            .values()
            .filter_map(|index| index.keep(at_rev))
            .collect()
    }

    /// Compacts every key at `at_rev`; returns the dropped records.
    pub fn compact(&mut self, at_rev: i64) -> Vec<(Revision, bool)> {
        let mut dropped = Vec::new();
        self.keys
            .retain(|_, index| !index.compact(at_rev, &mut dropped));
        dropped
    }

    /// [`KeyIndexTree::compact`] of the next `limit` keys after `after`
    /// (from the first key when None), their dropped revisions appended to
    /// `dropped`: the last key compacted when keys remain after it. A
    /// compaction in such steps, writes going on between them, drops what
    /// one step would: a compaction considers only revisions at or below
    /// `at_rev`, which are all in the index already.
    pub(crate) fn compact_from(
        &mut self,
        at_rev: i64,
        after: Option<&[u8]>,
        limit: usize,
        dropped: &mut Vec<(Revision, bool)>,
    ) -> Option<Vec<u8>> {
        use std::ops::Bound;
        let lower = match after {
            Some(key) => Bound::Excluded(key),
            None => Bound::Unbounded,
        };
        let mut emptied = Vec::new();
        let mut last: Option<&IndexKey> = None;
        let mut more = false;
        for (n, (key, index)) in self
            .keys
            .range_mut::<[u8], _>((lower, Bound::Unbounded))
            .enumerate()
        {
            if n == limit.max(1) {
                more = true;
                break;
            }
            if index.compact(at_rev, dropped) {
                emptied.push(key.clone());
            }
            last = Some(key);
        }
        let cursor = more.then(|| last.map(|k| k.as_slice().to_vec())).flatten();
        for key in emptied {
            self.keys.remove(&key);
        }
        cursor
    }

    /// Undoes the changes at or after `from` to the given keys.
    pub(crate) fn rollback<'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k [u8]>,
        from: Revision,
    ) {
        for key in keys {
            if self
                .keys
                .get_mut(key)
                .is_some_and(|index| index.rollback(from))
            {
                self.keys.remove(key);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn key_index(&self, key: &[u8]) -> Option<&KeyIndex> {
        self.keys.get(key)
    }
}

/// Writes `v` as a LEB128 varint (protobuf's).
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// From this many keys on, [`KeyIndexTree::encode`] encodes on two threads.
const PARALLEL_ENCODE_KEYS: usize = 100_000;

/// [`KeyIndexTree::encode`] hands its bytes on in pieces of about this
/// size, from one buffer it reuses.
const ENCODE_PIECE_BYTES: usize = 64 * 1024;

/// Appends `entries` to `out` as [`KeyIndexTree::encode`] lays out each key
/// (the first one's bytes after those it shares with `previous`, the key
/// before it), handing `out` to `sink` (and clearing it) whenever it holds
/// `piece_bytes`.
fn encode_entries<'a, E>(
    entries: impl Iterator<Item = (&'a IndexKey, &'a KeyIndex)>,
    mut previous: &'a [u8],
    out: &mut Vec<u8>,
    piece_bytes: usize,
    sink: &mut impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let mut entries = entries.peekable();
    let mut batch: Vec<(&IndexKey, &KeyIndex)> = Vec::with_capacity(ENCODE_BATCH);
    while entries.peek().is_some() {
        batch.clear();
        batch.extend(entries.by_ref().take(ENCODE_BATCH));
        // Load each key's history before encoding any: the loads do not
        // depend on each other, so the processor has many in flight at once
        // where the encoding would wait for each in turn.
        let mut touched = 0i64;
        for (_, index) in &batch {
            if let Repr::Generations(generations) = &index.repr {
                touched ^= generations.first().map_or(0, |g| g.created);
            }
        }
        for (_, index) in &batch {
            if let Repr::Generations(generations) = &index.repr {
                let first = generations.first().and_then(|g| g.revisions.first());
                touched ^= first.map_or(0, |r| r.main);
            }
        }
        std::hint::black_box(touched);
        previous = encode_batch(&batch, previous, out, piece_bytes, sink)?;
    }
    Ok(())
}

/// Keys [`encode_entries`] loads ahead of encoding them.
const ENCODE_BATCH: usize = 64;

/// Appends `batch` as [`encode_entries`] does; the last key.
fn encode_batch<'a, E>(
    batch: &[(&'a IndexKey, &'a KeyIndex)],
    mut previous: &'a [u8],
    out: &mut Vec<u8>,
    piece_bytes: usize,
    sink: &mut impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<&'a [u8], E> {
    for &(key, index) in batch {
        let key = key.as_slice();
        let shared = key.iter().zip(previous).take_while(|(a, b)| a == b).count();
        put_varint(out, shared as u64);
        put_varint(out, (key.len() - shared) as u64);
        out.extend_from_slice(&key[shared..]);
        previous = key;
        match &index.repr {
            Repr::Single {
                main,
                created,
                version,
                sub,
            } => {
                out.push(0);
                put_signed(out, *main);
                put_signed(out, *created);
                put_signed(out, *version);
                put_varint(out, u64::from(*sub));
            }
            Repr::Generations(generations) => {
                out.push(1);
                put_varint(out, generations.len() as u64);
                for generation in generations {
                    put_signed(out, generation.created);
                    put_signed(out, generation.version);
                    put_varint(out, generation.revisions.len() as u64);
                    for revision in &generation.revisions {
                        put_signed(out, revision.main);
                        put_signed(out, revision.sub);
                    }
                }
            }
        }
        if out.len() >= piece_bytes {
            sink(out)?;
            out.clear();
        }
    }
    Ok(previous)
}

/// Writes `v` zigzag-encoded (small negatives stay short).
pub(crate) fn put_signed(out: &mut Vec<u8>, v: i64) {
    put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Reads what [`put_varint`] and [`put_signed`] wrote, bounds-checked.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, pos: 0 }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.pos == self.bytes.len()
    }

    pub(crate) fn varint(&mut self) -> Result<u64, String> {
        crate::backend::read_varint(self.bytes, &mut self.pos).map_err(|e| e.to_string())
    }

    pub(crate) fn signed(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    /// A count of items that each take at least one byte (so a damaged
    /// count cannot make the caller reserve more than the bytes left).
    pub(crate) fn count(&mut self) -> Result<usize, String> {
        let n = self.varint()?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.bytes.len() - self.pos)
            .ok_or_else(|| format!("count {n} past the end"))
    }

    pub(crate) fn slice(&mut self) -> Result<&'a [u8], String> {
        let len = self.count()?;
        let slice = &self.bytes[self.pos..self.pos + len];
        self.pos += len;
        Ok(slice)
    }

    fn byte(&mut self) -> Result<u8, String> {
        let byte = *self.bytes.get(self.pos).ok_or("truncated")?;
        self.pos += 1;
        Ok(byte)
    }
}

impl KeyIndexTree {
    /// Encodes the whole index ([`KeyIndexTree::decode`] reads it back as
    /// it was): the number of keys, then for each key in order the length
    /// of the prefix it shares with the key before it, the rest of its
    /// bytes, and its history in its exact shape.
    ///
    /// The bytes go to `sink` in order, in pieces, from a buffer reused
    /// throughout (an index of 524,288 keys takes ~10 MB, and memory new to
    /// the process costs a page fault per 4 KiB). A large index's upper
    /// half is encoded on a second thread meanwhile: the walk waits on
    /// memory, and it is most of a stop.
    pub(crate) fn encode<E>(&self, sink: &mut impl FnMut(&[u8]) -> Result<(), E>) -> Result<(), E> {
        let n = self.keys.len();
        let mut out = Vec::with_capacity(ENCODE_PIECE_BYTES * 2);
        put_varint(&mut out, n as u64);
        if n < PARALLEL_ENCODE_KEYS {
            encode_entries(self.keys.iter(), &[], &mut out, ENCODE_PIECE_BYTES, sink)?;
            return if out.is_empty() { Ok(()) } else { sink(&out) };
        }
        let middle = self.keys.keys().nth(n / 2).expect("n > 0").as_slice();
        let upper = (Bound::Included(middle), Bound::Unbounded);
        let lower = (Bound::Unbounded, Bound::Excluded(middle));
        let before_middle = self.keys.range::<[u8], _>(lower).next_back();
        let before_middle = before_middle.map_or(&[][..], |(key, _)| key.as_slice());
        // all of it in one buffer, handed over at the end
        let encode_upper = || {
            let mut part = Vec::new();
            let mut unused = |_: &[u8]| Ok::<(), std::convert::Infallible>(());
            let entries = self.keys.range::<[u8], _>(upper);
            let Ok(()) = encode_entries(entries, before_middle, &mut part, usize::MAX, &mut unused);
            part
        };
        std::thread::scope(|scope| {
            let spawned = std::thread::Builder::new()
                .name("index-encode".into())
                .spawn_scoped(scope, encode_upper);
            let entries = self.keys.range::<[u8], _>(lower);
            encode_entries(entries, &[], &mut out, ENCODE_PIECE_BYTES, sink)?;
            sink(&out)?;
            let upper_bytes = match spawned {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                // no thread to be had: the upper half here too
                Err(_) => encode_upper(),
            };
            sink(&upper_bytes)
        })
    }

    /// The index as checkpoint format 1 laid it out, each key whole.
    #[cfg(test)]
    pub(crate) fn encode_whole_keys(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, self.keys.len() as u64);
        for (key, index) in &self.keys {
            let mut one = Vec::new();
            let mut unused = |_: &[u8]| Ok::<(), std::convert::Infallible>(());
            let Ok(()) = encode_entries(
                [(key, index)].into_iter(),
                &[],
                &mut one,
                usize::MAX,
                &mut unused,
            );
            // after the key's prefix shared with nothing (a 0), as format 1
            assert_eq!(one[0], 0);
            out.extend_from_slice(&one[1..]);
        }
        out
    }

    /// Reads an index [`KeyIndexTree::encode`] wrote, or with `whole_keys`
    /// one written before keys shared their prefixes (each key's length and
    /// bytes). Refuses keys out of order, a key without a generation or
    /// with revisions that do not grow: what a scan of the file could never
    /// have built.
    pub(crate) fn decode(
        reader: &mut Reader<'_>,
        whole_keys: bool,
    ) -> Result<KeyIndexTree, String> {
        let n = reader.count()?;
        let mut entries: Vec<(IndexKey, KeyIndex)> = Vec::with_capacity(n);
        let mut key = Vec::new();
        for _ in 0..n {
            let shared = if whole_keys {
                0
            } else {
                usize::try_from(reader.varint()?)
                    .ok()
                    .filter(|shared| *shared <= key.len())
                    .ok_or("a shared prefix longer than the key before")?
            };
            key.truncate(shared);
            key.extend_from_slice(reader.slice()?);
            if let Some((last, _)) = entries.last() {
                if last.as_slice() >= key.as_slice() {
                    return Err("keys out of order".into());
                }
            }
            let index = match reader.byte()? {
                0 => {
                    let (main, created, version) =
                        (reader.signed()?, reader.signed()?, reader.signed()?);
                    let sub = u32::try_from(reader.varint()?).map_err(|_| "sub past 32 bits")?;
                    KeyIndex {
                        repr: Repr::Single {
                            main,
                            created,
                            version,
                            sub,
                        },
                    }
                }
                1 => {
                    let count = reader.count()?;
                    if count == 0 {
                        return Err("a key without a generation".into());
                    }
                    let mut generations = Vec::with_capacity(count);
                    let mut last: Option<Revision> = None;
                    for _ in 0..count {
                        let (created, version) = (reader.signed()?, reader.signed()?);
                        let revisions_len = reader.count()?;
                        let mut revisions = Vec::with_capacity(revisions_len);
                        for _ in 0..revisions_len {
                            let revision = Revision::new(reader.signed()?, reader.signed()?);
                            if last.is_some_and(|last| revision <= last) {
                                return Err("revisions that do not grow".into());
                            }
                            last = Some(revision);
                            revisions.push(revision);
                        }
                        generations.push(Generation {
                            created,
                            version,
                            revisions,
                        });
                    }
                    let mut index = KeyIndex {
                        repr: Repr::Generations(generations),
                    };
                    index.normalize();
                    index
                }
                shape => return Err(format!("unknown key shape {shape}")),
            };
            entries.push((IndexKey::new(&key), index));
        }
        // sorted already: a bulk build, full nodes (as `repack`)
        Ok(KeyIndexTree {
            keys: entries.into_iter().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    /// The history of etcd's TestKeyIndexGet: puts at 2,4,6, delete at 8,
    /// puts at 10,12, delete 14, puts 16..
    fn etcd_history() -> KeyIndexTree {
        let mut tree = KeyIndexTree::default();
        tree.put(b"foo", rev(2));
        tree.put(b"foo", rev(4));
        tree.put(b"foo", rev(6));
        assert!(tree.tombstone(b"foo", rev(8)));
        tree.put(b"foo", rev(10));
        tree.put(b"foo", rev(12));
        assert!(tree.tombstone(b"foo", rev(14)));
        tree.put(b"foo", rev(16));
        tree
    }

    #[test]
    fn key_index_get_follows_generations() {
        let tree = etcd_history();
        let at = |r| {
            tree.get(b"foo", r)
                .map(|a| (a.modified.main, a.created, a.version))
        };
        assert_eq!(at(1), None);
        assert_eq!(at(2), Some((2, 2, 1)));
        assert_eq!(at(7), Some((6, 2, 3)));
        assert_eq!(at(8), None, "tombstone hides the key");
        assert_eq!(at(9), None);
        assert_eq!(at(11), Some((10, 10, 1)));
        assert_eq!(at(13), Some((12, 10, 2)));
        assert_eq!(at(14), None);
        assert_eq!(at(17), Some((16, 16, 1)));
    }

    #[test]
    fn key_index_tombstone_of_missing_key_is_refused() {
        let mut tree = KeyIndexTree::default();
        assert!(!tree.tombstone(b"foo", rev(2)));
        tree.put(b"foo", rev(3));
        assert!(tree.tombstone(b"foo", rev(4)));
        assert!(!tree.tombstone(b"foo", rev(5)));
    }

    #[test]
    #[should_panic(expected = "revisions only grow")]
    fn key_index_put_with_smaller_revision_panics() {
        let mut tree = KeyIndexTree::default();
        tree.put(b"foo", rev(3));
        tree.put(b"foo", rev(2));
    }

    #[test]
    fn key_index_compact_keeps_latest_revision_at_compaction_point() {
        let mut tree = etcd_history();
        let dropped = tree.compact(5);
        assert_eq!(dropped, vec![(rev(2), false)]);
        assert_eq!(
            tree.get(b"foo", 5).map(|a| (a.modified.main, a.version)),
            Some((4, 2))
        );
        assert_eq!(tree.get(b"foo", 7).map(|a| a.version), Some(3));

        // Compacting at the tombstone drops the generation but its
        // tombstone (etcd 3.5.16).
        let dropped = tree.compact(8);
        assert_eq!(dropped, vec![(rev(4), false), (rev(6), false)]);
        assert_eq!(tree.get(b"foo", 11).map(|a| a.created), Some(10));

        let dropped = tree.compact(15);
        assert_eq!(
            dropped,
            vec![
                (rev(8), true),
                (rev(10), false),
                (rev(12), false),
                (rev(14), true)
            ]
        );
        assert!(tree.key_index(b"foo").is_some());
        assert_eq!(tree.compact(100), vec![]);
    }

    #[test]
    fn key_index_compact_keeps_a_tombstone_at_the_compact_revision_then_drops_it() {
        let mut tree = KeyIndexTree::default();
        tree.put(b"foo", rev(2));
        assert!(tree.tombstone(b"foo", rev(3)));
        // etcd 3.5.16: the tombstone at exactly the compact revision stays
        let dropped = tree.compact(3);
        assert_eq!(dropped, vec![(rev(2), false)]);
        assert_eq!(tree.len(), 1);
        assert!(tree.live_keys(b"foo", RangeEnd::Single, 3).is_empty());
        // compacting past it drops it and the key
        let dropped = tree.compact(4);
        assert_eq!(dropped, vec![(rev(3), true)]);
        assert_eq!(tree.len(), 0);
    }

    #[test]
    fn key_index_rollback_restores_previous_state() {
        let mut tree = etcd_history();
        let before = tree.key_index(b"foo").cloned();
        tree.put(b"foo", Revision::new(20, 0));
        assert!(tree.tombstone(b"foo", Revision::new(20, 1)));
        tree.put(b"foo", Revision::new(20, 2));
        tree.put(b"bar", Revision::new(20, 3));
        tree.rollback([&b"foo"[..], &b"bar"[..]], Revision::new(20, 0));
        assert_eq!(tree.key_index(b"foo").cloned(), before);
        assert!(tree.key_index(b"bar").is_none());
    }

    #[test]
    fn key_index_memory_layout_stays_compact() {
        assert_eq!(std::mem::size_of::<IndexKey>(), 24);
        assert_eq!(std::mem::size_of::<KeyIndex>(), 32);
    }

    #[test]
    fn inline_and_boxed_keys_order_bytewise() {
        let short = vec![b'k'; INLINE_KEY_BYTES];
        let long = vec![b'k'; INLINE_KEY_BYTES + 1];
        let mut tree = KeyIndexTree::default();
        tree.put(&long, rev(2));
        tree.put(&short, rev(3));
        tree.put(b"", rev(4));
        tree.put(b"l", rev(5));
        assert!(matches!(
            tree.keys.first_key_value(),
            Some((IndexKey::Inline { len: 0, .. }, _))
        ));
        let keys = tree.live_keys(b"", RangeEnd::Unbounded, 10);
        assert_eq!(
            keys,
            vec![
                Bytes::new(),
                Bytes::from(short.clone()),
                Bytes::from(long.clone()),
                Bytes::from_static(b"l")
            ]
        );
        assert_eq!(tree.get(&long, 10).map(|a| a.modified), Some(rev(2)));
        assert_eq!(tree.get(&short, 10).map(|a| a.modified), Some(rev(3)));
        assert!(tree.get(&long[..INLINE_KEY_BYTES - 1], 10).is_none());
    }

    #[test]
    fn key_index_shape_is_canonical() {
        // A key compacted down to one revision is stored as one written once.
        let mut tree = KeyIndexTree::default();
        tree.put(b"foo", rev(2));
        tree.put(b"foo", rev(3));
        assert!(matches!(
            tree.key_index(b"foo").map(|k| &k.repr),
            Some(Repr::Generations(_))
        ));
        assert_eq!(tree.compact(3), vec![(rev(2), false)]);
        let mut restored = KeyIndexTree::default();
        restored.restore(b"foo", rev(3), 2, 2);
        assert_eq!(tree.key_index(b"foo"), restored.key_index(b"foo"));
        assert!(matches!(
            tree.key_index(b"foo").map(|k| &k.repr),
            Some(Repr::Single { .. })
        ));

        // A sub revision beyond 32 bits keeps the general shape.
        let big = Revision::new(5, i64::from(u32::MAX) + 1);
        tree.put(b"bar", big);
        assert!(matches!(
            tree.key_index(b"bar").map(|k| &k.repr),
            Some(Repr::Generations(_))
        ));
        assert_eq!(
            tree.get(b"bar", 5).map(|a| (a.modified, a.version)),
            Some((big, 1))
        );
        tree.rollback([&b"bar"[..]], big);
        assert!(tree.key_index(b"bar").is_none());
    }

    #[test]
    fn range_end_conventions() {
        let mut tree = KeyIndexTree::default();
        for (i, k) in [&b"a"[..], b"b", b"c"].iter().enumerate() {
            tree.put(k, rev(i as i64 + 1));
        }
        let keys = |k: &[u8], e: &[u8]| tree.live_keys(k, RangeEnd::from_request(e), 10).len();
        assert_eq!(keys(b"b", b""), 1);
        assert_eq!(keys(b"a", b"c"), 2);
        assert_eq!(keys(b"b", b"\0"), 2);
        assert_eq!(keys(b"\0", b"\0"), 3);
        assert_eq!(keys(b"c", b"a"), 0, "inverted range is empty");
    }
}
