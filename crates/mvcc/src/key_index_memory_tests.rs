//! What the key index costs per key and per revision, counted by the
//! allocator: exact and repeatable, unlike a process's RSS. The figures go
//! in README's benchmark section next to etcd's published ones (~120 B per
//! key, ~30 B per revision); these tests keep them from growing unnoticed.
//!
//! `cargo test -p mvcc --lib key_index_memory -- --nocapture` prints them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use crate::key_index::KeyIndexTree;
use crate::revision::Revision;

/// The system allocator, counting the bytes live on each thread: a test
/// measures only what its own thread allocates, whatever the other tests
/// running beside it do.
struct PerThread;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // try_with: allocations during the thread's teardown are not counted
    let _ = LIVE.try_with(|live| live.set(live.get() + delta));
}

unsafe impl GlobalAlloc for PerThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: PerThread = PerThread;

fn live() -> isize {
    LIVE.with(Cell::get)
}

const KEYS: usize = 100_000;

/// What [`measure`] found, in bytes.
struct Cost {
    /// Per key of `KEYS` keys written once, in key order (a benchmark's load).
    per_key: f64,
    /// The same after [`KeyIndexTree::repack`] (the index a start rebuilds).
    per_key_packed: f64,
    /// Per revision of further puts to every key (the revisions a key keeps
    /// until a compaction).
    per_revision: f64,
}

/// Measures the index over `KEYS` keys and `more` further revisions of
/// each. The bytes are requested sizes: the allocator's rounding comes on
/// top.
fn measure(key: impl Fn(usize) -> Vec<u8>, more: usize) -> Cost {
    let keys: Vec<Vec<u8>> = (0..KEYS).map(&key).collect();
    let before = live();
    let mut tree = KeyIndexTree::default();
    let mut main = 1;
    for k in &keys {
        tree.put(k, Revision::new(main, 0));
        main += 1;
    }
    let per_key = (live() - before) as f64 / KEYS as f64;
    tree.repack();
    let per_key_packed = (live() - before) as f64 / KEYS as f64;
    let written_once = live();
    for _ in 0..more {
        for k in &keys {
            tree.put(k, Revision::new(main, 0));
            main += 1;
        }
    }
    let per_revision = (live() - written_once) as f64 / (KEYS * more) as f64;
    assert_eq!(tree.len(), KEYS);
    assert_eq!(
        tree.get(&keys[KEYS / 2], main).map(|at| at.version),
        Some(1 + more as i64)
    );
    drop(tree);
    Cost {
        per_key,
        per_key_packed,
        per_revision,
    }
}

/// Keys as a benchmark writes them (8 bytes: held inline in the map).
#[test]
fn key_index_memory_short_keys() {
    let c = measure(|i| (i as u64).to_be_bytes().to_vec(), 4);
    eprintln!(
        "key index, 8-byte keys: {:.1} B/key written in order, {:.1} B/key packed, {:.1} B/revision",
        c.per_key, c.per_key_packed, c.per_revision
    );
    assert!(c.per_key <= 115.0, "{} B per 8-byte key", c.per_key);
    assert!(
        c.per_key_packed <= 70.0,
        "{} B per packed key",
        c.per_key_packed
    );
    assert!(c.per_revision <= 45.0, "{} B per revision", c.per_revision);
}

/// Keys as Kubernetes writes them (`/registry/pods/<namespace>/<name>`,
/// 40 bytes: boxed beside the map entry).
#[test]
fn key_index_memory_kubernetes_keys() {
    let c = measure(
        |i| format!("/registry/pods/default/web-{i:08}-x7k2p").into_bytes(),
        4,
    );
    eprintln!(
        "key index, 40-byte keys: {:.1} B/key written in order, {:.1} B/key packed, {:.1} B/revision",
        c.per_key, c.per_key_packed, c.per_revision
    );
    assert!(c.per_key <= 155.0, "{} B per 40-byte key", c.per_key);
    assert!(
        c.per_key_packed <= 110.0,
        "{} B per packed key",
        c.per_key_packed
    );
    assert!(c.per_revision <= 45.0, "{} B per revision", c.per_revision);
}
