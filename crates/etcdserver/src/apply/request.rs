//! The requests a raft entry carries, written down once: from this list come
//! the typed request ([`Request`]), its response ([`ApplyResponse`]), the
//! entry encoding, the metrics label, and the typed proposal
//! ([`Proposal`]: a proposer gets the response of its request's kind, so
//! no caller matches on the kind it did not ask for).

use api::etcdserverpb::*;

use crate::auth::AuthInfo;

/// A request type that can be proposed; its response comes back typed.
pub trait Proposal: Into<Request> {
    type Response;
    /// The response of this request's kind (always the one apply gives it).
    fn response(response: ApplyResponse) -> Option<Self::Response>;
}

macro_rules! requests {
    ($($kind:ident($request:ty, $field:ident) => $response:ty;)*) => {
        /// A committed request, decoded once from its raft entry.
        #[derive(Debug, Clone)]
        pub enum Request {
            $($kind($request),)*
        }

        /// What applying a [`Request`] gives its proposer.
        #[derive(Debug, Clone)]
        pub enum ApplyResponse {
            $($kind($response),)*
        }

        impl ApplyResponse {
            /// The response's protobuf size (etcd's "size:N" of a slow
            /// apply).
            pub fn encoded_len(&self) -> usize {
                match self {
                    $(ApplyResponse::$kind(response) => prost::Message::encoded_len(response),)*
                }
            }
        }

        impl Request {
            /// etcd's op labels (etcd_server_apply_duration_seconds), in
            /// [`Request::kind`] order.
            pub const KINDS: &'static [&'static str] = &[$(stringify!($kind),)*];

            /// This request's position in [`Request::KINDS`].
            pub fn kind(&self) -> usize {
                let mut kind = 0;
                $(
                    if matches!(self, Request::$kind(_)) {
                        return kind;
                    }
                    kind += 1;
                )*
                unreachable!("{kind} kinds and none matched")
            }

            /// The request a raft entry carries, the proposal ID it was
            /// proposed under and who proposed it; None when it carries no
            /// request this member knows.
            pub fn from_entry(entry: InternalRaftRequest) -> Option<(u64, AuthInfo, Request)> {
                let (id, user) = match &entry.header {
                    Some(h) => (h.id, AuthInfo { username: h.username.clone(), revision: h.auth_revision }),
                    None => (entry.id, AuthInfo::default()),
                };
                $(if let Some(request) = entry.$field {
                    return Some((id, user, Request::$kind(request)));
                })*
                None
            }

            /// The raft entry proposing this request under proposal `id`,
            /// on behalf of `user` (None: auth is off or the request carries
            /// no credentials).
            pub fn into_entry(self, id: u64, user: Option<&AuthInfo>) -> InternalRaftRequest {
                let mut entry = InternalRaftRequest {
                    header: Some(RequestHeader {
                        id,
                        username: user.map(|u| u.username.clone()).unwrap_or_default(),
                        auth_revision: user.map_or(0, |u| u.revision),
                    }),
                    ..Default::default()
                };
                match self {
                    $(Request::$kind(request) => entry.$field = Some(request),)*
                }
                entry
            }
        }

        $(
            impl From<$request> for Request {
                fn from(request: $request) -> Request {
                    Request::$kind(request)
                }
            }

            impl Proposal for $request {
                type Response = $response;
                fn response(response: ApplyResponse) -> Option<$response> {
                    #[allow(unreachable_patterns)]
                    match response {
                        ApplyResponse::$kind(response) => Some(response),
                        _ => None,
                    }
                }
            }
        )*
    };
}

requests! {
    Put(PutRequest, put) => PutResponse;
    DeleteRange(DeleteRangeRequest, delete_range) => DeleteRangeResponse;
    Txn(TxnRequest, txn) => TxnResponse;
    Compaction(CompactionRequest, compaction) => CompactionResponse;
    LeaseGrant(LeaseGrantRequest, lease_grant) => LeaseGrantResponse;
    LeaseRevoke(LeaseRevokeRequest, lease_revoke) => LeaseRevokeResponse;
    LeaseCheckpoint(LeaseCheckpointRequest, lease_checkpoint) => ();
    Alarm(AlarmRequest, alarm) => AlarmResponse;
    ClusterMemberAttrSet(ClusterMemberAttrSetRequest, cluster_member_attr_set) => ();
    Authenticate(InternalAuthenticateRequest, authenticate) => AuthenticateResponse;
    AuthEnable(AuthEnableRequest, auth_enable) => AuthEnableResponse;
    AuthDisable(AuthDisableRequest, auth_disable) => AuthDisableResponse;
    AuthStatus(AuthStatusRequest, auth_status) => AuthStatusResponse;
    AuthUserAdd(AuthUserAddRequest, auth_user_add) => AuthUserAddResponse;
    AuthUserDelete(AuthUserDeleteRequest, auth_user_delete) => AuthUserDeleteResponse;
    AuthUserChangePassword(AuthUserChangePasswordRequest, auth_user_change_password) => AuthUserChangePasswordResponse;
    AuthUserGrantRole(AuthUserGrantRoleRequest, auth_user_grant_role) => AuthUserGrantRoleResponse;
    AuthUserGet(AuthUserGetRequest, auth_user_get) => AuthUserGetResponse;
    AuthUserRevokeRole(AuthUserRevokeRoleRequest, auth_user_revoke_role) => AuthUserRevokeRoleResponse;
    AuthRoleAdd(AuthRoleAddRequest, auth_role_add) => AuthRoleAddResponse;
    AuthRoleGrantPermission(AuthRoleGrantPermissionRequest, auth_role_grant_permission) => AuthRoleGrantPermissionResponse;
    AuthRoleGet(AuthRoleGetRequest, auth_role_get) => AuthRoleGetResponse;
    AuthRoleRevokePermission(AuthRoleRevokePermissionRequest, auth_role_revoke_permission) => AuthRoleRevokePermissionResponse;
    AuthRoleDelete(AuthRoleDeleteRequest, auth_role_delete) => AuthRoleDeleteResponse;
    AuthUserList(AuthUserListRequest, auth_user_list) => AuthUserListResponse;
    AuthRoleList(AuthRoleListRequest, auth_role_list) => AuthRoleListResponse;
}

impl Request {
    /// Whether the capped applier (NOSPACE raised) refuses it: it would
    /// grow the backend (etcd's applierV3Capped).
    pub fn grows_backend(&self) -> bool {
        match self {
            Request::Put(_) | Request::LeaseGrant(_) => true,
            Request::Txn(txn) => crate::alarms::cost_txn(txn) > 0,
            _ => false,
        }
    }

    /// Whether only root may make it when auth is on (etcd's
    /// needAdminPermission).
    pub fn needs_admin(&self) -> bool {
        matches!(
            self,
            Request::AuthEnable(_)
                | Request::AuthDisable(_)
                | Request::AuthStatus(_)
                | Request::AuthUserAdd(_)
                | Request::AuthUserDelete(_)
                | Request::AuthUserChangePassword(_)
                | Request::AuthUserGrantRole(_)
                | Request::AuthUserRevokeRole(_)
                | Request::AuthRoleAdd(_)
                | Request::AuthRoleGrantPermission(_)
                | Request::AuthRoleRevokePermission(_)
                | Request::AuthRoleDelete(_)
                | Request::AuthUserList(_)
                | Request::AuthRoleList(_)
        )
    }

    /// Whether the corrupt applier (CORRUPT raised) refuses it: it writes
    /// keys or leases (etcd's applierV3Corrupt).
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Request::Put(_)
                | Request::DeleteRange(_)
                | Request::Txn(_)
                | Request::Compaction(_)
                | Request::LeaseGrant(_)
                | Request::LeaseRevoke(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_etcds_op_labels_and_index_them() {
        let requests: Vec<Request> = vec![
            PutRequest::default().into(),
            DeleteRangeRequest::default().into(),
            TxnRequest::default().into(),
            CompactionRequest::default().into(),
            LeaseGrantRequest::default().into(),
            LeaseRevokeRequest::default().into(),
            LeaseCheckpointRequest::default().into(),
            AlarmRequest::default().into(),
            ClusterMemberAttrSetRequest::default().into(),
        ];
        let labels: Vec<&str> = requests.iter().map(|r| Request::KINDS[r.kind()]).collect();
        assert_eq!(
            labels,
            [
                "Put",
                "DeleteRange",
                "Txn",
                "Compaction",
                "LeaseGrant",
                "LeaseRevoke",
                "LeaseCheckpoint",
                "Alarm",
                "ClusterMemberAttrSet"
            ]
        );
        // An entry carries its request and proposal ID both ways.
        let user = AuthInfo {
            username: "alice".into(),
            revision: 7,
        };
        for request in requests {
            let kind = request.kind();
            let (id, who, back) =
                Request::from_entry(request.into_entry(42, Some(&user))).expect("known");
            assert_eq!((id, back.kind()), (42, kind));
            assert_eq!(who, user);
        }
        assert!(Request::from_entry(InternalRaftRequest::default()).is_none());
    }
}
