//! Entries read back from the segments while the member runs: raft's log
//! below the entries it keeps in memory (see `node::log_storage`), for a
//! follower that needs them. The records are read, never the WAL's state:
//! nothing here writes, repairs or deletes a file.
//!
//! A record of an index may appear more than once (a follower's log
//! overwritten after a conflict); the one of the log is the one with the
//! term raft knows for that index, and raft's log matching makes (index,
//! term) name one entry. The log's record of index i + 1 always follows its
//! record of i in the segments: writing i cut everything after it. So a
//! single forward scan finds them in order.

use std::fs::{self, File};
use std::path::Path;

use raft::eraftpb::Entry;

use super::record::{self, DecodeError, Record};
use super::replay::{Window, BLOCK};
use super::{io_err, parse_segment_name, WalError};

/// Where the last read ended: just after the record of `next_index - 1` in
/// segment `seq`. The next read from `next_index` on starts there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    seq: u64,
    offset: u64,
    next_index: u64,
}

/// The segments of `dir` as (seq, first index, path), in order; unlike the
/// listing an open does, leaves a `.wal.tmp` alone.
fn segments(dir: &Path) -> Result<Vec<(u64, u64, std::path::PathBuf)>, WalError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        if let Some((seq, first)) = entry.file_name().to_str().and_then(parse_segment_name) {
            out.push((seq, first, entry.path()));
        }
    }
    out.sort_by_key(|s| s.0);
    Ok(out)
}

/// Reads the entries from `low` on whose terms are `terms` (entry
/// `low + i` has term `terms[i]`) back from the segments in `dir`: the
/// first one always, then as many as fit in `max_size` bytes (raft's
/// `limit_size`). None when the segments no longer hold the first of them
/// (purged) or hold it damaged: the caller falls back to a snapshot.
/// `cursor` carries where the previous read ended, so that a follower
/// catching up is read through once, not from a segment's start per call.
pub(crate) fn read_entries(
    dir: &Path,
    low: u64,
    terms: &[u64],
    max_size: Option<u64>,
    cursor: &mut Option<Cursor>,
) -> Result<Option<Vec<Entry>>, WalError> {
    if terms.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let segments = segments(dir)?;
    // From the cursor when it is at or before `low`, else from the last
    // segment named at or below `low` (an older one holds only entries
    // below it: a segment's name is the first index it may hold).
    let (start, mut offset) = match *cursor {
        Some(c) if c.next_index <= low => match segments.iter().position(|s| s.0 == c.seq) {
            Some(i) => (i, c.offset),
            None => (segments.iter().rposition(|s| s.1 <= low).unwrap_or(0), 0),
        },
        _ => (segments.iter().rposition(|s| s.1 <= low).unwrap_or(0), 0),
    };
    let mut out: Vec<Entry> = Vec::new();
    let mut size = 0u64;
    let mut want = low;
    let end = low + terms.len() as u64;
    for (seq, _, path) in segments.iter().skip(start) {
        let file = File::open(path).map_err(io_err(path))?;
        let file_len = file.metadata().map_err(io_err(path))?.len();
        let mut window = Window::new(&file, file_len);
        if offset > 0 {
            // skip to the cursor: whole blocks are not read
            window.start = offset.min(file_len);
            offset = 0;
        }
        loop {
            if window.data().len() < BLOCK / 2 {
                window.fill(BLOCK).map_err(io_err(path))?;
            }
            if window.data().is_empty() {
                break;
            }
            let mut decoded = record::decode(window.data());
            while matches!(decoded, Err(DecodeError::Incomplete)) && !window.at_eof() {
                let more = window.data().len().saturating_mul(2);
                window.fill(more).map_err(io_err(path))?;
                decoded = record::decode(window.data());
            }
            // the end of the records (a preallocated tail, a record being
            // written) or damage: on to the next segment
            let Ok((record, len)) = decoded else { break };
            window.consume(len);
            let Record::Entry(entry) = record else {
                continue;
            };
            if entry.index != want || entry.term != terms[(want - low) as usize] {
                continue;
            }
            size += len as u64 - record::HEADER_LEN as u64;
            if !out.is_empty() && max_size.is_some_and(|max| size > max) {
                return Ok(Some(out));
            }
            out.push(entry);
            want += 1;
            *cursor = Some(Cursor {
                seq: *seq,
                offset: window.start,
                next_index: want,
            });
            if want == end {
                return Ok(Some(out));
            }
        }
    }
    // what was found is a prefix of the range: raft takes fewer entries
    // than asked as the end of what it may send now
    Ok((!out.is_empty()).then_some(out))
}
