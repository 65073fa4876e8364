//! Reading segments back: records in order, the valid end of the last
//! segment, a torn tail told from mid-log corruption.
//!
//! A segment is read forward through a [`Window`] of a few blocks, never
//! whole: a segment is preallocated to 64 MiB, and a start that read each one
//! into memory kept that much resident after it (the allocator does not hand
//! a freed block back to the kernel at once).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

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

/// How much of a segment is read at a time.
pub(super) const BLOCK: usize = 256 * 1024;

/// Whether `buf` holds only zero bytes, compared in blocks (memcmp) rather
/// than byte by byte.
fn all_zero(buf: &[u8]) -> bool {
    const ZEROS: [u8; 4096] = [0; 4096];
    buf.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

/// A forward window over a segment file: the bytes from file offset `start`
/// that have been read and not yet consumed. It holds at most a block beyond
/// the longest record it was asked for.
pub(super) struct Window<'a> {
    file: &'a File,
    file_len: u64,
    /// File offset of `buf[head]`.
    pub(super) start: u64,
    buf: Vec<u8>,
    head: usize,
}

impl<'a> Window<'a> {
    pub(super) fn new(file: &'a File, file_len: u64) -> Self {
        Window {
            file,
            file_len,
            start: 0,
            buf: Vec::new(),
            head: 0,
        }
    }

    /// The unconsumed bytes read so far.
    pub(super) fn data(&self) -> &[u8] {
        &self.buf[self.head..]
    }

    /// Whether every byte of the file up to its end is in [`Self::data`].
    pub(super) fn at_eof(&self) -> bool {
        self.start + self.data().len() as u64 >= self.file_len
    }

    /// Reads until [`Self::data`] holds `want` bytes or the file ends.
    pub(super) fn fill(&mut self, want: usize) -> io::Result<()> {
        if self.head > 0 && self.head >= self.buf.len() / 2 {
            self.buf.drain(..self.head);
            self.head = 0;
        }
        while self.data().len() < want && !self.at_eof() {
            let have = self.buf.len();
            let end_offset = self.start + self.data().len() as u64;
            let left = (self.file_len - end_offset).min((want - self.data().len()) as u64);
            self.buf.resize(have + left as usize, 0);
            let n = self.file.read_at(&mut self.buf[have..], end_offset)?;
            self.buf.truncate(have + n);
            if n == 0 {
                // the file shrank under us: its end is where reads stop
                self.file_len = end_offset;
            }
        }
        Ok(())
    }

    pub(super) fn consume(&mut self, n: usize) {
        self.head += n;
        self.start += n as u64;
    }

    /// Whether the file holds only zero bytes from `offset` to its end.
    fn zeros_from(&self, offset: u64) -> io::Result<bool> {
        let mut found = true;
        self.scan_from(offset, |_, chunk| {
            found = all_zero(chunk);
            found
        })?;
        Ok(found)
    }

    /// The end of the last non-zero byte at or after `offset` (`offset`
    /// itself when only zeros follow).
    fn nonzero_end_from(&self, offset: u64) -> io::Result<u64> {
        let mut end = offset;
        self.scan_from(offset, |at, chunk| {
            if let Some(p) = chunk.iter().rposition(|b| *b != 0) {
                end = at + p as u64 + 1;
            }
            true
        })?;
        Ok(end)
    }

    /// Calls `visit(offset, chunk)` over the file from `offset` to its end, a
    /// block at a time, while it returns true.
    fn scan_from(
        &self,
        mut offset: u64,
        mut visit: impl FnMut(u64, &[u8]) -> bool,
    ) -> io::Result<()> {
        let mut chunk = vec![0u8; BLOCK];
        while offset < self.file_len {
            let len = (self.file_len - offset).min(BLOCK as u64) as usize;
            let n = self.file.read_at(&mut chunk[..len], offset)?;
            if n == 0 || !visit(offset, &chunk[..n]) {
                break;
            }
            offset += n as u64;
        }
        Ok(())
    }
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
        let path = &segment.path;
        let file = File::open(path).map_err(io_err(path))?;
        let file_len = file.metadata().map_err(io_err(path))?.len();
        let mut window = Window::new(&file, file_len);
        let corrupt = |offset: u64, reason: String| WalError::Corrupt {
            path: path.clone(),
            offset,
            reason,
        };
        // In the last segment, whether nothing but zeros follows `from`.
        let zeros_after = |w: &Window, from: u64| -> Result<bool, WalError> {
            Ok(is_last && w.zeros_from(from).map_err(io_err(path))?)
        };
        let mut first = true;
        let mut torn = false;
        loop {
            if window.data().len() < BLOCK / 2 {
                window.fill(BLOCK).map_err(io_err(path))?;
            }
            if window.data().is_empty() {
                break;
            }
            let offset = window.start;
            let mut decoded = record::decode(window.data());
            // a record longer than the window: read on, doubling, to its end
            while matches!(decoded, Err(DecodeError::Incomplete)) && !window.at_eof() {
                let want = window.data().len().saturating_mul(2);
                window.fill(want).map_err(io_err(path))?;
                decoded = record::decode(window.data());
            }
            match decoded {
                Ok((record, len)) => {
                    self.apply(record, first)
                        .map_err(|reason| corrupt(offset, reason))?;
                    first = false;
                    window.consume(len);
                }
                // the logical end: a zero-filled (preallocated) tail, no repair
                Err(_) if zeros_after(&window, offset)? => break,
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
                Err(DecodeError::BadHeader)
                    if zeros_after(&window, offset + HEADER_LEN as u64)? =>
                {
                    torn = true;
                    break;
                }
                Err(DecodeError::BadHeader) => {
                    return Err(corrupt(offset, "record header fails its CRC".into()))
                }
                Err(DecodeError::BadPayloadCrc { record_len })
                    if zeros_after(&window, offset + record_len as u64)? =>
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
        let valid_len = window.start;
        if first && !is_last {
            return Err(corrupt(0, "segment holds no records".into()));
        }
        let torn_bytes = if torn {
            // at least one byte: a torn record is never all zeros
            let end = window.nonzero_end_from(valid_len).map_err(io_err(path))?;
            (end - valid_len).max(1)
        } else {
            0
        };
        Ok(SegmentTail {
            valid_len,
            file_len: window.file_len,
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
