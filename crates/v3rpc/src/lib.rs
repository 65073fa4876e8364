//! v3rpc: the gRPC services (etcd's etcdserver/api/v3rpc): request checks, the require-leader rule, and the mapping
//! of every failure to etcd's code and message. Services not built yet are
//! not registered, so gRPC answers `Unimplemented` for them. Election and
//! Lock run clientv3's concurrency recipes on the member's own services
//! (`concurrency`), as etcd's v3election and v3lock do.

pub mod auth;
pub mod checks;
pub mod cluster;
pub mod concurrency;
pub mod election;
#[cfg(test)]
mod fuzz_tests;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod snapshot_stream;
pub mod watch;

use api::rpctypes;
use tonic::{Request, Status};

use etcdserver::EtcdServer;

/// What a request on a TLS connection knows of it (a request extension,
/// set by the listener).
#[derive(Clone, Debug)]
pub struct TlsConnectInfo {
    pub remote_addr: Option<std::net::SocketAddr>,
    /// The Common Name of the client's verified certificate, if it sent one
    /// (etcd's user name for `--client-cert-auth` when no token is sent;
    /// empty for a certificate without one).
    pub common_name: Option<String>,
}

/// clientv3's WithRequireLeader metadata key (rpctypes.MetadataRequireLeaderKey).
pub const REQUIRE_LEADER_KEY: &str = "hasleader";

/// A request that asks for a leader fails at once without one, as etcd's
/// gRPC interceptor does for kube-apiserver.
pub fn check_require_leader<T>(server: &EtcdServer, request: &Request<T>) -> Result<(), Status> {
    let wants_leader = request
        .metadata()
        .get(REQUIRE_LEADER_KEY)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == "true");
    if wants_leader && !server.has_leader() {
        return Err(rpctypes::NO_LEADER.status());
    }
    Ok(())
}
