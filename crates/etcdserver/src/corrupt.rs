//! Corruption checks (etcd's etcdserver/corrupt.go): members compare
//! HashKV at one revision over the peer listener.
//!
//! * Initial (`--experimental-initial-corrupt-check`): before serving
//!   clients, a restarting member hashes its data and asks every peer for
//!   its hash at the same revision; a peer with the same compact revision
//!   but another hash means this member's data is not the cluster's, and it
//!   refuses to start ("found data inconsistency with peers").
//! * Periodic (`--experimental-corrupt-check-time`): the leader compares its
//!   hash with its followers' and raises the CORRUPT alarm (through raft)
//!   for a member that disagrees; every member then refuses writes.
//! * Damaged reads (beyond etcd): every stored record carries a checksum
//!   (see mvcc); a read that meets a record whose bytes changed is refused
//!   ("etcdserver: corrupt cluster") and this member raises the CORRUPT
//!   alarm for itself ([`raise_on_damaged_reads`]).

use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::alarm_request::AlarmAction;
use api::etcdserverpb::{AlarmRequest, AlarmType, HashKvRequest, HashKvResponse};
use api::oxcdpeerpb::maintenance_peer_client::MaintenancePeerClient;
use api::oxcdpeerpb::maintenance_peer_server::{MaintenancePeer, MaintenancePeerServer};
use api::rpctypes;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::errors;
use crate::server::EtcdServer;

/// A peer's answer to "your hash at revision R".
struct PeerHash {
    member: u64,
    answer: Result<HashKvResponse, Status>,
}

/// Asks every other member for its HashKV at `revision`, concurrently,
/// each within the request timeout.
async fn peer_hashes(server: &EtcdServer, revision: i64) -> Vec<PeerHash> {
    let asks = server
        .members
        .list()
        .into_iter()
        .filter(|m| m.id != server.member.id)
        .map(|m| {
            let channel = server.peer_channels.channel(&server.members, m.id);
            let timeout = server.cfg.request_timeout();
            async move {
                let answer = match channel {
                    None => Err(Status::unavailable("member has no peer URL")),
                    Some(channel) => {
                        let mut client = MaintenancePeerClient::new(channel);
                        match tokio::time::timeout(
                            timeout,
                            client.hash_kv(HashKvRequest { revision }),
                        )
                        .await
                        {
                            Ok(answer) => answer.map(|r| r.into_inner()),
                            Err(_) => Err(Status::deadline_exceeded("hash request timed out")),
                        }
                    }
                };
                PeerHash {
                    member: m.id,
                    answer,
                }
            }
        });
    futures::future::join_all(asks).await
}

fn local_hash(server: &EtcdServer) -> Result<(u32, i64, i64), String> {
    server
        .store
        .hash_kv(0)
        .map_err(|e| format!("{:x} failed to fetch hash ({e})", server.member.id))
}

/// The initial check: Err(reason) when this member's data disagrees.
pub async fn check_initial(server: &EtcdServer) -> Result<(), String> {
    let id = format!("{:x}", server.member.id);
    tracing::info!("local-member-id" = %id, timeout = ?server.cfg.request_timeout(), "starting initial corruption check");
    let (hash, compact_revision, revision) = local_hash(server)?;
    let mut mismatches = 0;
    for peer in peer_hashes(server, revision).await {
        let remote = format!("{:x}", peer.member);
        match peer.answer {
            Ok(resp) if resp.hash != hash => {
                if resp.compact_revision == compact_revision {
                    tracing::warn!("local-member-id" = %id, "local-member-revision" = revision,
                        "local-member-compact-revision" = compact_revision, "local-member-hash" = hash,
                        "remote-peer-id" = %remote, "remote-peer-hash" = resp.hash,
                        "remote-peer-compact-revision" = resp.compact_revision,
                        "found different hash values from remote peer");
                    mismatches += 1;
                } else {
                    tracing::warn!("local-member-id" = %id, "remote-peer-id" = %remote,
                        "local-member-compact-revision" = compact_revision,
                        "remote-peer-compact-revision" = resp.compact_revision,
                        "found different compact revision values from remote peer");
                }
            }
            Ok(_) => {}
            Err(status) if status.message() == rpctypes::FUTURE_REV.message => {
                tracing::warn!("local-member-id" = %id, "remote-peer-id" = %remote,
                    "cannot fetch hash from slow remote peer")
            }
            Err(status) if status.message() == rpctypes::COMPACTED.message => {
                tracing::warn!("local-member-id" = %id, "remote-peer-id" = %remote,
                    "cannot fetch hash from remote peer; local member is behind")
            }
            Err(status) => {
                tracing::warn!("local-member-id" = %id, "remote-peer-id" = %remote, error = %status,
                    "cannot fetch hash from remote peer")
            }
        }
    }
    if mismatches > 0 {
        return Err(format!("{id} found data inconsistency with peers"));
    }
    tracing::info!("local-member-id" = %id, "initial corruption checking passed; no corruption");
    Ok(())
}

/// One leader-side check (etcd's checkHashKV); raises CORRUPT at most once.
async fn check_as_leader(server: &EtcdServer) -> Result<(), String> {
    let (hash, compact_revision, revision) = local_hash(server)?;
    let peers = peer_hashes(server, revision).await;
    let (hash2, compact_revision2, revision2) = local_hash(server)?;
    let mut suspect = None;
    if hash2 != hash && revision2 == revision && compact_revision2 == compact_revision {
        tracing::warn!(
            revision,
            "leader-hash" = hash,
            "leader-hash-again" = hash2,
            "found hash mismatch"
        );
        suspect = Some(server.member.id);
    }
    let mut checked = 0;
    for peer in &peers {
        let Ok(resp) = &peer.answer else { continue };
        checked += 1;
        let follower = format!("{:x}", peer.member);
        let follower_revision = resp.header.as_ref().map(|h| h.revision).unwrap_or(0);
        if follower_revision > revision2 {
            tracing::warn!("leader-revision" = revision2, "follower-revision" = follower_revision,
                "follower-peer-id" = %follower, "revision from follower must be less than or equal to leader's");
            suspect.get_or_insert(peer.member);
        }
        if resp.compact_revision > compact_revision2 {
            tracing::warn!("leader-compact-revision" = compact_revision2,
                "follower-compact-revision" = resp.compact_revision, "follower-peer-id" = %follower,
                "compact revision from follower must be less than or equal to leader's");
            suspect.get_or_insert(peer.member);
        }
        if resp.compact_revision == compact_revision && resp.hash != hash {
            tracing::warn!("leader-hash" = hash, "follower-hash" = resp.hash, "follower-peer-id" = %follower,
                "same compact revision then hashes must match");
            suspect.get_or_insert(peer.member);
        }
    }
    tracing::info!(
        "number-of-peers-checked" = checked,
        "finished peer corruption check"
    );
    if let Some(member) = suspect {
        let raise = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: member,
            alarm: AlarmType::Corrupt as i32,
        };
        server
            .alarm(raise)
            .await
            .map_err(|e| format!("failed to raise the CORRUPT alarm: {e}"))?;
    }
    Ok(())
}

/// The leader's periodic check, every `interval`, until shutdown.
pub async fn run_periodic(
    server: Arc<EtcdServer>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    tracing::info!("local-member-id" = %format!("{:x}", server.member.id), interval = ?interval,
        "enabled corruption checking");
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        if !server.raft.status().is_leader {
            continue;
        }
        if let Err(e) = check_as_leader(&server).await {
            tracing::warn!(error = %e, "failed to check hash KV");
        }
    }
}

/// The compaction hashes not yet checked (etcd's uncheckedRevisions):
/// newest first, those above `latest_checked`.
fn unchecked_hashes(mut hashes: Vec<mvcc::KvHash>, latest_checked: i64) -> Vec<mvcc::KvHash> {
    hashes.sort_by_key(|h| std::cmp::Reverse(h.revision));
    hashes.retain(|h| h.revision > latest_checked);
    hashes
}

/// What comparing one compaction hash with the peers' found.
#[derive(Debug, PartialEq, Eq)]
enum CompactHashOutcome {
    /// A peer at the same compact revision has another hash (its index).
    Mismatch(usize),
    /// Every peer answered with the same compact revision and hash.
    WholeCluster(usize),
    /// Some peers could not be compared (no answer, another compact
    /// revision): this many were checked.
    Skipped(usize),
}

/// etcd's CompactHashCheck rules for one hash: a peer that did not answer
/// or answered with another compact revision is skipped; one with the same
/// compact revision must have the same hash.
fn compare_compact_hash(
    leader: &mvcc::KvHash,
    peers: &[Option<(i64, u32)>],
    mut checked_one: impl FnMut(usize),
) -> CompactHashOutcome {
    let mut checked = 0;
    for (i, peer) in peers.iter().enumerate() {
        let Some((compact_revision, hash)) = *peer else {
            continue;
        };
        if compact_revision != leader.compact_revision {
            continue;
        }
        if hash != leader.hash {
            return CompactHashOutcome::Mismatch(i);
        }
        checked += 1;
        checked_one(i);
    }
    if checked == peers.len() {
        CompactHashOutcome::WholeCluster(checked)
    } else {
        CompactHashOutcome::Skipped(checked)
    }
}

/// One leader-side compaction hash check (etcd's CompactHashCheck): the
/// hashes recorded at recent compactions, newest first, are compared with
/// the peers' hashes at the same revisions; the newest one the whole
/// cluster agrees on ends the check and is not checked again. A mismatch
/// raises the CORRUPT alarm for member 0, as etcd 3.5.
pub async fn compact_hash_check(server: &EtcdServer, latest_checked: &mut i64) {
    let id = format!("{:x}", server.member.id);
    tracing::info!("local-member-id" = %id, timeout = ?server.cfg.request_timeout(),
        "starting compact hash check");
    let hashes = unchecked_hashes(server.store.compaction_hashes(), *latest_checked);
    for (i, hash) in hashes.iter().enumerate() {
        let peers = peer_hashes(server, hash.revision).await;
        if peers.is_empty() {
            continue;
        }
        let answers: Vec<Option<(i64, u32)>> = peers
            .iter()
            .map(|p| p.answer.as_ref().ok().map(|r| (r.compact_revision, r.hash)))
            .collect();
        let outcome = compare_compact_hash(hash, &answers, |p| {
            tracing::info!(revision = hash.revision, "peer-id" = %format!("{:x}", peers[p].member),
                "successfully checked hash on follower");
        });
        match outcome {
            CompactHashOutcome::Mismatch(p) => {
                let (compact_revision, follower_hash) = answers[p].unwrap_or_default();
                // etcd 3.5 cannot tell which member is corrupt: member 0
                let raise = AlarmRequest {
                    action: AlarmAction::Activate as i32,
                    member_id: 0,
                    alarm: AlarmType::Corrupt as i32,
                };
                if let Err(e) = server.alarm(raise).await {
                    tracing::warn!(error = %e, "failed to raise the CORRUPT alarm");
                }
                tracing::error!(revision = hash.revision,
                    "leader-compact-revision" = hash.compact_revision, "leader-hash" = hash.hash,
                    "follower-compact-revision" = compact_revision, "follower-hash" = follower_hash,
                    "follower-peer-id" = %format!("{:x}", peers[p].member),
                    "failed compaction hash check");
                return;
            }
            CompactHashOutcome::WholeCluster(checked) => {
                tracing::info!(
                    "number-of-peers-checked" = checked,
                    revision = hash.revision,
                    "successfully checked hash on whole cluster"
                );
                *latest_checked = (*latest_checked).max(hash.revision);
                tracing::info!(
                    "number-of-hashes-checked" = i + 1,
                    "finished compaction hash check"
                );
                return;
            }
            CompactHashOutcome::Skipped(checked) => {
                tracing::warn!(
                    "number-of-peers-checked" = checked,
                    "number-of-peers" = peers.len(),
                    revision = hash.revision,
                    "skipped revision in compaction hash check; was not able to check all peers"
                );
            }
        }
    }
    tracing::info!(
        "number-of-hashes-checked" = hashes.len(),
        "finished compaction hash check"
    );
}

/// The leader's compaction hash check, every `interval`, until shutdown
/// (etcd's monitorCompactHash).
pub async fn run_compact_hash_check(
    server: Arc<EtcdServer>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut latest_checked = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        if !server.raft.status().is_leader {
            continue;
        }
        compact_hash_check(&server, &mut latest_checked).await;
    }
}

/// A member's HashKV for its peers.
pub struct MaintenancePeerService {
    server: Arc<EtcdServer>,
}

impl MaintenancePeerService {
    pub fn server(server: Arc<EtcdServer>) -> MaintenancePeerServer<MaintenancePeerService> {
        MaintenancePeerServer::new(MaintenancePeerService { server })
    }
}

#[tonic::async_trait]
impl MaintenancePeer for MaintenancePeerService {
    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        let revision = request.into_inner().revision;
        let (hash, compact_revision, hash_revision) = self
            .server
            .store
            .hash_kv(revision)
            .map_err(|e| errors::from_mvcc(&e).status())?;
        Ok(Response::new(HashKvResponse {
            header: Some(self.server.header(self.server.store.current_revision())),
            hash,
            compact_revision,
            hash_revision,
        }))
    }
}

/// Raises the CORRUPT alarm for this member, through raft, when a read
/// meets a damaged record (mvcc's corruption observer). Once raised it
/// stays (the alarm is persisted) until an operator disarms it; a later
/// damaged read raises it again.
pub fn raise_on_damaged_reads(
    server: &Arc<EtcdServer>,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let damaged = Arc::new(tokio::sync::Notify::new());
    let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let damaged = damaged.clone();
        server.store.set_corruption_observer(Arc::new(move |e| {
            // every read of a damaged key meets it: log the first of each
            // power of two
            let count = seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if count.is_power_of_two() {
                tracing::error!(error = %e, "damaged-reads" = count, "the backend holds damaged data");
            }
            damaged.notify_one();
        }));
    }
    let server = Arc::downgrade(server);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = damaged.notified() => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            let Some(server) = server.upgrade() else {
                return;
            };
            let me = server.member.id;
            let raised = server
                .alarms
                .get(AlarmType::Corrupt as i32)
                .iter()
                .any(|a| a.member_id == me);
            if raised {
                continue;
            }
            let raise = AlarmRequest {
                action: AlarmAction::Activate as i32,
                member_id: me,
                alarm: AlarmType::Corrupt as i32,
            };
            if let Err(e) = server.alarm(raise).await {
                tracing::warn!(error = %e, "failed to raise the CORRUPT alarm for damaged data; retrying at the next damaged read");
            }
        }
    })
}

/// Makes the check of every record the backend's open deferred (a file a
/// clean stop left: see mvcc's `Store::open_deferring_check`), off the
/// request path, on a thread of its own whose disk reads are in the idle
/// class (mvcc::idle_io_priority); damage it finds stops the member with
/// the message a refused start gives. Gives up when the member stops (the
/// next start then checks every page).
pub fn check_deferred_backend(
    server: &Arc<EtcdServer>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    if !server.store.has_deferred_check() {
        return Ok(());
    }
    let store = server.store.clone();
    let fatal = server.raft.fatal();
    let check = move || {
        mvcc::idle_io_priority();
        let started = std::time::Instant::now();
        let stop = || *shutdown.borrow();
        match store.check_deferred(&stop) {
            Ok(Some(records)) => tracing::info!(
                records,
                took = ?started.elapsed(),
                "checked every record of the backend a clean stop left"
            ),
            Ok(None) => {}
            Err(e) => fatal.raise(e.to_string()),
        }
    };
    std::thread::Builder::new()
        .name("backend-check".into())
        .spawn(check)
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(revision: i64, compact_revision: i64, hash: u32) -> mvcc::KvHash {
        mvcc::KvHash {
            hash,
            compact_revision,
            revision,
        }
    }

    #[test]
    fn unchecked_hashes_are_newest_first_and_above_the_latest_checked() {
        let stored = vec![kv(5, 0, 1), kv(9, 5, 2), kv(12, 9, 3)];
        let revisions = |h: Vec<mvcc::KvHash>| h.iter().map(|h| h.revision).collect::<Vec<_>>();
        assert_eq!(revisions(unchecked_hashes(stored.clone(), 0)), [12, 9, 5]);
        assert_eq!(revisions(unchecked_hashes(stored.clone(), 9)), [12]);
        assert!(unchecked_hashes(stored, 12).is_empty());
    }

    #[test]
    fn compact_hash_rules() {
        let leader = kv(10, 4, 0xabc);
        let mut seen = Vec::new();
        // every peer at the same compact revision with the same hash
        let all = [Some((4, 0xabc)), Some((4, 0xabc))];
        assert_eq!(
            compare_compact_hash(&leader, &all, |p| seen.push(p)),
            CompactHashOutcome::WholeCluster(2)
        );
        assert_eq!(seen, [0, 1]);
        // a peer without an answer, or at another compact revision, is
        // skipped: not the whole cluster
        let partial = [Some((4, 0xabc)), None];
        assert_eq!(
            compare_compact_hash(&leader, &partial, |_| {}),
            CompactHashOutcome::Skipped(1)
        );
        let other_compaction = [Some((4, 0xabc)), Some((7, 0xdef))];
        assert_eq!(
            compare_compact_hash(&leader, &other_compaction, |_| {}),
            CompactHashOutcome::Skipped(1)
        );
        // the same compact revision and another hash: a mismatch, at once
        let mismatch = [Some((4, 0xabc)), Some((4, 0xdef)), Some((4, 0xabc))];
        assert_eq!(
            compare_compact_hash(&leader, &mismatch, |_| {}),
            CompactHashOutcome::Mismatch(1)
        );
    }
}
