//! `fanout`: N clients on T topics (client `i` on topic `i % T`, spread over
//! the gateways given), then R rounds `interval` apart; each round publishes
//! one S-byte message per topic, all stamped with the round's start time.
//! Per round: p50, p99 and max over the clients; its max is the round's
//! "last client". Over the run: the median and worst last client, the
//! latency over every (round, client) pair, and, for each `--watch-pid`
//! process (the gateway), CPU seconds per round and resident memory per round.
//!
//! The rounds themselves are run by [`engine`], which [`pods`](super::pods)
//! (a fan-out over several gateways) and [`slow`](super::slow) (a fan-out
//! with clients that never read) drive too: it connects, publishes rounds
//! and merges. This module holds the options, the result and its table.
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

pub mod engine;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{DEFAULT_SIZE, MAX_DURATION, check_bounds, floor};
use crate::clients::Library;
use crate::cpu::Usage;
use crate::latency::{Summary, ms};
use crate::report::{Outcome, Row, delivery_failures};
use crate::{Error, Target};
use engine::Engine;

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
    /// The clients' WebSocket client: tokio-tungstenite, or the load tool's
    /// own, with or without permessage-deflate (`--raw`, `--compression`).
    pub library: Library,
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
            library: Library::Tungstenite,
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// The first watched process's CPU in that window, user space against
    /// kernel, per round and per delivery.
    #[serde(default)]
    pub gateway_cpu: Option<CpuSplit>,
    /// The floor of the same run (`--floor`).
    pub floor: Option<floor::Floor>,
    /// This run's last client as multiples of the floor's.
    pub vs_floor: Option<VsFloor>,
    /// The clients' WebSocket client (results from before it was a
    /// choice: tokio-tungstenite).
    #[serde(default)]
    pub library: Library,
    /// Clients that negotiated permessage-deflate.
    #[serde(default)]
    pub compressed_clients: usize,
    /// Bytes of `msg` frames on the wire (headers included) per delivery,
    /// as the raw client counts them (tokio-tungstenite's: `None`).
    #[serde(default)]
    pub wire_bytes_per_delivery: Option<f64>,
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GatewayLatency {
    pub gateway: String,
    pub clients: usize,
    pub latency: Summary,
}

/// A watched process over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// A gateway's CPU over the measured rounds, split: the kernel's part is
/// mostly the sends, the user-space part what Herald adds to each.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CpuSplit {
    pub user_per_round_s: f64,
    pub system_per_round_s: f64,
    /// Over the measured rounds' deliveries (every client's, every round).
    pub user_ns_per_delivery: f64,
    pub system_ns_per_delivery: f64,
}

impl CpuSplit {
    /// From the first watched process's `usage` over `rounds` rounds that
    /// made `deliveries` deliveries; `None` without a watched process.
    pub(crate) fn of(usage: &Usage, rounds: usize, deliveries: u64) -> Option<Self> {
        let watched = usage.watched.first()?;
        let (user, system) = (watched.user_s?, watched.system_s?);
        let (rounds, deliveries) = (rounds.max(1) as f64, deliveries.max(1) as f64);
        Some(Self {
            user_per_round_s: user / rounds,
            system_per_round_s: system / rounds,
            user_ns_per_delivery: user * 1e9 / deliveries,
            system_ns_per_delivery: system * 1e9 / deliveries,
        })
    }
}

/// This run against the floor of the same run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
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
                    "{} on {}, connected and subscribed in {:.2} s ({}{})",
                    self.clients,
                    self.topic,
                    self.connect_s,
                    self.library.name(),
                    if self.library == Library::Deflate {
                        format!(": negotiated by {}", self.compressed_clients)
                    } else {
                        String::new()
                    }
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
                "wire bytes per delivery",
                self.wire_bytes_per_delivery
                    .map_or("not counted (tokio-tungstenite)".to_owned(), |b| {
                        format!("{b:.1}")
                    }),
            ),
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
        if let Some(split) = &self.gateway_cpu {
            rows.push(Row::new(
                "gateway CPU user / kernel",
                format!(
                    "{:.1} / {:.1} ms per round; {:.0} / {:.0} ns per delivery",
                    split.user_per_round_s * 1000.0,
                    split.system_per_round_s * 1000.0,
                    split.user_ns_per_delivery,
                    split.system_ns_per_delivery,
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
        // Figures "with deflate" must be that.
        if self.library == Library::Deflate && self.compressed_clients < self.clients {
            failures.push(format!(
                "permessage-deflate negotiated by {} of {} clients (websocket.compression off?)",
                self.compressed_clients, self.clients
            ));
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
