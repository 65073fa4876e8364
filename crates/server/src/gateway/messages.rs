//! The JSON form of each message the gateway carries, field by field in
//! .proto order with etcd's .proto field names (which is what grpc-gateway
//! prints: `dbSize`, `peerURLs` and `ID` are the names in etcd's rpc.proto).

use api::etcdserverpb::{
    compare, request_op, response_op, watch_request, CompactionRequest, CompactionResponse,
    Compare, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, LeaseGrantResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, Member, MemberListRequest, MemberListResponse,
    PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp,
    StatusRequest, StatusResponse, TxnRequest, TxnResponse, WatchCancelRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use api::mvccpb::{Event, KeyValue};
use serde_json::Value;
use tonic::Status;

use super::json::{Fields, Obj};

const SORT_ORDER: &[&str] = &["NONE", "ASCEND", "DESCEND"];
const SORT_TARGET: &[&str] = &["KEY", "VERSION", "CREATE", "MOD", "VALUE"];
const COMPARE_RESULT: &[&str] = &["EQUAL", "GREATER", "LESS", "NOT_EQUAL"];
const COMPARE_TARGET: &[&str] = &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"];
const FILTER_TYPE: &[&str] = &["NOPUT", "NODELETE"];
const EVENT_TYPE: &[&str] = &["PUT", "DELETE"];

/// Turns a JSON request body into a request message.
pub trait FromJson: Sized {
    fn from_json(value: &Value) -> Result<Self, Status>;
}

/// Writes a response message as JSON.
pub trait ToJson {
    fn to_json(&self, out: &mut String);
}

pub fn to_json_string<T: ToJson>(message: &T) -> String {
    let mut out = String::with_capacity(256);
    message.to_json(&mut out);
    out
}

// ---- requests ----

impl FromJson for RangeRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(RangeRequest {
            key: f.bytes("key")?.into(),
            range_end: f.bytes("range_end")?.into(),
            limit: f.int("limit")?,
            revision: f.int("revision")?,
            sort_order: f.enumeration("sort_order", SORT_ORDER)?,
            sort_target: f.enumeration("sort_target", SORT_TARGET)?,
            serializable: f.bool("serializable")?,
            keys_only: f.bool("keys_only")?,
            count_only: f.bool("count_only")?,
            min_mod_revision: f.int("min_mod_revision")?,
            max_mod_revision: f.int("max_mod_revision")?,
            min_create_revision: f.int("min_create_revision")?,
            max_create_revision: f.int("max_create_revision")?,
        })
    }
}

impl FromJson for PutRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(PutRequest {
            key: f.bytes("key")?.into(),
            value: f.bytes("value")?.into(),
            lease: f.int("lease")?,
            prev_kv: f.bool("prev_kv")?,
            ignore_value: f.bool("ignore_value")?,
            ignore_lease: f.bool("ignore_lease")?,
        })
    }
}

impl FromJson for DeleteRangeRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(DeleteRangeRequest {
            key: f.bytes("key")?.into(),
            range_end: f.bytes("range_end")?.into(),
            prev_kv: f.bool("prev_kv")?,
        })
    }
}

impl FromJson for Compare {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        let target_union = if f.get("version").is_some() {
            Some(compare::TargetUnion::Version(f.int("version")?))
        } else if f.get("create_revision").is_some() {
            Some(compare::TargetUnion::CreateRevision(
                f.int("create_revision")?,
            ))
        } else if f.get("mod_revision").is_some() {
            Some(compare::TargetUnion::ModRevision(f.int("mod_revision")?))
        } else if f.get("value").is_some() {
            Some(compare::TargetUnion::Value(f.bytes("value")?.into()))
        } else if f.get("lease").is_some() {
            Some(compare::TargetUnion::Lease(f.int("lease")?))
        } else {
            None
        };
        Ok(Compare {
            result: f.enumeration("result", COMPARE_RESULT)?,
            target: f.enumeration("target", COMPARE_TARGET)?,
            key: f.bytes("key")?.into(),
            range_end: f.bytes("range_end")?.into(),
            target_union,
        })
    }
}

impl FromJson for RequestOp {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        let request = if let Some(v) = f.msg("request_range") {
            Some(request_op::Request::RequestRange(RangeRequest::from_json(
                v,
            )?))
        } else if let Some(v) = f.msg("request_put") {
            Some(request_op::Request::RequestPut(PutRequest::from_json(v)?))
        } else if let Some(v) = f.msg("request_delete_range") {
            Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest::from_json(v)?,
            ))
        } else if let Some(v) = f.msg("request_txn") {
            Some(request_op::Request::RequestTxn(TxnRequest::from_json(v)?))
        } else {
            None
        };
        Ok(RequestOp { request })
    }
}

fn list<T: FromJson>(f: &Fields<'_>, name: &str) -> Result<Vec<T>, Status> {
    f.list(name)?.iter().map(T::from_json).collect()
}

impl FromJson for TxnRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(TxnRequest {
            compare: list(&f, "compare")?,
            success: list(&f, "success")?,
            failure: list(&f, "failure")?,
        })
    }
}

impl FromJson for CompactionRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(CompactionRequest {
            revision: f.int("revision")?,
            physical: f.bool("physical")?,
        })
    }
}

impl FromJson for WatchCreateRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        let filters = f
            .list("filters")?
            .iter()
            .map(|v| {
                let wrapped = serde_json::json!({ "filter": v });
                Fields::of(&wrapped)?.enumeration("filter", FILTER_TYPE)
            })
            .collect::<Result<_, Status>>()?;
        Ok(WatchCreateRequest {
            key: f.bytes("key")?.into(),
            range_end: f.bytes("range_end")?.into(),
            start_revision: f.int("start_revision")?,
            progress_notify: f.bool("progress_notify")?,
            filters,
            prev_kv: f.bool("prev_kv")?,
            watch_id: f.int("watch_id")?,
            fragment: f.bool("fragment")?,
        })
    }
}

impl FromJson for WatchRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        let request_union = if let Some(v) = f.msg("create_request") {
            Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest::from_json(v)?,
            ))
        } else if let Some(v) = f.msg("cancel_request") {
            let c = Fields::of(v)?;
            Some(watch_request::RequestUnion::CancelRequest(
                WatchCancelRequest {
                    watch_id: c.int("watch_id")?,
                },
            ))
        } else if f.msg("progress_request").is_some() {
            Some(watch_request::RequestUnion::ProgressRequest(
                WatchProgressRequest {},
            ))
        } else {
            None
        };
        Ok(WatchRequest { request_union })
    }
}

impl FromJson for StatusRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        Fields::of(value)?;
        Ok(StatusRequest {})
    }
}

impl FromJson for MemberListRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(MemberListRequest {
            linearizable: f.bool("linearizable")?,
        })
    }
}

impl FromJson for LeaseGrantRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LeaseGrantRequest {
            ttl: f.int("TTL")?,
            id: f.int("ID")?,
        })
    }
}

impl FromJson for LeaseRevokeRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LeaseRevokeRequest { id: f.int("ID")? })
    }
}

impl FromJson for LeaseTimeToLiveRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LeaseTimeToLiveRequest {
            id: f.int("ID")?,
            keys: f.bool("keys")?,
        })
    }
}

impl FromJson for LeaseLeasesRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        Fields::of(value)?;
        Ok(LeaseLeasesRequest {})
    }
}

// ---- responses ----

fn header(out: &mut String, h: &ResponseHeader) {
    let mut o = Obj::new(out);
    o.int("cluster_id", h.cluster_id)
        .int("member_id", h.member_id)
        .int("revision", h.revision)
        .int("raft_term", h.raft_term);
    o.end();
}

fn key_value(out: &mut String, kv: &KeyValue) {
    let mut o = Obj::new(out);
    o.bytes("key", &kv.key)
        .int("create_revision", kv.create_revision)
        .int("mod_revision", kv.mod_revision)
        .int("version", kv.version)
        .bytes("value", &kv.value)
        .int("lease", kv.lease);
    o.end();
}

fn event(out: &mut String, e: &Event) {
    let mut o = Obj::new(out);
    o.enumeration("type", e.r#type, EVENT_TYPE)
        .msg("kv", e.kv.as_ref(), key_value)
        .msg("prev_kv", e.prev_kv.as_ref(), key_value);
    o.end();
}

impl ToJson for RangeResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .msgs("kvs", &self.kvs, key_value)
            .bool("more", self.more)
            .int("count", self.count);
        o.end();
    }
}

impl ToJson for PutResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header).msg(
            "prev_kv",
            self.prev_kv.as_ref(),
            key_value,
        );
        o.end();
    }
}

impl ToJson for DeleteRangeResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .int("deleted", self.deleted)
            .msgs("prev_kvs", &self.prev_kvs, key_value);
        o.end();
    }
}

fn response_op(out: &mut String, op: &ResponseOp) {
    let mut o = Obj::new(out);
    match &op.response {
        Some(response_op::Response::ResponseRange(r)) => {
            o.msg("response_range", Some(r), |out, r: &RangeResponse| {
                r.to_json(out)
            });
        }
        Some(response_op::Response::ResponsePut(r)) => {
            o.msg("response_put", Some(r), |out, r: &PutResponse| {
                r.to_json(out)
            });
        }
        Some(response_op::Response::ResponseDeleteRange(r)) => {
            o.msg(
                "response_delete_range",
                Some(r),
                |out, r: &DeleteRangeResponse| r.to_json(out),
            );
        }
        Some(response_op::Response::ResponseTxn(r)) => {
            o.msg("response_txn", Some(r), |out, r: &TxnResponse| {
                r.to_json(out)
            });
        }
        None => {}
    }
    o.end();
}

impl ToJson for TxnResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .bool("succeeded", self.succeeded)
            .msgs("responses", &self.responses, response_op);
        o.end();
    }
}

impl ToJson for CompactionResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header);
        o.end();
    }
}

impl ToJson for WatchResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .int("watch_id", self.watch_id)
            .bool("created", self.created)
            .bool("canceled", self.canceled)
            .int("compact_revision", self.compact_revision)
            .str("cancel_reason", &self.cancel_reason)
            .bool("fragment", self.fragment)
            .msgs("events", &self.events, event);
        o.end();
    }
}

impl ToJson for StatusResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .str("version", &self.version)
            .int("dbSize", self.db_size)
            .int("leader", self.leader)
            .int("raftIndex", self.raft_index)
            .int("raftTerm", self.raft_term)
            .int("raftAppliedIndex", self.raft_applied_index)
            .strings("errors", &self.errors)
            .int("dbSizeInUse", self.db_size_in_use)
            .bool("isLearner", self.is_learner);
        o.end();
    }
}

impl ToJson for LeaseGrantResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .int("ID", self.id)
            .int("TTL", self.ttl)
            .str("error", &self.error);
        o.end();
    }
}

impl ToJson for LeaseRevokeResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header);
        o.end();
    }
}

impl ToJson for LeaseTimeToLiveResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .int("ID", self.id)
            .int("TTL", self.ttl)
            .int("grantedTTL", self.granted_ttl)
            .bytes_list("keys", &self.keys);
        o.end();
    }
}

fn lease_status(out: &mut String, l: &LeaseStatus) {
    let mut o = Obj::new(out);
    o.int("ID", l.id);
    o.end();
}

impl ToJson for LeaseLeasesResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .msgs("leases", &self.leases, lease_status);
        o.end();
    }
}

fn member(out: &mut String, m: &Member) {
    let mut o = Obj::new(out);
    o.int("ID", m.id)
        .str("name", &m.name)
        .strings("peerURLs", &m.peer_ur_ls)
        .strings("clientURLs", &m.client_ur_ls)
        .bool("isLearner", m.is_learner);
    o.end();
}

impl ToJson for MemberListResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .msgs("members", &self.members, member);
        o.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txn_request_with_nested_ops_and_compare_targets() {
        let value: Value = serde_json::from_str(
            r#"{"compare":[{"key":"Zm9v","target":"VERSION","result":"EQUAL","version":"0"}],
                "success":[{"request_put":{"key":"Zm9v","value":"MQ=="}}],
                "failure":[{"request_range":{"key":"Zm9v"}}]}"#,
        )
        .unwrap();
        let txn = TxnRequest::from_json(&value).unwrap();
        assert_eq!(txn.compare.len(), 1);
        assert_eq!(
            txn.compare[0].target_union,
            Some(compare::TargetUnion::Version(0))
        );
        assert!(matches!(
            txn.success[0].request,
            Some(request_op::Request::RequestPut(_))
        ));
        assert!(matches!(
            txn.failure[0].request,
            Some(request_op::Request::RequestRange(_))
        ));
    }

    #[test]
    fn delete_events_print_their_type_and_puts_do_not() {
        let response = WatchResponse {
            events: vec![
                Event {
                    r#type: 0,
                    kv: Some(KeyValue {
                        key: b"a".to_vec().into(),
                        mod_revision: 2,
                        ..Default::default()
                    }),
                    prev_kv: None,
                },
                Event {
                    r#type: 1,
                    kv: Some(KeyValue {
                        key: b"a".to_vec().into(),
                        mod_revision: 3,
                        ..Default::default()
                    }),
                    prev_kv: None,
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            to_json_string(&response),
            r#"{"events":[{"kv":{"key":"YQ==","mod_revision":"2"}},{"type":"DELETE","kv":{"key":"YQ==","mod_revision":"3"}}]}"#
        );
    }
}
