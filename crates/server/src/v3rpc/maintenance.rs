//! The Maintenance service: Status (what `etcdctl endpoint status` shows),
//! the alarm list, HashKV. Defragment, Snapshot, MoveLeader and Downgrade
//! arrive with the operations issue (Unimplemented until then).

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

use crate::errors;
use crate::etcdserver::EtcdServer;
use crate::v3rpc::check_require_leader;

/// The etcd API version this member implements and reports. kube-apiserver
/// enables features (watch progress, consistent list from cache) only for
/// 3.5.13 and later.
pub const ETCD_VERSION: &str = "3.5.13";
/// The cluster version, as etcd reports it (major.minor).
pub const CLUSTER_VERSION: &str = "3.5";

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
            is_learner: false,
        }))
    }

    /// Rewrites this member's backend (not through raft, as etcd). Reads
    /// and writes go on meanwhile; see mvcc's defrag module.
    async fn defragment(
        &self,
        _: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        let store = self.server.store.clone();
        tracing::info!(path = %self.server.cfg.backend_path().display(),
            "current-db-size-bytes" = store.db_size(), "starting defragmentation");
        let stats = tokio::task::spawn_blocking(move || store.defragment())
            .await
            .map_err(|e| Status::internal(format!("defragmentation task failed: {e}")))?
            .map_err(|e| {
                tracing::warn!(error = %e, "failed to defragment the backend");
                Status::unknown(e.to_string())
            })?;
        tracing::info!(path = %self.server.cfg.backend_path().display(),
            "current-db-size-bytes-diff" = stats.size_after - stats.size_before,
            "current-db-size-bytes" = stats.size_after,
            "took" = ?stats.copy_time + stats.swap_time,
            "writes-deferred" = ?stats.copy_time,
            "finished defragmenting directory");
        Ok(Response::new(DefragmentResponse {
            header: Some(self.server.header(self.server.store.current_revision())),
        }))
    }

    async fn hash(&self, _: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(Status::unimplemented("Hash is not implemented yet"))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let revision = request.get_ref().revision;
        let (hash, compact_revision, hash_revision) = self
            .server
            .store
            .hash_kv(revision)
            .map_err(|e| errors::from_mvcc(&e))?;
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
        _: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(Status::unimplemented("Snapshot is not implemented yet"))
    }

    async fn move_leader(
        &self,
        _: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        Err(Status::unimplemented("MoveLeader is not implemented yet"))
    }

    async fn downgrade(
        &self,
        _: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(Status::unimplemented("Downgrade is not implemented yet"))
    }
}
