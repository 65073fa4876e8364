//! `--experimental-enable-distributed-tracing` against a fake OTLP
//! collector (the trace service's gRPC server, on loopback): etcd's
//! parent-based sampling (at the default rate 0 only a request whose
//! `traceparent` says sampled is exported; at a million every request
//! without an unsampled parent), otelgrpc's span (name, kind, attributes,
//! status code, the parent's ids), the resource (`service.name`,
//! `service.instance.id`), one span per stream when the stream ends,
//! etcd's error for a bad sampling rate, and a member that keeps serving
//! when the collector is down.
//!
//! The batch processor's delay is shortened through `OTEL_BSP_SCHEDULE_DELAY`
//! and the export deadline through `OTEL_EXPORTER_OTLP_TIMEOUT`, variables
//! etcd's OpenTelemetry SDK reads too.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::watch_client::WatchClient;
use api::etcdserverpb::{
    watch_request, PutRequest, RangeRequest, WatchCreateRequest, WatchRequest,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use testkit::{json_field, oxcd_bin, Process, START_DEADLINE};
use tonic::transport::Channel;

/// How long a span may take to reach the collector (the batch delay is
/// 100 ms here; the machine may be loaded).
const EXPORT_DEADLINE: Duration = Duration::from_secs(20);

const OTELGRPC_SCOPE: &str =
    "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc";

/// One span as the collector got it, with its resource and scope.
#[derive(Clone, Debug)]
struct Received {
    resource: Vec<KeyValue>,
    scope: String,
    span: Span,
}

#[derive(Clone, Default)]
struct Sink {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans.resource.unwrap_or_default().attributes;
            for scope_spans in resource_spans.scope_spans {
                let scope = scope_spans.scope.unwrap_or_default().name;
                for span in scope_spans.spans {
                    spans.push(Received {
                        resource: resource.clone(),
                        scope: scope.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The fake collector: serves until the test's runtime ends.
struct Collector {
    address: SocketAddr,
    sink: Sink,
}

impl Collector {
    async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let sink = Sink::default();
        let service = TraceServiceServer::new(sink.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
        });
        Collector { address, sink }
    }

    fn spans(&self) -> Vec<Received> {
        self.sink.spans.lock().unwrap().clone()
    }

    /// Waits until a span of trace `trace_id` has arrived.
    async fn wait_for_trace(&self, trace_id: &[u8]) -> Received {
        let end = Instant::now() + EXPORT_DEADLINE;
        loop {
            if let Some(found) = self
                .spans()
                .into_iter()
                .find(|r| r.span.trace_id == trace_id)
            {
                return found;
            }
            assert!(
                Instant::now() < end,
                "no span of trace {} reached the collector; got {:?}",
                hex(trace_id),
                self.spans()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `count` spans named `name` have arrived.
    async fn wait_for_named(&self, name: &str, count: usize) -> Vec<Received> {
        let end = Instant::now() + EXPORT_DEADLINE;
        loop {
            let named: Vec<Received> = self
                .spans()
                .into_iter()
                .filter(|r| r.span.name == name)
                .collect();
            if named.len() >= count {
                return named;
            }
            assert!(
                Instant::now() < end,
                "{} of {count} {name} spans reached the collector",
                named.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attribute(attributes, key)? {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn int_attribute(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attribute(attributes, key)? {
        Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

/// Starts oxcd with tracing on, sending to `collector`, plus `extra` flags.
fn start_traced(data_dir: &std::path::Path, collector: SocketAddr, extra: &[&str]) -> Process {
    let address = collector.to_string();
    let mut flags = vec![
        "--experimental-enable-distributed-tracing",
        "--experimental-distributed-tracing-address",
        &address,
    ];
    flags.extend_from_slice(extra);
    start_with_env(data_dir, &[("OTEL_BSP_SCHEDULE_DELAY", "100")], &flags)
}

fn start_with_env(data_dir: &std::path::Path, env: &[(&str, &str)], flags: &[&str]) -> Process {
    let mut p = Process::launch_oxcd_env(&oxcd_bin(), data_dir, env, flags);
    let address = p
        .wait_for_log("serving client traffic", START_DEADLINE)
        .and_then(|line| json_field(&line, "address"))
        .unwrap_or_else(|| panic!("oxcd did not start serving; log:\n{}", p.log_text()));
    p.endpoint = format!("http://{address}");
    if p.wait_for_log("ready to serve client requests", START_DEADLINE)
        .is_none()
    {
        panic!("oxcd did not become ready; log:\n{}", p.log_text());
    }
    p
}

async fn channel(endpoint: &str) -> Channel {
    Channel::from_shared(endpoint.to_string())
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

/// A request carrying `traceparent` when one is given.
fn with_parent<T>(message: T, traceparent: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(traceparent) = traceparent {
        request
            .metadata_mut()
            .insert("traceparent", traceparent.parse().unwrap());
    }
    request
}

fn put(key: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: b"v".to_vec().into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_rate_zero_only_a_sampled_parents_requests_are_exported() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let member = tokio::task::block_in_place(|| {
        start_traced(
            dir.path(),
            collector.address,
            &["--experimental-distributed-tracing-instance-id", "member-1"],
        )
    });
    assert!(
        member
            .log_text()
            .contains("distributed tracing setup enabled"),
        "{}",
        member.log_text()
    );
    let mut kv = KvClient::new(channel(&member.endpoint).await);

    let sampled_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_span = "00f067aa0ba902b7";
    let unsampled_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let marker_trace = "6bf92f3577b34da6a3ce929d0e0e4738";
    kv.range(with_parent(
        RangeRequest {
            key: b"k".to_vec().into(),
            ..Default::default()
        },
        Some(&format!("00-{sampled_trace}-{parent_span}-01")),
    ))
    .await
    .unwrap();
    kv.put(with_parent(
        put("unsampled"),
        Some(&format!("00-{unsampled_trace}-{parent_span}-00")),
    ))
    .await
    .unwrap();
    kv.put(with_parent(put("no-parent"), None)).await.unwrap();
    // an error answered trailers-only: a future revision is OutOfRange
    let refused = kv
        .range(with_parent(
            RangeRequest {
                key: b"k".to_vec().into(),
                revision: 1_000_000,
                ..Default::default()
            },
            Some(&format!("00-{marker_trace}-{parent_span}-01")),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange);

    let range = collector.wait_for_trace(&unhex(sampled_trace)).await;
    assert_eq!(range.span.name, "etcdserverpb.KV/Range");
    assert_eq!(range.span.kind, SpanKind::Server as i32);
    assert_eq!(hex(&range.span.parent_span_id), parent_span);
    // as etcd's: the parent's is-remote bits
    assert_eq!(range.span.flags, 0x300);
    assert_eq!(range.scope, OTELGRPC_SCOPE);
    let attributes = &range.span.attributes;
    assert_eq!(
        string_attribute(attributes, "rpc.system").as_deref(),
        Some("grpc")
    );
    assert_eq!(
        string_attribute(attributes, "rpc.service").as_deref(),
        Some("etcdserverpb.KV")
    );
    assert_eq!(
        string_attribute(attributes, "rpc.method").as_deref(),
        Some("Range")
    );
    assert_eq!(int_attribute(attributes, "rpc.grpc.status_code"), Some(0));
    assert_eq!(
        string_attribute(attributes, "net.sock.peer.addr").as_deref(),
        Some("127.0.0.1")
    );
    assert!(int_attribute(attributes, "net.sock.peer.port").is_some_and(|p| p > 0));
    assert!(range.span.end_time_unix_nano >= range.span.start_time_unix_nano);
    let status = range.span.status.clone().unwrap_or_default();
    assert_eq!(status.code, StatusCode::Unset as i32);
    assert_eq!(
        string_attribute(&range.resource, "service.name").as_deref(),
        Some("etcd")
    );
    assert_eq!(
        string_attribute(&range.resource, "service.instance.id").as_deref(),
        Some("member-1")
    );

    // otelgrpc leaves OutOfRange's span status unset, with the code
    let marker = collector.wait_for_trace(&unhex(marker_trace)).await;
    assert_eq!(
        int_attribute(&marker.span.attributes, "rpc.grpc.status_code"),
        Some(11)
    );
    assert_eq!(
        marker.span.status.unwrap_or_default().code,
        StatusCode::Unset as i32
    );
    // the unsampled requests ended before the marker, so they would have
    // been exported with it or earlier
    let traces: Vec<String> = collector
        .spans()
        .iter()
        .map(|r| hex(&r.span.trace_id))
        .collect();
    assert_eq!(traces.len(), 2, "{traces:?}");
    assert!(!traces.contains(&unsampled_trace.to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_million_every_request_is_exported_and_a_stream_once_it_ends() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let member = tokio::task::block_in_place(|| {
        start_traced(
            dir.path(),
            collector.address,
            &[
                "--experimental-distributed-tracing-sampling-rate",
                "1000000",
                "--experimental-distributed-tracing-service-name",
                "kv-store",
            ],
        )
    });
    let channel = channel(&member.endpoint).await;
    let mut kv = KvClient::new(channel.clone());

    // a parent that says not sampled is followed whatever the rate
    let unsampled_trace = "7bf92f3577b34da6a3ce929d0e0e4739";
    kv.put(with_parent(
        put("unsampled"),
        Some(&format!("00-{unsampled_trace}-00f067aa0ba902b7-00")),
    ))
    .await
    .unwrap();
    let mut watch = WatchClient::new(channel.clone());
    let (requests, request_stream) = tokio::sync::mpsc::channel(1);
    requests
        .send(WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: b"w".to_vec().into(),
                    ..Default::default()
                },
            )),
        })
        .await
        .unwrap();
    let mut responses = watch
        .watch(tokio_stream::wrappers::ReceiverStream::new(request_stream))
        .await
        .unwrap()
        .into_inner();
    let created = responses.message().await.unwrap().unwrap();
    assert!(created.created);
    for key in ["a", "b", "c"] {
        kv.put(put(key)).await.unwrap();
    }
    let puts = collector.wait_for_named("etcdserverpb.KV/Put", 3).await;
    // the watch is still open: its span has not ended
    assert_eq!(puts.len(), 3, "{puts:?}");
    let mut traces: Vec<Vec<u8>> = puts.iter().map(|r| r.span.trace_id.clone()).collect();
    traces.sort();
    traces.dedup();
    assert_eq!(traces.len(), 3, "each root request is its own trace");
    // roots too carry etcd's flags (otelgrpc marks the empty parent remote)
    assert!(puts
        .iter()
        .all(|r| r.span.parent_span_id.is_empty() && r.span.flags == 0x300));
    assert!(collector
        .spans()
        .iter()
        .all(|r| r.span.name != "etcdserverpb.Watch/Watch"));
    let resource = &puts[0].resource;
    assert_eq!(
        string_attribute(resource, "service.name").as_deref(),
        Some("kv-store")
    );
    assert_eq!(string_attribute(resource, "service.instance.id"), None);

    // the client ends the stream: its one span goes out
    drop(requests);
    drop(responses);
    let watches = collector
        .wait_for_named("etcdserverpb.Watch/Watch", 1)
        .await;
    let watch_span = &watches[0].span;
    assert_eq!(watch_span.kind, SpanKind::Server as i32);
    assert_eq!(
        string_attribute(&watch_span.attributes, "rpc.service").as_deref(),
        Some("etcdserverpb.Watch")
    );
    assert!(int_attribute(&watch_span.attributes, "rpc.grpc.status_code").is_some());
    // a later request proves nothing else was pending
    kv.range(RangeRequest {
        key: b"k".to_vec().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    collector.wait_for_named("etcdserverpb.KV/Range", 1).await;
    let spans = collector.spans();
    assert_eq!(
        spans
            .iter()
            .filter(|r| r.span.name == "etcdserverpb.Watch/Watch")
            .count(),
        1
    );
    assert!(spans
        .iter()
        .all(|r| hex(&r.span.trace_id) != unsampled_trace));
}

#[test]
fn a_sampling_rate_outside_a_million_is_refused_with_etcds_error() {
    for (rate, problem) in [
        ("1000001", "tracing sampling rate must be less than 1000000"),
        ("-1", "tracing sampling rate must be positive"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut member = Process::launch_oxcd(
            &oxcd_bin(),
            dir.path(),
            &[
                "--experimental-enable-distributed-tracing",
                "--experimental-distributed-tracing-sampling-rate",
                rate,
            ],
        );
        let status = member.wait_exit(START_DEADLINE).expect("oxcd exits");
        assert!(!status.success());
        let expected = format!("distributed tracing configurition is not valid: ({problem})");
        let refused = member
            .log_lines()
            .into_iter()
            .find(|line| line.contains("failed to verify flags"))
            .unwrap_or_else(|| panic!("{}", member.log_text()));
        assert_eq!(
            json_field(&refused, "error").as_deref(),
            Some(expected.as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_collector_down_the_member_serves_and_logs_the_failed_exports() {
    // nothing listens there
    let address = format!("127.0.0.1:{}", testkit::free_port());
    let dir = tempfile::tempdir().unwrap();
    let mut member = tokio::task::block_in_place(|| {
        start_with_env(
            dir.path(),
            &[
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
            ],
            &[
                "--experimental-enable-distributed-tracing",
                "--experimental-distributed-tracing-address",
                &address,
                "--experimental-distributed-tracing-sampling-rate",
                "1000000",
            ],
        )
    });
    let mut kv = KvClient::new(channel(&member.endpoint).await);
    kv.put(put("before")).await.unwrap();
    let failed =
        tokio::task::block_in_place(|| member.wait_for_log("traces export: ", EXPORT_DEADLINE))
            .unwrap_or_else(|| panic!("no failed export logged:\n{}", member.log_text()));
    // Go's standard logger's line, as etcd's OpenTelemetry error handler writes it
    let expected = regex::Regex::new(
        r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d traces export: context deadline exceeded: rpc error: code = Unavailable desc = ",
    )
    .unwrap();
    assert!(expected.is_match(&failed), "{failed}");
    for i in 0..50 {
        kv.put(put(&format!("after-{i}"))).await.unwrap();
    }
    let got = kv
        .range(RangeRequest {
            key: b"after-49".to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.count, 1);
    // stopping sends what is queued, within its bound
    let status = tokio::task::block_in_place(|| member.terminate(START_DEADLINE));
    assert!(status.is_some_and(|s| s.success()), "{}", member.log_text());
}
