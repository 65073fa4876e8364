//! go-grpc-prometheus's server counters, as etcd registers them:
//! grpc_server_started_total and grpc_server_handled_total, labeled
//! grpc_type / grpc_service / grpc_method (/ grpc_code), every series
//! created up front for every etcd method as InitializeMetrics does.
//!
//! A tower layer on the client listener counts each gRPC call: started
//! when the request arrives, handled when its status is known (in the
//! response headers for a trailers-only answer, else in the trailers at the
//! end of the body; a body dropped before its trailers is a call the client
//! canceled). Per call: one hash lookup of the path and two atomic adds.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame};
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// gRPC's codes by number, as go-grpc-prometheus prints them.
const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];
const CANCELED: usize = 1;
const UNKNOWN: usize = 2;

/// Every method etcd 3.5 serves on the client port: (service, method, type).
const METHODS: &[(&str, &str, &str)] = &[
    ("etcdserverpb.KV", "Range", "unary"),
    ("etcdserverpb.KV", "Put", "unary"),
    ("etcdserverpb.KV", "DeleteRange", "unary"),
    ("etcdserverpb.KV", "Txn", "unary"),
    ("etcdserverpb.KV", "Compact", "unary"),
    ("etcdserverpb.Watch", "Watch", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseGrant", "unary"),
    ("etcdserverpb.Lease", "LeaseRevoke", "unary"),
    ("etcdserverpb.Lease", "LeaseKeepAlive", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseTimeToLive", "unary"),
    ("etcdserverpb.Lease", "LeaseLeases", "unary"),
    ("etcdserverpb.Cluster", "MemberAdd", "unary"),
    ("etcdserverpb.Cluster", "MemberRemove", "unary"),
    ("etcdserverpb.Cluster", "MemberUpdate", "unary"),
    ("etcdserverpb.Cluster", "MemberList", "unary"),
    ("etcdserverpb.Cluster", "MemberPromote", "unary"),
    ("etcdserverpb.Maintenance", "Alarm", "unary"),
    ("etcdserverpb.Maintenance", "Status", "unary"),
    ("etcdserverpb.Maintenance", "Defragment", "unary"),
    ("etcdserverpb.Maintenance", "Hash", "unary"),
    ("etcdserverpb.Maintenance", "HashKV", "unary"),
    ("etcdserverpb.Maintenance", "Snapshot", "server_stream"),
    ("etcdserverpb.Maintenance", "MoveLeader", "unary"),
    ("etcdserverpb.Maintenance", "Downgrade", "unary"),
    ("etcdserverpb.Auth", "AuthEnable", "unary"),
    ("etcdserverpb.Auth", "AuthDisable", "unary"),
    ("etcdserverpb.Auth", "AuthStatus", "unary"),
    ("etcdserverpb.Auth", "Authenticate", "unary"),
    ("etcdserverpb.Auth", "UserAdd", "unary"),
    ("etcdserverpb.Auth", "UserGet", "unary"),
    ("etcdserverpb.Auth", "UserList", "unary"),
    ("etcdserverpb.Auth", "UserDelete", "unary"),
    ("etcdserverpb.Auth", "UserChangePassword", "unary"),
    ("etcdserverpb.Auth", "UserGrantRole", "unary"),
    ("etcdserverpb.Auth", "UserRevokeRole", "unary"),
    ("etcdserverpb.Auth", "RoleAdd", "unary"),
    ("etcdserverpb.Auth", "RoleGet", "unary"),
    ("etcdserverpb.Auth", "RoleList", "unary"),
    ("etcdserverpb.Auth", "RoleDelete", "unary"),
    ("etcdserverpb.Auth", "RoleGrantPermission", "unary"),
    ("etcdserverpb.Auth", "RoleRevokePermission", "unary"),
    ("v3electionpb.Election", "Campaign", "unary"),
    ("v3electionpb.Election", "Proclaim", "unary"),
    ("v3electionpb.Election", "Leader", "unary"),
    ("v3electionpb.Election", "Observe", "server_stream"),
    ("v3electionpb.Election", "Resign", "unary"),
    ("v3lockpb.Lock", "Lock", "unary"),
    ("v3lockpb.Lock", "Unlock", "unary"),
];

struct MethodCounters {
    started: IntCounter,
    handled: [IntCounter; CODES.len()],
}

/// The counters of every known method, by request path.
#[derive(Clone)]
pub struct GrpcMetrics {
    inner: Arc<Methods>,
}

struct Methods {
    index_by_path: HashMap<String, usize>,
    counters: Vec<MethodCounters>,
}

impl GrpcMetrics {
    pub(super) fn new(registry: &Registry) -> GrpcMetrics {
        let started = IntCounterVec::new(
            Opts::new(
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
            ),
            &["grpc_type", "grpc_service", "grpc_method"],
        )
        .expect("valid metric");
        let handled = IntCounterVec::new(
            Opts::new(
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
            ),
            &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
        )
        .expect("valid metric");
        let mut index_by_path = HashMap::with_capacity(METHODS.len());
        let mut counters = Vec::with_capacity(METHODS.len());
        for (service, method, kind) in METHODS {
            index_by_path.insert(format!("/{service}/{method}"), counters.len());
            counters.push(MethodCounters {
                started: started.with_label_values(&[kind, service, method]),
                handled: CODES
                    .map(|code| handled.with_label_values(&[kind, service, method, code])),
            });
        }
        registry
            .register(Box::new(started))
            .expect("metric registered once");
        registry
            .register(Box::new(handled))
            .expect("metric registered once");
        GrpcMetrics {
            inner: Arc::new(Methods {
                index_by_path,
                counters,
            }),
        }
    }

    /// A call to `path` began; None for a path that is no etcd method.
    fn start(&self, path: &str) -> Option<Call> {
        let index = *self.inner.index_by_path.get(path)?;
        self.inner.counters[index].started.inc();
        Some(Call {
            metrics: self.clone(),
            index,
        })
    }
}

/// A started call whose status is not yet known. Dropped unfinished, it
/// counts as Canceled (the client went away mid-call).
struct Call {
    metrics: GrpcMetrics,
    index: usize,
}

impl Call {
    fn finish(self, code: usize) {
        self.count(code);
        std::mem::forget(self);
    }

    fn count(&self, code: usize) {
        self.metrics.inner.counters[self.index].handled[code.min(CODES.len() - 1)].inc();
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.count(CANCELED);
    }
}

fn status_code(headers: &http::HeaderMap) -> Option<usize> {
    let code: usize = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    Some(if code < CODES.len() { code } else { UNKNOWN })
}

/// Counts the gRPC calls passing through; other requests pass untouched.
#[derive(Clone)]
pub struct GrpcMetricsLayer {
    metrics: GrpcMetrics,
}

impl GrpcMetricsLayer {
    pub fn new(metrics: GrpcMetrics) -> Self {
        GrpcMetricsLayer { metrics }
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: GrpcMetrics,
}

fn is_grpc<B>(request: &http::Request<B>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<CountedBody<ResBody>>;
    type Error = S::Error;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let call = if is_grpc(&request) {
            self.metrics.start(request.uri().path())
        } else {
            None
        };
        CountedFuture {
            inner: self.inner.call(request),
            call,
        }
    }
}

pin_project_lite::pin_project! {
    pub struct CountedFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

impl<F, B, E> Future for CountedFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<CountedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx));
        let mut call = this.call.take();
        Poll::Ready(response.map(|response| {
            if let Some(code) = status_code(response.headers()) {
                // Trailers-only: the status is already here.
                if let Some(call) = call.take() {
                    call.finish(code);
                }
            }
            response.map(|inner| CountedBody { inner, call })
        }))
    }
}

pin_project_lite::pin_project! {
    pub struct CountedBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }
}

impl<B: Body> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    if let Some(call) = this.call.take() {
                        call.finish(status_code(trailers).unwrap_or(UNKNOWN));
                    }
                }
            }
            Some(Err(_)) => {
                if let Some(call) = this.call.take() {
                    call.finish(UNKNOWN);
                }
            }
            None => {
                if let Some(call) = this.call.take() {
                    call.finish(UNKNOWN);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
