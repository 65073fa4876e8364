//! The WAL's file operations: creating a segment, preallocating it, the
//! volume's free space, syncing a directory.

use std::fs::File;
use std::io;
use std::path::Path;

use raft::eraftpb::HardState;

use super::ops::FileOps;
use super::record::{self, Metadata, Record, SnapshotMarker};
use super::{io_err, Segment, WalError};

/// fsync a directory so that creates, renames and deletes in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Allocates `file` up to `len` bytes (never shrinking it) with
/// `posix_fallocate`; the new space reads as zeros. Returns false, having done
/// nothing, where the filesystem cannot preallocate.
pub(crate) fn preallocate(file: &File, len: u64) -> io::Result<bool> {
    if len == 0 {
        return Ok(false);
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd as _;
        let len = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "preallocation too large"))?;
        // SAFETY: plain syscall on a file descriptor owned by `file`, which
        // outlives the call.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        // posix_fallocate returns the error number; it does not set errno
        match rc {
            0 => Ok(true),
            libc::EOPNOTSUPP => {
                tracing::debug!("wal: filesystem cannot preallocate; segments will grow");
                Ok(false)
            }
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        Ok(false)
    }
}

/// [`preallocate`], but on a volume without room for `len` bytes (ENOSPC),
/// half of its free space (the backend shares the volume), with a warning:
/// a small volume still starts and serves until it fills, as etcd does on a
/// volume just larger than its segment. Returns whether anything was
/// preallocated; segments grow as written beyond it.
pub(super) fn preallocate_what_fits(
    ops: &dyn FileOps,
    file: &File,
    len: u64,
    path: &Path,
) -> io::Result<bool> {
    match ops.preallocate(file, len) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
            let current = file.metadata()?.len();
            let free = free_bytes(path.parent().unwrap_or(path))?;
            let fits = current + free / 2;
            tracing::warn!(
                file = %path.display(),
                "segment-bytes" = len,
                "volume-free-bytes" = free,
                "preallocated-bytes" = fits.max(current),
                "wal: the volume is too small for a whole segment; preallocating what fits \
                 (the member stops when the volume fills)"
            );
            if fits <= current {
                return Ok(false);
            }
            match ops.preallocate(file, fits) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => Ok(false),
                other => other,
            }
        }
        other => other,
    }
}

/// Bytes an unprivileged writer can still allocate on the volume holding
/// `path` (statvfs's f_bavail).
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is a valid NUL-terminated string and stat a writable
    // statvfs; the struct is read only after the call succeeded.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let stat = unsafe { stat.assume_init() };
    // fsblkcnt_t and c_ulong are u64 only on 64-bit targets
    #[allow(clippy::unnecessary_cast)]
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

/// Creates `segment` holding its header records, preallocated to
/// `preallocate_to`; returns it open for writing with its logical length.
pub(super) fn write_new_segment(
    ops: &dyn FileOps,
    dir: &Path,
    segment: &Segment,
    metadata: &Metadata,
    hard_state: &HardState,
    snapshot: &SnapshotMarker,
    preallocate_to: u64,
) -> Result<(File, u64), WalError> {
    let mut buf = Vec::new();
    record::encode(&Record::Metadata(metadata.clone()), &mut buf);
    if *hard_state != HardState::default() {
        record::encode(&Record::HardState(hard_state.clone()), &mut buf);
    }
    if snapshot.index > 0 {
        record::encode(&Record::Snapshot(*snapshot), &mut buf);
    }
    let tmp = segment.path.with_extension("wal.tmp");
    let file = ops.create(&tmp).map_err(io_err(&tmp))?;
    ops.write_at(&file, &buf, 0).map_err(io_err(&tmp))?;
    if preallocate_to > buf.len() as u64 {
        preallocate_what_fits(ops, &file, preallocate_to, &tmp).map_err(io_err(&tmp))?;
    }
    ops.sync_all(&file).map_err(io_err(&tmp))?;
    ops.rename(&tmp, &segment.path)
        .map_err(io_err(&segment.path))?;
    ops.sync_dir(dir).map_err(io_err(dir))?;
    // The descriptor follows the rename; records go at the logical length.
    Ok((file, buf.len() as u64))
}
