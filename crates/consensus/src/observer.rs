//! What the raft thread sees of its own files and heartbeats, for the
//! server's metrics (etcd's etcd_disk_wal_write_*, etcd_snap_* and
//! etcd_server_heartbeat_send_failures_total): this crate knows no metrics.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Called on the raft thread right where the work happens: it must be
/// cheap and must not block.
pub trait RaftObserver: Send + Sync {
    /// One write of buffered WAL records: `bytes` went to the segment in
    /// `took` (the fdatasync after it is the sync observer's).
    fn wal_written(&self, bytes: u64, took: Duration);
    /// A `.snap` file saved: encoding it, its fsync, and the whole save.
    fn snap_saved(&self, marshalling: Duration, fsync: Duration, total: Duration);
    /// The leader sent a heartbeat to a peer later than twice the heartbeat
    /// interval after the previous one (etcd: "leader failed to send out
    /// heartbeat on time").
    fn heartbeat_late(&self, to: u64, exceeded: Duration);
}

/// A [`RaftObserver`] as [`crate::StartOptions`] holds it.
#[derive(Clone)]
pub struct Observer(pub Arc<dyn RaftObserver>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// etcd's timeoutDetector for heartbeats: per peer, the time of the last
/// heartbeat sent in the current term. A new term (a new leadership) starts
/// afresh, so the gap while this member did not lead counts for nothing.
pub(crate) struct HeartbeatWatch {
    max_gap: Duration,
    last: HashMap<u64, (u64, Instant)>,
}

impl HeartbeatWatch {
    pub(crate) fn new(heartbeat: Duration) -> HeartbeatWatch {
        HeartbeatWatch {
            max_gap: 2 * heartbeat,
            last: HashMap::new(),
        }
    }

    /// A heartbeat to `to` in `term` is being sent now: how far past the
    /// allowed gap it is, if it is late.
    pub(crate) fn sent(&mut self, to: u64, term: u64, now: Instant) -> Option<Duration> {
        match self.last.insert(to, (term, now)) {
            Some((last_term, at)) if last_term == term => {
                let gap = now.saturating_duration_since(at);
                (gap > self.max_gap).then(|| gap - self.max_gap)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_is_late_only_past_twice_the_interval_within_one_term() {
        let mut watch = HeartbeatWatch::new(Duration::from_millis(100));
        let t0 = Instant::now();
        assert_eq!(watch.sent(2, 5, t0), None);
        assert_eq!(watch.sent(2, 5, t0 + Duration::from_millis(200)), None);
        assert_eq!(
            watch.sent(2, 5, t0 + Duration::from_millis(450)),
            Some(Duration::from_millis(50))
        );
        // A new term: the gap since the last leadership does not count.
        assert_eq!(watch.sent(2, 6, t0 + Duration::from_secs(10)), None);
    }
}
