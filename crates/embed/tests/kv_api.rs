//! The KV API through a real client (the `etcd-client` crate), against an
//! in-process member on loopback: etcd's semantics and etcd's errors.

mod common;
use common::member;

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use tonic::Code;

fn status_of(e: etcd_client::Error) -> (Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

fn code(c: Code) -> Code {
    c
}

#[tokio::test]
async fn put_get_delete_follow_etcd_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let r = c.put("a", "1", None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 2);
    assert!(r.header().unwrap().cluster_id() != 0 && r.header().unwrap().member_id() != 0);
    assert!(r.header().unwrap().raft_term() >= 1);
    let r = c
        .put("a", "2", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(r.prev_key().unwrap().value(), b"1");
    c.put("b", "3", None).await.unwrap();

    let g = c.get("a", None).await.unwrap();
    let kv = &g.kvs()[0];
    assert_eq!(
        (kv.create_revision(), kv.mod_revision(), kv.version()),
        (2, 3, 2)
    );
    assert_eq!(g.header().unwrap().revision(), 4);

    // Historical read at revision 2.
    let g = c
        .get("a", Some(GetOptions::new().with_revision(2)))
        .await
        .unwrap();
    assert_eq!(g.kvs()[0].value(), b"1");
    // revision <= 0 reads the current revision.
    let g = c
        .get("a", Some(GetOptions::new().with_revision(-5)))
        .await
        .unwrap();
    assert_eq!(g.kvs()[0].value(), b"2");

    let d = c
        .delete("a", Some(DeleteOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(d.deleted(), 1);
    assert_eq!(d.prev_kvs()[0].value(), b"2");
    assert!(c.get("a", None).await.unwrap().kvs().is_empty());
    // Deleting nothing does not bump the revision.
    let d = c.delete("nothing", None).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (0, 5));
    m.stop().await;
}

#[tokio::test]
async fn range_options_match_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    for (k, v) in [("k1", "c"), ("k2", "a"), ("k3", "b"), ("z", "z")] {
        c.put(k, v, None).await.unwrap();
    }
    let g = c
        .get("k", Some(GetOptions::new().with_prefix().with_limit(2)))
        .await
        .unwrap();
    assert_eq!((g.kvs().len(), g.more(), g.count()), (2, true, 3));
    // limit <= 0 means no limit.
    let g = c
        .get("k", Some(GetOptions::new().with_prefix().with_limit(-1)))
        .await
        .unwrap();
    assert_eq!((g.kvs().len(), g.more()), (3, false));
    let g = c
        .get(
            "k",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Value, SortOrder::Descend),
            ),
        )
        .await
        .unwrap();
    let keys: Vec<&str> = g.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(keys, ["k1", "k3", "k2"]);
    let g = c
        .get("k", Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .unwrap();
    assert_eq!((g.kvs().len(), g.count()), (0, 3));
    let g = c
        .get("k", Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    assert!(g.kvs().iter().all(|kv| kv.value().is_empty()));
    // from key to the end; all keys.
    let g = c
        .get("k2", Some(GetOptions::new().with_from_key()))
        .await
        .unwrap();
    assert_eq!(g.count(), 3);
    let g = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(g.count(), 4);
    // An inverted range returns nothing.
    let g = c
        .get("z", Some(GetOptions::new().with_range("a")))
        .await
        .unwrap();
    assert_eq!(g.count(), 0);
    let g = c
        .get(
            "k",
            Some(GetOptions::new().with_prefix().with_min_mod_revision(4)),
        )
        .await
        .unwrap();
    assert_eq!(g.kvs().len(), 1);
    let g = c
        .get("k1", Some(GetOptions::new().with_serializable()))
        .await
        .unwrap();
    assert_eq!(g.kvs()[0].value(), b"c");
    m.stop().await;
}

#[tokio::test]
async fn txn_compares_and_branches() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    c.put("x", "1", None).await.unwrap();
    let t = Txn::new()
        .when([
            Compare::value("x", CompareOp::Equal, "1"),
            Compare::version("x", CompareOp::Greater, 0),
        ])
        .and_then([TxnOp::put("y", "2", None), TxnOp::get("x", None)])
        .or_else([TxnOp::put("z", "3", None)]);
    let r = c.txn(t).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(r.header().unwrap().revision(), 3);
    let t = Txn::new()
        .when([Compare::mod_revision("x", CompareOp::Less, 2)])
        .and_then([TxnOp::put("y", "9", None)])
        .or_else([TxnOp::put("z", "3", None), TxnOp::delete("x", None)]);
    let r = c.txn(t).await.unwrap();
    assert!(!r.succeeded());
    // Both ops of the txn share one revision.
    let g = c.get("z", None).await.unwrap();
    assert_eq!(g.kvs()[0].mod_revision(), 4);
    assert!(c.get("x", None).await.unwrap().kvs().is_empty());
    // A read-only txn does not bump the revision.
    let r = c
        .txn(Txn::new().and_then([TxnOp::get("z", None)]))
        .await
        .unwrap();
    assert_eq!(r.header().unwrap().revision(), 4);
    m.stop().await;
}

#[tokio::test]
async fn errors_carry_etcds_codes_and_messages() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |cfg| cfg.max_request_bytes = 64 * 1024).await;
    for i in 0..5 {
        c.put("k", format!("{i}"), None).await.unwrap();
    }
    c.compact(4, None).await.unwrap();
    let e = status_of(
        c.get("k", Some(GetOptions::new().with_revision(3)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e,
        (
            code(Code::OutOfRange),
            "etcdserver: mvcc: required revision has been compacted".into()
        )
    );
    // The compacted revision itself is still readable.
    c.get("k", Some(GetOptions::new().with_revision(4)))
        .await
        .unwrap();
    let e = status_of(c.compact(3, None).await.unwrap_err());
    assert_eq!(
        e.1,
        "etcdserver: mvcc: required revision has been compacted"
    );
    let e = status_of(
        c.get("k", Some(GetOptions::new().with_revision(100)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e,
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision".into()
        )
    );
    let e = status_of(c.compact(100, None).await.unwrap_err());
    assert_eq!(
        e.1,
        "etcdserver: mvcc: required revision is a future revision"
    );

    let ops: Vec<TxnOp> = (0..129)
        .map(|i| TxnOp::put(format!("t{i}"), "v", None))
        .collect();
    let e = status_of(c.txn(Txn::new().and_then(ops)).await.unwrap_err());
    assert_eq!(
        e,
        (
            Code::InvalidArgument,
            "etcdserver: too many operations in txn request".into()
        )
    );
    let e = status_of(
        c.txn(Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e,
        (
            Code::InvalidArgument,
            "etcdserver: duplicate key given in txn request".into()
        )
    );
    let e = status_of(c.put("", "v", None).await.unwrap_err());
    assert_eq!(
        e,
        (
            Code::InvalidArgument,
            "etcdserver: key is not provided".into()
        )
    );
    let e = status_of(c.get("", None).await.unwrap_err());
    assert_eq!(e.1, "etcdserver: key is not provided");
    let e = status_of(c.delete("", None).await.unwrap_err());
    assert_eq!(e.1, "etcdserver: key is not provided");
    let e = status_of(c.put("big", vec![0u8; 100 * 1024], None).await.unwrap_err());
    assert_eq!(
        e,
        (
            Code::InvalidArgument,
            "etcdserver: request is too large".into()
        )
    );
    let e = status_of(
        c.put("l", "v", Some(PutOptions::new().with_lease(42)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e,
        (
            Code::NotFound,
            "etcdserver: requested lease not found".into()
        )
    );
    let e = status_of(
        c.put("missing", "", Some(PutOptions::new().with_ignore_value()))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e,
        (Code::InvalidArgument, "etcdserver: key not found".into())
    );
    // None of the failures above changed anything.
    assert_eq!(
        c.get("k", None).await.unwrap().header().unwrap().revision(),
        6
    );
    m.stop().await;
}

#[tokio::test]
async fn member_changes_and_auth_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    // a learner that never starts: it counts for no quorum
    let added = tokio::time::timeout(
        Duration::from_secs(10),
        c.member_add(
            ["http://127.0.0.1:1"],
            Some(etcd_client::MemberAddOptions::new().with_is_learner()),
        ),
    )
    .await
    .expect("no hang")
    .unwrap();
    let learner = added.member().unwrap();
    assert!(learner.is_learner() && learner.name().is_empty());
    assert_eq!(c.member_list().await.unwrap().members().len(), 2);
    c.put("still", "writable", None).await.unwrap();
    c.member_remove(learner.id()).await.unwrap();
    assert_eq!(c.member_list().await.unwrap().members().len(), 1);
    // Auth is served.
    let users = c.user_list().await.unwrap();
    assert!(users.users().is_empty());
    m.stop().await;
}

#[tokio::test]
async fn restart_on_the_same_data_dir_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |cfg| cfg.snapshot_count = 50).await;
    for i in 0..200 {
        c.put(format!("k{i:03}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.delete("k000", None).await.unwrap();
    let before = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    let status = c.status().await.unwrap();
    m.stop().await;

    let (m, mut c) = member(dir.path(), |cfg| cfg.snapshot_count = 50).await;
    let after = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(
        after.header().unwrap().revision(),
        before.header().unwrap().revision()
    );
    let flat = |r: &etcd_client::GetResponse| -> Vec<String> {
        r.kvs()
            .iter()
            .map(|kv| {
                format!(
                    "{:?}",
                    (
                        kv.key(),
                        kv.value(),
                        kv.create_revision(),
                        kv.mod_revision(),
                        kv.version()
                    )
                )
            })
            .collect()
    };
    assert_eq!(flat(&after), flat(&before));
    let restarted = c.status().await.unwrap();
    assert_eq!(
        restarted.header().unwrap().member_id(),
        status.header().unwrap().member_id()
    );
    assert!(restarted.raft_index() >= status.raft_index());
    assert!(restarted.raft_term() >= status.raft_term());
    c.put("k000", "back", None).await.unwrap();
    let g = c.get("k000", None).await.unwrap();
    assert_eq!(
        (g.kvs()[0].version(), g.kvs()[0].create_revision()),
        (1, 203)
    );
    m.stop().await;
}

#[tokio::test]
async fn status_and_member_list_describe_this_member() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let s = c.status().await.unwrap();
    assert_eq!(s.version(), "3.5.16");
    assert_eq!(s.leader(), s.header().unwrap().member_id());
    assert!(s.db_size() > 0);
    assert!(
        s.raft_applied_index() <= s.raft_index(),
        "applied ahead of committed"
    );
    // The member's own publish entry may still be in flight: the applied
    // index catches up with the committed one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.status().await.unwrap();
        if s.raft_index() == s.raft_applied_index() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "applied never reached committed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let list = c.member_list().await.unwrap();
    assert_eq!(list.members().len(), 1);
    assert_eq!(list.members()[0].name(), "default");
    assert_eq!(list.members()[0].id(), s.header().unwrap().member_id());
    m.stop().await;
}

#[tokio::test]
async fn unknown_lease_fails_only_in_the_chosen_txn_branch() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    c.put("a", "1", None).await.unwrap();
    // The put with a lease sits in the branch not taken: the txn succeeds.
    let t = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "1")])
        .and_then([TxnOp::put("b", "2", None)])
        .or_else([TxnOp::put("c", "3", Some(PutOptions::new().with_lease(7)))]);
    assert!(c.txn(t).await.unwrap().succeeded());
    // In the chosen branch it fails the whole txn, which changes nothing.
    let t = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "1")])
        .and_then([
            TxnOp::put("d", "4", None),
            TxnOp::put("e", "5", Some(PutOptions::new().with_lease(7))),
        ]);
    let e = status_of(c.txn(t).await.unwrap_err());
    assert_eq!(
        e,
        (
            Code::NotFound,
            "etcdserver: requested lease not found".into()
        )
    );
    let g = c.get("d", None).await.unwrap();
    assert!(g.kvs().is_empty());
    assert_eq!(g.header().unwrap().revision(), 3);
    m.stop().await;
}

#[tokio::test]
async fn restart_ignores_bootstrap_flags() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    c.put("a", "1", None).await.unwrap();
    let first = c.status().await.unwrap();
    m.stop().await;
    // Another token would derive other IDs: the WAL's identity wins.
    let (m, mut c) = member(dir.path(), |cfg| {
        cfg.initial_cluster_token = "other-token".into()
    })
    .await;
    let again = c.status().await.unwrap();
    assert_eq!(
        again.header().unwrap().member_id(),
        first.header().unwrap().member_id()
    );
    assert_eq!(
        again.header().unwrap().cluster_id(),
        first.header().unwrap().cluster_id()
    );
    assert_eq!(c.get("a", None).await.unwrap().kvs()[0].value(), b"1");
    m.stop().await;
}

#[tokio::test]
async fn a_request_beyond_the_grpc_limit_gets_grpc_gos_answer() {
    let dir = tempfile::tempdir().unwrap();
    // The gRPC limit is --max-request-bytes + 512 KiB, as etcd's.
    let (m, mut c) = member(dir.path(), |cfg| cfg.max_request_bytes = 64 * 1024).await;
    let e = status_of(
        c.put("huge", vec![0u8; 1024 * 1024], None)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.0, Code::ResourceExhausted);
    assert!(
        e.1.starts_with("grpc: received message larger than max (")
            && e.1.ends_with(" vs. 589824)"),
        "{}",
        e.1
    );
    // The member goes on serving.
    c.put("small", "v", None).await.unwrap();
    m.stop().await;
}
