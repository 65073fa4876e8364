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
