//! /debug/failpoints: arms the member's failpoints at run time, as gofail's
//! HTTP endpoint does for etcd (here on the client port, under one prefix).
//! Built only with the `failpoints` feature; without it these paths are
//! 404 like any other unknown path.
//!
//! * `GET /debug/failpoints`: one `name=action` line per armed failpoint;
//! * `GET /debug/failpoints/<name>`: its action, 404 when not armed;
//! * `PUT /debug/failpoints/<name>` with the action as body: 204;
//!   400 for an action that does not parse, 404 for an unknown name;
//! * `DELETE /debug/failpoints/<name>`: 204, 404 when not armed.

use axum::body::Body;
use http::{header, HeaderValue, Method, StatusCode};

use crate::{method_not_allowed, plain_error};

pub const PREFIX: &str = "/debug/failpoints";

/// An action is a few words (`50%3*sleep(200)`): anything longer is not one.
const MAX_ACTION_BYTES: usize = 4096;

pub fn router() -> axum::Router {
    axum::Router::new()
        .route(PREFIX, axum::routing::any(list))
        .route(&format!("{PREFIX}/{{name}}"), axum::routing::any(one))
}

fn text(status: StatusCode, body: String) -> http::Response<Body> {
    let mut response = http::Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn no_content() -> http::Response<Body> {
    let mut response = http::Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

async fn list(request: http::Request<Body>) -> http::Response<Body> {
    match *request.method() {
        Method::GET => {
            let lines: String = failpoint::list()
                .into_iter()
                .map(|(name, action)| format!("{name}={action}\n"))
                .collect();
            text(StatusCode::OK, lines)
        }
        _ => method_not_allowed(Some("GET")),
    }
}

async fn one(request: http::Request<Body>) -> http::Response<Body> {
    let name = request
        .uri()
        .path()
        .trim_start_matches(PREFIX)
        .trim_start_matches('/')
        .to_string();
    match *request.method() {
        Method::GET => match failpoint::get(&name) {
            Some(action) => text(StatusCode::OK, format!("{action}\n")),
            None => plain_error(StatusCode::NOT_FOUND, "failpoint is not armed"),
        },
        Method::PUT => {
            let body = match axum::body::to_bytes(request.into_body(), MAX_ACTION_BYTES).await {
                Ok(body) => body,
                Err(e) => {
                    return plain_error(
                        StatusCode::BAD_REQUEST,
                        &format!("failed to read the action: {e}"),
                    )
                }
            };
            let Ok(action) = std::str::from_utf8(&body) else {
                return plain_error(StatusCode::BAD_REQUEST, "the action is not UTF-8");
            };
            match failpoint::arm(&name, action) {
                Ok(()) => {
                    tracing::warn!(failpoint = %name, action = %action.trim(), "failpoint armed");
                    no_content()
                }
                Err(e @ failpoint::Error::Unknown(_)) => {
                    plain_error(StatusCode::NOT_FOUND, &e.to_string())
                }
                Err(e) => plain_error(StatusCode::BAD_REQUEST, &e.to_string()),
            }
        }
        Method::DELETE => {
            if failpoint::disarm(&name) {
                tracing::warn!(failpoint = %name, "failpoint disarmed");
                no_content()
            } else {
                plain_error(StatusCode::NOT_FOUND, "failpoint is not armed")
            }
        }
        _ => method_not_allowed(Some("GET, PUT, DELETE")),
    }
}
