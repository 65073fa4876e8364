//! Auto-compaction (etcd's v3compactor): the leader compacts history on a
//! schedule, `--auto-compaction-mode periodic` (keep a time window) or
//! `revision` (keep a number of revisions). Followers keep sampling but
//! never compact: the leader's compaction reaches them through raft.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::CompactionRequest;
use api::rpctypes;
use tokio::sync::watch;

use crate::server::EtcdServer;

/// What `--auto-compaction-mode` and `--auto-compaction-retention` ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep at least this much history (by time).
    Periodic(Duration),
    /// Keep this many revisions.
    Revision(i64),
}

/// etcd's revision compactor checks every 5 minutes (revInterval).
pub(crate) const REVISION_CHECK_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// The periodic compactor samples the revision this many times per period.
const RETRY_DIVISOR: u32 = 10;

/// Parses the flags as etcd's embed config does: a bare integer is hours
/// (periodic) or revisions (revision); anything else a Go duration, parsed
/// by `parse_duration`. A zero retention disables auto-compaction.
pub fn parse(
    mode: &str,
    retention: &str,
    parse_duration: impl Fn(&str) -> Result<Duration, String>,
) -> Result<Option<AutoCompaction>, String> {
    if mode != "periodic" && mode != "revision" {
        return Err(format!("unknown auto-compaction-mode {mode:?}"));
    }
    let parsed = match retention.parse::<i64>() {
        Ok(n) if n >= 0 => match mode {
            "revision" => AutoCompaction::Revision(n),
            _ => AutoCompaction::Periodic(Duration::from_secs(n as u64 * 3600)),
        },
        _ => {
            let d = parse_duration(retention)
                .map_err(|e| format!("error parsing CompactionRetention: {e}"))?;
            match mode {
                // etcd: time.Duration's nanoseconds as a revision count.
                "revision" => AutoCompaction::Revision(d.as_nanos().min(i64::MAX as u128) as i64),
                _ => AutoCompaction::Periodic(d),
            }
        }
    };
    Ok(match parsed {
        AutoCompaction::Periodic(d) if d.is_zero() => None,
        AutoCompaction::Revision(0) => None,
        other => Some(other),
    })
}

async fn compact(server: &EtcdServer, revision: i64) -> Result<(), rpctypes::EtcdError> {
    let request = CompactionRequest {
        revision,
        physical: false,
    };
    match server.propose(request).await {
        Ok(_) => Ok(()),
        // Someone compacted further already: as good as done.
        Err(e) if e == rpctypes::COMPACTED => Ok(()),
        Err(e) => Err(e),
    }
}

/// Runs the configured compactor until shutdown.
pub async fn run(
    server: Arc<EtcdServer>,
    mode: AutoCompaction,
    revision_interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    match mode {
        AutoCompaction::Periodic(period) => periodic(&server, period, &mut shutdown).await,
        AutoCompaction::Revision(retention) => {
            revision(&server, retention, revision_interval, &mut shutdown).await
        }
    }
}

/// etcd 3.5's Periodic: sample the revision every period/10 (at most every
/// 6 minutes), and once `period` has passed compact at the oldest sample
/// (the revision of about `period` ago), then again every min(period, 1 h).
async fn periodic(server: &EtcdServer, period: Duration, shutdown: &mut watch::Receiver<bool>) {
    let compact_interval = period.min(Duration::from_secs(3600));
    let retry_interval = compact_interval / RETRY_DIVISOR;
    let retentions = (period.as_nanos() / retry_interval.as_nanos().max(1)) as usize + 1;
    let mut samples: VecDeque<i64> = VecDeque::with_capacity(retentions + 1);
    let mut last_success = Instant::now();
    let mut base_interval = period;
    let mut last_compacted = 0;
    loop {
        samples.push_back(server.store.current_revision());
        if samples.len() > retentions {
            samples.pop_front();
        }
        tokio::select! {
            _ = tokio::time::sleep(retry_interval) => {}
            _ = shutdown.changed() => return,
        }
        if !server.raft.status().is_leader || last_success.elapsed() < base_interval {
            continue;
        }
        base_interval = compact_interval;
        let Some(&revision) = samples.front() else {
            continue;
        };
        if revision <= last_compacted {
            continue;
        }
        tracing::info!(revision, "compact-period" = ?period, "starting auto periodic compaction");
        match compact(server, revision).await {
            Ok(()) => {
                last_compacted = revision;
                last_success = Instant::now();
                tracing::info!(revision, "compact-period" = ?period, "completed auto periodic compaction");
            }
            Err(e) => {
                tracing::warn!(revision, "compact-period" = ?period, error = %e, "failed auto periodic compaction")
            }
        }
    }
}

/// etcd 3.5's Revision: every `interval` (5 minutes), compact at the
/// current revision minus the retention.
async fn revision(
    server: &EtcdServer,
    retention: i64,
    interval: Duration,
    shutdown: &mut watch::Receiver<bool>,
) {
    let mut previous = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        if !server.raft.status().is_leader {
            continue;
        }
        let revision = server.store.current_revision() - retention;
        if revision <= 0 || revision == previous {
            continue;
        }
        tracing::info!(
            revision,
            "revision-compaction-retention" = retention,
            "starting auto revision compaction"
        );
        match compact(server, revision).await {
            Ok(()) => {
                previous = revision;
                tracing::info!(
                    revision,
                    "revision-compaction-retention" = retention,
                    "completed auto revision compaction"
                );
            }
            Err(e) => {
                tracing::warn!(revision, error = %e, "failed auto revision compaction")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn go(text: &str) -> Result<Duration, String> {
        humantime::parse_duration(text).map_err(|e| e.to_string())
    }

    #[test]
    fn retention_parses_as_etcd() {
        assert_eq!(parse("periodic", "0", go), Ok(None));
        assert_eq!(
            parse("periodic", "1", go),
            Ok(Some(AutoCompaction::Periodic(Duration::from_secs(3600))))
        );
        assert_eq!(
            parse("periodic", "30m", go),
            Ok(Some(AutoCompaction::Periodic(Duration::from_secs(1800))))
        );
        assert_eq!(
            parse("revision", "1000", go),
            Ok(Some(AutoCompaction::Revision(1000)))
        );
        assert!(parse("daily", "1", go).is_err());
        assert!(parse("periodic", "soon", go).is_err());
    }
}
