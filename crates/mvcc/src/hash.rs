//! The hash of the whole backend (etcd's Maintenance.Hash, backend.Hash):
//! CRC-32 over every table's name and records, in table and key order,
//! except the consistent index (which differs between members that applied
//! the same entries at different raft indexes after a restore). Equal on
//! members that applied the same entries.

use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use crate::backend::{backend_error, SideTable, KEY_TABLE, META_CONSISTENT_INDEX, META_TABLE};
use crate::{MvccError, Store};

fn hash_table<K, V>(
    txn: &redb::ReadTransaction,
    table: TableDefinition<K, V>,
    hasher: &mut crc32fast::Hasher,
    mut include: impl FnMut(&[u8]) -> bool,
) -> Result<(), MvccError>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
{
    let source = match txn.open_table(table) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(backend_error(e)),
    };
    hasher.update(table.name().as_bytes());
    for row in source.iter().map_err(backend_error)? {
        let (k, v) = row.map_err(backend_error)?;
        let key_value = k.value();
        let key = K::as_bytes(&key_value);
        if include(key.as_ref()) {
            hasher.update(key.as_ref());
            let value = v.value();
            hasher.update(V::as_bytes(&value).as_ref());
        }
    }
    Ok(())
}

impl Store {
    /// Commits what is pending, then hashes the file as of that commit.
    /// Returns (hash, the store's revision at the hash).
    pub fn hash(&self) -> Result<(u32, i64), MvccError> {
        let _defrag = self.defrag_lock.lock();
        let (txn, revision) = {
            let _writer = self.writer.lock();
            self.commit_locked(false)?;
            let txn = self.db().begin_read().map_err(backend_error)?;
            (txn, self.current_revision())
        };
        let mut hasher = crc32fast::Hasher::new();
        hash_table(&txn, KEY_TABLE, &mut hasher, |_| true)?;
        hash_table(&txn, META_TABLE, &mut hasher, |key| {
            key != META_CONSISTENT_INDEX.as_bytes()
        })?;
        for side in SideTable::ALL {
            hash_table(&txn, side.definition(), &mut hasher, |_| true)?;
        }
        Ok((hasher.finalize(), revision))
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::put_at;
    use crate::Store;

    #[test]
    fn same_writes_same_hash_whatever_the_raft_indexes_and_commit_timing() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(&dir.path().join("a")).unwrap();
        let b = Store::open(&dir.path().join("b")).unwrap();
        for (i, key) in ["x", "y", "z"].iter().enumerate() {
            put_at(&a, i as u64 + 1, key, "v", 0);
            put_at(&b, i as u64 + 10, key, "v", 0);
            b.commit(false).unwrap();
        }
        let (ha, ra) = a.hash().unwrap();
        let (hb, rb) = b.hash().unwrap();
        assert_eq!((ha, ra), (hb, rb));
        put_at(&b, 20, "w", "v", 0);
        assert_ne!(b.hash().unwrap().0, ha);
    }
}
