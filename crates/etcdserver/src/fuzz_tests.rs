//! Fuzzing what the member decodes after raft and from its backend: a
//! committed entry's bytes (decoded as an `InternalRaftRequest` and
//! applied, conf changes with their member record among them), the side
//! tables' records a start or an installed snapshot recovers leases,
//! alarms, the auth store and members from, and the auth tokens a client
//! presents. Apply may refuse a request (etcd's error to its proposer) or
//! halt (an entry it cannot carry out), never panic: a panic on the apply
//! thread stops the member, and every member applies the same entry.
//!
//! `FUZZ_SEED` / `FUZZ_RUNS` replay or lengthen a run:
//! `FUZZ_RUNS=20000 cargo test -p etcdserver --lib fuzz_tests`.

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use std::path::Path;
use std::sync::Arc;

use api::authpb::{Permission, UserAddOptions};
use api::etcdserverpb::request_op::Request as Op;
use api::etcdserverpb::*;
use api::oxcdauthpb::AuthStore as StoredAuth;
use base64::Engine;
use bytes::Bytes;
use fuzz_support::{mutate, on_stack, protobuf_fields, some_bytes, Fuzz};
use prost::Message;
use protobuf::Message as _;

use crate::alarms::Alarms;
use crate::apply::{Request, StateMachine};
use crate::auth::{AuthConfig, AuthStore};
use crate::membership::{ClusterMembers, Member};
use crate::metrics::Metrics;

const MEMBER: u64 = 0x8e9e05c52164694d;

fn auth_store(token: &str) -> AuthStore {
    let config = AuthConfig {
        token: token.to_string(),
        bcrypt_cost: 4,
        ..AuthConfig::default()
    };
    AuthStore::new(
        &config,
        prometheus::IntGauge::new("auth_revision", "fuzz").expect("gauge"),
    )
    .expect("auth store")
}

/// A member's state machine on `dir`, recovered from its store as a start
/// recovers it.
fn machine(dir: &Path) -> StateMachine {
    let store = Arc::new(mvcc::Store::open(&dir.join("db")).expect("store"));
    let lessor = Arc::new(lease::Lessor::new(5, None));
    {
        let lessor = lessor.clone();
        store.set_lease_lookup(Arc::new(move |id| lessor.exists(id)));
    }
    let members = Arc::new(ClusterMembers::new(vec![Member {
        id: MEMBER,
        name: "m1".into(),
        peer_urls: vec!["http://127.0.0.1:2380".into()],
        client_urls: Vec::new(),
        is_learner: false,
    }]));
    let machine = StateMachine::new(
        store,
        lessor,
        Arc::new(Alarms::default()),
        members,
        Arc::new(Metrics::new(MEMBER, false)),
        Arc::new(auth_store("simple")),
    );
    machine.recover().expect("recover");
    machine
}

// ---- requests as a leader could commit them ----

fn key(rng: &mut fastrand::Rng) -> Bytes {
    match rng.u8(..10) {
        0 => Bytes::new(),
        1 => Bytes::from_static(b"\0"),
        2 => Bytes::from(some_bytes(rng, 0..40)),
        _ => Bytes::from(vec![b'a' + rng.u8(..4); rng.usize(1..3)]),
    }
}

fn name(rng: &mut fastrand::Rng) -> String {
    ["", "root", "u1", "u2", "r1", "r2", "\u{0}", "ü"][rng.usize(..8)].to_string()
}

fn int(rng: &mut fastrand::Rng) -> i64 {
    match rng.u8(..8) {
        0 => 0,
        1 => i64::MAX,
        2 => i64::MIN,
        3 => -rng.i64(1..100),
        4 => rng.i64(..),
        _ => rng.i64(1..20),
    }
}

fn lease_id(rng: &mut fastrand::Rng) -> i64 {
    match rng.u8(..4) {
        0 => 0,
        1 => int(rng),
        _ => rng.i64(1..4),
    }
}

fn random_op(rng: &mut fastrand::Rng, depth: usize) -> RequestOp {
    let request = match rng.u8(..9) {
        0 => None,
        1..=3 => Some(Op::RequestPut(random_put(rng))),
        4 | 5 => Some(Op::RequestDeleteRange(random_delete(rng))),
        6 | 7 => Some(Op::RequestRange(RangeRequest {
            key: key(rng),
            range_end: key(rng),
            limit: int(rng),
            revision: int(rng),
            sort_order: rng.i32(-1..4),
            sort_target: rng.i32(-1..6),
            count_only: rng.bool(),
            keys_only: rng.bool(),
            min_mod_revision: int(rng),
            max_create_revision: int(rng),
            ..Default::default()
        })),
        _ if depth > 0 => Some(Op::RequestTxn(random_txn(rng, depth - 1))),
        _ => None,
    };
    RequestOp { request }
}

fn random_put(rng: &mut fastrand::Rng) -> PutRequest {
    PutRequest {
        key: key(rng),
        value: Bytes::from(some_bytes(rng, 0..16)),
        lease: lease_id(rng),
        prev_kv: rng.bool(),
        ignore_value: rng.u8(..6) == 0,
        ignore_lease: rng.u8(..6) == 0,
    }
}

fn random_delete(rng: &mut fastrand::Rng) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: key(rng),
        range_end: if rng.bool() { key(rng) } else { Bytes::new() },
        prev_kv: rng.bool(),
    }
}

fn random_txn(rng: &mut fastrand::Rng, depth: usize) -> TxnRequest {
    let ops = |rng: &mut fastrand::Rng| {
        (0..rng.usize(0..4))
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
                target_union: match rng.u8(..6) {
                    0 => None,
                    1 => Some(compare::TargetUnion::Version(int(rng))),
                    2 => Some(compare::TargetUnion::CreateRevision(int(rng))),
                    3 => Some(compare::TargetUnion::ModRevision(int(rng))),
                    4 => Some(compare::TargetUnion::Value(key(rng))),
                    _ => Some(compare::TargetUnion::Lease(lease_id(rng))),
                },
            })
            .collect(),
        success: ops(rng),
        failure: ops(rng),
    }
}

fn random_request(rng: &mut fastrand::Rng) -> InternalRaftRequest {
    let mut r = InternalRaftRequest {
        header: rng.u8(..4).ne(&0).then(|| RequestHeader {
            id: rng.u64(..),
            username: name(rng),
            auth_revision: rng.u64(..4),
        }),
        id: rng.u64(..),
        ..Default::default()
    };
    match rng.u8(..26) {
        0..=3 => r.put = Some(random_put(rng)),
        4 => r.delete_range = Some(random_delete(rng)),
        5 | 6 => {
            let depth = rng.usize(0..4);
            r.txn = Some(random_txn(rng, depth));
        }
        7 => {
            r.compaction = Some(CompactionRequest {
                revision: int(rng),
                physical: rng.bool(),
            })
        }
        8 | 9 => {
            r.lease_grant = Some(LeaseGrantRequest {
                ttl: int(rng),
                id: lease_id(rng),
            })
        }
        10 => r.lease_revoke = Some(LeaseRevokeRequest { id: lease_id(rng) }),
        11 => {
            r.lease_checkpoint = Some(LeaseCheckpointRequest {
                checkpoints: (0..rng.usize(0..3))
                    .map(|_| LeaseCheckpoint {
                        id: lease_id(rng),
                        remaining_ttl: int(rng),
                    })
                    .collect(),
            })
        }
        12 => {
            r.alarm = Some(AlarmRequest {
                action: rng.i32(-1..4),
                member_id: if rng.bool() { MEMBER } else { rng.u64(..) },
                alarm: rng.i32(-1..4),
            })
        }
        13 => {
            r.cluster_member_attr_set = Some(ClusterMemberAttrSetRequest {
                member_id: if rng.bool() { MEMBER } else { rng.u64(..) },
                member_attributes: rng.bool().then(|| Attributes {
                    name: name(rng),
                    client_urls: (0..rng.usize(0..3))
                        .map(|_| String::from_utf8_lossy(&some_bytes(rng, 0..20)).into_owned())
                        .collect(),
                }),
            })
        }
        14 => {
            r.authenticate = Some(InternalAuthenticateRequest {
                name: name(rng),
                password: name(rng),
                simple_token: String::from_utf8_lossy(&some_bytes(rng, 0..24)).into_owned(),
            })
        }
        15 => r.auth_enable = Some(AuthEnableRequest {}),
        16 => r.auth_disable = Some(AuthDisableRequest {}),
        17 => {
            r.auth_user_add = Some(AuthUserAddRequest {
                name: name(rng),
                password: name(rng),
                options: rng.bool().then(|| UserAddOptions {
                    no_password: rng.bool(),
                }),
                hashed_password: ["", "$2a$04$x", "not a hash"][rng.usize(..3)].to_string(),
            })
        }
        18 => {
            r.auth_user_change_password = Some(AuthUserChangePasswordRequest {
                name: name(rng),
                password: name(rng),
                hashed_password: String::new(),
            })
        }
        19 => {
            r.auth_user_grant_role = Some(AuthUserGrantRoleRequest {
                user: name(rng),
                role: name(rng),
            })
        }
        20 => {
            r.auth_user_revoke_role = Some(AuthUserRevokeRoleRequest {
                name: name(rng),
                role: name(rng),
            })
        }
        21 => r.auth_role_add = Some(AuthRoleAddRequest { name: name(rng) }),
        22 => {
            r.auth_role_grant_permission = Some(AuthRoleGrantPermissionRequest {
                name: name(rng),
                perm: rng.u8(..6).ne(&0).then(|| Permission {
                    perm_type: rng.i32(-1..4),
                    key: key(rng),
                    range_end: key(rng),
                }),
            })
        }
        23 => {
            r.auth_role_revoke_permission = Some(AuthRoleRevokePermissionRequest {
                role: name(rng),
                key: key(rng),
                range_end: key(rng),
            })
        }
        24 => r.auth_user_delete = Some(AuthUserDeleteRequest { name: name(rng) }),
        _ => r.auth_role_delete = Some(AuthRoleDeleteRequest { role: name(rng) }),
    }
    r
}

/// A conf change as a leader commits one: its member record in the
/// context, sound or not.
fn random_conf_change(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut cc = raft::eraftpb::ConfChange {
        node_id: if rng.bool() { MEMBER } else { rng.u64(..5) },
        ..Default::default()
    };
    cc.set_change_type(match rng.u8(..3) {
        0 => raft::eraftpb::ConfChangeType::AddNode,
        1 => raft::eraftpb::ConfChangeType::AddLearnerNode,
        _ => raft::eraftpb::ConfChangeType::RemoveNode,
    });
    let mut context = match rng.u8(..3) {
        0 => Vec::new(),
        1 => some_bytes(rng, 0..30),
        _ => schema::members::encode(&Member {
            id: cc.node_id,
            name: name(rng),
            peer_urls: vec![format!("http://10.0.0.{}:2380", rng.u8(..4))],
            client_urls: Vec::new(),
            is_learner: rng.bool(),
        }),
    };
    if rng.u8(..4) == 0 {
        mutate(rng, &mut context);
    }
    cc.context = context.into();
    cc.write_to_bytes().expect("encode")
}

#[test]
fn committed_entries_of_any_bytes_apply_or_halt() {
    let fuzz = Fuzz::new("apply-entries", 5000);
    let mut rng = fuzz.rng();
    let dir = tempfile::tempdir().expect("tempdir");
    let (applied, halted) = on_stack(api::codec::REQUEST_THREAD_STACK_BYTES, move || {
        let machine = machine(dir.path());
        let (mut applied, mut halted) = (0, 0);
        for _ in fuzz.iterations() {
            let index = machine.store.consistent_index() + 1;
            if rng.u8(..12) == 0 {
                let mut bytes = random_conf_change(&mut rng);
                if rng.u8(..4) == 0 {
                    mutate(&mut rng, &mut bytes);
                }
                // what the apply loop does with a conf change entry
                if let Ok(cc) = raft::eraftpb::ConfChange::parse_from_bytes(&bytes) {
                    match machine.apply_conf_change(index, &cc) {
                        Ok(_) => applied += 1,
                        Err(_) => halted += 1,
                    }
                }
                continue;
            }
            let mut bytes = match rng.u8(..8) {
                0 => {
                    let mut bytes = Vec::new();
                    let depth = rng.usize(0..4);
                    protobuf_fields(&mut rng, depth, &mut bytes);
                    bytes
                }
                _ => random_request(&mut rng).encode_to_vec(),
            };
            if rng.u8(..5) == 0 {
                mutate(&mut rng, &mut bytes);
            }
            // what the apply loop does with a normal entry's bytes
            let Ok(decoded) = api::codec::decode_internal_raft_request(&bytes) else {
                continue;
            };
            let Some((_, user, request)) = Request::from_entry(decoded) else {
                continue;
            };
            match machine.apply(index, Some((user, request))) {
                Ok(_) => applied += 1,
                Err(_) => halted += 1,
            }
            if rng.u8(..50) == 0 {
                machine.store.commit(false).expect("commit");
            }
        }
        (applied, halted)
    });
    eprintln!("{applied} entries applied, {halted} halted apply");
    assert!(applied > 0);
}

// ---- records recovered from the backend ----

/// A side table's record: a sound one, damaged, or noise.
fn record(rng: &mut fastrand::Rng, sound: Vec<u8>) -> Option<Vec<u8>> {
    let mut bytes = match rng.u8(..6) {
        0 => return None,
        1 => some_bytes(rng, 0..40),
        _ => sound,
    };
    if rng.u8(..3) == 0 {
        mutate(rng, &mut bytes);
    }
    Some(bytes)
}

fn random_auth_store(rng: &mut fastrand::Rng) -> Vec<u8> {
    let users = (0..rng.usize(0..4))
        .map(|_| api::authpb::User {
            name: Bytes::from(name(rng)),
            password: Bytes::from(["", "$2a$04$abc", "\u{0}"][rng.usize(..3)]),
            roles: (0..rng.usize(0..3)).map(|_| name(rng)).collect(),
            options: rng.bool().then(|| UserAddOptions {
                no_password: rng.bool(),
            }),
        })
        .collect();
    let roles = (0..rng.usize(0..4))
        .map(|_| api::authpb::Role {
            name: Bytes::from(name(rng)),
            key_permission: (0..rng.usize(0..4))
                .map(|_| Permission {
                    perm_type: rng.i32(-1..4),
                    key: key(rng),
                    range_end: key(rng),
                })
                .collect(),
        })
        .collect();
    schema::auth::encode(&StoredAuth {
        enabled: rng.bool(),
        revision: rng.u64(..),
        users,
        roles,
    })
}

#[test]
fn stored_records_of_any_bytes_recover_or_are_refused() {
    use mvcc::SideTable;
    let fuzz = Fuzz::new("recover-records", 1000);
    let mut rng = fuzz.rng();
    let dir = tempfile::tempdir().expect("tempdir");
    let machine = machine(dir.path());
    let mut recovered = 0;
    for iteration in fuzz.iterations() {
        let index = iteration as u64 + 1;
        for _ in 0..rng.usize(1..6) {
            let id = rng.u64(..6);
            let (side, sound) = match rng.u8(..5) {
                0 => (
                    SideTable::Leases,
                    schema::leases::encode(lease_id(&mut rng), int(&mut rng), int(&mut rng)),
                ),
                1 => (
                    SideTable::Alarms,
                    schema::alarms::encode(rng.u64(..), rng.i32(-1..4)),
                ),
                2 => (SideTable::Auth, random_auth_store(&mut rng)),
                3 => (
                    SideTable::Members,
                    schema::members::encode(&Member {
                        id,
                        name: name(&mut rng),
                        peer_urls: vec![
                            String::from_utf8_lossy(&some_bytes(&mut rng, 0..20)).into_owned()
                        ],
                        client_urls: Vec::new(),
                        is_learner: rng.bool(),
                    }),
                ),
                _ => (
                    SideTable::MembersRemoved,
                    schema::members::REMOVED_RECORD.to_vec(),
                ),
            };
            let id = if matches!(side, SideTable::Auth) {
                0
            } else {
                id
            };
            machine
                .store
                .put_side(side, id, record(&mut rng, sound), index);
        }
        machine.store.commit(false).expect("commit");
        if machine.recover().is_ok() {
            recovered += 1;
            // what the recovered state answers
            let _ = machine.auth.token_info("x.1");
            let _ = machine.auth.has_role("u1", "r1");
            let info = crate::auth::AuthInfo {
                username: name(&mut rng),
                revision: machine.auth.revision(),
            };
            let _ = machine.auth.check_range(
                &info,
                &RangeRequest {
                    key: key(&mut rng),
                    range_end: key(&mut rng),
                    ..Default::default()
                },
            );
        }
    }
    eprintln!("{} rounds of records: {recovered} recovered", fuzz.runs);
}

// ---- tokens ----

/// An HS256 token for `claims`, signed with `secret` or not.
fn hs256(secret: &[u8], header: &str, claims: &str) -> String {
    let segment = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut token = format!("{}.{}", segment.encode(header), segment.encode(claims));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let signature = ring::hmac::sign(&key, token.as_bytes());
    token.push('.');
    token.push_str(&segment.encode(signature.as_ref()));
    token
}

fn random_claims(rng: &mut fastrand::Rng) -> String {
    let number = |rng: &mut fastrand::Rng| -> String {
        match rng.u8(..8) {
            0 => "1e400".into(),
            1 => "-1e400".into(),
            2 => "\"12\"".into(),
            3 => "9223372036854775808".into(),
            4 => "-0.5".into(),
            5 => "null".into(),
            _ => format!("{}", rng.i64(..)),
        }
    };
    let mut fields = Vec::new();
    for name in ["exp", "iat", "nbf", "revision"] {
        if rng.u8(..4) != 0 {
            fields.push(format!("\"{name}\":{}", number(rng)));
        }
    }
    if rng.u8(..5) != 0 {
        fields.push(format!(
            "\"username\":{}",
            ["\"root\"", "1", "null", "\"\\ud800\""][rng.usize(..4)]
        ));
    }
    let mut claims = format!("{{{}}}", fields.join(","));
    if rng.u8(..8) == 0 {
        claims = format!("{}{}", "[".repeat(rng.usize(1..300)), claims);
    }
    claims
}

#[test]
fn auth_tokens_of_any_text_name_a_user_or_none() {
    let fuzz = Fuzz::new("auth-tokens", 3000);
    let mut rng = fuzz.rng();
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, b"fuzzing secret").expect("write");
    let jwt = auth_store(&format!(
        "jwt,priv-key={},sign-method=HS256,ttl=5m",
        secret.display()
    ));
    let simple = auth_store("simple");
    for _ in fuzz.iterations() {
        let header = [
            "{\"alg\":\"HS256\",\"typ\":\"JWT\"}",
            "{\"alg\":\"none\"}",
            "{}",
            "[",
            "{\"alg\":1}",
        ][rng.usize(..5)];
        let signing_key: &[u8] = if rng.u8(..4) == 0 {
            b"another"
        } else {
            b"fuzzing secret"
        };
        let mut token = hs256(signing_key, header, &random_claims(&mut rng)).into_bytes();
        match rng.u8(..4) {
            0 => mutate(&mut rng, &mut token),
            1 => token = some_bytes(&mut rng, 0..64),
            _ => {}
        }
        let token = String::from_utf8_lossy(&token);
        let _ = jwt.token_info(&token);
        let _ = simple.token_info(&token);
        let _ = crate::auth::tokens::simple_token_index(&token);
    }
    // a token longer than any etcd signs, and one of dots
    let _ = jwt.token_info(&"a".repeat(1 << 20));
    let _ = jwt.token_info(&".".repeat(1 << 16));
}

#[test]
fn the_deepest_txn_an_entry_carries_applies_on_the_apply_threads_stack() {
    let dir = tempfile::tempdir().expect("tempdir");
    on_stack(api::codec::REQUEST_THREAD_STACK_BYTES, move || {
        let machine = machine(dir.path());
        let mut txn = TxnRequest {
            success: vec![RequestOp {
                request: Some(Op::RequestPut(PutRequest {
                    key: Bytes::from_static(b"deep"),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        for _ in 1..api::codec::MAX_TXN_DEPTH {
            txn = TxnRequest {
                compare: vec![Compare {
                    key: Bytes::from_static(b"deep"),
                    target_union: Some(compare::TargetUnion::Version(0)),
                    ..Default::default()
                }],
                success: vec![RequestOp {
                    request: Some(Op::RequestTxn(txn)),
                }],
                ..Default::default()
            };
        }
        let entry = InternalRaftRequest {
            txn: Some(txn),
            ..Default::default()
        }
        .encode_to_vec();
        let decoded = api::codec::decode_internal_raft_request(&entry).expect("decodes");
        let (_, user, request) = Request::from_entry(decoded).expect("a txn");
        let outcome = machine.apply(1, Some((user, request))).expect("applies");
        assert!(matches!(outcome, Some(Ok(_))), "{outcome:?}");
        assert_eq!(
            machine.store.current_revision(),
            2,
            "the put at the bottom applied"
        );
    });
}
