//! Beyond etcd: a stored value whose bytes changed on disk is refused with
//! "etcdserver: corrupt cluster" and raises the CORRUPT alarm, instead of
//! being served (etcd 3.5 serves it: bbolt checks nothing on reads).

mod common;
use common::member;

use std::time::{Duration, Instant};

use tonic::Code;

fn status_of(e: etcd_client::Error) -> (Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_value_is_refused_and_raises_the_corrupt_alarm() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let value = "the value the disk will damage";
    let rev = c
        .put("k", value, None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    c.put("other", "fine", None).await.unwrap();
    let store = m.server.store.clone();
    store.commit(true).unwrap();
    store.overwrite_stored_bytes_for_tests(rev, &value.as_bytes()[..10], b"0123456789");

    let refused = status_of(c.get("k", None).await.unwrap_err());
    assert_eq!(
        refused,
        (Code::DataLoss, "etcdserver: corrupt cluster".into())
    );
    let fine = c.get("other", None).await.unwrap();
    assert_eq!(fine.kvs()[0].value(), b"fine");
    // The member raises CORRUPT for itself, through raft: writes stop.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alarms = c
            .alarm(
                etcd_client::AlarmAction::Get,
                etcd_client::AlarmType::None,
                None,
            )
            .await
            .unwrap();
        if alarms.alarms().iter().any(|a| {
            a.alarm() == etcd_client::AlarmType::Corrupt && a.member_id() == m.server.member.id
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no CORRUPT alarm ({} alarms)",
            alarms.alarms().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = status_of(c.put("new", "v", None).await.unwrap_err());
    assert_eq!(
        refused,
        (Code::DataLoss, "etcdserver: corrupt cluster".into())
    );
    m.stop().await;
}
