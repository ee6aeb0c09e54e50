//! Moving clients off a pod: all of them when it stops (`[shutdown]`), some
//! when it holds more than its share (`[rebalance]`).

use std::time::Duration;

use serde::Deserialize;

use super::defaults::{
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_REBALANCE_INTERVAL, DEFAULT_REBALANCE_MAX_MOVE_FRACTION,
    DEFAULT_REBALANCE_TOLERANCE,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
}

/// Moving clients off a pod that holds more than its share, so that pods
/// added by a scale-out get some of the long-lived connections.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RebalanceConfig {
    /// Needs a shared broker (Redis): pods compare their loads through it.
    pub enabled: bool,
    /// How often a pod reports its load and, if it is over, moves clients.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A pod moves clients while it holds more than the average by this
    /// fraction (0.2: more than 120% of the average).
    pub tolerance: f64,
    /// At most this fraction of the pod's connections is asked to move per
    /// interval, so that a rebalance never becomes a reconnect storm.
    pub max_move_fraction: f64,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            interval: DEFAULT_REBALANCE_INTERVAL,
            tolerance: DEFAULT_REBALANCE_TOLERANCE,
            max_move_fraction: DEFAULT_REBALANCE_MAX_MOVE_FRACTION,
        }
    }
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}
