//! Fuzzing the request decoder every gRPC service and the apply loop use
//! (`api::codec`): arbitrary and damaged bytes as each request message of
//! the API (and of the peer port), and as a raft entry's
//! `InternalRaftRequest`, must decode or be refused — never panic, never
//! allocate more than in proportion to the bytes given, never overflow a
//! request thread's stack however deep a txn nests.
//!
//! `FUZZ_SEED` / `FUZZ_RUNS` replay or lengthen a run:
//! `FUZZ_RUNS=200000 cargo test -p api --release --test fuzz`.

#[path = "fuzz_support/mod.rs"]
mod fuzz_support;

use api::codec::{
    decode_internal_raft_request, decode_request, MAX_TXN_DEPTH, REQUEST_THREAD_STACK_BYTES,
};
use api::etcdserverpb::{self as pb, request_op, InternalRaftRequest, RequestOp, TxnRequest};
use api::{oxcdpeerpb, v3electionpb, v3lockpb};
use fuzz_support::{
    bounded, field_number, mutate, on_stack, protobuf_fields, put_key, put_varint, some_bytes,
    Fuzz, Meter,
};
use prost::bytes::Bytes;
use prost::Message;

#[global_allocator]
static METER: Meter = Meter;

/// Decoding holds a message's structs, not its bytes: an empty repeated
/// message element costs two bytes on the wire and a whole struct in
/// memory (a `RequestOp` is ~150 bytes), more while its Vec grows.
/// Measured worst case: ~105 bytes per input byte (a `TxnRequest` of
/// empty ops). What matters is that it is a constant, not a length read
/// from the input.
const BYTES_PER_INPUT_BYTE: usize = 256;
const SLACK_BYTES: usize = 64 * 1024;

// ---- valid seeds, mutated ----

fn put_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(pb::PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from_static(b"value"),
            lease: 7,
            ..Default::default()
        })),
    }
}

/// A txn with a compare and all four kinds of op, `depth` levels deep.
fn seed_txn(depth: usize) -> TxnRequest {
    let mut txn = TxnRequest {
        compare: vec![pb::Compare {
            key: Bytes::from_static(b"k"),
            range_end: Bytes::from_static(b"z"),
            result: 2,
            target: 1,
            target_union: Some(pb::compare::TargetUnion::CreateRevision(5)),
        }],
        success: vec![put_op("a")],
        failure: vec![
            RequestOp {
                request: Some(request_op::Request::RequestRange(pb::RangeRequest {
                    key: Bytes::from_static(b"a"),
                    range_end: Bytes::from_static(b"\0"),
                    limit: 10,
                    sort_order: 1,
                    ..Default::default()
                })),
            },
            RequestOp {
                request: Some(request_op::Request::RequestDeleteRange(
                    pb::DeleteRangeRequest {
                        key: Bytes::from_static(b"d"),
                        prev_kv: true,
                        ..Default::default()
                    },
                )),
            },
        ],
    };
    for _ in 1..depth {
        txn = TxnRequest {
            success: vec![
                RequestOp {
                    request: Some(request_op::Request::RequestTxn(txn)),
                },
                put_op("b"),
            ],
            ..Default::default()
        };
    }
    txn
}

/// Encodings of real requests, for the mutations to start from.
fn seeds() -> Vec<Vec<u8>> {
    let header = pb::RequestHeader {
        id: 9,
        username: "root".into(),
        auth_revision: 3,
    };
    vec![
        seed_txn(1).encode_to_vec(),
        seed_txn(4).encode_to_vec(),
        InternalRaftRequest {
            header: Some(header.clone()),
            id: 9,
            txn: Some(seed_txn(3)),
            ..Default::default()
        }
        .encode_to_vec(),
        InternalRaftRequest {
            header: Some(header.clone()),
            put: Some(pb::PutRequest {
                key: Bytes::from_static(b"foo"),
                value: Bytes::from_static(b"bar"),
                ..Default::default()
            }),
            auth_role_grant_permission: Some(pb::AuthRoleGrantPermissionRequest {
                name: "role".into(),
                perm: Some(api::authpb::Permission {
                    perm_type: 2,
                    key: Bytes::from_static(b"a"),
                    range_end: Bytes::from_static(b"b"),
                }),
            }),
            cluster_member_attr_set: Some(pb::ClusterMemberAttrSetRequest {
                member_id: 1,
                member_attributes: Some(pb::Attributes {
                    name: "m1".into(),
                    client_urls: vec!["http://127.0.0.1:2379".into()],
                }),
            }),
            ..Default::default()
        }
        .encode_to_vec(),
        pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: Bytes::from_static(b"a"),
                    range_end: Bytes::from_static(b"b"),
                    start_revision: 4,
                    filters: vec![0, 1, 1],
                    prev_kv: true,
                    watch_id: 3,
                    fragment: true,
                    progress_notify: true,
                },
            )),
        }
        .encode_to_vec(),
        pb::MemberAddRequest {
            peer_ur_ls: vec!["http://10.0.0.1:2380".into(), "http://[::1]:2380".into()],
            is_learner: true,
        }
        .encode_to_vec(),
        oxcdpeerpb::SnapshotChunk {
            cluster_id: 1,
            from: 2,
            to: 3,
            message: Bytes::from_static(b"\x08\x0a\x10\x01"),
            data: Bytes::from(vec![7u8; 100]),
            last: true,
        }
        .encode_to_vec(),
        v3electionpb::ProclaimRequest {
            leader: Some(v3electionpb::LeaderKey {
                name: Bytes::from_static(b"e"),
                key: Bytes::from_static(b"e/1"),
                rev: 3,
                lease: 5,
            }),
            value: Bytes::from_static(b"v"),
        }
        .encode_to_vec(),
    ]
}

/// One input: random fields, a mutated seed, or plain noise.
fn input(rng: &mut fastrand::Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    match rng.u8(..8) {
        0..=2 => {
            let mut bytes = Vec::new();
            let depth = rng.usize(0..6);
            protobuf_fields(rng, depth, &mut bytes);
            bytes
        }
        3..=6 => {
            let mut bytes = seeds[rng.usize(..seeds.len())].clone();
            mutate(rng, &mut bytes);
            bytes
        }
        _ => some_bytes(rng, 0..64),
    }
}

/// Decodes `bytes` as `T` the way the services do, within the allocation
/// bound; what decodes encodes and decodes again to itself.
fn check<T: Message + Default + PartialEq + 'static>(bytes: &[u8]) -> bool {
    let name = std::any::type_name::<T>();
    let decoded = bounded(name, bytes.len(), BYTES_PER_INPUT_BYTE, SLACK_BYTES, || {
        decode_request::<T>(Bytes::copy_from_slice(bytes))
    });
    let Ok(message) = decoded else {
        return false;
    };
    let again = decode_request::<T>(Bytes::from(message.encode_to_vec()))
        .unwrap_or_else(|e| panic!("{name}: its own encoding does not decode: {e}"));
    assert!(again == message, "{name}: does not survive re-encoding");
    true
}

fn check_internal(bytes: &[u8]) -> bool {
    let decoded = bounded(
        "InternalRaftRequest",
        bytes.len(),
        BYTES_PER_INPUT_BYTE,
        SLACK_BYTES,
        || decode_internal_raft_request(bytes),
    );
    let Ok(request) = decoded else {
        return false;
    };
    let again = decode_internal_raft_request(&request.encode_to_vec())
        .expect("an InternalRaftRequest's own encoding decodes");
    assert_eq!(again, request);
    true
}

/// Every request message a client or a peer sends: the services' inputs.
macro_rules! every_request {
    ($bytes:expr, $decoded:ident) => {{
        let bytes: &[u8] = $bytes;
        for ok in [
            check::<pb::RangeRequest>(bytes),
            check::<pb::PutRequest>(bytes),
            check::<pb::DeleteRangeRequest>(bytes),
            check::<pb::TxnRequest>(bytes),
            check::<pb::CompactionRequest>(bytes),
            check::<pb::WatchRequest>(bytes),
            check::<pb::LeaseGrantRequest>(bytes),
            check::<pb::LeaseRevokeRequest>(bytes),
            check::<pb::LeaseKeepAliveRequest>(bytes),
            check::<pb::LeaseTimeToLiveRequest>(bytes),
            check::<pb::LeaseLeasesRequest>(bytes),
            check::<pb::MemberAddRequest>(bytes),
            check::<pb::MemberRemoveRequest>(bytes),
            check::<pb::MemberUpdateRequest>(bytes),
            check::<pb::MemberListRequest>(bytes),
            check::<pb::MemberPromoteRequest>(bytes),
            check::<pb::AlarmRequest>(bytes),
            check::<pb::StatusRequest>(bytes),
            check::<pb::DefragmentRequest>(bytes),
            check::<pb::HashRequest>(bytes),
            check::<pb::HashKvRequest>(bytes),
            check::<pb::SnapshotRequest>(bytes),
            check::<pb::MoveLeaderRequest>(bytes),
            check::<pb::DowngradeRequest>(bytes),
            check::<pb::AuthEnableRequest>(bytes),
            check::<pb::AuthDisableRequest>(bytes),
            check::<pb::AuthStatusRequest>(bytes),
            check::<pb::AuthenticateRequest>(bytes),
            check::<pb::AuthUserAddRequest>(bytes),
            check::<pb::AuthUserGetRequest>(bytes),
            check::<pb::AuthUserListRequest>(bytes),
            check::<pb::AuthUserDeleteRequest>(bytes),
            check::<pb::AuthUserChangePasswordRequest>(bytes),
            check::<pb::AuthUserGrantRoleRequest>(bytes),
            check::<pb::AuthUserRevokeRoleRequest>(bytes),
            check::<pb::AuthRoleAddRequest>(bytes),
            check::<pb::AuthRoleGetRequest>(bytes),
            check::<pb::AuthRoleListRequest>(bytes),
            check::<pb::AuthRoleDeleteRequest>(bytes),
            check::<pb::AuthRoleGrantPermissionRequest>(bytes),
            check::<pb::AuthRoleRevokePermissionRequest>(bytes),
            check::<v3electionpb::CampaignRequest>(bytes),
            check::<v3electionpb::ProclaimRequest>(bytes),
            check::<v3electionpb::LeaderRequest>(bytes),
            check::<v3electionpb::ResignRequest>(bytes),
            check::<v3lockpb::LockRequest>(bytes),
            check::<v3lockpb::UnlockRequest>(bytes),
            check::<oxcdpeerpb::ProbeRequest>(bytes),
            check::<oxcdpeerpb::SnapshotChunk>(bytes),
            check::<oxcdpeerpb::MembersRequest>(bytes),
            check::<oxcdpeerpb::MembersResponse>(bytes),
            check_internal(bytes),
        ] {
            $decoded += usize::from(ok);
        }
    }};
}

#[test]
fn arbitrary_bytes_as_every_request_decode_or_are_refused() {
    let fuzz = Fuzz::new("api-requests", 5000);
    let mut rng = fuzz.rng();
    let seeds = seeds();
    // The decoder recurses once per txn level: give it a request thread.
    let (decoded, total) = on_stack(REQUEST_THREAD_STACK_BYTES, move || {
        let (mut decoded, mut total) = (0usize, 0usize);
        for _ in fuzz.iterations() {
            let bytes = input(&mut rng, &seeds);
            every_request!(&bytes, decoded);
            total += 52;
        }
        (decoded, total)
    });
    eprintln!("{total} decodes, {decoded} accepted");
    assert!(
        decoded > total / 20,
        "the generator must reach the decoders"
    );
}

// ---- deep and huge ----

/// A txn nested `levels` deep through `RequestOp.request_txn`, in the
/// `success` (field 2) or `failure` (field 3) branch, encoded without
/// recursion: outermost level first, each level's length known from
/// within.
fn nested_txn_bytes(levels: usize, branch_field: u32) -> Vec<u8> {
    fn varint_len(value: usize) -> usize {
        let mut len = 1;
        let mut value = value >> 7;
        while value > 0 {
            len += 1;
            value >>= 7;
        }
        len
    }
    // txn_len[i]: the encoded length of the txn i levels from the bottom.
    let mut txn_len = vec![0usize; levels];
    let mut op_len = vec![0usize; levels];
    for i in 1..levels {
        op_len[i] = 1 + varint_len(txn_len[i - 1]) + txn_len[i - 1];
        txn_len[i] = 1 + varint_len(op_len[i]) + op_len[i];
    }
    let mut out = Vec::with_capacity(txn_len[levels - 1]);
    for i in (1..levels).rev() {
        put_key(&mut out, branch_field, 2);
        put_varint(&mut out, op_len[i] as u64);
        put_key(&mut out, 4, 2);
        put_varint(&mut out, txn_len[i - 1] as u64);
    }
    assert_eq!(out.len(), txn_len[levels - 1]);
    out
}

/// etcd's refusal of a txn too deep for the decoder: the op budget's error.
fn too_many_ops(status: tonic::Status) {
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), api::rpctypes::TOO_MANY_OPS.message);
}

#[test]
fn txn_nested_100k_deep_is_refused_without_overflowing_the_stack() {
    on_stack(REQUEST_THREAD_STACK_BYTES, || {
        for branch in [2, 3] {
            let bytes = nested_txn_bytes(100_000, branch);
            let started = std::time::Instant::now();
            let refused = bounded("100k-deep txn", bytes.len(), 2, SLACK_BYTES, || {
                decode_request::<TxnRequest>(Bytes::from(bytes.clone()))
            });
            too_many_ops(refused.unwrap_err());
            let mut entry = Vec::new();
            put_key(&mut entry, 6, 2);
            put_varint(&mut entry, bytes.len() as u64);
            entry.extend_from_slice(&bytes);
            assert!(matches!(
                decode_internal_raft_request(&entry),
                Err(api::codec::TxnDecodeError::TooDeep)
            ));
            assert!(started.elapsed() < std::time::Duration::from_secs(5));
        }
        // the deepest accepted, and one more
        let deepest = nested_txn_bytes(MAX_TXN_DEPTH, 2);
        assert!(decode_request::<TxnRequest>(Bytes::from(deepest)).is_ok());
        let deeper = nested_txn_bytes(MAX_TXN_DEPTH + 1, 3);
        too_many_ops(decode_request::<TxnRequest>(Bytes::from(deeper)).unwrap_err());
    });
}

#[test]
fn lengths_past_the_input_are_refused_not_allocated() {
    let fuzz = Fuzz::new("api-huge-lengths", 300);
    let mut rng = fuzz.rng();
    on_stack(REQUEST_THREAD_STACK_BYTES, move || {
        for _ in fuzz.iterations() {
            // A length-delimited field (bytes, string, message, packed)
            // claiming up to 2^64 bytes, followed by a few real ones.
            let mut bytes = Vec::new();
            protobuf_fields(&mut rng, 2, &mut bytes);
            put_key(&mut bytes, field_number(&mut rng), 2);
            put_varint(&mut bytes, fuzz_support::huge(&mut rng));
            bytes.extend(some_bytes(&mut rng, 0..32));
            let mut decoded = 0;
            every_request!(&bytes, decoded);
            let _ = decoded;
        }
    });
}

#[test]
fn the_meter_sees_what_a_decoder_allocates() {
    let (v, peak) = fuzz_support::peak_bytes(|| vec![1u8; 100_000]);
    assert!(peak >= 100_000, "{peak}");
    drop(v);
    let (_, peak) = fuzz_support::peak_bytes(|| {
        decode_request::<pb::PutRequest>(Bytes::from(vec![0x12, 0x03, 1, 2, 3]))
    });
    assert!(peak < 1024, "{peak}");
}
