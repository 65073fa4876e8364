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
}
