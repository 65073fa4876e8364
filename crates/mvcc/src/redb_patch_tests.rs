//! The vendored redb's patches (vendor/redb.md) under this crate's use:
//! pages read and written through a cache far smaller than the file, so
//! that every read past the cache evicts and page buffers are recycled,
//! with commits without fsync in between (the store's own commits), must
//! each hold their own bytes.

use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, TableDefinition};

const TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("recycling");

/// Value `key` as of `generation`: 3,000 bytes (one leaf page each), no
/// two alike.
fn value(key: u64, generation: u64) -> Vec<u8> {
    (0..3000u64)
        .map(|i| (key.wrapping_mul(131) ^ generation.wrapping_mul(7) ^ i.wrapping_mul(31)) as u8)
        .collect()
}

fn write(db: &Database, keys: std::ops::Range<u64>, generation: u64, durable: bool) {
    let mut txn = db.begin_write().unwrap();
    if !durable {
        txn.set_durability(Durability::None).unwrap();
    }
    {
        let mut table = txn.open_table(TABLE).unwrap();
        for key in keys {
            table
                .insert(key, value(key, generation).as_slice())
                .unwrap();
        }
    }
    txn.commit().unwrap();
}

/// Reads every key, in order then backwards, checking each value against
/// `generation_of`.
fn check(db: &Database, keys: u64, generation_of: impl Fn(u64) -> u64) {
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(TABLE).unwrap();
    let mut seen = 0;
    for entry in table.range(0..keys).unwrap() {
        let (key, stored) = entry.unwrap();
        let key = key.value();
        assert!(
            stored.value() == value(key, generation_of(key)).as_slice(),
            "key {key}"
        );
        seen += 1;
    }
    assert_eq!(seen, keys);
    for entry in table.range(0..keys).unwrap().rev() {
        let (key, stored) = entry.unwrap();
        let key = key.value();
        assert!(
            stored.value() == value(key, generation_of(key)).as_slice(),
            "key {key} backwards"
        );
    }
}

#[test]
fn pages_through_a_small_cache_hold_their_own_bytes() {
    const KEYS: u64 = 4000; // ~16 MB of leaves against a 256 KiB cache
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(
        redb::Builder::new()
            .set_cache_size(256 * 1024)
            .create(dir.path().join("db"))
            .unwrap(),
    );
    write(&db, 0..KEYS, 0, true);
    check(&db, KEYS, |_| 0);

    // Half rewritten by commits without fsync (committed pages stay in the
    // write buffer), read concurrently by two threads while a third writes
    write(&db, 0..KEYS / 2, 1, false);
    let generation = |key: u64| u64::from(key < KEYS / 2);
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let db = db.clone();
            std::thread::spawn(move || check(&db, KEYS, generation))
        })
        .collect();
    let extra = {
        let db = db.clone();
        std::thread::spawn(move || write(&db, KEYS..KEYS + 500, 2, false))
    };
    for reader in readers {
        reader.join().unwrap();
    }
    extra.join().unwrap();
    check(&db, KEYS, generation);

    // And the same file read again after a durable commit and a reopen
    write(&db, KEYS / 2..KEYS, 3, true);
    drop(Arc::into_inner(db).unwrap());
    let db = redb::Builder::new()
        .set_cache_size(256 * 1024)
        .open(dir.path().join("db"))
        .unwrap();
    check(&db, KEYS, |key| if key < KEYS / 2 { 1 } else { 3 });
}
