//! Migration both ways (issue 19): a cluster moves from etcd (3.5.16 and
//! 3.4.23) to a 3-member oxcd cluster with `etcdctl snapshot save` + `oxctl
//! snapshot restore`, and from a 3-member oxcd cluster back to etcd 3.5.16
//! with `etcdctl snapshot save` + `etcdutl snapshot restore`.
//!
//! Each test loads the same history on the source (puts, overwrites,
//! deletes, txns with several ops, leases with keys and explicit IDs, a
//! lease revoked, a physical compaction on a tombstone in the middle, users
//! and roles with permissions, a NOSPACE alarm), saves a snapshot with the
//! reference's own etcdctl, restores it on the other side and compares,
//! between the etcd and every oxcd member: Range of all keys at every
//! revision from below the compaction to beyond the head (value,
//! create/mod revision, version, lease of every key; the compacted and
//! future-revision errors), a watch from around the compaction, HashKV at 0
//! and at every revision, LeaseLeases and LeaseTimeToLive, users, roles and
//! permissions, AuthStatus, alarms; then that writes are refused under the
//! alarm and go on from the same revision once it is disarmed, and that
//! the passwords came along (auth enabled at the very end on both sides).
//! `oxctl snapshot status` and `etcdutl snapshot status` must read each
//! snapshot file alike.
//!
//! HashKV at exactly the compaction's revision depends on where the
//! compaction ran (see [`compare_members`]); each test has the right etcd
//! for it: the same file restored into etcd 3.5.16 (etcd → oxcd), an etcd
//! 3.5.16 given the same history (oxcd → etcd, which also compares the
//! oxcd members with that etcd, and the two snapshots' bucket entries).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use api::etcdserverpb::auth_client::AuthClient;
use api::etcdserverpb::{AuthStatusRequest, AuthenticateRequest};
use etcd_client::{
    AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions, Compare, CompareOp,
    DeleteOptions, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, Permission, PutOptions,
    Txn, TxnOp, WatchOptions,
};
use testkit::{Cluster, Process, ETCD_34};

mod common;
use common::client;

const ETCD_3516: (&str, &str) = ("/opt/etcd-3.5.16/etcd", "/opt/etcd-3.5.16/etcdctl");
const ETCDUTL_3516: &str = "/opt/etcd-3.5.16/etcdutl";

/// The leases of the history: (ID, TTL). The last one is revoked.
const LEASES: [(i64, i64); 4] = [(0x1111, 600), (0x2222, 900), (0x3333, 1200), (0x4444, 300)];

/// How far apart the remaining TTLs of one lease may be on two servers
/// (a restore starts the leases afresh, as etcd's does; the test's runtime
/// separates them).
const TTL_TOLERANCE: i64 = 30;

/// The member ID the history's alarm names.
const ALARM_MEMBER: u64 = 0xa1a2a3a4a5a6a7a8;

/// What the history left to compare against.
struct History {
    /// The physical compaction's revision (on a tombstone).
    compact: i64,
    /// The revision of the last write.
    last: i64,
}

fn installed(paths: &[&str]) -> bool {
    let missing: Vec<&&str> = paths.iter().filter(|p| !Path::new(p).exists()).collect();
    if !missing.is_empty() {
        eprintln!(
            "not installed: {missing:?} (REF_ETCD=3.5.16 ../shared/tools/ref-etcd; \
             etcd 3.4.23 from Debian): skipped"
        );
    }
    missing.is_empty()
}

fn rev_of(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.expect("a response header").revision()
}

/// The history, the same whichever server it runs on.
async fn load_history(c: &mut Client) -> History {
    c.put("a", "1", None).await.unwrap();
    c.put("b", "1", None).await.unwrap();
    c.put("c", "1", None).await.unwrap();
    c.put("a", "2", None).await.unwrap();
    c.put("d", "1", None).await.unwrap();
    c.delete("b", None).await.unwrap();
    for (id, ttl) in LEASES {
        c.lease_grant(ttl, Some(LeaseGrantOptions::new().with_id(id)))
            .await
            .unwrap();
    }
    let with = |id| Some(PutOptions::new().with_lease(id));
    c.put("l/1", "x", with(0x1111)).await.unwrap();
    c.put("l/2", "y", with(0x1111)).await.unwrap();
    c.put("l/3", "z", with(0x2222)).await.unwrap();
    let txn = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "2")])
        .and_then([
            TxnOp::put("a", "3", None),
            TxnOp::put("e", "1", None),
            TxnOp::delete("c", None),
            TxnOp::put("l/4", "w", with(0x2222)),
        ])
        .or_else([TxnOp::put("never", "1", None)]);
    assert!(c.txn(txn).await.unwrap().succeeded());
    for i in 1..=3 {
        c.put(format!("x/{i}"), format!("{i}"), None).await.unwrap();
    }
    // compact right on a tombstone (3.5.16 keeps it, 3.4 drops it)
    let compact = rev_of(c.delete("d", None).await.unwrap().header());
    c.compact(compact, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    c.put("a", "4", None).await.unwrap();
    c.put("b", "again", None).await.unwrap();
    c.delete("l/2", None).await.unwrap();
    let txn = Txn::new()
        .when([Compare::version("e", CompareOp::Equal, 1)])
        .and_then([
            TxnOp::delete("x/", Some(DeleteOptions::new().with_prefix())),
            TxnOp::put("e", "2", None),
            TxnOp::put("f", "1", None),
            TxnOp::get("a", None),
        ]);
    assert!(c.txn(txn).await.unwrap().succeeded());
    c.put("l/1", "x2", with(0x1111)).await.unwrap();
    c.put("r/1", "1", with(0x4444)).await.unwrap();
    c.put("r/2", "2", with(0x4444)).await.unwrap();
    c.lease_revoke(0x4444).await.unwrap();
    let txn = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "nope")])
        .and_then([TxnOp::put("never", "1", None)])
        .or_else([TxnOp::put("g", "1", None), TxnOp::put("a", "5", None)]);
    assert!(!c.txn(txn).await.unwrap().succeeded());
    let last = rev_of(c.put("empty", "", None).await.unwrap().header());

    // auth state, auth left disabled (root exists so it can be enabled at
    // the end of the test)
    for role in ["reader", "writer", "nothing", "root"] {
        c.role_add(role).await.unwrap();
    }
    c.role_grant_permission("reader", Permission::read("a"))
        .await
        .unwrap();
    c.role_grant_permission("reader", Permission::read("l/").with_prefix())
        .await
        .unwrap();
    c.role_grant_permission("writer", Permission::read_write("x/").with_prefix())
        .await
        .unwrap();
    c.role_grant_permission("writer", Permission::write("z").with_from_key())
        .await
        .unwrap();
    c.role_grant_permission("writer", Permission::read("b").with_range_end("d"))
        .await
        .unwrap();
    for (user, password) in [
        ("alice", "alice-pw"),
        ("bob", "bob-pw"),
        ("carol", "carol-pw"),
        ("root", "root-pw"),
    ] {
        c.user_add(user, password, None).await.unwrap();
    }
    c.user_grant_role("alice", "reader").await.unwrap();
    c.user_grant_role("bob", "reader").await.unwrap();
    c.user_grant_role("bob", "writer").await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();

    // an alarm travels in the backend too (raised for a fixed member ID,
    // so that every server of the test holds the same one)
    let mut options = AlarmOptions::new();
    options.with_member(ALARM_MEMBER);
    c.alarm(AlarmAction::Activate, AlarmType::Nospace, Some(options))
        .await
        .unwrap();
    History { compact, last }
}

/// A gRPC error as its message (what a client sees of it).
fn message(e: etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        other => other.to_string(),
    }
}

/// key, value, create revision, mod revision, version, lease
type Row = (String, String, i64, i64, i64, i64);

/// event type (0 put, 1 delete), the event's KeyValue
type EventRow = (i32, Row);

/// hash, compact revision, header revision
type HashView = (u32, i64, i64);

#[derive(Debug, PartialEq)]
struct RangeView {
    header_revision: i64,
    count: i64,
    more: bool,
    kvs: Vec<Row>,
}

#[derive(Debug, PartialEq)]
struct TtlView {
    id: i64,
    ttl: i64,
    granted: i64,
    keys: Vec<String>,
}

/// Everything the tests compare, as one server answers it.
#[derive(Debug)]
struct View {
    /// (what was asked, the answer)
    ranges: Vec<(String, Result<RangeView, String>)>,
    /// revision asked → (hash, compact revision, header revision)
    hashes: Vec<(i64, Result<HashView, String>)>,
    /// start revision → the events up to the last revision, or how the
    /// watch was canceled
    watches: Vec<(i64, Result<Vec<EventRow>, String>)>,
    leases: Vec<i64>,
    ttls: Vec<TtlView>,
    users: BTreeMap<String, Vec<String>>,
    /// role → (type, key, range end)
    roles: BTreeMap<String, Vec<(i32, String, String)>>,
    /// (enabled, auth revision); None where the server has no AuthStatus
    /// (etcd 3.4)
    auth_status: Option<(bool, u64)>,
    alarms: Vec<(u64, i32)>,
}

fn row(kv: &etcd_client::KeyValue) -> Row {
    (
        String::from_utf8_lossy(kv.key()).into_owned(),
        String::from_utf8_lossy(kv.value()).into_owned(),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.lease(),
    )
}

async fn range(c: &mut Client, options: GetOptions) -> Result<RangeView, String> {
    c.get("", Some(options))
        .await
        .map(|r| RangeView {
            header_revision: rev_of(r.header()),
            count: r.count(),
            more: r.more(),
            kvs: r.kvs().iter().map(row).collect(),
        })
        .map_err(message)
}

/// The events of a watch on all keys from `start` up to `last`, or the
/// watch's cancellation.
async fn watch_from(c: &mut Client, start: i64, last: i64) -> Result<Vec<EventRow>, String> {
    let mut stream = c
        .watch(
            "",
            Some(
                WatchOptions::new()
                    .with_all_keys()
                    .with_start_revision(start),
            ),
        )
        .await
        .map_err(message)?;
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let Ok(answer) = tokio::time::timeout_at(deadline.into(), stream.message()).await else {
            return Err(format!("no event at {last} within 5 s; got {events:?}"));
        };
        let Some(r) = answer.map_err(message)? else {
            return Err(format!("watch ended; got {events:?}"));
        };
        if r.canceled() {
            return Err(format!(
                "canceled, compact revision {}: {:?}",
                r.compact_revision(),
                r.cancel_reason()
            ));
        }
        for e in r.events() {
            let kv = e.kv().expect("an event has a kv");
            events.push((e.event_type() as i32, row(kv)));
        }
        if events.last().is_some_and(|(_, kv)| kv.3 >= last) {
            return Ok(events);
        }
    }
}

/// What `endpoint` answers for the history `h` (serializable reads where
/// the server's own state is meant).
async fn observe(endpoint: &str, h: &History) -> View {
    let mut c = client(&[endpoint.to_string()]).await;
    let all = || GetOptions::new().with_all_keys().with_serializable();
    let mut ranges = Vec::new();
    let mut revisions: Vec<i64> = vec![0];
    revisions.extend((h.compact - 2).max(1)..=h.last + 1);
    for rev in &revisions {
        ranges.push((
            format!("all keys at revision {rev}"),
            range(&mut c, all().with_revision(*rev)).await,
        ));
    }
    ranges.push((
        "all keys, limit 2".into(),
        range(&mut c, all().with_limit(2)).await,
    ));
    ranges.push((
        format!("prefix l/ at revision {}, count only", h.compact),
        c.get(
            "l/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_count_only()
                    .with_revision(h.compact)
                    .with_serializable(),
            ),
        )
        .await
        .map(|r| RangeView {
            header_revision: rev_of(r.header()),
            count: r.count(),
            more: r.more(),
            kvs: r.kvs().iter().map(row).collect(),
        })
        .map_err(message),
    ));
    let mut hashes = Vec::new();
    for rev in revisions {
        let answer = c
            .hash_kv(rev)
            .await
            .map(|r| (r.hash(), r.compact_version(), rev_of(r.header())))
            .map_err(message);
        hashes.push((rev, answer));
    }
    let mut leases: Vec<i64> = c
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    leases.sort_unstable();
    let mut ttls = Vec::new();
    for (id, _) in LEASES {
        let r = c
            .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
            .await
            .unwrap();
        let mut keys: Vec<String> = r
            .keys()
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        keys.sort();
        ttls.push(TtlView {
            id: r.id(),
            ttl: r.ttl(),
            granted: r.granted_ttl(),
            keys,
        });
    }
    let mut users = BTreeMap::new();
    for user in c.user_list().await.unwrap().users().to_vec() {
        let mut roles = c.user_get(user.as_str()).await.unwrap().roles().to_vec();
        roles.sort();
        users.insert(user, roles);
    }
    let mut roles = BTreeMap::new();
    for role in c.role_list().await.unwrap().roles().to_vec() {
        let perms = c
            .role_get(role.as_str())
            .await
            .unwrap()
            .permissions()
            .iter()
            .map(|p| {
                (
                    p.get_type(),
                    String::from_utf8_lossy(p.key()).into_owned(),
                    String::from_utf8_lossy(p.range_end()).into_owned(),
                )
            })
            .collect();
        roles.insert(role, perms);
    }
    let auth_status = {
        let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
            .unwrap()
            .connect()
            .await
            .expect("connect");
        AuthClient::new(channel)
            .auth_status(AuthStatusRequest {})
            .await
            .ok()
            .map(|r| {
                let r = r.into_inner();
                (r.enabled, r.auth_revision)
            })
    };
    let mut alarms: Vec<(u64, i32)> = c
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .unwrap()
        .alarms()
        .iter()
        .map(|a| (a.member_id(), a.alarm() as i32))
        .collect();
    alarms.sort_unstable();
    let mut watches = Vec::new();
    for start in [h.compact - 1, h.compact, h.compact + 1] {
        watches.push((start, watch_from(&mut c, start, h.last).await));
    }
    View {
        ranges,
        hashes,
        watches,
        leases,
        ttls,
        users,
        roles,
        auth_status,
        alarms,
    }
}

/// One difference: what was asked, and both answers.
struct Diff {
    what: String,
    text: String,
}

/// Every difference between the reference's view and `got`'s.
fn differences(reference: &str, want: &View, name: &str, got: &View) -> Vec<Diff> {
    let mut diffs = Vec::new();
    let mut differ = |what: String, w: &dyn std::fmt::Debug, g: &dyn std::fmt::Debug| {
        diffs.push(Diff {
            text: format!("{name}: {what}:\n    {reference}: {w:?}\n    {name}: {g:?}"),
            what,
        })
    };
    for ((what, w), (_, g)) in want.ranges.iter().zip(&got.ranges) {
        if w != g {
            differ(format!("Range {what}"), w, g);
        }
    }
    for ((start, w), (_, g)) in want.watches.iter().zip(&got.watches) {
        if w != g {
            differ(format!("Watch all keys from revision {start}"), w, g);
        }
    }
    for ((rev, w), (_, g)) in want.hashes.iter().zip(&got.hashes) {
        if w != g {
            differ(hash_at(*rev), w, g);
        }
    }
    if want.leases != got.leases {
        differ("LeaseLeases".into(), &want.leases, &got.leases);
    }
    for (w, g) in want.ttls.iter().zip(&got.ttls) {
        let close = (w.ttl - g.ttl).abs() <= TTL_TOLERANCE && (w.ttl > 0) == (g.ttl > 0);
        if (w.id, w.granted, &w.keys) != (g.id, g.granted, &g.keys) || !close {
            differ(format!("LeaseTimeToLive({:#x}) with keys", w.id), w, g);
        }
    }
    if want.users != got.users {
        differ("users and their roles".into(), &want.users, &got.users);
    }
    if want.roles != got.roles {
        differ(
            "roles and their permissions".into(),
            &want.roles,
            &got.roles,
        );
    }
    if want.auth_status.is_some() && want.auth_status != got.auth_status {
        differ("AuthStatus".into(), &want.auth_status, &got.auth_status);
    }
    if want.alarms != got.alarms {
        differ("alarms".into(), &want.alarms, &got.alarms);
    }
    diffs
}

fn hash_at(rev: i64) -> String {
    format!("HashKV at revision {rev}")
}

/// The differences of every oxcd member from `source` (the server the
/// history ran on, or the one it was restored into), except HashKV at
/// exactly the compaction's revision, compared with `counterpart` instead.
///
/// That one answer depends on where the compaction ran, not on the data:
/// etcd 3.5.16 answers HashKV at a compaction's revision with the hash it
/// recorded while compacting (hashStorage: in memory, lost on a restart or
/// a restore), a member restored from a snapshot computes it from the
/// file, and etcd 3.4 refuses it as compacted (its rule is `rev <=
/// compactRev`). So a restored oxcd member answers it as a restored etcd
/// 3.5.16 does, and the oxcd member the history ran on as the etcd 3.5.16
/// the history ran on.
fn compare_members(
    source: (&str, &View),
    counterpart: (&str, &View),
    members: &[(String, View)],
    h: &History,
) -> Vec<String> {
    let at_compact = hash_at(h.compact);
    let mut diffs = Vec::new();
    for (name, got) in members {
        diffs.extend(
            differences(source.0, source.1, name, got)
                .into_iter()
                .filter(|d| d.what != at_compact)
                .map(|d| d.text),
        );
        diffs.extend(
            differences(counterpart.0, counterpart.1, name, got)
                .into_iter()
                .filter(|d| d.what == at_compact)
                .map(|d| d.text),
        );
    }
    diffs
}

/// Sanity of the reference's own view: the comparison means something.
fn check_reference(view: &View, h: &History) {
    let at = |rev: i64| {
        view.ranges
            .iter()
            .find(|(what, _)| *what == format!("all keys at revision {rev}"))
            .map(|(_, r)| r)
            .unwrap()
    };
    assert!(at(h.compact - 1).is_err(), "compacted below {}", h.compact);
    assert!(at(h.last + 1).is_err(), "future revision");
    assert!(at(h.compact).as_ref().unwrap().kvs.len() > 5);
    assert!(at(h.last).as_ref().unwrap().kvs.len() > 5);
    assert!(view.hashes.iter().filter(|(_, r)| r.is_ok()).count() > 5);
    assert_eq!(view.leases, [0x1111, 0x2222, 0x3333]);
    assert_eq!(view.users.len(), 4);
    assert_eq!(view.roles["writer"].len(), 3);
    assert_eq!(view.alarms, [(ALARM_MEMBER, AlarmType::Nospace as i32)]);
}

/// Runs a reference binary; stdout, or a panic naming what failed.
fn run(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    assert!(
        out.status.success(),
        "{bin} {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `oxctl` in process; stdout on success, the error line on failure.
fn oxctl(args: &[&str]) -> Result<String, String> {
    let mut out = Vec::new();
    let argv = std::iter::once("oxctl").chain(args.iter().copied());
    match oxctl::run(argv, &mut out) {
        Ok(()) => Ok(String::from_utf8(out).expect("utf-8 output")),
        Err(e) => Err(e.to_string()),
    }
}

/// `oxctl snapshot status` and `etcdutl snapshot status` (3.5.16) of the
/// same file: equal hash, revision, total keys and size. Returns it.
fn statuses_agree(path: &Path, h: &History) -> serde_json::Value {
    let file = path.to_str().unwrap();
    let ours: serde_json::Value = serde_json::from_str(
        oxctl(&["snapshot", "status", file, "-w", "json"])
            .unwrap_or_else(|e| panic!("oxctl snapshot status: {e}"))
            .trim(),
    )
    .unwrap();
    let theirs: serde_json::Value =
        serde_json::from_str(run(ETCDUTL_3516, &["snapshot", "status", file, "-w", "json"]).trim())
            .unwrap();
    assert_eq!(
        ours, theirs,
        "snapshot status of {file}: oxctl (left), etcdutl 3.5.16 (right)"
    );
    assert_eq!(ours["revision"], h.last, "{ours}");
    ours
}

/// `etcdctl snapshot save` with the given etcdctl.
fn save(etcdctl: &str, host_port: &str, path: &Path) {
    let out = run(
        etcdctl,
        &[
            "--endpoints",
            host_port,
            "snapshot",
            "save",
            path.to_str().unwrap(),
        ],
    );
    assert!(out.contains("Snapshot saved at"), "{out}");
}

/// Waits until every member has applied what member 0 has committed.
async fn cluster_settles(cluster: &Cluster) {
    let mut c = client(&[cluster.endpoint(0)]).await;
    let target = c.status().await.unwrap().raft_index();
    let deadline = Instant::now() + Duration::from_secs(20);
    for endpoint in cluster.endpoints() {
        let mut c = client(std::slice::from_ref(&endpoint)).await;
        loop {
            let applied = c.status().await.unwrap().raft_applied_index();
            if applied >= target {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{endpoint} applied {applied} < {target}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Both go on alike: a write is refused under the migrated NOSPACE alarm
/// with etcd's error; once the alarm is disarmed, writes go on from the
/// snapshot's revision (a leased key's too) and every member holds them.
async fn writes_go_on_alike(reference: &str, cluster: &Cluster, h: &History) -> Vec<String> {
    async fn go_on(endpoint: &str) -> Vec<Result<i64, String>> {
        let mut c = client(&[endpoint.to_string()]).await;
        let mut out = vec![c
            .put("after", "1", None)
            .await
            .map(|r| rev_of(r.header()))
            .map_err(message)];
        let mut options = AlarmOptions::new();
        options.with_member(ALARM_MEMBER);
        c.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))
            .await
            .unwrap();
        out.push(
            c.put("after", "1", None)
                .await
                .map(|r| rev_of(r.header()))
                .map_err(message),
        );
        out.push(
            c.put("l/5", "v", Some(PutOptions::new().with_lease(0x2222)))
                .await
                .map(|r| rev_of(r.header()))
                .map_err(message),
        );
        out
    }
    let want = go_on(reference).await;
    assert_eq!(want[1], Ok(h.last + 1), "{want:?}");
    let got = go_on(&cluster.endpoint(0)).await;
    let mut diffs = Vec::new();
    if got != want {
        diffs.push(format!(
            "put under the alarm, disarm, put, leased put:\n    reference: {want:?}\n    \
             oxcd: {got:?}"
        ));
    }
    let all = || GetOptions::new().with_all_keys().with_serializable();
    let want = range(&mut client(&[reference.to_string()]).await, all()).await;
    for endpoint in cluster.endpoints() {
        let mut c = client(std::slice::from_ref(&endpoint)).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = loop {
            let got = range(&mut c, all()).await;
            if got == want || Instant::now() >= deadline {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if got != want {
            diffs.push(format!(
                "{endpoint}: all keys after the new writes:\n    reference: {want:?}\n    \
                 {endpoint}: {got:?}"
            ));
        }
    }
    diffs
}

/// The passwords came along: with auth enabled on both sides, each user
/// logs in with its password and not with another one, as on the reference.
async fn passwords_agree(reference: &str, endpoints: &[String]) -> Vec<String> {
    async fn enable(endpoint: &str) {
        client(&[endpoint.to_string()])
            .await
            .auth_enable()
            .await
            .unwrap_or_else(|e| panic!("auth enable on {endpoint}: {e}"));
    }
    async fn logins(endpoint: &str) -> Vec<Result<(), String>> {
        let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
            .unwrap()
            .connect()
            .await
            .expect("connect");
        let mut auth = AuthClient::new(channel);
        let mut out = Vec::new();
        for (user, password) in [
            ("alice", "alice-pw"),
            ("bob", "bob-pw"),
            ("carol", "carol-pw"),
            ("root", "root-pw"),
            ("alice", "bob-pw"),
            ("nobody", "x"),
        ] {
            let r = auth
                .authenticate(AuthenticateRequest {
                    name: user.into(),
                    password: password.into(),
                })
                .await;
            out.push(
                r.map(|_| ())
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
            );
        }
        out
    }
    enable(reference).await;
    enable(&endpoints[0]).await;
    let want = logins(reference).await;
    assert!(want[..4].iter().all(Result::is_ok), "{want:?}");
    let mut diffs = Vec::new();
    for endpoint in endpoints {
        // a member applies the enable a moment later
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = loop {
            let got = logins(endpoint).await;
            if got == want || Instant::now() >= deadline {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if got != want {
            diffs.push(format!(
                "{endpoint}: Authenticate after auth enable:\n    reference: {want:?}\n    \
                 {endpoint}: {got:?}"
            ));
        }
    }
    diffs
}

/// `etcdutl snapshot restore` (3.5.16) of `snapshot` into `data_dir` as a
/// new one-member cluster, and etcd 3.5.16 started on it.
fn restore_etcd(snapshot: &Path, data_dir: &Path) -> Process {
    restore_etcd_with(snapshot, data_dir, &[])
}

/// The arguments of a restore of `snapshot` into `data_dir` as member
/// `restored` at `peer`, then `extra`: etcdutl's and oxctl's alike.
fn restore_args(snapshot: &Path, data_dir: &Path, peer: &str, extra: &[&str]) -> Vec<String> {
    let initial_cluster = format!("restored={peer}");
    [
        "snapshot",
        "restore",
        snapshot.to_str().unwrap(),
        "--name",
        "restored",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--initial-cluster",
        &initial_cluster,
        "--initial-cluster-token",
        "etcd-cluster",
        "--initial-advertise-peer-urls",
        peer,
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect()
}

/// [`restore_etcd`] with `extra` flags to etcdutl's restore.
fn restore_etcd_with(snapshot: &Path, data_dir: &Path, extra: &[&str]) -> Process {
    let peer = format!("http://127.0.0.1:{}", testkit::free_port());
    let initial_cluster = format!("restored={peer}");
    let args = restore_args(snapshot, data_dir, &peer, extra);
    run(
        ETCDUTL_3516,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // the restored name and peer URL (the helper's own peer flags come
    // first; etcd takes the last of a repeated flag)
    testkit::start_reference_etcd_with(
        ETCD_3516.0,
        data_dir,
        "http",
        &[
            "--name",
            "restored",
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &initial_cluster,
        ],
    )
    .expect("etcd 3.5.16")
}

/// Two etcd members that hold the same data, one of them restored from a
/// snapshot of the other's history, answer alike but for HashKV at the
/// compaction's revision (see [`compare_members`]): every other difference.
fn references_agree(a: (&str, &View), b: (&str, &View), h: &History) -> Vec<String> {
    let at_compact = hash_at(h.compact);
    let diffs = differences(a.0, a.1, b.0, b.1);
    assert!(
        diffs.iter().any(|d| d.what == at_compact),
        "{} and {} answer HashKV at the compaction's revision alike",
        a.0,
        b.0
    );
    diffs
        .into_iter()
        .filter(|d| d.what != at_compact)
        .map(|d| d.text)
        .collect()
}

/// Every member's view of the history.
async fn observe_members(cluster: &Cluster, h: &History) -> Vec<(String, View)> {
    let mut views = Vec::new();
    for endpoint in cluster.endpoints() {
        let view = observe(&endpoint, h).await;
        views.push((format!("oxcd {endpoint}"), view));
    }
    views
}

/// etcd (`bin`, its `etcdctl`) → a 3-member oxcd cluster restored by oxctl.
async fn etcd_to_oxcd(version: &str, (bin, etcdctl): (&str, &str)) {
    let dir = tempfile::tempdir().unwrap();
    let etcd = testkit::start_reference_etcd(bin, &dir.path().join("etcd")).expect("etcd");
    let mut c = client(std::slice::from_ref(&etcd.endpoint)).await;
    let h = load_history(&mut c).await;
    let snapshot = dir.path().join("etcd.db");
    save(etcdctl, etcd.host_port(), &snapshot);
    statuses_agree(&snapshot, &h);

    let mut cluster = Cluster::prepare(3, &[]);
    for i in 0..3 {
        let args = cluster.restore_args(i, &snapshot);
        oxctl(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .unwrap_or_else(|e| panic!("oxctl snapshot restore for m{i}: {e}"));
    }
    cluster.start_all();
    // the same file restored into etcd 3.5.16: the counterpart of a
    // restored oxcd member for HashKV at the compaction's revision
    let restored = restore_etcd(&snapshot, &dir.path().join("restored"));

    let source = format!("etcd {version}");
    let want = observe(&etcd.endpoint, &h).await;
    check_reference(&want, &h);
    let counterpart = observe(&restored.endpoint, &h).await;
    let mut diffs = references_agree(
        (&source, &want),
        ("etcd 3.5.16 (restored)", &counterpart),
        &h,
    );
    let members = observe_members(&cluster, &h).await;
    diffs.extend(compare_members(
        (&source, &want),
        ("etcd 3.5.16 (restored)", &counterpart),
        &members,
        &h,
    ));
    diffs.extend(writes_go_on_alike(&etcd.endpoint, &cluster, &h).await);
    diffs.extend(passwords_agree(&etcd.endpoint, &cluster.endpoints()).await);
    assert!(
        diffs.is_empty(),
        "{source} → oxcd: {} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_3_5_16_moves_to_a_three_member_oxcd_cluster() {
    if installed(&[ETCD_3516.0, ETCD_3516.1, ETCDUTL_3516]) {
        etcd_to_oxcd("3.5.16", ETCD_3516).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_3_4_23_moves_to_a_three_member_oxcd_cluster() {
    if installed(&[ETCD_34.0, ETCD_34.1, ETCD_3516.0, ETCDUTL_3516]) {
        etcd_to_oxcd("3.4.23", ETCD_34).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_oxcd_cluster_moves_back_to_etcd_3_5_16() {
    if !installed(&[ETCD_3516.0, ETCD_3516.1, ETCDUTL_3516]) {
        return;
    }
    let cluster = Cluster::start(3, &[]);
    let mut c = client(&[cluster.endpoint(0)]).await;
    let h = load_history(&mut c).await;
    cluster_settles(&cluster).await;

    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("oxcd.db");
    save(ETCD_3516.1, &format!("{}:2379", cluster.ips[1]), &snapshot);
    let ours = statuses_agree(&snapshot, &h);
    let etcd = restore_etcd(&snapshot, &dir.path().join("restored"));
    // etcd 3.5.16 with the same history, never restored: what the oxcd
    // members (where the history ran) must answer as well
    let twin =
        testkit::start_reference_etcd(ETCD_3516.0, &dir.path().join("twin")).expect("etcd 3.5.16");
    let twin_history = load_history(&mut client(std::slice::from_ref(&twin.endpoint)).await).await;
    assert_eq!(
        (twin_history.compact, twin_history.last),
        (h.compact, h.last)
    );
    let mut diffs = Vec::new();
    // its snapshot has the same entries in every bucket as ours, but for
    // the members (one there, three here). (etcd 3.5.16's compaction keeps
    // the tombstone at exactly the compact revision in its backend; a watch
    // from that revision delivers it: oxcd's must keep it too.)
    let twin_snapshot = dir.path().join("twin.db");
    save(ETCD_3516.1, twin.host_port(), &twin_snapshot);
    let theirs = statuses_agree(&twin_snapshot, &h);
    let entries = |status: &serde_json::Value| status["totalKey"].as_i64().unwrap();
    if entries(&ours) != entries(&theirs) + 2 {
        diffs.push(format!(
            "snapshot status: total keys of the oxcd snapshot (3 members) and of etcd \
             3.5.16's with the same history (1 member):\n    oxcd: {ours}\n    \
             etcd 3.5.16: {theirs}"
        ));
    }

    let reference = "etcd 3.5.16 (restored)";
    let twin_name = "etcd 3.5.16 (same history)";
    let want = observe(&etcd.endpoint, &h).await;
    check_reference(&want, &h);
    let counterpart = observe(&twin.endpoint, &h).await;
    check_reference(&counterpart, &h);
    diffs.extend(references_agree(
        (twin_name, &counterpart),
        (reference, &want),
        &h,
    ));
    let members = observe_members(&cluster, &h).await;
    diffs.extend(compare_members(
        (reference, &want),
        (twin_name, &counterpart),
        &members,
        &h,
    ));
    let at_compact = hash_at(h.compact);
    for (name, got) in &members {
        diffs.extend(
            differences(twin_name, &counterpart, name, got)
                .into_iter()
                .filter(|d| d.what != at_compact)
                .map(|d| d.text),
        );
    }
    diffs.extend(writes_go_on_alike(&etcd.endpoint, &cluster, &h).await);
    diffs.extend(passwords_agree(&etcd.endpoint, &cluster.endpoints()).await);
    assert!(
        diffs.is_empty(),
        "oxcd → {reference}: {} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// `oxctl migrate` of a stopped etcd member (issue 19, item 3): etcd
/// (`bin`) runs the history with a backend that commits only when it must
/// (a snapshot, its stop) and is killed with -9, so that its WAL holds
/// committed entries above the backend's consistent index. A copy of the
/// dir is restarted by the same etcd (which replays them); the dir itself
/// is migrated in place and started as oxcd, which must replay them too
/// and answer alike: every range, HashKV, watch, lease, user, role and
/// alarm, the member and cluster IDs, the membership, the passwords.
/// `snapshot_count` small makes etcd write raft snapshots, so the log
/// starts from one; etcd 3.4 with the default keeps its whole log, with
/// its v2 publish of the member's attributes.
async fn etcd_dir_migrates(version: &str, (bin, etcdctl): (&str, &str), snapshot_count: &str) {
    let dir = tempfile::tempdir().unwrap();
    let etcd_dir = dir.path().join("etcd");
    let mut etcd = testkit::start_reference_etcd_with(
        bin,
        &etcd_dir,
        "http",
        &[
            "--snapshot-count",
            snapshot_count,
            "--backend-batch-interval",
            "1h",
            "--backend-batch-limit",
            "1000000",
        ],
    )
    .expect("etcd");
    let mut c = client(std::slice::from_ref(&etcd.endpoint)).await;
    let h = load_history(&mut c).await;
    drop(c);
    let source_ids = run(
        etcdctl,
        &[
            "--endpoints",
            etcd.host_port(),
            "endpoint",
            "status",
            "-w",
            "json",
        ],
    );
    // never under a running etcd
    let running = oxctl(&["migrate", "--data-dir", etcd_dir.to_str().unwrap()]).unwrap_err();
    assert!(running.contains("etcd is still running"), "{running}");
    etcd.kill9();
    // oxcd refuses etcd's dir, naming the command that converts it
    let mut refused = testkit::Process::launch_oxcd(&testkit::oxcd_bin(), &etcd_dir, &[]);
    let status = refused.wait_exit(Duration::from_secs(30));
    assert!(status.is_some_and(|s| !s.success()), "oxcd on an etcd dir");
    assert!(
        refused.log_text().contains("oxctl migrate --data-dir"),
        "{}",
        refused.log_text()
    );

    // running etcd's lock is gone with it; a copy for the reference
    let twin_dir = dir.path().join("twin");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&etcd_dir)
        .arg(&twin_dir)
        .status()
        .unwrap();
    assert!(copied.success());

    let report = oxctl(&["migrate", "--data-dir", etcd_dir.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("oxctl migrate: {e}"));
    let replayed: u64 = report
        .split("a start applies ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no replay count in {report:?}"));
    assert!(
        replayed > 0,
        "the test needs entries above the consistent index: {report}"
    );
    assert!(etcd_dir.join("member.etcd/snap/db").exists(), "{report}");
    // a second run refuses: the dir is oxcd's now
    let again = oxctl(&["migrate", "--data-dir", etcd_dir.to_str().unwrap()]).unwrap_err();
    assert!(again.contains("oxcd data dir already"), "{again}");

    let oxcd =
        testkit::Process::start_oxcd(&testkit::oxcd_bin(), &etcd_dir, &["--name", "default"]);
    let twin = testkit::start_reference_etcd(bin, &twin_dir).expect("etcd");

    let source = format!("etcd {version} (restarted on a copy)");
    let want = observe(&twin.endpoint, &h).await;
    check_reference(&want, &h);
    let got = observe(&oxcd.endpoint, &h).await;
    // etcd 3.4 refuses HashKV at the compaction's revision (its rule is
    // `rev <= compactRev`); 3.5.16 and oxcd answer it
    let at_compact = hash_at(h.compact);
    let mut diffs: Vec<String> = differences(&source, &want, "oxcd (migrated)", &got)
        .into_iter()
        .filter(|d| version != "3.4.23" || d.what != at_compact)
        .map(|d| d.text)
        .collect();

    // the same member of the same cluster, with the same membership
    let ids = |status: &str| {
        let v: serde_json::Value = serde_json::from_str(status.trim()).unwrap();
        let header = &v[0]["Status"]["header"];
        (header["cluster_id"].clone(), header["member_id"].clone())
    };
    let theirs = ids(&source_ids);
    let ours = ids(&run(
        ETCD_3516.1,
        &[
            "--endpoints",
            oxcd.host_port(),
            "endpoint",
            "status",
            "-w",
            "json",
        ],
    ));
    if theirs != ours {
        diffs.push(format!(
            "(cluster ID, member ID): etcd {theirs:?}, oxcd {ours:?}"
        ));
    }
    let members = |endpoint: &str| {
        let out = run(
            ETCD_3516.1,
            &["--endpoints", endpoint, "member", "list", "-w", "json"],
        );
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["ID"].clone(), m["name"].clone(), m["peerURLs"].clone()))
            .collect::<Vec<_>>()
    };
    let (want_members, got_members) = (members(twin.host_port()), members(oxcd.host_port()));
    if want_members != got_members {
        diffs.push(format!(
            "member list: etcd {want_members:?}, oxcd {got_members:?}"
        ));
    }
    diffs.extend(passwords_agree(&twin.endpoint, std::slice::from_ref(&oxcd.endpoint)).await);
    assert!(
        diffs.is_empty(),
        "{source} → oxcd by oxctl migrate: {} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_etcd_3_5_16_member_is_migrated_in_place() {
    if installed(&[ETCD_3516.0, ETCD_3516.1]) {
        etcd_dir_migrates("3.5.16", ETCD_3516, "25").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_etcd_3_4_23_member_is_migrated_in_place() {
    if installed(&[ETCD_34.0, ETCD_34.1, ETCD_3516.1]) {
        etcd_dir_migrates("3.4.23", ETCD_34, "100000").await;
    }
}

/// etcdutl 3.5.16's `snapshot restore --bump-revision N --mark-compacted`
/// and oxctl's, of the same etcd snapshot: both servers start at the
/// bumped revision with everything below it compacted (reads, watches and
/// HashKV alike), and the next write takes the revision after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_bumps_the_revision_and_marks_it_compacted_as_etcdutl_does() {
    if !installed(&[ETCD_3516.0, ETCD_3516.1, ETCDUTL_3516]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = testkit::start_reference_etcd(ETCD_3516.0, &dir.path().join("etcd")).unwrap();
    let h = load_history(&mut client(std::slice::from_ref(&source.endpoint)).await).await;
    let snapshot = dir.path().join("etcd.db");
    save(ETCD_3516.1, source.host_port(), &snapshot);
    let bump = ["--bump-revision", "1000", "--mark-compacted"];
    let etcd = restore_etcd_with(&snapshot, &dir.path().join("restored"), &bump);
    let data = dir.path().join("oxcd");
    let peer = format!("http://127.0.0.1:{}", testkit::free_port());
    let args = restore_args(&snapshot, &data, &peer, &bump);
    oxctl(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let oxcd = testkit::Process::start_oxcd(
        &testkit::oxcd_bin(),
        &data,
        &[
            "--name",
            "restored",
            "--initial-cluster",
            &format!("restored={peer}"),
        ],
    );

    async fn answers(endpoint: &str, h: &History) -> Vec<String> {
        let mut c = client(&[endpoint.to_string()]).await;
        let mut out = Vec::new();
        let r = c.get("a", None).await.unwrap();
        out.push(format!(
            "get a: revision {} {:?}",
            rev_of(r.header()),
            r.kvs().iter().map(row).collect::<Vec<_>>()
        ));
        for rev in [h.last, h.last + 999, h.last + 1000] {
            let r = c.get("a", Some(GetOptions::new().with_revision(rev))).await;
            out.push(format!(
                "get a at {rev}: {:?}",
                r.map(|r| r.kvs().iter().map(row).collect::<Vec<_>>())
                    .map_err(message)
            ));
        }
        for rev in [0, h.last + 1000] {
            let r = c.hash_kv(rev).await;
            out.push(format!(
                "hashkv at {rev}: {:?}",
                r.map(|r| (r.hash(), r.compact_version(), rev_of(r.header())))
                    .map_err(message)
            ));
        }
        let w = watch_from(&mut c, h.last, h.last + 1001).await;
        out.push(format!("watch from {}: {w:?}", h.last));
        // the history's NOSPACE alarm came along: disarmed, writes go on
        let mut options = AlarmOptions::new();
        options.with_member(ALARM_MEMBER);
        c.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))
            .await
            .unwrap();
        let r = c.put("next", "1", None).await.unwrap();
        out.push(format!("put: revision {}", rev_of(r.header())));
        out
    }
    let want = answers(&etcd.endpoint, &h).await;
    assert!(
        want[0].contains(&format!("revision {}", h.last + 1000)),
        "{want:?}"
    );
    let got = answers(&oxcd.endpoint, &h).await;
    assert_eq!(
        got, want,
        "oxctl (left) and etcdutl 3.5.16 (right) restores with a revision bump"
    );
}

/// `oxctl backup` (etcdutl's legacy offline backup) of a stopped oxcd
/// member, started with `--force-new-cluster`: the same keys, revisions,
/// leases and HashKV under a new member and cluster ID, one member, and
/// writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_a_stopped_member_starts_as_a_new_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut member = testkit::Process::start_oxcd(
        &testkit::oxcd_bin(),
        &data,
        &["--name", "m", "--snapshot-count", "20"],
    );
    let mut c = client(std::slice::from_ref(&member.endpoint)).await;
    for i in 0..60 {
        c.put(format!("k/{i:02}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.delete("k/07", None).await.unwrap();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("leased", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    c.compact(30, None).await.unwrap();
    let last = rev_of(c.put("k/00", "again", None).await.unwrap().header());
    let before = c.status().await.unwrap();
    async fn view(c: &mut Client, last: i64) -> Vec<String> {
        let mut out = Vec::new();
        for rev in [0, 29, 30, 45, last] {
            let r = c
                .get(
                    "",
                    Some(GetOptions::new().with_from_key().with_revision(rev)),
                )
                .await;
            out.push(format!(
                "at {rev}: {:?}",
                r.map(|r| r.kvs().iter().map(row).collect::<Vec<_>>())
                    .map_err(message)
            ));
        }
        let h = c.hash_kv(0).await.unwrap();
        out.push(format!("hashkv {} {}", h.hash(), h.compact_version()));
        let leases = c.leases().await.unwrap();
        out.push(format!(
            "leases {:?}",
            leases.leases().iter().map(|l| l.id()).collect::<Vec<_>>()
        ));
        out
    }
    let want = view(&mut c, last).await;
    drop(c);
    member
        .terminate(Duration::from_secs(30))
        .expect("oxcd stops");

    let backup = dir.path().join("backup");
    let report = oxctl(&[
        "backup",
        "--data-dir",
        data.to_str().unwrap(),
        "--backup-dir",
        backup.to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("oxctl backup: {e}"));
    assert!(
        report.contains("start it with --force-new-cluster"),
        "{report}"
    );
    // the copy is refused on top of itself
    let again = oxctl(&[
        "backup",
        "--data-dir",
        data.to_str().unwrap(),
        "--backup-dir",
        backup.to_str().unwrap(),
    ])
    .unwrap_err();
    assert!(again.contains("exists"), "{again}");

    let restored = testkit::Process::start_oxcd(
        &testkit::oxcd_bin(),
        &backup,
        &["--name", "restored", "--force-new-cluster"],
    );
    let mut c = client(std::slice::from_ref(&restored.endpoint)).await;
    let got = view(&mut c, last).await;
    assert_eq!(got, want, "the backup (left) and the member (right)");
    let status = c.status().await.unwrap();
    let header = status.header().unwrap();
    let old = before.header().unwrap();
    assert_ne!(header.member_id(), old.member_id());
    assert_ne!(header.cluster_id(), old.cluster_id());
    let members = c.member_list().await.unwrap();
    assert_eq!(members.members().len(), 1, "{:?}", members.members());
    assert_eq!(members.members()[0].id(), header.member_id());
    let next = rev_of(c.put("after", "1", None).await.unwrap().header());
    assert_eq!(next, last + 1);
}

/// A client of the member at `endpoint` once it has applied `revision`
/// (a lagging member is waited for, with a deadline).
async fn caught_up(endpoint: &str, revision: i64) -> Client {
    let mut m = client(&[endpoint.to_string()]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while rev_of(m.get("x", None).await.unwrap().header()) < revision {
        assert!(
            Instant::now() < deadline,
            "{endpoint} lags behind {revision}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    m
}

/// The runbook for a whole cluster: a 3-member etcd 3.5.16 cluster under
/// writes, every member killed with -9 (entries above each backend's
/// consistent index), each data dir migrated in place, each started as
/// oxcd with its etcd flags: the same members (IDs, names, peer URLs) and
/// cluster ID, every acknowledged write, the same HashKV on every member,
/// and the cluster goes on taking writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_three_member_etcd_cluster_is_migrated_member_by_member() {
    if !installed(&[ETCD_3516.0, ETCD_3516.1]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let peers: Vec<String> = (0..3)
        .map(|_| format!("http://127.0.0.1:{}", testkit::free_port()))
        .collect();
    let initial_cluster = (0..3)
        .map(|i| format!("e{i}={}", peers[i]))
        .collect::<Vec<_>>()
        .join(",");
    let data = |i: usize| dir.path().join(format!("e{i}"));
    // each etcd waits for the others to publish: started together
    let starts: Vec<_> = (0..3)
        .map(|i| {
            let (peer, cluster, data) = (peers[i].clone(), initial_cluster.clone(), data(i));
            std::thread::spawn(move || {
                testkit::start_reference_etcd_with(
                    ETCD_3516.0,
                    &data,
                    "http",
                    &[
                        "--name",
                        &format!("e{i}"),
                        "--listen-peer-urls",
                        &peer,
                        "--initial-advertise-peer-urls",
                        &peer,
                        "--initial-cluster",
                        &cluster,
                        "--snapshot-count",
                        "40",
                        "--backend-batch-interval",
                        "1h",
                        "--backend-batch-limit",
                        "1000000",
                    ],
                )
                .expect("etcd 3.5.16")
            })
        })
        .collect();
    let mut etcds: Vec<Process> = starts.into_iter().map(|t| t.join().unwrap()).collect();
    let endpoints: Vec<String> = etcds.iter().map(|e| e.endpoint.clone()).collect();
    let mut c = client(&endpoints).await;
    for i in 0..100 {
        c.put(format!("k/{i:03}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    let lease = c.lease_grant(900, None).await.unwrap().id();
    c.put("leased", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    c.delete("k/050", None).await.unwrap();
    c.compact(60, None).await.unwrap();
    let mut last = 0;
    for i in 0..20 {
        last = rev_of(
            c.put(format!("after/{i}"), "1", None)
                .await
                .unwrap()
                .header(),
        );
    }
    // every member has applied the last write before the kill
    let mut want_members = Vec::new();
    for endpoint in &endpoints {
        let mut m = caught_up(endpoint, last).await;
        want_members = m
            .member_list()
            .await
            .unwrap()
            .members()
            .iter()
            .map(|m| (m.id(), m.name().to_string(), m.peer_urls().to_vec()))
            .collect::<Vec<_>>();
    }
    let want_keys = range(&mut c, GetOptions::new().with_from_key())
        .await
        .unwrap();
    let cluster_id = c.status().await.unwrap().header().unwrap().cluster_id();
    drop(c);
    for e in &mut etcds {
        e.kill9();
    }

    let mut replayed = 0;
    for i in 0..3 {
        let report = oxctl(&["migrate", "--data-dir", data(i).to_str().unwrap()])
            .unwrap_or_else(|e| panic!("oxctl migrate e{i}: {e}"));
        replayed += report
            .split("a start applies ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap();
    }
    assert!(
        replayed > 0,
        "no member had entries above its consistent index"
    );
    let mut members = Vec::new();
    for (i, peer) in peers.iter().enumerate() {
        let client_url = format!("http://127.0.0.1:{}", testkit::free_port());
        let name = format!("e{i}");
        let args = [
            "--name",
            &name,
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            &initial_cluster,
        ];
        members.push(testkit::Process::launch_oxcd_args(
            &testkit::oxcd_bin(),
            &data(i),
            &client_url,
            &args,
        ));
    }
    for m in &members {
        assert!(
            m.wait_for_log("ready to serve client requests", Duration::from_secs(60))
                .is_some(),
            "{}",
            m.log_text()
        );
    }
    let endpoints: Vec<String> = members.iter().map(|m| m.endpoint.clone()).collect();
    let mut c = client(&endpoints).await;
    let next = rev_of(c.put("after/oxcd", "1", None).await.unwrap().header());
    assert_eq!(next, last + 1);
    let mut hashes = Vec::new();
    for endpoint in &endpoints {
        let mut m = caught_up(endpoint, next).await;
        let got = range(
            &mut m,
            GetOptions::new().with_from_key().with_revision(last),
        )
        .await
        .unwrap();
        assert_eq!(got.kvs, want_keys.kvs, "{endpoint}: keys at {last}");
        let status = m.status().await.unwrap();
        assert_eq!(status.header().unwrap().cluster_id(), cluster_id);
        let got_members: Vec<_> = m
            .member_list()
            .await
            .unwrap()
            .members()
            .iter()
            .map(|m| (m.id(), m.name().to_string(), m.peer_urls().to_vec()))
            .collect();
        assert_eq!(got_members, want_members, "{endpoint}: members");
        let h = m.hash_kv(next).await.unwrap();
        hashes.push((h.hash(), h.compact_version()));
        assert_eq!(
            m.get("k/001", Some(GetOptions::new().with_revision(59)))
                .await
                .map_err(message)
                .unwrap_err(),
            "OutOfRange: etcdserver: mvcc: required revision has been compacted"
        );
    }
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");
}
