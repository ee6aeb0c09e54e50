//! `slow --catch-up` (issue #25): the slow clients stop reading only for the
//! slow phase (e.g. 10,000 rounds 1 ms apart: 10 s), then read again while
//! [`after`](CatchUp::after_rounds) more rounds go out. Where the pod
//! catches lagging clients up from history (`on_lag = "catch_up"`, history
//! long enough for the phase), each gets every round once and in order and
//! is back on the live stream for the last rounds; nobody is disconnected.
//! What it counts: [`CatchUp`]; the healthy clients' p99 with the slow ones
//! against without is `slow`'s own figure.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::Target;
use crate::clients::{End, MISSING, Received};
use crate::metrics::Scraper;
use crate::report::Row;

/// Rounds after the slow phase, while the slow clients read again.
pub const DEFAULT_AFTER_ROUNDS: usize = 20;

/// What the lagging clients came to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CatchUp {
    pub clients: usize,
    /// The rounds they did not read while they went out.
    pub paused_rounds: Range<usize>,
    /// The rounds after, while they read again.
    pub after_rounds: Range<usize>,
    /// Closed by the gateway (or failed) before they were done.
    pub disconnected: usize,
    /// Rounds sent from the slow phase on that a slow client never got.
    pub lost: u64,
    /// Rounds a slow client got more than once.
    pub duplicated: u64,
    /// Slow clients that got every round of the after phase: back live.
    pub back_live: usize,
    /// From reading again to the last slow client having every round;
    /// `None` when not all got there within the wait.
    pub caught_up_s: Option<f64>,
    /// Each watched process's memory before the slow phase, and once the
    /// catch-ups were over.
    pub rss: Vec<RssBeforeAfter>,
    /// The gateways' `herald_lag_*` samples once it was over (summed over
    /// the gateways): lags, catch-ups by outcome, history reads, throttling.
    #[serde(default)]
    pub lag_metrics: BTreeMap<String, u64>,
}

/// The `herald_lag_*` samples of `gateways`, summed by sample name.
pub async fn lag_metrics(gateways: &[Target]) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    for gateway in gateways {
        let Ok(text) = Scraper::new(gateway.addr).get("/metrics").await else {
            continue;
        };
        for line in text.lines().filter(|l| l.starts_with("herald_lag_")) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            // Counters print as integers or as floats (`3`, `3e0`).
            if let Ok(value) = value.parse::<f64>() {
                *sums.entry(name.to_owned()).or_insert(0) += value as u64;
            }
        }
    }
    sums
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RssBeforeAfter {
    pub pid: u32,
    pub name: String,
    pub before_bytes: Option<u64>,
    pub after_bytes: Option<u64>,
}

/// Counts what `received` (the slow clients' reading, by round) came to.
pub fn summarise(
    received: &[Received],
    paused: Range<usize>,
    after: Range<usize>,
    caught_up_s: Option<f64>,
    rss: Vec<RssBeforeAfter>,
    lag_metrics: BTreeMap<String, u64>,
) -> CatchUp {
    let got = |r: &Received, rounds: Range<usize>| {
        r.latency_us
            .get(rounds.clone())
            .map_or(0, |l| l.iter().filter(|&&l| l != MISSING).count())
    };
    let sent = after.end - paused.start;
    CatchUp {
        clients: received.len(),
        disconnected: received.iter().filter(|r| r.end != End::Stopped).count(),
        lost: received
            .iter()
            .map(|r| (sent - got(r, paused.start..after.end)) as u64)
            .sum(),
        duplicated: received.iter().map(|r| r.duplicates).sum(),
        back_live: received
            .iter()
            .filter(|r| got(r, after.clone()) == after.len())
            .count(),
        paused_rounds: paused,
        after_rounds: after,
        caught_up_s,
        rss,
        lag_metrics,
    }
}

impl CatchUp {
    /// Its rows in `slow`'s report.
    pub fn rows(&self) -> Vec<Row> {
        let mib =
            |b: Option<u64>| b.map_or("?".to_owned(), |b| format!("{:.1}", b as f64 / 1048576.0));
        let mut rows = vec![Row::new(
            format!(
                "catch-up: {} clients paused for rounds {:?}, read again for {:?}",
                self.clients, self.paused_rounds, self.after_rounds
            ),
            format!(
                "{} disconnected, {} lost, {} duplicated, {} back live; all caught up after {}",
                self.disconnected,
                self.lost,
                self.duplicated,
                self.back_live,
                self.caught_up_s
                    .map_or("(not within the wait)".to_owned(), |s| format!("{s:.2} s"))
            ),
        )];
        if !self.lag_metrics.is_empty() {
            let samples: Vec<String> = self
                .lag_metrics
                .iter()
                .map(|(name, n)| format!("{} {n}", name.trim_start_matches("herald_lag_")))
                .collect();
            rows.push(Row::new("the gateways' herald_lag_*", samples.join(", ")));
        }
        for r in &self.rss {
            rows.push(Row::new(
                format!(
                    "{} ({}) RSS before the pause / after the catch-up",
                    r.name, r.pid
                ),
                format!("{} / {} MiB", mib(r.before_bytes), mib(r.after_bytes)),
            ));
        }
        rows
    }

    /// What falls short of issue #25's target.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.disconnected > 0 {
            out.push(format!(
                "catch-up: {} slow clients disconnected",
                self.disconnected
            ));
        }
        if self.lost > 0 || self.duplicated > 0 {
            out.push(format!(
                "catch-up: {} rounds lost, {} duplicated",
                self.lost, self.duplicated
            ));
        }
        if self.back_live < self.clients {
            out.push(format!(
                "catch-up: {} of {} slow clients back live",
                self.back_live, self.clients
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(latency_us: Vec<u32>, duplicates: u64, end: End) -> Received {
        Received {
            client: 0,
            gateway: 0,
            latency_us,
            duplicates,
            unexpected: 0,
            wire_bytes: 0,
            compressed: false,
            end,
        }
    }

    #[test]
    fn lost_duplicated_and_back_live_are_counted_from_the_pause_on() {
        // Rounds 0..2 before, 2..5 paused, 5..7 after.
        let whole = received(vec![1; 7], 0, End::Stopped);
        let gap = received(vec![1, 1, 1, MISSING, 1, 1, 1], 2, End::Stopped);
        let closed = received(
            vec![1, 1, 1, 1, MISSING, MISSING, MISSING],
            0,
            End::Closed(Some(4000)),
        );
        let c = summarise(
            &[whole, gap, closed],
            2..5,
            5..7,
            None,
            Vec::new(),
            BTreeMap::new(),
        );
        assert_eq!(
            (c.disconnected, c.lost, c.duplicated, c.back_live),
            (1, 4, 2, 2)
        );
        assert_eq!(c.failures().len(), 3);
    }
}
