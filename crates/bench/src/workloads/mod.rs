//! One module per etcd benchmark subcommand.

pub mod failover;
pub mod health;
pub mod lease;
pub mod lease_expire;
pub mod put;
pub mod range;
pub mod snapshot;
pub mod txn_put;
pub mod watch;
pub mod watch_latency;
