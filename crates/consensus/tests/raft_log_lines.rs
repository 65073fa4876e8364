//! raft's log lines reach `tracing` in the form etcd operators grep for.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use consensus::{start, NoopTransport, RaftConfig};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Records every INFO-or-above event's message.
struct Capture(Arc<Mutex<Vec<String>>>);

struct MessageVisitor(String);

impl Visit for MessageVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut v = MessageVisitor(String::new());
        event.record(&mut v);
        self.0.lock().unwrap().push(v.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn raft_logs_became_leader_and_elected_leader_like_etcd() {
    let lines = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::set_global_default(Capture(lines.clone())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let id = 0x8e9e05c52164694d_u64;
    let (handle, _rx) = start(
        RaftConfig {
            id,
            member_dir: dir.path().join("member"),
            wal_dir: dir.path().join("member").join("wal"),
            voters: vec![id],
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(1000),
            applied: 0,
            cluster_id: 1,
            force_new_cluster: false,
        },
        Arc::new(NoopTransport),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !handle.status().is_leader {
        assert!(Instant::now() < deadline, "no leader");
        std::thread::sleep(Duration::from_millis(2));
    }
    handle.stop();
    let lines = lines.lock().unwrap();
    let has = |s: &str| lines.iter().any(|l| l.contains(s));
    assert!(
        has("8e9e05c52164694d became leader at term 1"),
        "{lines:#?}"
    );
    assert!(
        has("raft.node: 8e9e05c52164694d elected leader 8e9e05c52164694d at term 1"),
        "{lines:#?}"
    );
}
