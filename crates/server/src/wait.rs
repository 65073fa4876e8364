//! Proposal waiters keyed by request ID (etcd's pkg/wait): the caller
//! registers before proposing, the apply thread triggers after applying.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::sync::oneshot;

pub struct Wait<T> {
    waiters: Mutex<HashMap<u64, oneshot::Sender<T>>>,
}

impl<T> Default for Wait<T> {
    fn default() -> Self {
        Wait {
            waiters: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Wait<T> {
    pub fn register(&self, id: u64) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        let previous = self.waiters.lock().insert(id, tx);
        debug_assert!(previous.is_none(), "request id {id:x} registered twice");
        rx
    }

    /// Wakes the waiter of `id`, if this member has one (a request proposed
    /// by another member, or one whose caller gave up, has none).
    pub fn trigger(&self, id: u64, value: T) {
        if let Some(tx) = self.waiters.lock().remove(&id) {
            let _ = tx.send(value);
        }
    }

    pub fn cancel(&self, id: u64) {
        self.waiters.lock().remove(&id);
    }

    pub fn len(&self) -> usize {
        self.waiters.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
