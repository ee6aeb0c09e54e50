//! OpenTelemetry traces of the publish path, as a collector sees them: the
//! real `herald` binary exports over OTLP/gRPC to a receiver this test runs
//! (the collector's `TraceService`, from `opentelemetry-proto`).
//!
//! A publish over HTTP or gRPC is a `herald.publish` span, the child of the
//! publisher's `traceparent`; the broker's publish is its child
//! (`herald.router.publish`), and the fan-out to local subscribers
//! (`herald.fan_out`, with the subscriber count) the router span's child, on
//! the same pod or, with Redis, on the pod that has the subscribers. An
//! unsampled publisher is not traced, and without an endpoint nothing is
//! exported at all.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use proto::v1::{PublishBatchRequest, PublishRequest};
use serde_json::json;
use testkit::Herald;
use testkit::Redis;
use testkit::{Client, WAIT, grpc_client};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::pod::HERALD;

/// Longest spans may take to arrive: the batch delay is short, the machine
/// may be busy.
const EXPORT_WAIT: Duration = Duration::from_secs(20);

/// A span as received, with the `service.name` of the pod that sent it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn name(&self) -> &str {
        &self.span.name
    }

    fn attr(&self, key: &str) -> Option<&AnyValue> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    fn int(&self, key: &str) -> Option<i64> {
        match self.attr(key)? {
            AnyValue::IntValue(i) => Some(*i),
            _ => None,
        }
    }

    fn string(&self, key: &str) -> Option<&str> {
        match self.attr(key)? {
            AnyValue::StringValue(s) => Some(s),
            _ => None,
        }
    }
}

/// The OTLP receiver: every exported span goes to a channel.
struct Collector {
    spans: mpsc::UnboundedSender<Received>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    AnyValue::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    let _ = self.spans.send(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

struct Receiver {
    endpoint: String,
    spans: mpsc::UnboundedReceiver<Received>,
    /// Everything received so far.
    seen: Vec<Received>,
}

impl Receiver {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, spans) = mpsc::unbounded_channel();
        tokio::spawn(Server::builder().serve_with_incoming_shutdown(
            TraceServiceServer::new(Collector { spans: tx }),
            TcpIncoming::from(listener),
            std::future::pending::<()>(),
        ));
        Self {
            endpoint,
            spans,
            seen: Vec::new(),
        }
    }

    /// Waits until the spans of `trace` include every name of `names`; the
    /// trace's spans so far.
    async fn trace(&mut self, trace: &[u8], names: &[&str]) -> Vec<Received> {
        let deadline = Instant::now() + EXPORT_WAIT;
        loop {
            let spans: Vec<Received> = self
                .seen
                .iter()
                .filter(|r| r.span.trace_id == trace)
                .cloned()
                .collect();
            let missing: Vec<&&str> = names
                .iter()
                .filter(|n| spans.iter().filter(|s| s.name() == **n).count() < count(names, n))
                .collect();
            if missing.is_empty() {
                return spans;
            }
            match tokio::time::timeout_at(deadline, self.spans.recv()).await {
                Ok(Some(span)) => self.seen.push(span),
                _ => panic!(
                    "spans {missing:?} of trace {} not exported within {EXPORT_WAIT:?}; got {:#?}",
                    hex(trace),
                    self.seen
                ),
            }
        }
    }

    /// Everything that arrived up to now.
    fn drain(&mut self) -> &[Received] {
        while let Ok(span) = self.spans.try_recv() {
            self.seen.push(span);
        }
        &self.seen
    }
}

fn count(names: &[&str], name: &str) -> usize {
    names.iter().filter(|n| **n == name).count()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A publisher's span: random trace and span ids, and its `traceparent`.
struct Parent {
    trace: [u8; 16],
    span: [u8; 8],
}

impl Parent {
    fn new() -> Self {
        Self {
            trace: rand_bytes(),
            span: rand_bytes(),
        }
    }

    fn traceparent(&self, sampled: bool) -> String {
        format!(
            "00-{}-{}-{}",
            hex(&self.trace),
            hex(&self.span),
            if sampled { "01" } else { "00" }
        )
    }
}

fn rand_bytes<const N: usize>() -> [u8; N] {
    // Unique enough for a test: a hash of the time and a counter.
    use std::hash::{BuildHasher, Hasher};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let mut out = [0u8; N];
    for chunk in out.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let bytes = h.finish().to_be_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    out
}

fn one<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    let found: Vec<&Received> = spans.iter().filter(|s| s.name() == name).collect();
    assert_eq!(found.len(), 1, "one {name} in {spans:#?}");
    found[0]
}

/// `herald` exporting to `receiver`, after a short batch delay.
async fn traced_herald(receiver: &Receiver, extra: &[(&str, &str)]) -> Herald {
    exporting_herald(&receiver.endpoint, "100", extra).await
}

/// `herald` exporting to `endpoint` batches of spans `batch_delay_ms` apart.
async fn exporting_herald(endpoint: &str, batch_delay_ms: &str, extra: &[(&str, &str)]) -> Herald {
    let mut env = vec![
        ("HERALD_TELEMETRY__OTLP_ENDPOINT", endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", batch_delay_ms),
    ];
    env.extend_from_slice(extra);
    Herald::start(HERALD, &env, &[]).await
}

/// SIGTERM, and `herald` exits with success.
async fn exit_cleanly(herald: &mut Herald) {
    herald.sigterm();
    let status = herald
        .wait_exit(WAIT * 2)
        .await
        .expect("exit after SIGTERM");
    assert!(status.success(), "{status}");
}

async fn http_publish(herald: &Herald, topic: &str, traceparent: &str) {
    let body = json!({"topic": topic, "data": {"n": 1}}).to_string();
    let (status, body) = testkit::http(
        herald.addr,
        "POST",
        "/v1/publish",
        &[("traceparent", traceparent)],
        body.as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

fn with_traceparent<T>(message: T, traceparent: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("ASCII metadata"));
    request
}

fn item(topic: &str) -> PublishRequest {
    PublishRequest {
        topic: topic.to_owned(),
        data: br#"{"n":1}"#.to_vec(),
        idempotency_key: None,
        binary: false,
    }
}

/// The spans of a publish that reaches a subscriber.
const CHAIN: [&str; 3] = ["herald.publish", "herald.router.publish", "herald.fan_out"];

/// Publishes to `news` at `from` unsampled, then sampled, each delivered to
/// `client` (seqs 1 and 2): the sampled publish's spans, a chain from the
/// publisher's span to the fan-out to `client`. Nothing of the unsampled one
/// is exported (parent-based: not sampled by the publisher, not traced here).
async fn sampled_after_unsampled(
    receiver: &mut Receiver,
    from: &Herald,
    client: &mut Client,
) -> Vec<Received> {
    let unsampled = Parent::new();
    http_publish(from, "news", &unsampled.traceparent(false)).await;
    assert_eq!(client.msg().await.1, 1);
    let parent = Parent::new();
    http_publish(from, "news", &parent.traceparent(true)).await;
    assert_eq!(client.msg().await.1, 2);
    let spans = receiver.trace(&parent.trace, &CHAIN).await;
    assert_chain(&spans, &parent, 1);
    assert!(
        receiver
            .drain()
            .iter()
            .all(|s| s.span.trace_id != unsampled.trace),
        "an unsampled publish was exported: {:#?}",
        receiver.seen
    );
    spans
}

/// The publish, router and fan-out spans of one publish on one pod: a chain
/// from the publisher's span, and the fan-out reached `subscribers`.
fn assert_chain(spans: &[Received], parent: &Parent, subscribers: i64) {
    let publish = one(spans, "herald.publish");
    let router = one(spans, "herald.router.publish");
    let fan_out = one(spans, "herald.fan_out");
    assert_eq!(publish.span.parent_span_id, parent.span, "{publish:#?}");
    assert_eq!(
        router.span.parent_span_id, publish.span.span_id,
        "{router:#?}"
    );
    assert_eq!(
        fan_out.span.parent_span_id, router.span.span_id,
        "{fan_out:#?}"
    );
    assert_eq!(
        fan_out.int("herald.subscribers"),
        Some(subscribers),
        "{fan_out:#?}"
    );
    assert_eq!(router.int("herald.seq"), fan_out.int("herald.seq"));
    assert_eq!(
        router.string("herald.topic"),
        fan_out.string("herald.topic")
    );
}

fn load(vars: &[(&str, &str)]) -> Result<gateway::Config, gateway::config::ConfigError> {
    let env = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    gateway::Config::load(None, env)
}

#[test]
fn telemetry_settings_are_checked_and_a_bad_one_is_named() {
    let config = load(&[
        ("HERALD_TELEMETRY__OTLP_ENDPOINT", "http://collector:4317"),
        ("HERALD_TELEMETRY__SERVICE_NAME", "herald-eu"),
        ("HERALD_TELEMETRY__SAMPLE_RATIO", "0.5"),
    ])
    .expect("valid telemetry settings");
    assert_eq!(config.telemetry.otlp_endpoint, "http://collector:4317");
    assert_eq!(config.telemetry.service_name, "herald-eu");
    assert_eq!(config.telemetry.sample_ratio, 0.5);
    // The chart writes a whole ratio as a TOML integer.
    assert_eq!(
        load(&[("HERALD_TELEMETRY__SAMPLE_RATIO", "1")])
            .expect("a whole ratio")
            .telemetry
            .sample_ratio,
        1.0
    );
    let off = load(&[]).expect("the defaults");
    assert!(off.telemetry.otlp_endpoint.is_empty(), "off by default");
    for (var, value, key) in [
        (
            "HERALD_TELEMETRY__OTLP_ENDPOINT",
            "collector:4317",
            "telemetry.otlp_endpoint",
        ),
        (
            "HERALD_TELEMETRY__OTLP_ENDPOINT",
            "https://collector:4317",
            "telemetry.otlp_endpoint",
        ),
        (
            "HERALD_TELEMETRY__OTLP_ENDPOINT",
            "http://",
            "telemetry.otlp_endpoint",
        ),
        (
            "HERALD_TELEMETRY__SERVICE_NAME",
            " ",
            "telemetry.service_name",
        ),
        (
            "HERALD_TELEMETRY__SAMPLE_RATIO",
            "1.5",
            "telemetry.sample_ratio",
        ),
        (
            "HERALD_TELEMETRY__SAMPLE_RATIO",
            "-0.1",
            "telemetry.sample_ratio",
        ),
        (
            "HERALD_TELEMETRY__SAMPLE_RATIO",
            "NaN",
            "telemetry.sample_ratio",
        ),
    ] {
        match load(&[(var, value)]) {
            Err(e) => assert!(e.to_string().contains(key), "{var}={value}: {e}"),
            Ok(_) => panic!("{var}={value} was taken"),
        }
    }
}

#[test]
fn the_binary_refuses_a_bad_endpoint_with_exit_64() {
    let mut command = std::process::Command::new(HERALD);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("HERALD_") {
            command.env_remove(key);
        }
    }
    // --check exits once the configuration is read: no wait to bound.
    let output = command
        .arg("--check")
        .env("HERALD_TELEMETRY__OTLP_ENDPOINT", "grpc://collector")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run herald --check");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("telemetry.otlp_endpoint"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_publish_joins_the_publishers_trace_down_to_the_fan_out() {
    let mut receiver = Receiver::start().await;
    let herald = traced_herald(&receiver, &[]).await;
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    let spans = sampled_after_unsampled(&mut receiver, &herald, &mut client).await;
    let publish = one(&spans, "herald.publish");
    assert_eq!(publish.string("herald.api"), Some("http"));
    assert_eq!(publish.string("herald.method"), Some("POST /v1/publish"));
    let router = one(&spans, "herald.router.publish");
    assert_eq!(router.string("herald.topic"), Some("news"));
    assert_eq!(router.int("herald.seq"), Some(2));
    assert_eq!(publish.service, "herald");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_publishes_join_the_publishers_trace_from_metadata() {
    let mut receiver = Receiver::start().await;
    let herald = traced_herald(&receiver, &[]).await;
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    let mut grpc = grpc_client(herald.grpc_addr).await;

    let parent = Parent::new();
    grpc.publish(with_traceparent(item("news"), &parent.traceparent(true)))
        .await
        .expect("Publish");
    assert_eq!(client.msg().await.1, 1);
    let spans = receiver.trace(&parent.trace, &CHAIN).await;
    assert_chain(&spans, &parent, 1);
    assert_eq!(
        one(&spans, "herald.publish").string("herald.api"),
        Some("grpc")
    );

    // A batch is one publish span, with a router span (and its fan-out) per item.
    let batch = Parent::new();
    let items = PublishBatchRequest {
        items: vec![item("news"), item("other")],
    };
    grpc.publish_batch(with_traceparent(items, &batch.traceparent(true)))
        .await
        .expect("PublishBatch");
    assert_eq!(client.msg().await.1, 2);
    let names = [
        "herald.publish",
        "herald.router.publish",
        "herald.router.publish",
        "herald.fan_out",
    ];
    let spans = receiver.trace(&batch.trace, &names).await;
    let publish = one(&spans, "herald.publish");
    assert_eq!(publish.span.parent_span_id, batch.span);
    let routers: Vec<&Received> = spans
        .iter()
        .filter(|s| s.name() == "herald.router.publish")
        .collect();
    assert!(
        routers
            .iter()
            .all(|r| r.span.parent_span_id == publish.span.span_id),
        "{routers:#?}"
    );
    // `news` has a subscriber here; `other` is watched by no one, so the
    // embedded broker does not hand it to the hub at all.
    let news = routers
        .iter()
        .find(|r| r.string("herald.topic") == Some("news"))
        .expect("the router span of `news`");
    let fan_out = one(&spans, "herald.fan_out");
    assert_eq!(fan_out.span.parent_span_id, news.span.span_id);
    assert_eq!(fan_out.int("herald.subscribers"), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_batched_is_exported_on_sigterm() {
    let mut receiver = Receiver::start().await;
    // A batch delay far beyond the test: only the flush at exit sends.
    let mut herald = exporting_herald(&receiver.endpoint, "600000", &[]).await;
    let parent = Parent::new();
    http_publish(&herald, "news", &parent.traceparent(true)).await;
    exit_cleanly(&mut herald).await;
    // No subscriber: the embedded broker fans out to nobody, so no fan-out span.
    let spans = receiver
        .trace(&parent.trace, &["herald.publish", "herald.router.publish"])
        .await;
    assert_eq!(spans.len(), 2, "{spans:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_no_publish() {
    // A loopback port nobody listens on.
    let endpoint = format!("http://127.0.0.1:{}", testkit::herald::free_port());
    let mut herald = exporting_herald(&endpoint, "50", &[]).await;
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    for seq in 1..=3 {
        http_publish(&herald, "news", &Parent::new().traceparent(true)).await;
        assert_eq!(client.msg().await.1, seq);
    }
    drop(client);
    exit_cleanly(&mut herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_exported() {
    let mut receiver = Receiver::start().await;
    // The SDK's own variable names the receiver: herald must not follow it.
    let mut herald = Herald::start(
        HERALD,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
        &[],
    )
    .await;
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    let parent = Parent::new();
    http_publish(&herald, "news", &parent.traceparent(true)).await;
    assert_eq!(client.msg().await.1, 1);
    let mut grpc = grpc_client(herald.grpc_addr).await;
    grpc.publish(with_traceparent(item("news"), &parent.traceparent(true)))
        .await
        .expect("Publish");
    assert_eq!(client.msg().await.1, 2);

    // A traced herald flushes at exit: once this one has exited, whatever it
    // would have exported has arrived.
    drop(client);
    exit_cleanly(&mut herald).await;
    assert!(
        receiver.drain().is_empty(),
        "exported without an endpoint: {:#?}",
        receiver.seen
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_redis_the_other_pods_fan_out_joins_the_trace() {
    let redis = Redis::start().await;
    let url = redis.url();
    let mut receiver = Receiver::start().await;
    let pod = |name: &'static str| {
        vec![
            ("HERALD_BROKER", "redis"),
            ("HERALD_REDIS__URL", url.as_str()),
            ("HERALD_TELEMETRY__SERVICE_NAME", name),
        ]
    };
    let a = traced_herald(&receiver, &pod("herald-a")).await;
    let b = traced_herald(&receiver, &pod("herald-b")).await;
    let mut client = Client::subscriber(&b.ws_url(), "news").await;

    // Untraced first: delivered as always (the announcement carries nothing).
    let spans = sampled_after_unsampled(&mut receiver, &a, &mut client).await;
    assert_eq!(one(&spans, "herald.publish").service, "herald-a");
    assert_eq!(one(&spans, "herald.router.publish").service, "herald-a");
    assert_eq!(one(&spans, "herald.fan_out").service, "herald-b");
}
