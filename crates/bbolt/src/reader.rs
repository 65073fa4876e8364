//! Reading a bbolt file through `Read + Seek`, one page at a time.
//!
//! Nothing is cached: a [`Cursor`] holds the pages on its path from the
//! root to the current leaf (at most [`MAX_TREE_DEPTH`]), and every other
//! page is read when the walk reaches it. Every length, offset and page id
//! read from the file is checked against the page or the file before use,
//! so damaged or hostile bytes give a [`ReadError`], never a panic or an
//! allocation larger than the file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

use crate::cursor::{Cursor, Item};
use crate::error::{show_key, ReadError};
use crate::format::{
    is_supported_page_size, u32_at, u64_at, Meta, PageHeader, BRANCH_ELEMENT_SIZE,
    BUCKET_HEADER_SIZE, LEAF_ELEMENT_SIZE, META_SIZE, NO_FREELIST, PAGE_HEADER_SIZE,
};

/// Deepest B+tree accepted. With at least two children per branch page
/// this covers 2^32 leaves; a deeper walk means a reference cycle.
pub const MAX_TREE_DEPTH: usize = 32;

/// An open bbolt file: its chosen meta page and a source of pages.
pub struct Reader<R> {
    src: R,
    file_len: u64,
    meta: Meta,
    meta_page: u64,
    damaged_meta: Option<(u64, String)>,
}

impl Reader<File> {
    /// Opens the file at `path` (a trailing etcd sha256 may stay: reads stop
    /// at the high-water mark).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReadError> {
        Reader::new(File::open(path)?)
    }
}

impl<R: Read + Seek> Reader<R> {
    /// Reads and validates both meta pages and keeps the one bbolt would use:
    /// the valid one with the higher txid (meta 0 on a tie). A file with
    /// one damaged meta page opens, as in bbolt; see [`Reader::damaged_meta`].
    pub fn new(mut src: R) -> Result<Self, ReadError> {
        let file_len = src.seek(SeekFrom::End(0))?;
        let page_size = find_page_size(&mut src, file_len)?;
        let page_size_bytes = u64::from(page_size);
        if file_len < 2 * page_size_bytes {
            return Err(ReadError::NoValidMeta(format!(
                "page 1: missing, the file of {file_len} bytes ends before it (page size {page_size})"
            )));
        }
        let mut candidates = Vec::with_capacity(2);
        let mut damage = Vec::new();
        for page in 0..2u64 {
            let meta = read_meta(&mut src, page * page_size_bytes)?;
            match meta.validate() {
                Ok(()) if meta.page_size != page_size => damage.push((
                    page,
                    format!(
                        "page size {} differs from the file's page size {page_size}",
                        meta.page_size
                    ),
                )),
                Ok(()) => candidates.push((page, meta)),
                Err(what) => damage.push((page, what)),
            }
        }
        // bbolt's db.meta(): the higher txid wins, meta 0 on a tie.
        let chosen = match candidates.as_slice() {
            [] => {
                let parts: Vec<String> = damage
                    .iter()
                    .map(|(page, what)| format!("page {page}: {what}"))
                    .collect();
                return Err(ReadError::NoValidMeta(parts.join("; ")));
            }
            [only] => *only,
            [first, second, ..] => {
                if second.1.txid > first.1.txid {
                    *second
                } else {
                    *first
                }
            }
        };
        let (meta_page, meta) = chosen;
        let bad = |what: String| ReadError::BadMeta {
            page: meta_page,
            what,
        };
        if meta.pgid < 3 {
            return Err(bad(format!(
                "high-water mark of {} pages leaves no room for a root page",
                meta.pgid
            )));
        }
        if meta.root < 2 || meta.root >= meta.pgid {
            return Err(bad(format!(
                "root page {} out of bounds (high-water mark {})",
                meta.root, meta.pgid
            )));
        }
        if meta.freelist != NO_FREELIST && (meta.freelist < 2 || meta.freelist >= meta.pgid) {
            return Err(bad(format!(
                "freelist page {} out of bounds (high-water mark {})",
                meta.freelist, meta.pgid
            )));
        }
        match meta.pgid.checked_mul(page_size_bytes) {
            Some(size) if size <= file_len => {}
            _ => {
                return Err(bad(format!(
                    "high-water mark of {} pages of {page_size} bytes is past the end of the {file_len}-byte file \
                     (truncated?)",
                    meta.pgid
                )))
            }
        }
        Ok(Reader {
            src,
            file_len,
            meta,
            meta_page,
            damaged_meta: damage.into_iter().next(),
        })
    }

    /// The meta page in use.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Which meta page (0 or 1) is in use.
    pub fn meta_page(&self) -> u64 {
        self.meta_page
    }

    /// The other meta page when it failed validation (page, reason), e.g.
    /// `(1, "meta checksum mismatch")`. bbolt opens such a file using the
    /// valid page; a caller that wants both intact (a snapshot copied
    /// whole) refuses it.
    pub fn damaged_meta(&self) -> Option<(u64, &str)> {
        self.damaged_meta
            .as_ref()
            .map(|(page, what)| (*page, what.as_str()))
    }

    pub fn page_size(&self) -> u32 {
        self.meta.page_size
    }

    /// The database size bbolt reports (`tx.Size()`): high-water mark × page size.
    pub fn size(&self) -> u64 {
        self.meta.pgid * u64::from(self.meta.page_size)
    }

    /// Length of the underlying file (may exceed [`Reader::size`]).
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Cursor over the root bucket: its entries are the top-level buckets.
    pub fn root_cursor(&mut self) -> Result<Cursor, ReadError> {
        self.cursor(&BucketRoot::Page(self.meta.root))
    }

    /// Cursor over the bucket whose header is `root`.
    pub fn cursor(&mut self, root: &BucketRoot) -> Result<Cursor, ReadError> {
        Cursor::open(self, root)
    }

    /// Cursor over the top-level bucket `name`, if there is one.
    pub fn bucket(&mut self, name: &[u8]) -> Result<Option<Cursor>, ReadError> {
        let mut buckets = self.root_cursor()?;
        while let Some(item) = buckets.next(self)? {
            if item.key == name {
                if !item.is_bucket {
                    return Err(ReadError::NotABucket(show_key(name)));
                }
                let root = BucketRoot::parse(item.page, item.value)?;
                return self.cursor(&root).map(Some);
            }
            if item.key > name {
                break;
            }
        }
        Ok(None)
    }

    /// Walks every top-level bucket in order and every entry in it, as
    /// `tx.ForEach` + `Bucket.ForEach` do. Nested buckets are reported as
    /// entries with `is_bucket` (their value is the bucket header), not
    /// descended into. A top-level key that is not a bucket is an error.
    pub fn visit<E: From<ReadError>>(
        &mut self,
        mut visitor: impl FnMut(Visit<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut buckets = self.root_cursor()?;
        while let Some(item) = buckets.next(self)? {
            if !item.is_bucket {
                return Err(ReadError::NotABucket(show_key(item.key)).into());
            }
            let root = BucketRoot::parse(item.page, item.value)?;
            visitor(Visit::Bucket(item.key))?;
            let mut entries = self.cursor(&root)?;
            while let Some(entry) = entries.next(self)? {
                visitor(Visit::Entry(entry))?;
            }
        }
        Ok(())
    }

    /// bbolt's `tx.Check()`; see [`crate::check`].
    pub fn check(&mut self) -> Result<(), ReadError> {
        crate::check::check(self)
    }

    /// Reads page `id` with its overflow pages into `buf`, checking that
    /// its header names it and that it ends below the high-water mark.
    pub(crate) fn read_page(
        &mut self,
        id: u64,
        buf: &mut Vec<u8>,
    ) -> Result<PageHeader, ReadError> {
        let page_size = self.meta.page_size as usize;
        if id >= self.meta.pgid {
            return Err(ReadError::Corrupt {
                page: id,
                what: format!("page id out of bounds (high-water mark {})", self.meta.pgid),
            });
        }
        self.src.seek(SeekFrom::Start(id * page_size as u64))?;
        buf.clear();
        buf.resize(page_size, 0);
        self.src.read_exact(buf)?;
        let header = PageHeader::decode(buf);
        if header.id != id {
            return Err(ReadError::Corrupt {
                page: id,
                what: format!(
                    "page header names page {} (misplaced or damaged page)",
                    header.id
                ),
            });
        }
        let end = id + u64::from(header.overflow) + 1;
        if end > self.meta.pgid {
            return Err(ReadError::Corrupt {
                page: id,
                what: format!(
                    "{} overflow pages run past the high-water mark {}",
                    header.overflow, self.meta.pgid
                ),
            });
        }
        if header.overflow > 0 {
            // Bounded by the file: pgid * page_size <= file length.
            let total = (u64::from(header.overflow) + 1) as usize * page_size;
            buf.resize(total, 0);
            self.src.read_exact(&mut buf[page_size..])?;
        }
        Ok(header)
    }

    pub(crate) fn high_water_mark(&self) -> u64 {
        self.meta.pgid
    }
}

/// Finds the page size as bbolt's `getPageSize` does: from meta page 0 if
/// it is valid, else by probing for meta page 1 at 1 KiB, 2 KiB, … 16 MiB.
fn find_page_size<R: Read + Seek>(src: &mut R, file_len: u64) -> Result<u32, ReadError> {
    let first = if file_len >= (PAGE_HEADER_SIZE + META_SIZE) as u64 {
        let meta = read_meta(src, 0)?;
        match meta.validate() {
            Ok(()) if is_supported_page_size(meta.page_size) => return Ok(meta.page_size),
            Ok(()) => format!("unsupported page size {}", meta.page_size),
            Err(what) => what,
        }
    } else {
        format!("file of {file_len} bytes is too short for a meta page")
    };
    for shift in 0..=14u32 {
        let position = 1024u64 << shift;
        if position + 1024 >= file_len {
            break;
        }
        let meta = read_meta(src, position)?;
        if meta.validate().is_ok()
            && u64::from(meta.page_size) == position
            && is_supported_page_size(meta.page_size)
        {
            return Ok(meta.page_size);
        }
    }
    // As bbolt, which then tries the OS page size: say what is wrong with
    // meta page 1 at 4 KiB.
    const DEFAULT_PAGE_SIZE: u64 = 4096;
    let second = if file_len >= DEFAULT_PAGE_SIZE + (PAGE_HEADER_SIZE + META_SIZE) as u64 {
        let meta = read_meta(src, DEFAULT_PAGE_SIZE)?;
        match meta.validate() {
            Ok(()) => format!("page size {} does not match its position", meta.page_size),
            Err(what) => what,
        }
    } else {
        "no valid meta page at any page size".to_string()
    };
    Err(ReadError::NoValidMeta(format!(
        "page 0: {first}; page 1: {second}"
    )))
}

fn read_meta<R: Read + Seek>(src: &mut R, page_offset: u64) -> Result<Meta, ReadError> {
    let mut bytes = [0u8; PAGE_HEADER_SIZE + META_SIZE];
    src.seek(SeekFrom::Start(page_offset))?;
    src.read_exact(&mut bytes)?;
    Ok(Meta::decode(&bytes[PAGE_HEADER_SIZE..]))
}

/// Where a bucket's tree starts, from the bucket's value in its parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BucketRoot {
    /// Root page id.
    Page(u64),
    /// An inline bucket: `bytes` is its leaf page image, stored in the
    /// value on page `page` of the parent.
    Inline { page: u64, bytes: Vec<u8> },
}

impl BucketRoot {
    /// Parses a bucket value (`bucket{root, sequence}`, then the inline page
    /// when root is 0) found on page `page`.
    pub fn parse(page: u64, value: &[u8]) -> Result<BucketRoot, ReadError> {
        if value.len() < BUCKET_HEADER_SIZE {
            return Err(ReadError::Corrupt {
                page,
                what: format!(
                    "bucket value of {} bytes is shorter than a bucket header",
                    value.len()
                ),
            });
        }
        match u64_at(value, 0) {
            0 => {
                let bytes = &value[BUCKET_HEADER_SIZE..];
                if bytes.len() < PAGE_HEADER_SIZE {
                    return Err(ReadError::Corrupt {
                        page,
                        what: "inline bucket is shorter than a page header".to_string(),
                    });
                }
                Ok(BucketRoot::Inline {
                    page,
                    bytes: bytes.to_vec(),
                })
            }
            root => Ok(BucketRoot::Page(root)),
        }
    }
}

/// What [`Reader::visit`] reports, in file order.
#[derive(Clone, Copy, Debug)]
pub enum Visit<'a> {
    /// A top-level bucket starts; its entries follow.
    Bucket(&'a [u8]),
    Entry(Item<'a>),
}

/// A leaf element's key and value positions within its page bytes.
pub(crate) struct LeafElement {
    pub flags: u32,
    pub key: Range<usize>,
    pub value: Range<usize>,
}

/// A branch element's key position and child page.
pub(crate) struct BranchElement {
    pub key: Range<usize>,
    pub child: u64,
}

/// Checks that a page's element table fits its bytes.
pub(crate) fn check_element_table(page: u64, bytes: &[u8], count: usize) -> Result<(), ReadError> {
    // Leaf and branch elements are both 16 bytes.
    let table_end = PAGE_HEADER_SIZE + count * LEAF_ELEMENT_SIZE;
    if table_end > bytes.len() {
        return Err(ReadError::Corrupt {
            page,
            what: format!(
                "{count} elements do not fit a page of {} bytes",
                bytes.len()
            ),
        });
    }
    Ok(())
}

/// The data range `[element + pos, + len)`, checked against the page.
fn element_data(
    page: u64,
    bytes: &[u8],
    element: usize,
    pos: u32,
    len: u64,
    index: usize,
) -> Result<usize, ReadError> {
    let start = element as u64 + u64::from(pos);
    match start.checked_add(len) {
        Some(end) if end <= bytes.len() as u64 => Ok(start as usize),
        _ => Err(ReadError::Corrupt {
            page,
            what: format!("element {index} points past the end of its page"),
        }),
    }
}

/// Leaf element `index` (the table was checked by [`check_element_table`]).
pub(crate) fn leaf_element(
    page: u64,
    bytes: &[u8],
    index: usize,
) -> Result<LeafElement, ReadError> {
    let element = PAGE_HEADER_SIZE + index * LEAF_ELEMENT_SIZE;
    let flags = u32_at(bytes, element);
    let pos = u32_at(bytes, element + 4);
    let key_size = u32_at(bytes, element + 8) as usize;
    let value_size = u32_at(bytes, element + 12) as usize;
    let start = element_data(
        page,
        bytes,
        element,
        pos,
        key_size as u64 + value_size as u64,
        index,
    )?;
    Ok(LeafElement {
        flags,
        key: start..start + key_size,
        value: start + key_size..start + key_size + value_size,
    })
}

/// Branch element `index` (the table was checked by [`check_element_table`]).
pub(crate) fn branch_element(
    page: u64,
    bytes: &[u8],
    index: usize,
) -> Result<BranchElement, ReadError> {
    let element = PAGE_HEADER_SIZE + index * BRANCH_ELEMENT_SIZE;
    let pos = u32_at(bytes, element);
    let key_size = u32_at(bytes, element + 4) as usize;
    let child = u64_at(bytes, element + 8);
    let start = element_data(page, bytes, element, pos, key_size as u64, index)?;
    Ok(BranchElement {
        key: start..start + key_size,
        child,
    })
}
