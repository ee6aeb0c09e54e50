//! Every metric the gateway exports, named in one place.
//!
//! Label values come from closed sets (close reasons, drop reasons, HTTP
//! statuses): never a topic or a session.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::disconnect::CloseReason;

/// The gateway's metrics, on a registry of their own (so that tests can run
/// several gateways in one process).
pub struct Metrics {
    registry: Registry,
    pub connections: IntGauge,
    pub connections_opened: IntCounter,
    connections_closed: IntCounterVec,
    pub upgrades_rejected: IntCounterVec,
    pub subscriptions: IntGauge,
    pub topics: IntGauge,
    pub published: IntCounter,
    pub delivered: IntCounter,
    pub dropped_queue_full: IntCounter,
    pub bad_commands: IntCounter,
    pub replays: IntCounterVec,
    pub resumes: IntCounterVec,
    pub publish_requests: IntCounterVec,
    pub ping_rtt: Histogram,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let r = &registry;
        let closed = counter_vec(
            r,
            "herald_connections_closed_total",
            "WebSocket connections closed, by reason (slow_consumer and dead_peer among them).",
            &["reason"],
        );
        for reason in CloseReason::ALL {
            closed.with_label_values(&[reason.as_str()]);
        }
        let dropped = counter_vec(
            r,
            "herald_messages_dropped_total",
            "Messages not delivered to a subscriber, by reason.",
            &["reason"],
        );
        Self {
            connections: gauge(r, "herald_connections", "Open WebSocket connections."),
            connections_opened: counter(
                r,
                "herald_connections_opened_total",
                "WebSocket connections accepted.",
            ),
            connections_closed: closed,
            upgrades_rejected: counter_vec(
                r,
                "herald_upgrades_rejected_total",
                "WebSocket upgrades refused before the handshake, by reason.",
                &["reason"],
            ),
            subscriptions: gauge(r, "herald_subscriptions", "Live subscriptions on this pod."),
            topics: gauge(
                r,
                "herald_topics",
                "Topics with at least one subscriber on this pod.",
            ),
            published: counter(r, "herald_messages_published_total", "Publishes accepted."),
            delivered: counter(
                r,
                "herald_messages_delivered_total",
                "Frames written to clients (messages, replies and replays).",
            ),
            dropped_queue_full: dropped.with_label_values(&["queue_full"]),
            bad_commands: counter(
                r,
                "herald_bad_commands_total",
                "Client commands answered with `err`.",
            ),
            replays: counter_vec(
                r,
                "herald_replays_total",
                "Subscriptions with `since`, by whether history covered the gap.",
                &["recovered"],
            ),
            resumes: counter_vec(
                r,
                "herald_resumes_total",
                "`hello` with `resume`, by whether the session was still there.",
                &["resumed"],
            ),
            publish_requests: counter_vec(
                r,
                "herald_publish_requests_total",
                "HTTP publish requests, by status code.",
                &["status"],
            ),
            ping_rtt: histogram(
                r,
                "herald_ping_rtt_seconds",
                "Time from a server ping to the client's pong.",
            ),
            registry,
        }
    }

    pub fn closed(&self, reason: CloseReason) {
        self.connections_closed
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding into a Vec only fails on metric families the registry
        // itself would have refused.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

// Registration fails only on a duplicate or malformed name, which the names
// above are not (tests render every metric).
fn register<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    if let Err(e) = r.register(Box::new(c.clone())) {
        tracing::error!(error = %e, "metric registration failed");
    }
    c
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        r,
        IntCounter::with_opts(Opts::new(name, help)).unwrap_or_else(|_| unreachable!()),
    )
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(
        r,
        IntGauge::with_opts(Opts::new(name, help)).unwrap_or_else(|_| unreachable!()),
    )
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|_| unreachable!()),
    )
}

fn histogram(r: &Registry, name: &str, help: &str) -> Histogram {
    let buckets = vec![
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ];
    register(
        r,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
            .unwrap_or_else(|_| unreachable!()),
    )
}
