//! Which watchers a key reaches: single-key watchers in a hash map, range
//! watchers grouped by identical range in a map ordered by range start.
//!
//! A lookup costs one hash probe plus one check per *distinct* range whose
//! start is at or before the key. Clients watch few distinct ranges (a
//! thousand watchers of one prefix are one entry), so this stays cheap on the
//! apply path without an interval tree.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::Bytes;

/// A watcher's process-wide identity (never reused).
pub(crate) type Gid = u64;

/// Where a watched range ends, after etcd's conventions are decoded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WatchEnd {
    /// Exactly `key`.
    Key,
    /// Every key >= `key` (range_end "\0").
    FromKey,
    /// [key, end)
    Before(Bytes),
}

impl WatchEnd {
    /// Decodes a request's range_end; None when the range is empty
    /// (end <= key), which etcd refuses.
    pub(crate) fn from_request(key: &[u8], range_end: &[u8]) -> Option<WatchEnd> {
        match range_end {
            [] => Some(WatchEnd::Key),
            [0] => Some(WatchEnd::FromKey),
            end if end <= key => None,
            end => Some(WatchEnd::Before(Bytes::copy_from_slice(end))),
        }
    }
}

/// A set of watchers indexed by what they watch.
#[derive(Default)]
pub(crate) struct KeyGroup {
    keys: HashMap<Bytes, HashSet<Gid>>,
    /// range start → (FromKey = None / Before(end) = Some(end)) → watchers
    ranges: BTreeMap<Bytes, HashMap<Option<Bytes>, HashSet<Gid>>>,
    len: usize,
}

impl KeyGroup {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn add(&mut self, gid: Gid, key: &Bytes, end: &WatchEnd) {
        let inserted = match end {
            WatchEnd::Key => self.keys.entry(key.clone()).or_default().insert(gid),
            WatchEnd::FromKey | WatchEnd::Before(_) => self
                .ranges
                .entry(key.clone())
                .or_default()
                .entry(range_end(end))
                .or_default()
                .insert(gid),
        };
        debug_assert!(inserted, "a watcher is added to a group once");
        self.len += usize::from(inserted);
    }

    /// Returns whether the watcher was in the group.
    pub(crate) fn remove(&mut self, gid: Gid, key: &Bytes, end: &WatchEnd) -> bool {
        let removed = match end {
            WatchEnd::Key => match self.keys.get_mut(key) {
                Some(set) => {
                    let removed = set.remove(&gid);
                    if set.is_empty() {
                        self.keys.remove(key);
                    }
                    removed
                }
                None => false,
            },
            WatchEnd::FromKey | WatchEnd::Before(_) => {
                let Some(by_end) = self.ranges.get_mut(key) else {
                    return false;
                };
                let end = range_end(end);
                let removed = match by_end.get_mut(&end) {
                    Some(set) => {
                        let removed = set.remove(&gid);
                        if set.is_empty() {
                            by_end.remove(&end);
                        }
                        removed
                    }
                    None => false,
                };
                if by_end.is_empty() {
                    self.ranges.remove(key);
                }
                removed
            }
        };
        self.len -= usize::from(removed);
        removed
    }

    /// Calls `f` once for each watcher whose range holds `key`.
    pub(crate) fn for_each_match(&self, key: &[u8], mut f: impl FnMut(Gid)) {
        if let Some(set) = self.keys.get(key) {
            set.iter().copied().for_each(&mut f);
        }
        for (start, by_end) in self
            .ranges
            .range::<[u8], _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(key)))
        {
            for (end, set) in by_end {
                let inside = match end {
                    None => true,
                    Some(end) => key < &end[..],
                };
                debug_assert!(key >= &start[..]);
                if inside {
                    set.iter().copied().for_each(&mut f);
                }
            }
        }
    }

    /// Whether any watcher's range holds `key`.
    pub(crate) fn matches(&self, key: &[u8]) -> bool {
        let mut found = false;
        self.for_each_match(key, |_| found = true);
        found
    }
}

fn range_end(end: &WatchEnd) -> Option<Bytes> {
    match end {
        WatchEnd::Before(end) => Some(end.clone()),
        WatchEnd::Key | WatchEnd::FromKey => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matching(group: &KeyGroup, key: &[u8]) -> Vec<Gid> {
        let mut got = Vec::new();
        group.for_each_match(key, |g| got.push(g));
        got.sort_unstable();
        got
    }

    #[test]
    fn key_group_matches_keys_prefixes_and_open_ranges() {
        let mut group = KeyGroup::default();
        let foo = Bytes::from_static(b"foo");
        let a = Bytes::from_static(b"a");
        group.add(1, &foo, &WatchEnd::Key);
        group.add(2, &foo, &WatchEnd::Before(Bytes::from_static(b"fop")));
        group.add(3, &foo, &WatchEnd::Before(Bytes::from_static(b"fop")));
        group.add(4, &a, &WatchEnd::FromKey);
        group.add(5, &a, &WatchEnd::Before(Bytes::from_static(b"b")));
        assert_eq!(group.len(), 5);
        assert_eq!(matching(&group, b"foo"), vec![1, 2, 3, 4]);
        assert_eq!(matching(&group, b"foo1"), vec![2, 3, 4]);
        assert_eq!(matching(&group, b"fop"), vec![4]);
        assert_eq!(matching(&group, b"a"), vec![4, 5]);
        assert_eq!(matching(&group, b"0"), Vec::<Gid>::new());

        assert!(group.remove(2, &foo, &WatchEnd::Before(Bytes::from_static(b"fop"))));
        assert!(!group.remove(2, &foo, &WatchEnd::Before(Bytes::from_static(b"fop"))));
        assert!(group.remove(1, &foo, &WatchEnd::Key));
        assert_eq!(matching(&group, b"foo"), vec![3, 4]);
        for (gid, key, end) in [
            (3, &foo, WatchEnd::Before(Bytes::from_static(b"fop"))),
            (4, &a, WatchEnd::FromKey),
            (5, &a, WatchEnd::Before(Bytes::from_static(b"b"))),
        ] {
            assert!(group.remove(gid, key, &end));
        }
        assert!(group.is_empty());
        assert!(group.keys.is_empty() && group.ranges.is_empty());
    }

    #[test]
    fn watch_end_refuses_empty_ranges_as_etcd() {
        assert_eq!(WatchEnd::from_request(b"b", b"a"), None);
        assert_eq!(WatchEnd::from_request(b"b", b"b"), None);
        assert_eq!(WatchEnd::from_request(b"b", b"\0"), Some(WatchEnd::FromKey));
        assert_eq!(WatchEnd::from_request(b"b", b""), Some(WatchEnd::Key));
    }
}
