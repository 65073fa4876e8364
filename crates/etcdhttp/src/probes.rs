//! GET /livez and /readyz as etcd 3.5.16 answers them (etcdhttp/health.go,
//! its CheckRegistry): named checks, each also at `/<probe>/<check>`.
//!
//! - /livez: `serializable_read`, a local read (the process serves).
//! - /readyz: `data_corruption` (no CORRUPT alarm), `serializable_read`
//!   and `linearizable_read` (a read through raft: a leader and a quorum).
//!
//! 200 with `ok\n`, preceded by one `[+]<check> ok` line per check with
//! `?verbose`; 503 with one `[+]`/`[-]<check> failed: <error>` line per check
//! when any fails. `?exclude=<check>` (repeatable, root path only) skips a
//! check; excluding one that does not exist is warned about, not refused.
//! Each run sets etcd_server_healthcheck{type,name} and counts
//! etcd_server_healthchecks_total{type,name,status}. etcd runs the checks in
//! Go's random map order; oxcd in the order above.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Body;
use http::{Method, StatusCode};

use crate::health::{active_alarms, query_values, read};
use crate::{method_not_allowed, plain_error, plain_text};
use etcdserver::EtcdServer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    Livez,
    Readyz,
}

impl Probe {
    fn name(self) -> &'static str {
        match self {
            Probe::Livez => "livez",
            Probe::Readyz => "readyz",
        }
    }

    fn checks(self) -> &'static [&'static str] {
        match self {
            Probe::Livez => &["serializable_read"],
            Probe::Readyz => &["data_corruption", "serializable_read", "linearizable_read"],
        }
    }
}

/// The paths to route: each probe's root and one per check.
pub(crate) fn paths() -> Vec<(String, Probe, Option<&'static str>)> {
    let mut paths = Vec::new();
    for probe in [Probe::Livez, Probe::Readyz] {
        paths.push((format!("/{}", probe.name()), probe, None));
        for check in probe.checks() {
            paths.push((format!("/{}/{check}", probe.name()), probe, Some(*check)));
        }
    }
    paths
}

async fn run_check(server: &EtcdServer, check: &str) -> Result<(), String> {
    match check {
        "data_corruption" => match active_alarms(server).contains(&"CORRUPT") {
            true => Err("alarm activated: CORRUPT".to_string()),
            false => Ok(()),
        },
        "serializable_read" => read(server, true).await,
        _ => read(server, false).await,
    }
}

/// The checks of `probe` to run: all but the excluded ones (the root), or
/// the one a sub-path names.
fn selected(probe: Probe, only: Option<&'static str>, excluded: &[String]) -> Vec<&'static str> {
    if let Some(check) = only {
        return vec![check];
    }
    let missing: Vec<String> = excluded
        .iter()
        .filter(|name| !name.is_empty() && !probe.checks().contains(&name.as_str()))
        .map(|name| format!("{name:?}"))
        .collect();
    if !missing.is_empty() {
        tracing::warn!(
            missing_health_checks = %missing.join(","),
            "some health checks cannot be excluded"
        );
    }
    probe
        .checks()
        .iter()
        .copied()
        .filter(|check| !excluded.iter().any(|name| name == check))
        .collect()
}

pub(crate) async fn serve(
    server: Arc<EtcdServer>,
    probe: Probe,
    only: Option<&'static str>,
    request: http::Request<Body>,
) -> http::Response<Body> {
    let path = request.uri().path().to_string();
    if request.method() != Method::GET {
        tracing::warn!(path, status_code = 405, "Health request error");
        return method_not_allowed(Some("GET"));
    }
    let excluded = query_values(request.uri(), "exclude");
    let mut reason = String::new();
    let mut failed = false;
    for check in selected(probe, only, &excluded) {
        let status = match run_check(&server, check).await {
            Ok(()) => {
                let _ = writeln!(reason, "[+]{check} ok");
                "success"
            }
            Err(e) => {
                let _ = writeln!(reason, "[-]{check} failed: {e}");
                failed = true;
                "error"
            }
        };
        let metrics = &server.metrics;
        metrics
            .healthcheck
            .with_label_values(&[probe.name(), check])
            .set(i64::from(status == "success"));
        metrics
            .healthchecks
            .with_label_values(&[probe.name(), check, status])
            .inc();
    }
    if failed {
        tracing::error!(path, reason, status_code = 503, "Health check error");
        // http.Error: the reason (its lines end in \n) and one more newline
        return plain_error(StatusCode::SERVICE_UNAVAILABLE, &reason);
    }
    let verbose = request
        .uri()
        .query()
        .is_some_and(|q| url::form_urlencoded::parse(q.as_bytes()).any(|(k, _)| k == "verbose"));
    let body = match verbose {
        true => format!("{reason}ok\n"),
        false => "ok\n".to_string(),
    };
    plain_text(StatusCode::OK, body)
}
