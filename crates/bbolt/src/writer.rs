//! Writing a bbolt file in one pass, from buckets and keys given in order.
//!
//! Each tree (the root bucket's, and the current bucket's) is a stack of
//! open pages, one per level: a leaf page fills with entries and is written
//! as soon as the next entry would not fit; writing it adds (first key, page
//! id) to the open branch page one level up, which is written the same way
//! when full. At the end of a tree the open pages are written bottom-up and
//! the topmost page is the root. Pages therefore reach the output in
//! increasing id order, strictly sequentially; only the two meta pages, which
//! name the root and the high-water mark, are written last, by seeking back
//! to the start.
//!
//! Memory: one open page per tree level for two trees (the root bucket's
//! and the current bucket's), plus a bucket's entries while it may still be
//! inlined (a quarter page). An open page is at most a page, or two 32 KiB
//! keys on a branch page. None of it grows with the number of keys (a tree
//! of 4 KiB pages has 4 levels at 10^7 keys); a value larger than a page is
//! written straight from the caller's slice, never copied.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{show_key, WriteError};
use crate::format::{
    PageHeader, BUCKET_HEADER_SIZE, BUCKET_LEAF_FLAG, FREELIST_PAGE, LEAF_ELEMENT_SIZE, LEAF_PAGE,
    MAGIC, MAX_KEY_SIZE, MAX_VALUE_SIZE, META_PAGE, MIN_PAGE_SIZE, NO_FREELIST, VERSION,
};
use crate::pages::{PageBuilder, PageSink, TreeBuilder};
use crate::Meta;

/// Largest page size the writer produces: the largest OS page size bbolt
/// runs with on Linux; it also keeps a page's element count far below the
/// header's u16 limit.
pub const MAX_WRITE_PAGE_SIZE: u32 = 64 * 1024;

/// How a [`Writer`] lays out the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterOptions {
    /// Bytes per page: a power of two from 1 KiB to 64 KiB. bbolt (and etcd)
    /// use the OS page size, 4096 on amd64.
    pub page_size: u32,
    /// Transaction id of meta page 0; meta page 1 gets `txid - 1`, both
    /// pointing at the same tree, as bbolt's `tx.WriteTo` (etcd's snapshot)
    /// writes them. At least 1.
    pub txid: u64,
    /// `true`: an empty freelist page at page 2, as a fresh `bbolt.Open`
    /// writes it, readable by every bbolt version. `false`: no freelist
    /// (`pgidNoFreelist`), as etcd's own files (NoFreelistSync); bbolt
    /// v1.3.1+ rebuilds it by scanning the tree.
    pub persist_freelist: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            page_size: 4096,
            txid: 2,
            persist_freelist: true,
        }
    }
}

/// Builds a bbolt file from top-level buckets given in ascending name order,
/// each with its keys in ascending order. See the module doc for the layout.
///
/// ```
/// let mut out = std::io::Cursor::new(Vec::new());
/// let mut writer = bbolt::Writer::new(&mut out, 4096)?;
/// writer.begin_bucket(b"key")?;
/// writer.put(b"a", b"1")?;
/// writer.begin_bucket(b"meta")?;
/// let size = writer.finish()?;
/// assert_eq!(size, out.get_ref().len() as u64);
/// # Ok::<(), bbolt::WriteError>(())
/// ```
pub struct Writer<W: Write + Seek> {
    sink: PageSink<W>,
    options: WriterOptions,
    root: TreeBuilder,
    bucket: Option<OpenBucket>,
    last_bucket: Option<Vec<u8>>,
    /// Set when a call failed half-way: the file is then unusable.
    poisoned: bool,
}

impl Writer<BufWriter<File>> {
    /// Creates (or truncates) the file at `path` and writes into it.
    pub fn create(path: impl AsRef<Path>, options: WriterOptions) -> Result<Self, WriteError> {
        let file = File::create(path)?;
        Writer::with_options(BufWriter::with_capacity(1 << 20, file), options)
    }
}

impl<W: Write + Seek> Writer<W> {
    /// A writer with the default options and the given page size.
    pub fn new(out: W, page_size: u32) -> Result<Self, WriteError> {
        Writer::with_options(
            out,
            WriterOptions {
                page_size,
                ..WriterOptions::default()
            },
        )
    }

    /// Page 0 is `out`'s current position.
    pub fn with_options(mut out: W, options: WriterOptions) -> Result<Self, WriteError> {
        let page_size = options.page_size;
        if !page_size.is_power_of_two()
            || !(MIN_PAGE_SIZE..=MAX_WRITE_PAGE_SIZE).contains(&page_size)
        {
            return Err(WriteError::PageSize(page_size));
        }
        let txid = options.txid.max(1);
        let base = out.stream_position()?;
        let mut sink = PageSink {
            out,
            base,
            page_size: page_size as usize,
            next_pgid: 0,
            scratch: Vec::new(),
        };
        // Placeholders for the meta pages, written for real by finish().
        sink.write_zero_pages(2)?;
        if options.persist_freelist {
            let freelist = PageBuilder::new(FREELIST_PAGE);
            sink.write_page(&freelist)?;
        }
        Ok(Writer {
            sink,
            options: WriterOptions { txid, ..options },
            root: TreeBuilder::new(),
            bucket: None,
            last_bucket: None,
            poisoned: false,
        })
    }

    /// Ends the current bucket (if any) and starts the top-level bucket
    /// `name`, which must sort after the previous bucket's name.
    pub fn begin_bucket(&mut self, name: &[u8]) -> Result<(), WriteError> {
        self.guard(|writer| {
            check_key("bucket name", name)?;
            if let Some(previous) = &writer.last_bucket {
                if name <= previous.as_slice() {
                    return Err(WriteError::OutOfOrder {
                        what: "bucket",
                        key: show_key(name),
                        previous: show_key(previous),
                    });
                }
            }
            writer.end_bucket()?;
            writer.last_bucket = Some(name.to_vec());
            writer.bucket = Some(OpenBucket {
                name: name.to_vec(),
                last_key: None,
                body: BucketBody::Inline(PageBuilder::new(LEAF_PAGE)),
            });
            Ok(())
        })
    }

    /// Adds a key/value to the current bucket; keys must be non-empty and
    /// strictly ascending; values may be empty.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), WriteError> {
        self.guard(|writer| {
            check_key("key", key)?;
            if value.len() > MAX_VALUE_SIZE {
                return Err(WriteError::TooLarge {
                    what: "value",
                    len: value.len(),
                    limit: MAX_VALUE_SIZE,
                });
            }
            let page_size = writer.sink.page_size;
            let Some(bucket) = writer.bucket.as_mut() else {
                return Err(WriteError::NoBucket);
            };
            if let Some(previous) = &bucket.last_key {
                if key <= previous.as_slice() {
                    return Err(WriteError::OutOfOrder {
                        what: "key",
                        key: show_key(key),
                        previous: show_key(previous),
                    });
                }
            }
            match &mut bucket.body {
                BucketBody::Inline(page) => {
                    // bbolt inlines a bucket whose single leaf, header included,
                    // is at most a quarter page (`maxInlineBucketSize`).
                    if page.size() + LEAF_ELEMENT_SIZE + key.len() + value.len() <= page_size / 4 {
                        page.push_leaf(0, key, value);
                    } else {
                        let mut tree = TreeBuilder::new();
                        for index in 0..page.len() {
                            let (flags, key, value) = page.leaf_entry(index);
                            tree.add_leaf(&mut writer.sink, flags, key, value)?;
                        }
                        tree.add_leaf(&mut writer.sink, 0, key, value)?;
                        bucket.body = BucketBody::Tree(tree);
                    }
                }
                BucketBody::Tree(tree) => tree.add_leaf(&mut writer.sink, 0, key, value)?,
            }
            match &mut bucket.last_key {
                Some(last) => {
                    last.clear();
                    last.extend_from_slice(key);
                }
                None => bucket.last_key = Some(key.to_vec()),
            }
            Ok(())
        })
    }

    /// Ends the last bucket, writes the remaining pages and both meta pages;
    /// returns the database size (`pgid * page_size`, a multiple of the page
    /// size). The output is positioned at its end and flushed.
    pub fn finish(self) -> Result<u64, WriteError> {
        self.finish_into().map(|(size, _)| size)
    }

    /// As [`Writer::finish`], giving the output back (to fsync it, or to
    /// append etcd's sha256 after the body).
    pub fn finish_into(mut self) -> Result<(u64, W), WriteError> {
        if self.poisoned {
            return Err(WriteError::Poisoned);
        }
        self.end_bucket()?;
        let root_tree = std::mem::replace(&mut self.root, TreeBuilder::new());
        let root = root_tree.finish(&mut self.sink)?;
        let sink = &mut self.sink;
        let pgid = sink.next_pgid;
        let mut meta = Meta {
            magic: MAGIC,
            version: VERSION,
            page_size: self.options.page_size,
            flags: 0,
            root,
            root_sequence: 0,
            freelist: if self.options.persist_freelist {
                2
            } else {
                NO_FREELIST
            },
            pgid,
            txid: self.options.txid,
            checksum: 0,
        };
        let size = pgid * sink.page_size as u64;
        sink.out.seek(SeekFrom::Start(sink.base))?;
        for page_id in 0..2u64 {
            meta.txid = self.options.txid - page_id;
            meta.checksum = meta.sum64();
            sink.scratch.clear();
            sink.scratch.extend_from_slice(
                &PageHeader {
                    id: page_id,
                    flags: META_PAGE,
                    count: 0,
                    overflow: 0,
                }
                .encode(),
            );
            sink.scratch.extend_from_slice(&meta.encode());
            sink.scratch.resize(sink.page_size, 0);
            sink.out.write_all(&sink.scratch)?;
        }
        sink.out.seek(SeekFrom::Start(sink.base + size))?;
        sink.out.flush()?;
        let PageSink { out, .. } = self.sink;
        Ok((size, out))
    }

    /// Runs `step`, marking the writer unusable if it fails after having
    /// possibly written part of a page.
    fn guard(
        &mut self,
        step: impl FnOnce(&mut Self) -> Result<(), WriteError>,
    ) -> Result<(), WriteError> {
        if self.poisoned {
            return Err(WriteError::Poisoned);
        }
        let result = step(self);
        if matches!(result, Err(WriteError::Io(_))) {
            self.poisoned = true;
        }
        result
    }

    /// Writes the current bucket's pages and adds its key to the root bucket.
    fn end_bucket(&mut self) -> Result<(), WriteError> {
        let Some(bucket) = self.bucket.take() else {
            return Ok(());
        };
        let value = match bucket.body {
            BucketBody::Inline(page) => {
                // Bucket header with root 0, then the leaf as a page image
                // (id 0, no padding).
                let mut value = vec![0u8; BUCKET_HEADER_SIZE];
                page.encode_into(0, 0, &mut value);
                value
            }
            BucketBody::Tree(tree) => {
                let root = tree.finish(&mut self.sink)?;
                let mut value = Vec::with_capacity(BUCKET_HEADER_SIZE);
                value.extend_from_slice(&root.to_le_bytes());
                value.extend_from_slice(&0u64.to_le_bytes());
                value
            }
        };
        self.root
            .add_leaf(&mut self.sink, BUCKET_LEAF_FLAG, &bucket.name, &value)?;
        Ok(())
    }
}

fn check_key(what: &'static str, key: &[u8]) -> Result<(), WriteError> {
    if key.is_empty() {
        return Err(WriteError::EmptyKey(what));
    }
    if key.len() > MAX_KEY_SIZE {
        return Err(WriteError::TooLarge {
            what,
            len: key.len(),
            limit: MAX_KEY_SIZE,
        });
    }
    Ok(())
}

struct OpenBucket {
    name: Vec<u8>,
    last_key: Option<Vec<u8>>,
    body: BucketBody,
}

enum BucketBody {
    /// Small so far: kept in memory, may end as an inline bucket.
    Inline(PageBuilder),
    Tree(TreeBuilder),
}
