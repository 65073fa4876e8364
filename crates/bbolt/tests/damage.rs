//! Damaged, truncated and hostile files are refused with an error naming
//! the page, and never make the reader panic.

mod common;

use std::io::Cursor as IoCursor;

use bbolt::{snapshot_status, BucketRoot, Meta, ReadError, Reader, Visit, WriterOptions};
use common::{read, write, Db};

const PAGE: usize = 4096;

/// A database with inline buckets, a multi-level tree and overflow pages.
fn sample_db() -> Db {
    let mut db = common::etcd_like(600, 40);
    db.push((
        b"zz".to_vec(),
        vec![
            (b"big".to_vec(), vec![9; 3 * PAGE]),
            (b"small".to_vec(), b"s".to_vec()),
        ],
    ));
    db
}

fn sample(persist_freelist: bool) -> Vec<u8> {
    write(
        &sample_db(),
        WriterOptions {
            persist_freelist,
            ..WriterOptions::default()
        },
    )
}

fn open(bytes: &[u8]) -> Result<Reader<IoCursor<&[u8]>>, ReadError> {
    Reader::new(IoCursor::new(bytes))
}

fn meta_of(bytes: &[u8], page: usize) -> Meta {
    Meta::decode(&bytes[page * PAGE + 16..page * PAGE + 80])
}

fn set_meta(bytes: &mut [u8], page: usize, mut meta: Meta) {
    meta.checksum = meta.sum64();
    bytes[page * PAGE + 16..page * PAGE + 80].copy_from_slice(&meta.encode());
}

#[test]
fn a_damaged_meta_page_falls_back_to_the_other_as_bbolt_does() {
    let good = sample(true);
    for page in 0..2usize {
        // Every byte of the checksummed meta (magic..txid) and the checksum.
        for offset in 16..80 {
            let mut bytes = good.clone();
            bytes[page * PAGE + offset] ^= 0x40;
            let reader =
                open(&bytes).unwrap_or_else(|error| panic!("page {page} byte {offset}: {error}"));
            assert_eq!(reader.meta_page(), 1 - page as u64);
            let (damaged, what) = reader.damaged_meta().expect("damage reported");
            assert_eq!(damaged, page as u64);
            let expected = match offset {
                16..=19 => "bad magic",
                20..=23 => "unsupported version",
                _ => "meta checksum mismatch",
            };
            // A flipped page size that still validates is a size mismatch.
            assert!(
                what.contains(expected) || what.contains("page size"),
                "byte {offset}: {what}"
            );
            assert_eq!(read(&bytes).expect("content intact"), sample_db());
        }
    }
}

#[test]
fn both_meta_pages_damaged_is_refused_naming_both() {
    let mut bytes = sample(true);
    bytes[16 + 50] ^= 1; // meta 0's txid
    bytes[PAGE + 16 + 60] ^= 1; // meta 1's checksum
    let error = open(&bytes).err().expect("refused").to_string();
    assert!(error.contains("page 0: meta checksum mismatch"), "{error}");
    assert!(error.contains("page 1: meta checksum mismatch"), "{error}");

    let mut bytes = sample(false);
    bytes[16] ^= 0xFF;
    bytes[PAGE + 16] ^= 0xFF;
    let error = open(&bytes).err().expect("refused").to_string();
    assert!(error.contains("page 0: bad magic"), "{error}");
}

#[test]
fn a_meta_page_pointing_outside_the_file_is_refused() {
    let good = sample(true);
    let meta = meta_of(&good, 0);
    for (field, damaged) in [
        (
            "root page",
            Meta {
                root: meta.pgid,
                ..meta
            },
        ),
        ("root page", Meta { root: 1, ..meta }),
        (
            "freelist page",
            Meta {
                freelist: meta.pgid + 5,
                ..meta
            },
        ),
        (
            "high-water mark",
            Meta {
                pgid: meta.pgid + 1,
                ..meta
            },
        ),
        (
            "high-water mark",
            Meta {
                pgid: u64::MAX / 2,
                ..meta
            },
        ),
    ] {
        let mut bytes = good.clone();
        set_meta(&mut bytes, 0, damaged);
        set_meta(
            &mut bytes,
            1,
            Meta {
                txid: damaged.txid - 1,
                ..damaged
            },
        );
        let error = open(&bytes).err().expect("refused").to_string();
        assert!(
            error.starts_with("page 0: ") && error.contains(field),
            "{field}: {error}"
        );
    }
}

#[test]
fn truncated_files_are_refused() {
    let good = sample(true);
    let mut lengths = vec![
        0,
        1,
        15,
        16,
        79,
        80,
        1000,
        PAGE - 1,
        PAGE,
        PAGE + 100,
        2 * PAGE,
        2 * PAGE + 1,
    ];
    lengths.extend((3..good.len() / PAGE).map(|pages| pages * PAGE));
    lengths.push(good.len() - 1);
    for len in lengths {
        let error = open(&good[..len])
            .err()
            .unwrap_or_else(|| panic!("{len} bytes accepted"));
        let text = error.to_string();
        assert!(
            text.contains("page 0") || text.contains("page 1"),
            "{len} bytes: {text}"
        );
    }
    let error = open(&good[..good.len() - PAGE])
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("truncated"), "{error}");
}

#[test]
fn random_bytes_are_refused() {
    let mut rng = fastrand::Rng::with_seed(19);
    for len in [0, 7, 100, 4096, 8192, 3 * 4096, 50_000] {
        for _ in 0..20 {
            let bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            assert!(open(&bytes).is_err(), "{len} random bytes accepted");
        }
    }
}

/// The page id of bucket `name`'s root, when it is not inline.
fn bucket_root(bytes: &[u8], name: &[u8]) -> u64 {
    let mut reader = open(bytes).expect("open");
    let mut buckets = reader.root_cursor().expect("root");
    while let Some(item) = buckets.next(&mut reader).expect("next") {
        if item.key == name {
            match BucketRoot::parse(item.page, item.value).expect("bucket") {
                BucketRoot::Page(id) => return id,
                BucketRoot::Inline { .. } => panic!("{name:?} is inline"),
            }
        }
    }
    panic!("no bucket {name:?}")
}

fn check_error(bytes: &[u8]) -> String {
    let mut reader = open(bytes).expect("open");
    reader.check().expect_err("check refuses").to_string()
}

#[test]
fn an_unknown_page_type_is_refused_naming_the_page() {
    let mut bytes = sample(true);
    let root = bucket_root(&bytes, b"key") as usize;
    bytes[root * PAGE + 8] = 0x20;
    let error = check_error(&bytes);
    assert!(
        error.contains(&format!(
            "page {root}: invalid type: unknown page type 0x20"
        )),
        "{error}"
    );
    let error = read(&bytes).expect_err("iteration refuses").to_string();
    assert!(
        error.contains(&format!(
            "page {root}: invalid type: unknown page type 0x20"
        )),
        "{error}"
    );
}

#[test]
fn a_page_referenced_twice_is_found_by_the_check() {
    for persist_freelist in [true, false] {
        let mut bytes = sample(persist_freelist);
        let root = bucket_root(&bytes, b"key") as usize;
        assert_eq!(
            bytes[root * PAGE + 8],
            0x01,
            "600 revisions make a branch root"
        );
        // Point the root's second child at its first.
        let first_child = root * PAGE + 16 + 8;
        let second_child = root * PAGE + 32 + 8;
        let child: [u8; 8] = bytes[first_child..first_child + 8]
            .try_into()
            .expect("8 bytes");
        bytes[second_child..second_child + 8].copy_from_slice(&child);
        let error = check_error(&bytes);
        let child = u64::from_le_bytes(child);
        assert!(
            error.contains(&format!("page {child}: multiple references")),
            "{error}"
        );
        assert_eq!(
            error.contains("unreachable unfreed"),
            persist_freelist,
            "{error}"
        );
        // Iteration sees the same keys twice.
        let error = read(&bytes).expect_err("iteration refuses").to_string();
        assert!(error.contains("is not after the previous key"), "{error}");
    }
}

#[test]
fn keys_out_of_order_are_found_by_the_check() {
    let mut bytes = sample(true);
    let root = bucket_root(&bytes, b"key") as usize;
    // The first leaf under the root: swap the first byte of its first key
    // (revision 2) to make it larger than the next one.
    let first_child = u64::from_le_bytes(
        bytes[root * PAGE + 24..root * PAGE + 32]
            .try_into()
            .expect("8"),
    ) as usize;
    let element = first_child * PAGE + 16;
    let pos = u32::from_le_bytes(bytes[element + 4..element + 8].try_into().expect("4")) as usize;
    bytes[element + pos] = 0xFF;
    let error = check_error(&bytes);
    assert!(
        error.contains(&format!("page {first_child}: key[1]")),
        "{error}"
    );
}

#[test]
fn a_misplaced_page_is_refused_naming_the_page() {
    let mut bytes = sample(true);
    let root = bucket_root(&bytes, b"key") as usize;
    bytes[root * PAGE] ^= 1;
    let error = check_error(&bytes);
    assert!(
        error.contains(&format!("page {root}: page header names page {}", root ^ 1)),
        "{error}"
    );
}

/// Reads everything a caller could: open, check, visit, status.
/// Returns (opened, passed the check).
fn exercise(bytes: &[u8]) -> (bool, bool) {
    let Ok(mut reader) = open(bytes) else {
        return (false, false);
    };
    let checked = reader.check().is_ok();
    let mut entries = 0u64;
    let _ = reader.visit(|visit| {
        if let Visit::Entry(item) = visit {
            entries += item.key.len() as u64 + item.value.len() as u64;
        }
        Ok::<(), ReadError>(())
    });
    let _ = snapshot_status(&mut reader);
    let _ = reader
        .bucket(b"key")
        .map(|cursor| cursor.map(|mut cursor| while let Ok(Some(_)) = cursor.next(&mut reader) {}));
    (true, checked)
}

#[test]
fn random_mutations_never_panic() {
    let files = [
        sample(true),
        sample(false),
        write(&common::etcd_like(3, 5), WriterOptions::default()),
    ];
    // BBOLT_FUZZ_ITERATIONS / BBOLT_FUZZ_SEED run it longer or elsewhere.
    let iterations = std::env::var("BBOLT_FUZZ_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1500);
    let seed = std::env::var("BBOLT_FUZZ_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0x5eed);
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut opened, mut passed) = (0, 0);
    for iteration in 0..iterations {
        let file = &files[iteration % files.len()];
        let mut bytes = file.clone();
        let pages = bytes.len() / PAGE;
        for _ in 0..rng.usize(1..5) {
            let page = rng.usize(..pages);
            // Mostly headers and element tables, where damage is interesting.
            let offset = if rng.bool() {
                rng.usize(..64)
            } else {
                rng.usize(..PAGE)
            };
            bytes[page * PAGE + offset] = match rng.u8(..4) {
                0 => 0xFF,
                1 => 0,
                _ => rng.u8(..),
            };
        }
        if rng.u8(..8) == 0 {
            // Re-seal a meta page after changing one of its fields.
            let page = rng.usize(..2);
            let mut meta = meta_of(&bytes, page);
            match rng.u8(..4) {
                0 => meta.root = rng.u64(..pages as u64 + 2),
                1 => meta.pgid = rng.u64(..pages as u64 + 2),
                2 => meta.freelist = rng.u64(..pages as u64 + 2),
                _ => meta.txid = rng.u64(..),
            }
            set_meta(&mut bytes, page, meta);
        }
        if rng.u8(..10) == 0 {
            bytes.truncate(rng.usize(..bytes.len()));
        }
        match std::panic::catch_unwind(|| exercise(&bytes)) {
            Ok((open, checked)) => {
                opened += usize::from(open);
                passed += usize::from(checked);
            }
            Err(panic) => {
                eprintln!("seed {seed} iteration {iteration} panicked");
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("{iterations} mutated files: {opened} opened, {passed} passed the check");
}
