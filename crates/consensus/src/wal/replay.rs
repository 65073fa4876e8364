//! Reading segments back: records in order, the valid end of the last
//! segment, a torn tail told from mid-log corruption.

use std::fs;

use raft::eraftpb::{Entry, HardState};

use super::record::{self, DecodeError, Metadata, Record, SnapshotMarker, HEADER_LEN};
use super::{io_err, Segment, WalError};

/// State accumulated while replaying segments in order.
#[derive(Default)]
pub(super) struct Replay {
    pub(super) metadata: Option<Metadata>,
    pub(super) hard_state: HardState,
    pub(super) entries: Vec<Entry>,
    pub(super) snapshot: Option<SnapshotMarker>,
}

/// Where a segment's records end, as found by [`Replay::read_segment`].
#[derive(Default)]
pub(super) struct SegmentTail {
    /// End of the last valid record: the logical length.
    pub(super) valid_len: u64,
    /// Length of the file (preallocated space included).
    pub(super) file_len: u64,
    /// Bytes of a torn record after `valid_len`, up to the last non-zero
    /// byte; 0 when only zeros (or nothing) follow the last valid record.
    pub(super) torn_bytes: u64,
}

/// Whether `buf` holds only zero bytes. It may be a whole 64 MiB
/// preallocated tail: compare in blocks (memcmp) rather than byte by byte.
fn all_zero(buf: &[u8]) -> bool {
    const ZEROS: [u8; 4096] = [0; 4096];
    buf.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

/// Length of `buf` without its trailing zero bytes.
fn trim_zero_tail(buf: &[u8]) -> usize {
    let mut end = buf.len();
    while end > 0 {
        let start = end.saturating_sub(4096);
        if all_zero(&buf[start..end]) {
            end = start;
        } else {
            return start
                + buf[start..end]
                    .iter()
                    .rposition(|b| *b != 0)
                    .map_or(0, |p| p + 1);
        }
    }
    0
}

impl Replay {
    /// Reads one segment and finds where its records end. Damage is an error
    /// unless it is a torn tail of the last segment; so is anything but
    /// records in a sealed segment.
    pub(super) fn read_segment(
        &mut self,
        segment: &Segment,
        is_last: bool,
    ) -> Result<SegmentTail, WalError> {
        let buf = fs::read(&segment.path).map_err(io_err(&segment.path))?;
        let corrupt = |offset: usize, reason: String| WalError::Corrupt {
            path: segment.path.clone(),
            offset: offset as u64,
            reason,
        };
        // In the last segment, whether nothing but zeros follows `from`.
        let zeros_after = |from: usize| is_last && all_zero(buf.get(from..).unwrap_or_default());
        let mut offset = 0usize;
        let mut first = true;
        let mut torn = false;
        while offset < buf.len() {
            let rest = &buf[offset..];
            match record::decode(rest) {
                Ok((record, len)) => {
                    self.apply(record, first)
                        .map_err(|reason| corrupt(offset, reason))?;
                    first = false;
                    offset += len;
                }
                // the logical end: a zero-filled (preallocated) tail, no repair
                Err(_) if zeros_after(offset) => break,
                Err(DecodeError::Incomplete) if is_last => {
                    torn = true;
                    break;
                }
                Err(DecodeError::Incomplete) => {
                    return Err(corrupt(
                        offset,
                        "truncated record in a sealed segment".into(),
                    ))
                }
                Err(DecodeError::BadHeader) if zeros_after(offset + HEADER_LEN) => {
                    torn = true;
                    break;
                }
                Err(DecodeError::BadHeader) => {
                    return Err(corrupt(offset, "record header fails its CRC".into()))
                }
                Err(DecodeError::BadPayloadCrc { record_len })
                    if zeros_after(offset + record_len) =>
                {
                    torn = true;
                    break;
                }
                Err(DecodeError::BadPayloadCrc { .. }) => {
                    return Err(corrupt(
                        offset,
                        "record payload fails its CRC with more data after it".into(),
                    ))
                }
                Err(DecodeError::BadPayload { reason, .. }) => return Err(corrupt(offset, reason)),
            }
        }
        if first && !is_last {
            return Err(corrupt(0, "segment holds no records".into()));
        }
        let torn_bytes = if torn {
            // at least one byte: a torn record is never all zeros
            trim_zero_tail(&buf).saturating_sub(offset).max(1) as u64
        } else {
            0
        };
        Ok(SegmentTail {
            valid_len: offset as u64,
            file_len: buf.len() as u64,
            torn_bytes,
        })
    }

    fn apply(&mut self, record: Record, first_in_segment: bool) -> Result<(), String> {
        if first_in_segment != matches!(record, Record::Metadata(_)) {
            return Err("a segment must start with exactly one metadata record".into());
        }
        match record {
            Record::Metadata(m) => {
                if let Some(prev) = &self.metadata {
                    if *prev != m {
                        return Err(format!("metadata {m:?} differs from earlier {prev:?}"));
                    }
                }
                self.metadata = Some(m);
            }
            Record::HardState(hs) => self.hard_state = hs,
            Record::Snapshot(marker) => {
                if self.snapshot.is_none_or(|s| marker.index >= s.index) {
                    self.snapshot = Some(marker);
                }
            }
            Record::Entry(e) => {
                let snapshot_index = self.snapshot.map_or(0, |s| s.index);
                match self.entries.first().map(|f| f.index) {
                    None => {}
                    Some(first) if e.index <= first => self.entries.clear(),
                    Some(first) => {
                        let last = first + self.entries.len() as u64 - 1;
                        if e.index <= last {
                            // raft log truncation on conflict
                            self.entries.truncate((e.index - first) as usize);
                        } else if e.index > last + 1 {
                            // (`e.index - 1`: a marker at u64::MAX, damaged but
                            // sealed, must not overflow)
                            if e.index - 1 <= snapshot_index {
                                // the log restarts after a snapshot received from the leader
                                self.entries.clear();
                            } else {
                                return Err(format!(
                                    "entry {} follows entry {last}: gap in the log",
                                    e.index
                                ));
                            }
                        }
                    }
                }
                self.entries.push(e);
            }
        }
        Ok(())
    }
}
