//! Plain HTTP on the client port next to gRPC, as etcd serves it: /metrics,
//! /health, /livez, /readyz ([`probes`]), /version and the JSON gateway (/v3/...). One axum router holds
//! both: gRPC methods live under `/<package>.<Service>/<Method>` paths,
//! which no HTTP route shares, so routing by path sends every gRPC call to
//! tonic without a look at its headers; for a path no route takes, the
//! content-type decides between gRPC's Unimplemented and HTTP's 404.
//! /debug/vars ([`debug`]) and, with `--enable-pprof`, /debug/pprof
//! ([`pprof`]). `--listen-metrics-urls` serves /metrics and
//! the health paths only. A build with
//! the `failpoints` feature also serves /debug/failpoints ([`failpoints`]).
//!
//! On the client URLs, embed's access controller stands in front of every
//! route, as etcd's: `--host-whitelist`, the CORS headers of `--cors`,
//! OPTIONS answered; the handlers here add neither.

pub mod debug;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod gateway;
pub mod health;
pub mod pprof;
mod probes;

use std::sync::Arc;

use axum::body::Body;
use http::{header, HeaderValue, Method, StatusCode};

use crate::gateway::Gateway;
use etcdserver::metrics::TEXT_CONTENT_TYPE;
use etcdserver::EtcdServer;
use etcdserver::{CLUSTER_VERSION, ETCD_VERSION};

/// Go's http.Error: text/plain, nosniff, the message and a newline.
pub fn plain_error(status: StatusCode, message: &str) -> http::Response<Body> {
    plain_text(status, format!("{message}\n"))
}

/// `body` as text/plain with nosniff, as Go's handlers that set both.
pub(crate) fn plain_text(status: StatusCode, body: String) -> http::Response<Body> {
    let mut response = http::Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// 405, naming the allowed method as etcd's own handlers do (grpc-gateway
/// names none: pass None).
pub fn method_not_allowed(allow: Option<&'static str>) -> http::Response<Body> {
    let mut response = plain_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    if let Some(allow) = allow {
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    response
}

fn with_content_type(body: impl Into<Body>, content_type: &'static str) -> http::Response<Body> {
    let mut response = http::Response::new(body.into());
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// GET /version: etcd's two fields, then ours (clients that parse etcd's
/// shape ignore it).
pub fn version_json() -> String {
    format!(
        "{{\"etcdserver\":\"{ETCD_VERSION}\",\"etcdcluster\":\"{CLUSTER_VERSION}.0\",\"oxcd\":\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    )
}

async fn version(request: http::Request<Body>) -> http::Response<Body> {
    match *request.method() {
        Method::GET => with_content_type(version_json(), "application/json"),
        _ => method_not_allowed(Some("GET")),
    }
}

/// Any method, as promhttp's handler.
async fn metrics(server: Arc<EtcdServer>) -> http::Response<Body> {
    with_content_type(server.metrics.render(&server), TEXT_CONTENT_TYPE)
}

/// Anything no route took: a gRPC call to a service this member does not
/// serve gets gRPC's Unimplemented (as before HTTP shared the port),
/// a gateway path grpc-gateway's 404, anything else Go's.
async fn fallback(request: http::Request<Body>) -> http::Response<Body> {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        let (parts, ()) = tonic::Status::unimplemented("")
            .into_http::<()>()
            .into_parts();
        return http::Response::from_parts(parts, Body::empty());
    }
    let path = request.uri().path();
    if gateway::PREFIXES
        .iter()
        .any(|prefix| path.starts_with(prefix))
    {
        // grpc-gateway's own 404 (etcd 3.5 serves no HashKV route, say).
        return plain_error(StatusCode::NOT_FOUND, "Not Found");
    }
    plain_error(StatusCode::NOT_FOUND, "404 page not found")
}

/// /metrics, /health, /livez and /readyz: what `--listen-metrics-urls`
/// serves.
pub fn metrics_router(server: Arc<EtcdServer>) -> axum::Router {
    let for_metrics = server.clone();
    let mut router = axum::Router::new();
    for (path, probe, only) in probes::paths() {
        let server = server.clone();
        router = router.route(
            &path,
            axum::routing::any(move |request: http::Request<Body>| {
                probes::serve(server.clone(), probe, only, request)
            }),
        );
    }
    router
        .route(
            "/metrics",
            axum::routing::any(move || metrics(for_metrics.clone())),
        )
        .route(
            "/health",
            axum::routing::any(move |request: http::Request<Body>| {
                health::serve(server.clone(), request)
            }),
        )
}

/// Everything plain HTTP on the client port: metrics, health, version and
/// the gateway. Merge with the gRPC routes and then call [`with_fallback`].
pub fn client_router(server: Arc<EtcdServer>, gateway: Option<Arc<Gateway>>) -> axum::Router {
    let for_vars = server.clone();
    let server_pprof = server.cfg.enable_pprof;
    let router = metrics_router(server)
        .route("/version", axum::routing::any(version))
        .route(
            "/debug/vars",
            axum::routing::any(move |request: http::Request<Body>| {
                debug::vars(for_vars.clone(), request)
            }),
        )
        // etcd's --enable-grpc-gateway=false: no /v3 JSON routes
        .merge(gateway.map(gateway::router).unwrap_or_default());
    // --enable-pprof (or --log-level=debug): else these paths are 404
    let router = match server_pprof {
        true => router.merge(pprof::router()),
        false => router,
    };
    // test builds only: arming failpoints at run time
    #[cfg(feature = "failpoints")]
    let router = router.merge(failpoints::router());
    router
}

/// Sets the fallback for requests no route took.
pub fn with_fallback(router: axum::Router) -> axum::Router {
    router.fallback(fallback)
}
