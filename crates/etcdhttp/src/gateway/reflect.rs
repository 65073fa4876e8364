//! The JSON form of every message the gateway carries, derived from the
//! messages' descriptors (`api::FILE_DESCRIPTOR_SET`, which the protox build
//! already compiles) instead of code per message: what grpc-gateway v1 prints
//! in etcd (jsonpb with OrigName=true, EmitDefaults=false).
//!
//! * Responses ([`ToJson`]): the message's wire encoding walked field by
//!   field with its descriptor: fields in field-number order (which is
//!   etcd's declaration order, so Go's struct order; a test holds every
//!   message to it) under their .proto names (`dbSize`, `peerURLs` and `ID`
//!   are the names in etcd's rpc.proto), zero values left out (a set oneof
//!   member or message is printed even when empty), 64-bit integers as
//!   strings, 32-bit ones as numbers, bytes as standard base64, enums by
//!   name. It reads the wire form rather than a `prost_reflect::DynamicMessage`
//!   because prost decodes at most 100 levels and a txn response may nest
//!   128 (etcd's op budget); the walk has no depth limit of its own.
//! * Requests ([`FromJson`]): the JSON object walked with the descriptor
//!   into a `DynamicMessage`, fields under their .proto or JSON names,
//!   integers as numbers or strings, enums by name or number, the first
//!   member of a oneof that is present; unknown fields ignored (etcd's
//!   gateway allows them). The message is then decoded as the gRPC services
//!   decode it ([`api::codec::decode_request`]: a TxnRequest as deep as the
//!   gRPC decoder takes). Bad values are refused in Go's words
//!   ([`super::json`]).

use std::sync::LazyLock;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::{Buf, Bytes};
use prost::encoding::{decode_key, decode_varint, WireType};
use prost::{Message, Name};
use prost_reflect::{
    DescriptorPool, DynamicMessage, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor,
    Value as Field,
};
use serde_json::Value;
use tonic::Status;

use super::json::{self, invalid, push_string, unmarshal, Fields};

/// The descriptors of etcd's API, decoded once.
static POOL: LazyLock<Result<DescriptorPool, String>> =
    LazyLock::new(|| DescriptorPool::decode(api::FILE_DESCRIPTOR_SET).map_err(|e| e.to_string()));

/// The descriptor of `T`.
fn descriptor<T: Name>() -> Result<MessageDescriptor, Status> {
    let pool = POOL.as_ref().map_err(|e| Status::internal(e.clone()))?;
    pool.get_message_by_name(&T::full_name())
        .ok_or_else(|| Status::internal(format!("no descriptor for {}", T::full_name())))
}

/// Turns a JSON request body into a request message.
pub(crate) trait FromJson: Sized {
    /// Without a size limit (the tests' way in).
    #[cfg(test)]
    fn from_json(value: &Value) -> Result<Self, Status> {
        Self::from_json_within(value, usize::MAX)
    }

    /// [`FromJson::from_json`], refusing a message that takes more than
    /// `max_bytes` on the wire as grpc-go refuses what etcd's gateway
    /// sends it over its loopback gRPC connection.
    fn from_json_within(value: &Value, max_bytes: usize) -> Result<Self, Status>;
}

impl<T: Message + Name + Default + 'static> FromJson for T {
    fn from_json_within(value: &Value, max_bytes: usize) -> Result<T, Status> {
        let message = read_message(&descriptor::<T>()?, value)?.encode_to_vec();
        if message.len() > max_bytes {
            return Err(too_large(message.len(), max_bytes));
        }
        api::codec::decode_request(Bytes::from(message))
    }
}

/// grpc-go's refusal of a message above its receive limit.
pub(crate) fn too_large(size: usize, max_bytes: usize) -> Status {
    Status::resource_exhausted(format!(
        "grpc: received message larger than max ({size} vs. {max_bytes})"
    ))
}

/// Writes a response message as JSON.
pub(crate) trait ToJson {
    fn to_json(&self, out: &mut String);
}

impl<T: Message + Name> ToJson for T {
    fn to_json(&self, out: &mut String) {
        match descriptor::<T>() {
            Ok(desc) => write_message(out, &desc, &self.encode_to_vec()),
            // Not reachable for the API's messages (a test walks them all).
            Err(_) => out.push_str("{}"),
        }
    }
}

pub(crate) fn to_json_string<T: ToJson>(message: &T) -> String {
    let mut out = String::with_capacity(256);
    message.to_json(&mut out);
    out
}

// ---- requests ----

fn read_message(desc: &MessageDescriptor, value: &Value) -> Result<DynamicMessage, Status> {
    let fields = Fields::of(value)?;
    let mut message = DynamicMessage::new(desc.clone());
    let mut oneofs_set = Vec::new();
    for field in desc.fields() {
        let Some(value) = fields.get(field.name(), field.json_name()) else {
            continue;
        };
        let oneof = field.containing_oneof().map(|o| o.name().to_string());
        if let Some(oneof) = &oneof {
            if oneofs_set.contains(oneof) {
                continue;
            }
        }
        let read = if field.is_list() {
            let items = json::list(value)?
                .iter()
                .map(|item| read_value(&field, item))
                .collect::<Result<Vec<_>, _>>()?;
            Field::List(items)
        } else if field.is_map() {
            // etcd's requests have no map fields
            continue;
        } else {
            read_value(&field, value)?
        };
        message.set_field(&field, read);
        oneofs_set.extend(oneof);
    }
    Ok(message)
}

/// One value of `field` (an element, for a repeated field).
fn read_value(field: &FieldDescriptor, value: &Value) -> Result<Field, Status> {
    let name = field.name();
    let small = |n: i64| {
        i32::try_from(n).map_err(|_| invalid(format!("bad value for field {name}: {value}")))
    };
    Ok(match field.kind() {
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Field::I64(json::int(name, value, "int64")?),
        Kind::Uint64 | Kind::Fixed64 => Field::U64(json::uint(name, value, "uint64")?),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            Field::I32(small(json::int(name, value, "int32")?)?)
        }
        Kind::Uint32 | Kind::Fixed32 => {
            let n = json::uint(name, value, "uint32")?;
            Field::U32(
                u32::try_from(n)
                    .map_err(|_| invalid(format!("bad value for field {name}: {value}")))?,
            )
        }
        Kind::Bool => Field::Bool(json::boolean(value)?),
        Kind::String => Field::String(json::string(value)?),
        Kind::Bytes => Field::Bytes(json::bytes(value)?.into()),
        Kind::Enum(kind) => Field::EnumNumber(read_enum(&kind, value)?),
        Kind::Message(desc) => Field::Message(read_message(&desc, value)?),
        // (no etcd request has one; each kind gets its own value type, as
        // DynamicMessage::set_field requires)
        Kind::Double => match value {
            Value::Number(n) => Field::F64(n.as_f64().unwrap_or_default()),
            other => return Err(unmarshal(other, "float64")),
        },
        Kind::Float => match value {
            Value::Number(n) => Field::F32(n.as_f64().unwrap_or_default() as f32),
            other => return Err(unmarshal(other, "float32")),
        },
    })
}

/// An enum by name or by number, as jsonpb reads one.
fn read_enum(kind: &EnumDescriptor, value: &Value) -> Result<i32, Status> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| invalid(format!("bad value for enum {}: {n}", kind.full_name()))),
        Value::String(s) => kind
            .get_value_by_name(s)
            .map(|v| v.number())
            .ok_or_else(|| {
                // jsonpb quotes the JSON text of the value: "\"BOGUS\"".
                let text = serde_json::to_string(s).unwrap_or_default();
                invalid(format!(
                    "unknown value {text:?} for enum {}",
                    kind.full_name()
                ))
            }),
        other => Err(unmarshal(other, "protoreflect.EnumNumber")),
    }
}

// ---- responses ----

/// One field occurrence on the wire.
#[derive(Clone, Copy)]
enum Raw<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Len(&'a [u8]),
}

/// The field occurrences of one encoded message, by field number (stable:
/// repeated elements keep their order). Stops at anything malformed, which
/// a message prost just encoded never is.
fn scan(mut buf: &[u8]) -> Vec<(u32, Raw<'_>)> {
    let mut raws = Vec::new();
    while buf.has_remaining() {
        let Ok((number, wire_type)) = decode_key(&mut buf) else {
            break;
        };
        let raw = match wire_type {
            WireType::Varint => match decode_varint(&mut buf) {
                Ok(v) => Raw::Varint(v),
                Err(_) => break,
            },
            WireType::SixtyFourBit if buf.remaining() >= 8 => Raw::Fixed64(buf.get_u64_le()),
            WireType::ThirtyTwoBit if buf.remaining() >= 4 => Raw::Fixed32(buf.get_u32_le()),
            WireType::LengthDelimited => {
                let Ok(len) = decode_varint(&mut buf) else {
                    break;
                };
                let Some(len) = usize::try_from(len).ok().filter(|l| *l <= buf.len()) else {
                    break;
                };
                let (head, rest) = buf.split_at(len);
                buf = rest;
                Raw::Len(head)
            }
            _ => break,
        };
        raws.push((number, raw));
    }
    raws.sort_by_key(|(number, _)| *number);
    raws
}

fn write_message(out: &mut String, desc: &MessageDescriptor, encoded: &[u8]) {
    let raws = scan(encoded);
    out.push('{');
    let mut first = true;
    let mut rest = &raws[..];
    for field in desc.fields() {
        let start = rest.partition_point(|(n, _)| *n < field.number());
        let end = start + rest[start..].partition_point(|(n, _)| *n == field.number());
        let occurrences = &rest[start..end];
        rest = &rest[end..];
        let mut value = String::new();
        if field.is_list() {
            write_list(&mut value, &field, occurrences);
        } else if let Some((_, raw)) = occurrences.last() {
            // a oneof member or a message is printed once set, even if empty
            let always =
                field.containing_oneof().is_some() || matches!(field.kind(), Kind::Message(_));
            write_value(&mut value, &field.kind(), *raw, always);
        }
        if value.is_empty() {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        push_string(out, field.name());
        out.push(':');
        out.push_str(&value);
    }
    out.push('}');
}

/// A repeated field's elements (packed scalars unpacked), as a JSON array;
/// nothing when there are none.
fn write_list(out: &mut String, field: &FieldDescriptor, occurrences: &[(u32, Raw<'_>)]) {
    let kind = field.kind();
    let mut elements = Vec::new();
    for (_, raw) in occurrences {
        match (raw, packed_width(&kind)) {
            (Raw::Len(mut packed), Some(width)) => {
                while packed.has_remaining() {
                    let element = match width {
                        Width::Varint => decode_varint(&mut packed).ok().map(Raw::Varint),
                        Width::Eight if packed.remaining() >= 8 => {
                            Some(Raw::Fixed64(packed.get_u64_le()))
                        }
                        Width::Four if packed.remaining() >= 4 => {
                            Some(Raw::Fixed32(packed.get_u32_le()))
                        }
                        _ => None,
                    };
                    let Some(element) = element else { break };
                    elements.push(element);
                }
            }
            _ => elements.push(*raw),
        }
    }
    if elements.is_empty() {
        return;
    }
    out.push('[');
    for (i, element) in elements.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let before = out.len();
        write_value(out, &kind, element, true);
        if out.len() == before {
            out.push_str("null");
        }
    }
    out.push(']');
}

enum Width {
    Varint,
    Eight,
    Four,
}

/// How a packable scalar is laid out; None for what is never packed.
fn packed_width(kind: &Kind) -> Option<Width> {
    match kind {
        Kind::Int32
        | Kind::Int64
        | Kind::Uint32
        | Kind::Uint64
        | Kind::Sint32
        | Kind::Sint64
        | Kind::Bool
        | Kind::Enum(_) => Some(Width::Varint),
        Kind::Fixed64 | Kind::Sfixed64 | Kind::Double => Some(Width::Eight),
        Kind::Fixed32 | Kind::Sfixed32 | Kind::Float => Some(Width::Four),
        Kind::String | Kind::Bytes | Kind::Message(_) => None,
    }
}

/// One value; a zero value writes nothing unless `always`.
fn write_value(out: &mut String, kind: &Kind, raw: Raw<'_>, always: bool) {
    let zigzag = |v: u64| ((v >> 1) as i64) ^ -((v & 1) as i64);
    match (kind, raw) {
        (Kind::Message(desc), Raw::Len(encoded)) => write_message(out, desc, encoded),
        (Kind::String, Raw::Len(text)) if always || !text.is_empty() => {
            push_string(out, &String::from_utf8_lossy(text))
        }
        (Kind::Bytes, Raw::Len(data)) if always || !data.is_empty() => {
            out.push('"');
            out.push_str(&STANDARD.encode(data));
            out.push('"');
        }
        (Kind::Bool, Raw::Varint(v)) if always || v != 0 => {
            out.push_str(if v != 0 { "true" } else { "false" })
        }
        (Kind::Enum(desc), Raw::Varint(v)) if always || v != 0 => {
            let number = v as i32;
            match desc.get_value(number) {
                Some(value) => push_string(out, value.name()),
                None => out.push_str(&number.to_string()),
            }
        }
        // 64-bit integers as strings (JavaScript's numbers cannot hold them)
        (Kind::Int64, Raw::Varint(v)) if always || v != 0 => quoted(out, v as i64),
        (Kind::Uint64, Raw::Varint(v)) if always || v != 0 => quoted(out, v),
        (Kind::Sint64, Raw::Varint(v)) if always || v != 0 => quoted(out, zigzag(v)),
        (Kind::Fixed64, Raw::Fixed64(v)) if always || v != 0 => quoted(out, v),
        (Kind::Sfixed64, Raw::Fixed64(v)) if always || v != 0 => quoted(out, v as i64),
        (Kind::Int32, Raw::Varint(v)) if always || v != 0 => number(out, v as i32),
        (Kind::Uint32, Raw::Varint(v)) if always || v != 0 => number(out, v as u32),
        (Kind::Sint32, Raw::Varint(v)) if always || v != 0 => number(out, zigzag(v) as i32),
        (Kind::Fixed32, Raw::Fixed32(v)) if always || v != 0 => number(out, v),
        (Kind::Sfixed32, Raw::Fixed32(v)) if always || v != 0 => number(out, v as i32),
        (Kind::Double, Raw::Fixed64(v)) if always || v != 0 => float(out, f64::from_bits(v)),
        (Kind::Float, Raw::Fixed32(v)) if always || v != 0 => {
            float(out, f64::from(f32::from_bits(v)))
        }
        _ => {}
    }
}

fn quoted(out: &mut String, value: impl ToString) {
    out.push('"');
    out.push_str(&value.to_string());
    out.push('"');
}

fn number(out: &mut String, value: impl ToString) {
    out.push_str(&value.to_string());
}

fn float(out: &mut String, value: f64) {
    match serde_json::Number::from_f64(value) {
        Some(n) => out.push_str(&n.to_string()),
        None => push_string(out, &value.to_string()),
    }
}

#[cfg(test)]
mod tests;
