//! Lagging subscribers' metrics (issue #25): how often a queue had no room
//! for a topic's message, by the namespace's policy, and what the catch-ups
//! from history cost and came to.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};
use router::OnLag;

use super::register::{counter, counter_vec, gauge};

/// Every `policy` of `herald_lag_events_total`.
pub const LAG_POLICIES: [OnLag; 3] = [OnLag::CatchUp, OnLag::Disconnect, OnLag::DropNewest];

/// How a catch-up ended: `live` (back on the live stream), `reset` (history
/// no longer reached back; the client was sent `reset`, then went live),
/// `ended` (the connection closed, or the topic was left, first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUpOutcome {
    Live,
    Reset,
    Ended,
}

impl CatchUpOutcome {
    pub const ALL: [Self; 3] = [Self::Live, Self::Reset, Self::Ended];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Reset => "reset",
            Self::Ended => "ended",
        }
    }
}

pub struct LagMetrics {
    /// `herald_lag_events_total` by policy, in [`LAG_POLICIES`]' order:
    /// looked up once, as a drop is counted on the fan-out's path.
    events: [IntCounter; 3],
    catch_ups: IntCounterVec,
    /// Catch-ups under way on this pod.
    pub catching_up: IntGauge,
    pub history_reads: IntCounter,
    pub throttled: IntCounter,
}

impl LagMetrics {
    pub(super) fn new(r: &Registry) -> Self {
        let events = counter_vec(
            r,
            "herald_lag_events_total",
            "A subscriber's outgoing queue had no room for a topic's message, by the namespace's on_lag policy: catch_up (the subscriber went on from history; once per lag), disconnect (closed with 4000), drop_newest (the message was dropped for it).",
            &["policy"],
        );
        let metrics = Self {
            events: LAG_POLICIES.map(|policy| events.with_label_values(&[policy.as_str()])),
            catch_ups: counter_vec(
                r,
                "herald_lag_catch_ups_total",
                "Catch-ups of lagging subscribers from history that ended, by outcome: live (back on the live stream, nothing lost), reset (history no longer reached back: the client got `reset`, then went live), ended (the connection closed or the topic was left first).",
                &["outcome"],
            ),
            catching_up: gauge(
                r,
                "herald_lag_catching_up",
                "Lagging subscribers being caught up from history on this pod.",
            ),
            history_reads: counter(
                r,
                "herald_lag_history_reads_total",
                "Pages of history read to catch lagging subscribers up (capped by replay.catch_up_reads_per_second).",
            ),
            throttled: counter(
                r,
                "herald_lag_throttled_total",
                "Catch-up reads of history that waited for the pod's rate (replay.catch_up_reads_per_second).",
            ),
        };
        for outcome in CatchUpOutcome::ALL {
            metrics.catch_ups.with_label_values(&[outcome.as_str()]);
        }
        metrics
    }

    /// A queue had no room for a message of a topic with `policy`.
    pub fn lagged(&self, policy: OnLag) {
        let index = match policy {
            OnLag::CatchUp => 0,
            OnLag::Disconnect => 1,
            OnLag::DropNewest => 2,
        };
        self.events[index].inc();
    }

    pub fn caught_up(&self, outcome: CatchUpOutcome) {
        self.catch_ups.with_label_values(&[outcome.as_str()]).inc();
    }
}
