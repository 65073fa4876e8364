use api::etcdserverpb::{
    AlarmRequest, AuthStatusRequest, AuthUserAddRequest, CompactionRequest, DeleteRangeRequest,
    LeaseGrantRequest, RequestHeader,
};

use super::*;

fn entry(id: u64) -> InternalRaftRequest {
    InternalRaftRequest {
        header: Some(RequestHeader {
            id,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Each request as etcd 3.5.16 logged it ("apply request took too long"
/// with --experimental-warning-apply-duration 1ns).
#[test]
fn requests_are_written_as_etcd_writes_them() {
    let cases = [
        (
            InternalRaftRequest {
                put: Some(PutRequest {
                    key: "foo".into(),
                    value: "bar".into(),
                    ..Default::default()
                }),
                ..entry(9613111812493483271)
            },
            r#"header:<ID:9613111812493483271 > put:<key:"foo" value_size:3 >"#,
        ),
        (
            InternalRaftRequest {
                put: Some(PutRequest {
                    key: "a\"b".into(),
                    value: "v".into(),
                    prev_kv: true,
                    ..Default::default()
                }),
                ..entry(9613111812493483272)
            },
            r#"header:<ID:9613111812493483272 > put:<key:"a\"b" value_size:1 prev_kv:true >"#,
        ),
        (
            InternalRaftRequest {
                delete_range: Some(DeleteRangeRequest {
                    key: "k".into(),
                    range_end: "l".into(),
                    ..Default::default()
                }),
                ..entry(9613111812493483274)
            },
            r#"header:<ID:9613111812493483274 > delete_range:<key:"k" range_end:"l" > "#,
        ),
        (
            InternalRaftRequest {
                txn: Some(TxnRequest {
                    compare: vec![
                        Compare {
                            target: compare::CompareTarget::Value as i32,
                            key: "foo".into(),
                            target_union: Some(compare::TargetUnion::Value("bar".into())),
                            ..Default::default()
                        },
                        Compare {
                            result: compare::CompareResult::Greater as i32,
                            target: compare::CompareTarget::Mod as i32,
                            key: "x".into(),
                            target_union: Some(compare::TargetUnion::ModRevision(0)),
                            ..Default::default()
                        },
                    ],
                    success: vec![
                        RequestOp {
                            request: Some(request_op::Request::RequestPut(PutRequest {
                                key: "foo".into(),
                                value: "baz".into(),
                                ..Default::default()
                            })),
                        },
                        RequestOp {
                            request: Some(request_op::Request::RequestRange(RangeRequest {
                                key: "foo".into(),
                                ..Default::default()
                            })),
                        },
                    ],
                    failure: vec![RequestOp {
                        request: Some(request_op::Request::RequestDeleteRange(
                            DeleteRangeRequest {
                                key: "zz".into(),
                                ..Default::default()
                            },
                        )),
                    }],
                }),
                ..entry(9613111812493483276)
            },
            r#"header:<ID:9613111812493483276 > txn:<compare:<target:VALUE key:"foo" value_size:3  result:GREATER target:MOD key:"x" mod_revision:0 > success:<request_put:<key:"foo" value_size:3 > request_range:<key:"foo" > > failure:<request_delete_range:<key:"zz" > >>"#,
        ),
        (
            InternalRaftRequest {
                lease_grant: Some(LeaseGrantRequest {
                    ttl: 100,
                    id: 0x0568a242d1c91d0d,
                }),
                ..entry(9613111812493483278)
            },
            "header:<ID:9613111812493483278 > lease_grant:<ttl:100-second id:0568a242d1c91d0d>",
        ),
        (
            InternalRaftRequest {
                compaction: Some(CompactionRequest {
                    revision: 2,
                    ..Default::default()
                }),
                ..entry(9613111812493483279)
            },
            "header:<ID:9613111812493483279 > compaction:<revision:2 > ",
        ),
        (
            InternalRaftRequest {
                alarm: Some(AlarmRequest::default()),
                ..entry(9613111812493483280)
            },
            "header:<ID:9613111812493483280 > alarm:<> ",
        ),
        (
            InternalRaftRequest {
                auth_user_add: Some(AuthUserAddRequest {
                    name: "root".into(),
                    password: "pw".into(),
                    ..Default::default()
                }),
                ..entry(9613111812493483281)
            },
            "header:<ID:9613111812493483281 > auth_user_add:<name:root>",
        ),
        (
            InternalRaftRequest {
                auth_status: Some(AuthStatusRequest {}),
                ..entry(9613111812493483282)
            },
            "header:<ID:9613111812493483282 > auth_status:<> ",
        ),
    ];
    for (request, expected) in cases {
        assert_eq!(loggable_entry(&request), expected);
    }
}

#[test]
fn read_only_ranges_are_written_as_etcd_writes_them() {
    let range = RangeRequest {
        key: "a".into(),
        range_end: "b".into(),
        serializable: true,
        ..Default::default()
    };
    assert_eq!(
        compact_text(&range),
        r#"key:"a" range_end:"b" serializable:true "#
    );
}

#[test]
fn bytes_are_quoted_as_go_protobufs_text_format_quotes_them() {
    assert_eq!(
        go_quoted(b"a\n\t\"\\\x00\x7f\xff'"),
        r#""a\n\t\"\\\000\177\377'""#
    );
}

#[test]
fn a_request_slower_than_the_warning_duration_is_counted() {
    let metrics = Metrics::new(1, false);
    let before = metrics.ops.slow_applies();
    let started = Instant::now() - Duration::from_millis(5);
    let warned = warn_if_slow(
        &metrics,
        Duration::from_millis(1),
        started,
        "",
        String::new,
        || Outcome {
            response: String::new(),
            error: None,
        },
    );
    assert!(warned);
    assert_eq!(metrics.ops.slow_applies(), before + 1);
    let fast = warn_if_slow(
        &metrics,
        Duration::from_secs(3600),
        Instant::now(),
        "",
        || unreachable!("only a slow request is written out"),
        || unreachable!(),
    );
    assert!(!fast);
}
