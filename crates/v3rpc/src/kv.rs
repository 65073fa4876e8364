//! The KV service (etcd's api/v3rpc/key.go + the read path of v3_server.go).

use std::sync::Arc;
use std::time::Instant;

use api::etcdserverpb::kv_server::Kv;
use api::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use tonic::{Request, Response, Status};

use crate::auth::user_of;
use crate::check_require_leader;
use crate::checks;
use api::rpctypes::EtcdError;
use etcdserver::auth::AuthInfo;
use etcdserver::errors;
use etcdserver::expensive::{warn_read_only_range, warn_read_only_txn};
use etcdserver::EtcdServer;

pub struct KvService {
    server: Arc<EtcdServer>,
}

impl KvService {
    pub fn new(server: Arc<EtcdServer>) -> Self {
        KvService { server }
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let user = user_of(&self.server, &request).await?;
        let req = request.into_inner();
        checks::check_range(&req)?;
        // a learner serves serializable reads only (etcd's interceptor)
        if !req.serializable && self.server.is_learner() {
            return Err(api::rpctypes::NOT_SUPPORTED_FOR_LEARNER.status());
        }
        let started = Instant::now();
        let read = self.read_range(user.as_ref(), &req).await;
        warn_read_only_range(
            &self.server.metrics,
            self.server.cfg.warning_apply_duration,
            started,
            &req,
            read.as_ref().map_err(|e| e.message),
        );
        let mut resp = read?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let user = user_of(&self.server, &request).await?;
        let req = request.into_inner();
        checks::check_put(&req)?;
        self.server
            .check_quota(etcdserver::alarms::cost_put(&req))
            .await?;
        let mut resp = self.server.propose_as(user.as_ref(), req).await?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let user = user_of(&self.server, &request).await?;
        let req = request.into_inner();
        checks::check_delete(&req)?;
        let mut resp = self.server.propose_as(user.as_ref(), req).await?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        let user = user_of(&self.server, &request).await?;
        let req = request.into_inner();
        checks::check_txn(&req, self.server.cfg.max_txn_ops)?;
        let mut resp = if checks::txn_is_read_only(&req) {
            let started = Instant::now();
            let read = self.read_txn(user.as_ref(), &req).await;
            warn_read_only_txn(
                &self.server.metrics,
                self.server.cfg.warning_apply_duration,
                started,
                &req,
                read.as_ref().map_err(|e| e.message),
            );
            read?
        } else {
            self.server
                .check_quota(etcdserver::alarms::cost_txn(&req))
                .await?;
            self.server.propose_as(user.as_ref(), req).await?
        };
        fill_txn_headers(&self.server, &mut resp);
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        check_require_leader(&self.server, &request)?;
        // Compaction has no permission check in etcd 3.5, but the entry
        // carries its user like any other.
        let user = user_of(&self.server, &request).await?;
        let req = request.into_inner();
        let (revision, physical) = (req.revision, req.physical);
        let mut resp = self.server.propose_as(user.as_ref(), req).await?;
        if physical {
            self.server.wait_compaction_physical(revision).await?;
        }
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }
}

impl KvService {
    /// A range served here (etcd's EtcdServer.Range after v3rpc's checks).
    async fn read_range(
        &self,
        user: Option<&AuthInfo>,
        req: &RangeRequest,
    ) -> Result<RangeResponse, EtcdError> {
        if !req.serializable {
            self.server.linearizable_read_notify().await?;
        }
        self.server.serialized(
            user,
            |auth, user| auth.check_range(user, req),
            || {
                self.server
                    .store
                    .range(req)
                    .map_err(|e| errors::from_mvcc(&e))
            },
        )
    }

    /// A read-only txn: it never reaches raft; it is evaluated on a write
    /// handle that changes nothing, hence records no index.
    async fn read_txn(
        &self,
        user: Option<&AuthInfo>,
        req: &TxnRequest,
    ) -> Result<TxnResponse, EtcdError> {
        if !checks::txn_is_serializable(req) {
            self.server.linearizable_read_notify().await?;
        }
        self.server.serialized(
            user,
            |auth, user| auth.check_txn(user, req, &self.server.lessor),
            || {
                self.server
                    .store
                    .read_txn(req)
                    .map_err(|e| errors::from_mvcc(&e))
            },
        )
    }
}

/// etcd fills only the top-level header; nested responses keep just the
/// revision the apply set.
fn fill_txn_headers(server: &EtcdServer, resp: &mut TxnResponse) {
    server.fill_header(&mut resp.header);
}
