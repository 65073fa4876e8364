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

/// A protobuf enum: its full name (which jsonpb's errors give) and the
/// names of its values, by number.
pub(crate) struct EnumType {
    pub name: &'static str,
    pub values: &'static [&'static str],
}

/// Writes one JSON object, field by field, leaving zero values out.
pub(crate) struct Obj<'a> {
    out: &'a mut String,
    empty: bool,
}

impl<'a> Obj<'a> {
    pub fn new(out: &'a mut String) -> Obj<'a> {
        out.push('{');
        Obj { out, empty: true }
    }

    fn key(&mut self, name: &str) {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        self.out.push('"');
        self.out.push_str(name);
        self.out.push_str("\":");
    }

    pub(crate) fn end(self) {
        self.out.push('}');
    }

    pub(crate) fn int(&mut self, name: &str, value: impl Into<i128>) -> &mut Self {
        let value = value.into();
        if value != 0 {
            self.key(name);
            self.out.push('"');
            self.out.push_str(&value.to_string());
            self.out.push('"');
        }
        self
    }

    /// A 32-bit integer: a JSON number.
    pub(crate) fn int32(&mut self, name: &str, value: i64) -> &mut Self {
        if value != 0 {
            self.key(name);
            self.out.push_str(&value.to_string());
        }
        self
    }

    pub(crate) fn bool(&mut self, name: &str, value: bool) -> &mut Self {
        if value {
            self.key(name);
            self.out.push_str("true");
        }
        self
    }

    pub(crate) fn bytes(&mut self, name: &str, value: &[u8]) -> &mut Self {
        if !value.is_empty() {
            self.key(name);
            self.out.push('"');
            self.out.push_str(&STANDARD.encode(value));
            self.out.push('"');
        }
        self
    }

    pub(crate) fn str(&mut self, name: &str, value: &str) -> &mut Self {
        if !value.is_empty() {
            self.key(name);
            push_string(self.out, value);
        }
        self
    }

    /// An enum by name; the zero value is left out.
    pub(crate) fn enumeration(&mut self, name: &str, number: i32, kind: &EnumType) -> &mut Self {
        if number != 0 {
            self.key(name);
            match usize::try_from(number)
                .ok()
                .and_then(|i| kind.values.get(i))
            {
                Some(text) => push_string(self.out, text),
                None => self.out.push_str(&number.to_string()),
            }
        }
        self
    }

    pub(crate) fn bytes_list<B: AsRef<[u8]>>(&mut self, name: &str, values: &[B]) -> &mut Self {
        if !values.is_empty() {
            self.key(name);
            self.out.push('[');
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push('"');
                self.out.push_str(&STANDARD.encode(value.as_ref()));
                self.out.push('"');
            }
            self.out.push(']');
        }
        self
    }

    pub(crate) fn strings(&mut self, name: &str, values: &[String]) -> &mut Self {
        if !values.is_empty() {
            self.key(name);
            self.out.push('[');
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                push_string(self.out, value);
            }
            self.out.push(']');
        }
        self
    }

    /// A message field; None is left out.
    pub(crate) fn msg<T>(
        &mut self,
        name: &str,
        value: Option<&T>,
        write: fn(&mut String, &T),
    ) -> &mut Self {
        if let Some(value) = value {
            self.key(name);
            write(self.out, value);
        }
        self
    }

    pub(crate) fn msgs<T>(
        &mut self,
        name: &str,
        values: &[T],
        write: fn(&mut String, &T),
    ) -> &mut Self {
        if !values.is_empty() {
            self.key(name);
            self.out.push('[');
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                write(self.out, value);
            }
            self.out.push(']');
        }
        self
    }
}

fn push_string(out: &mut String, text: &str) {
    match serde_json::to_string(text) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

/// Reads fields of one JSON object of a request.
pub(crate) struct Fields<'a> {
    map: Option<&'a Map<String, Value>>,
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// `range_end` → `rangeEnd`: jsonpb accepts a field under either name.
fn camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

impl<'a> Fields<'a> {
    pub(crate) fn of(value: &'a Value) -> Result<Fields<'a>, Status> {
        match value {
            Value::Object(map) => Ok(Fields { map: Some(map) }),
            Value::Null => Ok(Fields { map: None }),
            other => Err(invalid(format!(
                "json: cannot unmarshal {} into Go value of type map[string]json.RawMessage",
                json_kind(other)
            ))),
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        let map = self.map?;
        let value = map.get(name).or_else(|| map.get(&camel_case(name)))?;
        (!value.is_null()).then_some(value)
    }

    pub(crate) fn int(&self, name: &str) -> Result<i64, Status> {
        match self.get(name) {
            None => Ok(0),
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
                .ok_or_else(|| invalid(format!("bad value for field {name}: {n}"))),
            Some(Value::String(s)) => s
                .parse()
                .map_err(|_| invalid(format!("bad value for field {name}: {s:?}"))),
            Some(other) => Err(invalid(format!(
                "json: cannot unmarshal {} into Go value of type int64",
                json_kind(other)
            ))),
        }
    }

    pub(crate) fn uint(&self, name: &str) -> Result<u64, Status> {
        match self.get(name) {
            None => Ok(0),
            Some(Value::Number(n)) => n
                .as_u64()
                .ok_or_else(|| invalid(format!("bad value for field {name}: {n}"))),
            Some(Value::String(s)) => s
                .parse()
                .map_err(|_| invalid(format!("bad value for field {name}: {s:?}"))),
            Some(other) => Err(invalid(format!(
                "json: cannot unmarshal {} into Go value of type uint64",
                json_kind(other)
            ))),
        }
    }

    pub(crate) fn bool(&self, name: &str) -> Result<bool, Status> {
        match self.get(name) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(invalid(format!(
                "json: cannot unmarshal {} into Go value of type bool",
                json_kind(other)
            ))),
        }
    }

    pub(crate) fn string(&self, name: &str) -> Result<String, Status> {
        match self.get(name) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(invalid(format!(
                "json: cannot unmarshal {} into Go value of type string",
                json_kind(other)
            ))),
        }
    }

    pub(crate) fn strings(&self, name: &str) -> Result<Vec<String>, Status> {
        self.list(name)?
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(invalid(format!(
                    "json: cannot unmarshal {} into Go value of type string",
                    json_kind(other)
                ))),
            })
            .collect()
    }

    pub(crate) fn bytes(&self, name: &str) -> Result<Vec<u8>, Status> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => decode_base64(s),
            Some(other) => Err(invalid(format!(
                "json: cannot unmarshal {} into Go value of type []uint8",
                json_kind(other)
            ))),
        }
    }

    pub(crate) fn enumeration(&self, name: &str, kind: &EnumType) -> Result<i32, Status> {
        match self.get(name) {
            None => Ok(0),
            Some(Value::Number(n)) => n
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| invalid(format!("bad value for enum {}: {n}", kind.name))),
            Some(Value::String(s)) => kind
                .values
                .iter()
                .position(|n| n == s)
                .map(|i| i as i32)
                .ok_or_else(|| {
                    // jsonpb quotes the JSON text of the value: "\"BOGUS\"".
                    let text = serde_json::to_string(s).unwrap_or_default();
                    invalid(format!("unknown value {text:?} for enum {}", kind.name))
                }),
            Some(other) => Err(invalid(format!(
                "json: cannot unmarshal {} into Go value of type protoreflect.EnumNumber",
                json_kind(other)
            ))),
        }
    }

    pub(crate) fn list(&self, name: &str) -> Result<&'a [Value], Status> {
        match self.get(name) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(invalid(format!(
                "json: cannot unmarshal {} into Go value of type []json.RawMessage",
                json_kind(other)
            ))),
        }
    }

    pub(crate) fn msg(&self, name: &str) -> Option<&'a Value> {
        self.get(name)
    }
}

/// A JSON syntax error in the words of Go's encoding/json, which is what
/// grpc-gateway answers ("invalid character 'x' looking for beginning of
/// value", "unexpected EOF"); serde_json's own words for the rarer ones.
pub(crate) fn syntax_error(input: &[u8], error: &serde_json::Error) -> String {
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

/// The character at serde_json's (1-based) line and column.
fn char_at(input: &[u8], line: usize, column: usize) -> Option<char> {
    let line = input.split(|b| *b == b'\n').nth(line.checked_sub(1)?)?;
    let rest = line.get(column.checked_sub(1)?..)?;
    let head = &rest[..rest.len().min(4)];
    String::from_utf8_lossy(head).chars().next()
}

fn decode_base64(text: &str) -> Result<Vec<u8>, Status> {
    STANDARD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .map_err(|e| invalid(format!("illegal base64 data: {e}")))
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

    const EVENT: EnumType = EnumType {
        name: "mvccpb.Event.EventType",
        values: &["PUT", "DELETE"],
    };

    #[test]
    fn unknown_enum_values_are_named_as_jsonpb_names_them() {
        let value: Value = serde_json::from_str(r#"{"type":"BOGUS","kind":true}"#).unwrap();
        let fields = Fields::of(&value).unwrap();
        assert_eq!(
            fields.enumeration("type", &EVENT).unwrap_err().message(),
            r#"unknown value "\"BOGUS\"" for enum mvccpb.Event.EventType"#
        );
        assert_eq!(
            fields.enumeration("kind", &EVENT).unwrap_err().message(),
            "json: cannot unmarshal bool into Go value of type protoreflect.EnumNumber"
        );
    }

    #[test]
    fn zero_values_are_left_out_and_int64_is_a_string() {
        let mut out = String::new();
        let mut o = Obj::new(&mut out);
        o.int("a", 0i64)
            .int("b", 7u64)
            .bytes("key", b"foo")
            .bool("f", false)
            .bool("t", true)
            .enumeration("type", 1, &EVENT);
        o.end();
        assert_eq!(out, r#"{"b":"7","key":"Zm9v","t":true,"type":"DELETE"}"#);
    }

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
    fn requests_take_orig_and_camel_case_names() {
        let value: Value = serde_json::from_str(
            r#"{"range_end":"AA==","countOnly":true,"limit":"3","revision":4}"#,
        )
        .unwrap();
        let fields = Fields::of(&value).unwrap();
        assert_eq!(fields.bytes("range_end").unwrap(), vec![0]);
        assert!(fields.bool("count_only").unwrap());
        assert_eq!(fields.int("limit").unwrap(), 3);
        assert_eq!(fields.int("revision").unwrap(), 4);
        assert_eq!(fields.enumeration("sort_order", &EVENT).unwrap(), 0);
    }
}
