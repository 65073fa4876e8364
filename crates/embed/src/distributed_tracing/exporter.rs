//! The OTLP/gRPC span exporter, as etcd's otlptracegrpc (OpenTelemetry Go
//! 1.20) sends: plain-text gRPC to the collector's `host:port`, each batch
//! within a 10 s deadline, retried with exponential backoff (5 s at first,
//! randomized by half, growing by half) while the collector answers with a
//! retryable code and the deadline allows.
//!
//! A batch that cannot be sent is logged as etcd's OpenTelemetry error
//! handler logs it: Go's standard logger on stderr, `traces export: ` and
//! the error (`context deadline exceeded: rpc error: code = Unavailable
//! desc = ...` when the retries ran into the deadline); the spans are then
//! dropped. The batch processor's thread blocks while a batch is sent
//! (spans that end meanwhile wait in its bounded queue), so at most one
//! line per batch is logged.

use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use tonic::transport::Channel;

/// otlptracegrpc's default export timeout: the whole of a batch's attempts.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// What bounds a batch's attempts when the timeout is set to 0 (no
/// deadline in otlptracegrpc): its retries' MaxElapsedTime.
const RETRY_MAX_ELAPSED: Duration = Duration::from_secs(60);
/// otlptracegrpc's default retry: the first wait, its cap, and backoff's
/// randomization and growth.
const RETRY_INITIAL_INTERVAL: Duration = Duration::from_secs(5);
const RETRY_MAX_INTERVAL: Duration = Duration::from_secs(30);
const RETRY_RANDOMIZATION: f64 = 0.5;
const RETRY_MULTIPLIER: f64 = 1.5;

/// An OTLP span's flags SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK |
/// SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK: the parent is known to be remote.
const PARENT_IS_REMOTE_FLAGS: u32 = 0x300;

/// gRPC's codes as grpc-go prints them.
const CODE_NAMES: [&str; 17] = etcdserver::metrics::grpc::CODES;

pub(super) struct OtlpExporter {
    /// How long a batch's attempts may take ([`export_timeout`]).
    timeout: Duration,
    /// None: the address is no URI authority (etcd's dial would fail alike;
    /// every export then fails with the reason).
    client: Result<TraceServiceClient<Channel>, String>,
    resource: ResourceAttributesWithSchema,
    /// The runtime that carries the gRPC calls: the batch processor calls
    /// [`SpanExporter::export`] from its own thread.
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtlpExporter")
    }
}

impl OtlpExporter {
    /// An exporter to `address` (`host:port`); connects at the first export.
    /// Must be called within `runtime`.
    pub(super) fn new(address: &str, runtime: tokio::runtime::Handle) -> OtlpExporter {
        let client = Channel::from_shared(format!("http://{address}"))
            .map(|endpoint| TraceServiceClient::new(endpoint.connect_lazy()))
            .map_err(|e| format!("cannot dial {address:?}: {e}"));
        OtlpExporter {
            timeout: export_timeout(|name| std::env::var(name).ok()),
            client,
            resource: ResourceAttributesWithSchema::default(),
            runtime,
        }
    }
}

impl SpanExporter for OtlpExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut resource_spans = group_spans_by_resource_and_scope(batch, &self.resource);
        // etcd's spans all carry these flags (seen from etcd 3.5.16): its
        // exporter sends only the parent's is-remote bits, and otelgrpc
        // marks the parent remote even when the request names none
        for scope in resource_spans
            .iter_mut()
            .flat_map(|r| r.scope_spans.iter_mut())
        {
            for span in &mut scope.spans {
                span.flags = PARENT_IS_REMOTE_FLAGS;
            }
        }
        let request = ExportTraceServiceRequest { resource_spans };
        let result = match &self.client {
            Ok(client) => {
                let client = client.clone();
                self.runtime
                    .spawn(export_with_retries(client, request, self.timeout))
                    .await
                    .unwrap_or_else(|e| Err(format!("export task failed: {e}")))
            }
            Err(reason) => export_failure_after_deadline(reason, self.timeout).await,
        };
        result.map_err(|error| {
            go_log(&format!("traces export: {error}"));
            OTelSdkError::InternalFailure(error)
        })
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.into();
    }
}

/// An unusable address fails as an unreachable collector does in etcd:
/// Unavailable, retried until the deadline. Waits without a runtime (the
/// batch processor's thread).
async fn export_failure_after_deadline(reason: &str, timeout: Duration) -> Result<(), String> {
    std::thread::sleep(timeout);
    Err(format!(
        "context deadline exceeded: rpc error: code = Unavailable desc = {reason}"
    ))
}

/// One batch: attempts until success, a code not worth retrying, or the
/// deadline (otlptracegrpc's requestFunc).
async fn export_with_retries(
    mut client: TraceServiceClient<Channel>,
    request: ExportTraceServiceRequest,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut interval = RETRY_INITIAL_INTERVAL;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let attempt = tokio::time::timeout(remaining, client.export(request.clone())).await;
        let status = match attempt {
            Ok(Ok(response)) => {
                if let Some(partial) = response.into_inner().partial_success {
                    if partial.rejected_spans != 0 || !partial.error_message.is_empty() {
                        let message = match partial.error_message.as_str() {
                            "" => "empty message",
                            message => message,
                        };
                        go_log(&format!(
                            "OTLP partial success: {message} ({} spans rejected)",
                            partial.rejected_spans
                        ));
                    }
                }
                return Ok(());
            }
            Ok(Err(status)) => status,
            Err(_) => tonic::Status::deadline_exceeded("context deadline exceeded"),
        };
        let error = rpc_error(&status);
        if !retryable(status.code()) {
            return Err(error);
        }
        let wait = randomized(interval);
        interval = interval.mul_f64(RETRY_MULTIPLIER).min(RETRY_MAX_INTERVAL);
        let remaining = deadline.saturating_duration_since(Instant::now());
        if wait >= remaining {
            tokio::time::sleep(remaining).await;
            return Err(format!("context deadline exceeded: {error}"));
        }
        tokio::time::sleep(wait).await;
    }
}

/// otlptracegrpc's export timeout: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else
/// `OTEL_EXPORTER_OTLP_TIMEOUT` (integer milliseconds; one that does not
/// parse is ignored), else 10 s. At 0 or below otlptracegrpc sets no
/// deadline and its retries stop after a minute: a minute here.
fn export_timeout(var: impl Fn(&str) -> Option<String>) -> Duration {
    let millis = [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|name| var(name)?.parse::<i64>().ok());
    match millis {
        None => EXPORT_TIMEOUT,
        Some(millis) if millis <= 0 => RETRY_MAX_ELAPSED,
        Some(millis) => Duration::from_millis(millis.unsigned_abs()),
    }
}

/// otlptracegrpc's retryable codes (ResourceExhausted only with a
/// RetryInfo, which is not read here: not retried).
fn retryable(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unavailable
            | Code::DataLoss
    )
}

/// backoff's RandomizationFactor: uniformly within ±50% of `interval`.
fn randomized(interval: Duration) -> Duration {
    let spread = RETRY_RANDOMIZATION * (2.0 * fastrand::f64() - 1.0);
    interval.mul_f64(1.0 + spread)
}

/// A status as grpc-go's error prints it; for one tonic made of a transport
/// error, its message then the root cause (`tcp connect error: Connection
/// refused (os error 111)`: the layers between repeat the message).
fn rpc_error(status: &tonic::Status) -> String {
    let code = CODE_NAMES
        .get(status.code() as usize)
        .copied()
        .unwrap_or("Unknown");
    let mut root_cause = None;
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        root_cause = Some(cause.to_string());
        source = cause.source();
    }
    let message = status.message();
    match root_cause.filter(|cause| cause != message) {
        Some(cause) => format!("rpc error: code = {code} desc = {message}: {cause}"),
        None => format!("rpc error: code = {code} desc = {message}"),
    }
}

/// A line as Go's standard logger writes it (`2006/01/02 15:04:05 msg`,
/// local time, on stderr), which is where OpenTelemetry Go's default error
/// handler sends export errors in etcd.
fn go_log(message: &str) {
    eprintln!("{} {message}", local_timestamp());
}

fn local_timestamp() -> String {
    // SAFETY: time(NULL) only reads the clock; localtime_r writes into `tm`,
    // which it owns, and is thread-safe.
    let tm = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return String::new();
        }
        tm
    };
    format!(
        "{:04}/{:02}/{:02} {:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_prints_as_grpc_go_prints_it() {
        let status = tonic::Status::unavailable("connection refused");
        assert_eq!(
            rpc_error(&status),
            "rpc error: code = Unavailable desc = connection refused"
        );
        let status = tonic::Status::cancelled("gone");
        assert_eq!(rpc_error(&status), "rpc error: code = Canceled desc = gone");
    }

    #[test]
    fn the_export_timeout_is_read_as_otlptracegrpc_reads_it() {
        fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |name| {
                pairs
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            }
        }
        assert_eq!(export_timeout(env(&[])), EXPORT_TIMEOUT);
        let general = ("OTEL_EXPORTER_OTLP_TIMEOUT", "3000");
        let traces = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1500");
        assert_eq!(export_timeout(env(&[general])), Duration::from_secs(3));
        // the traces' own variable wins
        assert_eq!(
            export_timeout(env(&[general, traces])),
            Duration::from_millis(1500)
        );
        let unparsed = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon");
        assert_eq!(
            export_timeout(env(&[general, unparsed])),
            Duration::from_secs(3)
        );
        assert_eq!(export_timeout(env(&[unparsed])), EXPORT_TIMEOUT);
        let zero = ("OTEL_EXPORTER_OTLP_TIMEOUT", "0");
        assert_eq!(export_timeout(env(&[zero])), RETRY_MAX_ELAPSED);
    }

    #[test]
    fn only_otlptracegrpc_retryable_codes_are_retried() {
        assert!(retryable(tonic::Code::Unavailable));
        assert!(retryable(tonic::Code::DeadlineExceeded));
        assert!(!retryable(tonic::Code::Unimplemented));
        assert!(!retryable(tonic::Code::InvalidArgument));
        assert!(!retryable(tonic::Code::ResourceExhausted));
    }

    #[test]
    fn backoff_stays_within_half_of_its_interval() {
        for _ in 0..1000 {
            let wait = randomized(RETRY_INITIAL_INTERVAL);
            assert!(wait >= Duration::from_millis(2500) && wait <= Duration::from_millis(7500));
        }
    }
}
