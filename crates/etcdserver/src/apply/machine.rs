//! The state machine: a committed request in, its response out, as a
//! function of the member's state (store, lessor, alarms, members) and the
//! entry. No raft, no threads, no clock but the lessor's grant time: a test
//! drives it entry by entry.
//!
//! Each entry is one mvcc write transaction, whatever it carries: its key
//! changes, its side-table records (leases, alarms, members) and its
//! consistent index are published together at the transaction's end — the
//! one place an entry's index is recorded. An entry at or below the store's
//! consistent index was applied before (a restart replays the WAL above the
//! durable index) and is skipped.
//!
//! Alarms restrict what applies as etcd's wrapping appliers do: with
//! NOSPACE raised the [`Capped`] applier refuses what would grow the
//! backend, with CORRUPT the [`Corrupt`] applier refuses every write.
//! Inside them the [`Authorized`] applier refuses what the entry's user may
//! not do (etcd's authApplierV3), before [`Backend`] carries it out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::{
    alarm_request::AlarmAction, AlarmRequest, AlarmResponse, AlarmType,
    ClusterMemberAttrSetRequest, CompactionRequest, CompactionResponse, DeleteRangeRequest,
    LeaseCheckpointRequest, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, ResponseHeader,
};
use api::rpctypes::{self, EtcdError};
use lease::Lessor;
use mvcc::{SideTable, Store, TxnWrite};

use super::request::{ApplyResponse, Request};
use super::ApplyOutcome;
use crate::alarms::{Alarms, Restriction};
use crate::auth::{AuthInfo, AuthStore};
use crate::errors;
use crate::membership::ClusterMembers;
use crate::metrics::Metrics;

/// etcd's DefaultWarningApplyDuration.
pub const DEFAULT_WARNING_APPLY_DURATION: Duration = Duration::from_millis(100);

/// The member's replicated state, and how a committed request changes it.
pub struct StateMachine {
    pub(crate) store: Arc<Store>,
    pub(crate) lessor: Arc<Lessor>,
    pub(crate) alarms: Arc<Alarms>,
    pub(crate) members: Arc<ClusterMembers>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) auth: Arc<AuthStore>,
    /// `--experimental-warning-apply-duration`.
    warning_apply_duration: Duration,
}

/// Why a request was not carried out.
pub(crate) enum ApplyError {
    /// The request's own error, for its proposer; every member gives it
    /// alike (the entry is applied: its index is recorded).
    Refused(EtcdError),
    /// Apply cannot carry the entry out (the backend failed under it): it
    /// halts, publishing nothing of it.
    Halt(String),
}

impl From<EtcdError> for ApplyError {
    fn from(e: EtcdError) -> Self {
        ApplyError::Refused(e)
    }
}

impl From<mvcc::MvccError> for ApplyError {
    fn from(e: mvcc::MvccError) -> Self {
        match e {
            mvcc::MvccError::Backend(_) | mvcc::MvccError::Corrupt(_) => {
                ApplyError::Halt(format!("the backend failed under it: {e}"))
            }
            e => ApplyError::Refused(errors::from_mvcc(&e)),
        }
    }
}

/// What an applier does with one request, inside the entry's transaction.
trait Apply {
    fn apply(&self, w: &mut TxnWrite<'_>, request: Request) -> Result<ApplyResponse, ApplyError>;
}

/// etcd's applierV3Capped: refuses what would grow the backend.
struct Capped<A>(A);

impl<A: Apply> Apply for Capped<A> {
    fn apply(&self, w: &mut TxnWrite<'_>, request: Request) -> Result<ApplyResponse, ApplyError> {
        if request.grows_backend() {
            return Err(rpctypes::NO_SPACE.into());
        }
        self.0.apply(w, request)
    }
}

/// etcd's applierV3Corrupt: refuses every write.
struct Corrupt<A>(A);

impl<A: Apply> Apply for Corrupt<A> {
    fn apply(&self, w: &mut TxnWrite<'_>, request: Request) -> Result<ApplyResponse, ApplyError> {
        if request.writes() {
            return Err(rpctypes::CORRUPT.into());
        }
        self.0.apply(w, request)
    }
}

/// etcd's authApplierV3: the request's user (from the entry's header)
/// must be allowed to make it, as of this entry.
struct Authorized<'m, A> {
    inner: A,
    machine: &'m StateMachine,
    user: AuthInfo,
}

impl<A: Apply> Apply for Authorized<'_, A> {
    fn apply(&self, w: &mut TxnWrite<'_>, request: Request) -> Result<ApplyResponse, ApplyError> {
        let (auth, user, lessor) = (&self.machine.auth, &self.user, &self.machine.lessor);
        if request.needs_admin() {
            auth.is_admin_permitted(user)?;
        }
        match &request {
            Request::Put(put) => auth.check_put(user, put, lessor)?,
            Request::DeleteRange(delete) => auth.check_delete(user, delete)?,
            Request::Txn(txn) => auth.check_txn(user, txn, lessor)?,
            Request::LeaseRevoke(revoke) => auth.check_lease_keys(user, revoke.id, lessor)?,
            // One's own user and one's own roles may be read without root.
            Request::AuthUserGet(get) => {
                if let Err(e) = auth.is_admin_permitted(user) {
                    if get.name != user.username {
                        return Err(e.into());
                    }
                }
            }
            Request::AuthRoleGet(get) => {
                if let Err(e) = auth.is_admin_permitted(user) {
                    if !auth.has_role(&user.username, &get.role) {
                        return Err(e.into());
                    }
                }
            }
            _ => {}
        }
        self.inner.apply(w, request)
    }
}

/// etcd's applierV3backend: every request carried out.
struct Backend<'m> {
    machine: &'m StateMachine,
    /// The entry's raft index (simple tokens carry it).
    index: u64,
}

impl Apply for Backend<'_> {
    fn apply(&self, w: &mut TxnWrite<'_>, request: Request) -> Result<ApplyResponse, ApplyError> {
        let m = self.machine;
        let auth = &m.auth;
        Ok(match request {
            Request::Put(put) => ApplyResponse::Put(w.put(&put)?),
            Request::DeleteRange(delete) => ApplyResponse::DeleteRange(w.delete_range(&delete)?),
            Request::Txn(txn) => ApplyResponse::Txn(w.txn(&txn)?),
            Request::Compaction(req) => ApplyResponse::Compaction(m.compact(w, &req)?),
            Request::LeaseGrant(req) => ApplyResponse::LeaseGrant(m.lease_grant(w, &req)?),
            Request::LeaseRevoke(req) => ApplyResponse::LeaseRevoke(m.lease_revoke(w, &req)?),
            Request::LeaseCheckpoint(req) => {
                m.lease_checkpoint(w, &req);
                ApplyResponse::LeaseCheckpoint(())
            }
            Request::Alarm(req) => ApplyResponse::Alarm(m.alarm(w, &req)),
            Request::ClusterMemberAttrSet(req) => {
                m.member_attributes(w, req);
                ApplyResponse::ClusterMemberAttrSet(())
            }
            Request::Authenticate(req) => {
                ApplyResponse::Authenticate(auth.apply_authenticate(&req, self.index)?)
            }
            Request::AuthEnable(_) => ApplyResponse::AuthEnable(auth.apply_enable(w)?),
            Request::AuthDisable(_) => ApplyResponse::AuthDisable(auth.apply_disable(w)),
            Request::AuthStatus(_) => ApplyResponse::AuthStatus(auth.apply_status()),
            Request::AuthUserAdd(req) => ApplyResponse::AuthUserAdd(auth.apply_user_add(w, &req)?),
            Request::AuthUserDelete(req) => {
                ApplyResponse::AuthUserDelete(auth.apply_user_delete(w, &req)?)
            }
            Request::AuthUserChangePassword(req) => {
                ApplyResponse::AuthUserChangePassword(auth.apply_user_change_password(w, &req)?)
            }
            Request::AuthUserGrantRole(req) => {
                ApplyResponse::AuthUserGrantRole(auth.apply_user_grant_role(w, &req)?)
            }
            Request::AuthUserGet(req) => ApplyResponse::AuthUserGet(auth.apply_user_get(&req)?),
            Request::AuthUserRevokeRole(req) => {
                ApplyResponse::AuthUserRevokeRole(auth.apply_user_revoke_role(w, &req)?)
            }
            Request::AuthRoleAdd(req) => ApplyResponse::AuthRoleAdd(auth.apply_role_add(w, &req)?),
            Request::AuthRoleGrantPermission(req) => {
                ApplyResponse::AuthRoleGrantPermission(auth.apply_role_grant_permission(w, &req)?)
            }
            Request::AuthRoleGet(req) => ApplyResponse::AuthRoleGet(auth.apply_role_get(&req)?),
            Request::AuthRoleRevokePermission(req) => {
                ApplyResponse::AuthRoleRevokePermission(auth.apply_role_revoke_permission(w, &req)?)
            }
            Request::AuthRoleDelete(req) => {
                ApplyResponse::AuthRoleDelete(auth.apply_role_delete(w, &req)?)
            }
            Request::AuthUserList(_) => ApplyResponse::AuthUserList(auth.apply_user_list()),
            Request::AuthRoleList(_) => ApplyResponse::AuthRoleList(auth.apply_role_list()),
        })
    }
}

impl StateMachine {
    pub fn new(
        store: Arc<Store>,
        lessor: Arc<Lessor>,
        alarms: Arc<Alarms>,
        members: Arc<ClusterMembers>,
        metrics: Arc<Metrics>,
        auth: Arc<AuthStore>,
    ) -> StateMachine {
        StateMachine {
            store,
            lessor,
            alarms,
            members,
            metrics,
            auth,
            warning_apply_duration: DEFAULT_WARNING_APPLY_DURATION,
        }
    }

    /// Applies slower than `duration` are logged and counted as slow.
    pub fn with_warning_apply_duration(mut self, duration: Duration) -> StateMachine {
        self.warning_apply_duration = duration;
        self
    }

    /// Applies the committed entry at `index` carrying `request` (None: an
    /// entry with no request, raft's empty entries and conf changes).
    /// Ok(None) for an entry applied before; Ok(Some(outcome)) for its
    /// proposer; Err(cause) when apply cannot carry it out (nothing of it
    /// is published and its index is not recorded: the loop halts).
    #[cfg(test)]
    pub(crate) fn apply(
        &self,
        index: u64,
        request: Option<(AuthInfo, Request)>,
    ) -> Result<Option<ApplyOutcome>, String> {
        self.apply_logged(index, request, &[])
    }

    /// [`StateMachine::apply`] of the entry whose data is `entry`: a slow
    /// apply is logged with the request it carries (etcd's
    /// warnOfExpensiveRequest), read back from `entry` only then.
    pub(crate) fn apply_logged(
        &self,
        index: u64,
        request: Option<(AuthInfo, Request)>,
        entry: &[u8],
    ) -> Result<Option<ApplyOutcome>, String> {
        if index <= self.store.consistent_index() {
            return Ok(None);
        }
        let mut w = self.store.write(index);
        let outcome = match request {
            None => None,
            Some((user, request)) => {
                let kind = request.kind();
                let started = Instant::now();
                let authorized = Authorized {
                    inner: Backend {
                        machine: self,
                        index,
                    },
                    machine: self,
                    user,
                };
                let applied = match self.alarms.restriction() {
                    Restriction::None => authorized.apply(&mut w, request),
                    Restriction::Capped => Capped(authorized).apply(&mut w, request),
                    Restriction::Corrupt => Corrupt(authorized).apply(&mut w, request),
                };
                let outcome = match applied {
                    Ok(response) => Ok(response),
                    Err(ApplyError::Refused(e)) => Err(e),
                    // The dropped transaction publishes nothing.
                    Err(ApplyError::Halt(cause)) => return Err(cause),
                };
                self.metrics
                    .ops
                    .applied(kind, outcome.is_ok(), started.elapsed());
                crate::expensive::warn_if_slow(
                    &self.metrics,
                    self.warning_apply_duration,
                    started,
                    "",
                    || {
                        api::codec::decode_internal_raft_request(entry)
                            .map(|request| crate::expensive::loggable_entry(&request))
                            .unwrap_or_default()
                    },
                    || match &outcome {
                        Ok(response) => crate::expensive::Outcome {
                            response: format!("size:{}", response.encoded_len()),
                            error: None,
                        },
                        Err(e) => crate::expensive::Outcome {
                            response: String::new(),
                            error: Some(e.to_string()),
                        },
                    },
                );
                Some(outcome)
            }
        };
        let written = w.end();
        self.lessor.on_events(&written.events);
        Ok(outcome)
    }

    fn compact(
        &self,
        w: &mut TxnWrite<'_>,
        req: &CompactionRequest,
    ) -> Result<CompactionResponse, ApplyError> {
        w.compact(req.revision)?;
        Ok(CompactionResponse {
            header: Some(ResponseHeader {
                revision: w.revision(),
                ..Default::default()
            }),
        })
    }

    fn lease_grant(
        &self,
        w: &mut TxnWrite<'_>,
        req: &LeaseGrantRequest,
    ) -> Result<LeaseGrantResponse, ApplyError> {
        let (ttl, record) = self.lessor.grant(req.id, req.ttl, Instant::now())?;
        self.metrics.ops.lease_granted.inc();
        self.metrics.ops.lease_ttl.observe(ttl as f64);
        w.put_side(SideTable::Leases, req.id as u64, Some(record));
        Ok(LeaseGrantResponse {
            header: None,
            id: req.id,
            ttl,
            error: String::new(),
        })
    }

    /// Deletes every key of the lease in one revision (in key order, as
    /// etcd) and the lease record with it.
    fn lease_revoke(
        &self,
        w: &mut TxnWrite<'_>,
        req: &LeaseRevokeRequest,
    ) -> Result<LeaseRevokeResponse, ApplyError> {
        let keys = self
            .lessor
            .keys_to_revoke(req.id)
            .ok_or(rpctypes::LEASE_NOT_FOUND)?;
        for key in keys {
            w.delete_range(&DeleteRangeRequest {
                key,
                ..Default::default()
            })?;
        }
        w.put_side(SideTable::Leases, req.id as u64, None);
        self.lessor.remove(req.id);
        self.metrics.ops.lease_revoked.inc();
        Ok(LeaseRevokeResponse {
            header: Some(ResponseHeader {
                revision: w.revision(),
                ..Default::default()
            }),
        })
    }

    fn lease_checkpoint(&self, w: &mut TxnWrite<'_>, req: &LeaseCheckpointRequest) {
        for (id, record) in self.lessor.checkpoint(&req.checkpoints, Instant::now()) {
            w.put_side(SideTable::Leases, id as u64, Some(record));
        }
    }

    /// etcd's applierV3backend.Alarm: GET lists; ACTIVATE/DEACTIVATE change
    /// the set (persisted with this entry) and answer with the alarm
    /// changed, if any.
    fn alarm(&self, w: &mut TxnWrite<'_>, req: &AlarmRequest) -> AlarmResponse {
        let mut resp = AlarmResponse::default();
        let changed = match AlarmAction::try_from(req.action) {
            Ok(AlarmAction::Get) => {
                resp.alarms = self.alarms.get(req.alarm);
                None
            }
            Ok(AlarmAction::Activate) => self
                .alarms
                .activate(req.member_id, req.alarm)
                .map(|m| (m, true)),
            Ok(AlarmAction::Deactivate) => self
                .alarms
                .deactivate(req.member_id, req.alarm)
                .map(|m| (m, false)),
            Err(_) => None,
        };
        if let Some((member, raised)) = changed {
            let name = AlarmType::try_from(member.alarm).map_or("UNKNOWN", |a| a.as_str_name());
            if raised {
                tracing::warn!(alarm = name, "from" = %format!("{:x}", member.member_id), "alarm raised");
            } else {
                tracing::info!(alarm = name, "from" = %format!("{:x}", member.member_id), "alarm disarmed");
            }
            w.put_side(
                SideTable::Alarms,
                schema::alarms::record_key(member.member_id, member.alarm),
                raised.then(|| schema::alarms::encode(member.member_id, member.alarm)),
            );
            resp.alarms.push(member);
        }
        resp
    }

    /// A member's published name and client URLs.
    fn member_attributes(&self, w: &mut TxnWrite<'_>, req: ClusterMemberAttrSetRequest) {
        let attributes = req.member_attributes.unwrap_or_default();
        match self
            .members
            .set_attributes(req.member_id, &attributes.name, &attributes.client_urls)
        {
            Some(member) => w.put_side(
                SideTable::Members,
                member.id,
                Some(schema::members::encode(&member)),
            ),
            None => {
                tracing::warn!(member = %format!("{:x}", req.member_id), "attributes of an unknown member ignored")
            }
        }
    }

    /// Applies the committed conf change at `index` to the member list
    /// (raft's configuration took it already), recording it in the same
    /// transaction as the index. Ok(None) for an entry applied before;
    /// Ok(Some(members)) the list after it, for its proposer.
    pub(crate) fn apply_conf_change(
        &self,
        index: u64,
        cc: &raft::eraftpb::ConfChange,
    ) -> Result<Option<Vec<crate::membership::Member>>, String> {
        use crate::membership::ConfOutcome;
        use raft::eraftpb::ConfChangeType;
        if index <= self.store.consistent_index() {
            return Ok(None);
        }
        let mut w = self.store.write(index);
        let id = cc.node_id;
        let proposed = (!cc.context.is_empty())
            .then(|| schema::members::decode(&cc.context))
            .flatten();
        let outcome = match cc.get_change_type() {
            ConfChangeType::AddNode => self.members.apply_add(id, false, proposed),
            ConfChangeType::AddLearnerNode => self.members.apply_add(id, true, proposed),
            ConfChangeType::RemoveNode => self.members.apply_remove(id),
        };
        let hex = format!("{id:x}");
        match &outcome {
            ConfOutcome::Added(m) | ConfOutcome::Updated(m) | ConfOutcome::Promoted(m) => {
                w.put_side(SideTable::Members, id, Some(schema::members::encode(m)));
                let urls = format!("[{}]", m.peer_urls.join(" "));
                match outcome {
                    ConfOutcome::Added(_) if m.is_learner => tracing::info!("added-peer-id" = %hex,
                        "added-peer-peer-urls" = %urls, "added-peer-is-learner" = true, "added member"),
                    ConfOutcome::Added(_) => tracing::info!("added-peer-id" = %hex,
                        "added-peer-peer-urls" = %urls, "added-peer-is-learner" = false, "added member"),
                    ConfOutcome::Promoted(_) => {
                        tracing::info!("promoted-member-id" = %hex, "promote member")
                    }
                    _ => tracing::info!("updated-remote-peer-id" = %hex,
                        "updated-remote-peer-peer-urls" = %urls, "updated member"),
                }
            }
            ConfOutcome::Removed(_) => {
                w.put_side(SideTable::Members, id, None);
                w.put_side(
                    SideTable::MembersRemoved,
                    id,
                    Some(schema::members::REMOVED_RECORD.to_vec()),
                );
                tracing::info!("removed-member-id" = %hex, "removed member");
            }
            ConfOutcome::Ignored => {
                tracing::warn!("member-id" = %hex, "a conf change names a removed member: ignored")
            }
        }
        w.end();
        Ok(Some(self.members.list()))
    }

    /// Rebuilds what lives beside the store (leases, alarms, members) from
    /// it: at start and after a snapshot replaced the store.
    pub(crate) fn recover(&self) -> Result<(), mvcc::MvccError> {
        crate::bootstrap::recover_alarms(&self.alarms, &self.store)?;
        crate::bootstrap::recover_lessor(&self.lessor, &self.store)?;
        self.auth.recover(&self.store)?;
        let members = self.store.members()?;
        let removed = self.store.side_records(SideTable::MembersRemoved)?;
        self.members.replace(
            members
                .values()
                .filter_map(|b| schema::members::decode(b))
                .collect(),
            removed.into_keys().collect(),
        );
        Ok(())
    }
}
