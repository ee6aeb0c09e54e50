//! `storm`: N clients with sessions, subscribed and acking while a paced
//! publisher runs; at `cut_at` every connection is cut at once, and every
//! client comes back with `resume` (jittered backoff, or the server's
//! `reconnect.after_ms`). Reports the time from the cut until every client
//! that lost its connection has its session back, and, per client, the
//! messages lost and duplicated; both must be 0.
//!
//! Three ways to cut:
//! - by default the tool aborts every client's connection itself (SO_LINGER
//!   0, then drop): the gateway sees a reset, as when a network path dies;
//! - with `cut = HalfOpen` (`--cut half-open`) the clients leave their old
//!   connections open and silent and come back on new ones: the gateway
//!   learns of each loss only from the resume, which takes the old
//!   connection over;
//! - with `kill_pid`, it sends SIGKILL to a gateway process instead (one of
//!   the `gateways`, found by its listening socket; it refuses any other
//!   process). Its clients come back at the other gateways, which needs
//!   `broker = "redis"`; each reconnect picks a gateway at random among
//!   those that did not refuse a connection in the last
//!   [`DOWN_FOR`](crate::sessions::DOWN_FOR), as a Service picks a live
//!   endpoint.
//!
//! Counting. The publisher keeps every seq the gateway answered, per topic.
//! Each client keeps every seq that came over the wire and every seq its
//! application processed under the protocol's rule ("drop a `msg` whose
//! `seq` is not above the last one processed"). After the last publish and
//! a drain:
//! - **lost**: a published seq of the client's topic it never processed;
//! - **duplicated (application)**: a seq processed twice: the figure that
//!   must be 0. Under the rule it can only happen after a `reset` moved a
//!   client back, so it is a check of the client as much as of the server;
//! - **redelivered (wire)**: a seq that came over the wire again, dropped by
//!   the rule. Expected after a resume (what was delivered but not acked
//!   yet is replayed: at-least-once), more of it after a kill (acks younger
//!   than `session.flush_interval` were not saved). Reported, not a failure.
//!
//! The history must hold what the publisher sends to a topic while its
//! clients are away (`history_size`, default 100 per topic): spread the rate
//! over `--topics`.
//!
//! Layout: the options and the run here; [`outcome`] (the result, the
//! records folded into it, its table), [`mod@kill`] (`--kill-pid`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::{DEFAULT_SIZE, check_bounds, unique_topic};
use crate::clients::{self, FD_MARGIN};
use crate::cpu::Meter;
use crate::latency::{Stamp, Summary, micros};
use crate::publish::{Pool, body};
use crate::sessions::{self, Backoff, Cut, Phase, Plan};
use crate::{Error, Target};

mod kill;
mod outcome;

pub(crate) use self::kill::{gateway_of, kill};
pub use self::outcome::Storm;

/// Clients, over all gateways.
pub const DEFAULT_CLIENTS: usize = 1000;
/// Topics; client `i` subscribes to topic `i % topics`.
pub const DEFAULT_TOPICS: usize = 10;
/// Messages per second, over all topics.
pub const DEFAULT_RATE: f64 = 50.0;
/// How long the publisher publishes.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// When the cut comes, from the first publish.
pub const DEFAULT_CUT_AT: Duration = Duration::from_secs(3);
/// After the last publish, how long to wait for every client to have
/// resumed and processed everything.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);
/// The first reconnect waits up to this long (at random).
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(100);
/// No reconnect waits longer.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(2);
/// Acks are cumulative; a client sends one at most this often.
pub const DEFAULT_ACK_INTERVAL: Duration = Duration::from_millis(20);
/// Keep-alive HTTP connections of the publisher.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// Most clients one process runs (each is a file descriptor; see `--help`).
pub const MAX_CLIENTS: usize = 100_000;
/// Highest rate.
pub const MAX_RATE: f64 = 10_000.0;
/// Publishes waiting for an answer at once; the schedule waits beyond.
const MAX_IN_FLIGHT: usize = 10_000;
/// Most failed clients listed in the result.
const FAILURES_LISTED: usize = 5;
/// Between two looks at the progress while draining.
const DRAIN_POLL: Duration = Duration::from_millis(10);

#[derive(Debug, Clone)]
pub struct Options {
    /// Client `i` first connects to `gateways[i % len]`; after the cut, to any.
    pub gateways: Vec<Target>,
    /// Where the publisher posts; default the first gateway (with
    /// `kill_pid`, the first one that is not killed).
    pub publish_to: Option<Target>,
    pub clients: usize,
    pub topics: usize,
    /// Messages per second, over all topics.
    pub rate: f64,
    pub duration: Duration,
    pub cut_at: Duration,
    pub drain: Duration,
    pub backoff: Backoff,
    /// How the tool cuts (without `kill_pid`).
    pub cut: Cut,
    /// Zero: ack every message as it is processed.
    pub ack_interval: Duration,
    /// Instead of cutting the connections, SIGKILL this gateway process.
    pub kill_pid: Option<u32>,
    /// Every client's `hello.token`.
    pub token: Option<String>,
    /// Payload bytes.
    pub size: usize,
    pub connections: usize,
    /// Local processes (gateways, redis) whose CPU time to report.
    pub watch: Vec<u32>,
}

impl Options {
    /// The defaults, against one gateway that also takes the publishes.
    pub fn new(gateway: Target) -> Self {
        Self {
            gateways: vec![gateway],
            publish_to: None,
            clients: DEFAULT_CLIENTS,
            topics: DEFAULT_TOPICS,
            rate: DEFAULT_RATE,
            duration: DEFAULT_DURATION,
            cut_at: DEFAULT_CUT_AT,
            drain: DEFAULT_DRAIN,
            backoff: Backoff {
                first: DEFAULT_BACKOFF,
                cap: DEFAULT_BACKOFF_CAP,
            },
            cut: Cut::Reset,
            ack_interval: DEFAULT_ACK_INTERVAL,
            kill_pid: None,
            token: None,
            size: DEFAULT_SIZE,
            connections: DEFAULT_CONNECTIONS,
            watch: Vec::new(),
        }
    }

    /// Messages published: `rate × duration`, at least one.
    pub fn messages(&self) -> usize {
        ((self.rate * self.duration.as_secs_f64()).round() as usize).max(1)
    }

    fn validate(&self) -> Result<(), Error> {
        check_bounds(self.duration, self.size)?;
        let bad = |m: String| Err(Error::Options(m));
        if self.gateways.is_empty() {
            return bad("give at least one --gateway".to_owned());
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
        if self.cut_at >= self.duration {
            return bad("--cut-at must come before the end of --duration".to_owned());
        }
        if self.drain.is_zero() || self.drain > super::MAX_DURATION {
            return bad("--drain must be over 0s and at most the longest run".to_owned());
        }
        if self.backoff.first.is_zero() || self.backoff.cap < self.backoff.first {
            return bad("--backoff must be over 0 and at most --backoff-cap".to_owned());
        }
        if self.backoff.cap > Duration::from_secs(60) || self.ack_interval > Duration::from_secs(10)
        {
            return bad("--backoff-cap is at most 60s, --ack-interval at most 10s".to_owned());
        }
        if self.kill_pid.is_some() && self.cut != Cut::Reset {
            return bad("--kill-pid is the cut: no --cut with it".to_owned());
        }
        if self.kill_pid.is_some() && self.gateways.len() < 2 {
            return bad(
                "--kill-pid needs at least two --gateway (the clients resume at the others)"
                    .to_owned(),
            );
        }
        Ok(())
    }
}

/// Runs the scenario: opens the sessions, publishes on schedule, cuts at
/// `cut_at`, waits for every client to have resumed and processed every
/// message (at most `drain` after the last publish), and counts.
pub async fn run(options: Options) -> Result<Storm, Error> {
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
        // The first one not killed (validate: there are at least two).
        (None, Some((_, g))) => options.gateways[usize::from(g == 0)].clone(),
        (None, None) => options.gateways[0].clone(),
    };
    let messages = options.messages();
    // A half-open cut keeps each client's old connection beside its new one.
    let per_client = if options.cut == Cut::HalfOpen { 2 } else { 1 };
    clients::raise_fd_limit(
        (options.clients * per_client + options.connections) as u64 + FD_MARGIN,
    )?;
    let run_topic = unique_topic("storm");
    let topics: Vec<String> = (0..options.topics)
        .map(|t| format!("{run_topic}.{t}"))
        .collect();

    let pool = Arc::new(Pool::open(publish_to.addr, options.connections).await?);
    let mut plan = Plan::new(
        options.gateways.clone(),
        options.backoff,
        options.cut,
        options.ack_interval,
    );
    plan.token = options.token.clone();
    let plan = Arc::new(plan);
    let connecting = Instant::now();
    let keepers = sessions::open_all(&plan, options.clients, &topics).await?;
    let connect_time = connecting.elapsed();
    let mut clients_per_topic = vec![0u64; options.topics];
    for k in &keepers {
        clients_per_topic[k.topic] += 1;
    }

    let progress = Arc::new(AtomicU64::new(0));
    let (phase, phases) = watch::channel(Phase::Running);
    let runners: Vec<_> = keepers
        .into_iter()
        .map(|k| tokio::spawn(k.run(plan.clone(), phases.clone(), progress.clone())))
        .collect();

    // The schedule, as in `pods`: message i at i / rate, each publish in a
    // task of its own, missed ticks caught up at once. The cut comes at
    // `cut_at` from the first tick, whatever the publishes are doing.
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / options.rate));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let meter = Meter::start(&options.watch);
    let topic_names: Arc<[String]> = topics.into();
    let size = options.size;
    let mut sends = JoinSet::new();
    let mut answers = Answers::new(options.topics);
    let mut cut_instant = None;
    let first_tick = ticks.tick().await;
    let cut_deadline = first_tick + options.cut_at;
    for i in 0..messages {
        while let Some(done) = sends.try_join_next() {
            answers.note(done);
        }
        if sends.len() >= MAX_IN_FLIGHT
            && let Some(done) = sends.join_next().await
        {
            answers.note(done);
        }
        if i > 0 {
            ticks.tick().await;
        }
        // At `cut_at`, or before the last message at the latest (a starved
        // schedule bursts): the publisher always outlives the cut.
        if cut_instant.is_none() && (Instant::now() >= cut_deadline || i + 1 == messages) {
            cut_instant = Some(Instant::now());
            match killed {
                Some((pid, _)) => {
                    if let Err(e) = kill(pid) {
                        // The clients see `Stop` and end; the publishes are aborted.
                        let _ = phase.send(Phase::Stop);
                        return Err(e);
                    }
                }
                None => {
                    let _ = phase.send(Phase::Cut);
                }
            }
        }
        let (pool, topics) = (pool.clone(), topic_names.clone());
        let t = i % options.topics;
        sends.spawn(async move {
            let started = Instant::now();
            let result = pool
                .publish_with(|| body(&topics[t], &Stamp::now(i as u64).encode(size)))
                .await;
            (t, result.map(|p| (p.seq, micros(started.elapsed()))))
        });
    }
    while let Some(done) = sends.join_next().await {
        answers.note(done);
    }
    let publish_time = first_tick.elapsed();
    let published: u64 = answers.seqs.iter().map(|s| s.len() as u64).sum();

    // Wait until every client has every message of its topic, within `drain`.
    let expected: u64 = answers
        .seqs
        .iter()
        .zip(&clients_per_topic)
        .map(|(seqs, clients)| seqs.len() as u64 * clients)
        .sum();
    let draining = Instant::now();
    while progress.load(Ordering::Relaxed) < expected
        && draining.elapsed() < options.drain
        && !runners.iter().all(|r| r.is_finished())
    {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let drain_wait = draining.elapsed();
    let cpu = meter.stop();
    let _ = phase.send(Phase::Stop);
    let mut records = Vec::with_capacity(runners.len());
    for runner in runners {
        match runner.await {
            Ok(r) => records.push(r),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let mut result = Storm {
        gateways: options.gateways.iter().map(Target::ws_url).collect(),
        publish_to: publish_to.http_url(),
        cut: match killed {
            Some((pid, g)) => format!("kill -9 {pid} ({})", options.gateways[g].ws_url()),
            None if options.cut == Cut::HalfOpen => "cut, half-open".to_owned(),
            None => "cut, reset".to_owned(),
        },
        clients: options.clients,
        topics: options.topics,
        rate_per_s: options.rate,
        duration_s: options.duration.as_secs_f64(),
        cut_at_s: options.cut_at.as_secs_f64(),
        size_bytes: Stamp::now(0).encode(size).len(),
        backoff_first_ms: options.backoff.first.as_millis() as u64,
        backoff_cap_ms: options.backoff.cap.as_millis() as u64,
        ack_interval_ms: options.ack_interval.as_millis() as u64,
        connect_s: connect_time.as_secs_f64(),
        messages: messages as u64,
        published,
        publish_errors: answers.errors,
        first_publish_error: answers.first_error.clone(),
        publish_s: publish_time.as_secs_f64(),
        publish_latency: Summary::of(&mut answers.latency_us),
        cut_after_s: cut_instant.map_or(0.0, |c| (c - first_tick).as_secs_f64()),
        cut_clients: 0,
        resumed: 0,
        all_resumed_s: None,
        resume_time: Summary::default(),
        attempts: 0,
        most_attempts: 0,
        failed_attempts: Vec::new(),
        failed_clients: 0,
        failures_listed: Vec::new(),
        other_disconnects: 0,
        clients_by_gateway: vec![0; options.gateways.len()],
        deliveries_expected: expected,
        processed: 0,
        lost: 0,
        app_duplicates: 0,
        wire_duplicates: 0,
        clients_with_wire_duplicates: 0,
        out_of_order: 0,
        resets: 0,
        unexpected: 0,
        drain_wait_s: drain_wait.as_secs_f64(),
        cpu,
    };
    outcome::merge(&mut result, cut_instant, &answers.seqs, &records);
    Ok(result)
}

/// The seqs the gateway answered, per topic.
struct Answers {
    seqs: Vec<Vec<u64>>,
    latency_us: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

/// A publish task's end: (topic index, the seq and the latency, or the error).
type Sent = Result<(usize, Result<(u64, u32), Error>), tokio::task::JoinError>;

impl Answers {
    fn new(topics: usize) -> Self {
        Self {
            seqs: vec![Vec::new(); topics],
            latency_us: Vec::new(),
            errors: 0,
            first_error: None,
        }
    }

    fn note(&mut self, done: Sent) {
        match done {
            Ok((t, Ok((seq, took)))) => {
                self.seqs[t].push(seq);
                self.latency_us.push(took);
            }
            Ok((_, Err(e))) => {
                self.errors += 1;
                self.first_error.get_or_insert(e.to_string());
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_must_come_while_publishing() {
        let mut options = Options::new(Target::websocket("ws://127.0.0.1:1").expect("target"));
        options.cut_at = options.duration;
        assert!(options.validate().is_err());
        options.cut_at = Duration::from_secs(1);
        assert!(options.validate().is_ok());
        options.kill_pid = Some(1);
        assert!(options.validate().is_err(), "a kill needs another gateway");
    }
}
