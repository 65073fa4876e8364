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
        let _ = std::fs::remove_file(dest);
        let file = std::fs::File::create(dest)
            .map_err(|e| MvccError::Backend(format!("cannot create {}: {e}", dest.display())))?;
        self.etcd_backend_copy(raft)?
            .write_to(std::io::BufWriter::with_capacity(1 << 20, file))
    }

    /// The store as of now as etcd 3.5's backend, laid out and ready to be
    /// written in one pass: its size is known before its first byte (etcd's
    /// Snapshot tells every chunk what remains), and its bytes come in
    /// order, meta pages first, so a stream needs no file to seek in.
    ///
    /// The layout is a first pass of the bbolt writer over the records'
    /// lengths (a long record's from its head, its parts unread), whose
    /// output is dropped but for the meta pages. The copy holds its read
    /// transaction, and the file handle it reads, until written: a slow
    /// client holds up neither writes nor a defragmentation (which swaps
    /// the handle; etcd's waits for a snapshot's bolt transaction, and
    /// every write waits for it).
    pub fn etcd_backend_copy(&self, raft: &RaftMeta) -> Result<EtcdBackendCopy<'_>, MvccError> {
        // (a commit is deferred during a defragmentation: one at a time)
        let _defrag = self.defrag_lock.lock();
        self.commit(false)?;
        let db = self.db();
        let txn = db.begin_read().map_err(backend_error)?;
        let options = bbolt::WriterOptions::default();
        let mut layout =
            bbolt::Writer::with_options(MetaPages::capture(std::io::sink(), options), options)
                .map_err(bbolt_error)?;
        write_buckets(&txn, &mut layout, raft, Values::Lengths(Vec::new()))?;
        let (size, sink) = layout.finish_into().map_err(bbolt_error)?;
        Ok(EtcdBackendCopy {
            txn,
            _db: db,
            _open: self.open_reads.open(),
            raft: raft.clone(),
            size,
            meta: sink.meta,
        })
    }
}

/// See [`Store::etcd_backend_copy`].
pub struct EtcdBackendCopy<'s> {
    txn: ReadTransaction,
    /// The handle `txn` reads (a defragmentation may swap the store's).
    _db: std::sync::Arc<redb::Database>,
    /// Counts `txn` as an open read transaction.
    _open: crate::stats::OpenRead<'s>,
    raft: RaftMeta,
    size: u64,
    meta: Vec<u8>,
}

impl EtcdBackendCopy<'_> {
    /// Bytes of the bbolt file.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Writes the file to `out`, in order. Fails if it does not come out as
    /// laid out (it cannot: both passes read one transaction).
    pub fn write_to(self, out: impl std::io::Write) -> Result<EtcdBackendSummary, MvccError> {
        let options = bbolt::WriterOptions::default();
        let mut writer =
            bbolt::Writer::with_options(MetaPages::expect(out, self.meta, options), options)
                .map_err(bbolt_error)?;
        let consistent_index = write_buckets(&self.txn, &mut writer, &self.raft, Values::Records)?;
        let (size, mut sink) = writer.finish_into().map_err(bbolt_error)?;
        if size != self.size {
            return Err(MvccError::Backend(format!(
                "the etcd backend came out {size} bytes, laid out as {}",
                self.size
            )));
        }
        sink.out.flush().map_err(|e| bbolt_error(e.into()))?;
        Ok(EtcdBackendSummary {
            size,
            consistent_index,
        })
    }
}

/// The output of the bbolt writer, whose two meta pages (written last, at
/// the start, by seeking back) are known beforehand: they go out first, the
/// writer's placeholders for them are dropped, and its final meta pages are
/// checked against them. Or, capturing: the meta pages are kept, nothing
/// goes out (the layout pass).
struct MetaPages<W> {
    out: W,
    /// Bytes of the two meta pages.
    meta_len: u64,
    /// The meta pages: expected (`capture` false) or captured.
    meta: Vec<u8>,
    capture: bool,
    /// Where the writer is in the file.
    pos: u64,
    /// Whether the writer went back to the start (to write the meta pages).
    rewound: bool,
}

impl<W: std::io::Write> MetaPages<W> {
    fn capture(out: W, options: bbolt::WriterOptions) -> MetaPages<W> {
        MetaPages {
            out,
            meta_len: 2 * u64::from(options.page_size),
            meta: Vec::new(),
            capture: true,
            pos: 0,
            rewound: false,
        }
    }

    fn expect(mut out: W, meta: Vec<u8>, options: bbolt::WriterOptions) -> MetaPages<W> {
        let written = out.write_all(&meta);
        MetaPages {
            out,
            meta_len: 2 * u64::from(options.page_size),
            meta,
            capture: false,
            // a failed write fails the first write through
            pos: if written.is_ok() { 0 } else { u64::MAX },
            rewound: false,
        }
    }
}

impl<W: std::io::Write> std::io::Write for MetaPages<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.pos == u64::MAX {
            return Err(std::io::Error::other("the meta pages were not written"));
        }
        if self.pos >= self.meta_len {
            let n = self.out.write(buf)?;
            self.pos += n as u64;
            return Ok(n);
        }
        // the meta pages' range: placeholders first, the pages at the end
        let n = buf.len().min((self.meta_len - self.pos) as usize);
        let at = self.pos as usize;
        if self.rewound && self.capture {
            self.meta.resize(at, 0);
            self.meta.extend_from_slice(&buf[..n]);
        } else if self.rewound && self.meta.get(at..at + n) != Some(&buf[..n]) {
            return Err(std::io::Error::other(
                "the etcd backend's meta pages differ from its layout",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl<W> std::io::Seek for MetaPages<W> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        match to {
            std::io::SeekFrom::Current(0) => Ok(self.pos),
            // back to the meta pages, then on to the end of the file
            std::io::SeekFrom::Start(0) => {
                self.rewound = true;
                self.pos = 0;
                Ok(0)
            }
            std::io::SeekFrom::Start(end) if self.rewound && self.pos == self.meta_len => {
                self.pos = end;
                Ok(end)
            }
            to => Err(std::io::Error::other(format!(
                "the etcd backend's writer seeks ({to:?}) where it writes in order"
            ))),
        }
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

/// What the `key` bucket's values are written from.
enum Values {
    /// The records, joined and checked.
    Records,
    /// Zeros of each record's length (a layout: the bbolt file's pages
    /// depend on lengths only), from this buffer.
    Lengths(Vec<u8>),
}

/// A `key` record whose seal does not hold.
fn damaged_record() -> MvccError {
    MvccError::Corrupt("a key record's checksum does not match".into())
}

/// The `key` table's records, each joined with its parts and its seal
/// checked, handed to `sink` in order until it returns false.
fn read_records(
    txn: &ReadTransaction,
    mut sink: impl FnMut(&[u8], &[u8]) -> Result<bool, MvccError>,
) -> Result<(), MvccError> {
    let table = txn.open_table(KEY_TABLE).map_err(backend_error)?;
    let parts = crate::parts::ReadParts::open(txn)?;
    for row in table.iter().map_err(backend_error)? {
        let (k, v) = row.map_err(backend_error)?;
        let whole = parts.join(k.value(), v.value())?;
        let payload = crate::backend::unseal(&whole).map_err(|_| damaged_record())?;
        if !sink(k.value(), payload)? {
            break;
        }
    }
    Ok(())
}

/// Records a batch between the reading thread and the writing one holds.
const RECORD_BATCH_BYTES: usize = 1 << 20;
/// Batches queued between them.
const RECORD_BATCHES_QUEUED: usize = 4;

type RecordBatch = Vec<(Vec<u8>, Vec<u8>)>;

/// The `key` bucket's records into `out`, read by a thread of its own
/// (the parts through redb's cache: two thirds of a snapshot's copy) while
/// this one lays out the bbolt pages; here when no thread starts.
fn put_records(
    txn: &ReadTransaction,
    out: &mut bbolt::Writer<impl std::io::Write + std::io::Seek>,
) -> Result<(), MvccError> {
    std::thread::scope(|scope| {
        let (batches, received) =
            std::sync::mpsc::sync_channel::<Result<RecordBatch, MvccError>>(RECORD_BATCHES_QUEUED);
        let reader = std::thread::Builder::new()
            .name("backend-read".into())
            .spawn_scoped(scope, move || {
                let mut batch = RecordBatch::new();
                let mut bytes = 0;
                let read = read_records(txn, |k, v| {
                    bytes += k.len() + v.len();
                    batch.push((k.to_vec(), v.to_vec()));
                    if bytes < RECORD_BATCH_BYTES {
                        return Ok(true);
                    }
                    bytes = 0;
                    // false: the writer stopped (its error is the copy's)
                    Ok(batches.send(Ok(std::mem::take(&mut batch))).is_ok())
                });
                let _ = batches.send(read.map(|()| batch));
            });
        if let Err(e) = reader {
            tracing::warn!(error = %e, "cannot start a thread to read the records; reading them here");
            return read_records(txn, |k, v| {
                out.put(k, v).map_err(bbolt_error)?;
                Ok(true)
            });
        }
        for batch in received {
            for (k, v) in batch? {
                out.put(&k, &v).map_err(bbolt_error)?;
            }
        }
        Ok(())
    })
}

/// Every bucket in etcd's order; returns the consistent index written.
fn write_buckets(
    txn: &ReadTransaction,
    out: &mut bbolt::Writer<impl std::io::Write + std::io::Seek>,
    raft: &RaftMeta,
    mut values: Values,
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
    match (txn.open_table(KEY_TABLE), &mut values) {
        (Ok(_), Values::Records) => put_records(txn, out)?,
        (Ok(table), Values::Lengths(zeros)) => {
            for row in table.iter().map_err(backend_error)? {
                let (k, v) = row.map_err(backend_error)?;
                let len = crate::parts::whole_len(v.value())
                    .checked_sub(crate::backend::CHECKSUM_LEN)
                    .filter(|len| *len <= bbolt::MAX_VALUE_SIZE)
                    .ok_or_else(damaged_record)?;
                if zeros.len() < len {
                    // zeroed by the OS as touched: the writer copies a
                    // value shorter than a page, a longer one goes to a
                    // sink that reads nothing
                    *zeros = vec![0; len];
                }
                out.put(k.value(), &zeros[..len]).map_err(bbolt_error)?;
            }
        }
        (Err(redb::TableError::TableDoesNotExist(_)), _) => {}
        (Err(e), _) => return Err(backend_error(e)),
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

    /// A copy is laid out, then written in order (meta pages first) into
    /// a plain writer: as of its read transaction, whatever is written to
    /// the store in between (a defragmentation too), and of the size laid
    /// out.
    #[test]
    fn a_copy_streams_in_order_as_of_its_layout() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        for i in 0..300u64 {
            let len = [10, 3000, 9000, 70_000][i as usize % 4];
            crate::test_util::put_at(&store, i + 1, &format!("k{i:03}"), vec![i as u8; len], 0);
        }
        let revision = store.current_revision();
        let raft = RaftMeta {
            term: 3,
            voters: vec![1],
            learners: vec![],
        };
        let copy = store.etcd_backend_copy(&raft).unwrap();
        crate::test_util::put_at(&store, 301, "later", "v", 0);
        store.commit(false).unwrap();
        // a defragmentation does not wait for the copy, nor spoil it
        store.defragment().unwrap();
        let size = copy.size();
        let mut bytes = Vec::new();
        let written = copy.write_to(&mut bytes).unwrap();
        assert_eq!((written.size, written.consistent_index), (size, 300));
        assert_eq!(bytes.len() as u64, size);
        let path = dir.path().join("etcd.db");
        std::fs::write(&path, &bytes).unwrap();
        let restored = restore_from_bbolt(&path, &dir.path().join("restored"), &[]).unwrap();
        assert_eq!((restored.revision, restored.keys_records), (revision, 300));
        let restored = Store::open(&dir.path().join("restored")).unwrap();
        assert_eq!(
            restored.hash_kv(revision).unwrap().0,
            store.hash_kv(revision).unwrap().0
        );
    }

    /// The records are read by a thread of their own: a writer that stops
    /// (a client gone) stops it, and a damaged record it reads fails the
    /// copy; neither hangs.
    #[test]
    fn a_copy_ends_when_its_writer_stops_or_a_record_is_damaged() {
        struct Closing(usize);
        impl std::io::Write for Closing {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                if self.0 < buf.len() {
                    return Err(std::io::ErrorKind::BrokenPipe.into());
                }
                self.0 -= buf.len();
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        // more than the batches queued between the threads
        let records = 2 * RECORD_BATCHES_QUEUED * RECORD_BATCH_BYTES / 8192;
        for i in 0..records as u64 {
            crate::test_util::put_at(&store, i + 1, &format!("k{i:05}"), vec![1; 8192], 0);
        }
        let raft = RaftMeta::default();
        let copy = store.etcd_backend_copy(&raft).unwrap();
        assert!(
            copy.write_to(Closing(256 << 10)).is_err(),
            "the writer stopped"
        );
        // whole, it goes through
        let copy = store.etcd_backend_copy(&raft).unwrap();
        let size = copy.size();
        assert_eq!(copy.write_to(Closing(usize::MAX)).unwrap().size, size);

        // a record's bytes damaged in the file: its seal fails
        store.commit(true).unwrap();
        {
            let db = store.db();
            let txn = redb::Database::begin_write(&db).unwrap();
            {
                let mut table = txn.open_table(KEY_TABLE).unwrap();
                let key = table.first().unwrap().unwrap().0.value().to_vec();
                let mut value = table.get(key.as_slice()).unwrap().unwrap().value().to_vec();
                value[0] ^= 0xff;
                table.insert(key.as_slice(), value.as_slice()).unwrap();
            }
            txn.commit().unwrap();
        }
        let copy = store.etcd_backend_copy(&raft).unwrap();
        let err = copy.write_to(Closing(usize::MAX)).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
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
