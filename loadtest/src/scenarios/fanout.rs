//! `fanout`: N clients on T topics (client `i` on topic `i % T`, spread over
//! the gateways given), then R rounds `interval` apart; each round publishes
//! one S-byte message per topic, all stamped with the round's start time.
//! Per round: p50, p99 and max over the clients; its max is the round's
//! "last client". Over the run: the median and worst last client, the
//! latency over every (round, client) pair, and, for each `--watch-pid`
//! process (the gateway), CPU seconds per round and resident memory per round.
//!
//! This module is also the engine of [`pods`](super::pods) (a fan-out over
//! several gateways) and [`slow`](super::slow) (a fan-out with clients that
//! never read): its `Engine` connects, publishes rounds and merges.
//!
//! Every publish of a round carries the round's start time, taken when the
//! schedule fires and before any publish waits for a connection: a
//! publisher that falls behind shows as latency (no coordinated omission),
//! and with several topics the last client is the last of the whole round.
//! The first `warmup` rounds are checked for loss like the others but left
//! out of the latency figures (first connections, allocations).
//!
//! With `--floor`, [`floor`] runs first with the same clients,
//! rounds, interval and size, and the result gives the last client's median
//! and p99 as multiples of the floor's.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::{DEFAULT_SIZE, MAX_DURATION, check_bounds, floor, unique_topic};
use crate::clients::{self, End, FD_MARGIN, MISSING, Received};
use crate::cpu::{self, Meter, Usage};
use crate::latency::{Stamp, Summary, micros, ms};
use crate::publish::{Pool, body};
use crate::report::{Outcome, Row, delivery_failures};
use crate::{Error, Target};

/// Clients, over all gateways.
pub const DEFAULT_CLIENTS: usize = 1000;
/// Topics the clients are spread over.
pub const DEFAULT_TOPICS: usize = 1;
/// Measured rounds.
pub const DEFAULT_ROUNDS: usize = 40;
/// From one round's start to the next.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);
/// Rounds before the measured ones.
pub const DEFAULT_WARMUP: usize = 2;
/// Keep-alive HTTP connections of the publisher.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// After the last round, how long to wait for the deliveries still missing.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);
/// Most clients one process runs.
pub const MAX_CLIENTS: usize = 100_000;
/// Most topics.
pub const MAX_TOPICS: usize = 10_000;
/// Shortest interval between rounds (a rate of 100,000 rounds per second).
pub const MIN_INTERVAL: Duration = Duration::from_micros(10);
/// Most (round, client) pairs a run keeps: 4 bytes each, then sorted.
pub const MAX_PAIRS: u64 = 50_000_000;
/// Publishes waiting for an answer at once; the schedule waits beyond.
const MAX_IN_FLIGHT: usize = 10_000;
/// Most clients' ends listed in the result.
const DISCONNECTS_LISTED: usize = 5;
/// Between two looks at the delivery count while draining.
const DRAIN_POLL: Duration = Duration::from_millis(5);

#[derive(Debug, Clone)]
pub struct Options {
    /// Client `i` connects to `gateways[i % len]`.
    pub gateways: Vec<Target>,
    /// Where the publisher posts.
    pub publish_to: Target,
    pub clients: usize,
    /// Client `i` subscribes to topic `i % topics`.
    pub topics: usize,
    /// Measured rounds, after the warm-up.
    pub rounds: usize,
    /// From one round's start to the next.
    pub interval: Duration,
    /// Payload bytes (at least the stamp's ~40).
    pub size: usize,
    pub warmup: usize,
    pub connections: usize,
    pub drain: Duration,
    /// The topic, or the topics' prefix (`<name>.<k>`); fresh per run when `None`.
    pub topic: Option<String>,
    /// Local processes (gateways, redis) whose CPU and memory to report.
    pub watch: Vec<u32>,
    /// Run [`floor`] first, its readers started from this executable
    /// (`herald-loadtest`).
    pub floor: Option<PathBuf>,
}

impl Options {
    /// The defaults, against one gateway that also takes the publishes.
    pub fn new(gateway: Target) -> Self {
        Self {
            gateways: vec![gateway.clone()],
            publish_to: gateway,
            clients: DEFAULT_CLIENTS,
            topics: DEFAULT_TOPICS,
            rounds: DEFAULT_ROUNDS,
            interval: DEFAULT_INTERVAL,
            size: DEFAULT_SIZE,
            warmup: DEFAULT_WARMUP,
            connections: DEFAULT_CONNECTIONS,
            drain: DEFAULT_DRAIN,
            topic: None,
            watch: Vec::new(),
            floor: None,
        }
    }

    /// Rounds published, warm-up included.
    pub fn total(&self) -> usize {
        self.warmup + self.rounds
    }

    pub(crate) fn validate(&self, extra_rounds: usize) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Options(m));
        if self.interval < MIN_INTERVAL {
            return bad(format!("--interval must be at least {MIN_INTERVAL:?}"));
        }
        let total = self.total() + extra_rounds;
        check_bounds(self.interval.saturating_mul(total as u32), self.size).map_err(|_| {
            Error::Options(format!(
                "rounds x interval must be over 0s and at most {}s, and --size at most {} bytes",
                MAX_DURATION.as_secs(),
                super::MAX_SIZE
            ))
        })?;
        if self.rounds == 0 {
            return bad("--rounds must be at least 1".to_owned());
        }
        if self.gateways.is_empty() {
            return bad("give at least one --gateway".to_owned());
        }
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return bad(format!("--clients must be 1 to {MAX_CLIENTS}"));
        }
        if self.topics == 0 || self.topics > MAX_TOPICS.min(self.clients) {
            return bad(format!(
                "--topics must be 1 to {MAX_TOPICS}, and at most --clients"
            ));
        }
        if self.drain > MAX_DURATION {
            return bad("--drain is too long".to_owned());
        }
        let pairs = total as u64 * self.clients as u64;
        if pairs > MAX_PAIRS {
            return bad(format!(
                "clients x rounds = {pairs} (round, client) pairs; at most {MAX_PAIRS}: \
                 lower --clients or --rounds"
            ));
        }
        Ok(())
    }
}

/// The result of a `fanout` run (and of `pods`, and `slow`'s healthy clients).
#[derive(Debug, Clone, Serialize)]
pub struct Fanout {
    pub gateways: Vec<String>,
    pub publish_to: String,
    /// The topic, or the first of `topics`.
    pub topic: String,
    pub topics: usize,
    pub clients: usize,
    pub rounds: usize,
    pub interval_s: f64,
    pub warmup_rounds: usize,
    /// Payload bytes as sent.
    pub size_bytes: usize,
    pub connections: usize,
    /// Time to connect and subscribe every client.
    pub connect_s: f64,
    /// Publishes sent (rounds x topics), warm-up included.
    pub messages: u64,
    /// Those the gateway accepted (200).
    pub published: u64,
    pub publish_errors: u64,
    pub first_publish_error: Option<String>,
    /// Rounds per second the schedule kept.
    pub round_rate_per_s: f64,
    /// From sending a publish to the gateway's answer.
    pub publish_latency: Summary,
    /// Accepted messages times their topic's clients.
    pub deliveries_expected: u64,
    /// Of those, delivered (once or more).
    pub deliveries: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Frames that were no stamped message of this run (a `reset`, say).
    pub unexpected: u64,
    /// Clients the gateway closed or that failed before the end.
    pub disconnected: u64,
    pub disconnects: Vec<String>,
    /// How long the last deliveries took to come in after the last round.
    pub drain_wait_s: f64,
    /// Over the measured rounds: every (round, client) pair, each round's
    /// slowest client and each round's p99.
    #[serde(flatten)]
    pub stats: Stats,
    pub by_gateway: Vec<GatewayLatency>,
    /// Every round, warm-up included.
    pub per_round: Vec<Round>,
    /// Each `--watch-pid` process, round by round.
    pub processes: Vec<ProcessRounds>,
    /// CPU from the first measured round to the end of the drain.
    pub cpu: Usage,
    /// The floor of the same run (`--floor`).
    pub floor: Option<floor::Floor>,
    /// This run's last client as multiples of the floor's.
    pub vs_floor: Option<VsFloor>,
}

/// Latency over a set of rounds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Every (round, client) pair.
    pub latency: Summary,
    /// Per round, its slowest client ("last client"): the median over
    /// rounds is `p50_us`, the worst `max_us`.
    pub last_client: Summary,
    /// Per round, the p99 over its clients; summarised over rounds.
    pub round_p99: Summary,
}

/// One round, over its clients.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Round {
    pub round: usize,
    pub warmup: bool,
    /// Clients that got it.
    pub clients: u64,
    /// Clients that should have and did not.
    pub missing: u64,
    pub p50_us: u32,
    pub p99_us: u32,
    /// The last client.
    pub max_us: u32,
}

/// The latency of the clients of one gateway.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayLatency {
    pub gateway: String,
    pub clients: usize,
    pub latency: Summary,
}

/// A watched process over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessRounds {
    pub pid: u32,
    pub name: String,
    /// CPU seconds from the first measured round's start to the end of the
    /// drain, divided by the measured rounds.
    pub cpu_per_round_s: Option<f64>,
    /// Per round (warm-up included), CPU seconds from its start to the next
    /// round's (the last: to the end of the drain).
    pub cpu_s: Vec<Option<f64>>,
    /// Resident memory at each round's start, and at the end.
    pub rss_bytes: Vec<Option<u64>>,
}

/// This run against the floor of the same run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct VsFloor {
    /// Last client, median over rounds: this run's over the floor's.
    pub last_client_p50_x: f64,
    /// Last client, p99 over rounds: this run's over the floor's.
    pub last_client_p99_x: f64,
    /// The first watched process's CPU per round over the floor's writer's.
    pub cpu_per_round_x: Option<f64>,
}

/// Runs the scenario: the floor if asked, then connects, publishes the
/// rounds, waits for the deliveries (at most `drain` after the last) and merges.
pub async fn run(options: Options) -> Result<Fanout, Error> {
    options.validate(0)?;
    // The floor first: its sockets are closed before the clients open, so
    // the two never share this process's file descriptors.
    let floor = match &options.floor {
        Some(exe) => Some(floor::run(floor::Options::like(&options, exe.clone())).await?),
        None => None,
    };
    let mut engine = Engine::connect(&options, options.total(), "fanout", 0).await?;
    engine.rounds(0..options.total()).await;
    engine.drain().await;
    let mut result = engine.finish().await.result;
    if let Some(floor) = floor {
        result.vs_floor = Some(VsFloor::of(&result, &floor));
        result.floor = Some(floor);
    }
    Ok(result)
}

impl VsFloor {
    fn of(run: &Fanout, floor: &floor::Floor) -> Self {
        let x = |a: u32, b: u32| f64::from(a) / f64::from(b.max(1));
        let cpu = run.processes.first().and_then(|p| p.cpu_per_round_s);
        Self {
            last_client_p50_x: x(run.stats.last_client.p50_us, floor.stats.last_client.p50_us),
            last_client_p99_x: x(run.stats.last_client.p99_us, floor.stats.last_client.p99_us),
            cpu_per_round_x: cpu
                .filter(|_| floor.writer_cpu_per_round_s > 0.0)
                .map(|c| c / floor.writer_cpu_per_round_s),
        }
    }
}

/// A fan-out in progress: clients reading, the publisher's schedule, and
/// what the watched processes used at each round's start.
pub(crate) struct Engine {
    options: Options,
    topics: Vec<String>,
    total: usize,
    pool: Arc<Pool>,
    connect_time: Duration,
    progress: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
    readers: Vec<JoinHandle<Received>>,
    ticks: Interval,
    first_tick: Option<Instant>,
    last_tick: Option<Instant>,
    sends: JoinSet<(usize, usize, Result<Duration, Error>)>,
    answers: Answers,
    /// Each round's stamp (µs since the epoch), once published.
    pub(crate) round_starts: Vec<Option<u64>>,
    /// At each round's start: each watched process's (CPU s, RSS bytes).
    samples: Vec<Vec<(Option<f64>, Option<u64>)>>,
    meter: Option<Meter>,
    drain_wait: Duration,
    end_sample: Vec<(Option<f64>, Option<u64>)>,
    cpu: Option<Usage>,
}

/// A finished fan-out: the result, and the clients' records for figures
/// over other sets of rounds ([`Finished::stats`]).
pub(crate) struct Finished {
    pub result: Fanout,
    received: Vec<Received>,
    accepted: Vec<Vec<bool>>,
    topics: usize,
}

impl Engine {
    /// Connects and subscribes `options.clients` clients and starts their
    /// readers for `total` rounds; `extra_fds` are kept for the caller's own
    /// sockets.
    pub(crate) async fn connect(
        options: &Options,
        total: usize,
        scenario: &str,
        extra_fds: u64,
    ) -> Result<Self, Error> {
        clients::raise_fd_limit(
            options.clients as u64 + options.connections as u64 + extra_fds + FD_MARGIN,
        )?;
        let base = options
            .topic
            .clone()
            .unwrap_or_else(|| unique_topic(scenario));
        let topics: Vec<String> = if options.topics == 1 {
            vec![base]
        } else {
            (0..options.topics).map(|k| format!("{base}.{k}")).collect()
        };
        let pool = Arc::new(Pool::open(options.publish_to.addr, options.connections).await?);
        let connecting = Instant::now();
        let subscribers =
            clients::subscribe_spread(&options.gateways, options.clients, &topics).await?;
        let connect_time = connecting.elapsed();
        let progress = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = watch::channel(false);
        let readers = subscribers
            .into_iter()
            .map(|s| tokio::spawn(s.read(total, progress.clone(), stopped.clone())))
            .collect();
        // When the schedule falls behind, the ticks it missed come at once
        // (`Burst`), so the count of rounds stays `total`.
        let mut ticks = tokio::time::interval(options.interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
        Ok(Self {
            options: options.clone(),
            topics,
            total,
            pool,
            connect_time,
            progress,
            stop,
            readers,
            ticks,
            first_tick: None,
            last_tick: None,
            sends: JoinSet::new(),
            answers: Answers::new(total, options.topics),
            round_starts: vec![None; total],
            samples: vec![Vec::new(); total],
            meter: None,
            drain_wait: Duration::ZERO,
            end_sample: Vec::new(),
            cpu: None,
        })
    }

    /// The topic of client `client`.
    pub(crate) fn topic_of(&self, client: usize) -> &str {
        &self.topics[client % self.topics.len()]
    }

    /// Publishes rounds `range` on the schedule: one publish per topic per
    /// round, each in its own task so that a slow answer shifts nothing after it.
    pub(crate) async fn rounds(&mut self, range: Range<usize>) {
        if range.start > 0 {
            // A later phase starts now, not with a burst of the rounds its
            // preparation took.
            self.ticks.reset_immediately();
        }
        for round in range.filter(|&r| r < self.total) {
            while let Some(done) = self.sends.try_join_next() {
                self.answers.note(done);
            }
            while self.sends.len() >= MAX_IN_FLIGHT {
                match self.sends.join_next().await {
                    Some(done) => self.answers.note(done),
                    None => break,
                }
            }
            let tick = self.ticks.tick().await;
            self.first_tick.get_or_insert(tick);
            self.last_tick = Some(tick);
            if round == self.options.warmup {
                self.meter = Some(Meter::start(&self.options.watch));
            }
            self.samples[round] = sample(&self.options.watch);
            let stamp = Stamp::now(round as u64);
            self.round_starts[round] = Some(stamp.t);
            let data: Arc<str> = stamp.encode(self.options.size).into();
            for (k, topic) in self.topics.iter().enumerate() {
                let (pool, topic, data) = (self.pool.clone(), topic.clone(), data.clone());
                self.sends.spawn(async move {
                    let mut sent = None;
                    let result = pool
                        .publish_with(|| {
                            sent = Some(Instant::now());
                            body(&topic, &data)
                        })
                        .await;
                    let took = result.map(|_| sent.map_or(Duration::ZERO, |s| s.elapsed()));
                    (round, k, took)
                });
            }
        }
    }

    /// Waits for the publishes' answers, then for the deliveries still on
    /// their way, at most `drain`; the watched processes are read at the end.
    pub(crate) async fn drain(&mut self) {
        while let Some(done) = self.sends.join_next().await {
            self.answers.note(done);
        }
        let expected = self.expected();
        let draining = Instant::now();
        while self.progress.load(Ordering::Relaxed) < expected
            && draining.elapsed() < self.options.drain
            && !self.readers.iter().all(|r| r.is_finished())
        {
            tokio::time::sleep(DRAIN_POLL).await;
        }
        self.drain_wait = draining.elapsed();
        self.end_sample = sample(&self.options.watch);
        self.cpu = self.meter.as_ref().map(Meter::stop);
    }

    /// Deliveries the accepted publishes call for.
    fn expected(&self) -> u64 {
        let per_topic = |k: usize| {
            (self.options.clients / self.options.topics
                + usize::from(k < self.options.clients % self.options.topics)) as u64
        };
        self.answers
            .accepted
            .iter()
            .flat_map(|round| round.iter().enumerate())
            .filter(|&(_, &ok)| ok)
            .map(|(k, _)| per_topic(k))
            .sum()
    }

    /// Stops the readers and merges their records.
    pub(crate) async fn finish(self) -> Finished {
        let _ = self.stop.send(true);
        let mut received = Vec::with_capacity(self.readers.len());
        for reader in self.readers {
            match reader.await {
                Ok(r) => received.push(r),
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
        let options = &self.options;
        let schedule = match (self.first_tick, self.last_tick) {
            (Some(first), Some(last)) => last - first,
            _ => Duration::ZERO,
        };
        let Answers {
            accepted,
            mut latency_us,
            errors,
            first_error,
        } = self.answers;
        let published = accepted.iter().flatten().filter(|&&a| a).count() as u64;
        let result = Fanout {
            gateways: options.gateways.iter().map(Target::ws_url).collect(),
            publish_to: options.publish_to.http_url(),
            topic: self.topics[0].clone(),
            topics: self.topics.len(),
            clients: options.clients,
            rounds: self.total.saturating_sub(options.warmup),
            interval_s: options.interval.as_secs_f64(),
            warmup_rounds: options.warmup,
            size_bytes: Stamp::now(0).encode(options.size).len(),
            connections: options.connections,
            connect_s: self.connect_time.as_secs_f64(),
            messages: (self.total * self.topics.len()) as u64,
            published,
            publish_errors: errors,
            first_publish_error: first_error,
            round_rate_per_s: if schedule.is_zero() {
                0.0
            } else {
                (self.total - 1) as f64 / schedule.as_secs_f64()
            },
            publish_latency: Summary::of(&mut latency_us),
            deliveries_expected: 0,
            deliveries: 0,
            lost: 0,
            duplicated: 0,
            unexpected: 0,
            disconnected: 0,
            disconnects: Vec::new(),
            drain_wait_s: self.drain_wait.as_secs_f64(),
            stats: Stats::default(),
            by_gateway: Vec::new(),
            per_round: Vec::new(),
            processes: processes(
                &options.watch,
                options.warmup,
                &self.samples,
                &self.end_sample,
            ),
            cpu: self.cpu.unwrap_or_default(),
            floor: None,
            vs_floor: None,
        };
        let mut finished = Finished {
            result,
            received,
            accepted,
            topics: self.topics.len(),
        };
        finished.merge(options);
        finished
    }
}

/// Whether the client `client` should have got round `round`: its topic's
/// publish of that round was accepted.
fn due(accepted: &[Vec<bool>], topics: usize, round: usize, client: usize) -> bool {
    accepted
        .get(round)
        .and_then(|r| r.get(client % topics))
        .copied()
        .unwrap_or(false)
}

impl Finished {
    /// Latency over rounds `range` (clamped to the rounds published).
    pub(crate) fn stats(&self, range: Range<usize>) -> Stats {
        let (accepted, topics) = (&self.accepted, self.topics);
        stats(&self.received, range, |r, c| due(accepted, topics, r, c))
    }

    fn merge(&mut self, options: &Options) {
        let (accepted, topics) = (&self.accepted, self.topics);
        let expected = |r, c| due(accepted, topics, r, c);
        let total = accepted.len();
        let result = &mut self.result;
        let mut per_gateway: Vec<Vec<u32>> = vec![Vec::new(); options.gateways.len()];
        let mut clients_per_gateway = vec![0; options.gateways.len()];
        let tally = tally(&self.received, expected);
        result.deliveries_expected = tally.expected;
        result.deliveries = tally.delivered;
        result.lost = tally.lost;
        result.duplicated = tally.duplicated;
        result.unexpected = tally.unexpected;
        for r in &self.received {
            clients_per_gateway[r.gateway] += 1;
            if r.end != End::Stopped {
                result.disconnected += 1;
                if result.disconnects.len() < DISCONNECTS_LISTED {
                    result.disconnects.push(format!(
                        "client {} of {}: {:?}",
                        r.client,
                        options.gateways[r.gateway].ws_url(),
                        r.end
                    ));
                }
            }
            for round in options.warmup.min(total)..total {
                let l = r.latency_us[round];
                if l != MISSING && expected(round, r.client) {
                    per_gateway[r.gateway].push(l);
                }
            }
        }
        result.stats = stats(&self.received, options.warmup..total, expected);
        result.per_round = per_round(&self.received, total, options.warmup, expected);
        for (g, samples) in per_gateway.iter_mut().enumerate() {
            result.by_gateway.push(GatewayLatency {
                gateway: options.gateways[g].ws_url(),
                clients: clients_per_gateway[g],
                latency: Summary::of(samples),
            });
        }
    }
}

/// Deliveries counted over every client and round.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Tally {
    pub expected: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub unexpected: u64,
}

/// Counts deliveries: `expected(round, client)` says which were due.
pub(crate) fn tally(received: &[Received], expected: impl Fn(usize, usize) -> bool) -> Tally {
    let mut t = Tally::default();
    for r in received {
        t.duplicated += r.duplicates;
        t.unexpected += r.unexpected;
        for (round, &l) in r.latency_us.iter().enumerate() {
            if expected(round, r.client) {
                t.expected += 1;
                if l == MISSING {
                    t.lost += 1;
                } else {
                    t.delivered += 1;
                }
            }
        }
    }
    t
}

/// Latency over rounds `range`: all pairs, per-round max and p99.
pub(crate) fn stats(
    received: &[Received],
    range: Range<usize>,
    expected: impl Fn(usize, usize) -> bool,
) -> Stats {
    let rounds = received.first().map_or(0, |r| r.latency_us.len());
    let mut all = Vec::new();
    let mut last = Vec::new();
    let mut p99 = Vec::new();
    let mut round = Vec::with_capacity(received.len());
    for i in range.start.min(rounds)..range.end.min(rounds) {
        round.clear();
        round.extend(
            received
                .iter()
                .filter(|r| expected(i, r.client))
                .map(|r| r.latency_us[i])
                .filter(|&l| l != MISSING),
        );
        if !round.is_empty() {
            all.extend_from_slice(&round);
            let s = Summary::of(&mut round);
            last.push(s.max_us);
            p99.push(s.p99_us);
        }
    }
    Stats {
        latency: Summary::of(&mut all),
        last_client: Summary::of(&mut last),
        round_p99: Summary::of(&mut p99),
    }
}

/// Every round's figures over its clients.
pub(crate) fn per_round(
    received: &[Received],
    rounds: usize,
    warmup: usize,
    expected: impl Fn(usize, usize) -> bool,
) -> Vec<Round> {
    let mut samples = Vec::with_capacity(received.len());
    (0..rounds)
        .map(|i| {
            samples.clear();
            let mut missing = 0;
            for r in received.iter().filter(|r| expected(i, r.client)) {
                match r.latency_us.get(i) {
                    Some(&l) if l != MISSING => samples.push(l),
                    _ => missing += 1,
                }
            }
            let s = Summary::of(&mut samples);
            Round {
                round: i,
                warmup: i < warmup,
                clients: s.count,
                missing,
                p50_us: s.p50_us,
                p99_us: s.p99_us,
                max_us: s.max_us,
            }
        })
        .collect()
}

/// Each watched process's (CPU seconds, RSS bytes) now.
fn sample(watch: &[u32]) -> Vec<(Option<f64>, Option<u64>)> {
    watch
        .iter()
        .map(|&pid| (cpu::process_seconds(pid), crate::memory::rss_bytes(pid)))
        .collect()
}

/// The watched processes round by round, from the samples at each round's
/// start (`samples[round]`, empty for rounds not published) and at the end.
fn processes(
    watch: &[u32],
    warmup: usize,
    samples: &[Vec<(Option<f64>, Option<u64>)>],
    end: &[(Option<f64>, Option<u64>)],
) -> Vec<ProcessRounds> {
    watch
        .iter()
        .enumerate()
        .map(|(w, &pid)| {
            let at = |round: usize| -> Option<(Option<f64>, Option<u64>)> {
                match samples.get(round) {
                    Some(s) => s.get(w).copied(),
                    None => end.get(w).copied(),
                }
            };
            let cpu_at = |round: usize| at(round).and_then(|s| s.0);
            let cpu_s = (0..samples.len())
                .map(|r| Some(cpu_at(r + 1)? - cpu_at(r)?))
                .collect();
            let mut rss_bytes: Vec<Option<u64>> = (0..samples.len())
                .map(|r| at(r).and_then(|s| s.1))
                .collect();
            rss_bytes.push(end.get(w).and_then(|s| s.1));
            let measured = samples.len().saturating_sub(warmup);
            let cpu_per_round_s = match (cpu_at(warmup), end.get(w).and_then(|s| s.0)) {
                (Some(start), Some(stop)) if measured > 0 => Some((stop - start) / measured as f64),
                _ => None,
            };
            ProcessRounds {
                pid,
                name: cpu::process_name(pid),
                cpu_per_round_s,
                cpu_s,
                rss_bytes,
            }
        })
        .collect()
}

/// The gateway's answers to the publishes, by round and topic.
struct Answers {
    accepted: Vec<Vec<bool>>,
    latency_us: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

/// A publish task's end: (round, topic index, its publish latency or error).
type Sent = Result<(usize, usize, Result<Duration, Error>), tokio::task::JoinError>;

impl Answers {
    fn new(total: usize, topics: usize) -> Self {
        Self {
            accepted: vec![vec![false; topics]; total],
            latency_us: Vec::with_capacity(total * topics),
            errors: 0,
            first_error: None,
        }
    }

    fn note(&mut self, done: Sent) {
        match done {
            Ok((round, k, Ok(took))) => {
                self.accepted[round][k] = true;
                self.latency_us.push(micros(took));
            }
            Ok((_, _, Err(e))) => {
                self.errors += 1;
                self.first_error.get_or_insert(e.to_string());
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// `p50 / p99 / max` of a last-client summary.
pub(crate) fn last_client_row(stats: &Stats) -> String {
    format!(
        "{} / {} / {} ms over {} rounds",
        ms(stats.last_client.p50_us),
        ms(stats.last_client.p99_us),
        ms(stats.last_client.max_us),
        stats.last_client.count
    )
}

impl Fanout {
    /// The table's lines; `pods` and `slow` show the same.
    pub(crate) fn rows(&self) -> Vec<Row> {
        let l = &self.stats.latency;
        let mut rows = vec![
            Row::new(
                "publisher",
                format!(
                    "{}: {} rounds ({} warm-up) {} ms apart, {} topic(s), {} B payload, {} connections",
                    self.publish_to,
                    self.rounds + self.warmup_rounds,
                    self.warmup_rounds,
                    self.interval_s * 1000.0,
                    self.topics,
                    self.size_bytes,
                    self.connections
                ),
            ),
            Row::new(
                "clients",
                format!(
                    "{} on {}, connected and subscribed in {:.2} s",
                    self.clients, self.topic, self.connect_s
                ),
            ),
            Row::new(
                "published",
                format!(
                    "{} of {} ({} errors), {:.1} rounds/s kept",
                    self.published, self.messages, self.publish_errors, self.round_rate_per_s
                ),
            ),
            Row::new("publish latency p50/p99/max", self.publish_latency.brief()),
            Row::new(
                "deliveries",
                format!(
                    "{} of {} (drained in {:.3} s)",
                    self.deliveries, self.deliveries_expected, self.drain_wait_s
                ),
            ),
            Row::new(
                "lost / duplicated / unexpected",
                format!("{} / {} / {}", self.lost, self.duplicated, self.unexpected),
            ),
            Row::new("disconnected clients", self.disconnected),
            Row::new(
                "latency p50/p90/p99/p99.9/max",
                format!(
                    "{} / {} / {} / {} / {} ms over {} pairs",
                    ms(l.p50_us),
                    ms(l.p90_us),
                    ms(l.p99_us),
                    ms(l.p999_us),
                    ms(l.max_us),
                    l.count
                ),
            ),
            Row::new("last client median/p99/worst", last_client_row(&self.stats)),
            Row::new(
                "per-round p99, median",
                format!("{} ms", ms(self.stats.round_p99.p50_us)),
            ),
        ];
        if self.by_gateway.len() > 1 {
            for g in &self.by_gateway {
                rows.push(Row::new(
                    format!("  via {}", g.gateway),
                    format!("{} clients: {}", g.clients, g.latency.brief()),
                ));
            }
        }
        for p in &self.processes {
            let rss: Vec<u64> = p.rss_bytes.iter().flatten().copied().collect();
            let mib = |b: Option<&u64>| {
                b.map_or("?".to_owned(), |b| format!("{:.1}", *b as f64 / 1048576.0))
            };
            rows.push(Row::new(
                format!("{} ({})", p.name, p.pid),
                format!(
                    "CPU {} ms per round; RSS {} MiB at the first round, {} MiB max, {} MiB at the end",
                    p.cpu_per_round_s
                        .map_or("?".to_owned(), |s| format!("{:.1}", s * 1000.0)),
                    mib(rss.first()),
                    mib(rss.iter().max()),
                    mib(rss.last()),
                ),
            ));
        }
        rows.push(Row::new("CPU", self.cpu.brief()));
        if let (Some(floor), Some(vs)) = (&self.floor, &self.vs_floor) {
            rows.push(Row::new(
                "floor last client median/p99/worst",
                last_client_row(&floor.stats),
            ));
            rows.push(Row::new(
                "floor writer CPU per round",
                format!("{:.1} ms", floor.writer_cpu_per_round_s * 1000.0),
            ));
            rows.push(Row::new(
                "vs floor: last client median, p99, CPU",
                format!(
                    "{:.2}x, {:.2}x, {}",
                    vs.last_client_p50_x,
                    vs.last_client_p99_x,
                    vs.cpu_per_round_x
                        .map_or("? (no --watch-pid)".to_owned(), |x| format!("{x:.2}x"))
                ),
            ));
        }
        rows
    }

    /// What must be zero; `pods` and `slow` check the same.
    pub(crate) fn failures(&self) -> Vec<String> {
        let mut failures = delivery_failures(
            self.publish_errors,
            self.first_publish_error.as_deref(),
            self.lost,
            self.duplicated,
            self.unexpected,
            self.disconnected,
            &self.disconnects,
        );
        if let Some(floor) = &self.floor {
            failures.extend(floor.failures().into_iter().map(|f| format!("floor: {f}")));
        }
        failures
    }
}

impl Outcome for Fanout {
    const SCENARIO: &'static str = "fanout";

    fn rows(&self) -> Vec<Row> {
        Fanout::rows(self)
    }

    fn failures(&self) -> Vec<String> {
        Fanout::failures(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(client: usize, latency_us: Vec<u32>) -> Received {
        Received {
            client,
            gateway: 0,
            latency_us,
            duplicates: 0,
            unexpected: 0,
            end: End::Stopped,
        }
    }

    #[test]
    fn a_rounds_maximum_is_its_last_client() {
        // Three clients, three rounds; client 2 missed round 1.
        let received = [
            client(0, vec![10, 20, 30]),
            client(1, vec![15, 25, 35]),
            client(2, vec![40, MISSING, 5]),
        ];
        let all = |_, _| true;
        let s = stats(&received, 1..3, all);
        assert_eq!(s.latency.count, 5);
        // Round 1: max 25; round 2: max 35.
        assert_eq!((s.last_client.p50_us, s.last_client.max_us), (25, 35));
        let t = tally(&received, all);
        assert_eq!((t.expected, t.delivered, t.lost), (9, 8, 1));
        let rounds = per_round(&received, 3, 1, all);
        assert_eq!(rounds[0].max_us, 40);
        assert!(rounds[0].warmup && !rounds[1].warmup);
        assert_eq!((rounds[1].clients, rounds[1].missing), (2, 1));
    }

    #[test]
    fn cpu_per_round_counts_from_the_first_measured_round() {
        let s = |cpu: f64, rss: u64| vec![(Some(cpu), Some(rss))];
        let samples = [s(1.0, 10), s(2.0, 20), s(2.5, 30)];
        let p = processes(&[1], 1, &samples, &s(3.0, 40));
        assert_eq!(p[0].cpu_s, vec![Some(1.0), Some(0.5), Some(0.5)]);
        assert_eq!(p[0].cpu_per_round_s, Some(0.5));
        assert_eq!(p[0].rss_bytes.len(), 4);
    }
}
