//! etcdserver: one oxcd member. Owns the gRPC services, the apply loop, the
//! proposal waiters, membership identity and the member's lifecycle.
//!
//! Never: touch the raft state directly (only through `RaftHandle`), write
//! the backend outside the apply thread, or answer a client with an error
//! that etcd would not give (every failure maps through `errors` to
//! `api::rpctypes`).
//!
//! A write: gRPC → `checks` → `EtcdServer::propose` (request ID, size
//! limit, waiter) → raft (WAL fsync, commit) → `apply::Applier` (mvcc
//! write, consistent index, waiter woken) → response with etcd's header.

pub mod alarms;
pub mod apply;
pub mod bootstrap;
pub mod checks;
pub mod compactor;
pub mod config;
pub mod corrupt;
pub mod errors;
pub mod etcdserver;
pub mod gateway;
pub mod grpc_compat;
pub mod http;
pub mod lease_driver;
pub mod listeners;
pub mod logutil;
pub mod membership;
pub mod metrics;
pub mod peers;
pub mod snapshot;
pub mod startup;
pub mod v3rpc;
pub mod wait;

pub use bootstrap::StartError;
pub use config::ServerConfig;
pub use etcdserver::EtcdServer;
pub use startup::{start, Member as RunningMember};
