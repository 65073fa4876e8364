//! The state machine without a running member: an entry in, a response
//! out, for every request kind; and replay after a crash changes nothing.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use api::etcdserverpb::alarm_request::AlarmAction;
use api::etcdserverpb::{
    compare, request_op, AlarmRequest, AlarmType, Attributes, ClusterMemberAttrSetRequest,
    CompactionRequest, Compare, DeleteRangeRequest, LeaseCheckpoint, LeaseCheckpointRequest,
    LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use api::rpctypes;
use lease::Lessor;
use mvcc::Store;
use proptest::prelude::*;

use super::request::{ApplyResponse, Request};
use super::{ApplyOutcome, StateMachine};
use crate::alarms::Alarms;
use crate::auth::{AuthConfig, AuthInfo, AuthStore};
use crate::membership::{ClusterMembers, Member};
use crate::metrics::Metrics;

const MEMBER: u64 = 0x8e9e05c52164694d;

/// A member's state machine on `dir`, its leases and alarms rebuilt from
/// the store, as a start does.
pub(super) fn machine(dir: &Path) -> StateMachine {
    let store = Arc::new(Store::open(&dir.join("db")).unwrap());
    let lessor = Arc::new(Lessor::new(5, None));
    {
        let lessor = lessor.clone();
        store.set_lease_lookup(Arc::new(move |id| lessor.exists(id)));
    }
    let members = Arc::new(ClusterMembers::new(vec![Member {
        id: MEMBER,
        name: String::new(),
        peer_urls: vec!["http://127.0.0.1:2380".into()],
        client_urls: Vec::new(),
        is_learner: false,
    }]));
    let m = StateMachine::new(
        store,
        lessor,
        Arc::new(Alarms::default()),
        members,
        Arc::new(Metrics::new(MEMBER, false)),
        Arc::new(test_auth_store()),
    );
    m.recover().unwrap();
    m
}

/// An auth store with simple tokens and bcrypt's lowest cost.
pub(super) fn test_auth_store() -> AuthStore {
    let config = AuthConfig {
        bcrypt_cost: 4,
        ..AuthConfig::default()
    };
    AuthStore::new(
        &config,
        prometheus::IntGauge::new("auth_revision", "test").unwrap(),
    )
    .unwrap()
}

/// Applies `request` as the entry after the last one applied.
pub(super) fn apply(m: &StateMachine, request: impl Into<Request>) -> ApplyOutcome {
    apply_as(m, AuthInfo::default(), request)
}

/// Applies `request` made by `user`.
pub(super) fn apply_as(
    m: &StateMachine,
    user: AuthInfo,
    request: impl Into<Request>,
) -> ApplyOutcome {
    let index = m.store.consistent_index() + 1;
    m.apply(index, Some((user, request.into())))
        .expect("applies")
        .expect("not applied before")
}

pub(super) fn put(key: &str, value: &str, lease: i64) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: value.as_bytes().to_vec().into(),
        lease,
        ..Default::default()
    }
}

pub(super) fn value(m: &StateMachine, key: &str) -> Option<String> {
    let r = m
        .store
        .range(&RangeRequest {
            key: key.as_bytes().to_vec().into(),
            ..Default::default()
        })
        .unwrap();
    r.kvs
        .first()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
}

#[test]
fn every_request_kind_applies_to_its_own_response() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    let Ok(ApplyResponse::Put(r)) = apply(&m, put("a", "1", 0)) else {
        panic!()
    };
    assert_eq!(r.header.unwrap().revision, 2);
    let Ok(ApplyResponse::Txn(r)) = apply(
        &m,
        TxnRequest {
            compare: vec![Compare {
                key: "a".into(),
                target: compare::CompareTarget::Value as i32,
                target_union: Some(compare::TargetUnion::Value("1".into())),
                ..Default::default()
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(put("b", "2", 0))),
            }],
            ..Default::default()
        },
    ) else {
        panic!()
    };
    assert!(r.succeeded);
    assert_eq!(value(&m, "b").as_deref(), Some("2"));
    let Ok(ApplyResponse::DeleteRange(r)) = apply(
        &m,
        DeleteRangeRequest {
            key: "b".into(),
            ..Default::default()
        },
    ) else {
        panic!()
    };
    assert_eq!(r.deleted, 1);
    let Ok(ApplyResponse::Compaction(r)) = apply(
        &m,
        CompactionRequest {
            revision: 3,
            physical: false,
        },
    ) else {
        panic!()
    };
    assert_eq!(r.header.unwrap().revision, 4);
    let Ok(ApplyResponse::LeaseGrant(r)) = apply(&m, LeaseGrantRequest { ttl: 60, id: 7 }) else {
        panic!()
    };
    assert_eq!((r.id, r.ttl), (7, 60));
    apply(&m, put("leased", "x", 7)).unwrap();
    let Ok(ApplyResponse::LeaseCheckpoint(())) = apply(
        &m,
        LeaseCheckpointRequest {
            checkpoints: vec![LeaseCheckpoint {
                id: 7,
                remaining_ttl: 30,
            }],
        },
    ) else {
        panic!()
    };
    let Ok(ApplyResponse::LeaseRevoke(r)) = apply(&m, LeaseRevokeRequest { id: 7 }) else {
        panic!()
    };
    assert_eq!(r.header.unwrap().revision, 6, "the leased key deleted at 6");
    assert_eq!(value(&m, "leased"), None);
    let Ok(ApplyResponse::Alarm(r)) = apply(
        &m,
        AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: MEMBER,
            alarm: AlarmType::Nospace as i32,
        },
    ) else {
        panic!()
    };
    assert_eq!(r.alarms.len(), 1);
    let Ok(ApplyResponse::ClusterMemberAttrSet(())) = apply(
        &m,
        ClusterMemberAttrSetRequest {
            member_id: MEMBER,
            member_attributes: Some(Attributes {
                name: "m1".into(),
                client_urls: vec!["http://127.0.0.1:2379".into()],
            }),
        },
    ) else {
        panic!()
    };
    assert_eq!(m.members.get(MEMBER).unwrap().name, "m1");
    // Each entry recorded its index, and only its own.
    assert_eq!(m.store.consistent_index(), 10);
}

#[test]
fn requests_refused_by_their_own_errors_still_record_their_index() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    assert_eq!(
        apply(&m, put("k", "v", 99)).unwrap_err(),
        rpctypes::LEASE_NOT_FOUND
    );
    assert_eq!(
        apply(&m, LeaseRevokeRequest { id: 99 }).unwrap_err(),
        rpctypes::LEASE_NOT_FOUND
    );
    assert_eq!(
        apply(
            &m,
            CompactionRequest {
                revision: 50,
                physical: false
            }
        )
        .unwrap_err(),
        rpctypes::FUTURE_REV
    );
    assert_eq!(m.store.consistent_index(), 3);
    assert_eq!(m.store.current_revision(), 1, "nothing changed");
}

#[test]
fn nospace_caps_growth_and_corrupt_refuses_writes_as_etcds_appliers() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    apply(&m, put("k", "v", 0)).unwrap();
    let raise = |alarm: AlarmType| AlarmRequest {
        action: AlarmAction::Activate as i32,
        member_id: MEMBER,
        alarm: alarm as i32,
    };
    apply(&m, raise(AlarmType::Nospace)).unwrap();
    assert_eq!(apply(&m, put("k", "w", 0)).unwrap_err(), rpctypes::NO_SPACE);
    assert_eq!(
        apply(&m, LeaseGrantRequest { ttl: 60, id: 1 }).unwrap_err(),
        rpctypes::NO_SPACE
    );
    let delete = DeleteRangeRequest {
        key: "k".into(),
        ..Default::default()
    };
    apply(&m, delete.clone()).expect("a delete frees space");
    apply(&m, raise(AlarmType::Corrupt)).unwrap();
    assert_eq!(apply(&m, delete).unwrap_err(), rpctypes::CORRUPT);
    // Alarms themselves still apply (an operator disarms them).
    apply(
        &m,
        AlarmRequest {
            action: AlarmAction::Deactivate as i32,
            member_id: MEMBER,
            alarm: AlarmType::Corrupt as i32,
        },
    )
    .unwrap();
}

#[test]
fn an_entry_applied_before_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    assert!(m
        .apply(1, Some((AuthInfo::default(), put("k", "1", 0).into())))
        .unwrap()
        .is_some());
    assert!(m
        .apply(1, Some((AuthInfo::default(), put("k", "2", 0).into())))
        .unwrap()
        .is_none());
    assert_eq!(value(&m, "k").as_deref(), Some("1"));
    // An entry with no request (raft's own, a conf change) records its index.
    assert!(m.apply(2, None).unwrap().is_none());
    assert_eq!(m.store.consistent_index(), 2);
}

/// Requests that a random log is made of: puts with and without a lease,
/// deletes, txns, lease grants and revokes, compactions.
fn request() -> impl Strategy<Value = Request> {
    let key = prop::sample::select(vec!["a", "b", "c", "d"]);
    let lease = prop::sample::select(vec![0i64, 0, 1, 2]);
    prop_oneof![
        4 => (key.clone(), "[a-z]{1,3}", lease.clone())
            .prop_map(|(k, v, l)| Request::from(put(k, &v, l))),
        1 => key.clone().prop_map(|k| Request::from(DeleteRangeRequest {
            key: k.as_bytes().to_vec().into(),
            ..Default::default()
        })),
        1 => (key.clone(), key).prop_map(|(a, b)| Request::from(TxnRequest {
            compare: vec![Compare {
                key: a.as_bytes().to_vec().into(),
                target: compare::CompareTarget::Version as i32,
                target_union: Some(compare::TargetUnion::Version(0)),
                ..Default::default()
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(put(a, "created", 0))),
            }],
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                    key: b.as_bytes().to_vec().into(),
                    ..Default::default()
                })),
            }],
        })),
        1 => lease.clone().prop_map(|id| Request::from(LeaseGrantRequest { ttl: 60, id: id.max(1) })),
        1 => lease.prop_map(|id| Request::from(LeaseRevokeRequest { id: id.max(1) })),
        1 => (1i64..20).prop_map(|revision| Request::from(CompactionRequest { revision, physical: false })),
    ]
}

/// Everything a member's state holds, comparable.
fn state(m: &StateMachine) -> (u32, i64, i64, Vec<i64>, u64) {
    let (hash, compacted, revision) = m.store.hash_kv(0).unwrap();
    let mut leases = m.lessor.leases();
    leases.sort_unstable();
    (
        hash,
        compacted,
        revision,
        leases,
        m.store.consistent_index(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// etcd's crash-replay rule: the WAL replays every entry above the
    /// backend's durable consistent index, so applying a log, crashing
    /// after any durable commit (losing what was not committed), then
    /// replaying the whole log leaves exactly the state of one clean apply.
    #[test]
    fn replaying_the_log_after_a_crash_leaves_the_same_state(
        log in prop::collection::vec(request(), 1..40),
        durable_at in any::<prop::sample::Index>(),
    ) {
        let clean_dir = tempfile::tempdir().unwrap();
        let clean = machine(clean_dir.path());
        for (i, request) in log.iter().enumerate() {
            let _ = clean.apply(i as u64 + 1, Some((AuthInfo::default(), request.clone()))).unwrap();
        }

        let dir = tempfile::tempdir().unwrap();
        let durable_at = durable_at.index(log.len());
        {
            let before = machine(dir.path());
            for (i, request) in log.iter().enumerate() {
                let _ = before.apply(i as u64 + 1, Some((AuthInfo::default(), request.clone()))).unwrap();
                if i == durable_at {
                    before.store.commit(true).unwrap();
                }
            }
            // the crash: whatever was not committed is lost
        }
        let replayed = machine(dir.path());
        let started = Instant::now();
        for (i, request) in log.iter().enumerate() {
            let _ = replayed.apply(i as u64 + 1, Some((AuthInfo::default(), request.clone()))).unwrap();
        }
        prop_assert!(started.elapsed().as_secs() < 60);
        prop_assert_eq!(state(&replayed), state(&clean));
        for key in ["a", "b", "c", "d"] {
            prop_assert_eq!(value(&replayed, key), value(&clean, key));
        }
    }
}
