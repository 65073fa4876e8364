//! Lease messages.

use api::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use serde_json::Value;
use tonic::Status;

use super::{header, FromJson, ToJson};
use crate::gateway::json::{Fields, Obj};

impl FromJson for LeaseGrantRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LeaseGrantRequest {
            ttl: f.int("TTL")?,
            id: f.int("ID")?,
        })
    }
}

impl FromJson for LeaseRevokeRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LeaseRevokeRequest { id: f.int("ID")? })
    }
}

impl FromJson for LeaseTimeToLiveRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LeaseTimeToLiveRequest {
            id: f.int("ID")?,
            keys: f.bool("keys")?,
        })
    }
}

impl FromJson for LeaseLeasesRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        Fields::of(value)?;
        Ok(LeaseLeasesRequest {})
    }
}

impl ToJson for LeaseGrantResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .int("ID", self.id)
            .int("TTL", self.ttl)
            .str("error", &self.error);
        o.end();
    }
}

impl ToJson for LeaseRevokeResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header);
        o.end();
    }
}

impl ToJson for LeaseTimeToLiveResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .int("ID", self.id)
            .int("TTL", self.ttl)
            .int("grantedTTL", self.granted_ttl)
            .bytes_list("keys", &self.keys);
        o.end();
    }
}

fn lease_status(out: &mut String, l: &LeaseStatus) {
    let mut o = Obj::new(out);
    o.int("ID", l.id);
    o.end();
}

impl ToJson for LeaseLeasesResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .msgs("leases", &self.leases, lease_status);
        o.end();
    }
}

impl FromJson for LeaseKeepAliveRequest {
    fn from_json(value: &Value) -> Result<Self, Status> {
        let f = Fields::of(value)?;
        Ok(LeaseKeepAliveRequest { id: f.int("ID")? })
    }
}

impl ToJson for LeaseKeepAliveResponse {
    fn to_json(&self, out: &mut String) {
        let mut o = Obj::new(out);
        o.msg("header", self.header.as_ref(), header)
            .int("ID", self.id)
            .int("TTL", self.ttl);
        o.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::messages::to_json_string;

    #[test]
    fn keep_alive_of_an_unknown_lease_leaves_ttl_out() {
        let value: Value = serde_json::from_str(r#"{"ID":"5"}"#).unwrap();
        let request = LeaseKeepAliveRequest::from_json(&value).unwrap();
        assert_eq!(request.id, 5);
        let response = LeaseKeepAliveResponse {
            header: Some(api::etcdserverpb::ResponseHeader {
                revision: 3,
                ..Default::default()
            }),
            id: 5,
            ttl: 0,
        };
        assert_eq!(
            to_json_string(&response),
            r#"{"header":{"revision":"3"},"ID":"5"}"#
        );
        let renewed = LeaseKeepAliveResponse {
            ttl: 60,
            ..response
        };
        assert!(to_json_string(&renewed).ends_with(r#""ID":"5","TTL":"60"}"#));
    }
}
