//! `put`: etcd's `benchmark put`.

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::PutRequest;
use bytes::Bytes;

use crate::client::{drive, status_message, Settings};
use crate::keys::{check_key_space, random_bytes, varint_key};
use crate::limiter::RateLimiter;

#[derive(Clone, Debug)]
pub struct PutOptions {
    pub key_size: usize,
    pub val_size: usize,
    pub total: u64,
    pub rate: u64,
    pub key_space_size: u64,
    pub sequential_keys: bool,
}

pub async fn run(settings: &Settings, opts: &PutOptions) -> Result<(), String> {
    if opts.key_space_size == 0 {
        return Err(format!(
            "expected positive --key-space-size, got ({})",
            opts.key_space_size
        ));
    }
    check_key_space(opts.key_size, opts.key_space_size)?;
    let clients: Vec<_> = settings
        .clients()
        .await?
        .into_iter()
        .map(KvClient::new)
        .collect();
    // Every put carries the same random value, as in etcd's benchmark.
    let value = Bytes::from(random_bytes(opts.val_size));
    let (key_size, key_space, sequential) =
        (opts.key_size, opts.key_space_size, opts.sequential_keys);
    let progress = settings.progress(opts.total);
    let stats = drive(
        clients,
        opts.total,
        RateLimiter::new(opts.rate, 1),
        &progress,
        move |kv, i| {
            let index = if sequential {
                i % key_space
            } else {
                fastrand::u64(0..key_space)
            };
            let key = varint_key(key_size, index as i64).unwrap_or_default();
            let request = PutRequest {
                key: key.into(),
                value: value.clone(),
                ..Default::default()
            };
            let mut kv = kv.clone();
            async move {
                kv.put(request)
                    .await
                    .map(|_| ())
                    .map_err(|s| status_message(&s))
            }
        },
    )
    .await;
    progress.finish().await;
    let out = settings.output();
    out.report("", &stats, "\n");
    out.json(&stats, &[]);
    Ok(())
}
