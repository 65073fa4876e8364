//! Helpers shared by the integration tests: a database as plain vectors,
//! written with the crate's writer and read back with its reader.
#![allow(dead_code)] // each test binary uses part of it

use std::io::Cursor as IoCursor;

use bbolt::{ReadError, Reader, Visit, Writer, WriterOptions};

/// Top-level buckets in name order, each with its entries in key order.
pub type Db = Vec<(Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>;

pub fn write(db: &Db, options: WriterOptions) -> Vec<u8> {
    let mut out = IoCursor::new(Vec::new());
    let mut writer = Writer::with_options(&mut out, options).expect("writer");
    for (name, entries) in db {
        writer.begin_bucket(name).expect("begin_bucket");
        for (key, value) in entries {
            writer.put(key, value).expect("put");
        }
    }
    let size = writer.finish().expect("finish");
    let bytes = out.into_inner();
    assert_eq!(size, bytes.len() as u64, "finish reports the file size");
    assert_eq!(size % u64::from(options.page_size), 0, "page-aligned");
    bytes
}

pub fn read(bytes: &[u8]) -> Result<Db, ReadError> {
    let mut reader = Reader::new(IoCursor::new(bytes))?;
    read_from(&mut reader)
}

pub fn read_from<R: std::io::Read + std::io::Seek>(
    reader: &mut Reader<R>,
) -> Result<Db, ReadError> {
    let mut db: Db = Vec::new();
    reader.visit(|visit| {
        match visit {
            Visit::Bucket(name) => db.push((name.to_vec(), Vec::new())),
            Visit::Entry(item) => {
                assert!(!item.is_bucket, "no nested buckets written");
                if let Some((_, entries)) = db.last_mut() {
                    entries.push((item.key.to_vec(), item.value.to_vec()));
                }
            }
        }
        Ok::<(), ReadError>(())
    })?;
    Ok(db)
}

/// etcd's revision key: main (u64 BE), '_', sub (u64 BE).
pub fn revision_key(main: u64, sub: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(17);
    key.extend_from_slice(&main.to_be_bytes());
    key.push(b'_');
    key.extend_from_slice(&sub.to_be_bytes());
    key
}

/// A database shaped like etcd's: its ten buckets, `revisions` puts in `key`.
pub fn etcd_like(revisions: u64, value_len: usize) -> Db {
    let mut db: Db = [
        "alarm",
        "auth",
        "authRoles",
        "authUsers",
        "cluster",
        "key",
        "lease",
        "members",
        "members_removed",
        "meta",
    ]
    .iter()
    .map(|name| (name.as_bytes().to_vec(), Vec::new()))
    .collect();
    let bucket = |db: &mut Db, name: &str| {
        db.iter()
            .position(|(n, _)| n == name.as_bytes())
            .expect("bucket")
    };
    let auth = bucket(&mut db, "auth");
    db[auth]
        .1
        .push((b"authRevision".to_vec(), 1u64.to_be_bytes().to_vec()));
    let cluster = bucket(&mut db, "cluster");
    db[cluster]
        .1
        .push((b"clusterVersion".to_vec(), b"3.5.0".to_vec()));
    let members = bucket(&mut db, "members");
    db[members].1.push((
        b"8e9e05c52164694d".to_vec(),
        br#"{"id":10276657743932975437,"peerURLs":["http://localhost:2380"],"name":"default"}"#
            .to_vec(),
    ));
    let meta = bucket(&mut db, "meta");
    db[meta]
        .1
        .push((b"consistent_index".to_vec(), 7u64.to_be_bytes().to_vec()));
    db[meta]
        .1
        .push((b"term".to_vec(), 2u64.to_be_bytes().to_vec()));
    let key = bucket(&mut db, "key");
    for main in 2..2 + revisions {
        let mut value = format!("key-{main:08}").into_bytes();
        value.resize(value_len.max(value.len()), b'v');
        db[key].1.push((revision_key(main, 0), value));
    }
    db
}
