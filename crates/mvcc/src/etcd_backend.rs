//! The backend in etcd 3.5's own format: a bbolt file with etcd's ten
//! buckets and their records (see `schema::etcd_buckets`), written from one
//! consistent read transaction of the store. It is what
//! `Maintenance.Snapshot` sends, so that a snapshot of oxcd is a snapshot of
//! etcd: etcdctl and etcdutl read it, and etcd restores it.
//!
//! The bbolt writer lays pages out as it goes: memory stays bounded by a
//! constant plus the small tables (members, alarms, the auth store), which
//! are sorted in memory; the `key` table streams in its own order, which is
//! etcd's (revision keys).
//!
//! What oxcd has no record of is written as a fresh etcd writes it:
//! `authRevision` 1 without an auth store, `authEnabled` only while auth is
//! on (etcd keeps it once auth was enabled), `clusterVersion` 3.5.0.

use std::path::Path;

use prost::Message;
use redb::{ReadTransaction, ReadableDatabase, ReadableTable};
use schema::etcd_buckets as eb;

use crate::backend::{
    backend_error, SideTable, KEY_TABLE, META_CONSISTENT_INDEX, META_FINISHED_COMPACT_REV,
    META_SCHEDULED_COMPACT_REV, META_TABLE,
};
use crate::{MvccError, Store};

/// What the backend does not hold and etcd's `meta` bucket does: raft's
/// term and configuration as of the consistent index.
#[derive(Clone, Debug, Default)]
pub struct RaftMeta {
    pub term: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}

/// What was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EtcdBackendSummary {
    /// Bytes of the bbolt file.
    pub size: u64,
    /// The consistent index the file holds.
    pub consistent_index: u64,
}

fn bbolt_error(e: bbolt::WriteError) -> MvccError {
    MvccError::Backend(format!("writing the etcd backend: {e}"))
}

impl Store {
    /// Writes the store, as of now, to `dest` as etcd 3.5's backend (a
    /// bbolt file; `dest` is replaced). Readers and writers go on meanwhile.
    pub fn write_etcd_backend(
        &self,
        dest: &Path,
        raft: &RaftMeta,
    ) -> Result<EtcdBackendSummary, MvccError> {
        // As backup_to: a defragmentation waits (it swaps the file the
        // read transaction reads).
        let _defrag = self.defrag_lock.lock();
        self.commit(false)?;
        let txn = self.db().begin_read().map_err(backend_error)?;
        let _ = std::fs::remove_file(dest);
        let mut out =
            bbolt::Writer::create(dest, bbolt::WriterOptions::default()).map_err(bbolt_error)?;
        let consistent_index = write_buckets(&txn, &mut out, raft)?;
        let size = out.finish().map_err(bbolt_error)?;
        Ok(EtcdBackendSummary {
            size,
            consistent_index,
        })
    }
}

/// A side table's records, in ID order.
fn side(txn: &ReadTransaction, table: SideTable) -> Result<Vec<(u64, Vec<u8>)>, MvccError> {
    let t = match txn.open_table(table.definition()) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(backend_error(e)),
    };
    let mut out = Vec::new();
    for row in t.iter().map_err(backend_error)? {
        let (k, v) = row.map_err(backend_error)?;
        out.push((k.value(), v.value().to_vec()));
    }
    Ok(out)
}

fn put_sorted(
    out: &mut bbolt::Writer<impl std::io::Write + std::io::Seek>,
    bucket: &str,
    mut records: Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<(), MvccError> {
    records.sort();
    records.dedup_by(|a, b| a.0 == b.0);
    out.begin_bucket(bucket.as_bytes()).map_err(bbolt_error)?;
    for (k, v) in &records {
        out.put(k, v).map_err(bbolt_error)?;
    }
    Ok(())
}

/// Every bucket in etcd's order; returns the consistent index written.
fn write_buckets(
    txn: &ReadTransaction,
    out: &mut bbolt::Writer<impl std::io::Write + std::io::Seek>,
    raft: &RaftMeta,
) -> Result<u64, MvccError> {
    let corrupt = |what: &str, e: prost::DecodeError| {
        MvccError::Corrupt(format!("cannot decode a {what} record: {e}"))
    };
    // alarm: the marshalled AlarmMember is the key
    let alarms = side(txn, SideTable::Alarms)?
        .into_iter()
        .map(|(_, v)| (v, Vec::new()))
        .collect();
    put_sorted(out, eb::ALARM, alarms)?;

    // auth, authRoles, authUsers: from the auth store record
    let auth = match side(txn, SideTable::Auth)?.into_iter().next() {
        Some((_, record)) => Some(schema::auth::decode(&record).map_err(|e| corrupt("auth", e))?),
        None => None,
    };
    let mut auth_bucket = vec![(
        eb::AUTH_REVISION.to_vec(),
        auth.as_ref()
            .map_or(1, |a| a.revision.max(1))
            .to_be_bytes()
            .to_vec(),
    )];
    if auth.as_ref().is_some_and(|a| a.enabled) {
        auth_bucket.push((eb::AUTH_ENABLED.to_vec(), vec![1]));
    }
    put_sorted(out, eb::AUTH, auth_bucket)?;
    let (users, roles) = auth.map_or((Vec::new(), Vec::new()), |a| (a.users, a.roles));
    let roles = roles
        .into_iter()
        .map(|r| (r.name.to_vec(), r.encode_to_vec()))
        .collect();
    put_sorted(out, eb::AUTH_ROLES, roles)?;
    let users = users
        .into_iter()
        .map(|u| (u.name.to_vec(), u.encode_to_vec()))
        .collect();
    put_sorted(out, eb::AUTH_USERS, users)?;

    put_sorted(
        out,
        eb::CLUSTER,
        vec![(
            eb::CLUSTER_VERSION.to_vec(),
            eb::CLUSTER_VERSION_VALUE.to_vec(),
        )],
    )?;

    // key: revision keys and marshalled KeyValues, streamed in their order
    out.begin_bucket(eb::KEY.as_bytes()).map_err(bbolt_error)?;
    match txn.open_table(KEY_TABLE) {
        Ok(table) => {
            let parts = crate::parts::ReadParts::open(txn)?;
            for row in table.iter().map_err(backend_error)? {
                let (k, v) = row.map_err(backend_error)?;
                let whole = parts.join(k.value(), v.value())?;
                let payload = crate::backend::unseal(&whole).map_err(|_| {
                    MvccError::Corrupt("a key record's checksum does not match".into())
                })?;
                out.put(k.value(), payload).map_err(bbolt_error)?;
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(backend_error(e)),
    }

    // lease: the ID big endian, in the table's (numeric) order
    out.begin_bucket(eb::LEASE.as_bytes())
        .map_err(bbolt_error)?;
    for (id, record) in side(txn, SideTable::Leases)? {
        out.put(&id.to_be_bytes(), &record).map_err(bbolt_error)?;
    }

    let mut members = Vec::new();
    for (_, record) in side(txn, SideTable::Members)? {
        let m = schema::members::decode(&record)
            .ok_or_else(|| MvccError::Corrupt("cannot decode a member record".into()))?;
        members.push((eb::member_key(m.id), eb::member_json(&m)));
    }
    put_sorted(out, eb::MEMBERS, members)?;
    let removed = side(txn, SideTable::MembersRemoved)?
        .into_iter()
        .map(|(id, _)| (eb::member_key(id), schema::members::REMOVED_RECORD.to_vec()))
        .collect();
    put_sorted(out, eb::MEMBERS_REMOVED, removed)?;

    // meta
    let meta = txn.open_table(META_TABLE).map_err(backend_error)?;
    let get = |key: &str| -> Result<Option<Vec<u8>>, MvccError> {
        Ok(meta
            .get(key)
            .map_err(backend_error)?
            .map(|v| v.value().to_vec()))
    };
    let be_i64 = |bytes: Vec<u8>| -> Result<i64, MvccError> {
        Ok(i64::from_be_bytes(bytes.try_into().map_err(|_| {
            MvccError::Corrupt("a meta revision is not 8 bytes".into())
        })?))
    };
    let consistent_index = match get(META_CONSISTENT_INDEX)? {
        Some(bytes) => u64::from_be_bytes(
            bytes
                .try_into()
                .map_err(|_| MvccError::Corrupt("consistent_index is not 8 bytes".into()))?,
        ),
        None => 0,
    };
    let mut meta_bucket = vec![
        (
            eb::CONSISTENT_INDEX.to_vec(),
            consistent_index.to_be_bytes().to_vec(),
        ),
        (eb::TERM.to_vec(), raft.term.to_be_bytes().to_vec()),
    ];
    if !raft.voters.is_empty() {
        meta_bucket.push((
            eb::CONF_STATE.to_vec(),
            eb::conf_state_json(&raft.voters, &raft.learners),
        ));
    }
    if let Some(rev) = get(META_FINISHED_COMPACT_REV)? {
        meta_bucket.push((
            eb::FINISHED_COMPACT_REV.to_vec(),
            eb::revision_key(be_i64(rev)?),
        ));
    }
    if let Some(rev) = get(META_SCHEDULED_COMPACT_REV)? {
        meta_bucket.push((
            eb::SCHEDULED_COMPACT_REV.to_vec(),
            eb::revision_key(be_i64(rev)?),
        ));
    }
    put_sorted(out, eb::META, meta_bucket)?;
    Ok(consistent_index)
}

/// Whether the file at `path` starts as a bbolt file does (its first meta
/// page's magic), without reading further.
pub fn is_bbolt(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 24];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && u32::from_le_bytes([head[16], head[17], head[18], head[19]]) == BBOLT_MAGIC
}

/// bbolt's meta page magic (at byte 16 of pages 0 and 1).
const BBOLT_MAGIC: u32 = 0xED0C_DAED;

/// What a restore from an etcd backend carried over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BboltRestore {
    pub revision: i64,
    pub keys_records: u64,
    pub leases: u64,
}

fn read_error(e: bbolt::ReadError) -> MvccError {
    MvccError::Corrupt(format!("etcd backend: {e}"))
}

/// Builds a new oxcd backend at `dest` from the etcd 3.5 (or 3.4) backend
/// in the bbolt file `src` (an etcd snapshot, its trailing sha256 already
/// checked): every revision of `key` with its record, the compaction
/// revisions, leases, the auth store and alarms; the membership is
/// `members` (the restore's flags, as etcdutl's restore rebuilds it), and
/// no consistent index: the new cluster's log applies from its start.
/// Durable on return; `dest` must not exist.
pub fn restore_from_bbolt(
    src: &Path,
    dest: &Path,
    members: &[(u64, Vec<u8>)],
) -> Result<BboltRestore, MvccError> {
    import_bbolt(
        src,
        dest,
        &BboltImport {
            members,
            removed: &[],
            consistent_index: 0,
        },
    )
}

/// What an import takes from outside the bbolt file.
pub struct BboltImport<'a> {
    /// The members table: (ID, record).
    pub members: &'a [(u64, Vec<u8>)],
    /// The IDs of removed members.
    pub removed: &'a [u64],
    /// The raft index the backend has applied (0 for a new cluster's log).
    pub consistent_index: u64,
}

/// [`restore_from_bbolt`] for a member that goes on with its own log
/// (`oxctl migrate`): the membership and consistent index are given.
pub fn import_bbolt(
    src: &Path,
    dest: &Path,
    import: &BboltImport<'_>,
) -> Result<BboltRestore, MvccError> {
    let members = import.members;
    let mut reader = bbolt::Reader::open(src).map_err(read_error)?;
    reader.check().map_err(read_error)?;
    let db = crate::backend::open_database(dest)?;
    let mut txn = db.begin_write().map_err(backend_error)?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(backend_error)?;
    let mut summary = BboltRestore::default();
    {
        let mut keys = crate::parts::Records::open(&txn)?;
        if let Some(mut cursor) = reader.bucket(eb::KEY.as_bytes()).map_err(read_error)? {
            while let Some(item) = cursor.next(&mut reader).map_err(read_error)? {
                let (revision, _) = crate::revision::RevisionKey::parse(item.key)?;
                api::mvccpb::KeyValue::decode(item.value).map_err(|e| {
                    MvccError::Corrupt(format!(
                        "etcd backend: the record at revision {} does not decode: {e}",
                        revision.main
                    ))
                })?;
                let sealed = crate::backend::seal(item.value.to_vec());
                keys.insert(item.key, &sealed)?;
                summary.revision = summary.revision.max(revision.main);
                summary.keys_records += 1;
            }
        }
        let mut meta = txn.open_table(META_TABLE).map_err(backend_error)?;
        if let Some(mut cursor) = reader.bucket(eb::META.as_bytes()).map_err(read_error)? {
            while let Some(item) = cursor.next(&mut reader).map_err(read_error)? {
                let ours = match item.key {
                    k if k == eb::FINISHED_COMPACT_REV => META_FINISHED_COMPACT_REV,
                    k if k == eb::SCHEDULED_COMPACT_REV => META_SCHEDULED_COMPACT_REV,
                    _ => continue,
                };
                let (revision, _) = crate::revision::RevisionKey::parse(item.value)?;
                meta.insert(ours, &revision.main.to_be_bytes()[..])
                    .map_err(backend_error)?;
            }
        }
        let mut leases = txn
            .open_table(SideTable::Leases.definition())
            .map_err(backend_error)?;
        if let Some(mut cursor) = reader.bucket(eb::LEASE.as_bytes()).map_err(read_error)? {
            while let Some(item) = cursor.next(&mut reader).map_err(read_error)? {
                let lease = schema::leases::decode(item.value)
                    .map_err(|e| MvccError::Corrupt(format!("etcd backend: a lease: {e}")))?;
                leases
                    .insert(lease.id as u64, item.value)
                    .map_err(backend_error)?;
                summary.leases += 1;
            }
        }
        let mut alarms = txn
            .open_table(SideTable::Alarms.definition())
            .map_err(backend_error)?;
        if let Some(mut cursor) = reader.bucket(eb::ALARM.as_bytes()).map_err(read_error)? {
            while let Some(item) = cursor.next(&mut reader).map_err(read_error)? {
                let alarm = schema::alarms::decode(item.key)
                    .map_err(|e| MvccError::Corrupt(format!("etcd backend: an alarm: {e}")))?;
                alarms
                    .insert(
                        schema::alarms::record_key(alarm.member_id, alarm.alarm),
                        item.key,
                    )
                    .map_err(backend_error)?;
            }
        }
        let auth = read_auth(&mut reader)?;
        let mut auth_table = txn
            .open_table(SideTable::Auth.definition())
            .map_err(backend_error)?;
        auth_table
            .insert(0, &schema::auth::encode(&auth)[..])
            .map_err(backend_error)?;
        let mut table = txn
            .open_table(SideTable::Members.definition())
            .map_err(backend_error)?;
        for (id, record) in members {
            table
                .insert(*id, record.as_slice())
                .map_err(backend_error)?;
        }
        let mut removed = txn
            .open_table(SideTable::MembersRemoved.definition())
            .map_err(backend_error)?;
        for id in import.removed {
            removed
                .insert(*id, schema::members::REMOVED_RECORD)
                .map_err(backend_error)?;
        }
        if import.consistent_index > 0 {
            meta.insert(
                META_CONSISTENT_INDEX,
                &import.consistent_index.to_be_bytes()[..],
            )
            .map_err(backend_error)?;
        }
    }
    txn.commit().map_err(backend_error)?;
    Ok(summary)
}

/// The auth store an etcd backend holds (`auth`, `authUsers`, `authRoles`).
fn read_auth<R: std::io::Read + std::io::Seek>(
    reader: &mut bbolt::Reader<R>,
) -> Result<api::oxcdauthpb::AuthStore, MvccError> {
    let mut auth = api::oxcdauthpb::AuthStore {
        revision: 1,
        ..Default::default()
    };
    if let Some(mut cursor) = reader.bucket(eb::AUTH.as_bytes()).map_err(read_error)? {
        while let Some(item) = cursor.next(reader).map_err(read_error)? {
            if item.key == eb::AUTH_ENABLED {
                auth.enabled = item.value == [1];
            } else if item.key == eb::AUTH_REVISION && item.value.len() == 8 {
                auth.revision = u64::from_be_bytes(item.value.try_into().expect("8 bytes"));
            }
        }
    }
    if let Some(mut cursor) = reader
        .bucket(eb::AUTH_USERS.as_bytes())
        .map_err(read_error)?
    {
        while let Some(item) = cursor.next(reader).map_err(read_error)? {
            auth.users.push(
                api::authpb::User::decode(item.value)
                    .map_err(|e| MvccError::Corrupt(format!("etcd backend: a user: {e}")))?,
            );
        }
    }
    if let Some(mut cursor) = reader
        .bucket(eb::AUTH_ROLES.as_bytes())
        .map_err(read_error)?
    {
        while let Some(item) = cursor.next(reader).map_err(read_error)? {
            auth.roles.push(
                api::authpb::Role::decode(item.value)
                    .map_err(|e| MvccError::Corrupt(format!("etcd backend: a role: {e}")))?,
            );
        }
    }
    Ok(auth)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revision_key(main: i64) -> Vec<u8> {
        eb::revision_key(main)
    }

    fn record(key: &str, value: &[u8], rev: i64) -> Vec<u8> {
        api::mvccpb::KeyValue {
            key: key.as_bytes().to_vec().into(),
            value: value.to_vec().into(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        }
        .encode_to_vec()
    }

    /// An etcd-shaped bbolt file: `key` holds `records`, plus buckets
    /// etcd does not have.
    fn etcd_file(path: &Path, records: &[(Vec<u8>, Vec<u8>)]) {
        let mut w = bbolt::Writer::create(path, bbolt::WriterOptions::default()).unwrap();
        w.begin_bucket(b"alarm").unwrap();
        w.begin_bucket(b"b-unknown").unwrap();
        w.put(b"x", b"y").unwrap();
        w.begin_bucket(eb::KEY.as_bytes()).unwrap();
        for (k, v) in records {
            w.put(k, v).unwrap();
        }
        w.begin_bucket(eb::META.as_bytes()).unwrap();
        w.begin_bucket(b"zzz-unknown").unwrap();
        w.put(b"x", &[7u8; 10_000]).unwrap();
        w.finish().unwrap();
    }

    #[test]
    fn unknown_buckets_are_ignored_and_huge_values_kept() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("etcd.db");
        let huge = vec![0x5au8; 3 << 20];
        etcd_file(
            &src,
            &[
                (revision_key(2), record("a", b"1", 2)),
                (revision_key(3), record("huge", &huge, 3)),
            ],
        );
        let dest = dir.path().join("db");
        let summary = restore_from_bbolt(&src, &dest, &[]).unwrap();
        assert_eq!((summary.revision, summary.keys_records), (3, 2));
        let store = Store::open(&dest).unwrap();
        let got = store
            .range(&api::etcdserverpb::RangeRequest {
                key: b"huge".to_vec().into(),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(got.kvs[0].value.len(), huge.len());
    }

    #[test]
    fn records_that_are_not_etcds_are_refused_with_their_revision() {
        let dir = tempfile::tempdir().unwrap();
        for (records, want) in [
            (
                vec![(revision_key(2), b"\xff\xff\xff".to_vec())],
                "the record at revision 2 does not decode",
            ),
            (
                vec![(b"short".to_vec(), record("a", b"1", 2))],
                "bad revision key",
            ),
        ] {
            let src = dir.path().join("bad.db");
            let _ = std::fs::remove_file(&src);
            etcd_file(&src, &records);
            let dest = dir.path().join("out");
            let _ = std::fs::remove_file(&dest);
            let e = restore_from_bbolt(&src, &dest, &[])
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
