//! Every metric the gateway exports, named in one place.
//!
//! Label values come from closed sets (close reasons, drop reasons, HTTP
//! statuses, gRPC methods and codes: [`labels`]): never a topic or a session.

mod delta;
mod labels;
mod lag;
mod observer;
mod proxy;
mod register;
mod stream_commands;
mod streams;

pub use delta::DeltaMetrics;
pub use labels::*;
pub use lag::{CatchUpOutcome, LAG_POLICIES, LagMetrics};
pub use proxy::{PROXIES, PROXY_FAILURES, PROXY_RESULTS, ProxyMetrics};
use register::{BUCKETS, counter, counter_vec, gauge, histogram, register};
pub use stream_commands::{STREAM_COMMAND_RESULTS, STREAM_FORWARD_RESULTS, StreamCommandMetrics};
pub use streams::{STREAM_REFUSALS, STREAM_TRANSPORTS, StreamMetrics};

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::disconnect::CloseReason;

/// The gateway's metrics, on a registry of their own (so that tests can run
/// several gateways in one process).
pub struct Metrics {
    registry: Registry,
    pub connections: IntGauge,
    pub connections_opened: IntCounter,
    connections_closed: IntCounterVec,
    pub connection_panics: IntCounter,
    pub config_reloads: IntCounterVec,
    pub upgrades_rejected: IntCounterVec,
    /// WebSocket upgrades by the subprotocol they negotiated.
    pub connections_protocol: IntCounterVec,
    pub subscriptions: IntGauge,
    pub topics: IntGauge,
    pub published: IntCounter,
    pub delivered: IntCounter,
    pub dropped_queue_full: IntCounter,
    pub bad_commands: IntCounter,
    auth_failures: IntCounterVec,
    pub rate_limited: IntCounter,
    pub http_rejected: IntCounterVec,
    pub replays: IntCounterVec,
    pub replays_running: IntGauge,
    pub replays_refused: IntCounter,
    pub replays_overrun: IntCounter,
    pub replays_lost: IntCounter,
    pub resumes: IntCounterVec,
    pub publish_requests: IntCounterVec,
    pub grpc_requests: IntCounterVec,
    pub ping_rtt: Histogram,
    pub fanout_latency: Histogram,
    pub write_batch_frames: Histogram,
    pub connections_max: IntGauge,
    pub cluster_pods: IntGauge,
    pub cluster_average_connections: IntGauge,
    pub rebalance_moves: IntCounter,
    redis_seconds: HistogramVec,
    redis_errors: IntCounterVec,
    redis_pubsub_up: IntGauge,
    redis_pubsub_reconnects: IntCounter,
    redis_pubsub_lag: Histogram,
    gap_filled: IntCounter,
    resets: IntCounter,
    redis_rewinds: IntCounter,
    redis_pubsub_backlog: IntGauge,
    limit_refusals: IntCounterVec,
    pub budget_principals: IntGauge,
    pub grpc_refused: IntCounterVec,
    pub grpc_connections: IntGauge,
    pub history_reads: IntCounterVec,
    pub server_subscriptions: IntCounterVec,
    pub server_subscriptions_applied: IntCounterVec,
    pub presence_members: IntGauge,
    pub presence_diffs: IntCounter,
    pub presence_queries: HistogramVec,
    pub presence_write_failures: IntCounter,
    pub presence_dead_pods: IntCounter,
    pub presence_dead_pod_members: IntCounter,
    // Webhooks (issue #24).
    pub webhook_events: IntCounterVec,
    pub webhook_batches: IntCounterVec,
    pub webhook_queue: IntGauge,
    pub webhook_post_seconds: Histogram,
    /// The proxies' (issue #24).
    pub proxy: ProxyMetrics,
    /// SSE and HTTP-streaming (issue #25).
    pub streams: StreamMetrics,
    /// HTTP-streaming's command POSTs' (issue #25).
    pub stream_commands: StreamCommandMetrics,
    /// Lagging subscribers' (issue #25).
    pub lag: LagMetrics,
    /// Deltas for state topics' (issue #26).
    pub delta: DeltaMetrics,
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
        // Registered once and never changed: only the registry needs it.
        register(
            r,
            IntGaugeVec::new(
                Opts::new("herald_build_info", "Always 1; the version is a label."),
                &["version"],
            )
            .unwrap_or_else(|_| unreachable!()),
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        let auth_failures = counter_vec(
            r,
            "herald_auth_failures_total",
            "Tokens refused (at hello or refresh), and commands refused by a topic's permissions, by reason.",
            &["reason"],
        );
        for reason in AUTH_FAILURE_REASONS {
            auth_failures.with_label_values(&[reason]);
        }
        let http_rejected = counter_vec(
            r,
            "herald_http_requests_rejected_total",
            "HTTP requests refused or cut off by the pod's limits, by reason.",
            &["reason"],
        );
        for reason in ["busy", "timeout"] {
            http_rejected.with_label_values(&[reason]);
        }
        let limit_refusals = counter_vec(
            r,
            "herald_limit_refusals_total",
            "Client `sub` and `pub` refused by a budget across a user's or an anonymous address's connections, by limit.",
            &["limit"],
        );
        for limit in LIMIT_REFUSALS {
            limit_refusals.with_label_values(&[limit]);
        }
        let grpc_refused = counter_vec(
            r,
            "herald_grpc_refused_total",
            "gRPC calls and connections refused by the pod's limits before a message of theirs was buffered, by reason.",
            &["reason"],
        );
        for reason in GRPC_REFUSAL_REASONS {
            grpc_refused.with_label_values(&[reason]);
        }
        let metrics = Self {
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
            connections_protocol: counter_vec(
                r,
                "herald_connections_protocol_total",
                "WebSocket upgrades answered (101) on /ws, by the protocol they speak: json, or protobuf (herald.v1.protobuf).",
                &["protocol"],
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
            connection_panics: counter(
                r,
                "herald_connection_panics_total",
                "Connection tasks that panicked (a bug): each released what it held, and its client was disconnected.",
            ),
            config_reloads: counter_vec(
                r,
                "herald_config_reloads_total",
                "Reloads of the configuration (SIGHUP, its file changed): applied, or refused and the running one kept (`unreadable`: it did not load; `empty`: the file was empty; `opens_api`: it would remove every API key without `http.open_api`).",
                &["result"],
            ),
            bad_commands: counter(
                r,
                "herald_bad_commands_total",
                "Client commands answered with `err`.",
            ),
            auth_failures,
            rate_limited: counter(
                r,
                "herald_commands_rate_limited_total",
                "Client commands refused with `rate_limited` (over websocket.commands_per_second).",
            ),
            http_rejected,
            replays: counter_vec(
                r,
                "herald_replays_total",
                "Subscriptions with `since`, by whether history covered the gap.",
                &["recovered"],
            ),
            replays_running: gauge(
                r,
                "herald_replays_running",
                "Replays streaming history to a client now (at most replay.max_concurrent).",
            ),
            replays_refused: counter(
                r,
                "herald_replays_refused_total",
                "Replays refused because replay.max_concurrent were running for all of replay.wait: the `sub` got `unavailable`, a resume 4003.",
            ),
            replays_overrun: counter(
                r,
                "herald_replays_overrun_total",
                "Replays whose live messages, held aside meanwhile, outgrew the client's queue bounds: dropped, and read from history instead.",
            ),
            replays_lost: counter(
                r,
                "herald_replays_lost_total",
                "Replays cut short because history no longer continued them (trimmed or expired while paging, or a new epoch): the client got `reset`.",
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
            grpc_requests: counter_vec(
                r,
                "herald_grpc_requests_total",
                "gRPC publish API calls, by method and status code.",
                &["method", "code"],
            ),
            ping_rtt: histogram(
                r,
                "herald_ping_rtt_seconds",
                "Time from a server ping to the client's pong.",
            ),
            fanout_latency: histogram(
                r,
                "herald_fanout_latency_seconds",
                "Time from a publication reaching the pod's hub to its frame written to a client (the oldest frame of each write).",
            ),
            write_batch_frames: register(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "herald_write_batch_frames",
                        "Frames per write to a client: how much its queue held when it was written.",
                    )
                    .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0]),
                )
                .unwrap_or_else(|_| unreachable!()),
            ),
            connections_max: gauge(
                r,
                "herald_connections_max",
                "The pod's connection cap (websocket.max_connections).",
            ),
            cluster_pods: gauge(
                r,
                "herald_cluster_pods",
                "Pods that reported their load in the last rebalance round (0 until one ran).",
            ),
            cluster_average_connections: gauge(
                r,
                "herald_cluster_average_connections",
                "The average connections per pod in the last rebalance round.",
            ),
            rebalance_moves: counter(
                r,
                "herald_rebalance_moves_total",
                "Clients asked to reconnect elsewhere because this pod held more than its share.",
            ),
            redis_seconds: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "herald_redis_command_seconds",
                        "Redis command latency, by operation.",
                    )
                    .buckets(BUCKETS.to_vec()),
                    &["op"],
                )
                .unwrap_or_else(|_| unreachable!()),
            ),
            redis_errors: counter_vec(
                r,
                "herald_redis_errors_total",
                "Redis commands that failed or timed out, by operation.",
                &["op"],
            ),
            redis_pubsub_up: gauge(
                r,
                "herald_redis_pubsub_up",
                "1 while the pod's Redis pub/sub connection is up (0 with the memory broker).",
            ),
            redis_pubsub_reconnects: counter(
                r,
                "herald_redis_pubsub_reconnects_total",
                "Times the pub/sub connection was lost (Redis restart, CLIENT KILL, output buffer limit) and re-established.",
            ),
            redis_pubsub_lag: histogram(
                r,
                "herald_redis_pubsub_lag_seconds",
                "Time from a publish in Redis to its arrival at this pod.",
            ),
            gap_filled: counter(
                r,
                "herald_gap_filled_total",
                "Publications delivered from history because live delivery skipped them.",
            ),
            resets: counter(
                r,
                "herald_topic_resets_total",
                "Times a topic lost continuity on this pod and its subscribers got `reset`.",
            ),
            redis_rewinds: counter(
                r,
                "herald_redis_rewinds_total",
                "Times this pod found Redis gone back in time (lost writes: a restart from an older snapshot, a failover to a lagging replica) and a new lineage begun.",
            ),
            redis_pubsub_backlog: gauge(
                r,
                "herald_redis_pubsub_backlog",
                "Announcements held aside while topics' history is read from Redis (a gap, a reconnect): what waits for Redis on this pod.",
            ),
            limit_refusals,
            budget_principals: gauge(
                r,
                "herald_budget_principals",
                "Users and anonymous address prefixes with a connection on this pod, whose budgets it keeps.",
            ),
            grpc_refused,
            grpc_connections: gauge(r, "herald_grpc_connections", "Open gRPC connections."),
            history_reads: counter_vec(
                r,
                "herald_history_reads_total",
                "History API reads (client `history`, HTTP, gRPC), by outcome.",
                &["outcome"],
            ),
            server_subscriptions: counter_vec(
                r,
                "herald_server_subscriptions_total",
                "Backend server-side subscribe and unsubscribe requests (HTTP, gRPC), by command and outcome.",
                &["command", "outcome"],
            ),
            server_subscriptions_applied: counter_vec(
                r,
                "herald_server_subscriptions_applied_total",
                "Server-side subscribe and unsubscribe commands applied to this pod's connections, by command and outcome.",
                &["command", "outcome"],
            ),

            presence_members: gauge(
                r,
                "herald_presence_members",
                "Users with a connection on this pod in a presence topic, counted once per topic (lingering ones included).",
            ),
            presence_diffs: counter(
                r,
                "herald_presence_diffs_total",
                "`presence_diff` frames encoded for a topic's subscribers on this pod (one per topic per diff_interval at most).",
            ),
            presence_queries: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "herald_presence_query_seconds",
                        "Presence queries answered (client `presence`, HTTP and gRPC), by kind (page, stats), and how long each took.",
                    )
                    .buckets(BUCKETS.to_vec()),
                    &["kind"],
                )
                .unwrap_or_else(|_| unreachable!()),
            ),
            presence_write_failures: counter(
                r,
                "herald_presence_write_failures_total",
                "Presence updates of a topic the broker did not take (written again at the next interval).",
            ),
            presence_dead_pods: counter(
                r,
                "herald_presence_dead_pods_total",
                "Dead pods whose presence this pod cleaned up (their liveness key expired).",
            ),
            presence_dead_pod_members: counter(
                r,
                "herald_presence_dead_pod_members_total",
                "Members removed from topics by this pod's cleanups of dead pods.",
            ),
            webhook_events: counter_vec(
                r,
                "herald_webhook_events_total",
                "Webhook events by type and result: queued, sent (acknowledged by the backend), dropped_full (the queue was full), dropped_retries (not acknowledged within retry_for).",
                &["type", "result"],
            ),
            webhook_batches: counter_vec(
                r,
                "herald_webhook_batches_total",
                "Webhook POSTs by result: sent (2xx), failed (another answer or none: tried again), dropped (retry_for over).",
                &["result"],
            ),
            webhook_queue: gauge(
                r,
                "herald_webhook_queue_events",
                "Webhook events waiting in this pod's queue (at most webhooks.queue).",
            ),
            webhook_post_seconds: histogram(
                r,
                "herald_webhook_post_seconds",
                "How long each webhook POST took, answer read.",
            ),
            proxy: ProxyMetrics::new(r),
            streams: StreamMetrics::new(r),
            stream_commands: StreamCommandMetrics::new(r),
            lag: LagMetrics::new(r),
            delta: DeltaMetrics::new(r),
            registry,
        };
        metrics.start_at_zero();
        // permessage-deflate's counters: process-wide (frames are encoded
        // where no pod's metrics are at hand), shown on every registry.
        crate::deflate::register_metrics(&metrics.registry);
        // The process' own fds, resident memory and CPU time (`process_*`),
        // read from /proc at each scrape: the fd and memory alerts compare
        // them with their limits. Only Linux has the collector.
        #[cfg(target_os = "linux")]
        if let Err(e) = metrics.registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        )) {
            tracing::error!(error = %e, "process metrics registration failed");
        }
        metrics
    }

    /// Announcements held aside on this pod while topics' history is read
    /// (`herald_redis_pubsub_backlog`), for the admin status.
    pub fn pubsub_backlog(&self) -> i64 {
        self.redis_pubsub_backlog.get()
    }

    /// Creates every known label value at 0, so that the first increment is a
    /// visible change (`rate` ignores a series' first sample).
    fn start_at_zero(&self) {
        for reason in [
            "bad_handshake",
            "draining",
            "origin",
            "at_capacity",
            "per_ip",
            "not_ready",
        ] {
            self.upgrades_rejected.with_label_values(&[reason]);
        }
        for protocol in PROTOCOLS {
            self.connections_protocol.with_label_values(&[protocol]);
        }
        for outcome in ["true", "false"] {
            self.replays.with_label_values(&[outcome]);
            self.resumes.with_label_values(&[outcome]);
        }
        for kind in ["page", "stats"] {
            self.presence_queries.with_label_values(&[kind]);
        }
        for status in ["200", "400", "401", "413", "503"] {
            self.publish_requests.with_label_values(&[status]);
        }
        for outcome in HISTORY_OUTCOMES {
            self.history_reads.with_label_values(&[outcome]);
        }
        for command in SERVER_SUBSCRIPTION_COMMANDS {
            for outcome in SERVER_SUBSCRIPTION_OUTCOMES {
                self.server_subscriptions
                    .with_label_values(&[command, outcome]);
            }
            for outcome in SERVER_SUBSCRIPTION_APPLIED {
                self.server_subscriptions_applied
                    .with_label_values(&[command, outcome]);
            }
        }
        for op in [
            "publish",
            "recover",
            "history",
            "subscription",
            "fill",
            "subscribe",
            "session_save",
            "session_load",
            "replay",
            "presence_write",
            "presence_read",
            "presence_list",
            "presence_beat",
            "presence_clean",
            "resumed",
            "session_user",
            "forward",
        ] {
            self.redis_seconds.with_label_values(&[op]);
            self.redis_errors.with_label_values(&[op]);
        }
    }

    /// A token refused, or a topic's rule refusing a command
    /// ([`AUTH_FAILURE_REASONS`]).
    pub fn auth_failed(&self, reason: &str) {
        self.auth_failures.with_label_values(&[reason]).inc();
    }

    /// A `sub` or `pub` over a budget ([`LIMIT_REFUSALS`]).
    pub fn limit_refused(&self, limit: &str) {
        self.limit_refusals.with_label_values(&[limit]).inc();
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
