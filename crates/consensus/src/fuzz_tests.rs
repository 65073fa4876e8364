//! Fuzzing what this crate reads from disk and from peers: WAL records and
//! segments, `.snap` files, a member started on a damaged data dir (the
//! WAL's entries, conf changes among them, replayed into raft), raft link
//! frames and the raft messages inside them. Each must be read, repaired
//! or refused — never a panic, never an allocation sized by a length it
//! read rather than by the bytes there.
//!
//! rust-protobuf (raft's messages) allocates a `bytes` field's claimed
//! length before it finds the input shorter, up to its own named cap
//! (`READ_RAW_BYTES_MAX_ALLOC`, 10 MB; untouched pages, freed at once):
//! the bounds below allow that much on top of a per-byte allowance.
//!
//! `FUZZ_SEED` / `FUZZ_RUNS` replay or lengthen a run:
//! `FUZZ_RUNS=20000 cargo test -p consensus --lib fuzz_tests`.

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState,
    Entry, EntryType, HardState, Message, MessageType, Snapshot,
};

use crate::transport::link::{read_frame, LinkBytes, LinkError};
use crate::transport::MAX_PEER_MESSAGE_BYTES;
use crate::wal::record::{self, DecodeError, Metadata, Record, SnapshotMarker, HEADER_LEN};
use crate::wal::{Wal, WalOptions, MAX_RECORD_PAYLOAD};
use fuzz_support::{bounded, mutate, peak_bytes, random_bytes, some_bytes, Fuzz, Meter};

#[global_allocator]
static METER: Meter = Meter;

/// rust-protobuf's `READ_RAW_BYTES_MAX_ALLOC`: what it may allocate for a
/// `bytes` field before it checks that the input holds that many.
const PROTOBUF_UNCHECKED_ALLOCATION: usize = 10_000_000;
/// Decoded structs per byte of input (an empty repeated element is two
/// bytes on the wire and a whole `Entry` in memory).
const BYTES_PER_INPUT_BYTE: usize = 256;
const SLACK_BYTES: usize = 64 * 1024;

fn protobuf_bound<R>(what: &str, input: &[u8], f: impl FnOnce() -> R) -> R {
    bounded(
        what,
        input.len(),
        BYTES_PER_INPUT_BYTE,
        SLACK_BYTES + PROTOBUF_UNCHECKED_ALLOCATION,
        f,
    )
}

// ---- generators ----

/// A u64 as a damaged or hostile file would hold one.
fn extreme(rng: &mut fastrand::Rng) -> u64 {
    match rng.u8(..8) {
        0 => 0,
        1 => u64::MAX,
        2 => u64::MAX - rng.u64(..3),
        3 => fuzz_support::huge(rng),
        _ => rng.u64(..100),
    }
}

fn node_id(rng: &mut fastrand::Rng) -> u64 {
    match rng.u8(..8) {
        0 => 0,
        1 => extreme(rng),
        _ => rng.u64(1..5),
    }
}

fn random_conf_change(rng: &mut fastrand::Rng) -> ConfChange {
    let mut cc = ConfChange {
        node_id: node_id(rng),
        id: rng.u64(..4),
        ..Default::default()
    };
    cc.set_change_type(change_type(rng));
    if rng.bool() {
        cc.context = some_bytes(rng, 0..32).into();
    }
    cc
}

fn change_type(rng: &mut fastrand::Rng) -> ConfChangeType {
    match rng.u8(..3) {
        0 => ConfChangeType::AddNode,
        1 => ConfChangeType::RemoveNode,
        _ => ConfChangeType::AddLearnerNode,
    }
}

fn random_conf_change_v2(rng: &mut fastrand::Rng) -> ConfChangeV2 {
    let mut cc = ConfChangeV2::default();
    cc.set_transition(match rng.u8(..3) {
        0 => ConfChangeTransition::Auto,
        1 => ConfChangeTransition::Implicit,
        _ => ConfChangeTransition::Explicit,
    });
    for _ in 0..rng.usize(0..4) {
        let mut single = ConfChangeSingle {
            node_id: node_id(rng),
            ..Default::default()
        };
        single.set_change_type(change_type(rng));
        cc.mut_changes().push(single);
    }
    cc
}

fn random_entry(rng: &mut fastrand::Rng, index: u64, term: u64) -> Entry {
    let mut entry = Entry {
        index,
        term,
        ..Default::default()
    };
    let data = match rng.u8(..10) {
        0 => {
            entry.set_entry_type(EntryType::EntryConfChange);
            random_conf_change(rng).write_to_bytes().expect("encode")
        }
        1 => {
            entry.set_entry_type(EntryType::EntryConfChangeV2);
            random_conf_change_v2(rng).write_to_bytes().expect("encode")
        }
        2 => {
            // a conf change entry whose bytes are not one
            entry.set_entry_type(if rng.bool() {
                EntryType::EntryConfChange
            } else {
                EntryType::EntryConfChangeV2
            });
            some_bytes(rng, 0..16)
        }
        _ => some_bytes(rng, 0..100),
    };
    entry.data = data.into();
    if rng.u8(..8) == 0 {
        entry.context = some_bytes(rng, 0..8).into();
    }
    entry
}

/// A [`random_entry`] whose conf change, if it is one, decodes: what a
/// member's own WAL holds.
fn sound_entry(rng: &mut fastrand::Rng, index: u64, term: u64) -> Entry {
    loop {
        let entry = random_entry(rng, index, term);
        let decodes = match entry.get_entry_type() {
            EntryType::EntryNormal => true,
            EntryType::EntryConfChange => ConfChange::parse_from_bytes(&entry.data).is_ok(),
            EntryType::EntryConfChangeV2 => ConfChangeV2::parse_from_bytes(&entry.data).is_ok(),
        };
        if decodes {
            return entry;
        }
    }
}

fn random_conf_state(rng: &mut fastrand::Rng) -> ConfState {
    let ids = |rng: &mut fastrand::Rng| (0..rng.usize(0..4)).map(|_| node_id(rng)).collect();
    ConfState {
        voters: ids(rng),
        learners: ids(rng),
        voters_outgoing: if rng.u8(..4) == 0 {
            ids(rng)
        } else {
            Vec::new()
        },
        learners_next: if rng.u8(..4) == 0 {
            ids(rng)
        } else {
            Vec::new()
        },
        auto_leave: rng.bool(),
        ..Default::default()
    }
}

fn random_snapshot(rng: &mut fastrand::Rng) -> Snapshot {
    let mut snapshot = Snapshot::default();
    let metadata = snapshot.mut_metadata();
    metadata.index = extreme(rng);
    metadata.term = extreme(rng);
    metadata.set_conf_state(random_conf_state(rng));
    if rng.u8(..4) == 0 {
        snapshot.data = some_bytes(rng, 0..64).into();
    }
    snapshot
}

fn random_message(rng: &mut fastrand::Rng) -> Message {
    let mut message = Message {
        to: node_id(rng),
        from: node_id(rng),
        term: extreme(rng),
        log_term: extreme(rng),
        index: extreme(rng),
        commit: extreme(rng),
        commit_term: extreme(rng),
        reject: rng.bool(),
        reject_hint: extreme(rng),
        request_snapshot: extreme(rng),
        priority: extreme(rng) as i64,
        ..Default::default()
    };
    message.set_msg_type(
        protobuf::ProtobufEnum::from_i32(rng.i32(0..19)).unwrap_or(MessageType::MsgHeartbeat),
    );
    for i in 0..rng.usize(0..4) {
        let entry = random_entry(rng, message.index.wrapping_add(i as u64 + 1), message.term);
        message.mut_entries().push(entry);
    }
    if rng.u8(..4) == 0 {
        message.set_snapshot(random_snapshot(rng));
    }
    if rng.u8(..4) == 0 {
        message.context = some_bytes(rng, 0..16).into();
    }
    message
}

fn random_record(rng: &mut fastrand::Rng) -> Record {
    match rng.u8(..4) {
        0 => Record::Metadata(Metadata {
            node_id: extreme(rng),
            cluster_id: extreme(rng),
            initial_voters: (0..rng.usize(0..5)).map(|_| node_id(rng)).collect(),
        }),
        1 => {
            let (index, term) = (extreme(rng), extreme(rng));
            Record::Entry(random_entry(rng, index, term))
        }
        2 => Record::HardState(HardState {
            term: extreme(rng),
            vote: node_id(rng),
            commit: extreme(rng),
            ..Default::default()
        }),
        _ => Record::Snapshot(SnapshotMarker {
            term: extreme(rng),
            index: extreme(rng),
        }),
    }
}

/// A record with any type byte, payload and claimed length, under CRCs
/// that pass: what a bug (or a hand) could write, past every checksum.
fn sealed(kind: u8, payload: &[u8], claimed_len: u32) -> Vec<u8> {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(payload);
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&claimed_len.to_le_bytes());
    header[4..8].copy_from_slice(&crc.finalize().to_le_bytes());
    header[8] = kind;
    let header_crc = crc32fast::hash(&header[0..12]);
    header[12..16].copy_from_slice(&header_crc.to_le_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(payload);
    out
}

/// The payload of a random record, damaged or not, sealed as a record of
/// its own type or another.
fn resealed_record(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut encoded = Vec::new();
    record::encode(&random_record(rng), &mut encoded);
    let mut payload = encoded[HEADER_LEN..].to_vec();
    if rng.u8(..4) != 0 {
        mutate(rng, &mut payload);
    }
    let kind = if rng.u8(..4) == 0 {
        rng.u8(..)
    } else {
        encoded[8]
    };
    sealed(kind, &payload, payload.len() as u32)
}

// ---- WAL records ----

#[test]
fn wal_records_decode_to_what_was_written_or_are_refused() {
    let fuzz = Fuzz::new("wal-records", 4000);
    let mut rng = fuzz.rng();
    let (mut damaged_read, mut resealed_read) = (0, 0);
    for _ in fuzz.iterations() {
        let record = random_record(&mut rng);
        let mut bytes = Vec::new();
        record::encode(&record, &mut bytes);
        let (decoded, len) = record::decode(&bytes).expect("a record as written decodes");
        assert_eq!(decoded, record);
        assert_eq!(len, bytes.len());

        let mut damaged = bytes.clone();
        mutate(&mut rng, &mut damaged);
        if let Ok((_, len)) =
            protobuf_bound("damaged record", &damaged, || record::decode(&damaged))
        {
            assert!((HEADER_LEN..=damaged.len()).contains(&len));
            damaged_read += 1;
        }

        let resealed = resealed_record(&mut rng);
        if let Ok((_, len)) =
            protobuf_bound("resealed record", &resealed, || record::decode(&resealed))
        {
            assert_eq!(len, resealed.len());
            resealed_read += 1;
        }
    }
    eprintln!(
        "{} runs: {damaged_read} damaged and {resealed_read} resealed records read",
        fuzz.runs
    );
}

#[test]
fn a_record_claiming_more_than_is_there_is_refused_without_allocating_it() {
    let fuzz = Fuzz::new("wal-record-lengths", 2000);
    let mut rng = fuzz.rng();
    for _ in fuzz.iterations() {
        let claimed = match rng.u8(..3) {
            0 => u32::MAX,
            1 => MAX_RECORD_PAYLOAD + rng.u32(1..1000),
            _ => rng.u32(1..MAX_RECORD_PAYLOAD),
        };
        let present = some_bytes(&mut rng, 0..64);
        let claimed = claimed.max(present.len() as u32 + 1);
        let bytes = sealed(rng.u8(1..5), &present, claimed);
        let (result, peak) = peak_bytes(|| record::decode(&bytes));
        let expected = if claimed > MAX_RECORD_PAYLOAD {
            DecodeError::BadHeader
        } else {
            DecodeError::Incomplete
        };
        assert_eq!(result.err(), Some(expected), "claimed {claimed}");
        assert!(
            peak < 1024,
            "{peak} bytes allocated refusing a {claimed}-byte record"
        );
    }
}

#[test]
fn wal_snapshot_marker_at_u64_max_does_not_overflow_replay() {
    // Found by `damaged_wal_segments_are_read_repaired_or_refused`: replay
    // computed `snapshot_index + 1` for an entry after a gap.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut segment = Vec::new();
    let metadata = Metadata {
        node_id: MEMBER,
        cluster_id: 1,
        initial_voters: vec![MEMBER],
    };
    record::encode(&Record::Metadata(metadata), &mut segment);
    let marker = SnapshotMarker {
        term: 1,
        index: u64::MAX,
    };
    record::encode(&Record::Snapshot(marker), &mut segment);
    for index in [1, 2, 7] {
        record::encode(
            &Record::Entry(random_entry(&mut fastrand::Rng::with_seed(index), index, 1)),
            &mut segment,
        );
    }
    fs::write(
        dir.path().join("0000000000000000-0000000000000000.wal"),
        &segment,
    )
    .expect("write");
    // every index is at or below the marker's: the log restarts at 7
    let contents = Wal::read(dir.path()).expect("read");
    assert_eq!(contents.entries.len(), 1);
    assert_eq!(contents.entries[0].index, 7);
}

// ---- WAL segments ----

const SEGMENT_BYTES: u64 = 512;

fn wal_options() -> WalOptions {
    WalOptions {
        segment_bytes: SEGMENT_BYTES,
        unsafe_no_fsync: true,
        ..Default::default()
    }
}

/// The member the damaged WALs belong to.
const MEMBER: u64 = 1;

/// Writes a WAL of several segments: entries (conf changes among them), a
/// conflict that overwrites a tail, hard states and a snapshot marker.
/// Returns each segment's name and bytes.
fn write_wal(rng: &mut fastrand::Rng, dir: &Path) -> Vec<(String, Vec<u8>)> {
    let metadata = Metadata {
        node_id: MEMBER,
        cluster_id: 0xc1,
        initial_voters: vec![MEMBER],
    };
    let mut wal = Wal::create(dir, metadata, wal_options()).expect("create WAL");
    let mut term = 1;
    let mut index = 0;
    for round in 0..40 {
        if round == 25 {
            // a new leader overwrites the last few entries
            term += 1;
            index -= 3;
        }
        index += 1;
        let entry = sound_entry(rng, index, term);
        let hard_state = HardState {
            term,
            vote: MEMBER,
            commit: index.saturating_sub(2),
            ..Default::default()
        };
        wal.append(&[entry], (round % 4 == 0).then_some(&hard_state));
        if round == 30 {
            wal.save_snapshot(SnapshotMarker { term, index: 10 });
        }
        wal.sync().expect("sync WAL");
    }
    let paths = wal.segment_paths();
    drop(wal);
    assert!(paths.len() > 3, "the WAL spans several segments");
    paths
        .iter()
        .map(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).expect("name");
            (name.to_string(), fs::read(p).expect("read segment"))
        })
        .collect()
}

/// The offsets where records start in `segment`, as far as they decode.
fn record_starts(segment: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut offset = 0;
    while let Ok((_, len)) = record::decode(&segment[offset..]) {
        starts.push(offset);
        offset += len;
    }
    starts
}

/// Replaces one record of one segment with a random sound one.
fn replace_a_record(rng: &mut fastrand::Rng, segments: &mut [(String, Vec<u8>)]) {
    let which = rng.usize(..segments.len());
    let bytes = &mut segments[which].1;
    let starts = record_starts(bytes);
    // not the metadata record every segment starts with
    if starts.len() < 2 {
        return;
    }
    let at = starts[rng.usize(1..starts.len())];
    let end = record::decode(&bytes[at..]).map_or(at, |(_, len)| at + len);
    let mut replacement = Vec::new();
    let record = match random_record(rng) {
        Record::Metadata(_) => Record::HardState(HardState {
            term: rng.u64(..4),
            vote: node_id(rng),
            commit: rng.u64(..45),
            ..Default::default()
        }),
        Record::Entry(_) => {
            let (index, term) = (rng.u64(1..45), rng.u64(..4));
            Record::Entry(sound_entry(rng, index, term))
        }
        other => other,
    };
    record::encode(&record, &mut replacement);
    bytes.splice(at..end, replacement);
}

/// Damages a copy of a WAL's segments in one to three ways.
fn damage_wal(rng: &mut fastrand::Rng, segments: &mut Vec<(String, Vec<u8>)>) {
    for _ in 0..rng.usize(1..4) {
        if segments.is_empty() {
            return;
        }
        let which = rng.usize(..segments.len());
        let bytes = &mut segments[which].1;
        let starts = record_starts(bytes);
        let at = if starts.is_empty() || rng.u8(..4) == 0 {
            rng.usize(..=bytes.len())
        } else {
            starts[rng.usize(..starts.len())]
        };
        match rng.u8(..9) {
            0 | 1 => mutate(rng, bytes),
            2 => {
                // a record replaced by another that passes its CRCs
                let end = record::decode(&bytes[at..]).map_or(at, |(_, len)| at + len);
                let replacement = if rng.bool() {
                    resealed_record(rng)
                } else {
                    let mut encoded = Vec::new();
                    record::encode(&random_record(rng), &mut encoded);
                    encoded
                };
                bytes.splice(at..end, replacement);
            }
            3 => {
                // a sound header claiming a huge or short payload
                let present = some_bytes(rng, 0..32);
                let claimed = if rng.bool() {
                    fuzz_support::huge(rng) as u32
                } else {
                    rng.u32(..64)
                };
                bytes.splice(at..at, sealed(rng.u8(1..5), &present, claimed));
            }
            4 => bytes.truncate(at),
            5 => {
                let tail = if rng.bool() {
                    vec![0u8; rng.usize(1..200)]
                } else {
                    some_bytes(rng, 1..40)
                };
                bytes.extend(tail);
            }
            6 => {
                segments.remove(which);
            }
            7 => {
                // renamed: another sequence number or first index
                let (seq, index) = (rng.u64(..6), extreme(rng));
                segments[which].0 = format!("{seq:016x}-{index:016x}.wal");
            }
            _ => {
                // a record written twice
                if let Ok((_, len)) = record::decode(&bytes[at..]) {
                    let copy = bytes[at..at + len].to_vec();
                    bytes.splice(at..at, copy);
                }
            }
        }
    }
}

fn write_segments(dir: &Path, segments: &[(String, Vec<u8>)]) {
    if dir.exists() {
        fs::remove_dir_all(dir).expect("clear WAL dir");
    }
    fs::create_dir_all(dir).expect("WAL dir");
    for (name, bytes) in segments {
        fs::write(dir.join(name), bytes).expect("write segment");
    }
}

/// What any WAL that reads must hold: entries without a gap.
fn check_contents(entries: &[Entry]) {
    for pair in entries.windows(2) {
        assert_eq!(
            pair[1].index,
            pair[0].index + 1,
            "the log read has a gap or a step back"
        );
    }
}

#[test]
fn damaged_wal_segments_are_read_repaired_or_refused() {
    let fuzz = Fuzz::new("wal-segments", 300);
    let mut rng = fuzz.rng();
    let root = tempfile::tempdir().expect("tempdir");
    let originals = write_wal(&mut rng, &root.path().join("original"));
    let dir = root.path().join("wal");
    let (mut read, mut opened) = (0, 0);
    for iteration in fuzz.iterations() {
        let mut segments = originals.clone();
        damage_wal(&mut rng, &mut segments);
        write_segments(&dir, &segments);
        let _ = Wal::read_metadata(&dir);
        if let Ok(contents) = Wal::read(&dir) {
            read += 1;
            check_contents(&contents.entries);
        }
        // Opening repairs a torn tail in place: not every time (it syncs).
        if iteration % 4 == 0 {
            if let Ok((_, contents)) = Wal::open(&dir, wal_options()) {
                opened += 1;
                check_contents(&contents.entries);
                // what an open left (repaired) opens again the same
                let (_, again) = Wal::open(&dir, wal_options()).expect("a repaired WAL opens");
                assert_eq!(again.entries, contents.entries);
            }
        }
    }
    eprintln!("{} damaged WALs: {read} read, {opened} opened", fuzz.runs);
}

// ---- .snap files ----

#[test]
fn snap_files_decode_to_what_was_written_or_are_refused() {
    let fuzz = Fuzz::new("snap-files", 3000);
    let mut rng = fuzz.rng();
    let mut resealed_read = 0;
    for _ in fuzz.iterations() {
        let snapshot = random_snapshot(&mut rng);
        let bytes = crate::snap::encode(&snapshot);
        let decoded = crate::snap::decode(&bytes);
        if crate::snap::restorable(snapshot.get_metadata().get_conf_state()) {
            assert_eq!(decoded.as_ref(), Ok(&snapshot));
        } else {
            assert!(
                decoded.is_err(),
                "a configuration raft cannot restore is refused"
            );
        }

        let mut damaged = bytes.clone();
        mutate(&mut rng, &mut damaged);
        let _ = protobuf_bound("damaged .snap", &damaged, || crate::snap::decode(&damaged));

        // a damaged body under a header that matches it
        let mut body = bytes[20..].to_vec();
        mutate(&mut rng, &mut body);
        let mut resealed = bytes[..12].to_vec();
        resealed.extend_from_slice(&(body.len() as u32).to_le_bytes());
        resealed.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        resealed.extend_from_slice(&body);
        if protobuf_bound("resealed .snap", &resealed, || {
            crate::snap::decode(&resealed)
        })
        .is_ok()
        {
            resealed_read += 1;
        }

        // a header claiming a huge body
        let mut huge = bytes.clone();
        huge[12..16].copy_from_slice(&(fuzz_support::huge(&mut rng) as u32).to_le_bytes());
        if huge[12..16] != bytes[12..16] {
            let (result, peak) = peak_bytes(|| crate::snap::decode(&huge));
            assert!(result.is_err());
            assert!(peak < 4096, "{peak} bytes allocated for a bad length");
        }
    }
    eprintln!(
        "{} runs: {resealed_read} resealed bodies decoded",
        fuzz.runs
    );
}

/// A member dir's snap files, some damaged or misnamed.
fn write_snap_files(rng: &mut fastrand::Rng, dir: &Path) {
    fs::create_dir_all(dir).expect("snap dir");
    for _ in 0..rng.usize(0..3).saturating_sub(rng.usize(0..2)) {
        let mut snapshot = random_snapshot(rng);
        if rng.bool() {
            // one that fits the WAL written by `write_wal`
            let metadata = snapshot.mut_metadata();
            metadata.index = rng.u64(..45);
            metadata.term = rng.u64(1..3);
            metadata.mut_conf_state().voters = vec![MEMBER];
        }
        let mut bytes = crate::snap::encode(&snapshot);
        if rng.u8(..3) == 0 {
            mutate(rng, &mut bytes);
        }
        let metadata = snapshot.get_metadata();
        let (term, index) = if rng.u8(..4) == 0 {
            (rng.u64(..3), rng.u64(..50))
        } else {
            (metadata.term, metadata.index)
        };
        let name = crate::snap::snap_name(term, index);
        fs::write(dir.join(name), bytes).expect("write snap file");
    }
}

#[test]
fn damaged_snap_dirs_load_a_snapshot_or_none() {
    let fuzz = Fuzz::new("snap-dirs", 300);
    let mut rng = fuzz.rng();
    let root = tempfile::tempdir().expect("tempdir");
    for iteration in fuzz.iterations() {
        let dir = root.path().join(format!("snap-{iteration}"));
        write_snap_files(&mut rng, &dir);
        if let Ok(Some(snapshot)) = crate::snap::load_newest(&dir) {
            let metadata = snapshot.get_metadata();
            let name = crate::snap::snap_name(metadata.term, metadata.index);
            assert!(dir.join(name).exists(), "loaded from the file it names");
        }
        fs::remove_dir_all(&dir).expect("clear snap dir");
    }
}

// ---- a member started on a damaged data dir ----

#[test]
fn a_member_starts_or_refuses_on_a_damaged_data_dir() {
    let fuzz = Fuzz::new("member-start", 60);
    let mut rng = fuzz.rng();
    let root = tempfile::tempdir().expect("tempdir");
    let originals = write_wal(&mut rng, &root.path().join("original"));
    let (mut started, mut refused) = (0, 0);
    for iteration in fuzz.iterations() {
        let member_dir = root.path().join(format!("member-{iteration}"));
        let mut segments = originals.clone();
        match rng.u8(..3) {
            0 => {}
            // one record replaced by another whose CRCs pass: raft meets
            // what it holds (terms, indexes, conf changes, hard states)
            1 => replace_a_record(&mut rng, &mut segments),
            _ => damage_wal(&mut rng, &mut segments),
        }
        write_segments(&member_dir.join("wal"), &segments);
        write_snap_files(&mut rng, &member_dir.join("snap"));
        let config = crate::RaftConfig {
            id: MEMBER,
            member_dir: member_dir.clone(),
            wal_dir: member_dir.join("wal"),
            voters: vec![MEMBER],
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(1000),
            // the backend's applied index: anywhere around the log
            applied: match rng.u8(..8) {
                0 => extreme(&mut rng),
                1 => rng.u64(..50),
                _ => rng.u64(..=37),
            },
            cluster_id: 0xc1,
            force_new_cluster: rng.u8(..8) == 0,
        };
        let options = crate::StartOptions {
            wal: wal_options(),
            ..Default::default()
        };
        match crate::start_with_options(config, Arc::new(crate::NoopTransport), options) {
            Ok((handle, _committed)) => {
                started += 1;
                handle.stop();
                if let Some(cause) = handle.fatal().cause() {
                    assert!(!cause.contains("panicked"), "{cause}");
                }
            }
            Err(_) => refused += 1,
        }
        let _ = fs::remove_dir_all(&member_dir);
    }
    eprintln!(
        "{} damaged data dirs: {started} started, {refused} refused",
        fuzz.runs
    );
}

#[test]
fn force_new_cluster_with_an_applied_index_beyond_the_log_is_refused_not_a_raft_panic() {
    // Found by `a_member_starts_or_refuses_on_a_damaged_data_dir`: the
    // forced conf changes were placed after the backend's applied index,
    // past a gap, and raft's MemStorage indexed out of bounds.
    let root = tempfile::tempdir().expect("tempdir");
    let segments = write_wal(
        &mut fastrand::Rng::with_seed(7),
        &root.path().join("original"),
    );
    let member_dir = root.path().join("member");
    write_segments(&member_dir.join("wal"), &segments);
    for applied in [1000, u64::MAX] {
        let config = crate::RaftConfig {
            id: MEMBER,
            member_dir: member_dir.clone(),
            wal_dir: member_dir.join("wal"),
            voters: vec![MEMBER],
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(1000),
            applied,
            cluster_id: 0xc1,
            force_new_cluster: true,
        };
        let options = crate::StartOptions {
            wal: wal_options(),
            ..Default::default()
        };
        match crate::start_with_options(config, Arc::new(crate::NoopTransport), options) {
            Err(crate::ConsensusError::Corrupt(reason)) => {
                assert!(reason.contains("beyond the log's last index"), "{reason}")
            }
            Err(e) => panic!("applied {applied}: {e}"),
            Ok(_) => panic!("applied {applied}: started"),
        }
    }
    // nothing was written: the WAL reads as before
    let contents = Wal::read(&member_dir.join("wal")).expect("read");
    assert_eq!(contents.entries.last().map(|e| e.index), Some(37));
}

// ---- raft links ----

/// A stream as a peer could send it: frames of raft messages (sound,
/// damaged or noise), perhaps one claiming too much, perhaps cut short.
/// Returns it with the payload lengths a reader should find, in order,
/// and whether it ends in the middle of a frame or with one too large.
fn random_stream(rng: &mut fastrand::Rng) -> (Vec<u8>, Vec<usize>, Ending) {
    let mut stream = Vec::new();
    let mut lengths = Vec::new();
    for _ in 0..rng.usize(0..6) {
        let payload = match rng.u8(..4) {
            0 => some_bytes(rng, 0..40),
            1 => {
                let mut bytes = random_message(rng).write_to_bytes().expect("encode");
                mutate(rng, &mut bytes);
                bytes
            }
            _ => random_message(rng).write_to_bytes().expect("encode"),
        };
        stream.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        stream.extend_from_slice(&payload);
        lengths.push(payload.len());
    }
    let ending = match rng.u8(..4) {
        0 => {
            let claimed = if rng.bool() {
                u32::MAX
            } else {
                MAX_PEER_MESSAGE_BYTES as u32 + rng.u32(1..1 << 20)
            };
            stream.extend_from_slice(&claimed.to_le_bytes());
            stream.extend(some_bytes(rng, 0..16));
            Ending::TooLarge
        }
        1 => {
            let claimed = rng.u32(1..=MAX_PEER_MESSAGE_BYTES as u32);
            stream.extend_from_slice(&claimed.to_le_bytes());
            let sent = rng.usize(..(claimed as usize).min(100));
            stream.extend(random_bytes(rng, sent));
            Ending::Truncated
        }
        2 => {
            // a length prefix itself cut short: the link closed
            stream.extend(some_bytes(rng, 0..4));
            Ending::Closed
        }
        _ => Ending::Closed,
    };
    (stream, lengths, ending)
}

#[derive(Debug, PartialEq)]
enum Ending {
    Closed,
    TooLarge,
    Truncated,
}

fn link_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

#[test]
fn raft_link_frames_are_read_whole_or_close_the_link() {
    let fuzz = Fuzz::new("raft-frames", 2000);
    let mut rng = fuzz.rng();
    let runtime = link_runtime();
    let total = AtomicUsize::new(0);
    for _ in fuzz.iterations() {
        let (stream, lengths, ending) = random_stream(&mut rng);
        let mut reader = &stream[..];
        let mut payload = Vec::new();
        let mut frames = Vec::new();
        let outcome = loop {
            let mut budget = LinkBytes::new(&total);
            let before = reader.len();
            let (read, peak) =
                peak_bytes(|| runtime.block_on(read_frame(&mut reader, &mut payload, &mut budget)));
            // a frame's buffer follows the bytes received (a chunk ahead,
            // doubled as a Vec grows), never its claim
            let received = before - reader.len();
            assert!(
                peak <= 2 * (received + 64 * 1024) + 1024,
                "{peak} bytes allocated reading {received}"
            );
            match read {
                Ok(true) => {
                    frames.push(payload.len());
                    if let Ok(message) = protobuf_bound("raft message", &payload, || {
                        Message::parse_from_bytes(&payload)
                    }) {
                        let again = message.write_to_bytes().expect("re-encode");
                        assert_eq!(
                            Message::parse_from_bytes(&again).ok().as_ref(),
                            Some(&message)
                        );
                    }
                }
                Ok(false) => break Ending::Closed,
                Err(LinkError::TooLarge(_)) => break Ending::TooLarge,
                Err(LinkError::Truncated) => break Ending::Truncated,
                Err(e) => panic!("unexpected link error {e}"),
            }
        };
        assert_eq!(frames, lengths);
        assert_eq!(outcome, ending);
        assert_eq!(
            total.load(Ordering::Acquire),
            0,
            "every frame's bytes given back"
        );
    }
}

#[test]
fn a_frame_claiming_gigabytes_is_refused_before_any_is_allocated() {
    let runtime = link_runtime();
    let total = AtomicUsize::new(0);
    for claimed in [u32::MAX, MAX_PEER_MESSAGE_BYTES as u32 + 1, 1 << 31] {
        let mut stream = claimed.to_le_bytes().to_vec();
        stream.extend_from_slice(&[7u8; 100]);
        let mut reader = &stream[..];
        let mut payload = Vec::new();
        let mut budget = LinkBytes::new(&total);
        let (read, peak) =
            peak_bytes(|| runtime.block_on(read_frame(&mut reader, &mut payload, &mut budget)));
        assert!(matches!(read, Err(LinkError::TooLarge(_))), "{read:?}");
        assert!(peak < 1024, "{peak} bytes allocated refusing {claimed}");
    }
    // the largest allowed, with almost nothing behind it: one chunk at most
    let mut stream = (MAX_PEER_MESSAGE_BYTES as u32).to_le_bytes().to_vec();
    stream.extend_from_slice(&[7u8; 10]);
    let mut reader = &stream[..];
    let mut payload = Vec::new();
    let mut budget = LinkBytes::new(&total);
    let (read, peak) =
        peak_bytes(|| runtime.block_on(read_frame(&mut reader, &mut payload, &mut budget)));
    assert!(matches!(read, Err(LinkError::Truncated)), "{read:?}");
    assert!(
        peak <= 2 * 65 * 1024,
        "{peak} bytes allocated for 10 received"
    );
    drop(budget);
    assert_eq!(total.load(Ordering::Acquire), 0);
}

// ---- raft's messages ----

/// Parses `bytes` as `T` within the allocation bound; what parses
/// re-encodes to something that parses to it again.
fn parse<T: protobuf::Message + PartialEq + std::fmt::Debug>(what: &str, bytes: &[u8]) -> bool {
    let Ok(message) = protobuf_bound(what, bytes, || T::parse_from_bytes(bytes)) else {
        return false;
    };
    let again = message.write_to_bytes().expect("re-encode");
    assert_eq!(
        T::parse_from_bytes(&again).ok().as_ref(),
        Some(&message),
        "{what}"
    );
    true
}

#[test]
fn raft_messages_from_any_bytes_decode_or_are_refused() {
    let fuzz = Fuzz::new("raft-messages", 3000);
    let mut rng = fuzz.rng();
    let mut decoded = 0;
    for _ in fuzz.iterations() {
        let mut bytes = match rng.u8(..6) {
            0 => random_message(&mut rng).write_to_bytes(),
            1 => random_snapshot(&mut rng).write_to_bytes(),
            2 => random_conf_change(&mut rng).write_to_bytes(),
            3 => random_conf_change_v2(&mut rng).write_to_bytes(),
            4 => random_entry(&mut rng, 1, 1).write_to_bytes(),
            _ => Ok(some_bytes(&mut rng, 0..64)),
        }
        .expect("encode");
        if rng.u8(..4) != 0 {
            mutate(&mut rng, &mut bytes);
        }
        for ok in [
            parse::<Message>("Message", &bytes),
            parse::<Entry>("Entry", &bytes),
            parse::<Snapshot>("Snapshot", &bytes),
            parse::<ConfChange>("ConfChange", &bytes),
            parse::<ConfChangeV2>("ConfChangeV2", &bytes),
            parse::<HardState>("HardState", &bytes),
        ] {
            decoded += usize::from(ok);
        }
    }
    eprintln!("{} inputs: {decoded} decodes", fuzz.runs);
}
