//! OpenTelemetry traces of the publish path, exported over OTLP/gRPC; off
//! unless `telemetry.otlp_endpoint` is set (docs/tracing.md).
//!
//! The spans are `tracing` spans with the target [`TARGET`], bridged to
//! OpenTelemetry by `tracing-opentelemetry`. Without an endpoint no layer
//! wants that target and the log filter turns it off, so each span is a
//! disabled callsite: one cached check, no allocation, nothing recorded.
//!
//! - `herald.publish`: one per HTTP `POST /v1/publish` or gRPC `Publish` /
//!   `PublishBatch` call, the child of the publisher's W3C `traceparent`
//!   (header or metadata) when it sends one.
//! - `herald.router.publish`: its child, one per item: the broker's publish.
//!   The embedded broker fans out within it; Redis announces the publication
//!   with the span's `traceparent` when it is sampled.
//! - `herald.fan_out`: the push to this pod's subscribers, the child of the
//!   router span (embedded broker) or of the `traceparent` that came with the
//!   announcement (Redis, on every pod that has subscribers).

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::registry::LookupSpan;

use crate::config::TelemetryConfig;

/// The `tracing` target of every span exported as a trace: the layer that
/// exports takes this target only, and the log output never shows it.
pub const TARGET: &str = "herald::trace";

/// Longest one export may take; a collector that does not answer costs
/// spans, never a publish. Short, as the flush at exit waits for it within
/// the pod's grace period.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(3);

/// What went wrong setting up the exporter.
#[derive(Debug, thiserror::Error)]
#[error("OTLP exporter: {0}")]
pub struct TelemetryError(#[from] opentelemetry_otlp::ExporterBuildError);

/// The tracer provider, when tracing is on: it holds the batch exporter,
/// which [`Tracing::shutdown`] flushes.
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Builds the OTLP exporter and provider, or `None` when no endpoint is
    /// configured. Must run inside the tokio runtime: tonic's channel lives
    /// there.
    pub fn start(config: &TelemetryConfig) -> Result<Option<Self>, TelemetryError> {
        if config.otlp_endpoint.is_empty() {
            return Ok(None);
        }
        let exporter = SpanExporter::builder()
            .with_tonic()
            .with_endpoint(config.otlp_endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()?;
        // Parent-based: a publisher's sampling decision stands; the ratio
        // decides for publishes that come without one.
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(sampler)
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        Ok(Some(Self { provider }))
    }

    /// The layer that turns spans of [`TARGET`] into OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let tracer = self.provider.tracer("herald");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // Our spans say what they are; thread ids and code paths are noise.
            .with_threads(false)
            .with_location(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target(TARGET, LevelFilter::TRACE))
    }

    /// Exports what is still batched and stops the exporter. Blocks: call it
    /// after the drain, outside the runtime's worker threads.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "traces not flushed at exit");
        }
    }
}

/// Where a publish came from, for the span's name and attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Http,
    HttpBatch,
    GrpcPublish,
    GrpcPublishBatch,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Self::Http => "POST /v1/publish",
            Self::HttpBatch => "POST /v1/publish/batch",
            Self::GrpcPublish => "herald.v1.Publisher/Publish",
            Self::GrpcPublishBatch => "herald.v1.Publisher/PublishBatch",
        }
    }
}

/// The span of one publish request: a child of the publisher's
/// `traceparent` (and `tracestate`) when `headers` carry one.
pub fn publish_span<'a>(api: Api, headers: impl Extractor + 'a) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "herald.publish",
        otel.kind = "server",
        herald.method = api.name(),
        otel.status_code = tracing::field::Empty,
        otel.status_message = tracing::field::Empty,
        herald.api = if matches!(api, Api::Http | Api::HttpBatch) { "http" } else { "grpc" },
    );
    if !span.is_disabled() {
        let parent = TraceContextPropagator::new().extract(&headers);
        if parent.span().span_context().is_valid() {
            let _ = span.set_parent(parent);
        }
    }
    span
}

/// Marks `span` (a publish or router span) as failed.
pub fn failed(span: &Span, message: &dyn std::fmt::Display) {
    if !span.is_disabled() {
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_message", tracing::field::display(message));
    }
}

/// The span of one publish through the broker, a child of the current
/// (publish) span.
pub fn router_span(topic: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "herald.router.publish",
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        otel.status_message = tracing::field::Empty,
        herald.topic = topic,
        herald.seq = tracing::field::Empty,
        herald.epoch = tracing::field::Empty,
    )
}

/// The span of a fan-out to this pod's subscribers: a child of the current
/// span, or of `traceparent` (a publish on another pod) when given. `None`
/// when there is nothing to trace: tracing off, or a publication that comes
/// from an untraced publish (an untraced Redis announcement, a gap filled
/// from history) — such a fan-out would only start a trace of its own.
pub fn fan_out_span(topic: &str, seq: u64, traceparent: Option<&str>) -> Option<Span> {
    if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
        return None;
    }
    let parent = match traceparent {
        Some(traceparent) => {
            let parent = TraceContextPropagator::new().extract(&Traceparent(traceparent));
            if !parent.span().span_context().is_valid() {
                return None;
            }
            Some(parent)
        }
        // Only within one of ours (the embedded broker's publish): a client's
        // `pub` over WebSocket has no publish span and starts no trace.
        None if Span::current()
            .metadata()
            .is_none_or(|m| m.target() != TARGET) =>
        {
            return None;
        }
        None => None,
    };
    let span = tracing::info_span!(
        target: TARGET,
        "herald.fan_out",
        otel.kind = if parent.is_some() { "consumer" } else { "internal" },
        herald.topic = topic,
        herald.seq = int(seq),
        herald.subscribers = tracing::field::Empty,
    );
    if let Some(parent) = parent {
        let _ = span.set_parent(parent);
    }
    Some(span)
}

/// The W3C `traceparent` of `span`, if it is sampled: what a traced publish
/// carries to the pods that deliver it. `None` for a disabled or unsampled
/// span, so that an untraced publish carries nothing.
pub fn traceparent(span: &Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_sampled() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// `n` as an attribute: OpenTelemetry has signed integers only (and
/// tracing-opentelemetry writes a `u64` as text).
pub fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// A lone `traceparent` as a carrier for the propagator.
struct Traceparent<'a>(&'a str);

impl Extractor for Traceparent<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == "traceparent").then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

/// HTTP headers as a carrier (also gRPC metadata, through its header map).
pub struct Headers<'a>(pub &'a hyper::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}
