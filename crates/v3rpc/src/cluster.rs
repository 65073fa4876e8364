//! The Cluster service: membership as this member knows it, and its
//! changes (judged and carried out by the leader: etcdserver::reconfig).

use std::sync::Arc;

use api::etcdserverpb::cluster_server::Cluster;
use api::etcdserverpb::{
    Member as PbMember, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use tonic::{Request, Response, Status};

use crate::check_require_leader;
use etcdserver::EtcdServer;

pub struct ClusterService {
    server: Arc<EtcdServer>,
}

impl ClusterService {
    pub fn new(server: Arc<EtcdServer>) -> Self {
        ClusterService { server }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        // Member changes are root's (etcd's authClusterServer).
        crate::auth::require_admin(&self.server, &request).await?;
        check_require_leader(&self.server, &request)?;
        let resp = self.server.member_add(request.into_inner()).await?;
        Ok(Response::new(resp))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        // Member changes are root's (etcd's authClusterServer).
        crate::auth::require_admin(&self.server, &request).await?;
        check_require_leader(&self.server, &request)?;
        let resp = self.server.member_remove(request.into_inner()).await?;
        Ok(Response::new(resp))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        // Member changes are root's (etcd's authClusterServer).
        crate::auth::require_admin(&self.server, &request).await?;
        check_require_leader(&self.server, &request)?;
        let resp = self.server.member_update(request.into_inner()).await?;
        Ok(Response::new(resp))
    }

    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        if request.get_ref().linearizable {
            self.server.linearizable_read_notify().await?;
        }
        // Ordered by ID, as etcd lists them.
        let members: Vec<PbMember> = self
            .server
            .members
            .list()
            .iter()
            .map(etcdserver::reconfig::to_pb)
            .collect();
        // etcd's cluster server header carries no revision.
        let header = self.server.header(0);
        Ok(Response::new(MemberListResponse {
            header: Some(header),
            members,
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        // Member changes are root's (etcd's authClusterServer).
        crate::auth::require_admin(&self.server, &request).await?;
        check_require_leader(&self.server, &request)?;
        let resp = self.server.member_promote(request.into_inner()).await?;
        Ok(Response::new(resp))
    }
}
