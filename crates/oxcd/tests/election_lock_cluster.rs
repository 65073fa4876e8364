//! Election and Lock across the members of a 3-member cluster: a waiter
//! served by one member is released by what happens on another (a resign,
//! or the holder's member dying and its lease expiring), and an observer on
//! a third member sees every leader in turn.

use std::time::Duration;

use etcd_client::{Client, LeaseGrantOptions, LockOptions, ProclaimOptions, ResignOptions};
use testkit::Cluster;

/// Elections, lease expiry after a leader change, and the waits below.
const DEADLINE: Duration = Duration::from_secs(30);
/// How long a blocked campaign or lock is watched to stay blocked.
const STILL_BLOCKED: Duration = Duration::from_millis(500);

async fn connect(endpoint: &str) -> Client {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Ok(mut client) = Client::connect([endpoint], None).await {
            // A member without a leader yet answers writes with errors.
            if client.put("ready", "", None).await.is_ok() {
                return client;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{endpoint} never served a write"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn grant(client: &mut Client, id: i64, ttl: i64) {
    client
        .lease_grant(ttl, Some(LeaseGrantOptions::new().with_id(id)))
        .await
        .expect("lease grant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_leader_passes_between_members_and_is_observed_elsewhere() {
    let cluster = Cluster::start(3, &[]);
    let mut first = connect(&cluster.endpoint(0)).await;
    let mut second = connect(&cluster.endpoint(1)).await;
    let mut observer = connect(&cluster.endpoint(2)).await;
    grant(&mut first, 0xa1, 60).await;
    grant(&mut second, 0xb1, 60).await;

    let campaign = first.campaign("job", "first", 0xa1).await.unwrap();
    let first_key = campaign.leader().unwrap().clone();
    let mut observed = observer.observe("job").await.unwrap();
    let leader = observed.message().await.unwrap().unwrap();
    assert_eq!(leader.kv().unwrap().value(), b"first");

    // The second candidate waits behind the first, on another member.
    let mut waiting = second.clone();
    let blocked = tokio::spawn(async move { waiting.campaign("job", "second", 0xb1).await });
    tokio::time::sleep(STILL_BLOCKED).await;
    assert!(!blocked.is_finished(), "campaign won while another leads");

    first
        .proclaim(
            "first, updated",
            Some(ProclaimOptions::new().with_leader(first_key.clone())),
        )
        .await
        .unwrap();
    let update = observed.message().await.unwrap().unwrap();
    assert_eq!(update.kv().unwrap().value(), b"first, updated");

    first
        .resign(Some(ResignOptions::new().with_leader(first_key)))
        .await
        .unwrap();
    let won = tokio::time::timeout(DEADLINE, blocked)
        .await
        .expect("campaign released by the resign")
        .unwrap()
        .unwrap();
    let second_key = won.leader().unwrap().clone();
    assert_eq!(second_key.lease(), 0xb1);
    let next = observed.message().await.unwrap().unwrap();
    assert_eq!(next.kv().unwrap().value(), b"second");
    let asked = first.leader("job").await.unwrap();
    assert_eq!(asked.kv().unwrap().value(), b"second");
    assert_eq!(asked.kv().unwrap().key(), second_key.key());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_passes_to_a_waiter_when_the_holders_member_dies() {
    let mut cluster = Cluster::start(3, &[]);
    let mut holder = connect(&cluster.endpoint(0)).await;
    let mut waiter = connect(&cluster.endpoint(1)).await;
    // The holder's lease is never kept alive: once its member is gone, it
    // expires (on whichever member leads by then).
    grant(&mut holder, 0xa2, 3).await;
    grant(&mut waiter, 0xb2, 60).await;

    let held = holder
        .lock("shared", Some(LockOptions::new().with_lease(0xa2)))
        .await
        .unwrap();
    let held_key = held.key().to_vec();

    let mut blocked_client = waiter.clone();
    let blocked = tokio::spawn(async move {
        blocked_client
            .lock("shared", Some(LockOptions::new().with_lease(0xb2)))
            .await
    });
    tokio::time::sleep(STILL_BLOCKED).await;
    assert!(!blocked.is_finished(), "lock acquired while held");

    cluster.kill9(0);
    let acquired = tokio::time::timeout(DEADLINE, blocked)
        .await
        .expect("lock released when the holder's lease expired")
        .unwrap()
        .unwrap();
    let acquired_key = acquired.key().to_vec();
    assert_ne!(acquired_key, held_key);
    assert!(acquired_key.starts_with(b"shared/"));
    // The holder's key went with its lease; the new holder's key is live.
    let held_now = waiter.get(held_key, None).await.unwrap();
    assert!(held_now.kvs().is_empty());
    let mine = waiter.get(acquired_key.clone(), None).await.unwrap();
    assert_eq!(mine.kvs().len(), 1);
    assert_eq!(mine.kvs()[0].lease(), 0xb2);

    waiter.unlock(acquired_key.clone()).await.unwrap();
    assert!(waiter
        .get(acquired_key, None)
        .await
        .unwrap()
        .kvs()
        .is_empty());
}
