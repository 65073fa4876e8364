//! Revisions and their on-disk key encoding (see the crate doc for the layout).

use crate::MvccError;

/// Length of an encoded revision: 8-byte main, `b'_'`, 8-byte sub.
pub(crate) const REVISION_BYTES_LEN: usize = 17;
/// Length of an encoded tombstone revision: the revision plus [`TOMBSTONE_MARK`].
pub(crate) const MARKED_REVISION_BYTES_LEN: usize = 18;
/// Trailing byte that marks a deletion record in the `key` table.
pub(crate) const TOMBSTONE_MARK: u8 = b't';

/// A point in the store's history: `main` is the write transaction, `sub` the
/// operation inside it. Ordered by (main, sub), which is also the byte order of
/// the encoding because both parts are non-negative.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    pub main: i64,
    pub sub: i64,
}

impl Revision {
    pub(crate) fn new(main: i64, sub: i64) -> Revision {
        Revision { main, sub }
    }
}

/// The `key` table key of one record: a revision, tombstone-marked or not.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RevisionKey {
    bytes: [u8; MARKED_REVISION_BYTES_LEN],
    len: u8,
}

impl RevisionKey {
    pub(crate) fn new(revision: Revision, tombstone: bool) -> RevisionKey {
        debug_assert!(revision.main >= 0 && revision.sub >= 0);
        let mut bytes = [0u8; MARKED_REVISION_BYTES_LEN];
        bytes[..8].copy_from_slice(&revision.main.to_be_bytes());
        bytes[8] = b'_';
        bytes[9..17].copy_from_slice(&revision.sub.to_be_bytes());
        let len = if tombstone {
            bytes[17] = TOMBSTONE_MARK;
            MARKED_REVISION_BYTES_LEN
        } else {
            REVISION_BYTES_LEN
        };
        RevisionKey {
            bytes,
            len: len as u8,
        }
    }

    /// Parses a key read from disk; anything but the two documented shapes is corruption.
    pub(crate) fn parse(bytes: &[u8]) -> Result<(Revision, bool), MvccError> {
        let tombstone = match bytes.len() {
            REVISION_BYTES_LEN => false,
            MARKED_REVISION_BYTES_LEN if bytes[17] == TOMBSTONE_MARK => true,
            _ => {
                return Err(MvccError::Corrupt(format!(
                    "bad revision key of {} bytes",
                    bytes.len()
                )))
            }
        };
        if bytes[8] != b'_' {
            return Err(MvccError::Corrupt("bad revision key separator".into()));
        }
        let mut main = [0u8; 8];
        main.copy_from_slice(&bytes[..8]);
        let mut sub = [0u8; 8];
        sub.copy_from_slice(&bytes[9..17]);
        let revision = Revision::new(i64::from_be_bytes(main), i64::from_be_bytes(sub));
        if revision.main < 0 || revision.sub < 0 {
            return Err(MvccError::Corrupt("negative revision".into()));
        }
        Ok((revision, tombstone))
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Whether the record is a deletion (etcd's `t`-marked revision key).
    pub(crate) fn is_tombstone(&self) -> bool {
        self.len as usize == MARKED_REVISION_BYTES_LEN
    }

    pub(crate) fn revision(&self) -> Revision {
        // Built by `new`, so the shape is valid.
        match RevisionKey::parse(self.as_slice()) {
            Ok((revision, _)) => revision,
            Err(_) => unreachable!("RevisionKey holds a valid encoding"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_bytes_match_etcd_layout() {
        let key = RevisionKey::new(Revision::new(0x0102, 3), false);
        assert_eq!(
            key.as_slice(),
            &[0, 0, 0, 0, 0, 0, 1, 2, b'_', 0, 0, 0, 0, 0, 0, 0, 3]
        );
        let tomb = RevisionKey::new(Revision::new(5, 0), true);
        assert_eq!(tomb.as_slice().len(), 18);
        assert_eq!(tomb.as_slice()[17], b't');
        assert_eq!(
            RevisionKey::parse(tomb.as_slice()).unwrap(),
            (Revision::new(5, 0), true)
        );
        assert!(RevisionKey::parse(&[0u8; 16]).is_err());
    }

    #[test]
    fn revision_bytes_sort_in_revision_order() {
        let a = RevisionKey::new(Revision::new(1, 300), false);
        let b = RevisionKey::new(Revision::new(2, 0), true);
        let c = RevisionKey::new(Revision::new(2, 1), false);
        assert!(a.as_slice() < b.as_slice());
        assert!(b.as_slice() < c.as_slice());
    }
}
