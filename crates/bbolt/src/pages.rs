//! The writer's page machinery: a sink that appends pages in id order, an
//! open page being filled, and a B+tree built bottom-up from open pages.

use std::io::Write;

use crate::format::{
    PageHeader, BRANCH_ELEMENT_SIZE, BRANCH_PAGE, LEAF_ELEMENT_SIZE, LEAF_PAGE, PAGE_HEADER_SIZE,
};

/// bbolt's minKeysPerPage: the fewest entries a leaf it splits keeps.
const MIN_KEYS_PER_PAGE: usize = 2;

/// Where pages go: sequentially, page `next_pgid` at `base + next_pgid * page_size`.
pub(crate) struct PageSink<W> {
    pub(crate) out: W,
    pub(crate) base: u64,
    pub(crate) page_size: usize,
    pub(crate) next_pgid: u64,
    /// Reused buffer for assembling one page.
    pub(crate) scratch: Vec<u8>,
}

impl<W: Write> PageSink<W> {
    fn pages_for(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.page_size).max(1)
    }

    pub(crate) fn write_zero_pages(&mut self, count: usize) -> std::io::Result<()> {
        self.scratch.clear();
        self.scratch.resize(self.page_size * count, 0);
        self.out.write_all(&self.scratch)?;
        self.next_pgid += count as u64;
        Ok(())
    }

    /// Writes `page` at the next id (spanning overflow pages when larger
    /// than a page) and returns its id.
    pub(crate) fn write_page(&mut self, page: &PageBuilder) -> std::io::Result<u64> {
        let id = self.next_pgid;
        let pages = self.pages_for(page.size());
        self.scratch.clear();
        page.encode_into(id, overflow_count(pages), &mut self.scratch);
        self.scratch.resize(pages * self.page_size, 0);
        self.out.write_all(&self.scratch)?;
        self.next_pgid += pages as u64;
        Ok(id)
    }
}

fn overflow_count(pages: usize) -> u32 {
    // A page is at most a 2 GiB value plus a 32 KiB key: far below u32 pages.
    u32::try_from(pages - 1).unwrap_or(u32::MAX)
}

fn to_u32(value: usize) -> u32 {
    // Sizes and offsets are bounded by MAX_VALUE_SIZE + page contents < 2^32.
    u32::try_from(value).unwrap_or(u32::MAX)
}

fn push_leaf_element(
    out: &mut Vec<u8>,
    flags: u32,
    pos: usize,
    key_size: usize,
    value_size: usize,
) {
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&to_u32(pos).to_le_bytes());
    out.extend_from_slice(&to_u32(key_size).to_le_bytes());
    out.extend_from_slice(&to_u32(value_size).to_le_bytes());
}

/// One element of an open page; its key (and value) are in the page's data.
#[derive(Clone, Copy)]
struct Element {
    /// Leaf: element flags; branch: unused.
    flags: u32,
    data_offset: usize,
    key_size: usize,
    value_size: usize,
    /// Branch: the child page.
    child: u64,
}

/// An open page: elements and the bytes they point to, laid out on encode.
pub(crate) struct PageBuilder {
    page_flags: u16,
    elements: Vec<Element>,
    data: Vec<u8>,
}

impl PageBuilder {
    pub(crate) fn new(page_flags: u16) -> Self {
        PageBuilder {
            page_flags,
            elements: Vec::new(),
            data: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.elements.len()
    }

    /// Encoded size, as bbolt's `node.size()` (leaf and branch elements are both 16 bytes).
    pub(crate) fn size(&self) -> usize {
        PAGE_HEADER_SIZE + self.elements.len() * LEAF_ELEMENT_SIZE + self.data.len()
    }

    pub(crate) fn push_leaf(&mut self, flags: u32, key: &[u8], value: &[u8]) {
        self.elements.push(Element {
            flags,
            data_offset: self.data.len(),
            key_size: key.len(),
            value_size: value.len(),
            child: 0,
        });
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
    }

    fn push_branch(&mut self, key: &[u8], child: u64) {
        self.elements.push(Element {
            flags: 0,
            data_offset: self.data.len(),
            key_size: key.len(),
            value_size: 0,
            child,
        });
        self.data.extend_from_slice(key);
    }

    pub(crate) fn leaf_entry(&self, index: usize) -> (u32, &[u8], &[u8]) {
        let element = self.elements[index];
        let key_end = element.data_offset + element.key_size;
        (
            element.flags,
            &self.data[element.data_offset..key_end],
            &self.data[key_end..key_end + element.value_size],
        )
    }

    fn first_key(&self) -> &[u8] {
        match self.elements.first() {
            Some(element) => {
                &self.data[element.data_offset..element.data_offset + element.key_size]
            }
            None => &[],
        }
    }

    fn clear(&mut self) {
        self.elements.clear();
        self.data.clear();
    }

    /// Appends the page image (header, elements, data; no padding) to `out`.
    pub(crate) fn encode_into(&self, id: u64, overflow: u32, out: &mut Vec<u8>) {
        debug_assert!(
            self.elements.len() < 0xFFFF,
            "page element count overflows the header"
        );
        let count = u16::try_from(self.elements.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(
            &PageHeader {
                id,
                flags: self.page_flags,
                count,
                overflow,
            }
            .encode(),
        );
        let data_start = PAGE_HEADER_SIZE + self.elements.len() * LEAF_ELEMENT_SIZE;
        for (index, element) in self.elements.iter().enumerate() {
            // `pos` is relative to the element itself.
            let pos =
                data_start + element.data_offset - (PAGE_HEADER_SIZE + index * LEAF_ELEMENT_SIZE);
            if self.page_flags == BRANCH_PAGE {
                out.extend_from_slice(&to_u32(pos).to_le_bytes());
                out.extend_from_slice(&to_u32(element.key_size).to_le_bytes());
                out.extend_from_slice(&element.child.to_le_bytes());
            } else {
                push_leaf_element(
                    out,
                    element.flags,
                    pos,
                    element.key_size,
                    element.value_size,
                );
            }
        }
        out.extend_from_slice(&self.data);
    }
}

/// A B+tree built bottom-up: `levels[0]` is the open leaf page, `levels[i]`
/// the open branch page over level `i - 1`.
pub(crate) struct TreeBuilder {
    levels: Vec<PageBuilder>,
}

impl TreeBuilder {
    pub(crate) fn new() -> Self {
        TreeBuilder {
            levels: vec![PageBuilder::new(LEAF_PAGE)],
        }
    }

    pub(crate) fn add_leaf<W: Write>(
        &mut self,
        sink: &mut PageSink<W>,
        flags: u32,
        key: &[u8],
        value: &[u8],
    ) -> std::io::Result<()> {
        let entry_size = LEAF_ELEMENT_SIZE + key.len() + value.len();
        // bbolt's split: a leaf ends where the next entry would take it past
        // a page, but holds two entries at least (its minKeysPerPage), so
        // entries larger than half a page go in pairs on leaves spanning
        // overflow pages (8 KiB values: 20 KiB per pair where a leaf each
        // took 12 KiB; etcd's files hold them so too)
        let open = &self.levels[0];
        if open.len() >= MIN_KEYS_PER_PAGE && open.size() + entry_size > sink.page_size {
            self.flush_level(sink, 0)?;
        }
        self.levels[0].push_leaf(flags, key, value);
        Ok(())
    }

    /// Writes the open page of `level` and links it from the level above.
    fn flush_level<W: Write>(
        &mut self,
        sink: &mut PageSink<W>,
        level: usize,
    ) -> std::io::Result<()> {
        let id = sink.write_page(&self.levels[level])?;
        let first_key = self.levels[level].first_key().to_vec();
        self.levels[level].clear();
        self.add_child(sink, level + 1, &first_key, id)
    }

    fn add_child<W: Write>(
        &mut self,
        sink: &mut PageSink<W>,
        level: usize,
        key: &[u8],
        child: u64,
    ) -> std::io::Result<()> {
        if self.levels.len() == level {
            self.levels.push(PageBuilder::new(BRANCH_PAGE));
        }
        // A branch page takes at least two children, so that levels shrink
        // even with 32 KiB keys (such a page spans overflow pages).
        let branch = &self.levels[level];
        if branch.len() >= 2 && branch.size() + BRANCH_ELEMENT_SIZE + key.len() > sink.page_size {
            self.flush_level(sink, level)?;
        }
        self.levels[level].push_branch(key, child);
        Ok(())
    }

    /// Writes the open pages bottom-up and returns the root page id. An
    /// empty tree is one empty leaf page.
    pub(crate) fn finish<W: Write>(mut self, sink: &mut PageSink<W>) -> std::io::Result<u64> {
        let mut level = 0;
        loop {
            let is_top = level + 1 == self.levels.len();
            let open = &self.levels[level];
            if is_top {
                if level > 0 && open.len() == 1 {
                    // A branch with one child: the child is the root.
                    return Ok(open.elements[0].child);
                }
                return sink.write_page(open);
            }
            if open.len() > 0 {
                self.flush_level(sink, level)?;
            }
            level += 1;
        }
    }
}
