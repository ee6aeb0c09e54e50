//! What the scale-out tests (`rebalance.rs`, `rollout.rs`) share about a
//! group of pods: how many connections each holds, and a wait until the
//! rebalancer has evened them out.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::eventually;
use crate::http::get;

/// The pod's `herald_connections` gauge (through a hand-written request: a
/// pod may be on its way out).
pub async fn connections(addr: SocketAddr) -> u64 {
    let (status, metrics) = get(addr, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("/metrics of {addr}: {e}"));
    assert_eq!(status, 200, "/metrics of {addr}");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("herald_connections ")?.parse().ok())
        .unwrap_or_else(|| panic!("herald_connections of {addr}"))
}

/// When the pods count as even.
#[derive(Debug, Clone, Copy)]
pub struct Even {
    /// Of how many clients in all.
    pub clients: usize,
    /// The fraction of them that must be connected (1.0: every one).
    pub connected: f64,
    /// How far from their average each pod may be, as a fraction of it.
    pub spread: f64,
}

/// Waits, at most `within`, until `pods` are [`Even`]; how long that took
/// and the counts.
pub async fn even_out(pods: &[SocketAddr], even: Even, within: Duration) -> (Duration, Vec<u64>) {
    let started = Instant::now();
    let counts = eventually(within, || async {
        let mut counts = Vec::new();
        for pod in pods {
            counts.push(connections(*pod).await);
        }
        let total = counts.iter().sum::<u64>();
        let average = total as f64 / pods.len() as f64;
        let connected = total as f64 >= even.connected * even.clients as f64;
        let spread = counts
            .iter()
            .all(|&n| (n as f64 - average).abs() <= even.spread * average);
        if connected && spread {
            Ok(counts)
        } else {
            Err(format!(
                "the pods did not even out (each within {}% of their average, {}% of {} clients connected): {counts:?}",
                even.spread * 100.0,
                even.connected * 100.0,
                even.clients
            ))
        }
    })
    .await;
    (started.elapsed(), counts)
}
