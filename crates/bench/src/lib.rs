//! oxbench: etcd's `benchmark` tool, rewritten light.
//!
//! Owns: the workloads of etcd's `tools/benchmark` (put, range, txn-put,
//! watch, watch-latency, lease-keepalive) against any etcd v3 endpoint, a few
//! of its own for bench/ (health, lease-expire, failover), and
//! the report etcd's `pkg/report` prints, so that oxcd and etcd are measured
//! with one tool and one format. Talks raw gRPC through the `api` crate's
//! generated clients: on a 2-core machine the client competes with the server
//! for CPU, so the hot loop does one request build and one RPC, collects
//! latencies in per-task vectors (no channel, no lock) and merges them at the
//! end. With `--user`, each connection authenticates once and its requests
//! carry the token (see [`auth`]), as clientv3's do.
//!
//! Never: links the server, or changes what is measured to flatter oxcd — a
//! workload does what etcd's benchmark does, and where it cannot (an
//! unimplemented RPC), the failure is counted and reported, never hidden.

pub mod auth;
pub mod client;
pub mod gofmt;
pub mod keys;
pub mod limiter;
pub mod report;
pub mod workloads;
