//! etcd's access controller (server/embed/serve.go `accessController`,
//! etcdserver's `AccessController`): `--host-whitelist` and `--cors` on the
//! HTTP side of the client URLs, a layer in front of every route (the
//! handlers of etcdhttp add neither).
//!
//! * On a plain listener, a request whose Host is not in the whitelist gets
//!   421 and etcd's CVE-2018-5702 text, logged as etcd logs it ("rejecting
//!   HTTP request to prevent DNS rebinding attacks"). Over TLS any Host is
//!   taken.
//! * The CORS headers go on every answer when `--cors` allows all (`*`, the
//!   default), else when the request's Origin is listed, with that origin.
//! * OPTIONS, on any path, is answered at once: 200, empty.
//! * Over TLS with `--client-cert-auth`, the gateway on and auth enabled, a
//!   gateway request (`/v3/`, `/v3beta/`) whose verified client certificate
//!   has a Common Name gets 400 "CommonName of client sending a request
//!   against gateway will be ignored and not used as expected" (etcd's
//!   gateway calls gRPC on a connection of its own, so the name would not
//!   be the user; neither is it here).
//!
//! What etcd puts behind its access controller: on a plain listener its
//! HTTP/1.x server (HTTP/2 goes to grpc-go, which sees neither check), on a
//! TLS listener Go's HTTP server for everything, gRPC included (CORS headers
//! on gRPC answers, OPTIONS to a gRPC path answered 200). Here: every request
//! but HTTP/2 gRPC on a plain listener, and all of them over TLS. A client
//! URL serving gRPC alone (`--listen-client-http-urls`) has none, nor has
//! `--listen-metrics-urls` (etcd's metrics mux is a plain one).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::Either;

/// etcdserver's `AccessController`: the `--cors` origins and the
/// `--host-whitelist` hosts. An empty set, or one holding `*`, allows all.
#[derive(Clone)]
pub struct AccessController {
    cors: HashSet<String>,
    host_whitelist: HashSet<String>,
    /// Whether auth is enabled now, when gateway requests with a client
    /// certificate's Common Name are refused (`--client-cert-auth` and the
    /// gateway on); None: never.
    refuses_gateway_cn: Option<AuthEnabled>,
}

/// Tells whether the member's auth is enabled at this moment.
pub type AuthEnabled = Arc<dyn Fn() -> bool + Send + Sync>;

/// etcd's answer to a gateway request with a client certificate's name.
const GATEWAY_CN_IGNORED: &str =
    "CommonName of client sending a request against gateway will be ignored and not used as expected";

impl AccessController {
    /// `cors`: the origins as `--cors` holds them (URLs, or `*`);
    /// `host_whitelist`: `--host-whitelist`'s hosts.
    pub fn new(cors: &[String], host_whitelist: &[String]) -> AccessController {
        AccessController {
            cors: cors.iter().map(|origin| go_url_string(origin)).collect(),
            host_whitelist: host_whitelist.iter().cloned().collect(),
            refuses_gateway_cn: None,
        }
    }

    /// With `--client-cert-auth` and the gateway on: a gateway request
    /// whose client certificate names a user is refused while auth is
    /// enabled.
    pub fn refusing_gateway_common_names(mut self, auth_enabled: AuthEnabled) -> Self {
        self.refuses_gateway_cn = Some(auth_enabled);
        self
    }

    /// Whether etcd refuses `request` (over TLS) as a gateway request that
    /// carries a client certificate's Common Name.
    fn refuses_gateway_cn<B>(&self, request: &http::Request<B>) -> bool {
        let Some(auth_enabled) = &self.refuses_gateway_cn else {
            return false;
        };
        let path = request.uri().path();
        let gateway = path.starts_with("/v3/") || path.starts_with("/v3beta/");
        gateway
            && auth_enabled()
            && request
                .extensions()
                .get::<v3rpc::TlsConnectInfo>()
                .and_then(|info| info.common_name.as_deref())
                .is_some_and(|name| !name.is_empty())
    }

    /// etcd's `OriginAllowed`.
    pub fn origin_allowed(&self, origin: &str) -> bool {
        self.cors.is_empty() || self.cors.contains("*") || self.cors.contains(origin)
    }

    /// etcd's `IsHostWhitelisted`.
    pub fn is_host_whitelisted(&self, host: &str) -> bool {
        self.host_whitelist.is_empty()
            || self.host_whitelist.contains("*")
            || self.host_whitelist.contains(host)
    }
}

/// etcd keeps a `--cors` URL as Go's `url.URL.String()` gives it back: the
/// scheme lower-cased, the rest as written.
fn go_url_string(origin: &str) -> String {
    match origin.split_once("://") {
        Some((scheme, rest)) => format!("{}://{rest}", scheme.to_ascii_lowercase()),
        None => origin.to_string(),
    }
}

/// The request's host as etcd's `httputil.GetHostname` takes it: Go's
/// `req.Host` (the URI's authority, else the Host header) without its
/// port; all of it when it is not `host:port` as Go's `net.SplitHostPort`
/// reads it.
pub fn hostname<B>(request: &http::Request<B>) -> String {
    let host = match request.uri().authority() {
        Some(authority) => authority.as_str().to_string(),
        None => request
            .headers()
            .get(header::HOST)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default(),
    };
    match split_host_port(&host) {
        Some(name) => name.to_string(),
        None => host,
    }
}

/// Go's `net.SplitHostPort`, the host part; None where Go errs.
fn split_host_port(hostport: &str) -> Option<&str> {
    let last_colon = hostport.rfind(':')?;
    let (host, from, to) = if hostport.starts_with('[') {
        let end = hostport.find(']')?;
        // "]" must come just before the last ':'
        if end + 1 != last_colon {
            return None;
        }
        (&hostport[1..end], 1, end + 1)
    } else {
        let host = &hostport[..last_colon];
        if host.contains(':') {
            return None;
        }
        (host, 0, 0)
    };
    if hostport[from..].contains('[') || hostport[to..].contains(']') {
        return None;
    }
    Some(host)
}

/// etcd's `errCVE20185702`.
fn cve_2018_5702(host: &str) -> String {
    format!(
        "
etcd received your request, but the Host header was unrecognized.

To fix this, choose one of the following options:
- Enable TLS, then any HTTPS request will be allowed.
- Add the hostname you want to use to the whitelist in settings.
  - e.g. etcd --host-whitelist {}

This requirement has been added to help prevent \"DNS Rebinding\" attacks (CVE-2018-5702).
",
        go_quote(host)
    )
}

/// Go's `%q` of a string (strconv.Quote) for what a Host header may hold.
fn go_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// etcd's `addCORSHeader`.
fn add_cors_headers(headers: &mut http::HeaderMap, origin: HeaderValue) {
    headers.append(
        "access-control-allow-methods",
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    headers.append("access-control-allow-origin", origin);
    headers.append(
        "access-control-allow-headers",
        HeaderValue::from_static("accept, content-type, authorization"),
    );
}

/// The access controller in front of a client listener's routes.
#[derive(Clone)]
pub struct AccessLayer {
    /// None: nothing is checked (a listener serving gRPC alone).
    controller: Option<Arc<AccessController>>,
    /// A TLS listener: any Host, and gRPC is behind the controller too.
    secure: bool,
}

impl AccessLayer {
    pub fn new(controller: Option<Arc<AccessController>>, secure: bool) -> AccessLayer {
        AccessLayer { controller, secure }
    }
}

impl<S> tower::Layer<S> for AccessLayer {
    type Service = Access<S>;

    fn layer(&self, inner: S) -> Access<S> {
        Access {
            inner,
            controller: self.controller.clone(),
            secure: self.secure,
        }
    }
}

#[derive(Clone)]
pub struct Access<S> {
    inner: S,
    controller: Option<Arc<AccessController>>,
    secure: bool,
}

/// grpc-go's test of a gRPC content type.
fn is_grpc<B>(request: &http::Request<B>) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.as_bytes().strip_prefix(b"application/grpc"))
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Access<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ReqBody: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
{
    type Response = http::Response<Either<ResBody, Body>>;
    type Error = S::Error;
    type Future = AccessFuture<S::Future, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let Some(controller) = &self.controller else {
            return AccessFuture::Inner {
                inner: self.inner.call(request),
                cors: None,
            };
        };
        // grpc-go's own connections, which etcd's controller never sees
        if !self.secure && request.version() == http::Version::HTTP_2 && is_grpc(&request) {
            return AccessFuture::Inner {
                inner: self.inner.call(request),
                cors: None,
            };
        }
        if !self.secure {
            let host = hostname(&request);
            if !controller.is_host_whitelisted(&host) {
                tracing::warn!(
                    host = %host,
                    "rejecting HTTP request to prevent DNS rebinding attacks"
                );
                let mut refusal =
                    http::Response::new(Body::from(format!("{}\n", cve_2018_5702(&host))));
                *refusal.status_mut() = StatusCode::MISDIRECTED_REQUEST;
                refusal.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                refusal.headers_mut().insert(
                    "x-content-type-options",
                    HeaderValue::from_static("nosniff"),
                );
                return answered(refusal, request);
            }
        } else if controller.refuses_gateway_cn(&request) {
            let refusal = etcdhttp::plain_error(StatusCode::BAD_REQUEST, GATEWAY_CN_IGNORED);
            return answered(refusal, request);
        }
        let cors = if controller.origin_allowed("*") {
            Some(HeaderValue::from_static("*"))
        } else {
            request
                .headers()
                .get(header::ORIGIN)
                .filter(|origin| {
                    origin
                        .to_str()
                        .is_ok_and(|origin| controller.origin_allowed(origin))
                })
                .cloned()
        };
        if request.method() == Method::OPTIONS {
            let mut answer = http::Response::new(Body::empty());
            answer
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
            if let Some(origin) = cors {
                add_cors_headers(answer.headers_mut(), origin);
            }
            return answered(answer, request);
        }
        AccessFuture::Inner {
            inner: self.inner.call(request),
            cors,
        }
    }
}

/// How much of a request's body the controller reads before its own
/// answer: a client that sends a small body along with its headers (curl)
/// takes an answer that comes before the body is all sent, and the reset
/// that ends the rest, for a failed request; past this the answer goes
/// anyway.
const DRAIN_LIMIT_BYTES: usize = 64 * 1024;

/// The controller's own answer to `request`, given once the request's body
/// is read (up to [`DRAIN_LIMIT_BYTES`]), as etcd's Go server has mostly
/// read it by the time its handler answers. A body left unread is kept
/// until the answer has been sent: h2 then resets the request with
/// NO_ERROR, as RFC 9113 (8.1) asks of a server that answers early; a body
/// dropped first would be reset with CANCEL.
fn answered<F, ReqBody>(
    answer: http::Response<Body>,
    request: http::Request<ReqBody>,
) -> AccessFuture<F, ReqBody> {
    AccessFuture::Answered {
        answer: Some(answer),
        request: Some(Box::pin(request.into_body())),
        drained: 0,
    }
}

pin_project_lite::pin_project! {
    /// An answer's body, holding the request's until it is done.
    struct AnswerBody<B> {
        #[pin]
        answer: Body,
        _request: B,
    }
}

impl<B> http_body::Body for AnswerBody<B> {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().answer.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.answer.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.answer.size_hint()
    }
}

pin_project_lite::pin_project! {
    #[project = AccessProjection]
    pub enum AccessFuture<F, B> {
        Answered {
            answer: Option<http::Response<Body>>,
            request: Option<Pin<Box<B>>>,
            // request body bytes read so far
            drained: usize,
        },
        Inner {
            #[pin]
            inner: F,
            // the CORS origin to answer with, if any
            cors: Option<HeaderValue>,
        },
    }
}

impl<F, B, ResBody, E> Future for AccessFuture<F, B>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
{
    type Output = Result<http::Response<Either<ResBody, Body>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            AccessProjection::Answered {
                answer,
                request,
                drained,
            } => {
                let body = request
                    .as_mut()
                    .expect("an answered future is polled to its end");
                while *drained <= DRAIN_LIMIT_BYTES && !body.is_end_stream() {
                    match std::task::ready!(body.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => {
                            *drained += frame.data_ref().map_or(0, axum::body::Bytes::len);
                        }
                        Some(Err(_)) | None => break,
                    }
                }
                let request = request.take().expect("taken once");
                let answer = answer.take().expect("an answered future is polled once");
                let answer = answer.map(|body| {
                    Body::new(AnswerBody {
                        answer: body,
                        _request: request,
                    })
                });
                Poll::Ready(Ok(answer.map(Either::Right)))
            }
            AccessProjection::Inner { inner, cors } => {
                let mut response = std::task::ready!(inner.poll(cx))?;
                if let Some(origin) = cors.take() {
                    add_cors_headers(response.headers_mut(), origin);
                }
                Poll::Ready(Ok(response.map(Either::Left)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(host: Option<&str>, uri: &str) -> http::Request<()> {
        let mut builder = http::Request::builder().uri(uri);
        if let Some(host) = host {
            builder = builder.header(header::HOST, host);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn hostnames_as_go_splits_them() {
        for (host, name) in [
            ("evil.example", "evil.example"),
            ("evil.example:2379", "evil.example"),
            ("localhost:1", "localhost"),
            ("[::1]:2379", "::1"),
            ("[::1]", "[::1]"),
            ("a:b:c", "a:b:c"),
            ("", ""),
            ("[a]b:1", "[a]b:1"),
            (":80", ""),
        ] {
            assert_eq!(hostname(&request(Some(host), "/version")), name, "{host}");
        }
        // an absolute URI's authority wins over the Host header, as in Go
        assert_eq!(
            hostname(&request(Some("other"), "http://localhost:2379/version")),
            "localhost"
        );
        assert_eq!(hostname(&request(None, "/version")), "");
    }

    #[test]
    fn whitelists_and_origins_as_etcd_judges_them() {
        let list = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let all = AccessController::new(&list(&["*"]), &list(&["*"]));
        assert!(all.is_host_whitelisted("anything"));
        assert!(all.origin_allowed("http://x:1"));
        let none = AccessController::new(&[], &[]);
        assert!(none.is_host_whitelisted("anything"));
        assert!(none.origin_allowed(""));
        let some = AccessController::new(
            &list(&["HTTP://a.com:80", "https://b.org:443"]),
            &list(&["localhost", "127.0.0.1"]),
        );
        assert!(some.is_host_whitelisted("localhost"));
        assert!(!some.is_host_whitelisted("evil"));
        assert!(!some.is_host_whitelisted(""));
        assert!(some.origin_allowed("http://a.com:80"));
        assert!(some.origin_allowed("https://b.org:443"));
        assert!(!some.origin_allowed("https://c.org:443"));
        assert!(!some.origin_allowed(""));
        // `--host-whitelist ''` allows only an empty Host, as etcd's
        let empty = AccessController::new(&[], &list(&[""]));
        assert!(empty.is_host_whitelisted(""));
        assert!(!empty.is_host_whitelisted("localhost"));
    }

    #[test]
    fn the_refusal_quotes_the_host_as_go() {
        assert!(cve_2018_5702("evil.example").contains("--host-whitelist \"evil.example\"\n"));
        assert_eq!(go_quote("a\"b\\c\x01\t"), r#""a\"b\\c\x01\t""#);
        // etcd 3.5.16's body for this host: 374 bytes with http.Error's newline
        assert_eq!(cve_2018_5702("evil.example").len() + 1, 374);
    }
}
