//! The byte layout of bbolt's pages (bbolt v1.3.x `page.go`, `db.go`,
//! `bucket.go`): constants, and encoders/decoders for the fixed-size
//! structures. Everything here is little-endian, as bbolt writes its structs
//! in the machine's byte order and every platform etcd supports is
//! little-endian.

/// `page{id u64, flags u16, count u16, overflow u32}`.
pub const PAGE_HEADER_SIZE: usize = 16;
/// `leafPageElement{flags u32, pos u32, ksize u32, vsize u32}`.
pub const LEAF_ELEMENT_SIZE: usize = 16;
/// `branchPageElement{pos u32, ksize u32, pgid u64}`.
pub const BRANCH_ELEMENT_SIZE: usize = 16;
/// `bucket{root u64, sequence u64}`: the value of a bucket's key in its parent.
pub const BUCKET_HEADER_SIZE: usize = 16;
/// `meta{magic, version, pageSize, flags u32; root bucket; freelist, pgid,
/// txid, checksum u64}`, stored right after a meta page's header.
pub const META_SIZE: usize = 64;
/// The checksum covers the meta's bytes before the checksum field.
const META_CHECKSUMMED: usize = 56;

pub const BRANCH_PAGE: u16 = 0x01;
pub const LEAF_PAGE: u16 = 0x02;
pub const META_PAGE: u16 = 0x04;
pub const FREELIST_PAGE: u16 = 0x10;

/// Leaf element flag: the value is a nested bucket (header, maybe an inline page).
pub const BUCKET_LEAF_FLAG: u32 = 0x01;

pub const MAGIC: u32 = 0xED0C_DAED;
pub const VERSION: u32 = 2;
/// `meta.freelist` when the freelist is not persisted (`NoFreelistSync`, as etcd runs).
pub const NO_FREELIST: u64 = u64::MAX;
/// A freelist page whose `count` is this holds the real count in its first u64.
pub const FREELIST_COUNT_OVERFLOW: u16 = 0xFFFF;

/// bbolt's `MaxKeySize`.
pub const MAX_KEY_SIZE: usize = 32_768;
/// bbolt's `MaxValueSize`.
pub const MAX_VALUE_SIZE: usize = (1 << 31) - 2;

/// Smallest page size we read or write: bbolt probes for the second meta page
/// from 1 KiB up, so smaller pages are not found by bbolt either.
pub const MIN_PAGE_SIZE: u32 = 1024;
/// Largest page size we read or write. bbolt uses the OS page size (4 KiB,
/// 16 KiB or 64 KiB on Linux); a reader holds a handful of pages per tree
/// level, so a larger claimed size is treated as damage rather than trusted.
pub const MAX_PAGE_SIZE: u32 = 1 << 20;

pub fn is_supported_page_size(page_size: u32) -> bool {
    page_size.is_power_of_two() && (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size)
}

pub fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    let mut raw = [0u8; 2];
    raw.copy_from_slice(&bytes[offset..offset + 2]);
    u16::from_le_bytes(raw)
}

pub fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(raw)
}

pub fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(raw)
}

/// The 16 bytes that open every page (and every inline bucket's page).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    pub id: u64,
    pub flags: u16,
    pub count: u16,
    /// Pages after this one that belong to it (a page spans `overflow + 1`).
    pub overflow: u32,
}

impl PageHeader {
    /// Decodes the header from the first 16 bytes of `bytes` (the caller
    /// guarantees the length).
    pub fn decode(bytes: &[u8]) -> PageHeader {
        PageHeader {
            id: u64_at(bytes, 0),
            flags: u16_at(bytes, 8),
            count: u16_at(bytes, 10),
            overflow: u32_at(bytes, 12),
        }
    }

    pub fn encode(&self) -> [u8; PAGE_HEADER_SIZE] {
        let mut out = [0u8; PAGE_HEADER_SIZE];
        out[0..8].copy_from_slice(&self.id.to_le_bytes());
        out[8..10].copy_from_slice(&self.flags.to_le_bytes());
        out[10..12].copy_from_slice(&self.count.to_le_bytes());
        out[12..16].copy_from_slice(&self.overflow.to_le_bytes());
        out
    }
}

/// A page type for messages: bbolt's names, or the raw flags.
pub fn page_type_name(flags: u16) -> String {
    match flags {
        BRANCH_PAGE => "branch".to_string(),
        LEAF_PAGE => "leaf".to_string(),
        META_PAGE => "meta".to_string(),
        FREELIST_PAGE => "freelist".to_string(),
        other => format!("unknown page type {other:#04x}"),
    }
}

/// The content of a meta page (pages 0 and 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub magic: u32,
    pub version: u32,
    pub page_size: u32,
    pub flags: u32,
    /// Root page of the root bucket (whose keys are the top-level buckets).
    pub root: u64,
    /// The root bucket's sequence (unused by etcd, 0).
    pub root_sequence: u64,
    /// Freelist page, or [`NO_FREELIST`].
    pub freelist: u64,
    /// High-water mark: the number of pages in use; `pgid * page_size` is the
    /// database size bbolt reports (`tx.Size()`).
    pub pgid: u64,
    pub txid: u64,
    pub checksum: u64,
}

impl Meta {
    /// Decodes the 64 bytes after a meta page's header.
    pub fn decode(bytes: &[u8]) -> Meta {
        Meta {
            magic: u32_at(bytes, 0),
            version: u32_at(bytes, 4),
            page_size: u32_at(bytes, 8),
            flags: u32_at(bytes, 12),
            root: u64_at(bytes, 16),
            root_sequence: u64_at(bytes, 24),
            freelist: u64_at(bytes, 32),
            pgid: u64_at(bytes, 40),
            txid: u64_at(bytes, 48),
            checksum: u64_at(bytes, 56),
        }
    }

    /// Encodes the meta with its checksum field as it is.
    pub fn encode(&self) -> [u8; META_SIZE] {
        let mut out = [0u8; META_SIZE];
        out[0..4].copy_from_slice(&self.magic.to_le_bytes());
        out[4..8].copy_from_slice(&self.version.to_le_bytes());
        out[8..12].copy_from_slice(&self.page_size.to_le_bytes());
        out[12..16].copy_from_slice(&self.flags.to_le_bytes());
        out[16..24].copy_from_slice(&self.root.to_le_bytes());
        out[24..32].copy_from_slice(&self.root_sequence.to_le_bytes());
        out[32..40].copy_from_slice(&self.freelist.to_le_bytes());
        out[40..48].copy_from_slice(&self.pgid.to_le_bytes());
        out[48..56].copy_from_slice(&self.txid.to_le_bytes());
        out[56..64].copy_from_slice(&self.checksum.to_le_bytes());
        out
    }

    /// bbolt's `meta.sum64`: FNV-1a 64 over the fields before the checksum.
    pub fn sum64(&self) -> u64 {
        fnv1a64(&self.encode()[..META_CHECKSUMMED])
    }

    /// bbolt's `meta.validate`, in its order: magic, version, checksum.
    pub fn validate(&self) -> Result<(), String> {
        if self.magic != MAGIC {
            return Err(format!(
                "bad magic {:#010x} (not a bbolt meta page)",
                self.magic
            ));
        }
        if self.version != VERSION {
            return Err(format!(
                "unsupported version {} (bbolt writes {VERSION})",
                self.version
            ));
        }
        if self.checksum != self.sum64() {
            return Err("meta checksum mismatch".to_string());
        }
        Ok(())
    }
}

/// FNV-1a, 64 bits (Go's `hash/fnv.New64a`).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_go_hash_fnv() {
        // Go: fnv.New64a() over "" and "a".
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn meta_round_trips_and_validates() {
        let mut meta = Meta {
            magic: MAGIC,
            version: VERSION,
            page_size: 4096,
            flags: 0,
            root: 3,
            root_sequence: 0,
            freelist: NO_FREELIST,
            pgid: 4,
            txid: 7,
            checksum: 0,
        };
        meta.checksum = meta.sum64();
        let decoded = Meta::decode(&meta.encode());
        assert_eq!(decoded, meta);
        assert_eq!(decoded.validate(), Ok(()));
        let mut bad = meta;
        bad.txid += 1;
        assert_eq!(bad.validate(), Err("meta checksum mismatch".to_string()));
    }

    #[test]
    fn page_header_round_trips() {
        let header = PageHeader {
            id: 0x0102_0304_0506_0708,
            flags: LEAF_PAGE,
            count: 513,
            overflow: 9,
        };
        assert_eq!(PageHeader::decode(&header.encode()), header);
    }
}
