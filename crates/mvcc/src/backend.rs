//! The redb file: table definitions, meta fields, the startup scan, and the
//! batch commit. The byte layout is documented in the crate doc.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::key_index::KeyIndexTree;
use crate::parts::{ReadParts, Records};
use crate::revision::{Revision, RevisionKey};
use crate::MvccError;

pub(crate) const KEY_TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("key");
pub(crate) const META_TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// Cluster membership as the apply layer records it: member ID (u64) →
/// an opaque record the server encodes (etcd keeps a "members" bucket).
pub(crate) const MEMBERS_TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("members");
/// Members removed from the cluster: member ID → a marker (etcd's
/// "members_removed" bucket); a removed ID never joins again.
pub(crate) const MEMBERS_REMOVED_TABLE: TableDefinition<u64, &[u8]> =
    TableDefinition::new("members_removed");
/// Leases: lease ID (i64 as u64) → an encoded `leasepb.Lease` (etcd's "lease" bucket).
pub(crate) const LEASES_TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("lease");
/// Alarms: an opaque key chosen by the server → an opaque record (etcd's "alarm" bucket).
pub(crate) const ALARMS_TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("alarm");
/// Auth: the auth store's record (etcd's "auth", "authUsers" and "authRoles" buckets).
pub(crate) const AUTH_TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("auth");

/// The tables of records the server keeps beside the key history. Each maps
/// a u64 to bytes the server encodes; mvcc only stores them, in the same
/// transaction as the consistent index of the entry that changed them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SideTable {
    Members,
    MembersRemoved,
    Leases,
    Alarms,
    Auth,
}

impl SideTable {
    pub(crate) const ALL: [SideTable; 5] = [
        SideTable::Members,
        SideTable::MembersRemoved,
        SideTable::Leases,
        SideTable::Alarms,
        SideTable::Auth,
    ];

    pub(crate) fn definition(self) -> TableDefinition<'static, u64, &'static [u8]> {
        match self {
            SideTable::Members => MEMBERS_TABLE,
            SideTable::MembersRemoved => MEMBERS_REMOVED_TABLE,
            SideTable::Leases => LEASES_TABLE,
            SideTable::Alarms => ALARMS_TABLE,
            SideTable::Auth => AUTH_TABLE,
        }
    }
}

pub(crate) const META_CONSISTENT_INDEX: &str = "consistent_index";
pub(crate) const META_FINISHED_COMPACT_REV: &str = "finishedCompactRev";
pub(crate) const META_SCHEDULED_COMPACT_REV: &str = "scheduledCompactRev";
pub(crate) const META_FORMAT_VERSION: &str = "mvcc_format_version";
/// Bumped on any incompatible change of the layout in the crate doc.
/// Version 2 seals every `key` record with a checksum; version 3 stores
/// records longer than a page in parts ([`crate::parts`]). A file of an
/// older version is upgraded when opened or restored ([`upgrade_format`]).
pub(crate) const FORMAT_VERSION: u32 = 3;

/// The tag of a record's checksum: protobuf field 15, wire type 5
/// (fixed32), so a sealed record is still a valid `mvccpb.KeyValue`
/// encoding (decoders skip the unknown field).
pub(crate) const CHECKSUM_TAG: u8 = (15 << 3) | 5;
/// Bytes a seal adds to a record: the tag and a CRC-32 (IEEE, little-endian)
/// of everything before it.
pub(crate) const CHECKSUM_LEN: usize = 5;

/// A `key` record as stored: the encoded KeyValue, then its checksum.
pub(crate) fn seal(mut payload: Vec<u8>) -> Bytes {
    let crc = crc32fast::hash(&payload);
    payload.reserve_exact(CHECKSUM_LEN);
    payload.push(CHECKSUM_TAG);
    payload.extend_from_slice(&crc.to_le_bytes());
    Bytes::from(payload)
}

/// The encoded KeyValue of a stored record, if its checksum holds. redb
/// checks no checksum on reads, so without this a few overwritten bytes in
/// the file would be served as the value (etcd has the same blind spot).
pub(crate) fn unseal(record: &[u8]) -> Result<&[u8], ChecksumMismatch> {
    let split = record
        .len()
        .checked_sub(CHECKSUM_LEN)
        .ok_or(ChecksumMismatch)?;
    let (payload, trailer) = record.split_at(split);
    if trailer[0] != CHECKSUM_TAG || trailer[1..] != crc32fast::hash(payload).to_le_bytes() {
        return Err(ChecksumMismatch);
    }
    Ok(payload)
}

/// [`unseal`] of a shared buffer, without copying.
pub(crate) fn unseal_bytes(record: &Bytes) -> Result<Bytes, ChecksumMismatch> {
    let len = unseal(record)?.len();
    Ok(record.slice(..len))
}

/// A stored record whose bytes are not what was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChecksumMismatch;

impl ChecksumMismatch {
    /// The error naming the record.
    pub(crate) fn at(self, revision: Revision) -> MvccError {
        MvccError::Corrupt(format!(
            "the record of revision {}/{} fails its checksum",
            revision.main, revision.sub
        ))
    }
}

pub(crate) fn backend_error(err: impl std::fmt::Display) -> MvccError {
    MvccError::Backend(err.to_string())
}

/// What a startup scan of the file yields.
pub(crate) struct Loaded {
    pub index: KeyIndexTree,
    pub current_revision: i64,
    pub compact_revision: i64,
    /// A compaction recorded but not finished (only in a backend imported
    /// from etcd, which writes the two marks in separate transactions):
    /// the open resumes it, as etcd's restore does.
    pub scheduled_compact_revision: Option<i64>,
    pub consistent_index: u64,
    /// Live keys whose latest put names a lease, with that lease: the lessor
    /// rebuilds its key sets from them (etcd's restore attaches them).
    pub leased_keys: Vec<(Bytes, i64)>,
}

/// redb's page cache for the store's file (read cache and write buffer
/// together; the write buffer takes at most half). The file itself stays in
/// the OS page cache, which does not count against the process: this only
/// needs to hold the hot part of the tree (the right edge of the `key` table,
/// where every write lands, and the branch pages). redb's default (1 GiB)
/// would hold a whole 1M-key file (~340 MB) in process memory. Measured on
/// loads of 1M keys of 256 B (100 clients), 16 MiB against 64 MiB: the same
/// put rate (~20k/s), 194 MB resident instead of 260 (the write buffer
/// spills pages to the file between durable commits sooner, without an
/// fsync, which costs nothing a put waits for).
pub(crate) const CACHE_BYTES: usize = 16 * 1024 * 1024;

/// How every redb handle on the store's file is opened.
pub(crate) fn builder() -> redb::Builder {
    let mut builder = redb::Builder::new();
    builder.set_cache_size(CACHE_BYTES);
    builder
}

thread_local! {
    /// Set while [`without_panics`] runs on this thread: the panic hook
    /// stays quiet (the panic becomes an error of ours).
    static QUIET_PANICS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, which reads the redb file at `path`, turning a panic into a
/// [`MvccError::Corrupt`] that names the file, and naming the file in a
/// corruption error too. redb reports most damage as errors, but some
/// damaged pages (a branch page with garbage, a bad page number) make it
/// panic ("unreachable"): a member must refuse such a file with a clear
/// message, not die with redb's internals.
pub(crate) fn without_panics<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, MvccError>,
) -> Result<T, MvccError> {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET_PANICS.with(|quiet| quiet.get()) {
                previous(info);
            }
        }));
    });
    let was_quiet = QUIET_PANICS.with(|quiet| quiet.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET_PANICS.with(|quiet| quiet.set(was_quiet));
    let damaged = |what: String| {
        MvccError::Corrupt(format!(
            "{} is damaged ({what}); restore it from a snapshot or another member",
            path.display()
        ))
    };
    match result {
        Ok(Err(MvccError::Corrupt(what))) => Err(damaged(what)),
        Ok(other) => other,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(damaged(format!("the backend failed reading it: {what}")))
        }
    }
}

/// Creates (or opens) the redb file at `path` with `builder`; a new file is
/// made 0600 first, as etcd's bbolt files (`fileutil.PrivateFileMode`), an
/// existing one keeps its mode.
pub(crate) fn create_private(builder: &redb::Builder, path: &Path) -> Result<Database, MvccError> {
    let file = open_private(path)?;
    let backend = crate::copy_file::live(file)
        .map_err(|e| MvccError::Backend(format!("cannot open {}: {e}", path.display())))?;
    builder.create_with_backend(backend).map_err(database_error)
}

/// [`create_private`] for a copy's new file, its writes gathered into runs
/// (see [`crate::copy_file`]), and the handle that turns that off.
pub(crate) fn create_copy(
    builder: &redb::Builder,
    path: &Path,
) -> Result<(Database, crate::copy_file::Combining), MvccError> {
    let file = open_private(path)?;
    let (backend, combining) = crate::copy_file::on(file)
        .map_err(|e| MvccError::Backend(format!("cannot open {}: {e}", path.display())))?;
    let db = builder
        .create_with_backend(backend)
        .map_err(database_error)?;
    Ok((db, combining))
}

/// `path` opened for reading and writing, created 0600 if missing.
fn open_private(path: &Path) -> Result<std::fs::File, MvccError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(path)
        .map_err(|e| MvccError::Backend(format!("cannot create {}: {e}", path.display())))
}

pub(crate) fn database_error(e: redb::DatabaseError) -> MvccError {
    match e {
        // the integrity check's verdict (open_database): a damaged file
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(what)) => {
            MvccError::Corrupt(what)
        }
        e => backend_error(e),
    }
}

/// Opens the store's file, every page checked; any key index checkpoint is
/// deleted in the open's transaction (see [`crate::index_checkpoint`]).
pub(crate) fn open_database(path: &Path) -> Result<Database, MvccError> {
    open_database_with(path, true)
}

/// [`open_database`], with redb's check of every page at open or without
/// it (a file a clean stop left, whose check is deferred: see
/// [`crate::deferred_check`]).
pub(crate) fn open_database_with(path: &Path, check_pages: bool) -> Result<Database, MvccError> {
    // Every page's checksum verified at open (a full read of the file:
    // +80 ms on a 65 MiB one whose key index rebuild takes 700). redb
    // trusts a file altered on disk, and damage in its freed-pages tree
    // makes the first commit panic, then panic again while unwinding from
    // it, which aborts the process past any catch_unwind. With the check
    // such a file is refused as corrupted.
    let mut builder = builder();
    builder.set_check_integrity_on_open(check_pages);
    let db = match create_private(&builder, path) {
        // our own checks name what is damaged (a record and its
        // revision); redb's only that a page is
        Err(MvccError::Corrupt(what)) => {
            return Err(damaged_record(path).unwrap_or(MvccError::Corrupt(what)))
        }
        opened => opened?,
    };
    // Make sure both tables and the format version exist, so readers never
    // meet a missing table.
    let txn = db.begin_write().map_err(backend_error)?;
    {
        Records::open(&txn)?;
        let mut meta = txn.open_table(META_TABLE).map_err(backend_error)?;
        let existing = meta
            .get(META_FORMAT_VERSION)
            .map_err(backend_error)?
            .map(|v| v.value().to_vec());
        if existing.is_none() {
            meta.insert(META_FORMAT_VERSION, &FORMAT_VERSION.to_be_bytes()[..])
                .map_err(backend_error)?;
        }
    }
    upgrade_format(&txn)?;
    crate::index_checkpoint::drop_in(&txn)?;
    txn.commit().map_err(backend_error)?;
    Ok(db)
}

/// What reading a file that failed redb's integrity check meets first, if
/// anything (read-only: nothing is written to it).
fn damaged_record(path: &Path) -> Option<MvccError> {
    let db = builder().open_read_only(path).ok()?;
    load_from(&db).err()
}

/// Records resealed per step of an upgrade (bounds the memory it holds).
const UPGRADE_CHUNK: usize = 10_000;

/// Brings a file written in an older format (as recorded in meta) to
/// [`FORMAT_VERSION`] inside `txn`: version 1 records get their checksum
/// (and long ones are stored in parts); version 2 files need nothing (their
/// records are all whole, which version 3 reads as it reads short ones).
/// Refuses a newer format.
pub(crate) fn upgrade_format(txn: &redb::WriteTransaction) -> Result<(), MvccError> {
    let mut meta = txn.open_table(META_TABLE).map_err(backend_error)?;
    let version = match meta.get(META_FORMAT_VERSION).map_err(backend_error)? {
        Some(v) => {
            let bytes: [u8; 4] = v.value().try_into().map_err(|_| {
                MvccError::Corrupt(format!("mvcc format version is {} bytes", v.value().len()))
            })?;
            u32::from_be_bytes(bytes)
        }
        None => FORMAT_VERSION,
    };
    if version == FORMAT_VERSION {
        return Ok(());
    }
    if version == 2 {
        meta.insert(META_FORMAT_VERSION, &FORMAT_VERSION.to_be_bytes()[..])
            .map_err(backend_error)?;
        return Ok(());
    }
    if version != 1 {
        return Err(MvccError::Corrupt(format!(
            "unsupported mvcc format version {version} (this oxcd reads 1 to {FORMAT_VERSION})"
        )));
    }
    let mut records = Records::open(txn)?;
    let mut from: Option<Vec<u8>> = None;
    let mut resealed = 0u64;
    loop {
        let chunk: Vec<(Vec<u8>, Vec<u8>)> = {
            let rows = match &from {
                Some(after) => records.table.range::<&[u8]>(after.as_slice()..),
                None => records.table.range::<&[u8]>(..),
            }
            .map_err(backend_error)?;
            rows.skip(usize::from(from.is_some()))
                .take(UPGRADE_CHUNK)
                .map(|row| row.map(|(k, v)| (k.value().to_vec(), v.value().to_vec())))
                .collect::<Result<_, _>>()
                .map_err(backend_error)?
        };
        let Some((last, _)) = chunk.last() else { break };
        from = Some(last.clone());
        for (key, value) in chunk {
            // (a format 1 record is no head: its bytes are not read as one)
            records
                .table
                .remove(key.as_slice())
                .map_err(backend_error)?;
            records.insert(key.as_slice(), &seal(value))?;
            resealed += 1;
        }
    }
    meta.insert(META_FORMAT_VERSION, &FORMAT_VERSION.to_be_bytes()[..])
        .map_err(backend_error)?;
    tracing::info!(
        records = resealed,
        "mvcc: upgraded the backend format from 1 to {FORMAT_VERSION} (record checksums)"
    );
    Ok(())
}

fn meta_i64(value: &[u8], name: &str) -> Result<i64, MvccError> {
    let bytes: [u8; 8] = value
        .try_into()
        .map_err(|_| MvccError::Corrupt(format!("meta {name} is {} bytes", value.len())))?;
    Ok(i64::from_be_bytes(bytes))
}

/// Reads meta and rebuilds the key index by scanning the key table in
/// revision order, decoding only key, create_revision and version.
pub(crate) fn load(db: &Database) -> Result<Loaded, MvccError> {
    load_from(db)
}

/// [`load`] from any redb handle (a read-only one too).
/// The marks of the meta table a load needs.
pub(crate) struct Meta {
    pub consistent_index: u64,
    /// -1: never compacted (compact(0) is then still accepted, as etcd).
    pub compact_revision: i64,
    /// A compaction recorded but not finished.
    pub scheduled_compact_revision: Option<i64>,
}

pub(crate) fn read_meta(db: &impl ReadableDatabase) -> Result<Meta, MvccError> {
    let txn = db.begin_read().map_err(backend_error)?;
    let meta = txn.open_table(META_TABLE).map_err(backend_error)?;
    meta_of(&meta)
}

/// [`read_meta`] from the meta table of any transaction.
pub(crate) fn meta_of(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Meta, MvccError> {
    let get = |name: &str| -> Result<Option<i64>, MvccError> {
        match meta.get(name).map_err(backend_error)? {
            Some(v) => Ok(Some(meta_i64(v.value(), name)?)),
            None => Ok(None),
        }
    };
    let compact_revision = get(META_FINISHED_COMPACT_REV)?.unwrap_or(-1);
    Ok(Meta {
        consistent_index: get(META_CONSISTENT_INDEX)?.unwrap_or(0) as u64,
        compact_revision,
        scheduled_compact_revision: get(META_SCHEDULED_COMPACT_REV)?
            .filter(|s| *s > compact_revision),
    })
}

/// Reads the meta and side tables through once: redb checks a page as it
/// reads it and panics on some damage (an invalid key), which the caller's
/// `without_panics` turns into refusing the file at open rather than a
/// panic in a later read of it (a hash, a side-table lookup).
pub(crate) fn read_small_tables(db: &impl ReadableDatabase) -> Result<(), MvccError> {
    {
        let txn = db.begin_read().map_err(backend_error)?;
        let meta = txn.open_table(META_TABLE).map_err(backend_error)?;
        for row in meta.iter().map_err(backend_error)? {
            let (k, v) = row.map_err(backend_error)?;
            let _ = (k.value(), v.value());
        }
    }
    for side in SideTable::ALL {
        load_side_from(db, side)?;
    }
    Ok(())
}

pub(crate) fn load_from(db: &impl ReadableDatabase) -> Result<Loaded, MvccError> {
    let Meta {
        consistent_index,
        compact_revision,
        scheduled_compact_revision,
    } = read_meta(db)?;
    let txn = db.begin_read().map_err(backend_error)?;
    let table = txn.open_table(KEY_TABLE).map_err(backend_error)?;
    let parts = ReadParts::open(&txn)?;
    let mut indexer = Indexer::default();
    for entry in table.iter().map_err(backend_error)? {
        let (k, v) = entry.map_err(backend_error)?;
        indexer.add(k.value(), &parts.join(k.value(), v.value())?)?;
    }
    drop((table, parts));
    drop(txn);
    read_small_tables(db)?;
    Ok(indexer.finish(Meta {
        consistent_index,
        compact_revision,
        scheduled_compact_revision,
    }))
}

/// The key index and leased keys of the `key` table's records, given in
/// revision order, every record's checksum verified.
#[derive(Default)]
pub(crate) struct Indexer {
    index: KeyIndexTree,
    current_revision: i64,
    leased: std::collections::HashMap<Bytes, i64>,
}

impl Indexer {
    /// The next record of the `key` table (its key and whole record).
    pub(crate) fn add(&mut self, key: &[u8], value: &[u8]) -> Result<(), MvccError> {
        let (revision, tombstone) = RevisionKey::parse(key)?;
        let record = unseal(value).map_err(|e| e.at(revision))?;
        let fields = scan_key_value(record)?;
        self.add_fields(revision, tombstone, &fields);
        Ok(())
    }

    /// [`Indexer::add`] of a record whose fields were read elsewhere (a
    /// long record's from its first part and its head: see
    /// [`crate::parts::long_fields`]), its checksum unchecked.
    pub(crate) fn add_fields(
        &mut self,
        revision: Revision,
        tombstone: bool,
        fields: &KeyValueFields<'_>,
    ) {
        self.current_revision = revision.main;
        if tombstone {
            self.index.restore_tombstone(fields.key, revision);
        } else {
            self.index
                .restore(fields.key, revision, fields.create_revision, fields.version);
        }
        if fields.lease != 0 && !tombstone {
            self.leased
                .insert(Bytes::copy_from_slice(fields.key), fields.lease);
        } else if !self.leased.is_empty() {
            self.leased.remove(fields.key);
        }
    }

    /// What a load of the file yields, its meta being `meta`.
    pub(crate) fn finish(mut self, meta: Meta) -> Loaded {
        self.index.repack();
        Loaded {
            index: self.index,
            current_revision: self.current_revision.max(meta.compact_revision),
            compact_revision: meta.compact_revision,
            scheduled_compact_revision: meta.scheduled_compact_revision,
            consistent_index: meta.consistent_index,
            leased_keys: self.leased.into_iter().collect(),
        }
    }
}

/// The fields of an encoded `mvccpb.KeyValue` the index needs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KeyValueFields<'a> {
    pub key: &'a [u8],
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

pub(crate) fn read_varint(bytes: &[u8], pos: &mut usize) -> Result<u64, MvccError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&byte) = bytes.get(*pos) else {
            return Err(MvccError::Corrupt("truncated varint in KeyValue".into()));
        };
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(MvccError::Corrupt("overlong varint in KeyValue".into()))
}

/// Decodes key, create_revision, mod_revision, version and lease from a protobuf
/// `mvccpb.KeyValue` without copying or decoding the value.
pub fn scan_key_value(bytes: &[u8]) -> Result<KeyValueFields<'_>, MvccError> {
    let mut fields = KeyValueFields::default();
    let mut pos = 0;
    while pos < bytes.len() {
        let tag = read_varint(bytes, &mut pos)?;
        let (field, wire_type) = (tag >> 3, tag & 7);
        match wire_type {
            0 => {
                let v = read_varint(bytes, &mut pos)? as i64;
                match field {
                    2 => fields.create_revision = v,
                    3 => fields.mod_revision = v,
                    4 => fields.version = v,
                    6 => fields.lease = v,
                    _ => {}
                }
            }
            2 => {
                let len = read_varint(bytes, &mut pos)? as usize;
                let end = pos
                    .checked_add(len)
                    .filter(|end| *end <= bytes.len())
                    .ok_or_else(|| MvccError::Corrupt("truncated field in KeyValue".into()))?;
                if field == 1 {
                    fields.key = &bytes[pos..end];
                }
                pos = end;
            }
            1 => pos += 8,
            5 => pos += 4,
            _ => {
                return Err(MvccError::Corrupt(format!(
                    "unexpected wire type {wire_type} in KeyValue"
                )))
            }
        }
    }
    if pos != bytes.len() {
        return Err(MvccError::Corrupt("truncated KeyValue".into()));
    }
    Ok(fields)
}

/// One batch, written in one redb transaction.
pub(crate) struct Batch<'a> {
    pub records: &'a BTreeMap<Revision, (bool, Bytes)>,
    pub deletions: &'a [RevisionKey],
    pub consistent_index: u64,
    /// A compaction scheduled (its deletions may follow in later batches).
    pub compact_revision: Option<i64>,
    /// A compaction whose last deletions are in this batch.
    pub finished_compact_revision: Option<i64>,
    /// Side-table records to write (Some) or remove (None).
    pub side: &'a BTreeMap<(SideTable, u64), Option<Vec<u8>>>,
    pub durable: bool,
}

/// The file's bytes in use ([`crate::Store::db_size_in_use`]): counted at
/// open and defragmentation, and kept up to date in between by every
/// commit's own writes and removals, so that a member loaded without a
/// defragmentation does not report the fresh file's few pages.
#[derive(Debug)]
pub(crate) struct InUseBytes(std::sync::atomic::AtomicI64);

impl InUseBytes {
    pub(crate) fn new(counted: i64) -> InUseBytes {
        InUseBytes(std::sync::atomic::AtomicI64::new(counted))
    }

    /// Takes a count (every page walked).
    pub(crate) fn store(&self, counted: i64, order: std::sync::atomic::Ordering) {
        self.0.store(counted, order);
    }

    /// Applies a commit's change ([`commit_batch`]).
    pub(crate) fn add(&self, change: i64, order: std::sync::atomic::Ordering) {
        self.0.fetch_add(change, order);
    }

    pub(crate) fn load(&self, order: std::sync::atomic::Ordering) -> i64 {
        self.0.load(order)
    }
}

/// Bytes of allocated pages as a write transaction sees them. Walks every
/// page of the file: see [`commit_batch`].
pub(crate) fn size_in_use(txn: &redb::WriteTransaction) -> Result<i64, MvccError> {
    txn.stats()
        .map(|s| (s.allocated_pages() * s.page_size() as u64) as i64)
        .map_err(backend_error)
}

/// Bytes of allocated pages in `db`, counted in a write transaction that
/// is then aborted (it waits for any other writer of `db`).
pub(crate) fn count_in_use(db: &Database) -> Result<i64, MvccError> {
    let txn = db.begin_write().map_err(backend_error)?;
    let in_use = size_in_use(&txn)?;
    txn.abort().map_err(backend_error)?;
    Ok(in_use)
}

/// Every record of a side table in the file.
pub(crate) fn load_side(
    db: &Database,
    side: SideTable,
) -> Result<BTreeMap<u64, Vec<u8>>, MvccError> {
    load_side_from(db, side)
}

fn load_side_from(
    db: &impl ReadableDatabase,
    side: SideTable,
) -> Result<BTreeMap<u64, Vec<u8>>, MvccError> {
    let txn = db.begin_read().map_err(backend_error)?;
    let table = match txn.open_table(side.definition()) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(BTreeMap::new()),
        Err(e) => return Err(backend_error(e)),
    };
    let mut out = BTreeMap::new();
    for row in table.iter().map_err(backend_error)? {
        let (id, record) = row.map_err(backend_error)?;
        out.insert(id.value(), record.value().to_vec());
    }
    Ok(out)
}

/// Makes every commit before it durable: an empty write transaction
/// committed with fsync (redb persists the commits made without one, and the
/// pages they freed, with the next durable commit).
pub(crate) fn sync_commits(db: &Database) -> Result<(), MvccError> {
    let mut txn = db.begin_write().map_err(backend_error)?;
    txn.set_durability(Durability::Immediate)
        .map_err(backend_error)?;
    txn.commit().map_err(backend_error)
}

/// Writes the batch with its consistent index in one transaction. Returns
/// the change of the bytes in use: the bytes the batch wrote less those it
/// removed (keys and values; the pages' own overhead is counted at the next
/// count, a defragmentation's). redb counts pages by walking every page of
/// every table, which costs as much as reading the whole file (through the
/// page cache, evicting the hot pages), under the writer lock: never in a
/// commit (the last commit of a stopping member walked 30k pages, 0.7 s at
/// 285 MB; a compaction's last batch stalled writes 200 ms at 570 MB).
pub(crate) fn commit_batch(db: &Database, batch: &Batch<'_>) -> Result<i64, MvccError> {
    let (mut written, mut removed) = (0i64, 0i64);
    let mut count = |added: usize, old: Option<usize>| {
        written += added as i64;
        removed += old.unwrap_or(0) as i64;
    };
    let mut txn = db.begin_write().map_err(backend_error)?;
    txn.set_durability(if batch.durable {
        Durability::Immediate
    } else {
        Durability::None
    })
    .map_err(backend_error)?;
    {
        let mut table = Records::open(&txn)?;
        for (revision, (tombstone, value)) in batch.records {
            let key = RevisionKey::new(*revision, *tombstone);
            // Checked right before it is written, as it is right after it is
            // read: a record damaged in memory never reaches the file.
            assert!(
                unseal(value).is_ok(),
                "the record of revision {revision:?} is sealed"
            );
            let (written, replaced) = table.insert(key.as_slice(), value)?;
            count(written, Some(replaced));
        }
        // After the inserts: a record compacted while still pending is written
        // and removed in the same transaction.
        let removed = table.remove_all(batch.deletions)?;
        count(0, Some(removed));
        let mut meta = txn.open_table(META_TABLE).map_err(backend_error)?;
        meta.insert(
            META_CONSISTENT_INDEX,
            &batch.consistent_index.to_be_bytes()[..],
        )
        .map_err(backend_error)?;
        for side in SideTable::ALL {
            let mut changes = batch.side.range((side, 0)..=(side, u64::MAX)).peekable();
            if changes.peek().is_none() {
                continue;
            }
            let mut table = txn.open_table(side.definition()).map_err(backend_error)?;
            for ((_, id), record) in changes {
                let id_len = std::mem::size_of::<u64>();
                let (added, old) = match record {
                    Some(bytes) => (
                        id_len + bytes.len(),
                        table.insert(*id, &bytes[..]).map_err(backend_error)?,
                    ),
                    None => (0, table.remove(*id).map_err(backend_error)?),
                };
                count(added, old.map(|old| id_len + old.value().len()));
            }
        }
        if let Some(revision) = batch.compact_revision {
            meta.insert(META_SCHEDULED_COMPACT_REV, &revision.to_be_bytes()[..])
                .map_err(backend_error)?;
        }
        if let Some(revision) = batch.finished_compact_revision {
            meta.insert(META_FINISHED_COMPACT_REV, &revision.to_be_bytes()[..])
                .map_err(backend_error)?;
        }
    }
    txn.commit().map_err(backend_error)?;
    Ok(written - removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::mvccpb::KeyValue;
    use prost::Message;

    #[test]
    fn a_durable_commit_changes_the_in_use_figure_without_counting_pages() {
        // The last commit of a stopping member is durable: counting its
        // pages there read the whole file (30k preads, 0.7 s at 285 MB).
        let dir = tempfile::tempdir().unwrap();
        let db = create_private(&builder(), &dir.path().join("db")).unwrap();
        let value = seal(vec![7; 3000]);
        let records = BTreeMap::from([(Revision::new(2, 0), (false, value.clone()))]);
        let side = BTreeMap::new();
        let batch = |durable| Batch {
            records: &records,
            deletions: &[],
            consistent_index: 5,
            compact_revision: None,
            finished_compact_revision: None,
            side: &side,
            durable,
        };
        let key_len = RevisionKey::new(Revision::new(2, 0), false)
            .as_slice()
            .len() as i64;
        assert_eq!(
            commit_batch(&db, &batch(true)).unwrap(),
            key_len + value.len() as i64
        );
        assert_eq!(
            commit_batch(&db, &batch(false)).unwrap(),
            0,
            "the same record again: replaced, nothing more in use"
        );
    }

    #[test]
    fn scan_key_value_matches_prost_decoding() {
        let kv = KeyValue {
            key: Bytes::from_static(b"foo"),
            create_revision: 300,
            mod_revision: 1 << 40,
            version: 7,
            value: Bytes::from(vec![9u8; 1000]),
            lease: 42,
        };
        let encoded = kv.encode_to_vec();
        let fields = scan_key_value(&encoded).unwrap();
        assert_eq!(
            fields,
            KeyValueFields {
                key: b"foo",
                create_revision: 300,
                mod_revision: 1 << 40,
                version: 7,
                lease: 42,
            }
        );
        assert!(scan_key_value(&encoded[..encoded.len() - 1]).is_err());
    }
}
