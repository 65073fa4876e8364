//! The WAL's file operations behind one small trait, so that a test can put
//! in their place one that fails or tears a call, as redb's crash tests
//! replace its storage backend. Every write, sync, preallocation,
//! truncation, creation, rename and removal the WAL makes on its segments
//! and its directory goes through [`FileOps`]; reading a WAL back does not
//! (a read that fails is an error at open, with nothing to protect).

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

/// The file operations of the WAL's write path.
pub trait FileOps: Send + Sync + fmt::Debug {
    /// Creates (truncating) a file open for writing.
    fn create(&self, path: &Path) -> io::Result<File>;
    /// pwrite: all of `buf` at `offset`.
    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync.
    fn sync_data(&self, file: &File) -> io::Result<()>;
    /// fsync.
    fn sync_all(&self, file: &File) -> io::Result<()>;
    /// ftruncate.
    fn set_len(&self, file: &File, len: u64) -> io::Result<()>;
    /// posix_fallocate from 0 to `len`; Ok(false), doing nothing, where the
    /// filesystem cannot preallocate.
    fn preallocate(&self, file: &File, len: u64) -> io::Result<bool>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// fsync of a directory, so that creates, renames and removals in it are
    /// durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The operating system's calls: what a member uses.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsFileOps;

impl FileOps for OsFileOps {
    /// Created 0600, as etcd's WAL files.
    fn create(&self, path: &Path) -> io::Result<File> {
        crate::fileutil::create_private_file(path)
    }

    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        file.write_all_at(buf, offset)
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn sync_all(&self, file: &File) -> io::Result<()> {
        file.sync_all()
    }

    fn set_len(&self, file: &File, len: u64) -> io::Result<()> {
        file.set_len(len)
    }

    fn preallocate(&self, file: &File, len: u64) -> io::Result<bool> {
        super::file::preallocate(file, len)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        super::file::sync_dir(dir)
    }
}
