//! Maintenance and Cluster messages.

use api::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse,
    DowngradeRequest, DowngradeResponse, HashRequest, HashResponse, Member, MemberAddRequest,
    MemberAddResponse, MemberListRequest, MemberListResponse, MemberPromoteRequest,
    MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest,
    MemberUpdateResponse, MoveLeaderRequest, MoveLeaderResponse, SnapshotRequest, SnapshotResponse,
    StatusRequest, StatusResponse,
};
use serde_json::Value;
use tonic::Status;

use super::{header, FromJson, ToJson};
use crate::gateway::json::{EnumType, Fields, Obj};

const ALARM_ACTION: EnumType = EnumType {
    name: "etcdserverpb.AlarmRequest.AlarmAction",
    values: &["GET", "ACTIVATE", "DEACTIVATE"],
};
const ALARM_TYPE: EnumType = EnumType {
    name: "etcdserverpb.AlarmType",
    values: &["NONE", "NOSPACE", "CORRUPT"],
};
const DOWNGRADE_ACTION: EnumType = EnumType {
    name: "etcdserverpb.DowngradeRequest.DowngradeAction",
    values: &["VALIDATE", "ENABLE", "CANCEL"],
};

/// Requests without fields: any JSON object (or an empty body) will do.
macro_rules! empty_request {
    ($($message:ident),*) => {$(
        impl FromJson for $message {
            fn from_json(value: &Value) -> Result<Self, Status> {
                Fields::of(value)?;
                Ok($message {})
            }
        }
    )*};
}

empty_request!(
    StatusRequest,
    DefragmentRequest,
    HashRequest,
    SnapshotRequest
);

/// Responses that carry only a header.
macro_rules! header_response {
    ($($message:ident),*) => {$(
        impl ToJson for $message {
            fn to_json(&self, out: &mut String) {
                let mut o = Obj::new(out);
                o.msg("header", self.header.as_ref(), header);
                o.end();
            }
        }
    )*};
}

header_response!(DefragmentResponse, MoveLeaderResponse);

impl FromJson for MemberListRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(MemberListRequest {
            linearizable: f.bool("linearizable")?,
        })
    }
}

impl ToJson for StatusResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .str("version", &self.version)
            .int("dbSize", self.db_size)
            .int("leader", self.leader)
            .int("raftIndex", self.raft_index)
            .int("raftTerm", self.raft_term)
            .int("raftAppliedIndex", self.raft_applied_index)
            .strings("errors", &self.errors)
            .int("dbSizeInUse", self.db_size_in_use)
            .bool("isLearner", self.is_learner);
        o.end();
    }
}

fn member(out: &mut String, m: &Member) {
    let mut o = Obj::new(out);
    o.int("ID", m.id)
        .str("name", &m.name)
        .strings("peerURLs", &m.peer_ur_ls)
        .strings("clientURLs", &m.client_ur_ls)
        .bool("isLearner", m.is_learner);
    o.end();
}

impl FromJson for AlarmRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(AlarmRequest {
            action: f.enumeration("action", &ALARM_ACTION)?,
            member_id: f.uint("memberID")?,
            alarm: f.enumeration("alarm", &ALARM_TYPE)?,
        })
    }
}

fn alarm_member(out: &mut String, a: &AlarmMember) {
    let mut o = Obj::new(out);
    o.int("memberID", a.member_id)
        .enumeration("alarm", a.alarm, &ALARM_TYPE);
    o.end();
}

impl ToJson for AlarmResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .msgs("alarms", &self.alarms, alarm_member);
        o.end();
    }
}

impl ToJson for HashResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .int32("hash", i64::from(self.hash));
        o.end();
    }
}

impl FromJson for MoveLeaderRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(MoveLeaderRequest {
            target_id: f.uint("targetID")?,
        })
    }
}

impl ToJson for SnapshotResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .int("remaining_bytes", self.remaining_bytes)
            .bytes("blob", &self.blob);
        o.end();
    }
}

impl FromJson for DowngradeRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(DowngradeRequest {
            action: f.enumeration("action", &DOWNGRADE_ACTION)?,
            version: f.string("version")?,
        })
    }
}

impl ToJson for DowngradeResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .str("version", &self.version);
        o.end();
    }
}

impl FromJson for MemberAddRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(MemberAddRequest {
            peer_ur_ls: f.strings("peerURLs")?,
            is_learner: f.bool("isLearner")?,
        })
    }
}

impl ToJson for MemberAddResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .msg("member", self.member.as_ref(), member)
            .msgs("members", &self.members, member);
        o.end();
    }
}

impl FromJson for MemberRemoveRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(MemberRemoveRequest { id: f.uint("ID")? })
    }
}

impl FromJson for MemberUpdateRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(MemberUpdateRequest {
            id: f.uint("ID")?,
            peer_ur_ls: f.strings("peerURLs")?,
        })
    }
}

impl FromJson for MemberPromoteRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(MemberPromoteRequest { id: f.uint("ID")? })
    }
}

/// Responses that carry a header and the members after the change.
macro_rules! members_response {
    ($($message:ident),*) => {$(
        impl ToJson for $message {
            fn to_json(&self, out: &mut String) {
                let mut o = Obj::new(out);
                o.msg("header", self.header.as_ref(), header)
                    .msgs("members", &self.members, member);
                o.end();
            }
        }
    )*};
}

members_response!(
    MemberListResponse,
    MemberRemoveResponse,
    MemberUpdateResponse,
    MemberPromoteResponse
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::messages::to_json_string;
    use api::etcdserverpb::ResponseHeader;

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn alarm_request_takes_enums_by_name_or_number() {
        let by_name = AlarmRequest::from_json(&parse(
            r#"{"action":"DEACTIVATE","memberID":"7","alarm":"CORRUPT"}"#,
        ))
        .unwrap();
        assert_eq!(
            (by_name.action, by_name.member_id, by_name.alarm),
            (2, 7, 2)
        );
        let by_number =
            AlarmRequest::from_json(&parse(r#"{"action":1,"memberID":7,"alarm":1}"#)).unwrap();
        assert_eq!((by_number.action, by_number.alarm), (1, 1));
        let bogus = AlarmRequest::from_json(&parse(r#"{"action":"BOGUS"}"#)).unwrap_err();
        assert_eq!(bogus.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn alarm_members_print_member_id_as_a_string_and_alarm_by_name() {
        let response = AlarmResponse {
            header: Some(ResponseHeader {
                revision: 1,
                ..Default::default()
            }),
            alarms: vec![AlarmMember {
                member_id: 1,
                alarm: 1,
            }],
        };
        assert_eq!(
            to_json_string(&response),
            r#"{"header":{"revision":"1"},"alarms":[{"memberID":"1","alarm":"NOSPACE"}]}"#
        );
    }

    #[test]
    fn hash_is_a_json_number_and_remaining_bytes_a_string() {
        let hash = HashResponse {
            header: None,
            hash: u32::MAX,
        };
        assert_eq!(to_json_string(&hash), r#"{"hash":4294967295}"#);
        let chunk = SnapshotResponse {
            header: None,
            remaining_bytes: 32,
            blob: b"db".to_vec().into(),
        };
        assert_eq!(
            to_json_string(&chunk),
            r#"{"remaining_bytes":"32","blob":"ZGI="}"#
        );
        assert_eq!(to_json_string(&DefragmentResponse { header: None }), "{}");
    }

    #[test]
    fn member_requests_take_uint64_ids_and_url_lists() {
        let update = MemberUpdateRequest::from_json(&parse(
            r#"{"ID":"18446744073709551615","peerURLs":["http://a:2380"]}"#,
        ))
        .unwrap();
        assert_eq!(update.id, u64::MAX);
        assert_eq!(update.peer_ur_ls, vec!["http://a:2380".to_string()]);
        let wrong = MemberAddRequest::from_json(&parse(r#"{"peerURLs":[1]}"#)).unwrap_err();
        assert_eq!(
            wrong.message(),
            "json: cannot unmarshal number into Go value of type string"
        );
        let target = MoveLeaderRequest::from_json(&parse(r#"{"targetID":"9"}"#)).unwrap();
        assert_eq!(target.target_id, 9);
        let downgrade =
            DowngradeRequest::from_json(&parse(r#"{"action":"ENABLE","version":"3.4"}"#)).unwrap();
        assert_eq!((downgrade.action, downgrade.version.as_str()), (1, "3.4"));
    }
}
