//! Store behaviour, each test named after the etcd behaviour it pins.

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::{
    request_op, response_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, TxnRequest,
};
use api::mvccpb::event::EventType;
use bytes::Bytes;

use crate::{MvccError, Store};

struct TestStore {
    store: Store,
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

fn open() -> TestStore {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    TestStore {
        store: Store::open(&path).unwrap(),
        _dir: dir,
        path,
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn put_req(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: b(key),
        value: b(value),
        ..Default::default()
    }
}

fn put(store: &Store, key: &str, value: &str) -> i64 {
    let mut txn = store.write(0);
    let resp = txn.put(&put_req(key, value)).unwrap();
    let result = txn.end();
    assert_eq!(resp.header.unwrap().revision, result.revision);
    result.revision
}

fn delete(store: &Store, key: &str, end: &str) -> i64 {
    let mut txn = store.write(0);
    let resp = txn
        .delete_range(&DeleteRangeRequest {
            key: b(key),
            range_end: b(end),
            prev_kv: false,
        })
        .unwrap();
    txn.end();
    resp.deleted
}

fn get(store: &Store, key: &str, end: &str) -> RangeResponse {
    store
        .range(&RangeRequest {
            key: b(key),
            range_end: b(end),
            ..Default::default()
        })
        .unwrap()
}

fn keys(resp: &RangeResponse) -> Vec<String> {
    resp.kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

fn abc(store: &Store) {
    put(store, "a", "1");
    put(store, "b", "2");
    put(store, "c", "3");
}

#[test]
fn fresh_store_is_at_revision_one_and_first_write_is_two() {
    let t = open();
    assert_eq!(t.store.current_revision(), 1);
    assert_eq!(get(&t.store, "a", "").header.unwrap().revision, 1);
    assert_eq!(put(&t.store, "a", "1"), 2);
    assert_eq!(t.store.current_revision(), 2);
}

#[test]
fn range_single_key_prefix_from_key_all_and_inverted() {
    let t = open();
    abc(&t.store);
    put(&t.store, "ab", "4");
    assert_eq!(keys(&get(&t.store, "a", "")), ["a"]);
    assert_eq!(keys(&get(&t.store, "a", "b")), ["a", "ab"]);
    assert_eq!(keys(&get(&t.store, "ab", "\0")), ["ab", "b", "c"]);
    assert_eq!(keys(&get(&t.store, "\0", "\0")), ["a", "ab", "b", "c"]);
    assert!(get(&t.store, "c", "a").kvs.is_empty());
    assert_eq!(get(&t.store, "c", "a").count, 0);
    assert!(get(&t.store, "zz", "").kvs.is_empty());
}

#[test]
fn range_future_revision_fails_with_future_rev() {
    let t = open();
    abc(&t.store);
    let err = t
        .store
        .range(&RangeRequest {
            key: b("a"),
            revision: 5,
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(err, MvccError::FutureRev);
    assert_eq!(
        err.to_string(),
        "mvcc: required revision is a future revision"
    );
}

#[test]
fn range_historical_read_returns_old_value_with_current_header_revision() {
    let t = open();
    put(&t.store, "a", "old");
    put(&t.store, "a", "new");
    let resp = t
        .store
        .range(&RangeRequest {
            key: b("a"),
            revision: 2,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(resp.kvs[0].value, b("old"));
    assert_eq!(resp.kvs[0].version, 1);
    assert_eq!(resp.header.unwrap().revision, 3);
}

#[test]
fn range_limit_sets_more_and_count_counts_whole_range() {
    let t = open();
    abc(&t.store);
    let resp = t
        .store
        .range(&RangeRequest {
            key: b("\0"),
            range_end: b("\0"),
            limit: 2,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(keys(&resp), ["a", "b"]);
    assert!(resp.more);
    assert_eq!(resp.count, 3);
    let resp = t
        .store
        .range(&RangeRequest {
            key: b("\0"),
            range_end: b("\0"),
            limit: 3,
            ..Default::default()
        })
        .unwrap();
    assert!(!resp.more);
}

#[test]
fn range_sort_targets_and_orders_as_etcd_applier() {
    let t = open();
    put(&t.store, "a", "z");
    put(&t.store, "b", "y");
    put(&t.store, "b", "y2");
    put(&t.store, "c", "x");
    let sorted = |target: SortTarget, order: SortOrder, limit: i64| {
        let resp = t
            .store
            .range(&RangeRequest {
                key: b("a"),
                range_end: b("d"),
                sort_target: target as i32,
                sort_order: order as i32,
                limit,
                ..Default::default()
            })
            .unwrap();
        (keys(&resp), resp.more, resp.count)
    };
    assert_eq!(
        sorted(SortTarget::Key, SortOrder::Descend, 0).0,
        ["c", "b", "a"]
    );
    assert_eq!(
        sorted(SortTarget::Key, SortOrder::Descend, 2),
        (vec!["c".to_string(), "b".into()], true, 3)
    );
    // NONE with a non-key target sorts ascending.
    assert_eq!(
        sorted(SortTarget::Value, SortOrder::None, 0).0,
        ["c", "b", "a"]
    );
    assert_eq!(sorted(SortTarget::Version, SortOrder::Descend, 1).0, ["b"]);
    // Stable: equal versions keep key order.
    assert_eq!(
        sorted(SortTarget::Version, SortOrder::Ascend, 0).0,
        ["a", "c", "b"]
    );
    assert_eq!(
        sorted(SortTarget::Create, SortOrder::Descend, 0).0,
        ["c", "b", "a"]
    );
    assert_eq!(
        sorted(SortTarget::Mod, SortOrder::Ascend, 0).0,
        ["a", "b", "c"]
    );
    assert_eq!(
        sorted(SortTarget::Mod, SortOrder::Descend, 0).0,
        ["c", "b", "a"]
    );
}

#[test]
fn range_keys_only_drops_values_and_count_only_drops_kvs() {
    let t = open();
    abc(&t.store);
    let resp = t
        .store
        .range(&RangeRequest {
            key: b("a"),
            range_end: b("z"),
            keys_only: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(resp.kvs.len(), 3);
    assert!(resp
        .kvs
        .iter()
        .all(|kv| kv.value.is_empty() && kv.version == 1));
    let resp = t
        .store
        .range(&RangeRequest {
            key: b("a"),
            range_end: b("z"),
            count_only: true,
            limit: 1,
            ..Default::default()
        })
        .unwrap();
    assert!(resp.kvs.is_empty());
    assert_eq!(resp.count, 3);
    assert!(!resp.more);
}

#[test]
fn range_mod_and_create_revision_filters_leave_count_unchanged() {
    let t = open();
    abc(&t.store); // a@2 b@3 c@4
    put(&t.store, "a", "again"); // a@5, created 2
    let filtered = |req: RangeRequest| {
        let resp = t
            .store
            .range(&RangeRequest {
                key: b("a"),
                range_end: b("z"),
                ..req
            })
            .unwrap();
        (keys(&resp), resp.count)
    };
    let (k, count) = filtered(RangeRequest {
        min_mod_revision: 4,
        ..Default::default()
    });
    assert_eq!((k, count), (vec!["a".to_string(), "c".into()], 3));
    let (k, _) = filtered(RangeRequest {
        max_mod_revision: 3,
        ..Default::default()
    });
    assert_eq!(k, ["b"]);
    let (k, _) = filtered(RangeRequest {
        min_create_revision: 3,
        ..Default::default()
    });
    assert_eq!(k, ["b", "c"]);
    let (k, _) = filtered(RangeRequest {
        max_create_revision: 2,
        ..Default::default()
    });
    assert_eq!(k, ["a"]);
    // Filters apply before limit: more is computed on what survived.
    let resp = t
        .store
        .range(&RangeRequest {
            key: b("a"),
            range_end: b("z"),
            min_mod_revision: 4,
            limit: 1,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        (keys(&resp), resp.more, resp.count),
        (vec!["a".to_string()], true, 3)
    );
}

#[test]
fn put_versions_and_create_revision_restart_after_delete() {
    let t = open();
    put(&t.store, "a", "1");
    put(&t.store, "a", "2");
    let kv = get(&t.store, "a", "").kvs.remove(0);
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    assert_eq!(delete(&t.store, "a", ""), 1);
    assert!(get(&t.store, "a", "").kvs.is_empty());
    put(&t.store, "a", "3");
    let kv = get(&t.store, "a", "").kvs.remove(0);
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (5, 5, 1));
}

#[test]
fn put_prev_kv_lease_ignore_value_and_ignore_lease() {
    let t = open();
    let mut txn = t.store.write(0);
    txn.put(&PutRequest {
        lease: 7,
        ..put_req("a", "v1")
    })
    .unwrap();
    txn.end();
    let mut txn = t.store.write(0);
    let resp = txn
        .put(&PutRequest {
            prev_kv: true,
            ignore_value: true,
            lease: 9,
            ..put_req("a", "")
        })
        .unwrap();
    txn.end();
    let prev = resp.prev_kv.unwrap();
    assert_eq!((prev.value, prev.lease), (b("v1"), 7));
    let kv = get(&t.store, "a", "").kvs.remove(0);
    assert_eq!((kv.value.clone(), kv.lease, kv.version), (b("v1"), 9, 2));

    let mut txn = t.store.write(0);
    txn.put(&PutRequest {
        ignore_lease: true,
        ..put_req("a", "v2")
    })
    .unwrap();
    txn.end();
    let kv = get(&t.store, "a", "").kvs.remove(0);
    assert_eq!((kv.value, kv.lease), (b("v2"), 9));
}

#[test]
fn put_ignore_value_on_missing_key_fails_with_key_not_found() {
    let t = open();
    let mut txn = t.store.write(0);
    let err = txn
        .put(&PutRequest {
            ignore_value: true,
            ..put_req("missing", "")
        })
        .unwrap_err();
    assert_eq!(err.to_string(), "etcdserver: key not found");
    let err = txn
        .put(&PutRequest {
            ignore_lease: true,
            ..put_req("missing", "x")
        })
        .unwrap_err();
    assert_eq!(err, MvccError::KeyNotFound);
    let result = txn.end();
    assert_eq!(result.revision, 1);
    assert!(result.events.is_empty());
}

#[test]
fn delete_range_counts_returns_prev_kvs_and_emits_events() {
    let t = open();
    abc(&t.store);
    let mut txn = t.store.write(0);
    let resp = txn
        .delete_range(&DeleteRangeRequest {
            key: b("a"),
            range_end: b("c"),
            prev_kv: true,
        })
        .unwrap();
    let result = txn.end();
    assert_eq!(resp.deleted, 2);
    assert_eq!(resp.prev_kvs.len(), 2);
    assert_eq!(resp.header.unwrap().revision, 5);
    assert_eq!(result.revision, 5);
    assert_eq!(result.events.len(), 2);
    for (sub, event) in result.events.iter().enumerate() {
        assert_eq!(event.r#type, EventType::Delete as i32);
        let kv = event.kv.as_ref().unwrap();
        assert_eq!(kv.mod_revision, 5);
        assert_eq!(kv.key, b(["a", "b"][sub]));
        assert!(event.prev_kv.is_none(), "looked up as a watcher is sent it");
    }
    assert_eq!(keys(&get(&t.store, "\0", "\0")), ["c"]);
    // History is still readable below the delete.
    let old = t
        .store
        .range(&RangeRequest {
            key: b("a"),
            revision: 4,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(old.kvs.len(), 1);
}

#[test]
fn delete_range_of_nothing_does_not_bump_revision() {
    let t = open();
    abc(&t.store);
    let mut txn = t.store.write(0);
    let resp = txn
        .delete_range(&DeleteRangeRequest {
            key: b("x"),
            range_end: b("z"),
            prev_kv: true,
        })
        .unwrap();
    let result = txn.end();
    assert_eq!((resp.deleted, resp.header.unwrap().revision), (0, 4));
    assert_eq!(result.revision, 4);
    assert_eq!(t.store.pending_ops(), 3);
}

#[test]
fn put_events_carry_no_prev_kv_a_write_reads_no_previous_value() {
    let t = open();
    put(&t.store, "a", "1");
    let mut txn = t.store.write(0);
    txn.put(&put_req("a", "2")).unwrap();
    txn.put(&put_req("b", "x")).unwrap();
    let result = txn.end();
    assert_eq!(result.revision, 3);
    let e0 = &result.events[0];
    assert_eq!(e0.r#type, EventType::Put as i32);
    assert_eq!(e0.kv.as_ref().unwrap().value, b("2"));
    // A write reads no previous value for its events: a watcher that asks
    // for prev_kv gets it looked up as it is sent.
    assert!(result.events.iter().all(|e| e.prev_kv.is_none()));
}

fn cmp(key: &str, target: CompareTarget, result: CompareResult, value: TargetUnion) -> Compare {
    Compare {
        key: b(key),
        target: target as i32,
        result: result as i32,
        target_union: Some(value),
        range_end: Bytes::new(),
    }
}

fn op_put(key: &str, value: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(put_req(key, value))),
    }
}

fn op_get(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: b(key),
            ..Default::default()
        })),
    }
}

fn txn_succeeds(store: &Store, compare: Compare) -> bool {
    let mut txn = store.write(0);
    let resp = txn
        .txn(&TxnRequest {
            compare: vec![compare],
            ..Default::default()
        })
        .unwrap();
    txn.end();
    resp.succeeded
}

#[test]
fn txn_compare_targets_and_results_as_etcd_apply_compare() {
    use CompareResult::*;
    use CompareTarget::*;
    let t = open();
    let mut txn = t.store.write(0);
    txn.put(&PutRequest {
        lease: 5,
        ..put_req("a", "m")
    })
    .unwrap();
    txn.end(); // a: create 2, mod 2, version 1, lease 5
    let s = &t.store;
    assert!(txn_succeeds(
        s,
        cmp("a", Value, Equal, TargetUnion::Value(b("m")))
    ));
    assert!(txn_succeeds(
        s,
        cmp("a", Value, Greater, TargetUnion::Value(b("l")))
    ));
    assert!(txn_succeeds(
        s,
        cmp("a", Value, Less, TargetUnion::Value(b("n")))
    ));
    assert!(txn_succeeds(
        s,
        cmp("a", Value, NotEqual, TargetUnion::Value(b("x")))
    ));
    assert!(txn_succeeds(
        s,
        cmp("a", Version, Equal, TargetUnion::Version(1))
    ));
    assert!(txn_succeeds(
        s,
        cmp("a", Create, Equal, TargetUnion::CreateRevision(2))
    ));
    assert!(txn_succeeds(
        s,
        cmp("a", Mod, Less, TargetUnion::ModRevision(3))
    ));
    assert!(txn_succeeds(
        s,
        cmp("a", Lease, Equal, TargetUnion::Lease(5))
    ));
    assert!(!txn_succeeds(
        s,
        cmp("a", Lease, Greater, TargetUnion::Lease(5))
    ));
    // Missing key: VALUE always fails, others compare a zero KeyValue.
    assert!(!txn_succeeds(
        s,
        cmp("zz", Value, NotEqual, TargetUnion::Value(b("x")))
    ));
    assert!(txn_succeeds(
        s,
        cmp("zz", Version, Equal, TargetUnion::Version(0))
    ));
    assert!(txn_succeeds(
        s,
        cmp("zz", Create, Equal, TargetUnion::CreateRevision(0))
    ));
    assert!(txn_succeeds(
        s,
        cmp("zz", Lease, Equal, TargetUnion::Lease(0))
    ));
    assert_eq!(t.store.current_revision(), 2, "read-only txns do not bump");
}

#[test]
fn txn_compare_over_range_requires_every_key_to_pass() {
    use CompareResult::*;
    use CompareTarget::*;
    let t = open();
    abc(&t.store); // mods 2,3,4
    let ranged = |result, m| Compare {
        range_end: b("c"),
        ..cmp("a", Mod, result, TargetUnion::ModRevision(m))
    };
    assert!(txn_succeeds(&t.store, ranged(Less, 4)));
    assert!(!txn_succeeds(&t.store, ranged(Less, 3)));
    assert!(txn_succeeds(&t.store, ranged(Greater, 1)));
    let empty = Compare {
        range_end: b("y"),
        ..cmp("x", Value, Equal, TargetUnion::Value(Bytes::new()))
    };
    assert!(!txn_succeeds(&t.store, empty));
}

#[test]
fn txn_ops_share_one_revision_with_increasing_sub_and_nested_txns() {
    let t = open();
    put(&t.store, "a", "1");
    let inner = TxnRequest {
        compare: vec![cmp(
            "a",
            CompareTarget::Value,
            CompareResult::Equal,
            TargetUnion::Value(b("nope")),
        )],
        success: vec![op_put("never", "x")],
        failure: vec![op_put("c", "3"), op_get("b")],
    };
    let req = TxnRequest {
        compare: vec![cmp(
            "a",
            CompareTarget::Value,
            CompareResult::Equal,
            TargetUnion::Value(b("1")),
        )],
        success: vec![
            op_get("a"),
            op_put("b", "2"),
            RequestOp {
                request: Some(request_op::Request::RequestTxn(inner)),
            },
        ],
        failure: vec![],
    };
    let mut txn = t.store.write(0);
    let resp = txn.txn(&req).unwrap();
    let result = txn.end();
    assert!(resp.succeeded);
    assert_eq!(resp.header.unwrap().revision, 3);
    assert_eq!(result.revision, 3);
    let kinds: Vec<_> = result
        .events
        .iter()
        .map(|e| {
            let kv = e.kv.as_ref().unwrap();
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                kv.mod_revision,
            )
        })
        .collect();
    assert_eq!(kinds, [("b".to_string(), 3), ("c".to_string(), 3)]);
    let Some(response_op::Response::ResponseTxn(nested)) = &resp.responses[2].response else {
        panic!("nested txn response expected");
    };
    assert!(!nested.succeeded);
    // The nested range sees the earlier put of this txn.
    let Some(response_op::Response::ResponseRange(r)) = &nested.responses[1].response else {
        panic!("range response expected");
    };
    assert_eq!(r.kvs[0].value, b("2"));
    assert_eq!(r.header.as_ref().unwrap().revision, 3);
    // Sub revisions: b is (3,0), c is (3,1) — both readable at revision 3.
    assert_eq!(keys(&get(&t.store, "a", "z")), ["a", "b", "c"]);
}

#[test]
fn txn_error_in_chosen_branch_changes_nothing() {
    let t = open();
    put(&t.store, "a", "1");
    let delete_a = RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: b("a"),
                ..Default::default()
            },
        )),
    };
    let put_ignore = RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            ignore_value: true,
            ..put_req("a", "")
        })),
    };
    // Passes the pre-txn check (a exists), fails when applied after the delete.
    let req = TxnRequest {
        success: vec![op_put("b", "2"), delete_a, put_ignore.clone()],
        ..Default::default()
    };
    let mut txn = t.store.write(0);
    assert_eq!(txn.txn(&req).unwrap_err(), MvccError::KeyNotFound);
    let result = txn.end();
    assert_eq!(result.revision, 2);
    assert!(result.events.is_empty());
    assert_eq!(keys(&get(&t.store, "\0", "\0")), ["a"]);

    // Caught by the check before anything is applied.
    let req = TxnRequest {
        success: vec![
            op_put("b", "2"),
            RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    ignore_lease: true,
                    ..put_req("missing", "x")
                })),
            },
        ],
        ..Default::default()
    };
    let mut txn = t.store.write(0);
    assert_eq!(txn.txn(&req).unwrap_err(), MvccError::KeyNotFound);
    assert_eq!(txn.end().revision, 2);
}

#[test]
fn txn_range_at_future_or_compacted_revision_fails_before_any_change() {
    let t = open();
    abc(&t.store);
    t.store.compact(3, 0).unwrap();
    for (revision, expected) in [(5, MvccError::FutureRev), (2, MvccError::Compacted)] {
        let req = TxnRequest {
            success: vec![
                op_put("x", "1"),
                RequestOp {
                    request: Some(request_op::Request::RequestRange(RangeRequest {
                        key: b("a"),
                        revision,
                        ..Default::default()
                    })),
                },
            ],
            ..Default::default()
        };
        let mut txn = t.store.write(0);
        assert_eq!(txn.txn(&req).unwrap_err(), expected);
        assert_eq!(txn.end().revision, 4);
    }
}

#[test]
fn txn_read_only_does_not_bump_revision() {
    let t = open();
    abc(&t.store);
    let req = TxnRequest {
        success: vec![op_get("a"), op_get("b")],
        ..Default::default()
    };
    assert!(crate::is_txn_read_only(&req));
    let mut txn = t.store.write(0);
    let resp = txn.txn(&req).unwrap();
    let result = txn.end();
    assert_eq!(resp.header.unwrap().revision, 4);
    assert_eq!(result.revision, 4);
    assert!(!crate::is_txn_read_only(&TxnRequest {
        failure: vec![op_put("a", "1")],
        ..Default::default()
    }));
}

#[test]
fn dropped_txn_write_discards_its_changes() {
    let t = open();
    put(&t.store, "a", "1");
    {
        let mut txn = t.store.write(9);
        txn.put(&put_req("a", "2")).unwrap();
        txn.put(&put_req("b", "2")).unwrap();
        txn.delete_range(&DeleteRangeRequest {
            key: b("a"),
            ..Default::default()
        })
        .unwrap();
        txn.put(&put_req("a", "3")).unwrap();
        let inside = txn.range(&RangeRequest {
            key: b("a"),
            range_end: b("z"),
            ..Default::default()
        });
        assert_eq!(inside.unwrap().kvs.len(), 2);
        // Other readers never see an unfinished transaction.
        assert_eq!(get(&t.store, "b", "").kvs.len(), 0);
    }
    assert_eq!(t.store.current_revision(), 2);
    assert_eq!(t.store.consistent_index(), 0);
    let kv = get(&t.store, "a", "z").kvs;
    assert_eq!(kv.len(), 1);
    assert_eq!((kv[0].value.clone(), kv[0].version), (b("1"), 1));
    assert_eq!(put(&t.store, "a", "4"), 3);
    assert_eq!(get(&t.store, "a", "").kvs[0].version, 2);
}

#[test]
fn compact_keeps_latest_revision_and_fails_below_it() {
    let t = open();
    put(&t.store, "a", "1"); // 2
    put(&t.store, "a", "2"); // 3
    put(&t.store, "b", "1"); // 4
    delete(&t.store, "b", ""); // 5
    put(&t.store, "c", "1"); // 6
    assert_eq!(t.store.compact(7, 0).unwrap_err(), MvccError::FutureRev);
    t.store.compact(5, 0).unwrap();
    assert_eq!(t.store.compact_revision(), 5);
    assert_eq!(t.store.compact(5, 0).unwrap_err(), MvccError::Compacted);
    assert_eq!(t.store.compact(4, 0).unwrap_err(), MvccError::Compacted);
    let at = |revision| {
        t.store.range(&RangeRequest {
            key: b("\0"),
            range_end: b("\0"),
            revision,
            ..Default::default()
        })
    };
    assert_eq!(at(4).unwrap_err(), MvccError::Compacted);
    assert_eq!(
        at(4).unwrap_err().to_string(),
        "mvcc: required revision has been compacted"
    );
    let at5 = at(5).unwrap();
    assert_eq!(keys(&at5), ["a"]);
    assert_eq!(at5.kvs[0].version, 2);
    assert_eq!(keys(&at(0).unwrap()), ["a", "c"]);
    // a@2 and b@4 are dropped from the index and the file; b's tombstone
    // at exactly the compact revision stays (etcd 3.5.16).
    assert_eq!(t.store.index_len(), 3);
    t.store.commit(true).unwrap();
    assert_eq!(t.store.pending_ops(), 0);
    drop(t.store);
    let reopened = Store::open(&t.path).unwrap();
    assert_eq!(reopened.compact_revision(), 5);
    assert_eq!(reopened.index_len(), 3);
    assert_eq!(reopened.current_revision(), 6);
    assert_eq!(
        reopened
            .range(&RangeRequest {
                key: b("a"),
                revision: 4,
                ..Default::default()
            })
            .unwrap_err(),
        MvccError::Compacted
    );
    let kv = get(&reopened, "a", "").kvs.remove(0);
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
}

#[test]
fn compact_of_uncommitted_writes_removes_them_in_the_same_commit() {
    let t = open();
    put(&t.store, "a", "1");
    delete(&t.store, "a", "");
    put(&t.store, "b", "1");
    t.store.compact(4, 0).unwrap();
    t.store.commit(false).unwrap();
    drop(t.store);
    let reopened = Store::open(&t.path).unwrap();
    assert_eq!(reopened.index_len(), 1);
    assert_eq!(reopened.current_revision(), 4);
    let (hash_reopened, _, _) = reopened.hash_kv(0).unwrap();
    let other = open();
    put(&other.store, "a", "1");
    delete(&other.store, "a", "");
    put(&other.store, "b", "1");
    other.store.compact(4, 0).unwrap();
    assert_eq!(other.store.hash_kv(0).unwrap().0, hash_reopened);
}

#[test]
fn reopen_restores_committed_state_and_forgets_uncommitted_writes() {
    let t = open();
    let mut txn = t.store.write(10);
    txn.put(&PutRequest {
        lease: 3,
        ..put_req("a", "1")
    })
    .unwrap();
    txn.put(&put_req("b", "1")).unwrap();
    txn.end();
    put(&t.store, "a", "2");
    delete(&t.store, "b", "");
    put(&t.store, "b", "new");
    t.store.set_consistent_index(11);
    t.store.commit(false).unwrap();
    assert_eq!(t.store.durable_consistent_index(), 0);
    t.store.commit(true).unwrap();
    assert_eq!(t.store.durable_consistent_index(), 11);
    let before_all = get(&t.store, "\0", "\0");
    let before_old = t
        .store
        .range(&RangeRequest {
            key: b("\0"),
            range_end: b("\0"),
            revision: 3,
            ..Default::default()
        })
        .unwrap();
    let (hash, _, _) = t.store.hash_kv(0).unwrap();
    // Applied but never committed: the WAL would replay it.
    let mut txn = t.store.write(12);
    txn.put(&put_req("c", "lost")).unwrap();
    txn.end();
    assert_eq!(t.store.consistent_index(), 12);
    drop(t.store);

    let store = Store::open(&t.path).unwrap();
    assert_eq!(store.current_revision(), 5);
    assert_eq!(store.consistent_index(), 11);
    assert_eq!(store.durable_consistent_index(), 11);
    assert_eq!(get(&store, "\0", "\0").kvs, before_all.kvs);
    let old = store
        .range(&RangeRequest {
            key: b("\0"),
            range_end: b("\0"),
            revision: 3,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(old.kvs, before_old.kvs);
    assert_eq!(store.hash_kv(0).unwrap().0, hash);
    let at2 = store
        .range(&RangeRequest {
            key: b("a"),
            revision: 2,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(at2.kvs[0].lease, 3);
    assert!(get(&store, "c", "").kvs.is_empty());
    assert_eq!(put(&store, "c", "again"), 6);
    assert!(store.db_size() > 0);
    assert!(store.db_size_in_use() > 0);
}

#[test]
fn hash_kv_is_independent_of_commit_timing_and_tracks_revisions() {
    let a = open();
    let b_ = open();
    for (i, s) in [&a.store, &b_.store].into_iter().enumerate() {
        put(s, "x", "1");
        if i == 0 {
            s.commit(false).unwrap();
        }
        put(s, "y", "2");
        delete(s, "x", "");
    }
    let (ha, compact, rev) = a.store.hash_kv(0).unwrap();
    assert_eq!(
        (compact, rev),
        (-1, 4),
        "etcd: -1 until the first compaction"
    );
    assert_eq!(b_.store.hash_kv(0).unwrap().0, ha);
    assert_eq!(a.store.hash_kv(3).unwrap(), b_.store.hash_kv(3).unwrap());
    assert_ne!(a.store.hash_kv(3).unwrap().0, ha);
    assert_eq!(a.store.hash_kv(9).unwrap_err(), MvccError::FutureRev);
    let at_three = a.store.hash_kv(3).unwrap();
    a.store.compact(3, 0).unwrap();
    assert_eq!(a.store.hash_kv(2).unwrap_err(), MvccError::Compacted);
    assert_eq!(a.store.hash_kv(0).unwrap().1, 3);
    // the compaction records the hash at its revision as it was before it,
    // which HashKV at that revision answers from then on (etcd's
    // hashStorage; recorded off the write path)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while a.store.hash_kv(3).unwrap() != at_three {
        assert!(std::time::Instant::now() < deadline, "no compaction hash");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn consistent_index_is_recorded_by_end_and_set_consistent_index() {
    let t = open();
    assert_eq!(t.store.consistent_index(), 0);
    let txn = t.store.write(4);
    assert_eq!(txn.end().revision, 1);
    assert_eq!(t.store.consistent_index(), 4);
    t.store.set_consistent_index(5);
    assert_eq!(t.store.consistent_index(), 5);
    assert_eq!(t.store.pending_ops(), 0);
    t.store.commit(true).unwrap();
    assert_eq!(t.store.durable_consistent_index(), 5);
    drop(t.store);
    assert_eq!(Store::open(&t.path).unwrap().consistent_index(), 5);
}

#[test]
fn readers_on_other_threads_see_published_writes() {
    let t = open();
    let store = &t.store;
    let done = std::sync::atomic::AtomicBool::new(false);
    let done = &done;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            for i in 0..200 {
                put(store, &format!("k{:03}", i % 20), &i.to_string());
                if i % 17 == 0 {
                    store.commit(i % 34 == 0).unwrap();
                }
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        for _ in 0..2 {
            scope.spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    let resp = get(store, "k", "l");
                    let header = resp.header.unwrap().revision;
                    // Every key seen is at or below the header revision.
                    assert!(resp.kvs.iter().all(|kv| kv.mod_revision <= header));
                    assert_eq!(resp.count as usize, resp.kvs.len());
                }
            });
        }
    });
    assert_eq!(store.current_revision(), 201);
}

#[test]
fn store_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
}

#[test]
fn compact_zero_on_fresh_store_is_accepted_once_as_etcd() {
    let t = open();
    t.store.compact(0, 0).unwrap();
    assert_eq!(t.store.compact_revision(), 0);
    assert_eq!(t.store.compact(0, 0).unwrap_err(), MvccError::Compacted);
    t.store.compact(1, 0).unwrap();
    assert_eq!(t.store.compact(2, 0).unwrap_err(), MvccError::FutureRev);
}

#[test]
fn member_records_persist_with_the_consistent_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let store = Store::open(&path).unwrap();
        store.put_member(7, Some(b"seven".to_vec()), 3);
        store.put_member(9, Some(b"nine".to_vec()), 4);
        assert_eq!(store.members().unwrap().len(), 2);
        store.put_member(9, None, 5);
        assert_eq!(
            store.members().unwrap().keys().copied().collect::<Vec<_>>(),
            vec![7]
        );
        store.commit(true).unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.consistent_index(), 5);
    assert_eq!(
        store.members().unwrap().get(&7).map(Vec::as_slice),
        Some(&b"seven"[..])
    );
    assert!(!store.members().unwrap().contains_key(&9));
}

#[test]
fn a_tombstone_kept_at_the_compact_revision_survives_a_restart_and_goes_with_the_next_compaction() {
    let t = open();
    put(&t.store, "b", "1"); // 2
    delete(&t.store, "b", ""); // 3
    put(&t.store, "c", "1"); // 4
    t.store.compact(3, 0).unwrap();
    assert_eq!(t.store.index_len(), 2, "b's tombstone and c");
    t.store.commit(true).unwrap();
    drop(t.store);
    let reopened = Store::open(&t.path).unwrap();
    assert_eq!(reopened.index_len(), 2, "rebuilt from the file");
    reopened.compact(4, 0).unwrap();
    reopened.commit(true).unwrap();
    assert_eq!(reopened.index_len(), 1, "only c");
    drop(reopened);
    assert_eq!(Store::open(&t.path).unwrap().index_len(), 1);
}

#[test]
fn a_scheduled_compaction_left_unfinished_is_resumed_on_open() {
    // etcd writes scheduledCompactRev with the compaction's entry and
    // finishedCompactRev once the records are gone, in another
    // transaction; an etcd backend imported between the two (a snapshot or
    // `oxctl migrate` of a killed member) opens with the compaction done.
    let t = open();
    put(&t.store, "a", "1");
    put(&t.store, "a", "2");
    put(&t.store, "b", "1");
    t.store.commit(true).unwrap();
    drop(t.store);
    {
        let db = crate::backend::open_database(&t.path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(crate::backend::META_TABLE).unwrap();
            meta.insert(
                crate::backend::META_SCHEDULED_COMPACT_REV,
                &3i64.to_be_bytes()[..],
            )
            .unwrap();
        }
        txn.commit().unwrap();
    }
    let reopened = Store::open(&t.path).unwrap();
    assert_eq!(reopened.compact_revision(), 3);
    assert_eq!(
        reopened
            .range(&RangeRequest {
                key: b("a"),
                revision: 2,
                ..Default::default()
            })
            .unwrap_err(),
        MvccError::Compacted
    );
    assert_eq!(get(&reopened, "a", "").kvs[0].mod_revision, 3);
    drop(reopened);
    // and it is finished for good: the next open has nothing to resume
    let again = Store::open(&t.path).unwrap();
    assert_eq!(again.compact_revision(), 3);
    assert_eq!(again.index_len(), 2);
}

#[test]
fn size_in_use_tracks_a_load_without_a_durable_commit_and_drops_after_a_compaction() {
    // etcd's dbSizeInUse follows every commit; a member loaded before its
    // first durable commit reported the fresh file's few pages.
    let t = open();
    let fresh = t.store.db_size_in_use();
    let value = "v".repeat(8 * 1024);
    let keys = 100;
    for round in 0..2 {
        for i in 0..keys {
            put(&t.store, &format!("key{i:03}"), &value);
            if i % 25 == 24 {
                t.store.commit(false).unwrap();
            }
        }
        let written = (round + 1) * keys * value.len() as i64;
        let in_use = t.store.db_size_in_use();
        assert!(
            in_use >= fresh + written,
            "{in_use} B in use after {written} B written"
        );
        assert!(
            in_use <= t.store.db_size(),
            "{in_use} B in use in a file of {} B",
            t.store.db_size()
        );
    }
    // Compacting at the last revision drops the first round's values; both
    // figures counted (the pages, the compaction's commit counts them too).
    let before = t.store.measure_size_in_use().unwrap();
    t.store.compact(t.store.current_revision(), 0).unwrap();
    t.store.commit(false).unwrap();
    let after = t.store.db_size_in_use();
    assert!(
        after <= before - keys * value.len() as i64 / 2,
        "{after} B in use after the compaction, {before} B before"
    );
}
