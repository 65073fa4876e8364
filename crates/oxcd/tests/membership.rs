//! Membership changes on process clusters: growing and shrinking under a
//! writer, replacing a dead member, learners and their promotion, removing
//! the leader, a removed member refused when it comes back, etcd's checks
//! and errors, and `--force-new-cluster`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, MemberAddOptions};
use testkit::Cluster;
use tonic::Code;

mod common;
use common::{client, hashes_converge, leader, ELECTION_DEADLINE};

/// A membership change may wait for the strict reconfig check's 5 s of
/// connectivity, an election, a member catching up.
const CHANGE_DEADLINE: Duration = Duration::from_secs(30);

/// Runs a change until this member has been connected to every voter for
/// etcd's 5 s (before that the strict reconfig check refuses it first).
async fn settled<T, F, Fut>(call: F) -> Result<T, etcd_client::Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        let r = call().await;
        match &r {
            Err(etcd_client::Error::GRpcStatus(s))
                if s.message() == "etcdserver: unhealthy cluster" && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ => return r,
        }
    }
}

/// A call failed with exactly `code` and `message`.
#[track_caller]
fn expect(r: Result<(), etcd_client::Error>, code: Code, message: &str) {
    match r {
        Ok(()) => panic!("succeeded; expected {code:?} {message:?}"),
        Err(e) => {
            let (got_code, got) = status_of(e);
            assert_eq!((got_code, got.as_str()), (code, message));
        }
    }
}

fn status_of(e: etcd_client::Error) -> (Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

/// Whether an error is one a caller retries: the cluster is settling
/// (connectivity under 5 s, an election, a change in flight).
fn transient(message: &str) -> bool {
    [
        "etcdserver: unhealthy cluster",
        "etcdserver: request timed out",
        "etcdserver: leader changed",
        "etcdserver: no leader",
        "etcdserver: not leader",
        "etcdserver: can only promote a learner member which is in sync with leader",
        "etcdserver: server stopped",
        // the client picked a learner: another endpoint serves it
        "etcdserver: rpc not supported for learner",
    ]
    .contains(&message)
        || message.contains("transport")
        || message.contains("connect")
}

/// MemberAdd through any running member, retried while the cluster is
/// settling; the new member's ID.
async fn add_member(cluster: &Cluster, peer_url: &str, learner: bool) -> u64 {
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        let mut c = client(&cluster.endpoints()).await;
        let options = learner.then(|| MemberAddOptions::new().with_is_learner());
        match c.member_add([peer_url], options).await {
            Ok(resp) => return resp.member().expect("the added member").id(),
            Err(e) => {
                let (_, message) = status_of(e);
                assert!(
                    transient(&message) && Instant::now() < deadline,
                    "member add {peer_url}: {message}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn remove_member(cluster: &Cluster, id: u64, through: &[String]) {
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        let mut c = client(through).await;
        match c.member_remove(id).await {
            Ok(_) => return,
            Err(e) => {
                let (_, message) = status_of(e);
                assert!(
                    transient(&message) && Instant::now() < deadline,
                    "member remove {id:x}: {message}; {:?}",
                    cluster.endpoints()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn promote(cluster: &Cluster, id: u64) {
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        let mut c = client(&cluster.endpoints()).await;
        match c.member_promote(id).await {
            Ok(_) => return,
            Err(e) => {
                let (_, message) = status_of(e);
                assert!(
                    transient(&message) && Instant::now() < deadline,
                    "member promote {id:x}: {message}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (id, name, is_learner) of every member, as `endpoint` lists them.
async fn members_of(endpoint: &str) -> Vec<(u64, String, bool)> {
    let mut c = client(&[endpoint.to_string()]).await;
    let list = c.member_list().await.expect("member list");
    list.members()
        .iter()
        .map(|m| (m.id(), m.name().to_string(), m.is_learner()))
        .collect()
}

/// Waits until every running member lists `want` members, all started
/// (named) and the same on each.
async fn members_agree(cluster: &Cluster, want: usize) -> Vec<(u64, String, bool)> {
    lists_agree(cluster, |list| {
        list.len() == want && list.iter().all(|m| !m.1.is_empty())
    })
    .await
}

/// Waits until every running member lists the same members, and the list
/// passes `good`.
async fn lists_agree(
    cluster: &Cluster,
    good: impl Fn(&[(u64, String, bool)]) -> bool,
) -> Vec<(u64, String, bool)> {
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        let mut lists = Vec::new();
        // a learner does not list members (etcd refuses MemberList there)
        let mut learners = 0;
        for endpoint in cluster.endpoints() {
            let mut c = client(&[endpoint]).await;
            match c.member_list().await {
                Ok(list) => lists.push(
                    list.members()
                        .iter()
                        .map(|m| (m.id(), m.name().to_string(), m.is_learner()))
                        .collect::<Vec<_>>(),
                ),
                Err(etcd_client::Error::GRpcStatus(s))
                    if s.message() == "etcdserver: rpc not supported for learner" =>
                {
                    learners += 1
                }
                Err(_) => {}
            }
        }
        let agreed = !lists.is_empty()
            && lists.len() + learners == cluster.endpoints().len()
            && lists.iter().all(|l| *l == lists[0])
            && lists[0].iter().filter(|m| m.2).count() >= learners
            && good(&lists[0]);
        if agreed {
            return lists.swap_remove(0);
        }
        assert!(Instant::now() < deadline, "members do not agree: {lists:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The ID of member `i` (its own Status header).
async fn id_of(cluster: &Cluster, i: usize) -> u64 {
    let mut c = client(&[cluster.endpoint(i)]).await;
    c.status().await.unwrap().header().unwrap().member_id()
}

/// Puts `w/<n>` as fast as it can through the endpoints it is given,
/// recording what was acknowledged.
struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(String, Instant)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(endpoints: Vec<String>) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let (s, a) = (stop.clone(), acked.clone());
        let task = tokio::spawn(async move {
            let mut n = 0u64;
            let mut c: Option<Client> = None;
            while !s.load(Ordering::Relaxed) {
                if c.is_none() {
                    c = Client::connect(&endpoints, None).await.ok();
                }
                let Some(client) = c.as_mut() else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let key = format!("w/{n:08}");
                let put = tokio::time::timeout(
                    Duration::from_secs(5),
                    client.put(key.clone(), "v", None),
                )
                .await;
                match put {
                    Ok(Ok(_)) => a.lock().unwrap().push((key, Instant::now())),
                    _ => {
                        c = None;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                n += 1;
            }
        });
        Writer { stop, acked, task }
    }

    /// Stops and returns the acknowledged keys.
    async fn finish(self) -> Vec<String> {
        self.finish_timed()
            .await
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    /// Stops and returns the acknowledged keys with when each was acked.
    async fn finish_timed(self) -> Vec<(String, Instant)> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let acked = self.acked.lock().unwrap().clone();
        acked
    }
}

/// Waits until member `i` saw its raft link to `dead` break (its
/// etcd_network_active_peers for it is 0).
async fn link_seen_broken(cluster: &Cluster, i: usize, dead: u64) {
    let gone = format!("Remote=\"{dead:x}\"}} 0");
    let deadline = Instant::now() + CHANGE_DEADLINE;
    while !testkit::http::get(&cluster.endpoint(i), "/metrics")
        .map(|r| {
            r.body
                .lines()
                .any(|l| l.starts_with("etcd_network_active_peers") && l.ends_with(&gone))
        })
        .unwrap_or(false)
    {
        assert!(
            Instant::now() < deadline,
            "member {i} still counts the dead member active"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A put, retried while the cluster elects a leader (the member killed
/// just before may have led).
async fn put_retrying(c: &mut Client, key: String, value: Vec<u8>) {
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        match c.put(key.clone(), value.clone(), None).await {
            Ok(_) => return,
            Err(e) => {
                let (code, message) = status_of(e);
                assert!(
                    code == Code::Unavailable && Instant::now() < deadline,
                    "put {key}: {message}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every acknowledged key is on every running member.
async fn nothing_lost(cluster: &Cluster, acked: &[String]) {
    for endpoint in cluster.endpoints() {
        let mut c = client(std::slice::from_ref(&endpoint)).await;
        let have: BTreeSet<String> = c
            .get("w/", Some(GetOptions::new().with_prefix().with_keys_only()))
            .await
            .unwrap()
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_string())
            .collect();
        let lost: Vec<&String> = acked.iter().filter(|k| !have.contains(*k)).collect();
        assert!(
            lost.is_empty(),
            "{endpoint} lost {} acknowledged writes: {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_one_to_three_to_five_under_a_writer_and_shrink_back_to_three() {
    let mut cluster = Cluster::start(1, &[]);
    let writer = Writer::start(vec![cluster.endpoint(0)]);
    for _ in 0..4 {
        let i = cluster.reserve();
        add_member(&cluster, &cluster.peer_url(i), false).await;
        cluster.join(i);
        members_agree(&cluster, i + 1).await;
    }
    assert_eq!(members_of(&cluster.endpoint(4)).await.len(), 5);
    // shrink: remove two followers, each stops by itself (exit status 0)
    let lead = leader(&cluster).await;
    let followers: Vec<usize> = (0..5).filter(|i| *i != lead).take(2).collect();
    for i in followers.iter().copied() {
        let id = id_of(&cluster, i).await;
        let others: Vec<String> = (0..5)
            .filter(|j| !followers.contains(j) && cluster.members[*j].is_some())
            .map(|j| cluster.endpoint(j))
            .collect();
        remove_member(&cluster, id, &others).await;
        let p = cluster.members[i].as_mut().unwrap();
        let status = p.wait_exit(Duration::from_secs(15));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "a removed member exits 0; log:\n{}",
            p.log_text()
        );
        assert!(p
            .log_text()
            .contains("data-dir used by this member must be removed"));
        cluster.members[i] = None;
    }
    members_agree(&cluster, 3).await;
    let acked = writer.finish().await;
    assert!(acked.len() > 50, "the writer went on: {}", acked.len());
    nothing_lost(&cluster, &acked).await;
    hashes_converge(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_replaced_and_the_new_one_catches_up_by_snapshot() {
    // small snapshots and catch-up window: the new member needs a snapshot
    let mut cluster = Cluster::start(
        3,
        &[
            "--snapshot-count",
            "100",
            "--experimental-snapshot-catchup-entries",
            "50",
        ],
    );
    let dead = 2;
    let dead_id = id_of(&cluster, dead).await;
    cluster.kill9(dead);
    let mut c = client(&cluster.endpoints()).await;
    for n in 0..1000 {
        put_retrying(&mut c, format!("k/{n:05}"), vec![b'x'; 100]).await;
    }
    let started = Instant::now();
    remove_member(&cluster, dead_id, &cluster.endpoints()).await;
    let i = cluster.reserve();
    add_member(&cluster, &cluster.peer_url(i), false).await;
    cluster.join(i);
    let replaced = started.elapsed();
    let p = cluster.members[i].as_ref().unwrap();
    assert!(
        p.wait_for_log("applied database snapshot", Duration::from_secs(10))
            .is_some(),
        "the new member installs a snapshot:\n{}",
        p.log_text()
    );
    members_agree(&cluster, 3).await;
    hashes_converge(&cluster).await;
    let mut n = client(&[cluster.endpoint(i)]).await;
    let got = n
        .get(
            "k/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(got.count(), 1000);
    eprintln!("replaced a dead member holding 1000 keys in {replaced:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_serves_only_what_etcds_learners_serve_and_is_promoted_once_in_sync() {
    let mut cluster = Cluster::start(3, &[]);
    let mut c = client(&cluster.endpoints()).await;
    for n in 0..200 {
        c.put(format!("k/{n}"), "v", None).await.unwrap();
    }
    // added, caught up and promoted under a writer
    let writer = Writer::start(cluster.endpoints());
    let i = cluster.reserve();
    let id = add_member(&cluster, &cluster.peer_url(i), true).await;
    // not started: its log is empty, far from the leader's
    let (code, message) = status_of(c.member_promote(id).await.unwrap_err());
    assert_eq!(
        (code, message.as_str()),
        (
            Code::FailedPrecondition,
            "etcdserver: can only promote a learner member which is in sync with leader"
        )
    );
    // a second learner is refused
    let second = settled(|| {
        let mut c = c.clone();
        async move {
            c.member_add(
                ["http://127.0.0.1:1"],
                Some(MemberAddOptions::new().with_is_learner()),
            )
            .await
        }
    })
    .await;
    let (code, message) = status_of(second.unwrap_err());
    assert_eq!(
        (code, message.as_str()),
        (
            Code::FailedPrecondition,
            "etcdserver: too many learner members in cluster"
        )
    );
    cluster.join(i);
    let learner = cluster.endpoint(i);
    let mut l = client(std::slice::from_ref(&learner)).await;
    // serializable reads and Status are served; the rest is refused
    let got = l
        .get(
            "k/",
            Some(GetOptions::new().with_prefix().with_serializable()),
        )
        .await;
    let deadline = Instant::now() + CHANGE_DEADLINE;
    let mut got = got;
    while got.as_ref().map_or(true, |g| g.kvs().len() < 200) {
        assert!(Instant::now() < deadline, "the learner does not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = l
            .get(
                "k/",
                Some(GetOptions::new().with_prefix().with_serializable()),
            )
            .await;
    }
    assert!(l.status().await.unwrap().is_learner());
    let refused = [
        l.put("x", "y", None).await.map(|_| ()),
        l.get("k/1", None).await.map(|_| ()),
        l.member_list().await.map(|_| ()),
        l.lease_grant(10, None).await.map(|_| ()),
    ];
    for r in refused {
        let (code, message) = status_of(r.unwrap_err());
        assert_eq!(
            (code, message.as_str()),
            (
                Code::Unavailable,
                "etcdserver: rpc not supported for learner"
            )
        );
    }
    // the gateway answers as etcd's, which calls the gRPC services
    let put =
        testkit::http::post(&learner, "/v3/kv/put", r#"{"key":"eA==","value":"eQ=="}"#).unwrap();
    assert_eq!(put.status, 503, "{}", put.body);
    assert!(
        put.body
            .contains("etcdserver: rpc not supported for learner"),
        "{}",
        put.body
    );
    let range = testkit::http::post(
        &learner,
        "/v3/kv/range",
        r#"{"key":"ay8x","serializable":true}"#,
    )
    .unwrap();
    assert_eq!(range.status, 200, "{}", range.body);
    let metrics = testkit::http::get(&learner, "/metrics").unwrap().body;
    assert!(metrics.contains("etcd_server_is_learner 1"), "{metrics}");
    // in sync now: promoted (through whichever member the client picks)
    promote(&cluster, id).await;
    let list = members_agree(&cluster, 4).await;
    assert!(list.iter().all(|m| !m.2), "no learner left: {list:?}");
    let acked = writer.finish().await;
    assert!(!acked.is_empty());
    nothing_lost(&cluster, &acked).await;
    let lead = leader(&cluster).await;
    let metrics = testkit::http::get(&cluster.endpoint(lead), "/metrics")
        .unwrap()
        .body;
    assert!(
        metrics.contains("etcd_server_learner_promote_successes 1"),
        "{metrics}"
    );
    let mut l = client(&[learner]).await;
    l.put("by-the-promoted", "1", None).await.unwrap();
    // promoting a voter is refused
    let (code, message) = status_of(c.member_promote(id).await.unwrap_err());
    assert_eq!(
        (code, message.as_str()),
        (
            Code::FailedPrecondition,
            "etcdserver: can only promote a learner member"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_leader_under_a_writer_elects_another_and_loses_nothing() {
    let mut cluster = Cluster::start(3, &[]);
    let lead = leader(&cluster).await;
    let lead_id = id_of(&cluster, lead).await;
    let others: Vec<String> = (0..3)
        .filter(|i| *i != lead)
        .map(|i| cluster.endpoint(i))
        .collect();
    let writer = Writer::start(others.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    remove_member(&cluster, lead_id, &others).await;
    let removed_at = Instant::now();
    let p = cluster.members[lead].as_mut().unwrap();
    let status = p.wait_exit(Duration::from_secs(15));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", p.log_text());
    cluster.members[lead] = None;
    let new_leader = leader(&cluster).await;
    assert_ne!(new_leader, lead);
    // writes go on on the pair
    let mut c = client(&others).await;
    c.put("after", "1", None).await.unwrap();
    eprintln!(
        "a new leader and a write {:?} after the removal",
        removed_at.elapsed()
    );
    assert!(removed_at.elapsed() < ELECTION_DEADLINE);
    let acked = writer.finish_timed().await;
    // the longest the writer waited for an acknowledgement around the
    // removal: the leader hands over before it goes, so writes pause for
    // a transfer, not an election timeout
    let pause = acked
        .windows(2)
        .map(|w| w[1].1.duration_since(w[0].1))
        .max()
        .unwrap_or_default();
    eprintln!("longest write pause while removing the leader: {pause:?}");
    assert!(pause < ELECTION_DEADLINE, "{pause:?}");
    let acked: Vec<String> = acked.into_iter().map(|(k, _)| k).collect();
    nothing_lost(&cluster, &acked).await;
    members_agree(&cluster, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_removed_while_paused_is_refused_when_it_comes_back() {
    let mut cluster = Cluster::start(3, &[]);
    let lead = leader(&cluster).await;
    let victim = (lead + 1) % 3;
    let victim_id = id_of(&cluster, victim).await;
    cluster.pause(victim);
    let others: Vec<String> = (0..3)
        .filter(|i| *i != victim)
        .map(|i| cluster.endpoint(i))
        .collect();
    remove_member(&cluster, victim_id, &others).await;
    cluster.resume(victim);
    let p = cluster.members[victim].as_mut().unwrap();
    let status = p.wait_exit(Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", p.log_text());
    cluster.members[victim] = None;
    // restarted on its data dir it is refused again and stops
    let p = cluster.spawn_with(victim, &[]);
    let status = p.wait_exit(Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", p.log_text());
    assert!(p
        .log_text()
        .contains("the member has been permanently removed from the cluster"));
    cluster.members[victim] = None;
    let refused = (0..3).filter_map(|i| cluster.members[i].as_ref()).any(|p| {
        p.log_text()
            .contains("rejected stream from remote peer because it was removed")
    });
    members_agree(&cluster, 2).await;
    assert!(refused, "a peer logs etcd's refusal of the removed member");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_errors_are_etcds() {
    let mut cluster = Cluster::start(3, &[]);
    // one member answers them all: once it has been connected to every
    // voter for 5 s the strict reconfig check stays out of the way
    let mut c = client(&[cluster.endpoint(0)]).await;
    // a removed member's ID is never known again (adding it waits until
    // this member has been connected to every voter for 5 s)
    let added = settled(|| {
        let mut c = c.clone();
        async move {
            c.member_add(
                ["http://127.0.0.1:1"],
                Some(MemberAddOptions::new().with_is_learner()),
            )
            .await
        }
    })
    .await;
    let learner = added.unwrap().member().unwrap().id();
    c.member_remove(learner).await.unwrap();
    expect(
        c.member_remove(learner).await.map(|_| ()),
        Code::NotFound,
        "etcdserver: member not found",
    );
    expect(
        c.member_update(learner, vec!["http://127.0.0.1:9".to_string()])
            .await
            .map(|_| ()),
        Code::NotFound,
        "etcdserver: member not found",
    );
    expect(
        c.member_promote(learner).await.map(|_| ()),
        Code::NotFound,
        "etcdserver: member not found",
    );
    let taken = cluster.peer_url(1);
    expect(
        c.member_add([taken.as_str()], None).await.map(|_| ()),
        Code::FailedPrecondition,
        "etcdserver: Peer URLs already exists",
    );
    // (etcd_client adds "http://" to a URL without a scheme)
    for bad in ["http://a", "http://a:1/path", "ftp://a:1"] {
        expect(
            c.member_add([bad], None).await.map(|_| ()),
            Code::InvalidArgument,
            "etcdserver: given member URLs are invalid",
        );
    }
    expect(
        c.member_remove(0x1234).await.map(|_| ()),
        Code::NotFound,
        "etcdserver: member not found",
    );
    expect(
        c.member_update(0x1234, vec!["http://127.0.0.1:1".to_string()])
            .await
            .map(|_| ()),
        Code::NotFound,
        "etcdserver: member not found",
    );
    expect(
        c.member_promote(0x1234).await.map(|_| ()),
        Code::NotFound,
        "etcdserver: member not found",
    );
    let id0 = id_of(&cluster, 0).await;
    expect(
        c.member_update(id0, vec![taken.clone()]).await.map(|_| ()),
        Code::FailedPrecondition,
        "etcdserver: Peer URLs already exists",
    );
    // a member down: the local member is not connected to every voter
    let dead = id_of(&cluster, 2).await;
    cluster.kill9(2);
    let lead = leader(&cluster).await;
    link_seen_broken(&cluster, lead, dead).await;
    let mut l = client(&[cluster.endpoint(lead)]).await;
    expect(
        l.member_add(
            ["http://127.0.0.1:4"],
            Some(MemberAddOptions::new().with_is_learner()),
        )
        .await
        .map(|_| ()),
        Code::Unavailable,
        "etcdserver: unhealthy cluster",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_reconfig_check_refuses_what_would_leave_too_few_started_members() {
    let cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.endpoints()).await;
    // a one-member cluster may always add one (etcd: restoring a cluster);
    // the unstarted voter leaves it without a quorum
    c.member_add(["http://127.0.0.1:1"], None).await.unwrap();
    let own = id_of(&cluster, 0).await;
    for r in [
        c.member_add(["http://127.0.0.1:2"], None).await.map(|_| ()),
        c.member_remove(own).await.map(|_| ()),
    ] {
        let (code, message) = status_of(r.unwrap_err());
        assert_eq!(
            (code, message.as_str()),
            (
                Code::Unknown,
                "etcdserver: re-configuration failed due to not enough started members"
            ),
            "as etcd sends it: no gRPC status of its own"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_strict_reconfig_check_a_member_down_does_not_block_changes() {
    let mut cluster = Cluster::start(3, &["--strict-reconfig-check=false"]);
    let dead = id_of(&cluster, 2).await;
    cluster.kill9(2);
    let lead = leader(&cluster).await;
    link_seen_broken(&cluster, lead, dead).await;
    let mut l = client(&[cluster.endpoint(lead)]).await;
    let resp = l
        .member_add(
            ["http://127.0.0.1:4"],
            Some(MemberAddOptions::new().with_is_learner()),
        )
        .await
        .unwrap();
    assert!(resp.member().unwrap().is_learner());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_rebuilds_a_cluster_from_one_survivor() {
    let mut cluster = Cluster::start(3, &[]);
    let mut c = client(&cluster.endpoints()).await;
    for n in 0..100 {
        c.put(format!("k/{n:03}"), "v", None).await.unwrap();
    }
    let survivor = 0;
    let lost: Vec<u64> = vec![id_of(&cluster, 1).await, id_of(&cluster, 2).await];
    for i in 0..3 {
        cluster.kill9(i);
    }
    for i in 1..3 {
        std::fs::remove_dir_all(cluster.data_dir(i)).unwrap();
    }
    let p = cluster.spawn_with(survivor, &["--force-new-cluster"]);
    assert!(
        p.wait_for_log("ready to serve client requests", Duration::from_secs(30))
            .is_some(),
        "{}",
        p.log_text()
    );
    let list = members_of(&cluster.endpoint(survivor)).await;
    assert_eq!(list.len(), 1, "{list:?}");
    let mut c = client(&[cluster.endpoint(survivor)]).await;
    let got = c
        .get(
            "k/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(got.count(), 100, "the survivor keeps its data");
    // the lost members can never come back
    for id in lost {
        let (code, _) = status_of(c.member_remove(id).await.unwrap_err());
        assert_eq!(code, Code::NotFound);
    }
    // grow back to three, on new addresses
    for _ in 0..2 {
        let i = cluster.reserve();
        add_member(&cluster, &cluster.peer_url(i), false).await;
        cluster.join(i);
    }
    members_agree(&cluster, 3).await;
    hashes_converge(&cluster).await;
}

/// A membership change through any member, tolerating every failure (a
/// member it went through may be killed meanwhile).
async fn try_change(endpoints: Vec<String>, change: &'static str, arg: u64, url: String) {
    let Ok(mut c) = Client::connect(&endpoints, None).await else {
        return;
    };
    let call = async {
        match change {
            "add-learner" => c
                .member_add(
                    [url.as_str()],
                    Some(MemberAddOptions::new().with_is_learner()),
                )
                .await
                .map(|_| ()),
            "promote" => c.member_promote(arg).await.map(|_| ()),
            _ => c.member_remove(arg).await.map(|_| ()),
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), call).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_membership_changes_leaves_every_member_with_one_configuration() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    eprintln!("seed {seed}");
    let mut rng = seed;
    let mut next = move |n: u64| {
        // xorshift: enough to spread kill points and victims
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut cluster = Cluster::start(3, &[]);
    let mut c = client(&cluster.endpoints()).await;
    // past the strict reconfig check's 5 s of connectivity
    add_member(&cluster, "http://127.0.0.1:1", true).await;
    let first = lists_agree(&cluster, |l| l.len() == 4).await;
    let mut learner = first.iter().find(|m| m.2).map(|m| m.0);
    for round in 0..6u64 {
        let (change, arg) = match learner {
            Some(id) => ("remove", id),
            None => ("add-learner", 0),
        };
        let url = format!("http://127.0.0.1:{}", 10 + round);
        let task = tokio::spawn(try_change(cluster.endpoints(), change, arg, url));
        tokio::time::sleep(Duration::from_millis(next(300))).await;
        let victim = next(3) as usize;
        cluster.kill9(victim);
        let _ = task.await;
        cluster.restart(victim);
        // one configuration on every member, whatever the change became
        let list = lists_agree(&cluster, |l| {
            l.iter().filter(|m| !m.2).count() == 3 && l.iter().filter(|m| m.2).count() <= 1
        })
        .await;
        learner = list.iter().find(|m| m.2).map(|m| m.0);
        // and it still commits writes
        let deadline = Instant::now() + CHANGE_DEADLINE;
        while c.put(format!("round/{round}"), "v", None).await.is_err() {
            assert!(Instant::now() < deadline, "round {round}: no write commits");
            c = client(&cluster.endpoints()).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // a removed ID never comes back
        if change == "remove" && learner.is_none() {
            let (code, _) = status_of(c.member_remove(arg).await.unwrap_err());
            assert_eq!(code, Code::NotFound);
        }
    }
    // a new member still joins, and is promoted under a kill of another
    let i = cluster.reserve();
    if let Some(id) = learner {
        remove_member(&cluster, id, &cluster.endpoints()).await;
    }
    let id = add_member(&cluster, &cluster.peer_url(i), true).await;
    cluster.join(i);
    let task = tokio::spawn(try_change(
        cluster.endpoints(),
        "promote",
        id,
        String::new(),
    ));
    tokio::time::sleep(Duration::from_millis(next(300))).await;
    let victim = next(3) as usize;
    cluster.kill9(victim);
    let _ = task.await;
    cluster.restart(victim);
    let list = lists_agree(&cluster, |l| l.len() == 4).await;
    if list.iter().any(|m| m.0 == id && m.2) {
        promote(&cluster, id).await;
    }
    members_agree(&cluster, 4).await;
    hashes_converge(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_member_checks_its_initial_cluster_against_the_running_one() {
    let mut cluster = Cluster::start(1, &[]);
    let i = cluster.reserve();
    add_member(&cluster, &cluster.peer_url(i), true).await;
    let me = format!("{}={}", cluster.names[i], cluster.peer_url(i));
    let running = format!("{}={}", cluster.names[0], cluster.peer_url(0));
    // a member the running cluster does not have
    let extra = format!("{running},{me},m9=http://127.0.0.1:9");
    let p = cluster.spawn_joining(i, &extra);
    let status = p.wait_exit(Duration::from_secs(20));
    assert_ne!(status.and_then(|s| s.code()), Some(0));
    assert!(
        p.log_text().contains("member count is unequal"),
        "{}",
        p.log_text()
    );
    cluster.members[i] = None;
    // a peer URL the running cluster does not have
    let wrong = format!("{running},{}=http://127.0.0.1:9", cluster.names[i]);
    let spec = wrong.replace(
        "http://127.0.0.1:9",
        &cluster.peer_url(i).replace("2380", "2381"),
    );
    let p = cluster.spawn_joining(i, &spec);
    let status = p.wait_exit(Duration::from_secs(20));
    assert_ne!(status.and_then(|s| s.code()), Some(0));
    assert!(
        p.log_text().contains("no match found for existing member"),
        "{}",
        p.log_text()
    );
    cluster.members[i] = None;
    // nothing was written: with the right flags it joins on the same dir
    cluster.join(i);
    let list = lists_agree(&cluster, |l| l.len() == 2).await;
    assert!(list.iter().any(|m| m.1 == cluster.names[i] && m.2));
}
