//! DNS messages (RFC 1035 §4.1) as far as SRV bootstrap needs them: a
//! query, and the A, AAAA, SRV, CNAME and OPT (RFC 6891) records of an
//! answer. Other records are carried as opaque bytes.
//!
//! # Decoding what the network sends
//!
//! Nothing read is trusted: a count only says how many records to try to
//! read (each takes at least [`MIN_RECORD_BYTES`], so the bytes bound it),
//! every length is checked against what is left, a name is at most
//! [`MAX_NAME_BYTES`] long and follows at most [`MAX_POINTERS`] compression
//! pointers (so a loop of pointers ends), and nothing is allocated ahead by
//! a length read. A malformed message is an error, never a panic.
//!
//! Like Go's `dnsmessage` parser, which etcd's resolver uses, the header and
//! the question are read first (a response that fails them is not an
//! answer to the query), then the answers (which must all be sound), and
//! the authority and additional sections only as far as they are sound.
//!
//! Names are kept in presentation form, rooted (`m1.example.com.`, the root
//! `.`), with a label's bytes as they came (a non-ASCII byte becomes U+FFFD,
//! which no valid host name holds; a label holding a dot is refused, as it
//! could not be told apart from two labels).
//!
//! Encoding writes names uncompressed.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
pub const TYPE_SRV: u16 = 33;
pub const TYPE_OPT: u16 = 41;
pub const CLASS_INET: u16 = 1;

pub const RCODE_SUCCESS: u16 = 0;
pub const RCODE_SERVER_FAILURE: u16 = 2;
pub const RCODE_NAME_ERROR: u16 = 3;

/// A name's longest wire form (RFC 1035 §2.3.4), length octets included.
pub const MAX_NAME_BYTES: usize = 255;
/// A label's longest (RFC 1035 §2.3.4).
pub const MAX_LABEL_BYTES: usize = 63;
/// Compression pointers followed within one name (Go's dnsmessage stops at
/// 10 too): a pointer loop ends there.
pub const MAX_POINTERS: usize = 10;
/// The fixed part of a message.
pub const HEADER_BYTES: usize = 12;
/// The least a resource record takes: a root name (1), type, class, TTL,
/// data length (10).
pub const MIN_RECORD_BYTES: usize = 11;

/// Why bytes are not a DNS message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The message ends inside a field.
    Truncated,
    /// A name: too long, a label too long or holding a dot, a reserved
    /// label type, too many pointers.
    BadName,
    /// A record's data does not have its type's length or shape.
    BadData,
    /// A name or a section too large to encode.
    TooLarge,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireError::Truncated => "message truncated",
            WireError::BadName => "malformed name",
            WireError::BadData => "malformed record data",
            WireError::TooLarge => "too large to encode",
        })
    }
}

impl std::error::Error for WireError {}

/// RFC 1035 §4.1.1 (the rcode is the header's 4 bits; see
/// [`Message::extended_rcode`] for EDNS's upper bits).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub id: u16,
    pub response: bool,
    pub opcode: u8,
    pub authoritative: bool,
    pub truncated: bool,
    pub recursion_desired: bool,
    pub recursion_available: bool,
    pub rcode: u16,
}

impl Header {
    fn flags(&self) -> u16 {
        let mut bits = (u16::from(self.opcode & 0xf) << 11) | (self.rcode & 0xf);
        for (set, bit) in [
            (self.response, 1 << 15),
            (self.authoritative, 1 << 10),
            (self.truncated, 1 << 9),
            (self.recursion_desired, 1 << 8),
            (self.recursion_available, 1 << 7),
        ] {
            if set {
                bits |= bit;
            }
        }
        bits
    }

    fn from_flags(id: u16, bits: u16) -> Header {
        Header {
            id,
            response: bits & (1 << 15) != 0,
            opcode: ((bits >> 11) & 0xf) as u8,
            authoritative: bits & (1 << 10) != 0,
            truncated: bits & (1 << 9) != 0,
            recursion_desired: bits & (1 << 8) != 0,
            recursion_available: bits & (1 << 7) != 0,
            rcode: bits & 0xf,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    /// Rooted presentation form.
    pub name: String,
    pub qtype: u16,
    pub class: u16,
}

/// An SRV record's data (RFC 2782).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrvData {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// Rooted presentation form.
    pub target: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RData {
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    Srv(SrvData),
    Cname(String),
    /// Any other type, OPT included: its bytes.
    Other(Vec<u8>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Rooted presentation form.
    pub name: String,
    pub rtype: u16,
    /// For OPT, the sender's UDP payload size.
    pub class: u16,
    /// For OPT, the extended rcode, version and flags.
    pub ttl: u32,
    pub data: RData,
}

impl Record {
    /// EDNS0's OPT pseudo-record advertising `udp_size` (RFC 6891 §6.1.2).
    pub fn opt(udp_size: u16) -> Record {
        Record {
            name: ".".into(),
            rtype: TYPE_OPT,
            class: udp_size,
            ttl: 0,
            data: RData::Other(Vec::new()),
        }
    }
}

/// A message whose header and question are sound; `answers` says whether
/// the answer section is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub header: Header,
    pub questions: Vec<Question>,
    pub answers: Vec<Record>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
}

/// What [`parse`] read: the header and questions, the answer section or
/// why it is unsound, and the sound prefix of the other two sections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub header: Header,
    pub questions: Vec<Question>,
    pub answers: Result<Vec<Record>, WireError>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
}

impl Parsed {
    /// The rcode with an OPT record's upper 8 bits (RFC 6891 §6.1.3), and
    /// whether the additional section held any record (Go's
    /// `extractExtendedRCode`).
    pub fn extended_rcode(&self) -> (u16, bool) {
        let rcode = self.header.rcode;
        let opt = self.additionals.iter().find(|r| r.rtype == TYPE_OPT);
        let rcode = opt.map_or(rcode, |opt| ((opt.ttl >> 24) as u16) << 4 | rcode);
        (rcode, !self.additionals.is_empty())
    }
}

impl Message {
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(512);
        put_u16(&mut out, self.header.id);
        put_u16(&mut out, self.header.flags());
        for count in [
            self.questions.len(),
            self.answers.len(),
            self.authorities.len(),
            self.additionals.len(),
        ] {
            put_u16(
                &mut out,
                u16::try_from(count).map_err(|_| WireError::TooLarge)?,
            );
        }
        for q in &self.questions {
            put_name(&mut out, &q.name)?;
            put_u16(&mut out, q.qtype);
            put_u16(&mut out, q.class);
        }
        for record in self
            .answers
            .iter()
            .chain(&self.authorities)
            .chain(&self.additionals)
        {
            put_record(&mut out, record)?;
        }
        if out.len() > usize::from(u16::MAX) {
            return Err(WireError::TooLarge);
        }
        Ok(out)
    }

    /// The whole message, every section sound.
    pub fn decode(bytes: &[u8]) -> Result<Message, WireError> {
        let (parsed, rest) = read_sections(bytes)?;
        let answers = parsed.answers?;
        rest?;
        Ok(Message {
            header: parsed.header,
            questions: parsed.questions,
            answers,
            authorities: parsed.authorities,
            additionals: parsed.additionals,
        })
    }
}

/// Reads a message as Go's resolver does: an error only when the header or
/// a question is unsound.
pub fn parse(bytes: &[u8]) -> Result<Parsed, WireError> {
    read_sections(bytes).map(|(parsed, _)| parsed)
}

/// The sections, and whether the authority and additional sections were
/// sound to their end.
fn read_sections(bytes: &[u8]) -> Result<(Parsed, Result<(), WireError>), WireError> {
    let mut reader = Reader::new(bytes);
    let id = reader.u16()?;
    let header = Header::from_flags(id, reader.u16()?);
    let mut counts = [0usize; 4];
    for count in &mut counts {
        *count = usize::from(reader.u16()?);
    }
    let mut questions = Vec::new();
    for _ in 0..counts[0] {
        let name = reader.name()?;
        let qtype = reader.u16()?;
        let class = reader.u16()?;
        questions.push(Question { name, qtype, class });
    }
    let answers = reader.records(counts[1]);
    let mut authorities = Vec::new();
    let mut additionals = Vec::new();
    let rest = match &answers {
        Err(e) => Err(e.clone()),
        Ok(_) => reader
            .sound_records(counts[2], &mut authorities)
            .and_then(|()| reader.sound_records(counts[3], &mut additionals)),
    };
    let parsed = Parsed {
        header,
        questions,
        answers,
        authorities,
        additionals,
    };
    Ok((parsed, rest))
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated)?;
        let slice = self.bytes.get(self.pos..end).ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(slice)
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A name at the current position (following pointers anywhere in the
    /// message); the position moves past its bytes here.
    fn name(&mut self) -> Result<String, WireError> {
        let (name, end) = read_name(self.bytes, self.pos)?;
        self.pos = end;
        Ok(name)
    }

    fn records(&mut self, count: usize) -> Result<Vec<Record>, WireError> {
        // a count is only a promise: the bytes left bound what is reserved
        let room = self.bytes.len().saturating_sub(self.pos) / MIN_RECORD_BYTES;
        let mut records = Vec::with_capacity(count.min(room));
        for _ in 0..count {
            records.push(self.record()?);
        }
        Ok(records)
    }

    /// Records into `records` up to the first unsound one, which is the
    /// error.
    fn sound_records(&mut self, count: usize, records: &mut Vec<Record>) -> Result<(), WireError> {
        for _ in 0..count {
            records.push(self.record()?);
        }
        Ok(())
    }

    fn record(&mut self) -> Result<Record, WireError> {
        let name = self.name()?;
        let rtype = self.u16()?;
        let class = self.u16()?;
        let ttl = self.u32()?;
        let length = usize::from(self.u16()?);
        let start = self.pos;
        let data = self.take(length)?;
        let data = match rtype {
            TYPE_A => RData::A(Ipv4Addr::from(
                <[u8; 4]>::try_from(data).map_err(|_| WireError::BadData)?,
            )),
            TYPE_AAAA => RData::Aaaa(Ipv6Addr::from(
                <[u8; 16]>::try_from(data).map_err(|_| WireError::BadData)?,
            )),
            TYPE_SRV => {
                if data.len() < 7 {
                    return Err(WireError::BadData);
                }
                let field = |i: usize| u16::from_be_bytes([data[i], data[i + 1]]);
                let (target, end) = read_name(self.bytes, start + 6)?;
                if end != self.pos {
                    return Err(WireError::BadData);
                }
                RData::Srv(SrvData {
                    priority: field(0),
                    weight: field(2),
                    port: field(4),
                    target,
                })
            }
            TYPE_CNAME => {
                let (target, end) = read_name(self.bytes, start)?;
                if end != self.pos {
                    return Err(WireError::BadData);
                }
                RData::Cname(target)
            }
            _ => RData::Other(data.to_vec()),
        };
        Ok(Record {
            name,
            rtype,
            class,
            ttl,
            data,
        })
    }
}

/// The name at `start` and the offset just past it where it is stored
/// (past its first pointer, if it has one).
fn read_name(bytes: &[u8], start: usize) -> Result<(String, usize), WireError> {
    let mut name = String::new();
    let mut wire_len = 1; // the root's length octet
    let mut pos = start;
    let mut end = None;
    let mut pointers = 0;
    loop {
        let length = *bytes.get(pos).ok_or(WireError::Truncated)?;
        match length & 0xc0 {
            0x00 if length == 0 => {
                let end = end.unwrap_or(pos + 1);
                if name.is_empty() {
                    name.push('.');
                }
                return Ok((name, end));
            }
            0x00 => {
                let length = usize::from(length);
                let label = bytes
                    .get(pos + 1..pos + 1 + length)
                    .ok_or(WireError::Truncated)?;
                wire_len += 1 + length;
                if wire_len > MAX_NAME_BYTES || label.contains(&b'.') {
                    return Err(WireError::BadName);
                }
                name.push_str(&String::from_utf8_lossy(label));
                name.push('.');
                pos += 1 + length;
            }
            0xc0 => {
                let low = *bytes.get(pos + 1).ok_or(WireError::Truncated)?;
                pointers += 1;
                if pointers > MAX_POINTERS {
                    return Err(WireError::BadName);
                }
                if end.is_none() {
                    end = Some(pos + 2);
                }
                pos = usize::from(u16::from_be_bytes([length & 0x3f, low]));
            }
            // 0x40 and 0x80: extended and reserved label types
            _ => return Err(WireError::BadName),
        }
    }
}

fn put_u16(out: &mut Vec<u8>, value: u16) {
    out.extend_from_slice(&value.to_be_bytes());
}

/// A presentation-form name, rooted or not, as labels.
pub fn put_name(out: &mut Vec<u8>, name: &str) -> Result<(), WireError> {
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    let mut wire_len = 1;
    if !trimmed.is_empty() {
        for label in trimmed.split('.') {
            if label.is_empty() || label.len() > MAX_LABEL_BYTES {
                return Err(WireError::BadName);
            }
            wire_len += 1 + label.len();
            if wire_len > MAX_NAME_BYTES {
                return Err(WireError::BadName);
            }
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
    }
    out.push(0);
    Ok(())
}

fn put_record(out: &mut Vec<u8>, record: &Record) -> Result<(), WireError> {
    put_name(out, &record.name)?;
    put_u16(out, record.rtype);
    put_u16(out, record.class);
    out.extend_from_slice(&record.ttl.to_be_bytes());
    let length_at = out.len();
    put_u16(out, 0);
    match &record.data {
        RData::A(ip) => out.extend_from_slice(&ip.octets()),
        RData::Aaaa(ip) => out.extend_from_slice(&ip.octets()),
        RData::Srv(srv) => {
            put_u16(out, srv.priority);
            put_u16(out, srv.weight);
            put_u16(out, srv.port);
            put_name(out, &srv.target)?;
        }
        RData::Cname(target) => put_name(out, target)?,
        RData::Other(bytes) => out.extend_from_slice(bytes),
    }
    let length = u16::try_from(out.len() - length_at - 2).map_err(|_| WireError::TooLarge)?;
    out[length_at..length_at + 2].copy_from_slice(&length.to_be_bytes());
    Ok(())
}

/// Whether two presentation-form names are the same, ASCII case aside
/// (Go's `equalASCIIName`).
pub fn same_name(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn srv_answer() -> Message {
        Message {
            header: Header {
                id: 0xbeef,
                response: true,
                authoritative: true,
                recursion_desired: true,
                ..Header::default()
            },
            questions: vec![Question {
                name: "_etcd-server._tcp.example.com.".into(),
                qtype: TYPE_SRV,
                class: CLASS_INET,
            }],
            answers: vec![Record {
                name: "_etcd-server._tcp.example.com.".into(),
                rtype: TYPE_SRV,
                class: CLASS_INET,
                ttl: 60,
                data: RData::Srv(SrvData {
                    priority: 1,
                    weight: 2,
                    port: 2380,
                    target: "m1.example.com.".into(),
                }),
            }],
            authorities: Vec::new(),
            additionals: vec![Record::opt(1232)],
        }
    }

    #[test]
    fn a_message_round_trips() {
        let message = srv_answer();
        let bytes = message.encode().unwrap();
        assert_eq!(Message::decode(&bytes).unwrap(), message);
        let parsed = parse(&bytes).unwrap();
        assert_eq!(parsed.extended_rcode(), (RCODE_SUCCESS, true));
    }

    #[test]
    fn compressed_names_are_followed_and_pointer_loops_refused() {
        // header, question "a.b." at 12, an A answer whose name points there
        let mut bytes = vec![0, 1, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0];
        bytes.extend_from_slice(&[1, b'a', 1, b'b', 0, 0, 1, 0, 1]);
        bytes.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 0, 0, 1]);
        let message = Message::decode(&bytes).unwrap();
        assert_eq!(message.answers[0].name, "a.b.");
        assert_eq!(
            message.answers[0].data,
            RData::A(Ipv4Addr::new(10, 0, 0, 1))
        );
        // the answer's name points at itself
        let at = 21;
        bytes[at] = 0xc0;
        bytes[at + 1] = at as u8;
        assert_eq!(parse(&bytes).unwrap().answers, Err(WireError::BadName));
    }

    #[test]
    fn lengths_are_checked_not_trusted() {
        let bytes = srv_answer().encode().unwrap();
        for cut in 0..bytes.len() {
            let _ = parse(&bytes[..cut]);
            assert!(Message::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // 65535 answers promised, none there
        let mut bytes = bytes;
        bytes[6] = 0xff;
        bytes[7] = 0xff;
        assert!(parse(&bytes).unwrap().answers.is_err());
    }

    #[test]
    fn names_too_long_or_with_dotted_labels_are_refused() {
        let long = format!("{}.", vec!["a".repeat(63); 4].join("."));
        assert_eq!(put_name(&mut Vec::new(), &long), Err(WireError::BadName));
        assert_eq!(
            put_name(&mut Vec::new(), &"a".repeat(64)),
            Err(WireError::BadName)
        );
        assert_eq!(put_name(&mut Vec::new(), "a..b"), Err(WireError::BadName));
        let mut root = Vec::new();
        put_name(&mut root, ".").unwrap();
        assert_eq!(root, [0]);
        let mut bytes = vec![0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        bytes.extend_from_slice(&[3, b'a', b'.', b'b', 0, 0, 1, 0, 1]);
        assert_eq!(parse(&bytes), Err(WireError::BadName));
    }
}
