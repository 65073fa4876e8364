//! Faults, injected one after another while the traffic runs. Each one
//! ends with the cluster whole again: the member restarted, healed or
//! resumed, so that the next fault and the final checks start from a
//! cluster that can make progress.
//!
//! - kill -9 of the leader or a follower, then a restart;
//! - a two-way partition of the leader or a follower (its bridge port
//!   down), then heal;
//! - SIGSTOP / SIGCONT of the leader or a follower (ours: etcd's suite has
//!   sleep failpoints instead);
//! - a follower killed and restarted with its WAL's last record torn, as a
//!   crash in the middle of a write leaves it;
//! - compaction and defragmentation during the traffic;
//! - a full disk: the member's tmpfs shrunk to what it uses, then given
//!   room again (the member exits, as it must, and is restarted);
//! - crash points inside the server (failpoints armed over HTTP, in a
//!   build with the `failpoints` feature): the member aborts at that point
//!   and is restarted.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::client::{connect, Recorder};
use super::history::FaultRecord;
use crate::netns::NetnsCluster;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    KillLeader,
    KillFollower,
    PartitionLeader,
    PartitionFollower,
    PauseLeader,
    PauseFollower,
    TruncatedWalTail,
    CompactDefrag,
    DiskFull,
    CrashPoint(&'static str),
}

/// The failpoints a crash fault arms (etcd's gofail names where etcd has
/// one), and what has to happen for each to be reached.
pub const CRASH_POINTS: &[&str] = &[
    "raftBeforeSave",
    "raftAfterSave",
    "beforeCommit",
    "afterCommit",
    "compactBeforeCommitScheduledCompact",
    "compactAfterCommitScheduledCompact",
    "compactBeforeCommitBatch",
    "compactAfterCommitBatch",
    "defragBeforeCopy",
    "defragBeforeRename",
    "raftBeforeApplySnap",
    "raftAfterApplySnap",
    "raftDuringSendSnapshot",
];

impl Fault {
    pub fn name(&self) -> String {
        match self {
            Fault::KillLeader => "kill-leader".into(),
            Fault::KillFollower => "kill-follower".into(),
            Fault::PartitionLeader => "partition-leader".into(),
            Fault::PartitionFollower => "partition-follower".into(),
            Fault::PauseLeader => "pause-leader".into(),
            Fault::PauseFollower => "pause-follower".into(),
            Fault::TruncatedWalTail => "truncated-wal-tail".into(),
            Fault::CompactDefrag => "compact-defrag".into(),
            Fault::DiskFull => "disk-full".into(),
            Fault::CrashPoint(name) => format!("crash:{name}"),
        }
    }

    /// The faults any server takes (crash points need failpoints).
    pub const PLAIN: [Fault; 9] = [
        Fault::KillLeader,
        Fault::KillFollower,
        Fault::PartitionLeader,
        Fault::PartitionFollower,
        Fault::PauseLeader,
        Fault::PauseFollower,
        Fault::TruncatedWalTail,
        Fault::CompactDefrag,
        Fault::DiskFull,
    ];

    /// A fault chosen by the seed; crash points only where the server was
    /// built with failpoints.
    pub fn choose(rng: &mut fastrand::Rng, failpoints: bool) -> Fault {
        if failpoints && rng.u8(0..3) == 0 {
            return Fault::CrashPoint(CRASH_POINTS[rng.usize(0..CRASH_POINTS.len())]);
        }
        Fault::PLAIN[rng.usize(0..Fault::PLAIN.len())]
    }

    /// The fault named `name` (as [`Fault::name`] prints it).
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::PLAIN
            .into_iter()
            .chain(CRASH_POINTS.iter().map(|p| Fault::CrashPoint(p)))
            .find(|f| f.name() == name)
    }

    fn on_leader(&self) -> bool {
        matches!(
            self,
            Fault::KillLeader
                | Fault::PartitionLeader
                | Fault::PauseLeader
                | Fault::CrashPoint("raftDuringSendSnapshot")
        )
    }
}

/// The index of the member that leads, asking every member; None while
/// there is no leader (or none answered).
pub async fn leader(endpoints: &[String]) -> Option<usize> {
    let mut ids = Vec::new();
    let mut leader_id = None;
    for endpoint in endpoints {
        let mut id = 0;
        if let Some(mut client) = connect(endpoint, Duration::from_secs(1)).await {
            if let Ok(Ok(status)) =
                tokio::time::timeout(Duration::from_secs(1), client.status()).await
            {
                id = status.header().map_or(0, |h| h.member_id());
                if status.leader() != 0 {
                    leader_id = Some(status.leader());
                }
            }
        }
        ids.push(id);
    }
    let leader_id = leader_id?;
    ids.iter().position(|id| *id == leader_id)
}

/// Waits (up to 20 s) for a leader.
pub async fn wait_for_leader(endpoints: &[String]) -> Option<usize> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(i) = leader(endpoints).await {
            return Some(i);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub type SharedCluster = Arc<Mutex<NetnsCluster>>;

async fn with_cluster<R: Send + 'static>(
    cluster: &SharedCluster,
    f: impl FnOnce(&mut NetnsCluster) -> R + Send + 'static,
) -> R {
    let cluster = cluster.clone();
    tokio::task::spawn_blocking(move || f(&mut cluster.lock().expect("cluster lock")))
        .await
        .expect("cluster operation")
}

/// Injects `fault` and brings the cluster back; the record says what was
/// done to which member.
pub async fn inject(
    fault: Fault,
    cluster: &SharedCluster,
    endpoints: &[String],
    rng: &mut fastrand::Rng,
    recorder: &Recorder,
) -> FaultRecord {
    let n = endpoints.len();
    let leader = wait_for_leader(endpoints).await.unwrap_or(0);
    let member = if fault.on_leader() {
        leader
    } else {
        // a follower
        (leader + 1 + rng.usize(0..n - 1)) % n
    };
    let start = recorder.now();
    let mut pause = |min: u64, max: u64| Duration::from_millis(rng.u64(min..max));
    let detail = match fault {
        Fault::KillLeader | Fault::KillFollower => {
            with_cluster(cluster, move |c| c.kill9(member)).await;
            tokio::time::sleep(pause(200, 1500)).await;
            restart(cluster, member).await
        }
        Fault::PartitionLeader | Fault::PartitionFollower => {
            with_cluster(cluster, move |c| c.isolate(member)).await;
            tokio::time::sleep(pause(1000, 3000)).await;
            with_cluster(cluster, move |c| c.heal(member)).await;
            String::new()
        }
        Fault::PauseLeader | Fault::PauseFollower => {
            with_cluster(cluster, move |c| c.pause(member)).await;
            tokio::time::sleep(pause(500, 2500)).await;
            with_cluster(cluster, move |c| c.resume(member)).await;
            String::new()
        }
        Fault::TruncatedWalTail => {
            tokio::time::sleep(pause(0, 500)).await;
            let cut = pause(1, u64::MAX).as_millis() as u64;
            let torn = with_cluster(cluster, move |c| {
                c.kill9(member);
                tear_after_last_wal_record(&c.data_dir(member).join("member/wal"), cut)
            })
            .await;
            let restarted = restart(cluster, member).await;
            let repaired = with_cluster(cluster, move |c| {
                c.members[member]
                    .as_ref()
                    .is_some_and(|p| p.log_text().contains("repairing torn tail"))
            })
            .await;
            let repaired = if repaired {
                "; repaired on restart"
            } else {
                "; NOT repaired"
            };
            format!("{torn}{repaired}{restarted}")
        }
        Fault::CompactDefrag => compact_and_defrag(&endpoints[member], endpoints).await,
        Fault::DiskFull => disk_full(cluster, member).await,
        Fault::CrashPoint(name) => {
            let other = pause(0, endpoints.len() as u64 - 1).as_millis() as usize;
            crash_point(cluster, endpoints, member, name, other).await
        }
    };
    FaultRecord {
        kind: fault.name(),
        member: member as u32,
        start,
        end: recorder.now(),
        detail,
    }
}

/// What a fault detail says of a member that did not come back.
pub const DID_NOT_COME_BACK: &str = "; DID NOT COME BACK: ";

fn came_back(result: Result<(), String>) -> String {
    match result {
        Ok(()) => String::new(),
        Err(log) => {
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(6)..].join("\n");
            format!("{DID_NOT_COME_BACK}{tail}")
        }
    }
}

/// Restarts `member`; empty when it came back, else why not.
async fn restart(cluster: &SharedCluster, member: usize) -> String {
    with_cluster(cluster, move |c| came_back(c.try_restart(member))).await
}

/// Compacts to a revision a little behind the newest (through any member)
/// and defragments `target`.
async fn compact_and_defrag(target: &str, endpoints: &[String]) -> String {
    let timeout = Duration::from_secs(5);
    let mut detail = String::new();
    for endpoint in endpoints {
        let Some(mut client) = connect(endpoint, timeout).await else {
            continue;
        };
        let any = etcd_client::GetOptions::new()
            .with_all_keys()
            .with_count_only();
        let Ok(Ok(status)) = tokio::time::timeout(timeout, client.get("", Some(any))).await else {
            continue;
        };
        let revision = status.header().map_or(0, |h| h.revision()) - 5;
        if revision > 1 {
            let r = tokio::time::timeout(timeout, client.compact(revision, None)).await;
            detail = format!("compacted to {revision}: {}", r.is_ok_and(|r| r.is_ok()));
        }
        break;
    }
    if let Some(mut client) = connect(target, timeout).await {
        let r = tokio::time::timeout(Duration::from_secs(20), client.defragment()).await;
        detail.push_str(&format!("; defragment: {}", r.is_ok_and(|r| r.is_ok())));
    }
    detail
}

/// Shrinks the member's tmpfs to what it uses, waits for the member to
/// fail (it must exit rather than go on without a durable WAL), then gives
/// the room back and restarts it.
async fn disk_full(cluster: &SharedCluster, member: usize) -> String {
    let shrunk = with_cluster(cluster, move |c| {
        let volume = c.volume(member)?;
        let used = used_bytes(volume.path())?;
        volume.resize(&format!("{}k", used / 1024 + 4));
        Some(())
    })
    .await;
    if shrunk.is_none() {
        return "no volume: skipped".into();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut exited = false;
    while tokio::time::Instant::now() < deadline {
        if with_cluster(cluster, move |c| c.reap_if_exited(member)).await {
            exited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let restarted = with_cluster(cluster, move |c| {
        if let Some(volume) = c.volume(member) {
            volume.resize(VOLUME_SIZE);
        }
        if c.has_process(member) {
            String::new()
        } else {
            came_back(c.try_restart(member))
        }
    })
    .await;
    if exited {
        format!("the member exited on the full disk and came back{restarted}")
    } else {
        "the member kept serving on the full disk".into()
    }
}

/// The size of each member's tmpfs when disk-full faults are scheduled.
pub const VOLUME_SIZE: &str = "256m";

fn used_bytes(path: &Path) -> Option<u64> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct for a valid C path.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    (rc == 0).then(|| (stat.f_blocks - stat.f_bfree) * stat.f_frsize)
}

/// Leaves a torn write after the last record of the newest WAL segment,
/// as a crash in the middle of an append that was never synced (so never
/// acknowledged) leaves it: a record header claiming `len` payload bytes
/// (its header CRC sound) followed by only part of them. The WAL layout is
/// crates/consensus/src/wal/mod.rs's: 16-byte headers (length, payload CRC,
/// type, 3 reserved bytes, header CRC of bytes 0..12), then the payload; the
/// preallocated tail is zeros. Tearing a record that was synced would lose
/// what the member acknowledged, a fault outside raft's model (raft then
/// stops the member, as etcd does: "tocommit is out of range").
fn tear_after_last_wal_record(dir: &Path, seed: u64) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return format!("no WAL dir {}", dir.display());
    };
    let mut segments: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segments.sort();
    let Some(last) = segments.last() else {
        return "no WAL segment".into();
    };
    let Ok(bytes) = std::fs::read(last) else {
        return "unreadable WAL segment".into();
    };
    let mut offset = 0usize;
    while offset + 16 <= bytes.len() {
        let len =
            u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 && bytes[offset..offset + 16].iter().all(|b| *b == 0) {
            break;
        }
        let end = offset + 16 + len;
        if end > bytes.len() {
            break;
        }
        offset = end;
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let len = rng.usize(16..512);
    let written = rng.usize(1..len);
    let mut torn = Vec::with_capacity(16 + written);
    torn.extend_from_slice(&(len as u32).to_le_bytes());
    torn.extend_from_slice(&rng.u32(..).to_le_bytes());
    torn.extend_from_slice(&[2, 0, 0, 0]);
    let header_crc = crc32fast::hash(&torn[..12]);
    torn.extend_from_slice(&header_crc.to_le_bytes());
    torn.extend((0..written).map(|_| rng.u8(1..)));
    let Ok(file) = std::fs::OpenOptions::new().write(true).open(last) else {
        return "cannot open the WAL segment".into();
    };
    use std::os::unix::fs::FileExt;
    match file.write_all_at(&torn, offset as u64) {
        Ok(()) => format!(
            "a torn record at {}:{offset} ({written} of {len} payload bytes)",
            last.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        ),
        Err(e) => format!("cannot tear: {e}"),
    }
}

fn failpoint_request(endpoint: &str, method: &str, name: &str, body: Option<&str>) -> bool {
    crate::http::request(endpoint, method, &format!("/debug/failpoints/{name}"), body)
        .is_ok_and(|r| r.status / 100 == 2)
}

/// Arms `name` to crash `member` once, makes the server reach it, waits
/// for the crash and restarts the member.
async fn crash_point(
    cluster: &SharedCluster,
    endpoints: &[String],
    member: usize,
    name: &'static str,
    other: usize,
) -> String {
    let endpoint = endpoints[member].clone();
    // a member that installs a snapshot is one that was down: it is armed
    // from the environment when it starts again
    let on_install = name.contains("ApplySnap");
    let armed = on_install || {
        let endpoint = endpoint.clone();
        tokio::task::spawn_blocking(move || {
            failpoint_request(&endpoint, "PUT", name, Some("1*panic"))
        })
        .await
        .unwrap_or(false)
    };
    if !armed {
        return "could not arm (a server without failpoints?)".into();
    }
    // make the server reach the point
    if name.starts_with("compact") || name.starts_with("defrag") {
        compact_and_defrag(&endpoint, endpoints).await;
    } else if name.contains("Snap") {
        // a follower down long enough to need a snapshot when it comes back
        // (the cluster runs with a small --snapshot-count)
        let lagging = if name == "raftDuringSendSnapshot" {
            (member + 1 + other) % endpoints.len()
        } else {
            member
        };
        with_cluster(cluster, move |c| c.kill9(lagging)).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let restarted_lagging = with_cluster(cluster, move |c| {
            if on_install {
                let spec = format!("{name}=1*panic");
                c.spawn_with_env(lagging, &[("OXCD_FAILPOINTS", &spec)]);
                let armed = c.members[lagging]
                    .as_ref()
                    .and_then(|p| p.wait_for_log("failpoint armed", Duration::from_secs(10)));
                if armed.is_some() {
                    String::new()
                } else {
                    "could not arm (a server without failpoints?)".into()
                }
            } else {
                came_back(c.try_restart(lagging))
            }
        })
        .await;
        if !restarted_lagging.is_empty() {
            return restarted_lagging;
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut crashed = false;
    while tokio::time::Instant::now() < deadline {
        if with_cluster(cluster, move |c| c.reap_if_exited(member)).await {
            crashed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if crashed {
        format!(
            "crashed there and came back{}",
            restart(cluster, member).await
        )
    } else {
        tokio::task::spawn_blocking(move || failpoint_request(&endpoint, "DELETE", name, None))
            .await
            .ok();
        if std::env::var_os("ROBUSTNESS_VERBOSE").is_some() {
            let tail = with_cluster(cluster, move |c| {
                (0..3)
                    .map(|i| format!("m{}:\n{}", i + 1, c.log_tail(i, 400)))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .await;
            eprintln!(
                "robustness: {name} not reached on m{}; its log ends:\n{tail}",
                member + 1
            );
        }
        "not reached in time (disarmed)".into()
    }
}
