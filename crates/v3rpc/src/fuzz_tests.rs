//! Fuzzing request validation as the KV service runs it: bytes decoded as
//! the services decode them (`api::codec::decode_request`), then etcd's
//! checks (`checks`), on a request thread's stack. Whatever decodes is
//! judged — accepted or refused with etcd's error — never a panic, and a
//! txn as deep as the decoder takes is judged without overflowing the
//! stack, whatever `--max-txn-ops` allows.
//!
//! `FUZZ_SEED` / `FUZZ_RUNS` replay or lengthen a run:
//! `FUZZ_RUNS=100000 cargo test -p v3rpc --lib fuzz_tests`.

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use api::codec::{decode_request, MAX_TXN_DEPTH, REQUEST_THREAD_STACK_BYTES};
use api::etcdserverpb::request_op::Request;
use api::etcdserverpb::{
    compare, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use api::rpctypes;
use fuzz_support::{mutate, on_stack, protobuf_fields, some_bytes, Fuzz};
use prost::bytes::Bytes;
use prost::Message;

use crate::checks::{
    check_delete, check_put, check_range, check_txn, txn_is_read_only, txn_is_serializable,
};

/// Keys from a small alphabet, so that puts collide and ranges overlap.
fn key(rng: &mut fastrand::Rng) -> Bytes {
    match rng.u8(..8) {
        0 => Bytes::new(),
        1 => Bytes::from_static(b"\0"),
        _ => Bytes::from(vec![b'a' + rng.u8(..4); rng.usize(1..3)]),
    }
}

fn random_op(rng: &mut fastrand::Rng, depth: usize) -> RequestOp {
    let request = match rng.u8(..10) {
        0 => None,
        1..=3 => Some(Request::RequestPut(PutRequest {
            key: key(rng),
            value: Bytes::from(some_bytes(rng, 0..4)),
            lease: if rng.u8(..4) == 0 { rng.i64(..) } else { 0 },
            ignore_value: rng.u8(..8) == 0,
            ignore_lease: rng.u8(..8) == 0,
            prev_kv: rng.bool(),
        })),
        4 | 5 => Some(Request::RequestDeleteRange(DeleteRangeRequest {
            key: key(rng),
            range_end: if rng.bool() { key(rng) } else { Bytes::new() },
            prev_kv: rng.bool(),
        })),
        6 | 7 => Some(Request::RequestRange(RangeRequest {
            key: key(rng),
            range_end: key(rng),
            sort_order: rng.i32(-1..4),
            sort_target: rng.i32(-1..6),
            serializable: rng.bool(),
            limit: rng.i64(..),
            ..Default::default()
        })),
        _ if depth > 0 => Some(Request::RequestTxn(random_txn(rng, depth - 1))),
        _ => None,
    };
    RequestOp { request }
}

fn random_txn(rng: &mut fastrand::Rng, depth: usize) -> TxnRequest {
    let ops = |rng: &mut fastrand::Rng| {
        (0..rng.usize(0..5))
            .map(|_| random_op(rng, depth))
            .collect()
    };
    TxnRequest {
        compare: (0..rng.usize(0..3))
            .map(|_| Compare {
                key: key(rng),
                range_end: key(rng),
                result: rng.i32(-1..5),
                target: rng.i32(-1..6),
                target_union: Some(compare::TargetUnion::Version(rng.i64(..))),
            })
            .collect(),
        success: ops(rng),
        failure: ops(rng),
    }
}

/// Bytes for the services' decoder: a random request (of the kind the
/// KV service takes) or random fields, perhaps damaged.
fn input(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut bytes = match rng.u8(..6) {
        0 => {
            let mut bytes = Vec::new();
            let depth = rng.usize(0..5);
            protobuf_fields(rng, depth, &mut bytes);
            bytes
        }
        1 => random_op(rng, 2).encode_to_vec(),
        _ => {
            let depth = rng.usize(0..5);
            random_txn(rng, depth).encode_to_vec()
        }
    };
    if rng.u8(..3) == 0 {
        mutate(rng, &mut bytes);
    }
    bytes
}

/// A check's verdict: accepted, or one of etcd's answers to a request
/// that fails a check, nothing else.
fn etcds(verdict: Result<(), rpctypes::EtcdError>) {
    let Err(error) = verdict else {
        return;
    };
    assert!(
        [
            rpctypes::EMPTY_KEY,
            rpctypes::INVALID_SORT_OPTION,
            rpctypes::VALUE_PROVIDED,
            rpctypes::LEASE_PROVIDED,
            rpctypes::TOO_MANY_OPS,
            rpctypes::DUPLICATE_KEY,
            rpctypes::KEY_NOT_FOUND,
        ]
        .contains(&error),
        "{error:?}"
    );
}

fn judge(bytes: &[u8], max_txn_ops: usize) -> usize {
    let mut decoded = 0;
    let bytes = || Bytes::copy_from_slice(bytes);
    if let Ok(r) = decode_request::<RangeRequest>(bytes()) {
        decoded += 1;
        etcds(check_range(&r));
    }
    if let Ok(r) = decode_request::<PutRequest>(bytes()) {
        decoded += 1;
        etcds(check_put(&r));
    }
    if let Ok(r) = decode_request::<DeleteRangeRequest>(bytes()) {
        decoded += 1;
        etcds(check_delete(&r));
    }
    if let Ok(r) = decode_request::<TxnRequest>(bytes()) {
        decoded += 1;
        let verdict = check_txn(&r, max_txn_ops);
        assert_eq!(
            verdict,
            check_txn(&r, max_txn_ops),
            "a verdict is a function of the txn"
        );
        etcds(verdict);
        if txn_is_serializable(&r) {
            assert!(txn_is_read_only(&r));
        }
    }
    decoded
}

#[test]
fn decoded_requests_are_judged_with_etcds_errors() {
    let fuzz = Fuzz::new("v3rpc-checks", 20000);
    let mut rng = fuzz.rng();
    let decoded = on_stack(REQUEST_THREAD_STACK_BYTES, move || {
        let mut decoded = 0;
        for _ in fuzz.iterations() {
            let bytes = input(&mut rng);
            let max_txn_ops = [128, 1, 3, 10_000][rng.usize(..4)];
            decoded += judge(&bytes, max_txn_ops);
        }
        decoded
    });
    assert!(decoded > 0);
}

/// A txn `levels` deep, one op (the next level) per level, a put at the
/// bottom: the deepest shape the decoder lets through.
fn chain(levels: usize) -> TxnRequest {
    let mut txn = TxnRequest {
        success: vec![RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: Bytes::from_static(b"k"),
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    for _ in 1..levels {
        txn = TxnRequest {
            success: vec![RequestOp {
                request: Some(Request::RequestTxn(txn)),
            }],
            failure: vec![RequestOp {
                request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                    key: Bytes::from_static(b"d"),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
    }
    txn
}

#[test]
fn the_deepest_txn_decoded_is_judged_on_a_request_threads_stack() {
    on_stack(REQUEST_THREAD_STACK_BYTES, || {
        let bytes = Bytes::from(chain(MAX_TXN_DEPTH).encode_to_vec());
        let txn = decode_request::<TxnRequest>(bytes).expect("decodes");
        // etcd's default budget refuses it; a budget that allows it walks
        // every level (both checks recurse once per level)
        assert_eq!(check_txn(&txn, 128), Err(rpctypes::TOO_MANY_OPS));
        assert_eq!(check_txn(&txn, 100_000), Ok(()));
        assert!(!txn_is_read_only(&txn));
        drop(txn);
    });
}
