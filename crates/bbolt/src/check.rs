//! bbolt's `tx.Check()` (tx_check.go), which `etcdutl snapshot status`
//! runs before anything else:
//!
//! * the freelist (when persisted) frees no page twice;
//! * every page of every bucket tree is within the high-water mark, is a
//!   branch or leaf page, is referenced once, and is not on the freelist;
//! * keys are strictly ascending within a page, and each child's keys lie
//!   between its branch key and the next one;
//! * with a persisted freelist, every page below the high-water mark is
//!   reachable or free (without one, bbolt deems unreachable pages free).
//!
//! Beyond bbolt, which would panic or loop on these: a page whose header
//! names another page, element tables and keys running past their page,
//! empty keys, trees deeper than [`MAX_TREE_DEPTH`], bucket nesting deeper
//! than [`MAX_BUCKET_NESTING`], and the content of inline buckets (which
//! bbolt skips) are reported too. A page referenced twice is reported and
//! not walked again, so cycles end.

use std::io::{Read, Seek};

use crate::error::ReadError;
use crate::format::{
    page_type_name, u64_at, BRANCH_PAGE, BUCKET_LEAF_FLAG, FREELIST_COUNT_OVERFLOW, FREELIST_PAGE,
    LEAF_PAGE, NO_FREELIST, PAGE_HEADER_SIZE,
};
use crate::reader::{
    branch_element, check_element_table, leaf_element, BucketRoot, Reader, MAX_TREE_DEPTH,
};

/// Problems kept for the error message; the count covers all of them.
pub const MAX_REPORTED_PROBLEMS: usize = 100;

/// Deepest nesting of buckets walked (etcd nests none). Each level of the
/// walk holds one page per tree level, so this bounds memory and stack.
pub const MAX_BUCKET_NESTING: usize = 16;

pub(crate) fn check<R: Read + Seek>(reader: &mut Reader<R>) -> Result<(), ReadError> {
    let pages = reader.high_water_mark();
    let mut checker = Checker {
        reachable: Bitmap::new(pages),
        freed: Bitmap::new(pages),
        problems: Vec::new(),
        count: 0,
        reader,
    };
    let freelist = checker.reader.meta().freelist;
    if freelist != NO_FREELIST {
        checker.read_freelist(freelist)?;
    }
    checker.reachable.set(0);
    checker.reachable.set(1);
    let root = checker.reader.meta().root;
    checker.check_bucket(&BucketRoot::Page(root), 0)?;
    if freelist != NO_FREELIST {
        for page in 0..pages {
            if !checker.reachable.get(page) && !checker.freed.get(page) {
                checker.problem(format!("page {page}: unreachable unfreed"));
            }
        }
    }
    if checker.count == 0 {
        return Ok(());
    }
    Err(ReadError::Inconsistent {
        problems: checker.problems,
        count: checker.count,
    })
}

struct Bitmap(Vec<u64>);

impl Bitmap {
    fn new(bits: u64) -> Self {
        // bits <= file length / page size: the reader checked the high-water mark.
        Bitmap(vec![0; bits.div_ceil(64) as usize])
    }

    fn get(&self, bit: u64) -> bool {
        self.0
            .get((bit / 64) as usize)
            .is_some_and(|word| word & (1 << (bit % 64)) != 0)
    }

    fn set(&mut self, bit: u64) {
        if let Some(word) = self.0.get_mut((bit / 64) as usize) {
            *word |= 1 << (bit % 64);
        }
    }
}

struct Checker<'r, R> {
    reader: &'r mut Reader<R>,
    reachable: Bitmap,
    freed: Bitmap,
    problems: Vec<String>,
    count: usize,
}

fn hex(key: &[u8]) -> String {
    const SHOWN: usize = 64;
    let mut text: String = key
        .iter()
        .take(SHOWN)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    if key.len() > SHOWN {
        text.push('…');
    }
    text
}

impl<R: Read + Seek> Checker<'_, R> {
    fn problem(&mut self, what: String) {
        self.count += 1;
        if self.problems.len() < MAX_REPORTED_PROBLEMS {
            self.problems.push(what);
        }
    }

    /// Records a damaged page; other errors (I/O) end the check.
    fn damage(&mut self, error: ReadError) -> Result<(), ReadError> {
        match error {
            ReadError::Corrupt { page, what } => {
                self.problem(format!("page {page}: {what}"));
                Ok(())
            }
            other => Err(other),
        }
    }

    fn read_freelist(&mut self, id: u64) -> Result<(), ReadError> {
        let mut bytes = Vec::new();
        let header = match self.reader.read_page(id, &mut bytes) {
            Ok(header) => header,
            Err(error) => return self.damage(error),
        };
        for page in id..=id + u64::from(header.overflow) {
            self.reachable.set(page);
        }
        if header.flags != FREELIST_PAGE {
            self.problem(format!(
                "page {id}: invalid type: {} (expected the freelist)",
                page_type_name(header.flags)
            ));
            return Ok(());
        }
        let (first, count) = if header.count == FREELIST_COUNT_OVERFLOW {
            if bytes.len() < PAGE_HEADER_SIZE + 8 {
                self.problem(format!("page {id}: freelist count missing"));
                return Ok(());
            }
            (1u64, u64_at(&bytes, PAGE_HEADER_SIZE))
        } else {
            (0, u64::from(header.count))
        };
        let slots = ((bytes.len() - PAGE_HEADER_SIZE) / 8) as u64;
        if count > slots.saturating_sub(first) {
            self.problem(format!(
                "page {id}: freelist of {count} ids does not fit its {} bytes",
                bytes.len()
            ));
            return Ok(());
        }
        let pages = self.reader.high_water_mark();
        for slot in first..first + count {
            let freed = u64_at(&bytes, PAGE_HEADER_SIZE + slot as usize * 8);
            if freed >= pages {
                self.problem(format!(
                    "page {freed}: freed page out of bounds (high-water mark {pages})"
                ));
            } else if self.freed.get(freed) {
                self.problem(format!("page {freed}: already freed"));
            } else {
                self.freed.set(freed);
            }
        }
        Ok(())
    }

    fn check_bucket(&mut self, root: &BucketRoot, nesting: usize) -> Result<(), ReadError> {
        match root {
            BucketRoot::Page(id) => {
                let mut stack = Vec::new();
                self.check_page(*id, None, None, &mut stack, nesting)?;
            }
            BucketRoot::Inline { page, bytes } => self.check_inline(*page, bytes),
        }
        Ok(())
    }

    /// An inline bucket: a leaf page image inside its parent's value.
    fn check_inline(&mut self, page: u64, bytes: &[u8]) {
        let header = crate::format::PageHeader::decode(bytes);
        if header.flags != LEAF_PAGE {
            self.problem(format!(
                "page {page}: inline bucket has type {} (expected leaf)",
                page_type_name(header.flags)
            ));
            return;
        }
        let count = usize::from(header.count);
        if let Err(error) = check_element_table(page, bytes, count) {
            self.problem(error.to_string());
            return;
        }
        let mut previous: Option<&[u8]> = None;
        for index in 0..count {
            let element = match leaf_element(page, bytes, index) {
                Ok(element) => element,
                Err(error) => {
                    self.problem(format!("{error} (inline bucket)"));
                    return;
                }
            };
            let key = &bytes[element.key];
            if key.is_empty() {
                self.problem(format!("page {page}: inline bucket key[{index}] is empty"));
            }
            if previous.is_some_and(|previous| previous >= key) {
                self.problem(format!(
                    "page {page}: inline bucket key[{index}]=(hex){} is not after the previous key",
                    hex(key)
                ));
            }
            if element.flags & BUCKET_LEAF_FLAG != 0 {
                self.problem(format!(
                    "page {page}: inline bucket holds a nested bucket (bbolt never writes one)"
                ));
            }
            previous = Some(key);
        }
    }

    /// Checks the subtree at `id`, whose keys must be `>= min` and `< max`;
    /// returns its largest key (bbolt's `recursivelyCheckPagesInternal`).
    fn check_page(
        &mut self,
        id: u64,
        min: Option<&[u8]>,
        max: Option<&[u8]>,
        stack: &mut Vec<u64>,
        nesting: usize,
    ) -> Result<Option<Vec<u8>>, ReadError> {
        let pages = self.reader.high_water_mark();
        if stack.len() >= MAX_TREE_DEPTH {
            self.problem(format!(
                "page {id}: tree deeper than {MAX_TREE_DEPTH} levels (stack: {stack:?})"
            ));
            return Ok(None);
        }
        if id >= pages || id < 2 {
            self.problem(format!(
                "page {id}: out of bounds: {pages} (stack: {stack:?})"
            ));
            return Ok(None);
        }
        if self.reachable.get(id) {
            self.problem(format!("page {id}: multiple references (stack: {stack:?})"));
            return Ok(None);
        }
        let mut bytes = Vec::new();
        let header = match self.reader.read_page(id, &mut bytes) {
            Ok(header) => header,
            Err(error) => {
                self.reachable.set(id);
                self.damage(error)?;
                return Ok(None);
            }
        };
        for page in id..=id + u64::from(header.overflow) {
            if self.reachable.get(page) {
                self.problem(format!(
                    "page {page}: multiple references (stack: {stack:?})"
                ));
            }
            self.reachable.set(page);
        }
        if self.freed.get(id) {
            self.problem(format!("page {id}: reachable freed"));
        }
        let count = usize::from(header.count);
        match header.flags {
            BRANCH_PAGE | LEAF_PAGE => {}
            flags => {
                self.problem(format!(
                    "page {id}: invalid type: {} (stack: {stack:?})",
                    page_type_name(flags)
                ));
                return Ok(None);
            }
        }
        if let Err(error) = check_element_table(id, &bytes, count) {
            self.damage(error)?;
            return Ok(None);
        }
        stack.push(id);
        let result = if header.flags == BRANCH_PAGE {
            self.check_branch(id, &bytes, count, min, max, stack, nesting)
        } else {
            self.check_leaf(id, &bytes, count, min, max, nesting)
        };
        stack.pop();
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn check_branch(
        &mut self,
        id: u64,
        bytes: &[u8],
        count: usize,
        min: Option<&[u8]>,
        max: Option<&[u8]>,
        stack: &mut Vec<u64>,
        nesting: usize,
    ) -> Result<Option<Vec<u8>>, ReadError> {
        if count == 0 {
            self.problem(format!("page {id}: branch page has no elements"));
            return Ok(None);
        }
        let mut elements = Vec::with_capacity(count);
        for index in 0..count {
            match branch_element(id, bytes, index) {
                Ok(element) => elements.push(element),
                Err(error) => {
                    self.damage(error)?;
                    return Ok(None);
                }
            }
        }
        let mut running_min: Option<Vec<u8>> = min.map(<[u8]>::to_vec);
        for (index, element) in elements.iter().enumerate() {
            let key = &bytes[element.key.clone()];
            self.verify_key_order(id, "branch", index, key, running_min.as_deref(), max);
            let next_max = match elements.get(index + 1) {
                Some(next) => Some(&bytes[next.key.clone()]),
                None => max,
            };
            running_min = self.check_page(element.child, Some(key), next_max, stack, nesting)?;
        }
        Ok(running_min)
    }

    fn check_leaf(
        &mut self,
        id: u64,
        bytes: &[u8],
        count: usize,
        min: Option<&[u8]>,
        max: Option<&[u8]>,
        nesting: usize,
    ) -> Result<Option<Vec<u8>>, ReadError> {
        let mut running_min = min;
        for index in 0..count {
            let element = match leaf_element(id, bytes, index) {
                Ok(element) => element,
                Err(error) => {
                    self.damage(error)?;
                    return Ok(None);
                }
            };
            let key = &bytes[element.key.clone()];
            self.verify_key_order(id, "leaf", index, key, running_min, max);
            running_min = Some(key);
            if element.flags & BUCKET_LEAF_FLAG == 0 {
                continue;
            }
            if nesting + 1 >= MAX_BUCKET_NESTING {
                self.problem(format!(
                    "page {id}: buckets nested deeper than {MAX_BUCKET_NESTING} levels"
                ));
                continue;
            }
            match BucketRoot::parse(id, &bytes[element.value]) {
                Ok(root) => self.check_bucket(&root, nesting + 1)?,
                Err(error) => self.damage(error)?,
            }
        }
        Ok(running_min.map(<[u8]>::to_vec))
    }

    /// bbolt's `verifyKeyOrder`: `previous` is the previous key on the page,
    /// or for the first one the lower bound from the parent.
    fn verify_key_order(
        &mut self,
        id: u64,
        page_type: &str,
        index: usize,
        key: &[u8],
        previous: Option<&[u8]>,
        max: Option<&[u8]>,
    ) {
        if key.is_empty() {
            self.problem(format!(
                "page {id}: key[{index}] on {page_type} page is empty"
            ));
        }
        if let Some(previous) = previous {
            if index == 0 && previous > key {
                self.problem(format!(
                    "page {id}: the first key[{index}]=(hex){} on {page_type} page needs to be >= the key in the \
                     ancestor (hex){}",
                    hex(key),
                    hex(previous)
                ));
            }
            if index > 0 && previous >= key {
                let found = if previous == key { "=" } else { "<" };
                self.problem(format!(
                    "page {id}: key[{index}]=(hex){} on {page_type} page needs to be > (found {found}) than previous \
                     element (hex){}",
                    hex(key),
                    hex(previous)
                ));
            }
        }
        if let Some(max) = max {
            if key >= max {
                self.problem(format!(
                    "page {id}: key[{index}]=(hex){} on {page_type} page needs to be < than key of the next element \
                     in ancestor (hex){}",
                    hex(key),
                    hex(max)
                ));
            }
        }
    }
}
