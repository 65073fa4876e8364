//! Loads keys into a store the way compare.sh phase B does (8-byte varint
//! keys, 256-byte values, one put per raft entry), with the apply loop's
//! commit pattern, and prints the throughput and the process RSS: a quick
//! way to see what the store costs in memory without the server around it.
//!
//!   cargo run --release -p mvcc --example load_rss -- [KEYS] [COMMIT_EVERY] [DURABLE_EVERY]
//!
//! KEYS defaults to 1,000,000; a non-durable commit every COMMIT_EVERY puts
//! (default 2,000: the 100 ms batch interval at ~20k puts/s) and a durable
//! one every DURABLE_EVERY puts (default 100,000: --snapshot-count). Then the
//! store is reopened (as a restart) and the RSS printed again.

use std::time::Instant;

use api::etcdserverpb::PutRequest;
use mvcc::Store;

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn varint_key(value: i64) -> Vec<u8> {
    let mut key = vec![0u8; 8];
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    let mut i = 0;
    while zigzag >= 0x80 {
        key[i] = (zigzag as u8) | 0x80;
        zigzag >>= 7;
        i += 1;
    }
    key[i] = zigzag as u8;
    key
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let keys = args.first().copied().unwrap_or(1_000_000);
    let commit_every = args.get(1).copied().unwrap_or(2_000).max(1);
    let durable_every = args.get(2).copied().unwrap_or(100_000).max(1);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("db");
    println!("start: rss {:.1} MB", rss_mb());
    let store = Store::open(&path)?;
    let value = vec![b'x'; 256];
    let started = Instant::now();
    let mut chunk_started = Instant::now();
    for i in 0..keys {
        let index = i + 1;
        let mut txn = store.write(index);
        txn.put(&PutRequest {
            key: varint_key(i as i64).into(),
            value: value.clone().into(),
            ..Default::default()
        })?;
        txn.end();
        if index % durable_every == 0 {
            store.commit(true)?;
        } else if index % commit_every == 0 {
            store.commit(false)?;
        }
        if index % 100_000 == 0 {
            println!(
                "{index}: {:.0} puts/s in the last 100k, rss {:.1} MB, file {:.1} MB",
                100_000.0 / chunk_started.elapsed().as_secs_f64(),
                rss_mb(),
                store.db_size() as f64 / 1e6
            );
            chunk_started = Instant::now();
        }
    }
    store.commit(false)?;
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "loaded {keys} in {elapsed:.1} s: {:.0} puts/s, rss {:.1} MB, file {:.1} MB",
        keys as f64 / elapsed,
        rss_mb(),
        store.db_size() as f64 / 1e6
    );
    store.commit(true)?;
    drop(store);
    println!("closed: rss {:.1} MB", rss_mb());
    let started = Instant::now();
    let store = Store::open(&path)?;
    println!(
        "reopened in {:.2} s: rss {:.1} MB, {} keys",
        started.elapsed().as_secs_f64(),
        rss_mb(),
        store.index_len()
    );
    Ok(())
}
