use super::*;
use api::etcdserverpb::{
    compare, request_op, response_op, AlarmMember, AlarmRequest, AlarmResponse, Compare,
    DefragmentResponse, DowngradeRequest, HashResponse, LeaseKeepAliveRequest,
    LeaseKeepAliveResponse, MemberAddRequest, MemberUpdateRequest, MoveLeaderRequest, RangeRequest,
    RequestOp, ResponseHeader, ResponseOp, SnapshotResponse, StatusRequest, TxnRequest,
    TxnResponse, WatchRequest, WatchResponse,
};
use api::mvccpb::{Event, KeyValue};
use api::v3electionpb::{LeaderKey, LeaderResponse, ProclaimRequest, ResignRequest};
use api::v3lockpb::{LockRequest, LockResponse};

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

#[test]
fn every_message_declares_its_fields_in_number_order() {
    // Go prints a message's fields in declaration order, the walk in number
    // order: they must be the same order for every message we carry.
    let pool = POOL.as_ref().unwrap();
    let mut checked = 0;
    // etcd's own .proto files; ours (raft entries, peer messages) never
    // reach the gateway
    let etcds = pool
        .all_messages()
        .filter(|m| m.parent_file().name().starts_with("etcd/"));
    for message in etcds {
        let declared: Vec<i32> = message
            .descriptor_proto()
            .field
            .iter()
            .map(|f| f.number())
            .collect();
        let mut sorted = declared.clone();
        sorted.sort_unstable();
        assert_eq!(declared, sorted, "{}", message.full_name());
        checked += 1;
    }
    assert!(checked > 50, "{checked} messages");
}

#[test]
fn every_request_and_response_type_has_a_descriptor() {
    assert!(descriptor::<RangeRequest>().is_ok());
    assert!(descriptor::<WatchResponse>().is_ok());
    assert!(descriptor::<LeaderResponse>().is_ok());
    assert!(descriptor::<LockRequest>().is_ok());
    assert!(descriptor::<LeaseKeepAliveResponse>().is_ok());
}

#[test]
fn txn_request_with_nested_ops_and_compare_targets() {
    let value = parse(
        r#"{"compare":[{"key":"Zm9v","target":"VERSION","result":"EQUAL","version":"0"}],
            "success":[{"request_put":{"key":"Zm9v","value":"MQ=="}}],
            "failure":[{"request_range":{"key":"Zm9v"}}]}"#,
    );
    let txn = TxnRequest::from_json(&value).unwrap();
    assert_eq!(txn.compare.len(), 1);
    assert_eq!(
        txn.compare[0].target_union,
        Some(compare::TargetUnion::Version(0)),
        "a oneof member set to zero is still set"
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
fn the_first_member_of_a_oneof_wins() {
    let value = parse(r#"{"key":"YQ==","mod_revision":"3","version":"2"}"#);
    let compare = Compare::from_json(&value).unwrap();
    assert_eq!(compare.target_union, Some(compare::TargetUnion::Version(2)));
    let watch = WatchRequest::from_json(&parse(r#"{"progress_request":{}}"#)).unwrap();
    assert!(watch.request_union.is_some());
}

/// A txn `levels` deep, one op per level around an empty txn.
fn txn_chain(levels: usize) -> String {
    let mut json = "{}".to_string();
    for _ in 0..levels {
        json = format!(r#"{{"success":[{{"request_txn":{json}}}]}}"#);
    }
    json
}

#[test]
fn txns_deeper_than_prosts_limit_as_deep_as_etcd_takes() {
    // etcd's op budget admits 128 levels; prost alone decodes 100
    let deep = 128;
    let text = txn_chain(deep);
    let mut deserializer = serde_json::Deserializer::from_str(&text);
    deserializer.disable_recursion_limit();
    let value: Value = deserializer.into_iter().next().unwrap().unwrap();
    let std = std::thread::Builder::new().stack_size(api::codec::REQUEST_THREAD_STACK_BYTES);
    let (decoded, response) = std
        .spawn(move || {
            let decoded = TxnRequest::from_json(&value).map(|_| ());
            // and a response as deep
            let mut response = TxnResponse::default();
            for _ in 0..128 {
                response = TxnResponse {
                    succeeded: true,
                    responses: vec![ResponseOp {
                        response: Some(response_op::Response::ResponseTxn(response)),
                    }],
                    ..Default::default()
                };
            }
            (decoded, to_json_string(&response))
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(decoded.is_ok(), "{decoded:?}");
    assert_eq!(response.matches("response_txn").count(), 128);
    assert!(response.ends_with(&format!("{{}}{}", "}]}".repeat(128))));
}

#[test]
fn delete_events_print_their_type_and_puts_do_not() {
    let event = |r#type, mod_revision| Event {
        r#type,
        kv: Some(KeyValue {
            key: b"a".to_vec().into(),
            mod_revision,
            ..Default::default()
        }),
        prev_kv: None,
    };
    let response = WatchResponse {
        events: vec![event(0, 2), event(1, 3)],
        ..Default::default()
    };
    assert_eq!(
        to_json_string(&response),
        r#"{"events":[{"kv":{"key":"YQ==","mod_revision":"2"}},{"type":"DELETE","kv":{"key":"YQ==","mod_revision":"3"}}]}"#
    );
}

#[test]
fn a_missing_leader_stays_none_for_the_service_to_reject() {
    let empty = serde_json::json!({});
    assert!(ResignRequest::from_json(&empty).unwrap().leader.is_none());
    let null = serde_json::json!({"leader": null});
    assert!(ProclaimRequest::from_json(&null).unwrap().leader.is_none());
    let wrong = serde_json::json!({"leader": 5});
    assert_eq!(
        ResignRequest::from_json(&wrong).unwrap_err().message(),
        "json: cannot unmarshal number into Go value of type map[string]json.RawMessage"
    );
}

#[test]
fn leader_keys_and_lock_keys_are_base64() {
    let response = LeaderResponse {
        header: None,
        kv: None,
    };
    assert_eq!(to_json_string(&response), "{}");
    let leader = LeaderKey {
        name: b"el".to_vec().into(),
        key: b"el/4d".to_vec().into(),
        rev: 4,
        lease: 77,
    };
    assert_eq!(
        to_json_string(&leader),
        r#"{"name":"ZWw=","key":"ZWwvNGQ=","rev":"4","lease":"77"}"#
    );
    let lock = LockRequest::from_json(&serde_json::json!({"name": "bGs=", "lease": "77"})).unwrap();
    assert_eq!((&lock.name[..], lock.lease), (&b"lk"[..], 77));
    let response = LockResponse {
        header: None,
        key: b"lk/4d".to_vec().into(),
    };
    assert_eq!(to_json_string(&response), r#"{"key":"bGsvNGQ="}"#);
}

#[test]
fn keep_alive_of_an_unknown_lease_leaves_ttl_out() {
    let request = LeaseKeepAliveRequest::from_json(&parse(r#"{"ID":"5"}"#)).unwrap();
    assert_eq!(request.id, 5);
    let response = LeaseKeepAliveResponse {
        header: Some(ResponseHeader {
            revision: 3,
            ..Default::default()
        }),
        id: 5,
        ttl: 0,
    };
    assert_eq!(
        to_json_string(&response),
        r#"{"header":{"revision":"3"},"ID":"5"}"#
    );
    let renewed = LeaseKeepAliveResponse {
        ttl: 60,
        ..response
    };
    assert!(to_json_string(&renewed).ends_with(r#""ID":"5","TTL":"60"}"#));
}

#[test]
fn alarm_request_takes_enums_by_name_or_number() {
    let by_name = AlarmRequest::from_json(&parse(
        r#"{"action":"DEACTIVATE","memberID":"7","alarm":"CORRUPT"}"#,
    ))
    .unwrap();
    assert_eq!(
        (by_name.action, by_name.member_id, by_name.alarm),
        (2, 7, 2)
    );
    let by_number =
        AlarmRequest::from_json(&parse(r#"{"action":1,"memberID":7,"alarm":1}"#)).unwrap();
    assert_eq!((by_number.action, by_number.alarm), (1, 1));
    let bogus = AlarmRequest::from_json(&parse(r#"{"action":"BOGUS"}"#)).unwrap_err();
    assert_eq!(
        bogus.message(),
        r#"unknown value "\"BOGUS\"" for enum etcdserverpb.AlarmRequest.AlarmAction"#
    );
    let wrong = AlarmRequest::from_json(&parse(r#"{"alarm":true}"#)).unwrap_err();
    assert_eq!(
        wrong.message(),
        "json: cannot unmarshal bool into Go value of type protoreflect.EnumNumber"
    );
}

#[test]
fn alarm_members_print_member_id_as_a_string_and_alarm_by_name() {
    let response = AlarmResponse {
        header: Some(ResponseHeader {
            revision: 1,
            ..Default::default()
        }),
        alarms: vec![AlarmMember {
            member_id: 1,
            alarm: 1,
        }],
    };
    assert_eq!(
        to_json_string(&response),
        r#"{"header":{"revision":"1"},"alarms":[{"memberID":"1","alarm":"NOSPACE"}]}"#
    );
}

#[test]
fn hash_is_a_json_number_and_remaining_bytes_a_string() {
    let hash = HashResponse {
        header: None,
        hash: u32::MAX,
    };
    assert_eq!(to_json_string(&hash), r#"{"hash":4294967295}"#);
    let chunk = SnapshotResponse {
        header: None,
        remaining_bytes: 32,
        blob: b"db".to_vec().into(),
    };
    assert_eq!(
        to_json_string(&chunk),
        r#"{"remaining_bytes":"32","blob":"ZGI="}"#
    );
    assert_eq!(to_json_string(&DefragmentResponse { header: None }), "{}");
    let header_only = DefragmentResponse {
        header: Some(ResponseHeader::default()),
    };
    assert_eq!(to_json_string(&header_only), r#"{"header":{}}"#);
}

#[test]
fn member_requests_take_uint64_ids_and_url_lists() {
    let update = MemberUpdateRequest::from_json(&parse(
        r#"{"ID":"18446744073709551615","peerURLs":["http://a:2380"]}"#,
    ))
    .unwrap();
    assert_eq!(update.id, u64::MAX);
    assert_eq!(update.peer_ur_ls, vec!["http://a:2380".to_string()]);
    let wrong = MemberAddRequest::from_json(&parse(r#"{"peerURLs":[1]}"#)).unwrap_err();
    assert_eq!(
        wrong.message(),
        "json: cannot unmarshal number into Go value of type string"
    );
    let target = MoveLeaderRequest::from_json(&parse(r#"{"targetID":"9"}"#)).unwrap();
    assert_eq!(target.target_id, 9);
    let downgrade =
        DowngradeRequest::from_json(&parse(r#"{"action":"ENABLE","version":"3.4"}"#)).unwrap();
    assert_eq!((downgrade.action, downgrade.version.as_str()), (1, "3.4"));
}

#[test]
fn requests_without_fields_take_any_object_or_nothing() {
    assert!(StatusRequest::from_json(&Value::Null).is_ok());
    assert!(StatusRequest::from_json(&parse(r#"{"unknown":[1,2]}"#)).is_ok());
    assert!(StatusRequest::from_json(&parse("[]")).is_err());
}

#[test]
fn request_fields_take_orig_and_camel_case_names() {
    let range = RangeRequest::from_json(&parse(
        r#"{"range_end":"AA==","countOnly":true,"limit":"3","revision":4,"sort_order":"DESCEND"}"#,
    ))
    .unwrap();
    assert_eq!(&range.range_end[..], &[0]);
    assert!(range.count_only);
    assert_eq!((range.limit, range.revision, range.sort_order), (3, 4, 2));
    let op = RequestOp::from_json(&parse(r#"{"requestPut":{"key":"YQ=="}}"#)).unwrap();
    assert!(matches!(
        op.request,
        Some(request_op::Request::RequestPut(_))
    ));
}

#[test]
fn a_message_above_the_limit_gets_grpc_gos_refusal() {
    // {"key": "k", "value": 20 bytes}: 2 + 1 + 2 + 20 = 25 bytes on the wire
    let value = parse(r#"{"key":"aw==","value":"MDEyMzQ1Njc4OTAxMjM0NTY3ODk="}"#);
    let put = api::etcdserverpb::PutRequest::from_json_within(&value, 25).unwrap();
    assert_eq!(put.value.len(), 20);
    let refused = api::etcdserverpb::PutRequest::from_json_within(&value, 24).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "grpc: received message larger than max (25 vs. 24)"
    );
}
