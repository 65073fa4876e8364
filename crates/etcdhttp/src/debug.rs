//! `/debug/vars`: Go's expvar page as etcd serves it on every client URL
//! (always, GET only): `cmdline`, `memstats`, `file_descriptor_limit` and
//! `raft.status`, the keys in expvar's order (sorted), one per line.
//!
//! `memstats` has every key of Go's runtime.MemStats. A Rust process has no
//! garbage collector and the allocator keeps no Go-style counts, so it is
//! filled from /proc/self/status where a key has a near meaning and 0
//! elsewhere:
//! - `Sys`, `HeapSys`: VmData (memory obtained from the OS for data:
//!   heap, thread stacks, anonymous mappings);
//! - `Alloc`, `HeapAlloc`, `HeapInuse`: RssAnon (anonymous memory resident
//!   now: what the allocator holds, in use or cached);
//! - `HeapIdle`: VmData − RssAnon; `StackInuse`, `StackSys`: VmStk;
//! - `TotalAlloc`, `Mallocs`, `Frees`, `HeapObjects`, `Lookups`, every GC
//!   key (`NextGC`, `LastGC`, `PauseTotalNs`, `PauseNs`, `PauseEnd`,
//!   `NumGC`, `NumForcedGC`, `GCCPUFraction`, `GCSys`), the span and cache
//!   keys: 0 (`PauseNs`/`PauseEnd` Go's 256 zeros, `BySize` Go's 61 empty
//!   size classes, `EnableGC` false).
//!
//! `raft.status` is etcd's raft Status JSON from what the raft thread
//! publishes: id, term, vote, commit, lead, raftState, applied,
//! leadtransferee, and on the leader `progress` (each member's match, next
//! and state, asked of the raft thread), empty elsewhere as etcd's.

use std::sync::Arc;

use axum::body::Body;
use http::{header, HeaderValue, Method};
use serde_json::{json, Map, Value};

use etcdserver::{metrics, EtcdServer};

/// Fields of /proc/self/status, in bytes.
fn proc_status_bytes() -> std::collections::HashMap<String, u64> {
    let mut fields = std::collections::HashMap::new();
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        for line in status.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let mut parts = value.split_whitespace();
            if let (Some(n), Some("kB")) = (parts.next(), parts.next()) {
                if let Ok(n) = n.parse::<u64>() {
                    fields.insert(key.to_string(), n * 1024);
                }
            }
        }
    }
    fields
}

fn memstats() -> Value {
    let status = proc_status_bytes();
    let get = |key: &str| status.get(key).copied().unwrap_or(0);
    let (data, anon, stack) = (get("VmData"), get("RssAnon"), get("VmStk"));
    let mut m = Map::new();
    let mut put = |key: &str, value: Value| {
        m.insert(key.to_string(), value);
    };
    put("Alloc", json!(anon));
    put("TotalAlloc", json!(0));
    put("Sys", json!(data));
    put("Lookups", json!(0));
    put("Mallocs", json!(0));
    put("Frees", json!(0));
    put("HeapAlloc", json!(anon));
    put("HeapSys", json!(data));
    put("HeapIdle", json!(data.saturating_sub(anon)));
    put("HeapInuse", json!(anon));
    put("HeapReleased", json!(0));
    put("HeapObjects", json!(0));
    put("StackInuse", json!(stack));
    put("StackSys", json!(stack));
    for key in [
        "MSpanInuse",
        "MSpanSys",
        "MCacheInuse",
        "MCacheSys",
        "BuckHashSys",
        "GCSys",
        "OtherSys",
        "NextGC",
        "LastGC",
        "PauseTotalNs",
    ] {
        put(key, json!(0));
    }
    put("PauseNs", json!(vec![0u64; 256]));
    put("PauseEnd", json!(vec![0u64; 256]));
    put("NumGC", json!(0));
    put("NumForcedGC", json!(0));
    put("GCCPUFraction", json!(0));
    put("EnableGC", json!(false));
    put("DebugGC", json!(false));
    let size_classes: Vec<Value> = (0..61)
        .map(|_| json!({"Size": 0, "Mallocs": 0, "Frees": 0}))
        .collect();
    put("BySize", Value::Array(size_classes));
    Value::Object(m)
}

/// etcd's raft Status JSON (raft/status.go MarshalJSON): IDs in hex;
/// `progress` only on the leader, asked of the raft thread.
pub async fn raft_status_json(server: &EtcdServer) -> Value {
    let status = server.raft.status();
    let mut progress = Map::new();
    if status.is_leader {
        if let Ok(Some(peers)) = server.raft.progress().await {
            for peer in peers {
                progress.insert(
                    format!("{:x}", peer.id),
                    json!({"match": peer.matched, "next": peer.next, "state": peer.state}),
                );
            }
        }
    }
    json!({
        "id": format!("{:x}", status.id),
        "term": status.term,
        "vote": format!("{:x}", status.vote),
        "commit": status.commit_index,
        "lead": format!("{:x}", status.leader),
        "raftState": status.raft_state,
        "applied": status.applied_index,
        "progress": progress,
        "leadtransferee": format!("{:x}", status.lead_transferee),
    })
}

/// The page: expvar's layout ("{\n", `"key": value` lines joined by ",\n",
/// "\n}\n"), keys sorted.
pub async fn vars_page(server: &EtcdServer) -> String {
    let cmdline: Vec<String> = std::env::args().collect();
    let fd_limit = metrics::process::soft_limit(metrics::process::NOFILE).unwrap_or(0);
    let vars = [
        ("cmdline", json!(cmdline)),
        ("file_descriptor_limit", json!(fd_limit)),
        ("memstats", memstats()),
        ("raft.status", raft_status_json(server).await),
    ];
    let lines: Vec<String> = vars
        .iter()
        .map(|(key, value)| format!("{}: {}", json!(key), value))
        .collect();
    format!("{{\n{}\n}}\n", lines.join(",\n"))
}

pub async fn vars(server: Arc<EtcdServer>, request: http::Request<Body>) -> http::Response<Body> {
    match *request.method() {
        Method::GET => {
            let mut response = http::Response::new(Body::from(vars_page(&server).await));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json; charset=utf-8"),
            );
            response
        }
        _ => crate::method_not_allowed(Some("GET")),
    }
}
