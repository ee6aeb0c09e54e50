//! `[presence]`: who is subscribed to a topic, across pods (issue #23). The
//! namespace decides whether a topic has presence (`presence`, `join_leave`,
//! `presence_counts_only_above`); this section says how the pod keeps it.

use std::time::Duration;

use serde::Deserialize;

use super::defaults::{
    DEFAULT_PRESENCE_DIFF_INTERVAL, DEFAULT_PRESENCE_MAX_INFO_BYTES, DEFAULT_PRESENCE_PAGE_SIZE,
    DEFAULT_PRESENCE_POD_TTL,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PresenceConfig {
    /// How long changes are gathered: this pod writes a topic's changes to
    /// the broker at most once per interval, and sends its subscribers at
    /// most one `presence_diff` per interval.
    #[serde(with = "humantime_serde")]
    pub diff_interval: Duration,
    /// Members per page of a `presence` query, at most and by default.
    pub page_size: usize,
    /// Largest token `info` claim, as compact JSON text.
    pub max_info_bytes: usize,
    /// How long a pod's presence outlives its last sign of life (it renews
    /// it every `pod_ttl / 5`): a pod killed without warning has its members
    /// removed by another pod within `pod_ttl` and one scan (`pod_ttl / 5`).
    #[serde(with = "humantime_serde")]
    pub pod_ttl: Duration,
}

impl Default for PresenceConfig {
    fn default() -> Self {
        Self {
            diff_interval: DEFAULT_PRESENCE_DIFF_INTERVAL,
            page_size: DEFAULT_PRESENCE_PAGE_SIZE,
            max_info_bytes: DEFAULT_PRESENCE_MAX_INFO_BYTES,
            pod_ttl: DEFAULT_PRESENCE_POD_TTL,
        }
    }
}

/// The shortest `presence.pod_ttl`: its refresh (`pod_ttl / 5`) must leave
/// Redis's round trips room, or a busy pod would be taken for dead.
pub const MIN_PRESENCE_POD_TTL: Duration = Duration::from_secs(1);

impl PresenceConfig {
    /// The refusal of a bad setting: its key and why.
    pub(super) fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self.diff_interval.is_zero() {
            return Err(("presence.diff_interval", "must be longer than 0s"));
        }
        if self.page_size == 0 {
            return Err(("presence.page_size", "must be at least 1"));
        }
        if self.max_info_bytes < 2 {
            return Err((
                "presence.max_info_bytes",
                "must be at least 2 (the empty object `{}`)",
            ));
        }
        if self.pod_ttl < MIN_PRESENCE_POD_TTL {
            return Err(("presence.pod_ttl", "must be at least 1s"));
        }
        if self.diff_interval >= self.pod_ttl {
            return Err((
                "presence.diff_interval",
                "must be shorter than presence.pod_ttl",
            ));
        }
        Ok(())
    }
}
