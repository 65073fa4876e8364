//! Leases in 3-member process clusters: keep-alives through a follower reach
//! the leader, a lease with keep-alives flowing survives the leader's death,
//! and a checkpointed lease keeps its remaining TTL across a leader change.

mod common;
use common::{client, leader};

use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseTimeToLiveOptions, PutOptions};
use testkit::Cluster;

async fn present(c: &mut Client, key: &str) -> bool {
    c.get(key, None).await.unwrap().count() == 1
}

/// Sends one keep-alive a second on `endpoint` for `duration`, checking
/// every answer renews the lease to `ttl`.
async fn keep_alive_for(endpoint: &str, lease: i64, ttl: i64, duration: Duration) {
    let mut c = client(&[endpoint.to_string()]).await;
    let (mut keeper, mut answers) = c.lease_keep_alive(lease).await.unwrap();
    let until = Instant::now() + duration;
    while Instant::now() < until {
        keeper.keep_alive().await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(15), answers.message())
            .await
            .expect("a keep-alive answer in time")
            .unwrap()
            .unwrap();
        assert_eq!((answer.id(), answer.ttl()), (lease, ttl));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_through_a_follower_reaches_the_leader() {
    let cluster = Cluster::start(3, &[]);
    let leader_index = leader(&cluster).await;
    let follower = cluster.endpoint((leader_index + 1) % 3);
    let mut c = client(std::slice::from_ref(&follower)).await;
    let lease = c.lease_grant(3, None).await.unwrap().id();
    c.put("f/key", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    // Twice the TTL: only renewals that reach the leader keep it.
    keep_alive_for(&follower, lease, 3, Duration::from_secs(6)).await;
    assert!(present(&mut c, "f/key").await);
    // TimeToLive through the follower is the leader's view.
    let ttl = c
        .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(ttl.granted_ttl(), 3);
    assert!((1..=3).contains(&ttl.ttl()), "ttl {}", ttl.ttl());
    assert_eq!(ttl.keys(), &[b"f/key".to_vec()]);
    // Without keep-alives it expires, on every member.
    let deadline = Instant::now() + Duration::from_secs(15);
    for endpoint in cluster.endpoints() {
        let mut c = client(&[endpoint]).await;
        while present(&mut c, "f/key").await {
            assert!(Instant::now() < deadline, "lease never expired");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_survives_the_leaders_death_with_keep_alives_flowing() {
    let mut cluster = Cluster::start(3, &[]);
    let old_leader = leader(&cluster).await;
    let survivor = cluster.endpoint((old_leader + 1) % 3);
    let mut c = client(std::slice::from_ref(&survivor)).await;
    let lease = c.lease_grant(4, None).await.unwrap().id();
    c.put("s/key", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    let keeper = {
        let survivor = survivor.clone();
        tokio::spawn(
            async move { keep_alive_for(&survivor, lease, 4, Duration::from_secs(10)).await },
        )
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.kill9(old_leader);
    let new_leader = leader(&cluster).await;
    assert_ne!(new_leader, old_leader);
    keeper.await.unwrap();
    assert!(present(&mut c, "s/key").await, "a kept-alive lease expired");
    cluster.restart(old_leader);
    let mut c = client(&[cluster.endpoint(old_leader)]).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !present(&mut c, "s/key").await {
        assert!(
            Instant::now() < deadline,
            "the restarted member lost the key"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.lease_revoke(lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpointed_lease_keeps_its_remaining_ttl_across_a_leader_change() {
    let mut cluster = Cluster::start(
        3,
        &[
            "--experimental-enable-lease-checkpoint",
            "--experimental-lease-checkpoint-interval=1s",
        ],
    );
    let old_leader = leader(&cluster).await;
    let survivor = cluster.endpoint((old_leader + 1) % 3);
    let mut c = client(std::slice::from_ref(&survivor)).await;
    let lease = c.lease_grant(30, None).await.unwrap().id();
    let granted = Instant::now();
    // Let a few checkpoints (one a second) record the remaining TTL.
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster.kill9(old_leader);
    leader(&cluster).await;
    let ttl = c.lease_time_to_live(lease, None).await.unwrap().ttl();
    let elapsed = granted.elapsed().as_secs() as i64;
    // Without checkpoints the new leader would start over at 30 s + 1 s
    // (the election extension); with them it resumes from about 30 - 4.
    assert!(
        ttl <= 30 - elapsed + 3 && ttl > 0,
        "ttl {ttl} after {elapsed} s"
    );
    // A keep-alive clears the checkpoint: the full TTL again.
    keep_alive_for(&survivor, lease, 30, Duration::from_millis(100)).await;
    let ttl = c.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!(ttl >= 28, "ttl {ttl} after a keep-alive");
}
