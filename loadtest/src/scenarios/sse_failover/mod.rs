//! `sse-failover`: server-sent event streams across a pod's death. N
//! `EventSource`-style clients, round-robin over the gateways (pods sharing
//! a Redis), each on one topic, while a paced publisher posts to a pod that
//! survives; at `kill_at` one gateway is killed with SIGKILL (`kill_pid`,
//! one of the `gateways`, found by its listening socket as `storm` finds
//! it), or, without one, every client's connection is dropped by the tool.
//! Each client whose stream ends comes back as `EventSource` does: after
//! the server's `retry:` (or `retry` when it gave none; jittered, doubled
//! per failed attempt up to [`RETRY_CAP`]), with `Last-Event-ID` set to the
//! last `id:` it read, at the next gateway in the list (a load balancer
//! sends it to a live pod; one that refuses is skipped).
//!
//! Counting, per client, against every seq the publisher was answered for
//! the client's topic: **lost**, a seq never received; **duplicated**, a
//! seq received more than once. A stream resumed by its event id owes
//! exactly what it missed (a replay from history, nothing twice), so both
//! must be 0, and so must `reset` events (continuity lost: the history did
//! not reach back) and publish errors; every client cut must come back.
//!
//! Layout: the options, the run, the counting ([`merge`]) and the result
//! here; the clients in [`client`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use self::client::{follow, open_all};
use super::storm::{gateway_of, kill};
use super::{DEFAULT_SIZE, check_bounds, unique_topic};
use crate::clients::{self, FD_MARGIN};
use crate::cpu::{Meter, Usage};
use crate::latency::{Stamp, Summary, micros};
use crate::publish::{Pool, body};
use crate::report::{Outcome, Row};
use crate::sessions::Phase;
use crate::{Error, Target};

mod client;

/// Clients, over all gateways.
pub const DEFAULT_CLIENTS: usize = 1000;
/// Topics; client `i` reads topic `i % topics`.
pub const DEFAULT_TOPICS: usize = 10;
/// Messages per second, over all topics.
pub const DEFAULT_RATE: f64 = 50.0;
/// How long the publisher publishes.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// When the kill comes, from the first publish.
pub const DEFAULT_KILL_AT: Duration = Duration::from_secs(3);
/// After the last publish, how long to wait for every client to have
/// everything.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(15);
/// The reconnection time when the server gave none (browsers take about
/// 3 s; a shorter one makes a shorter run).
pub const DEFAULT_RETRY: Duration = Duration::from_millis(500);
/// No reconnect waits longer.
pub const RETRY_CAP: Duration = Duration::from_secs(5);
/// Keep-alive HTTP connections of the publisher.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// Most clients.
pub const MAX_CLIENTS: usize = 100_000;
/// Highest rate.
pub const MAX_RATE: f64 = 10_000.0;
/// Each client's read buffer (it grows for a larger event).
const BUFFER_BYTES: usize = 2048;
/// Publishes waiting for an answer at once.
const MAX_IN_FLIGHT: usize = 10_000;
/// Clients' failures and attempt errors listed in the result.
const LISTED: usize = 5;
/// Between two looks at the progress while draining.
const DRAIN_POLL: Duration = Duration::from_millis(10);

#[derive(Debug, Clone)]
pub struct Options {
    /// Client `i` first connects to `gateways[i % len]`.
    pub gateways: Vec<Target>,
    /// Where the publisher posts [default: the first gateway not killed].
    pub publish_to: Option<Target>,
    /// The gateway process to SIGKILL; without one, the tool drops every
    /// client's connection instead.
    pub kill_pid: Option<u32>,
    pub clients: usize,
    pub topics: usize,
    pub rate: f64,
    pub duration: Duration,
    pub kill_at: Duration,
    pub drain: Duration,
    /// The reconnection time when the server sent no `retry:`.
    pub retry: Duration,
    pub size: usize,
    pub connections: usize,
    /// Local processes (gateways, redis) whose CPU time to report.
    pub watch: Vec<u32>,
}

impl Options {
    pub fn new(gateways: Vec<Target>) -> Self {
        Self {
            gateways,
            publish_to: None,
            kill_pid: None,
            clients: DEFAULT_CLIENTS,
            topics: DEFAULT_TOPICS,
            rate: DEFAULT_RATE,
            duration: DEFAULT_DURATION,
            kill_at: DEFAULT_KILL_AT,
            drain: DEFAULT_DRAIN,
            retry: DEFAULT_RETRY,
            size: DEFAULT_SIZE,
            connections: DEFAULT_CONNECTIONS,
            watch: Vec::new(),
        }
    }

    fn validate(&self) -> Result<(), Error> {
        check_bounds(self.duration, self.size)?;
        let bad = |m: String| Err(Error::Options(m));
        if self.gateways.is_empty() {
            return bad("give at least one --gateway".to_owned());
        }
        if self.kill_pid.is_some() && self.gateways.len() < 2 {
            return bad(
                "--kill-pid needs at least two --gateway (the clients come back at the others)"
                    .to_owned(),
            );
        }
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return bad(format!("--clients must be 1 to {MAX_CLIENTS}"));
        }
        if self.topics == 0 || self.topics > self.clients {
            return bad("--topics must be 1 to --clients".to_owned());
        }
        if !(self.rate > 0.0 && self.rate <= MAX_RATE) {
            return bad(format!("--rate must be over 0 and at most {MAX_RATE}"));
        }
        if self.kill_at >= self.duration {
            return bad("--kill-at must come before the end of --duration".to_owned());
        }
        if self.drain.is_zero() || self.drain > super::MAX_DURATION {
            return bad("--drain must be over 0s and at most the longest run".to_owned());
        }
        if self.retry.is_zero() || self.retry > RETRY_CAP {
            return bad(format!("--retry must be over 0 and at most {RETRY_CAP:?}"));
        }
        if self.connections == 0 || self.connections > 1024 {
            return bad("--connections must be 1 to 1024".to_owned());
        }
        Ok(())
    }
}

/// The result of an `sse-failover` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SseFailover {
    pub gateways: Vec<String>,
    pub publish_to: String,
    /// `kill -9 <pid> (<url>)`, or `cut` (the tool dropped every stream).
    pub cut: String,
    pub clients: usize,
    pub topics: usize,
    pub rate_per_s: f64,
    pub duration_s: f64,
    pub kill_at_s: f64,
    pub retry_ms: u64,
    pub connect_s: f64,
    pub messages: u64,
    pub published: u64,
    pub publish_errors: u64,
    pub first_publish_error: Option<String>,
    /// Clients whose stream ended at or after the kill.
    pub cut_clients: u64,
    /// Of those, the ones that read their stream again.
    pub reconnected: u64,
    /// From the kill to the last cut client's stream open again; `None`
    /// unless every one came back.
    pub all_reconnected_s: Option<f64>,
    pub reconnect_time: Summary,
    /// Reconnect attempts over all clients, and why they failed, most
    /// frequent first.
    pub attempts: u64,
    pub failed_attempts: Vec<String>,
    /// Streams that ended before the kill.
    pub other_disconnects: u64,
    pub deliveries_expected: u64,
    pub received: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub clients_with_loss: u64,
    pub clients_with_duplicates: u64,
    /// `reset` events (must be 0).
    pub resets: u64,
    /// `ok` events on a reconnect with `recovered: false`.
    pub unrecovered: u64,
    /// Events that are no `msg`, `ok`, `reset` or `reconnect` of the topic.
    pub unexpected: u64,
    pub failures_listed: Vec<String>,
    pub drain_wait_s: f64,
    pub cpu: Usage,
}

/// What one client saw.
struct Record {
    client: usize,
    topic: usize,
    /// Every `msg` seq of its topic, as they came.
    seqs: Vec<u64>,
    /// When its stream ended, and when one opened again after it.
    lost_at: Vec<Instant>,
    back_at: Vec<Instant>,
    attempts: u64,
    attempt_errors: Vec<String>,
    resets: u64,
    unrecovered: u64,
    unexpected: u64,
    failure: Option<String>,
}

pub async fn run(options: Options) -> Result<SseFailover, Error> {
    options.validate()?;
    let killed = match options.kill_pid {
        Some(pid) => Some((pid, gateway_of(pid, &options.gateways)?)),
        None => None,
    };
    let publish_to = match (&options.publish_to, killed) {
        (Some(t), Some((pid, g))) if t.addr == options.gateways[g].addr => {
            return Err(Error::Options(format!(
                "--publish-to {} is the gateway that --kill-pid {pid} kills",
                t.http_url()
            )));
        }
        (Some(t), _) => t.clone(),
        (None, Some((_, g))) => options.gateways[usize::from(g == 0)].clone(),
        (None, None) => options.gateways[0].clone(),
    };
    clients::raise_fd_limit((options.clients + options.connections) as u64 + FD_MARGIN)?;
    let run_topic = unique_topic("sse-failover");
    let topics: Arc<[String]> = (0..options.topics)
        .map(|t| format!("{run_topic}.{t}"))
        .collect();
    let pool = Arc::new(Pool::open(publish_to.addr, options.connections).await?);

    let connecting = Instant::now();
    let opened = open_all(&options, &topics).await?;
    let connect = connecting.elapsed();
    let mut per_topic = vec![0u64; options.topics];
    for (client, _) in &opened {
        per_topic[client % options.topics] += 1;
    }

    let progress = Arc::new(AtomicU64::new(0));
    let (phase, phases) = watch::channel(Phase::Running);
    let options = Arc::new(options);
    let readers: Vec<_> = opened
        .into_iter()
        .map(|(client, c)| {
            tokio::spawn(follow(
                client,
                c,
                options.clone(),
                topics.clone(),
                progress.clone(),
                phases.clone(),
            ))
        })
        .collect();

    let messages = ((options.rate * options.duration.as_secs_f64()).round() as usize).max(1);
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / options.rate));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let meter = Meter::start(&options.watch);
    let mut sends = JoinSet::new();
    let mut answers: Vec<Vec<u64>> = vec![Vec::new(); options.topics];
    let (mut errors, mut first_error) = (0u64, None);
    let mut note = |done: Result<(usize, Result<u64, Error>), tokio::task::JoinError>| match done {
        Ok((t, Ok(seq))) => answers[t].push(seq),
        Ok((_, Err(e))) => {
            errors += 1;
            first_error.get_or_insert(e.to_string());
        }
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    let first_tick = ticks.tick().await;
    let mut cut_instant = None;
    for i in 0..messages {
        while let Some(done) = sends.try_join_next() {
            note(done);
        }
        if sends.len() >= MAX_IN_FLIGHT
            && let Some(done) = sends.join_next().await
        {
            note(done);
        }
        if i > 0 {
            ticks.tick().await;
        }
        if cut_instant.is_none() && (first_tick.elapsed() >= options.kill_at || i + 1 == messages) {
            cut_instant = Some(Instant::now());
            match killed {
                Some((pid, _)) => {
                    if let Err(e) = kill(pid) {
                        let _ = phase.send(Phase::Stop);
                        return Err(e);
                    }
                }
                None => {
                    let _ = phase.send(Phase::Cut);
                }
            }
        }
        let (pool, topics, size) = (pool.clone(), topics.clone(), options.size);
        let t = i % options.topics;
        sends.spawn(async move {
            let sent = pool
                .publish_with(|| body(&topics[t], &Stamp::now(i as u64).encode(size)))
                .await;
            (t, sent.map(|p| p.seq))
        });
    }
    while let Some(done) = sends.join_next().await {
        note(done);
    }
    let expected: u64 = answers
        .iter()
        .zip(&per_topic)
        .map(|(seqs, n)| seqs.len() as u64 * n)
        .sum();
    let draining = Instant::now();
    while progress.load(Ordering::Relaxed) < expected
        && draining.elapsed() < options.drain
        && !readers.iter().all(|r| r.is_finished())
    {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let drain_wait = draining.elapsed();
    let cpu = meter.stop();
    let _ = phase.send(Phase::Stop);
    let mut records = Vec::with_capacity(readers.len());
    for reader in readers {
        match reader.await {
            Ok(r) => records.push(r),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let mut result = SseFailover {
        gateways: options.gateways.iter().map(|g| g.http_url()).collect(),
        publish_to: publish_to.http_url(),
        cut: match killed {
            Some((pid, g)) => format!("kill -9 {pid} ({})", options.gateways[g].http_url()),
            None => "cut".to_owned(),
        },
        clients: options.clients,
        topics: options.topics,
        rate_per_s: options.rate,
        duration_s: options.duration.as_secs_f64(),
        kill_at_s: options.kill_at.as_secs_f64(),
        retry_ms: options.retry.as_millis() as u64,
        connect_s: connect.as_secs_f64(),
        messages: messages as u64,
        published: answers.iter().map(|a| a.len() as u64).sum(),
        publish_errors: errors,
        first_publish_error: first_error,
        cut_clients: 0,
        reconnected: 0,
        all_reconnected_s: None,
        reconnect_time: Summary::default(),
        attempts: 0,
        failed_attempts: Vec::new(),
        other_disconnects: 0,
        deliveries_expected: expected,
        received: 0,
        lost: 0,
        duplicated: 0,
        clients_with_loss: 0,
        clients_with_duplicates: 0,
        resets: 0,
        unrecovered: 0,
        unexpected: 0,
        failures_listed: Vec::new(),
        drain_wait_s: drain_wait.as_secs_f64(),
        cpu,
    };
    merge(&mut result, cut_instant, &answers, records);
    Ok(result)
}

/// Folds the clients' records into `result`.
fn merge(
    result: &mut SseFailover,
    cut: Option<Instant>,
    answers: &[Vec<u64>],
    records: Vec<Record>,
) {
    let mut back_us = Vec::new();
    let mut last_back = Some(Duration::ZERO);
    let mut attempt_errors: std::collections::BTreeMap<String, u64> = Default::default();
    for mut r in records {
        r.seqs.sort_unstable();
        let received = r.seqs.len() as u64;
        r.seqs.dedup();
        let duplicated = received - r.seqs.len() as u64;
        let lost = answers[r.topic]
            .iter()
            .filter(|s| r.seqs.binary_search(s).is_err())
            .count() as u64;
        result.received += received;
        result.duplicated += duplicated;
        result.lost += lost;
        result.clients_with_loss += u64::from(lost > 0);
        result.clients_with_duplicates += u64::from(duplicated > 0);
        result.resets += r.resets;
        result.unrecovered += r.unrecovered;
        result.unexpected += r.unexpected;
        result.attempts += r.attempts;
        for e in r.attempt_errors {
            *attempt_errors.entry(e).or_default() += 1;
        }
        let cut_at = cut.filter(|&c| r.lost_at.iter().any(|&t| t >= c));
        result.other_disconnects += r
            .lost_at
            .iter()
            .filter(|&&t| cut.is_none_or(|c| t < c))
            .count() as u64;
        if let Some(c) = cut_at {
            result.cut_clients += 1;
            match r.back_at.iter().find(|&&t| t >= c) {
                Some(&t) => {
                    result.reconnected += 1;
                    back_us.push(micros(t - c));
                    last_back = last_back.map(|l| l.max(t - c));
                }
                None => last_back = None,
            }
        }
        if let Some(f) = r.failure
            && result.failures_listed.len() < LISTED
        {
            result
                .failures_listed
                .push(format!("client {}: {f}", r.client));
        }
    }
    let mut attempt_errors: Vec<_> = attempt_errors.into_iter().collect();
    attempt_errors.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    result.failed_attempts = attempt_errors
        .into_iter()
        .take(LISTED)
        .map(|(e, n)| format!("{e}: {n}"))
        .collect();
    result.reconnect_time = Summary::of(&mut back_us);
    result.all_reconnected_s = last_back
        .filter(|_| result.cut_clients > 0)
        .map(|d| d.as_secs_f64());
}

impl Outcome for SseFailover {
    const SCENARIO: &'static str = "sse-failover";

    fn rows(&self) -> Vec<Row> {
        vec![
            Row::new(
                "clients",
                format!(
                    "{} SSE streams over {} gateways, {} topics; open in {:.2} s",
                    self.clients,
                    self.gateways.len(),
                    self.topics,
                    self.connect_s
                ),
            ),
            Row::new(
                "publisher",
                format!(
                    "{} msg/s for {:.0} s to {}: {} of {} accepted ({} errors)",
                    self.rate_per_s,
                    self.duration_s,
                    self.publish_to,
                    self.published,
                    self.messages,
                    self.publish_errors
                ),
            ),
            Row::new("cut", format!("{} at {:.1} s", self.cut, self.kill_at_s)),
            Row::new(
                "streams back",
                format!(
                    "{} of {} cut, all within {}; per client {}",
                    self.reconnected,
                    self.cut_clients,
                    self.all_reconnected_s
                        .map_or("n/a".to_owned(), |s| format!("{s:.2} s")),
                    self.reconnect_time.brief()
                ),
            ),
            Row::new(
                "reconnect attempts",
                format!("{} ({})", self.attempts, self.failed_attempts.join(", ")),
            ),
            Row::new(
                "deliveries",
                format!("{} of {} expected", self.received, self.deliveries_expected),
            ),
            Row::new(
                "lost",
                format!("{} ({} clients)", self.lost, self.clients_with_loss),
            ),
            Row::new(
                "duplicated",
                format!(
                    "{} ({} clients)",
                    self.duplicated, self.clients_with_duplicates
                ),
            ),
            Row::new("resets", self.resets),
            Row::new("not recovered on reconnect", self.unrecovered),
            Row::new("unexpected events", self.unexpected),
            Row::new("streams ended before the cut", self.other_disconnects),
            Row::new("CPU", self.cpu.brief()),
        ]
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
        for (n, what) in [
            (self.lost, "deliveries lost"),
            (self.duplicated, "deliveries duplicated"),
            (self.resets, "resets"),
            (self.unrecovered, "streams not recovered on reconnect"),
            (self.unexpected, "unexpected events"),
            (self.other_disconnects, "streams ended before the cut"),
        ] {
            if n > 0 {
                failures.push(format!("{n} {what}"));
            }
        }
        if self.reconnected < self.cut_clients {
            failures.push(format!(
                "{} of {} cut clients did not come back",
                self.cut_clients - self.reconnected,
                self.cut_clients
            ));
        }
        if !self.failures_listed.is_empty() {
            failures.push(format!("errors: {}", self.failures_listed.join("; ")));
        }
        failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_and_duplicated_are_counted_per_client() {
        let gateway = Target::at(([127, 0, 0, 1], 1).into()).expect("t");
        let mut result = run_less_result(&gateway);
        let now = Instant::now();
        let record = |client, seqs: Vec<u64>| Record {
            client,
            topic: 0,
            seqs,
            lost_at: vec![now],
            back_at: vec![now + Duration::from_millis(300)],
            attempts: 1,
            attempt_errors: vec!["refused".to_owned()],
            resets: 0,
            unrecovered: 0,
            unexpected: 0,
            failure: None,
        };
        let records = vec![
            record(0, vec![1, 2, 3, 4]),
            record(1, vec![1, 3, 3, 2, 4, 4]),
        ];
        merge(&mut result, Some(now), &[vec![1, 2, 3, 4, 5]], records);
        assert_eq!((result.lost, result.clients_with_loss), (2, 2));
        assert_eq!((result.duplicated, result.clients_with_duplicates), (2, 1));
        assert_eq!((result.cut_clients, result.reconnected), (2, 2));
        assert_eq!(result.all_reconnected_s, Some(0.3));
        assert_eq!(result.failed_attempts, ["refused: 2"]);
        assert!(!result.failures().is_empty());
        let mut options = Options::new(vec![gateway]);
        options.kill_pid = Some(1);
        assert!(options.validate().is_err(), "a kill needs a second gateway");
    }

    fn run_less_result(gateway: &Target) -> SseFailover {
        SseFailover {
            gateways: vec![gateway.http_url()],
            publish_to: gateway.http_url(),
            cut: "cut".to_owned(),
            clients: 2,
            topics: 1,
            rate_per_s: 1.0,
            duration_s: 1.0,
            kill_at_s: 0.5,
            retry_ms: 500,
            connect_s: 0.0,
            messages: 5,
            published: 5,
            publish_errors: 0,
            first_publish_error: None,
            cut_clients: 0,
            reconnected: 0,
            all_reconnected_s: None,
            reconnect_time: Summary::default(),
            attempts: 0,
            failed_attempts: Vec::new(),
            other_disconnects: 0,
            deliveries_expected: 10,
            received: 0,
            lost: 0,
            duplicated: 0,
            clients_with_loss: 0,
            clients_with_duplicates: 0,
            resets: 0,
            unrecovered: 0,
            unexpected: 0,
            failures_listed: Vec::new(),
            drain_wait_s: 0.0,
            cpu: Usage::default(),
        }
    }
}
