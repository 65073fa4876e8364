//! embed: starting and stopping a member (etcd's embed package). Builds the
//! member from its config (backend, raft, apply loop, EtcdServer), binds its
//! listeners (client connection threads serving gRPC and HTTP, the peer port,
//! the metrics port), runs its background loops, and stops it in order.

pub mod access;
mod distributed_tracing;
pub mod grpc_compat;
pub mod listeners;
pub mod logutil;
pub mod ping_policy;
pub mod secure;
pub mod startup;

pub use etcdserver::config::DistributedTracing;
pub use etcdserver::{ServerConfig, StartError};
pub use startup::{start, Member as RunningMember};
