//! When each slow client was closed: the gateways' close counters read
//! every [`POLL`] while the slow clients are connected ([`Watcher`]), and
//! those closes paired with the slow clients the gateways closed
//! ([`match_closes`]). Its own module: the one question the module doc
//! answers at length, apart from the rounds that raise it.

use std::time::Duration;

use tokio::sync::watch;

use super::{CloseEvent, POLL, SLOW_REASONS, SlowClient};
use crate::Target;
use crate::clients::{End, MISSING, Received};
use crate::latency::now_micros;
use crate::metrics::Scraper;
use crate::scenarios::fanout;

/// Pairs, per gateway, the slow clients the gateway closed (fewest rounds
/// received first) with its slow-reason closes (earliest first).
pub(super) fn match_closes(
    received: &[Received],
    closes: &[CloseEvent],
    round_starts: &[Option<u64>],
    joined: usize,
    options: &fanout::Options,
    phase_start: u64,
) -> Vec<SlowClient> {
    let last_round = |r: &Received| r.latency_us.iter().rposition(|&l| l != MISSING);
    let mut order: Vec<&Received> = received.iter().collect();
    order.sort_by_key(|r| (r.gateway, last_round(r).map_or(0, |l| l + 1), r.client));
    let mut used = vec![false; closes.len()];
    let mut out: Vec<SlowClient> = order
        .into_iter()
        .map(|r| {
            let closed = r.end != End::Stopped;
            let last = last_round(r);
            let event = closed
                .then(|| {
                    closes.iter().enumerate().position(|(i, c)| {
                        !used[i]
                            && c.gateway_index == r.gateway
                            && SLOW_REASONS.contains(&c.reason.as_str())
                    })
                })
                .flatten();
            if let Some(i) = event {
                used[i] = true;
            }
            let event = event.map(|i| &closes[i]);
            let stuck = last.map_or(joined, |l| l + 1);
            let blocked_for_s = event.and_then(|e| {
                let start = round_starts.get(stuck).copied().flatten()?;
                Some(e.seen_us.saturating_sub(start) as f64 / 1e6)
            });
            SlowClient {
                client: r.client,
                gateway: options.gateways[r.gateway].ws_url(),
                rounds_sent: (round_starts.len() - joined) as u64,
                rounds_received: r.latency_us[joined.min(r.latency_us.len())..]
                    .iter()
                    .filter(|&&l| l != MISSING)
                    .count() as u64,
                last_round: last,
                closed,
                end: match &r.end {
                    End::Stopped => "still open".to_owned(),
                    End::Closed(code) => format!("closed ({code:?})"),
                    End::Failed(e) => format!("ended: {e}"),
                },
                reason: event.map(|e| e.reason.clone()),
                closed_after_s: event.map(|e| e.seen_us.saturating_sub(phase_start) as f64 / 1e6),
                blocked_for_s,
            }
        })
        .collect();
    out.sort_by_key(|c| c.client);
    out
}

/// Reads every gateway's close counters every [`POLL`] in a task of its own.
pub(super) struct Watcher {
    stop: watch::Sender<bool>,
    slow_closes: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<(Vec<Event>, Option<String>)>,
}

/// (gateway index, reason, µs seen, µs of the read before).
type Event = (usize, String, u64, u64);

impl Watcher {
    /// Takes the counts now as the baseline and starts polling.
    pub(super) async fn start(gateways: &[Target]) -> Self {
        let mut scrapers: Vec<Scraper> = gateways.iter().map(|g| Scraper::new(g.addr)).collect();
        let mut first_error = None;
        let mut last = Vec::with_capacity(scrapers.len());
        for s in &mut scrapers {
            match s.closes().await {
                Ok(c) => last.push(Some(c)),
                Err(e) => {
                    first_error.get_or_insert(e.to_string());
                    last.push(None);
                }
            }
        }
        let mut before_us = now_micros();
        let (stop, mut stopped) = watch::channel(false);
        let (count, slow_closes) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            let mut events = Vec::new();
            let mut ticks = tokio::time::interval(POLL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    _ = stopped.changed() => break,
                    _ = ticks.tick() => {}
                }
                for (g, s) in scrapers.iter_mut().enumerate() {
                    let now = match s.closes().await {
                        Ok(c) => c,
                        Err(e) => {
                            first_error.get_or_insert(e.to_string());
                            continue;
                        }
                    };
                    let seen_us = now_micros();
                    if let Some(previous) = &last[g] {
                        for (reason, &n) in &now {
                            let before = previous.get(reason).copied().unwrap_or(0);
                            for _ in before..n {
                                events.push((g, reason.clone(), seen_us, before_us));
                            }
                        }
                    }
                    last[g] = Some(now);
                }
                before_us = now_micros();
                let slow = events
                    .iter()
                    .filter(|e: &&Event| SLOW_REASONS.contains(&e.1.as_str()))
                    .count() as u64;
                count.send_replace(slow);
            }
            (events, first_error)
        });
        Self {
            stop,
            slow_closes,
            task,
        }
    }

    /// Until `n` slow-reason closes were seen, at most `wait`.
    pub(super) async fn wait_for_slow_closes(&mut self, n: u64, wait: Duration) {
        let _ = tokio::time::timeout(wait, self.slow_closes.wait_for(|&seen| seen >= n)).await;
    }

    pub(super) async fn stop(self) -> (Vec<Event>, Option<String>) {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(client: usize, latency_us: Vec<u32>, end: End) -> Received {
        Received {
            client,
            gateway: 0,
            latency_us,
            duplicates: 0,
            unexpected: 0,
            wire_bytes: 0,
            compressed: false,
            end,
        }
    }

    fn close(reason: &str, seen_us: u64) -> CloseEvent {
        CloseEvent {
            gateway: "g".to_owned(),
            reason: reason.to_owned(),
            seen_after_s: 0.0,
            not_before_s: 0.0,
            seen_us,
            gateway_index: 0,
        }
    }

    #[test]
    fn a_close_is_timed_from_the_round_whose_write_was_stuck() {
        let options = fanout::Options::new(
            Target::at("127.0.0.1:1".parse().expect("addr")).expect("loopback"),
        );
        // Rounds 0..4 start at 0, 1, 2, 3 s; the slow client joined at round 1
        // and got rounds 1 and 2: round 3's write was stuck.
        let starts: Vec<Option<u64>> = (0..4).map(|r| Some(r * 1_000_000)).collect();
        let slow = received(7, vec![MISSING, 5, 5, MISSING], End::Closed(None));
        let open = received(8, vec![MISSING, 5, 5, 5], End::Stopped);
        let closes = [
            close("client_closed", 1_000_000),
            close("write_timeout", 4_500_000),
        ];
        let clients = match_closes(&[slow, open], &closes, &starts, 1, &options, 1_000_000);
        assert_eq!(clients[0].last_round, Some(2));
        assert_eq!(clients[0].reason.as_deref(), Some("write_timeout"));
        assert_eq!(clients[0].blocked_for_s, Some(1.5));
        assert_eq!(clients[0].closed_after_s, Some(3.5));
        assert_eq!((clients[0].rounds_sent, clients[0].rounds_received), (3, 2));
        assert!(!clients[1].closed);
        assert_eq!(clients[1].reason, None);
    }
}
