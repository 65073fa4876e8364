//! Model-based test: random histories of put / delete / txn / compact / range
//! (historical reads included) with random commits and reopens, against a
//! plain model that keeps a full snapshot per revision. Every response and
//! every event list must match exactly.

use std::collections::BTreeMap;

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::{
    request_op, response_op, Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest,
    TxnResponse,
};
use api::mvccpb::{event::EventType, Event, KeyValue};
use bytes::Bytes;
use mvcc::{MvccError, Store};
use proptest::prelude::*;

const KEYS: &[&str] = &["a", "b", "c", "d", "e"];

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

// ---------------------------------------------------------------- the model

type Snapshot = BTreeMap<Bytes, KeyValue>;

#[derive(Clone)]
struct Model {
    /// snapshots[r] is the state at revision r; revision 0 and 1 are empty.
    snapshots: Vec<Snapshot>,
    /// -1 until the first compaction (etcd accepts compact(0) once).
    compacted: i64,
    /// (consistent index, revision, compacted) of every commit.
    commits: Vec<(u64, i64, i64)>,
    last_durable_index: u64,
}

fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == start,
        [0] => key >= start,
        end => key >= start && key < end,
    }
}

impl Model {
    fn new() -> Model {
        Model {
            snapshots: vec![Snapshot::new(), Snapshot::new()],
            compacted: -1,
            commits: vec![(0, 1, -1)],
            last_durable_index: 0,
        }
    }

    fn current(&self) -> i64 {
        self.snapshots.len() as i64 - 1
    }

    fn range_at(&self, snapshot: &Snapshot, req: &RangeRequest, header_rev: i64) -> RangeResponse {
        let all: Vec<KeyValue> = snapshot
            .values()
            .filter(|kv| in_range(&kv.key, &req.key, &req.range_end))
            .cloned()
            .collect();
        let count = all.len() as i64;
        let mut kvs: Vec<KeyValue> = all
            .into_iter()
            .filter(|kv| req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            .filter(|kv| req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            .filter(|kv| {
                req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision
            })
            .filter(|kv| {
                req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision
            })
            .collect();
        let mut order = req.sort_order();
        if req.sort_target() != SortTarget::Key && order == SortOrder::None {
            order = SortOrder::Ascend;
        }
        if order != SortOrder::None {
            let key = |kv: &KeyValue| -> (i64, Bytes) {
                match req.sort_target() {
                    SortTarget::Key => (0, kv.key.clone()),
                    SortTarget::Version => (kv.version, Bytes::new()),
                    SortTarget::Create => (kv.create_revision, Bytes::new()),
                    SortTarget::Mod => (kv.mod_revision, Bytes::new()),
                    SortTarget::Value => (0, kv.value.clone()),
                }
            };
            // Stable: ties keep key order, in both directions.
            if order == SortOrder::Descend {
                kvs.sort_by_key(|kv| std::cmp::Reverse(key(kv)));
            } else {
                kvs.sort_by_key(key);
            }
        }
        let mut more = false;
        if req.limit > 0 && kvs.len() > req.limit as usize {
            kvs.truncate(req.limit as usize);
            more = true;
        }
        if req.keys_only {
            kvs.iter_mut().for_each(|kv| kv.value = Bytes::new());
        }
        if req.count_only {
            kvs.clear();
            more = false;
        }
        RangeResponse {
            header: header(header_rev),
            kvs,
            more,
            count,
        }
    }

    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        let current = self.current();
        if req.revision > current {
            return Err(MvccError::FutureRev);
        }
        let rev = if req.revision <= 0 {
            current
        } else {
            req.revision
        };
        if rev < self.compacted {
            return Err(MvccError::Compacted);
        }
        Ok(self.range_at(&self.snapshots[rev as usize], req, current))
    }

    fn compact(&mut self, revision: i64) -> Result<(), MvccError> {
        if revision <= self.compacted {
            return Err(MvccError::Compacted);
        }
        if revision > self.current() {
            return Err(MvccError::FutureRev);
        }
        self.compacted = revision;
        Ok(())
    }

    fn commit(&mut self, index: u64, durable: bool) {
        self.commits.push((index, self.current(), self.compacted));
        if durable {
            self.last_durable_index = index;
        }
    }

    /// Back to the commit the reopened file holds: at least the last durable
    /// one (a clean close may or may not have flushed later ones).
    fn reopen(&mut self, index: u64) -> Result<(), TestCaseError> {
        prop_assert!(index >= self.last_durable_index);
        let Some(&(_, revision, compacted)) = self.commits.iter().find(|c| c.0 == index) else {
            return Err(TestCaseError::fail(format!(
                "reopened at unknown index {index}"
            )));
        };
        self.snapshots.truncate(revision as usize + 1);
        self.compacted = compacted;
        self.commits.retain(|c| c.0 <= index);
        Ok(())
    }
}

/// One write transaction against the model.
struct ModelTxn<'m> {
    model: &'m mut Model,
    begin: i64,
    state: Snapshot,
    events: Vec<Event>,
}

impl<'m> ModelTxn<'m> {
    fn new(model: &'m mut Model) -> ModelTxn<'m> {
        let begin = model.current();
        let state = model.snapshots[begin as usize].clone();
        ModelTxn {
            model,
            begin,
            state,
            events: Vec::new(),
        }
    }

    fn view(&self) -> i64 {
        self.begin + i64::from(!self.events.is_empty())
    }

    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        let view = self.view();
        if req.revision > view {
            return Err(MvccError::FutureRev);
        }
        let rev = if req.revision <= 0 {
            view
        } else {
            req.revision
        };
        if rev < self.model.compacted {
            return Err(MvccError::Compacted);
        }
        let snapshot = if rev == view {
            &self.state
        } else {
            &self.model.snapshots[rev as usize]
        };
        Ok(self.model.range_at(snapshot, req, view))
    }

    fn put(&mut self, req: &PutRequest) -> Result<PutResponse, MvccError> {
        let prev = self.state.get(&req.key).cloned();
        if (req.ignore_value || req.ignore_lease) && prev.is_none() {
            return Err(MvccError::KeyNotFound);
        }
        let rev = self.begin + 1;
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
            mod_revision: rev,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value: match (&prev, req.ignore_value) {
                (Some(p), true) => p.value.clone(),
                _ => req.value.clone(),
            },
            lease: match (&prev, req.ignore_lease) {
                (Some(p), true) => p.lease,
                _ => req.lease,
            },
        };
        self.state.insert(req.key.clone(), kv.clone());
        self.events.push(Event {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            // prev_kv is looked up as a watcher is sent the event
            prev_kv: None,
        });
        Ok(PutResponse {
            header: header(rev),
            prev_kv: if req.prev_kv { prev } else { None },
        })
    }

    fn delete(&mut self, req: &DeleteRangeRequest) -> DeleteRangeResponse {
        let doomed: Vec<KeyValue> = self
            .state
            .values()
            .filter(|kv| in_range(&kv.key, &req.key, &req.range_end))
            .cloned()
            .collect();
        for kv in &doomed {
            self.state.remove(&kv.key);
            self.events.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(KeyValue {
                    key: kv.key.clone(),
                    mod_revision: self.begin + 1,
                    ..Default::default()
                }),
                prev_kv: None,
            });
        }
        DeleteRangeResponse {
            header: header(self.view()),
            deleted: doomed.len() as i64,
            prev_kvs: if req.prev_kv { doomed } else { Vec::new() },
        }
    }

    fn compare(&self, c: &Compare) -> bool {
        let kvs: Vec<&KeyValue> = self
            .state
            .values()
            .filter(|kv| in_range(&kv.key, &c.key, &c.range_end))
            .collect();
        let zero = KeyValue::default();
        if kvs.is_empty() && c.target() == CompareTarget::Value {
            return false;
        }
        let check = |kv: &KeyValue| {
            let ord = match (c.target(), &c.target_union) {
                (CompareTarget::Value, Some(TargetUnion::Value(v))) => kv.value.cmp(v),
                (CompareTarget::Version, Some(TargetUnion::Version(v))) => kv.version.cmp(v),
                (CompareTarget::Create, Some(TargetUnion::CreateRevision(v))) => {
                    kv.create_revision.cmp(v)
                }
                (CompareTarget::Mod, Some(TargetUnion::ModRevision(v))) => kv.mod_revision.cmp(v),
                (CompareTarget::Lease, Some(TargetUnion::Lease(v))) => kv.lease.cmp(v),
                _ => unreachable!("generated compares are well formed"),
            };
            match c.result() {
                CompareResult::Equal => ord.is_eq(),
                CompareResult::NotEqual => ord.is_ne(),
                CompareResult::Greater => ord.is_gt(),
                CompareResult::Less => ord.is_lt(),
            }
        };
        if kvs.is_empty() {
            check(&zero)
        } else {
            kvs.into_iter().all(check)
        }
    }

    fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
        let succeeded = req.compare.iter().all(|c| self.compare(c));
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        // Validation against the pre-txn state: puts first, then ranges.
        for op in ops {
            if let Some(request_op::Request::RequestPut(p)) = &op.request {
                if (p.ignore_value || p.ignore_lease) && !self.state.contains_key(&p.key) {
                    return Err(MvccError::KeyNotFound);
                }
            }
        }
        let view = self.view();
        for op in ops {
            if let Some(request_op::Request::RequestRange(r)) = &op.request {
                if r.revision != 0 && r.revision > view {
                    return Err(MvccError::FutureRev);
                }
                if r.revision != 0 && r.revision < self.model.compacted {
                    return Err(MvccError::Compacted);
                }
            }
        }
        let saved_state = self.state.clone();
        let saved_events = self.events.len();
        let mut responses = Vec::new();
        for op in ops {
            let response = match &op.request {
                Some(request_op::Request::RequestRange(r)) => {
                    response_op::Response::ResponseRange(self.range(r).expect("validated"))
                }
                Some(request_op::Request::RequestPut(p)) => match self.put(p) {
                    Ok(resp) => response_op::Response::ResponsePut(resp),
                    Err(err) => {
                        self.state = saved_state;
                        self.events.truncate(saved_events);
                        return Err(err);
                    }
                },
                Some(request_op::Request::RequestDeleteRange(d)) => {
                    response_op::Response::ResponseDeleteRange(self.delete(d))
                }
                _ => unreachable!("no nested txns generated"),
            };
            responses.push(ResponseOp {
                response: Some(response),
            });
        }
        Ok(TxnResponse {
            header: header(self.view()),
            succeeded,
            responses,
        })
    }

    fn end(self) -> (i64, Vec<Event>) {
        if !self.events.is_empty() {
            self.model.snapshots.push(self.state);
        }
        (self.model.current(), self.events)
    }
}

// ---------------------------------------------------------------- generation

#[derive(Clone, Debug)]
enum Op {
    Put(PutRequest),
    Delete(DeleteRangeRequest),
    Range(RangeRequest, RevPick),
    Txn(TxnRequest),
    Compact(RevPick),
    Commit(bool),
    Reopen,
}

/// A revision chosen relative to the current one when the op runs.
#[derive(Clone, Copy, Debug)]
enum RevPick {
    Current,
    Back(i64),
    Future,
    Raw(i64),
}

impl RevPick {
    fn resolve(self, current: i64) -> i64 {
        match self {
            RevPick::Current => 0,
            RevPick::Back(n) => (current - n).max(1),
            RevPick::Future => current + 1,
            RevPick::Raw(r) => r,
        }
    }
}

fn key() -> impl Strategy<Value = Bytes> {
    prop::sample::select(KEYS).prop_map(|k| Bytes::from_static(k.as_bytes()))
}

fn range_end() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        3 => Just(Bytes::new()),
        1 => Just(Bytes::from_static(b"\0")),
        3 => prop::sample::select(&["b", "c", "d", "f"][..]).prop_map(|k| Bytes::from_static(k.as_bytes())),
    ]
}

fn rev_pick() -> impl Strategy<Value = RevPick> {
    prop_oneof![
        4 => Just(RevPick::Current),
        4 => (0i64..8).prop_map(RevPick::Back),
        1 => Just(RevPick::Future),
        1 => (-1i64..3).prop_map(RevPick::Raw),
    ]
}

fn put_req() -> impl Strategy<Value = PutRequest> {
    (
        key(),
        prop::sample::select(&["x", "y", "zz", ""][..]),
        0i64..3,
        any::<bool>(),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.15),
    )
        .prop_map(
            |(key, value, lease, prev_kv, ignore_value, ignore_lease)| PutRequest {
                key,
                value: if ignore_value {
                    Bytes::new()
                } else {
                    Bytes::from_static(value.as_bytes())
                },
                lease,
                prev_kv,
                ignore_value,
                ignore_lease,
            },
        )
}

fn delete_req() -> impl Strategy<Value = DeleteRangeRequest> {
    (key(), range_end(), any::<bool>()).prop_map(|(key, range_end, prev_kv)| DeleteRangeRequest {
        key,
        range_end,
        prev_kv,
    })
}

fn range_req() -> impl Strategy<Value = RangeRequest> {
    (
        (key(), range_end(), 0i64..4),
        (0i32..3, 0i32..5),
        (prop::bool::weighted(0.2), prop::bool::weighted(0.1)),
        prop::option::weighted(0.2, (0usize..4, 1i64..10)),
    )
        .prop_map(
            |((key, range_end, limit), (order, target), (keys_only, count_only), filter)| {
                let mut req = RangeRequest {
                    key,
                    range_end,
                    limit,
                    sort_order: order,
                    sort_target: target,
                    keys_only,
                    count_only,
                    ..Default::default()
                };
                match filter {
                    Some((0, r)) => req.min_mod_revision = r,
                    Some((1, r)) => req.max_mod_revision = r,
                    Some((2, r)) => req.min_create_revision = r,
                    Some((_, r)) => req.max_create_revision = r,
                    None => {}
                }
                req
            },
        )
}

fn compare() -> impl Strategy<Value = Compare> {
    (
        key(),
        prop::option::weighted(0.2, range_end()),
        0i32..5,
        0i32..4,
        0i64..6,
        prop::sample::select(&["x", "y", ""][..]),
    )
        .prop_map(|(key, range_end, target, result, n, v)| {
            let target_union = match CompareTarget::try_from(target).unwrap() {
                CompareTarget::Value => TargetUnion::Value(Bytes::from_static(v.as_bytes())),
                CompareTarget::Version => TargetUnion::Version(n % 3),
                CompareTarget::Create => TargetUnion::CreateRevision(n),
                CompareTarget::Mod => TargetUnion::ModRevision(n),
                CompareTarget::Lease => TargetUnion::Lease(n % 3),
            };
            Compare {
                key,
                range_end: range_end
                    .filter(|e| !e.is_empty() && e[..] != [0])
                    .unwrap_or_default(),
                target,
                result,
                target_union: Some(target_union),
            }
        })
}

fn request_op() -> impl Strategy<Value = RequestOp> {
    prop_oneof![
        3 => put_req().prop_map(request_op::Request::RequestPut),
        2 => delete_req().prop_map(request_op::Request::RequestDeleteRange),
        2 => (range_req(), prop_oneof![Just(0i64), 1i64..4]).prop_map(|(mut r, rev)| {
            r.revision = rev;
            request_op::Request::RequestRange(r)
        }),
    ]
    .prop_map(|request| RequestOp {
        request: Some(request),
    })
}

fn txn_req() -> impl Strategy<Value = TxnRequest> {
    (
        prop::collection::vec(compare(), 0..3),
        prop::collection::vec(request_op(), 0..4),
        prop::collection::vec(request_op(), 0..3),
    )
        .prop_map(|(compare, success, failure)| TxnRequest {
            compare,
            success,
            failure,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => put_req().prop_map(Op::Put),
        3 => delete_req().prop_map(Op::Delete),
        6 => (range_req(), rev_pick()).prop_map(|(r, p)| Op::Range(r, p)),
        4 => txn_req().prop_map(Op::Txn),
        1 => rev_pick().prop_map(Op::Compact),
        2 => any::<bool>().prop_map(Op::Commit),
        1 => Just(Op::Reopen),
    ]
}

// ---------------------------------------------------------------- the check

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut store = Store::open(&path).unwrap();
    let mut model = Model::new();
    let mut index = 0u64;
    for op in ops {
        index += 1;
        match op {
            Op::Put(req) => {
                let mut txn = store.write(index);
                let got = txn.put(&req);
                let got_end = txn.end();
                let mut mtxn = ModelTxn::new(&mut model);
                let want = mtxn.put(&req);
                let want_end = mtxn.end();
                prop_assert_eq!(got, want);
                prop_assert_eq!((got_end.revision, got_end.events), want_end);
            }
            Op::Delete(req) => {
                let mut txn = store.write(index);
                let got = txn.delete_range(&req);
                let got_end = txn.end();
                let mut mtxn = ModelTxn::new(&mut model);
                let want = mtxn.delete(&req);
                let want_end = mtxn.end();
                prop_assert_eq!(got, Ok(want));
                prop_assert_eq!((got_end.revision, got_end.events), want_end);
            }
            Op::Txn(req) => {
                let mut txn = store.write(index);
                let got = txn.txn(&req);
                let got_end = txn.end();
                let mut mtxn = ModelTxn::new(&mut model);
                let want = mtxn.txn(&req);
                let want_end = mtxn.end();
                prop_assert_eq!(got, want);
                prop_assert_eq!((got_end.revision, got_end.events), want_end);
            }
            Op::Range(mut req, pick) => {
                req.revision = pick.resolve(model.current());
                let got = store.range(&req);
                prop_assert_eq!(got, model.range(&req));
            }
            Op::Compact(pick) => {
                let revision = match pick.resolve(model.current()) {
                    0 => model.current(),
                    r => r,
                };
                prop_assert_eq!(store.compact(revision, index), model.compact(revision));
            }
            Op::Commit(durable) => {
                store.set_consistent_index(index);
                store.commit(durable).unwrap();
                model.commit(index, durable);
                if durable {
                    prop_assert_eq!(store.durable_consistent_index(), index);
                }
            }
            Op::Reopen => {
                drop(store);
                store = Store::open(&path).unwrap();
                prop_assert_eq!(store.durable_consistent_index(), store.consistent_index());
                model.reopen(store.consistent_index())?;
            }
        }
        prop_assert_eq!(store.current_revision(), model.current());
        prop_assert_eq!(store.compact_revision(), model.compacted.max(0));
    }
    // Whole history readable above the compaction point matches.
    for rev in model.compacted.max(1)..=model.current() {
        let req = RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            revision: rev,
            ..Default::default()
        };
        prop_assert_eq!(store.range(&req), model.range(&req));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_snapshot_model(ops in prop::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}
