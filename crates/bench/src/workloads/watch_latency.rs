//! `watch-latency`: etcd's `benchmark watch-latency`. `--streams` ×
//! `--watchers-per-stream` watchers on one key; one client puts to it
//! `--put-total` times at `--put-rate`; each event's latency runs from the end
//! of its put to its arrival at each watcher.
//!
//! An event is matched to its put by revision (the put's header revision is
//! the event's mod_revision), so the receiving side keeps one 16-byte record
//! per event and no buffer per watcher: at 100,000 watchers (bench/watch-scale.sh)
//! a buffer of `--put-total` instants per watcher was gigabytes.
//!
//! oxbench's own additions, for bench/watch-scale.sh: `--pause-file`,
//! `--put-burst`, and under `--json` the watchers created, the creation
//! summary (`create`, its `total_secs` the wall time of creating them all),
//! the latencies from each put's sending (`since_put_sent`: at scale a server
//! may answer the put behind its deliveries, and most events then beat the
//! answer) and the events delivered per second (`events_per_sec`, from the
//! first put to the last event).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::PutRequest;
use bytes::Bytes;
use tokio::sync::watch;

use crate::client::{status_message, Progress, Settings};
use crate::keys::random_bytes;
use crate::limiter::{self, RateLimiter};
use crate::report::Recorder;
use crate::workloads::watch::{open_streams, wait_for_events};

/// How long `--pause-file` may hold the run: a script that died must not
/// leave oxbench (and its watchers) behind for ever.
const PAUSE_LIMIT: Duration = Duration::from_secs(600);
/// How often the pause file is looked for.
const PAUSE_POLL: Duration = Duration::from_millis(10);

#[derive(Clone, Debug)]
pub struct WatchLatencyOptions {
    pub streams: usize,
    pub watchers_per_stream: usize,
    pub prevkv: bool,
    pub put_total: u64,
    pub put_rate: u64,
    /// Puts that may go at once; 0 is `put_rate` (etcd's limiter).
    pub put_burst: u64,
    pub key_size: usize,
    pub val_size: usize,
    /// Once every watcher is created, create this file and wait until it is
    /// removed before the first put (a script reads the server's memory then).
    pub pause_file: Option<PathBuf>,
}

/// One event's arrival: the revision of the put that caused it, and when it
/// arrived, in nanoseconds after the put phase began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Arrival {
    revision: i64,
    at_nanos: u64,
}

/// When a put was sent and answered, in ns after the put phase began.
#[derive(Clone, Copy, Debug)]
struct PutTimes {
    sent: u64,
    answered: u64,
}

/// Record the latency of every arrival whose revision is a put's: in
/// `from_answer`, arrival − that put's answer (etcd's; 0 when the event beat
/// the answer, as it does when a server answers the put behind its
/// deliveries), in `from_sent`, arrival − the put's sending. Returns how
/// many matched and the last matched arrival (ns after the put phase began).
fn tally(
    puts: &HashMap<i64, PutTimes>,
    arrivals: &[Arrival],
    from_answer: &mut Recorder,
    from_sent: &mut Recorder,
) -> (u64, u64) {
    let mut matched = 0;
    let mut last = 0;
    for arrival in arrivals {
        let Some(put) = puts.get(&arrival.revision) else {
            continue;
        };
        from_answer.success(Duration::from_nanos(
            arrival.at_nanos.saturating_sub(put.answered),
        ));
        from_sent.success(Duration::from_nanos(
            arrival.at_nanos.saturating_sub(put.sent),
        ));
        matched += 1;
        last = last.max(arrival.at_nanos);
    }
    (matched, last)
}

/// Events delivered per second between the first put (time 0) and the last
/// event's arrival.
fn events_per_sec(matched: u64, last_arrival_nanos: u64) -> f64 {
    if matched == 0 || last_arrival_nanos == 0 {
        return 0.0;
    }
    matched as f64 / Duration::from_nanos(last_arrival_nanos).as_secs_f64()
}

fn nanos_since(base: Instant, at: Instant) -> u64 {
    at.saturating_duration_since(base)
        .as_nanos()
        .min(u64::MAX as u128) as u64
}

/// Create `path`, then wait until it is gone (at most [`PAUSE_LIMIT`]).
async fn pause(path: &std::path::Path) -> Result<(), String> {
    std::fs::write(path, b"every watcher created\n")
        .map_err(|e| format!("cannot create --pause-file {}: {e}", path.display()))?;
    let start = Instant::now();
    while path.exists() {
        if start.elapsed() > PAUSE_LIMIT {
            return Err(format!(
                "--pause-file {} still present after {PAUSE_LIMIT:?}",
                path.display()
            ));
        }
        tokio::time::sleep(PAUSE_POLL).await;
    }
    Ok(())
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
    // Creation is not in etcd's text report; its failures count as errors.
    let creating = Instant::now();
    let (streams, creation) = open_streams(&clients, keys, opts.prevkv, &Progress::hidden()).await;
    let creation = creation.finish(creating.elapsed());
    let watchers: usize = streams.iter().map(|s| s.watchers.len()).sum();
    if let Some(path) = &opts.pause_file {
        pause(path).await?;
    }

    let start = Instant::now();
    let received = Arc::new(AtomicI64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut receivers = Vec::new();
    for mut stream in streams {
        let received = received.clone();
        let counter = progress.counter();
        let mut stop = stop_rx.clone();
        let capacity = opts.put_total as usize * stream.watchers.len();
        receivers.push(tokio::spawn(async move {
            let mut arrivals = Vec::with_capacity(capacity);
            let mut errors = Recorder::default();
            loop {
                let message = tokio::select! {
                    _ = stop.changed() => break,
                    message = stream.responses.message() => message,
                };
                match message {
                    Ok(Some(response)) => {
                        let at_nanos = nanos_since(start, Instant::now());
                        if !stream.watchers.contains_key(&response.watch_id) {
                            continue;
                        }
                        let n = response.events.len();
                        arrivals.extend(response.events.iter().map(|event| Arrival {
                            revision: event.kv.as_ref().map_or(0, |kv| kv.mod_revision),
                            at_nanos,
                        }));
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

    // The put loop; each successful put's end is when its event is due.
    let burst = if opts.put_burst == 0 {
        opts.put_rate
    } else {
        opts.put_burst
    };
    let limiter = RateLimiter::new(opts.put_rate, burst);
    let mut puts = Recorder::with_capacity(opts.put_total as usize);
    let mut put_times: HashMap<i64, PutTimes> = HashMap::with_capacity(opts.put_total as usize);
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
                Ok(response) => {
                    puts.success(end - st);
                    let revision = response.into_inner().header.map_or(0, |h| h.revision);
                    let times = PutTimes {
                        sent: nanos_since(start, st),
                        answered: nanos_since(start, end),
                    };
                    put_times.insert(revision, times);
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
    let mut from_sent = Recorder::with_capacity(expected.max(0) as usize);
    let (mut matched, mut last_arrival) = (0, 0);
    for task in receivers {
        match task.await {
            Ok((arrivals, errors)) => {
                events.merge(errors);
                let (m, last) = tally(&put_times, &arrivals, &mut events, &mut from_sent);
                matched += m;
                last_arrival = last_arrival.max(last);
            }
            Err(e) => events.error(format!("watch task failed: {e}")),
        }
    }
    for (message, count) in &creation.errors {
        events.errors_n(message, *count);
    }
    if watchers == 0 {
        events.error("no watcher was created".into());
    }
    events.errors_n("watch event not received", missing.max(0) as u64);
    // As etcd's, the watch report spans the put phase, the wait and the tally.
    let events = events.finish(start.elapsed());
    let from_sent = from_sent.finish(start.elapsed());
    out.report("\nWatch events summary:\n", &events, "");
    out.json_with(
        &events,
        &[
            ("put", &puts),
            ("create", &creation),
            ("since_put_sent", &from_sent),
        ],
        &[
            ("watchers", watchers as f64),
            ("events_per_sec", events_per_sec(matched, last_arrival)),
        ],
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(revision: i64, at_ms: u64) -> Arrival {
        Arrival {
            revision,
            at_nanos: at_ms * 1_000_000,
        }
    }

    #[test]
    fn events_are_matched_to_their_put_by_revision() {
        // puts at revisions 2 and 3, sent at 1 ms and 11 ms, answered at 10 ms and 20 ms
        let times = |sent_ms: u64, answered_ms: u64| PutTimes {
            sent: sent_ms * 1_000_000,
            answered: answered_ms * 1_000_000,
        };
        let puts = HashMap::from([(2, times(1, 10)), (3, times(11, 20))]);
        // out of order across watchers, one before its put's answer, one of
        // a revision no put of ours made (a failed put that committed)
        let arrivals = [
            arrival(3, 25),
            arrival(2, 12),
            arrival(2, 9),
            arrival(7, 40),
        ];
        let (mut from_answer, mut from_sent) = (Recorder::default(), Recorder::default());
        let (matched, last) = tally(&puts, &arrivals, &mut from_answer, &mut from_sent);
        assert_eq!((matched, last), (3, 25_000_000));
        let ms = |recorder: Recorder| -> Vec<f64> {
            let stats = recorder.finish(Duration::from_secs(1));
            stats
                .latencies
                .iter()
                .map(|s| (s * 1000.0).round())
                .collect()
        };
        assert_eq!(ms(from_answer), [0.0, 2.0, 5.0]);
        assert_eq!(ms(from_sent), [8.0, 11.0, 14.0]);
    }

    #[test]
    fn events_per_sec_runs_from_the_first_put_to_the_last_event() {
        assert_eq!(events_per_sec(1000, 500_000_000), 2000.0);
        assert_eq!(events_per_sec(0, 500_000_000), 0.0);
        assert_eq!(events_per_sec(10, 0), 0.0);
    }
}
