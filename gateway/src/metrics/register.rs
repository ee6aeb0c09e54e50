//! Registering a metric on the gateway's registry.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
// Registration fails only on a duplicate or malformed name, which the names
// above are not (tests render every metric).
pub(super) fn register<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    if let Err(e) = r.register(Box::new(c.clone())) {
        tracing::error!(error = %e, "metric registration failed");
    }
    c
}

pub(super) fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        r,
        IntCounter::with_opts(Opts::new(name, help)).unwrap_or_else(|_| unreachable!()),
    )
}

pub(super) fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(
        r,
        IntGauge::with_opts(Opts::new(name, help)).unwrap_or_else(|_| unreachable!()),
    )
}

pub(super) fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|_| unreachable!()),
    )
}

/// Seconds, from well under a millisecond (loopback) to seconds (trouble).
pub(super) const BUCKETS: [f64; 13] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

pub(super) fn histogram(r: &Registry, name: &str, help: &str) -> Histogram {
    register(
        r,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()))
            .unwrap_or_else(|_| unreachable!()),
    )
}
