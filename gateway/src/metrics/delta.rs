//! Deltas for state topics' metrics (issue #26): how often a delta
//! subscriber was sent a delta rather than the full data (the hit rate),
//! and how many deltas were computed (one per publication at most, however
//! many subscribers and formats share it).

use prometheus::{IntCounter, Registry};

use super::register::{counter, counter_vec};

pub struct DeltaMetrics {
    /// `herald_delta_deliveries_total{sent="delta"}`: looked up once, as
    /// each is counted on the fan-out's path.
    pub sent_delta: IntCounter,
    /// `{sent="full"}`: the full data (or the plain `msg` a JSON client gets
    /// for binary data).
    pub sent_full: IntCounter,
    pub encodes: IntCounter,
}

impl DeltaMetrics {
    pub(super) fn new(r: &Registry) -> Self {
        let deliveries = counter_vec(
            r,
            "herald_delta_deliveries_total",
            "Messages queued to subscribers that asked for deltas (namespaces with delta = true), by what was sent: delta (a Fossil delta against the message before) or full (the first after a subscribe, a resume, a replay, a catch-up, a reset or a dropped message; or a delta no shorter than the data).",
            &["sent"],
        );
        Self {
            sent_delta: deliveries.with_label_values(&["delta"]),
            sent_full: deliveries.with_label_values(&["full"]),
            encodes: counter(
                r,
                "herald_delta_encodes_total",
                "Deltas computed for delta subscribers on this pod: one per publication at most, shared by all its subscribers and formats.",
            ),
        }
    }

    /// A message was queued to a delta subscriber: a delta or not.
    pub fn delivered(&self, delta: bool) {
        if delta {
            self.sent_delta.inc();
        } else {
            self.sent_full.inc();
        }
    }
}
