//! etcd's warnings of expensive requests (etcdserver/util.go
//! `warnOfExpensiveRequest`, `warnOfExpensiveReadOnly{Range,Txn}Request`):
//! an apply, or a read-only range or txn served here, that took longer
//! than `--experimental-warning-apply-duration` is logged as "apply
//! request took too long" and counted in etcd_server_slow_apply_total.
//!
//! The request is written as etcd writes it: Go protobuf's compact text
//! format (`key:"foo" range_end:"fop" `), with values replaced by their
//! sizes and passwords left out (api/etcdserverpb/raft_internal_stringer.go
//! `InternalRaftStringer`, `NewLoggableTxnRequest`). Only a slow request
//! pays for this text.

use std::fmt::Write as _;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use api::etcdserverpb::{
    compare, request_op, Compare, InternalRaftRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, TxnRequest, TxnResponse,
};
use prost::{Message, Name};
use prost_reflect::{DescriptorPool, DynamicMessage, FieldDescriptor, Kind, ReflectMessage, Value};

use crate::metrics::Metrics;

static POOL: LazyLock<Option<DescriptorPool>> =
    LazyLock::new(|| DescriptorPool::decode(api::FILE_DESCRIPTOR_SET).ok());

/// A request's outcome as the warning shows it.
pub(crate) struct Outcome {
    /// etcd's "response" field ("size:4", "range_response_count:1 size:22";
    /// empty when there is none).
    pub(crate) response: String,
    pub(crate) error: Option<String>,
}

/// Logs and counts a request that took longer than `expected` since
/// `started` (etcd's warnOfExpensiveGenericRequest); returns whether it
/// did. `request` is only asked for then.
pub(crate) fn warn_if_slow(
    metrics: &Metrics,
    expected: Duration,
    started: Instant,
    prefix: &str,
    request: impl FnOnce() -> String,
    outcome: impl FnOnce() -> Outcome,
) -> bool {
    let took = started.elapsed();
    if took <= expected {
        return false;
    }
    let outcome = outcome();
    let request = request();
    match &outcome.error {
        None => tracing::warn!(
            took = ?took,
            "expected-duration" = ?expected,
            prefix,
            request = %request,
            response = %outcome.response,
            "apply request took too long"
        ),
        Some(error) => tracing::warn!(
            took = ?took,
            "expected-duration" = ?expected,
            prefix,
            request = %request,
            response = %outcome.response,
            error = %error,
            "apply request took too long"
        ),
    }
    metrics.ops.slow_apply();
    true
}

/// A read-only range served on this member (`prefix` "read-only range ").
pub fn warn_read_only_range(
    metrics: &Metrics,
    expected: Duration,
    started: Instant,
    request: &RangeRequest,
    result: Result<&RangeResponse, &str>,
) {
    if started.elapsed() <= expected {
        return;
    }
    let (response, error) = match result {
        Ok(resp) => (
            format!(
                "range_response_count:{} size:{}",
                resp.kvs.len(),
                resp.encoded_len()
            ),
            None,
        ),
        Err(e) => (String::new(), Some(e.to_string())),
    };
    warn_if_slow(
        metrics,
        expected,
        started,
        "read-only range ",
        || compact_text(request),
        || Outcome { response, error },
    );
}

/// A read-only txn served on this member (`prefix` "read-only txn ").
pub fn warn_read_only_txn(
    metrics: &Metrics,
    expected: Duration,
    started: Instant,
    request: &TxnRequest,
    result: Result<&TxnResponse, &str>,
) {
    if started.elapsed() <= expected {
        return;
    }
    let (response, error) = match result {
        Ok(resp) => {
            let ranges: Vec<String> = resp
                .responses
                .iter()
                .filter_map(|r| match &r.response {
                    Some(api::etcdserverpb::response_op::Response::ResponseRange(range)) => {
                        Some(format!("range_response_count:{}", range.kvs.len()))
                    }
                    _ => None,
                })
                .collect();
            (
                format!(
                    "responses:<{}> size:{}",
                    ranges.join(" "),
                    resp.encoded_len()
                ),
                None,
            )
        }
        Err(e) => (String::new(), Some(e.to_string())),
    };
    warn_if_slow(
        metrics,
        expected,
        started,
        "read-only txn ",
        || loggable_txn(request),
        || Outcome { response, error },
    );
}

/// etcd's InternalRaftStringer of a committed entry's request.
pub(crate) fn loggable_entry(entry: &InternalRaftRequest) -> String {
    let header = entry
        .header
        .as_ref()
        .map_or_else(|| "<nil>".to_string(), compact_text);
    if let Some(grant) = &entry.lease_grant {
        return format!(
            "header:<{header}> lease_grant:<ttl:{}-second id:{}>",
            grant.ttl,
            go_hex16(grant.id)
        );
    }
    if let Some(revoke) = &entry.lease_revoke {
        return format!(
            "header:<{header}> lease_revoke:<id:{}>",
            go_hex16(revoke.id)
        );
    }
    if let Some(auth) = &entry.authenticate {
        return format!(
            "header:<{header}> authenticate:<name:{} simple_token:{}>",
            auth.name, auth.simple_token
        );
    }
    if let Some(add) = &entry.auth_user_add {
        return format!("header:<{header}> auth_user_add:<name:{}>", add.name);
    }
    if let Some(change) = &entry.auth_user_change_password {
        return format!(
            "header:<{header}> auth_user_change_password:<name:{}>",
            change.name
        );
    }
    if let Some(put) = &entry.put {
        return format!("header:<{header}> put:<{}>", loggable_put(put));
    }
    if let Some(txn) = &entry.txn {
        return format!("header:<{header}> txn:<{}>", loggable_txn(txn));
    }
    compact_text(entry)
}

/// Go's `%016x` of an int64.
fn go_hex16(id: i64) -> String {
    if id < 0 {
        format!("-{:015x}", id.unsigned_abs())
    } else {
        format!("{id:016x}")
    }
}

/// etcd's loggablePutRequest: the value's size instead of the value.
fn loggable_put(put: &PutRequest) -> String {
    let mut out = String::new();
    if !put.key.is_empty() {
        let _ = write!(out, "key:{} ", go_quoted(&put.key));
    }
    int_field(&mut out, "value_size", put.value.len() as i64);
    int_field(&mut out, "lease", put.lease);
    bool_field(&mut out, "prev_kv", put.prev_kv);
    bool_field(&mut out, "ignore_value", put.ignore_value);
    bool_field(&mut out, "ignore_lease", put.ignore_lease);
    out
}

/// etcd's txnRequestStringer: puts and value compares by size.
pub(crate) fn loggable_txn(txn: &TxnRequest) -> String {
    let compares: Vec<String> = txn.compare.iter().map(loggable_compare).collect();
    let ops = |ops: &[RequestOp]| ops.iter().map(loggable_op).collect::<Vec<_>>().join(" ");
    format!(
        "compare:<{}> success:<{}> failure:<{}>",
        compares.join(" "),
        ops(&txn.success),
        ops(&txn.failure)
    )
}

fn loggable_op(op: &RequestOp) -> String {
    match &op.request {
        Some(request_op::Request::RequestPut(put)) => {
            format!("request_put:<{}>", loggable_put(put))
        }
        Some(request_op::Request::RequestTxn(txn)) => {
            format!("request_txn:<{}>", loggable_txn(txn))
        }
        _ => compact_text(op),
    }
}

/// etcd's loggableValueCompare for a value compare; others as they are.
fn loggable_compare(c: &Compare) -> String {
    let Some(compare::TargetUnion::Value(value)) = &c.target_union else {
        return compact_text(c);
    };
    let mut out = String::new();
    if c.result != 0 {
        let name = compare::CompareResult::try_from(c.result)
            .map(|r| r.as_str_name().to_string())
            .unwrap_or_else(|_| c.result.to_string());
        let _ = write!(out, "result:{name} ");
    }
    if c.target != 0 {
        let name = compare::CompareTarget::try_from(c.target)
            .map(|t| t.as_str_name().to_string())
            .unwrap_or_else(|_| c.target.to_string());
        let _ = write!(out, "target:{name} ");
    }
    if !c.key.is_empty() {
        let _ = write!(out, "key:{} ", go_quoted(&c.key));
    }
    int_field(&mut out, "value_size", value.len() as i64);
    if !c.range_end.is_empty() {
        let _ = write!(out, "range_end:{} ", go_quoted(&c.range_end));
    }
    out
}

fn int_field(out: &mut String, name: &str, value: i64) {
    if value != 0 {
        let _ = write!(out, "{name}:{value} ");
    }
}

fn bool_field(out: &mut String, name: &str, value: bool) {
    if value {
        let _ = write!(out, "{name}:true ");
    }
}

/// Go protobuf's CompactTextString of `message`: its set fields in
/// declaration order, `name:value ` each, messages as `name:<...> `.
pub(crate) fn compact_text<M: Message + Name>(message: &M) -> String {
    let Some(pool) = POOL.as_ref() else {
        return String::new();
    };
    let Some(descriptor) = pool.get_message_by_name(&M::full_name()) else {
        return String::new();
    };
    match DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice()) {
        Ok(dynamic) => {
            let mut out = String::new();
            write_message(&mut out, &dynamic);
            out
        }
        Err(_) => String::new(),
    }
}

fn write_message(out: &mut String, message: &DynamicMessage) {
    let descriptor = message.descriptor();
    // declaration order, as Go's struct fields (not field numbers:
    // InternalRaftRequest declares its header, field 100, first)
    for declared in &descriptor.descriptor_proto().field {
        let Some(field) = declared.number.and_then(|n| descriptor.get_field(n as u32)) else {
            continue;
        };
        let value = message.get_field(&field);
        if field.is_list() {
            if let Value::List(items) = value.as_ref() {
                for item in items {
                    write_field(out, &field, item);
                }
            }
            continue;
        }
        let set = if field.containing_oneof().is_some() || field.kind().as_message().is_some() {
            message.has_field(&field)
        } else {
            !is_default(value.as_ref())
        };
        if set {
            write_field(out, &field, value.as_ref());
        }
    }
}

fn write_field(out: &mut String, field: &FieldDescriptor, value: &Value) {
    out.push_str(field.name());
    match value {
        Value::Message(inner) => {
            out.push_str(":<");
            write_message(out, inner);
            out.push_str("> ");
            return;
        }
        Value::EnumNumber(n) => {
            let name = match field.kind() {
                Kind::Enum(e) => e.get_value(*n).map(|v| v.name().to_string()),
                _ => None,
            };
            let _ = write!(out, ":{}", name.unwrap_or_else(|| n.to_string()));
        }
        Value::String(s) => {
            let _ = write!(out, ":{}", go_quoted(s.as_bytes()));
        }
        Value::Bytes(b) => {
            let _ = write!(out, ":{}", go_quoted(b));
        }
        Value::Bool(b) => {
            let _ = write!(out, ":{b}");
        }
        Value::I32(n) => {
            let _ = write!(out, ":{n}");
        }
        Value::I64(n) => {
            let _ = write!(out, ":{n}");
        }
        Value::U32(n) => {
            let _ = write!(out, ":{n}");
        }
        Value::U64(n) => {
            let _ = write!(out, ":{n}");
        }
        Value::F32(n) => {
            let _ = write!(out, ":{n}");
        }
        Value::F64(n) => {
            let _ = write!(out, ":{n}");
        }
        Value::List(_) | Value::Map(_) => {}
    }
    out.push(' ');
}

fn is_default(value: &Value) -> bool {
    match value {
        Value::Bool(b) => !b,
        Value::I32(n) | Value::EnumNumber(n) => *n == 0,
        Value::I64(n) => *n == 0,
        Value::U32(n) => *n == 0,
        Value::U64(n) => *n == 0,
        Value::F32(n) => *n == 0.0,
        Value::F64(n) => *n == 0.0,
        Value::String(s) => s.is_empty(),
        Value::Bytes(b) => b.is_empty(),
        Value::List(l) => l.is_empty(),
        Value::Map(m) => m.is_empty(),
        Value::Message(_) => false,
    }
}

/// Go protobuf's text quoting of bytes: `\n \r \t \" \\` escaped, other
/// bytes outside printable ASCII as three octal digits.
fn go_quoted(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for &b in bytes {
        match b {
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
