//! Request validation done before a request reaches raft, as etcd's
//! api/v3rpc/key.go does it: the same checks, in the same order, with the
//! same errors.

use std::collections::{BTreeMap, HashSet};

use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::request_op::Request;
use api::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest};
use api::rpctypes::{self, EtcdError};

pub(crate) fn check_range(r: &RangeRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(rpctypes::EMPTY_KEY);
    }
    if SortOrder::try_from(r.sort_order).is_err() || SortTarget::try_from(r.sort_target).is_err() {
        return Err(rpctypes::INVALID_SORT_OPTION);
    }
    Ok(())
}

pub(crate) fn check_put(r: &PutRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(rpctypes::EMPTY_KEY);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(rpctypes::VALUE_PROVIDED);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(rpctypes::LEASE_PROVIDED);
    }
    Ok(())
}

pub(crate) fn check_delete(r: &DeleteRangeRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(rpctypes::EMPTY_KEY);
    }
    Ok(())
}

/// etcd's checkTxnRequest followed by checkIntervals on both branches.
pub(crate) fn check_txn(r: &TxnRequest, max_txn_ops: usize) -> Result<(), EtcdError> {
    check_txn_ops(r, max_txn_ops)?;
    check_intervals(&r.success)?;
    check_intervals(&r.failure)?;
    Ok(())
}

fn check_txn_ops(r: &TxnRequest, max_txn_ops: usize) -> Result<(), EtcdError> {
    let opc = r.compare.len().max(r.success.len()).max(r.failure.len());
    if opc > max_txn_ops {
        return Err(rpctypes::TOO_MANY_OPS);
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(rpctypes::EMPTY_KEY);
    }
    for op in r.success.iter().chain(r.failure.iter()) {
        check_request_op(op, max_txn_ops - opc)?;
    }
    Ok(())
}

fn check_request_op(op: &RequestOp, max_txn_ops: usize) -> Result<(), EtcdError> {
    match &op.request {
        Some(Request::RequestRange(r)) => check_range(r),
        Some(Request::RequestPut(r)) => check_put(r),
        Some(Request::RequestDeleteRange(r)) => check_delete(r),
        Some(Request::RequestTxn(r)) => check_txn_ops(r, max_txn_ops),
        // etcd answers an empty op with "key not found".
        None => Err(rpctypes::KEY_NOT_FOUND),
    }
}

/// A deleted interval: `[key, end)`, a single key when `end` is None, and
/// to the end of the keyspace when `end` is `Some(b"\0")`.
struct Interval {
    key: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Interval {
    fn of(d: &DeleteRangeRequest) -> Interval {
        let end = if d.range_end.is_empty() {
            None
        } else {
            Some(d.range_end.to_vec())
        };
        Interval {
            key: d.key.to_vec(),
            end,
        }
    }

    /// As a half-open range `[start, end)`, end None for the end of the
    /// keyspace; None when it holds no key at all (`end` ≤ `key`).
    fn half_open(self) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
        match self.end {
            None => {
                let mut end = self.key.clone();
                end.push(0);
                Some((self.key, Some(end)))
            }
            Some(end) if end.as_slice() == b"\0" => Some((self.key, None)),
            Some(end) if end > self.key => Some((self.key, Some(end))),
            Some(_) => None,
        }
    }
}

/// The union of deleted intervals as disjoint ranges by start, so that a
/// put is checked in O(log n) — etcd keeps an interval tree for the same
/// reason: a linear scan per put makes a txn of many puts and deletes
/// quadratic, seconds of CPU for one request within --max-request-bytes.
#[derive(Default)]
struct DeletedSet {
    /// start → end (None: to the end of the keyspace); disjoint.
    ranges: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl DeletedSet {
    fn insert(&mut self, interval: Interval) {
        if let Some((start, end)) = interval.half_open() {
            self.insert_half_open(start, end);
        }
    }

    fn insert_half_open(&mut self, mut start: Vec<u8>, mut end: Option<Vec<u8>>) {
        // the range that starts at or before `start` and reaches it
        if let Some((s, e)) = self.ranges.range(..=start.clone()).next_back() {
            if e.as_ref().is_none_or(|e| *e >= start) {
                start = s.clone();
                end = max_end(end, e.clone());
            }
        }
        // the ranges that start inside the new one
        let inside: Vec<Vec<u8>> = self
            .ranges
            .range(start.clone()..)
            .take_while(|(s, _)| end.as_ref().is_none_or(|e| *s <= e))
            .map(|(s, _)| s.clone())
            .collect();
        for s in inside {
            if let Some(e) = self.ranges.remove(&s) {
                end = max_end(end, e);
            }
        }
        self.ranges.insert(start, end);
    }

    fn contains(&self, k: &[u8]) -> bool {
        self.ranges
            .range::<[u8], _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(k)))
            .next_back()
            .is_some_and(|(_, e)| e.as_ref().is_none_or(|e| k < e.as_slice()))
    }

    fn union(&mut self, other: DeletedSet) {
        for (start, end) in other.ranges {
            self.insert_half_open(start, end);
        }
    }
}

fn max_end(a: Option<Vec<u8>>, b: Option<Vec<u8>>) -> Option<Vec<u8>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    }
}

/// etcd's checkIntervals: puts may not repeat a key nor fall in a deleted
/// range, across nesting levels; the two branches of a nested txn are
/// mutually exclusive, so a key put in both is fine.
fn check_intervals(reqs: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, DeletedSet), EtcdError> {
    let mut dels = DeletedSet::default();
    for op in reqs {
        if let Some(Request::RequestDeleteRange(d)) = &op.request {
            dels.insert(Interval::of(d));
        }
    }
    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    for op in reqs {
        let Some(Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || dels.contains(k) {
                return Err(rpctypes::DUPLICATE_KEY);
            }
            puts.insert(k.clone());
        }
        for k in puts_else {
            if (puts.contains(&k) && !puts_then.contains(&k)) || dels.contains(&k) {
                return Err(rpctypes::DUPLICATE_KEY);
            }
            puts.insert(k);
        }
        dels.union(dels_then);
        dels.union(dels_else);
    }
    for op in reqs {
        let Some(Request::RequestPut(p)) = &op.request else {
            continue;
        };
        let k = p.key.to_vec();
        if puts.contains(&k) || dels.contains(&k) {
            return Err(rpctypes::DUPLICATE_KEY);
        }
        puts.insert(k);
    }
    Ok((puts, dels))
}

/// A txn whose every op is a range never goes through raft (etcd's isTxnReadonly).
pub(crate) fn txn_is_read_only(r: &TxnRequest) -> bool {
    r.success
        .iter()
        .chain(r.failure.iter())
        .all(|op| matches!(op.request, Some(Request::RequestRange(_))))
}

/// A read-only txn whose every range is serializable skips the ReadIndex round.
pub(crate) fn txn_is_serializable(r: &TxnRequest) -> bool {
    r.success
        .iter()
        .chain(r.failure.iter())
        .all(|op| matches!(&op.request, Some(Request::RequestRange(rr)) if rr.serializable))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deleted set answers as a scan of every interval would, for
    /// random single keys, ranges, from-key ranges and empty ranges.
    #[test]
    fn deleted_set_contains_what_a_scan_of_the_intervals_contains() {
        let mut rng = fastrand::Rng::with_seed(20);
        let key = |rng: &mut fastrand::Rng| -> Vec<u8> {
            let len = rng.usize(0..3);
            (0..len).map(|_| rng.u8(b'a'..b'e')).collect()
        };
        for _ in 0..2000 {
            let mut set = DeletedSet::default();
            let mut scan: Vec<Interval> = Vec::new();
            for _ in 0..rng.usize(0..8) {
                let k = key(&mut rng);
                let end = match rng.u8(0..4) {
                    0 => None,
                    1 => Some(b"\0".to_vec()),
                    _ => Some(key(&mut rng)),
                };
                let (a, b) = (
                    Interval {
                        key: k.clone(),
                        end: end.clone(),
                    },
                    Interval { key: k, end },
                );
                if rng.bool() {
                    set.insert(a);
                } else {
                    let mut other = DeletedSet::default();
                    other.insert(a);
                    set.union(other);
                }
                scan.push(b);
            }
            for _ in 0..20 {
                let k = key(&mut rng);
                assert_eq!(
                    set.contains(&k),
                    scan.iter().any(|iv| iv.contains_by_scan(&k)),
                    "{k:?} in {:?}",
                    scan.iter().map(|iv| (&iv.key, &iv.end)).collect::<Vec<_>>()
                );
            }
        }
    }

    impl Interval {
        fn contains_by_scan(&self, k: &[u8]) -> bool {
            match &self.end {
                None => self.key == k,
                Some(end) if end.as_slice() == b"\0" => k >= self.key.as_slice(),
                Some(end) => k >= self.key.as_slice() && k < end.as_slice(),
            }
        }
    }

    /// Many puts and many deletes in one txn: judged as before (the
    /// conflict found, the clean one accepted), in O(n log n).
    #[test]
    fn a_txn_of_many_puts_and_deletes_is_judged_without_a_scan_per_put() {
        let n = 20_000;
        let mut ops: Vec<RequestOp> = (0..n).map(|i| del(&format!("d{i:06}"), "")).collect();
        ops.extend((0..n).map(|i| put(&format!("p{i:06}"))));
        assert!(check_intervals(&ops).is_ok());
        ops.push(put(&format!("d{:06}", n / 2)));
        assert!(check_intervals(&ops).is_err());
    }
    use api::etcdserverpb::Compare;

    fn put(k: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: k.as_bytes().to_vec().into(),
                ..Default::default()
            })),
        }
    }
    fn del(k: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                key: k.as_bytes().to_vec().into(),
                range_end: end.as_bytes().to_vec().into(),
                ..Default::default()
            })),
        }
    }
    fn txn(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
        TxnRequest {
            compare: vec![],
            success,
            failure,
        }
    }

    #[test]
    fn txn_rejects_duplicate_put_keys() {
        assert_eq!(
            check_txn(&txn(vec![put("a"), put("a")], vec![]), 128),
            Err(rpctypes::DUPLICATE_KEY)
        );
    }

    #[test]
    fn txn_rejects_put_inside_deleted_range() {
        assert_eq!(
            check_txn(&txn(vec![del("a", "c"), put("b")], vec![]), 128),
            Err(rpctypes::DUPLICATE_KEY)
        );
        assert_eq!(
            check_txn(&txn(vec![del("a", "\0"), put("z")], vec![]), 128),
            Err(rpctypes::DUPLICATE_KEY)
        );
        assert!(check_txn(&txn(vec![del("a", "c"), put("c")], vec![]), 128).is_ok());
    }

    #[test]
    fn txn_allows_same_key_in_both_branches_of_nested_txn() {
        let nested = RequestOp {
            request: Some(Request::RequestTxn(txn(vec![put("a")], vec![put("a")]))),
        };
        assert!(check_txn(&txn(vec![nested], vec![]), 128).is_ok());
        let nested = RequestOp {
            request: Some(Request::RequestTxn(txn(vec![put("a")], vec![]))),
        };
        assert_eq!(
            check_txn(&txn(vec![nested, put("a")], vec![]), 128),
            Err(rpctypes::DUPLICATE_KEY)
        );
    }

    #[test]
    fn txn_rejects_too_many_operations() {
        let ops: Vec<RequestOp> = (0..129).map(|i| put(&format!("k{i}"))).collect();
        assert_eq!(
            check_txn(&txn(ops, vec![]), 128),
            Err(rpctypes::TOO_MANY_OPS)
        );
        let ops: Vec<RequestOp> = (0..128).map(|i| put(&format!("k{i}"))).collect();
        assert!(check_txn(&txn(ops, vec![]), 128).is_ok());
    }

    #[test]
    fn txn_rejects_empty_compare_key_and_empty_op() {
        let mut t = txn(vec![], vec![]);
        t.compare.push(Compare::default());
        assert_eq!(check_txn(&t, 128), Err(rpctypes::EMPTY_KEY));
        let t = txn(vec![RequestOp { request: None }], vec![]);
        assert_eq!(check_txn(&t, 128), Err(rpctypes::KEY_NOT_FOUND));
    }

    #[test]
    fn put_checks_match_etcd() {
        assert_eq!(check_put(&PutRequest::default()), Err(rpctypes::EMPTY_KEY));
        let p = PutRequest {
            key: "k".into(),
            value: "v".into(),
            ignore_value: true,
            ..Default::default()
        };
        assert_eq!(check_put(&p), Err(rpctypes::VALUE_PROVIDED));
        let p = PutRequest {
            key: "k".into(),
            lease: 5,
            ignore_lease: true,
            ..Default::default()
        };
        assert_eq!(check_put(&p), Err(rpctypes::LEASE_PROVIDED));
    }

    #[test]
    fn range_rejects_unknown_sort_option() {
        let r = RangeRequest {
            key: "k".into(),
            sort_order: 7,
            ..Default::default()
        };
        assert_eq!(check_range(&r), Err(rpctypes::INVALID_SORT_OPTION));
        assert_eq!(
            check_range(&RangeRequest::default()),
            Err(rpctypes::EMPTY_KEY)
        );
    }
}
