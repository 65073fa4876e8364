//! Multi-member clusters as processes on loopback: replication, writes on
//! any member, leader failure under load, quorum loss.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use testkit::Cluster;
use tonic::Code;

mod common;
use common::{client, hashes_converge, leader, require_leader_client, ELECTION_DEADLINE};

fn status_error(e: etcd_client::Error) -> (Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_replicate_writes_made_on_any_member() {
    let cluster = Cluster::start(3, &[]);
    for i in 0..3 {
        let mut c = client(&[cluster.endpoint(i)]).await;
        c.put(format!("from-m{i}"), format!("{i}"), None)
            .await
            .unwrap();
    }
    for i in 0..3 {
        let mut c = client(&[cluster.endpoint(i)]).await;
        // Linearizable reads on followers see every acknowledged write.
        let g = c
            .get("from-", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        assert_eq!(g.count(), 3, "member {i}");
        let s = c.status().await.unwrap();
        assert_ne!(s.leader(), 0);
    }
    let mut c = client(&[cluster.endpoint(0)]).await;
    let members = c.member_list().await.unwrap();
    assert_eq!(members.members().len(), 3);
    // Every member published its name and client URLs through raft.
    let mut published: Vec<(String, Vec<String>)> = members
        .members()
        .iter()
        .map(|m| (m.name().to_string(), m.client_urls().to_vec()))
        .collect();
    published.sort();
    let expected: Vec<(String, Vec<String>)> = (0..3)
        .map(|i| (format!("m{}", i + 1), vec![cluster.endpoint(i)]))
        .collect();
    assert_eq!(published, expected);
    hashes_converge(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_under_load_loses_no_acknowledged_write() {
    let mut cluster = Cluster::start(3, &[]);
    let endpoints = cluster.endpoints();
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..8 {
        let (acked, stop, endpoint) = (acked.clone(), stop.clone(), endpoints[w % 3].clone());
        writers.push(tokio::spawn(async move {
            let mut c = client(&[endpoint]).await;
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let (k, v) = (format!("w{w}/{i:06}"), format!("v{i}"));
                // A failed put is not acknowledged; the writer moves on.
                if c.put(k.clone(), v.clone(), None).await.is_ok() {
                    acked.lock().unwrap().push((k, v));
                }
                i += 1;
            }
        }));
    }
    let wait_for = |n: usize| {
        let acked = acked.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while acked.lock().unwrap().len() < n {
                assert!(Instant::now() < deadline, "writes stalled");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for(500).await;
    let old_leader = leader(&cluster).await;
    let killed_at = Instant::now();
    cluster.kill9(old_leader);
    let new_leader = leader(&cluster).await;
    assert_ne!(new_leader, old_leader);
    let election = killed_at.elapsed();
    let before = acked.lock().unwrap().len();
    wait_for(before + 500).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    assert!(election < ELECTION_DEADLINE, "election took {election:?}");

    cluster.restart(old_leader);
    hashes_converge(&cluster).await;
    let mut c = client(&[cluster.endpoint(old_leader)]).await;
    let all = c
        .get("w", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let stored: HashMap<String, String> = all
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect();
    let acked = acked.lock().unwrap();
    let lost: Vec<_> = acked
        .iter()
        .filter(|(k, v)| stored.get(k) != Some(v))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert_eq!(
        all.header().unwrap().revision() as usize,
        stored.len() + 1,
        "a write applied twice or lost"
    );
    assert!(
        all.kvs().iter().all(|kv| kv.version() == 1),
        "a put applied twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_serve_with_two_lost_and_refuse_writes_with_three_lost() {
    let mut cluster = Cluster::start(5, &["--election-timeout", "500"]);
    let first_leader = leader(&cluster).await;
    // Lose two, including the leader: a new one is elected, writes go on.
    let others: Vec<usize> = (0..5).filter(|i| *i != first_leader).collect();
    cluster.kill9(first_leader);
    cluster.kill9(others[0]);
    leader(&cluster).await;
    let mut c = client(&cluster.endpoints()).await;
    c.put("with-three", "ok", None).await.unwrap();

    // Lose a third: no quorum. The survivors lose their leader.
    let survivors: Vec<usize> = (0..5).filter(|i| cluster.members[*i].is_some()).collect();
    cluster.kill9(survivors[0]);
    let lone = survivors[1];
    let mut c = require_leader_client(&cluster.endpoint(lone)).await;
    let deadline = Instant::now() + ELECTION_DEADLINE;
    let err = loop {
        match c.put("nq/while-leader-steps-down", "x", None).await {
            Err(e) => {
                let e = status_error(e);
                if e.1 == "etcdserver: no leader" {
                    break e;
                }
            }
            Ok(_) => panic!("a write committed without a quorum"),
        }
        assert!(
            Instant::now() < deadline,
            "the member kept its leader without a quorum"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(err.0, Code::Unavailable);
    // With require-leader the answer is immediate.
    let started = Instant::now();
    let e = status_error(c.put("nq/require-leader", "x", None).await.unwrap_err());
    assert_eq!(e.1, "etcdserver: no leader");
    assert!(started.elapsed() < Duration::from_secs(1));
    // Without it, the request times out as etcd's does (5 s + 2 election timeouts).
    let mut plain = client(&[cluster.endpoint(lone)]).await;
    let started = Instant::now();
    let e = status_error(plain.put("nq/plain", "x", None).await.unwrap_err());
    assert_eq!(
        e,
        (Code::Unavailable, "etcdserver: request timed out".into())
    );
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Serializable reads are still served locally.
    let g = plain
        .get("with-three", Some(GetOptions::new().with_serializable()))
        .await
        .unwrap();
    assert_eq!(g.kvs()[0].value(), b"ok");

    // Quorum back: new writes commit.
    let dead: Vec<usize> = (0..5).filter(|i| cluster.members[*i].is_none()).collect();
    cluster.restart(dead[0]);
    cluster.restart(dead[1]);
    leader(&cluster).await;
    let mut c = client(&cluster.endpoints()).await;
    c.put("after", "quorum", None).await.unwrap();
    // Writes refused while there was no leader were never proposed: they
    // exist nowhere. (A write that timed out while the old leader still
    // led is in doubt, as in etcd: a later leader may commit it.)
    assert!(c
        .get("nq/require-leader", None)
        .await
        .unwrap()
        .kvs()
        .is_empty());
    assert!(c.get("nq/plain", None).await.unwrap().kvs().is_empty());
    hashes_converge(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_behind_the_leaders_compacted_log_rejoins_by_snapshot() {
    // Snapshot every 100 entries and keep only 10 below it: a member that
    // misses a few hundred writes can only catch up from a snapshot.
    let args = [
        "--snapshot-count",
        "100",
        "--experimental-snapshot-catchup-entries",
        "10",
    ];
    let mut cluster = Cluster::start(3, &args);
    let lagging = (leader(&cluster).await + 1) % 3;
    cluster.kill9(lagging);
    let mut c = client(&cluster.endpoints()).await;
    for i in 0..400 {
        c.put(format!("k{i:03}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.compact(300, None).await.unwrap();
    cluster.restart(lagging);
    let mut lag = client(&[cluster.endpoint(lagging)]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let g = lag
            .get(
                "k",
                Some(GetOptions::new().with_prefix().with_serializable()),
            )
            .await
            .unwrap();
        if g.count() == 400 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lagging member has {} of 400 keys",
            g.count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = cluster.members[lagging].as_ref().unwrap().log_text();
    assert!(
        log.contains("applied database snapshot"),
        "caught up without a snapshot:\n{log}"
    );
    // the leader sent its file's image, the member wrote it as it came
    assert!(log.contains(r#""stream":"image""#), "{log}");
    hashes_converge(&cluster).await;
    // It serves writes and reads like the others afterwards.
    lag.put("after", "snapshot", None).await.unwrap();
    let g = lag.get("k399", None).await.unwrap();
    assert_eq!(g.kvs()[0].value(), b"v399");
    let compacted = lag
        .get("k000", Some(GetOptions::new().with_revision(200)))
        .await
        .unwrap_err();
    assert!(format!("{compacted}").contains("required revision has been compacted"));
    // etcd's snapshot metrics saw it: the backend sent, received, saved and
    // installed, and `.snap` files saved every 100 entries
    let metrics = |i: usize| {
        testkit::http::get(&cluster.endpoint(i), "/metrics")
            .unwrap()
            .body
    };
    let total = |text: &str, prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let lagging_metrics = metrics(lagging);
    assert!(
        total(
            &lagging_metrics,
            "etcd_network_snapshot_receive_success{From="
        ) >= 1.0
    );
    assert!(
        total(
            &lagging_metrics,
            "etcd_snap_db_save_total_duration_seconds_count"
        ) >= 1.0
    );
    assert!(
        total(
            &lagging_metrics,
            "etcd_snap_db_fsync_duration_seconds_count"
        ) >= 1.0
    );
    assert_eq!(
        total(
            &lagging_metrics,
            "etcd_server_snapshot_apply_in_progress_total"
        ),
        0.0
    );
    let others: Vec<String> = (0..3).filter(|i| *i != lagging).map(metrics).collect();
    let sent: f64 = others
        .iter()
        .map(|t| total(t, "etcd_network_snapshot_send_success{To="))
        .sum();
    assert!(sent >= 1.0, "no member counted a snapshot sent");
    assert!(
        total(
            &others[0],
            "etcd_debugging_snap_save_total_duration_seconds_count"
        ) >= 1.0
    );
    assert!(total(&others[0], "etcd_snap_fsync_duration_seconds_count") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_behind_by_thousands_of_entries_catches_up_from_the_leaders_wal() {
    // etcd's defaults: no snapshot before 100,000 entries. The leader keeps
    // only its last ~1,000 applied entries in memory; the 5,000 the member
    // misses come back from the leader's WAL segments, not by snapshot.
    let mut cluster = Cluster::start(3, &[]);
    let lagging = (leader(&cluster).await + 1) % 3;
    cluster.kill9(lagging);
    let endpoints: Vec<String> = (0..3)
        .filter(|i| *i != lagging)
        .map(|i| cluster.endpoint(i))
        .collect();
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let endpoints = endpoints.clone();
            tokio::spawn(async move {
                let mut c = client(&endpoints).await;
                for i in (w..5000).step_by(8) {
                    c.put(format!("k{i:04}"), format!("v{i}"), None)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    cluster.restart(lagging);
    let mut lag = client(&[cluster.endpoint(lagging)]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let count = lag
            .get(
                "k",
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_serializable()
                        .with_count_only(),
                ),
            )
            .await
            .map(|g| g.count())
            .unwrap_or(0);
        if count == 5000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lagging member has {count} of 5000 keys"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = cluster.members[lagging].as_ref().unwrap().log_text();
    assert!(
        !log.contains("applied database snapshot"),
        "caught up by snapshot, not from the WAL:\n{log}"
    );
    hashes_converge(&cluster).await;
    let g = lag.get("k4999", None).await.unwrap();
    assert_eq!(g.kvs()[0].value(), b"v4999");
}

/// A watch on `prefix` from `start`, on one member.
async fn watch_prefix(endpoint: &str, prefix: &str, start: i64) -> etcd_client::WatchStream {
    use etcd_client::WatchOptions;
    let mut watcher = client(&[endpoint.to_string()]).await;
    watcher
        .watch(
            prefix,
            Some(WatchOptions::new().with_prefix().with_start_revision(start)),
        )
        .await
        .unwrap()
}

/// Receives events until `want` PUTs arrived or the stream breaks; returns
/// the (revision, key) of each, and the last revision seen.
async fn collect_events(
    stream: &mut etcd_client::WatchStream,
    seen: &mut Vec<(i64, String)>,
    want: usize,
) -> bool {
    while seen.len() < want {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(resp))) => {
                for e in resp.events() {
                    let kv = e.kv().expect("event has a kv");
                    seen.push((kv.mod_revision(), kv.key_str().unwrap().to_string()));
                }
            }
            // The member died under the stream, or nothing came for 10 s.
            _ => return false,
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_on_another_member_without_gap_or_duplicate() {
    use etcd_client::WatchOptions;
    const TOTAL: usize = 600;
    let mut cluster = Cluster::start(3, &[]);
    // Write through the leader, watch on a follower, resume on the third.
    let writing = leader(&cluster).await;
    let (watched, resumed) = ((writing + 1) % 3, (writing + 2) % 3);
    let writer_ep = cluster.endpoint(writing);
    let start = client(std::slice::from_ref(&writer_ep))
        .await
        .put("w/0000", "v", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let writer = tokio::spawn(async move {
        let mut c = client(&[writer_ep]).await;
        let mut last = 0;
        for i in 1..TOTAL {
            last = c
                .put(format!("w/{i:04}"), "v", None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
        }
        last
    });
    let mut stream = watch_prefix(&cluster.endpoint(watched), "w/", start).await;
    let mut seen = Vec::new();
    assert!(
        collect_events(&mut stream, &mut seen, TOTAL / 3).await,
        "no events before the kill"
    );
    // Kill the watched member mid-stream; take what it had sent.
    cluster.kill9(watched);
    collect_events(&mut stream, &mut seen, TOTAL).await;
    let last = seen.last().map(|e| e.0).unwrap();
    // Resume on another member from the last revision seen + 1.
    let mut other = client(&[cluster.endpoint(resumed)]).await;
    let mut stream = other
        .watch(
            "w/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(last + 1),
            ),
        )
        .await
        .unwrap();
    assert!(
        collect_events(&mut stream, &mut seen, TOTAL).await,
        "got {} of {TOTAL} events",
        seen.len()
    );
    let final_revision = writer.await.unwrap();
    let revisions: Vec<i64> = seen.iter().map(|e| e.0).collect();
    assert!(
        revisions.windows(2).all(|w| w[1] == w[0] + 1),
        "a gap or a duplicate: {revisions:?}"
    );
    assert_eq!(
        (revisions[0], *revisions.last().unwrap()),
        (start, final_revision)
    );
}

/// The fault injector's finding: a follower that catches up from a
/// snapshot must still deliver every revision to the watchers it serves
/// (etcd's watchableStore.Restore moves them to unsynced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_a_follower_never_skips_a_revision_across_a_snapshot_install() {
    const BEFORE: usize = 50;
    // More entries than the leader keeps in flight to one follower (512
    // MsgApps, which the paused member's socket would buffer and deliver).
    const WHILE_PAUSED: usize = 1200;
    const AFTER: usize = 50;
    let args = [
        "--snapshot-count",
        "100",
        "--experimental-snapshot-catchup-entries",
        "10",
    ];
    let cluster = Cluster::start(3, &args);
    let writing = leader(&cluster).await;
    let watched = (writing + 1) % 3;
    let mut writer = client(&[cluster.endpoint(writing)]).await;
    let start = writer
        .put("w/start", "v", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let mut stream = watch_prefix(&cluster.endpoint(watched), "w/", start).await;
    let mut seen = Vec::new();
    let put_range = |c: &mut etcd_client::Client, from: usize, to: usize| {
        let mut c = c.clone();
        async move {
            let mut last = 0;
            for i in from..to {
                last = c
                    .put(format!("w/{i:04}"), "v", None)
                    .await
                    .unwrap()
                    .header()
                    .unwrap()
                    .revision();
            }
            last
        }
    };
    put_range(&mut writer, 1, BEFORE).await;
    assert!(
        collect_events(&mut stream, &mut seen, BEFORE).await,
        "events before the pause"
    );
    // The watched follower neither sends nor answers while the others go
    // far past the log the leader keeps: it can only catch up by snapshot.
    cluster.pause(watched);
    put_range(&mut writer, BEFORE, BEFORE + WHILE_PAUSED).await;
    cluster.resume(watched);
    let last = put_range(
        &mut writer,
        BEFORE + WHILE_PAUSED,
        BEFORE + WHILE_PAUSED + AFTER,
    )
    .await;
    let total = BEFORE + WHILE_PAUSED + AFTER;
    assert!(
        collect_events(&mut stream, &mut seen, total).await,
        "got {} of {total} events; the watched member's log:\n{}",
        seen.len(),
        cluster.members[watched].as_ref().unwrap().log_text()
    );
    let log = cluster.members[watched].as_ref().unwrap().log_text();
    assert!(
        log.contains("applied database snapshot"),
        "caught up without a snapshot:\n{}",
        (0..3)
            .map(|i| cluster.members[i].as_ref().unwrap().log_text())
            .collect::<Vec<_>>()
            .join("\n=====\n")
    );
    let revisions: Vec<i64> = seen.iter().map(|e| e.0).collect();
    let skipped: Vec<&[i64]> = revisions.windows(2).filter(|w| w[1] != w[0] + 1).collect();
    assert!(
        skipped.is_empty(),
        "a gap or a duplicate across the snapshot: {skipped:?}"
    );
    assert_eq!((revisions[0], *revisions.last().unwrap()), (start, last));
}

#[test]
fn etcdctl_endpoint_status_cluster_shows_one_leader_and_one_term() {
    let cluster = Cluster::start(3, &[]);
    for etcdctl in [testkit::ETCD_34.1, testkit::ETCD_35.1] {
        // A URL endpoint, as operators write it: etcd 3.4's client sends it
        // whole as the HTTP/2 :authority.
        let out = std::process::Command::new(etcdctl)
            .env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                &cluster.endpoint(0),
                "endpoint",
                "status",
                "--cluster",
                "-w",
                "json",
            ])
            .output()
            .unwrap_or_else(|e| panic!("{etcdctl}: {e}"));
        assert!(
            out.status.success(),
            "{etcdctl}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let statuses: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let statuses = statuses.as_array().unwrap();
        assert_eq!(statuses.len(), 3, "{text}");
        let leaders: Vec<u64> = statuses
            .iter()
            .map(|s| s["Status"]["leader"].as_u64().unwrap())
            .collect();
        let terms: Vec<u64> = statuses
            .iter()
            .map(|s| s["Status"]["raftTerm"].as_u64().unwrap())
            .collect();
        assert!(
            leaders.iter().all(|l| *l == leaders[0] && *l != 0),
            "{text}"
        );
        assert!(terms.iter().all(|t| *t == terms[0]), "{text}");
        let ids: Vec<u64> = statuses
            .iter()
            .map(|s| s["Status"]["header"]["member_id"].as_u64().unwrap())
            .collect();
        assert_eq!(
            ids.iter().filter(|id| **id == leaders[0]).count(),
            1,
            "{text}"
        );
    }
}

/// Opens a raft link to `peer` (host:port) with the given hello; returns
/// the stream after writing `then`.
async fn raft_link(
    peer: &str,
    cluster_id: u64,
    from: u64,
    to: u64,
    then: &[u8],
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(peer).await.unwrap();
    let mut hello = b"OXRAFT01".to_vec();
    for v in [cluster_id, from, to] {
        hello.extend_from_slice(&v.to_le_bytes());
    }
    hello.extend_from_slice(then);
    stream.write_all(&hello).await.unwrap();
    stream
}

/// The member closes the link: a read ends (EOF or reset) in time.
async fn closed_by_member(mut stream: tokio::net::TcpStream, what: &str) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 16];
    match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("{what}: the member wrote {n} bytes on a raft link"),
        Err(_) => panic!("{what}: the member kept the link open"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_port_closes_bad_raft_links_and_keeps_replicating() {
    let cluster = Cluster::start(3, &[]);
    let mut c = client(&[cluster.endpoint(0)]).await;
    let status = c.status().await.unwrap();
    let header = status.header().unwrap();
    let (cluster_id, me) = (header.cluster_id(), header.member_id());
    let peer = cluster
        .peer_url(0)
        .trim_start_matches("http://")
        .to_string();

    // another cluster, another member
    closed_by_member(
        raft_link(&peer, cluster_id ^ 1, 7, me, &[]).await,
        "wrong cluster",
    )
    .await;
    closed_by_member(
        raft_link(&peer, cluster_id, 7, me ^ 1, &[]).await,
        "wrong member",
    )
    .await;
    // a sender that is not a member (etcd: "404 error sender not found")
    closed_by_member(
        raft_link(&peer, cluster_id, 7, me, &[]).await,
        "unknown sender",
    )
    .await;
    // as a member: a length beyond any raft message, then a body that is
    // not a message, then a message that names another sender
    let other = member_id(&cluster, 1).await;
    let huge = u32::MAX.to_le_bytes();
    closed_by_member(
        raft_link(&peer, cluster_id, other, me, &huge).await,
        "oversized frame",
    )
    .await;
    let mut garbage = 6u32.to_le_bytes().to_vec();
    garbage.extend_from_slice(&[0xff; 6]);
    closed_by_member(
        raft_link(&peer, cluster_id, other, me, &garbage).await,
        "undecodable frame",
    )
    .await;
    // half a magic, then gone; and a stream that is neither raft nor HTTP/2
    {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(&peer).await.unwrap();
        s.write_all(b"OXRA").await.unwrap();
        drop(s);
        let mut s = tokio::net::TcpStream::connect(&peer).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        drop(s);
    }
    let log = cluster.members[0].as_ref().unwrap().log_text();
    assert!(
        log.contains("refused a raft link for another cluster or member"),
        "{log}"
    );
    assert!(
        log.contains("refused a raft link: sender not found"),
        "{log}"
    );

    // The member still replicates, both ways.
    for i in [0, 2] {
        let mut c = client(&[cluster.endpoint(i)]).await;
        c.put(format!("after-bad-links-{i}"), "v", None)
            .await
            .unwrap();
    }
    hashes_converge(&cluster).await;
}

async fn member_id(cluster: &Cluster, i: usize) -> u64 {
    let mut c = client(&[cluster.endpoint(i)]).await;
    c.status().await.unwrap().header().unwrap().member_id()
}

/// Resident memory of member `i`, in bytes.
fn rss(cluster: &Cluster, i: usize) -> u64 {
    let pid = cluster.members[i].as_ref().unwrap().pid();
    testkit::vm_rss(&pid.to_string())
}

/// The probe that took a member from 19 MB to 2.5 GB in 8 s: 40 raft
/// links, each declaring a 60 MiB frame and sending a few bytes of it.
/// Frames now grow with the bytes received and a sender has one link at a
/// time; the member goes on replicating. (Stalls and the links' byte
/// budget: consensus::transport's unit tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_port_cannot_be_used_to_exhaust_memory() {
    let cluster = Cluster::start(3, &[]);
    let mut c = client(&[cluster.endpoint(0)]).await;
    let header = c.status().await.unwrap().header().unwrap().clone();
    let (cluster_id, me) = (header.cluster_id(), header.member_id());
    let senders = [member_id(&cluster, 1).await, member_id(&cluster, 2).await];
    let peer = cluster
        .peer_url(0)
        .trim_start_matches("http://")
        .to_string();
    let before = rss(&cluster, 0);

    let mut declared = (60u32 << 20).to_le_bytes().to_vec();
    declared.extend_from_slice(&[0u8; 1024]);
    let mut links = Vec::new();
    for i in 0..40 {
        links.push(raft_link(&peer, cluster_id, senders[i % 2], me, &declared).await);
    }
    // One link per sender: all but the last two were replaced and closed.
    for (i, link) in links.drain(..38).enumerate() {
        closed_by_member(link, &format!("link {i}, replaced by a newer one")).await;
    }
    let grown = rss(&cluster, 0).saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "40 links of 60 MiB frames grew the member by {grown} bytes"
    );
    // The two left are closed too: stalled mid-frame, or replaced by the
    // real members' links reconnecting.
    for (i, link) in links.into_iter().enumerate() {
        closed_by_member(link, &format!("stalled link {i}")).await;
    }
    assert!(rss(&cluster, 0).saturating_sub(before) < 64 << 20);

    // The peer gRPC services: a sender that is not a member is not found;
    // a message past the peer port's size bound is refused unread.
    {
        use api::oxcdpeerpb::peer_client::PeerClient;
        use api::oxcdpeerpb::{ProbeRequest, SnapshotChunk};
        let channel = tonic::transport::Endpoint::from_shared(cluster.peer_url(0))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut peer_client = PeerClient::new(channel).max_encoding_message_size(usize::MAX);
        let probe = |from| ProbeRequest {
            cluster_id,
            from,
            to: me,
        };
        let refused = peer_client.probe(probe(7)).await.unwrap_err();
        assert_eq!(
            (refused.code(), refused.message()),
            (Code::NotFound, "error sender not found")
        );
        peer_client.probe(probe(senders[0])).await.unwrap();
        let chunk = |from, data: Vec<u8>| SnapshotChunk {
            cluster_id,
            from,
            to: me,
            data: data.into(),
            ..Default::default()
        };
        let refused = peer_client
            .snapshot(tokio_stream::iter(vec![chunk(7, Vec::new())]))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
        let huge = chunk(senders[0], vec![0u8; 8 << 20]);
        let refused = peer_client
            .snapshot(tokio_stream::iter(vec![huge]))
            .await
            .unwrap_err();
        assert!(
            refused.message().contains("message length too large"),
            "{refused:?}"
        );
    }

    // Replication goes on, and the real links come back.
    for i in 0..3 {
        let mut c = client(&[cluster.endpoint(i)]).await;
        c.put(format!("after-{i}"), "v", None).await.unwrap();
    }
    hashes_converge(&cluster).await;
}
