//! `watch-latency`: etcd's `benchmark watch-latency`. `--streams` ×
//! `--watchers-per-stream` watchers on one key; one client puts to it
//! `--put-total` times at `--put-rate`; each event's latency runs from the end
//! of its put to its arrival at each watcher.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::PutRequest;
use bytes::Bytes;
use tokio::sync::watch;

use crate::client::{status_message, Progress, Settings};
use crate::keys::random_bytes;
use crate::limiter::{self, RateLimiter};
use crate::report::Recorder;
use crate::workloads::watch::{open_streams, wait_for_events};

#[derive(Clone, Debug)]
pub struct WatchLatencyOptions {
    pub streams: usize,
    pub watchers_per_stream: usize,
    pub prevkv: bool,
    pub put_total: u64,
    pub put_rate: u64,
    pub key_size: usize,
    pub val_size: usize,
}

pub async fn run(settings: &Settings, opts: &WatchLatencyOptions) -> Result<(), String> {
    if opts.streams == 0 || opts.watchers_per_stream == 0 {
        return Err("--streams and --watchers-per-stream must be positive".into());
    }
    let key = Bytes::from(random_bytes(opts.key_size));
    let value = Bytes::from(random_bytes(opts.val_size));
    let clients = settings.clients().await?;
    let mut put_client = KvClient::new(settings.connection().await?);
    let out = settings.output();

    let wanted_watchers = opts.streams * opts.watchers_per_stream;
    let progress = settings.progress(opts.put_total * wanted_watchers as u64);
    let keys = vec![vec![key.clone(); opts.watchers_per_stream]; opts.streams];
    // Creation is not reported (as in etcd); its failures count as errors.
    let (streams, creation) = open_streams(&clients, keys, opts.prevkv, &Progress::hidden()).await;
    let creation_errors = creation.finish(std::time::Duration::from_secs(1)).errors;
    let watchers: usize = streams.iter().map(|s| s.watchers.len()).sum();

    let received = Arc::new(AtomicI64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut receivers = Vec::new();
    for mut stream in streams {
        let received = received.clone();
        let counter = progress.counter();
        let mut stop = stop_rx.clone();
        let capacity = opts.put_total as usize;
        receivers.push(tokio::spawn(async move {
            let mut arrivals: Vec<Vec<Instant>> =
                vec![Vec::with_capacity(capacity); stream.watchers.len()];
            let mut errors = Recorder::default();
            loop {
                let message = tokio::select! {
                    _ = stop.changed() => break,
                    message = stream.responses.message() => message,
                };
                match message {
                    Ok(Some(response)) => {
                        let now = Instant::now();
                        let Some(index) = stream.watchers.get(&response.watch_id) else {
                            continue;
                        };
                        let n = response.events.len();
                        arrivals[*index].extend(std::iter::repeat_n(now, n));
                        received.fetch_add(n as i64, Ordering::Relaxed);
                        counter.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Ok(None) => break,
                    Err(status) => {
                        errors.error(status_message(&status));
                        break;
                    }
                }
            }
            (arrivals, errors)
        }));
    }

    // The put loop; each successful put's end time is when its event is due.
    let limiter = RateLimiter::new(opts.put_rate, opts.put_rate);
    let mut puts = Recorder::with_capacity(opts.put_total as usize);
    let mut put_times = Vec::with_capacity(opts.put_total as usize);
    let start = Instant::now();
    if watchers > 0 {
        for _ in 0..opts.put_total {
            limiter::wait(limiter.as_ref()).await;
            let request = PutRequest {
                key: key.clone(),
                value: value.clone(),
                prev_kv: false,
                ..Default::default()
            };
            let st = Instant::now();
            let result = put_client.put(request).await;
            let end = Instant::now();
            match result {
                Ok(_) => {
                    puts.success(end - st);
                    put_times.push(end);
                }
                Err(status) => puts.error(status_message(&status)),
            }
        }
    }
    let expected = (put_times.len() * watchers) as i64;
    let missing = wait_for_events(&received, || expected, || true).await;
    let _ = stop_tx.send(true);
    let puts = puts.finish(start.elapsed());
    progress.finish().await;
    out.report("\nPut summary:\n", &puts, "");

    let mut events = Recorder::with_capacity(expected.max(0) as usize);
    for task in receivers {
        match task.await {
            Ok((arrivals, errors)) => {
                events.merge(errors);
                for arrived in arrivals {
                    for (put_end, event) in put_times.iter().zip(&arrived) {
                        events.success(event.saturating_duration_since(*put_end));
                    }
                }
            }
            Err(e) => events.error(format!("watch task failed: {e}")),
        }
    }
    for (message, count) in creation_errors {
        events.errors_n(&message, count);
    }
    if watchers == 0 {
        events.error("no watcher was created".into());
    }
    events.errors_n("watch event not received", missing.max(0) as u64);
    // As etcd's, the watch report spans the put phase, the wait and the tally.
    let events = events.finish(start.elapsed());
    out.report("\nWatch events summary:\n", &events, "");
    out.json(&events, &[("put", &puts)]);
    Ok(())
}
