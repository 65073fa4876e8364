//! Long records (stored in parts, see [`crate::parts`]) through every
//! reader and writer of the store: reads, history, watch replay, hashes,
//! compaction, backups, defragmentation, record streams, etcd backends,
//! reopening and the deferred check.

use std::sync::atomic::Ordering;

use api::etcdserverpb::RangeRequest;
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

use crate::parts::{PART_BYTES, PART_TABLE};
use crate::test_util::{delete_range_at, put_at};
use crate::watch::WatchOptions;
use crate::Store;

/// Values of lengths around and well past a part, key `k<i>`.
fn values() -> Vec<Vec<u8>> {
    [
        100,
        PART_BYTES - 60,
        PART_BYTES - 20,
        PART_BYTES,
        8192,
        3 * PART_BYTES,
        20_000,
        300_000,
    ]
    .iter()
    .enumerate()
    .map(|(i, len)| (0..*len).map(|b| (b * 31 + i * 7) as u8).collect())
    .collect()
}

fn get_at(store: &Store, key: &str, revision: i64) -> Vec<u8> {
    let r = store
        .range(&RangeRequest {
            key: key.as_bytes().to_vec().into(),
            revision,
            ..Default::default()
        })
        .unwrap();
    r.kvs[0].value.to_vec()
}

/// The deferred check's reading of every record, made now.
fn check_every_record(store: &Store) -> Result<Option<u64>, crate::MvccError> {
    store.check_deferred.store(true, Ordering::Release);
    store.check_deferred(&|| false)
}

fn parts_in_file(store: &Store) -> u64 {
    let txn = store.db().begin_read().unwrap();
    let table = txn.open_table(PART_TABLE).unwrap();
    table.len().unwrap()
}

/// Every value as the last write left it, and k4's first value at revision 6.
fn assert_holds(store: &Store, values: &[Vec<u8>], k4_first: &[u8]) {
    for (i, value) in values.iter().enumerate() {
        let key = format!("k{i}");
        assert_eq!(get_at(store, &key, 0), *value, "{key}");
    }
    assert_eq!(get_at(store, "k4", 6), k4_first, "k4 at revision 6");
}

/// A store with every value written (revisions 2..=9), k4 written again
/// (revision 10), committed durably; (values now, k4's first value, the
/// next raft index).
fn written(store: &Store) -> (Vec<Vec<u8>>, Vec<u8>, u64) {
    let mut values = values();
    let mut index = 0;
    for (i, value) in values.iter().enumerate() {
        index += 1;
        put_at(store, index, &format!("k{i}"), value, 0);
    }
    let first = values[4].clone();
    values[4] = vec![0xee; 9000];
    index += 1;
    put_at(store, index, "k4", &values[4], 0);
    (values, first, index + 1)
}

#[test]
fn long_values_read_back_whole_from_every_copy_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::open(&dir.path().join("db")).unwrap());
    store.watch.background.store(false, Ordering::Relaxed);
    let (values, k4_first, _) = written(&store);
    // from the pending overlay, then from the file
    assert_holds(&store, &values, &k4_first);
    let pending_hash = store.hash_kv(0).unwrap();
    store.commit(true).unwrap();
    assert!(parts_in_file(&store) > 0, "the long records are in parts");
    assert_holds(&store, &values, &k4_first);
    assert_eq!(
        store.hash_kv(0).unwrap(),
        pending_hash,
        "HashKV of joined records"
    );
    check_every_record(&store).unwrap().expect("checked");

    // a watcher replaying history gets every value whole
    let stream = store.watch_stream(Box::new(|| {}));
    stream
        .watch(WatchOptions {
            key: b"k".to_vec().into(),
            range_end: b"l".to_vec().into(),
            start_revision: 1,
            ..Default::default()
        })
        .unwrap();
    store.sync_watchers();
    let events: Vec<_> = std::iter::from_fn(|| stream.pop())
        .flat_map(|r| r.events)
        .collect();
    assert_eq!(events.len(), values.len() + 1);
    assert_eq!(events[4].kv.as_ref().unwrap().value, k4_first);
    assert_eq!(events.last().unwrap().kv.as_ref().unwrap().value, values[4]);
    drop(stream);

    // a backup, a record stream's build and a defragmentation
    let backup = dir.path().join("backup.db");
    store.backup_to(&backup).unwrap();
    let mut stream = Vec::new();
    store
        .write_records(&mut |piece| {
            stream.extend_from_slice(piece);
            true
        })
        .unwrap();
    let built = dir.path().join("built.db");
    let mut builder = crate::record_stream::RecordsBuilder::create(&built).unwrap();
    builder.feed(&stream).unwrap();
    builder.finish().unwrap();
    store.defragment().unwrap();
    assert_holds(&store, &values, &k4_first);
    for copy in [backup, built] {
        let copy = Store::open(&copy).unwrap();
        assert!(parts_in_file(&copy) > 0);
        assert_holds(&copy, &values, &k4_first);
        assert_eq!(copy.hash_kv(0).unwrap().0, pending_hash.0);
    }

    // through etcd's backend format and back
    let etcd = dir.path().join("etcd.db");
    let raft = crate::etcd_backend::RaftMeta {
        term: 2,
        voters: vec![1],
        learners: vec![],
    };
    store.write_etcd_backend(&etcd, &raft).unwrap();
    let restored = dir.path().join("restored.db");
    crate::etcd_backend::restore_from_bbolt(&etcd, &restored, &[]).unwrap();
    let restored = Store::open(&restored).unwrap();
    assert_holds(&restored, &values, &k4_first);
    assert_eq!(restored.hash_kv(0).unwrap().0, pending_hash.0);

    // reopened after a clean stop (checkpoint) and after a crash (scan)
    let path = dir.path().join("db");
    store.close(&[]).unwrap();
    drop(
        std::sync::Arc::try_unwrap(store)
            .ok()
            .expect("no other handle"),
    );
    let store = Store::open(&path).unwrap();
    assert_holds(&store, &values, &k4_first);
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_holds(&store, &values, &k4_first);
    check_every_record(&store).unwrap().expect("checked");
}

#[test]
fn compaction_removes_the_parts_of_the_records_it_drops() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).unwrap();
    let (values, _, mut index) = written(&store);
    store.commit(true).unwrap();
    let before = parts_in_file(&store);
    // k4's first value (8,192 B: two parts) is superseded
    store.compact(store.current_revision(), index).unwrap();
    store.commit(true).unwrap();
    assert_eq!(store.finished_compact_revision(), store.current_revision());
    assert_eq!(parts_in_file(&store), before - 2);
    for (i, value) in values.iter().enumerate() {
        assert_eq!(get_at(&store, &format!("k{i}"), 0), *value);
    }
    // every key deleted and compacted: no part is left
    index += 1;
    delete_range_at(&store, index, "k", "l");
    index += 1;
    store.compact(store.current_revision(), index).unwrap();
    store.commit(true).unwrap();
    assert_eq!(parts_in_file(&store), 0);
}

#[test]
fn a_damaged_part_is_refused_on_reads_and_by_the_deferred_check() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).unwrap();
    let (values, _, _) = written(&store);
    store.commit(true).unwrap();
    // the first bytes of k7's value (revision 9) are in its first part
    store.overwrite_stored_bytes_for_tests(9, &values[7][..10], b"0123456789");
    let err = store
        .range(&RangeRequest {
            key: b"k7".to_vec().into(),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("revision 9/0 fails its checksum"),
        "{err}"
    );
    assert_eq!(
        get_at(&store, "k6", 0),
        values[6],
        "other records still serve"
    );
    assert!(store.hash_kv(0).is_err());
    let err = check_every_record(&store).unwrap_err();
    assert!(err.to_string().contains("revision 9/0"), "{err}");

    // its head's count of parts damaged: refused, by the etcd backend's
    // layout too (which reads lengths only), never a huge allocation
    {
        let db = store.db();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(crate::backend::KEY_TABLE).unwrap();
            let key =
                crate::revision::RevisionKey::new(crate::revision::Revision::new(9, 0), false);
            let mut head = table.get(key.as_slice()).unwrap().unwrap().value().to_vec();
            let n = head.len();
            head[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
            table.insert(key.as_slice(), head.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let raft = crate::etcd_backend::RaftMeta::default();
    let err = store.etcd_backend_copy(&raft).err().expect("refused");
    assert!(err.to_string().contains("checksum"), "{err}");
    let err = check_every_record(&store).unwrap_err();
    assert!(err.to_string().contains("revision 9/0"), "{err}");
}
