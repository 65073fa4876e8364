//! The Watch service (etcd's api/v3rpc/watch.go): one bidirectional stream
//! carries many watchers of the member's own applied state.
//!
//! One queue per stream: mvcc's (created and canceled responses, events,
//! progress answers, all in the order mvcc put them, at most
//! `mvcc::watch::STREAM_QUEUE_CAPACITY` event responses). gRPC pulls from
//! it directly ([`Responses`]): a response is turned into the wire message
//! (header, prev_kv looked up for a watcher that asked, fragments) as gRPC
//! takes it. A task per stream ([`Session`]) reads the client's requests,
//! ticks progress notifications and watches for a lost leader. Writes never
//! wait for either: when gRPC does not keep up, the queue fills and mvcc
//! moves the stream's watchers aside until it drains.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use api::etcdserverpb::watch_create_request::FilterType;
use api::etcdserverpb::watch_server::Watch;
use api::etcdserverpb::{
    watch_request, RangeRequest, WatchCreateRequest, WatchRequest, WatchResponse,
};
use api::mvccpb::event::EventType;
use api::rpctypes;
use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};
use mvcc::{WatchOptions, WatchStream, INVALID_WATCH_ID};
use parking_lot::Mutex;
use prost::Message;
use tokio::sync::{watch, Notify};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{go_status_text, Credentials};
use crate::REQUIRE_LEADER_KEY;
use api::rpctypes::EtcdError;
use etcdserver::auth::Access;
use etcdserver::config::GRPC_OVERHEAD_BYTES;
use etcdserver::EtcdServer;

/// etcd's minWatchProgressInterval.
const MIN_PROGRESS_INTERVAL: Duration = Duration::from_millis(100);
/// Election timeouts without a leader before require-leader streams are
/// canceled (etcd's maxNoLeaderCnt).
const MAX_NO_LEADER_COUNT: u32 = 3;

pub struct WatchService {
    server: Arc<EtcdServer>,
    /// Becomes true when the member stops: open streams end with
    /// "etcdserver: server stopped" instead of holding the listener open.
    shutdown: watch::Receiver<bool>,
}

impl WatchService {
    pub fn new(server: Arc<EtcdServer>, shutdown: watch::Receiver<bool>) -> Self {
        WatchService { server, shutdown }
    }
}

pub type ResponseStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = ResponseStream;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let require_leader = request
            .metadata()
            .get(REQUIRE_LEADER_KEY)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == "true");
        if require_leader && !self.server.has_leader() {
            return Err(rpctypes::NO_LEADER.status());
        }
        let credentials = Credentials::of(&request);
        Ok(Response::new(self.open(
            request.into_inner(),
            require_leader,
            credentials,
        )))
    }
}

impl WatchService {
    /// Serves one watch stream fed by `inbound` (gRPC's, or the JSON
    /// gateway's decoded requests), each watch created with the read
    /// permission of `credentials` as they stand at its creation.
    pub fn open<S>(
        &self,
        inbound: S,
        require_leader: bool,
        credentials: Credentials,
    ) -> ResponseStream
    where
        S: Stream<Item = Result<WatchRequest, Status>> + Unpin + Send + 'static,
    {
        let link = Arc::new(Link::default());
        let wake = link.clone();
        let stream = Arc::new(
            self.server
                .store
                .watch_stream(Box::new(move || wake.waker.wake())),
        );
        let session = Session {
            server: self.server.clone(),
            stream: stream.clone(),
            link: link.clone(),
            require_leader,
            credentials,
            shutdown: self.shutdown.clone(),
        };
        tokio::spawn(session.run(inbound));
        Box::pin(Responses {
            server: self.server.clone(),
            stream,
            link,
            parts: VecDeque::new(),
            done: false,
        })
    }
}

/// What the session and the response side of one stream tell each other.
#[derive(Default)]
struct Link {
    /// Wakes gRPC's poll of [`Responses`] (mvcc's queue got a response, or
    /// the session ended).
    waker: AtomicWaker,
    /// Set by the session when it ends: the stream ends after what is
    /// queued, with this error if any.
    end: Mutex<Option<Option<Status>>>,
    /// The client went away (gRPC dropped [`Responses`]).
    gone: Notify,
}

impl Link {
    fn end(&self, error: Option<Status>) {
        self.end.lock().get_or_insert(error);
        self.waker.wake();
    }
}

/// The stream's responses, as gRPC pulls them from mvcc's queue.
struct Responses {
    server: Arc<EtcdServer>,
    stream: Arc<WatchStream>,
    link: Arc<Link>,
    /// Parts of a fragmented response not yet taken.
    parts: VecDeque<WatchResponse>,
    done: bool,
}

impl Stream for Responses {
    type Item = Result<WatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(part) = self.parts.pop_front() {
                return Poll::Ready(Some(Ok(part)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            if let Some(response) = self.stream.pop() {
                self.parts = self.wire(response).into();
                continue;
            }
            let end = self.link.end.lock().take();
            if let Some(end) = end {
                self.done = true;
                return Poll::Ready(end.map(Err));
            }
            // Registered before looking again: a response queued in between
            // wakes this poll.
            self.link.waker.register(cx.waker());
            if let Some(response) = self.stream.pop() {
                self.parts = self.wire(response).into();
                continue;
            }
            if self.link.end.lock().is_some() {
                continue;
            }
            return Poll::Pending;
        }
    }
}

impl Drop for Responses {
    fn drop(&mut self) {
        self.link.gone.notify_one();
    }
}

impl Responses {
    /// The wire message(s) of one mvcc response.
    fn wire(&self, response: mvcc::WatchResponse) -> Vec<WatchResponse> {
        let mut events = response.events;
        if response.needs_prev_kv {
            self.fill_prev_kv(&mut events);
        }
        let wire = WatchResponse {
            header: Some(self.server.header(response.revision)),
            watch_id: response.watch_id,
            created: response.created,
            canceled: response.canceled,
            compact_revision: response.compact_revision,
            cancel_reason: response.cancel_reason,
            fragment: false,
            events,
        };
        if response.fragment {
            fragments(
                wire,
                self.server.cfg.max_request_bytes + GRPC_OVERHEAD_BYTES,
            )
        } else {
            vec![wire]
        }
    }

    /// prev_kv for a watcher that asked: looked up at the revision before,
    /// as etcd's sendLoop does (nothing if compacted; a create has none).
    fn fill_prev_kv(&self, events: &mut [api::mvccpb::Event]) {
        for event in events {
            let Some(kv) = &event.kv else { continue };
            let is_create =
                event.r#type == EventType::Put as i32 && kv.create_revision == kv.mod_revision;
            if is_create || event.prev_kv.is_some() {
                continue;
            }
            let previous = self.server.store.range(&RangeRequest {
                key: kv.key.clone(),
                revision: kv.mod_revision - 1,
                ..Default::default()
            });
            if let Ok(mut previous) = previous {
                event.prev_kv = previous.kvs.pop();
            }
        }
    }
}

/// One Watch stream's requests, progress ticks and leader checks.
struct Session {
    server: Arc<EtcdServer>,
    stream: Arc<WatchStream>,
    link: Arc<Link>,
    require_leader: bool,
    credentials: Credentials,
    shutdown: watch::Receiver<bool>,
}

impl Session {
    async fn run<S>(self, mut inbound: S)
    where
        S: Stream<Item = Result<WatchRequest, Status>> + Unpin,
    {
        let error = self.serve(&mut inbound).await;
        self.link.end(error);
    }

    /// Serves until the stream ends; the error it ends with, if any.
    async fn serve<S>(&self, inbound: &mut S) -> Option<Status>
    where
        S: Stream<Item = Result<WatchRequest, Status>> + Unpin,
    {
        let mut shutdown = self.shutdown.clone();
        let mut progress = progress_ticker(self.server.cfg.watch_progress_notify_interval);
        let mut leader_check = tokio::time::interval(self.server.cfg.election_timeout);
        leader_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut no_leader_count = 0;
        let mut reading = true;
        loop {
            tokio::select! {
                request = inbound.next(), if reading => match request {
                    Some(Ok(request)) => self.handle(request).await,
                    // Half-closed: events still flow until the client leaves
                    // (etcd keeps the stream until its context ends).
                    None => reading = false,
                    Some(Err(status)) => {
                        self.server.metrics.ops.stream_receive_failed("watch", &status);
                        return None;
                    }
                },
                _ = self.link.gone.notified() => return None,
                _ = async { drop(shutdown.wait_for(|stop| *stop).await) } => {
                    return Some(rpctypes::STOPPED.status());
                }
                _ = tick(&mut progress) => self.stream.progress_tick(),
                _ = leader_check.tick(), if self.require_leader => {
                    if self.server.has_leader() {
                        no_leader_count = 0;
                    } else {
                        no_leader_count += 1;
                    }
                    if no_leader_count >= MAX_NO_LEADER_COUNT {
                        return Some(rpctypes::NO_LEADER.status());
                    }
                }
            }
        }
    }

    async fn handle(&self, request: WatchRequest) {
        match request.request_union {
            Some(watch_request::RequestUnion::CreateRequest(create)) => {
                if let Err(e) = self.permitted(&create).await {
                    // Not a stream error: a created-and-canceled answer, as
                    // etcd, with Go's status text as the reason.
                    let revision = self.stream.current_revision();
                    self.stream.push(mvcc::WatchResponse {
                        watch_id: INVALID_WATCH_ID,
                        revision,
                        created: true,
                        canceled: true,
                        cancel_reason: go_status_text(e),
                        ..Default::default()
                    });
                    return;
                }
                self.create(create)
            }
            Some(watch_request::RequestUnion::CancelRequest(cancel)) => {
                // An unknown ID gets no answer, as etcd.
                let _ = self.stream.cancel(cancel.watch_id);
            }
            Some(watch_request::RequestUnion::ProgressRequest(_)) => {
                self.stream.request_progress_all();
            }
            None => {}
        }
    }

    /// Read permission on the watched range, checked once, at creation
    /// (a watch keeps running after its token expires, as in etcd). An
    /// empty key is `\0`; a `\0` end is from the key on.
    async fn permitted(&self, create: &WatchCreateRequest) -> Result<(), EtcdError> {
        let auth = &self.server.auth;
        if !auth.is_enabled() {
            return Ok(());
        }
        let user = self
            .credentials
            .user(&self.server)
            .await?
            .unwrap_or_default();
        let key: &[u8] = if create.key.is_empty() {
            &[0]
        } else {
            &create.key
        };
        let result = auth.check(&user, Access::Read, key, &create.range_end);
        match result {
            Err(e)
                if e != rpctypes::INVALID_AUTH_TOKEN
                    && e != rpctypes::AUTH_OLD_REVISION
                    && e != rpctypes::USER_EMPTY =>
            {
                Err(rpctypes::PERMISSION_DENIED)
            }
            other => other,
        }
    }

    fn create(&self, create: WatchCreateRequest) {
        let options = WatchOptions {
            id: create.watch_id,
            key: create.key,
            range_end: create.range_end,
            start_revision: create.start_revision,
            no_put: create.filters.contains(&(FilterType::Noput as i32)),
            no_delete: create.filters.contains(&(FilterType::Nodelete as i32)),
            prev_kv: create.prev_kv,
            progress_notify: create.progress_notify,
            fragment: create.fragment,
        };
        let revision = self.stream.current_revision();
        if let Err(e) = self.stream.watch(options) {
            self.stream.push(mvcc::WatchResponse {
                watch_id: INVALID_WATCH_ID,
                revision,
                created: true,
                canceled: true,
                cancel_reason: e.to_string(),
                ..Default::default()
            });
        }
    }
}

/// etcd's sendFragments: a response of two or more events whose size
/// reaches `limit` goes out in parts, each with `fragment` set but the last.
fn fragments(response: WatchResponse, limit: usize) -> Vec<WatchResponse> {
    if response.encoded_len() < limit || response.events.len() < 2 {
        return vec![response];
    }
    let mut template = response.clone();
    template.events = Vec::new();
    template.fragment = true;
    let mut parts = Vec::new();
    let mut current = template.clone();
    for event in response.events {
        current.events.push(event);
        if current.events.len() > 1 && current.encoded_len() >= limit {
            let overflow = current.events.pop();
            parts.push(std::mem::replace(&mut current, template.clone()));
            current.events.extend(overflow);
        }
    }
    current.fragment = false;
    parts.push(current);
    parts
}

fn progress_ticker(interval: Duration) -> Option<tokio::time::Interval> {
    if interval.is_zero() {
        return None;
    }
    let interval = interval.max(MIN_PROGRESS_INTERVAL);
    // etcd adds up to a tenth as jitter so that watchers created together do
    // not all report at once.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let tenth = (interval.as_nanos() / 10).max(1) as u64;
    let interval = interval + Duration::from_nanos(nanos.wrapping_mul(0x9e37_79b9) % tenth);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    Some(ticker)
}

async fn tick(ticker: &mut Option<tokio::time::Interval>) {
    match ticker {
        Some(ticker) => {
            ticker.tick().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::mvccpb::{Event, KeyValue};

    fn event(size: usize) -> Event {
        Event {
            kv: Some(KeyValue {
                key: "k".into(),
                value: vec![b'x'; size].into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn fragments_split_at_the_limit_and_mark_all_but_the_last() {
        let response = WatchResponse {
            watch_id: 3,
            events: (0..10).map(|_| event(100)).collect(),
            ..Default::default()
        };
        assert_eq!(fragments(response.clone(), 10_000).len(), 1);
        let parts = fragments(response, 350);
        assert!(parts.len() > 1);
        assert_eq!(parts.iter().map(|p| p.events.len()).sum::<usize>(), 10);
        assert!(parts[..parts.len() - 1].iter().all(|p| p.fragment));
        assert!(!parts.last().unwrap().fragment);
        assert!(parts
            .iter()
            .all(|p| p.watch_id == 3 && !p.events.is_empty()));
        // One event is never split, however large.
        let single = WatchResponse {
            events: vec![event(1000)],
            ..Default::default()
        };
        assert_eq!(fragments(single, 10).len(), 1);
    }
}
