//! GET /health as etcd 3.5 answers it (etcdhttp/metrics.go):
//! `{"health":"true","reason":""}` with 200, or `{"health":"false",
//! "reason":"..."}` with 503 when an alarm is active ("ALARM NOSPACE",
//! "ALARM CORRUPT"; `?exclude=NOSPACE` ignores that alarm), when the member
//! sees no leader ("RAFT NO LEADER") or when a read through raft fails
//! within the request timeout ("RANGE ERROR:<error>").
//!
//! `?serializable=true` (etcd 3.5.x later than 3.5.1, which ignores it)
//! checks this member alone: no leader needed, and the read is local.

use std::sync::Arc;

use api::etcdserverpb::{AlarmType, RangeRequest};
use axum::body::Body;
use http::{header, HeaderValue, Method, StatusCode};

use crate::{method_not_allowed, plain_error};
use etcdserver::EtcdServer;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Health {
    pub healthy: bool,
    pub reason: String,
}

impl Health {
    fn ok() -> Health {
        Health {
            healthy: true,
            reason: String::new(),
        }
    }

    fn failed(reason: String) -> Health {
        Health {
            healthy: false,
            reason,
        }
    }

    pub(crate) fn to_json(&self) -> String {
        format!(
            "{{\"health\":\"{}\",\"reason\":{}}}",
            self.healthy,
            serde_json::to_string(&self.reason).unwrap_or_else(|_| "\"\"".into())
        )
    }
}

/// The alarms raised in the cluster, by etcd's names ("NOSPACE", "CORRUPT").
pub(crate) fn active_alarms(server: &EtcdServer) -> Vec<&'static str> {
    server
        .alarms
        .get(AlarmType::None as i32)
        .iter()
        .map(|m| {
            AlarmType::try_from(m.alarm)
                .map(|a| a.as_str_name())
                .unwrap_or("UNKNOWN")
        })
        .collect()
}

/// etcd's checkHealth + checkV3Health.
pub(crate) async fn check(
    server: &EtcdServer,
    excluded_alarms: &[String],
    serializable: bool,
) -> Health {
    for alarm in active_alarms(server) {
        if excluded_alarms.iter().any(|excluded| excluded == alarm) {
            continue;
        }
        let reason = match alarm {
            "NOSPACE" => "ALARM NOSPACE",
            "CORRUPT" => "ALARM CORRUPT",
            _ => "ALARM UNKNOWN",
        };
        tracing::warn!(alarm, "serving /health false due to an alarm");
        return Health::failed(reason.to_string());
    }
    if !serializable && !server.has_leader() {
        tracing::warn!("serving /health false; no leader");
        return Health::failed("RAFT NO LEADER".to_string());
    }
    if let Err(e) = read(server, serializable).await {
        tracing::warn!(error = %e, "serving /health false; Range failed");
        return Health::failed(format!("RANGE ERROR:{e}"));
    }
    Health::ok()
}

/// A one-key, keys-only range, linearizable unless `serializable`: proves
/// that raft serves reads (etcd's ReqTimeout bounds it).
pub(crate) async fn read(server: &EtcdServer, serializable: bool) -> Result<(), String> {
    if !serializable {
        server
            .linearizable_read_notify()
            .await
            .map_err(|e| e.message.to_string())?;
    }
    let request = RangeRequest {
        key: b"\0".to_vec().into(),
        keys_only: true,
        limit: 1,
        serializable,
        ..Default::default()
    };
    server
        .store
        .range(&request)
        .map(|_| ())
        .map_err(|e| etcdserver::errors::from_mvcc(&e).message.to_string())
}

pub(crate) fn query_values(uri: &http::Uri, name: &str) -> Vec<String> {
    let Some(query) = uri.query() else {
        return Vec::new();
    };
    url::form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
        .collect()
}

pub(crate) async fn serve(
    server: Arc<EtcdServer>,
    request: http::Request<Body>,
) -> http::Response<Body> {
    if request.method() != Method::GET {
        return method_not_allowed(Some("GET"));
    }
    let excluded = query_values(request.uri(), "exclude");
    let serializable = query_values(request.uri(), "serializable")
        .first()
        .is_some_and(|v| v == "true");
    let health = check(&server, &excluded, serializable).await;
    if health.healthy {
        server.metrics.health_success.inc();
        let mut response = http::Response::new(Body::from(health.to_json()));
        // Go sniffs a JSON body as text/plain.
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    } else {
        server.metrics.health_failures.inc();
        plain_error(StatusCode::SERVICE_UNAVAILABLE, &health.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_etcds() {
        assert_eq!(Health::ok().to_json(), r#"{"health":"true","reason":""}"#);
        assert_eq!(
            Health::failed("RAFT NO LEADER".into()).to_json(),
            r#"{"health":"false","reason":"RAFT NO LEADER"}"#
        );
    }
}
