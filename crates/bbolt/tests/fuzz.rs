//! Fuzzing the bbolt reader and consistency check (etcd backends and
//! snapshots, read by `oxctl snapshot status|restore` and `migrate`): files
//! of many shapes, damaged at random, in their structure (page headers,
//! element tables, bucket headers) and in resealed meta pages, must be
//! read or refused — never a panic, and never more memory than the file
//! (the crate's promise: nothing is loaded whole, a cursor holds the pages
//! of one path).
//!
//! `FUZZ_SEED` / `FUZZ_RUNS` replay or lengthen a run:
//! `FUZZ_RUNS=100000 cargo test -p bbolt --release --test fuzz`.

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

mod common;

use std::io::Cursor as IoCursor;

use bbolt::{snapshot_status, BucketRoot, Meta, ReadError, Reader, Visit, WriterOptions};
use common::{write, Db};
use fuzz_support::{mutate, peak_bytes, some_bytes, Fuzz, Meter};

#[global_allocator]
static METER: Meter = Meter;

/// A database of random shape: buckets of small and large values (overflow
/// pages), many keys (branch pages), some small enough to be inline.
fn random_db(rng: &mut fastrand::Rng) -> Db {
    let mut names: Vec<Vec<u8>> = (0..rng.usize(1..6))
        .map(|i| format!("bucket-{i}-{}", rng.u8(..)).into_bytes())
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let mut keys: Vec<Vec<u8>> = (0..rng.usize(0..300))
                .map(|_| {
                    let mut key = some_bytes(rng, 1..24);
                    key[0] |= 1;
                    key
                })
                .collect();
            keys.sort();
            keys.dedup();
            let entries = keys
                .into_iter()
                .map(|key| {
                    let value = match rng.u8(..20) {
                        0 => vec![7u8; rng.usize(4000..20000)],
                        _ => some_bytes(rng, 0..60),
                    };
                    (key, value)
                })
                .collect();
            (name, entries)
        })
        .collect()
}

fn random_file(rng: &mut fastrand::Rng) -> (Vec<u8>, usize) {
    let page_size = [1024u32, 4096, 16384][rng.usize(..3)];
    let options = WriterOptions {
        page_size,
        txid: rng.u64(1..1000),
        persist_freelist: rng.bool(),
    };
    (write(&random_db(rng), options), page_size as usize)
}

fn meta_at(bytes: &[u8], page: usize, page_size: usize) -> Meta {
    Meta::decode(&bytes[page * page_size + 16..page * page_size + 80])
}

fn reseal_meta(bytes: &mut [u8], page: usize, page_size: usize, mut meta: Meta) {
    meta.checksum = meta.sum64();
    bytes[page * page_size + 16..page * page_size + 80].copy_from_slice(&meta.encode());
}

/// A u32 or u64 field value as damage or a hostile writer leaves it.
fn hostile(rng: &mut fastrand::Rng, pages: u64, page_size: usize) -> u64 {
    match rng.u8(..8) {
        0 => 0,
        1 => u64::from(u32::MAX),
        2 => u64::MAX,
        3 => pages + rng.u64(..3),
        4 => pages.saturating_sub(rng.u64(1..3)),
        5 => page_size as u64 + rng.u64(..17),
        6 => rng.u64(..pages.max(1)),
        _ => fuzz_support::huge(rng),
    }
}

/// Damage aimed at structure: a page header field, an element's fields, a
/// meta field under a recomputed checksum; or bytes anywhere.
fn damage(rng: &mut fastrand::Rng, bytes: &mut Vec<u8>, page_size: usize) {
    for _ in 0..rng.usize(1..4) {
        let pages = (bytes.len() / page_size) as u64;
        if pages < 3 {
            mutate(rng, bytes);
            return;
        }
        let page = rng.u64(2..pages) as usize;
        let at = page * page_size;
        let value = hostile(rng, pages, page_size);
        match rng.u8(..8) {
            0 => {
                // header: id, flags, count, overflow
                let (offset, width) = [(0, 8), (8, 2), (10, 2), (12, 4)][rng.usize(..4)];
                bytes[at + offset..at + offset + width]
                    .copy_from_slice(&value.to_le_bytes()[..width]);
            }
            1 | 2 => {
                // an element: leaf (flags, pos, ksize, vsize) or branch
                // (pos, ksize, pgid)
                let count = u16::from_le_bytes([bytes[at + 10], bytes[at + 11]]) as usize;
                let element = 16 + 16 * rng.usize(..count.clamp(1, 64));
                let (offset, width) = [(0, 4), (4, 4), (8, 4), (12, 4), (8, 8)][rng.usize(..5)];
                if at + element + offset + width <= bytes.len()
                    && element + offset + width <= page_size
                {
                    bytes[at + element + offset..at + element + offset + width]
                        .copy_from_slice(&value.to_le_bytes()[..width]);
                }
            }
            3 => {
                let meta_page = rng.usize(..2);
                let mut meta = meta_at(bytes, meta_page, page_size);
                match rng.u8(..5) {
                    0 => meta.root = value,
                    1 => meta.pgid = value,
                    2 => meta.freelist = value,
                    3 => {
                        meta.page_size =
                            [512u32, 1024, 2048, 4096, 1 << 20, 1 << 24, u32::MAX][rng.usize(..7)]
                    }
                    _ => meta.txid = value,
                }
                reseal_meta(bytes, meta_page, page_size, meta);
            }
            4 => {
                // a page written over by another (a reference cycle, a page twice)
                let from = rng.u64(2..pages) as usize * page_size;
                let copy = bytes[from..from + page_size].to_vec();
                bytes[at..at + page_size].copy_from_slice(&copy);
            }
            5 => bytes.truncate(rng.usize(..bytes.len())),
            _ => mutate(rng, bytes),
        }
    }
}

/// Everything a caller reads, with the memory it took; whether it opened.
fn exercise(bytes: &[u8]) -> (bool, usize) {
    let (opened, peak) = peak_bytes(|| {
        let Ok(mut reader) = Reader::new(IoCursor::new(bytes)) else {
            return false;
        };
        let _ = reader.check();
        let _ = reader.visit(|visit| {
            if let Visit::Entry(item) = visit {
                if item.is_bucket {
                    let _ = BucketRoot::parse(item.page, item.value);
                }
            }
            Ok::<(), ReadError>(())
        });
        let _ = snapshot_status(&mut reader);
        for name in [&b"key"[..], b"bucket-0", b"meta"] {
            if let Ok(Some(mut cursor)) = reader.bucket(name) {
                while let Ok(Some(_)) = cursor.next(&mut reader) {}
            }
        }
        true
    });
    (opened, peak)
}

/// What reading a file may hold at once: the pages of one path (which do
/// not overlap, so at most the file), one more being read, a spare page
/// per level, and small change.
fn memory_bound(file_len: usize) -> usize {
    2 * file_len + 64 * 16384 + 256 * 1024
}

#[test]
fn damaged_files_are_read_or_refused_within_the_files_size() {
    let fuzz = Fuzz::new("bbolt-files", 400);
    let mut rng = fuzz.rng();
    let mut opened = 0;
    for iteration in fuzz.iterations() {
        // a few shapes, each damaged many times
        let (original, page_size) = random_file(&mut rng);
        for _ in 0..if iteration % 2 == 0 { 4 } else { 1 } {
            let mut bytes = original.clone();
            damage(&mut rng, &mut bytes, page_size);
            let (open, peak) = exercise(&bytes);
            opened += usize::from(open);
            assert!(
                peak <= memory_bound(bytes.len()),
                "{peak} bytes held reading a {}-byte file",
                bytes.len()
            );
        }
    }
    eprintln!("{} runs: {opened} damaged files opened", fuzz.runs);
}

/// A file whose bucket `b` is a branch page spanning the rest of the file
/// (overflow pages), each level's child the next page, itself spanning to
/// the end: every page of the path overlaps the ones above it; `cycle`
/// makes the child the page itself.
fn overlapping_path(cycle: bool) -> Vec<u8> {
    const PAGE: usize = 4096;
    const PAGES: usize = 64;
    let mut bytes = vec![0u8; PAGE * PAGES];
    let header = |bytes: &mut [u8], id: usize, flags: u16, count: u16, overflow: u32| {
        let at = id * PAGE;
        bytes[at..at + 8].copy_from_slice(&(id as u64).to_le_bytes());
        bytes[at + 8..at + 10].copy_from_slice(&flags.to_le_bytes());
        bytes[at + 10..at + 12].copy_from_slice(&count.to_le_bytes());
        bytes[at + 12..at + 16].copy_from_slice(&overflow.to_le_bytes());
    };
    for meta_page in 0..2 {
        header(&mut bytes, meta_page, 0x04, 0, 0);
        let meta = Meta {
            magic: 0xED0C_DAED,
            version: 2,
            page_size: PAGE as u32,
            flags: 0,
            root: 2,
            root_sequence: 0,
            freelist: u64::MAX,
            pgid: PAGES as u64,
            txid: 2 - meta_page as u64,
            checksum: 0,
        };
        reseal_meta(&mut bytes, meta_page, PAGE, meta);
    }
    // page 2: the root bucket's leaf, one bucket "b" rooted at page 3
    header(&mut bytes, 2, 0x02, 1, 0);
    let element = 2 * PAGE + 16;
    bytes[element..element + 4].copy_from_slice(&1u32.to_le_bytes()); // bucket flag
    bytes[element + 4..element + 8].copy_from_slice(&16u32.to_le_bytes()); // pos
    bytes[element + 8..element + 12].copy_from_slice(&1u32.to_le_bytes()); // ksize
    bytes[element + 12..element + 16].copy_from_slice(&16u32.to_le_bytes()); // vsize
    bytes[element + 16] = b'b';
    bytes[element + 17..element + 25].copy_from_slice(&3u64.to_le_bytes());
    // pages 3..: branch pages, each spanning to the end of the file
    for id in 3..PAGES - 1 {
        let overflow = (PAGES - 1 - id) as u32;
        header(&mut bytes, id, 0x01, 1, overflow);
        let element = id * PAGE + 16;
        let child = if cycle { id } else { id + 1 } as u64;
        bytes[element..element + 4].copy_from_slice(&16u32.to_le_bytes()); // pos
        bytes[element + 4..element + 8].copy_from_slice(&1u32.to_le_bytes()); // ksize
        bytes[element + 8..element + 16].copy_from_slice(&child.to_le_bytes());
        bytes[element + 16] = b'k';
        if cycle {
            break;
        }
    }
    bytes
}

#[test]
fn a_path_of_overlapping_pages_is_refused_within_the_files_size() {
    // Found by this harness's bound: a cursor held every page of its path,
    // and a path may revisit (a cycle) or overlap (a page inside another's
    // overflow pages) its pages up to MAX_TREE_DEPTH times: 32 times the
    // file's size for one walk of a hostile file.
    for cycle in [true, false] {
        let bytes = overlapping_path(cycle);
        let (result, peak) = peak_bytes(|| {
            let mut reader = Reader::new(IoCursor::new(&bytes[..])).expect("opens");
            let mut cursor = reader.bucket(b"b").expect("root").expect("bucket b");
            let mut result = Ok(());
            loop {
                match cursor.next(&mut reader) {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            result
        });
        let error = result.expect_err("refused").to_string();
        assert!(error.contains("overlaps"), "cycle {cycle}: {error}");
        assert!(
            peak <= 2 * bytes.len() + 64 * 1024,
            "cycle {cycle}: {peak} bytes held walking a {}-byte file",
            bytes.len()
        );
        // the check finds it too, within the same bound
        let (checked, peak) = peak_bytes(|| {
            Reader::new(IoCursor::new(&bytes[..]))
                .expect("opens")
                .check()
        });
        assert!(checked.is_err());
        assert!(peak <= 2 * bytes.len() + 64 * 1024, "check: {peak}");
    }
}
