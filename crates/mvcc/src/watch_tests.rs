//! The watchable store, each test named after the etcd guarantee it pins.
//! Sync rounds are driven by hand (no syncer thread) so every move between
//! groups is deterministic.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use api::etcdserverpb::{request_op, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest};
use api::mvccpb::event::EventType;
use bytes::Bytes;

use crate::watch::STREAM_QUEUE_CAPACITY;
use crate::{Store, WatchError, WatchOptions, WatchResponse, WatchStream, INVALID_WATCH_ID};

struct TestStore {
    store: Arc<Store>,
    _dir: tempfile::TempDir,
}

fn open() -> TestStore {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).unwrap();
    store.watch.background.store(false, Ordering::Relaxed);
    TestStore {
        store: Arc::new(store),
        _dir: dir,
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn put(store: &Store, key: &str, value: &str) -> i64 {
    let mut txn = store.write(0);
    txn.put(&PutRequest {
        key: b(key),
        value: b(value),
        ..Default::default()
    })
    .unwrap();
    txn.end().revision
}

fn delete(store: &Store, key: &str) -> i64 {
    let mut txn = store.write(0);
    txn.delete_range(&DeleteRangeRequest {
        key: b(key),
        ..Default::default()
    })
    .unwrap();
    txn.end().revision
}

fn stream(store: &Arc<Store>) -> WatchStream {
    store.watch_stream(Box::new(|| {}))
}

fn key_watch(key: &str, start_revision: i64) -> WatchOptions {
    WatchOptions {
        key: b(key),
        start_revision,
        ..Default::default()
    }
}

fn prefix_watch(prefix: &str, start_revision: i64) -> WatchOptions {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    WatchOptions {
        key: b(prefix),
        range_end: Bytes::from(end),
        start_revision,
        ..Default::default()
    }
}

fn drain(stream: &WatchStream) -> Vec<WatchResponse> {
    std::iter::from_fn(|| stream.pop()).collect()
}

/// (type, key, mod_revision) of every event, in order.
fn events(responses: &[WatchResponse]) -> Vec<(EventType, String, i64)> {
    responses
        .iter()
        .flat_map(|r| &r.events)
        .map(|e| {
            let kv = e.kv.as_ref().unwrap();
            (
                e.r#type(),
                String::from_utf8_lossy(&kv.key).into_owned(),
                kv.mod_revision,
            )
        })
        .collect()
}

fn sync_until_idle(store: &Store) {
    for _ in 0..100 {
        if !store.sync_watchers() {
            return;
        }
    }
    panic!("sync rounds never settle");
}

#[test]
fn watch_created_response_precedes_live_events_of_its_key() {
    let t = open();
    let s = stream(&t.store);
    let id = s.watch(key_watch("foo", 0)).unwrap();
    assert_eq!(id, 0);
    put(&t.store, "bar", "x");
    put(&t.store, "foo", "1");
    let got = drain(&s);
    assert!(got[0].created && got[0].revision == 1 && got[0].watch_id == 0);
    assert_eq!(events(&got[1..]), vec![(EventType::Put, "foo".into(), 3)]);
    assert_eq!(got[1].revision, 3);
    let kv = got[1].events[0].kv.as_ref().unwrap();
    assert_eq!(
        (kv.create_revision, kv.version, &kv.value[..]),
        (3, 1, &b"1"[..])
    );
}

#[test]
fn txn_events_arrive_in_one_response_in_sub_revision_order() {
    let t = open();
    let s = stream(&t.store);
    s.watch(prefix_watch("k", 0)).unwrap();
    let put_op = |k: &str| RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: b(k),
            value: b("v"),
            ..Default::default()
        })),
    };
    let mut txn = t.store.write(0);
    txn.txn(&TxnRequest {
        success: vec![put_op("k2"), put_op("k1"), put_op("zz"), put_op("k3")],
        ..Default::default()
    })
    .unwrap();
    txn.end();
    let got = drain(&s);
    assert_eq!(got.len(), 2);
    assert_eq!(
        events(&got[1..]),
        vec![
            (EventType::Put, "k2".into(), 2),
            (EventType::Put, "k1".into(), 2),
            (EventType::Put, "k3".into(), 2),
        ]
    );
}

#[test]
fn watch_from_past_revision_replays_history_then_switches_to_live() {
    let t = open();
    put(&t.store, "a", "1"); // 2
    put(&t.store, "a", "2"); // 3
    t.store.commit(false).unwrap(); // history now partly in redb…
    delete(&t.store, "a"); // 4, …and partly pending
    put(&t.store, "b", "x"); // 5
    let s = stream(&t.store);
    let id = s
        .watch(WatchOptions {
            prev_kv: true,
            ..key_watch("a", 3)
        })
        .unwrap();
    assert_eq!(s.unsynced_ids(), vec![id]);
    sync_until_idle(&t.store);
    assert!(s.unsynced_ids().is_empty());
    put(&t.store, "a", "3"); // 6: live
    let got = drain(&s);
    assert!(got[0].created);
    assert_eq!(
        events(&got[1..]),
        vec![
            (EventType::Put, "a".into(), 3),
            (EventType::Delete, "a".into(), 4),
            (EventType::Put, "a".into(), 6),
        ]
    );
    // Replayed and live events alike leave prev_kv to the server.
    assert!(got[1].needs_prev_kv && got[1].revision == 5);
    assert!(got[2].needs_prev_kv);
    assert!(got[2].events[0].prev_kv.is_none());
}

#[test]
fn filters_drop_puts_or_deletes_and_prev_kv_only_when_asked() {
    let t = open();
    let s = stream(&t.store);
    let no_put = s
        .watch(WatchOptions {
            no_put: true,
            prev_kv: true,
            ..key_watch("k", 0)
        })
        .unwrap();
    let no_delete = s
        .watch(WatchOptions {
            no_delete: true,
            ..key_watch("k", 0)
        })
        .unwrap();
    put(&t.store, "k", "v1"); // 2
    put(&t.store, "k", "v2"); // 3
    delete(&t.store, "k"); // 4
    let got = drain(&s);
    let of = |id| -> Vec<WatchResponse> {
        got.iter()
            .filter(|r| r.watch_id == id && !r.created)
            .cloned()
            .collect()
    };
    assert_eq!(
        events(&of(no_put)),
        vec![(EventType::Delete, "k".into(), 4)]
    );
    // prev_kv is the server's to look up, for the watcher that asked only.
    assert!(of(no_put).iter().all(|r| r.needs_prev_kv));
    assert!(of(no_delete).iter().all(|r| !r.needs_prev_kv));
    assert_eq!(
        events(&of(no_delete)),
        vec![
            (EventType::Put, "k".into(), 2),
            (EventType::Put, "k".into(), 3)
        ]
    );
    assert!(of(no_delete)
        .iter()
        .flat_map(|r| &r.events)
        .all(|e| e.prev_kv.is_none()));
}

#[test]
fn slow_stream_is_moved_aside_and_caught_up_from_backend_without_gap_or_duplicate() {
    let t = open();
    let slow = stream(&t.store);
    let fast = stream(&t.store);
    slow.watch(key_watch("k", 0)).unwrap();
    fast.watch(key_watch("k", 0)).unwrap();
    let writes = STREAM_QUEUE_CAPACITY as i64 + 50;
    let mut fast_got = Vec::new();
    for i in 0..writes {
        put(&t.store, "k", &i.to_string());
        if i == writes / 2 {
            t.store.commit(false).unwrap();
        }
        fast_got.extend(drain(&fast));
    }
    // The slow stream's queue filled up: its watcher was moved aside, the
    // other stream kept receiving live events, and apply never waited.
    assert_eq!(slow.unsynced_ids(), vec![0]);
    assert_eq!(events(&fast_got).len() as i64, writes);
    assert!(slow.queued() <= STREAM_QUEUE_CAPACITY + 1);
    // The syncer cannot serve it until the consumer drains.
    assert!(!t.store.sync_watchers());
    let mut slow_got = drain(&slow);
    sync_until_idle(&t.store);
    slow_got.extend(drain(&slow));
    assert!(slow.unsynced_ids().is_empty());
    put(&t.store, "k", "live");
    slow_got.extend(drain(&slow));
    let revisions: Vec<i64> = events(&slow_got).iter().map(|e| e.2).collect();
    let expected: Vec<i64> = (2..=writes + 2).collect();
    assert_eq!(revisions, expected);
}

#[test]
fn watcher_below_compacted_revision_is_canceled_with_compact_revision() {
    let t = open();
    for i in 0..5 {
        put(&t.store, "k", &i.to_string()); // 2..=6
    }
    t.store.compact(4, 0).unwrap();
    let s = stream(&t.store);
    let below = s
        .watch(WatchOptions {
            id: 5,
            ..key_watch("k", 3)
        })
        .unwrap();
    let at = s.watch(key_watch("k", 4)).unwrap();
    sync_until_idle(&t.store);
    let got = drain(&s);
    let canceled: Vec<&WatchResponse> = got.iter().filter(|r| r.watch_id == below).collect();
    assert_eq!(canceled.len(), 2);
    assert!(canceled[1].canceled && canceled[1].compact_revision == 4);
    assert!(canceled[1].events.is_empty());
    let kept: Vec<WatchResponse> = got.iter().filter(|r| r.watch_id == at).cloned().collect();
    assert_eq!(
        events(&kept).iter().map(|e| e.2).collect::<Vec<_>>(),
        vec![4, 5, 6]
    );
    // A compacted watcher's ID stays until the client cancels it, as etcd.
    assert_eq!(
        s.watch(WatchOptions {
            id: below,
            ..key_watch("k", 0)
        }),
        Err(WatchError::DuplicateId)
    );
    s.cancel(below).unwrap();
    assert!(drain(&s)[0].canceled);
}

#[test]
fn compaction_while_catching_up_cancels_the_watcher_it_overtakes() {
    let t = open();
    for i in 0..10 {
        put(&t.store, "k", &i.to_string()); // 2..=11
    }
    let s = stream(&t.store);
    let id = s.watch(key_watch("k", 2)).unwrap();
    // Compacted before the first round reads anything.
    t.store.compact(8, 0).unwrap();
    t.store.commit(false).unwrap();
    sync_until_idle(&t.store);
    let got = drain(&s);
    assert_eq!(got.len(), 2);
    assert!(got[1].canceled && got[1].compact_revision == 8 && got[1].watch_id == id);
    // Synced watchers never see compaction.
    let live = s.watch(key_watch("k", 0)).unwrap();
    t.store.compact(11, 0).unwrap();
    put(&t.store, "k", "after");
    let got = drain(&s);
    assert_eq!(got.last().unwrap().watch_id, live);
    assert_eq!(events(&got), vec![(EventType::Put, "k".into(), 12)]);
}

#[test]
fn request_progress_answers_once_every_watcher_is_synced() {
    let t = open();
    put(&t.store, "k", "1"); // 2
    put(&t.store, "k", "2"); // 3
    let s = stream(&t.store);
    // No watcher: no answer (etcd 3.5.13).
    s.request_progress_all();
    assert!(drain(&s).is_empty());
    s.watch(key_watch("other", 0)).unwrap();
    s.watch(key_watch("k", 2)).unwrap();
    drain(&s);
    s.request_progress_all();
    s.request_progress_all(); // folded into the pending one
    assert!(drain(&s).is_empty());
    sync_until_idle(&t.store);
    let got = drain(&s);
    assert_eq!(events(&got).len(), 2);
    let last = got.last().unwrap();
    assert_eq!(
        (last.watch_id, last.revision, last.events.len()),
        (INVALID_WATCH_ID, 3, 0)
    );
    // All synced: answered at once.
    put(&t.store, "x", "1");
    s.request_progress_all();
    let got = drain(&s);
    assert_eq!((got[0].watch_id, got[0].revision), (INVALID_WATCH_ID, 4));
}

#[test]
fn progress_tick_skips_watchers_that_just_sent_events() {
    let t = open();
    let s = stream(&t.store);
    let quiet = s
        .watch(WatchOptions {
            progress_notify: true,
            ..key_watch("quiet", 0)
        })
        .unwrap();
    let busy = s
        .watch(WatchOptions {
            progress_notify: true,
            ..key_watch("busy", 0)
        })
        .unwrap();
    s.watch(key_watch("plain", 0)).unwrap();
    drain(&s);
    put(&t.store, "busy", "1"); // 2
    drain(&s);
    s.progress_tick();
    let got = drain(&s);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].watch_id, got[0].revision), (quiet, 2));
    s.progress_tick();
    let mut ids: Vec<i64> = drain(&s).iter().map(|r| r.watch_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![quiet, busy]);
}

#[test]
fn watch_ids_errors_and_cancel_follow_etcd() {
    let t = open();
    let s = stream(&t.store);
    assert_eq!(
        s.watch(WatchOptions {
            key: b("b"),
            range_end: b("a"),
            ..Default::default()
        }),
        Err(WatchError::EmptyRange)
    );
    assert_eq!(
        WatchError::EmptyRange.to_string(),
        "mvcc: watcher range is empty"
    );
    assert_eq!(
        s.watch(WatchOptions {
            id: 1,
            ..key_watch("k", 0)
        }),
        Ok(1)
    );
    assert_eq!(
        s.watch(WatchOptions {
            id: 1,
            ..key_watch("k", 0)
        }),
        Err(WatchError::DuplicateId)
    );
    // Auto IDs skip the ones taken.
    assert_eq!(s.watch(key_watch("k", 0)), Ok(0));
    assert_eq!(s.watch(key_watch("k", 0)), Ok(2));
    assert_eq!(s.cancel(7), Err(WatchError::NotExist));
    drain(&s);
    s.cancel(1).unwrap();
    put(&t.store, "k", "v");
    let got = drain(&s);
    assert!(got[0].canceled && got[0].watch_id == 1);
    assert!(got[1..].iter().all(|r| r.watch_id != 1));
    assert_eq!(t.store.watcher_count(), 2);
    drop(s);
    assert_eq!(t.store.watcher_count(), 0);
}

#[test]
fn watch_with_future_start_revision_skips_earlier_events() {
    let t = open();
    let s = stream(&t.store);
    s.watch(key_watch("k", 4)).unwrap();
    put(&t.store, "k", "2");
    put(&t.store, "k", "3");
    put(&t.store, "k", "4");
    let got = drain(&s);
    assert_eq!(events(&got), vec![(EventType::Put, "k".into(), 4)]);
}

#[test]
fn catch_up_reads_history_in_bounded_chunks() {
    let t = open();
    let total = crate::watch_sync::MAX_SYNC_REVISIONS as i64 + 200;
    for i in 0..total {
        put(&t.store, &format!("k{}", i % 7), "v");
    }
    t.store.commit(false).unwrap();
    let s = stream(&t.store);
    s.watch(prefix_watch("k", 1)).unwrap();
    assert!(t.store.sync_watchers(), "a second chunk is due");
    let first = drain(&s);
    assert_eq!(events(&first).len(), crate::watch_sync::MAX_SYNC_REVISIONS);
    sync_until_idle(&t.store);
    let mut all = first;
    all.extend(drain(&s));
    let revisions: Vec<i64> = events(&all).iter().map(|e| e.2).collect();
    assert_eq!(revisions, (2..total + 2).collect::<Vec<_>>());
}

#[test]
fn background_syncer_catches_up_without_being_driven() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
    put(&store, "k", "1");
    let s = stream(&store);
    s.watch(key_watch("k", 1)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut got = Vec::new();
    while events(&got).is_empty() {
        assert!(std::time::Instant::now() < deadline, "syncer never ran");
        got.extend(drain(&s));
        std::thread::yield_now();
    }
    assert_eq!(events(&got), vec![(EventType::Put, "k".into(), 2)]);
}

/// A leader's backup for `restore_from`: "k" put at 2..=6 (as the
/// follower's own history), then `extra_puts` alternating between "k" and
/// "other", then an optional compaction.
fn leader_backup(
    dir: &std::path::Path,
    extra_puts: usize,
    compact_at: Option<i64>,
) -> std::path::PathBuf {
    let leader = Store::open(&dir.join("leader.db")).unwrap();
    for i in 0..5 {
        put(&leader, "k", &i.to_string()); // 2..=6, as the follower
    }
    for i in 0..extra_puts {
        put(
            &leader,
            if i % 2 == 0 { "k" } else { "other" },
            &format!("x{i}"),
        );
    }
    if let Some(rev) = compact_at {
        leader.compact(rev, 0).unwrap();
    }
    let path = dir.join("snap.db");
    leader.backup_to(&path).unwrap();
    path
}

#[test]
fn watch_never_skips_a_revision_when_its_store_installs_a_snapshot() {
    let t = open();
    let dir = tempfile::tempdir().unwrap();
    let snapshot = leader_backup(dir.path(), 40, None); // the leader reaches 46
    for i in 0..5 {
        put(&t.store, "k", &i.to_string());
    }
    let s = stream(&t.store);
    let all = s.watch(key_watch("k", 1)).unwrap();
    let live = s.watch(key_watch("k", 0)).unwrap();
    let future = s.watch(key_watch("k", 100)).unwrap();
    sync_until_idle(&t.store);
    let before = drain(&s);
    assert_eq!(
        events(&before).len(),
        5,
        "history 2..=6 delivered: {before:?}"
    );
    assert!(s.unsynced_ids().is_empty());

    t.store.restore_from(&snapshot).unwrap();
    assert_eq!(t.store.current_revision(), 46);
    // Watchers that had seen up to 6 need 7..=46 from the restored file.
    assert_eq!(s.unsynced_ids(), vec![all, live]);
    sync_until_idle(&t.store);
    put(&t.store, "k", "after"); // 47: live again
    let got = drain(&s);
    let want: Vec<(EventType, String, i64)> = (7..=47)
        .filter(|rev| rev % 2 == 1) // "k" at odd revisions from 7, then 47
        .map(|rev| (EventType::Put, "k".to_string(), rev))
        .collect();
    for id in [all, live] {
        let mine: Vec<WatchResponse> = got.iter().filter(|r| r.watch_id == id).cloned().collect();
        assert_eq!(
            events(&mine),
            want,
            "watcher {id}: every revision once, in order"
        );
        assert!(mine.iter().all(|r| !r.canceled && r.compact_revision == 0));
    }
    assert!(
        got.iter().all(|r| r.watch_id != future),
        "a future start revision is not reached"
    );
    put(&t.store, "k", "more"); // 48 .. up to 100 stays silent for `future`
    assert!(drain(&s).iter().all(|r| r.watch_id != future));
}

#[test]
fn watch_behind_a_restored_snapshots_compaction_is_canceled_not_skipped() {
    let t = open();
    let dir = tempfile::tempdir().unwrap();
    let snapshot = leader_backup(dir.path(), 40, Some(30));
    for i in 0..5 {
        put(&t.store, "k", &i.to_string());
    }
    let s = stream(&t.store);
    let id = s.watch(key_watch("k", 0)).unwrap();
    drain(&s);
    t.store.restore_from(&snapshot).unwrap();
    sync_until_idle(&t.store);
    let got = drain(&s);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].canceled && got[0].watch_id == id && got[0].compact_revision == 30);
    assert!(got[0].events.is_empty());
}
