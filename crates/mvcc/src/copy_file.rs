//! The storage of a copy's new file (a new member's, a defrag's, a backup's,
//! a restore's): redb's file backend, with the pages redb writes gathered
//! in memory and written as runs of adjacent pages, a run per call.
//!
//! redb writes a page to its file when it leaves its write buffer: one
//! `pwrite` of the page, in the order the buffer lets them go, which is
//! striped by offset (every 131st page of the file in turn), not the order
//! they were allocated in. A copy writes every page of a new file, and at
//! 4 KiB per call the kernel's work per call and per page (the file
//! system's block reservation, the page cache's lookup and insert) took
//! most of a new member's build (perf, 2 GiB of 8 KiB values: 64% of the
//! feed in `pwrite`). Here up to [`COMBINE_BYTES`] of pages wait, each in
//! a slot of its own, and go out in offset order, adjacent pages in one
//! `pwritev`: a run of ~20 pages on average in that build.
//!
//! What redb sees does not change. A read is served from the waiting pages
//! where it meets them (reading the file there would make the kernel fill
//! its page cache with zeroes for bytes not written yet); a sync writes
//! them out first, so a durable commit is as durable; so does a shrink
//! below them, and the close. Until the copy's last, durable commit the
//! file is not a copy anyway (see [`crate::snapshot::SteppedWrite`]).
//! After it, [`Combining::pass_through`] writes what waits, frees the
//! slots and turns the gathering off: a defrag's copy becomes the store's
//! file, whose writes go straight to the file as redb's own backend's do.
//! The store's file is opened on this backend too, passing through from the
//! start ([`live`]): its reads are the ones a defrag drops from the page
//! cache as it copies them ([`crate::read_drop`]).
//!
//! A full batch is written by a thread of its own while redb's thread
//! fills the next one ([`Shared::send_out`]): the writes were a quarter of
//! a new member's build, which is the one thread a catch-up waits for.
//! One batch is in flight at a time (the next full one waits for it),
//! reads see it until it is written, and everything but a gathered write
//! (a sync, a resize, a write that does not gather, the close, the end of
//! the gathering) first waits for it to land. A failed write fails the
//! next call, and redb fails the file from then on.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};
use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// Bytes that wait at most before they are written.
const COMBINE_BYTES: usize = 16 << 20;

/// What gathers: whole pages of this size at offsets that are multiples
/// of it (redb's pages: the smallest is 4 KiB, the others multiples of
/// it). Anything else is written at once.
const PAGE: usize = 4096;

type Page = [u8; PAGE];

/// A redb backend on a copy's file (see the module doc).
#[derive(Debug)]
pub(crate) struct CombiningFile {
    /// redb's own backend on the file: its locks.
    locks: FileBackend,
    shared: Arc<Shared>,
}

/// The handle its creator keeps, to turn the gathering off.
#[derive(Debug, Clone)]
pub(crate) struct Combining(Arc<Shared>);

struct Shared {
    /// The same open file as `locks`' (a second descriptor).
    file: File,
    /// Set by [`Combining::pass_through`]: writes go straight to the file.
    passing_through: AtomicBool,
    waiting: Mutex<Waiting>,
    /// Taken after `waiting` when both are.
    in_flight: Mutex<InFlight>,
    /// Signalled when a batch in flight has landed.
    landed: Condvar,
    /// The file's device and inode, for [`crate::read_drop`].
    id: Option<crate::read_drop::FileId>,
    /// Writes to the file so far.
    #[cfg(test)]
    written: std::sync::atomic::AtomicUsize,
}

/// The batch a writer thread is writing, and what it leaves behind.
#[derive(Default)]
struct InFlight {
    batch: Option<Arc<Waiting>>,
    /// Its write failed: for the next call.
    failed: Option<io::Error>,
    /// Its slots, for the next batch.
    spare: Vec<Page>,
}

impl Shared {
    /// Waits until no batch is in flight; its failure, if it failed.
    fn drain(&self) -> io::Result<()> {
        self.wait_landed(&mut self.in_flight.lock())
    }

    /// [`Shared::drain`] under a lock the caller keeps.
    fn wait_landed(&self, flight: &mut MutexGuard<'_, InFlight>) -> io::Result<()> {
        while flight.batch.is_some() {
            self.landed.wait(flight);
        }
        flight.failed.take().map_or(Ok(()), Err)
    }

    /// The batch in flight, if any.
    fn flying(&self) -> Option<Arc<Waiting>> {
        self.in_flight.lock().batch.clone()
    }

    /// Hands what waits to a writer thread, once the batch before it has
    /// landed, and starts a new batch in its slots; written here if no
    /// thread starts.
    fn send_out(self: &Arc<Self>, waiting: &mut Waiting) -> io::Result<()> {
        let mut flight = self.in_flight.lock();
        self.wait_landed(&mut flight)?;
        let batch = Arc::new(waiting.detach(std::mem::take(&mut flight.spare)));
        flight.batch = Some(batch.clone());
        drop(flight);
        let spawned = std::thread::Builder::new()
            .name("copy-write".into())
            .stack_size(WRITER_STACK_BYTES)
            .spawn({
                let (shared, batch) = (self.clone(), batch.clone());
                move || shared.write_batch(batch)
            });
        if spawned.is_err() {
            self.write_batch(batch);
            return self.drain();
        }
        Ok(())
    }

    /// Writes `batch`, marks it landed, then starts its disk writes.
    fn write_batch(&self, batch: Arc<Waiting>) {
        let written = batch.write_pages(
            &self.file,
            #[cfg(test)]
            &self.written,
        );
        let range = written.is_ok().then(|| (batch.first(), batch.end()));
        self.landed_with(batch, written);
        // after it landed: the next batch need not wait for this
        if let Some((from, to)) = range {
            crate::flush::start_write_back(&self.file, from, to);
        }
    }

    /// Marks `batch` landed, keeping its slots for the next one.
    fn landed_with(&self, batch: Arc<Waiting>, written: io::Result<()>) {
        let mut flight = self.in_flight.lock();
        flight.batch = None;
        if let Err(e) = written {
            flight.failed = Some(e);
        }
        // a reader may still hold it: then its slots go with it
        if let Ok(batch) = Arc::try_unwrap(batch) {
            flight.spare = batch.slots;
        }
        self.landed.notify_all();
    }
}

/// A batch writer's stack: it only calls `pwritev`.
const WRITER_STACK_BYTES: usize = 64 * 1024;

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field(
                "passing_through",
                &self.passing_through.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

/// Pages waiting to be written, each in a slot of its own: the slots are
/// allocated as first needed, up to [`COMBINE_BYTES`], and kept (written
/// out and reused) until the gathering ends.
#[derive(Default)]
struct Waiting {
    slots: Vec<Page>,
    free: Vec<u32>,
    /// The waiting pages: file offset → slot.
    pages: BTreeMap<u64, u32>,
    /// Bytes that wait at most ([`COMBINE_BYTES`]; less in tests).
    limit: usize,
}

impl Waiting {
    /// Puts `data` at `offset` (whole pages at a page's offset): a waiting
    /// page is rewritten in its slot.
    fn put(&mut self, offset: u64, data: &[u8]) {
        debug_assert!(gathers(offset, data));
        for (at, page) in (offset..).step_by(PAGE).zip(data.chunks_exact(PAGE)) {
            let slot = match self.pages.get(&at) {
                Some(slot) => *slot,
                None => {
                    let slot = self.free.pop().unwrap_or_else(|| {
                        self.slots.push([0; PAGE]);
                        (self.slots.len() - 1) as u32
                    });
                    self.pages.insert(at, slot);
                    slot
                }
            };
            self.slots[slot as usize].copy_from_slice(page);
        }
    }

    fn full(&self) -> bool {
        self.pages.len() * PAGE >= self.limit
    }

    /// The waiting pages that meet `[offset, offset + len)`.
    fn meeting(&self, offset: u64, len: u64) -> std::collections::btree_map::Range<'_, u64, u32> {
        let first = offset - offset % PAGE as u64;
        self.pages.range(first..offset + len)
    }

    /// Whether every byte of `[offset, offset + len)` waits here or in
    /// `also`.
    fn covers(&self, also: Option<&Waiting>, offset: u64, len: u64) -> bool {
        let first = offset - offset % PAGE as u64;
        (first..offset + len).step_by(PAGE).all(|at| {
            self.pages.contains_key(&at) || also.is_some_and(|w| w.pages.contains_key(&at))
        })
    }

    /// Copies the waiting bytes of `[offset, offset + out.len())` into `out`.
    fn overlay(&self, offset: u64, out: &mut [u8]) {
        let end = offset + out.len() as u64;
        for (at, slot) in self.meeting(offset, out.len() as u64) {
            let page = &self.slots[*slot as usize];
            let from = offset.max(*at);
            let to = end.min(at + PAGE as u64);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&page[(from - at) as usize..(to - at) as usize]);
        }
    }

    /// The first waiting page's offset (0 if none).
    fn first(&self) -> u64 {
        self.pages.first_key_value().map_or(0, |(at, _)| *at)
    }

    /// The end of the last waiting page (0 if none).
    fn end(&self) -> u64 {
        self.pages
            .last_key_value()
            .map_or(0, |(at, _)| at + PAGE as u64)
    }

    /// Writes every waiting page to `file` and empties the batch. On an
    /// error nothing waits any more: redb fails the file from then on.
    fn write_out(
        &mut self,
        file: &File,
        #[cfg(test)] written: &std::sync::atomic::AtomicUsize,
    ) -> io::Result<()> {
        let result = self.write_pages(
            file,
            #[cfg(test)]
            written,
        );
        self.pages.clear();
        self.free.clear();
        self.free.extend((0..self.slots.len() as u32).rev());
        result
    }

    /// Writes every waiting page to `file`, runs of adjacent pages a call
    /// each, in offset order.
    fn write_pages(
        &self,
        file: &File,
        #[cfg(test)] written: &std::sync::atomic::AtomicUsize,
    ) -> io::Result<()> {
        let mut run: Vec<&Page> = Vec::new();
        let mut run_at = 0;
        let mut pages = self.pages.iter().peekable();
        while let Some((&at, &slot)) = pages.next() {
            if run.is_empty() {
                run_at = at;
            }
            run.push(&self.slots[slot as usize]);
            let next_adjoins = pages
                .peek()
                .is_some_and(|(next, _)| **next == at + PAGE as u64);
            if !next_adjoins || run.len() == MAX_RUN_PAGES {
                #[cfg(test)]
                written.fetch_add(1, Ordering::Relaxed);
                write_run(file, run_at, &run)?;
                run.clear();
            }
        }
        Ok(())
    }

    /// The waiting pages as a batch of their own; the next ones wait in
    /// `slots` (a landed batch's, reused).
    fn detach(&mut self, slots: Vec<Page>) -> Waiting {
        let batch = Waiting {
            slots: std::mem::replace(&mut self.slots, slots),
            free: Vec::new(),
            pages: std::mem::take(&mut self.pages),
            limit: self.limit,
        };
        self.free.clear();
        self.free.extend((0..self.slots.len() as u32).rev());
        batch
    }

    /// Ends the gathering: the slots are freed.
    fn end_gathering(&mut self) {
        debug_assert!(self.pages.is_empty());
        self.slots = Vec::new();
        self.free = Vec::new();
    }
}

/// Pages a write takes at most (Linux's `IOV_MAX`).
const MAX_RUN_PAGES: usize = 1024;

/// Writes `pages`, adjacent from `at`, to `file` in `pwritev`s of at most
/// [`crate::flush::WRITE_BYTES`] each.
fn write_run(file: &File, at: u64, pages: &[&Page]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let iov: Vec<libc::iovec> = pages
        .iter()
        .map(|page| libc::iovec {
            iov_base: page.as_ptr() as *mut libc::c_void,
            iov_len: PAGE,
        })
        .collect();
    let total = pages.len() * PAGE;
    let mut done = 0;
    while done < total {
        let (first, within) = (done / PAGE, done % PAGE);
        if within != 0 {
            // a short write ended within a page: the rest of it alone
            file.write_all_at(&pages[first][within..], at + done as u64)?;
            done += PAGE - within;
            continue;
        }
        // no more than a small write's worth (see flush::WRITE_BYTES),
        // within one aligned block of it
        let offset = at + done as u64;
        let room = crate::flush::write_room(offset).div_ceil(PAGE);
        let rest = &iov[first..(first + room).min(iov.len())];
        // SAFETY: every iovec points at a live page of PAGE bytes, borrowed
        // for the call; there are MAX_RUN_PAGES (IOV_MAX) at most.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                rest.as_ptr(),
                rest.len() as libc::c_int,
                offset as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::ErrorKind::WriteZero.into()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Whether a write of `data` at `offset` gathers: whole pages at a page's
/// offset.
fn gathers(offset: u64, data: &[u8]) -> bool {
    offset.is_multiple_of(PAGE as u64) && data.len().is_multiple_of(PAGE) && !data.is_empty()
}

/// Creates the backend on `file`, open for reading and writing, and the
/// handle that turns its gathering off.
pub(crate) fn on(file: File) -> io::Result<(CombiningFile, Combining)> {
    on_with(file, COMBINE_BYTES)
}

/// The backend of a store's own file: nothing gathers, every write goes
/// straight to the file, as once a defrag's copy has become the store's
/// file ([`Combining::pass_through`]).
pub(crate) fn live(file: File) -> io::Result<CombiningFile> {
    let (backend, combining) = on_with(file, 0)?;
    combining.0.passing_through.store(true, Ordering::Release);
    Ok(backend)
}

/// [`on`], with batches of `limit` bytes.
fn on_with(file: File, limit: usize) -> io::Result<(CombiningFile, Combining)> {
    let own = file.try_clone()?;
    let id = crate::read_drop::FileId::of(&own);
    let locks = FileBackend::new(file).map_err(io::Error::other)?;
    let shared = Arc::new(Shared {
        file: own,
        passing_through: AtomicBool::new(false),
        waiting: Mutex::new(Waiting {
            limit,
            ..Waiting::default()
        }),
        in_flight: Mutex::new(InFlight::default()),
        landed: Condvar::new(),
        id,
        #[cfg(test)]
        written: Default::default(),
    });
    Ok((
        CombiningFile {
            locks,
            shared: shared.clone(),
        },
        Combining(shared),
    ))
}

impl Combining {
    /// Writes what waits, then every write goes straight to the file
    /// (through the page cache).
    pub(crate) fn pass_through(&self) -> io::Result<()> {
        let mut waiting = self.0.waiting.lock();
        self.0.passing_through.store(true, Ordering::Release);
        let landed = self.0.drain();
        let written = waiting.write_out(
            &self.0.file,
            #[cfg(test)]
            &self.0.written,
        );
        waiting.end_gathering();
        std::mem::take(&mut self.0.in_flight.lock().spare);
        landed.and(written)
    }

    /// Writes so far, once the batch in flight has landed.
    #[cfg(test)]
    fn written(&self) -> usize {
        let _ = self.0.drain();
        self.0.written.load(Ordering::Relaxed)
    }
}

impl StorageBackend for CombiningFile {
    fn len(&self) -> Result<u64, io::Error> {
        if self.shared.passing_through.load(Ordering::Acquire) {
            return Ok(self.shared.file.metadata()?.len());
        }
        let waiting = self.shared.waiting.lock();
        let flying = self.shared.flying().map_or(0, |batch| batch.end());
        let len = self.shared.file.metadata()?.len();
        Ok(len.max(waiting.end()).max(flying))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        if !self.shared.passing_through.load(Ordering::Acquire) {
            let waiting = self.shared.waiting.lock();
            let len = out.len() as u64;
            let flying = self
                .shared
                .flying()
                .filter(|batch| batch.meeting(offset, len).next().is_some());
            if flying.is_some() || waiting.meeting(offset, len).next().is_some() {
                // under the lock: the waiting pages cannot go out between
                // (those in flight are read from their batch, whether or
                // not they have landed yet). Bytes not written yet are not
                // read from the file: it would fill its page cache with
                // zeroes for them.
                if !waiting.covers(flying.as_deref(), offset, len) {
                    self.shared.file.read_exact_at(out, offset)?;
                }
                if let Some(batch) = &flying {
                    batch.overlay(offset, out);
                }
                waiting.overlay(offset, out);
                return Ok(());
            }
        }
        self.shared.file.read_exact_at(out, offset)?;
        crate::read_drop::note_read(self.shared.id, &self.shared.file, offset, out.len());
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        if !self.shared.passing_through.load(Ordering::Acquire) {
            let mut waiting = self.shared.waiting.lock();
            self.shared.drain()?;
            if waiting.end() > len {
                waiting.write_out(
                    &self.shared.file,
                    #[cfg(test)]
                    &self.shared.written,
                )?;
            }
        }
        self.shared.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        if !self.shared.passing_through.load(Ordering::Acquire) {
            let mut waiting = self.shared.waiting.lock();
            self.shared.drain()?;
            waiting.write_out(
                &self.shared.file,
                #[cfg(test)]
                &self.shared.written,
            )?;
        }
        self.shared.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        if !self.shared.passing_through.load(Ordering::Acquire) {
            let mut waiting = self.shared.waiting.lock();
            // checked again under the lock: a pass_through under way
            if !self.shared.passing_through.load(Ordering::Acquire) {
                if !gathers(offset, data) {
                    // nothing older may land over it afterwards
                    self.shared.drain()?;
                    if waiting.meeting(offset, data.len() as u64).next().is_some() {
                        waiting.write_out(
                            &self.shared.file,
                            #[cfg(test)]
                            &self.shared.written,
                        )?;
                    }
                    return crate::flush::write_all_at(&self.shared.file, data, offset);
                }
                waiting.put(offset, data);
                if waiting.full() {
                    self.shared.send_out(&mut waiting)?;
                }
                return Ok(());
            }
        }
        crate::flush::write_all_at(&self.shared.file, data, offset)
    }

    fn close(&self) -> Result<(), io::Error> {
        let written = if self.shared.passing_through.load(Ordering::Acquire) {
            Ok(())
        } else {
            let mut waiting = self.shared.waiting.lock();
            let landed = self.shared.drain();
            let written = waiting.write_out(
                &self.shared.file,
                #[cfg(test)]
                &self.shared.written,
            );
            landed.and(written)
        };
        let closed = self.locks.close();
        written.and(closed)
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.locks.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.locks.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.locks.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend on a new file in `dir`, and its handle.
    fn backend(dir: &tempfile::TempDir) -> (CombiningFile, Combining, File) {
        backend_with(dir, COMBINE_BYTES)
    }

    /// [`backend`], with batches of `limit` bytes.
    fn backend_with(dir: &tempfile::TempDir, limit: usize) -> (CombiningFile, Combining, File) {
        let path = dir.path().join("copy");
        let (backend, combining) = on_with(crate::test_util::new_file(&path), limit).unwrap();
        (backend, combining, File::open(&path).unwrap())
    }

    /// xorshift64: the same sequence on every run.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    #[test]
    fn what_is_read_and_what_lands_is_what_was_written() {
        reads_and_lands(COMBINE_BYTES);
        // batches of 32 pages: most go out on a writer thread while the
        // next fills and reads meet them in flight
        reads_and_lands(32 * PAGE);
    }

    fn reads_and_lands(limit: usize) {
        let dir = tempfile::tempdir().unwrap();
        let (file, combining, on_disk) = backend_with(&dir, limit);
        // the file as redb sees it
        let mut model: Vec<u8> = Vec::new();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut fill = 0u8;
        for step in 0..20_000 {
            match rng.below(100) {
                // grow or shrink, as redb does with set_len
                0..=1 => {
                    let len = rng.below(3 * COMBINE_BYTES as u64 / PAGE as u64) * PAGE as u64
                        + rng.below(2) * rng.below(PAGE as u64);
                    file.set_len(len).unwrap();
                    model.resize(len as usize, 0);
                }
                2 => file.sync_data().unwrap(),
                // a read anywhere within the file, pages or not
                3..=30 if !model.is_empty() => {
                    let offset = rng.below(model.len() as u64);
                    let len = 1 + rng.below((model.len() as u64 - offset).min(5 * PAGE as u64));
                    let mut out = vec![0xee; len as usize];
                    file.read(offset, &mut out).unwrap();
                    let want = &model[offset as usize..(offset + len) as usize];
                    assert!(out == want, "step {step}: read of {len} at {offset}");
                }
                // a few bytes anywhere: written at once
                31..=33 if !model.is_empty() => {
                    let offset = rng.below(model.len() as u64);
                    let len = 1 + rng.below((model.len() as u64 - offset).min(100));
                    fill = fill.wrapping_add(1);
                    let data = vec![fill; len as usize];
                    file.write(offset, &data).unwrap();
                    model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                }
                // whole pages, mostly near the last ones (redb allocates
                // upwards), sometimes again over waiting ones
                _ if model.len() >= PAGE => {
                    let pages = model.len() as u64 / PAGE as u64;
                    let count = 1 + rng.below(4.min(pages));
                    let first = rng.below(pages - count + 1);
                    let offset = first * PAGE as u64;
                    let data: Vec<u8> = (0..count as usize * PAGE)
                        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(fill))
                        .collect();
                    fill = fill.wrapping_add(7);
                    file.write(offset, &data).unwrap();
                    model[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
                }
                _ => {}
            }
            assert_eq!(file.len().unwrap(), model.len() as u64, "step {step}");
        }
        combining.pass_through().unwrap();
        // after it, straight to the file
        if model.len() >= PAGE {
            file.write(0, &[0x5a; PAGE]).unwrap();
            model[..PAGE].copy_from_slice(&[0x5a; PAGE]);
        }
        let mut landed = Vec::new();
        std::io::Read::read_to_end(&mut &on_disk, &mut landed).unwrap();
        assert_eq!(landed.len(), model.len());
        assert!(landed == model, "the file holds what was written");
        file.close().unwrap();
    }

    #[test]
    fn adjacent_pages_go_out_in_one_write_whatever_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let (file, combining, on_disk) = backend(&dir);
        const PAGES: u64 = 1000;
        file.set_len(PAGES * PAGE as u64).unwrap();
        // in the order redb's striped write buffer lets them go
        for first in 0..131 {
            for page in (first..PAGES).step_by(131) {
                file.write(page * PAGE as u64, &[page as u8; PAGE]).unwrap();
            }
        }
        assert_eq!(combining.written(), 0, "all of it waits");
        let mut page_7 = [0; PAGE];
        file.read(7 * PAGE as u64, &mut page_7).unwrap();
        assert_eq!(page_7, [7; PAGE], "a waiting page reads back");
        file.sync_data().unwrap();
        assert_eq!(combining.written(), 1, "one run");
        let landed = std::fs::read(dir.path().join("copy")).unwrap();
        for (page, bytes) in landed.chunks(PAGE).enumerate() {
            assert!(bytes.iter().all(|b| *b == page as u8), "page {page}");
        }

        // past COMBINE_BYTES they go out without a sync; after
        // pass_through, at once
        let pages = (COMBINE_BYTES / PAGE) as u64;
        file.set_len(2 * pages * PAGE as u64).unwrap();
        for page in 0..pages {
            file.write(page * PAGE as u64, &[1; PAGE]).unwrap();
        }
        // a write takes MAX_RUN_PAGES at most
        let full = 1 + (pages as usize).div_ceil(MAX_RUN_PAGES);
        assert_eq!(combining.written(), full);
        file.write(pages * PAGE as u64, &[2; PAGE]).unwrap();
        combining.pass_through().unwrap();
        assert_eq!(combining.written(), full + 1);
        file.write((pages + 1) * PAGE as u64, &[3; PAGE]).unwrap();
        let mut out = [0; 2 * PAGE];
        on_disk
            .read_exact_at(&mut out, pages * PAGE as u64)
            .unwrap();
        assert!(out[..PAGE].iter().all(|b| *b == 2) && out[PAGE..].iter().all(|b| *b == 3));
        assert_eq!(combining.written(), full + 1, "no longer gathered");
        file.close().unwrap();
    }
}
