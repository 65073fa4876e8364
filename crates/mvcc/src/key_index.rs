//! The in-memory key index: for every key, its generations of revisions, as
//! etcd's `mvcc/key_index.go`. Values never live here; only revisions.
//!
//! A generation is a key's life from creation to deletion. Every generation but
//! the last one is non-empty and ends with its tombstone; the last one is empty
//! right after a delete. A key whose only generation is empty is removed.

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

use crate::revision::Revision;

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
pub struct KeyAt {
    pub modified: Revision,
    pub created: i64,
    pub version: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyIndex {
    generations: Vec<Generation>,
}

impl KeyIndex {
    fn new() -> KeyIndex {
        KeyIndex {
            generations: vec![Generation::default()],
        }
    }

    fn last_revision(&self) -> Option<Revision> {
        self.generations
            .iter()
            .rev()
            .find_map(|g| g.revisions.last().copied())
    }

    fn put(&mut self, revision: Revision) {
        if let Some(last) = self.last_revision() {
            assert!(
                revision > last,
                "revisions only grow: put {revision:?} after {last:?}"
            );
        }
        let Some(generation) = self.generations.last_mut() else {
            unreachable!("a key index always has a generation");
        };
        if generation.revisions.is_empty() {
            generation.created = revision.main;
            generation.version = 0;
        }
        generation.revisions.push(revision);
        generation.version += 1;
    }

    /// Appends a tombstone and opens an empty generation. Returns false (and
    /// changes nothing) when the key is not live.
    fn tombstone(&mut self, revision: Revision) -> bool {
        if self
            .generations
            .last()
            .is_none_or(|g| g.revisions.is_empty())
        {
            return false;
        }
        self.put(revision);
        self.generations.push(Generation::default());
        true
    }

    fn is_empty(&self) -> bool {
        self.generations.len() == 1 && self.generations[0].revisions.is_empty()
    }

    /// The generation alive at `at_rev`, as etcd's findGeneration.
    fn find_generation(&self, at_rev: i64) -> Option<&Generation> {
        let last = self.generations.len() - 1;
        for (i, generation) in self.generations.iter().enumerate().rev() {
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

    pub fn get(&self, at_rev: i64) -> Option<KeyAt> {
        let generation = self.find_generation(at_rev)?;
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
        let mut first_kept = 0;
        while first_kept + 1 < self.generations.len() {
            let generation = &self.generations[first_kept];
            let tombstone = generation.revisions[generation.revisions.len() - 1];
            if tombstone.main > at_rev {
                break;
            }
            let n = generation.revisions.len();
            for (i, r) in generation.revisions.iter().enumerate() {
                dropped.push((*r, i + 1 == n));
            }
            first_kept += 1;
        }
        self.generations.drain(..first_kept);
        let generation = &mut self.generations[0];
        if let Some(keep) = generation.revisions.iter().rposition(|r| r.main <= at_rev) {
            dropped.extend(generation.revisions.drain(..keep).map(|r| (r, false)));
        }
        self.is_empty()
    }

    /// Undoes every change at or after `from` (an aborted write). Returns true
    /// when nothing of the key remains.
    fn rollback(&mut self, from: Revision) -> bool {
        loop {
            let len = self.generations.len();
            let generation = &mut self.generations[len - 1];
            if generation.revisions.last().is_some_and(|r| *r >= from) {
                generation.revisions.pop();
                generation.version -= 1;
                continue;
            }
            if generation.revisions.is_empty()
                && len > 1
                && self.generations[len - 2]
                    .revisions
                    .last()
                    .is_some_and(|r| *r >= from)
            {
                self.generations.pop();
                continue;
            }
            break;
        }
        self.is_empty()
    }
}

/// Where a range ends, after etcd's conventions are decoded.
#[derive(Copy, Clone, Debug)]
pub enum RangeEnd<'a> {
    /// No range_end: the single key.
    Single,
    /// range_end == "\0": every key >= key.
    Unbounded,
    /// [key, end)
    Before(&'a [u8]),
}

impl<'a> RangeEnd<'a> {
    pub fn from_request(range_end: &'a [u8]) -> RangeEnd<'a> {
        match range_end {
            [] => RangeEnd::Single,
            [0] => RangeEnd::Unbounded,
            end => RangeEnd::Before(end),
        }
    }
}

/// All keys, ordered. Owns only copied key bytes (never a slice of a request
/// buffer, which would pin the whole buffer).
#[derive(Debug, Default)]
pub struct KeyIndexTree {
    keys: BTreeMap<Bytes, KeyIndex>,
}

impl KeyIndexTree {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn get(&self, key: &[u8], at_rev: i64) -> Option<KeyAt> {
        self.keys.get(key)?.get(at_rev)
    }

    pub fn put(&mut self, key: &[u8], revision: Revision) {
        match self.keys.get_mut(key) {
            Some(index) => index.put(revision),
            None => {
                let mut index = KeyIndex::new();
                index.put(revision);
                self.keys.insert(Bytes::copy_from_slice(key), index);
            }
        }
    }

    /// Rebuild path: the first record seen of a key after compaction may be in
    /// the middle of a generation, so its created revision and version come
    /// from the record itself.
    pub fn restore(&mut self, key: &[u8], revision: Revision, created: i64, version: i64) {
        match self.keys.get_mut(key) {
            Some(index) => index.put(revision),
            None => {
                let index = KeyIndex {
                    generations: vec![Generation {
                        created,
                        version,
                        revisions: vec![revision],
                    }],
                };
                self.keys.insert(Bytes::copy_from_slice(key), index);
            }
        }
    }

    /// Returns false when the key is not live (nothing changes).
    pub fn tombstone(&mut self, key: &[u8], revision: Revision) -> bool {
        self.keys
            .get_mut(key)
            .is_some_and(|index| index.tombstone(revision))
    }

    fn walk<'s>(
        &'s self,
        key: &'s [u8],
        end: RangeEnd<'s>,
    ) -> Box<dyn Iterator<Item = (&'s Bytes, &'s KeyIndex)> + 's> {
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
    pub fn revisions(
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
    pub fn live_keys(&self, key: &[u8], end: RangeEnd<'_>, at_rev: i64) -> Vec<Bytes> {
        self.walk(key, end)
            .filter(|(_, index)| index.get(at_rev).is_some())
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Compacts every key at `at_rev`; returns the dropped records.
    pub fn compact(&mut self, at_rev: i64) -> Vec<(Revision, bool)> {
        let mut dropped = Vec::new();
        self.keys
            .retain(|_, index| !index.compact(at_rev, &mut dropped));
        dropped
    }

    /// Undoes the changes at or after `from` to the given keys.
    pub fn rollback<'k>(&mut self, keys: impl IntoIterator<Item = &'k [u8]>, from: Revision) {
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
    pub fn key_index(&self, key: &[u8]) -> Option<&KeyIndex> {
        self.keys.get(key)
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

        // Compacting at the tombstone drops the whole generation.
        let dropped = tree.compact(8);
        assert_eq!(
            dropped,
            vec![(rev(4), false), (rev(6), false), (rev(8), true)]
        );
        assert_eq!(tree.get(b"foo", 11).map(|a| a.created), Some(10));

        let dropped = tree.compact(15);
        assert_eq!(
            dropped,
            vec![(rev(10), false), (rev(12), false), (rev(14), true)]
        );
        assert!(tree.key_index(b"foo").is_some());
        assert_eq!(tree.compact(100), vec![]);
    }

    #[test]
    fn key_index_compact_removes_key_whose_latest_is_a_tombstone() {
        let mut tree = KeyIndexTree::default();
        tree.put(b"foo", rev(2));
        assert!(tree.tombstone(b"foo", rev(3)));
        let dropped = tree.compact(3);
        assert_eq!(dropped, vec![(rev(2), false), (rev(3), true)]);
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
