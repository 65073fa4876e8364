//! The write-ahead log: raft's durable memory.
//!
//! An entry is acknowledged only after the WAL record holding it is
//! fdatasync'ed; the WAL therefore owns durability for the whole member. The
//! backend may commit without fsync because entries above its durable
//! consistent index are replayed from here on restart.
//!
//! # Files
//!
//! `<wal dir>/<seq %016x>-<first index %016x>.wal`, as etcd names them; the
//! WAL dir is `<member_dir>/wal`, or etcd's `--wal-dir`.
//! `seq` grows by one per segment; `first index` is the raft index the next
//! entry was expected to have when the segment was cut (the very first
//! segment is `0000000000000000-0000000000000000.wal`). A segment is cut when
//! its logical length (the end of its last record) reaches
//! [`WalOptions::segment_bytes`] ([`SEGMENT_BYTES`], 64 MiB, etcd's
//! `SegmentSizeBytes`). A new segment is written as `<name>.tmp`, synced and
//! renamed, so a half-created segment never exists under its real name.
//!
//! Like etcd (`fileutil.Preallocate`), a new segment is preallocated to
//! `segment_bytes` with `posix_fallocate` before it is synced and renamed, so
//! the fdatasync after an append need not also commit a new file size (on
//! ext4: ~110 µs instead of ~170 µs per sync). The preallocated space reads as
//! zeros; records are written with `pwrite` at the logical end, never at the
//! file end. Where the filesystem cannot preallocate (`EOPNOTSUPP`) the
//! segment simply grows. Opening also preallocates a last segment that is not
//! (one written before preallocation existed). So:
//! - the **last** segment is its records followed by a zero-filled tail, up to
//!   `segment_bytes` or beyond;
//! - a **sealed** segment (any other) is truncated to its logical length, and
//!   that truncation is synced, before the next segment is created: a sealed
//!   segment is records only, with no zero tail.
//!
//! # Record layout, format version 1
//!
//! A segment is a sequence of records, nothing else (the last segment then
//! has its zero-filled preallocated tail, see above). All integers are
//! little-endian. Every record:
//!
//! | offset | size | field                                                    |
//! |-------:|-----:|----------------------------------------------------------|
//! |      0 |    4 | `payload_len` (u32), at most 256 MiB                     |
//! |      4 |    4 | `payload_crc`: CRC-32 (IEEE) of the type byte then the payload |
//! |      8 |    1 | `type`: 1 metadata, 2 entry, 3 hard state, 4 snapshot    |
//! |      9 |    3 | reserved, zero                                           |
//! |     12 |    4 | `header_crc`: CRC-32 (IEEE) of bytes 0..12               |
//! |     16 |    n | payload                                                  |
//!
//! The CRC is per record (not chained): the header CRC makes the length
//! trustworthy before it is used, so a flipped bit in a length field is
//! detected instead of being read as a torn tail.
//!
//! Payloads:
//! - **metadata** (type 1), the first record of every segment:
//!   `magic "oxcdwal\0"` (8) · `format_version` u32 (= 1) · `node_id` u64 ·
//!   `cluster_id` u64 · `voter_count` u32 · `voter_count` × u64 bootstrap voters.
//! - **entry** (type 2): a raft-rs `eraftpb::Entry` in protobuf encoding.
//! - **hard state** (type 3): `term` u64 · `vote` u64 · `commit` u64.
//! - **snapshot marker** (type 4): `term` u64 · `index` u64.
//!
//! After its metadata record every new segment repeats the latest hard state
//! and snapshot marker, so the WAL stays complete after older segments are
//! released.
//!
//! # Reading and repair
//!
//! Entries are replayed in file order; an entry whose index is ≤ the last one
//! read replaces it and everything after it (raft log truncation on
//! conflict).
//!
//! In the LAST segment, reading stops at the first offset where only zeros
//! remain (or at end of file): that is the logical end, and the zero-filled
//! region after it is the preallocated tail — normal, not a repair, and the
//! file keeps its size. Damage at the tail of the last segment is a torn write
//! and is cut away, provided nothing but zeros follows the damaged record: an
//! incomplete record at end of file, a record whose header fails its CRC when
//! everything after its 16 header bytes is zero, or a record whose payload
//! fails its CRC when everything after the record is zero. The repair
//! truncates the file at the end of the last valid record, then preallocates
//! it again (as etcd's `fileutil.ZeroToEnd` does), and syncs it: the cut
//! region reads as zeros from then on and can never be taken for data, and
//! the next append overwrites it. Only such a repair logs "repairing torn
//! tail".
//!
//! Anything else — a bad record followed by more non-zero data (even far out
//! in the preallocated tail), a payload that passes its CRC but does not
//! decode, or any damage in a sealed segment, including a zero tail —
//! refuses to open with [`WalError::Corrupt`], naming the file and offset:
//! truncating there could drop acknowledged entries.
//!
//! # Release and purge
//!
//! [`Wal::release_to`] releases whole segments whose entries all precede the
//! given index (etcd's `ReleaseLockTo`): the caller (the raft thread) only
//! passes an index covered by a durable backend commit and a saved
//! snapshot. Opening at a snapshot ([`Wal::open_at`]) releases the
//! segments before the one holding its index, which are not read (etcd's
//! `openAtIndex` locks only the segments from there on). Only a released
//! segment may be deleted, and the active one never is.
//!
//! The purge is etcd's (`fileutil.PurgeFile` on `*.wal` with `--max-wals`):
//! while the directory holds more than [`WalOptions::max_files`] segments,
//! the oldest goes if it is released (logged `purged`, with its path); 0
//! keeps every segment. etcd purges every 30 s; here it runs whenever the
//! count or the released set can grow (a release, a cut) and at start.

mod cold;
#[cfg(test)]
mod fault_tests;
mod file;
mod ops;
pub(crate) mod record;
mod replay;
/// A WAL dir read back: all its segments, the records of those read, the
/// last segment's tail and the metadata.
struct Replayed {
    segments: Vec<Segment>,
    /// The segments before this one were not read.
    first_read: usize,
    reader: Replay,
    tail: SegmentTail,
    metadata: Metadata,
}

/// The records of the WAL in `dir` from the segment that holds `index`
/// (the last one whose first index is at or below it; from the first
/// segment when none is), checked: etcd's `openAtIndex`, which reads
/// nothing of the segments a snapshot at `index` makes useless.
fn replay_dir(dir: &Path, index: u64) -> Result<Replayed, WalError> {
    let segments = list_segments(dir)?;
    let Some(last_segment) = segments.last() else {
        return Err(WalError::NotFound {
            dir: dir.to_path_buf(),
        });
    };
    let first_read = segments
        .iter()
        .rposition(|s| s.first_index <= index)
        .unwrap_or(0);
    let mut reader = Replay::default();
    let mut tail = SegmentTail::default();
    for (i, segment) in segments.iter().enumerate().skip(first_read) {
        tail = reader.read_segment(segment, i + 1 == segments.len())?;
    }
    let metadata = reader.metadata.clone().ok_or_else(|| WalError::Corrupt {
        path: last_segment.path.clone(),
        offset: 0,
        reason: "no metadata record".into(),
    })?;
    Ok(Replayed {
        segments,
        first_read,
        reader,
        tail,
        metadata,
    })
}

#[cfg(test)]
mod tests;

pub(crate) use cold::{read_entries, Cursor};
pub use file::free_bytes;
pub(crate) use file::sync_dir;
use file::{preallocate_what_fits, write_new_segment};
pub use ops::{FileOps, OsFileOps};
pub use record::{
    Metadata, Record, SnapshotMarker, HEADER_LEN, MAX_RECORD_PAYLOAD, WAL_FORMAT_VERSION,
};
use replay::{Replay, SegmentTail};

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

use raft::eraftpb::{Entry, HardState};

/// Segment size at which the WAL cuts a new file: etcd's SegmentSizeBytes,
/// 64,000,000 bytes (decimal, ~61 MiB), so a 64 MiB volume holds a first
/// segment and a small backend, as with etcd.
pub const SEGMENT_BYTES: u64 = 64 * 1000 * 1000;

/// Errors of the WAL. Each names the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("wal: {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("wal: {path}: corrupt at offset {offset}: {reason}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("wal: {dir}: no WAL segments found")]
    NotFound { dir: PathBuf },
    #[error("wal: {dir}: {reason}")]
    Inconsistent { dir: PathBuf, reason: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A metadata record holds two IDs and the bootstrap voters: far below this.
const METADATA_READ_LIMIT: u64 = 1 << 20;

/// Segment files kept at most (etcd's `--max-wals` default).
pub const MAX_FILES: usize = 5;

/// Tunables; the defaults are what a member uses.
#[derive(Clone, Debug)]
pub struct WalOptions {
    pub segment_bytes: u64,
    /// etcd's `--max-wals`: released segments are deleted, oldest first,
    /// while there are more than this many segment files; 0 keeps all.
    pub max_files: usize,
    /// etcd's --unsafe-no-fsync: records are written but never fdatasync'ed,
    /// so an OS crash or power loss can lose acknowledged writes (a process
    /// crash cannot: the page cache keeps them). For benchmarks and tests.
    pub unsafe_no_fsync: bool,
    /// The file operations of the write path ([`OsFileOps`]; tests put in
    /// ones that fail).
    pub ops: std::sync::Arc<dyn FileOps>,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: SEGMENT_BYTES,
            max_files: MAX_FILES,
            unsafe_no_fsync: false,
            ops: std::sync::Arc::new(OsFileOps),
        }
    }
}

/// Everything the WAL held when it was opened.
#[derive(Clone, Debug)]
pub struct WalContents {
    pub metadata: Metadata,
    /// The latest hard state written (default if none).
    pub hard_state: HardState,
    /// Contiguous entries after conflict overwrites, in index order.
    pub entries: Vec<Entry>,
    /// The latest snapshot marker, if any.
    pub snapshot: Option<SnapshotMarker>,
    /// Bytes of torn records cut from the tail of the last segment by repair
    /// (from the logical end to the last non-zero byte; the zero-filled
    /// preallocated tail is not counted).
    pub repaired_bytes: u64,
}

#[derive(Clone, Debug)]
struct Segment {
    seq: u64,
    first_index: u64,
    path: PathBuf,
}

/// Receives the duration of every fdatasync that makes appended records
/// durable (metrics live above this crate). Called on the raft thread right
/// after the sync: it must be cheap and must not block.
#[derive(Clone)]
pub struct SyncObserver(pub std::sync::Arc<dyn Fn(std::time::Duration) + Send + Sync>);

impl std::fmt::Debug for SyncObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SyncObserver")
    }
}

/// An open WAL, appending to its last segment.
pub struct Wal {
    dir: PathBuf,
    options: WalOptions,
    segments: Vec<Segment>,
    /// How many of the oldest `segments` are released: a snapshot covers
    /// their entries, so the purge may delete them. Always fewer than
    /// `segments.len()`: the active segment is never released.
    released: usize,
    /// The last segment, opened for writing (not appending: it is
    /// preallocated, so records go at `active_len`, not at the file end).
    active: File,
    /// Logical length of the active segment: the end of its last record.
    active_len: u64,
    /// Encoded records not yet written; written and synced by [`Wal::sync`].
    pending: Vec<u8>,
    metadata: Metadata,
    last_index: u64,
    hard_state: HardState,
    snapshot: SnapshotMarker,
    sync_count: u64,
    sync_observer: Option<SyncObserver>,
    /// Told of each write of buffered records (bytes, time).
    write_observer: Option<crate::Observer>,
    /// Set when a write, a sync or a cut failed: every later one fails too.
    failed: Option<String>,
}

fn segment_name(seq: u64, first_index: u64) -> String {
    format!("{seq:016x}-{first_index:016x}.wal")
}

fn parse_segment_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".wal")?;
    let (seq, index) = stem.split_once('-')?;
    if seq.len() != 16 || index.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(seq, 16).ok()?,
        u64::from_str_radix(index, 16).ok()?,
    ))
}

impl Wal {
    /// Whether `dir` holds at least one segment (etcd's `wal.Exist`).
    pub fn exists(dir: &Path) -> bool {
        fs::read_dir(dir)
            .map(|rd| {
                rd.flatten().any(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(parse_segment_name)
                        .is_some()
                })
            })
            .unwrap_or(false)
    }

    /// Creates a new WAL in `dir` (created if missing) holding only metadata.
    pub fn create(dir: &Path, metadata: Metadata, options: WalOptions) -> Result<Wal, WalError> {
        crate::fileutil::create_private_dir_all(dir).map_err(io_err(dir))?;
        if Wal::exists(dir) {
            return Err(WalError::Inconsistent {
                dir: dir.to_path_buf(),
                reason: "create: a WAL already exists".into(),
            });
        }
        let segment = Segment {
            seq: 0,
            first_index: 0,
            path: dir.join(segment_name(0, 0)),
        };
        let hard_state = HardState::default();
        let snapshot = SnapshotMarker::default();
        let (active, active_len) = write_new_segment(
            &*options.ops,
            dir,
            &segment,
            &metadata,
            &hard_state,
            &snapshot,
            options.segment_bytes,
        )?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            options,
            segments: vec![segment],
            released: 0,
            active,
            active_len,
            pending: Vec::new(),
            metadata,
            last_index: 0,
            hard_state,
            snapshot,
            sync_count: 0,
            sync_observer: None,
            write_observer: None,
            failed: None,
        })
    }

    /// The identity recorded in the WAL of `dir` (None when there is no
    /// WAL yet), read from the first record of the newest segment without
    /// replaying the log: a restarted member takes its identity from here,
    /// never from bootstrap flags.
    pub fn read_metadata(dir: &Path) -> Result<Option<Metadata>, WalError> {
        let segments = list_segments(dir)?;
        let Some(segment) = segments.last() else {
            return Ok(None);
        };
        let mut head = Vec::new();
        fs::File::open(&segment.path)
            .and_then(|f| std::io::Read::take(f, METADATA_READ_LIMIT).read_to_end(&mut head))
            .map_err(io_err(&segment.path))?;
        match record::decode(&head) {
            Ok((Record::Metadata(metadata), _)) => Ok(Some(metadata)),
            _ => Err(WalError::Corrupt {
                path: segment.path.clone(),
                offset: 0,
                reason: "segment does not start with a metadata record".into(),
            }),
        }
    }

    /// Reads a WAL through without touching it (no repair of a torn tail,
    /// which is reported in `repaired_bytes` as what a start would cut):
    /// every record's CRC is checked. For offline tools.
    pub fn read(dir: &Path) -> Result<WalContents, WalError> {
        let Replayed {
            reader,
            tail,
            metadata,
            ..
        } = replay_dir(dir, 0)?;
        Ok(WalContents {
            metadata,
            hard_state: reader.hard_state,
            entries: reader.entries,
            snapshot: reader.snapshot,
            repaired_bytes: tail.torn_bytes,
        })
    }

    /// Opens the WAL in `dir`, reads every record, repairs a torn tail of the
    /// last segment and returns what it held.
    pub fn open(dir: &Path, options: WalOptions) -> Result<(Wal, WalContents), WalError> {
        Wal::open_at(dir, 0, options)
    }

    /// [`Wal::open`] for a member restarting from a snapshot at `index`:
    /// the segments before the one holding `index` are neither read nor
    /// kept from the purge (they are released), as etcd's `wal.Open` at a
    /// snapshot. The entries returned may still begin below `index`.
    pub fn open_at(
        dir: &Path,
        index: u64,
        options: WalOptions,
    ) -> Result<(Wal, WalContents), WalError> {
        let Replayed {
            segments,
            first_read,
            reader,
            tail,
            metadata,
        } = replay_dir(dir, index)?;
        let last_segment = segments
            .last()
            .cloned()
            .expect("replay_dir found a segment");
        let path = &last_segment.path;
        let active = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_err(path))?;
        let active_len = tail.valid_len;
        let mut file_len = tail.file_len;
        if tail.torn_bytes > 0 {
            tracing::warn!(
                file = %path.display(),
                offset = active_len,
                cut_bytes = tail.torn_bytes,
                "wal: repairing torn tail of last segment"
            );
            // Cut the torn record, then give the space back as zeros.
            let ops = &*options.ops;
            ops.set_len(&active, active_len).map_err(io_err(path))?;
            preallocate_what_fits(ops, &active, file_len.max(options.segment_bytes), path)
                .map_err(io_err(path))?;
            ops.sync_all(&active).map_err(io_err(path))?;
            file_len = active.metadata().map_err(io_err(path))?.len();
        }
        if file_len < options.segment_bytes && active_len < options.segment_bytes {
            // a segment written before preallocation existed, or after a
            // repair where preallocation is unsupported
            let ops = &*options.ops;
            if preallocate_what_fits(ops, &active, options.segment_bytes, path)
                .map_err(io_err(path))?
            {
                ops.sync_all(&active).map_err(io_err(path))?;
            }
        }
        let repaired_bytes = tail.torn_bytes;
        let snapshot = reader.snapshot.unwrap_or_default();
        // A snapshot received from the leader may lie beyond every entry.
        let last_index = reader
            .entries
            .last()
            .map_or(0, |e| e.index)
            .max(snapshot.index);
        let mut pending = Vec::new();
        if active_len == 0 {
            // repair removed everything, even the segment's metadata record
            record::encode(&Record::Metadata(metadata.clone()), &mut pending);
        }
        let contents = WalContents {
            metadata: metadata.clone(),
            hard_state: reader.hard_state.clone(),
            entries: reader.entries,
            snapshot: reader.snapshot,
            repaired_bytes,
        };
        let wal = Wal {
            dir: dir.to_path_buf(),
            options,
            segments,
            released: first_read,
            active,
            active_len,
            pending,
            metadata,
            last_index,
            hard_state: reader.hard_state,
            snapshot,
            sync_count: 0,
            sync_observer: None,
            write_observer: None,
            failed: None,
        };
        Ok((wal, contents))
    }

    /// Buffers entries and a hard state; nothing is durable until [`Wal::sync`].
    pub fn append(&mut self, entries: &[Entry], hard_state: Option<&HardState>) {
        for e in entries {
            debug_assert!(
                e.index <= self.last_index.saturating_add(1) || self.last_index == 0,
                "wal: gap before entry {} (last {})",
                e.index,
                self.last_index
            );
            record::encode(&Record::Entry(e.clone()), &mut self.pending);
            self.last_index = e.index;
        }
        if let Some(hs) = hard_state {
            record::encode(&Record::HardState(hs.clone()), &mut self.pending);
            self.hard_state = hs.clone();
        }
    }

    /// Buffers a snapshot marker.
    pub(crate) fn save_snapshot(&mut self, marker: SnapshotMarker) {
        record::encode(&Record::Snapshot(marker), &mut self.pending);
        if marker.index >= self.snapshot.index {
            self.snapshot = marker;
        }
        if marker.index > self.last_index {
            self.last_index = marker.index;
        }
    }

    /// Writes buffered records and fdatasyncs once; cuts a new segment when
    /// the active one is full.
    pub fn sync(&mut self) -> Result<(), WalError> {
        self.write_pending(true)
    }

    /// Writes buffered records without fdatasync: for records that need not
    /// be durable yet (a commit-index-only hard state), which the next
    /// [`Wal::sync`] makes durable anyway.
    pub(crate) fn flush(&mut self) -> Result<(), WalError> {
        self.write_pending(false)
    }

    fn write_pending(&mut self, sync: bool) -> Result<(), WalError> {
        let path = self.active_path().to_path_buf();
        if let Some(failed) = &self.failed {
            // After a failed write or fdatasync the kernel may have dropped
            // the dirty pages (fsyncgate): a later success proves nothing.
            return Err(WalError::Io {
                path,
                source: io::Error::other(format!("an earlier write failed: {failed}")),
            });
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        let result = self.write_pending_at(&path, sync);
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
        }
        result
    }

    fn write_pending_at(&mut self, path: &Path, sync: bool) -> Result<(), WalError> {
        // pwrite at the logical end: the file is preallocated beyond it
        let writing = std::time::Instant::now();
        self.options
            .ops
            .write_at(&self.active, &self.pending, self.active_len)
            .map_err(io_err(path))?;
        if let Some(observer) = &self.write_observer {
            observer
                .0
                .wal_written(self.pending.len() as u64, writing.elapsed());
        }
        self.active_len += self.pending.len() as u64;
        self.pending.clear();
        if !sync {
            return Ok(());
        }
        let started = std::time::Instant::now();
        if !self.options.unsafe_no_fsync {
            self.options
                .ops
                .sync_data(&self.active)
                .map_err(io_err(path))?;
        }
        if let Some(observer) = &self.sync_observer {
            (observer.0)(started.elapsed());
        }
        self.sync_count += 1;
        if self.active_len >= self.options.segment_bytes {
            self.cut()?;
        }
        Ok(())
    }

    fn cut(&mut self) -> Result<(), WalError> {
        // Seal the active segment: drop any zero tail beyond its records (as
        // etcd truncates on cut), durably, before the next segment exists —
        // the reader refuses a zero tail in a sealed segment.
        let path = self.active_path().to_path_buf();
        let file_len = self.active.metadata().map_err(io_err(&path))?.len();
        let ops = &*self.options.ops;
        if file_len > self.active_len {
            ops.set_len(&self.active, self.active_len)
                .map_err(io_err(&path))?;
            ops.sync_all(&self.active).map_err(io_err(&path))?;
        }
        let prev = self.segments.last().expect("wal has an active segment");
        // only a damaged marker or file name puts either at u64::MAX
        let (Some(seq), Some(first_index)) =
            (prev.seq.checked_add(1), self.last_index.checked_add(1))
        else {
            return Err(WalError::Inconsistent {
                dir: self.dir.clone(),
                reason: format!(
                    "no segment can follow {} (last index {})",
                    prev.path.display(),
                    self.last_index
                ),
            });
        };
        let segment = Segment {
            seq,
            first_index,
            path: self.dir.join(segment_name(seq, first_index)),
        };
        let (file, len) = write_new_segment(
            &*self.options.ops,
            &self.dir,
            &segment,
            &self.metadata,
            &self.hard_state,
            &self.snapshot,
            self.options.segment_bytes,
        )?;
        tracing::info!(file = %segment.path.display(), "wal: created a new segment");
        self.active = file;
        self.active_len = len;
        self.segments.push(segment);
        // one more file: a released one may now be one too many
        self.purge()
    }

    /// Releases the segments whose entries are all < `index` (the segment
    /// that may contain `index` and the active segment never are), then
    /// purges: etcd's `ReleaseLockTo` followed by its purge.
    pub(crate) fn release_to(&mut self, index: u64) -> Result<(), WalError> {
        // Segment k holds entries < segments[k+1].first_index, so it is
        // released when the next segment starts at or below `index`.
        let mut covered = 0;
        while covered + 1 < self.segments.len() && self.segments[covered + 1].first_index <= index {
            covered += 1;
        }
        self.released = self.released.max(covered);
        self.purge()
    }

    /// etcd's purge of `*.wal` files: while there are more than
    /// `max_files` segments (0: no limit), the oldest is deleted if it is
    /// released; an unreleased one stops the purge, as a segment whose
    /// lock etcd cannot take does.
    pub(crate) fn purge(&mut self) -> Result<(), WalError> {
        let max_files = self.options.max_files;
        if max_files == 0 {
            return Ok(());
        }
        let mut purged = false;
        while self.segments.len() > max_files && self.released > 0 {
            debug_assert!(
                self.released < self.segments.len(),
                "the active segment is released"
            );
            let segment = self.segments.remove(0);
            self.released -= 1;
            purged = true;
            if let Err(e) = self.options.ops.remove(&segment.path) {
                self.segments.insert(0, segment);
                self.released += 1;
                return Err(io_err(&self.segments[0].path)(e));
            }
            tracing::info!(path = %segment.path.display(), "purged");
        }
        if purged {
            self.options
                .ops
                .sync_dir(&self.dir)
                .map_err(io_err(&self.dir))?;
        }
        Ok(())
    }

    pub(crate) fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The last index the WAL accounts for: its last entry, or a snapshot
    /// marker beyond it.
    pub(crate) fn last_index(&self) -> u64 {
        self.last_index
    }

    /// Reports the duration of each later append fdatasync to `observer`.
    pub(crate) fn set_sync_observer(&mut self, observer: SyncObserver) {
        self.sync_observer = Some(observer);
    }

    /// Reports every write of buffered records to `observer`.
    pub(crate) fn set_write_observer(&mut self, observer: crate::Observer) {
        self.write_observer = Some(observer);
    }

    /// Number of fdatasync calls made by [`Wal::sync`] since open.
    pub(crate) fn sync_count(&self) -> u64 {
        self.sync_count
    }

    /// File names of the live segments, oldest first.
    #[cfg(test)]
    pub(crate) fn segment_paths(&self) -> Vec<PathBuf> {
        self.segments.iter().map(|s| s.path.clone()).collect()
    }

    fn active_path(&self) -> &Path {
        &self
            .segments
            .last()
            .expect("wal has an active segment")
            .path
    }
}

fn list_segments(dir: &Path) -> Result<Vec<Segment>, WalError> {
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".wal.tmp") {
            // A segment whose creation never finished: it held no entries.
            let _ = fs::remove_file(entry.path());
            continue;
        }
        if let Some((seq, first_index)) = parse_segment_name(name) {
            segments.push(Segment {
                seq,
                first_index,
                path: entry.path(),
            });
        }
    }
    segments.sort_by_key(|s| s.seq);
    for pair in segments.windows(2) {
        if pair[1].seq != pair[0].seq + 1 || pair[1].first_index < pair[0].first_index {
            return Err(WalError::Inconsistent {
                dir: dir.to_path_buf(),
                reason: format!(
                    "segments out of sequence: {} then {}",
                    pair[0].path.display(),
                    pair[1].path.display()
                ),
            });
        }
    }
    Ok(segments)
}
