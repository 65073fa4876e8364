//! `health`: not an etcd benchmark command but the probe bench/compare.sh
//! times restarts with. Healthy means what `etcdctl endpoint health` checks:
//! Maintenance.Status answers with a leader, and a linearizable Range succeeds
//! or is refused for permission only (the member answered). With `--user`,
//! each probe authenticates first, so a member restarting with auth enabled
//! is healthy once it can also authenticate.

use std::time::{Duration, Instant};

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::maintenance_client::MaintenanceClient;
use api::etcdserverpb::{RangeRequest, StatusRequest};
use api::rpctypes;
use bytes::Bytes;

use crate::client::{status_message, Settings};

/// Pause between probes: short, because the probe times restarts.
const PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// Bound on one probe's RPCs, so that a hung member cannot stall the loop.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

async fn probe(settings: &Settings, endpoint: &str) -> Result<(), String> {
    let connection = settings.connect(endpoint, Some(PROBE_TIMEOUT)).await?;
    let status = MaintenanceClient::new(connection.clone())
        .status(StatusRequest {})
        .await
        .map_err(|s| status_message(&s))?
        .into_inner();
    if status.leader == 0 {
        return Err("no leader".into());
    }
    let read = KvClient::new(connection)
        .range(RangeRequest {
            key: Bytes::from_static(b"health"),
            ..Default::default()
        })
        .await;
    match read {
        Ok(_) => Ok(()),
        Err(s) if s.message() == rpctypes::PERMISSION_DENIED.message => Ok(()),
        Err(s) => Err(status_message(&s)),
    }
}

/// Probe until healthy or `timeout`; prints the seconds it took.
pub async fn run(settings: &Settings, timeout: Duration) -> Result<(), String> {
    let endpoint = settings.endpoints[0].clone();
    let start = Instant::now();
    let mut last_error = String::from("not probed");
    while start.elapsed() < timeout {
        match tokio::time::timeout(PROBE_TIMEOUT, probe(settings, &endpoint)).await {
            Ok(Ok(())) => {
                let secs = start.elapsed().as_secs_f64();
                if settings.json {
                    println!(
                        "{}",
                        serde_json::json!({"endpoint": endpoint, "healthy": true, "secs": secs})
                    );
                } else {
                    println!("{endpoint} is healthy: took {secs:.3} secs");
                }
                return Ok(());
            }
            // The member answered: a wrong password will not get better.
            Ok(Err(e)) if e.ends_with(rpctypes::AUTH_FAILED.message) => return Err(e),
            Ok(Err(e)) => last_error = e,
            Err(_) => last_error = "probe timed out".into(),
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    Err(format!(
        "{endpoint} is unhealthy after {timeout:?}: {last_error}"
    ))
}
