//! `--experimental-enable-distributed-tracing`: an OpenTelemetry span for
//! every gRPC request on the client port, sent to an OTLP collector, as
//! etcd 3.5 does with otelgrpc's interceptors (embed/config_tracing.go,
//! v3rpc/grpc.go).
//!
//! - Sampling is etcd's `ParentBased(rate == 0 ? NeverSample :
//!   TraceIDRatioBased(rate / 1e6))`: a request whose W3C `traceparent`
//!   names a parent follows the parent's sampled flag; one without is
//!   sampled by its trace id at the configured rate (none at the default 0).
//! - Spans are named and attributed as otelgrpc 0.46 makes them
//!   ([`layer`]); the resource has `service.name` and, when set,
//!   `service.instance.id`, over any `OTEL_RESOURCE_ATTRIBUTES`.
//! - OpenTelemetry's batch span processor queues ended spans (2048, the
//!   newest dropped when full; `OTEL_BSP_*` variables honoured, as Go's SDK
//!   does) and hands batches to [`exporter`], which sends them over
//!   plain-text gRPC with otlptracegrpc's deadline and retries, and logs a
//!   failure as etcd's OpenTelemetry error handler does.
//!
//! Off (the default), nothing of this exists: no layer on the routes, no
//! thread, no queue.

mod exporter;
mod layer;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::resource::EnvResourceDetector;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use etcdserver::config::DistributedTracing;

pub(crate) use layer::RequestTracingLayer;

/// etcd's maxSamplingRatePerMillion.
const SAMPLING_RATE_DENOMINATOR: f64 = 1_000_000.0;

/// The instrumentation scope of etcd's spans: otelgrpc's, at the version
/// etcd 3.5.16 builds with.
const SCOPE_NAME: &str =
    "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc";
const SCOPE_VERSION: &str = "0.46.0";

/// How long stopping waits for the spans still queued to be sent (the SDK's
/// default shutdown timeout); a collector that does not answer by then
/// loses them.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// A member's tracing: the SDK's provider (sampler, batch queue, export
/// thread) and the layer that records the requests.
pub(crate) struct RequestTracing {
    provider: SdkTracerProvider,
    layer: RequestTracingLayer,
}

impl RequestTracing {
    /// Sets tracing up for `cfg` (within the runtime that will carry the
    /// exports), logging etcd's lines. Nothing is dialed yet: a collector
    /// that is down or an address that cannot be reached shows only as
    /// failed exports, as in etcd.
    pub(crate) fn start(cfg: &DistributedTracing) -> RequestTracing {
        let exporter = exporter::OtlpExporter::new(&cfg.address, tokio::runtime::Handle::current());
        let mut attributes = vec![KeyValue::new("service.name", cfg.service_name.clone())];
        // etcd sets the instance id only when it is not empty: an id must be
        // unique, so the empty default must not be shared by all members
        if !cfg.service_instance_id.is_empty() {
            attributes.push(KeyValue::new(
                "service.instance.id",
                cfg.service_instance_id.clone(),
            ));
        }
        // Go's SDK merges resource.Environment() under the given resource
        let resource = Resource::builder_empty()
            .with_detector(Box::new(EnvResourceDetector::new()))
            .with_attributes(attributes)
            .build();
        let root_sampler = match cfg.sampling_rate_per_million {
            0 => Sampler::AlwaysOff,
            rate => Sampler::TraceIdRatioBased(f64::from(rate) / SAMPLING_RATE_DENOMINATOR),
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .with_resource(resource)
            .with_sampler(Sampler::ParentBased(Box::new(root_sampler)))
            .build();
        let tracer = provider.tracer_with_scope(
            InstrumentationScope::builder(SCOPE_NAME)
                .with_version(SCOPE_VERSION)
                .build(),
        );
        tracing::debug!(
            address = %cfg.address,
            "service-name" = %cfg.service_name,
            "service-instance-id" = %cfg.service_instance_id,
            "distributed tracing enabled"
        );
        tracing::info!("distributed tracing setup enabled");
        RequestTracing {
            provider,
            layer: RequestTracingLayer::new(tracer, cfg.sampling_rate_per_million),
        }
    }

    /// The layer for the client port's gRPC routes.
    pub(crate) fn layer(&self) -> RequestTracingLayer {
        self.layer.clone()
    }

    /// Sends what is still queued and stops the export thread (blocking:
    /// call it off the runtime's workers).
    pub(crate) fn shutdown(self) {
        // an error here is a timeout or a second shutdown: nothing to do
        let _ = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
    }
}
