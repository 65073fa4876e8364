//! `range KEY [END]`: etcd's `benchmark range`.

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::RangeRequest;
use bytes::Bytes;

use crate::client::{drive, status_message, Settings};
use crate::limiter::RateLimiter;

#[derive(Clone, Debug)]
pub struct RangeOptions {
    pub key: String,
    pub end: Option<String>,
    pub consistency: String,
    pub total: u64,
    pub rate: u64,
    pub limit: i64,
}

pub async fn run(settings: &Settings, opts: &RangeOptions) -> Result<(), String> {
    let out = settings.output();
    let serializable = match opts.consistency.as_str() {
        "l" => {
            out.text("bench with linearizable range\n");
            false
        }
        "s" => {
            out.text("bench with serializable range\n");
            true
        }
        other => return Err(format!("--consistency must be l or s, got {other:?}")),
    };
    let clients: Vec<_> = settings
        .clients()
        .await?
        .into_iter()
        .map(KvClient::new)
        .collect();
    let request = RangeRequest {
        key: Bytes::from(opts.key.clone().into_bytes()),
        range_end: Bytes::from(opts.end.clone().unwrap_or_default().into_bytes()),
        limit: opts.limit,
        serializable,
        ..Default::default()
    };
    let progress = settings.progress(opts.total);
    let stats = drive(
        clients,
        opts.total,
        RateLimiter::new(opts.rate, 1),
        &progress,
        move |kv, _| {
            let request = request.clone();
            let mut kv = kv.clone();
            async move {
                kv.range(request)
                    .await
                    .map(|_| ())
                    .map_err(|s| status_message(&s))
            }
        },
    )
    .await;
    progress.finish().await;
    out.report("", &stats, "");
    out.json(&stats, &[]);
    Ok(())
}
