//! The watchable store, as etcd's mvcc/watchable_store.go: every committed
//! change reaches the watchers of its key, in revision order, exactly once.
//!
//! # Groups
//!
//! * **synced**: watchers that have seen everything up to the current
//!   revision. `TxnWrite::end` publishes a revision and notifies them in the
//!   same critical section (the hub lock), so a watcher created "from now"
//!   can neither miss nor see twice the revision being written.
//! * **unsynced**: watchers that start in the past, or whose stream's queue
//!   was full when a change came (etcd's victims: we keep no events for them,
//!   only the revision they need next, so a slow stream costs no memory beyond
//!   its queue). The syncer thread ([`crate::watch_sync`]) reads their history
//!   from the pending batch and redb, a chunk at a time, without holding the
//!   hub lock while it reads, and moves them to synced once caught up.
//! * **compacted**: watchers whose next revision was compacted away; they got
//!   a response with `compact_revision` and stay only so that a cancel by the
//!   client is answered, as etcd.
//!
//! # Streams
//!
//! A [`WatchStream`] (one gRPC Watch stream) owns a bounded queue of
//! responses that the server drains. Control responses (created, canceled,
//! progress answers) always enter the queue; event responses enter only while
//! it has room ([`STREAM_QUEUE_CAPACITY`]), else the watcher is moved aside.
//! Everything for one watcher passes through its stream's queue, so a created
//! response precedes its events and a canceled response follows its last one.
//!
//! # Lock order
//!
//! hub lock → store state lock → queue lock. The queue's wake callback runs
//! under the hub lock: it must not block or call back into the store.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use api::mvccpb::{event::EventType, Event};
use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};

use crate::watch_group::{Gid, KeyGroup, WatchEnd};
use crate::watch_sync::SyncSignal;
use crate::Store;

/// A watcher's ID on its stream, chosen by the client or assigned.
pub type WatchId = i64;
/// "Assign me an ID" (clientv3.AutoWatchID).
pub const AUTO_WATCH_ID: WatchId = 0;
/// The ID of responses that belong to no watcher (clientv3.InvalidWatchID).
pub const INVALID_WATCH_ID: WatchId = -1;

/// Event responses a stream's queue holds before its watchers are moved
/// aside (etcd's chanBufLen). Bounds a slow stream's memory.
pub(crate) const STREAM_QUEUE_CAPACITY: usize = 128;

/// etcd's watch errors (mvcc/watcher.go), Display strings included.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    #[error("mvcc: watcher range is empty")]
    EmptyRange,
    #[error("mvcc: duplicate watch ID provided on the WatchStream")]
    DuplicateId,
    #[error("mvcc: watcher does not exist")]
    NotExist,
}

/// A watch create request, in etcd's conventions: an empty key is "\0",
/// range_end empty = one key, "\0" = every key >= key; start_revision 0 =
/// after the current revision.
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    pub id: WatchId,
    pub key: Bytes,
    pub range_end: Bytes,
    pub start_revision: i64,
    pub no_put: bool,
    pub no_delete: bool,
    pub prev_kv: bool,
    pub progress_notify: bool,
    pub fragment: bool,
}

/// One response for the stream (etcd's WatchResponse without the header,
/// whose revision is `revision`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WatchResponse {
    pub watch_id: WatchId,
    pub revision: i64,
    pub created: bool,
    pub canceled: bool,
    pub compact_revision: i64,
    pub cancel_reason: String,
    pub events: Vec<Event>,
    /// The watcher asked for large responses to be split.
    pub fragment: bool,
    /// The watcher asked for prev_kv: the server looks it up at
    /// `mod_revision - 1` as it sends (as etcd's sendLoop does), so a write
    /// never reads a previous value for watchers that did not ask.
    pub needs_prev_kv: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum WatcherState {
    Synced,
    Unsynced,
    Compacted,
}

pub(crate) struct Watcher {
    pub stream: u64,
    pub id: WatchId,
    pub key: Bytes,
    pub end: WatchEnd,
    pub no_put: bool,
    pub no_delete: bool,
    pub prev_kv: bool,
    pub progress_notify: bool,
    pub fragment: bool,
    /// Synced: events below it are skipped (a future start revision).
    /// Unsynced: the next revision it needs.
    pub min_rev: i64,
    pub state: WatcherState,
    /// Events went out since the last progress tick (etcd elides the tick).
    pub sent_since_tick: bool,
}

impl Watcher {
    /// The events this watcher sends, after its filters (without prev_kv:
    /// see [`WatchResponse::needs_prev_kv`]).
    pub(crate) fn select<'e>(&self, events: impl IntoIterator<Item = &'e Event>) -> Vec<Event> {
        events
            .into_iter()
            .filter(|ev| {
                let put = ev.r#type == EventType::Put as i32;
                !(put && self.no_put || !put && self.no_delete)
            })
            .cloned()
            .collect()
    }
}

/// A stream's responses, drained by the server.
pub(crate) struct Queue {
    items: Mutex<VecDeque<WatchResponse>>,
    wake: Box<dyn Fn() + Send + Sync>,
    /// An event response was refused: the syncer waits for room.
    blocked: AtomicBool,
    /// The store's event counts (queued, taken, discarded).
    events: Arc<crate::stats::EventCounts>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        let left: usize = self.items.get_mut().iter().map(|r| r.events.len()).sum();
        self.events.discarded(left);
    }
}

impl Queue {
    /// An event response, only while there is room.
    pub(crate) fn try_push(&self, response: WatchResponse) -> bool {
        let mut items = self.items.lock();
        if items.len() >= STREAM_QUEUE_CAPACITY {
            self.blocked.store(true, Ordering::Relaxed);
            return false;
        }
        self.events.queued(response.events.len());
        items.push_back(response);
        drop(items);
        (self.wake)();
        true
    }

    /// A control response: always taken (the server bounds how many it
    /// causes by pausing its reads while the queue is long).
    pub fn push(&self, response: WatchResponse) {
        self.events.queued(response.events.len());
        self.items.lock().push_back(response);
        (self.wake)();
    }

    pub(crate) fn has_room(&self) -> bool {
        let room = self.items.lock().len() < STREAM_QUEUE_CAPACITY;
        if !room {
            self.blocked.store(true, Ordering::Relaxed);
        }
        room
    }
}

pub(crate) struct StreamEntry {
    pub queue: Arc<Queue>,
    pub ids: HashMap<WatchId, Gid>,
    next_id: WatchId,
    /// A RequestProgress waits for all watchers of the stream to be synced.
    pub progress_pending: bool,
}

/// Everything the hub lock guards.
#[derive(Default)]
pub(crate) struct Groups {
    next_gid: Gid,
    next_stream: u64,
    pub watchers: HashMap<Gid, Watcher>,
    pub streams: HashMap<u64, StreamEntry>,
    pub synced: KeyGroup,
    pub unsynced: BTreeSet<Gid>,
    /// Where the next sync round starts, for fairness past its size limit.
    pub sync_cursor: Gid,
}

/// The watchers of one store.
pub(crate) struct WatchHub {
    groups: Mutex<Groups>,
    pub signal: Arc<SyncSignal>,
    /// Whether a syncer thread runs (tests drive rounds by hand).
    pub background: AtomicBool,
    syncer_started: Mutex<bool>,
    pub(crate) events: Arc<crate::stats::EventCounts>,
}

impl Default for WatchHub {
    fn default() -> Self {
        WatchHub {
            groups: Mutex::new(Groups::default()),
            signal: Arc::new(SyncSignal::default()),
            background: AtomicBool::new(true),
            syncer_started: Mutex::new(false),
            events: Arc::default(),
        }
    }
}

impl WatchHub {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Groups> {
        self.groups.lock()
    }
}

impl Groups {
    /// Notifies synced watchers of one revision's events (sub-revision
    /// order). Called with the revision just published, under the hub lock.
    /// Returns whether a watcher was moved aside (the syncer must run).
    pub(crate) fn notify(&mut self, revision: i64, events: &[Event]) -> bool {
        if self.synced.is_empty() || events.is_empty() {
            return false;
        }
        let mut order: Vec<Gid> = Vec::new();
        let mut matched: HashMap<Gid, Vec<&Event>> = HashMap::new();
        for event in events {
            let Some(kv) = &event.kv else { continue };
            self.synced.for_each_match(&kv.key, |gid| {
                matched
                    .entry(gid)
                    .or_insert_with(|| {
                        order.push(gid);
                        Vec::new()
                    })
                    .push(event);
            });
        }
        let mut moved_aside = false;
        for gid in order {
            let Some(watcher) = self.watchers.get_mut(&gid) else {
                continue;
            };
            debug_assert_eq!(watcher.state, WatcherState::Synced);
            if revision < watcher.min_rev {
                continue;
            }
            let selected = watcher.select(matched.remove(&gid).unwrap_or_default());
            if selected.is_empty() {
                continue;
            }
            let Some(stream) = self.streams.get(&watcher.stream) else {
                continue;
            };
            let response = WatchResponse {
                watch_id: watcher.id,
                revision,
                events: selected,
                fragment: watcher.fragment,
                needs_prev_kv: watcher.prev_kv,
                ..Default::default()
            };
            if stream.queue.try_push(response) {
                watcher.sent_since_tick = true;
            } else {
                // Moved aside: caught up from this revision by the syncer.
                watcher.min_rev = revision;
                watcher.state = WatcherState::Unsynced;
                self.synced.remove(gid, &watcher.key, &watcher.end);
                self.unsynced.insert(gid);
                moved_aside = true;
            }
        }
        moved_aside
    }

    /// The store's revision jumped from `previous` to `restored` without
    /// notifying anyone (a snapshot install). Each synced watcher has seen
    /// everything up to `previous`; one that still needs a revision at or
    /// below `restored` moves to unsynced to read it from the backend (or to
    /// be canceled with the compact revision if the restored file no longer
    /// holds it). Returns whether any moved (the syncer must run).
    pub(crate) fn unsync_after_jump(&mut self, previous: i64, restored: i64) -> bool {
        let mut moved = false;
        for (gid, watcher) in self.watchers.iter_mut() {
            if watcher.state != WatcherState::Synced {
                continue;
            }
            let next = watcher.min_rev.max(previous + 1);
            if next > restored {
                continue; // a future start revision the jump did not reach
            }
            watcher.min_rev = next;
            watcher.state = WatcherState::Unsynced;
            self.synced.remove(*gid, &watcher.key, &watcher.end);
            self.unsynced.insert(*gid);
            moved = true;
        }
        moved
    }

    /// Answers a stream's pending RequestProgress if all its watchers are
    /// synced (etcd 3.5.13's progressIfSync: no watcher, no answer).
    pub(crate) fn answer_progress(&mut self, stream_id: u64, current: i64) {
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return;
        };
        if !stream.progress_pending {
            return;
        }
        let watchers = &self.watchers;
        let all_synced = stream.ids.values().all(|gid| {
            watchers
                .get(gid)
                .is_none_or(|w| w.state != WatcherState::Unsynced)
        });
        if !all_synced {
            return;
        }
        stream.progress_pending = false;
        if stream.ids.is_empty() {
            return;
        }
        stream.queue.push(WatchResponse {
            watch_id: INVALID_WATCH_ID,
            revision: current,
            ..Default::default()
        });
    }

    fn remove_watcher(&mut self, gid: Gid) -> Option<Watcher> {
        let watcher = self.watchers.remove(&gid)?;
        match watcher.state {
            WatcherState::Synced => {
                self.synced.remove(gid, &watcher.key, &watcher.end);
            }
            WatcherState::Unsynced => {
                self.unsynced.remove(&gid);
            }
            WatcherState::Compacted => {}
        }
        Some(watcher)
    }
}

impl Store {
    /// Opens a watch stream. `wake` is called whenever a response enters its
    /// queue; it runs under the store's watch lock, so it must only signal
    /// (e.g. `tokio::sync::Notify::notify_one`).
    pub fn watch_stream(self: &Arc<Self>, wake: Box<dyn Fn() + Send + Sync>) -> WatchStream {
        if self.watch.background.load(Ordering::Relaxed) {
            let mut started = self.watch.syncer_started.lock();
            if !*started {
                *started = crate::watch_sync::spawn_syncer(self);
            }
        }
        let queue = Arc::new(Queue {
            items: Mutex::new(VecDeque::new()),
            wake,
            blocked: AtomicBool::new(false),
            events: self.watch.events.clone(),
        });
        let mut groups = self.watch.lock();
        let id = groups.next_stream;
        groups.next_stream += 1;
        groups.streams.insert(
            id,
            StreamEntry {
                queue: queue.clone(),
                ids: HashMap::new(),
                next_id: 0,
                progress_pending: false,
            },
        );
        WatchStream {
            store: self.clone(),
            id,
            queue,
        }
    }

    /// Number of watchers of every state (for tests and metrics).
    pub fn watcher_count(&self) -> usize {
        self.watch.lock().watchers.len()
    }

    /// (watch streams, watchers, unsynced watchers), for etcd's
    /// etcd_debugging_mvcc_{watch_stream,watcher,slow_watcher}_total.
    pub fn watch_counts(&self) -> (usize, usize, usize) {
        let groups = self.watch.lock();
        (
            groups.streams.len(),
            groups.watchers.len(),
            groups.unsynced.len(),
        )
    }
}

/// One gRPC Watch stream's watchers and response queue. Dropping it cancels
/// every watcher on it.
pub struct WatchStream {
    store: Arc<Store>,
    id: u64,
    queue: Arc<Queue>,
}

impl WatchStream {
    /// Creates a watcher; its created response (header revision = the
    /// current revision) enters the queue before any of its events.
    pub fn watch(&self, options: WatchOptions) -> Result<WatchId, WatchError> {
        let key = if options.key.is_empty() {
            Bytes::from_static(b"\0")
        } else {
            options.key.clone()
        };
        let end = WatchEnd::from_request(&key, &options.range_end).ok_or(WatchError::EmptyRange)?;
        let mut guard = self.store.watch.lock();
        let current = self.store.current_revision();
        let groups = &mut *guard;
        let Some(stream) = groups.streams.get_mut(&self.id) else {
            return Err(WatchError::EmptyRange);
        };
        let id = if options.id == AUTO_WATCH_ID {
            while stream.ids.contains_key(&stream.next_id) {
                stream.next_id += 1;
            }
            stream.next_id += 1;
            stream.next_id - 1
        } else if stream.ids.contains_key(&options.id) {
            return Err(WatchError::DuplicateId);
        } else {
            options.id
        };
        let start = if options.start_revision == 0 {
            current + 1
        } else {
            options.start_revision
        };
        let synced = start > current;
        let gid = groups.next_gid;
        groups.next_gid += 1;
        stream.ids.insert(id, gid);
        stream.queue.push(WatchResponse {
            watch_id: id,
            revision: current,
            created: true,
            ..Default::default()
        });
        let watcher = Watcher {
            stream: self.id,
            id,
            key,
            end,
            no_put: options.no_put,
            no_delete: options.no_delete,
            prev_kv: options.prev_kv,
            progress_notify: options.progress_notify,
            fragment: options.fragment,
            min_rev: start,
            state: if synced {
                WatcherState::Synced
            } else {
                WatcherState::Unsynced
            },
            sent_since_tick: false,
        };
        if synced {
            groups.synced.add(gid, &watcher.key, &watcher.end);
        } else {
            groups.unsynced.insert(gid);
        }
        groups.watchers.insert(gid, watcher);
        drop(guard);
        if !synced {
            self.store.watch.signal.wake();
        }
        Ok(id)
    }

    /// Cancels a watcher; its canceled response follows its last event.
    pub fn cancel(&self, id: WatchId) -> Result<(), WatchError> {
        let mut groups = self.store.watch.lock();
        let current = self.store.current_revision();
        let Some(stream) = groups.streams.get_mut(&self.id) else {
            return Err(WatchError::NotExist);
        };
        let gid = stream.ids.remove(&id).ok_or(WatchError::NotExist)?;
        stream.queue.push(WatchResponse {
            watch_id: id,
            revision: current,
            canceled: true,
            ..Default::default()
        });
        groups.remove_watcher(gid);
        groups.answer_progress(self.id, current);
        Ok(())
    }

    /// etcd 3.5.13's RequestProgress: one response (watch ID -1, the
    /// current revision) once every watcher on the stream is synced; a
    /// request while one is pending is folded into it.
    pub fn request_progress_all(&self) {
        let mut groups = self.store.watch.lock();
        let current = self.store.current_revision();
        if let Some(stream) = groups.streams.get_mut(&self.id) {
            stream.progress_pending = true;
        }
        groups.answer_progress(self.id, current);
    }

    /// The progress_notify tick: each synced progress_notify watcher that
    /// sent nothing since the last tick gets an empty response with the
    /// current revision (skipped when the queue is full: it is busy).
    pub fn progress_tick(&self) {
        let mut groups = self.store.watch.lock();
        let current = self.store.current_revision();
        let groups = &mut *groups;
        let Some(stream) = groups.streams.get(&self.id) else {
            return;
        };
        for gid in stream.ids.values() {
            let Some(watcher) = groups.watchers.get_mut(gid) else {
                continue;
            };
            if !watcher.progress_notify {
                continue;
            }
            if !watcher.sent_since_tick && watcher.state == WatcherState::Synced {
                stream.queue.try_push(WatchResponse {
                    watch_id: watcher.id,
                    revision: current,
                    ..Default::default()
                });
            }
            watcher.sent_since_tick = false;
        }
    }

    /// Queues a response the server made itself (e.g. a refused create).
    pub fn push(&self, response: WatchResponse) {
        self.queue.push(response);
    }

    /// The next response, if any.
    pub fn pop(&self) -> Option<WatchResponse> {
        let (response, left) = {
            let mut items = self.queue.items.lock();
            let response = items.pop_front();
            (response, items.len())
        };
        if let Some(response) = &response {
            self.queue.events.taken(response.events.len());
        }
        if left < STREAM_QUEUE_CAPACITY / 2 && self.queue.blocked.swap(false, Ordering::Relaxed) {
            self.store.watch.signal.wake();
        }
        response
    }

    /// Responses waiting in the queue.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue.items.lock().len()
    }

    pub fn current_revision(&self) -> i64 {
        self.store.current_revision()
    }

    /// IDs of the stream's watchers that are not synced (for tests).
    #[cfg(test)]
    pub(crate) fn unsynced_ids(&self) -> Vec<WatchId> {
        let groups = self.store.watch.lock();
        let Some(stream) = groups.streams.get(&self.id) else {
            return Vec::new();
        };
        let mut ids: Vec<WatchId> = stream
            .ids
            .iter()
            .filter(|(_, gid)| {
                groups
                    .watchers
                    .get(gid)
                    .is_some_and(|w| w.state == WatcherState::Unsynced)
            })
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        let mut groups = self.store.watch.lock();
        if let Some(stream) = groups.streams.remove(&self.id) {
            let gids: HashSet<Gid> = stream.ids.into_values().collect();
            for gid in gids {
                groups.remove_watcher(gid);
            }
        }
    }
}
