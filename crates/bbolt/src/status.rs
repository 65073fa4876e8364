//! etcd's `snapshot status` (etcdutl/snapshot/v3_snapshot.go `Status`, 3.5),
//! computed over a [`Reader`] exactly as etcdutl computes it over bbolt.

use std::io::{Read, Seek};

use crate::error::{show_key, ReadError};
use crate::reader::{Reader, Visit};

/// Length of an etcd revision key: main (u64 BE), `_`, sub (u64 BE);
/// tombstones add a `t`.
const REVISION_KEY_LEN: usize = 17;

/// What `etcdutl snapshot status -w json` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotStatus {
    /// CRC-32C over each top-level bucket's name, then each of its keys and
    /// values, in bbolt order (a nested bucket's entry contributes its key only).
    pub hash: u32,
    /// Main revision of the last key in bucket `key` (0 without one).
    pub revision: i64,
    /// Entries in all buckets, not only `key`.
    pub total_key: u64,
    /// bbolt's `tx.Size()`: high-water mark × page size (a trailing sha256 is not counted).
    pub total_size: u64,
}

/// Runs bbolt's consistency check, then hashes and counts as etcdutl does.
pub fn snapshot_status<R: Read + Seek>(
    reader: &mut Reader<R>,
) -> Result<SnapshotStatus, ReadError> {
    reader.check()?;
    let mut hash = 0u32;
    let mut revision = 0i64;
    let mut total_key = 0u64;
    let mut in_key_bucket = false;
    reader.visit(|visit| {
        match visit {
            Visit::Bucket(name) => {
                hash = crc32c::crc32c_append(hash, name);
                in_key_bucket = name == b"key";
            }
            Visit::Entry(item) => {
                hash = crc32c::crc32c_append(hash, item.key);
                // bbolt's ForEach gives a nil value for a nested bucket.
                if !item.is_bucket {
                    hash = crc32c::crc32c_append(hash, item.value);
                }
                if in_key_bucket {
                    // etcdutl's bytesToRev would panic on a shorter key.
                    if item.key.len() < REVISION_KEY_LEN {
                        return Err(ReadError::NotARevision(show_key(item.key)));
                    }
                    let mut main = [0u8; 8];
                    main.copy_from_slice(&item.key[..8]);
                    revision = i64::from_be_bytes(main);
                }
                total_key += 1;
            }
        }
        Ok::<(), ReadError>(())
    })?;
    Ok(SnapshotStatus {
        hash,
        revision,
        total_key,
        total_size: reader.size(),
    })
}
