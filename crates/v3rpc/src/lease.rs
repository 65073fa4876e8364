//! The Lease service (etcd's api/v3rpc/lease.go).

use std::pin::Pin;
use std::sync::Arc;

use api::etcdserverpb::lease_server::Lease;
use api::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use api::rpctypes;
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::user_of;
use crate::{check_require_leader, REQUIRE_LEADER_KEY};
use etcdserver::EtcdServer;

/// Keep-alive answers queued for a slow client; the stream reads its next
/// request only when there is room, so a client that does not read its
/// answers stops being served instead of growing a buffer.
const KEEPALIVE_OUTBOUND: usize = 16;
/// Election timeouts without a leader before a require-leader keep-alive
/// stream is ended with "no leader" (etcd's maxNoLeaderCnt).
const MAX_NO_LEADER_COUNT: u32 = 3;

pub struct LeaseService {
    server: Arc<EtcdServer>,
    shutdown: watch::Receiver<bool>,
}

impl LeaseService {
    pub fn new(server: Arc<EtcdServer>, shutdown: watch::Receiver<bool>) -> Self {
        LeaseService { server, shutdown }
    }

    /// Serves one keep-alive stream fed by `inbound` (gRPC's, or the JSON
    /// gateway's decoded requests). The stream ends when `inbound` does.
    pub fn open<S>(&self, inbound: S, require_leader: bool) -> KeepAliveStream
    where
        S: Stream<Item = Result<LeaseKeepAliveRequest, Status>> + Unpin + Send + 'static,
    {
        let (outbound, rx) = mpsc::channel(KEEPALIVE_OUTBOUND);
        tokio::spawn(keep_alive(
            self.server.clone(),
            inbound,
            outbound,
            require_leader,
            self.shutdown.clone(),
        ));
        Box::pin(ReceiverStream::new(rx))
    }
}

pub type KeepAliveStream =
    Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let resp = self.server.lease_grant(request.into_inner()).await?;
        Ok(Response::new(resp))
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let user = user_of(&self.server, &request).await?;
        let resp = self
            .server
            .lease_revoke(user.as_ref(), request.into_inner())
            .await?;
        Ok(Response::new(resp))
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let require_leader = request
            .metadata()
            .get(REQUIRE_LEADER_KEY)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == "true");
        check_require_leader(&self.server, &request)?;
        Ok(Response::new(
            self.open(request.into_inner(), require_leader),
        ))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let user = user_of(&self.server, &request).await?;
        let req = request.into_inner();
        let id = req.id;
        // With keys, etcd checks read permission on every attached key
        // (this member's view), and refuses the answer if an auth change
        // applied meanwhile.
        let checked_at = self.server.auth.revision();
        if req.keys && self.server.auth.is_enabled() {
            let user = user.as_ref().ok_or(rpctypes::USER_EMPTY)?;
            for key in self.server.lessor.keys_to_revoke(id).unwrap_or_default() {
                self.server
                    .auth
                    .check(user, etcdserver::auth::Access::Read, &key, &[])?;
            }
        }
        let keys = req.keys;
        match self.server.lease_time_to_live(req).await {
            Ok(_)
                if keys
                    && self.server.auth.is_enabled()
                    && checked_at != self.server.auth.revision() =>
            {
                Err(rpctypes::AUTH_OLD_REVISION.status())
            }
            Ok(resp) => Ok(Response::new(resp)),
            // etcd answers an unknown lease with TTL -1, not an error.
            Err(e) if e == rpctypes::LEASE_NOT_FOUND => {
                Ok(Response::new(LeaseTimeToLiveResponse {
                    header: Some(self.server.header(self.server.store.current_revision())),
                    id,
                    ttl: -1,
                    ..Default::default()
                }))
            }
            Err(e) => Err(e.status()),
        }
    }

    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        Ok(Response::new(self.server.lease_leases()))
    }
}

/// One keep-alive stream: each request renews its lease on the leader and
/// is answered in order. An unknown lease is answered with TTL 0.
async fn keep_alive<S>(
    server: Arc<EtcdServer>,
    mut requests: S,
    outbound: mpsc::Sender<Result<LeaseKeepAliveResponse, Status>>,
    require_leader: bool,
    mut shutdown: watch::Receiver<bool>,
) where
    S: Stream<Item = Result<LeaseKeepAliveRequest, Status>> + Unpin,
{
    let mut leader_check = tokio::time::interval(server.cfg.election_timeout);
    leader_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut no_leader_count = 0;
    loop {
        let request = tokio::select! {
            request = requests.next() => request,
            _ = leader_check.tick(), if require_leader => {
                if server.has_leader() {
                    no_leader_count = 0;
                } else {
                    no_leader_count += 1;
                    if no_leader_count >= MAX_NO_LEADER_COUNT {
                        let _ = outbound.send(Err(rpctypes::NO_LEADER.status())).await;
                        return;
                    }
                }
                continue;
            }
            _ = async { shutdown.wait_for(|stop| *stop).await.map(|_| ()) } => {
                let _ = outbound.send(Err(rpctypes::STOPPED.status())).await;
                return;
            }
            _ = outbound.closed() => return,
        };
        let request = match request {
            Some(Ok(r)) => r,
            None => return,
            Some(Err(status)) => {
                tracing::debug!(error = %status, "lease keep-alive stream failed");
                server
                    .metrics
                    .ops
                    .stream_receive_failed("lease-keepalive", &status);
                return;
            }
        };
        // The header is taken before the renewal, so its revision is at
        // most the revision at which the keep-alive happened: a client never
        // sees a keep-alive succeed at a revision after the lease's revocation.
        let header = server.header(server.store.current_revision());
        let ttl = match server.lease_renew(request.id).await {
            Ok(ttl) => ttl,
            Err(e) if e == rpctypes::LEASE_NOT_FOUND => 0,
            Err(e) => {
                let _ = outbound.send(Err(e.status())).await;
                return;
            }
        };
        let response = LeaseKeepAliveResponse {
            header: Some(header),
            id: request.id,
            ttl,
        };
        if outbound.send(Ok(response)).await.is_err() {
            return;
        }
    }
}
