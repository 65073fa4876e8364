//! Helpers for the crate's unit tests.

use api::etcdserverpb::{DeleteRangeRequest, PutRequest};

use crate::Store;

/// Puts `key` = `value` (with `lease`) as the apply of raft entry `index`.
pub(crate) fn put_at(store: &Store, index: u64, key: &str, value: impl AsRef<[u8]>, lease: i64) {
    let mut w = store.write(index);
    w.put(&PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: value.as_ref().to_vec().into(),
        lease,
        ..Default::default()
    })
    .unwrap();
    w.end();
}

/// Deletes `key`..`range_end` as the apply of raft entry `index`.
pub(crate) fn delete_range_at(store: &Store, index: u64, key: &str, range_end: &str) {
    let mut w = store.write(index);
    w.delete_range(&DeleteRangeRequest {
        key: key.as_bytes().to_vec().into(),
        range_end: range_end.as_bytes().to_vec().into(),
        ..Default::default()
    })
    .unwrap();
    w.end();
}

/// A lease (5) and a member (7) in the side tables, then 3 rounds of puts
/// of `k000`..`k199` (values `r<round>-<i>`, lease 5) as raft entries 2..;
/// the last entry's index.
pub(crate) fn three_rounds(store: &Store) -> u64 {
    store.put_side(crate::SideTable::Leases, 5, Some(b"lease-5".to_vec()), 1);
    store.put_side(crate::SideTable::Members, 7, Some(b"member-7".to_vec()), 1);
    let mut index = 1;
    for round in 0..3 {
        for i in 0..200 {
            index += 1;
            put_at(
                store,
                index,
                &format!("k{i:03}"),
                format!("r{round}-{i}"),
                5,
            );
        }
    }
    index
}

/// A new, empty file at `path`, open for reading and writing.
pub(crate) fn new_file(path: &std::path::Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap()
}
