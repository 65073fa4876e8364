//! The Maintenance service: Status (what `etcdctl endpoint status` shows),
//! Alarm, Defragment, Hash, HashKV, MoveLeader. Downgrade answers
//! Unimplemented.

use std::pin::Pin;
use std::sync::Arc;

use api::etcdserverpb::maintenance_server::Maintenance;
use api::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use api::rpctypes;
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::auth::require_admin;
use crate::check_require_leader;
use etcdserver::errors;
use etcdserver::EtcdServer;
use etcdserver::ETCD_VERSION;

pub struct MaintenanceService {
    server: Arc<EtcdServer>,
}

impl MaintenanceService {
    pub fn new(server: Arc<EtcdServer>) -> Self {
        MaintenanceService { server }
    }
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        Ok(Response::new(
            self.server.alarm(request.into_inner()).await?,
        ))
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let raft = self.server.raft.status();
        let store = &self.server.store;
        let mut errors = Vec::new();
        if raft.leader == 0 {
            errors.push(rpctypes::NO_LEADER.message.to_string());
        }
        errors.extend(self.server.alarm_errors());
        Ok(Response::new(StatusResponse {
            header: Some(self.server.header(store.current_revision())),
            version: ETCD_VERSION.to_string(),
            db_size: store.db_size(),
            leader: raft.leader,
            raft_index: raft.commit_index,
            raft_term: raft.term,
            raft_applied_index: self.server.applied_index(),
            errors,
            db_size_in_use: store.db_size_in_use(),
            is_learner: self.server.is_learner(),
        }))
    }

    /// Rewrites this member's backend (not through raft, as etcd). Reads
    /// and writes go on meanwhile; see mvcc's defrag module.
    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        require_admin(&self.server, &request).await?;
        let store = self.server.store.clone();
        tracing::info!("starting defragment");
        let (size, in_use) = (
            store.db_size().max(0) as u64,
            store.db_size_in_use().max(0) as u64,
        );
        tracing::info!(path = %self.server.cfg.backend_path().display(),
            "current-db-size-bytes" = size,
            "current-db-size" = %mvcc::snapshot_file::humanize_bytes(size),
            "current-db-size-in-use-bytes" = in_use,
            "current-db-size-in-use" = %mvcc::snapshot_file::humanize_bytes(in_use),
            "defragmenting");
        let timer = self.server.metrics.ops.defrag_started();
        let stats = tokio::task::spawn_blocking(move || store.defragment())
            .await
            .map_err(|e| Status::internal(format!("defragmentation task failed: {e}")))?
            .map_err(|e| {
                tracing::warn!(error = %e, "failed to defragment");
                Status::unknown(e.to_string())
            })?;
        tracing::info!(path = %self.server.cfg.backend_path().display(),
            "current-db-size-bytes-diff" = stats.size_after - stats.size_before,
            "current-db-size-bytes" = stats.size_after,
            "took" = ?stats.copy_time + stats.swap_time,
            "writes-deferred" = ?stats.copy_time,
            "finished defragmenting directory");
        tracing::info!("finished defragment");
        timer.finish();
        // etcd answers with an empty message, no header (its gateway
        // prints `{}`).
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    /// The hash of this member's whole backend (not through raft).
    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        require_admin(&self.server, &request).await?;
        let store = self.server.store.clone();
        let timer = self.server.metrics.ops.hash_started();
        let (hash, revision) = tokio::task::spawn_blocking(move || store.hash())
            .await
            .map_err(|e| Status::internal(format!("hash task failed: {e}")))?
            .map_err(|e| errors::from_mvcc(&e))?;
        timer.finish();
        Ok(Response::new(HashResponse {
            header: Some(self.server.header(revision)),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        require_admin(&self.server, &request).await?;
        let revision = request.get_ref().revision;
        let timer = self.server.metrics.ops.hash_rev_started();
        let (hash, compact_revision, hash_revision) = self
            .server
            .store
            .hash_kv(revision)
            .map_err(|e| errors::from_mvcc(&e))?;
        timer.finish();
        Ok(Response::new(HashKvResponse {
            header: Some(self.server.header(self.server.store.current_revision())),
            hash,
            compact_revision,
            hash_revision,
        }))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        check_require_leader(&self.server, &request)?;
        require_admin(&self.server, &request).await?;
        let stream = crate::snapshot_stream::start(self.server.clone());
        Ok(Response::new(Box::pin(stream)))
    }

    /// Hands leadership to another voting member (etcd's MoveLeader): only
    /// the leader accepts it; answered once the transferee leads.
    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let target = request.into_inner().target_id;
        let server = &self.server;
        if server.raft.status().leader != server.member.id {
            return Err(rpctypes::NOT_LEADER.status());
        }
        if server.members.get(target).is_none_or(|m| m.is_learner) {
            return Err(rpctypes::BAD_LEADER_TRANSFEREE.status());
        }
        let started = std::time::Instant::now();
        tracing::info!("current-leader-member-id" = %format!("{:x}", server.member.id),
            "transferee-member-id" = %format!("{:x}", target), "leadership transfer starting");
        let deadline = tokio::time::Instant::now() + server.cfg.request_timeout();
        server
            .raft
            .transfer_leader(target)
            .await
            .map_err(|e| errors::from_consensus(&e).status())?;
        while server.raft.status().leader != target {
            if tokio::time::Instant::now() >= deadline {
                return Err(rpctypes::TIMEOUT_LEADER_TRANSFER.status());
            }
            tokio::time::sleep(server.cfg.heartbeat).await;
        }
        tracing::info!("old-leader-member-id" = %format!("{:x}", server.member.id),
            "new-leader-member-id" = %format!("{:x}", target), "took" = ?started.elapsed(),
            "leadership transfer finished");
        // etcd answers `&pb.MoveLeaderResponse{}`: no header (the etcd-client
        // crate's test_move_leader asserts it).
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }

    async fn downgrade(
        &self,
        _: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(Status::unimplemented("Downgrade is not implemented yet"))
    }
}
