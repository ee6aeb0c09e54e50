//! The proxies' metrics (issue #24, [`crate::hooks`]): calls by result,
//! failures by reason, how long calls take and how many are in flight, per
//! proxy.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::register::{counter_vec, register};

/// Every `proxy` label: the proxies of `[proxy]`.
pub const PROXIES: [&str; 5] = ["connect", "refresh", "subscribe", "publish", "rpc"];

/// Every `result` of `herald_proxy_calls_total`: approved, the backend's
/// refusals (`401`, `403`, a named error), and no usable answer.
pub const PROXY_RESULTS: [&str; 5] = ["ok", "unauthorized", "forbidden", "refused", "unavailable"];

/// Every `reason` of `herald_proxy_failures_total`: the labels of
/// [`crate::hooks::Failure`] (`not_configured` never reaches a metric).
pub const PROXY_FAILURES: [&str; 8] = [
    "saturated",
    "timeout",
    "connect",
    "status",
    "redirect",
    "content_type",
    "too_large",
    "malformed",
];

/// A proxy call's duration, from half a millisecond (a backend on the same
/// host) to 5 s (past any sensible `timeout`).
const PROXY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0,
];

/// The proxies' metrics.
pub struct ProxyMetrics {
    pub calls: IntCounterVec,
    pub failures: IntCounterVec,
    pub duration: HistogramVec,
    pub in_flight: IntGaugeVec,
}

impl ProxyMetrics {
    pub(super) fn new(r: &Registry) -> Self {
        let metrics = Self {
            calls: counter_vec(
                r,
                "herald_proxy_calls_total",
                "Calls to the application's backend by the proxies, by proxy and result (ok, unauthorized, forbidden, refused: the backend's answers; unavailable: none it could use).",
                &["proxy", "result"],
            ),
            failures: counter_vec(
                r,
                "herald_proxy_failures_total",
                "Proxy calls without a usable answer (each also counted as unavailable), by proxy and reason.",
                &["proxy", "reason"],
            ),
            duration: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "herald_proxy_duration_seconds",
                        "How long proxy calls took (refused at once when saturated: not counted), by proxy.",
                    )
                    .buckets(PROXY_BUCKETS.to_vec()),
                    &["proxy"],
                )
                .unwrap_or_else(|_| unreachable!()),
            ),
            in_flight: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "herald_proxy_in_flight",
                        "Proxy calls waiting for the backend (at most proxy.max_in_flight each), by proxy.",
                    ),
                    &["proxy"],
                )
                .unwrap_or_else(|_| unreachable!()),
            ),
        };
        for proxy in PROXIES {
            for result in PROXY_RESULTS {
                metrics.calls.with_label_values(&[proxy, result]);
            }
            for reason in PROXY_FAILURES {
                metrics.failures.with_label_values(&[proxy, reason]);
            }
            metrics.duration.with_label_values(&[proxy]);
            metrics.in_flight.with_label_values(&[proxy]);
        }
        metrics
    }
}
