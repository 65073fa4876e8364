//! What every crate's fuzz harness (`tests/fuzz.rs`, or `src/fuzz_tests.rs`
//! where the decoder is private) shares, kept once here and included with
//! `#[path = ".../api/tests/fuzz_support/mod.rs"] mod fuzz_support;`
//! (testkit is not a dependency of the storage crates):
//!
//! * [`Fuzz`]: the seed and the number of runs, from `FUZZ_SEED` and
//!   `FUZZ_RUNS` when set, and on a failure the line that replays it;
//! * [`Meter`]: a global allocator that counts the bytes live on the calling
//!   thread, so that a harness can hold a decoder to "allocates in
//!   proportion to its input, never to a length it reads" ([`peak_bytes`]);
//! * [`mutate`]: the damage done to valid inputs (bit flips, bytes set to
//!   0/0xff, truncation, splices, length-looking fields made huge);
//! * [`protobuf_fields`]: random protobuf wire-format fields, for the
//!   decoders of etcd's messages.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The seed and runs of one harness; prints how to replay it if the test
/// fails (panics) while it is alive.
pub struct Fuzz {
    pub name: &'static str,
    pub seed: u64,
    pub runs: usize,
    iteration: Cell<usize>,
}

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let text = std::env::var(name).ok()?;
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?.to_string().parse().ok(),
        None => text.parse().ok(),
    }
}

impl Fuzz {
    /// `default_runs` unless `FUZZ_RUNS` says otherwise; the seed is
    /// `FUZZ_SEED` or a fixed one derived from `name` (so that CI runs the
    /// same cases every time and each harness its own).
    pub fn new(name: &'static str, default_runs: usize) -> Fuzz {
        let seed = env_number("FUZZ_SEED").unwrap_or_else(|| {
            // FNV-1a of the name: stable across runs and toolchains
            name.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
            })
        });
        let runs = env_number("FUZZ_RUNS").unwrap_or(default_runs);
        CURRENT_SEED.store(seed, Ordering::Relaxed);
        Fuzz {
            name,
            seed,
            runs,
            iteration: Cell::new(0),
        }
    }

    pub fn rng(&self) -> fastrand::Rng {
        fastrand::Rng::with_seed(self.seed)
    }

    /// The runs, each noted so that a failure names it.
    pub fn iterations(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.runs).inspect(|i| {
            self.iteration.set(*i);
            CURRENT_ITERATION.store(*i as u64, Ordering::Relaxed);
        })
    }
}

impl Drop for Fuzz {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "fuzz {}: failed at iteration {}; replay with FUZZ_SEED={} FUZZ_RUNS={}",
                self.name,
                self.iteration.get(),
                self.seed,
                self.iteration.get() + 1
            );
        }
    }
}

static CURRENT_SEED: AtomicU64 = AtomicU64::new(0);
static CURRENT_ITERATION: AtomicU64 = AtomicU64::new(0);

/// A single allocation this large while metered is a decoder trusting a
/// length: refused (the process aborts, naming the seed) rather than
/// attempted.
pub const REFUSE_ALLOCATIONS_ABOVE: usize = 1 << 30;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The largest single allocation seen while metered, on any thread.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// Counts, per thread and only while [`peak_bytes`] runs, the bytes
/// allocated and freed; otherwise the system allocator as is.
pub struct Meter;

fn note(delta: isize, size: usize) -> bool {
    ARMED
        .try_with(|armed| {
            if !armed.get() {
                return true;
            }
            LARGEST.fetch_max(size, Ordering::Relaxed);
            if size > REFUSE_ALLOCATIONS_ABOVE {
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "fuzz meter: refused an allocation of {size} bytes (FUZZ_SEED={} iteration {})",
                    CURRENT_SEED.load(Ordering::Relaxed),
                    CURRENT_ITERATION.load(Ordering::Relaxed)
                );
                return false;
            }
            let live = LIVE.get() + delta;
            LIVE.set(live);
            PEAK.set(PEAK.get().max(live));
            true
        })
        .unwrap_or(true)
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// bookkeeping touches only const-initialised thread-locals (no allocation,
// no destructor) and never unwinds.
unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size() as isize, layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size() as isize, layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize), 0);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note(new_size as isize - layout.size() as isize, new_size) {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns its result with the most bytes it held allocated
/// at once on this thread (what it allocated and had not freed yet).
/// Needs `#[global_allocator] static METER: Meter = Meter;` in the binary.
pub fn peak_bytes<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LIVE.set(0);
    PEAK.set(0);
    ARMED.set(true);
    let result = f();
    ARMED.set(false);
    (result, PEAK.get().max(0) as usize)
}

/// Holds `f` to allocating at most `per_input_byte` bytes per byte of
/// `input_len` plus `slack`, and returns its result.
#[track_caller]
pub fn bounded<R>(
    what: &str,
    input_len: usize,
    per_input_byte: usize,
    slack: usize,
    f: impl FnOnce() -> R,
) -> R {
    let (result, peak) = peak_bytes(f);
    let limit = input_len * per_input_byte + slack;
    assert!(
        peak <= limit,
        "{what}: {peak} bytes allocated for {input_len} bytes of input (limit {limit})"
    );
    result
}

/// Runs `f` on a thread with `stack_bytes` of stack (as the server's
/// request, raft and apply threads have) and returns what it returned;
/// a panic in it is a panic here.
pub fn on_stack<R: Send + 'static>(
    stack_bytes: usize,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let thread = std::thread::Builder::new()
        .stack_size(stack_bytes)
        .spawn(f)
        .expect("spawn a fuzz thread");
    match thread.join() {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

pub fn random_bytes(rng: &mut fastrand::Rng, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes);
    bytes
}

/// Random bytes, as many as `lens` picks.
pub fn some_bytes(rng: &mut fastrand::Rng, lens: std::ops::Range<usize>) -> Vec<u8> {
    let len = rng.usize(lens);
    random_bytes(rng, len)
}

/// A u32 or u64 that looks like an attacker's length: at or near a power
/// of two, the type's maximum, or just past what is there.
pub fn huge(rng: &mut fastrand::Rng) -> u64 {
    match rng.u8(..6) {
        0 => u64::MAX,
        1 => u64::from(u32::MAX),
        2 => 1 << 40, // 1 TiB
        3 => (1u64 << rng.u32(16..64)).wrapping_sub(rng.u64(..2)),
        4 => u64::from(i32::MAX as u32) + rng.u64(..3),
        _ => rng.u64(..),
    }
}

/// Damages `bytes` in one of several ways, one to a few times.
pub fn mutate(rng: &mut fastrand::Rng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.usize(1..4) {
        if bytes.is_empty() {
            bytes.extend(some_bytes(rng, 1..16));
            continue;
        }
        let at = rng.usize(..bytes.len());
        match rng.u8(..10) {
            0 => bytes[at] ^= 1 << rng.u8(..8),
            1 => bytes[at] = 0,
            2 => bytes[at] = 0xff,
            3 => bytes[at] = rng.u8(..),
            4 => bytes.truncate(at),
            5 => {
                let len = rng.usize(..bytes.len() - at + 1);
                bytes.drain(at..at + len);
            }
            6 => {
                let insert = some_bytes(rng, 1..9);
                bytes.splice(at..at, insert);
            }
            7 => {
                // a little-endian length field made huge
                let width = [2usize, 4, 8][rng.usize(..3)];
                let value = huge(rng).to_le_bytes();
                let end = (at + width).min(bytes.len());
                bytes[at..end].copy_from_slice(&value[..end - at]);
            }
            8 => {
                // a protobuf varint (a length, a tag) made huge
                let mut value = huge(rng);
                let mut varint = Vec::new();
                while value >= 0x80 {
                    varint.push(value as u8 | 0x80);
                    value >>= 7;
                }
                varint.push(value as u8);
                let end = (at + 1).min(bytes.len());
                bytes.splice(at..end, varint);
            }
            _ => {
                // a run of the file repeated (a record or page twice)
                let len = rng.usize(1..=(bytes.len() - at).min(64));
                let copy = bytes[at..at + len].to_vec();
                let to = rng.usize(..=bytes.len());
                bytes.splice(to..to, copy);
            }
        }
    }
}

// ---- protobuf-shaped bytes ----

pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire_type));
}

/// Field numbers worth hitting in etcd's messages: the small ones every
/// message uses, and InternalRaftRequest's (header 100, auth 1000+,
/// members 1301).
const FIELD_NUMBERS: &[u32] = &[
    100, 1000, 1011, 1012, 1013, 1100, 1101, 1102, 1103, 1104, 1105, 1106, 1107, 1200, 1201, 1202,
    1203, 1204, 1301,
];

pub fn field_number(rng: &mut fastrand::Rng) -> u32 {
    match rng.u8(..16) {
        0 => FIELD_NUMBERS[rng.usize(..FIELD_NUMBERS.len())],
        1 => rng.u32(1..1 << 29),
        _ => rng.u32(1..14),
    }
}

fn varint_value(rng: &mut fastrand::Rng) -> u64 {
    match rng.u8(..6) {
        0 => 0,
        1 => 1,
        2 => rng.u64(..300),
        3 => (-(rng.i64(1..1000))) as u64, // a negative int64: ten bytes
        4 => huge(rng),
        _ => rng.u64(..u64::from(u32::MAX)),
    }
}

/// Random protobuf fields, well-formed at every level (so that decoders
/// get past the wire format to the fields), nested `depth` deep at most.
pub fn protobuf_fields(rng: &mut fastrand::Rng, depth: usize, out: &mut Vec<u8>) {
    for _ in 0..rng.usize(0..7) {
        let field = field_number(rng);
        match rng.u8(..10) {
            0..=2 => {
                put_key(out, field, 0);
                put_varint(out, varint_value(rng));
            }
            3 => {
                put_key(out, field, 1);
                out.extend(random_bytes(rng, 8));
            }
            4 => {
                put_key(out, field, 5);
                out.extend(random_bytes(rng, 4));
            }
            5..=7 if depth > 0 => {
                let mut nested = Vec::new();
                protobuf_fields(rng, depth - 1, &mut nested);
                put_key(out, field, 2);
                put_varint(out, nested.len() as u64);
                out.extend(nested);
            }
            8 if rng.u8(..8) == 0 => {
                // a group, or a wire type that does not exist
                put_key(out, field, rng.u8(3..8));
                if rng.bool() {
                    put_key(out, field, 4);
                }
            }
            _ => {
                let data = some_bytes(rng, 0..24);
                put_key(out, field, 2);
                put_varint(out, data.len() as u64);
                out.extend(data);
            }
        }
    }
}
