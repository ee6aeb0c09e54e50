//! The metrics of HTTP-streaming's command POSTs (issue #25,
//! [`crate::stream_commands`]): each POST by its answer, and the forwards
//! between pods by what became of them.

use prometheus::{IntCounterVec, Registry};

use super::register::counter_vec;

/// Every `result` of `herald_stream_commands_total`: `accepted` (202), or
/// the `error.code` of the refusal.
pub const STREAM_COMMAND_RESULTS: [&str; 10] = [
    "accepted",
    "unknown_session",
    "unauthorized",
    "forbidden",
    "malformed",
    "too_large",
    "rate_limited",
    "unavailable",
    "draining",
    "timeout",
];

/// Every `result` of `herald_stream_commands_forwarded_total`: on the pod
/// that took the POST, `sent` to the broker or `failed` (answered 503); on
/// the pod that holds the session, `queued`, `dropped` (too many waited:
/// the client is told) or `other_user` (the session is not the poster's
/// any more: nothing runs).
pub const STREAM_FORWARD_RESULTS: [&str; 5] = ["sent", "failed", "queued", "dropped", "other_user"];

/// The command POSTs' metrics.
pub struct StreamCommandMetrics {
    pub posts: IntCounterVec,
    pub forwarded: IntCounterVec,
}

impl StreamCommandMetrics {
    pub(super) fn new(r: &Registry) -> Self {
        let metrics = Self {
            posts: counter_vec(
                r,
                "herald_stream_commands_total",
                "Command POSTs (POST /stream/<session>) by result: accepted (202), or the error code they were refused with.",
                &["result"],
            ),
            forwarded: counter_vec(
                r,
                "herald_stream_commands_forwarded_total",
                "Command POSTs for a session another pod holds, by result: sent or failed (the pod that took the POST), queued, dropped or other_user (the pod that holds the session).",
                &["result"],
            ),
        };
        for result in STREAM_COMMAND_RESULTS {
            metrics.posts.with_label_values(&[result]);
        }
        for result in STREAM_FORWARD_RESULTS {
            metrics.forwarded.with_label_values(&[result]);
        }
        metrics
    }
}
