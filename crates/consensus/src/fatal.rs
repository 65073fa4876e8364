//! A member that cannot go on stops and exits non-zero, as etcd's
//! `lg.Fatal` does for a WAL write, a snapshot save or a backend commit that
//! fails: a process that stays up answering `server stopped` forever is
//! never restarted by its supervisor.
//!
//! Whoever meets such an error (the raft loop, the apply side) raises it
//! here and stops its own work at once; the process's owner waits on
//! [`Fatal::raised`], stops the member in order and exits with the cause in
//! its last log line.

use tokio::sync::watch;

/// The first fatal error of a member, once raised.
pub struct Fatal {
    cause: watch::Sender<Option<String>>,
}

impl Default for Fatal {
    fn default() -> Self {
        Fatal {
            cause: watch::channel(None).0,
        }
    }
}

impl Fatal {
    /// Records `cause` unless another was raised first (that one stays the
    /// cause: what follows is usually its consequence).
    pub fn raise(&self, cause: impl Into<String>) {
        let cause = cause.into();
        self.cause.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            tracing::error!(cause = %cause, "fatal error: stopping the member");
            *current = Some(cause);
            true
        });
    }

    /// The cause, if one was raised.
    pub fn cause(&self) -> Option<String> {
        self.cause.borrow().clone()
    }

    /// Resolves with the cause once one is raised.
    pub async fn raised(&self) -> String {
        let mut rx = self.cause.subscribe();
        loop {
            if let Some(cause) = rx.borrow_and_update().clone() {
                return cause;
            }
            if rx.changed().await.is_err() {
                // The sender lives in self: unreachable while we borrow it.
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Fatal {
    /// Runs a member's thread body; a panic in it becomes the member's
    /// fatal error (the process then stops in order and exits non-zero)
    /// rather than a dead thread in a process that stays up.
    pub fn run_thread(&self, thread: &str, body: impl FnOnce()) {
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
            let what = panic_message(panic.as_ref());
            self.raise(format!("the {thread} thread panicked: {what}"));
        }
    }
}

/// What a caught panic said (its `&str` or `String` payload).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::Fatal;

    #[tokio::test]
    async fn the_first_cause_wins_and_wakes_waiters() {
        let fatal = std::sync::Arc::new(Fatal::default());
        assert_eq!(fatal.cause(), None);
        let waiter = {
            let fatal = fatal.clone();
            tokio::spawn(async move { fatal.raised().await })
        };
        fatal.raise("wal: disk full");
        fatal.raise("then everything else fails");
        assert_eq!(waiter.await.unwrap(), "wal: disk full");
        assert_eq!(fatal.cause().as_deref(), Some("wal: disk full"));
        assert_eq!(fatal.raised().await, "wal: disk full");
    }

    #[test]
    fn a_panicking_member_thread_raises_the_fatal_error() {
        let fatal = Fatal::default();
        fatal.run_thread("apply", || {});
        assert_eq!(fatal.cause(), None);
        fatal.run_thread("apply", || panic!("index out of range"));
        assert_eq!(
            fatal.cause().as_deref(),
            Some("the apply thread panicked: index out of range")
        );
    }
}
