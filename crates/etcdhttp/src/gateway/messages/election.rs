//! v3election and v3lock messages (etcd's v3election.proto, v3lock.proto).

use api::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use api::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use serde_json::Value;
use tonic::Status;

use super::{header, key_value, FromJson, ToJson};
use crate::gateway::json::{Fields, Obj};

impl FromJson for LeaderKey {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LeaderKey {
            name: f.bytes("name")?.into(),
            key: f.bytes("key")?.into(),
            rev: f.int("rev")?,
            lease: f.int("lease")?,
        })
    }
}

fn leader_key(out: &mut String, l: &LeaderKey) {
    let mut o = Obj::new(out);
    o.bytes("name", &l.name)
        .bytes("key", &l.key)
        .int("rev", l.rev)
        .int("lease", l.lease);
    o.end();
}

/// An optional LeaderKey field: absent (or null) is None, as jsonpb reads it.
fn optional_leader(f: &Fields<'_>) -> Result<Option<LeaderKey>, Status> {
    f.msg("leader").map(LeaderKey::from_json).transpose()
}

impl FromJson for CampaignRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(CampaignRequest {
            name: f.bytes("name")?.into(),
            lease: f.int("lease")?,
            value: f.bytes("value")?.into(),
        })
    }
}

impl ToJson for CampaignResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header).msg(
            "leader",
            self.leader.as_ref(),
            leader_key,
        );
        o.end();
    }
}

impl FromJson for LeaderRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LeaderRequest {
            name: f.bytes("name")?.into(),
        })
    }
}

impl ToJson for LeaderResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .msg("kv", self.kv.as_ref(), key_value);
        o.end();
    }
}

impl FromJson for ProclaimRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(ProclaimRequest {
            leader: optional_leader(&f)?,
            value: f.bytes("value")?.into(),
        })
    }
}

impl FromJson for ResignRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(ResignRequest {
            leader: optional_leader(&f)?,
        })
    }
}

impl FromJson for LockRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LockRequest {
            name: f.bytes("name")?.into(),
            lease: f.int("lease")?,
        })
    }
}

impl ToJson for LockResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .bytes("key", &self.key);
        o.end();
    }
}

impl FromJson for UnlockRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(UnlockRequest {
            key: f.bytes("key")?.into(),
        })
    }
}

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

header_response!(ProclaimResponse, ResignResponse, UnlockResponse);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::messages::to_json_string;

    #[test]
    fn leader_key_round_trips_with_int64_fields_as_strings() {
        let value: Value = serde_json::from_str(
            r#"{"leader":{"name":"ZWw=","key":"ZWwvNGQ=","rev":"4","lease":77},"value":"djI="}"#,
        )
        .unwrap();
        let proclaim = ProclaimRequest::from_json(&value).unwrap();
        let leader = proclaim.leader.clone().unwrap();
        assert_eq!(&leader.key[..], b"el/4d");
        assert_eq!((leader.rev, leader.lease), (4, 77));
        assert_eq!(&proclaim.value[..], b"v2");
        let response = CampaignResponse {
            header: None,
            leader: Some(leader),
        };
        assert_eq!(
            to_json_string(&response),
            r#"{"leader":{"name":"ZWw=","key":"ZWwvNGQ=","rev":"4","lease":"77"}}"#
        );
    }

    #[test]
    fn a_missing_leader_stays_none_for_the_service_to_reject() {
        let empty = serde_json::json!({});
        assert!(ResignRequest::from_json(&empty).unwrap().leader.is_none());
        let null = serde_json::json!({"leader": null});
        assert!(ProclaimRequest::from_json(&null).unwrap().leader.is_none());
        let wrong = serde_json::json!({"leader": 5});
        assert!(ResignRequest::from_json(&wrong).is_err());
    }

    #[test]
    fn lock_key_is_base64() {
        let value = serde_json::json!({"name": "bGs=", "lease": "77"});
        let lock = LockRequest::from_json(&value).unwrap();
        assert_eq!((&lock.name[..], lock.lease), (&b"lk"[..], 77));
        let response = LockResponse {
            header: None,
            key: b"lk/4d".to_vec().into(),
        };
        assert_eq!(to_json_string(&response), r#"{"key":"bGsvNGQ="}"#);
    }
}
