//! Scale check (ignored by default; run with
//! `cargo test -p mvcc --release --test scale -- --ignored --nocapture`):
//! 1M keys must reopen in about a second with a small index.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use api::etcdserverpb::PutRequest;
use bytes::Bytes;
use mvcc::Store;

/// Counts live heap bytes, to measure the key index.
struct CountingAlloc;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

#[test]
#[ignore]
fn one_million_keys_reopen_quickly() {
    const KEYS: usize = 1_000_000;
    const PER_TXN: usize = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let store = Store::open(&path).unwrap();
        let started = Instant::now();
        let value = Bytes::from(vec![b'v'; 64]);
        for batch in 0..KEYS / PER_TXN {
            let mut txn = store.write(batch as u64 + 1);
            for i in 0..PER_TXN {
                let key = format!("/registry/pods/default/pod-{:08}", batch * PER_TXN + i);
                txn.put(&PutRequest {
                    key: Bytes::from(key),
                    value: value.clone(),
                    ..Default::default()
                })
                .unwrap();
            }
            txn.end();
            if batch % 10 == 9 {
                store.commit(false).unwrap();
            }
        }
        store.commit(true).unwrap();
        eprintln!("wrote {KEYS} keys in {:?}", started.elapsed());
    }
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let started = Instant::now();
    let store = Store::open(&path).unwrap();
    let took = started.elapsed();
    let grown = LIVE_BYTES.load(Ordering::Relaxed).saturating_sub(before);
    eprintln!(
        "reopened {} keys in {took:?}, heap +{} MiB ({} B/key incl. redb cache), file {} MiB",
        store.index_len(),
        grown >> 20,
        grown / KEYS,
        store.db_size() >> 20
    );
    assert_eq!(store.index_len(), KEYS);
    assert_eq!(store.current_revision(), (KEYS / PER_TXN) as i64 + 1);
}

/// The compaction of half the revisions of a store of large values
/// (`OXCD_SCALE_MIB` MiB of values, default 512, `OXCD_SCALE_VALUE` B each,
/// default 8,192, every key written twice), timed until its deletions are
/// done.
#[test]
#[ignore]
fn compaction_of_half_the_revisions_of_large_values() {
    let value_size = env_or("OXCD_SCALE_VALUE", 8192);
    let mib = env_or("OXCD_SCALE_MIB", 512);
    let keys = mib * 1024 * 1024 / value_size / 2;
    let dir = scale_dir();
    let store = std::sync::Arc::new(Store::open(&dir.path().join("db")).unwrap());
    let started = Instant::now();
    let index = fill(&store, keys, value_size, 2);
    eprintln!(
        "wrote {} keys twice in {:?}, {} MB",
        keys,
        started.elapsed(),
        store.db_size() / 1_000_000
    );
    store
        .start_compactor(mvcc::CompactionBatches::default())
        .unwrap();
    let revision = store.current_revision();
    let started = Instant::now();
    store.compact(revision, index + 1).unwrap();
    let scheduled = started.elapsed();
    while store.finished_compact_revision() < revision {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    eprintln!(
        "compacted {} revisions: scheduled in {scheduled:?}, done in {:?}",
        keys,
        started.elapsed()
    );
}

/// A defragmentation after the compaction of half the revisions of large
/// values (`OXCD_SCALE_MIB` MiB of values, default 512, 8,192 B each,
/// every key written twice).
#[test]
#[ignore]
fn defrag_of_large_values() {
    let mib = env_or("OXCD_SCALE_MIB", 512);
    let keys = mib * 1024 * 1024 / 8192 / 2;
    let dir = scale_dir();
    let store = std::sync::Arc::new(Store::open(&dir.path().join("db")).unwrap());
    let index = fill(&store, keys, 8192, 2);
    store
        .start_compactor(mvcc::CompactionBatches::default())
        .unwrap();
    let revision = store.current_revision();
    store.compact(revision, index + 1).unwrap();
    while store.finished_compact_revision() < revision {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    store.commit(true).unwrap();
    let started = Instant::now();
    let cpu = cpu_time();
    let stats = store.defragment().unwrap();
    eprintln!(
        "defragmented {} MB to {} MB in {:?}: copy {:?}, swap {:?}, CPU {:?}",
        stats.size_before / 1_000_000,
        stats.size_after / 1_000_000,
        started.elapsed(),
        stats.copy_time,
        stats.swap_time,
        cpu_time() - cpu
    );
    let in_use = store.db_size_in_use();
    eprintln!(
        "in use after it: {in_use} B, {} B counted by redb",
        store.measure_size_in_use().unwrap()
    );
}

/// The close of a member's store of large values (`OXCD_SCALE_MIB` MiB of
/// values, default 512, `OXCD_SCALE_VALUE` B each, default 8,192, every key
/// written twice, as `bench/large-db.sh` stops it): its last commit and key
/// index checkpoint, then the file's close, timed apart.
#[test]
#[ignore]
fn close_of_large_values() {
    let value_size = env_or("OXCD_SCALE_VALUE", 8192);
    let mib = env_or("OXCD_SCALE_MIB", 512);
    let keys = mib * 1024 * 1024 / value_size / 2;
    let dir = scale_dir();
    let store = Store::open(&dir.path().join("db")).unwrap();
    fill(&store, keys, value_size, 2);
    let started = Instant::now();
    let cpu = cpu_time();
    store.close(&[]).unwrap();
    let closed = started.elapsed();
    drop(store);
    eprintln!(
        "closed {keys} keys: checkpoint in {closed:?}, file closed in {:?}, CPU {:?}",
        started.elapsed() - closed,
        cpu_time() - cpu
    );
}

/// A raft snapshot's record stream of a store of large values
/// (`OXCD_SCALE_MIB` MiB, default 512, 8,192 B each): the leader's side
/// (reading and framing) and the follower's (building the file), timed
/// apart.
#[test]
#[ignore]
fn record_stream_of_large_values() {
    const VALUE: usize = 8192;
    let mib = env_or("OXCD_SCALE_MIB", 512);
    let keys = mib * 1024 * 1024 / VALUE;
    let dir = scale_dir();
    let store = Store::open(&dir.path().join("db")).unwrap();
    fill(&store, keys, VALUE, 1);
    let started = Instant::now();
    let mut pieces = Vec::new();
    store
        .write_records(&mut |piece| {
            pieces.push(piece.to_vec());
            true
        })
        .unwrap();
    let bytes: usize = pieces.iter().map(Vec::len).sum();
    eprintln!(
        "leader: {} MB of records in {:?}",
        bytes / 1_000_000,
        started.elapsed()
    );
    let started = Instant::now();
    let cpu = cpu_time();
    let mut builder =
        mvcc::record_stream::RecordsBuilder::create(&dir.path().join("built.db")).unwrap();
    for piece in &pieces {
        builder.feed(piece).unwrap();
    }
    let fed = started.elapsed();
    builder.finish().unwrap();
    eprintln!(
        "follower: fed in {fed:?}, committed in {:?}, CPU {:?}",
        started.elapsed(),
        cpu_time() - cpu
    );
}

/// The process's CPU time so far (user and system, every thread).
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let of = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    of(usage.ru_utime) + of(usage.ru_stime)
}

/// A directory for a scale test's files (`OXCD_SCALE_DIR`, default /tmp).
fn scale_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("oxcd-scale")
        .tempdir_in(std::env::var("OXCD_SCALE_DIR").unwrap_or_else(|_| "/tmp".into()))
        .unwrap()
}

/// Writes `keys` keys of `value_size` bytes `passes` times, 100 puts an
/// entry, a durable commit every 10; the index of the last entry.
fn fill(store: &Store, keys: usize, value_size: usize, passes: usize) -> u64 {
    const PER_TXN: usize = 100;
    let value = Bytes::from(vec![b'v'; value_size]);
    let mut index = 0u64;
    for _pass in 0..passes {
        for batch in 0..keys / PER_TXN {
            index += 1;
            let mut txn = store.write(index);
            for i in 0..PER_TXN {
                txn.put(&PutRequest {
                    key: Bytes::from(format!("/registry/k/{:010}", batch * PER_TXN + i)),
                    value: value.clone(),
                    ..Default::default()
                })
                .unwrap();
            }
            txn.end();
            store.commit(index.is_multiple_of(10)).unwrap();
        }
    }
    store.commit(true).unwrap();
    index
}

/// A size from the environment, or `default`.
fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
