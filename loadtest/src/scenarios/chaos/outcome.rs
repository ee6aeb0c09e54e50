//! What a `chaos` run found ([`Chaos`]): the figures gathered from the
//! faults, the publishers' answers, the clients' records and the
//! [`check`]'s verdict, its table and its failures. Its own
//! module: the result and how it reads, apart from how the run gets it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::client::Record;
use super::faults::Fault;
use super::publisher::Attempt;
use super::{LISTED, Options, Redis, Tally, check};
use crate::cpu::Usage;
use crate::report::{Outcome, Row};

/// The result of a `chaos` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Chaos {
    pub seed: u64,
    /// The Redis the pods used.
    #[serde(default)]
    pub redis: Redis,
    pub pods: usize,
    pub clients: usize,
    pub topics: usize,
    pub subscriptions: usize,
    pub publishers: usize,
    pub rate_per_s: f64,
    pub duration_s: f64,
    /// From the first client's connect to the end of the drain.
    pub ran_s: f64,
    pub churn_s: f64,
    pub faults: Vec<Fault>,
    /// Faults injected, by kind.
    pub faults_by_kind: BTreeMap<String, u64>,
    /// Faults that could not be injected as planned.
    pub faults_failed: u64,
    /// Faults after which Redis held less than had been issued.
    pub lossy_faults: u64,
    pub lost_writes: u64,
    pub lost_acked_writes: u64,
    pub published: u64,
    pub acked: u64,
    pub publish_errors: u64,
    /// Why publishes failed, `reason: count`, most frequent first.
    pub publish_error_reasons: Vec<String>,
    /// `msg` frames checked, redeliveries included.
    pub checked: u64,
    pub processed: u64,
    /// Replayed after a resume and dropped by the seq rule (at-least-once).
    pub redelivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub mismatched: u64,
    pub ack_conflicts: u64,
    pub resets_expected: u64,
    pub resets_history: u64,
    pub resets_unexpected: u64,
    /// Answered publishes clients never got because a reset skipped them.
    pub skipped_at_resets: u64,
    /// Per topic, its final epoch and newest answered seq.
    pub finals: Vec<Option<(String, u64)>>,
    pub client_cuts: u64,
    pub connections_lost: u64,
    pub resumes: u64,
    pub reconnect_attempts: u64,
    /// Why reconnect attempts failed, `reason: count`, most frequent first.
    pub failed_attempts: Vec<String>,
    pub sessions_lost: u64,
    pub sessions_lost_listed: Vec<String>,
    pub failed_clients: u64,
    pub failures_listed: Vec<String>,
    pub unexpected_frames: u64,
    pub unexpected_listed: Vec<String>,
    /// `herald_redis_rewinds_total` over the pods at the end (a pod
    /// restarted counts from its restart).
    pub pod_rewinds: u64,
    /// From the last publish until every client had caught up (or the drain ran out).
    pub drain_s: f64,
    pub caught_up: bool,
    /// The first problems of each kind found, described.
    pub problems: Vec<String>,
    /// Problems found, by kind.
    pub problem_counts: BTreeMap<String, u64>,
    /// Logs and dumps (removed after a run that passed, unless kept).
    pub dir: String,
    pub cpu: Usage,
}

/// `reason: count`, most frequent first.
fn by_count<'a>(reasons: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for r in reasons {
        *counts.entry(r).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    counts
        .into_iter()
        .map(|(r, n)| format!("{r}: {n}"))
        .collect()
}

#[allow(clippy::too_many_arguments)]
pub(super) fn tally(
    options: &Options,
    seed: u64,
    dir: &std::path::Path,
    faults: Vec<Fault>,
    attempts: &[Attempt],
    records: &[Record],
    v: check::Verdict,
    t: Tally,
) -> Chaos {
    let mut faults_by_kind = BTreeMap::new();
    for f in &faults {
        *faults_by_kind.entry(f.kind.name().to_owned()).or_default() += 1;
    }
    let errors: Vec<&str> = attempts
        .iter()
        .filter_map(|a| a.answer.as_ref().err())
        .map(|e| shorten(e))
        .collect();
    let sessions_lost_listed: Vec<String> = records
        .iter()
        .flat_map(|r| {
            r.sessions_lost
                .iter()
                .map(move |s| format!("client {}: {s}", r.client))
        })
        .take(LISTED)
        .collect();
    Chaos {
        seed,
        redis: options.redis,
        pods: options.pods,
        clients: options.clients,
        topics: options.topics,
        subscriptions: options.subscriptions,
        publishers: options.publishers,
        rate_per_s: options.rate,
        duration_s: options.duration.as_secs_f64(),
        ran_s: t.ran.as_secs_f64(),
        churn_s: options.churn.as_secs_f64(),
        faults_failed: faults.iter().filter(|f| f.error.is_some()).count() as u64,
        lossy_faults: faults.iter().filter(|f| f.lossy()).count() as u64,
        lost_writes: faults.iter().map(|f| f.lost_writes).sum(),
        lost_acked_writes: faults.iter().map(|f| f.lost_acked).sum(),
        faults,
        faults_by_kind,
        published: attempts.len() as u64,
        acked: v.acked,
        publish_errors: errors.len() as u64,
        publish_error_reasons: by_count(errors.into_iter()),
        checked: v.checked,
        processed: v.processed,
        redelivered: v.redelivered,
        lost: v.lost,
        duplicated: v.duplicated,
        mismatched: v.mismatched,
        ack_conflicts: v.ack_conflicts,
        resets_expected: v.resets_expected,
        resets_history: v.resets_history,
        resets_unexpected: v.resets_unexpected,
        skipped_at_resets: v.skipped_at_resets,
        finals: v.finals,
        client_cuts: records.iter().map(|r| u64::from(r.cuts)).sum(),
        connections_lost: records.iter().map(|r| u64::from(r.lost)).sum(),
        resumes: records.iter().map(|r| u64::from(r.resumes)).sum(),
        reconnect_attempts: records.iter().map(|r| u64::from(r.attempts)).sum(),
        failed_attempts: by_count(
            records
                .iter()
                .flat_map(|r| r.attempt_errors.iter().map(|e| shorten(e))),
        ),
        sessions_lost: records.iter().map(|r| r.sessions_lost.len() as u64).sum(),
        sessions_lost_listed,
        failed_clients: records.iter().filter(|r| r.failure.is_some()).count() as u64,
        failures_listed: records
            .iter()
            .filter_map(|r| Some(format!("client {}: {}", r.client, r.failure.as_ref()?)))
            .take(LISTED)
            .collect(),
        unexpected_frames: records.iter().map(|r| r.unexpected).sum(),
        unexpected_listed: records
            .iter()
            .flat_map(|r| r.unexpected_kept.iter().cloned())
            .take(LISTED)
            .collect(),
        pod_rewinds: t.pod_rewinds,
        drain_s: t.drain.as_secs_f64(),
        caught_up: t.caught_up,
        problems: v.problems,
        problem_counts: v.problem_counts,
        dir: dir.display().to_string(),
        cpu: t.cpu,
    }
}

/// An error without the addresses and numbers that make each one unique.
fn shorten(e: &str) -> &str {
    let e = e.split_once(": ").map_or(e, |(_, rest)| rest);
    e.split(" (").next().unwrap_or(e)
}

impl Outcome for Chaos {
    const SCENARIO: &'static str = "chaos";

    fn rows(&self) -> Vec<Row> {
        let list = |l: &[String]| {
            if l.is_empty() {
                "none".to_owned()
            } else {
                l.join("; ")
            }
        };
        let mut rows = vec![
            Row::new(
                "cluster",
                format!(
                    "{} pods, {}; seed {}",
                    self.pods,
                    match self.redis {
                        Redis::One => "Redis master + replica behind a proxy",
                        Redis::Cluster => "Redis Cluster of 3 masters with a replica each",
                    },
                    self.seed
                ),
            ),
            Row::new(
                "clients",
                format!(
                    "{} with sessions, {} of {} topics each, own cut every {} s on average",
                    self.clients, self.subscriptions, self.topics, self.churn_s
                ),
            ),
            Row::new(
                "publishers",
                format!(
                    "{} at {}/s in all for {} s; ran {:.1} s in all",
                    self.publishers, self.rate_per_s, self.duration_s, self.ran_s
                ),
            ),
            Row::new(
                "faults",
                format!(
                    "{} ({}); {} failed to inject",
                    self.faults.len(),
                    self.faults_by_kind
                        .iter()
                        .map(|(k, n)| format!("{k} {n}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    self.faults_failed
                ),
            ),
        ];
        for f in &self.faults {
            rows.push(Row::new(
                format!("  {:.1} s {}", f.at_s, f.kind.name()),
                format!(
                    "{:.1} s;{} lost {} writes ({} acked); {} resets{}",
                    f.took_s,
                    f.master
                        .map(|m| format!(
                            " master {m}, topics {:?};",
                            f.topics.clone().unwrap_or_default()
                        ))
                        .unwrap_or_default(),
                    f.lost_writes,
                    f.lost_acked,
                    f.resets,
                    f.error
                        .as_deref()
                        .map(|e| format!("; FAILED: {e}"))
                        .unwrap_or_default()
                ),
            ));
        }
        rows.extend([
            Row::new(
                "published",
                format!(
                    "{} acknowledged of {} ({} errors: {})",
                    self.acked,
                    self.published,
                    self.publish_errors,
                    list(&self.publish_error_reasons)
                ),
            ),
            Row::new(
                "Redis lost",
                format!(
                    "{} writes ({} acknowledged) in {} faults",
                    self.lost_writes, self.lost_acked_writes, self.lossy_faults
                ),
            ),
            Row::new(
                "messages checked",
                format!(
                    "{} ({} processed, {} redelivered and dropped by the seq rule)",
                    self.checked, self.processed, self.redelivered
                ),
            ),
            Row::new("lost", self.lost),
            Row::new("duplicated", self.duplicated),
            Row::new("mismatched", self.mismatched),
            Row::new("ack conflicts", self.ack_conflicts),
            Row::new(
                "resets",
                format!(
                    "{} after faults that lost writes, {} where history could not bridge, {} unexpected",
                    self.resets_expected, self.resets_history, self.resets_unexpected
                ),
            ),
            Row::new("skipped at resets", self.skipped_at_resets),
            Row::new(
                "connections",
                format!(
                    "{} lost ({} cut by the clients), {} resumed, {} attempts",
                    self.connections_lost, self.client_cuts, self.resumes, self.reconnect_attempts
                ),
            ),
            Row::new("failed attempts", list(&self.failed_attempts)),
            Row::new("sessions lost", self.sessions_lost),
            Row::new("failed clients", self.failed_clients),
            Row::new("unexpected frames", self.unexpected_frames),
            Row::new("pod rewinds (metric)", self.pod_rewinds),
            Row::new(
                "drain",
                format!(
                    "{:.2} s ({})",
                    self.drain_s,
                    if self.caught_up { "all caught up" } else { "NOT all caught up" }
                ),
            ),
            Row::new("CPU", self.cpu.brief()),
            Row::new("logs", &self.dir),
        ]);
        if !self.problem_counts.is_empty() {
            rows.push(Row::new(
                "problems",
                self.problem_counts
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        for p in &self.problems {
            rows.push(Row::new("  problem", p));
        }
        rows
    }

    fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.acked == 0 {
            failures.push("no publish was acknowledged".to_owned());
        }
        if self.faults.is_empty() {
            failures.push("no fault was injected (a longer --duration?)".to_owned());
        }
        if self.faults_failed > 0 {
            failures.push(format!(
                "{} faults could not be injected",
                self.faults_failed
            ));
        }
        for (n, what) in [
            (self.lost, "messages lost"),
            (self.duplicated, "messages duplicated"),
            (
                self.mismatched,
                "messages not the publish acknowledged at their seq",
            ),
            (self.ack_conflicts, "seqs acknowledged to two publishes"),
            (
                self.resets_unexpected,
                "resets after no fault that lost writes",
            ),
            (self.sessions_lost, "sessions lost"),
            (self.unexpected_frames, "unexpected frames"),
        ] {
            if n > 0 {
                failures.push(format!("{n} {what}"));
            }
        }
        if self.failed_clients > 0 {
            failures.push(format!(
                "{} clients failed: {}",
                self.failed_clients,
                self.failures_listed.join("; ")
            ));
        }
        if !self.caught_up && self.lost == 0 {
            failures.push("not every client caught up by the end of the drain".to_owned());
        }
        failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_grouped_without_their_addresses() {
        assert_eq!(
            shorten(
                "publish to 127.0.0.1:1: connect: Connection refused (os error 111) (is the gateway running?)"
            ),
            "connect: Connection refused"
        );
    }
}
