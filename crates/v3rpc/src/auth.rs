//! The Auth service (etcd's api/v3rpc/auth.go) and the credentials every
//! other service reads from a request: the `token` metadata (or
//! `authorization`, raw, as the gateway forwards it) and, with
//! `--client-cert-auth`, the verified client certificate's Common Name.

use std::sync::Arc;

use api::etcdserverpb::auth_server::Auth;
use api::etcdserverpb::*;
use api::rpctypes::EtcdError;
use etcdserver::auth::AuthInfo;
use etcdserver::EtcdServer;
use tonic::{Request, Response, Status};

use crate::TlsConnectInfo;

/// etcd's TokenFieldNameGRPC and TokenFieldNameSwagger.
pub const TOKEN_KEY: &str = "token";
pub const AUTHORIZATION_KEY: &str = "authorization";
/// Set by the gateway on the requests it forwards: a gateway request never
/// runs as the certificate's Common Name (etcd's grpcgateway-accept check).
pub const GATEWAY_KEY: &str = "grpcgateway-accept";

/// The credentials a request came with.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub token: Option<String>,
    /// The verified client certificate's Common Name (never for gateway
    /// requests).
    pub common_name: Option<String>,
}

impl Credentials {
    pub fn of<T>(request: &Request<T>) -> Credentials {
        let metadata = request.metadata();
        let token = metadata
            .get(TOKEN_KEY)
            .or_else(|| metadata.get(AUTHORIZATION_KEY))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let common_name = if metadata.contains_key(GATEWAY_KEY) {
            None
        } else {
            request
                .extensions()
                .get::<TlsConnectInfo>()
                .and_then(|info| info.common_name.clone())
        };
        Credentials { token, common_name }
    }

    /// Who they stand for (None: auth is off or none came).
    pub async fn user(&self, server: &EtcdServer) -> Result<Option<AuthInfo>, EtcdError> {
        if !server.auth.is_enabled() {
            return Ok(None);
        }
        server
            .auth_info(self.token.as_deref(), self.common_name.as_deref())
            .await
    }
}

/// Who `request` runs as (None: auth is off or no credentials came).
pub async fn user_of<T>(
    server: &EtcdServer,
    request: &Request<T>,
) -> Result<Option<AuthInfo>, Status> {
    if !server.auth.is_enabled() {
        return Ok(None);
    }
    Ok(Credentials::of(request).user(server).await?)
}

/// An error as Go's gRPC status prints it (`rpc error: code = … desc =
/// …`): etcd's watch cancel reasons are written this way.
pub fn go_status_text(e: EtcdError) -> String {
    format!("rpc error: code = {:?} desc = {}", e.code, e.message)
}

/// Defragment, Snapshot, Hash, HashKV and member changes: root only when
/// auth is on (etcd's authMaintenanceServer and authClusterServer).
pub async fn require_admin<T>(server: &EtcdServer, request: &Request<T>) -> Result<(), Status> {
    if !server.auth.is_enabled() {
        return Ok(());
    }
    let user = user_of(server, request).await?.unwrap_or_default();
    Ok(server.auth.is_admin_permitted(&user)?)
}

pub struct AuthService {
    server: Arc<EtcdServer>,
}

impl AuthService {
    pub fn new(server: Arc<EtcdServer>) -> Self {
        AuthService { server }
    }
}

/// An Auth request through raft on behalf of the caller.
async fn through_raft<P>(
    server: &EtcdServer,
    request: Request<P>,
) -> Result<Response<P::Response>, Status>
where
    P: etcdserver::apply::Proposal,
    P::Response: etcdserver::auth::HasHeader,
{
    let user = user_of(server, &request).await?;
    let resp = server
        .auth_request(user.as_ref(), request.into_inner())
        .await?;
    Ok(Response::new(resp))
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn auth_status(
        &self,
        request: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        through_raft(&self.server, request).await
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        Ok(Response::new(
            self.server.authenticate(request.into_inner()).await?,
        ))
    }

    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let user = user_of(&self.server, &request).await?;
        let resp = self
            .server
            .user_add(user.as_ref(), request.into_inner())
            .await?;
        Ok(Response::new(resp))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let user = user_of(&self.server, &request).await?;
        let resp = self
            .server
            .user_change_password(user.as_ref(), request.into_inner())
            .await?;
        Ok(Response::new(resp))
    }
}
