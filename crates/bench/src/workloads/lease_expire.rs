//! `lease-expire` (oxbench's own, not in etcd's tool): many leases, one key
//! each, granted together so that they expire together, while a writer puts
//! at a steady rate. Reports how long the mass expiry takes (the server
//! rate-limits revocations: etcd's leaseRevokeRate is 1,000/s) and the
//! writer's latency during it: a mass expiry must not stall writes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::lease_client::LeaseClient;
use api::etcdserverpb::{LeaseGrantRequest, PutRequest, RangeRequest};

use crate::auth::Connection;
use crate::client::{drive, status_message, Settings};
use crate::limiter::{self, RateLimiter};
use crate::report::Recorder;

const PREFIX: &str = "lease-expire/";
/// How often the remaining leased keys are counted.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Give up waiting for the expiry after this long past the TTL.
const EXPIRY_DEADLINE: Duration = Duration::from_secs(300);

#[derive(Clone, Debug)]
pub struct LeaseExpireOptions {
    pub leases: u64,
    pub ttl: i64,
    pub put_rate: u64,
}

fn prefix_end() -> Vec<u8> {
    let mut end = PREFIX.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

async fn remaining_keys(kv: &mut KvClient<Connection>) -> Result<i64, String> {
    kv.range(RangeRequest {
        key: PREFIX.into(),
        range_end: prefix_end().into(),
        count_only: true,
        serializable: true,
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().count)
    .map_err(|s| status_message(&s))
}

pub async fn run(settings: &Settings, opts: &LeaseExpireOptions) -> Result<(), String> {
    let clients: Vec<(LeaseClient<Connection>, KvClient<Connection>)> = settings
        .clients()
        .await?
        .into_iter()
        .map(|c| (LeaseClient::new(c.clone()), KvClient::new(c)))
        .collect();
    let ttl = opts.ttl;
    let progress = settings.progress(opts.leases);
    let granting = drive(clients, opts.leases, None, &progress, move |client, i| {
        let (mut lease, mut kv) = client.clone();
        async move {
            let id = lease
                .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                .await
                .map_err(|s| status_message(&s))?
                .into_inner()
                .id;
            kv.put(PutRequest {
                key: format!("{PREFIX}{i:08}").into(),
                value: "v".into(),
                lease: id,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|s| status_message(&s))
        }
    })
    .await;
    progress.finish().await;
    let granted_at = Instant::now();

    let connection = settings.connection().await?;
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let mut kv = KvClient::new(connection.clone());
        let done = done.clone();
        let limiter = RateLimiter::new(opts.put_rate, 1);
        tokio::spawn(async move {
            let mut recorder = Recorder::with_capacity(1 << 16);
            let start = Instant::now();
            let mut i = 0u64;
            while !done.load(Ordering::Relaxed) {
                limiter::wait(limiter.as_ref()).await;
                let st = Instant::now();
                let result = kv
                    .put(PutRequest {
                        key: format!("writer/{}", i % 1000).into(),
                        value: "v".into(),
                        ..Default::default()
                    })
                    .await
                    .map(|_| ())
                    .map_err(|s| status_message(&s));
                recorder.record(st, Instant::now(), result);
                i += 1;
            }
            recorder.finish(start.elapsed())
        })
    };
    let mut kv = KvClient::new(connection);
    let deadline = granted_at + Duration::from_secs(ttl.max(0) as u64) + EXPIRY_DEADLINE;
    let mut first_expiry = None;
    let outcome = loop {
        let left = remaining_keys(&mut kv).await?;
        if left < opts.leases as i64 && first_expiry.is_none() {
            first_expiry = Some(granted_at.elapsed());
        }
        if left == 0 {
            break Ok(granted_at.elapsed());
        }
        if Instant::now() > deadline {
            break Err(format!("{left} leased keys still present"));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    };
    done.store(true, Ordering::Relaxed);
    let writes = writer
        .await
        .map_err(|e| format!("writer task failed: {e}"))?;
    let all_gone = outcome?;
    let first = first_expiry.unwrap_or(all_gone);
    let spread = all_gone.saturating_sub(first).as_secs_f64();
    let out = settings.output();
    out.text(&format!(
        "\n{} leases (TTL {} s) granted in {:.2} s; first expiry {:.2} s and all keys gone {:.2} s after the last grant ({:.0} revocations/s)\n",
        opts.leases,
        ttl,
        granting.total.as_secs_f64(),
        first.as_secs_f64(),
        all_gone.as_secs_f64(),
        opts.leases as f64 / spread.max(1e-3),
    ));
    out.report("\nWriter during the expiry:\n", &writes, "\n");
    out.json_with(
        &writes,
        &[("grant", &granting)],
        &[
            ("first_expiry_secs", first.as_secs_f64()),
            ("all_expired_secs", all_gone.as_secs_f64()),
        ],
    );
    Ok(())
}
