//! Turns of the raft loop on a client thread.
//!
//! A lone client's write used to cross threads twice in series with the
//! WAL's fdatasync: the request's thread woke the raft thread, which woke
//! it back with the answer. While the member leads alone (one voter, no
//! learners: nobody else's message is needed to commit), a thread that
//! allows it ([`allow_client_turns`]: the `grpc-client-N` threads, each a
//! current-thread runtime) queues its proposals without waking the raft
//! thread and, once the tasks already queued on its runtime have run, takes
//! the loop's lock and turns it itself: the queued input, the WAL append and
//! fdatasync, the hand-off to apply (inline when the apply side is idle),
//! whose wake-up of the waiting request is a push onto this thread's own
//! run queue. Proposals queued by the thread's other tasks in the meantime
//! share the turn (group commit, as on the raft thread).
//!
//! When the lock is held (the raft thread's tick, or another client
//! thread's turn) the thread wakes the raft thread instead, which turns
//! once the lock is free: a queued proposal is always someone's. Ticks,
//! peer messages, snapshots and stopping stay the raft thread's; an error
//! or a panic in a client thread's turn is handed to it, which stops the
//! loop as for its own.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use crate::HandleInner;

thread_local! {
    static ALLOWED: Cell<bool> = const { Cell::new(false) };
    /// The handles whose turn is scheduled on this thread.
    static DUE: RefCell<Vec<Arc<HandleInner>>> = const { RefCell::new(Vec::new()) };
}

/// Lets proposals made on this thread turn the raft loop here (see the
/// module). Only for a thread that runs a current-thread tokio runtime and
/// may block for a WAL fdatasync.
pub fn allow_client_turns() {
    ALLOWED.with(|allowed| allowed.set(true));
}

/// This thread allows client turns and is inside its runtime.
pub(crate) fn allowed() -> bool {
    ALLOWED.with(Cell::get) && tokio::runtime::Handle::try_current().is_ok()
}

/// Schedules a turn for `inner` on this thread's runtime, after the tasks
/// already queued there (once per handle until it runs).
pub(crate) fn schedule(inner: &Arc<HandleInner>) {
    let first = DUE.with(|due| {
        let mut due = due.borrow_mut();
        if due.iter().any(|d| Arc::ptr_eq(d, inner)) {
            return false;
        }
        due.push(inner.clone());
        due.len() == 1
    });
    if first {
        tokio::spawn(async { run_due() });
    }
}

fn run_due() {
    let due = DUE.with(|due| std::mem::take(&mut *due.borrow_mut()));
    for inner in due {
        inner.client_turn();
    }
}
