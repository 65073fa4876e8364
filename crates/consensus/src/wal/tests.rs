use super::file::preallocate;
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

/// Segments preallocated to 64 KiB: small enough to copy per byte offset.
const SMALL: u64 = 64 * 1024;

fn small() -> WalOptions {
    WalOptions {
        segment_bytes: SMALL,
        ..Default::default()
    }
}

/// Writes `n` entries, one sync each; returns the single segment's path and
/// its logical length.
fn write_log_with(dir: &Path, n: u64, options: WalOptions) -> (PathBuf, u64) {
    let mut wal = Wal::create(dir, meta(), options).unwrap();
    for i in 1..=n {
        wal.append(
            &[entry(i, 1, format!("value-{i}").as_bytes())],
            Some(&hs(1, 1, i)),
        );
        wal.sync().unwrap();
    }
    (wal.segment_paths().pop().unwrap(), wal.active_len)
}

/// [`write_log_with`] on [`SMALL`] segments; returns the segment's path.
fn write_log(dir: &Path, n: u64) -> PathBuf {
    write_log_with(dir, n, small()).0
}

/// --unsafe-no-fsync skips only the fdatasync: every record still reaches
/// the file (a process crash loses nothing), segments are still cut.
#[test]
fn unsafe_no_fsync_still_writes_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let options = WalOptions {
        segment_bytes: 4096,
        unsafe_no_fsync: true,
        ..Default::default()
    };
    let (_, _) = write_log_with(dir.path(), 300, options.clone());
    let (wal, c) = Wal::open(dir.path(), options).unwrap();
    assert_eq!(indexes(&c), (1..=300).collect::<Vec<_>>());
    assert_eq!(c.hard_state, hs(1, 1, 300));
    assert!(wal.segment_paths().len() > 1, "segments were cut");
}

#[test]
fn wal_round_trips_entries_hard_state_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_log_with(dir.path(), 10, WalOptions::default());
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
    let (mut wal, _) = Wal::open(dir.path(), small()).unwrap();
    wal.append(&[entry(4, 2, b"x")], Some(&hs(2, 1, 4)));
    wal.sync().unwrap();
    drop(wal);
    let (_, c) = Wal::open(dir.path(), small()).unwrap();
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
    let (path, logical) = write_log_with(dir.path(), 5, small());
    let file = fs::read(&path).unwrap();
    assert_eq!(file.len() as u64, SMALL, "segment is preallocated");
    let full = &file[..logical as usize];
    // find where the last record (the hard state after entry 5) and the last
    // entry start: re-encode them.
    let mut last_two = Vec::new();
    record::encode(&Record::Entry(entry(5, 1, b"value-5")), &mut last_two);
    let entry5_len = last_two.len();
    record::encode(&Record::HardState(hs(1, 1, 5)), &mut last_two);
    let entry5_start = full.len() - last_two.len();
    let hs5_start = entry5_start + entry5_len;
    // Each cut is tried on a segment that grew by appends (the file ends at
    // the cut, as before preallocation) and on a preallocated one (zeros from
    // the cut to the preallocated size).
    for preallocated in [false, true] {
        for cut in entry5_start..full.len() {
            let what = format!("cut at {cut}, preallocated {preallocated}");
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join(path.file_name().unwrap());
            let mut bytes = full[..cut].to_vec();
            if preallocated {
                bytes.resize(SMALL as usize, 0);
            }
            fs::write(&p, &bytes).unwrap();
            let (mut wal, c) =
                Wal::open(d.path(), small()).unwrap_or_else(|e| panic!("{what}: {e}"));
            // Bytes lost at the cut that were zeros anyway leave the record
            // whole in a preallocated file.
            let intact =
                |end: usize| cut >= end || (preallocated && full[cut..end].iter().all(|b| *b == 0));
            let (expect_last, expect_len) = if intact(full.len()) {
                (5, full.len())
            } else if intact(hs5_start) {
                (5, hs5_start)
            } else {
                (4, entry5_start)
            };
            assert_eq!(*indexes(&c).last().unwrap(), expect_last, "{what}");
            assert_eq!(wal.active_len, expect_len as u64, "{what}");
            // A cut exactly at a record boundary of a preallocated file is
            // just its zero tail; anything else is a torn record, repaired.
            let is_boundary = preallocated
                && full[expect_len..cut.max(expect_len)]
                    .iter()
                    .all(|b| *b == 0);
            assert_eq!(
                c.repaired_bytes == 0,
                is_boundary || cut == expect_len,
                "{what}"
            );
            // the repaired segment is its records, then zeros up to the
            // preallocated size
            let after = fs::read(&p).unwrap();
            assert_eq!(after.len() as u64, SMALL, "{what}");
            assert_eq!(&after[..expect_len], &full[..expect_len], "{what}");
            assert!(after[expect_len..].iter().all(|b| *b == 0), "{what}");
            // the repaired WAL accepts appends and reads back cleanly
            wal.append(&[entry(expect_last + 1, 1, b"after")], None);
            wal.sync().unwrap();
            drop(wal);
            let (_, c) = Wal::open(d.path(), small()).unwrap();
            assert_eq!(*indexes(&c).last().unwrap(), expect_last + 1, "{what}");
            assert_eq!(c.repaired_bytes, 0, "{what}");
        }
    }
}

#[test]
fn wal_preallocated_zero_tail_opens_without_repair() {
    let dir = tempfile::tempdir().unwrap();
    let (path, logical) = write_log_with(dir.path(), 3, WalOptions::default());
    let before = fs::read(&path).unwrap();
    assert_eq!(before.len() as u64, SEGMENT_BYTES, "preallocated to 64 MiB");
    assert!(before[logical as usize..].iter().all(|b| *b == 0));
    let (wal, c) = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(indexes(&c), vec![1, 2, 3]);
    assert_eq!(c.hard_state, hs(1, 1, 3));
    assert_eq!(c.repaired_bytes, 0);
    assert_eq!(wal.active_len, logical);
    drop(wal);
    // untouched: same size, same bytes
    assert_eq!(fs::read(&path).unwrap(), before);

    // a zero tail longer than the preallocation is no repair either
    let mut longer = before.clone();
    longer.extend_from_slice(&[0u8; 4096]);
    fs::write(&path, &longer).unwrap();
    let (_, c) = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(indexes(&c), vec![1, 2, 3]);
    assert_eq!(c.repaired_bytes, 0);
    assert_eq!(fs::metadata(&path).unwrap().len(), longer.len() as u64);
}

#[test]
fn wal_segment_without_preallocation_is_preallocated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, logical) = write_log_with(dir.path(), 3, small());
    // as written before preallocation existed: records only
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..logical as usize]).unwrap();
    let (mut wal, c) = Wal::open(dir.path(), small()).unwrap();
    assert_eq!(indexes(&c), vec![1, 2, 3]);
    assert_eq!(c.repaired_bytes, 0);
    assert_eq!(fs::metadata(&path).unwrap().len(), SMALL);
    wal.append(&[entry(4, 1, b"x")], None);
    wal.sync().unwrap();
    drop(wal);
    let (_, c) = Wal::open(dir.path(), small()).unwrap();
    assert_eq!(indexes(&c), vec![1, 2, 3, 4]);
}

#[test]
fn wal_append_after_reopen_writes_at_the_logical_end() {
    let dir = tempfile::tempdir().unwrap();
    let (path, logical) = write_log_with(dir.path(), 3, small());
    let (mut wal, _) = Wal::open(dir.path(), small()).unwrap();
    assert_eq!(wal.active_len, logical);
    let e4 = entry(4, 2, b"four");
    wal.append(std::slice::from_ref(&e4), None);
    wal.sync().unwrap();
    let mut encoded = Vec::new();
    record::encode(&Record::Entry(e4.clone()), &mut encoded);
    assert_eq!(wal.active_len, logical + encoded.len() as u64);
    drop(wal);
    let bytes = fs::read(&path).unwrap();
    // not at the file end: the file keeps its preallocated size
    assert_eq!(bytes.len() as u64, SMALL);
    let at = logical as usize;
    assert_eq!(&bytes[at..at + encoded.len()], &encoded[..]);
    assert!(bytes[at + encoded.len()..].iter().all(|b| *b == 0));
    let (_, c) = Wal::open(dir.path(), small()).unwrap();
    assert_eq!(indexes(&c), vec![1, 2, 3, 4]);
    assert_eq!(c.entries[3], e4);
    assert_eq!(c.repaired_bytes, 0);
}

#[test]
fn wal_torn_record_in_a_preallocated_segment_is_repaired() {
    // a long record torn mid-payload, then a short one written over it: the
    // rest of the torn record must not survive as garbage after it
    let long = entry(6, 1, &[0xabu8; 3000]);
    let mut torn = Vec::new();
    record::encode(&Record::Entry(long), &mut torn);
    for keep in [10, HEADER_LEN + 1, 2000] {
        let dir = tempfile::tempdir().unwrap();
        let (path, logical) = write_log_with(dir.path(), 5, small());
        let mut bytes = fs::read(&path).unwrap();
        let at = logical as usize;
        bytes[at..at + keep].copy_from_slice(&torn[..keep]);
        fs::write(&path, &bytes).unwrap();

        let (mut wal, c) = Wal::open(dir.path(), small()).unwrap();
        assert_eq!(indexes(&c), vec![1, 2, 3, 4, 5], "keep {keep}");
        assert!(c.repaired_bytes > 0, "keep {keep}");
        assert_eq!(wal.active_len, logical);
        let repaired = fs::read(&path).unwrap();
        assert_eq!(repaired.len() as u64, SMALL, "re-preallocated");
        assert_eq!(&repaired[..at], &bytes[..at]);
        assert!(repaired[at..].iter().all(|b| *b == 0), "keep {keep}");

        wal.append(&[entry(6, 2, b"short")], Some(&hs(2, 1, 6)));
        wal.append(&[entry(7, 2, b"seven")], None);
        wal.sync().unwrap();
        drop(wal);
        let (_, c) = Wal::open(dir.path(), small()).unwrap();
        assert_eq!(indexes(&c), vec![1, 2, 3, 4, 5, 6, 7], "keep {keep}");
        assert_eq!(c.entries[5].data.as_ref(), b"short");
        assert_eq!(c.hard_state, hs(2, 1, 6));
        assert_eq!(c.repaired_bytes, 0, "keep {keep}");
    }
}

/// Replay reads a segment through a window of a few hundred KiB, not whole:
/// records larger than the window and records straddling its edges come
/// back whole, and a torn record longer than the window is cut off, every
/// byte of it counted.
#[test]
fn wal_replay_reads_records_larger_than_its_window() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let options = WalOptions::default();
    let sizes = [10usize, 700_000, 3, 262_131, 1_300_000, 5, 131_072];
    let mut wal = Wal::create(dir.path(), meta(), options.clone()).unwrap();
    for (i, size) in sizes.iter().enumerate() {
        let index = i as u64 + 1;
        wal.append(
            &[entry(index, 1, &vec![index as u8; *size])],
            Some(&hs(1, 1, index)),
        );
    }
    wal.sync().unwrap();
    let path = wal.segment_paths().pop().unwrap();
    let logical = wal.active_len;
    drop(wal);
    let check = |c: &WalContents| {
        assert_eq!(indexes(c), (1..=sizes.len() as u64).collect::<Vec<_>>());
        for (e, size) in c.entries.iter().zip(sizes) {
            assert_eq!(e.data.len(), size, "entry {}", e.index);
            assert!(e.data.iter().all(|b| *b == e.index as u8));
        }
        assert_eq!(c.hard_state, hs(1, 1, sizes.len() as u64));
    };
    let (_, c) = Wal::open(dir.path(), options.clone()).unwrap();
    check(&c);
    assert_eq!(c.repaired_bytes, 0);

    let mut torn = Vec::new();
    record::encode(&Record::Entry(entry(8, 1, &[0xcd; 1 << 20])), &mut torn);
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_at(&torn[..900_000], logical).unwrap();
    drop(file);
    let (wal, c) = Wal::open(dir.path(), options).unwrap();
    check(&c);
    assert_eq!(c.repaired_bytes, 900_000);
    assert_eq!(wal.active_len, logical);
}

#[test]
fn wal_sealed_segments_have_no_zero_tail() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WalOptions {
        segment_bytes: 4096,
        ..Default::default()
    };
    let mut wal = Wal::create(dir.path(), meta(), opts.clone()).unwrap();
    for i in 1..=200 {
        wal.append(&[entry(i, 1, &[3u8; 100])], Some(&hs(1, 1, i)));
        wal.sync().unwrap();
    }
    let segments = wal.segment_paths();
    assert!(segments.len() > 3, "{segments:?}");
    drop(wal);
    let (sealed, last) = segments.split_at(segments.len() - 1);
    for path in sealed {
        // records exactly to the end of the file
        let bytes = fs::read(path).unwrap();
        assert!(bytes.len() >= 4096, "{path:?} cut early");
        let mut offset = 0;
        while offset < bytes.len() {
            let (_, len) = record::decode(&bytes[offset..])
                .unwrap_or_else(|e| panic!("{path:?} at {offset}: {e:?}"));
            offset += len;
        }
        assert_eq!(offset, bytes.len(), "{path:?}");
    }
    // the active segment is preallocated
    let active = fs::read(&last[0]).unwrap();
    assert_eq!(active.len(), 4096);
    assert_eq!(*active.last().unwrap(), 0);
    let (_, c) = Wal::open(dir.path(), opts.clone()).unwrap();
    assert_eq!(c.entries.len(), 200);

    // a zero tail in a sealed segment is refused, not skipped
    let mut bytes = fs::read(&sealed[0]).unwrap();
    bytes.extend_from_slice(&[0u8; 64]);
    fs::write(&sealed[0], &bytes).unwrap();
    let err = Wal::open(dir.path(), opts).err().expect("must refuse");
    assert!(
        matches!(err, WalError::Corrupt { ref path, .. } if *path == sealed[0]),
        "{err}"
    );
}

#[test]
fn wal_cut_truncates_a_preallocated_tail_beyond_segment_bytes() {
    // reopened with a smaller segment size than the file was preallocated to
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = write_log_with(dir.path(), 3, small());
    let opts = WalOptions {
        segment_bytes: 512,
        ..Default::default()
    };
    let (mut wal, _) = Wal::open(dir.path(), opts.clone()).unwrap();
    for i in 4..=20 {
        wal.append(&[entry(i, 1, &[9u8; 64])], None);
        wal.sync().unwrap();
    }
    assert!(wal.segment_paths().len() > 2);
    drop(wal);
    let len = fs::metadata(&first).unwrap().len();
    assert!(
        (512..SMALL).contains(&len),
        "sealed segment truncated: {len}"
    );
    let (_, c) = Wal::open(dir.path(), opts).unwrap();
    assert_eq!(indexes(&c), (1..=20).collect::<Vec<_>>());
}

#[test]
fn wal_refuses_to_open_when_a_byte_is_flipped_mid_log() {
    let dir = tempfile::tempdir().unwrap();
    let (path, logical) = write_log_with(dir.path(), 5, small());
    let preallocated = fs::read(&path).unwrap();
    let grown = preallocated[..logical as usize].to_vec();
    let mut tail = Vec::new();
    record::encode(&Record::HardState(hs(1, 1, 5)), &mut tail);
    // every byte before the final record is "mid-log", whether or not the
    // segment has a preallocated zero tail
    let positions = 0..logical as usize - tail.len();
    for (full, pos) in [&grown, &preallocated]
        .into_iter()
        .flat_map(|full| positions.clone().map(move |pos| (full, pos)))
    {
        let mut bytes = full.clone();
        bytes[pos] ^= 0x40;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(path.file_name().unwrap());
        fs::write(&p, &bytes).unwrap();
        match Wal::open(d.path(), small()) {
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
fn wal_refuses_non_zero_bytes_in_the_preallocated_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (path, logical) = write_log_with(dir.path(), 3, small());
    let full = fs::read(&path).unwrap();
    for pos in [
        logical as usize + 100,
        SMALL as usize / 2,
        SMALL as usize - 1,
    ] {
        let mut bytes = full.clone();
        bytes[pos] = 0x01;
        fs::write(&path, &bytes).unwrap();
        match Wal::open(dir.path(), small()) {
            Err(WalError::Corrupt { offset, .. }) => assert_eq!(offset, logical, "byte at {pos}"),
            Err(e) => panic!("byte at {pos}: unexpected error {e}"),
            Ok((_, c)) => panic!("byte at {pos}: opened with {:?}", indexes(&c)),
        }
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }
}

#[test]
fn wal_refuses_damage_in_a_sealed_segment() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WalOptions {
        segment_bytes: 256,
        ..Default::default()
    };
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
    // one file at most: every released segment goes
    let opts = WalOptions {
        segment_bytes: 512,
        max_files: 1,
        ..Default::default()
    };
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

/// The first index of each segment file in `dir`, oldest first.
fn segment_firsts(dir: &Path) -> Vec<u64> {
    let mut firsts: Vec<(u64, u64)> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| parse_segment_name(e.unwrap().file_name().to_str().unwrap()))
        .collect();
    firsts.sort();
    firsts.into_iter().map(|(_, first)| first).collect()
}

/// A WAL of 100 entries on 512-byte segments (many of them), none
/// released; its segments' first indexes.
fn write_segmented(dir: &Path, max_files: usize) -> (Wal, Vec<u64>) {
    let opts = WalOptions {
        segment_bytes: 512,
        max_files,
        ..Default::default()
    };
    let mut wal = Wal::create(dir, meta(), opts).unwrap();
    for i in 1..=100 {
        wal.append(&[entry(i, 1, &[1u8; 40])], Some(&hs(1, 1, i)));
        wal.sync().unwrap();
    }
    let firsts = segment_firsts(dir);
    assert!(firsts.len() > 8, "{firsts:?}");
    (wal, firsts)
}

#[test]
fn max_wals_keeps_that_many_segments_and_purges_only_released_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, firsts) = write_segmented(dir.path(), 3);
    // etcd's purge takes no segment it cannot lock: more than 3 files, but
    // none released, none goes
    assert_eq!(segment_firsts(dir.path()), firsts);

    // released: the segments wholly below 50 (not the one holding it)
    wal.save_snapshot(SnapshotMarker { term: 1, index: 50 });
    wal.sync().unwrap();
    wal.release_to(50).unwrap();
    let holding = firsts.iter().rposition(|f| *f <= 50).unwrap();
    assert!(holding >= 1 && firsts.len() - holding > 3, "{firsts:?}");
    // the oldest go while there are more than 3, as long as they are
    // released: everything below the segment holding 50
    assert_eq!(segment_firsts(dir.path()), firsts[holding..]);

    // the whole log released: the newest 3 files stay
    wal.release_to(100).unwrap();
    assert_eq!(segment_firsts(dir.path()), firsts[firsts.len() - 3..]);
    drop(wal);
    let (_, c) = Wal::open(dir.path(), WalOptions::default()).unwrap();
    assert_eq!(c.entries.last().unwrap().index, 100);
    assert_eq!(c.hard_state, hs(1, 1, 100));
}

#[test]
fn max_wals_zero_keeps_every_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, firsts) = write_segmented(dir.path(), 0);
    wal.save_snapshot(SnapshotMarker {
        term: 1,
        index: 100,
    });
    wal.sync().unwrap();
    wal.release_to(100).unwrap();
    wal.purge().unwrap();
    assert_eq!(segment_firsts(dir.path()), firsts);
}

#[test]
fn max_wals_a_cut_purges_a_released_segment_beyond_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, firsts) = write_segmented(dir.path(), 4);
    wal.release_to(100).unwrap();
    assert_eq!(segment_firsts(dir.path()), firsts[firsts.len() - 4..]);
    // new segments: the released ones make room, the count stays at 4
    // until only unreleased segments are left
    for i in 101..=160 {
        wal.append(&[entry(i, 1, &[1u8; 40])], Some(&hs(1, 1, i)));
        wal.sync().unwrap();
    }
    let now = segment_firsts(dir.path());
    // more than 4 files, none of them released: the one holding 100 and
    // those after it
    let holding = firsts.iter().rposition(|f| *f <= 100).unwrap();
    assert!(now.len() > 4, "{now:?}");
    assert_eq!(now[0], firsts[holding], "{now:?}");
    assert!(now[1] > 100, "{now:?}");
}

#[test]
fn open_at_a_snapshot_reads_from_its_segment_and_releases_the_older_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, firsts) = write_segmented(dir.path(), 0);
    wal.save_snapshot(SnapshotMarker { term: 1, index: 50 });
    wal.sync().unwrap();
    drop(wal);
    let holding = firsts.iter().rposition(|f| *f <= 50).unwrap();

    // --max-wals 0: nothing goes, the older segments are not even read
    let keep_all = WalOptions {
        segment_bytes: 512,
        max_files: 0,
        ..Default::default()
    };
    let (mut wal, c) = Wal::open_at(dir.path(), 50, keep_all).unwrap();
    assert_eq!(c.entries.first().unwrap().index, firsts[holding]);
    assert_eq!(c.entries.last().unwrap().index, 100);
    assert_eq!(c.snapshot, Some(SnapshotMarker { term: 1, index: 50 }));
    assert_eq!(c.hard_state, hs(1, 1, 100));
    wal.purge().unwrap();
    assert_eq!(segment_firsts(dir.path()), firsts);
    drop(wal);

    // a damaged segment below the snapshot's is never read
    let oldest = dir.path().join(segment_name(0, 0));
    let bytes = fs::read(&oldest).unwrap();
    fs::write(&oldest, &bytes[..bytes.len() - 3]).unwrap();
    assert!(Wal::open(dir.path(), WalOptions::default()).is_err());

    // --max-wals 2: the start purges what precedes the snapshot's segment
    let two = WalOptions {
        segment_bytes: 512,
        max_files: 2,
        ..Default::default()
    };
    let (mut wal, c) = Wal::open_at(dir.path(), 50, two).unwrap();
    assert_eq!(c.entries.first().unwrap().index, firsts[holding]);
    wal.purge().unwrap();
    assert_eq!(segment_firsts(dir.path()), firsts[holding..]);
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
    let (_, c) = Wal::open(dir.path(), small()).unwrap();
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

/// Median and p99 of `micros`, sorted in place.
fn median_p99(micros: &mut [f64]) -> (f64, f64) {
    micros.sort_by(f64::total_cmp);
    let pct = |p: f64| micros[((micros.len() - 1) as f64 * p) as usize];
    (pct(0.5), pct(0.99))
}

/// Latency of 2,000 single-entry append+sync calls on the default 64 MiB
/// segment, next to raw pwrite+fdatasync on a growing and on a preallocated
/// file for comparison. Run it on the disk the WAL lives on (`WAL_BENCH_DIR`,
/// default the temp dir):
/// `cargo test -p consensus --lib -- --ignored wal_sync_latency --nocapture`.
#[test]
#[ignore]
fn wal_sync_latency() {
    use std::os::unix::fs::FileExt as _;
    const N: u64 = 2000;
    let base = std::env::var_os("WAL_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::tempdir_in(base).unwrap();
    let value = [0x5au8; 200];

    let mut wal = Wal::create(&dir.path().join("wal"), meta(), WalOptions::default()).unwrap();
    let mut micros = Vec::new();
    for i in 1..=N {
        wal.append(&[entry(i, 1, &value)], Some(&hs(1, 1, i)));
        let t = std::time::Instant::now();
        wal.sync().unwrap();
        micros.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let record_bytes = wal.active_len / N;
    let (median, p99) = median_p99(&mut micros);
    println!(
        "wal_sync_latency: wal append+sync: {} syncs, median {median:.0} µs, p99 {p99:.0} µs, segment file {} bytes",
        wal.sync_count(),
        fs::metadata(wal.segment_paths().pop().unwrap()).unwrap().len()
    );

    for preallocated in [false, true] {
        let f = File::create(dir.path().join(format!("raw-{preallocated}"))).unwrap();
        if preallocated {
            assert!(preallocate(&f, SEGMENT_BYTES).unwrap());
            f.sync_all().unwrap();
        }
        let buf = vec![0x5au8; record_bytes as usize];
        let mut micros = Vec::new();
        for i in 0..N {
            let t = std::time::Instant::now();
            f.write_all_at(&buf, i * record_bytes).unwrap();
            f.sync_data().unwrap();
            micros.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let (median, p99) = median_p99(&mut micros);
        println!(
            "wal_sync_latency: raw pwrite {record_bytes} B + fdatasync, preallocated {preallocated}: median {median:.0} µs, p99 {p99:.0} µs"
        );
    }
}
