//! `health`: not an etcd benchmark command but the probe bench/compare.sh
//! times restarts with. Healthy means what `etcdctl endpoint health` checks:
//! Maintenance.Status answers with a leader, and a linearizable Range succeeds.

use std::time::{Duration, Instant};

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::maintenance_client::MaintenanceClient;
use api::etcdserverpb::{RangeRequest, StatusRequest};
use bytes::Bytes;

use crate::client::{dial, status_message, Settings};

/// Pause between probes: short, because the probe times restarts.
const PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// Bound on one probe's RPCs, so that a hung member cannot stall the loop.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

async fn probe(settings: &Settings, endpoint: &str) -> Result<(), String> {
    let channel = dial(endpoint, Some(PROBE_TIMEOUT), settings.tls.as_ref()).await?;
    let status = MaintenanceClient::new(channel.clone())
        .status(StatusRequest {})
        .await
        .map_err(|s| status_message(&s))?
        .into_inner();
    if status.leader == 0 {
        return Err("no leader".into());
    }
    KvClient::new(channel)
        .range(RangeRequest {
            key: Bytes::from_static(b"health"),
            ..Default::default()
        })
        .await
        .map_err(|s| status_message(&s))?;
    Ok(())
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
            Ok(Err(e)) => last_error = e,
            Err(_) => last_error = "probe timed out".into(),
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    Err(format!(
        "{endpoint} is unhealthy after {timeout:?}: {last_error}"
    ))
}
