//! The member's side of leases (etcd's EtcdServer lease methods and the
//! lessor's run loop): grants and revocations go through raft; keep-alives
//! and TimeToLive are answered by the leader, which a follower asks over the
//! peer listener; the leader's loop proposes the revocation of expired
//! leases (rate-limited) and checkpoints of remaining TTLs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::{
    LeaseCheckpointRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseLeasesResponse,
    LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus, LeaseTimeToLiveRequest,
    LeaseTimeToLiveResponse,
};
use api::oxcdpeerpb::lease_peer_client::LeasePeerClient;
use api::oxcdpeerpb::lease_peer_server::{LeasePeer, LeasePeerServer};
use api::rpctypes::{self, EtcdError};
use tokio::sync::{watch, Semaphore};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use crate::auth::AuthInfo;
use crate::server::EtcdServer;
use lease::MAX_LEASE_CHECKPOINT_BATCH_SIZE;
use lease::{RenewOutcome, LEASE_CHECKPOINT_RATE, LEASE_REVOKE_RATE};

/// How often the leader looks for expired leases and due checkpoints.
const LEASE_LOOP_INTERVAL: Duration = Duration::from_millis(100);
/// Revocations in flight at once (etcd's maxPendingRevokes).
const MAX_PENDING_REVOKES: usize = 16;
/// A follower's pause between attempts to reach the leader (etcd: 50 ms).
const FORWARD_RETRY_INTERVAL: Duration = Duration::from_millis(50);

/// Why the leader-side answer failed.
enum LeaderAnswer<T> {
    Ok(T),
    NotFound,
    /// This member is not (or no longer) the leader.
    NotPrimary,
    Failed(EtcdError),
}

impl EtcdServer {
    /// Revokes a lease through raft: its keys are deleted in one revision.
    pub async fn lease_revoke(
        &self,
        user: Option<&AuthInfo>,
        req: LeaseRevokeRequest,
    ) -> Result<LeaseRevokeResponse, EtcdError> {
        let mut resp = self.propose_as(user, req).await?;
        self.fill_header(&mut resp.header);
        Ok(resp)
    }

    /// Renews a lease on the leader, forwarding from a follower (etcd's
    /// LeaseRenew). Returns the lease's TTL.
    pub async fn lease_renew(&self, id: i64) -> Result<i64, EtcdError> {
        let deadline = tokio::time::Instant::now() + self.cfg.request_timeout();
        self.on_leader(
            deadline,
            || self.renew_as_leader(id, deadline),
            |mut client| async move {
                client
                    .renew(LeaseKeepAliveRequest { id })
                    .await
                    .map(|r| r.into_inner().ttl)
            },
        )
        .await
    }

    /// TimeToLive from the leader, forwarded from a follower.
    pub async fn lease_time_to_live(
        &self,
        req: LeaseTimeToLiveRequest,
    ) -> Result<LeaseTimeToLiveResponse, EtcdError> {
        let deadline = tokio::time::Instant::now() + self.cfg.request_timeout();
        let mut resp = self
            .on_leader(
                deadline,
                || self.time_to_live_as_leader(&req, deadline),
                |mut client| async move { client.time_to_live(req).await.map(|r| r.into_inner()) },
            )
            .await?;
        self.fill_header(&mut resp.header);
        Ok(resp)
    }

    /// Every lease this member knows, soonest expiry first (served locally,
    /// as etcd does).
    pub fn lease_leases(&self) -> LeaseLeasesResponse {
        LeaseLeasesResponse {
            header: Some(self.header(self.store.current_revision())),
            leases: self
                .lessor
                .leases()
                .into_iter()
                .map(|id| LeaseStatus { id })
                .collect(),
        }
    }

    /// Runs `local` if this member leads, else `remote` against the leader's
    /// peer listener, retrying while leadership moves, until `deadline`.
    async fn on_leader<T, L, LF, R, RF>(
        &self,
        deadline: tokio::time::Instant,
        local: L,
        remote: R,
    ) -> Result<T, EtcdError>
    where
        L: Fn() -> LF,
        LF: std::future::Future<Output = LeaderAnswer<T>>,
        R: Fn(LeasePeerClient<Channel>) -> RF,
        RF: std::future::Future<Output = Result<T, Status>>,
    {
        loop {
            let leader = self.raft.status().leader;
            if leader == self.member.id {
                match local().await {
                    LeaderAnswer::Ok(value) => return Ok(value),
                    LeaderAnswer::NotFound => return Err(rpctypes::LEASE_NOT_FOUND),
                    LeaderAnswer::Failed(e) => return Err(e),
                    LeaderAnswer::NotPrimary => {}
                }
            } else if leader != 0 {
                if let Some(channel) = self.peer_channels.channel(&self.members, leader) {
                    let client = LeasePeerClient::new(channel);
                    match tokio::time::timeout_at(deadline, remote(client)).await {
                        Ok(Ok(value)) => return Ok(value),
                        Ok(Err(status)) if status.code() == Code::NotFound => {
                            return Err(rpctypes::LEASE_NOT_FOUND)
                        }
                        Ok(Err(status)) => {
                            tracing::debug!(leader = %format!("{leader:x}"), error = %status, "lease request to the leader failed; retrying");
                        }
                        Err(_) => return Err(rpctypes::TIMEOUT),
                    }
                }
            }
            if tokio::time::Instant::now() + FORWARD_RETRY_INTERVAL >= deadline {
                return Err(rpctypes::TIMEOUT);
            }
            tokio::time::sleep(FORWARD_RETRY_INTERVAL).await;
        }
    }

    /// The leader applies everything committed before it answers, so a
    /// lease granted just before is known (etcd's waitAppliedIndex).
    async fn wait_applied_commit(&self, deadline: tokio::time::Instant) -> Result<(), EtcdError> {
        let commit = self.raft.status().commit_index;
        self.wait_applied(commit, deadline).await
    }

    async fn renew_as_leader(&self, id: i64, deadline: tokio::time::Instant) -> LeaderAnswer<i64> {
        if let Err(e) = self.wait_applied_commit(deadline).await {
            return LeaderAnswer::Failed(e);
        }
        loop {
            let changed = self.lessor.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.lessor.renew(id, Instant::now()) {
                RenewOutcome::Renewed {
                    ttl,
                    clear_checkpoint,
                } => {
                    self.metrics.ops.lease_renewed.inc();
                    if clear_checkpoint {
                        self.propose_checkpoints(vec![api::etcdserverpb::LeaseCheckpoint {
                            id,
                            remaining_ttl: 0,
                        }]);
                    }
                    return LeaderAnswer::Ok(ttl);
                }
                RenewOutcome::NotFound => return LeaderAnswer::NotFound,
                RenewOutcome::NotPrimary => return LeaderAnswer::NotPrimary,
                // Being revoked: the answer is NotFound once that applies,
                // or NotPrimary if leadership moves first.
                RenewOutcome::Expired => {
                    if tokio::time::timeout_at(deadline, changed).await.is_err() {
                        return LeaderAnswer::Failed(rpctypes::TIMEOUT);
                    }
                }
            }
        }
    }

    async fn time_to_live_as_leader(
        &self,
        req: &LeaseTimeToLiveRequest,
        deadline: tokio::time::Instant,
    ) -> LeaderAnswer<LeaseTimeToLiveResponse> {
        if let Err(e) = self.wait_applied_commit(deadline).await {
            return LeaderAnswer::Failed(e);
        }
        if !self.lessor.is_primary() {
            return LeaderAnswer::NotPrimary;
        }
        match self.lessor.time_to_live(req.id, req.keys, Instant::now()) {
            Some(info) => LeaderAnswer::Ok(LeaseTimeToLiveResponse {
                header: None,
                id: req.id,
                ttl: info.remaining,
                granted_ttl: info.granted_ttl,
                keys: info.keys,
            }),
            None => LeaderAnswer::NotFound,
        }
    }

    /// Proposes checkpoints in the background (their outcome matters to
    /// nobody waiting).
    fn propose_checkpoints(&self, checkpoints: Vec<api::etcdserverpb::LeaseCheckpoint>) {
        let Some(server) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            if let Err(e) = server.propose(LeaseCheckpointRequest { checkpoints }).await {
                tracing::warn!(error = %e, "failed to checkpoint leases");
            }
        });
    }
}

/// Follows leadership: the leader's lessor keeps expiries, a follower's
/// none. Runs until shutdown.
pub async fn run_primacy(server: Arc<EtcdServer>, mut shutdown: watch::Receiver<bool>) {
    let mut role = server.raft.subscribe_role();
    let mut leading = false;
    loop {
        let is_leader = role.borrow_and_update().is_leader;
        if is_leader != leading {
            leading = is_leader;
            if is_leader {
                // No lease expires because of the election (etcd extends by
                // one election timeout).
                server
                    .lessor
                    .promote(server.cfg.election_timeout, Instant::now());
                tracing::info!(leases = server.lessor.len(), "promoted the lessor");
            } else {
                server.lessor.demote();
            }
        }
        tokio::select! {
            changed = role.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

/// The leader's lease loop: proposes the revocation of expired leases (at
/// most LEASE_REVOKE_RATE per second, MAX_PENDING_REVOKES at once) and due
/// checkpoints (at most LEASE_CHECKPOINT_RATE per second).
pub async fn run_expiry(server: Arc<EtcdServer>, mut shutdown: watch::Receiver<bool>) {
    let per_tick =
        |rate: usize| (rate as u128 * LEASE_LOOP_INTERVAL.as_millis() / 1000).max(1) as usize;
    let revokes = Arc::new(Semaphore::new(MAX_PENDING_REVOKES));
    let mut ticker = tokio::time::interval(LEASE_LOOP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = Instant::now();
        for id in server.lessor.expired(now, per_tick(LEASE_REVOKE_RATE)) {
            server.metrics.ops.lease_expired.inc();
            let permit = tokio::select! {
                permit = revokes.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = shutdown.changed() => return,
            };
            let server = server.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match server
                    .lease_revoke(Some(&server.root()), LeaseRevokeRequest { id })
                    .await
                {
                    Ok(_) => {
                        tracing::debug!(lease = %format!("{id:016x}"), "revoked an expired lease")
                    }
                    Err(e) if e == rpctypes::LEASE_NOT_FOUND => {}
                    Err(e) => {
                        tracing::warn!(lease = %format!("{id:016x}"), error = %e, "failed to revoke an expired lease")
                    }
                }
            });
        }
        let due = server
            .lessor
            .due_checkpoints(now, per_tick(LEASE_CHECKPOINT_RATE));
        for batch in due.chunks(MAX_LEASE_CHECKPOINT_BATCH_SIZE) {
            server.propose_checkpoints(batch.to_vec());
        }
    }
}

/// The leader's end of forwarded lease requests, on the peer listener.
pub struct LeasePeerService {
    server: Arc<EtcdServer>,
}

impl LeasePeerService {
    pub fn server(server: Arc<EtcdServer>) -> LeasePeerServer<LeasePeerService> {
        LeasePeerServer::new(LeasePeerService { server })
    }
}

fn answer_status<T>(answer: LeaderAnswer<T>) -> Result<T, Status> {
    match answer {
        LeaderAnswer::Ok(value) => Ok(value),
        LeaderAnswer::NotFound => Err(Status::not_found(rpctypes::LEASE_NOT_FOUND.message)),
        LeaderAnswer::NotPrimary => Err(Status::unavailable("not primary")),
        LeaderAnswer::Failed(e) => Err(e.status()),
    }
}

#[tonic::async_trait]
impl LeasePeer for LeasePeerService {
    async fn renew(
        &self,
        request: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        let id = request.into_inner().id;
        let deadline = tokio::time::Instant::now() + self.server.cfg.request_timeout();
        let ttl = answer_status(self.server.renew_as_leader(id, deadline).await)?;
        Ok(Response::new(LeaseKeepAliveResponse {
            header: None,
            id,
            ttl,
        }))
    }

    async fn time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let req = request.into_inner();
        let deadline = tokio::time::Instant::now() + self.server.cfg.request_timeout();
        let resp = answer_status(self.server.time_to_live_as_leader(&req, deadline).await)?;
        Ok(Response::new(resp))
    }
}
