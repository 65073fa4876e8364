//! `watch`: etcd's `benchmark watch`. Phase 1 creates `--streams` ×
//! `--watch-per-stream` watchers over `--watched-key-total` keys and reports
//! creation latency; phase 2 puts `--put-total` times to the watched keys and
//! reports the rate at which the events arrive.
//!
//! Also the stream plumbing `watch-latency` shares.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::watch_client::WatchClient;
use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::{PutRequest, WatchCreateRequest, WatchRequest, WatchResponse};
use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::auth::Connection;
use crate::client::{status_message, Dispenser, Progress, Settings};
use crate::keys::{check_key_space, varint_key};
use crate::limiter::{self, RateLimiter};
use crate::report::Recorder;

/// Requests queued on one watch stream's send side; creation sends one at a time.
const WATCH_REQUEST_QUEUE: usize = 16;
/// Give up on events still missing this long after the last one arrived.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the waiting side checks progress.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// One bidirectional Watch RPC with the watchers created on it.
pub(crate) struct WatchStream {
    /// Kept open: closing the send side ends the stream on the server.
    _requests: mpsc::Sender<WatchRequest>,
    pub responses: tonic::Streaming<WatchResponse>,
    /// Watch id → index of the watcher within this stream.
    pub watchers: HashMap<i64, usize>,
}

fn create_request(key: Bytes, prev_kv: bool) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key,
            prev_kv,
            ..Default::default()
        })),
    }
}

async fn wait_created(responses: &mut tonic::Streaming<WatchResponse>) -> Result<i64, String> {
    loop {
        match responses.message().await {
            Ok(Some(r)) if r.created && r.canceled => {
                return Err(format!("watch canceled: {}", r.cancel_reason))
            }
            Ok(Some(r)) if r.created => return Ok(r.watch_id),
            Ok(Some(_)) => continue,
            Ok(None) => return Err("watch stream closed by the server".into()),
            Err(status) => return Err(status_message(&status)),
        }
    }
}

/// Open a stream and create one watcher per key, each after the previous one
/// is confirmed (as clientv3 does), recording each creation's latency. A
/// failure counts as an error for every watcher it prevents.
pub(crate) async fn open_stream(
    connection: Connection,
    keys: Vec<Bytes>,
    prev_kv: bool,
    recorder: &mut Recorder,
    progress: &AtomicU64,
) -> Option<WatchStream> {
    let wanted = keys.len() as u64;
    let (tx, rx) = mpsc::channel(WATCH_REQUEST_QUEUE);
    let mut keys = keys.into_iter();
    let first = keys.next()?;
    let mut start = Instant::now();
    // The first create goes before the call: etcd sends no response headers
    // until it has a request to answer.
    if tx.send(create_request(first, prev_kv)).await.is_err() {
        return None;
    }
    let mut responses = match WatchClient::new(connection)
        .watch(ReceiverStream::new(rx))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => {
            recorder.errors_n(&status_message(&status), wanted);
            progress.fetch_add(wanted, Ordering::Relaxed);
            return None;
        }
    };
    let mut watchers = HashMap::new();
    let mut attempted = 0;
    loop {
        let created = wait_created(&mut responses).await;
        attempted += 1;
        progress.fetch_add(1, Ordering::Relaxed);
        match created {
            Ok(id) => {
                recorder.success(start.elapsed());
                watchers.insert(id, watchers.len());
            }
            Err(e) if e.starts_with("watch canceled") => recorder.error(e),
            Err(e) => {
                recorder.error(e.clone());
                recorder.errors_n(&e, wanted - attempted);
                progress.fetch_add(wanted - attempted, Ordering::Relaxed);
                return None;
            }
        }
        let Some(key) = keys.next() else { break };
        start = Instant::now();
        if tx.send(create_request(key, prev_kv)).await.is_err() {
            recorder.errors_n("watch stream closed", wanted - attempted);
            return None;
        }
    }
    Some(WatchStream {
        _requests: tx,
        responses,
        watchers,
    })
}

/// Create all streams concurrently; stream `s` uses client `s % clients`.
pub(crate) async fn open_streams(
    clients: &[Connection],
    keys_per_stream: Vec<Vec<Bytes>>,
    prev_kv: bool,
    progress: &Progress,
) -> (Vec<WatchStream>, Recorder) {
    let mut tasks = Vec::new();
    for (s, keys) in keys_per_stream.into_iter().enumerate() {
        let connection = clients[s % clients.len()].clone();
        let counter = progress.counter();
        tasks.push(tokio::spawn(async move {
            let mut recorder = Recorder::with_capacity(keys.len());
            let stream = open_stream(connection, keys, prev_kv, &mut recorder, &counter).await;
            (stream, recorder)
        }));
    }
    let mut streams = Vec::new();
    let mut all = Recorder::default();
    for task in tasks {
        match task.await {
            Ok((stream, recorder)) => {
                streams.extend(stream);
                all.merge(recorder);
            }
            Err(e) => all.error(format!("watch task failed: {e}")),
        }
    }
    (streams, all)
}

/// Wait until `received` reaches `expected()`, or until no event has arrived
/// for [`STALL_TIMEOUT`] once `producers_done()`. Returns how many are missing.
pub(crate) async fn wait_for_events(
    received: &AtomicI64,
    expected: impl Fn() -> i64,
    producers_done: impl Fn() -> bool,
) -> i64 {
    let mut last = received.load(Ordering::Relaxed);
    let mut last_change = Instant::now();
    loop {
        let now = received.load(Ordering::Relaxed);
        if producers_done() && now >= expected() {
            return 0;
        }
        if now != last {
            last = now;
            last_change = Instant::now();
        } else if producers_done() && last_change.elapsed() > STALL_TIMEOUT {
            return expected() - now;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[derive(Clone, Debug)]
pub struct WatchOptions {
    pub streams: usize,
    pub watch_per_stream: usize,
    pub watched_key_total: usize,
    pub put_rate: u64,
    pub put_total: u64,
    pub key_size: usize,
    pub key_space_size: u64,
    pub sequential_keys: bool,
}

pub async fn run(settings: &Settings, opts: &WatchOptions) -> Result<(), String> {
    if opts.key_space_size == 0 {
        return Err(format!(
            "expected positive --key-space-size, got ({})",
            opts.key_space_size
        ));
    }
    if opts.watched_key_total == 0 || opts.streams == 0 || opts.watch_per_stream == 0 {
        return Err(
            "--watched-key-total, --streams and --watch-per-stream must be positive".into(),
        );
    }
    check_key_space(opts.key_size, opts.key_space_size)?;
    let watched: Vec<Bytes> = (0..opts.watched_key_total as u64)
        .map(|i| {
            let index = if opts.sequential_keys {
                i % opts.key_space_size
            } else {
                fastrand::u64(0..opts.key_space_size)
            };
            Bytes::from(varint_key(opts.key_size, index as i64).unwrap_or_default())
        })
        .collect();
    let clients = settings.clients().await?;
    let out = settings.output();

    // Phase 1: create the watchers.
    let keys_per_stream: Vec<Vec<Bytes>> = (0..opts.streams)
        .map(|s| {
            (0..opts.watch_per_stream)
                .map(|w| watched[(s * opts.watch_per_stream + w) % watched.len()].clone())
                .collect()
        })
        .collect();
    let progress = settings.progress((opts.streams * opts.watch_per_stream) as u64);
    let start = Instant::now();
    let (streams, creation) =
        open_streams(&clients, keys_per_stream.clone(), false, &progress).await;
    let creation = creation.finish(start.elapsed());
    progress.finish().await;
    out.report("Watch creation summary:\n", &creation, "");

    // Events each put produces: the number of live watchers on its key.
    let mut watchers_per_key: HashMap<Bytes, i64> = HashMap::new();
    for (stream, keys) in streams.iter().zip(&keys_per_stream) {
        for index in stream.watchers.values() {
            *watchers_per_key.entry(keys[*index].clone()).or_insert(0) += 1;
        }
    }
    let events_total: i64 = (0..opts.put_total as usize)
        .map(|i| {
            watchers_per_key
                .get(&watched[i % watched.len()])
                .copied()
                .unwrap_or(0)
        })
        .sum();

    // Phase 2: put to the watched keys and count the events.
    let progress = settings.progress(events_total.max(0) as u64);
    let received = Arc::new(AtomicI64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let start = Instant::now();
    let mut receivers = Vec::new();
    for mut stream in streams {
        let received = received.clone();
        let counter = progress.counter();
        let mut stop = stop_rx.clone();
        receivers.push(tokio::spawn(async move {
            let mut recorder = Recorder::default();
            loop {
                let message = tokio::select! {
                    _ = stop.changed() => break,
                    message = stream.responses.message() => message,
                };
                match message {
                    Ok(Some(response)) => {
                        // As etcd's benchmark: an event's "latency" runs from the
                        // arrival of its response; the figure is the event rate.
                        let arrived = Instant::now();
                        for _ in &response.events {
                            recorder.success(arrived.elapsed());
                        }
                        let n = response.events.len() as i64;
                        received.fetch_add(n, Ordering::Relaxed);
                        counter.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Ok(None) => break,
                    Err(status) => {
                        recorder.error(status_message(&status));
                        break;
                    }
                }
            }
            recorder
        }));
    }
    let dispenser = Arc::new(Dispenser::new(if events_total > 0 {
        opts.put_total
    } else {
        0
    }));
    let limiter = Arc::new(RateLimiter::new(opts.put_rate, 1));
    let mut putters = Vec::new();
    for connection in &clients {
        let mut kv = KvClient::new(connection.clone());
        let dispenser = dispenser.clone();
        let limiter = limiter.clone();
        let watched = watched.clone();
        putters.push(tokio::spawn(async move {
            let mut errors = Recorder::default();
            while let Some(i) = dispenser.take() {
                limiter::wait(limiter.as_ref().as_ref()).await;
                let request = PutRequest {
                    key: watched[i as usize % watched.len()].clone(),
                    value: Bytes::from_static(b"data"),
                    ..Default::default()
                };
                if let Err(status) = kv.put(request).await {
                    errors.error(format!("put: {}", status_message(&status)));
                }
            }
            errors
        }));
    }
    let putters_done = || putters.iter().all(|p| p.is_finished());
    let missing = wait_for_events(&received, || events_total, putters_done).await;
    let _ = stop_tx.send(true);
    let mut events = Recorder::default();
    for task in receivers.into_iter().chain(putters) {
        match task.await {
            Ok(recorder) => events.merge(recorder),
            Err(e) => events.error(format!("task failed: {e}")),
        }
    }
    if events_total == 0 {
        events.error("no watcher was created".into());
    }
    events.errors_n("watch event not received", missing.max(0) as u64);
    let events = events.finish(start.elapsed());
    progress.finish().await;
    out.report("Watch events received summary:\n", &events, "");
    out.json(&events, &[("create", &creation)]);
    Ok(())
}
