//! Request validation done before a request reaches raft, as etcd's
//! api/v3rpc/key.go does it: the same checks, in the same order, with the
//! same errors.

use std::collections::HashSet;

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

    fn contains(&self, k: &[u8]) -> bool {
        match &self.end {
            None => self.key == k,
            Some(end) if end.as_slice() == b"\0" => k >= self.key.as_slice(),
            Some(end) => k >= self.key.as_slice() && k < end.as_slice(),
        }
    }
}

/// etcd's checkIntervals: puts may not repeat a key nor fall in a deleted
/// range, across nesting levels; the two branches of a nested txn are
/// mutually exclusive, so a key put in both is fine.
fn check_intervals(reqs: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Vec<Interval>), EtcdError> {
    let mut dels: Vec<Interval> = reqs
        .iter()
        .filter_map(|op| match &op.request {
            Some(Request::RequestDeleteRange(d)) => Some(Interval::of(d)),
            _ => None,
        })
        .collect();
    let deleted = |dels: &[Interval], k: &[u8]| dels.iter().any(|iv| iv.contains(k));

    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    for op in reqs {
        let Some(Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || deleted(&dels, k) {
                return Err(rpctypes::DUPLICATE_KEY);
            }
            puts.insert(k.clone());
        }
        for k in puts_else {
            if (puts.contains(&k) && !puts_then.contains(&k)) || deleted(&dels, &k) {
                return Err(rpctypes::DUPLICATE_KEY);
            }
            puts.insert(k);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in reqs {
        let Some(Request::RequestPut(p)) = &op.request else {
            continue;
        };
        let k = p.key.to_vec();
        if puts.contains(&k) || deleted(&dels, &k) {
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
