//! The JSON form of each message the gateway carries, field by field in
//! .proto order with etcd's .proto field names (which is what grpc-gateway
//! prints: `dbSize`, `peerURLs` and `ID` are the names in etcd's rpc.proto).
//!
//! One module per service; [`ToJson`] writers of messages that several
//! services share (the response header, mvcc's KeyValue) live here.

mod election;
mod kv;
mod lease;
mod maintenance;

use api::etcdserverpb::ResponseHeader;
use api::mvccpb::KeyValue;
use serde_json::Value;
use tonic::Status;

use super::json::{Fields, Obj};

/// Turns a JSON request body into a request message.
pub(crate) trait FromJson: Sized {
    fn from_json(value: &Value) -> Result<Self, Status>;
}

/// Writes a response message as JSON.
pub(crate) trait ToJson {
    fn to_json(&self, out: &mut String);
}

pub(crate) fn to_json_string<T: ToJson>(message: &T) -> String {
    let mut out = String::with_capacity(256);
    message.to_json(&mut out);
    out
}

pub(crate) fn list<T: FromJson>(f: &Fields<'_>, name: &str) -> Result<Vec<T>, Status> {
    f.list(name)?.iter().map(T::from_json).collect()
}

pub(crate) fn header(out: &mut String, h: &ResponseHeader) {
    let mut o = Obj::new(out);
    o.int("cluster_id", h.cluster_id)
        .int("member_id", h.member_id)
        .int("revision", h.revision)
        .int("raft_term", h.raft_term);
    o.end();
}

pub(crate) fn key_value(out: &mut String, kv: &KeyValue) {
    let mut o = Obj::new(out);
    o.bytes("key", &kv.key)
        .int("create_revision", kv.create_revision)
        .int("mod_revision", kv.mod_revision)
        .int("version", kv.version)
        .bytes("value", &kv.value)
        .int("lease", kv.lease);
    o.end();
}
