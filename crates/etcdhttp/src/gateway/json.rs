//! The protobuf ↔ JSON mapping grpc-gateway v1 uses in etcd (jsonpb with
//! OrigName=true, EmitDefaults=false): fields in proto order under their
//! .proto names, zero values left out, 64-bit integers as strings, bytes
//! as standard base64, enums by name. Requests may also name fields in
//! lowerCamelCase and give integers as numbers and enums as numbers, as
//! jsonpb accepts.

use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use base64::Engine;
use serde_json::{Map, Value};
use tonic::Status;

/// The deepest JSON a unary request may nest: a txn level is three (the
/// txn object, its `success` array, the op object), so this admits txns as
/// deep as the gRPC decoder does (`api::codec::MAX_TXN_DEPTH`), where
/// serde_json's default limit (128) stopped at 42 levels. Past it the body
/// is refused before it is parsed, which bounds the parser's recursion.
pub(crate) const MAX_DEPTH: usize = 3 * api::codec::MAX_TXN_DEPTH + 8;

/// How deeply `body` nests objects and arrays (strings skipped; a body that
/// is not JSON is measured all the same and refused later by the parser).
pub(crate) fn nesting_depth(body: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The fields of one JSON object of a request; `null` has none.
pub(crate) struct Fields<'a> {
    map: Option<&'a Map<String, Value>>,
}

pub(crate) fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

impl<'a> Fields<'a> {
    pub(crate) fn of(value: &'a Value) -> Result<Fields<'a>, Status> {
        match value {
            Value::Object(map) => Ok(Fields { map: Some(map) }),
            Value::Null => Ok(Fields { map: None }),
            other => Err(unmarshal(other, "map[string]json.RawMessage")),
        }
    }

    /// A field under its .proto name or its JSON name (`range_end`,
    /// `rangeEnd`), as jsonpb accepts either; `null` is absent.
    pub(crate) fn get(&self, name: &str, json_name: &str) -> Option<&'a Value> {
        let map = self.map?;
        let value = map.get(name).or_else(|| map.get(json_name))?;
        (!value.is_null()).then_some(value)
    }
}

/// Go's words for a JSON value of the wrong kind.
pub(crate) fn unmarshal(value: &Value, go_type: &str) -> Status {
    invalid(format!(
        "json: cannot unmarshal {} into Go value of type {go_type}",
        json_kind(value)
    ))
}

/// A signed integer field: a JSON number or a string holding one.
pub(crate) fn int(name: &str, value: &Value, go_type: &str) -> Result<i64, Status> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
            .ok_or_else(|| invalid(format!("bad value for field {name}: {n}"))),
        Value::String(s) => s
            .parse()
            .map_err(|_| invalid(format!("bad value for field {name}: {s:?}"))),
        other => Err(unmarshal(other, go_type)),
    }
}

/// An unsigned integer field: a JSON number or a string holding one.
pub(crate) fn uint(name: &str, value: &Value, go_type: &str) -> Result<u64, Status> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| invalid(format!("bad value for field {name}: {n}"))),
        Value::String(s) => s
            .parse()
            .map_err(|_| invalid(format!("bad value for field {name}: {s:?}"))),
        other => Err(unmarshal(other, go_type)),
    }
}

pub(crate) fn boolean(value: &Value) -> Result<bool, Status> {
    match value {
        Value::Bool(b) => Ok(*b),
        other => Err(unmarshal(other, "bool")),
    }
}

pub(crate) fn string(value: &Value) -> Result<String, Status> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => Err(unmarshal(other, "string")),
    }
}

/// A bytes field: standard base64 (URL-safe accepted, as Go's decoder).
pub(crate) fn bytes(value: &Value) -> Result<Vec<u8>, Status> {
    match value {
        Value::String(s) => decode_base64(s),
        other => Err(unmarshal(other, "[]uint8")),
    }
}

pub(crate) fn list(value: &Value) -> Result<&[Value], Status> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(unmarshal(other, "[]json.RawMessage")),
    }
}

/// A JSON syntax error in the words of Go's encoding/json, which is what
/// grpc-gateway answers ("invalid character 'x' looking for beginning of
/// value", "unexpected EOF"); serde_json's own words for the rarer ones.
pub fn syntax_error(input: &[u8], error: &serde_json::Error) -> String {
    if error.classify() == serde_json::error::Category::Eof {
        return "unexpected EOF".to_string();
    }
    let text = error.to_string();
    let context = [
        ("expected value", "looking for beginning of value"),
        ("expected `:`", "after object key"),
        ("expected `,` or `}`", "after object key:value pair"),
        ("expected `,` or `]`", "after array element"),
        (
            "key must be a string",
            "looking for beginning of object key string",
        ),
    ];
    let Some(offending) = char_at(input, error.line(), error.column()) else {
        return text;
    };
    let go = if text.starts_with("trailing comma") {
        // `[1,]` and `{"a":1,}`: Go expected another element.
        Some(if offending == '}' {
            "looking for beginning of object key string"
        } else {
            "looking for beginning of value"
        })
    } else {
        context
            .iter()
            .find(|(serde, _)| text.starts_with(serde))
            .map(|(_, go)| *go)
    };
    match go {
        Some(go) => format!("invalid character {offending:?} {go}"),
        None => text,
    }
}

/// The character at serde_json's (1-based) line and column (a byte
/// column): the byte there, as Go's encoding/json names it (`quoteChar`:
/// the byte as a character, so the first byte of a multi-byte one),
/// which does not depend on whether the rest of it has arrived yet.
fn char_at(input: &[u8], line: usize, column: usize) -> Option<char> {
    let line = input.split(|b| *b == b'\n').nth(line.checked_sub(1)?)?;
    line.get(column.checked_sub(1)?)
        .map(|byte| char::from(*byte))
}

fn decode_base64(text: &str) -> Result<Vec<u8>, Status> {
    STANDARD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .map_err(|e| invalid(format!("illegal base64 data: {e}")))
}

/// A JSON string, escaped as serde_json escapes it.
pub(crate) fn push_string(out: &mut String, text: &str) {
    match serde_json::to_string(text) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nesting_depth_counts_objects_and_arrays_outside_strings() {
        use super::nesting_depth;
        assert_eq!(nesting_depth(b"{}"), 1);
        assert_eq!(nesting_depth(br#"{"a":[{"b":"[[[{{"}]}"#), 3);
        assert_eq!(nesting_depth(br#"{"a":"\"[[[["}"#), 1);
        assert_eq!(nesting_depth(b"not json"), 0);
        let deep = "[".repeat(10_000);
        assert_eq!(nesting_depth(deep.as_bytes()), 10_000);
    }

    use super::*;

    #[test]
    fn syntax_errors_are_worded_as_go_words_them() {
        let go = |input: &str| {
            let error = serde_json::from_str::<Value>(input).unwrap_err();
            syntax_error(input.as_bytes(), &error)
        };
        assert_eq!(
            go("xx"),
            "invalid character 'x' looking for beginning of value"
        );
        assert_eq!(
            go("[1,]"),
            "invalid character ']' looking for beginning of value"
        );
        assert_eq!(go("{\"key\" 1}"), "invalid character '1' after object key");
        assert_eq!(go("{\"key\":"), "unexpected EOF");
        assert_eq!(
            go("'"),
            r"invalid character '\'' looking for beginning of value"
        );
        assert_eq!(
            go("{\"a\":1\n x}"),
            "invalid character 'x' after object key:value pair"
        );
    }

    #[test]
    fn fields_are_found_under_either_name_and_null_is_absent() {
        let value: Value =
            serde_json::from_str(r#"{"range_end":"AA==","countOnly":true,"limit":null}"#).unwrap();
        let fields = Fields::of(&value).unwrap();
        assert_eq!(
            bytes(fields.get("range_end", "rangeEnd").unwrap()).unwrap(),
            vec![0]
        );
        assert!(boolean(fields.get("count_only", "countOnly").unwrap()).unwrap());
        assert!(fields.get("limit", "limit").is_none());
        assert_eq!(
            Fields::of(&Value::Bool(true)).err().unwrap().message(),
            "json: cannot unmarshal bool into Go value of type map[string]json.RawMessage"
        );
    }

    #[test]
    fn integers_are_numbers_or_strings() {
        let int64 = |text: &str| int("limit", &serde_json::from_str(text).unwrap(), "int64");
        assert_eq!(int64("3").unwrap(), 3);
        assert_eq!(int64("\"-3\"").unwrap(), -3);
        assert_eq!(int64("3.0").unwrap(), 3);
        assert_eq!(
            int64("\"x\"").unwrap_err().message(),
            r#"bad value for field limit: "x""#
        );
        assert_eq!(
            int64("true").unwrap_err().message(),
            "json: cannot unmarshal bool into Go value of type int64"
        );
        let value = serde_json::json!(-1);
        assert!(uint("ID", &value, "uint64").is_err());
    }
}
