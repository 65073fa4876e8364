//! Multi-version key-value storage for oxcd, the role of etcd's `mvcc` and
//! `mvcc/backend` packages.
//!
//! # What it owns
//!
//! * The **global revision**: each write transaction that changes at least
//!   one key takes `main = current + 1`; its operations take `sub = 0, 1, 2…`.
//!   A fresh store is at revision 1 (as etcd), so the first write is 2.
//! * The **key index** ([`key_index`]): per key, etcd's generations of
//!   revisions (created revision, version counter, revisions; a delete appends
//!   a tombstone and opens an empty generation). Only revisions live in
//!   memory — never values.
//! * The **redb file** (layout below) and the **pending batch**: writes that
//!   `TxnWrite::end` published but `Store::commit` has not written yet.
//! * The etcd semantics of Range / Put / DeleteRange / Txn / Compact, down to
//!   etcdserver/apply.go's filter, sort and compare rules.
//!
//! # What it never does
//!
//! No networking, no async runtime, no raft, no lease or auth checks (the
//! server checks a lease exists before a put; we only store its id), no
//! request validation that etcd does before apply (empty key, txn duplicate
//! keys, value with ignore_value): callers validate, as etcd's server does.
//!
//! # Usage
//!
//! ```no_run
//! # use mvcc::Store;
//! # use api::etcdserverpb::{PutRequest, RangeRequest};
//! let store = Store::open(std::path::Path::new("db"))?;
//! let mut txn = store.write(7); // raft index 7 is being applied
//! txn.put(&PutRequest { key: "foo".into(), value: "bar".into(), ..Default::default() })?;
//! let result = txn.end(); // revision 2, one PUT event
//! store.commit(false)?; // batch to redb; `true` fsyncs it
//! let got = store.range(&RangeRequest { key: "foo".into(), ..Default::default() })?;
//! # Ok::<(), mvcc::MvccError>(())
//! ```
//!
//! # On-disk layout (format version 3)
//!
//! One redb 4 database with three tables (and the side tables below).
//!
//! Table `key` (`&[u8]` → `&[u8]`): one record per change.
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | main revision, i64 big-endian (non-negative) |
//! | 8 | `b'_'` |
//! | 9..17 | sub revision, i64 big-endian (non-negative) |
//! | 17 | only on deletions: `b't'` (tombstone mark; key is then 18 bytes) |
//!
//! Value: a protobuf `mvccpb.KeyValue` (prost encoding), sealed: followed by
//! 5 bytes, `0x7d` and the CRC-32 (IEEE, little-endian) of the encoding
//! before it — protobuf field 15 as a fixed32, so the sealed record is still
//! a valid KeyValue encoding. A put stores the full KeyValue (key,
//! create_revision, mod_revision, version, value, lease); a tombstone stores
//! `KeyValue { key }` only. Byte order of the keys is revision order, so a
//! scan of the table replays history.
//!
//! Every read of a record checks its seal (redb checks no checksum on
//! reads): a record whose bytes changed is refused with
//! [`MvccError::Corrupt`] and reported to the
//! [`Store::set_corruption_observer`] observer, never served; opening a
//! file with such a record fails. Format 1 (the same without the seal) is
//! upgraded in place when opened or installed as a snapshot.
//!
//! A sealed record longer than `parts::PART_BYTES` (4,062 B) is stored
//! in page-sized parts in table `key_parts` (`&[u8]` → `&[u8]`: the
//! record's key and the part's number, u32 big-endian → exactly 4,062
//! bytes of the record), and only its last bytes in `key`, followed by
//! `0x75` and the number of parts (u32 little-endian); readers join them
//! back (see the `parts` module). Format 2 (every record whole) is read as it is and
//! marked 3 when opened: its whole long records stay as they are.
//!
//! Table `meta` (`&str` → `&[u8]`):
//!
//! | key | value |
//! |---|---|
//! | `consistent_index` | u64 big-endian: last raft index whose effects the file holds |
//! | `scheduledCompactRev` | i64 big-endian: last compaction requested |
//! | `finishedCompactRev` | i64 big-endian: last compaction whose deletions are in the file |
//! | `mvcc_format_version` | u32 big-endian: 3 |
//!
//! Side tables `members`, `lease`, `alarm` and `auth` (`u64` → `&[u8]`, see
//! [`SideTable`]) hold records the server encodes (a member, a
//! `leasepb.Lease`, an alarm, the auth store); mvcc stores them in the same transaction as
//! the consistent index of the entry that changed them and never reads them.
//!
//! Snapshot files (what Maintenance.Snapshot streams and `oxctl snapshot`
//! reads: this redb file, padding, a sha256) are laid out in [`snapshot_file`].
//!
//! # Invariants
//!
//! * The consistent index is written in the same redb transaction as the
//!   records it covers. A commit is `Durability::None` unless asked durable
//!   (`Immediate`); [`Store::durable_consistent_index`] is what an
//!   `Immediate` commit covered, the only index up to which the WAL may go.
//!   [`Store::commit`]'s durable commit writes its batch without fsync
//!   under the writer lock, then makes it durable with an empty
//!   `Immediate` transaction outside it (redb persists the commits before
//!   a durable one); the durable index moves only once that returned, and
//!   no commit goes in between (they wait, or are deferred).
//! * Readers see published-but-uncommitted writes: values are looked up in
//!   the pending overlay first, then in a redb read transaction begun after
//!   the overlay miss. The writer removes overlay entries only after the redb
//!   commit returned, so a miss always finds the record in redb.
//! * Revisions only grow (asserted in the key index and at `end`).
//! * Memory is bounded by the key count, not the file: the key index holds
//!   revisions only (~100 B per key written once, see [`key_index`]), and
//!   redb's own page cache is capped (`backend::CACHE_BYTES`); the rest of
//!   the file is left to the OS page cache. Nothing on the commit path reads
//!   the whole file (redb's page count walks every page: durable and
//!   compaction commits only).
//! * One writer at a time (`write`, `compact`, `commit` and
//!   `set_consistent_index` take the writer lock): never call `commit` or
//!   `compact` on a thread that holds a [`TxnWrite`].
//! * A compaction at `rev` keeps, for each key, its latest revision at `rev`
//!   (unless that is a tombstone) and everything after; the records it drops
//!   leave the file at the next commit together with `finishedCompactRev`.
//! * On open, the index is rebuilt from the `key` table; the current revision
//!   is the highest revision in it, or the finished compaction revision if
//!   higher, or 1. Uncommitted writes are lost: the WAL replays them. After
//!   a clean stop ([`Store::close`]) the index is read from the table
//!   `oxcd_index_checkpoint` instead (see [`index_checkpoint`]), which the
//!   open deletes.

mod backend;
mod compaction;
mod copy_file;
mod deferred_check;
mod defrag;
pub mod etcd_backend;
mod flush;
mod hash;
pub mod image_stream;
mod index_checkpoint;
mod io_priority;
pub mod key_index;
mod parts;
mod range;
mod read_drop;
pub mod record_stream;
pub mod revision;
mod snapshot;
pub mod snapshot_file;
mod stats;
mod store;
mod txn;
pub mod watch;
mod watch_group;
mod watch_sync;

// Failpoint sites (`crate::fail_point!`) are compiled in only with the
// `failpoints` feature (test builds); without it they expand to nothing.
#[cfg(feature = "failpoints")]
pub(crate) use failpoint::fail_point;
#[cfg(not(feature = "failpoints"))]
macro_rules! fail_point {
    ($($site:tt)*) => {};
}
#[cfg(not(feature = "failpoints"))]
pub(crate) use fail_point;

pub use backend::{scan_key_value, KeyValueFields, SideTable};
pub use compaction::CompactionBatches;
pub use defrag::DefragStats;
pub use flush::FLUSH_INTERVAL;
pub use hash::KvHash;
pub use io_priority::idle_io_priority;
pub use revision::{Revision, RevisionKey};
pub use stats::{CompactionObserver, OpCounts};
pub use store::{CommitObserver, CorruptionObserver, LeaseLookup, Store};
pub use txn::{is_txn_read_only, TxnWrite, WriteResult};
pub use watch::{
    WatchError, WatchId, WatchOptions, WatchResponse, WatchStream, AUTO_WATCH_ID, INVALID_WATCH_ID,
};

/// Errors of the store; Display strings are etcd's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MvccError {
    #[error("mvcc: required revision has been compacted")]
    Compacted,
    #[error("mvcc: required revision is a future revision")]
    FutureRev,
    /// A put with ignore_value/ignore_lease on a missing key.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    /// A put names a lease the lease lookup does not know.
    #[error("lease not found")]
    LeaseNotFound,
    #[error("mvcc: backend: {0}")]
    Backend(String),
    #[error("mvcc: corrupt data: {0}")]
    Corrupt(String),
    /// A commit asked for while a defragmentation copies the file: the
    /// batch stays pending (readable) and is committed after the swap.
    #[error("mvcc: commit deferred by a defragmentation")]
    Deferred,
}

#[cfg(test)]
mod checksum_tests;
#[cfg(test)]
mod key_index_memory_tests;
#[cfg(test)]
mod parts_tests;
#[cfg(test)]
mod redb_patch_tests;
#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod watch_tests;
