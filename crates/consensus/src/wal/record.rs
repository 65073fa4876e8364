//! Encoding and decoding of one WAL record (format version 1).
//!
//! See the `wal` module doc for the byte layout. Every function here is pure:
//! bytes in, records out, so a fuzz target or a test can drive it directly.

use raft::eraftpb::{Entry, HardState};
// `protobuf::Message` supplies `write_to_bytes` / `parse_from_bytes` for Entry.
use protobuf::Message as _;

/// Version written into every segment's metadata record. Bump it, and keep a
/// decoder for the old one, whenever the layout below changes.
pub const WAL_FORMAT_VERSION: u32 = 1;

/// Identifies an oxcd WAL segment (first 8 bytes of the metadata payload).
pub(crate) const WAL_MAGIC: &[u8; 8] = b"oxcdwal\0";

/// Size of the fixed record header.
pub const HEADER_LEN: usize = 16;

/// Upper bound on one record's payload: one raft entry is bounded by the
/// server's request size limit (etcd: 1.5 MiB default, 10 MiB recommended
/// max), and raft batches never merge entries into one record. A header that
/// claims more than this is corruption, not a record.
pub const MAX_RECORD_PAYLOAD: u32 = 256 * 1024 * 1024;

/// The type byte of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordType {
    Metadata = 1,
    Entry = 2,
    HardState = 3,
    Snapshot = 4,
}

impl RecordType {
    fn from_u8(b: u8) -> Option<RecordType> {
        match b {
            1 => Some(RecordType::Metadata),
            2 => Some(RecordType::Entry),
            3 => Some(RecordType::HardState),
            4 => Some(RecordType::Snapshot),
            _ => None,
        }
    }
}

/// Identity of the member that owns the WAL; repeated at the start of every
/// segment so that any suffix of segments is self-describing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    pub node_id: u64,
    pub cluster_id: u64,
    /// Voters of the bootstrap configuration. Used when no snapshot exists yet,
    /// so that a restart does not depend on the command line's initial cluster.
    pub initial_voters: Vec<u64>,
}

/// A snapshot marker: the WAL has seen a snapshot at (term, index).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotMarker {
    pub term: u64,
    pub index: u64,
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Metadata(Metadata),
    Entry(Entry),
    HardState(HardState),
    Snapshot(SnapshotMarker),
}

/// Why the bytes at an offset are not a record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Fewer bytes remain than the record needs (a torn write at the tail).
    Incomplete,
    /// The 16-byte header fails its own CRC: the length cannot be trusted.
    BadHeader,
    /// The header is sound, the payload fails its CRC.
    BadPayloadCrc { record_len: usize },
    /// CRCs are fine but the payload does not decode (a bug or a format skew).
    BadPayload { record_len: usize, reason: String },
}

/// Appends one encoded record to `out`.
pub(crate) fn encode(record: &Record, out: &mut Vec<u8>) {
    let (kind, payload) = match record {
        Record::Metadata(m) => {
            let mut p = Vec::with_capacity(8 + 4 + 16 + 4 + 8 * m.initial_voters.len());
            p.extend_from_slice(WAL_MAGIC);
            p.extend_from_slice(&WAL_FORMAT_VERSION.to_le_bytes());
            p.extend_from_slice(&m.node_id.to_le_bytes());
            p.extend_from_slice(&m.cluster_id.to_le_bytes());
            p.extend_from_slice(&(m.initial_voters.len() as u32).to_le_bytes());
            for v in &m.initial_voters {
                p.extend_from_slice(&v.to_le_bytes());
            }
            (RecordType::Metadata, p)
        }
        Record::Entry(e) => {
            // Encoding a well-formed in-memory message cannot fail.
            let p = e.write_to_bytes().expect("encode raft entry");
            (RecordType::Entry, p)
        }
        Record::HardState(hs) => {
            let mut p = Vec::with_capacity(24);
            p.extend_from_slice(&hs.term.to_le_bytes());
            p.extend_from_slice(&hs.vote.to_le_bytes());
            p.extend_from_slice(&hs.commit.to_le_bytes());
            (RecordType::HardState, p)
        }
        Record::Snapshot(s) => {
            let mut p = Vec::with_capacity(16);
            p.extend_from_slice(&s.term.to_le_bytes());
            p.extend_from_slice(&s.index.to_le_bytes());
            (RecordType::Snapshot, p)
        }
    };
    let mut payload_crc = crc32fast::Hasher::new();
    payload_crc.update(&[kind as u8]);
    payload_crc.update(&payload);
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[4..8].copy_from_slice(&payload_crc.finalize().to_le_bytes());
    header[8] = kind as u8;
    // bytes 9..12 reserved, zero
    let header_crc = crc32fast::hash(&header[0..12]);
    header[12..16].copy_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&payload);
}

/// Decodes the record at the start of `buf`; on success returns it with the
/// number of bytes it occupies.
pub(crate) fn decode(buf: &[u8]) -> Result<(Record, usize), DecodeError> {
    if buf.len() < HEADER_LEN {
        return Err(DecodeError::Incomplete);
    }
    let header = &buf[..HEADER_LEN];
    let stored_header_crc = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
    if crc32fast::hash(&header[0..12]) != stored_header_crc {
        return Err(DecodeError::BadHeader);
    }
    let payload_len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    if payload_len > MAX_RECORD_PAYLOAD || header[9..12] != [0, 0, 0] {
        return Err(DecodeError::BadHeader);
    }
    let record_len = HEADER_LEN + payload_len as usize;
    if buf.len() < record_len {
        return Err(DecodeError::Incomplete);
    }
    let kind_byte = header[8];
    let payload = &buf[HEADER_LEN..record_len];
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind_byte]);
    crc.update(payload);
    let stored_payload_crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    if crc.finalize() != stored_payload_crc {
        return Err(DecodeError::BadPayloadCrc { record_len });
    }
    let bad = |reason: &str| DecodeError::BadPayload {
        record_len,
        reason: reason.to_string(),
    };
    let kind = RecordType::from_u8(kind_byte).ok_or_else(|| bad("unknown record type"))?;
    let u64_at = |i: usize| -> Option<u64> {
        payload
            .get(i..i + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let record = match kind {
        RecordType::Metadata => {
            if payload.len() < 32 || &payload[0..8] != WAL_MAGIC {
                return Err(bad("not an oxcd WAL metadata record"));
            }
            let version = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes"));
            if version != WAL_FORMAT_VERSION {
                return Err(bad(&format!("unsupported WAL format version {version}")));
            }
            let node_id = u64_at(12).ok_or_else(|| bad("short metadata"))?;
            let cluster_id = u64_at(20).ok_or_else(|| bad("short metadata"))?;
            let count = u32::from_le_bytes(payload[28..32].try_into().expect("4 bytes")) as usize;
            if payload.len() != 32 + 8 * count {
                return Err(bad("metadata voter count does not match its length"));
            }
            let initial_voters = (0..count)
                .map(|i| u64_at(32 + 8 * i).unwrap_or_default())
                .collect();
            Record::Metadata(Metadata {
                node_id,
                cluster_id,
                initial_voters,
            })
        }
        RecordType::Entry => {
            let e = Entry::parse_from_bytes(payload).map_err(|e| bad(&e.to_string()))?;
            Record::Entry(e)
        }
        RecordType::HardState => {
            if payload.len() != 24 {
                return Err(bad("hard state payload is not 24 bytes"));
            }
            let hs = HardState {
                term: u64_at(0).unwrap_or_default(),
                vote: u64_at(8).unwrap_or_default(),
                commit: u64_at(16).unwrap_or_default(),
                ..Default::default()
            };
            Record::HardState(hs)
        }
        RecordType::Snapshot => {
            if payload.len() != 16 {
                return Err(bad("snapshot marker payload is not 16 bytes"));
            }
            Record::Snapshot(SnapshotMarker {
                term: u64_at(0).unwrap_or_default(),
                index: u64_at(8).unwrap_or_default(),
            })
        }
    };
    Ok((record, record_len))
}
