//! One robustness run: a 3-member cluster in network namespaces, the
//! traffic and its watchers, the faults, then the cluster healed, the
//! members' final state read and every watcher caught up to it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::client::{connect, kvs_of, Recorder, RecordingClient};
use super::faults::{self, Fault, SharedCluster};
use super::history::{FaultRecord, History, MemberState, Request};
use super::traffic::{self, Ctx, TrafficKind};
use super::watcher::{run_watcher, WatchSpec};
use crate::netns::NetnsCluster;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// A handful of short runs inside .ci/run.
    Ci,
    /// Longer runs with more clients and faults, run by hand.
    Full,
}

impl Profile {
    pub fn parse(name: &str) -> Option<Profile> {
        match name {
            "ci" => Some(Profile::Ci),
            "full" => Some(Profile::Full),
            _ => None,
        }
    }

    fn clients(self) -> u32 {
        match self {
            Profile::Ci => 4,
            Profile::Full => 6,
        }
    }

    fn interval(self) -> Duration {
        match self {
            Profile::Ci => Duration::from_millis(25),
            Profile::Full => Duration::from_millis(15),
        }
    }

    /// How long the traffic runs at least.
    fn duration(self) -> Duration {
        match self {
            Profile::Ci => Duration::from_secs(6),
            Profile::Full => Duration::from_secs(12),
        }
    }

    fn faults(self, rng: &mut fastrand::Rng) -> usize {
        match self {
            Profile::Ci => 1,
            Profile::Full => rng.usize(1..=2),
        }
    }
}

pub struct RunConfig {
    pub seed: u64,
    pub traffic: TrafficKind,
    pub profile: Profile,
    /// The server was built with the `failpoints` feature: crash points
    /// are among the faults.
    pub failpoints: bool,
    /// Arm `brokenLinearizableRead` on a partitioned follower that a
    /// client keeps reading from: the checks must find the stale reads.
    pub broken_server: bool,
    /// Forces the fault (else the seed chooses).
    pub fault: Option<Fault>,
}

/// The seed's fault schedule: (fault, delay before it).
pub fn schedule(config: &RunConfig) -> Vec<Fault> {
    let mut rng =
        fastrand::Rng::with_seed(config.seed ^ 0x5eed_fa17 ^ ((config.traffic as u64) << 32));
    if config.broken_server {
        return Vec::new();
    }
    if let Some(f) = config.fault {
        return vec![f];
    }
    (0..config.profile.faults(&mut rng))
        .map(|_| Fault::choose(&mut rng, config.failpoints))
        .collect()
}

/// Runs the cluster, the traffic and the faults; returns the history.
pub fn run(config: &RunConfig) -> History {
    let faults = schedule(config);
    let disk_full = faults.contains(&Fault::DiskFull);
    let flags = [
        // snapshots often, so that a member cut off for a few seconds
        // catches up by snapshot
        "--snapshot-count",
        "100",
        "--experimental-snapshot-catchup-entries",
        "20",
    ];
    let volumes: Vec<usize> = if disk_full { vec![0, 1, 2] } else { vec![] };
    let begun = std::time::Instant::now();
    let cluster = NetnsCluster::start_with_volumes(3, &flags, &volumes, faults::VOLUME_SIZE);
    progress(&format!(
        "cluster up in {:.1}s",
        begun.elapsed().as_secs_f64()
    ));
    let endpoints = cluster.endpoints();
    let broken_follower = config.broken_server.then_some(config.seed as usize % 3);
    let cluster: SharedCluster = Arc::new(Mutex::new(cluster));
    let recorder = Recorder::new();

    // the stale-read client of a broken-server run sits on the member's
    // own side of the partition
    let (stop_tx, stop_rx) = watch::channel(false);
    let local_reader = broken_follower.map(|member| {
        let recorder = recorder.clone();
        let endpoint = endpoints[member].clone();
        let stop = stop_rx.clone();
        let guard = cluster.lock().expect("cluster lock");
        guard.spawn_in_member_ns(member, move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(stale_reader(member as u32, endpoint, recorder, stop))
        })
    });

    let runner = {
        let cluster = cluster.clone();
        let guard = cluster.lock().expect("cluster lock");
        let cluster = cluster.clone();
        let endpoints = endpoints.clone();
        let recorder = recorder.clone();
        let seed = config.seed;
        let kind = config.traffic;
        let profile = config.profile;
        guard.spawn_in_client_ns(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(drive(
                seed,
                kind,
                profile,
                faults,
                broken_follower,
                cluster,
                endpoints,
                recorder,
                stop_tx,
                stop_rx,
            ))
        })
    };
    let (fault_records, watchers, log, members_at_end) = runner
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    if let Some(reader) = local_reader {
        let _ = reader.join();
    }
    let mut operations = recorder.take();
    operations.sort_by_key(|o| o.call);
    History {
        seed: config.seed,
        traffic: config.traffic.name().to_string(),
        members: 3,
        faults: fault_records,
        operations,
        watchers,
        log,
        members_at_end,
        broken_server: config.broken_server,
    }
}

type Outcome = (
    Vec<FaultRecord>,
    Vec<super::history::Watcher>,
    super::history::Watcher,
    Vec<MemberState>,
);

#[allow(clippy::too_many_arguments)]
async fn drive(
    seed: u64,
    kind: TrafficKind,
    profile: Profile,
    faults: Vec<Fault>,
    broken_follower: Option<usize>,
    cluster: SharedCluster,
    endpoints: Vec<String>,
    recorder: Arc<Recorder>,
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
) -> Outcome {
    let (target_tx, target_rx) = watch::channel(None);
    let log_watcher = tokio::spawn(run_watcher(
        WatchSpec {
            client: 1000,
            key: String::new(),
            end: "\0".into(),
            prev_kv: false,
            progress_notify: false,
            // heard from twice a second: a member cut off is left at once,
            // before compaction can take what the log has not had yet
            request_progress: Some(Duration::from_millis(500)),
        },
        endpoints.clone(),
        recorder.clone(),
        target_rx.clone(),
    ));
    let watchers: Vec<_> = kind
        .watched_ranges()
        .into_iter()
        .enumerate()
        .map(|(i, (key, end))| {
            tokio::spawn(run_watcher(
                WatchSpec {
                    client: 100 + i as u32,
                    key,
                    end,
                    prev_kv: true,
                    progress_notify: true,
                    request_progress: (kind == TrafficKind::Kubernetes)
                        .then_some(Duration::from_secs(1)),
                },
                endpoints.clone(),
                recorder.clone(),
                target_rx.clone(),
            ))
        })
        .collect();
    let ctx = Arc::new(Ctx {
        endpoints: endpoints.clone(),
        recorder: recorder.clone(),
        timeout: Duration::from_secs(2),
        interval: profile.interval(),
        stop: stop_rx,
        compact_interval: Duration::from_secs(2),
    });
    let clients: Vec<_> = (0..profile.clients())
        .map(|id| {
            tokio::spawn(traffic::run_client(
                kind,
                id,
                seed.wrapping_mul(1000).wrapping_add(id as u64),
                ctx.clone(),
            ))
        })
        .collect();

    let started = tokio::time::Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xfa_0175);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut records = Vec::new();
    if let Some(member) = broken_follower {
        records.push(broken_read_window(&cluster, &endpoints, member, &recorder).await);
    }
    for fault in faults {
        records.push(faults::inject(fault, &cluster, &endpoints, &mut rng, &recorder).await);
        progress(&format!(
            "{} done after {:.1}s",
            fault.name(),
            started.elapsed().as_secs_f64()
        ));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let remaining = profile.duration().saturating_sub(started.elapsed());
    tokio::time::sleep(remaining.max(Duration::from_secs(1))).await;
    let _ = stop_tx.send(true);
    for c in clients {
        let _ = c.await;
    }

    progress(&format!(
        "traffic stopped after {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let members_at_end = converge(&cluster, &endpoints).await;
    progress(&format!(
        "converged after {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let final_revision = members_at_end.iter().map(|m| m.revision).max().unwrap_or(0);
    let _ = target_tx.send(Some(final_revision));
    let mut watched = Vec::new();
    for w in watchers {
        if let Ok(w) = w.await {
            watched.push(w);
        }
    }
    let log = log_watcher.await.expect("history watcher");
    progress(&format!(
        "watchers caught up after {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    (records, watched, log, members_at_end)
}

/// Waits (up to 60 s) for every member to be at the same revision, then
/// reads each one's state.
async fn converge(cluster: &SharedCluster, endpoints: &[String]) -> Vec<MemberState> {
    // every member running again (a fault that failed half-way)
    let cluster = cluster.clone();
    let restart = tokio::task::spawn_blocking(move || {
        let mut c = cluster.lock().expect("cluster lock");
        for i in 0..3 {
            c.resume(i);
            c.heal(i);
            c.reap_if_exited(i);
            if !c.has_process(i) {
                // one that does not come back is missing from the final
                // state, which the checks report
                let _ = c.try_restart(i);
            }
        }
    });
    let _ = restart.await;
    let timeout = Duration::from_secs(3);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // Leases go on expiring after the traffic stopped, so the members are
    // compared at one revision rather than at "the same moment": the
    // newest any member has once every member answers a linearizable read,
    // then each one's state at that revision once it got there.
    let current = |endpoint: String, serializable: bool| async move {
        let mut c = connect(&endpoint, timeout).await?;
        let mut any = etcd_client::GetOptions::new()
            .with_all_keys()
            .with_count_only();
        if serializable {
            any = any.with_serializable();
        }
        let r = tokio::time::timeout(timeout, c.get("", Some(any)))
            .await
            .ok()?
            .ok()?;
        r.header().map(|h| h.revision())
    };
    let mut target = 0;
    loop {
        let mut answered = 0;
        for endpoint in endpoints {
            if let Some(revision) = current(endpoint.clone(), false).await {
                answered += 1;
                target = target.max(revision);
            }
        }
        if answered == endpoints.len() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut states = Vec::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        // this member has applied the target revision (or the deadline)
        while current(endpoint.clone(), true).await.unwrap_or(0) < target
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let state = async {
            let mut c = connect(endpoint, timeout).await?;
            let hash = tokio::time::timeout(timeout, c.hash_kv(target))
                .await
                .ok()?
                .ok()?;
            let all = tokio::time::timeout(
                timeout,
                c.get(
                    "",
                    Some(
                        etcd_client::GetOptions::new()
                            .with_all_keys()
                            .with_revision(target)
                            .with_serializable(),
                    ),
                ),
            )
            .await
            .ok()?
            .ok()?;
            Some(MemberState {
                member: i as u32,
                revision: target,
                compact_revision: hash.compact_version(),
                hash: hash.hash(),
                kvs: kvs_of(all.kvs()),
            })
        }
        .await;
        if let Some(s) = state {
            states.push(s);
        }
    }
    states
}

/// The broken-server run's window: `brokenLinearizableRead` armed on the
/// follower, the follower cut off for 3 s while the others go on writing
/// and its local client reads, then healed and disarmed.
async fn broken_read_window(
    cluster: &SharedCluster,
    endpoints: &[String],
    member: usize,
    recorder: &Recorder,
) -> FaultRecord {
    let start = recorder.now();
    let endpoint = endpoints[member].clone();
    let arm = endpoint.clone();
    let armed = tokio::task::spawn_blocking(move || {
        crate::http::request(
            &arm,
            "PUT",
            "/debug/failpoints/brokenLinearizableRead",
            Some("return"),
        )
        .is_ok_and(|r| r.status / 100 == 2)
    })
    .await
    .unwrap_or(false);
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.lock().expect("cluster lock").isolate(member))
        .await
        .ok();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.lock().expect("cluster lock").heal(member))
        .await
        .ok();
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::spawn_blocking(move || {
        crate::http::request(
            &endpoint,
            "DELETE",
            "/debug/failpoints/brokenLinearizableRead",
            None,
        )
    })
    .await
    .ok();
    FaultRecord {
        kind: "broken-linearizable-read".into(),
        member: member as u32,
        start,
        end: recorder.now(),
        detail: if armed {
            "armed on the partitioned follower".into()
        } else {
            "could not arm (a server without failpoints?)".into()
        },
    }
}

/// Linearizable gets of the hot keys, from inside a member's namespace.
async fn stale_reader(
    member: u32,
    endpoint: String,
    recorder: Arc<Recorder>,
    mut stop: watch::Receiver<bool>,
) {
    let mut client = RecordingClient::new(500, member, endpoint, recorder, Duration::from_secs(1));
    let mut n = 0usize;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        n += 1;
        client
            .run(Request::Range {
                key: format!("/kv/s/{}", n % 8),
                end: String::new(),
                revision: 0,
                limit: 0,
                serializable: false,
                count_only: false,
            })
            .await;
    }
}

/// A progress line on stderr when ROBUSTNESS_VERBOSE is set.
pub fn progress(line: &str) {
    if std::env::var_os("ROBUSTNESS_VERBOSE").is_some() {
        eprintln!("robustness: {line}");
    }
}

/// Where a run's history is saved.
pub fn history_path(dir: &std::path::Path, config: &RunConfig) -> PathBuf {
    dir.join(format!(
        "robustness-{}-{}.json",
        config.traffic.name(),
        config.seed
    ))
}
