//! Walking one bucket's tree in key order, holding only the pages on the
//! path from its root to the current leaf.

use std::io::{Read, Seek};

use crate::error::{show_key, ReadError};
use crate::format::{page_type_name, PageHeader, BRANCH_PAGE, BUCKET_LEAF_FLAG, LEAF_PAGE};
use crate::reader::{
    branch_element, check_element_table, leaf_element, BucketRoot, Reader, MAX_TREE_DEPTH,
};

/// One entry of a bucket, borrowed from the cursor's current leaf.
#[derive(Clone, Copy, Debug)]
pub struct Item<'c> {
    pub key: &'c [u8],
    /// The value; for a nested bucket, its header (and inline page).
    pub value: &'c [u8],
    /// The entry is a nested bucket (`bucketLeafFlag`).
    pub is_bucket: bool,
    /// The page holding the entry (for messages and [`BucketRoot::parse`]).
    pub page: u64,
}

/// Walks one bucket's tree in key order, holding the pages from the root
/// to the current leaf. Advance it with [`Cursor::next`], passing the
/// reader it came from (so that cursors on several buckets can be open at
/// once).
///
/// It refuses keys that are empty or not strictly ascending, trees deeper
/// than [`MAX_TREE_DEPTH`], a path whose pages overlap (so that what it
/// holds stays within the file's size), and a walk that reads more pages
/// than the file holds (which only a page referenced twice can cause); it
/// does not look for every inconsistency: [`Reader::check`] does.
pub struct Cursor {
    stack: Vec<Frame>,
    /// Page buffers of finished frames, reused.
    spare: Vec<Vec<u8>>,
    last_key: Option<Vec<u8>>,
    /// Page reads left before the walk is deemed cyclic.
    pages_left: u64,
}

struct Frame {
    page: u64,
    /// The last page it spans (its overflow pages); None for an inline
    /// bucket's page, which is a copy out of its parent's value.
    last_page: Option<u64>,
    is_leaf: bool,
    bytes: Vec<u8>,
    count: usize,
    next: usize,
}

impl Frame {
    /// Checks the page's type and element table.
    fn new(page: u64, inline: bool, bytes: Vec<u8>) -> Result<Frame, ReadError> {
        let header = PageHeader::decode(&bytes);
        let is_leaf = match header.flags {
            LEAF_PAGE => true,
            BRANCH_PAGE if !inline => false,
            flags => {
                let what = if inline {
                    format!(
                        "inline bucket page has type {} (expected leaf)",
                        page_type_name(flags)
                    )
                } else {
                    format!(
                        "invalid type: {} (expected branch or leaf)",
                        page_type_name(flags)
                    )
                };
                return Err(ReadError::Corrupt { page, what });
            }
        };
        let count = usize::from(header.count);
        if !is_leaf && count == 0 {
            return Err(ReadError::Corrupt {
                page,
                what: "branch page has no elements".to_string(),
            });
        }
        check_element_table(page, &bytes, count)?;
        Ok(Frame {
            page,
            last_page: (!inline).then(|| page + u64::from(header.overflow)),
            is_leaf,
            bytes,
            count,
            next: 0,
        })
    }
}

impl Cursor {
    /// A cursor before the first entry of the bucket whose header is `root`.
    pub(crate) fn open<R: Read + Seek>(
        reader: &mut Reader<R>,
        root: &BucketRoot,
    ) -> Result<Cursor, ReadError> {
        let mut cursor = Cursor {
            stack: Vec::new(),
            spare: Vec::new(),
            last_key: None,
            pages_left: reader.high_water_mark(),
        };
        let frame = match root {
            BucketRoot::Page(id) => cursor.load(reader, *id)?,
            BucketRoot::Inline { page, bytes } => Frame::new(*page, true, bytes.clone())?,
        };
        cursor.stack.push(frame);
        Ok(cursor)
    }

    fn load<R: Read + Seek>(
        &mut self,
        reader: &mut Reader<R>,
        id: u64,
    ) -> Result<Frame, ReadError> {
        if self.pages_left == 0 {
            return Err(ReadError::Corrupt {
                page: id,
                what: "the walk read more pages than the file holds (a page referenced twice?)"
                    .to_string(),
            });
        }
        self.pages_left -= 1;
        if id < 2 {
            return Err(ReadError::Corrupt {
                page: id,
                what: "a tree page points at a meta page".to_string(),
            });
        }
        let mut bytes = self.spare.pop().unwrap_or_default();
        let header = reader.read_page(id, &mut bytes)?;
        // The pages of one path never share a page in a sound tree; a path
        // that revisits one (a cycle, or a page inside another's overflow
        // pages) would hold the same bytes again at every level, up to
        // MAX_TREE_DEPTH times the file.
        let last = id + u64::from(header.overflow);
        let overlapped = self.stack.iter().find(|frame| {
            frame
                .last_page
                .is_some_and(|frame_last| id <= frame_last && frame.page <= last)
        });
        if let Some(frame) = overlapped {
            return Err(ReadError::Corrupt {
                page: id,
                what: format!(
                    "overlaps page {} on the path from the bucket's root (a reference cycle?)",
                    frame.page
                ),
            });
        }
        Frame::new(id, false, bytes)
    }

    /// The next entry in key order, or `None` at the end.
    #[allow(clippy::should_implement_trait)] // lends from self and borrows the reader: not an Iterator
    pub fn next<R: Read + Seek>(
        &mut self,
        reader: &mut Reader<R>,
    ) -> Result<Option<Item<'_>>, ReadError> {
        let element = loop {
            let Some(top) = self.stack.last_mut() else {
                return Ok(None);
            };
            if top.next >= top.count {
                if let Some(mut done) = self.stack.pop() {
                    // one page kept for reuse, not an overflowing page's
                    // many (which would add up, buffer by buffer)
                    done.bytes.clear();
                    done.bytes.shrink_to(reader.page_size() as usize);
                    self.spare.push(done.bytes);
                }
                continue;
            }
            let index = top.next;
            top.next += 1;
            if top.is_leaf {
                let element = leaf_element(top.page, &top.bytes, index)?;
                let key = &top.bytes[element.key.clone()];
                if key.is_empty() {
                    return Err(ReadError::Corrupt {
                        page: top.page,
                        what: format!("element {index} has an empty key"),
                    });
                }
                if let Some(last) = &self.last_key {
                    if key <= last.as_slice() {
                        return Err(ReadError::Corrupt {
                            page: top.page,
                            what: format!(
                                "key {} is not after the previous key {}",
                                show_key(key),
                                show_key(last)
                            ),
                        });
                    }
                }
                let last = self.last_key.get_or_insert_with(Vec::new);
                last.clear();
                last.extend_from_slice(key);
                break element;
            }
            let page = top.page;
            let child = branch_element(page, &top.bytes, index)?.child;
            if self.stack.len() >= MAX_TREE_DEPTH {
                return Err(ReadError::Corrupt {
                    page,
                    what: format!("tree deeper than {MAX_TREE_DEPTH} levels (a reference cycle?)"),
                });
            }
            let frame = self.load(reader, child)?;
            self.stack.push(frame);
        };
        let Some(top) = self.stack.last() else {
            return Ok(None);
        };
        Ok(Some(Item {
            key: &top.bytes[element.key],
            value: &top.bytes[element.value],
            is_bucket: element.flags & BUCKET_LEAF_FLAG != 0,
            page: top.page,
        }))
    }
}
