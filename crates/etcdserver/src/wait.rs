//! Proposal waiters keyed by request ID (etcd's pkg/wait): the caller
//! registers before proposing, the apply thread triggers after applying.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::sync::oneshot;

pub struct Wait<T> {
    /// None once closed: nothing will be triggered any more.
    waiters: Mutex<Option<HashMap<u64, oneshot::Sender<T>>>>,
}

impl<T> Default for Wait<T> {
    fn default() -> Self {
        Wait {
            waiters: Mutex::new(Some(HashMap::new())),
        }
    }
}

impl<T> Wait<T> {
    /// The receiver of `id`'s outcome; after [`Wait::close`], one that
    /// fails at once (its sender is dropped).
    pub(crate) fn register(&self, id: u64) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        if let Some(waiters) = self.waiters.lock().as_mut() {
            let previous = waiters.insert(id, tx);
            debug_assert!(previous.is_none(), "request id {id:x} registered twice");
        }
        rx
    }

    /// Apply has stopped for good: every waiter, present and future, fails
    /// now (its caller answers "server stopped") instead of at its timeout.
    pub(crate) fn close(&self) {
        self.waiters.lock().take();
    }

    /// Wakes the waiter of `id`, if this member has one (a request proposed
    /// by another member, or one whose caller gave up, has none).
    pub(crate) fn trigger(&self, id: u64, value: T) {
        let tx = self.waiters.lock().as_mut().and_then(|w| w.remove(&id));
        if let Some(tx) = tx {
            let _ = tx.send(value);
        }
    }

    pub(crate) fn cancel(&self, id: u64) {
        if let Some(waiters) = self.waiters.lock().as_mut() {
            waiters.remove(&id);
        }
    }
}
