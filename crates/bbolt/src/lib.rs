//! bbolt database files, as etcd 3.5 writes them (go.etcd.io/bbolt v1.3.11):
//! a streaming [`Writer`], a page-at-a-time [`Reader`] with bbolt's
//! consistency check, and etcd's `snapshot status` computation. etcd's
//! backend file and its snapshots (the same file plus a trailing sha256)
//! are bbolt databases; this crate is how oxcd reads and writes them.
//!
//! Never: linking other oxcd crates, knowing etcd's record encodings
//! (beyond the revision key of bucket `key` that `status` needs), mapping
//! files into memory, loading a whole file, or panicking on any input.
//!
//! # Format (bbolt v1.3.x, little-endian)
//!
//! A file is an array of pages of `page_size` bytes (the OS page size when
//! bbolt created it; 4096 on amd64). Page `n` starts at byte `n * page_size`.
//! Every page opens with a 16-byte header:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | `id`: the page's own number |
//! | 8..10 | `flags`: `0x01` branch, `0x02` leaf, `0x04` meta, `0x10` freelist (exactly one) |
//! | 10..12 | `count`: elements on the page |
//! | 12..16 | `overflow`: pages after this one that it also occupies |
//!
//! **Meta pages** 0 and 1 hold, from byte 16: `magic` u32 `0xED0CDAED`,
//! `version` u32 `2`, `page_size` u32, `flags` u32 (0), the root bucket
//! (`root` page u64, `sequence` u64), `freelist` page u64 (`u64::MAX` when
//! not persisted, as etcd runs with `NoFreelistSync`), `pgid` u64 (the
//! high-water mark: pages in use), `txid` u64, and `checksum` u64 = FNV-1a 64
//! over the 56 bytes before it. A reader uses the valid meta page (magic,
//! version, checksum) with the higher txid. bbolt's `tx.WriteTo` (etcd's
//! snapshot) writes both pointing at the same tree, meta 1 with `txid - 1`;
//! the file is then exactly `pgid * page_size` bytes.
//!
//! **Leaf pages**: `count` elements of 16 bytes (`flags` u32, `pos` u32,
//! `ksize` u32, `vsize` u32), then the keys and values; an element's key
//! starts `pos` bytes after the element itself, its value right after the
//! key. Element flag `0x01` marks a nested bucket: the value is a bucket
//! header (`root` page u64, `sequence` u64); `root == 0` means an *inline*
//! bucket, whose single leaf follows the header as a page image (header id
//! 0, no padding). **Branch pages**: elements of 16 bytes (`pos` u32,
//! `ksize` u32, child `pgid` u64), then the keys; each key is the first
//! key of its child. A page larger than `page_size` (a large value, or
//! large keys) occupies `overflow + 1` consecutive pages; only the first has
//! a header.
//!
//! **Freelist page**: `count` page ids (u64); a count of `0xFFFF` means the
//! real count is the first u64.
//!
//! The root bucket's tree (from the meta page) holds one entry per
//! top-level bucket: key = name, flags = bucket, value = bucket header.
//! Keys are non-empty byte strings, at most 32768 bytes, strictly ascending
//! in byte order within a bucket; values are at most 2^31 - 2 bytes and may
//! be empty.
//!
//! # What the writer produces
//!
//! [`Writer`] streams pages in increasing id order: pages 0 and 1 (metas,
//! written last), page 2 an empty freelist (or none: [`WriterOptions`]),
//! then each bucket's leaves and branches as they fill, interleaved with
//! the root bucket's pages. Leaves are packed full, two entries at least as
//! bbolt splits them (entries larger than half a page go in pairs, on a leaf
//! with overflow pages); a branch page holds at least two children. A bucket whose entries fit in
//! a quarter page (bbolt's `maxInlineBucketSize`, headers included) is
//! written inline, as bbolt does — so etcd's small buckets look as in
//! etcd's own files. Memory is bounded by a few pages per tree level,
//! independent of the number of keys. The size is a multiple of the page
//! size, hence of 512, so etcd finds an appended sha256 (`size % 512 == 32`).
//!
//! # What the reader checks
//!
//! Opening validates both meta pages and the chosen one's bounds. Cursors
//! check every element against its page and refuse unordered keys.
//! [`Reader::check`] is bbolt's `tx.Check()` and more (see [`check`]).
//! Errors name the page: `page 1: meta checksum mismatch`,
//! `page 57: invalid type: unknown page type 0x20 (expected branch or leaf)`.

pub mod check;
mod cursor;
mod error;
mod format;
mod pages;
mod reader;
mod status;
mod writer;

pub use cursor::{Cursor, Item};
pub use error::{ReadError, WriteError};
pub use format::{Meta, MAX_KEY_SIZE, MAX_VALUE_SIZE, NO_FREELIST};
pub use reader::{BucketRoot, Reader, Visit, MAX_TREE_DEPTH};
pub use status::{snapshot_status, SnapshotStatus};
pub use writer::{Writer, WriterOptions, MAX_WRITE_PAGE_SIZE};
