//! One error enum per kind of operation: writing a file, reading one.

/// Why a [`crate::Writer`] refused a call or failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("writing the bbolt file: {0}")]
    Io(#[from] std::io::Error),
    #[error("page size {0} is not supported (a power of two from 1 KiB to 64 KiB)")]
    PageSize(u32),
    /// bbolt refuses empty keys and bucket names (`ErrKeyRequired`, `ErrBucketNameRequired`).
    #[error("empty {0}: bbolt requires a non-empty key")]
    EmptyKey(&'static str),
    #[error("{what} of {len} bytes is larger than bbolt's limit of {limit}")]
    TooLarge {
        what: &'static str,
        len: usize,
        limit: usize,
    },
    /// Keys within a bucket, and buckets, must come in strictly ascending byte order.
    #[error("{what} {key:?} is not after the previous one {previous:?}")]
    OutOfOrder {
        what: &'static str,
        key: String,
        previous: String,
    },
    #[error("put before any begin_bucket")]
    NoBucket,
    #[error("the writer failed earlier or was finished; no more calls are accepted")]
    Poisoned,
}

/// Why a [`crate::Reader`] could not open or read a file, or why
/// [`crate::Reader::check`] refused it.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading the bbolt file: {0}")]
    Io(#[from] std::io::Error),
    /// Neither meta page is usable: each part names its page.
    #[error("not a valid bbolt file: {0}")]
    NoValidMeta(String),
    /// The chosen meta page's fields do not fit the file.
    #[error("page {page}: {what}")]
    BadMeta { page: u64, what: String },
    /// A page that the walk reached is damaged.
    #[error("page {page}: {what}")]
    Corrupt { page: u64, what: String },
    /// [`crate::Reader::check`] found inconsistencies (bbolt's `tx.Check()` errors).
    #[error("bbolt consistency check failed: {count} problem(s): {}", problems.join("; "))]
    Inconsistent {
        /// The first problems found (at most [`crate::check::MAX_REPORTED_PROBLEMS`]).
        problems: Vec<String>,
        count: usize,
    },
    /// A top-level key is not a bucket (bbolt never writes one; etcdutl
    /// refuses it with `cannot get hash of bucket`).
    #[error("top-level key {0:?} is not a bucket")]
    NotABucket(String),
    /// etcd-specific: a key of bucket `key` is not a revision.
    #[error("bucket key: key {0:?} is not a 17-byte revision key")]
    NotARevision(String),
}

/// Printable form of a key for messages: UTF-8 when it is, else hex.
pub(crate) fn show_key(key: &[u8]) -> String {
    const SHOWN: usize = 64;
    let shown = &key[..key.len().min(SHOWN)];
    let mut text = match std::str::from_utf8(shown) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => format!(
            "0x{}",
            shown
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect::<String>()
        ),
    };
    if key.len() > SHOWN {
        text.push_str(&format!("… ({} bytes)", key.len()));
    }
    text
}
