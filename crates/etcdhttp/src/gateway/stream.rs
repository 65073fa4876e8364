//! The gateway's streams: a body of concatenated JSON requests read as it
//! arrives into a service's request stream ([`serve_bidi`]: watch and
//! lease/keepalive), and a service's responses written as
//! `{"result":...}` lines, one per response (also for Snapshot and
//! Observe, which take one request).

use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{header, HeaderValue, Method};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::json::syntax_error;
use super::reflect::{too_large, FromJson, ToJson};
use super::{error_response, http_status, Gateway};
use crate::method_not_allowed;
use v3rpc::auth::Credentials;

/// Decoded requests of a bidirectional stream queued ahead of its service;
/// beyond it the body is not read (the client's writes wait).
const STREAM_REQUEST_QUEUE: usize = 16;

/// The requests of a bidirectional stream, decoded from the body.
pub(crate) type Inbound<Req> = ReceiverStream<Result<Req, Status>>;

/// A stream of `{"result":...}` lines (and a last error line on failure).
pub(crate) type ResultLines =
    Pin<Box<dyn Stream<Item = Result<Bytes, std::convert::Infallible>> + Send>>;

/// Splits a body of concatenated JSON values, chunk by chunk.
pub(super) struct JsonValues {
    /// The start of a value not yet complete.
    buffer: Vec<u8>,
    /// The body's first syntax error, in Go's words, until decoded.
    error: Option<String>,
    /// A syntax error was found: nothing after it is read.
    failed: bool,
}

impl JsonValues {
    pub(super) fn new() -> JsonValues {
        JsonValues {
            buffer: Vec::new(),
            error: None,
            failed: false,
        }
    }

    /// The values `chunk` completes, in order; after a syntax error, the
    /// values before it (the error waits in `error`).
    pub(super) fn push(&mut self, chunk: &[u8]) -> Vec<Value> {
        if self.failed {
            return Vec::new();
        }
        self.buffer.extend_from_slice(chunk);
        let mut values = Vec::new();
        let mut consumed = 0;
        {
            let mut stream = serde_json::Deserializer::from_slice(&self.buffer).into_iter();
            loop {
                match stream.next() {
                    Some(Ok(value)) => {
                        values.push(value);
                        consumed = stream.byte_offset();
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(e)) => {
                        // serde's line and column count from the buffer's
                        // start, not the failed value's
                        self.error = Some(syntax_error(&self.buffer, &e));
                        self.failed = true;
                        consumed = self.buffer.len();
                        break;
                    }
                    None => {
                        consumed = self.buffer.len();
                        break;
                    }
                }
            }
        }
        self.buffer.drain(..consumed);
        values
    }

    /// The body ended: a value left incomplete is a syntax error.
    pub(super) fn finish(&mut self) {
        if !self.failed && !self.buffer.iter().all(u8::is_ascii_whitespace) {
            if let Err(e) = serde_json::from_slice::<Value>(&self.buffer) {
                self.error = Some(syntax_error(&self.buffer, &e));
                self.failed = true;
            }
        }
        self.buffer.clear();
    }

    /// Decodes the values as requests, in order, up to the first that is
    /// not one or the syntax error, which ends the list as an Err.
    /// Each may take `max_bytes` on the wire.
    pub(super) fn decode<Req: FromJson>(
        &mut self,
        values: Vec<Value>,
        max_bytes: usize,
    ) -> Vec<Result<Req, Status>> {
        let mut requests = Vec::with_capacity(values.len() + 1);
        for value in &values {
            let request = Req::from_json_within(value, max_bytes);
            let failed = request.is_err();
            requests.push(request);
            if failed {
                return requests;
            }
        }
        if let Some(e) = self.error.take() {
            requests.push(Err(Status::invalid_argument(e)));
        }
        requests
    }
}

/// grpc-gateway's in-stream error object (runtime.streamError).
fn stream_error_line(status: &Status) -> Bytes {
    let http = http_status(status.code());
    let message = serde_json::to_string(status.message()).unwrap_or_else(|_| "\"\"".into());
    let reason = serde_json::to_string(http.canonical_reason().unwrap_or(""))
        .unwrap_or_else(|_| "\"\"".into());
    Bytes::from(format!(
        "{{\"error\":{{\"grpc_code\":{},\"http_code\":{},\"message\":{message},\"http_status\":{reason}}}}}\n",
        status.code() as i32,
        http.as_u16()
    ))
}

/// Serves a bidirectional stream route (watch, lease/keepalive): the body
/// is a stream of JSON requests, the answer a stream of `{"result":...}`
/// lines. The stream `open` returns ends the answer.
pub(crate) async fn serve_bidi<Req, Resp, S>(
    gateway: Arc<Gateway>,
    request: http::Request<Body>,
    open: fn(&Gateway, Inbound<Req>, Credentials) -> S,
) -> http::Response<Body>
where
    Req: FromJson + Send + 'static,
    Resp: ToJson + Send + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + 'static,
{
    if request.method() != Method::POST {
        return method_not_allowed(None);
    }
    let max_body = gateway.max_body();
    let max_message = gateway.max_message();
    let credentials = super::credentials(request.headers());
    let mut body = request.into_body();
    let mut values = JsonValues::new();
    // The first request is read before answering, so that a body that does
    // not start with a request gets a plain error response as grpc-gateway
    // gives it (code Unknown: the stream's first Recv failed).
    let mut pending: Vec<Result<Req, Status>> = Vec::new();
    let mut ended = false;
    while pending.is_empty() && !ended {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let parsed = values.push(&data);
                    if values.buffer.len() > max_body {
                        return error_response(&too_large(values.buffer.len(), max_message));
                    }
                    pending = values.decode(parsed, max_message);
                }
            }
            Some(Err(e)) => return error_response(&Status::unknown(e.to_string())),
            None => {
                ended = true;
                values.finish();
                pending = values.decode(Vec::new(), max_message);
            }
        }
    }
    if let Some(Err(status)) = pending.first() {
        return error_response(&Status::unknown(status.message()));
    }

    let (tx, rx) = mpsc::channel::<Result<Req, Status>>(STREAM_REQUEST_QUEUE);
    tokio::spawn(async move {
        loop {
            // A request that failed to decode ends the service's stream,
            // as a failed Recv ends etcd's.
            for request in pending.drain(..) {
                let failed = request.is_err();
                if tx.send(request).await.is_err() || failed {
                    return;
                }
            }
            if ended {
                // Dropping `tx` half-closes the service's stream: a watch
                // goes on until the client leaves, a keep-alive stream ends.
                return;
            }
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let parsed = values.push(&data);
                        if values.buffer.len() > max_body {
                            let _ = tx
                                .send(Err(too_large(values.buffer.len(), max_message)))
                                .await;
                            return;
                        }
                        pending = values.decode(parsed, max_message);
                    }
                }
                Some(Err(_)) => return,
                None => {
                    ended = true;
                    values.finish();
                    pending = values.decode(Vec::new(), max_message);
                }
            }
        }
    });

    lines_response(Box::pin(result_lines(open(
        &gateway,
        ReceiverStream::new(rx),
        credentials,
    ))))
}

/// 200 with a body of result lines, and grpc-gateway's headers.
pub(crate) fn lines_response(lines: ResultLines) -> http::Response<Body> {
    let mut response = http::Response::new(Body::from_stream(lines));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        "grpc-metadata-content-type",
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// Each response as one `{"result":...}` line; an error ends the stream
/// with grpc-gateway's error line.
pub(crate) fn result_lines<S, T>(
    responses: S,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>>
where
    S: Stream<Item = Result<T, Status>> + Send + 'static,
    T: ToJson,
{
    responses.scan(false, |failed, item| {
        if *failed {
            return futures::future::ready(None);
        }
        let line = match item {
            Ok(response) => {
                let mut line = String::with_capacity(256);
                line.push_str("{\"result\":");
                response.to_json(&mut line);
                line.push_str("}\n");
                Bytes::from(line)
            }
            Err(status) => {
                *failed = true;
                stream_error_line(&status)
            }
        };
        futures::future::ready(Some(Ok(line)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::etcdserverpb::LeaseKeepAliveRequest;

    #[test]
    fn concatenated_requests_split_across_chunks() {
        let mut values = JsonValues::new();
        assert_eq!(values.push(b"{\"a\":1} {\"b\"").len(), 1);
        let rest = values.push(b":2}");
        assert_eq!(rest, vec![serde_json::json!({"b": 2})]);
        values.finish();
        assert!(values.error.is_none());
    }

    #[test]
    fn requests_before_a_syntax_error_are_kept_and_the_error_ends_them() {
        let mut values = JsonValues::new();
        let parsed = values.push(b"{\"ID\":\"1\"}{\"ID\":2} xx {\"ID\":3}");
        let requests: Vec<Result<LeaseKeepAliveRequest, Status>> =
            values.decode(parsed, usize::MAX);
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[0].as_ref().unwrap().id, 1);
        assert_eq!(requests[1].as_ref().unwrap().id, 2);
        assert!(requests[2].is_err());
        assert!(
            values.push(b"{\"ID\":4}").is_empty(),
            "nothing is read after an error"
        );

        let mut values = JsonValues::new();
        let parsed = values.push(b"[1] {\"ID\":2}");
        let requests: Vec<Result<LeaseKeepAliveRequest, Status>> =
            values.decode(parsed, usize::MAX);
        assert_eq!(requests.len(), 1, "a request that is not one ends the list");
        assert!(requests[0].is_err());

        let mut values = JsonValues::new();
        assert!(values.push(b"{\"ID\":").is_empty());
        values.finish();
        let requests: Vec<Result<LeaseKeepAliveRequest, Status>> =
            values.decode(Vec::new(), usize::MAX);
        assert!(requests[0].is_err(), "a body cut short is a syntax error");
    }
}
