//! KV and Watch messages.

use api::etcdserverpb::{
    compare, request_op, response_op, watch_request, CompactionRequest, CompactionResponse,
    Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseOp, TxnRequest, TxnResponse, WatchCancelRequest,
    WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
};
use api::mvccpb::Event;
use serde_json::Value;
use tonic::Status;

use super::{header, key_value, list, FromJson, ToJson};
use crate::gateway::json::{EnumType, Fields, Obj};

const SORT_ORDER: EnumType = EnumType {
    name: "etcdserverpb.RangeRequest.SortOrder",
    values: &["NONE", "ASCEND", "DESCEND"],
};
const SORT_TARGET: EnumType = EnumType {
    name: "etcdserverpb.RangeRequest.SortTarget",
    values: &["KEY", "VERSION", "CREATE", "MOD", "VALUE"],
};
const COMPARE_RESULT: EnumType = EnumType {
    name: "etcdserverpb.Compare.CompareResult",
    values: &["EQUAL", "GREATER", "LESS", "NOT_EQUAL"],
};
const COMPARE_TARGET: EnumType = EnumType {
    name: "etcdserverpb.Compare.CompareTarget",
    values: &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"],
};
const FILTER_TYPE: EnumType = EnumType {
    name: "etcdserverpb.WatchCreateRequest.FilterType",
    values: &["NOPUT", "NODELETE"],
};
const EVENT_TYPE: EnumType = EnumType {
    name: "mvccpb.Event.EventType",
    values: &["PUT", "DELETE"],
};

// ---- requests ----

impl FromJson for RangeRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(RangeRequest {
            key: f.bytes("key")?.into(),
            range_end: f.bytes("range_end")?.into(),
            limit: f.int("limit")?,
            revision: f.int("revision")?,
            sort_order: f.enumeration("sort_order", &SORT_ORDER)?,
            sort_target: f.enumeration("sort_target", &SORT_TARGET)?,
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
            result: f.enumeration("result", &COMPARE_RESULT)?,
            target: f.enumeration("target", &COMPARE_TARGET)?,
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
                Fields::of(&wrapped)?.enumeration("filter", &FILTER_TYPE)
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

// ---- responses ----

fn event(out: &mut String, e: &Event) {
    let mut o = Obj::new(out);
    o.enumeration("type", e.r#type, &EVENT_TYPE)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::messages::to_json_string;
    use api::mvccpb::KeyValue;

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
