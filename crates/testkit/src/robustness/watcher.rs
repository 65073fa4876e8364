//! A watcher: one key range followed across reconnections. Every stream
//! starts after the last revision the watcher knows it has (the last event,
//! or a progress notification's revision), on the next member when the
//! previous one failed, as etcd's client resumes. A stream canceled because
//! its start revision was compacted resumes from the compaction revision.
//! Once the run sets a final revision, the watcher stops as soon as it has
//! everything up to it.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::sync::watch;

use super::client::{connect, kvs_of, Recorder};
use super::history::{Event, EventKind, Kv, WatchResponse, WatchStream, Watcher};

pub struct WatchSpec {
    pub client: u32,
    pub key: String,
    pub end: String,
    pub prev_kv: bool,
    pub progress_notify: bool,
    /// How often to send RequestProgress (None: never).
    pub request_progress: Option<Duration>,
}

fn event_of(event: &etcd_client::Event) -> Option<Event> {
    let kv = kvs_of(std::slice::from_ref(event.kv()?)).pop()?;
    let prev_kv: Option<Kv> = event
        .prev_kv()
        .and_then(|p| kvs_of(std::slice::from_ref(p)).pop());
    Some(Event {
        kind: match event.event_type() {
            EventType::Put => EventKind::Put,
            EventType::Delete => EventKind::Delete,
        },
        kv,
        prev_kv,
    })
}

/// Follows `spec` from revision 1 until `target` is set and reached (or
/// its deadline passes).
pub async fn run_watcher(
    spec: WatchSpec,
    endpoints: Vec<String>,
    recorder: Arc<Recorder>,
    mut target: watch::Receiver<Option<i64>>,
) -> Watcher {
    let mut record = Watcher {
        client: spec.client,
        key: spec.key.clone(),
        end: spec.end.clone(),
        prev_kv: spec.prev_kv,
        progress_notify: spec.progress_notify,
        streams: Vec::new(),
    };
    let members = endpoints.len();
    let mut member = spec.client as usize % members;
    let mut next = 1i64;
    let mut target_deadline: Option<tokio::time::Instant> = None;
    loop {
        let wanted = *target.borrow();
        if let Some(final_revision) = wanted {
            let deadline = *target_deadline
                .get_or_insert_with(|| tokio::time::Instant::now() + Duration::from_secs(30));
            if next > final_revision || tokio::time::Instant::now() >= deadline {
                return record;
            }
        }
        let mut stream = WatchStream {
            member: member as u32,
            start_revision: next,
            opened: recorder.now(),
            responses: Vec::new(),
            broken: None,
        };
        let outcome = follow(
            &spec,
            &endpoints[member],
            &recorder,
            &mut stream,
            &mut next,
            &mut target,
        )
        .await;
        let failed = outcome.is_err();
        stream.broken = outcome.err();
        record.streams.push(stream);
        if failed {
            member = (member + 1) % members;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One stream: Ok when it ended for a reason that is not a failure (the
/// target was reached, or a compaction cancel to resume from), Err with
/// the failure otherwise.
async fn follow(
    spec: &WatchSpec,
    endpoint: &str,
    recorder: &Recorder,
    stream: &mut WatchStream,
    next: &mut i64,
    target: &mut watch::Receiver<Option<i64>>,
) -> Result<(), String> {
    let timeout = Duration::from_secs(2);
    let mut client = connect(endpoint, timeout).await.ok_or("cannot connect")?;
    let mut options = WatchOptions::new()
        .with_range(spec.end.as_str())
        .with_start_revision(*next);
    if spec.prev_kv {
        options = options.with_prev_key();
    }
    if spec.progress_notify {
        options = options.with_progress_notify();
    }
    let mut watch_stream =
        match tokio::time::timeout(timeout, client.watch(spec.key.as_str(), Some(options))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("watch did not open in time".into()),
        };
    let mut progress_tick =
        tokio::time::interval(spec.request_progress.unwrap_or(Duration::from_millis(500)));
    // a stream quiet for this long while the run still writes is stuck: a
    // partitioned member never closes it
    let quiet_limit = Duration::from_millis(1500);
    let mut last_heard = tokio::time::Instant::now();
    loop {
        tokio::select! {
            message = watch_stream.message() => {
                let response = match message {
                    Ok(Some(r)) => r,
                    Ok(None) => return Err("stream ended".into()),
                    Err(e) => return Err(e.to_string()),
                };
                last_heard = tokio::time::Instant::now();
                let events: Vec<Event> = response.events().iter().filter_map(event_of).collect();
                let revision = response.header().map_or(0, |h| h.revision());
                let record = WatchResponse {
                    time: recorder.now(),
                    revision,
                    events,
                    created: response.created(),
                    canceled: response.canceled(),
                    compact_revision: response.compact_revision(),
                    cancel_reason: response.cancel_reason().to_string(),
                };
                if let Some(last) = record.events.last() {
                    *next = (*next).max(last.kv.mod_revision + 1);
                } else if record.is_progress() {
                    *next = (*next).max(revision + 1);
                }
                let canceled = record.canceled;
                let compacted = record.compact_revision;
                stream.responses.push(record);
                if canceled {
                    if compacted > 0 {
                        *next = (*next).max(compacted);
                        return Ok(());
                    }
                    return Err("canceled".into());
                }
                if target.borrow().is_some_and(|t| *next > t) {
                    return Ok(());
                }
            }
            _ = progress_tick.tick() => {
                if spec.request_progress.is_some() || target.borrow().is_some() {
                    if let Err(e) = watch_stream.request_progress().await {
                        return Err(e.to_string());
                    }
                }
                if last_heard.elapsed() > quiet_limit {
                    return Err("no response for 1.5 s".into());
                }
            }
            _ = target.changed() => {}
        }
    }
}
