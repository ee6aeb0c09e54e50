//! Scale-out that moves load. Long-lived WebSockets stay on the pod they
//! first reached, so a pod added by the autoscaler would only ever get new
//! clients. Every interval each pod reports its connection count through the
//! broker and reads everyone's; a pod holding more than the average by the
//! tolerance (or over the average at all while some pod is under it by the
//! tolerance) asks some of its clients to move (`reconnect` with a jittered
//! `after_ms`, then close 4002), at most a fraction of its connections per
//! interval. Clients resume wherever the Service sends them and lose nothing.
//!
//! [`round`] is one interval's work; the node runs it every
//! `rebalance.interval` until the pod drains.

use std::time::Duration;

use router::{Broker, Causes};

use crate::config::RebalanceConfig;
use crate::metrics::Metrics;
use crate::session::Registry;

/// One round for `pod`, which holds `connections`: reports them through the
/// broker, reads every pod's, and asks some of `live`'s clients to move when
/// this pod holds more than its share.
pub async fn round(
    pod: &str,
    connections: usize,
    broker: &dyn Broker,
    live: &Registry,
    metrics: &Metrics,
    config: &RebalanceConfig,
) {
    let mine = connections as u64;
    // A pod that missed three reports (and a second more, for a pod
    // that is merely busy) is gone.
    let gone_after = config.interval * 3 + Duration::from_secs(1);
    let loads = match broker.pod_loads(pod, mine, gone_after).await {
        Ok(loads) => loads,
        Err(e) => {
            tracing::debug!(error = %Causes(&e), "pod loads unavailable; not rebalancing this round");
            return;
        }
    };
    let pods = loads.len().max(1);
    let average = loads.iter().sum::<u64>() as f64 / pods as f64;
    metrics.cluster_pods.set(pods as i64);
    metrics
        .cluster_average_connections
        .set(average.round() as i64);
    let least = loads.iter().copied().min().unwrap_or(mine);
    let moves = to_move(
        mine,
        average,
        least,
        config.tolerance,
        config.max_move_fraction,
    );
    if moves == 0 {
        return;
    }
    let asked = live.ask_to_move(moves, config.interval);
    metrics.rebalance_moves.inc_by(asked as u64);
    tracing::info!(
        pods,
        connections = mine,
        average,
        asked,
        "moving clients to even out the pods"
    );
}

/// How many clients a pod with `mine` connections moves this round: down to
/// the average, once it is over it by `tolerance`, at most `max_fraction` of
/// its connections (and at least one).
///
/// While some pod (`least`) is under the average by more than `tolerance`,
/// every pod over the average moves, not only those over the band: a moved
/// client lands on any pod, so with only the band's top moving, the pods
/// just inside it would keep the under-loaded one down (a new fourth pod
/// would stop near 40% under the average with a 20% tolerance).
fn to_move(mine: u64, average: f64, least: u64, tolerance: f64, max_fraction: f64) -> usize {
    let underloaded = (least as f64) < average * (1.0 - tolerance);
    let threshold = if underloaded {
        average
    } else {
        average * (1.0 + tolerance)
    };
    if (mine as f64) <= threshold {
        return 0;
    }
    let excess = (mine as f64 - average).floor() as usize;
    let cap = ((mine as f64 * max_fraction).ceil() as usize).max(1);
    excess.min(cap)
}

#[cfg(test)]
mod tests {
    use super::to_move;

    #[test]
    fn moves_only_when_over_the_tolerance_and_at_a_bounded_rate() {
        // Three pods at 1000 and a new one at 0: average 750.
        assert_eq!(to_move(1000, 750.0, 0, 0.2, 0.05), 50);
        assert_eq!(to_move(1000, 750.0, 0, 0.2, 1.0), 250);
        // Within 20% of the average, and so is everyone: stay.
        assert_eq!(to_move(890, 750.0, 700, 0.2, 1.0), 0);
        assert_eq!(to_move(0, 0.0, 0, 0.2, 0.05), 0);
        // A small pod still moves one at a time.
        assert_eq!(to_move(3, 1.0, 0, 0.2, 0.05), 1);
    }

    #[test]
    fn an_underloaded_pod_makes_every_pod_over_the_average_move() {
        // 850, 830, 820 and a fourth at 500: average 750, the fourth is
        // 33% under. The others are inside the band but still move.
        assert_eq!(to_move(850, 750.0, 500, 0.2, 1.0), 100);
        assert_eq!(to_move(830, 750.0, 500, 0.2, 0.05), 42);
        // The under-loaded pod itself does not.
        assert_eq!(to_move(500, 750.0, 500, 0.2, 1.0), 0);
    }
}
