//! The requests a raft entry carries, written down once: from this list come
//! the typed request ([`Request`]), its response ([`ApplyResponse`]), the
//! entry encoding, the metrics label, and the typed proposal
//! ([`Proposal`]: a proposer gets the response of its request's kind, so
//! no caller matches on the kind it did not ask for).

use api::etcdserverpb::{
    AlarmRequest, AlarmResponse, ClusterMemberAttrSetRequest, CompactionRequest,
    CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, InternalRaftRequest,
    LeaseCheckpointRequest, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, PutRequest, PutResponse, RequestHeader, TxnRequest, TxnResponse,
};

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

            /// The request a raft entry carries, and the proposal ID it was
            /// proposed under; None when it carries no request this member
            /// knows.
            pub fn from_entry(entry: InternalRaftRequest) -> Option<(u64, Request)> {
                let id = entry.header.as_ref().map_or(entry.id, |h| h.id);
                $(if let Some(request) = entry.$field {
                    return Some((id, Request::$kind(request)));
                })*
                None
            }

            /// The raft entry proposing this request under proposal `id`.
            pub fn into_entry(self, id: u64) -> InternalRaftRequest {
                let mut entry = InternalRaftRequest {
                    header: Some(RequestHeader { id, ..Default::default() }),
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
        for request in requests {
            let kind = request.kind();
            let (id, back) = Request::from_entry(request.into_entry(42)).expect("known");
            assert_eq!((id, back.kind()), (42, kind));
        }
        assert!(Request::from_entry(InternalRaftRequest::default()).is_none());
    }
}
