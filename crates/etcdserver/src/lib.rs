//! etcdserver: one oxcd member (etcd's server/etcdserver). Owns the
//! EtcdServer (proposals, linearizable reads, the member's identity and
//! state), the apply loop, alarms, membership, the lease loops, the
//! compactor, the corruption checks, the proposal waiters and the metrics
//! registry. The gRPC services (`v3rpc`), the HTTP routes (`etcdhttp`) and
//! the listeners and lifecycle (`embed`) are built on it.
//!
//! Never: touch the raft state directly (only through `RaftHandle`), write
//! the backend outside the apply thread, or give a client an error that etcd
//! would not give (every failure maps through `errors` to `api::rpctypes`).
//!
//! A write: gRPC (v3rpc's checks) → [`EtcdServer::propose`] (request ID,
//! size limit, waiter) → raft (WAL fsync, commit) → `apply::Applier` (mvcc
//! write, consistent index, waiter woken) → response with etcd's header.

pub mod alarms;
pub mod apply;
pub mod auth;
pub mod bootstrap;
pub mod compactor;
pub mod config;
pub mod corrupt;
pub mod errors;
pub mod expensive;
#[cfg(test)]
mod fuzz_tests;
pub mod lease_driver;
pub mod membership;
pub mod metrics;
pub mod peers;
pub mod reconfig;
pub mod server;
pub mod snapshot;
pub mod ticks;
pub mod wait;

// Failpoint sites (`crate::fail_point!`) are compiled in only with the
// `failpoints` feature (test builds); without it they expand to nothing.
#[cfg(feature = "failpoints")]
pub(crate) use failpoint::fail_point;
#[cfg(not(feature = "failpoints"))]
macro_rules! fail_point {
    ($($site:tt)*) => {};
}
#[cfg(not(feature = "failpoints"))]
pub(crate) use fail_point;

pub use auth::go_duration_nanos;
pub use bootstrap::StartError;
pub use config::ServerConfig;
pub use server::{EtcdServer, CLUSTER_VERSION, ETCD_VERSION};
