//! kill -9 under concurrent writes loses no acknowledged write and applies
//! nothing twice: after each restart every acknowledged put is there with
//! its value, and the revision equals the number of puts that took effect.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use testkit::Process;

const WRITERS: usize = 16;
const ROUNDS: usize = 3;

async fn connect(endpoint: &str) -> Client {
    Client::connect([endpoint], None).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_concurrent_writes_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let bin = testkit::oxcd_bin();
    // A small snapshot count so that snapshots and WAL release happen too.
    let args = ["--snapshot-count", "500"];
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();

    for round in 0..ROUNDS {
        let mut member = Process::start_oxcd(&bin, dir.path(), &args);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let endpoint = member.endpoint.clone();
            let acked = acked.clone();
            let stop = stop.clone();
            writers.push(tokio::spawn(async move {
                let mut client = connect(&endpoint).await;
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("r{round}/w{w}/{i:06}");
                    let value = format!("v{round}-{w}-{i}");
                    match client.put(key.clone(), value.clone(), None).await {
                        Ok(_) => acked.lock().unwrap().push((key, value)),
                        Err(_) => break, // the member died under us
                    }
                }
            }));
        }
        // Let writes flow, then kill without warning mid-stream.
        let before = acked.lock().unwrap().len();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while acked.lock().unwrap().len() < before + 1500 && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        member.kill9();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in writers {
            let _ = w.await;
        }
        assert!(
            acked.lock().unwrap().len() > before,
            "round {round}: no write was acknowledged"
        );
    }

    let member = Process::start_oxcd(&bin, dir.path(), &args);
    let mut client = connect(&member.endpoint).await;
    let resp = client
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .expect("get all");
    let stored: std::collections::HashMap<String, String> = resp
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect();
    let acked = acked.lock().unwrap();
    eprintln!(
        "{} acknowledged puts over {ROUNDS} kill -9 rounds; {} keys stored",
        acked.len(),
        stored.len()
    );
    let lost: Vec<_> = acked
        .iter()
        .filter(|(k, v)| stored.get(k) != Some(v))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    // Every stored key is a put that took effect exactly once: one revision each.
    let revision = resp.header().unwrap().revision();
    assert_eq!(
        revision as usize,
        stored.len() + 1,
        "revision {} for {} keys: something applied twice or was lost",
        revision,
        stored.len()
    );
    for kv in resp.kvs() {
        assert_eq!(
            kv.version(),
            1,
            "{} applied more than once",
            kv.key_str().unwrap()
        );
    }
}
