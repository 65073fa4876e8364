//! `txn-put`: etcd's `benchmark txn-put` (3.4/3.5 form: a txn whose success
//! branch puts `--txn-ops` keys, with no compare).

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::request_op::Request;
use api::etcdserverpb::{PutRequest, RequestOp, TxnRequest};
use bytes::Bytes;

use crate::client::{drive, status_message, Settings};
use crate::keys::{check_key_space, random_bytes, varint_key};
use crate::limiter::RateLimiter;

#[derive(Clone, Debug)]
pub struct TxnPutOptions {
    pub key_size: usize,
    pub val_size: usize,
    pub total: u64,
    pub rate: u64,
    pub txn_ops: u64,
    pub key_space_size: u64,
}

pub async fn run(settings: &Settings, opts: &TxnPutOptions) -> Result<(), String> {
    if opts.key_space_size == 0 {
        return Err(format!(
            "expected positive --key-space-size, got ({})",
            opts.key_space_size
        ));
    }
    if opts.txn_ops == 0 {
        return Err(format!(
            "expected positive --txn-ops, got ({})",
            opts.txn_ops
        ));
    }
    if opts.txn_ops > opts.key_space_size {
        return Err(format!(
            "expected --txn-ops no larger than --key-space-size, got txn-ops({}) key-space-size({})",
            opts.txn_ops, opts.key_space_size
        ));
    }
    check_key_space(opts.key_size, opts.key_space_size)?;
    let clients: Vec<_> = settings
        .clients()
        .await?
        .into_iter()
        .map(KvClient::new)
        .collect();
    let value = Bytes::from(random_bytes(opts.val_size));
    let (key_size, key_space, ops) = (opts.key_size, opts.key_space_size, opts.txn_ops);
    let progress = settings.progress(opts.total);
    let stats = drive(
        clients,
        opts.total,
        RateLimiter::new(opts.rate, 1),
        &progress,
        move |kv, i| {
            let success = (0..ops)
                .map(|j| {
                    let index = (i * ops + j) % key_space;
                    RequestOp {
                        request: Some(Request::RequestPut(PutRequest {
                            key: varint_key(key_size, index as i64)
                                .unwrap_or_default()
                                .into(),
                            value: value.clone(),
                            ..Default::default()
                        })),
                    }
                })
                .collect();
            let request = TxnRequest {
                success,
                ..Default::default()
            };
            let mut kv = kv.clone();
            async move {
                kv.txn(request)
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
