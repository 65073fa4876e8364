//! Auth through the state machine: etcd's rules and errors for every Auth
//! request, the revision, the permission matrix of writes checked at apply
//! (nested txns, prev_kv and lease keys included: the fixed behaviour),
//! and the store surviving a reopen.

use api::authpb::{permission::Type as PermType, Permission, UserAddOptions};
use api::etcdserverpb::*;
use api::rpctypes::{self, EtcdError};

use super::request::ApplyResponse;
use super::tests::{apply, apply_as, machine, put, value};
use super::StateMachine;
use crate::auth::{Access, AuthInfo};

fn ok(outcome: super::ApplyOutcome) -> ApplyResponse {
    outcome.unwrap_or_else(|e| panic!("refused: {e}"))
}

fn err(outcome: super::ApplyOutcome) -> EtcdError {
    match outcome {
        Ok(r) => panic!("applied: {r:?}"),
        Err(e) => e,
    }
}

fn hashed(password: &str) -> String {
    use base64::Engine;
    let hash = bcrypt::hash(password, 4).unwrap();
    base64::engine::general_purpose::STANDARD.encode(hash)
}

fn user_add(m: &StateMachine, name: &str) -> super::ApplyOutcome {
    apply(
        m,
        AuthUserAddRequest {
            name: name.into(),
            hashed_password: hashed("pw"),
            ..Default::default()
        },
    )
}

fn grant(m: &StateMachine, user: &str, role: &str) -> super::ApplyOutcome {
    apply(
        m,
        AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        },
    )
}

fn role_perm(
    m: &StateMachine,
    role: &str,
    t: PermType,
    key: &str,
    end: &str,
) -> super::ApplyOutcome {
    apply(
        m,
        AuthRoleGrantPermissionRequest {
            name: role.into(),
            perm: Some(Permission {
                perm_type: t as i32,
                key: key.as_bytes().to_vec().into(),
                range_end: end.as_bytes().to_vec().into(),
            }),
        },
    )
}

fn role_add(m: &StateMachine, name: &str) -> super::ApplyOutcome {
    apply(m, AuthRoleAddRequest { name: name.into() })
}

fn revision(m: &StateMachine) -> u64 {
    m.auth.revision()
}

/// root (with the root role) and auth enabled.
fn enabled(m: &StateMachine) {
    ok(user_add(m, "root"));
    ok(grant(m, "root", "root"));
    ok(apply(m, AuthEnableRequest {}));
}

fn as_user(m: &StateMachine, name: &str) -> AuthInfo {
    AuthInfo {
        username: name.into(),
        revision: revision(m),
    }
}

#[test]
fn enabling_needs_root_with_the_root_role_and_keeps_the_revision() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    assert_eq!(revision(&m), 1, "a fresh store is at revision 1");
    assert_eq!(
        err(apply(&m, AuthEnableRequest {})),
        rpctypes::ROOT_USER_NOT_EXIST
    );
    ok(user_add(&m, "root"));
    assert_eq!(
        err(apply(&m, AuthEnableRequest {})),
        rpctypes::ROOT_ROLE_NOT_EXIST
    );
    // The root role need not exist as a role to be granted.
    ok(grant(&m, "root", "root"));
    let before = revision(&m);
    ok(apply(&m, AuthEnableRequest {}));
    assert!(m.auth.is_enabled());
    assert_eq!(revision(&m), before, "AuthEnable does not bump");
    // Enabled: admin requests need root.
    let root = as_user(&m, "root");
    ok(apply_as(&m, root.clone(), AuthEnableRequest {}));
    assert_eq!(err(apply(&m, AuthStatusRequest {})), rpctypes::USER_EMPTY);
    let ghost = as_user(&m, "ghost");
    assert_eq!(
        err(apply_as(&m, ghost, AuthUserListRequest {})),
        rpctypes::USER_NOT_FOUND
    );
    let ApplyResponse::AuthStatus(status) = ok(apply_as(&m, root.clone(), AuthStatusRequest {}))
    else {
        panic!()
    };
    assert!(status.enabled);
    assert_eq!(status.auth_revision, before);
    // Disabling bumps.
    ok(apply_as(&m, root, AuthDisableRequest {}));
    assert!(!m.auth.is_enabled());
    assert_eq!(revision(&m), before + 1);
}

#[test]
fn user_and_role_errors_are_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    assert_eq!(err(user_add(&m, "")), rpctypes::USER_EMPTY);
    ok(user_add(&m, "alice"));
    assert_eq!(err(user_add(&m, "alice")), rpctypes::USER_ALREADY_EXIST);
    assert_eq!(err(role_add(&m, "")), rpctypes::ROLE_EMPTY);
    ok(role_add(&m, "r"));
    assert_eq!(err(role_add(&m, "r")), rpctypes::ROLE_ALREADY_EXIST);
    assert_eq!(err(grant(&m, "bob", "r")), rpctypes::USER_NOT_FOUND);
    assert_eq!(err(grant(&m, "alice", "nope")), rpctypes::ROLE_NOT_FOUND);
    ok(grant(&m, "alice", "r"));
    let at = revision(&m);
    ok(grant(&m, "alice", "r"));
    assert_eq!(revision(&m), at, "granting again changes nothing");
    let revoke = |role: &str| {
        apply(
            &m,
            AuthUserRevokeRoleRequest {
                name: "alice".into(),
                role: role.into(),
            },
        )
    };
    assert_eq!(err(revoke("other")), rpctypes::ROLE_NOT_GRANTED);
    assert_eq!(
        err(apply(
            &m,
            AuthRoleGrantPermissionRequest {
                name: "r".into(),
                perm: None
            }
        )),
        rpctypes::PERMISSION_NOT_GIVEN
    );
    assert_eq!(
        err(role_perm(&m, "r", PermType::Read, "b", "a")),
        rpctypes::INVALID_AUTH_MGMT
    );
    assert_eq!(
        err(role_perm(&m, "nope", PermType::Read, "a", "")),
        rpctypes::ROLE_NOT_FOUND
    );
    ok(role_perm(&m, "r", PermType::Read, "k2", ""));
    ok(role_perm(&m, "r", PermType::Read, "k1", "k3"));
    // Same key and end: the type is updated in place.
    ok(role_perm(&m, "r", PermType::Write, "k2", ""));
    let ApplyResponse::AuthRoleGet(role) = ok(apply(&m, AuthRoleGetRequest { role: "r".into() }))
    else {
        panic!()
    };
    let keys: Vec<(&[u8], i32)> = role
        .perm
        .iter()
        .map(|p| (&p.key[..], p.perm_type))
        .collect();
    assert_eq!(keys, [(&b"k1"[..], 0), (&b"k2"[..], 1)], "sorted by key");
    let revoke_perm = |key: &str, end: &str| {
        apply(
            &m,
            AuthRoleRevokePermissionRequest {
                role: "r".into(),
                key: key.as_bytes().to_vec().into(),
                range_end: end.as_bytes().to_vec().into(),
            },
        )
    };
    assert_eq!(err(revoke_perm("k1", "")), rpctypes::PERMISSION_NOT_GRANTED);
    ok(revoke_perm("k1", "k3"));
    ok(revoke("r"));
    assert_eq!(
        err(apply(&m, AuthUserGetRequest { name: "x".into() })),
        rpctypes::USER_NOT_FOUND
    );
    assert_eq!(
        err(apply(&m, AuthRoleDeleteRequest { role: "x".into() })),
        rpctypes::ROLE_NOT_FOUND
    );
    // Deleting a role takes it from its users.
    ok(grant(&m, "alice", "r"));
    ok(apply(&m, AuthRoleDeleteRequest { role: "r".into() }));
    let ApplyResponse::AuthUserGet(alice) = ok(apply(
        &m,
        AuthUserGetRequest {
            name: "alice".into(),
        },
    )) else {
        panic!()
    };
    assert!(alice.roles.is_empty());
    assert_eq!(
        err(apply(&m, AuthUserDeleteRequest { name: "x".into() })),
        rpctypes::USER_NOT_FOUND
    );
    let ApplyResponse::AuthUserList(list) = ok(apply(&m, AuthUserListRequest {})) else {
        panic!()
    };
    assert_eq!(list.users, ["alice"]);
}

#[test]
fn root_cannot_be_taken_apart_while_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    ok(role_add(&m, "root"));
    enabled(&m);
    let root = as_user(&m, "root");
    for outcome in [
        apply_as(
            &m,
            root.clone(),
            AuthUserDeleteRequest {
                name: "root".into(),
            },
        ),
        apply_as(
            &m,
            root.clone(),
            AuthRoleDeleteRequest {
                role: "root".into(),
            },
        ),
        apply_as(
            &m,
            root.clone(),
            AuthUserRevokeRoleRequest {
                name: "root".into(),
                role: "root".into(),
            },
        ),
    ] {
        assert_eq!(err(outcome), rpctypes::INVALID_AUTH_MGMT);
    }
}

#[test]
fn own_user_and_own_roles_are_readable_without_root() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    ok(user_add(&m, "alice"));
    ok(role_add(&m, "mine"));
    ok(role_add(&m, "other"));
    ok(grant(&m, "alice", "mine"));
    enabled(&m);
    let alice = as_user(&m, "alice");
    ok(apply_as(
        &m,
        alice.clone(),
        AuthUserGetRequest {
            name: "alice".into(),
        },
    ));
    ok(apply_as(
        &m,
        alice.clone(),
        AuthRoleGetRequest {
            role: "mine".into(),
        },
    ));
    let denied = |r: super::ApplyOutcome| assert_eq!(err(r), rpctypes::PERMISSION_DENIED);
    denied(apply_as(
        &m,
        alice.clone(),
        AuthUserGetRequest {
            name: "root".into(),
        },
    ));
    denied(apply_as(
        &m,
        alice.clone(),
        AuthRoleGetRequest {
            role: "other".into(),
        },
    ));
    denied(apply_as(&m, alice.clone(), AuthUserListRequest {}));
    denied(apply_as(&m, alice.clone(), AuthRoleListRequest {}));
    denied(apply_as(
        &m,
        alice,
        AuthUserChangePasswordRequest {
            name: "alice".into(),
            hashed_password: hashed("new"),
            ..Default::default()
        },
    ));
}

/// A user with read on `r`, write on `w`, read-write on the prefix `p/`.
fn matrix(m: &StateMachine) -> AuthInfo {
    ok(user_add(m, "u"));
    ok(role_add(m, "ro"));
    ok(role_perm(m, "ro", PermType::Read, "r", ""));
    ok(role_perm(m, "ro", PermType::Write, "w", ""));
    ok(role_perm(m, "ro", PermType::Readwrite, "p/", "p0"));
    ok(grant(m, "u", "ro"));
    enabled(m);
    as_user(m, "u")
}

fn txn(compare: &[&str], success: Vec<RequestOp>) -> TxnRequest {
    TxnRequest {
        compare: compare
            .iter()
            .map(|k| Compare {
                key: k.as_bytes().to_vec().into(),
                target: compare::CompareTarget::Version as i32,
                result: compare::CompareResult::Greater as i32,
                target_union: Some(compare::TargetUnion::Version(-1)),
                ..Default::default()
            })
            .collect(),
        success,
        failure: Vec::new(),
    }
}

fn put_op(key: &str, prev_kv: bool, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            prev_kv,
            ..put(key, "v", lease)
        })),
    }
}

#[test]
fn writes_are_allowed_exactly_where_granted() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    let u = matrix(&m);
    let allowed = |r: super::ApplyOutcome| {
        ok(r);
    };
    let denied = |r: super::ApplyOutcome| assert_eq!(err(r), rpctypes::PERMISSION_DENIED);
    allowed(apply_as(&m, u.clone(), put("w", "1", 0)));
    allowed(apply_as(&m, u.clone(), put("p/a", "1", 0)));
    denied(apply_as(&m, u.clone(), put("r", "1", 0)));
    denied(apply_as(&m, u.clone(), put("x", "1", 0)));
    // prev_kv needs read as well.
    denied(apply_as(
        &m,
        u.clone(),
        PutRequest {
            prev_kv: true,
            ..put("w", "2", 0)
        },
    ));
    allowed(apply_as(
        &m,
        u.clone(),
        PutRequest {
            prev_kv: true,
            ..put("p/a", "2", 0)
        },
    ));
    let delete = |key: &str, end: &str, prev_kv: bool| DeleteRangeRequest {
        key: key.as_bytes().to_vec().into(),
        range_end: end.as_bytes().to_vec().into(),
        prev_kv,
    };
    allowed(apply_as(&m, u.clone(), delete("p/", "p0", true)));
    denied(apply_as(&m, u.clone(), delete("p", "p0", false)));
    denied(apply_as(&m, u.clone(), delete("w", "", true)));
    allowed(apply_as(&m, u.clone(), delete("w", "", false)));
    // Txns: compares read, ops as themselves, nested too.
    allowed(apply_as(
        &m,
        u.clone(),
        txn(&["r", "p/x"], vec![put_op("p/y", true, 0)]),
    ));
    denied(apply_as(&m, u.clone(), txn(&["w"], vec![])));
    denied(apply_as(
        &m,
        u.clone(),
        txn(&["r"], vec![put_op("w", true, 0)]),
    ));
    let nested = RequestOp {
        request: Some(request_op::Request::RequestTxn(txn(
            &[],
            vec![put_op("r", false, 0)],
        ))),
    };
    denied(apply_as(&m, u.clone(), txn(&[], vec![nested])));
    assert_eq!(value(&m, "r"), None, "nothing written by a denied request");
    // No credentials, and an old revision.
    assert_eq!(err(apply(&m, put("w", "1", 0))), rpctypes::USER_EMPTY);
    let root = as_user(&m, "root");
    ok(apply_as(&m, root, role_add_req("later")));
    assert_eq!(
        err(apply_as(&m, u, put("w", "1", 0))),
        rpctypes::AUTH_OLD_REVISION
    );
}

fn role_add_req(name: &str) -> AuthRoleAddRequest {
    AuthRoleAddRequest { name: name.into() }
}

#[test]
fn lease_keys_need_write_to_revoke_or_attach() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    let u = matrix(&m);
    let root = as_user(&m, "root");
    ok(apply(&m, LeaseGrantRequest { ttl: 60, id: 7 }));
    ok(apply_as(&m, root.clone(), put("r", "held", 7)));
    // The lease holds a key the user cannot write: no attaching, no revoking.
    assert_eq!(
        err(apply_as(&m, u.clone(), put("w", "1", 7))),
        rpctypes::PERMISSION_DENIED
    );
    assert_eq!(
        err(apply_as(
            &m,
            u.clone(),
            txn(&[], vec![put_op("w", false, 7)])
        )),
        rpctypes::PERMISSION_DENIED
    );
    assert_eq!(
        err(apply_as(&m, u.clone(), LeaseRevokeRequest { id: 7 })),
        rpctypes::PERMISSION_DENIED
    );
    ok(apply_as(&m, root, LeaseRevokeRequest { id: 7 }));
    assert_eq!(value(&m, "r"), None);
}

#[test]
fn read_checks_match_the_grants() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    let u = matrix(&m);
    let check = |key: &str, end: &str| {
        m.auth
            .check(&u, Access::Read, key.as_bytes(), end.as_bytes())
    };
    assert!(check("r", "").is_ok());
    assert!(check("w", "").is_err());
    assert!(check("p/", "p0").is_ok());
    assert!(check("p/a", "p/b").is_ok());
    assert!(check("p", "p0").is_err());
    assert!(check("p/", "\0").is_err());
    let no_user = AuthInfo::default();
    assert_eq!(
        m.auth.check(&no_user, Access::Read, b"r", b""),
        Err(rpctypes::USER_EMPTY)
    );
}

#[test]
fn the_store_survives_a_reopen_and_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    {
        let m = machine(dir.path());
        matrix(&m);
        ok(apply_as(
            &m,
            as_user(&m, "root"),
            AuthUserAddRequest {
                name: "nopw".into(),
                options: Some(UserAddOptions { no_password: true }),
                ..Default::default()
            },
        ));
        m.store.commit(true).unwrap();
    }
    let m = machine(dir.path());
    assert!(m.auth.is_enabled());
    let u = as_user(&m, "u");
    assert!(m.auth.check(&u, Access::Write, b"w", b"").is_ok());
    assert!(m.auth.check(&u, Access::Write, b"r", b"").is_err());
    let ApplyResponse::AuthUserList(list) =
        ok(apply_as(&m, as_user(&m, "root"), AuthUserListRequest {}))
    else {
        panic!()
    };
    assert_eq!(list.users, ["nopw", "root", "u"]);
}

#[tokio::test]
async fn passwords_check_against_bcrypt_and_tokens_are_registered_at_apply() {
    let dir = tempfile::tempdir().unwrap();
    let m = machine(dir.path());
    ok(apply(
        &m,
        AuthUserAddRequest {
            name: "nopw".into(),
            options: Some(UserAddOptions { no_password: true }),
            ..Default::default()
        },
    ));
    assert_eq!(
        m.auth.check_password("root", "pw").await,
        Err(rpctypes::AUTH_NOT_ENABLED)
    );
    enabled(&m);
    assert!(m.auth.check_password("root", "pw").await.is_ok());
    assert_eq!(
        m.auth.check_password("root", "bad").await,
        Err(rpctypes::AUTH_FAILED)
    );
    assert_eq!(
        m.auth.check_password("ghost", "pw").await,
        Err(rpctypes::AUTH_FAILED)
    );
    assert_eq!(
        m.auth.check_password("nopw", "x").await,
        Err(rpctypes::NO_PASSWORD_USER)
    );
    // A hash made by the receiving member is what the store keeps.
    let hash = m.auth.hash_password("s3cret").await.unwrap();
    ok(apply_as(
        &m,
        as_user(&m, "root"),
        AuthUserChangePasswordRequest {
            name: "root".into(),
            hashed_password: hash,
            ..Default::default()
        },
    ));
    assert!(m.auth.check_password("root", "s3cret").await.is_ok());
    // Authenticate applied: a token `<prefix>.<index>` for that user.
    let index = m.store.consistent_index() + 1;
    let ApplyResponse::Authenticate(resp) = ok(apply(
        &m,
        InternalAuthenticateRequest {
            name: "root".into(),
            simple_token: "abcdefghijklmnop".into(),
            ..Default::default()
        },
    )) else {
        panic!()
    };
    assert_eq!(resp.token, format!("abcdefghijklmnop.{index}"));
    assert_eq!(m.auth.token_info(&resp.token).unwrap().username, "root");
    assert_eq!(
        err(apply(
            &m,
            InternalAuthenticateRequest {
                name: "nopw".into(),
                simple_token: "abcdefghijklmnop".into(),
                ..Default::default()
            }
        )),
        rpctypes::AUTH_FAILED
    );
    // Deleting the user drops its tokens.
    ok(apply_as(
        &m,
        as_user(&m, "root"),
        AuthUserAddRequest {
            name: "tmp".into(),
            hashed_password: hashed("x"),
            ..Default::default()
        },
    ));
    let ApplyResponse::Authenticate(tmp) = ok(apply(
        &m,
        InternalAuthenticateRequest {
            name: "tmp".into(),
            simple_token: "qwertyuiopasdfgh".into(),
            ..Default::default()
        },
    )) else {
        panic!()
    };
    ok(apply_as(
        &m,
        as_user(&m, "root"),
        AuthUserDeleteRequest { name: "tmp".into() },
    ));
    assert!(m.auth.token_info(&tmp.token).is_none());
}
