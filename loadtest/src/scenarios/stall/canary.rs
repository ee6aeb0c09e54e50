//! The canary: its publisher ([`publish_canary`], one stamped message
//! every interval), its reader ([`read_canary`], every delivery timed), and
//! what is made of them, per phase ([`phase`]) and over the run
//! ([`count`]). Its own module: the one topic the scenario measures, apart
//! from the setup of those it only watches.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use super::{CANARY_SIZE, Canary, Delivery, Phase, Sent, lock};
use crate::latency::{Stamp, Summary, now_micros};
use crate::publish::{Pool, body};
use crate::raw::{self, Client};

/// The canary's `msg` as far as the tool reads it.
#[derive(Deserialize)]
struct CanaryFrame {
    op: String,
    seq: Option<u64>,
    data: Option<Stamp>,
}

/// Reads the canary until the run stops: every delivery with its time.
pub(super) async fn read_canary(
    mut client: Client,
    canary: Arc<Mutex<Canary>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let frame = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            frame = client.next() => frame,
        };
        let now = now_micros();
        let (opcode, payload) = match frame {
            Ok(Some(frame)) => (frame.opcode, frame.payload.to_vec()),
            Ok(None) => {
                return lock(&canary)
                    .unexpected
                    .push("the canary's connection ended".into());
            }
            Err(e) => {
                return lock(&canary)
                    .unexpected
                    .push(format!("the canary's connection: {e}"));
            }
        };
        if opcode == raw::OP_PING {
            if client.send(raw::OP_PONG, &payload).await.is_err() {
                return;
            }
            continue;
        }
        match opcode {
            raw::OP_TEXT => match serde_json::from_slice::<CanaryFrame>(&payload) {
                Ok(CanaryFrame {
                    op,
                    seq: Some(seq),
                    data: Some(stamp),
                }) if op == "msg" => {
                    lock(&canary).deliveries.push((seq, stamp.i, stamp.t, now));
                }
                Ok(CanaryFrame { op, .. }) if op == "reset" => lock(&canary).resets += 1,
                _ => lock(&canary)
                    .unexpected
                    .push(String::from_utf8_lossy(&payload).into_owned()),
            },
            raw::OP_CLOSE => {
                let close = raw::describe_close(&payload);
                return lock(&canary)
                    .unexpected
                    .push(format!("the canary closed: {close}"));
            }
            _ => {}
        }
    }
}

/// Publishes canary message `i` every `interval` (each stamped with its
/// scheduled time, so that a publish that waits counts), until `until`.
pub(super) async fn publish_canary(
    pool: Arc<Pool>,
    topic: String,
    interval: Duration,
    sent: Arc<Mutex<Vec<Sent>>>,
    mut until: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    // A late tick is sent late, not skipped: every index is a message.
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let next = AtomicU64::new(0);
    let mut publishing = JoinSet::new();
    loop {
        tokio::select! {
            _ = until.wait_for(|u| *u) => break,
            _ = tick.tick() => {}
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        let stamp = Stamp::now(i);
        let body = body(&topic, &stamp.encode(CANARY_SIZE));
        let (pool, sent) = (pool.clone(), sent.clone());
        publishing.spawn(async move {
            let answer = pool.publish_with(|| body).await;
            let seq = answer.map(|a| a.seq).map_err(|e| e.to_string());
            lock(&sent).push((i, stamp.t, seq));
        });
        // Reap what is done, so that the set holds only what is in flight.
        while publishing.try_join_next().is_some() {}
    }
    while publishing.join_next().await.is_some() {}
}

/// The figures of the canary messages sent in `[from, to)` (µs).
pub(super) fn phase(
    name: &str,
    from: u64,
    to: u64,
    sent: &[Sent],
    deliveries: &[Delivery],
) -> Phase {
    let in_phase: Vec<&Sent> = sent.iter().filter(|s| (from..to).contains(&s.1)).collect();
    let by_index: std::collections::HashMap<u64, u64> =
        deliveries.iter().map(|&(_, i, _, at)| (i, at)).collect();
    let mut latency = Vec::new();
    let mut undelivered = 0;
    for &&(i, t, ref seq) in &in_phase {
        match by_index.get(&i) {
            Some(&at) => latency.push(u32::try_from(at.saturating_sub(t)).unwrap_or(u32::MAX)),
            None if seq.is_ok() => undelivered += 1,
            None => {}
        }
    }
    // Gaps between deliveries (of any canary message) within the phase,
    // from its start and to its end.
    let mut times: Vec<u64> = deliveries
        .iter()
        .map(|d| d.3)
        .filter(|at| (from..to).contains(at))
        .collect();
    times.sort_unstable();
    let longest_gap = std::iter::once(from)
        .chain(times.iter().copied())
        .zip(times.iter().copied().chain(std::iter::once(to)))
        .map(|(a, b)| b - a)
        .max()
        .unwrap_or(to - from);
    Phase {
        name: name.to_owned(),
        seconds: (to - from) as f64 / 1e6,
        sent: in_phase.len() as u64,
        delivered: latency.len() as u64,
        latency: Summary::of(&mut latency),
        undelivered,
        longest_gap_ms: longest_gap as f64 / 1e3,
    }
}

/// (lost, duplicated, out of order): answered seqs never delivered, seqs
/// delivered again, deliveries whose seq is not above the one before.
pub(super) fn count(answered: &HashSet<u64>, deliveries: &[Delivery]) -> (u64, u64, u64) {
    let mut seen = HashSet::new();
    let (mut duplicated, mut out_of_order, mut last) = (0, 0, 0);
    for &(seq, ..) in deliveries {
        if !seen.insert(seq) {
            duplicated += 1;
        } else if seq <= last {
            out_of_order += 1;
        }
        last = last.max(seq);
    }
    let lost = answered.iter().filter(|seq| !seen.contains(seq)).count() as u64;
    (lost, duplicated, out_of_order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_counts_its_own_messages_and_its_longest_silence() {
        // Sent at 0, 10, 20, 30 ms; 1 and 2 delivered late, 3 never.
        let sent: Vec<Sent> = (0..4).map(|i| (i, i * 10_000, Ok(i + 1))).collect();
        let deliveries = vec![
            (1, 0, 0, 5_000),
            (2, 1, 10_000, 90_000),
            (3, 2, 20_000, 95_000),
        ];
        let p = phase("p", 0, 100_000, &sent, &deliveries);
        assert_eq!((p.sent, p.delivered, p.undelivered), (4, 3, 1));
        assert_eq!(p.latency.max_us, 80_000);
        assert_eq!(p.longest_gap_ms, 85.0, "from 5 ms to 90 ms");
        let quiet = phase("q", 100_000, 200_000, &sent, &deliveries);
        assert_eq!((quiet.sent, quiet.longest_gap_ms), (0, 100.0));
    }

    #[test]
    fn lost_duplicated_and_out_of_order_are_told_apart() {
        let answered: HashSet<u64> = [1, 2, 3, 4].into();
        let deliveries = vec![(1, 0, 0, 0), (3, 2, 0, 0), (2, 1, 0, 0), (3, 2, 0, 0)];
        assert_eq!(count(&answered, &deliveries), (1, 1, 1));
    }
}
