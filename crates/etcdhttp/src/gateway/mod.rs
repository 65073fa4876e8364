//! The JSON gateway etcd serves on its client port (grpc-gateway v1):
//! `POST /v3/<service>/<method>` with a JSON request body, answered with the
//! JSON response, calling the gRPC service implementations directly (no
//! loopback gRPC hop). `/v3beta/` is an alias, as in etcd 3.4 and 3.5.
//!
//! Errors are etcd 3.5's: the HTTP status grpc-gateway maps the gRPC code
//! to, and `{"error":msg,"code":n,"message":msg}` (3.4 orders the fields
//! error, message, code and sends them chunked with a trailer; clients
//! parse either).
//!
//! A route that takes one request is one line of [`ROUTES`] plus one
//! [`unary!`] (or [`server_stream!`], answered with `{"result":...}` lines).
//! `watch` and `lease/keepalive` are bidirectional streams: the body is a
//! stream of concatenated JSON requests fed to the service's stream as they
//! arrive ([`serve_bidi`]). etcd 3.5 serves no HashKV route (its gateway
//! answers 404), so neither do we.

#[cfg(test)]
mod fuzz_tests;
pub(crate) mod json;
mod reflect;
mod stream;

pub use json::syntax_error;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use api::etcdserverpb::auth_server::Auth;
use api::etcdserverpb::cluster_server::Cluster;
use api::etcdserverpb::kv_server::Kv;
use api::etcdserverpb::lease_server::Lease;
use api::etcdserverpb::maintenance_server::Maintenance;
use api::v3electionpb::election_server::Election;
use api::v3lockpb::lock_server::Lock;
use axum::body::Body;
use futures::Stream;
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::Value;
use tokio::sync::watch;
use tonic::{Code, Status};

use crate::method_not_allowed;
use etcdserver::config::GRPC_OVERHEAD_BYTES;
use etcdserver::EtcdServer;
use reflect::{to_json_string, FromJson, ToJson};
use stream::{lines_response, result_lines, serve_bidi, Inbound, ResultLines};
use v3rpc::auth::{AuthService, Credentials};
use v3rpc::cluster::ClusterService;
use v3rpc::concurrency::LocalClient;
use v3rpc::election::ElectionService;
use v3rpc::kv::KvService;
use v3rpc::lease::{KeepAliveStream, LeaseService};
use v3rpc::lock::LockService;
use v3rpc::maintenance::MaintenanceService;
use v3rpc::watch::{ResponseStream as WatchStream, WatchService};

/// Path prefixes the gateway answers under.
pub(crate) const PREFIXES: [&str; 2] = ["/v3/", "/v3beta/"];

/// The services the gateway calls.
pub struct Gateway {
    server: Arc<EtcdServer>,
    kv: KvService,
    maintenance: MaintenanceService,
    cluster: ClusterService,
    lease: LeaseService,
    watch: WatchService,
    election: ElectionService,
    lock: LockService,
    auth: AuthService,
}

impl Gateway {
    /// `shutdown` ends open streams when the member stops; `client` is the
    /// member's own client that Election and Lock run their recipes on.
    pub fn new(
        server: Arc<EtcdServer>,
        shutdown: watch::Receiver<bool>,
        client: LocalClient,
    ) -> Gateway {
        Gateway {
            kv: KvService::new(server.clone()),
            maintenance: MaintenanceService::new(server.clone()),
            cluster: ClusterService::new(server.clone()),
            lease: LeaseService::new(server.clone(), shutdown.clone()),
            watch: WatchService::new(server.clone(), shutdown),
            election: ElectionService::new(client.clone()),
            lock: LockService::new(client),
            auth: AuthService::new(server.clone()),
            server,
        }
    }

    /// The largest request message: what grpc-go takes from etcd's gateway
    /// (`--max-request-bytes` and gRPC's overhead); a put or txn above
    /// `--max-request-bytes` alone gets etcd's "request is too large".
    fn max_message(&self) -> usize {
        self.server.cfg.max_request_bytes + GRPC_OVERHEAD_BYTES
    }

    /// The most JSON text a request may take in memory: twice its message's
    /// limit (base64 makes bytes 4/3 as long; the rest is JSON's syntax).
    /// etcd's gateway reads any body whole.
    fn max_body(&self) -> usize {
        2 * self.max_message()
    }
}

/// What a route answers with: one JSON message, or a stream of lines.
pub(crate) enum Answer {
    Message(String),
    Lines(ResultLines),
}

type RouteFuture<'a> = Pin<Box<dyn Future<Output = Result<Answer, Status>> + Send + 'a>>;
/// A route that takes one JSON request: unary or server-streaming.
pub(crate) type Route = for<'a> fn(&'a Gateway, Value, Credentials) -> RouteFuture<'a>;

/// The caller's credentials: grpc-gateway forwards the `Authorization`
/// header as `authorization` metadata, which etcd reads as a raw token. A
/// gateway request never runs as a client certificate's Common Name.
pub(crate) fn credentials(headers: &http::HeaderMap) -> Credentials {
    Credentials {
        token: headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        common_name: None,
    }
}

/// A service request carrying `credentials` as gRPC metadata.
fn with_credentials<T>(message: T, credentials: &Credentials) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = credentials.token.as_deref().and_then(|t| t.parse().ok()) {
        request
            .metadata_mut()
            .insert(v3rpc::auth::AUTHORIZATION_KEY, token);
    }
    request
}

/// Decodes the request (up to `max_message` bytes), calls the unary
/// method, encodes its answer.
fn call<'a, Req, Resp, F, Fut>(
    value: Value,
    max_message: usize,
    credentials: Credentials,
    method: F,
) -> RouteFuture<'a>
where
    Req: FromJson + Send + 'a,
    Resp: ToJson,
    F: FnOnce(tonic::Request<Req>) -> Fut + Send + 'a,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>> + Send + 'a,
{
    let request = Req::from_json_within(&value, max_message);
    Box::pin(async move {
        let response = method(with_credentials(request?, &credentials)).await?;
        Ok(Answer::Message(to_json_string(response.get_ref())))
    })
}

/// Decodes the request, calls the server-streaming method, and answers
/// with its responses as they come.
fn call_stream<'a, Req, Resp, S, F, Fut>(
    value: Value,
    max_message: usize,
    credentials: Credentials,
    method: F,
) -> RouteFuture<'a>
where
    Req: FromJson + Send + 'a,
    Resp: ToJson + Send + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + 'static,
    F: FnOnce(tonic::Request<Req>) -> Fut + Send + 'a,
    Fut: Future<Output = Result<tonic::Response<S>, Status>> + Send + 'a,
{
    let request = Req::from_json_within(&value, max_message);
    Box::pin(async move {
        let responses = method(with_credentials(request?, &credentials)).await?;
        Ok(Answer::Lines(Box::pin(result_lines(
            responses.into_inner(),
        ))))
    })
}

macro_rules! unary {
    ($name:ident, $service:ident . $method:ident) => {
        fn $name(gateway: &Gateway, value: Value, credentials: Credentials) -> RouteFuture<'_> {
            call(value, gateway.max_message(), credentials, move |request| {
                gateway.$service.$method(request)
            })
        }
    };
}

macro_rules! server_stream {
    ($name:ident, $service:ident . $method:ident) => {
        fn $name(gateway: &Gateway, value: Value, credentials: Credentials) -> RouteFuture<'_> {
            call_stream(value, gateway.max_message(), credentials, move |request| {
                gateway.$service.$method(request)
            })
        }
    };
}

unary!(kv_range, kv.range);
unary!(kv_put, kv.put);
unary!(kv_delete_range, kv.delete_range);
unary!(kv_txn, kv.txn);
unary!(kv_compact, kv.compact);
unary!(maintenance_alarm, maintenance.alarm);
unary!(maintenance_status, maintenance.status);
unary!(maintenance_defragment, maintenance.defragment);
unary!(maintenance_hash, maintenance.hash);
server_stream!(maintenance_snapshot, maintenance.snapshot);
unary!(maintenance_move_leader, maintenance.move_leader);
unary!(maintenance_downgrade, maintenance.downgrade);
unary!(cluster_member_add, cluster.member_add);
unary!(cluster_member_remove, cluster.member_remove);
unary!(cluster_member_update, cluster.member_update);
unary!(cluster_member_list, cluster.member_list);
unary!(cluster_member_promote, cluster.member_promote);
unary!(lease_grant, lease.lease_grant);
unary!(lease_revoke, lease.lease_revoke);
unary!(lease_time_to_live, lease.lease_time_to_live);
unary!(lease_leases, lease.lease_leases);
unary!(election_campaign, election.campaign);
unary!(election_proclaim, election.proclaim);
unary!(election_leader, election.leader);
server_stream!(election_observe, election.observe);
unary!(election_resign, election.resign);
unary!(lock_lock, lock.lock);
unary!(lock_unlock, lock.unlock);
unary!(auth_enable, auth.auth_enable);
unary!(auth_disable, auth.auth_disable);
unary!(auth_status, auth.auth_status);
unary!(auth_authenticate, auth.authenticate);
unary!(auth_user_add, auth.user_add);
unary!(auth_user_get, auth.user_get);
unary!(auth_user_list, auth.user_list);
unary!(auth_user_delete, auth.user_delete);
unary!(auth_user_change_password, auth.user_change_password);
unary!(auth_user_grant_role, auth.user_grant_role);
unary!(auth_user_revoke_role, auth.user_revoke_role);
unary!(auth_role_add, auth.role_add);
unary!(auth_role_get, auth.role_get);
unary!(auth_role_list, auth.role_list);
unary!(auth_role_delete, auth.role_delete);
unary!(auth_role_grant_permission, auth.role_grant_permission);
unary!(auth_role_revoke_permission, auth.role_revoke_permission);

/// Routes that take one request, under each of [`PREFIXES`] (etcd's
/// google.api.http annotations).
pub(crate) const ROUTES: &[(&str, Route)] = &[
    ("kv/range", kv_range),
    ("kv/put", kv_put),
    ("kv/deleterange", kv_delete_range),
    ("kv/txn", kv_txn),
    ("kv/compaction", kv_compact),
    ("maintenance/alarm", maintenance_alarm),
    ("maintenance/status", maintenance_status),
    ("maintenance/defragment", maintenance_defragment),
    ("maintenance/hash", maintenance_hash),
    ("maintenance/snapshot", maintenance_snapshot),
    ("maintenance/transfer-leadership", maintenance_move_leader),
    ("maintenance/downgrade", maintenance_downgrade),
    ("cluster/member/add", cluster_member_add),
    ("cluster/member/remove", cluster_member_remove),
    ("cluster/member/update", cluster_member_update),
    ("cluster/member/list", cluster_member_list),
    ("cluster/member/promote", cluster_member_promote),
    ("lease/grant", lease_grant),
    ("lease/revoke", lease_revoke),
    ("kv/lease/revoke", lease_revoke),
    ("lease/timetolive", lease_time_to_live),
    ("kv/lease/timetolive", lease_time_to_live),
    ("lease/leases", lease_leases),
    ("kv/lease/leases", lease_leases),
    ("election/campaign", election_campaign),
    ("election/proclaim", election_proclaim),
    ("election/leader", election_leader),
    ("election/observe", election_observe),
    ("election/resign", election_resign),
    ("lock/lock", lock_lock),
    ("lock/unlock", lock_unlock),
    ("auth/enable", auth_enable),
    ("auth/disable", auth_disable),
    ("auth/status", auth_status),
    ("auth/authenticate", auth_authenticate),
    ("auth/user/add", auth_user_add),
    ("auth/user/get", auth_user_get),
    ("auth/user/list", auth_user_list),
    ("auth/user/delete", auth_user_delete),
    ("auth/user/changepw", auth_user_change_password),
    ("auth/user/grant", auth_user_grant_role),
    ("auth/user/revoke", auth_user_revoke_role),
    ("auth/role/add", auth_role_add),
    ("auth/role/get", auth_role_get),
    ("auth/role/list", auth_role_list),
    ("auth/role/delete", auth_role_delete),
    ("auth/role/grant", auth_role_grant_permission),
    ("auth/role/revoke", auth_role_revoke_permission),
];

fn open_watch(
    gateway: &Gateway,
    inbound: Inbound<api::etcdserverpb::WatchRequest>,
    credentials: Credentials,
) -> WatchStream {
    gateway.watch.open(inbound, false, credentials)
}

fn open_keep_alive(
    gateway: &Gateway,
    inbound: Inbound<api::etcdserverpb::LeaseKeepAliveRequest>,
    _: Credentials,
) -> KeepAliveStream {
    gateway.lease.open(inbound, false)
}

/// The HTTP status grpc-gateway v1 gives a gRPC code (HTTPStatusFromCode).
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The body of a failed call, etcd 3.5's field order.
pub(crate) fn error_body(status: &Status) -> String {
    let message = serde_json::to_string(status.message()).unwrap_or_else(|_| "\"\"".into());
    format!(
        "{{\"error\":{message},\"code\":{},\"message\":{message}}}",
        status.code() as i32
    )
}

fn json_response(status: StatusCode, body: String, from_grpc: bool) -> http::Response<Body> {
    let mut response = http::Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if from_grpc {
        headers.insert(
            "grpc-metadata-content-type",
            HeaderValue::from_static("application/grpc"),
        );
    }
    response
}

fn error_response(status: &Status) -> http::Response<Body> {
    json_response(http_status(status.code()), error_body(status), false)
}

/// The JSON value of a unary route's body, as grpc-gateway reads it: the
/// body's first JSON value (what follows it is not read), `null` for an
/// empty body, InvalidArgument for a body that is not JSON.
fn request_value(body: &[u8]) -> Result<Value, Status> {
    if json::nesting_depth(body) > json::MAX_DEPTH {
        // deeper than any txn the gRPC decoder takes (etcd's budget refuses it)
        return Err(api::rpctypes::TOO_MANY_OPS.status());
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    deserializer.disable_recursion_limit();
    match deserializer.into_iter().next() {
        None => Ok(Value::Null),
        Some(Ok(value)) => Ok(value),
        Some(Err(e)) => Err(Status::invalid_argument(json::syntax_error(body, &e))),
    }
}

enum BodyError {
    /// Longer than allowed: the bytes read when that showed.
    TooLong(usize),
    Read(String),
}

/// A request body of at most `max` bytes.
async fn read_body(mut body: Body, max: usize) -> Result<Vec<u8>, BodyError> {
    use http_body_util::BodyExt;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > max {
                return Err(BodyError::TooLong(bytes.len() + data.len()));
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

/// Serves one route that takes one request.
pub(crate) async fn serve_route(
    gateway: Arc<Gateway>,
    route: Route,
    request: http::Request<Body>,
) -> http::Response<Body> {
    if request.method() != Method::POST {
        return method_not_allowed(None);
    }
    let credentials = credentials(request.headers());
    let body = match read_body(request.into_body(), gateway.max_body()).await {
        Ok(body) => body,
        // etcd's gateway reads it all, and grpc-go then refuses its message
        Err(BodyError::TooLong(read)) => {
            return error_response(&reflect::too_large(read, gateway.max_message()))
        }
        Err(BodyError::Read(e)) => return error_response(&Status::invalid_argument(e)),
    };
    let value = match request_value(&body) {
        Ok(value) => value,
        Err(status) => return error_response(&status),
    };
    match route(&gateway, value, credentials).await {
        Ok(Answer::Message(json)) => json_response(StatusCode::OK, json, true),
        Ok(Answer::Lines(lines)) => lines_response(lines),
        Err(status) => error_response(&status),
    }
}

/// The routes a learner serves: what etcd's learners serve over gRPC,
/// which etcd's gateway calls (the KV service refuses a linearizable
/// range on a learner).
const LEARNER_ROUTES: &[&str] = &["kv/range", "maintenance/status", "maintenance/snapshot"];

/// etcd's answer on a learner to what it does not serve.
fn refused_on_learner(gateway: &Gateway, path: &str) -> Option<http::Response<Body>> {
    (gateway.server.is_learner() && !LEARNER_ROUTES.contains(&path))
        .then(|| error_response(&api::rpctypes::NOT_SUPPORTED_FOR_LEARNER.status()))
}

/// The gateway's routes, to merge into the client listener's router.
pub(crate) fn router(gateway: Arc<Gateway>) -> axum::Router {
    let mut router = axum::Router::new();
    for prefix in PREFIXES {
        for (path, route) in ROUTES {
            let gateway = gateway.clone();
            let route = *route;
            router = router.route(
                &format!("{prefix}{path}"),
                axum::routing::any(move |request: http::Request<Body>| {
                    let gateway = gateway.clone();
                    async move {
                        if let Some(refused) = refused_on_learner(&gateway, path) {
                            return refused;
                        }
                        serve_route(gateway, route, request).await
                    }
                }),
            );
        }
        let watch = gateway.clone();
        router = router.route(
            &format!("{prefix}watch"),
            axum::routing::any(move |request: http::Request<Body>| {
                let watch = watch.clone();
                async move {
                    if let Some(refused) = refused_on_learner(&watch, "watch") {
                        return refused;
                    }
                    serve_bidi(watch, request, open_watch).await
                }
            }),
        );
        let keep_alive = gateway.clone();
        router = router.route(
            &format!("{prefix}lease/keepalive"),
            axum::routing::any(move |request: http::Request<Body>| {
                let keep_alive = keep_alive.clone();
                async move {
                    if let Some(refused) = refused_on_learner(&keep_alive, "lease/keepalive") {
                        return refused;
                    }
                    serve_bidi(keep_alive, request, open_keep_alive).await
                }
            }),
        );
    }
    router
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_grpc_gateway_statuses() {
        assert_eq!(http_status(Code::InvalidArgument), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::OutOfRange), StatusCode::BAD_REQUEST);
        assert_eq!(
            http_status(Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            error_body(&Status::invalid_argument("etcdserver: key is not provided")),
            r#"{"error":"etcdserver: key is not provided","code":3,"message":"etcdserver: key is not provided"}"#
        );
    }
}
