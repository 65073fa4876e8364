//! Catching unsynced watchers up from history (etcd's syncWatchers and
//! syncVictims in one): a background thread, started with the first watch
//! stream, runs rounds while there is work and otherwise sleeps until woken
//! (a new unsynced watcher, a full queue drained) or [`SYNC_INTERVAL`].
//!
//! A round: under the hub lock, cancel watchers whose next revision was
//! compacted and choose up to [`MAX_WATCHERS_PER_SYNC`] whose queue has room;
//! without the lock, read one chunk of history (whole revisions, at most
//! [`MAX_SYNC_REVISIONS`] and about [`MAX_SYNC_BYTES`]) from the pending batch
//! and redb; under the lock again, hand each watcher its events and move
//! those that reached the current revision to synced. Reading outside the lock
//! keeps the apply path free; a watcher only leaves unsynced when, under the
//! lock, nothing was written after the chunk it got.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use api::mvccpb::{event::EventType, Event, KeyValue};
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use prost::Message;
use redb::ReadableDatabase;

use crate::backend::{backend_error, scan_key_value, KEY_TABLE};
use crate::parts::ReadParts;
use crate::revision::{Revision, RevisionKey};
use crate::watch::{WatchResponse, WatcherState};
use crate::watch_group::{Gid, KeyGroup};
use crate::{MvccError, Store};

/// How long the syncer sleeps when nothing wakes it (etcd: 100 ms).
pub(crate) const SYNC_INTERVAL: Duration = Duration::from_millis(100);
/// Watchers served per round (etcd's maxWatchersPerSync).
pub(crate) const MAX_WATCHERS_PER_SYNC: usize = 512;
/// Revisions read per round (etcd's watchBatchMaxRevs): bounds one catch-up
/// response.
pub(crate) const MAX_SYNC_REVISIONS: usize = 1000;
/// Bytes of records read per round, checked at revision boundaries (a
/// revision is never split, so one huge txn may exceed it).
pub(crate) const MAX_SYNC_BYTES: usize = 16 << 20;

/// Wakes the syncer thread.
#[derive(Default)]
pub(crate) struct SyncSignal {
    woken: Mutex<bool>,
    condvar: Condvar,
}

impl SyncSignal {
    pub(crate) fn wake(&self) {
        *self.woken.lock() = true;
        self.condvar.notify_one();
    }

    fn wait(&self, timeout: Duration) {
        let mut woken = self.woken.lock();
        if !*woken {
            self.condvar.wait_for(&mut woken, timeout);
        }
        *woken = false;
    }
}

/// Starts the syncer thread; it ends once the store is dropped. Returns
/// whether it started.
pub(crate) fn spawn_syncer(store: &Arc<Store>) -> bool {
    let weak: Weak<Store> = Arc::downgrade(store);
    let signal = store.watch.signal.clone();
    std::thread::Builder::new()
        .name("watch-sync".into())
        .spawn(move || loop {
            let more = match weak.upgrade() {
                Some(store) => store.sync_watchers(),
                None => return,
            };
            if !more {
                signal.wait(SYNC_INTERVAL);
            }
        })
        .is_ok()
}

/// A watcher chosen for a round, as it was when chosen.
struct Chosen {
    gid: Gid,
    min_rev: i64,
}

/// One catch-up round as chosen under the hub lock: the watchers, the keys
/// they watch and the revisions to read (`from..=to`, `to` the current
/// revision when chosen).
struct Round {
    chosen: Vec<Chosen>,
    group: KeyGroup,
    from: i64,
    to: i64,
}

impl Store {
    /// Runs one catch-up round. Returns whether another round could make
    /// progress right away.
    pub(crate) fn sync_watchers(&self) -> bool {
        let Some(round) = self.choose_round() else {
            return false;
        };
        let (events, upper) = if round.from > round.to {
            (Vec::new(), round.to)
        } else {
            match self.read_history(round.from, round.to, |key| round.group.matches(key)) {
                Ok(read) => read,
                // Nothing is lost: the watchers stay unsynced for a later round.
                Err(_) => return false,
            }
        };
        self.deliver_round(&round, &events, upper)
    }

    /// Under the hub lock: cancels the watchers whose next revision was
    /// compacted and chooses up to [`MAX_WATCHERS_PER_SYNC`] unsynced ones
    /// whose queue has room, starting where the last round stopped. None
    /// when there is nothing to read.
    fn choose_round(&self) -> Option<Round> {
        let mut groups = self.watch.lock();
        if groups.unsynced.is_empty() {
            return None;
        }
        let (current, compacted) = self.revisions();
        let groups = &mut *groups;
        let cursor = groups.sync_cursor;
        let order: Vec<Gid> = groups
            .unsynced
            .range(cursor..)
            .chain(groups.unsynced.range(..cursor))
            .copied()
            .collect();
        let mut chosen = Vec::new();
        let mut group = KeyGroup::default();
        let mut compacted_streams = HashSet::new();
        for gid in order {
            if chosen.len() >= MAX_WATCHERS_PER_SYNC {
                groups.sync_cursor = gid;
                break;
            }
            let Some(watcher) = groups.watchers.get_mut(&gid) else {
                continue;
            };
            let Some(stream) = groups.streams.get(&watcher.stream) else {
                continue;
            };
            if watcher.min_rev < compacted {
                let response = WatchResponse {
                    watch_id: watcher.id,
                    canceled: true,
                    compact_revision: compacted,
                    ..Default::default()
                };
                // A full queue: retried next round, as etcd.
                if stream.queue.try_push(response) {
                    watcher.state = WatcherState::Compacted;
                    groups.unsynced.remove(&gid);
                    compacted_streams.insert(watcher.stream);
                }
                continue;
            }
            if !stream.queue.has_room() {
                continue;
            }
            debug_assert!(watcher.min_rev <= current + 1);
            group.add(gid, &watcher.key, &watcher.end);
            chosen.push(Chosen {
                gid,
                min_rev: watcher.min_rev,
            });
        }
        for stream in compacted_streams {
            groups.answer_progress(stream, current);
        }
        let from = chosen.iter().map(|c| c.min_rev).min()?;
        Some(Round {
            chosen,
            group,
            from,
            to: current,
        })
    }

    /// Under the hub lock again: hands each chosen watcher still as it was
    /// its events of `round.from..=upper` and moves those that reached the
    /// current revision to synced. Returns whether another round could make
    /// progress right away.
    fn deliver_round(&self, round: &Round, events: &[Event], upper: i64) -> bool {
        let mut per_watcher = round.split(events);
        let mut groups = self.watch.lock();
        let (current, compacted) = self.revisions();
        if compacted > round.from {
            // A compaction ran during the read and may have dropped records
            // of it: the next round cancels or re-reads.
            return true;
        }
        let groups = &mut *groups;
        let mut progressed = false;
        let mut synced_streams = HashSet::new();
        for c in &round.chosen {
            let Some(watcher) = groups.watchers.get_mut(&c.gid) else {
                continue;
            };
            if watcher.state != WatcherState::Unsynced || watcher.min_rev != c.min_rev {
                continue;
            }
            let Some(stream) = groups.streams.get(&watcher.stream) else {
                continue;
            };
            let selected = watcher.select(per_watcher.remove(&c.gid).unwrap_or_default());
            if !selected.is_empty() {
                let response = WatchResponse {
                    watch_id: watcher.id,
                    revision: upper,
                    events: selected,
                    fragment: watcher.fragment,
                    needs_prev_kv: watcher.prev_kv,
                    ..Default::default()
                };
                if !stream.queue.try_push(response) {
                    continue;
                }
                watcher.sent_since_tick = true;
            }
            progressed = true;
            watcher.min_rev = upper + 1;
            if upper == current {
                watcher.state = WatcherState::Synced;
                groups.unsynced.remove(&c.gid);
                groups.synced.add(c.gid, &watcher.key, &watcher.end);
                synced_streams.insert(watcher.stream);
            }
        }
        for stream in synced_streams {
            groups.answer_progress(stream, current);
        }
        progressed && !groups.unsynced.is_empty()
    }

    /// The current and the compacted revision.
    fn revisions(&self) -> (i64, i64) {
        let state = self.state.read();
        (state.current_revision, state.compact_revision)
    }

    /// Events of revisions `from..=to` whose key is `wanted`, in revision
    /// order, read from the pending batch and redb; stops early at a revision
    /// boundary past the round limits. Returns the events and the last
    /// revision fully read.
    pub(crate) fn read_history(
        &self,
        from: i64,
        to: i64,
        wanted: impl Fn(&[u8]) -> bool,
    ) -> Result<(Vec<Event>, i64), MvccError> {
        let _open = self.open_reads.open();
        let lower = Revision::new(from, 0);
        let upper = Revision::new(to + 1, 0);
        // Before the pending lock: a batch leaving the backlog meanwhile is
        // in this set already (see `compaction`).
        let backlog = self.backlog_dropped_from(lower);
        let (overlay, deleted, table, parts) = {
            let pending = self.pending.read();
            let overlay: Vec<(Revision, bool, Bytes)> = pending
                .records
                .range(lower..upper)
                .map(|(r, (tombstone, v))| (*r, *tombstone, v.clone()))
                .collect();
            let deleted: HashSet<Revision> = pending
                .deletions
                .iter()
                .map(|k| k.revision())
                .filter(|r| *r >= lower)
                .chain(backlog.iter().map(|k| k.revision()))
                .collect();
            // Begun under the pending lock: whatever redb lacks is in `overlay`.
            let txn = self.db().begin_read().map_err(backend_error)?;
            let table = txn.open_table(KEY_TABLE).map_err(backend_error)?;
            (overlay, deleted, table, ReadParts::open(&txn)?)
        };
        let lower_key = RevisionKey::new(lower, false);
        let upper_key = RevisionKey::new(upper, false);
        let mut overlay = overlay.into_iter().peekable();
        let mut redb = table
            .range(lower_key.as_slice()..upper_key.as_slice())
            .map_err(backend_error)?;
        let mut history = History::new(to, wanted);
        loop {
            let next_redb = match redb.next() {
                Some(entry) => {
                    let (k, v) = entry.map_err(backend_error)?;
                    let (revision, tombstone) = RevisionKey::parse(k.value())?;
                    let record = parts
                        .join(k.value(), v.value())
                        .map_err(|e| self.damaged(e))?;
                    Some((revision, tombstone, Bytes::from(record.into_owned())))
                }
                None => None,
            };
            // Overlay records before (or equal to) this redb record go first.
            while let Some((revision, tombstone, value)) =
                overlay.next_if(|(r, _, _)| next_redb.as_ref().is_none_or(|(rr, _, _)| r <= rr))
            {
                if next_redb.as_ref().is_some_and(|(rr, _, _)| *rr == revision) {
                    continue; // committed meanwhile: the redb copy follows
                }
                if !deleted.contains(&revision) {
                    let value = self.unseal_record_bytes(revision, &value)?;
                    if !history.add(revision, tombstone, &value)? {
                        return Ok(history.finish());
                    }
                }
            }
            let Some((revision, tombstone, value)) = next_redb else {
                break;
            };
            if !deleted.contains(&revision) {
                let value = self.unseal_record_bytes(revision, &value)?;
                if !history.add(revision, tombstone, &value)? {
                    return Ok(history.finish());
                }
            }
        }
        Ok(history.finish())
    }
}

/// Accumulates one round's events within its limits.
struct History<F> {
    wanted: F,
    events: Vec<Event>,
    revisions: usize,
    bytes: usize,
    last_main: i64,
    /// Last revision fully read.
    upper: i64,
}

impl<F: Fn(&[u8]) -> bool> History<F> {
    fn new(to: i64, wanted: F) -> Self {
        History {
            wanted,
            events: Vec::new(),
            revisions: 0,
            bytes: 0,
            last_main: 0,
            upper: to,
        }
    }

    /// Returns false when the limits end the read before `revision`.
    /// `value` is the record's encoded KeyValue (unsealed).
    fn add(
        &mut self,
        revision: Revision,
        tombstone: bool,
        value: &Bytes,
    ) -> Result<bool, MvccError> {
        if revision.main != self.last_main {
            if self.revisions >= MAX_SYNC_REVISIONS || self.bytes >= MAX_SYNC_BYTES {
                self.upper = self.last_main;
                return Ok(false);
            }
            self.revisions += 1;
            self.last_main = revision.main;
        }
        self.bytes += value.len();
        let fields = scan_key_value(value)?;
        if !(self.wanted)(fields.key) {
            return Ok(true);
        }
        let event = if tombstone {
            Event {
                r#type: EventType::Delete as i32,
                kv: Some(KeyValue {
                    key: Bytes::copy_from_slice(fields.key),
                    mod_revision: revision.main,
                    ..Default::default()
                }),
                prev_kv: None,
            }
        } else {
            let kv =
                KeyValue::decode(value.clone()).map_err(|e| MvccError::Corrupt(e.to_string()))?;
            Event {
                r#type: EventType::Put as i32,
                kv: Some(kv),
                prev_kv: None,
            }
        };
        self.events.push(event);
        Ok(true)
    }

    fn finish(self) -> (Vec<Event>, i64) {
        (self.events, self.upper)
    }
}

impl Round {
    /// The events each chosen watcher watches, at or after its own start.
    fn split<'a>(&self, events: &'a [Event]) -> HashMap<Gid, Vec<&'a Event>> {
        let min_rev: HashMap<Gid, i64> = self.chosen.iter().map(|c| (c.gid, c.min_rev)).collect();
        let mut per_watcher: HashMap<Gid, Vec<&Event>> = HashMap::new();
        for event in events {
            let Some(kv) = &event.kv else { continue };
            self.group.for_each_match(&kv.key, |gid| {
                if min_rev.get(&gid).is_some_and(|m| kv.mod_revision >= *m) {
                    per_watcher.entry(gid).or_default().push(event);
                }
            });
        }
        per_watcher
    }
}
