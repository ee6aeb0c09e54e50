//! The broker's events ([`router::Observer`]), as the gateway's metrics.

use router::Observer;

use super::Metrics;

/// The broker's events, as metrics.
impl Observer for Metrics {
    fn redis_call(&self, op: &'static str, seconds: f64, ok: bool) {
        self.redis_seconds.with_label_values(&[op]).observe(seconds);
        if !ok {
            self.redis_errors.with_label_values(&[op]).inc();
        }
    }

    fn pubsub_up(&self, up: bool) {
        self.redis_pubsub_up.set(i64::from(up));
        if !up {
            self.redis_pubsub_reconnects.inc();
        }
    }

    fn pubsub_lag(&self, seconds: f64) {
        self.redis_pubsub_lag.observe(seconds);
    }

    fn gap_filled(&self, count: u64) {
        self.gap_filled.inc_by(count);
    }

    fn topic_reset(&self) {
        self.resets.inc();
    }

    fn redis_rewound(&self) {
        self.redis_rewinds.inc();
    }

    fn pubsub_backlog(&self, held: usize) {
        self.redis_pubsub_backlog
            .set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    fn presence_cleaned(&self, members: u64) {
        self.presence_dead_pod_members.inc_by(members);
    }

    fn presence_pod_cleaned(&self) {
        self.presence_dead_pods.inc();
    }
}
