//! What the writer writes, the reader reads back identically, and it passes
//! bbolt's consistency check.

mod common;

use std::collections::BTreeMap;
use std::io::Cursor as IoCursor;

use bbolt::{
    snapshot_status, BucketRoot, ReadError, Reader, WriteError, Writer, WriterOptions, NO_FREELIST,
};
use common::{read, revision_key, write, Db};
use proptest::prelude::*;

fn round_trip(db: &Db, options: WriterOptions) {
    let bytes = write(db, options);
    assert_eq!(&read(&bytes).expect("read back"), db);
    let mut reader = Reader::new(IoCursor::new(&bytes)).expect("open");
    reader.check().expect("passes the check");
    let status = snapshot_status(&mut reader).expect("status");
    let entries: usize = db.iter().map(|(_, entries)| entries.len()).sum();
    assert_eq!(status.total_key, entries as u64);
    assert_eq!(status.total_size, bytes.len() as u64);
}

fn value_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => proptest::collection::vec(any::<u8>(), 0..48),
        1 => proptest::collection::vec(any::<u8>(), 0..9000),
    ]
}

fn db_strategy() -> impl Strategy<Value = Db> {
    let bucket = proptest::collection::btree_map(
        proptest::collection::vec(any::<u8>(), 1..24),
        value_strategy(),
        0..200,
    );
    proptest::collection::btree_map(proptest::collection::vec(any::<u8>(), 1..12), bucket, 0..6)
        .prop_map(|buckets: BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>>| {
            buckets
                .into_iter()
                .map(|(name, entries)| (name, entries.into_iter().collect()))
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_databases_round_trip(
        db in db_strategy(),
        page_size in prop_oneof![Just(1024u32), Just(4096u32)],
        persist_freelist in any::<bool>(),
    ) {
        round_trip(&db, WriterOptions { page_size, persist_freelist, ..WriterOptions::default() });
    }
}

#[test]
fn a_database_without_buckets_round_trips() {
    round_trip(&Vec::new(), WriterOptions::default());
    round_trip(
        &Vec::new(),
        WriterOptions {
            persist_freelist: false,
            ..WriterOptions::default()
        },
    );
}

#[test]
fn empty_buckets_and_empty_values_round_trip() {
    let db: Db = vec![
        (b"a".to_vec(), Vec::new()),
        (
            b"b".to_vec(),
            vec![(b"k".to_vec(), Vec::new()), (b"l".to_vec(), Vec::new())],
        ),
        (b"c".to_vec(), Vec::new()),
    ];
    round_trip(&db, WriterOptions::default());
}

#[test]
fn a_hundred_thousand_keys_stream_through_a_file() {
    const KEYS: u64 = 100_000;
    let value = |main: u64| vec![(main % 251) as u8; (main % 33) as usize];
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db");
    let mut writer = Writer::create(&path, WriterOptions::default()).expect("create");
    writer.begin_bucket(b"key").expect("bucket");
    for main in 1..=KEYS {
        writer
            .put(&revision_key(main, 0), &value(main))
            .expect("put");
    }
    writer.begin_bucket(b"meta").expect("bucket");
    writer
        .put(b"consistent_index", &7u64.to_be_bytes())
        .expect("put");
    let size = writer.finish().expect("finish");
    assert_eq!(size, std::fs::metadata(&path).expect("stat").len());

    let mut reader = Reader::open(&path).expect("open");
    reader.check().expect("check");
    let mut keys = reader.bucket(b"key").expect("lookup").expect("bucket key");
    let mut expected = 1;
    while let Some(item) = keys.next(&mut reader).expect("next") {
        assert_eq!(item.key, revision_key(expected, 0).as_slice());
        assert_eq!(item.value, value(expected).as_slice());
        expected += 1;
    }
    assert_eq!(expected, KEYS + 1);
    let status = snapshot_status(&mut reader).expect("status");
    assert_eq!((status.revision, status.total_key), (KEYS as i64, KEYS + 1));
}

#[test]
fn values_spanning_overflow_pages_round_trip() {
    let page = 4096usize;
    // Sizes around the page boundaries: an entry that just fits a page,
    // one byte more, several pages, and a multi-megabyte value.
    let mut entries = Vec::new();
    for (index, len) in [
        0,
        1,
        page - 33,
        page - 32,
        page - 31,
        page,
        page + 1,
        3 * page - 40,
        3 * page,
        (5 << 20) + 1,
        10,
    ]
    .iter()
    .enumerate()
    {
        entries.push((
            vec![b'a' + index as u8],
            (0..*len).map(|byte| (byte % 253) as u8).collect(),
        ));
    }
    let db: Db = vec![
        (b"big".to_vec(), entries),
        (b"small".to_vec(), vec![(b"x".to_vec(), b"y".to_vec())]),
    ];
    round_trip(&db, WriterOptions::default());
    round_trip(
        &db,
        WriterOptions {
            page_size: 1024,
            persist_freelist: false,
            ..WriterOptions::default()
        },
    );
}

#[test]
fn largest_keys_make_branch_pages_with_overflow() {
    let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..300u32)
        .map(|index| {
            let mut key = vec![b'k'; bbolt::MAX_KEY_SIZE];
            key[bbolt::MAX_KEY_SIZE - 4..].copy_from_slice(&index.to_be_bytes());
            (key, index.to_be_bytes().to_vec())
        })
        .collect();
    let mut names: Vec<Vec<u8>> = (0..3u8)
        .map(|index| {
            vec![b'n'; bbolt::MAX_KEY_SIZE - 1]
                .into_iter()
                .chain([index])
                .collect()
        })
        .collect();
    names.sort();
    let mut db: Db = names.into_iter().map(|name| (name, Vec::new())).collect();
    db[1].1 = entries;
    round_trip(&db, WriterOptions::default());
}

/// The bucket value in the root bucket: header only, or header + inline page.
fn bucket_value_len(bytes: &[u8], name: &[u8]) -> usize {
    let mut reader = Reader::new(IoCursor::new(bytes)).expect("open");
    let mut buckets = reader.root_cursor().expect("root");
    while let Some(item) = buckets.next(&mut reader).expect("next") {
        if item.key == name {
            assert!(item.is_bucket);
            return item.value.len();
        }
    }
    panic!("no bucket {name:?}");
}

#[test]
fn buckets_up_to_a_quarter_page_are_inline_as_bbolt_writes_them() {
    // Page header 16 + one element 16 + key 1 + value: inline iff <= 1024.
    let fits = 1024 - 16 - 16 - 1;
    for (value_len, inline) in [(fits, true), (fits + 1, false)] {
        let db: Db = vec![(b"b".to_vec(), vec![(b"k".to_vec(), vec![1; value_len])])];
        let bytes = write(&db, WriterOptions::default());
        let len = bucket_value_len(&bytes, b"b");
        assert_eq!(len > 16, inline, "value of {value_len} bytes");
        let mut reader = Reader::new(IoCursor::new(&bytes)).expect("open");
        let mut buckets = reader.root_cursor().expect("root");
        let item = buckets.next(&mut reader).expect("next").expect("bucket");
        let root = BucketRoot::parse(item.page, item.value).expect("header");
        assert_eq!(matches!(root, BucketRoot::Inline { .. }), inline);
        assert_eq!(read(&bytes).expect("read"), db);
    }
    let empty: Db = vec![(b"e".to_vec(), Vec::new())];
    assert_eq!(
        bucket_value_len(&write(&empty, WriterOptions::default()), b"e"),
        32,
        "header + empty leaf"
    );
}

#[test]
fn meta_pages_are_written_as_tx_write_to_writes_them() {
    for persist_freelist in [true, false] {
        let options = WriterOptions {
            txid: 9,
            persist_freelist,
            ..WriterOptions::default()
        };
        let bytes = write(&common::etcd_like(3, 10), options);
        let reader = Reader::new(IoCursor::new(&bytes)).expect("open");
        assert_eq!(reader.meta_page(), 0, "meta 0 has the higher txid");
        assert_eq!(reader.meta().txid, 9);
        assert_eq!(reader.damaged_meta(), None);
        assert_eq!(
            reader.meta().freelist,
            if persist_freelist { 2 } else { NO_FREELIST }
        );
        let meta1 = bbolt::Meta::decode(&bytes[4096 + 16..4096 + 80]);
        assert_eq!(meta1.txid, 8);
        assert_eq!(
            (meta1.root, meta1.pgid),
            (reader.meta().root, reader.meta().pgid)
        );
        assert_eq!(reader.size(), bytes.len() as u64);
    }
}

#[test]
fn a_trailing_sha256_is_ignored_by_the_reader() {
    let db = common::etcd_like(10, 10);
    let mut bytes = write(&db, WriterOptions::default());
    bytes.extend_from_slice(&[0xAB; 32]);
    assert_eq!(read(&bytes).expect("read"), db);
    let mut reader = Reader::new(IoCursor::new(&bytes)).expect("open");
    assert_eq!(
        snapshot_status(&mut reader).expect("status").total_size,
        bytes.len() as u64 - 32
    );
}

#[test]
fn the_writer_refuses_what_bbolt_refuses() {
    let mut out = IoCursor::new(Vec::new());
    assert!(matches!(
        Writer::new(&mut out, 1000),
        Err(WriteError::PageSize(1000))
    ));
    assert!(matches!(
        Writer::new(&mut out, 128 * 1024),
        Err(WriteError::PageSize(_))
    ));
    let mut writer = Writer::new(&mut out, 4096).expect("writer");
    assert!(matches!(writer.put(b"k", b"v"), Err(WriteError::NoBucket)));
    assert!(matches!(
        writer.begin_bucket(b""),
        Err(WriteError::EmptyKey(_))
    ));
    writer.begin_bucket(b"m").expect("bucket");
    assert!(matches!(
        writer.put(b"", b"v"),
        Err(WriteError::EmptyKey(_))
    ));
    assert!(matches!(
        writer.put(&vec![1; bbolt::MAX_KEY_SIZE + 1], b"v"),
        Err(WriteError::TooLarge { .. })
    ));
    writer.put(b"b", b"1").expect("put");
    assert!(
        matches!(writer.put(b"b", b"2"), Err(WriteError::OutOfOrder { .. })),
        "duplicate key"
    );
    assert!(
        matches!(writer.put(b"a", b"2"), Err(WriteError::OutOfOrder { .. })),
        "descending key"
    );
    assert!(
        matches!(
            writer.begin_bucket(b"m"),
            Err(WriteError::OutOfOrder { .. })
        ),
        "same bucket again"
    );
    assert!(
        matches!(
            writer.begin_bucket(b"a"),
            Err(WriteError::OutOfOrder { .. })
        ),
        "descending bucket"
    );
    // A refused call leaves the writer usable.
    writer.put(b"c", b"3").expect("put after refusals");
    writer.finish().expect("finish");
    let expected: Db = vec![(
        b"m".to_vec(),
        vec![
            (b"b".to_vec(), b"1".to_vec()),
            (b"c".to_vec(), b"3".to_vec()),
        ],
    )];
    assert_eq!(read(out.get_ref()).expect("read"), expected);
}

#[test]
fn status_refuses_a_key_bucket_without_revision_keys() {
    let db: Db = vec![(b"key".to_vec(), vec![(b"short".to_vec(), b"v".to_vec())])];
    let bytes = write(&db, WriterOptions::default());
    let mut reader = Reader::new(IoCursor::new(&bytes)).expect("open");
    assert!(matches!(
        snapshot_status(&mut reader),
        Err(ReadError::NotARevision(_))
    ));
}
