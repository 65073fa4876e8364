//! The v3election and v3lock services through a real client (the
//! `etcd-client` crate's Election and Lock clients), against an in-process
//! member: etcd 3.5's server-side recipes, their waits and their errors.

mod common;
use common::member;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, GetOptions, LeaderKey, LeaseGrantOptions, ProclaimOptions, ResignOptions,
};
use tonic::Code;

/// How long a wait for a condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);

fn status_of(e: etcd_client::Error) -> (Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

async fn grant(c: &mut Client, ttl: i64) -> i64 {
    c.lease_grant(ttl, None).await.expect("lease grant").id()
}

/// Waits until `prefix` holds `n` keys.
async fn wait_for_keys(c: &mut Client, prefix: &str, n: usize) {
    tokio::time::timeout(DEADLINE, async {
        loop {
            let r = c
                .get(prefix, Some(GetOptions::new().with_prefix()))
                .await
                .unwrap();
            if r.kvs().len() == n {
                return;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{prefix} never held {n} keys"));
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen in time"))
}

#[tokio::test]
async fn lock_key_is_name_slash_lease_and_unlock_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let lease = grant(&mut c, 30).await;
    let r = c
        .lock(
            "mylock",
            Some(etcd_client::LockOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();
    let key = format!("mylock/{lease:x}");
    assert_eq!(r.key(), key.as_bytes());
    let g = c.get(key.as_str(), None).await.unwrap();
    assert_eq!(g.kvs()[0].lease(), lease);
    assert_eq!(g.kvs()[0].value(), b"");
    // Uncontended: the header is the txn's, at the key's creation.
    assert_eq!(r.header().unwrap().revision(), g.kvs()[0].create_revision());

    // Locking again with the same lease is the same acquisition.
    let again = c
        .lock(
            "mylock",
            Some(etcd_client::LockOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();
    assert_eq!(again.key(), key.as_bytes());

    let u = c.unlock(key.as_str()).await.unwrap();
    assert_eq!(
        u.header().unwrap().revision(),
        g.header().unwrap().revision() + 1
    );
    assert!(c.get(key.as_str(), None).await.unwrap().kvs().is_empty());
}

#[tokio::test]
async fn lock_without_lease_grants_a_sixty_second_session_lease() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let r = c.lock("nolease", None).await.unwrap();
    let key = String::from_utf8(r.key().to_vec()).unwrap();
    let g = c.get(key.as_str(), None).await.unwrap();
    let lease = g.kvs()[0].lease();
    assert!(lease > 0);
    assert_eq!(key, format!("nolease/{lease:x}"));
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 60);
}

#[tokio::test]
async fn second_locker_waits_until_the_holder_unlocks() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let (a, b) = (grant(&mut c, 30).await, grant(&mut c, 30).await);
    let held = c
        .lock("q", Some(etcd_client::LockOptions::new().with_lease(a)))
        .await
        .unwrap();
    let mut waiter_client = c.clone();
    let waiter = tokio::spawn(async move {
        waiter_client
            .lock("q", Some(etcd_client::LockOptions::new().with_lease(b)))
            .await
    });
    // The waiter queued its key behind the holder's, and waits.
    wait_for_keys(&mut c, "q/", 2).await;
    assert!(!waiter.is_finished());

    let unlocked = c.unlock(held.key()).await.unwrap();
    let got = within("waiter acquires", waiter).await.unwrap().unwrap();
    assert_eq!(got.key(), format!("q/{b:x}").as_bytes());
    // Contended: the header is the check of the waiter's own key, after the
    // holder's delete.
    assert!(got.header().unwrap().revision() >= unlocked.header().unwrap().revision());
}

#[tokio::test]
async fn revoking_the_holders_lease_lets_the_next_waiter_in() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let (a, b) = (grant(&mut c, 30).await, grant(&mut c, 30).await);
    c.lock("rv", Some(etcd_client::LockOptions::new().with_lease(a)))
        .await
        .unwrap();
    let mut waiter_client = c.clone();
    let waiter = tokio::spawn(async move {
        waiter_client
            .lock("rv", Some(etcd_client::LockOptions::new().with_lease(b)))
            .await
    });
    wait_for_keys(&mut c, "rv/", 2).await;
    assert!(!waiter.is_finished());
    c.lease_revoke(a).await.unwrap();
    let got = within("waiter acquires", waiter).await.unwrap().unwrap();
    assert_eq!(got.key(), format!("rv/{b:x}").as_bytes());
}

#[tokio::test]
async fn waiter_whose_lease_expired_gets_mutex_session_is_expired() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let (a, b) = (grant(&mut c, 30).await, grant(&mut c, 30).await);
    let held = c
        .lock("exp", Some(etcd_client::LockOptions::new().with_lease(a)))
        .await
        .unwrap();
    let mut waiter_client = c.clone();
    let waiter = tokio::spawn(async move {
        waiter_client
            .lock("exp", Some(etcd_client::LockOptions::new().with_lease(b)))
            .await
    });
    wait_for_keys(&mut c, "exp/", 2).await;
    c.lease_revoke(b).await.unwrap();
    wait_for_keys(&mut c, "exp/", 1).await;
    c.unlock(held.key()).await.unwrap();
    let err = within("waiter fails", waiter).await.unwrap().unwrap_err();
    assert_eq!(
        status_of(err),
        (Code::Unknown, "mutex: session is expired".to_string())
    );
}

#[tokio::test]
async fn canceled_lock_request_leaves_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let (a, b) = (grant(&mut c, 30).await, grant(&mut c, 30).await);
    c.lock("cx", Some(etcd_client::LockOptions::new().with_lease(a)))
        .await
        .unwrap();
    let mut waiter_client = c.clone();
    let waiter = tokio::spawn(async move {
        waiter_client
            .lock("cx", Some(etcd_client::LockOptions::new().with_lease(b)))
            .await
    });
    wait_for_keys(&mut c, "cx/", 2).await;
    // The client gives up: the server deletes the waiter's key for it.
    waiter.abort();
    wait_for_keys(&mut c, "cx/", 1).await;
    let left = c
        .get("cx/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(left.kvs()[0].key(), format!("cx/{a:x}").as_bytes());
}

/// Five clients take the same lock twenty times each: never two holders at
/// once, and each holder's key is the oldest under the prefix while it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contending_lockers_never_hold_the_lock_together() {
    const CLIENTS: usize = 5;
    const ROUNDS: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let (_m, c) = member(dir.path(), |_| {}).await;
    let holders = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let mut c = c.clone();
        let holders = holders.clone();
        tasks.push(tokio::spawn(async move {
            let lease = grant(&mut c, 60).await;
            let mut held = Vec::new();
            for _ in 0..ROUNDS {
                let r = c
                    .lock(
                        "contended",
                        Some(etcd_client::LockOptions::new().with_lease(lease)),
                    )
                    .await
                    .expect("lock");
                assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                let owner = c
                    .get(
                        "contended/",
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_sort(
                                    etcd_client::SortTarget::Create,
                                    etcd_client::SortOrder::Ascend,
                                )
                                .with_limit(1),
                        ),
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    owner.kvs()[0].key(),
                    r.key(),
                    "holder is not the oldest key"
                );
                let acquired = owner.header().unwrap().revision();
                holders.fetch_sub(1, Ordering::SeqCst);
                let released = c.unlock(r.key()).await.unwrap();
                held.push((acquired, released.header().unwrap().revision()));
            }
            held
        }));
    }
    let mut intervals = Vec::new();
    for t in tasks {
        intervals.extend(within("lockers finish", t).await.unwrap());
    }
    // Hold intervals (by revision) never overlap.
    intervals.sort();
    assert_eq!(intervals.len(), CLIENTS * ROUNDS);
    for pair in intervals.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlapping holds: {pair:?}");
    }
}

#[tokio::test]
async fn unlock_of_a_missing_key_succeeds_and_empty_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let r = c.unlock("never-locked/1").await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 1);
    let err = c.unlock("").await.unwrap_err();
    assert_eq!(
        status_of(err),
        (Code::Unknown, "etcdserver: key is not provided".to_string())
    );
}

#[tokio::test]
async fn lock_and_campaign_with_an_unknown_lease_fail_with_lease_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let want = (
        Code::Unknown,
        "etcdserver: requested lease not found".to_string(),
    );
    let err = c
        .lock(
            "l",
            Some(etcd_client::LockOptions::new().with_lease(0x5555)),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(err), want);
    let err = c.campaign("e", "v", 0x5555).await.unwrap_err();
    assert_eq!(status_of(err), want);
}

#[tokio::test]
async fn election_errors_match_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let err = c.leader("nobody").await.unwrap_err();
    assert_eq!(
        status_of(err),
        (Code::Unknown, "election: no leader".to_string())
    );
    let missing = (
        Code::Unknown,
        "\"leader\" field must be provided".to_string(),
    );
    let err = c.proclaim("v", None).await.unwrap_err();
    assert_eq!(status_of(err), missing);
    let err = c.resign(None).await.unwrap_err();
    assert_eq!(status_of(err), missing);

    // A leader key that does not hold the election (a lease is given, so
    // no session lease is granted).
    let stranger = LeaderKey::new()
        .with_name("nobody")
        .with_key("nobody/77")
        .with_rev(5)
        .with_lease(0x77);
    let err = c
        .proclaim(
            "v",
            Some(ProclaimOptions::new().with_leader(stranger.clone())),
        )
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        (Code::Unknown, "election: not leader".to_string())
    );
    // Resigning it is a no-op that succeeds.
    let r = c
        .resign(Some(ResignOptions::new().with_leader(stranger)))
        .await
        .unwrap();
    assert_eq!(r.header().unwrap().revision(), 1);
}

#[tokio::test]
async fn campaign_proclaim_leader_resign() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let lease = grant(&mut c, 30).await;
    let r = c.campaign("job", "v1", lease).await.unwrap();
    let leader = r.leader().unwrap().clone();
    let key = format!("job/{lease:x}");
    assert_eq!(leader.name(), b"job");
    assert_eq!(leader.key(), key.as_bytes());
    assert_eq!(leader.lease(), lease);
    assert_eq!(leader.rev(), r.header().unwrap().revision());

    let l = c.leader("job").await.unwrap();
    assert_eq!(l.kv().unwrap().key(), key.as_bytes());
    assert_eq!(l.kv().unwrap().value(), b"v1");

    let p = c
        .proclaim(
            "v2",
            Some(ProclaimOptions::new().with_leader(leader.clone())),
        )
        .await
        .unwrap();
    assert_eq!(p.header().unwrap().revision(), leader.rev() + 1);
    let l = c.leader("job").await.unwrap();
    assert_eq!(l.kv().unwrap().value(), b"v2");
    assert_eq!(l.kv().unwrap().create_revision(), leader.rev());

    // Campaigning again with the same lease resumes, proclaiming the value.
    let again = c.campaign("job", "v3", lease).await.unwrap();
    assert_eq!(again.leader().unwrap().rev(), leader.rev());
    assert_eq!(c.leader("job").await.unwrap().kv().unwrap().value(), b"v3");

    let rs = c
        .resign(Some(ResignOptions::new().with_leader(leader.clone())))
        .await
        .unwrap();
    assert_eq!(rs.header().unwrap().revision(), leader.rev() + 3);
    let err = c.leader("job").await.unwrap_err();
    assert_eq!(status_of(err).1, "election: no leader");
    // The old leader key no longer proclaims.
    let err = c
        .proclaim("v4", Some(ProclaimOptions::new().with_leader(leader)))
        .await
        .unwrap_err();
    assert_eq!(status_of(err).1, "election: not leader");
}

#[tokio::test]
async fn second_candidate_waits_until_the_leader_resigns() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let (a, b) = (grant(&mut c, 30).await, grant(&mut c, 30).await);
    let first = c.campaign("race", "a", a).await.unwrap();
    let mut other = c.clone();
    let second = tokio::spawn(async move { other.campaign("race", "b", b).await });
    wait_for_keys(&mut c, "race/", 2).await;
    assert!(!second.is_finished());
    assert_eq!(c.leader("race").await.unwrap().kv().unwrap().value(), b"a");

    c.resign(Some(
        ResignOptions::new().with_leader(first.leader().unwrap().clone()),
    ))
    .await
    .unwrap();
    let won = within("second candidate wins", second)
        .await
        .unwrap()
        .unwrap();
    let leader = won.leader().unwrap();
    assert_eq!(leader.key(), format!("race/{b:x}").as_bytes());
    // The header is the campaign txn's: the revision its key was created.
    assert_eq!(won.header().unwrap().revision(), leader.rev());
    assert_eq!(c.leader("race").await.unwrap().kv().unwrap().value(), b"b");
}

#[tokio::test]
async fn leader_lease_revoked_passes_leadership_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let (a, b) = (grant(&mut c, 30).await, grant(&mut c, 30).await);
    c.campaign("rvk", "a", a).await.unwrap();
    let mut other = c.clone();
    let second = tokio::spawn(async move { other.campaign("rvk", "b", b).await });
    wait_for_keys(&mut c, "rvk/", 2).await;
    c.lease_revoke(a).await.unwrap();
    within("second candidate wins", second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.leader("rvk").await.unwrap().kv().unwrap().value(), b"b");
}

#[tokio::test]
async fn canceled_campaign_resigns() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let (a, b) = (grant(&mut c, 30).await, grant(&mut c, 30).await);
    c.campaign("cc", "a", a).await.unwrap();
    let mut other = c.clone();
    let second = tokio::spawn(async move { other.campaign("cc", "b", b).await });
    wait_for_keys(&mut c, "cc/", 2).await;
    second.abort();
    wait_for_keys(&mut c, "cc/", 1).await;
    assert_eq!(c.leader("cc").await.unwrap().kv().unwrap().value(), b"a");
}

#[tokio::test]
async fn observe_sees_proclaims_and_the_leader_change() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let (a, b) = (grant(&mut c, 30).await, grant(&mut c, 30).await);

    // Observing an election without a leader waits for the first one (the
    // call itself answers only then, as etcd's).
    let mut observing = c.clone();
    let observer = tokio::spawn(async move { observing.observe("obs").await });
    // The observer is waiting once its watch on the prefix exists.
    within("observer waits", async {
        while m.server.store.watcher_count() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(!observer.is_finished());
    let first = c.campaign("obs", "a1", a).await.unwrap();
    let leader_a = first.leader().unwrap().clone();
    let mut observer = within("observe answers", observer).await.unwrap().unwrap();
    let seen = within("first leader observed", observer.message())
        .await
        .unwrap()
        .unwrap();
    let kv = seen.kv().unwrap();
    assert_eq!((kv.key(), kv.value()), (leader_a.key(), &b"a1"[..]));
    assert_eq!(seen.header().unwrap().revision(), kv.mod_revision());

    c.proclaim(
        "a2",
        Some(ProclaimOptions::new().with_leader(leader_a.clone())),
    )
    .await
    .unwrap();
    let seen = within("proclaim observed", observer.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"a2");

    let mut other = c.clone();
    let second = tokio::spawn(async move { other.campaign("obs", "b1", b).await });
    wait_for_keys(&mut c, "obs/", 2).await;
    c.resign(Some(ResignOptions::new().with_leader(leader_a)))
        .await
        .unwrap();
    within("second candidate wins", second)
        .await
        .unwrap()
        .unwrap();
    let seen = within("leader change observed", observer.message())
        .await
        .unwrap()
        .unwrap();
    let kv = seen.kv().unwrap();
    assert_eq!(kv.key(), format!("obs/{b:x}").as_bytes());
    assert_eq!(kv.value(), b"b1");

    // A late observer starts from the current leader.
    let mut late = c.observe("obs").await.unwrap();
    let seen = within("current leader observed", late.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"b1");
}

#[tokio::test]
async fn campaign_with_a_client_chosen_lease_id() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let lease = c
        .lease_grant(30, Some(LeaseGrantOptions::new().with_id(0x1a2b)))
        .await
        .unwrap()
        .id();
    let r = c.campaign("hex", "v", lease).await.unwrap();
    assert_eq!(r.leader().unwrap().key(), b"hex/1a2b");
}

/// The holder's client dies: its keep-alives stop, its lease expires, and
/// the next waiter gets the lock without anyone unlocking.
#[tokio::test]
async fn lock_passes_on_when_the_holders_keep_alives_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, mut c) = member(dir.path(), |_| {}).await;
    let (a, b) = (grant(&mut c, 2).await, grant(&mut c, 30).await);
    let (mut keeper, mut acks) = c.lease_keep_alive(a).await.unwrap();
    let holder = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            if keeper.keep_alive().await.is_err() || acks.message().await.is_err() {
                return;
            }
        }
    });
    c.lock("dies", Some(etcd_client::LockOptions::new().with_lease(a)))
        .await
        .unwrap();
    let mut waiter_client = c.clone();
    let waiter = tokio::spawn(async move {
        waiter_client
            .lock("dies", Some(etcd_client::LockOptions::new().with_lease(b)))
            .await
    });
    wait_for_keys(&mut c, "dies/", 2).await;
    assert!(!waiter.is_finished());
    holder.abort();
    let got = within("waiter acquires after expiry", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.key(), format!("dies/{b:x}").as_bytes());
    assert!(c.lease_time_to_live(a, None).await.unwrap().ttl() < 0);
}
