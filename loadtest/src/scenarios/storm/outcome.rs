//! What a `storm` run found ([`Storm`]): the clients' records folded into
//! it ([`merge`]), its table and its failures. Its own module: the result
//! and how it reads, apart from how the run gets it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::FAILURES_LISTED;
use crate::cpu::Usage;
use crate::latency::{Summary, micros};
use crate::report::{Outcome, Row};
use crate::sessions::Record;

/// The result of a `storm` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Storm {
    pub gateways: Vec<String>,
    pub publish_to: String,
    /// `cut, reset` (the tool aborted every connection), `cut, half-open`
    /// (it left them open and silent) or `kill -9 <pid> (<url>)`.
    pub cut: String,
    pub clients: usize,
    pub topics: usize,
    pub rate_per_s: f64,
    pub duration_s: f64,
    pub cut_at_s: f64,
    pub size_bytes: usize,
    pub backoff_first_ms: u64,
    pub backoff_cap_ms: u64,
    pub ack_interval_ms: u64,
    /// Time to connect, start a session and subscribe every client.
    pub connect_s: f64,
    /// Messages the publisher sent, and those the gateway accepted (200).
    pub messages: u64,
    pub published: u64,
    pub publish_errors: u64,
    pub first_publish_error: Option<String>,
    /// From the first publish to the last answer.
    pub publish_s: f64,
    /// From the publish's start (a free connection included) to its answer.
    pub publish_latency: Summary,
    /// When the cut came, from the first publish (later than `cut_at_s`
    /// only when this tool was starved).
    pub cut_after_s: f64,
    /// Clients that lost their connection at or after the cut.
    pub cut_clients: u64,
    /// Of those, the ones whose session came back (`resumed: true`).
    pub resumed: u64,
    /// From the cut to the last client's resumed `welcome`; `None` unless
    /// every cut client resumed.
    pub all_resumed_s: Option<f64>,
    /// Per cut client, from the cut to its resumed `welcome`.
    pub resume_time: Summary,
    /// Reconnect attempts over all clients, and the most one client made.
    pub attempts: u64,
    pub most_attempts: u32,
    /// Why reconnect attempts failed, `reason: count`, most frequent first.
    pub failed_attempts: Vec<String>,
    /// Clients that lost their session or could not come back, with the
    /// first few reasons.
    pub failed_clients: u64,
    pub failures_listed: Vec<String>,
    /// Connections lost other than by the cut (a slow-consumer close, say).
    pub other_disconnects: u64,
    /// Clients on each gateway at the end.
    pub clients_by_gateway: Vec<usize>,
    /// Published messages times their topic's clients.
    pub deliveries_expected: u64,
    /// Of those, processed by the application.
    pub processed: u64,
    pub lost: u64,
    /// Processed twice by the application (must be 0).
    pub app_duplicates: u64,
    /// Came over the wire again and were dropped by the seq rule
    /// (at-least-once replay after a resume; not a failure).
    pub wire_duplicates: u64,
    /// Clients that got at least one wire duplicate.
    pub clients_with_wire_duplicates: u64,
    /// Came below the last processed seq without having come before (dropped,
    /// so also counted lost).
    pub out_of_order: u64,
    /// `reset` frames: continuity lost (history too short for the outage).
    pub resets: u64,
    /// Frames that are neither `msg`, `reset` nor `reconnect`.
    pub unexpected: u64,
    /// From the last publish's answer until everything was in (or `drain`).
    pub drain_wait_s: f64,
    /// CPU from the first publish to the end of the drain.
    pub cpu: Usage,
}

/// Folds the clients' records into `result`.
pub(super) fn merge(
    result: &mut Storm,
    cut: Option<Instant>,
    seqs: &[Vec<u64>],
    records: &[Record],
) {
    let mut resume_us = Vec::new();
    let mut attempt_errors: BTreeMap<&str, u64> = BTreeMap::new();
    let mut last_resumed = Some(Duration::ZERO);
    for r in records {
        result.processed += seqs[r.topic]
            .iter()
            .filter(|&&s| s > r.base && r.processed.contains((s - r.base - 1) as usize))
            .count() as u64;
        result.app_duplicates += r.app_duplicates;
        result.wire_duplicates += r.wire_duplicates;
        result.clients_with_wire_duplicates += u64::from(r.wire_duplicates > 0);
        result.out_of_order += r.out_of_order;
        result.resets += r.resets;
        result.unexpected += r.unexpected;
        result.attempts += u64::from(r.attempts);
        result.most_attempts = result.most_attempts.max(r.attempts);
        for e in &r.attempt_errors {
            *attempt_errors.entry(e).or_default() += 1;
        }
        if let Some(g) = result.clients_by_gateway.get_mut(r.gateway) {
            *g += 1;
        }
        let lost_at_cut = cut.and_then(|cut| r.lost_at.iter().any(|&t| t >= cut).then_some(cut));
        result.other_disconnects += r
            .lost_at
            .iter()
            .filter(|&&t| lost_at_cut.is_none_or(|cut| t < cut))
            .count() as u64;
        if let Some(cut) = lost_at_cut {
            result.cut_clients += 1;
            match r.resumed_at.iter().find(|&&t| t >= cut) {
                Some(&t) => {
                    result.resumed += 1;
                    resume_us.push(micros(t - cut));
                    last_resumed = last_resumed.map(|l| l.max(t - cut));
                }
                None => last_resumed = None,
            }
        }
        if let Some(failure) = &r.failure {
            result.failed_clients += 1;
            if result.failures_listed.len() < FAILURES_LISTED {
                result
                    .failures_listed
                    .push(format!("client {}: {failure}", r.client));
            }
        }
    }
    let mut attempt_errors: Vec<_> = attempt_errors.into_iter().collect();
    attempt_errors.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    result.failed_attempts = attempt_errors
        .into_iter()
        .map(|(e, n)| format!("{e}: {n}"))
        .collect();
    result.lost = result.deliveries_expected.saturating_sub(result.processed);
    result.resume_time = Summary::of(&mut resume_us);
    result.all_resumed_s = last_resumed
        .filter(|_| result.cut_clients > 0)
        .map(|d| d.as_secs_f64());
}

impl Outcome for Storm {
    const SCENARIO: &'static str = "storm";

    fn rows(&self) -> Vec<Row> {
        let mut rows = vec![
            Row::new(
                "clients",
                format!(
                    "{} with sessions over {} gateways, {} topics; connected and subscribed in {:.2} s",
                    self.clients,
                    self.gateways.len(),
                    self.topics,
                    self.connect_s
                ),
            ),
            Row::new(
                "publisher",
                format!(
                    "{} at {}/s for {}s, {} B payload",
                    self.publish_to, self.rate_per_s, self.duration_s, self.size_bytes
                ),
            ),
            Row::new(
                "published",
                format!(
                    "{} of {} in {:.2} s ({} errors)",
                    self.published, self.messages, self.publish_s, self.publish_errors
                ),
            ),
            Row::new("publish latency p50/p99/max", self.publish_latency.brief()),
            Row::new(
                "cut",
                format!(
                    "{} at {:.3} s; backoff {}-{} ms, acks every {} ms",
                    self.cut,
                    self.cut_after_s,
                    self.backoff_first_ms,
                    self.backoff_cap_ms,
                    self.ack_interval_ms
                ),
            ),
            Row::new(
                "resumed",
                format!("{} of {} cut clients", self.resumed, self.cut_clients),
            ),
            Row::new(
                "all resumed after the cut",
                match self.all_resumed_s {
                    Some(s) => format!("{s:.3} s"),
                    None => "no (see failures)".to_owned(),
                },
            ),
            Row::new("resume time p50/p99/max", self.resume_time.brief()),
            Row::new(
                "reconnect attempts",
                format!(
                    "{} (at most {} by one client)",
                    self.attempts, self.most_attempts
                ),
            ),
            Row::new(
                "failed attempts",
                match self.failed_attempts.as_slice() {
                    [] => "none".to_owned(),
                    reasons => reasons.join("; "),
                },
            ),
            Row::new("failed clients", self.failed_clients),
            Row::new("other disconnects", self.other_disconnects),
            Row::new(
                "processed",
                format!(
                    "{} of {} (drained in {:.3} s)",
                    self.processed, self.deliveries_expected, self.drain_wait_s
                ),
            ),
            Row::new("lost", self.lost),
            Row::new("duplicated (application)", self.app_duplicates),
            Row::new(
                "redelivered on the wire",
                format!(
                    "{} to {} clients (dropped by the seq rule; at-least-once replay)",
                    self.wire_duplicates, self.clients_with_wire_duplicates
                ),
            ),
            Row::new("out of order", self.out_of_order),
            Row::new("resets", self.resets),
            Row::new("unexpected frames", self.unexpected),
        ];
        for (g, n) in self.gateways.iter().zip(&self.clients_by_gateway) {
            rows.push(Row::new(format!("  at the end on {g}"), n));
        }
        rows.push(Row::new("CPU", self.cpu.brief()));
        rows
    }

    fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.published == 0 {
            failures.push("nothing was published".to_owned());
        }
        if self.publish_errors > 0 {
            failures.push(format!(
                "{} publishes failed; first: {}",
                self.publish_errors,
                self.first_publish_error.as_deref().unwrap_or("?")
            ));
        }
        if self.cut_clients == 0 {
            failures.push("the cut cut no client".to_owned());
        }
        if self.failed_clients > 0 || self.resumed < self.cut_clients {
            failures.push(format!(
                "{} of {} cut clients did not resume; {} clients failed: {}",
                self.cut_clients - self.resumed,
                self.cut_clients,
                self.failed_clients,
                self.failures_listed.join("; ")
            ));
        }
        if self.lost > 0 {
            failures.push(format!("{} deliveries lost", self.lost));
        }
        if self.app_duplicates > 0 {
            failures.push(format!(
                "{} deliveries processed twice",
                self.app_duplicates
            ));
        }
        if self.resets > 0 {
            failures.push(format!(
                "{} resets (history too short for the outage: more --topics or a lower --rate)",
                self.resets
            ));
        }
        if self.unexpected > 0 {
            failures.push(format!("{} unexpected frames", self.unexpected));
        }
        failures
    }
}
