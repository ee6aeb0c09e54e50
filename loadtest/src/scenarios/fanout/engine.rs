//! The fan-out engine: connects and subscribes the clients, publishes
//! rounds on a schedule (one publish per topic, each stamped with the
//! round's start), drains the deliveries and merges the clients' records
//! into a [`Fanout`] result. `fanout` runs it once over all its rounds;
//! [`pods`](crate::scenarios::pods) with a round per message;
//! [`slow`](crate::scenarios::slow) in two phases with slow clients joining
//! between them; [`floor`](crate::scenarios::floor) shares its tallies.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::{CpuSplit, Fanout, GatewayLatency, Options, ProcessRounds, Round, Stats};
use crate::clients::{self, End, FD_MARGIN, Library, MISSING, Received};
use crate::cpu::{self, Meter, Usage};
use crate::latency::{Stamp, Summary, micros};
use crate::publish::{Pool, body};
use crate::scenarios::unique_topic;
use crate::{Error, Target};

/// Publishes waiting for an answer at once; the schedule waits beyond.
const MAX_IN_FLIGHT: usize = 10_000;
/// Most clients' ends listed in the result.
const DISCONNECTS_LISTED: usize = 5;
/// Between two looks at the delivery count while draining.
const DRAIN_POLL: Duration = Duration::from_millis(5);

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
            clients::subscribe_spread(&options.gateways, options.clients, &topics, options.library)
                .await?;
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
            gateway_cpu: None,
            floor: None,
            vs_floor: None,
            library: options.library,
            compressed_clients: 0,
            wire_bytes_per_delivery: None,
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
        let wire_bytes: u64 = self.received.iter().map(|r| r.wire_bytes).sum();
        result.compressed_clients = self.received.iter().filter(|r| r.compressed).count();
        result.wire_bytes_per_delivery = (options.library != Library::Tungstenite)
            .then(|| wire_bytes as f64 / (tally.delivered + tally.duplicated).max(1) as f64);
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
        result.gateway_cpu = CpuSplit::of(
            &result.cpu,
            total.saturating_sub(options.warmup),
            result.stats.latency.count,
        );
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
            wire_bytes: 0,
            compressed: false,
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
