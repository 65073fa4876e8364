//! What a robustness run records: every client operation with its call and
//! return times and its answer, every watch response, the faults injected
//! and the members' final state. A run's history is saved as one JSON file
//! that `robustness --check FILE` checks again offline.
//!
//! Times are nanoseconds since the run started, on one monotonic clock
//! shared by every client. An operation whose answer never came (a timeout,
//! an unavailable member, a dropped connection) has no return time and no
//! response: it may or may not have taken effect.

use serde::{Deserialize, Serialize};

/// One key-value pair as etcd returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kv {
    pub key: String,
    pub value: String,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

/// The one comparison of a transaction (the traffic never sends more):
/// `key`'s target equals the given value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Compare {
    ModRevision(String, i64),
    Version(String, i64),
    Value(String, String),
}

impl Compare {
    pub fn key(&self) -> &str {
        match self {
            Compare::ModRevision(k, _) | Compare::Version(k, _) | Compare::Value(k, _) => k,
        }
    }
}

/// A single-key operation inside a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    Put {
        key: String,
        value: String,
        lease: i64,
    },
    Delete {
        key: String,
    },
    Get {
        key: String,
    },
}

impl TxnOp {
    pub fn key(&self) -> &str {
        match self {
            TxnOp::Put { key, .. } | TxnOp::Delete { key } | TxnOp::Get { key } => key,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Put {
        key: String,
        value: String,
        lease: i64,
    },
    /// A single key.
    Delete {
        key: String,
    },
    /// `end` empty: the single key; `revision` 0: the newest.
    Range {
        key: String,
        end: String,
        revision: i64,
        limit: i64,
        serializable: bool,
        count_only: bool,
    },
    Txn {
        compare: Compare,
        then: Vec<TxnOp>,
        otherwise: Vec<TxnOp>,
    },
    LeaseGrant {
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
    },
    LeaseKeepAlive {
        id: i64,
    },
    Compact {
        revision: i64,
    },
    Defragment,
}

impl Request {
    /// Whether the request may change the key-value store.
    pub fn writes(&self) -> bool {
        match self {
            Request::Put { .. } | Request::Delete { .. } | Request::LeaseRevoke { .. } => true,
            Request::Txn {
                then, otherwise, ..
            } => then
                .iter()
                .chain(otherwise)
                .any(|op| !matches!(op, TxnOp::Get { .. })),
            _ => false,
        }
    }
}

/// The answer of one operation inside a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpResult {
    Put,
    Delete { deleted: i64 },
    Get { kvs: Vec<Kv> },
}

/// An answer; `revision` is the response header's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Put {
        revision: i64,
    },
    Delete {
        revision: i64,
        deleted: i64,
    },
    Range {
        revision: i64,
        kvs: Vec<Kv>,
        count: i64,
        more: bool,
    },
    Txn {
        revision: i64,
        succeeded: bool,
        results: Vec<OpResult>,
    },
    LeaseGrant {
        revision: i64,
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        revision: i64,
    },
    LeaseKeepAlive {
        revision: i64,
        ttl: i64,
    },
    Compact {
        revision: i64,
    },
    Defragment,
}

impl Response {
    pub fn revision(&self) -> Option<i64> {
        match self {
            Response::Put { revision }
            | Response::Delete { revision, .. }
            | Response::Range { revision, .. }
            | Response::Txn { revision, .. }
            | Response::LeaseGrant { revision, .. }
            | Response::LeaseRevoke { revision }
            | Response::LeaseKeepAlive { revision, .. }
            | Response::Compact { revision } => Some(*revision),
            Response::Defragment => None,
        }
    }
}

/// A transaction's answer against its request: the header revision and
/// each operation of the branch taken with its result.
pub fn txn_branch<'a>(
    request: &'a Request,
    response: &'a Response,
) -> Option<(i64, Vec<(&'a TxnOp, &'a OpResult)>)> {
    match (request, response) {
        (
            Request::Txn {
                then, otherwise, ..
            },
            Response::Txn {
                revision,
                succeeded,
                results,
            },
        ) => {
            let ops = if *succeeded { then } else { otherwise };
            Some((*revision, ops.iter().zip(results).collect()))
        }
        _ => None,
    }
}

/// One client operation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Operation {
    pub client: u32,
    /// The member it was sent to (index in the cluster).
    pub member: u32,
    pub call: u64,
    /// None: no answer came, the outcome is unknown.
    pub ret: Option<u64>,
    pub request: Request,
    pub response: Option<Response>,
    /// The error, when the operation failed.
    pub error: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    /// For a delete: the key, and its mod revision is the delete's.
    pub kv: Kv,
    pub prev_kv: Option<Kv>,
}

/// One response on a watch stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WatchResponse {
    pub time: u64,
    pub revision: i64,
    pub events: Vec<Event>,
    pub created: bool,
    pub canceled: bool,
    pub compact_revision: i64,
    pub cancel_reason: String,
}

impl WatchResponse {
    /// A progress notification (periodic or requested): no events, and
    /// neither the creation nor the end of the watch.
    pub fn is_progress(&self) -> bool {
        self.events.is_empty() && !self.created && !self.canceled
    }
}

/// One gRPC watch stream of a watcher: from its start revision until it
/// broke or the run ended.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WatchStream {
    pub member: u32,
    pub start_revision: i64,
    pub opened: u64,
    pub responses: Vec<WatchResponse>,
    /// Why it ended early (an error), if it did.
    pub broken: Option<String>,
}

/// A watcher: one key range watched across reconnections, each resuming
/// after the last revision delivered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Watcher {
    pub client: u32,
    pub key: String,
    pub end: String,
    pub prev_kv: bool,
    pub progress_notify: bool,
    pub streams: Vec<WatchStream>,
}

/// A fault as injected: what, on which member, when it started and ended.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaultRecord {
    pub kind: String,
    pub member: u32,
    pub start: u64,
    pub end: u64,
    pub detail: String,
}

/// A member at the end of the run, once the cluster healed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberState {
    pub member: u32,
    pub revision: i64,
    pub compact_revision: i64,
    pub hash: u32,
    /// The whole key space read at `revision` (serializable, on this member).
    pub kvs: Vec<Kv>,
}

/// A whole run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct History {
    pub seed: u64,
    pub traffic: String,
    pub members: u32,
    pub faults: Vec<FaultRecord>,
    pub operations: Vec<Operation>,
    pub watchers: Vec<Watcher>,
    /// The watcher over every key from revision 1: the revision log the
    /// other checks replay.
    pub log: Watcher,
    pub members_at_end: Vec<MemberState>,
    /// Set when the run had a deliberately broken server: the checks must
    /// find a violation.
    #[serde(default)]
    pub broken_server: bool,
}

impl History {
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<()> {
        let file = std::io::BufWriter::new(std::fs::File::create(path)?);
        serde_json::to_writer(file, self).map_err(std::io::Error::other)
    }

    pub fn load(path: &std::path::Path) -> std::io::Result<History> {
        let file = std::io::BufReader::new(std::fs::File::open(path)?);
        serde_json::from_reader(file).map_err(std::io::Error::other)
    }
}
