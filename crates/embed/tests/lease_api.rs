//! The Lease API through a real client (the `etcd-client` crate) against an
//! in-process member: etcd 3.5's lease semantics, errors, expiry, the keys
//! a revocation removes, persistence across a restart, and many leases
//! expiring under a concurrent writer.

mod common;
use common::member;

use std::time::{Duration, Instant};

use etcd_client::{
    Client, EventType, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions,
    WatchOptions,
};
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(20);

fn grpc_error(e: etcd_client::Error) -> (Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("not a gRPC status: {other:?}"),
    }
}

async fn put_leased(c: &mut Client, key: &str, lease: i64) -> i64 {
    c.put(key, "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

#[tokio::test]
async fn lease_grant_revoke_time_to_live_and_errors_as_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;

    // Server-chosen IDs are positive; TTLs below the minimum are raised
    // to 1.5 election timeouts (2 s with etcd's defaults).
    let auto = c.lease_grant(1, None).await.unwrap();
    assert!(auto.id() > 0);
    assert_eq!(auto.ttl(), 2);
    let chosen = c
        .lease_grant(60, Some(LeaseGrantOptions::new().with_id(0x1234)))
        .await
        .unwrap();
    assert_eq!((chosen.id(), chosen.ttl()), (0x1234, 60));

    let dup = c
        .lease_grant(60, Some(LeaseGrantOptions::new().with_id(0x1234)))
        .await
        .unwrap_err();
    assert_eq!(
        grpc_error(dup),
        (
            Code::FailedPrecondition,
            "etcdserver: lease already exists".into()
        )
    );
    let too_long = c.lease_grant(9_000_000_001, None).await.unwrap_err();
    assert_eq!(
        grpc_error(too_long),
        (Code::OutOfRange, "etcdserver: too large lease TTL".into())
    );
    let unknown = c
        .put("k", "v", Some(PutOptions::new().with_lease(999)))
        .await
        .unwrap_err();
    assert_eq!(
        grpc_error(unknown),
        (
            Code::NotFound,
            "etcdserver: requested lease not found".into()
        )
    );

    put_leased(&mut c, "k2", 0x1234).await;
    put_leased(&mut c, "k1", 0x1234).await;
    let ttl = c
        .lease_time_to_live(0x1234, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(ttl.granted_ttl(), 60);
    assert!((58..=60).contains(&ttl.ttl()), "ttl {}", ttl.ttl());
    assert_eq!(ttl.keys(), &[b"k1".to_vec(), b"k2".to_vec()]);
    // An unknown lease has TTL -1, not an error.
    let missing = c.lease_time_to_live(777, None).await.unwrap();
    assert_eq!((missing.id(), missing.ttl()), (777, -1));

    let mut listed: Vec<i64> = c
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    listed.sort();
    assert_eq!(listed, vec![0x1234, auto.id()]);

    c.lease_revoke(0x1234).await.unwrap();
    let again = c.lease_revoke(0x1234).await.unwrap_err();
    assert_eq!(
        grpc_error(again),
        (
            Code::NotFound,
            "etcdserver: requested lease not found".into()
        )
    );
    assert_eq!(c.get("k1", None).await.unwrap().count(), 0);
    m.stop().await;
}

#[tokio::test]
async fn revoke_deletes_every_attached_key_in_one_revision_with_delete_events() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let lease = c.lease_grant(60, None).await.unwrap().id();
    for key in ["r/c", "r/a", "r/b"] {
        put_leased(&mut c, key, lease).await;
    }
    // Moved to no lease: not revoked with it.
    put_leased(&mut c, "r/d", lease).await;
    let before = c.put("r/d", "kept", None).await.unwrap();
    let before = before.header().unwrap().revision();
    let mut events = c
        .watch(
            "r/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(before + 1),
            ),
        )
        .await
        .unwrap();

    let revoked = c.lease_revoke(lease).await.unwrap();
    assert_eq!(revoked.header().unwrap().revision(), before + 1);

    let mut got = Vec::new();
    while got.len() < 3 {
        let resp = tokio::time::timeout(DEADLINE, events.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        for e in resp.events() {
            let kv = e.kv().unwrap();
            got.push((
                e.event_type(),
                kv.key_str().unwrap().to_string(),
                kv.mod_revision(),
            ));
        }
    }
    assert_eq!(
        got,
        vec![
            (EventType::Delete, "r/a".into(), before + 1),
            (EventType::Delete, "r/b".into(), before + 1),
            (EventType::Delete, "r/c".into(), before + 1),
        ]
    );
    let left = c
        .get("r/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(left.kvs().len(), 1);
    assert_eq!(left.kvs()[0].value(), b"kept");
    m.stop().await;
}

#[tokio::test]
async fn lease_expires_on_time_unless_kept_alive() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let kept = c.lease_grant(2, None).await.unwrap().id();
    let granted_at = Instant::now();
    let expiring = c.lease_grant(2, None).await.unwrap().id();
    put_leased(&mut c, "e/kept", kept).await;
    put_leased(&mut c, "e/expiring", expiring).await;
    let mut events = c
        .watch("e/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let (mut keeper, mut answers) = c.lease_keep_alive(kept).await.unwrap();

    let mut expired_after = None;
    while Instant::now() < granted_at + Duration::from_secs(5) {
        keeper.keep_alive().await.unwrap();
        let answer = tokio::time::timeout(DEADLINE, answers.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!((answer.id(), answer.ttl()), (kept, 2));
        if let Ok(Some(Ok(Some(resp)))) = tokio::time::timeout(Duration::from_millis(400), async {
            Some(events.message().await)
        })
        .await
        {
            for e in resp.events() {
                assert_eq!(e.event_type(), EventType::Delete);
                assert_eq!(e.kv().unwrap().key(), b"e/expiring");
                expired_after.get_or_insert(granted_at.elapsed());
            }
        }
    }
    let expired_after = expired_after.expect("the lease without keep-alives expired");
    // etcd's own granularity is 500 ms; ours is the 100 ms loop plus a commit.
    assert!(
        expired_after >= Duration::from_millis(1900) && expired_after < Duration::from_millis(3500),
        "expired after {expired_after:?}"
    );
    assert_eq!(c.get("e/kept", None).await.unwrap().count(), 1);
    let gone = c.lease_time_to_live(expiring, None).await.unwrap();
    assert_eq!(gone.ttl(), -1);

    // A keep-alive for a lease that no longer exists answers TTL 0 (which
    // the client turns into "lease not found").
    match c.lease_keep_alive(expiring).await {
        Err(etcd_client::Error::LeaseKeepAliveError(msg)) => assert_eq!(msg, "lease not found"),
        other => panic!("keep-alive of a revoked lease: {other:?}"),
    }
    m.stop().await;
}

#[tokio::test]
async fn leases_and_their_keys_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let long = c.lease_grant(600, None).await.unwrap().id();
    let short = c.lease_grant(3, None).await.unwrap().id();
    put_leased(&mut c, "p/long", long).await;
    put_leased(&mut c, "p/short", short).await;
    m.stop().await;

    let (m, mut c) = member(dir.path(), |_| {}).await;
    let ttl = c
        .lease_time_to_live(long, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(ttl.granted_ttl(), 600);
    assert_eq!(ttl.keys(), &[b"p/long".to_vec()]);
    // The short lease still expires after the restart and takes its key.
    let deadline = Instant::now() + DEADLINE;
    while c.get("p/short", None).await.unwrap().count() == 1 {
        assert!(Instant::now() < deadline, "short lease never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.lease_revoke(long).await.unwrap();
    assert_eq!(c.get("p/long", None).await.unwrap().count(), 0);
    m.stop().await;
}

#[tokio::test]
async fn thousand_leases_expire_without_stalling_a_writer() {
    const LEASES: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let mut tasks = Vec::new();
    for chunk in 0..10 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..LEASES / 10 {
                let id = c.lease_grant(2, None).await.unwrap().id();
                put_leased(&mut c, &format!("many/{chunk}/{i}"), id).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    let writer = {
        let mut c = c.clone();
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let mut writes = 0;
            let until = Instant::now() + Duration::from_secs(4);
            while Instant::now() < until {
                let start = Instant::now();
                c.put("writer", writes.to_string(), None).await.unwrap();
                slowest = slowest.max(start.elapsed());
                writes += 1;
            }
            (writes, slowest)
        })
    };
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = c
            .get(
                "many/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .unwrap()
            .count();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} leased keys left");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (writes, slowest) = writer.await.unwrap();
    assert!(writes > 0);
    // Not a performance bound: a stall (writes queued behind the mass
    // revocation for seconds) is what this catches.
    assert!(slowest < Duration::from_secs(2), "a put took {slowest:?}");
    assert!(c.leases().await.unwrap().leases().is_empty());
    m.stop().await;
}
