//! Where tonic's own answers differ from grpc-go's (and so from etcd's),
//! rewritten on the way out, so clients see etcd's code and message; and
//! the gate in front of the gRPC services ([`GrpcGuardLayer`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::Either;

/// The path prefixes of the gRPC services on the client port.
const GRPC_PACKAGES: &[&str] = &["/etcdserverpb.", "/v3electionpb.", "/v3lockpb."];

/// grpc-go's test of a gRPC request's content type: `application/grpc`,
/// alone or followed by `+subtype` or `;parameters`.
pub(crate) fn is_grpc_content_type(value: &[u8]) -> bool {
    match value.strip_prefix(b"application/grpc") {
        Some(rest) => rest.is_empty() || rest[0] == b'+' || rest[0] == b';',
        None => false,
    }
}

/// Only a gRPC request reaches the gRPC services, as in etcd, where the
/// client port hands HTTP/2 to grpc-go and HTTP/1.x to its HTTP mux:
///
/// * HTTP/1.x to a gRPC path: the HTTP mux's 404 ("404 page not found");
/// * HTTP/2 to a gRPC path without a gRPC content type: grpc-go's 415 with
///   `grpc-status: 3` and `invalid gRPC request content-type "..."`
///   (etcd 3.5.16; 3.5.1's grpc-go reset the stream);
/// * a gRPC call to a method or service that does not exist: grpc-go's
///   Unimplemented `unknown method M for service S` / `unknown service S`
///   (tonic answers without a message);
/// * a call whose deadline (`grpc-timeout`) passes before it is answered:
///   DeadlineExceeded `context deadline exceeded`, as etcd's handlers
///   answer (tonic's own timer, outside every layer, answers CANCELLED
///   "Timeout expired"; ours fires [`DEADLINE_MARGIN`] before it).
///
/// Without it a browser's "simple request" (HTTP/1.1, `text/plain`) to
/// `/etcdserverpb.KV/Put` wrote a key.
///
/// On a learner it lets through only what etcd's learners serve (etcd's
/// interceptors, v3rpc/interceptor.go and util.go): Status, Range (the
/// KV service refuses a linearizable one) and the Snapshot stream; any
/// other call gets Unavailable `etcdserver: rpc not supported for
/// learner`, so that a client moves on to another endpoint.
#[derive(Clone, Default)]
pub(crate) struct GrpcGuardLayer {
    /// Whether this member is a learner now (None: never).
    pub(crate) is_learner: Option<IsLearner>,
}

/// Tells whether the member is a learner at this moment.
pub(crate) type IsLearner = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;

impl<S> tower::Layer<S> for GrpcGuardLayer {
    type Service = GrpcGuard<S>;

    fn layer(&self, inner: S) -> GrpcGuard<S> {
        GrpcGuard {
            inner,
            is_learner: self.is_learner.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct GrpcGuard<S> {
    inner: S,
    is_learner: Option<IsLearner>,
}

/// The calls a learner serves (etcd's isRPCSupportedForLearner: Status and
/// serializable Range; of the streams, Snapshot).
const LEARNER_CALLS: &[&str] = &[
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.KV/Range",
    "/etcdserverpb.Maintenance/Snapshot",
];

/// A learner's answer to a call it does not serve.
fn not_supported_for_learner() -> Refusal {
    let mut response = http::Response::new(axum::body::Body::empty());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", http::HeaderValue::from_static("14"));
    headers.insert(
        "grpc-message",
        http::HeaderValue::from_static("etcdserver: rpc not supported for learner"),
    );
    response
}

type Refusal = http::Response<axum::body::Body>;

/// How much earlier than tonic's timer for the same `grpc-timeout` ours
/// fires. Ours is made first and polled first (tonic's timeout layer makes
/// its timer after calling in, and polls the call before its timer), so
/// this only guards against the two landing in different millisecond
/// ticks of tokio's timer wheel. A deadline no longer than this is
/// exceeded at once, without running the call, as in etcd, whose handlers
/// find such a context already done.
pub(crate) const DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_millis(1);

/// A `grpc-timeout` header's duration (gRPC's format: at most 8 digits and
/// a unit); None when absent or malformed (tonic ignores those too).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<std::time::Duration> {
    use std::time::Duration;
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (amount, unit) = value.split_at(value.len() - 1);
    let amount: u64 = amount.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// etcd's answer to a call whose deadline passed.
fn deadline_exceeded() -> Refusal {
    let mut response = http::Response::new(axum::body::Body::empty());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", http::HeaderValue::from_static("4"));
    headers.insert(
        "grpc-message",
        http::HeaderValue::from_static("context deadline exceeded"),
    );
    response
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for GrpcGuard<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<Either<ResBody, axum::body::Body>>;
    type Error = S::Error;
    type Future = GuardFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let grpc_path = GRPC_PACKAGES
            .iter()
            .any(|p| request.uri().path().starts_with(p));
        let content_type = request.headers().get(http::header::CONTENT_TYPE);
        let grpc = content_type.is_some_and(|v| is_grpc_content_type(v.as_bytes()));
        if grpc_path && request.version() < http::Version::HTTP_2 {
            let refusal = etcdhttp::plain_error(http::StatusCode::NOT_FOUND, "404 page not found");
            return GuardFuture::Refused {
                refusal: Some(refusal),
            };
        }
        if grpc_path && !grpc {
            let shown = content_type.map_or(String::new(), |v| {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            });
            return GuardFuture::Refused {
                refusal: Some(unsupported_media_type(&shown)),
            };
        }
        let grpc = grpc && request.version() >= http::Version::HTTP_2;
        if grpc
            && grpc_path
            && self.is_learner.as_ref().is_some_and(|learner| learner())
            && !LEARNER_CALLS.contains(&request.uri().path())
        {
            return GuardFuture::Refused {
                refusal: Some(not_supported_for_learner()),
            };
        }
        let timeout = grpc.then(|| grpc_timeout(request.headers())).flatten();
        if timeout.is_some_and(|t| t <= DEADLINE_MARGIN) {
            return GuardFuture::Refused {
                refusal: Some(deadline_exceeded()),
            };
        }
        let deadline = timeout.map(|t| tokio::time::sleep(t - DEADLINE_MARGIN));
        let uri = grpc.then(|| request.uri().clone());
        GuardFuture::Inner {
            inner: self.inner.call(request),
            deadline,
            uri,
        }
    }
}

/// grpc-go's answer to an HTTP/2 request on a gRPC path whose content type
/// is not gRPC.
fn unsupported_media_type(content_type: &str) -> Refusal {
    let message = format!("invalid gRPC request content-type {content_type:?}");
    let mut response = http::Response::new(axum::body::Body::empty());
    *response.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    if let Ok(value) = http::HeaderValue::from_str(&percent_encode(&message)) {
        headers.insert("grpc-message", value);
    }
    response
}

/// grpc-go's message for a call no service answered: tonic's own
/// Unimplemented carries none.
fn unknown_method_message(path: &str) -> String {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return format!("malformed method name: {path:?}");
    };
    const SERVED: &[&str] = &[
        "etcdserverpb.KV",
        "etcdserverpb.Watch",
        "etcdserverpb.Lease",
        "etcdserverpb.Cluster",
        "etcdserverpb.Maintenance",
        "etcdserverpb.Auth",
        "v3electionpb.Election",
        "v3lockpb.Lock",
    ];
    if SERVED.contains(&service) {
        format!("unknown method {method} for service {service}")
    } else {
        format!("unknown service {service}")
    }
}

pin_project_lite::pin_project! {
    #[project = GuardProjection]
    pub(crate) enum GuardFuture<F> {
        Refused { refusal: Option<Refusal> },
        Inner {
            #[pin]
            inner: F,
            // the call's deadline, from its grpc-timeout
            #[pin]
            deadline: Option<tokio::time::Sleep>,
            // a gRPC call's URI: to name what was not found
            uri: Option<http::Uri>,
        },
    }
}

impl<F, ResBody, E> Future for GuardFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<Either<ResBody, axum::body::Body>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GuardProjection::Refused { refusal } => {
                let refusal = refusal.take().expect("a refused future is polled once");
                Poll::Ready(Ok(refusal.map(Either::Right)))
            }
            GuardProjection::Inner {
                inner,
                deadline,
                uri,
            } => {
                let mut response = match inner.poll(cx) {
                    Poll::Ready(response) => response?,
                    Poll::Pending => {
                        if let Some(deadline) = deadline.as_pin_mut() {
                            std::task::ready!(deadline.poll(cx));
                            return Poll::Ready(Ok(deadline_exceeded().map(Either::Right)));
                        }
                        return Poll::Pending;
                    }
                };
                if let Some(uri) = uri.take() {
                    let headers = response.headers_mut();
                    let unimplemented = headers.get("grpc-status").is_some_and(|v| v == "12");
                    let silent = headers.get("grpc-message").is_none_or(|v| v.is_empty());
                    if unimplemented && silent {
                        let message = unknown_method_message(uri.path());
                        if let Ok(value) = http::HeaderValue::from_str(&percent_encode(&message)) {
                            headers.insert("grpc-message", value);
                        }
                    }
                }
                Poll::Ready(Ok(response.map(Either::Left)))
            }
        }
    }
}

/// gRPC's grpc-message percent-encoding of what is not printable ASCII.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// tonic refuses a request above the decoding limit with OutOfRange "Error,
/// decoded message length too large: found N bytes, the limit is: M bytes";
/// grpc-go (etcd) answers ResourceExhausted "grpc: received message larger
/// than max (N vs. M)". Such a refusal is a trailers-only response: the
/// status is in the headers.
pub(crate) fn rewrite_oversized_request<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    if headers.get("grpc-status").and_then(|v| v.to_str().ok()) != Some("11") {
        return response;
    }
    let Some(message) = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(percent_decode)
    else {
        return response;
    };
    let Some((found, limit)) = parse_too_large(&message) else {
        return response;
    };
    let rewritten = format!("grpc: received message larger than max ({found} vs. {limit})");
    if let Ok(value) = http::HeaderValue::from_str(&rewritten) {
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
        headers.insert("grpc-message", value);
    }
    response
}

fn parse_too_large(message: &str) -> Option<(u64, u64)> {
    let rest = message.strip_prefix("Error, decoded message length too large: found ")?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    Some((found.parse().ok()?, limit.parse().ok()?))
}

/// gRPC's grpc-message percent-encoding (only `%XX` escapes).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_requests_get_grpc_go_wording() {
        let response = http::Response::builder()
            .header("grpc-status", "11")
            .header("grpc-message", "Error,%20decoded message length too large: found 3000000 bytes, the limit is: 2097152 bytes")
            .body(())
            .unwrap();
        let response = rewrite_oversized_request(response);
        assert_eq!(response.headers()["grpc-status"], "8");
        assert_eq!(
            response.headers()["grpc-message"],
            "grpc: received message larger than max (3000000 vs. 2097152)"
        );
    }

    #[test]
    fn other_statuses_pass_through() {
        let response = http::Response::builder()
            .header("grpc-status", "11")
            .header(
                "grpc-message",
                "etcdserver: mvcc: required revision is a future revision",
            )
            .body(())
            .unwrap();
        let response = rewrite_oversized_request(response);
        assert_eq!(response.headers()["grpc-status"], "11");
    }
}
