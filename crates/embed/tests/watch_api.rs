//! The Watch API through a real client (the `etcd-client` crate), against an
//! in-process member on loopback: etcd 3.5's watch semantics.

mod common;
use common::endpoint;
use common::member;

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchFilterType, WatchOptions,
    WatchResponse, WatchStream,
};

const DEADLINE: Duration = Duration::from_secs(20);

async fn next(stream: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("a watch response in time")
        .expect("stream ok")
        .expect("stream open")
}

/// (type, key, value, mod_revision) of each event.
fn events(resp: &WatchResponse) -> Vec<(EventType, String, String, i64)> {
    resp.events()
        .iter()
        .map(|e| {
            let kv = e.kv().unwrap();
            (
                e.event_type(),
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
                kv.mod_revision(),
            )
        })
        .collect()
}

/// Reads responses until `n` events arrived (skipping empty responses).
async fn collect_events(
    stream: &mut WatchStream,
    n: usize,
) -> Vec<(EventType, String, String, i64)> {
    let mut got = Vec::new();
    while got.len() < n {
        got.extend(events(&next(stream).await));
    }
    got
}

#[tokio::test]
async fn watch_from_past_revision_replays_history_then_streams_live_events() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    c.put("k/a", "1", None).await.unwrap(); // 2
    c.put("k/b", "2", None).await.unwrap(); // 3
    c.put("other", "x", None).await.unwrap(); // 4
    c.delete("k/a", None).await.unwrap(); // 5

    let mut w = c
        .watch(
            "k/",
            Some(WatchOptions::new().with_prefix().with_start_revision(3)),
        )
        .await
        .unwrap();
    let created = next(&mut w).await;
    assert!(created.created());
    assert_eq!(created.header().unwrap().revision(), 5);
    assert!(created.header().unwrap().cluster_id() != 0);
    let replayed = collect_events(&mut w, 2).await;
    assert_eq!(
        replayed,
        vec![
            (EventType::Put, "k/b".into(), "2".into(), 3),
            (EventType::Delete, "k/a".into(), "".into(), 5),
        ]
    );
    c.put("k/c", "3", None).await.unwrap(); // 6
    let live = next(&mut w).await;
    assert_eq!(live.header().unwrap().revision(), 6);
    assert_eq!(
        events(&live),
        vec![(EventType::Put, "k/c".into(), "3".into(), 6)]
    );
    let kv = live.events()[0].kv().unwrap();
    assert_eq!((kv.create_revision(), kv.version()), (6, 1));
    m.stop().await;
}

#[tokio::test]
async fn txn_events_arrive_in_one_response_in_operation_order() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    c.put("t/x", "old", None).await.unwrap(); // 2
    let mut w = c
        .watch("t/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(next(&mut w).await.created());
    let txn = Txn::new()
        .when([Compare::value("t/x", CompareOp::Equal, "old")])
        .and_then([
            TxnOp::put("t/z", "1", None),
            TxnOp::delete("t/x", None),
            TxnOp::put("t/a", "2", None),
        ]);
    c.txn(txn).await.unwrap(); // 3
    let resp = next(&mut w).await;
    assert_eq!(
        events(&resp),
        vec![
            (EventType::Put, "t/z".into(), "1".into(), 3),
            (EventType::Delete, "t/x".into(), "".into(), 3),
            (EventType::Put, "t/a".into(), "2".into(), 3),
        ]
    );
    m.stop().await;
}

#[tokio::test]
async fn delete_event_carries_tombstone_and_prev_kv_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    c.put("d", "v1", None).await.unwrap(); // 2
    let mut live = c
        .watch("d", Some(WatchOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert!(next(&mut live).await.created());
    let mut plain = c.watch("d", None).await.unwrap();
    assert!(next(&mut plain).await.created());
    let mut no_put = c
        .watch(
            "d",
            Some(WatchOptions::new().with_filters([WatchFilterType::NoPut])),
        )
        .await
        .unwrap();
    assert!(next(&mut no_put).await.created());
    c.put("d", "v2", None).await.unwrap(); // 3
    c.delete("d", None).await.unwrap(); // 4

    let put = next(&mut live).await;
    assert_eq!(put.events()[0].prev_kv().unwrap().value(), b"v1");
    let del = next(&mut live).await;
    let ev = &del.events()[0];
    assert_eq!(ev.event_type(), EventType::Delete);
    let kv = ev.kv().unwrap();
    assert_eq!(
        (
            kv.key(),
            kv.mod_revision(),
            kv.create_revision(),
            kv.version()
        ),
        (&b"d"[..], 4, 0, 0)
    );
    assert_eq!(ev.prev_kv().unwrap().value(), b"v2");
    assert!(next(&mut plain).await.events()[0].prev_kv().is_none());
    let only_delete = next(&mut no_put).await;
    assert_eq!(
        events(&only_delete),
        vec![(EventType::Delete, "d".into(), "".into(), 4)]
    );

    // Replayed from the backend, prev_kv is looked up too.
    let mut past = c
        .watch(
            "d",
            Some(WatchOptions::new().with_prev_key().with_start_revision(3)),
        )
        .await
        .unwrap();
    assert!(next(&mut past).await.created());
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(next(&mut past).await.events().to_vec());
    }
    assert_eq!(got[0].prev_kv().unwrap().value(), b"v1");
    assert_eq!(got[1].prev_kv().unwrap().value(), b"v2");
    m.stop().await;
}

#[tokio::test]
async fn compacted_start_revision_is_canceled_with_compact_revision() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    for i in 0..5 {
        c.put("c", i.to_string(), None).await.unwrap(); // 2..=6
    }
    c.compact(4, None).await.unwrap();

    let mut w = c
        .watch("c", Some(WatchOptions::new().with_start_revision(3)))
        .await
        .unwrap();
    assert!(next(&mut w).await.created());
    let canceled = next(&mut w).await;
    assert!(canceled.canceled());
    assert_eq!(canceled.compact_revision(), 4);
    assert!(canceled.events().is_empty());

    // The compacted revision itself is still watchable.
    let mut at = c
        .watch("c", Some(WatchOptions::new().with_start_revision(4)))
        .await
        .unwrap();
    assert!(next(&mut at).await.created());
    let got = collect_events(&mut at, 3).await;
    assert_eq!(got.iter().map(|e| e.3).collect::<Vec<_>>(), vec![4, 5, 6]);
    m.stop().await;
}

#[tokio::test]
async fn progress_request_answers_with_the_current_revision() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    c.put("p", "1", None).await.unwrap(); // 2
    c.put("elsewhere", "1", None).await.unwrap(); // 3
    let mut w = c.watch("p", None).await.unwrap();
    assert!(next(&mut w).await.created());
    c.put("elsewhere", "2", None).await.unwrap(); // 4
    w.request_progress().await.unwrap();
    let progress = next(&mut w).await;
    assert_eq!(progress.watch_id(), -1);
    assert!(progress.events().is_empty() && !progress.created() && !progress.canceled());
    assert_eq!(progress.header().unwrap().revision(), 4);
    m.stop().await;
}

#[tokio::test]
async fn progress_notify_reports_idle_watchers_at_the_configured_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |cfg| {
        cfg.watch_progress_notify_interval = Duration::from_millis(200);
    })
    .await;
    let mut w = c
        .watch("idle", Some(WatchOptions::new().with_progress_notify()))
        .await
        .unwrap();
    let created = next(&mut w).await;
    c.put("other", "x", None).await.unwrap();
    let notify = next(&mut w).await;
    assert_eq!(notify.watch_id(), created.watch_id());
    assert!(notify.events().is_empty());
    assert!(notify.header().unwrap().revision() >= 2);
    m.stop().await;
}

#[tokio::test]
async fn one_stream_carries_many_watchers_with_ids_and_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let mut w = c
        .watch("a", Some(WatchOptions::new().with_watch_id(7)))
        .await
        .unwrap();
    let first = next(&mut w).await;
    assert!(first.created() && first.watch_id() == 7);
    w.watch("b", None).await.unwrap();
    let second = next(&mut w).await;
    assert!(second.created() && second.watch_id() == 0);
    // A duplicate ID and an empty range are refused as etcd refuses them.
    w.watch("c", Some(WatchOptions::new().with_watch_id(7)))
        .await
        .unwrap();
    let dup = next(&mut w).await;
    assert!(dup.created() && dup.canceled() && dup.watch_id() == -1);
    assert_eq!(
        dup.cancel_reason(),
        "mvcc: duplicate watch ID provided on the WatchStream"
    );
    w.watch("z", Some(WatchOptions::new().with_range("a")))
        .await
        .unwrap();
    let empty = next(&mut w).await;
    assert!(empty.canceled() && empty.watch_id() == -1);
    assert_eq!(empty.cancel_reason(), "mvcc: watcher range is empty");

    c.put("a", "1", None).await.unwrap();
    c.put("b", "1", None).await.unwrap();
    assert_eq!(next(&mut w).await.watch_id(), 7);
    assert_eq!(next(&mut w).await.watch_id(), 0);
    w.cancel(7).await.unwrap();
    let canceled = next(&mut w).await;
    assert!(canceled.canceled() && canceled.watch_id() == 7);
    c.put("a", "2", None).await.unwrap();
    c.put("b", "2", None).await.unwrap();
    let after = next(&mut w).await;
    assert_eq!(after.watch_id(), 0, "no event after cancel");
    m.stop().await;
}

#[tokio::test]
async fn require_leader_stream_opens_while_the_member_has_a_leader() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = member(dir.path(), |_| {}).await;
    let opts = etcd_client::ConnectOptions::new().with_require_leader(true);
    let mut c = Client::connect([endpoint(&m)], Some(opts)).await.unwrap();
    let mut w = c.watch("k", None).await.unwrap();
    assert!(next(&mut w).await.created());
    c.put("k", "v", Some(PutOptions::new())).await.unwrap();
    assert_eq!(next(&mut w).await.events().len(), 1);
    m.stop().await;
}

/// A catch-up response above max-request-bytes (+ gRPC overhead) is split
/// when the watcher asked for fragments.
#[tokio::test]
async fn large_response_is_fragmented_when_asked() {
    use api::etcdserverpb::watch_client::WatchClient;
    use api::etcdserverpb::{watch_request, WatchCreateRequest, WatchRequest};

    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let value = vec![b'v'; 400 * 1024];
    for _ in 0..8 {
        c.put("big", value.clone(), None).await.unwrap(); // 2..=9
    }
    let mut raw = WatchClient::connect(endpoint(&m))
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20);
    for fragment in [true, false] {
        let request = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: "big".into(),
                    start_revision: 2,
                    fragment,
                    ..Default::default()
                },
            )),
        };
        let mut responses = raw
            .watch(tokio_stream::iter(vec![request]))
            .await
            .unwrap()
            .into_inner();
        let mut parts = Vec::new();
        let mut total = 0;
        while total < 8 {
            let resp = tokio::time::timeout(DEADLINE, responses.message())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if resp.created {
                continue;
            }
            total += resp.events.len();
            parts.push(resp.fragment);
        }
        if fragment {
            assert!(parts.len() >= 2, "split: {parts:?}");
            assert!(parts[..parts.len() - 1].iter().all(|f| *f));
            assert!(!parts.last().unwrap());
        } else {
            assert_eq!(parts, vec![false]);
        }
    }
    m.stop().await;
}
