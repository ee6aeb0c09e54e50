//! The streams' metrics (issue #25): SSE and HTTP-streaming connections
//! open, opened and refused, by transport. Their deliveries, closes and
//! queues count in the connection metrics too: a stream is a connection.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::register::{counter_vec, register};

/// Every `transport` label.
pub const STREAM_TRANSPORTS: [&str; 2] = ["sse", "ndjson"];

/// Every `reason` of `herald_streams_refused_total`.
pub const STREAM_REFUSALS: [&str; 12] = [
    "malformed",
    "too_large",
    "timeout",
    "too_many_topics",
    "bad_topic",
    "unknown_namespace",
    "unauthorized",
    "origin",
    "draining",
    "not_ready",
    "at_capacity",
    "per_ip",
];

pub struct StreamMetrics {
    pub open: IntGaugeVec,
    pub opened: IntCounterVec,
    pub refused: IntCounterVec,
    /// Commands posted to a stream's session (`POST /stream/<session>`).
    pub commands: IntCounterVec,
    /// Those forwarded to the pod that holds the session.
    pub commands_forwarded: IntCounterVec,
}

impl StreamMetrics {
    pub fn new(r: &Registry) -> Self {
        let open = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "herald_streams_open",
                    "Open SSE (`GET /sse`) and HTTP-streaming (`POST /stream`) connections, by transport.",
                ),
                &["transport"],
            )
            .unwrap_or_else(|_| unreachable!()),
        );
        let opened = counter_vec(
            r,
            "herald_streams_opened_total",
            "SSE and HTTP-streaming connections opened (their response began), by transport.",
            &["transport"],
        );
        let refused = counter_vec(
            r,
            "herald_streams_refused_total",
            "SSE and HTTP-streaming requests refused before their response began, by transport and reason.",
            &["transport", "reason"],
        );
        for transport in STREAM_TRANSPORTS {
            open.with_label_values(&[transport]);
            opened.with_label_values(&[transport]);
            for reason in STREAM_REFUSALS {
                refused.with_label_values(&[transport, reason]);
            }
        }
        let commands = counter_vec(
            r,
            "herald_stream_commands_total",
            "Commands posted to HTTP-streaming sessions, by result.",
            &["result"],
        );
        let commands_forwarded = counter_vec(
            r,
            "herald_stream_commands_forwarded_total",
            "Posted commands forwarded to the pod holding their session, by result.",
            &["result"],
        );
        Self {
            open,
            opened,
            refused,
            commands,
            commands_forwarded,
        }
    }
}
