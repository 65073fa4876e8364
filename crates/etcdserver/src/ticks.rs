//! etcd's adjustTicks (etcdserver/server.go): at start, a member's first
//! election timer is fast-forwarded so that the cluster elects a leader
//! sooner than a full election timeout.
//!
//! - One member: `election ticks - 1` at once. (oxcd's raft core also
//!   campaigns at once when the member is raft's only voter.)
//! - More, with `--initial-election-tick-advance=false`: nothing.
//! - More: once more than one peer's raft link is up (polled every 50 ms
//!   for up to 5 s, etcd's rafthttp.ConnReadTimeout), `election ticks - 2`:
//!   a leader's heartbeat, if there is a leader, still comes in time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::EtcdServer;

/// How often the peers' links are looked at.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long they are waited for (etcd's rafthttp.ConnReadTimeout).
const PEER_WAIT: Duration = Duration::from_secs(5);

/// Raft's election ticks: one tick per heartbeat interval.
fn election_ticks(server: &EtcdServer) -> usize {
    let heartbeat = server.cfg.heartbeat.as_millis().max(1);
    (server.cfg.election_timeout.as_millis() / heartbeat).max(2) as usize
}

/// etcd's tickToDur.
fn ticks_duration(server: &EtcdServer, ticks: usize) -> String {
    format!("{:?}", server.cfg.heartbeat * ticks as u32)
}

/// Whether this member's raft link to `peer` is up (etcd's ActivePeers
/// counts the peers whose link has an ActiveSince).
fn is_active(server: &EtcdServer, peer: u64) -> bool {
    server
        .transport
        .get()
        .is_some_and(|t| t.active_since(peer).is_some())
}

/// Fast-forwards this member's election ticks as etcd does at start.
pub async fn adjust(server: Arc<EtcdServer>, mut shutdown: watch::Receiver<bool>) {
    let election_ticks = election_ticks(&server);
    let members = server.members.list();
    let id = format!("{:x}", server.member.id);
    if members.len() == 1 {
        let ticks = election_ticks - 1;
        tracing::info!(
            "local-member-id" = %id,
            "forward-ticks" = ticks,
            "forward-duration" = %ticks_duration(&server, ticks),
            "election-ticks" = election_ticks,
            "election-timeout" = %ticks_duration(&server, election_ticks),
            "started as single-node; fast-forwarding election ticks"
        );
        let _ = server.raft.advance_ticks(ticks).await;
        return;
    }
    if !server.cfg.initial_election_tick_advance {
        tracing::info!(
            "election-ticks" = election_ticks,
            "skipping initial election tick advance"
        );
        return;
    }
    tracing::info!(
        "election-ticks" = election_ticks,
        "starting initial election tick advance"
    );
    for _ in 0..PEER_WAIT.as_millis() / POLL_INTERVAL.as_millis() {
        tokio::select! {
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let active = server
            .members
            .list()
            .iter()
            .filter(|m| m.id != server.member.id && is_active(&server, m.id))
            .count();
        if active > 1 {
            let ticks = election_ticks - 2;
            tracing::info!(
                "local-member-id" = %id,
                "forward-ticks" = ticks,
                "forward-duration" = %ticks_duration(&server, ticks),
                "election-ticks" = election_ticks,
                "election-timeout" = %ticks_duration(&server, election_ticks),
                "active-remote-members" = active,
                "initialized peer connections; fast-forwarding election ticks"
            );
            let _ = server.raft.advance_ticks(ticks).await;
            return;
        }
    }
}
