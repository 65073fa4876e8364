use super::*;
use std::fs;

fn meta() -> Metadata {
    Metadata {
        node_id: 0x8e9e05c52164694d,
        cluster_id: 0xcdf818194e3a8c32,
        initial_voters: vec![0x8e9e05c52164694d],
    }
}

fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
    Entry {
        index,
        term,
        data: data.to_vec().into(),
        ..Default::default()
    }
}

fn hs(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

fn indexes(c: &WalContents) -> Vec<u64> {
    c.entries.iter().map(|e| e.index).collect()
}

/// Writes `n` entries, one sync each; returns the single segment's path.
fn write_log(dir: &Path, n: u64) -> PathBuf {
    let mut wal = Wal::create(dir, meta(), WalOptions::default()).unwrap();
    for i in 1..=n {
        wal.append(
            &[entry(i, 1, format!("value-{i}").as_bytes())],
            Some(&hs(1, 1, i)),
        );
        wal.sync().unwrap();
    }
    wal.segment_paths().pop().unwrap()
}

#[test]
fn wal_round_trips_entries_hard_state_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), 10);
    assert_eq!(
        path.file_name().unwrap().to_str().unwrap(),
        "0000000000000000-0000000000000000.wal"
    );
    let (wal, c) = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(c.metadata, meta());
    assert_eq!(indexes(&c), (1..=10).collect::<Vec<_>>());
    assert_eq!(c.entries[4].data.as_ref(), b"value-5");
    assert_eq!(c.hard_state, hs(1, 1, 10));
    assert_eq!(c.repaired_bytes, 0);
    assert_eq!(wal.sync_count(), 0);
}

#[test]
fn wal_append_after_reopen_continues_the_log() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 3);
    let (mut wal, _) = Wal::open(dir.path(), WalOptions::default()).unwrap();
    wal.append(&[entry(4, 2, b"x")], Some(&hs(2, 1, 4)));
    wal.sync().unwrap();
    drop(wal);
    let (_, c) = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(indexes(&c), vec![1, 2, 3, 4]);
    assert_eq!(c.hard_state.term, 2);
}

#[test]
fn wal_conflicting_entry_overwrites_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), meta(), WalOptions::default()).unwrap();
    wal.append(
        &[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")],
        None,
    );
    wal.sync().unwrap();
    // a new leader at term 2 overwrites index 2 onwards
    wal.append(&[entry(2, 2, b"B")], None);
    wal.sync().unwrap();
    drop(wal);
    let (_, c) = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(indexes(&c), vec![1, 2]);
    assert_eq!(c.entries[1].term, 2);
    assert_eq!(c.entries[1].data.as_ref(), b"B");
}

#[test]
fn wal_torn_tail_at_every_offset_of_last_record_opens_with_earlier_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), 5);
    let full = fs::read(&path).unwrap();
    // find where the last record (the hard state after entry 5) and the last
    // entry start: re-encode them.
    let mut last_two = Vec::new();
    record::encode(&Record::Entry(entry(5, 1, b"value-5")), &mut last_two);
    let entry5_len = last_two.len();
    record::encode(&Record::HardState(hs(1, 1, 5)), &mut last_two);
    let entry5_start = full.len() - last_two.len();
    let hs5_start = entry5_start + entry5_len;
    for cut in entry5_start..full.len() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(path.file_name().unwrap());
        fs::write(&p, &full[..cut]).unwrap();
        let (mut wal, c) = Wal::open(d.path(), WalOptions::default())
            .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        let expect_last = if cut >= hs5_start { 5 } else { 4 };
        assert_eq!(*indexes(&c).last().unwrap(), expect_last, "cut at {cut}");
        let expect_len = if cut >= hs5_start {
            hs5_start
        } else {
            entry5_start
        };
        assert_eq!(
            fs::metadata(&p).unwrap().len(),
            expect_len as u64,
            "cut at {cut}"
        );
        // the repaired WAL accepts appends and reads back cleanly
        wal.append(&[entry(expect_last + 1, 1, b"after")], None);
        wal.sync().unwrap();
        drop(wal);
        let (_, c) = Wal::open(d.path(), WalOptions::default()).unwrap();
        assert_eq!(
            *indexes(&c).last().unwrap(),
            expect_last + 1,
            "cut at {cut}"
        );
    }
}

#[test]
fn wal_zero_filled_tail_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), 3);
    let mut bytes = fs::read(&path).unwrap();
    let len = bytes.len();
    bytes.extend_from_slice(&[0u8; 4096]);
    fs::write(&path, &bytes).unwrap();
    let (_, c) = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(indexes(&c), vec![1, 2, 3]);
    assert_eq!(fs::metadata(&path).unwrap().len(), len as u64);
}

#[test]
fn wal_refuses_to_open_when_a_byte_is_flipped_mid_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), 5);
    let full = fs::read(&path).unwrap();
    let mut tail = Vec::new();
    record::encode(&Record::HardState(hs(1, 1, 5)), &mut tail);
    // every byte before the final record is "mid-log"
    for pos in 0..full.len() - tail.len() {
        let mut bytes = full.clone();
        bytes[pos] ^= 0x40;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(path.file_name().unwrap());
        fs::write(&p, &bytes).unwrap();
        match Wal::open(d.path(), WalOptions::default()) {
            Err(WalError::Corrupt {
                path: bad,
                offset,
                reason,
            }) => {
                assert_eq!(bad, p, "flip at {pos}");
                assert!(offset <= pos as u64, "flip at {pos}: offset {offset}");
                let msg = WalError::Corrupt {
                    path: bad,
                    offset,
                    reason,
                }
                .to_string();
                assert!(msg.contains(".wal") && msg.contains("offset"), "{msg}");
            }
            Err(e) => panic!("flip at {pos}: unexpected error {e}"),
            Ok((_, c)) => panic!("flip at {pos}: opened with {:?}", indexes(&c)),
        }
        // nothing was truncated
        assert_eq!(fs::read(&p).unwrap(), bytes);
    }
}

#[test]
fn wal_refuses_damage_in_a_sealed_segment() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WalOptions { segment_bytes: 256 };
    let mut wal = Wal::create(dir.path(), meta(), opts.clone()).unwrap();
    for i in 1..=20 {
        wal.append(&[entry(i, 1, &[7u8; 64])], None);
        wal.sync().unwrap();
    }
    let segments = wal.segment_paths();
    assert!(segments.len() > 3, "{segments:?}");
    drop(wal);
    // cut the tail off a sealed segment: not a torn write, refuse
    let first = &segments[0];
    let bytes = fs::read(first).unwrap();
    fs::write(first, &bytes[..bytes.len() - 3]).unwrap();
    let err = Wal::open(dir.path(), opts).err().expect("must refuse");
    assert!(
        matches!(err, WalError::Corrupt { ref path, .. } if path == first),
        "{err}"
    );
}

#[test]
fn wal_cuts_segments_and_release_keeps_the_segment_holding_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WalOptions { segment_bytes: 512 };
    let mut wal = Wal::create(dir.path(), meta(), opts.clone()).unwrap();
    for i in 1..=100 {
        wal.append(&[entry(i, 1, &[1u8; 40])], Some(&hs(1, 1, i)));
        wal.sync().unwrap();
    }
    let before = wal.segment_paths();
    assert!(before.len() > 5);
    let firsts: Vec<u64> = before
        .iter()
        .map(|p| {
            parse_segment_name(p.file_name().unwrap().to_str().unwrap())
                .unwrap()
                .1
        })
        .collect();
    wal.save_snapshot(SnapshotMarker { term: 1, index: 50 });
    wal.sync().unwrap();
    wal.release_to(50).unwrap();
    let after = wal.segment_paths();
    assert!(after.len() < before.len());
    let first_kept = parse_segment_name(after[0].file_name().unwrap().to_str().unwrap())
        .unwrap()
        .1;
    assert!(first_kept <= 50, "kept segment must hold index 50");
    let expected = *firsts.iter().filter(|f| **f <= 50).max().unwrap();
    assert_eq!(
        first_kept, expected,
        "kept segments start with the one holding 50"
    );
    drop(wal);
    let (_, c) = Wal::open(dir.path(), opts).unwrap();
    assert!(c.entries.first().unwrap().index <= 50);
    assert_eq!(c.entries.last().unwrap().index, 100);
    assert_eq!(c.snapshot, Some(SnapshotMarker { term: 1, index: 50 }));
    assert_eq!(c.hard_state, hs(1, 1, 100));
    assert_eq!(c.metadata, meta());
}

#[test]
fn wal_leftover_tmp_segment_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 2);
    fs::write(
        dir.path().join("0000000000000001-0000000000000003.wal.tmp"),
        b"junk",
    )
    .unwrap();
    let (_, c) = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(indexes(&c), vec![1, 2]);
    assert!(!dir
        .path()
        .join("0000000000000001-0000000000000003.wal.tmp")
        .exists());
}

#[test]
fn wal_record_decoder_never_panics_on_garbage() {
    // a cheap stand-in for a fuzz target: every prefix and every single-byte
    // mutation of a valid record decodes to a record or an error.
    let mut buf = Vec::new();
    record::encode(&Record::Entry(entry(9, 3, b"payload")), &mut buf);
    record::encode(&Record::Metadata(meta()), &mut buf);
    for cut in 0..buf.len() {
        let _ = record::decode(&buf[..cut]);
    }
    for pos in 0..buf.len() {
        for bit in 0..8 {
            let mut b = buf.clone();
            b[pos] ^= 1 << bit;
            let _ = record::decode(&b);
        }
    }
}
