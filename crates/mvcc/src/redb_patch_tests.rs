//! The vendored redb's patches (vendor/redb.md) under this crate's use:
//! pages read and written through a cache far smaller than the file, so
//! that every read past the cache evicts and page buffers are recycled,
//! with commits without fsync in between (the store's own commits), must
//! each hold their own bytes; and a read transaction's file image
//! (`ReadTransaction::export_image`) must open as exactly that transaction's
//! tables while the database goes on changing.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable as _, TableDefinition};

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

/// A second table, of values from 1 byte to 3 pages (leaves of 1 to 4
/// pages), so that an image has pages of every order.
const MIXED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("mixed");

type Model = BTreeMap<(&'static str, Vec<u8>), Vec<u8>>;

fn mixed_value(key: u64, generation: u64) -> Vec<u8> {
    let len = (key * 2_654_435_761 % 12_000) as usize + 1;
    (0..len)
        .map(|i| (key ^ generation.wrapping_mul(13) ^ (i as u64 * 7)) as u8)
        .collect()
}

fn write_mixed(db: &Database, keys: std::ops::Range<u64>, generation: u64, durable: bool) {
    let mut txn = db.begin_write().unwrap();
    if !durable {
        txn.set_durability(Durability::None).unwrap();
    }
    {
        let mut table = txn.open_table(MIXED).unwrap();
        for key in keys {
            let value = mixed_value(key, generation);
            table
                .insert(key.to_be_bytes().as_slice(), value.as_slice())
                .unwrap();
        }
    }
    txn.commit().unwrap();
}

/// Every pair of both tables, as the transaction sees them.
fn model(txn: &redb::ReadTransaction) -> Model {
    let mut model = Model::new();
    if let Ok(table) = txn.open_table(TABLE) {
        for entry in table.iter().unwrap() {
            let (key, value) = entry.unwrap();
            model.insert(
                ("recycling", key.value().to_be_bytes().to_vec()),
                value.value().to_vec(),
            );
        }
    }
    if let Ok(table) = txn.open_table(MIXED) {
        for entry in table.iter().unwrap() {
            let (key, value) = entry.unwrap();
            model.insert(("mixed", key.value().to_vec()), value.value().to_vec());
        }
    }
    model
}

/// Writes `txn`'s image to `path`.
fn export(txn: &redb::ReadTransaction, path: &Path) -> u64 {
    let file = std::fs::File::create(path).unwrap();
    let mut last_end = 0;
    let len = txn
        .export_image(&mut |offset, bytes| {
            assert!(
                offset >= last_end,
                "pieces in ascending order, not overlapping"
            );
            last_end = offset + bytes.len() as u64;
            file.write_all_at(bytes, offset)
                .map_err(redb::StorageError::from)
        })
        .unwrap();
    assert!(last_end <= len, "every piece inside the image");
    file.set_len(len).unwrap();
    file.sync_all().unwrap();
    len
}

#[test]
fn a_read_transactions_image_opens_as_its_tables() {
    const KEYS: u64 = 1500;
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Builder::new()
        .set_cache_size(256 * 1024)
        .create(dir.path().join("db"))
        .unwrap();
    write(&db, 0..KEYS, 0, true);
    write_mixed(&db, 0..KEYS, 0, false);
    write(&db, 0..KEYS / 3, 1, false);
    let snapshot = db.begin_read().unwrap();
    let expected = model(&snapshot);
    assert_eq!(expected.len() as u64, 2 * KEYS);

    // The database goes on: pages rewritten, freed and reused by later
    // commits, durable or not, a table deleted, another created
    write_mixed(&db, 0..KEYS, 1, false);
    write(&db, 0..KEYS, 2, true);
    {
        let txn = db.begin_write().unwrap();
        txn.delete_table(MIXED).unwrap();
        txn.open_table(TableDefinition::<u64, u64>::new("later"))
            .unwrap()
            .insert(1, 2)
            .unwrap();
        txn.commit().unwrap();
    }
    write(&db, KEYS..2 * KEYS, 3, false);

    let image = dir.path().join("image");
    export(&snapshot, &image);
    drop(snapshot);
    {
        let copy = redb::Builder::new()
            .set_cache_size(256 * 1024)
            .create(&image)
            .unwrap();
        let txn = copy.begin_read().unwrap();
        assert!(
            model(&txn) == expected,
            "the image holds the snapshot's tables"
        );
        assert!(txn
            .open_table(TableDefinition::<u64, u64>::new("later"))
            .is_err());
        drop(txn);
        // its allocator is whole: it takes writes and a reopen
        write_mixed(&copy, KEYS..KEYS + 300, 5, true);
    }
    let mut copy = Database::open(&image).unwrap();
    let mut more = expected.clone();
    for key in KEYS..KEYS + 300 {
        more.insert(("mixed", key.to_be_bytes().to_vec()), mixed_value(key, 5));
    }
    assert!(
        model(&copy.begin_read().unwrap()) == more,
        "after writes and a reopen"
    );
    assert!(
        copy.check_integrity().unwrap(),
        "the image passes redb's check"
    );

    // The database itself is untouched by the export
    check(&db, 2 * KEYS, |key| if key < KEYS { 2 } else { 3 });
}

#[test]
fn a_damaged_image_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(dir.path().join("db")).unwrap();
    write(&db, 0..200, 0, true);
    let snapshot = db.begin_read().unwrap();
    let image = dir.path().join("image");
    export(&snapshot, &image);
    // a byte flipped in the middle of one value (inside a leaf's checksum)
    let bytes = std::fs::read(&image).unwrap();
    let wanted = value(77, 0);
    let at = bytes
        .windows(wanted.len())
        .position(|w| w == wanted.as_slice())
        .expect("the value is in the image")
        + wanted.len() / 2;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap();
    file.write_all_at(&[bytes[at] ^ 0x40], at as u64).unwrap();
    drop(file);
    let opened = Database::create(&image);
    assert!(opened.is_err(), "a damaged image opened");
}
