//! Record checksums: a stored value whose bytes changed is refused, never
//! served (etcd serves it: bbolt checks nothing on reads), and the server
//! is told; files of the older format are upgraded in place.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use api::etcdserverpb::RangeRequest;
use redb::{ReadableDatabase, ReadableTable};

use crate::backend::{self, KEY_TABLE, META_FORMAT_VERSION, META_TABLE};
use crate::test_util::put_at;
use crate::watch::WatchOptions;
use crate::{MvccError, Store};

fn get(store: &Store, key: &str) -> Result<Vec<u8>, MvccError> {
    let r = store.range(&RangeRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    })?;
    Ok(r.kvs[0].value.to_vec())
}

/// Overwrites 10 bytes of the value inside the stored record of `revision`,
/// as a bad disk or a stray write would.
fn damage_value(store: &Store, revision: i64, value: &[u8]) {
    store.commit(true).unwrap();
    store.overwrite_stored_bytes_for_tests(revision, &value[..10], b"0123456789");
}

#[test]
fn a_damaged_value_is_refused_on_every_read_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
    store.watch.background.store(false, Ordering::Relaxed);
    let reported = Arc::new(AtomicUsize::new(0));
    let seen = reported.clone();
    store.set_corruption_observer(Arc::new(move |e| {
        assert!(
            e.to_string().contains("revision 2/0 fails its checksum"),
            "{e}"
        );
        seen.fetch_add(1, Ordering::Relaxed);
    }));
    let value = "a value of some length to damage";
    put_at(&store, 1, "k", value, 0); // revision 2
    put_at(&store, 2, "other", "fine", 0);
    assert_eq!(get(&store, "k").unwrap(), value.as_bytes());
    damage_value(&store, 2, value.as_bytes());

    let err = get(&store, "k").unwrap_err();
    assert!(
        matches!(&err, MvccError::Corrupt(m) if m.contains("fails its checksum")),
        "{err}"
    );
    assert_eq!(
        get(&store, "other").unwrap(),
        b"fine",
        "undamaged records still serve"
    );
    assert!(store.hash_kv(0).is_err(), "HashKV checks every record");
    // A watcher replaying history does not get the damaged event either.
    let stream = store.watch_stream(Box::new(|| {}));
    stream
        .watch(WatchOptions {
            key: "k".into(),
            start_revision: 1,
            ..Default::default()
        })
        .unwrap();
    store.sync_watchers();
    assert!(std::iter::from_fn(|| stream.pop()).all(|r| r.events.is_empty()));
    assert!(reported.load(Ordering::Relaxed) >= 3);

    // At rest, the file is refused when opened, naming it and the record.
    drop(stream);
    let store = Arc::try_unwrap(store).ok().expect("no other handle");
    drop(store);
    let err = Store::open(&dir.path().join("db")).err().expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("db is damaged") && text.contains("revision 2/0 fails its checksum"),
        "{text}"
    );
}

#[test]
fn a_format_1_file_is_upgraded_in_place_and_hashes_the_same() {
    let dir = tempfile::tempdir().unwrap();
    // Format 1: the same records without their checksums.
    let path = dir.path().join("v1.db");
    let current = Store::open(&dir.path().join("v2.db")).unwrap();
    for i in 0..25 {
        put_at(&current, i + 1, &format!("k{}", i % 7), format!("v{i}"), 0);
    }
    // a long record, stored in parts once upgraded
    let long = vec![b'l'; 3 * crate::parts::PART_BYTES];
    put_at(&current, 26, "long", &long, 0);
    // a format 1 record whose fifth byte from the end is a head's mark
    // (its value ends the encoding): not taken for a head of parts
    put_at(&current, 27, "mark", "u1234", 0);
    current.commit(true).unwrap();
    {
        let v1 = redb::Database::create(&path).unwrap();
        let txn = v1.begin_write().unwrap();
        {
            let source = current.db();
            let read = source.begin_read().unwrap();
            let from = read.open_table(KEY_TABLE).unwrap();
            let mut to = txn.open_table(KEY_TABLE).unwrap();
            let parts = crate::parts::ReadParts::open(&read).unwrap();
            for row in from.iter().unwrap() {
                let (k, v) = row.unwrap();
                let whole = parts.join(k.value(), v.value()).unwrap();
                let payload = backend::unseal(&whole).unwrap();
                to.insert(k.value(), payload).unwrap();
            }
            let mut meta = txn.open_table(META_TABLE).unwrap();
            meta.insert(META_FORMAT_VERSION, &1u32.to_be_bytes()[..])
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let upgraded = Store::open(&path).unwrap();
    assert_eq!(upgraded.hash_kv(0).unwrap(), current.hash_kv(0).unwrap());
    assert_eq!(get(&upgraded, "k3").unwrap(), get(&current, "k3").unwrap());
    assert_eq!(get(&upgraded, "long").unwrap(), long);
    assert_eq!(get(&upgraded, "mark").unwrap(), b"u1234");
    assert_eq!(parts_in(&upgraded), 3);
    put_at(&upgraded, 28, "after", "v", 0);
    upgraded.commit(true).unwrap();
    drop(upgraded);
    let reopened = Store::open(&path).unwrap();
    assert_eq!(
        format_version(&reopened),
        backend::FORMAT_VERSION.to_be_bytes()
    );
}

/// The format version the store's file records.
fn format_version(store: &Store) -> Vec<u8> {
    let txn = store.db().begin_read().unwrap();
    let meta = txn.open_table(META_TABLE).unwrap();
    let version = meta.get(META_FORMAT_VERSION).unwrap().unwrap();
    version.value().to_vec()
}

fn parts_in(store: &Store) -> u64 {
    use redb::ReadableTableMetadata;
    let txn = store.db().begin_read().unwrap();
    let parts = txn.open_table(crate::parts::PART_TABLE).unwrap();
    parts.len().unwrap()
}

#[test]
fn a_format_2_file_keeps_its_whole_long_records_and_stores_new_ones_in_parts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.db");
    let long = vec![b'w'; 10_000];
    // Format 2: every record whole, no parts table.
    let record = api::mvccpb::KeyValue {
        key: b"whole".to_vec().into(),
        create_revision: 2,
        mod_revision: 2,
        version: 1,
        value: long.clone().into(),
        lease: 0,
    };
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut keys = txn.open_table(KEY_TABLE).unwrap();
            let key =
                crate::revision::RevisionKey::new(crate::revision::Revision::new(2, 0), false);
            let sealed = backend::seal(prost::Message::encode_to_vec(&record));
            keys.insert(key.as_slice(), &sealed[..]).unwrap();
            let mut meta = txn.open_table(META_TABLE).unwrap();
            meta.insert(META_FORMAT_VERSION, &2u32.to_be_bytes()[..])
                .unwrap();
            meta.insert(backend::META_CONSISTENT_INDEX, &1u64.to_be_bytes()[..])
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(get(&store, "whole").unwrap(), long);
    put_at(&store, 2, "parts", &long, 0);
    store.commit(true).unwrap();
    assert_eq!(parts_in(&store), 2, "the new record, in parts");
    assert_eq!(get(&store, "whole").unwrap(), long);
    assert_eq!(get(&store, "parts").unwrap(), long);
    let hash = store.hash_kv(0).unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.hash_kv(0).unwrap(), hash);
    assert_eq!(
        format_version(&store),
        backend::FORMAT_VERSION.to_be_bytes(),
        "an older oxcd refuses it now"
    );
}

#[test]
fn a_newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    drop(Store::open(&path).unwrap());
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META_TABLE)
            .unwrap()
            .insert(META_FORMAT_VERSION, &99u32.to_be_bytes()[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let err = Store::open(&path).err().expect("refused");
    assert!(
        err.to_string()
            .contains("unsupported mvcc format version 99"),
        "{err}"
    );
}
