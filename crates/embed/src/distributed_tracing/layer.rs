//! The span of each gRPC request, as otelgrpc 0.46's server interceptors
//! (the unary and the stream one alike) make it in etcd:
//!
//! - the parent is the request's W3C `traceparent` (and `tracestate`),
//!   parsed as OpenTelemetry Go 1.20's TraceContext propagator does;
//! - the name is the full method without its leading slash
//!   (`etcdserverpb.KV/Range`), the kind is server, the attributes are
//!   `rpc.system` = `grpc`, `rpc.service`, `rpc.method`, the client's
//!   `net.sock.peer.addr` and `net.sock.peer.port` (TCP clients), and at the
//!   end `rpc.grpc.status_code`;
//! - the status is Error (with the gRPC message) for Unknown,
//!   DeadlineExceeded, Unimplemented, Internal, Unavailable and DataLoss,
//!   else unset;
//! - the span covers the call: it ends when the status is sent (the
//!   trailers, or a trailers-only answer), so a stream's span (Watch,
//!   LeaseKeepAlive, Snapshot, Observe) ends when the stream does; a call
//!   the client abandons ends as Canceled.
//!
//! Only the methods etcd serves get a span (grpc-go runs no interceptor for
//! an unknown method), and only gRPC requests.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SdkTracer, Span};

/// gRPC's codes for which otelgrpc's serverStatus sets an Error status:
/// Unknown, DeadlineExceeded, Unimplemented, Internal, Unavailable,
/// DataLoss.
const ERROR_CODES: [i64; 6] = [2, 4, 12, 13, 14, 15];
const CANCELED: i64 = 1;
const UNKNOWN: i64 = 2;

/// Records a span for each gRPC request to an etcd method.
#[derive(Clone)]
pub(crate) struct RequestTracingLayer {
    shared: Arc<Shared>,
}

struct Shared {
    tracer: SdkTracer,
    /// By request path (`/etcdserverpb.KV/Range`).
    methods: HashMap<String, MethodNames>,
    /// Whether a request without a sampled parent can be sampled at all
    /// (a sampling rate above 0).
    samples_roots: bool,
}

struct MethodNames {
    /// The span's name: the path without its leading slash.
    span: String,
    service: &'static str,
    method: &'static str,
}

impl RequestTracingLayer {
    pub(super) fn new(tracer: SdkTracer, sampling_rate_per_million: u32) -> Self {
        let methods = etcdserver::metrics::grpc::METHODS
            .iter()
            .map(|(service, method, _)| {
                let span = format!("{service}/{method}");
                let names = MethodNames {
                    span: span.clone(),
                    service,
                    method,
                };
                (format!("/{span}"), names)
            })
            .collect();
        RequestTracingLayer {
            shared: Arc::new(Shared {
                tracer,
                methods,
                samples_roots: sampling_rate_per_million > 0,
            }),
        }
    }
}

impl Shared {
    /// The request's span, if it is sampled.
    fn start<B>(&self, request: &http::Request<B>) -> Option<Span> {
        if !is_grpc(request) {
            return None;
        }
        let names = self.methods.get(request.uri().path())?;
        let parent = remote_parent(request.headers());
        // ParentBased(NeverSample): without a sampled parent nothing is
        // recorded, known here without asking the SDK
        if !self.samples_roots && !parent.as_ref().is_some_and(SpanContext::is_sampled) {
            return None;
        }
        let context = match parent {
            Some(parent) => opentelemetry::Context::new().with_remote_span_context(parent),
            None => opentelemetry::Context::new(),
        };
        let mut attributes = Vec::with_capacity(6);
        attributes.push(KeyValue::new("rpc.system", "grpc"));
        attributes.push(KeyValue::new("rpc.service", names.service));
        attributes.push(KeyValue::new("rpc.method", names.method));
        if let Some(peer) = peer_addr(request.extensions()) {
            attributes.push(KeyValue::new("net.sock.peer.addr", peer.ip().to_string()));
            attributes.push(KeyValue::new("net.sock.peer.port", i64::from(peer.port())));
        }
        let span = self
            .tracer
            .span_builder(names.span.clone())
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &context);
        span.is_recording().then_some(span)
    }
}

fn is_grpc<B>(request: &http::Request<B>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The client's TCP address (plain or TLS); None on a Unix socket, where
/// otelgrpc finds no host and port either.
fn peer_addr(extensions: &http::Extensions) -> Option<std::net::SocketAddr> {
    if let Some(info) = extensions.get::<crate::listeners::ClientConnectInfo>() {
        return match info {
            crate::listeners::ClientConnectInfo::Tcp(tcp) => tcp.remote_addr(),
            crate::listeners::ClientConnectInfo::Unix(_) => None,
        };
    }
    extensions
        .get::<v3rpc::TlsConnectInfo>()
        .and_then(|tls| tls.remote_addr)
}

/// The remote parent named by `traceparent`, as OpenTelemetry Go 1.20's
/// TraceContext.extract reads it: `^([0-9a-f]{2})-([a-f0-9]{32})-
/// ([a-f0-9]{16})-([a-f0-9]{2})(?:-.*)?$`, version ff refused, version 00
/// with flags above 02 refused, an all-zero trace or span id refused; only
/// the sampled flag is kept. A `tracestate` that does not parse is dropped,
/// the parent kept.
fn remote_parent(headers: &http::HeaderMap) -> Option<SpanContext> {
    let value = headers.get("traceparent")?.as_bytes();
    let field = |from: usize, len: usize| -> Option<&[u8]> {
        let part = value.get(from..from + len)?;
        part.iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            .then_some(part)
    };
    let version = hex_u8(field(0, 2)?)?;
    let trace_id = field(3, 32)?;
    let span_id = field(36, 16)?;
    let flags = hex_u8(field(53, 2)?)?;
    let dashes = [2, 35, 52].iter().all(|&i| value[i] == b'-');
    // `(?:-.*)?$`: the end, or a dash and anything but a newline
    let rest = &value[55..];
    let rest_ok = rest.is_empty() || (rest[0] == b'-' && !rest.contains(&b'\n'));
    if !dashes || !rest_ok || version == 0xff || (version == 0 && flags > 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(std::str::from_utf8(trace_id).ok()?).ok()?;
    let span_id = SpanId::from_hex(std::str::from_utf8(span_id).ok()?).ok()?;
    let trace_state = headers
        .get("tracestate")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<TraceState>().ok())
        .unwrap_or_default();
    let parent = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        trace_state,
    );
    parent.is_valid().then_some(parent)
}

fn hex_u8(digits: &[u8]) -> Option<u8> {
    u8::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

/// The gRPC status in `headers` (response headers of a trailers-only
/// answer, or trailers): the code and the percent-decoded message.
fn grpc_status(headers: &http::HeaderMap) -> Option<(i64, String)> {
    let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .map(|v| percent_decode(v.as_bytes()))
        .unwrap_or_default();
    Some((code, message))
}

/// gRPC's percent-encoding of grpc-message.
fn percent_decode(encoded: &[u8]) -> String {
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut i = 0;
    while i < encoded.len() {
        let decoded = (encoded[i] == b'%')
            .then(|| encoded.get(i + 1..i + 3))
            .flatten()
            .and_then(hex_u8);
        match decoded {
            Some(byte) => {
                bytes.push(byte);
                i += 3;
            }
            None => {
                bytes.push(encoded[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A recording span not yet ended; dropped unfinished (the client went
/// away mid-call), it ends as Canceled.
struct OpenSpan(Option<Span>);

impl OpenSpan {
    fn finish(&mut self, code: i64, message: String) {
        if let Some(mut span) = self.0.take() {
            span.set_attribute(KeyValue::new("rpc.grpc.status_code", code));
            if ERROR_CODES.contains(&code) {
                span.set_status(Status::error(message));
            }
            span.end();
        }
    }
}

impl Drop for OpenSpan {
    fn drop(&mut self) {
        self.finish(CANCELED, String::new());
    }
}

impl<S> tower::Layer<S> for RequestTracingLayer {
    type Service = RequestTracingService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestTracingService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct RequestTracingService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for RequestTracingService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<TracedBody<ResBody>>;
    type Error = S::Error;
    type Future = TracedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let span = self.shared.start(&request);
        TracedFuture {
            inner: self.inner.call(request),
            span: span.map(|span| OpenSpan(Some(span))),
        }
    }
}

pin_project_lite::pin_project! {
    pub(crate) struct TracedFuture<F> {
        #[pin]
        inner: F,
        span: Option<OpenSpan>,
    }
}

impl<F, B, E> Future for TracedFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<TracedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx));
        let mut span = this.span.take();
        Poll::Ready(match response {
            Ok(response) => {
                if let Some((code, message)) = grpc_status(response.headers()) {
                    // trailers-only: the status is already here
                    if let Some(mut span) = span.take() {
                        span.finish(code, message);
                    }
                }
                Ok(response.map(|inner| TracedBody { inner, span }))
            }
            Err(e) => {
                if let Some(mut span) = span {
                    span.finish(UNKNOWN, String::new());
                }
                Err(e)
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body whose trailers end the request's span.
    pub(crate) struct TracedBody<B> {
        #[pin]
        inner: B,
        span: Option<OpenSpan>,
    }
}

impl<B: Body> Body for TracedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(span) = this.span.as_mut() {
            match &frame {
                Some(Ok(frame)) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        let (code, message) =
                            grpc_status(trailers).unwrap_or((UNKNOWN, String::new()));
                        span.finish(code, message);
                    }
                }
                Some(Err(_)) | None => span.finish(UNKNOWN, String::new()),
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
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::{BodyExt as _, StreamBody};
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{
        Sampler, SdkTracerProvider, SimpleSpanProcessor, SpanData, SpanExporter,
    };
    use tower::Layer as _;

    use super::*;

    fn parent(traceparent: &str) -> Option<SpanContext> {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", traceparent.parse().unwrap());
        remote_parent(&headers)
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn traceparent_is_read_as_opentelemetry_go_reads_it() {
        let sampled = parent(&format!("00-{TRACE}-{SPAN}-01")).unwrap();
        assert!(sampled.is_sampled() && sampled.is_remote());
        assert_eq!(sampled.trace_id().to_string(), TRACE);
        assert_eq!(sampled.span_id().to_string(), SPAN);
        assert!(!parent(&format!("00-{TRACE}-{SPAN}-00"))
            .unwrap()
            .is_sampled());
        // flags other than sampled are cleared; a later version may carry more
        assert!(parent(&format!("00-{TRACE}-{SPAN}-02")).is_some_and(|p| !p.is_sampled()));
        assert!(parent(&format!("01-{TRACE}-{SPAN}-09-more")).is_some_and(|p| p.is_sampled()));
        // Go's expression lets version 00 have a tail too
        assert!(parent(&format!("00-{TRACE}-{SPAN}-01-x")).is_some());
    }

    #[test]
    fn a_traceparent_go_refuses_names_no_parent() {
        for bad in [
            format!("ff-{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}-03"),
            format!("00-{}-{SPAN}-01", TRACE.to_uppercase()),
            format!("00-{TRACE}-{SPAN}-01x"),
            format!("00-{}-{SPAN}-01", "0".repeat(32)),
            format!("00-{TRACE}-{}-01", "0".repeat(16)),
            format!("00-{}-{SPAN}-01", &TRACE[1..]),
            format!("00_{TRACE}-{SPAN}-01"),
            format!("0-{TRACE}-{SPAN}-01"),
            String::new(),
        ] {
            assert!(parent(&bad).is_none(), "{bad:?}");
        }
    }

    /// Keeps every span the SDK ends.
    #[derive(Clone, Debug, Default)]
    struct Ended(Arc<std::sync::Mutex<Vec<SpanData>>>);

    impl SpanExporter for Ended {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    impl Ended {
        fn spans(&self) -> Vec<SpanData> {
            self.0.lock().unwrap().clone()
        }
    }

    /// A layer as etcd's sampler configures it at `rate`, ending spans
    /// into the returned list at once.
    fn layer(rate: u32) -> (RequestTracingLayer, Ended, SdkTracerProvider) {
        let ended = Ended::default();
        let root = match rate {
            0 => Sampler::AlwaysOff,
            rate => Sampler::TraceIdRatioBased(f64::from(rate) / 1e6),
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(ended.clone()))
            .with_sampler(Sampler::ParentBased(Box::new(root)))
            .build();
        let tracer = provider.tracer("test");
        (RequestTracingLayer::new(tracer, rate), ended, provider)
    }

    type TestBody =
        StreamBody<tokio_stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

    fn trailers(code: &str, message: Option<&str>) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        map.insert("grpc-status", code.parse().unwrap());
        if let Some(message) = message {
            map.insert("grpc-message", message.parse().unwrap());
        }
        map
    }

    fn request(path: &str, traceparent: Option<&str>) -> http::Request<()> {
        let mut request = http::Request::builder()
            .uri(format!("http://127.0.0.1:2379{path}"))
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        if let Some(traceparent) = traceparent {
            request
                .headers_mut()
                .insert("traceparent", traceparent.parse().unwrap());
        }
        request.extensions_mut().insert(v3rpc::TlsConnectInfo {
            remote_addr: Some("127.0.0.1:40000".parse().unwrap()),
            common_name: None,
        });
        request
    }

    /// Calls the traced service with `request`; the inner service answers
    /// with `headers` (a trailers-only status, if any) and `frames`.
    async fn call(
        layer: &RequestTracingLayer,
        request: http::Request<()>,
        headers: Option<http::HeaderMap>,
        frames: Vec<Frame<Bytes>>,
    ) -> http::Response<TracedBody<TestBody>> {
        let inner = tower::service_fn(move |_: http::Request<()>| {
            let headers = headers.clone();
            let frames: Vec<Result<Frame<Bytes>, Infallible>> =
                frames.iter().map(|f| Ok(clone_frame(f))).collect();
            async move {
                let mut response = http::Response::new(StreamBody::new(tokio_stream::iter(frames)));
                if let Some(headers) = headers {
                    response.headers_mut().extend(headers);
                }
                Ok::<_, Infallible>(response)
            }
        });
        tower::ServiceExt::oneshot(layer.layer(inner), request)
            .await
            .unwrap()
    }

    fn clone_frame(frame: &Frame<Bytes>) -> Frame<Bytes> {
        match (frame.data_ref(), frame.trailers_ref()) {
            (Some(data), _) => Frame::data(data.clone()),
            (_, Some(trailers)) => Frame::trailers(trailers.clone()),
            _ => unreachable!("a frame is data or trailers"),
        }
    }

    fn int(span: &SpanData, key: &str) -> Option<i64> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .and_then(|kv| match kv.value {
                opentelemetry::Value::I64(i) => Some(i),
                _ => None,
            })
    }

    fn text(span: &SpanData, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.as_str().into_owned())
    }

    #[tokio::test]
    async fn a_sampled_parents_call_is_one_server_span_ended_by_its_trailers() {
        let (layer, ended, _provider) = layer(0);
        let parent = format!("00-{TRACE}-{SPAN}-01");
        let response = call(
            &layer,
            request("/etcdserverpb.KV/Range", Some(&parent)),
            None,
            vec![
                Frame::data(Bytes::from_static(b"\0\0\0\0\0")),
                Frame::trailers(trailers("0", None)),
            ],
        )
        .await;
        // the answer is not sent yet: the span is open
        assert!(ended.spans().is_empty());
        response.into_body().collect().await.unwrap();
        let spans = ended.spans();
        assert_eq!(spans.len(), 1);
        let span = &spans[0];
        assert_eq!(span.name, "etcdserverpb.KV/Range");
        assert_eq!(span.span_kind, SpanKind::Server);
        assert_eq!(span.span_context.trace_id().to_string(), TRACE);
        assert_eq!(span.parent_span_id.to_string(), SPAN);
        assert!(span.parent_span_is_remote);
        assert_eq!(text(span, "rpc.system").as_deref(), Some("grpc"));
        assert_eq!(
            text(span, "rpc.service").as_deref(),
            Some("etcdserverpb.KV")
        );
        assert_eq!(text(span, "rpc.method").as_deref(), Some("Range"));
        assert_eq!(
            text(span, "net.sock.peer.addr").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(int(span, "net.sock.peer.port"), Some(40000));
        assert_eq!(int(span, "rpc.grpc.status_code"), Some(0));
        assert_eq!(span.status, Status::Unset);
    }

    #[tokio::test]
    async fn the_codes_otelgrpc_counts_as_server_errors_set_an_error_status() {
        let (layer, ended, _provider) = layer(1_000_000);
        // trailers-only: Unavailable is an error, its message the description
        let response = call(
            &layer,
            request("/etcdserverpb.KV/Put", None),
            Some(trailers("14", Some("etcdserver: no leader%21"))),
            vec![],
        )
        .await;
        drop(response);
        // NotFound is the client's doing: no error status
        call(
            &layer,
            request("/etcdserverpb.Cluster/MemberRemove", None),
            Some(trailers("5", Some("etcdserver: member not found"))),
            vec![],
        )
        .await;
        let spans = ended.spans();
        assert_eq!(spans.len(), 2);
        assert_eq!(int(&spans[0], "rpc.grpc.status_code"), Some(14));
        assert_eq!(spans[0].status, Status::error("etcdserver: no leader!"));
        assert_eq!(int(&spans[1], "rpc.grpc.status_code"), Some(5));
        assert_eq!(spans[1].status, Status::Unset);
        // a root span at a rate of a million
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID);
    }

    #[tokio::test]
    async fn a_stream_the_client_abandons_ends_as_canceled() {
        let (layer, ended, _provider) = layer(1_000_000);
        let response = call(
            &layer,
            request("/etcdserverpb.Watch/Watch", None),
            None,
            vec![Frame::data(Bytes::from_static(b"\0\0\0\0\0"))],
        )
        .await;
        let mut body = response.into_body();
        body.frame().await.unwrap().unwrap();
        assert!(ended.spans().is_empty(), "the stream is still open");
        drop(body);
        let spans = ended.spans();
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].name, "etcdserverpb.Watch/Watch");
        assert_eq!(int(&spans[0], "rpc.grpc.status_code"), Some(1));
        assert_eq!(spans[0].status, Status::Unset);
    }

    #[tokio::test]
    async fn what_etcd_would_not_trace_gets_no_span() {
        let (layer, ended, _provider) = layer(0);
        let sampled = format!("00-{TRACE}-{SPAN}-01");
        let done = || Some(trailers("0", None));
        // rate 0: no parent, or a parent not sampled
        call(
            &layer,
            request("/etcdserverpb.KV/Range", None),
            done(),
            vec![],
        )
        .await;
        let unsampled = format!("00-{TRACE}-{SPAN}-00");
        call(
            &layer,
            request("/etcdserverpb.KV/Range", Some(&unsampled)),
            done(),
            vec![],
        )
        .await;
        // a method etcd does not serve, and a request that is not gRPC
        call(
            &layer,
            request("/etcdserverpb.KV/Nope", Some(&sampled)),
            done(),
            vec![],
        )
        .await;
        let mut json = request("/etcdserverpb.KV/Range", Some(&sampled));
        json.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        call(&layer, json, done(), vec![]).await;
        assert!(ended.spans().is_empty());
        // at any rate a parent that is not sampled is followed
        let (layer, ended, _provider) = self::layer(1_000_000);
        call(
            &layer,
            request("/etcdserverpb.KV/Range", Some(&unsampled)),
            done(),
            vec![],
        )
        .await;
        assert!(ended.spans().is_empty());
        call(
            &layer,
            request("/etcdserverpb.KV/Range", None),
            done(),
            vec![],
        )
        .await;
        assert_eq!(ended.spans().len(), 1);
    }

    #[test]
    fn grpc_message_is_percent_decoded() {
        assert_eq!(
            percent_decode(b"etcdserver: key not found%0Aand 100%25"),
            "etcdserver: key not found\nand 100%"
        );
        assert_eq!(percent_decode(b"100%"), "100%");
    }
}
