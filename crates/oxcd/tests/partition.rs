//! The seed scenario: a 3-member cluster split 1|2 by the network (members
//! in network namespaces of their own; a bridge port taken down is a true
//! two-way partition).

use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions};
use testkit::netns::NetnsCluster;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn message(e: etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
        other => format!("{other}"),
    }
}

/// Index of the member all reachable members agree leads.
async fn leader(endpoints: &[String]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut views = Vec::new();
        for (i, ep) in endpoints.iter().enumerate() {
            let Ok(Ok(mut c)) =
                tokio::time::timeout(Duration::from_secs(1), Client::connect([ep], None)).await
            else {
                continue;
            };
            if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(1), c.status()).await {
                views.push((i, s.header().unwrap().member_id(), s.leader()));
            }
        }
        if let Some(&(_, _, l)) = views.first() {
            if l != 0 && views.iter().all(|v| v.2 == l) {
                if let Some(v) = views.iter().find(|v| v.1 == l) {
                    return v.0;
                }
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader: {views:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn isolated_leader_never_accepts_a_write_and_the_majority_goes_on() {
    let cluster = NetnsCluster::start(3, &[]);
    let all = cluster.endpoints();
    let eps = all.clone();
    let old = cluster.in_client_ns(move || runtime().block_on(leader(&eps)));
    let majority: Vec<String> = (0..3)
        .filter(|i| *i != old)
        .map(|i| cluster.endpoint(i))
        .collect();

    cluster.isolate(old);
    let isolated_at = Instant::now();

    // The pair elects a new leader within an election timeout or two and
    // commits in milliseconds.
    let eps = majority.clone();
    let (elected_after, latencies) = cluster.in_client_ns(move || {
        runtime().block_on(async move {
            let mut c = Client::connect(eps.clone(), None).await.unwrap();
            loop {
                match tokio::time::timeout(
                    Duration::from_secs(2),
                    c.put("majority/first", "v", None),
                )
                .await
                {
                    Ok(Ok(_)) => break,
                    _ => assert!(
                        isolated_at.elapsed() < Duration::from_secs(15),
                        "the majority stopped committing"
                    ),
                }
            }
            let elected_after = isolated_at.elapsed();
            let mut latencies = Vec::new();
            for i in 0..50 {
                let t = Instant::now();
                c.put(format!("majority/{i}"), "v", None).await.unwrap();
                latencies.push(t.elapsed());
            }
            latencies.sort();
            (elected_after, latencies)
        })
    });
    assert!(
        elected_after < Duration::from_secs(5),
        "new leader after {elected_after:?}"
    );
    assert!(
        latencies[25] < Duration::from_millis(200),
        "median commit latency {:?}",
        latencies[25]
    );

    // Writes sent to the isolated member never succeed: with require-leader
    // metadata "no leader" once it has stepped down (CheckQuorum), at once;
    // without it "request timed out".
    let iso = cluster.endpoint(old);
    let (rl_errors, plain_error, plain_took) = cluster.in_member_ns(old, move || {
        runtime().block_on(async move {
            let mut rl = Client::connect(
                [iso.clone()],
                Some(ConnectOptions::new().with_require_leader(true)),
            )
            .await
            .unwrap();
            let mut errors = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match rl
                    .put(format!("isolated/rl/{}", errors.len()), "x", None)
                    .await
                {
                    Ok(_) => panic!("the isolated member acknowledged a write"),
                    Err(e) => {
                        let m = message(e);
                        let done = m == "etcdserver: no leader";
                        errors.push(m);
                        if done {
                            break;
                        }
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "never answered no leader: {errors:?}"
                );
            }
            let started = Instant::now();
            let e = rl.put("isolated/rl/last", "x", None).await.unwrap_err();
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "no leader took {:?}",
                started.elapsed()
            );
            errors.push(message(e));
            let mut plain = Client::connect([iso], None).await.unwrap();
            let started = Instant::now();
            let e = plain.put("isolated/plain", "x", None).await.unwrap_err();
            (errors, message(e), started.elapsed())
        })
    });
    assert_eq!(rl_errors.last().unwrap(), "etcdserver: no leader");
    for e in &rl_errors {
        assert!(
            e == "etcdserver: no leader" || e.starts_with("etcdserver: request timed out"),
            "{e}"
        );
    }
    assert_eq!(plain_error, "etcdserver: request timed out");
    assert!(
        plain_took >= Duration::from_secs(5),
        "timed out after {plain_took:?}"
    );

    // Heal: the old leader catches up by itself; nothing written to it
    // while isolated exists anywhere; every member holds the same data.
    cluster.heal(old);
    let eps = all.clone();
    cluster.in_client_ns(move || {
        runtime().block_on(async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let mut views = Vec::new();
                for ep in &eps {
                    let mut c = Client::connect([ep], None).await.unwrap();
                    let g = c
                        .get(
                            "",
                            Some(GetOptions::new().with_all_keys().with_serializable()),
                        )
                        .await
                        .unwrap();
                    let h = c.hash_kv(0).await.unwrap();
                    let isolated_keys = g
                        .kvs()
                        .iter()
                        .filter(|kv| kv.key().starts_with(b"isolated/"))
                        .count();
                    views.push((
                        g.header().unwrap().revision(),
                        h.hash(),
                        g.count(),
                        isolated_keys,
                    ));
                }
                if views.iter().all(|v| *v == views[0]) && views[0].2 == 51 {
                    assert_eq!(views[0].3, 0, "a write to the isolated member survived");
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "no convergence after heal: {views:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });
}

#[test]
fn isolated_follower_refuses_linearizable_reads_and_catches_up() {
    let cluster = NetnsCluster::start(3, &[]);
    let eps = cluster.endpoints();
    let leader_idx = cluster.in_client_ns(move || runtime().block_on(leader(&eps)));
    let follower = (leader_idx + 1) % 3;
    cluster.isolate(follower);
    let majority: Vec<String> = (0..3)
        .filter(|i| *i != follower)
        .map(|i| cluster.endpoint(i))
        .collect();
    cluster.in_client_ns(move || {
        runtime().block_on(async move {
            let mut c = Client::connect(majority, None).await.unwrap();
            for i in 0..100 {
                c.put(format!("k{i:03}"), "v", None).await.unwrap();
            }
        })
    });
    // Cut off, the follower serves no stale linearizable read.
    let ep = cluster.endpoint(follower);
    let (linearizable, serializable_count) = cluster.in_member_ns(follower, move || {
        runtime().block_on(async move {
            let mut c = Client::connect([ep], None).await.unwrap();
            let l = c
                .get("k", Some(GetOptions::new().with_prefix()))
                .await
                .map(|_| ())
                .map_err(message);
            let s = c
                .get(
                    "k",
                    Some(GetOptions::new().with_prefix().with_serializable()),
                )
                .await
                .unwrap();
            (l, s.count())
        })
    });
    // The round in flight ends with the leadership ("leader changed", as
    // etcd's read loop answers); later reads wait for a leader, then time out.
    let refused = linearizable.expect_err("an isolated member served a linearizable read");
    assert!(
        refused == "etcdserver: leader changed" || refused == "etcdserver: request timed out",
        "{refused}"
    );
    assert_eq!(
        serializable_count, 0,
        "the isolated follower cannot have the new writes"
    );
    cluster.heal(follower);
    let ep = cluster.endpoint(follower);
    cluster.in_client_ns(move || {
        runtime().block_on(async move {
            let mut c = Client::connect([ep], None).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(g) = c.get("k", Some(GetOptions::new().with_prefix())).await {
                    if g.count() == 100 {
                        return;
                    }
                }
                assert!(Instant::now() < deadline, "the follower did not catch up");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });
}

#[test]
fn require_leader_watch_on_an_isolated_member_is_canceled_with_no_leader() {
    use etcd_client::WatchOptions;
    let cluster = NetnsCluster::start(3, &[]);
    let eps = cluster.endpoints();
    let leader_idx = cluster.in_client_ns(move || runtime().block_on(leader(&eps)));
    let follower = (leader_idx + 1) % 3;
    let ep = cluster.endpoint(follower);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let watcher = cluster.spawn_in_member_ns(follower, move || {
        runtime().block_on(async move {
            let opts = ConnectOptions::new().with_require_leader(true);
            let mut c = Client::connect([ep], Some(opts)).await.unwrap();
            let mut stream = c
                .watch("k", Some(WatchOptions::new().with_prefix()))
                .await
                .unwrap();
            ready_tx.send(()).unwrap();
            let started = Instant::now();
            loop {
                match tokio::time::timeout(Duration::from_secs(20), stream.message()).await {
                    Ok(Ok(Some(_))) => continue,
                    Ok(Ok(None)) => {
                        return (
                            "stream ended without an error".to_string(),
                            started.elapsed(),
                        )
                    }
                    Ok(Err(e)) => return (message(e), started.elapsed()),
                    Err(_) => return ("still open after 20 s".to_string(), started.elapsed()),
                }
            }
        })
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("watch opened");
    cluster.isolate(follower);
    let (error, after) = watcher.join().unwrap();
    assert_eq!(error, "etcdserver: no leader");
    assert!(after < Duration::from_secs(10), "canceled after {after:?}");
    cluster.heal(follower);
}

#[test]
fn a_member_removed_while_partitioned_is_refused_when_the_partition_heals() {
    let mut cluster = NetnsCluster::start(3, &[]);
    let all = cluster.endpoints();
    let eps = all.clone();
    let lead = cluster.in_client_ns(move || runtime().block_on(leader(&eps)));
    let victim = (lead + 1) % 3;
    let victim_endpoint = cluster.endpoint(victim);
    let victim_id = cluster.in_client_ns(move || {
        runtime().block_on(async move {
            let mut c = Client::connect([victim_endpoint], None).await.unwrap();
            c.status().await.unwrap().header().unwrap().member_id()
        })
    });
    cluster.isolate(victim);
    let majority: Vec<String> = (0..3)
        .filter(|i| *i != victim)
        .map(|i| cluster.endpoint(i))
        .collect();
    cluster.in_client_ns(move || {
        runtime().block_on(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let mut c = Client::connect(&majority, None).await.unwrap();
                match c.member_remove(victim_id).await {
                    Ok(resp) => {
                        assert_eq!(resp.members().len(), 2);
                        break;
                    }
                    // the strict reconfig check may wait for the links
                    Err(e) => assert!(Instant::now() < deadline, "member remove: {}", message(e)),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let mut c = Client::connect(&majority, None).await.unwrap();
            c.put("after-removal", "1", None).await.unwrap();
        })
    });
    cluster.heal(victim);
    let p = cluster.members[victim].as_mut().unwrap();
    let status = p.wait_exit(Duration::from_secs(30));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "the removed member stops with status 0 once a peer refuses it:\n{}",
        p.log_text()
    );
    assert!(p
        .log_text()
        .contains("the member has been permanently removed from the cluster"));
    cluster.members[victim] = None;
    let refused = cluster.members.iter().flatten().any(|p| {
        p.log_text()
            .contains("rejected stream from remote peer because it was removed")
    });
    assert!(refused, "a peer logs etcd's refusal of the removed member");
}
