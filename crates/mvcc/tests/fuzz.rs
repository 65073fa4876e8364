//! Fuzzing what this crate reads from files it did not just write: the
//! backend file (a member's `snap/db`, or one received from a leader and
//! installed), snapshot files (`oxctl snapshot status|restore`: oxcd's redb
//! ones and etcd's bbolt ones, whose records — keys, leases, the auth
//! store, alarms — are decoded on the way in), and a stored record's
//! encoded KeyValue. Damaged bytes, damaged bytes under a sha256 that
//! matches them, cut files, trailers claiming any length: each is read or
//! refused — never a panic, never an allocation sized by a length read.
//!
//! `FUZZ_SEED` / `FUZZ_RUNS` replay or lengthen a run:
//! `FUZZ_RUNS=2000 cargo test -p mvcc --release --test fuzz`.

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use std::fs;
use std::path::{Path, PathBuf};

use api::etcdserverpb::{PutRequest, RangeRequest};
use api::mvccpb::KeyValue;
use bytes::Bytes;
use fuzz_support::{bounded, mutate, peak_bytes, some_bytes, Fuzz, Meter};
use mvcc::snapshot_file::{write_snapshot, SnapshotFile};
use mvcc::{scan_key_value, SideTable, Store};
use prost::Message;
use sha2::{Digest, Sha256};

#[global_allocator]
static METER: Meter = Meter;

/// A store with history: puts (some leased), a delete, a compaction, and
/// a record in every side table.
fn source_store(dir: &Path) -> Store {
    let store = Store::open(&dir.join("source.db")).expect("open store");
    for round in 0..30u64 {
        let mut txn = store.write(round + 1);
        txn.put(&PutRequest {
            key: Bytes::from(format!("key-{}", round % 7)),
            value: Bytes::from(vec![round as u8; (round as usize * 37) % 300]),
            lease: if round % 5 == 0 { 0x10 } else { 0 },
            ..Default::default()
        })
        .expect("put");
        if round == 20 {
            txn.delete_range(&api::etcdserverpb::DeleteRangeRequest {
                key: Bytes::from_static(b"key-3"),
                ..Default::default()
            })
            .expect("delete");
        }
        txn.end();
    }
    store.compact(10, 31).expect("compact");
    store.put_side(
        SideTable::Leases,
        0x10,
        Some(schema::leases::encode(0x10, 60, 0)),
        32,
    );
    store.put_side(SideTable::Alarms, 1, Some(schema::alarms::encode(1, 1)), 32);
    let auth = api::oxcdauthpb::AuthStore {
        enabled: true,
        revision: 4,
        users: vec![api::authpb::User {
            name: Bytes::from_static(b"root"),
            password: Bytes::from_static(b"$2a$04$hash"),
            roles: vec!["root".into()],
            options: None,
        }],
        roles: vec![api::authpb::Role {
            name: Bytes::from_static(b"root"),
            key_permission: vec![api::authpb::Permission {
                perm_type: 2,
                key: Bytes::from_static(b"a"),
                range_end: Bytes::from_static(b"\0"),
            }],
        }],
    };
    store.put_side(SideTable::Auth, 0, Some(schema::auth::encode(&auth)), 32);
    store.put_member(
        7,
        Some(schema::members::encode(&schema::members::Member {
            id: 7,
            name: "m".into(),
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            client_urls: vec!["http://127.0.0.1:2379".into()],
            is_learner: false,
        })),
        32,
    );
    store.commit(true).expect("commit");
    store
}

/// Page-sized damage where the structure is (headers, the start of
/// pages), and byte-level damage anywhere.
fn damage(rng: &mut fastrand::Rng, bytes: &mut Vec<u8>, page: usize) {
    if rng.bool() {
        mutate(rng, bytes);
        return;
    }
    let pages = bytes.len() / page;
    for _ in 0..rng.usize(1..4) {
        if pages == 0 {
            break;
        }
        let at = rng.usize(..pages) * page
            + if rng.bool() {
                rng.usize(..64)
            } else {
                rng.usize(..page)
            };
        if at < bytes.len() {
            bytes[at] = match rng.u8(..4) {
                0 => 0xff,
                1 => 0,
                _ => rng.u8(..),
            };
        }
    }
}

/// `body` with the sha256 etcd appends, so that the hash check passes and
/// the damage meets the reader.
fn with_sha256(body: &[u8]) -> Vec<u8> {
    let mut file = body.to_vec();
    file.extend_from_slice(&Sha256::digest(body));
    file
}

/// Everything a tool does with a snapshot file.
fn exercise_snapshot_file(path: &Path, dest: &Path) {
    for skip_hash_check in [false, true] {
        let Ok(file) = SnapshotFile::open(path, skip_hash_check) else {
            continue;
        };
        assert!(file.db_len <= file.body_len, "{file:?}");
        let _ = file.status();
        let _ = fs::remove_file(dest);
        let _ = file.restore_to(dest, &[]);
        let _ = fs::remove_file(dest);
    }
}

#[test]
fn damaged_redb_snapshot_files_are_refused_or_read() {
    let fuzz = Fuzz::new("mvcc-redb-snapshots", 60);
    let mut rng = fuzz.rng();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = source_store(dir.path());
    let backup = dir.path().join("backup.db");
    store.backup_to(&backup).expect("backup");
    let mut original = Vec::new();
    write_snapshot(&backup, &mut original).expect("snapshot");
    let body = original[..original.len() - 32].to_vec();
    let (path, dest) = (dir.path().join("snapshot"), dir.path().join("restored.db"));
    for _ in fuzz.iterations() {
        let mut damaged = body.clone();
        damage(&mut rng, &mut damaged, 4096);
        let file = match rng.u8(..3) {
            0 => damaged,
            _ => with_sha256(&damaged),
        };
        fs::write(&path, &file).expect("write");
        exercise_snapshot_file(&path, &dest);
    }
}

#[test]
fn damaged_etcd_snapshot_files_are_refused_or_read() {
    let fuzz = Fuzz::new("mvcc-bbolt-snapshots", 150);
    let mut rng = fuzz.rng();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = source_store(dir.path());
    let bbolt_file = dir.path().join("etcd.db");
    let raft = mvcc::etcd_backend::RaftMeta {
        term: 3,
        voters: vec![7],
        learners: Vec::new(),
    };
    store
        .write_etcd_backend(&bbolt_file, &raft)
        .expect("etcd backend");
    let body = fs::read(&bbolt_file).expect("read");
    let (path, dest) = (dir.path().join("snapshot"), dir.path().join("restored.db"));
    let mut restored = 0;
    for _ in fuzz.iterations() {
        let mut damaged = body.clone();
        damage(&mut rng, &mut damaged, 4096);
        fs::write(&path, with_sha256(&damaged)).expect("write");
        exercise_snapshot_file(&path, &dest);
        let _ = fs::remove_file(&dest);
        if mvcc::etcd_backend::restore_from_bbolt(&path, &dest, &[]).is_ok() {
            restored += 1;
        }
        let _ = fs::remove_file(&dest);
    }
    eprintln!("{} damaged etcd snapshots: {restored} restored", fuzz.runs);
}

/// A sparse file of `len` bytes (`len % 512 == 0`, no sha256) ending in
/// the pad trailer with `db_len`.
fn sparse_snapshot(path: &PathBuf, len: u64, db_len: u64) {
    let file = fs::File::create(path).expect("create");
    file.set_len(len).expect("set_len");
    let mut trailer = b"oxcdpad1".to_vec();
    trailer.extend_from_slice(&db_len.to_be_bytes());
    use std::os::unix::fs::FileExt;
    file.write_all_at(&trailer, len - 16).expect("trailer");
}

#[test]
fn a_pad_trailer_is_checked_without_allocating_the_padding_it_implies() {
    // The trailer is the one length a snapshot file carries: whatever it
    // claims, checking it costs no more than the padding of one database
    // (under 528 bytes), on a 64 GiB (sparse) file as on a small one.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huge");
    const LEN: u64 = 64 << 30;
    for db_len in [1, 513, LEN - 17, LEN - 513, LEN + 1, u64::MAX] {
        sparse_snapshot(&path, LEN, db_len);
        let (file, peak) = peak_bytes(|| SnapshotFile::open(&path, true));
        let file = file.expect("opens with --skip-hash-check");
        assert!(file.db_len <= file.body_len);
        assert!(
            peak < 64 * 1024,
            "{peak} bytes allocated for a trailer claiming {db_len}"
        );
    }
    // the one trailer padding_for writes for a database of LEN - 17 bytes
    sparse_snapshot(&path, LEN, LEN - 17);
    assert_eq!(
        SnapshotFile::open(&path, true).expect("opens").db_len,
        LEN - 17
    );
}

#[test]
fn damaged_backend_files_open_or_are_refused() {
    let fuzz = Fuzz::new("mvcc-backend-files", 60);
    let mut rng = fuzz.rng();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = source_store(dir.path());
    let backup = dir.path().join("backup.db");
    store.backup_to(&backup).expect("backup");
    let original = fs::read(&backup).expect("read");
    let path = dir.path().join("member.db");
    let received = dir.path().join("received.db");
    let (mut opened, mut installed) = (0, 0);
    for _ in fuzz.iterations() {
        let mut damaged = original.clone();
        damage(&mut rng, &mut damaged, 4096);
        // a member's own backend, damaged on disk
        fs::write(&path, &damaged).expect("write");
        if let Ok(store) = Store::open(&path) {
            opened += 1;
            let _ = store.range(&RangeRequest {
                key: Bytes::from_static(b"\0"),
                range_end: Bytes::from_static(b"\0"),
                ..Default::default()
            });
            let _ = store.hash();
            let _ = store.hash_kv(0);
            for side in [
                SideTable::Members,
                SideTable::Leases,
                SideTable::Alarms,
                SideTable::Auth,
            ] {
                let _ = store.side_records(side);
            }
        }
        // a backend received from a leader, installed over a sound one
        fs::write(&received, &damaged).expect("write");
        if store.restore_from(&received).is_ok() {
            installed += 1;
            // an install takes the file itself: a copy of the sound one
            let sound = dir.path().join("sound.db");
            fs::copy(&backup, &sound).expect("copy");
            store
                .restore_from(&sound)
                .expect("a sound backend installs after a damaged one");
        }
        let _ = fs::remove_file(&path);
    }
    eprintln!(
        "{} damaged backends: {opened} opened, {installed} installed",
        fuzz.runs
    );
}

// ---- records ----

fn random_key_value(rng: &mut fastrand::Rng) -> Vec<u8> {
    let number = |rng: &mut fastrand::Rng| match rng.u8(..4) {
        0 => 0,
        1 => i64::MAX,
        2 => -rng.i64(1..100),
        _ => rng.i64(..1000),
    };
    KeyValue {
        key: Bytes::from(some_bytes(rng, 0..16)),
        create_revision: number(rng),
        mod_revision: number(rng),
        version: number(rng),
        value: Bytes::from(some_bytes(rng, 0..32)),
        lease: number(rng),
    }
    .encode_to_vec()
}

#[test]
fn stored_records_scan_as_prost_decodes_them() {
    let fuzz = Fuzz::new("mvcc-records", 20000);
    let mut rng = fuzz.rng();
    let mut agreed = 0;
    for _ in fuzz.iterations() {
        let mut bytes = match rng.u8(..3) {
            0 => some_bytes(&mut rng, 0..40),
            _ => random_key_value(&mut rng),
        };
        if rng.bool() {
            mutate(&mut rng, &mut bytes);
        }
        let scanned = bounded("scan_key_value", bytes.len(), 0, 1024, || {
            scan_key_value(&bytes)
        });
        let decoded = bounded("KeyValue", bytes.len(), 64, 1024, || {
            KeyValue::decode(&bytes[..])
        });
        if let (Ok(scanned), Ok(decoded)) = (&scanned, &decoded) {
            // what both read, both read alike (the index is built from
            // the scan, reads serve prost's decode)
            assert_eq!(scanned.key, &decoded.key[..]);
            assert_eq!(scanned.create_revision, decoded.create_revision);
            assert_eq!(scanned.mod_revision, decoded.mod_revision);
            assert_eq!(scanned.version, decoded.version);
            assert_eq!(scanned.lease, decoded.lease);
            agreed += 1;
        }
    }
    assert!(
        agreed > fuzz.runs / 4,
        "{agreed} of {} records agreed",
        fuzz.runs
    );
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn a_backend_whose_meta_key_is_not_utf8_is_refused_at_open() {
    // Found by `damaged_backend_files_open_or_are_refused`: such a file
    // opened (the meta table was only looked up), and the next full read
    // of it (Maintenance.Hash, a corruption check) panicked in redb. (The
    // integrity check at open now refuses it first; the full read of every
    // table at open stays behind it.)
    let dir = tempfile::tempdir().expect("tempdir");
    let store = source_store(dir.path());
    let backup = dir.path().join("backup.db");
    store.backup_to(&backup).expect("backup");
    let mut bytes = fs::read(&backup).expect("read");
    let at = find(&bytes, b"consistent_index").expect("the meta key is in the file");
    bytes[at + 3] = 0xff;
    let path = dir.path().join("member.db");
    fs::write(&path, &bytes).expect("write");
    let refused = Store::open(&path).err().expect("refused");
    assert!(refused.to_string().contains("is damaged"), "{refused}");
}

#[test]
fn a_backend_damaged_in_redbs_freed_pages_is_refused_at_open_not_an_abort() {
    // Found by `damaged_backend_files_open_or_are_refused` (release build,
    // iteration 55 of its default seed; the file it wrote is the fixture):
    // three bytes of a backup changed, in redb's freed-pages tree. The
    // open's first commit walked that tree, redb panicked in it and again
    // while unwinding (a double panic: the process aborted, past any
    // catch_unwind; in a debug build a debug assertion of redb's panics
    // first, which is caught, so the abort shows in release builds). The
    // integrity check at open refuses the file instead.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("member.db");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/freed_pages_damaged.redb");
    fs::copy(fixture, &path).expect("copy the fixture");
    let refused = Store::open(&path).err().expect("refused");
    assert!(refused.to_string().contains("is damaged"), "{refused}");
}

#[test]
fn a_damaged_backend_received_from_a_leader_is_refused_not_a_panic() {
    // Found by `damaged_backend_files_open_or_are_refused`: installing a
    // received backend read it with redb unguarded, and redb's panic on a
    // damaged page would have stopped the apply thread. Every page's
    // header damaged in turn: refused or installed, and the store goes on.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = source_store(dir.path());
    let backup = dir.path().join("backup.db");
    store.backup_to(&backup).expect("backup");
    let original = fs::read(&backup).expect("read");
    let received = dir.path().join("received.db");
    let mut refused = 0;
    for page in 0..original.len() / 4096 {
        for offset in [0, 1, 2, 4, 8, 12, 16] {
            let mut bytes = original.clone();
            bytes[page * 4096 + offset..page * 4096 + offset + 4].fill(0xff);
            fs::write(&received, &bytes).expect("write");
            if store.restore_from(&received).is_err() {
                refused += 1;
            }
        }
    }
    assert!(refused > 0);
    store
        .restore_from(&backup)
        .expect("a sound backend installs");
    assert_eq!(
        store
            .range(&RangeRequest {
                key: Bytes::from_static(b"key-1"),
                ..Default::default()
            })
            .expect("read")
            .kvs
            .len(),
        1
    );
}

#[test]
fn a_damaged_value_is_named_by_its_records_checksum_not_only_redbs_page_check() {
    // With redb's integrity check at open, a value overwritten on disk
    // fails redb's page checksum first; the refusal still says which
    // record, as the record's own checksum does.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = source_store(dir.path());
    let backup = dir.path().join("backup.db");
    store.backup_to(&backup).expect("backup");
    let mut bytes = fs::read(&backup).expect("read");
    let value = vec![29u8; (29 * 37) % 300];
    let mut copies = 0;
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(value.len()).position(|w| w == value) {
        let start = at + found;
        bytes[start..start + 10].copy_from_slice(b"0123456789");
        copies += 1;
        at = start + value.len();
    }
    assert!(copies > 0);
    let path = dir.path().join("member.db");
    fs::write(&path, &bytes).expect("write");
    let refused = Store::open(&path).err().expect("refused").to_string();
    assert!(
        refused.contains("is damaged") && refused.contains("fails its checksum"),
        "{refused}"
    );
}
