//! The three kinds of traffic, each a loop per client that picks its next
//! request from a seeded generator and what it has seen so far, and the
//! watchers that run beside them.
//!
//! - `kv`: puts, linearizable and serializable gets, deletes, compare-and-
//!   swap transactions on value and on mod revision, ranges over a prefix,
//!   on a small hot key space and a larger one.
//! - `kubernetes`: what kube-apiserver sends — create as
//!   `If(mod_revision == 0) Then(put)`, update and delete as
//!   `If(mod_revision == R) Then(op) Else(get)`, paged lists pinned to the
//!   first page's revision, count-only lists, events on a lease, a watch per
//!   resource prefix with prev_kv and progress notifications plus
//!   RequestProgress, and compaction through the `compact_rev_key`
//!   transaction. kube-apiserver compacts every 5 minutes; here every few
//!   seconds, an acceleration so that short runs compact at all.
//! - `leases`: grants, keep-alives, revokes, puts on leases, and leases left
//!   to expire.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::client::RecordingClient;
use super::history::{Compare, Request, Response, TxnOp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrafficKind {
    Kv,
    Kubernetes,
    Leases,
}

impl TrafficKind {
    pub fn parse(name: &str) -> Option<TrafficKind> {
        match name {
            "kv" => Some(TrafficKind::Kv),
            "kubernetes" => Some(TrafficKind::Kubernetes),
            "leases" => Some(TrafficKind::Leases),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TrafficKind::Kv => "kv",
            TrafficKind::Kubernetes => "kubernetes",
            TrafficKind::Leases => "leases",
        }
    }

    /// The key ranges its watchers follow: (key, range end).
    pub fn watched_ranges(self) -> Vec<(String, String)> {
        let prefixes: &[&str] = match self {
            TrafficKind::Kv => &["/kv/s/", "/kv/"],
            TrafficKind::Kubernetes => &[PODS, CONFIGMAPS, EVENTS],
            TrafficKind::Leases => &["/leases/"],
        };
        prefixes
            .iter()
            .map(|p| (p.to_string(), prefix_end(p)))
            .collect()
    }
}

const PODS: &str = "/registry/pods/default/";
const CONFIGMAPS: &str = "/registry/configmaps/default/";
const EVENTS: &str = "/registry/events/default/";
/// kube-apiserver's compaction bookkeeping key.
pub const COMPACT_REV_KEY: &str = "compact_rev_key";

/// The end of the range of keys that start with `prefix`.
pub fn prefix_end(prefix: &str) -> String {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7f {
            bytes.push(last + 1);
            return String::from_utf8(bytes).expect("ASCII prefix");
        }
    }
    "\0".to_string()
}

/// What a traffic loop needs from the run.
pub struct Ctx {
    pub endpoints: Vec<String>,
    pub recorder: Arc<super::client::Recorder>,
    pub timeout: Duration,
    /// Pause between two requests of one client (the rate limit).
    pub interval: Duration,
    /// Becomes true when the traffic should stop.
    pub stop: watch::Receiver<bool>,
    /// kube-apiserver's compaction interval, accelerated.
    pub compact_interval: Duration,
}

/// What one client has seen of each key: value and mod revision (None:
/// seen absent).
#[derive(Default)]
struct Seen {
    keys: HashMap<String, Option<(String, i64)>>,
    /// Leases this client granted and has not revoked: (id, ttl).
    leases: Vec<(i64, i64)>,
    /// The lease for events (kube-apiserver reuses one for a while) and
    /// when it was granted.
    event_lease: Option<(i64, tokio::time::Instant)>,
    /// kube-apiserver's compactor: the `compact_rev_key` version it
    /// expects and the revision of its previous round.
    compact_version: i64,
    compact_previous: i64,
}

impl Seen {
    fn learn(&mut self, request: &Request, response: &Response) {
        match (request, response) {
            (Request::Put { key, value, .. }, Response::Put { revision }) => {
                self.keys
                    .insert(key.clone(), Some((value.clone(), *revision)));
            }
            (Request::Delete { key }, Response::Delete { .. }) => {
                self.keys.insert(key.clone(), None);
            }
            (
                Request::Range {
                    key,
                    end,
                    count_only: false,
                    ..
                },
                Response::Range { kvs, .. },
            ) => {
                if end.is_empty() && kvs.is_empty() {
                    self.keys.insert(key.clone(), None);
                }
                for kv in kvs {
                    self.keys
                        .insert(kv.key.clone(), Some((kv.value.clone(), kv.mod_revision)));
                }
            }
            (Request::Txn { .. }, _) => {
                let Some((revision, branch)) = super::history::txn_branch(request, response) else {
                    return;
                };
                let revision = &revision;
                for (op, result) in branch {
                    match (op, result) {
                        (TxnOp::Put { key, value, .. }, _) => {
                            self.keys
                                .insert(key.clone(), Some((value.clone(), *revision)));
                        }
                        (TxnOp::Delete { key }, _) => {
                            self.keys.insert(key.clone(), None);
                        }
                        (TxnOp::Get { key }, super::history::OpResult::Get { kvs }) => {
                            let found = kvs.first().map(|kv| (kv.value.clone(), kv.mod_revision));
                            self.keys.insert(key.clone(), found);
                        }
                        _ => {}
                    }
                }
            }
            (Request::LeaseGrant { .. }, Response::LeaseGrant { id, ttl, .. }) => {
                self.leases.push((*id, *ttl));
            }
            _ => {}
        }
    }

    fn mod_revision(&self, key: &str) -> i64 {
        self.keys
            .get(key)
            .and_then(|s| s.as_ref())
            .map_or(0, |s| s.1)
    }
}

/// Runs one client of `kind` until the run stops.
pub async fn run_client(kind: TrafficKind, id: u32, seed: u64, ctx: Arc<Ctx>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let members = ctx.endpoints.len() as u32;
    let mut member = id % members;
    let mut client = RecordingClient::new(
        id,
        member,
        ctx.endpoints[member as usize].clone(),
        ctx.recorder.clone(),
        ctx.timeout,
    );
    let mut seen = Seen::default();
    let mut counter = 0u64;
    let mut stop = ctx.stop.clone();
    let mut failures = 0;
    let mut last_compaction = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ctx.interval) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        counter += 1;
        let value = format!("c{id}-{counter}");
        let requests = match kind {
            TrafficKind::Kv => vec![kv_request(&mut rng, &seen, value)],
            TrafficKind::Kubernetes => {
                // one client plays kube-apiserver's compactor
                if id == 0 && last_compaction.elapsed() >= ctx.compact_interval {
                    last_compaction = tokio::time::Instant::now();
                    compact(&mut client, &mut seen).await;
                    continue;
                }
                kubernetes_requests(&mut rng, &mut client, &mut seen, value).await
            }
            TrafficKind::Leases => vec![lease_request(&mut rng, &mut seen, value)],
        };
        for request in requests {
            match client.run(request.clone()).await {
                Some(response) => {
                    failures = 0;
                    if let Request::LeaseRevoke { id } = &request {
                        seen.leases.retain(|l| l.0 != *id);
                    }
                    seen.learn(&request, &response);
                }
                None => {
                    failures += 1;
                    // a revoked lease is gone either way; a put on a lease
                    // that failed most likely found it expired
                    match &request {
                        Request::LeaseRevoke { id } | Request::Put { lease: id, .. } => {
                            seen.leases.retain(|l| l.0 != *id);
                        }
                        _ => {}
                    }
                    // a balancer moves on from a member that keeps failing
                    if failures >= 2 {
                        failures = 0;
                        member = (member + 1) % members;
                        client.switch_to(member, ctx.endpoints[member as usize].clone());
                    }
                    break;
                }
            }
        }
    }
}

fn kv_request(rng: &mut fastrand::Rng, seen: &Seen, value: String) -> Request {
    let small = rng.u8(0..10) < 7;
    let key = if small {
        format!("/kv/s/{}", rng.usize(0..8))
    } else {
        format!("/kv/l/{:02}", rng.usize(0..64))
    };
    let prefix = if small { "/kv/s/" } else { "/kv/l/" };
    let range = |serializable: bool, limit: i64| Request::Range {
        key: prefix.to_string(),
        end: prefix_end(prefix),
        revision: 0,
        limit,
        serializable,
        count_only: false,
    };
    let get = |serializable: bool| Request::Range {
        key: key.clone(),
        end: String::new(),
        revision: 0,
        limit: 0,
        serializable,
        count_only: false,
    };
    match rng.u32(0..100) {
        0..=24 => Request::Put {
            key,
            value,
            lease: 0,
        },
        25..=42 => get(false),
        43..=49 => get(true),
        50..=57 => Request::Delete { key },
        58..=69 => Request::Txn {
            compare: Compare::ModRevision(key.clone(), seen.mod_revision(&key)),
            then: vec![TxnOp::Put {
                key: key.clone(),
                value,
                lease: 0,
            }],
            otherwise: vec![TxnOp::Get { key }],
        },
        70..=77 => {
            let expected = seen
                .keys
                .get(&key)
                .and_then(|s| s.as_ref())
                .map_or_else(|| "c0-0".to_string(), |s| s.0.clone());
            Request::Txn {
                compare: Compare::Value(key.clone(), expected),
                then: vec![TxnOp::Put {
                    key: key.clone(),
                    value,
                    lease: 0,
                }],
                otherwise: vec![TxnOp::Get { key }],
            }
        }
        78..=87 => range(false, 0),
        88..=92 => range(true, 0),
        93..=96 => range(false, 5),
        _ => Request::Txn {
            compare: Compare::ModRevision(key.clone(), seen.mod_revision(&key)),
            then: vec![TxnOp::Delete { key: key.clone() }],
            otherwise: vec![TxnOp::Get { key }],
        },
    }
}

fn get_key(key: &str) -> Request {
    Request::Range {
        key: key.to_string(),
        end: String::new(),
        revision: 0,
        limit: 0,
        serializable: false,
        count_only: false,
    }
}

/// kube-apiserver's requests: usually one, a paged list several.
async fn kubernetes_requests(
    rng: &mut fastrand::Rng,
    client: &mut RecordingClient,
    seen: &mut Seen,
    value: String,
) -> Vec<Request> {
    let prefix = if rng.bool() { PODS } else { CONFIGMAPS };
    let key = format!("{prefix}obj-{:02}", rng.usize(0..16));
    match rng.u32(0..100) {
        0..=29 => vec![Request::Txn {
            compare: Compare::ModRevision(key.clone(), 0),
            then: vec![TxnOp::Put {
                key,
                value,
                lease: 0,
            }],
            otherwise: vec![],
        }],
        30..=54 => match seen.keys.get(&key) {
            Some(Some((_, rev))) => vec![Request::Txn {
                compare: Compare::ModRevision(key.clone(), *rev),
                then: vec![TxnOp::Put {
                    key: key.clone(),
                    value,
                    lease: 0,
                }],
                otherwise: vec![TxnOp::Get { key }],
            }],
            _ => vec![get_key(&key)],
        },
        55..=64 => match seen.keys.get(&key) {
            Some(Some((_, rev))) => vec![Request::Txn {
                compare: Compare::ModRevision(key.clone(), *rev),
                then: vec![TxnOp::Delete { key: key.clone() }],
                otherwise: vec![TxnOp::Get { key }],
            }],
            _ => vec![get_key(&key)],
        },
        65..=72 => vec![get_key(&key)],
        73..=88 => {
            paged_list(client, seen, prefix).await;
            vec![]
        }
        89..=93 => vec![Request::Range {
            key: prefix.to_string(),
            end: prefix_end(prefix),
            revision: 0,
            limit: 0,
            serializable: false,
            count_only: true,
        }],
        _ => {
            // an event on the lease kube-apiserver reuses for a while
            let fresh = seen
                .event_lease
                .is_some_and(|(_, at)| at.elapsed() < Duration::from_secs(2));
            if !fresh {
                let Some(Response::LeaseGrant { id, .. }) =
                    client.run(Request::LeaseGrant { ttl: 3 }).await
                else {
                    return vec![];
                };
                seen.event_lease = Some((id, tokio::time::Instant::now()));
            }
            let lease = seen.event_lease.map_or(0, |l| l.0);
            vec![Request::Txn {
                compare: Compare::ModRevision(format!("{EVENTS}{value}"), 0),
                then: vec![TxnOp::Put {
                    key: format!("{EVENTS}{value}"),
                    value,
                    lease,
                }],
                otherwise: vec![],
            }]
        }
    }
}

/// A list as kube-apiserver pages it: limit 5, each next page from the key
/// after the last one, at the first page's revision.
async fn paged_list(client: &mut RecordingClient, seen: &mut Seen, prefix: &str) {
    let (mut key, mut revision) = (prefix.to_string(), 0);
    for _ in 0..8 {
        let request = Request::Range {
            key: key.clone(),
            end: prefix_end(prefix),
            revision,
            limit: 5,
            serializable: false,
            count_only: false,
        };
        let Some(response) = client.run(request.clone()).await else {
            return;
        };
        seen.learn(&request, &response);
        let Response::Range {
            revision: header,
            kvs,
            more,
            ..
        } = response
        else {
            return;
        };
        if revision == 0 {
            revision = header;
        }
        match kvs.last() {
            Some(last) if more => key = format!("{}\0", last.key),
            _ => return,
        }
    }
}

/// kube-apiserver's compactor round: claim the round through
/// `compact_rev_key`'s version, then compact to the previous round's
/// revision.
async fn compact(client: &mut RecordingClient, seen: &mut Seen) {
    let request = Request::Txn {
        compare: Compare::Version(COMPACT_REV_KEY.to_string(), seen.compact_version),
        then: vec![TxnOp::Put {
            key: COMPACT_REV_KEY.to_string(),
            value: format!("round-{}", seen.compact_version + 1),
            lease: 0,
        }],
        otherwise: vec![TxnOp::Get {
            key: COMPACT_REV_KEY.to_string(),
        }],
    };
    let Some(Response::Txn {
        revision,
        succeeded,
        results,
    }) = client.run(request).await
    else {
        return;
    };
    if !succeeded {
        // someone else compacted: learn the version and wait a round
        if let Some(super::history::OpResult::Get { kvs }) = results.first() {
            seen.compact_version = kvs.first().map_or(0, |kv| kv.version);
        }
        return;
    }
    seen.compact_version += 1;
    let previous = std::mem::replace(&mut seen.compact_previous, revision);
    if previous > 0 {
        client.run(Request::Compact { revision: previous }).await;
    }
}

fn lease_request(rng: &mut fastrand::Rng, seen: &mut Seen, value: String) -> Request {
    let key = format!("/leases/k{:02}", rng.usize(0..16));
    let held = (!seen.leases.is_empty()).then(|| seen.leases[rng.usize(0..seen.leases.len())]);
    match rng.u32(0..100) {
        0..=11 if seen.leases.len() < 3 => Request::LeaseGrant {
            ttl: rng.i64(2..=4),
        },
        12..=26 if held.is_some() => Request::LeaseKeepAlive {
            id: held.map_or(0, |l| l.0),
        },
        27..=33 if held.is_some() => Request::LeaseRevoke {
            id: held.map_or(0, |l| l.0),
        },
        34..=64 => Request::Put {
            key,
            value,
            lease: held.map_or(0, |l| l.0),
        },
        65..=79 => get_key(&key),
        80..=89 => Request::Range {
            key: "/leases/".to_string(),
            end: prefix_end("/leases/"),
            revision: 0,
            limit: 0,
            serializable: rng.u8(0..4) == 0,
            count_only: false,
        },
        90..=94 => Request::Delete { key },
        _ => {
            // a lease this client forgets: left to expire
            if !seen.leases.is_empty() && rng.bool() {
                seen.leases.remove(0);
            }
            get_key(&key)
        }
    }
}
