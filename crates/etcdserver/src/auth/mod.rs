//! Authentication and role-based access (etcd's server/auth): users,
//! roles, key permissions, the enabled flag and the auth revision, kept in
//! the backend's `auth` record and changed only by applied raft entries;
//! tokens; and the permission checks every request goes through.
//!
//! Where checks run, as in etcd: a write carries its user name and the auth
//! revision its token was checked at in the entry's header, and apply
//! checks it against the store as of that entry (so every member decides
//! alike, and a request checked before an auth change committed gets
//! "revision of auth store is old"); reads are checked on the member that
//! serves them. Nested txns, prev_kv reads and lease keys of puts inside a
//! txn are checked too: the fixed behaviour of etcd 3.5.28/3.5.30 (3.5.16
//! skips them).

mod jwt;
pub use jwt::go_duration_nanos;
pub mod perms;
pub(crate) mod requests;
pub mod tokens;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::authpb::{Permission, Role, User, UserAddOptions};
use api::etcdserverpb::{
    request_op, AuthDisableResponse, AuthEnableResponse, AuthRoleAddRequest, AuthRoleAddResponse,
    AuthRoleDeleteRequest, AuthRoleDeleteResponse, AuthRoleGetRequest, AuthRoleGetResponse,
    AuthRoleGrantPermissionRequest, AuthRoleGrantPermissionResponse, AuthRoleListResponse,
    AuthRoleRevokePermissionRequest, AuthRoleRevokePermissionResponse, AuthStatusResponse,
    AuthUserAddRequest, AuthUserAddResponse, AuthUserChangePasswordRequest,
    AuthUserChangePasswordResponse, AuthUserDeleteRequest, AuthUserDeleteResponse,
    AuthUserGetRequest, AuthUserGetResponse, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse,
    AuthUserListResponse, AuthUserRevokeRoleRequest, AuthUserRevokeRoleResponse,
    AuthenticateResponse, DeleteRangeRequest, InternalAuthenticateRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest,
};
use api::rpctypes::{self, EtcdError};
use base64::Engine;
use lease::Lessor;
use mvcc::{SideTable, Store, TxnWrite};
use parking_lot::RwLock;

pub use perms::Access;
use perms::UserPermissions;
pub use requests::HasHeader;
pub use tokens::TokenProvider;

pub const ROOT_USER: &str = "root";
pub const ROOT_ROLE: &str = "root";

/// etcd's bcrypt cost bounds and default (`--bcrypt-cost`).
pub const BCRYPT_MIN_COST: u32 = 4;
pub const BCRYPT_MAX_COST: u32 = 31;
pub const BCRYPT_DEFAULT_COST: u32 = 10;

/// Who a request runs as: the user and the auth revision its credentials
/// were checked at (0: no credentials, etcd's "user name is empty").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthInfo {
    pub username: String,
    pub revision: u64,
}

/// Auth settings from the command line.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// `--auth-token`: `simple` or `jwt,…`.
    pub token: String,
    /// `--auth-token-ttl` (simple tokens).
    pub token_ttl: Duration,
    /// `--bcrypt-cost`.
    pub bcrypt_cost: u32,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            token: "simple".into(),
            token_ttl: Duration::from_secs(300),
            bcrypt_cost: BCRYPT_DEFAULT_COST,
        }
    }
}

#[derive(Default)]
struct State {
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
    /// Each user's merged grants (etcd's rangePermCache).
    perms: HashMap<String, Arc<UserPermissions>>,
}

impl State {
    fn refresh_perms(&mut self) {
        let roles = &self.roles;
        self.perms = self
            .users
            .iter()
            .map(|(name, user)| {
                let merged = UserPermissions::merge(user.roles.iter().filter_map(|r| roles.get(r)));
                (name.clone(), Arc::new(merged))
            })
            .collect();
    }
}

/// The member's auth store.
pub struct AuthStore {
    state: RwLock<State>,
    enabled: AtomicBool,
    revision: AtomicU64,
    pub tokens: TokenProvider,
    bcrypt_cost: u32,
    /// bcrypt runs off the connection threads, a few at a time: a flood of
    /// Authenticate or UserAdd calls waits here instead of taking every
    /// blocking thread.
    hashing: tokio::sync::Semaphore,
    revision_gauge: prometheus::IntGauge,
}

fn name_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn has_root_role(user: &User) -> bool {
    user.roles.iter().any(|r| r == ROOT_ROLE)
}

impl AuthStore {
    /// etcd's NewAuthStore: a cost outside 4..=31 is warned about and the
    /// default used.
    pub fn new(
        config: &AuthConfig,
        revision_gauge: prometheus::IntGauge,
    ) -> Result<AuthStore, tokens::InvalidOptions> {
        let tokens = TokenProvider::new(&config.token, config.token_ttl)?;
        let mut bcrypt_cost = config.bcrypt_cost;
        if !(BCRYPT_MIN_COST..=BCRYPT_MAX_COST).contains(&bcrypt_cost) {
            tracing::warn!(
                "bcrypt-cost" = bcrypt_cost,
                "default-cost" = BCRYPT_DEFAULT_COST,
                "use default bcrypt cost instead of the invalid given cost"
            );
            bcrypt_cost = BCRYPT_DEFAULT_COST;
        }
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(AuthStore {
            state: RwLock::new(State::default()),
            enabled: AtomicBool::new(false),
            revision: AtomicU64::new(1),
            tokens,
            bcrypt_cost,
            hashing: tokio::sync::Semaphore::new(workers),
            revision_gauge,
        })
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    pub fn bcrypt_cost(&self) -> u32 {
        self.bcrypt_cost
    }

    /// Loads the store from the backend (at start, after a snapshot
    /// replaced it). A backend without an auth record is a fresh store:
    /// disabled, revision 1 (etcd writes authRevision=1 on a new backend).
    pub fn recover(&self, store: &Store) -> Result<(), mvcc::MvccError> {
        let records = store.side_records(SideTable::Auth)?;
        let record = match records.get(&schema::auth::RECORD_KEY) {
            Some(bytes) => schema::auth::decode(bytes).map_err(|e| {
                mvcc::MvccError::Corrupt(format!("the auth store's record cannot be decoded: {e}"))
            })?,
            None => api::oxcdauthpb::AuthStore {
                revision: 1,
                ..Default::default()
            },
        };
        let mut state = self.state.write();
        state.users = record
            .users
            .into_iter()
            .map(|u| (name_of(&u.name), u))
            .collect();
        state.roles = record
            .roles
            .into_iter()
            .map(|r| (name_of(&r.name), r))
            .collect();
        state.refresh_perms();
        let was_enabled = self.enabled.swap(record.enabled, Ordering::AcqRel);
        if was_enabled && !record.enabled {
            self.tokens.clear();
        }
        self.set_revision(record.revision.max(1));
        Ok(())
    }

    fn set_revision(&self, revision: u64) {
        self.revision.store(revision, Ordering::Release);
        self.revision_gauge.set(revision as i64);
    }

    /// Writes the store into the entry's transaction.
    fn persist(&self, w: &mut TxnWrite<'_>, state: &State) {
        let record = api::oxcdauthpb::AuthStore {
            enabled: self.is_enabled(),
            revision: self.revision(),
            users: state.users.values().cloned().collect(),
            roles: state.roles.values().cloned().collect(),
        };
        w.put_side(
            SideTable::Auth,
            schema::auth::RECORD_KEY,
            Some(schema::auth::encode(&record)),
        );
    }

    /// A change to users or roles: `change` validates, then changes
    /// `state`; on success the revision goes up (etcd's commitRevision),
    /// the grants are merged again and the store is written.
    fn change<T>(
        &self,
        w: &mut TxnWrite<'_>,
        change: impl FnOnce(&mut State) -> Result<T, EtcdError>,
    ) -> Result<T, EtcdError> {
        let mut state = self.state.write();
        let out = change(&mut state)?;
        state.refresh_perms();
        self.set_revision(self.revision() + 1);
        self.persist(w, &state);
        Ok(out)
    }

    // ---- applied requests (etcd's authStore methods) ----

    pub fn apply_enable(&self, w: &mut TxnWrite<'_>) -> Result<AuthEnableResponse, EtcdError> {
        if self.is_enabled() {
            return Ok(AuthEnableResponse::default());
        }
        let state = self.state.write();
        let root = state
            .users
            .get(ROOT_USER)
            .ok_or(rpctypes::ROOT_USER_NOT_EXIST)?;
        if !has_root_role(root) {
            return Err(rpctypes::ROOT_ROLE_NOT_EXIST);
        }
        // Enabling does not move the revision (etcd's setRevision(getRevision)).
        self.enabled.store(true, Ordering::Release);
        self.persist(w, &state);
        tracing::info!("enabled authentication");
        Ok(AuthEnableResponse::default())
    }

    pub fn apply_disable(&self, w: &mut TxnWrite<'_>) -> AuthDisableResponse {
        if self.is_enabled() {
            let state = self.state.write();
            self.enabled.store(false, Ordering::Release);
            self.set_revision(self.revision() + 1);
            self.persist(w, &state);
            self.tokens.clear();
            tracing::info!("disabled authentication");
        }
        AuthDisableResponse::default()
    }

    pub fn apply_status(&self) -> AuthStatusResponse {
        AuthStatusResponse {
            header: None,
            enabled: self.is_enabled(),
            auth_revision: self.revision(),
        }
    }

    /// A password checked on the proposing member becomes a token on every
    /// member (the password itself never reaches raft).
    pub fn apply_authenticate(
        &self,
        req: &InternalAuthenticateRequest,
        index: u64,
    ) -> Result<AuthenticateResponse, EtcdError> {
        if !self.is_enabled() {
            return Err(rpctypes::AUTH_NOT_ENABLED);
        }
        {
            let state = self.state.read();
            let user = state.users.get(&req.name).ok_or(rpctypes::AUTH_FAILED)?;
            if user.options.as_ref().is_some_and(|o| o.no_password) {
                return Err(rpctypes::AUTH_FAILED);
            }
        }
        let token = self
            .tokens
            .assign(&req.name, self.revision(), &req.simple_token, index)?;
        tracing::debug!(user = %req.name, "authenticated a user");
        Ok(AuthenticateResponse {
            header: None,
            token,
        })
    }

    /// etcd's selectPassword: the hash the proposer made, or (an entry of
    /// an etcd before 3.5) a plaintext hashed here.
    fn stored_password(&self, password: &str, hashed: &str) -> Result<Vec<u8>, EtcdError> {
        if !password.is_empty() && hashed.is_empty() {
            return bcrypt_hash(password, self.bcrypt_cost)
                .map(String::into_bytes)
                .map_err(|_| rpctypes::NO_PASSWORD_USER);
        }
        base64::engine::general_purpose::STANDARD
            .decode(hashed)
            .map_err(|_| rpctypes::NO_PASSWORD_USER)
    }

    pub fn apply_user_add(
        &self,
        w: &mut TxnWrite<'_>,
        req: &AuthUserAddRequest,
    ) -> Result<AuthUserAddResponse, EtcdError> {
        if req.name.is_empty() {
            return Err(rpctypes::USER_EMPTY);
        }
        self.change(w, |state| {
            if state.users.contains_key(&req.name) {
                return Err(rpctypes::USER_ALREADY_EXIST);
            }
            let options = req.options.unwrap_or(UserAddOptions { no_password: false });
            let password = if options.no_password {
                Vec::new()
            } else {
                self.stored_password(&req.password, &req.hashed_password)?
            };
            state.users.insert(
                req.name.clone(),
                User {
                    name: req.name.clone().into_bytes().into(),
                    password: password.into(),
                    roles: Vec::new(),
                    options: Some(options),
                },
            );
            Ok(AuthUserAddResponse::default())
        })
    }

    pub fn apply_user_delete(
        &self,
        w: &mut TxnWrite<'_>,
        req: &AuthUserDeleteRequest,
    ) -> Result<AuthUserDeleteResponse, EtcdError> {
        if self.is_enabled() && req.name == ROOT_USER {
            tracing::error!("cannot delete 'root' user");
            return Err(rpctypes::INVALID_AUTH_MGMT);
        }
        self.change(w, |state| {
            state
                .users
                .remove(&req.name)
                .ok_or(rpctypes::USER_NOT_FOUND)?;
            Ok(())
        })?;
        self.tokens.invalidate_user(&req.name);
        Ok(AuthUserDeleteResponse::default())
    }

    pub fn apply_user_change_password(
        &self,
        w: &mut TxnWrite<'_>,
        req: &AuthUserChangePasswordRequest,
    ) -> Result<AuthUserChangePasswordResponse, EtcdError> {
        self.change(w, |state| {
            let user = state.users.get(&req.name).ok_or(rpctypes::USER_NOT_FOUND)?;
            let no_password = user.options.as_ref().is_some_and(|o| o.no_password);
            let password = if no_password {
                Vec::new()
            } else {
                self.stored_password(&req.password, &req.hashed_password)?
            };
            if let Some(user) = state.users.get_mut(&req.name) {
                user.password = password.into();
            }
            Ok(())
        })?;
        self.tokens.invalidate_user(&req.name);
        Ok(AuthUserChangePasswordResponse::default())
    }

    pub fn apply_user_grant_role(
        &self,
        w: &mut TxnWrite<'_>,
        req: &AuthUserGrantRoleRequest,
    ) -> Result<AuthUserGrantRoleResponse, EtcdError> {
        {
            let state = self.state.read();
            let user = state.users.get(&req.user).ok_or(rpctypes::USER_NOT_FOUND)?;
            if req.role != ROOT_ROLE && !state.roles.contains_key(&req.role) {
                return Err(rpctypes::ROLE_NOT_FOUND);
            }
            if user.roles.contains(&req.role) {
                // Granted already: nothing changes, the revision stays.
                return Ok(AuthUserGrantRoleResponse::default());
            }
        }
        self.change(w, |state| {
            let user = state
                .users
                .get_mut(&req.user)
                .ok_or(rpctypes::USER_NOT_FOUND)?;
            user.roles.push(req.role.clone());
            user.roles.sort();
            Ok(AuthUserGrantRoleResponse::default())
        })
    }

    pub fn apply_user_get(
        &self,
        req: &AuthUserGetRequest,
    ) -> Result<AuthUserGetResponse, EtcdError> {
        let state = self.state.read();
        let user = state.users.get(&req.name).ok_or(rpctypes::USER_NOT_FOUND)?;
        Ok(AuthUserGetResponse {
            header: None,
            roles: user.roles.clone(),
        })
    }

    pub fn apply_user_list(&self) -> AuthUserListResponse {
        AuthUserListResponse {
            header: None,
            users: self.state.read().users.keys().cloned().collect(),
        }
    }

    pub fn apply_user_revoke_role(
        &self,
        w: &mut TxnWrite<'_>,
        req: &AuthUserRevokeRoleRequest,
    ) -> Result<AuthUserRevokeRoleResponse, EtcdError> {
        if self.is_enabled() && req.name == ROOT_USER && req.role == ROOT_ROLE {
            tracing::error!("'root' user cannot revoke 'root' role");
            return Err(rpctypes::INVALID_AUTH_MGMT);
        }
        self.change(w, |state| {
            let user = state
                .users
                .get_mut(&req.name)
                .ok_or(rpctypes::USER_NOT_FOUND)?;
            let before = user.roles.len();
            user.roles.retain(|r| *r != req.role);
            if user.roles.len() == before {
                return Err(rpctypes::ROLE_NOT_GRANTED);
            }
            Ok(AuthUserRevokeRoleResponse::default())
        })
    }

    pub fn apply_role_add(
        &self,
        w: &mut TxnWrite<'_>,
        req: &AuthRoleAddRequest,
    ) -> Result<AuthRoleAddResponse, EtcdError> {
        if req.name.is_empty() {
            return Err(rpctypes::ROLE_EMPTY);
        }
        self.change(w, |state| {
            if state.roles.contains_key(&req.name) {
                return Err(rpctypes::ROLE_ALREADY_EXIST);
            }
            state.roles.insert(
                req.name.clone(),
                Role {
                    name: req.name.clone().into_bytes().into(),
                    key_permission: Vec::new(),
                },
            );
            Ok(AuthRoleAddResponse::default())
        })
    }

    pub fn apply_role_get(
        &self,
        req: &AuthRoleGetRequest,
    ) -> Result<AuthRoleGetResponse, EtcdError> {
        let state = self.state.read();
        let role = state.roles.get(&req.role).ok_or(rpctypes::ROLE_NOT_FOUND)?;
        Ok(AuthRoleGetResponse {
            header: None,
            perm: role.key_permission.clone(),
        })
    }

    pub fn apply_role_list(&self) -> AuthRoleListResponse {
        AuthRoleListResponse {
            header: None,
            roles: self.state.read().roles.keys().cloned().collect(),
        }
    }

    pub fn apply_role_delete(
        &self,
        w: &mut TxnWrite<'_>,
        req: &AuthRoleDeleteRequest,
    ) -> Result<AuthRoleDeleteResponse, EtcdError> {
        if self.is_enabled() && req.role == ROOT_ROLE {
            tracing::error!("cannot delete 'root' role");
            return Err(rpctypes::INVALID_AUTH_MGMT);
        }
        self.change(w, |state| {
            state
                .roles
                .remove(&req.role)
                .ok_or(rpctypes::ROLE_NOT_FOUND)?;
            for user in state.users.values_mut() {
                user.roles.retain(|r| *r != req.role);
            }
            Ok(AuthRoleDeleteResponse::default())
        })
    }

    pub fn apply_role_grant_permission(
        &self,
        w: &mut TxnWrite<'_>,
        req: &AuthRoleGrantPermissionRequest,
    ) -> Result<AuthRoleGrantPermissionResponse, EtcdError> {
        let perm = req.perm.as_ref().ok_or(rpctypes::PERMISSION_NOT_GIVEN)?;
        if !perms::valid_grant(&perm.key, &perm.range_end) {
            return Err(rpctypes::INVALID_AUTH_MGMT);
        }
        self.change(w, |state| {
            let role = state
                .roles
                .get_mut(&req.name)
                .ok_or(rpctypes::ROLE_NOT_FOUND)?;
            match role
                .key_permission
                .iter_mut()
                .find(|p| p.key == perm.key && p.range_end == perm.range_end)
            {
                Some(existing) => existing.perm_type = perm.perm_type,
                None => {
                    role.key_permission.push(Permission {
                        perm_type: perm.perm_type,
                        key: perm.key.clone(),
                        range_end: perm.range_end.clone(),
                    });
                    // etcd keeps them sorted by key (a stable sort).
                    role.key_permission.sort_by(|a, b| a.key.cmp(&b.key));
                }
            }
            Ok(AuthRoleGrantPermissionResponse::default())
        })
    }

    pub fn apply_role_revoke_permission(
        &self,
        w: &mut TxnWrite<'_>,
        req: &AuthRoleRevokePermissionRequest,
    ) -> Result<AuthRoleRevokePermissionResponse, EtcdError> {
        self.change(w, |state| {
            let role = state
                .roles
                .get_mut(&req.role)
                .ok_or(rpctypes::ROLE_NOT_FOUND)?;
            let before = role.key_permission.len();
            role.key_permission
                .retain(|p| p.key != req.key || p.range_end != req.range_end);
            if role.key_permission.len() == before {
                return Err(rpctypes::PERMISSION_NOT_GRANTED);
            }
            Ok(AuthRoleRevokePermissionResponse::default())
        })
    }

    // ---- permission checks ----

    /// etcd's IsAdminPermitted: auth off, or a user holding the root role.
    /// (No revision check, as etcd.)
    pub fn is_admin_permitted(&self, info: &AuthInfo) -> Result<(), EtcdError> {
        if !self.is_enabled() {
            return Ok(());
        }
        if info.username.is_empty() {
            return Err(rpctypes::USER_EMPTY);
        }
        let state = self.state.read();
        let user = state
            .users
            .get(&info.username)
            .ok_or(rpctypes::USER_NOT_FOUND)?;
        if !has_root_role(user) {
            return Err(rpctypes::PERMISSION_DENIED);
        }
        Ok(())
    }

    /// Whether `username` holds `role` (RoleGet of one's own role).
    pub fn has_role(&self, username: &str, role: &str) -> bool {
        self.state
            .read()
            .users
            .get(username)
            .is_some_and(|u| u.roles.iter().any(|r| r == role))
    }

    /// etcd's isOpPermitted for one key (empty `range_end`) or a range.
    pub fn check(
        &self,
        info: &AuthInfo,
        access: Access,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), EtcdError> {
        if !self.is_enabled() {
            return Ok(());
        }
        if info.revision == 0 {
            return Err(rpctypes::USER_EMPTY);
        }
        if info.revision < self.revision() {
            tracing::warn!(
                "current node auth revision" = self.revision(),
                "request auth revision" = info.revision,
                "request auth revision is less than current node auth revision"
            );
            return Err(rpctypes::AUTH_OLD_REVISION);
        }
        let state = self.state.read();
        let Some(user) = state.users.get(&info.username) else {
            tracing::error!(user = %info.username, "cannot find a user for permission check");
            return Err(rpctypes::PERMISSION_DENIED);
        };
        if has_root_role(user) {
            return Ok(());
        }
        match state.perms.get(&info.username) {
            Some(perms) if perms.permits(access, key, range_end) => Ok(()),
            _ => Err(rpctypes::PERMISSION_DENIED),
        }
    }

    pub fn check_range(&self, info: &AuthInfo, req: &RangeRequest) -> Result<(), EtcdError> {
        self.check(info, Access::Read, &req.key, &req.range_end)
    }

    /// A put: write on its key; write on every key already attached to its
    /// lease (unless root: the user could not revoke that lease); read on
    /// its key when it asks for the previous value.
    pub fn check_put(
        &self,
        info: &AuthInfo,
        req: &PutRequest,
        lessor: &Lessor,
    ) -> Result<(), EtcdError> {
        self.check(info, Access::Write, &req.key, &[])?;
        self.check_lease_keys(info, req.lease, lessor)?;
        if req.prev_kv {
            self.check(info, Access::Read, &req.key, &[])?;
        }
        Ok(())
    }

    pub fn check_delete(&self, info: &AuthInfo, req: &DeleteRangeRequest) -> Result<(), EtcdError> {
        self.check(info, Access::Write, &req.key, &req.range_end)?;
        if req.prev_kv {
            self.check(info, Access::Read, &req.key, &req.range_end)?;
        }
        Ok(())
    }

    /// Every compare (read), then every op of both branches, nested txns
    /// included.
    pub fn check_txn(
        &self,
        info: &AuthInfo,
        req: &TxnRequest,
        lessor: &Lessor,
    ) -> Result<(), EtcdError> {
        for compare in &req.compare {
            self.check(info, Access::Read, &compare.key, &compare.range_end)?;
        }
        self.check_ops(info, &req.success, lessor)?;
        self.check_ops(info, &req.failure, lessor)
    }

    fn check_ops(
        &self,
        info: &AuthInfo,
        ops: &[RequestOp],
        lessor: &Lessor,
    ) -> Result<(), EtcdError> {
        for op in ops {
            match &op.request {
                Some(request_op::Request::RequestRange(r)) => self.check_range(info, r)?,
                Some(request_op::Request::RequestPut(p)) => self.check_put(info, p, lessor)?,
                Some(request_op::Request::RequestDeleteRange(d)) => self.check_delete(info, d)?,
                Some(request_op::Request::RequestTxn(t)) => self.check_txn(info, t, lessor)?,
                None => {}
            }
        }
        Ok(())
    }

    /// LeaseRevoke (and a put with a lease): write on every key attached
    /// to the lease, unless root.
    pub fn check_lease_keys(
        &self,
        info: &AuthInfo,
        lease: i64,
        lessor: &Lessor,
    ) -> Result<(), EtcdError> {
        if lease == 0 || !self.is_enabled() || self.is_admin_permitted(info).is_ok() {
            return Ok(());
        }
        for key in lessor.keys_to_revoke(lease).unwrap_or_default() {
            self.check(info, Access::Write, &key, &[])?;
        }
        Ok(())
    }

    // ---- passwords ----

    /// etcd's CheckPassword, on the member that receives Authenticate: the
    /// auth revision it was checked at, or why not. bcrypt runs on a
    /// blocking thread, a few at a time; an unknown user costs a hash too.
    pub async fn check_password(&self, name: &str, password: &str) -> Result<u64, EtcdError> {
        if !self.is_enabled() {
            return Err(rpctypes::AUTH_NOT_ENABLED);
        }
        let (hash, revision) = {
            let state = self.state.read();
            match state.users.get(name) {
                Some(user) if user.options.as_ref().is_some_and(|o| o.no_password) => {
                    return Err(rpctypes::NO_PASSWORD_USER)
                }
                Some(user) => (Some(name_of(&user.password)), self.revision()),
                None => (None, 0),
            }
        };
        let password = password.to_string();
        let cost = self.bcrypt_cost;
        let matches = self
            .blocking_hash(move || match hash {
                Some(hash) => bcrypt::verify(password, &hash).unwrap_or(false),
                // An unknown user costs a hash too: a wrong name takes as
                // long as a wrong password.
                None => {
                    let _ = bcrypt_hash(&password, cost);
                    false
                }
            })
            .await?;
        if matches {
            Ok(revision)
        } else {
            Err(rpctypes::AUTH_FAILED)
        }
    }

    /// The bcrypt hash of `password` at the configured cost, base64 as
    /// etcd proposes it (`hashedPassword`).
    pub async fn hash_password(&self, password: &str) -> Result<String, EtcdError> {
        let password = password.to_string();
        let cost = self.bcrypt_cost;
        let hash = self
            .blocking_hash(move || bcrypt_hash(&password, cost))
            .await?
            .map_err(|_| rpctypes::AUTH_FAILED)?;
        Ok(base64::engine::general_purpose::STANDARD.encode(hash))
    }

    async fn blocking_hash<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, EtcdError> {
        let _permit = self
            .hashing
            .acquire()
            .await
            .map_err(|_| rpctypes::STOPPED)?;
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|_| rpctypes::STOPPED)
    }

    /// The user a token stands for, checked at the store's current
    /// revision (simple tokens) or the one it was signed at (JWT). A simple
    /// token registered at an index this member has not applied yet is
    /// looked up once `applied` reaches it.
    pub fn token_info(&self, token: &str) -> Option<AuthInfo> {
        match &self.tokens {
            TokenProvider::Simple(tokens) => tokens.user(token).map(|username| AuthInfo {
                username,
                revision: self.revision(),
            }),
            TokenProvider::Jwt(jwt) => jwt
                .info(token)
                .map(|(username, revision)| AuthInfo { username, revision }),
        }
    }
}

/// Go's bcrypt format (`$2a$`), which etcd stores and reads.
fn bcrypt_hash(password: &str, cost: u32) -> Result<String, bcrypt::BcryptError> {
    Ok(bcrypt::hash_with_result(password, cost)?.format_for_version(bcrypt::Version::TwoA))
}
