//! The member's side of auth (etcd's v3_server.go): who a request runs as,
//! Authenticate (password checked here, token made by every member), the
//! password hashing before UserAdd/UserChangePassword reach raft, and the
//! check-read-recheck of requests served without raft.

use api::etcdserverpb::{
    AuthUserAddRequest, AuthUserChangePasswordRequest, AuthenticateRequest, AuthenticateResponse,
    InternalAuthenticateRequest,
};
use api::rpctypes::{self, EtcdError};

use super::{tokens, AuthInfo, AuthStore, ROOT_USER};
use crate::apply::Proposal;
use crate::server::EtcdServer;

impl EtcdServer {
    /// The member's own requests (lease expiry) run as root, as etcd's
    /// `WithRoot`.
    pub fn root(&self) -> AuthInfo {
        AuthInfo {
            username: ROOT_USER.into(),
            revision: self.auth.revision(),
        }
    }

    /// Who a request runs as (etcd's AuthInfoFromCtx, then AuthInfoFromTLS):
    /// None when auth is off or no credentials came. A token wins over a
    /// certificate; the verified client certificate's Common Name counts
    /// only with `--client-cert-auth` (the caller passes None for gateway
    /// requests). A simple token made at a raft index this member has not
    /// applied yet is looked up once it has.
    pub async fn auth_info(
        &self,
        token: Option<&str>,
        cert_common_name: Option<&str>,
    ) -> Result<Option<AuthInfo>, EtcdError> {
        if !self.auth.is_enabled() {
            return Ok(None);
        }
        if let Some(token) = token {
            if let (super::TokenProvider::Simple(_), Some(index)) =
                (&self.auth.tokens, tokens::simple_token_index(token))
            {
                let deadline = tokio::time::Instant::now() + self.cfg.request_timeout();
                if self.wait_applied(index, deadline).await.is_err() {
                    return Err(rpctypes::INVALID_AUTH_TOKEN);
                }
            }
            return match self.auth.token_info(token) {
                Some(info) => Ok(Some(info)),
                None => {
                    // etcd logs the token itself here; we never log tokens.
                    tracing::warn!("invalid auth token");
                    Err(rpctypes::INVALID_AUTH_TOKEN)
                }
            };
        }
        if self.cfg.client_tls.client_cert_auth {
            if let Some(cn) = cert_common_name {
                return Ok(Some(AuthInfo {
                    username: cn.to_string(),
                    revision: self.auth.revision(),
                }));
            }
        }
        Ok(None)
    }

    /// etcd's doSerialize, for what is served without raft: check, read,
    /// then "revision of auth store is old" if an auth change applied
    /// meanwhile (the read may have been allowed by grants now gone).
    pub fn serialized<T>(
        &self,
        user: Option<&AuthInfo>,
        check: impl FnOnce(&AuthStore, &AuthInfo) -> Result<(), EtcdError>,
        read: impl FnOnce() -> Result<T, EtcdError>,
    ) -> Result<T, EtcdError> {
        let anonymous = AuthInfo::default();
        let user = user.unwrap_or(&anonymous);
        check(&self.auth, user)?;
        let out = read()?;
        if user.revision != 0 && user.revision != self.auth.revision() {
            return Err(rpctypes::AUTH_OLD_REVISION);
        }
        Ok(out)
    }

    /// etcd's Authenticate: a linearizable read, the password checked on
    /// this member (bcrypt, off the connection threads), then the token
    /// proposed without the password; again if an auth change committed
    /// between the check and the token.
    pub async fn authenticate(
        &self,
        req: AuthenticateRequest,
    ) -> Result<AuthenticateResponse, EtcdError> {
        self.linearizable_read_notify().await?;
        loop {
            let checked = match self.auth.check_password(&req.name, &req.password).await {
                Ok(revision) => revision,
                Err(e) => {
                    if e != rpctypes::AUTH_NOT_ENABLED {
                        tracing::warn!(user = %req.name, error = %e, "invalid authentication was requested");
                    }
                    return Err(e);
                }
            };
            let internal = InternalAuthenticateRequest {
                name: req.name.clone(),
                password: String::new(),
                simple_token: self.auth.tokens.prefix(),
            };
            let mut resp = self.propose(internal).await?;
            if checked == self.auth.revision() {
                self.fill_header(&mut resp.header);
                return Ok(resp);
            }
            tracing::info!("revision when password checked became stale; retrying");
        }
    }

    /// An Auth request through raft on behalf of `user`, its header filled.
    pub async fn auth_request<P>(
        &self,
        user: Option<&AuthInfo>,
        req: P,
    ) -> Result<P::Response, EtcdError>
    where
        P: Proposal,
        P::Response: HasHeader,
    {
        let mut resp = self.propose_as(user, req).await?;
        self.fill_header(resp.header_mut());
        Ok(resp)
    }

    /// UserAdd: the password is hashed here and only the hash goes through
    /// raft (etcd 3.5).
    pub async fn user_add(
        &self,
        user: Option<&AuthInfo>,
        mut req: AuthUserAddRequest,
    ) -> Result<api::etcdserverpb::AuthUserAddResponse, EtcdError> {
        if !req.options.as_ref().is_some_and(|o| o.no_password) {
            req.hashed_password = self.auth.hash_password(&req.password).await?;
            req.password.clear();
        }
        self.auth_request(user, req).await
    }

    pub async fn user_change_password(
        &self,
        user: Option<&AuthInfo>,
        mut req: AuthUserChangePasswordRequest,
    ) -> Result<api::etcdserverpb::AuthUserChangePasswordResponse, EtcdError> {
        if !req.password.is_empty() {
            req.hashed_password = self.auth.hash_password(&req.password).await?;
            req.password.clear();
        }
        self.auth_request(user, req).await
    }
}

/// A response with etcd's header.
pub trait HasHeader {
    fn header_mut(&mut self) -> &mut Option<api::etcdserverpb::ResponseHeader>;
}

macro_rules! has_header {
    ($($t:ident),* $(,)?) => {
        $(impl HasHeader for api::etcdserverpb::$t {
            fn header_mut(&mut self) -> &mut Option<api::etcdserverpb::ResponseHeader> {
                &mut self.header
            }
        })*
    };
}

has_header!(
    AuthEnableResponse,
    AuthDisableResponse,
    AuthStatusResponse,
    AuthUserAddResponse,
    AuthUserDeleteResponse,
    AuthUserChangePasswordResponse,
    AuthUserGrantRoleResponse,
    AuthUserGetResponse,
    AuthUserRevokeRoleResponse,
    AuthUserListResponse,
    AuthRoleAddResponse,
    AuthRoleGrantPermissionResponse,
    AuthRoleGetResponse,
    AuthRoleRevokePermissionResponse,
    AuthRoleDeleteResponse,
    AuthRoleListResponse,
    MemberAddResponse,
    MemberRemoveResponse,
    MemberUpdateResponse,
    MemberPromoteResponse,
);
