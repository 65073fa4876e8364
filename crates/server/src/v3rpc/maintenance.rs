//! The Maintenance service: Status (what `etcdctl endpoint status` shows),
//! the alarm list, HashKV. Defragment, Snapshot, MoveLeader and Downgrade
//! arrive with the operations issue (Unimplemented until then).

use std::pin::Pin;
use std::sync::Arc;

use api::etcdserverpb::alarm_request::AlarmAction;
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
        let req = request.into_inner();
        if req.action != AlarmAction::Get as i32 {
            return Err(Status::unimplemented(
                "alarm activation is not implemented yet",
            ));
        }
        // No alarm can be raised yet (quota arrives with the operations issue).
        let header = self.server.header(self.server.store.current_revision());
        Ok(Response::new(AlarmResponse {
            header: Some(header),
            alarms: vec![],
        }))
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

    async fn defragment(
        &self,
        _: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        Err(Status::unimplemented("Defragment is not implemented yet"))
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
        request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        check_require_leader(&self.server, &request)?;
        let stream = crate::v3rpc::snapshot_stream::start(self.server.clone());
        Ok(Response::new(Box::pin(stream)))
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
