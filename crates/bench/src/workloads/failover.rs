//! `failover` (oxbench's own, not in etcd's tool): one client putting
//! continuously through the endpoints while every endpoint's Status is
//! polled, writing a timeline that bench/failover.sh reads around its kills
//! of the leader. One line per fact, times in Unix nanoseconds (the wall
//! clock, to compare with the script's kill times), endpoints by their index
//! in `--endpoints`:
//!
//! ```text
//! ack <sent_ns> <acked_ns> <endpoint> <revision>
//! error <ns> <endpoint> <message>
//! leader <ns> <endpoint> <leader_id> <term>   (when an endpoint's answer changes;
//!                                              "- -" when it stops answering)
//! ```
//!
//! Each put has a deadline (`--request-timeout`); a failed or timed-out put is
//! retried on another endpoint, after [`RETRY_PAUSE`] when the member
//! answered with an error (a follower without a leader refuses at once).
//! With `--via follower` (the default) the writer goes through a member whose
//! latest Status names another member leader, or none (an election), so that
//! every kill of the leader is seen from the same side; `--via any` keeps an
//! endpoint until it fails, as clientv3 does. Runs until SIGTERM or SIGINT, or
//! `--duration`, then prints how many puts were acknowledged and failed.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::maintenance_client::MaintenanceClient;
use api::etcdserverpb::{PutRequest, StatusRequest};
use bytes::Bytes;
use tokio::signal::unix::{signal, SignalKind};

use crate::client::{status_message, Settings};

/// Pause before retrying after an error answer: bounds the retry rate while
/// a follower without a leader refuses proposals at once.
const RETRY_PAUSE: Duration = Duration::from_millis(5);
/// How often each endpoint's Status is asked: the resolution of "a new
/// leader is seen".
const STATUS_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Value size of each put.
const VALUE_SIZE: usize = 64;

/// What an endpoint's latest Status said of its member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// No answer yet, or the last poll failed.
    Unknown = 0,
    Follower = 1,
    Leader = 2,
    /// It answered, knowing no leader (an election).
    NoLeader = 3,
}

impl Role {
    fn from_u8(v: u8) -> Role {
        match v {
            1 => Role::Follower,
            2 => Role::Leader,
            3 => Role::NoLeader,
            _ => Role::Unknown,
        }
    }

    fn of_status(member_id: u64, leader: u64) -> Role {
        if leader == 0 {
            Role::NoLeader
        } else if leader == member_id {
            Role::Leader
        } else {
            Role::Follower
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Follower,
    Any,
}

impl std::str::FromStr for Via {
    type Err = String;
    fn from_str(s: &str) -> Result<Via, String> {
        match s {
            "follower" => Ok(Via::Follower),
            "any" => Ok(Via::Any),
            _ => Err(format!("--via takes follower or any; got {s:?}")),
        }
    }
}

/// The endpoint of the next put. After a failure, never `current` (unless
/// it is the only one); with [`Via::Follower`], the first endpoint from
/// there on whose member answered and is not the leader, else simply the
/// next one.
pub fn pick_endpoint(current: usize, roles: &[Role], via: Via, failed: bool) -> usize {
    let n = roles.len();
    let next = (current + 1) % n.max(1);
    if via == Via::Any {
        return if failed { next } else { current };
    }
    let from = if failed { next } else { current };
    (0..n)
        .map(|k| (from + k) % n)
        .filter(|&i| !(failed && i == current && n > 1))
        .find(|&i| matches!(roles[i], Role::Follower | Role::NoLeader))
        .unwrap_or(if failed { next } else { current })
}

#[derive(Clone, Debug)]
pub struct FailoverOptions {
    pub timeline: std::path::PathBuf,
    pub request_timeout: Duration,
    pub duration: Duration,
    pub via: Via,
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
}

/// The timeline file, one line per write (flushed at each newline, so that
/// the script reads it while the run goes on).
struct Timeline {
    file: Mutex<LineWriter<File>>,
    failed: AtomicBool,
}

impl Timeline {
    fn create(path: &Path) -> Result<Timeline, String> {
        let file = File::create(path)
            .map_err(|e| format!("cannot create --timeline {}: {e}", path.display()))?;
        Ok(Timeline {
            file: Mutex::new(LineWriter::new(file)),
            failed: AtomicBool::new(false),
        })
    }

    fn line(&self, text: std::fmt::Arguments) {
        let mut file = match self.file.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if writeln!(file, "{text}").is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
    }
}

struct Shared {
    roles: Vec<AtomicU8>,
    stop: AtomicBool,
    timeline: Timeline,
}

impl Shared {
    fn roles(&self) -> Vec<Role> {
        self.roles
            .iter()
            .map(|r| Role::from_u8(r.load(Ordering::Relaxed)))
            .collect()
    }
}

async fn poll_status(
    shared: Arc<Shared>,
    mut maintenance: MaintenanceClient<crate::auth::Connection>,
    endpoint: usize,
    timeout: Duration,
) {
    // (leader, term) last written; None: unreachable written (or nothing yet).
    let mut last: Option<(u64, u64)> = None;
    let mut started = false;
    while !shared.stop.load(Ordering::Relaxed) {
        let answer = tokio::time::timeout(timeout, maintenance.status(StatusRequest {})).await;
        let now = unix_nanos();
        match answer {
            Ok(Ok(response)) => {
                let status = response.into_inner();
                let member_id = status.header.map_or(0, |h| h.member_id);
                let role = Role::of_status(member_id, status.leader);
                shared.roles[endpoint].store(role as u8, Ordering::Relaxed);
                let seen = (status.leader, status.raft_term);
                if last != Some(seen) {
                    shared.timeline.line(format_args!(
                        "leader {now} {endpoint} {} {}",
                        seen.0, seen.1
                    ));
                    last = Some(seen);
                }
            }
            Ok(Err(_)) | Err(_) => {
                shared.roles[endpoint].store(Role::Unknown as u8, Ordering::Relaxed);
                if last.is_some() || !started {
                    shared
                        .timeline
                        .line(format_args!("leader {now} {endpoint} - -"));
                    last = None;
                }
            }
        }
        started = true;
        tokio::time::sleep(STATUS_POLL_INTERVAL).await;
    }
}

async fn write(
    shared: Arc<Shared>,
    mut kvs: Vec<KvClient<crate::auth::Connection>>,
    opts: FailoverOptions,
    acks: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
) {
    let key = Bytes::from_static(b"failover");
    let mut endpoint = pick_endpoint(0, &shared.roles(), opts.via, false);
    let mut sequence = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        sequence += 1;
        let mut value = format!("{sequence}").into_bytes();
        value.resize(VALUE_SIZE, b'.');
        let request = PutRequest {
            key: key.clone(),
            value: value.into(),
            ..Default::default()
        };
        let sent = unix_nanos();
        let answer = tokio::time::timeout(opts.request_timeout, kvs[endpoint].put(request)).await;
        let now = unix_nanos();
        let failed = match answer {
            Ok(Ok(response)) => {
                let revision = response.into_inner().header.map_or(0, |h| h.revision);
                shared
                    .timeline
                    .line(format_args!("ack {sent} {now} {endpoint} {revision}"));
                acks.fetch_add(1, Ordering::Relaxed);
                false
            }
            Ok(Err(status)) => {
                let message = status_message(&status).replace('\n', " ");
                shared
                    .timeline
                    .line(format_args!("error {now} {endpoint} {message}"));
                errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(RETRY_PAUSE).await;
                true
            }
            Err(_) => {
                shared.timeline.line(format_args!(
                    "error {now} {endpoint} no answer within {:?}",
                    opts.request_timeout
                ));
                errors.fetch_add(1, Ordering::Relaxed);
                true
            }
        };
        endpoint = pick_endpoint(endpoint, &shared.roles(), opts.via, failed);
    }
}

pub async fn run(settings: &Settings, opts: &FailoverOptions) -> Result<(), String> {
    let n = settings.endpoints.len();
    let mut kvs = Vec::with_capacity(n);
    let mut maintenances = Vec::with_capacity(n);
    for endpoint in &settings.endpoints {
        // One connection for the writer and one for the poller, each endpoint.
        kvs.push(KvClient::new(
            settings.connect(endpoint, settings.dial_timeout).await?,
        ));
        maintenances.push(MaintenanceClient::new(
            settings.connect(endpoint, settings.dial_timeout).await?,
        ));
    }
    let shared = Arc::new(Shared {
        roles: (0..n).map(|_| AtomicU8::new(Role::Unknown as u8)).collect(),
        stop: AtomicBool::new(false),
        timeline: Timeline::create(&opts.timeline)?,
    });
    let mut pollers = Vec::new();
    for (endpoint, maintenance) in maintenances.into_iter().enumerate() {
        pollers.push(tokio::spawn(poll_status(
            shared.clone(),
            maintenance,
            endpoint,
            opts.request_timeout,
        )));
    }
    // Let every poller answer once, so the first put already knows the roles.
    let waiting = Instant::now();
    while shared.roles().contains(&Role::Unknown) && waiting.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(STATUS_POLL_INTERVAL).await;
    }

    let acks = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let writer = tokio::spawn(write(
        shared.clone(),
        kvs,
        opts.clone(),
        acks.clone(),
        errors.clone(),
    ));
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
        _ = tokio::time::sleep(opts.duration) => {}
    }
    shared.stop.store(true, Ordering::Relaxed);
    // The writer stops after its put in flight, at most a request timeout.
    let _ = writer.await;
    for poller in pollers {
        let _ = poller.await;
    }
    let secs = start.elapsed().as_secs_f64();
    let (acks, errors) = (acks.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
    if shared.timeline.failed.load(Ordering::Relaxed) {
        return Err(format!(
            "writing --timeline {} failed",
            opts.timeline.display()
        ));
    }
    if settings.json {
        println!(
            "{}",
            serde_json::json!({"acks": acks, "errors": errors, "secs": secs})
        );
    } else {
        println!("{acks} puts acknowledged, {errors} failed, in {secs:.2} secs");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Role::*;

    #[test]
    fn any_keeps_its_endpoint_until_it_fails() {
        let roles = [Leader, Follower, Follower];
        assert_eq!(pick_endpoint(0, &roles, Via::Any, false), 0);
        assert_eq!(pick_endpoint(0, &roles, Via::Any, true), 1);
        assert_eq!(pick_endpoint(2, &roles, Via::Any, true), 0);
    }

    #[test]
    fn follower_leaves_the_leader_even_without_a_failure() {
        assert_eq!(
            pick_endpoint(0, &[Leader, Follower, Follower], Via::Follower, false),
            1
        );
        // a member that won an election under the writer
        assert_eq!(
            pick_endpoint(1, &[Follower, Leader, Follower], Via::Follower, false),
            2
        );
        assert_eq!(
            pick_endpoint(2, &[Follower, Follower, Leader], Via::Follower, false),
            0
        );
    }

    #[test]
    fn follower_stays_through_an_election() {
        assert_eq!(
            pick_endpoint(1, &[Unknown, NoLeader, NoLeader], Via::Follower, false),
            1
        );
    }

    #[test]
    fn after_a_failure_follower_skips_the_dead_and_the_leader() {
        // the killed leader (0) no longer answers; the writer's follower (1) failed
        assert_eq!(
            pick_endpoint(1, &[Unknown, NoLeader, NoLeader], Via::Follower, true),
            2
        );
        assert_eq!(
            pick_endpoint(2, &[Unknown, Follower, Leader], Via::Follower, true),
            1
        );
        // nothing known: round-robin
        assert_eq!(
            pick_endpoint(2, &[Unknown, Unknown, Unknown], Via::Follower, true),
            0
        );
        // the only follower failed and no other qualifies: the next one, whatever it is
        assert_eq!(
            pick_endpoint(1, &[Leader, Follower, Unknown], Via::Follower, true),
            2
        );
    }

    #[test]
    fn a_single_endpoint_is_always_picked() {
        assert_eq!(pick_endpoint(0, &[Leader], Via::Follower, true), 0);
        assert_eq!(pick_endpoint(0, &[Unknown], Via::Any, true), 0);
    }
}
