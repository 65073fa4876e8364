//! go-grpc-prometheus's server metrics, as etcd registers them:
//! grpc_server_started_total, grpc_server_handled_total,
//! grpc_server_msg_received_total and grpc_server_msg_sent_total, labeled
//! grpc_type / grpc_service / grpc_method (/ grpc_code), every series
//! created up front for every etcd method as InitializeMetrics does; with
//! `--metrics extensive`, grpc_server_handling_seconds too. Beside them
//! etcd's etcd_network_client_grpc_{received,sent}_bytes_total (message
//! payload bytes, what etcd counts with proto.Size).
//!
//! A tower layer on the client listener counts each gRPC call: started
//! when the request arrives, handled when its status is known (in the
//! response headers for a trailers-only answer, else in the trailers at the
//! end of the body; a body dropped before its trailers is a call the client
//! canceled). Messages are counted as they complete in the request and
//! response bodies by following gRPC's length-prefixed framing
//! ([`MessageFraming`]). Per call: one hash lookup of the path and a few
//! atomic adds per message.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Buf;
use http_body::{Body, Frame};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};

/// gRPC's codes by number, as go-grpc-prometheus prints them.
pub const CODES: [&str; 17] = [
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
pub const METHODS: &[(&str, &str, &str)] = &[
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

/// prometheus.DefBuckets, go-grpc-prometheus's default for the handling
/// time histogram.
const HANDLING_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

struct MethodCounters {
    started: IntCounter,
    handled: [IntCounter; CODES.len()],
    msg_received: IntCounter,
    msg_sent: IntCounter,
    /// Only with `--metrics extensive`.
    handling: Option<Histogram>,
}

/// The counters of every known method, by request path.
#[derive(Clone)]
pub struct GrpcMetrics {
    inner: Arc<Methods>,
}

struct Methods {
    index_by_path: HashMap<String, usize>,
    counters: Vec<MethodCounters>,
    /// etcd_server_client_requests_total{type, client_api_version}.
    client_requests: IntCounterVec,
    received_bytes: IntCounter,
    sent_bytes: IntCounter,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: &T) {
    registry
        .register(Box::new(metric.clone()))
        .expect("metric registered once");
}

impl GrpcMetrics {
    /// `extensive`: also the handling time histogram (`--metrics extensive`).
    pub(super) fn new(registry: &Registry, extensive: bool) -> GrpcMetrics {
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
        let labels = &["grpc_type", "grpc_service", "grpc_method"];
        let msg_received = IntCounterVec::new(
            Opts::new(
                "grpc_server_msg_received_total",
                "Total number of RPC stream messages received on the server.",
            ),
            labels,
        )
        .expect("valid metric");
        let msg_sent = IntCounterVec::new(
            Opts::new(
                "grpc_server_msg_sent_total",
                "Total number of gRPC stream messages sent by the server.",
            ),
            labels,
        )
        .expect("valid metric");
        let handling = extensive.then(|| {
            HistogramVec::new(
                HistogramOpts::new(
                    "grpc_server_handling_seconds",
                    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
                )
                .buckets(HANDLING_BUCKETS.to_vec()),
                labels,
            )
            .expect("valid metric")
        });
        let received_bytes = IntCounter::new(
            "etcd_network_client_grpc_received_bytes_total",
            "The total number of bytes received from grpc clients.",
        )
        .expect("valid metric");
        let sent_bytes = IntCounter::new(
            "etcd_network_client_grpc_sent_bytes_total",
            "The total number of bytes sent to grpc clients.",
        )
        .expect("valid metric");
        let client_requests = IntCounterVec::new(
            Opts::new(
                "etcd_server_client_requests_total",
                "The total number of client requests per client version.",
            ),
            &["type", "client_api_version"],
        )
        .expect("valid metric");
        let mut index_by_path = HashMap::with_capacity(METHODS.len());
        let mut counters = Vec::with_capacity(METHODS.len());
        for (service, method, kind) in METHODS {
            let method_labels = [*kind, service, method];
            index_by_path.insert(format!("/{service}/{method}"), counters.len());
            counters.push(MethodCounters {
                started: started.with_label_values(&method_labels),
                handled: CODES
                    .map(|code| handled.with_label_values(&[kind, service, method, code])),
                msg_received: msg_received.with_label_values(&method_labels),
                msg_sent: msg_sent.with_label_values(&method_labels),
                handling: handling
                    .as_ref()
                    .map(|h| h.with_label_values(&method_labels)),
            });
        }
        register(registry, &started);
        register(registry, &handled);
        register(registry, &msg_received);
        register(registry, &msg_sent);
        if let Some(handling) = &handling {
            register(registry, handling);
        }
        register(registry, &received_bytes);
        register(registry, &sent_bytes);
        register(registry, &client_requests);
        GrpcMetrics {
            inner: Arc::new(Methods {
                index_by_path,
                counters,
                client_requests,
                received_bytes,
                sent_bytes,
            }),
        }
    }

    fn counters(&self, index: usize) -> &MethodCounters {
        &self.inner.counters[index]
    }

    /// A call to `path` began; None for a path that is no etcd method.
    fn start(&self, path: &str, headers: &http::HeaderMap) -> Option<Call> {
        let index = *self.inner.index_by_path.get(path)?;
        let counters = self.counters(index);
        counters.started.inc();
        let kind = match METHODS[index].2 {
            "unary" => "unary",
            _ => "stream",
        };
        self.inner
            .client_requests
            .with_label_values(&[kind, client_api_version(headers)])
            .inc();
        Some(Call {
            metrics: self.clone(),
            index,
            started: counters.handling.as_ref().map(|_| Instant::now()),
        })
    }

    fn received(&self, index: usize, messages: u64, bytes: u64) {
        self.counters(index).msg_received.inc_by(messages);
        self.inner.received_bytes.inc_by(bytes);
    }

    fn sent(&self, index: usize, messages: u64, bytes: u64) {
        self.counters(index).msg_sent.inc_by(messages);
        self.inner.sent_bytes.inc_by(bytes);
    }
}

/// The `client-api-version` metadata etcd's clients send (clientv3 sends
/// its major.minor, e.g. "3.5"), as etcd's interceptors label
/// etcd_server_client_requests_total with it; "unknown" without one. etcd
/// takes any value; here only a short version-shaped one becomes a label
/// value, so that a client cannot grow the series without bound.
fn client_api_version(headers: &http::HeaderMap) -> &str {
    const MAX_VERSION_BYTES: usize = 16;
    match headers.get("client-api-version").map(|v| v.as_bytes()) {
        Some(v)
            if !v.is_empty()
                && v.len() <= MAX_VERSION_BYTES
                && v.iter().all(|b| b.is_ascii_digit() || *b == b'.') =>
        {
            std::str::from_utf8(v).unwrap_or("unknown")
        }
        _ => "unknown",
    }
}

/// Follows gRPC's framing (a 1-byte compressed flag and a 4-byte big-endian
/// length before each message) across body chunks of any size, counting the
/// messages that complete and their payload bytes.
#[derive(Default)]
struct MessageFraming {
    header: [u8; 5],
    /// Header bytes seen of the current message (5: in its payload).
    header_seen: usize,
    /// The current message's payload length, and how much of it is still to come.
    payload_len: u64,
    payload_left: u64,
}

impl MessageFraming {
    /// Consumes one chunk; returns (messages completed, their payload bytes).
    fn push(&mut self, mut chunk: &[u8]) -> (u64, u64) {
        let (mut messages, mut bytes) = (0, 0);
        while !chunk.is_empty() {
            if self.header_seen < self.header.len() {
                let take = (self.header.len() - self.header_seen).min(chunk.len());
                self.header[self.header_seen..self.header_seen + take]
                    .copy_from_slice(&chunk[..take]);
                self.header_seen += take;
                chunk = &chunk[take..];
                if self.header_seen < self.header.len() {
                    break;
                }
                let [_, a, b, c, d] = self.header;
                self.payload_len = u64::from(u32::from_be_bytes([a, b, c, d]));
                self.payload_left = self.payload_len;
            }
            let take = self.payload_left.min(chunk.len() as u64);
            self.payload_left -= take;
            chunk = &chunk[take as usize..];
            if self.payload_left == 0 {
                messages += 1;
                bytes += self.payload_len;
                self.header_seen = 0;
            }
        }
        (messages, bytes)
    }
}

/// A started call whose status is not yet known. Dropped unfinished, it
/// counts as Canceled (the client went away mid-call).
struct Call {
    metrics: GrpcMetrics,
    index: usize,
    /// When the call started, if its handling time is observed.
    started: Option<Instant>,
}

impl Call {
    fn finish(self, code: usize) {
        self.count(code);
        std::mem::forget(self);
    }

    fn count(&self, code: usize) {
        let counters = self.metrics.counters(self.index);
        counters.handled[code.min(CODES.len() - 1)].inc();
        if let (Some(histogram), Some(started)) = (&counters.handling, self.started) {
            histogram.observe(started.elapsed().as_secs_f64());
        }
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

impl<S, ResBody> tower::Service<http::Request<tonic::body::Body>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<CountedBody<ResBody>>;
    type Error = S::Error;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let call = if is_grpc(&request) {
            self.metrics.start(request.uri().path(), request.headers())
        } else {
            None
        };
        let request = match &call {
            Some(call) => {
                let (metrics, index) = (call.metrics.clone(), call.index);
                request.map(|body| {
                    tonic::body::Body::new(CountedRequestBody {
                        inner: body,
                        framing: MessageFraming::default(),
                        metrics,
                        index,
                    })
                })
            }
            None => request,
        };
        CountedFuture {
            inner: self.inner.call(request),
            call,
        }
    }
}

pin_project_lite::pin_project! {
    /// A gRPC request body whose messages are counted as they arrive.
    pub(crate) struct CountedRequestBody<B> {
        #[pin]
        inner: B,
        framing: MessageFraming,
        metrics: GrpcMetrics,
        index: usize,
    }
}

impl<B: Body<Data = bytes::Bytes>> Body for CountedRequestBody<B> {
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(Ok(frame)) = &frame {
            if let Some(data) = frame.data_ref() {
                let (messages, bytes) = this.framing.push(data);
                if messages > 0 {
                    this.metrics.received(*this.index, messages, bytes);
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
            response.map(|inner| CountedBody {
                inner,
                call,
                framing: MessageFraming::default(),
            })
        }))
    }
}

pin_project_lite::pin_project! {
    pub struct CountedBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
        framing: MessageFraming,
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
                if let (Some(data), Some(call)) = (frame.data_ref(), this.call.as_ref()) {
                    let (messages, bytes) = this.framing.push(data.chunk());
                    if messages > 0 {
                        call.metrics.sent(call.index, messages, bytes);
                    }
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for payload in payloads {
            out.push(0);
            out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            out.extend_from_slice(payload);
        }
        out
    }

    #[test]
    fn framing_counts_messages_split_anywhere() {
        let wire = framed(&[b"hello", b"", b"0123456789"]);
        for split in 0..=wire.len() {
            let mut framing = MessageFraming::default();
            let (m1, b1) = framing.push(&wire[..split]);
            let (m2, b2) = framing.push(&wire[split..]);
            assert_eq!((m1 + m2, b1 + b2), (3, 15), "split at {split}");
        }
        let mut framing = MessageFraming::default();
        let total = wire
            .iter()
            .map(|b| framing.push(std::slice::from_ref(b)))
            .fold((0, 0), |acc, (m, b)| (acc.0 + m, acc.1 + b));
        assert_eq!(total, (3, 15));
    }

    #[test]
    fn a_message_is_counted_only_once_complete() {
        let wire = framed(&[b"abcdef"]);
        let mut framing = MessageFraming::default();
        assert_eq!(framing.push(&wire[..8]), (0, 0));
        assert_eq!(framing.push(&wire[8..]), (1, 6));
    }
}
