//! `pods`: N clients spread over one or more gateways, all subscribed to one
//! topic; a publisher posts to one gateway at a steady rate. Every
//! (message, client) pair is a latency sample, and every pair must arrive
//! exactly once. Run it with the clients on the publisher's pod and then on
//! another pod: the difference is what crossing pods (through Redis) costs.
//!
//! The first [`DEFAULT_WARMUP`] messages are sent and checked for loss like
//! the others but left out of the latency figures (first connections,
//! Redis scripts loading).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::{DEFAULT_SIZE, check_bounds, unique_topic};
use crate::clients::{self, End, FD_MARGIN, MISSING, Received};
use crate::cpu::{Meter, Usage};
use crate::latency::{Stamp, Summary, micros};
use crate::publish::{Pool, body};
use crate::report::{Outcome, Row};
use crate::{Error, Target};

/// Clients, over all gateways.
pub const DEFAULT_CLIENTS: usize = 1000;
/// Messages per second.
pub const DEFAULT_RATE: f64 = 100.0;
/// How long the publisher publishes (after the warm-up).
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// Messages before the measured ones.
pub const DEFAULT_WARMUP: usize = 10;
/// Keep-alive HTTP connections of the publisher.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// After the last publish, how long to wait for the deliveries still missing.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);
/// Most clients one process runs.
pub const MAX_CLIENTS: usize = 100_000;
/// Highest rate.
pub const MAX_RATE: f64 = 100_000.0;
/// Most (message, client) pairs a run keeps: 4 bytes each, then sorted.
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
    /// Messages per second.
    pub rate: f64,
    pub duration: Duration,
    /// Payload bytes (at least the stamp's ~40).
    pub size: usize,
    pub warmup: usize,
    pub connections: usize,
    pub drain: Duration,
    /// The topic; a fresh one per run when `None`.
    pub topic: Option<String>,
    /// Local processes (gateways, redis) whose CPU time to report.
    pub watch: Vec<u32>,
}

impl Options {
    /// The defaults, against one gateway that also takes the publishes.
    pub fn new(gateway: Target) -> Self {
        Self {
            gateways: vec![gateway.clone()],
            publish_to: gateway,
            clients: DEFAULT_CLIENTS,
            rate: DEFAULT_RATE,
            duration: DEFAULT_DURATION,
            size: DEFAULT_SIZE,
            warmup: DEFAULT_WARMUP,
            connections: DEFAULT_CONNECTIONS,
            drain: DEFAULT_DRAIN,
            topic: None,
            watch: Vec::new(),
        }
    }

    /// Messages measured: `rate × duration`, at least one.
    pub fn measured(&self) -> usize {
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
        if !(self.rate > 0.0 && self.rate <= MAX_RATE) {
            return bad(format!("--rate must be over 0 and at most {MAX_RATE}"));
        }
        if self.drain > super::MAX_DURATION {
            return bad("--drain is too long".to_owned());
        }
        let pairs = (self.measured() + self.warmup) as u64 * self.clients as u64;
        if pairs > MAX_PAIRS {
            return bad(format!(
                "clients x messages = {pairs} (message, client) pairs; at most {MAX_PAIRS}: \
                 lower --clients, --rate or --duration"
            ));
        }
        Ok(())
    }
}

/// The result of a `pods` run.
#[derive(Debug, Clone, Serialize)]
pub struct Pods {
    pub gateways: Vec<String>,
    pub publish_to: String,
    pub topic: String,
    pub clients: usize,
    pub rate_per_s: f64,
    pub duration_s: f64,
    /// Payload bytes as sent.
    pub size_bytes: usize,
    pub warmup_messages: usize,
    pub connections: usize,
    /// Time to connect and subscribe every client.
    pub connect_s: f64,
    /// Messages the publisher sent, warm-up included.
    pub messages: u64,
    /// Those the gateway accepted (200).
    pub published: u64,
    pub publish_errors: u64,
    pub first_publish_error: Option<String>,
    /// The rate the schedule kept.
    pub publish_rate_per_s: f64,
    /// From the stamp to the gateway's answer.
    pub publish_latency: Summary,
    /// Accepted messages times clients.
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
    /// How long the last deliveries took to come in after the last publish answered.
    pub drain_wait_s: f64,
    /// Delivery latency over every measured (message, client) pair.
    pub latency: Summary,
    /// Per message, its slowest client ("last client"): the median over
    /// messages is `p50_us`, the worst `max_us`.
    pub last_client: Summary,
    /// Per message, the p99 over its clients; summarised over messages.
    pub round_p99: Summary,
    pub by_gateway: Vec<GatewayLatency>,
    /// CPU from the first publish to the end of the drain.
    pub cpu: Usage,
}

/// The latency of the clients of one gateway.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayLatency {
    pub gateway: String,
    pub clients: usize,
    pub latency: Summary,
}

/// Runs the scenario: connects, publishes on schedule, waits for the
/// deliveries (at most `drain` after the last publish), and merges.
pub async fn run(options: Options) -> Result<Pods, Error> {
    options.validate()?;
    let measured = options.measured();
    let total = options.warmup + measured;
    clients::raise_fd_limit(options.clients as u64 + options.connections as u64 + FD_MARGIN)?;
    let topic = options
        .topic
        .clone()
        .unwrap_or_else(|| unique_topic("pods"));

    let pool = Arc::new(Pool::open(options.publish_to.addr, options.connections).await?);
    let connecting = Instant::now();
    let subscribers = clients::subscribe_all(&options.gateways, options.clients, &topic).await?;
    let connect_time = connecting.elapsed();

    let progress = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = watch::channel(false);
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|s| tokio::spawn(s.read(total, progress.clone(), stopped.clone())))
        .collect();

    // The schedule: message i at i / rate. A publish runs in its own task so
    // that a slow answer does not shift the messages after it; when the
    // schedule falls behind, the ticks it missed come at once (`Burst`), so
    // the count stays `total`. At most `MAX_IN_FLIGHT` publishes wait at once.
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / options.rate));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let size = options.size;
    let meter = Meter::start(&options.watch);
    let topic_arc: Arc<str> = topic.as_str().into();
    let mut sends = JoinSet::new();
    let mut answers = Answers::new(total);
    let mut first_tick = None;
    for i in 0..total {
        while let Some(done) = sends.try_join_next() {
            answers.note(done);
        }
        if sends.len() >= MAX_IN_FLIGHT
            && let Some(done) = sends.join_next().await
        {
            answers.note(done);
        }
        let tick = ticks.tick().await;
        first_tick.get_or_insert(tick);
        let (pool, topic) = (pool.clone(), topic_arc.clone());
        sends.spawn(async move {
            let mut sent = None;
            let result = pool
                .publish_with(|| {
                    sent = Some(Instant::now());
                    body(&topic, &Stamp::now(i as u64).encode(size))
                })
                .await;
            (
                i,
                result.map(|_| sent.map_or(Duration::ZERO, |s| s.elapsed())),
            )
        });
    }
    let schedule = first_tick.map_or(Duration::ZERO, |t| t.elapsed());
    while let Some(done) = sends.join_next().await {
        answers.note(done);
    }
    let Answers {
        accepted,
        mut latency_us,
        errors: publish_errors,
        first_error: first_publish_error,
    } = answers;
    let published = accepted.iter().filter(|&&a| a).count() as u64;

    // Wait for the deliveries still on their way, within `drain`.
    let expected = published * options.clients as u64;
    let draining = Instant::now();
    while progress.load(Ordering::Relaxed) < expected
        && draining.elapsed() < options.drain
        && !readers.iter().all(|r| r.is_finished())
    {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let drain_wait = draining.elapsed();
    let cpu = meter.stop();
    let _ = stop.send(true);
    let mut received = Vec::with_capacity(readers.len());
    for reader in readers {
        match reader.await {
            Ok(r) => received.push(r),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    let mut result = Pods {
        gateways: options.gateways.iter().map(Target::ws_url).collect(),
        publish_to: options.publish_to.http_url(),
        topic,
        clients: options.clients,
        rate_per_s: options.rate,
        duration_s: options.duration.as_secs_f64(),
        size_bytes: Stamp::now(0).encode(size).len(),
        warmup_messages: options.warmup,
        connections: options.connections,
        connect_s: connect_time.as_secs_f64(),
        messages: total as u64,
        published,
        publish_errors,
        first_publish_error,
        publish_rate_per_s: if schedule.is_zero() {
            0.0
        } else {
            (total - 1) as f64 / schedule.as_secs_f64()
        },
        publish_latency: Summary::of(&mut latency_us),
        deliveries_expected: expected,
        deliveries: 0,
        lost: 0,
        duplicated: 0,
        unexpected: 0,
        disconnected: 0,
        disconnects: Vec::new(),
        drain_wait_s: drain_wait.as_secs_f64(),
        latency: Summary::default(),
        last_client: Summary::default(),
        round_p99: Summary::default(),
        by_gateway: Vec::new(),
        cpu,
    };
    merge(&mut result, &options, &accepted, &received);
    Ok(result)
}

/// The gateway's answers to the publishes, by message index.
struct Answers {
    accepted: Vec<bool>,
    latency_us: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

/// A publish task's end: (message index, its publish latency or error).
type Sent = Result<(usize, Result<Duration, Error>), tokio::task::JoinError>;

impl Answers {
    fn new(total: usize) -> Self {
        Self {
            accepted: vec![false; total],
            latency_us: Vec::with_capacity(total),
            errors: 0,
            first_error: None,
        }
    }

    fn note(&mut self, done: Sent) {
        match done {
            Ok((i, Ok(took))) => {
                self.accepted[i] = true;
                self.latency_us.push(micros(took));
            }
            Ok((_, Err(e))) => {
                self.errors += 1;
                self.first_error.get_or_insert(e.to_string());
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// Folds the clients' records into `result`: counts, then latency over all
/// pairs, per message, and per gateway.
fn merge(result: &mut Pods, options: &Options, accepted: &[bool], received: &[Received]) {
    let warmup = options.warmup.min(accepted.len());
    let mut per_gateway: Vec<Vec<u32>> = vec![Vec::new(); options.gateways.len()];
    let mut clients_per_gateway = vec![0; options.gateways.len()];
    for r in received {
        result.duplicated += r.duplicates;
        result.unexpected += r.unexpected;
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
        for (i, (&latency, &ok)) in r.latency_us.iter().zip(accepted).enumerate() {
            match (ok, latency == MISSING) {
                (false, _) => {}
                (true, true) => result.lost += 1,
                (true, false) => {
                    result.deliveries += 1;
                    if i >= warmup {
                        per_gateway[r.gateway].push(latency);
                    }
                }
            }
        }
    }
    // Per message ("round"): its slowest client and its p99.
    let mut last = Vec::new();
    let mut p99 = Vec::new();
    let mut round = Vec::with_capacity(received.len());
    for i in (warmup..accepted.len()).filter(|&i| accepted[i]) {
        round.clear();
        round.extend(
            received
                .iter()
                .map(|r| r.latency_us[i])
                .filter(|&l| l != MISSING),
        );
        if !round.is_empty() {
            let s = Summary::of(&mut round);
            last.push(s.max_us);
            p99.push(s.p99_us);
        }
    }
    result.last_client = Summary::of(&mut last);
    result.round_p99 = Summary::of(&mut p99);
    for (g, samples) in per_gateway.iter_mut().enumerate() {
        result.by_gateway.push(GatewayLatency {
            gateway: options.gateways[g].ws_url(),
            clients: clients_per_gateway[g],
            latency: Summary::of(samples),
        });
    }
    let mut all: Vec<u32> = per_gateway.concat();
    result.latency = Summary::of(&mut all);
}

impl Outcome for Pods {
    const SCENARIO: &'static str = "pods";

    fn rows(&self) -> Vec<Row> {
        let l = &self.latency;
        let mut rows = vec![
            Row::new(
                "publisher",
                format!(
                    "{} at {}/s for {}s, {} B payload, {} connections",
                    self.publish_to,
                    self.rate_per_s,
                    self.duration_s,
                    self.size_bytes,
                    self.connections
                ),
            ),
            Row::new(
                "clients",
                format!(
                    "{} on topic {}, connected and subscribed in {:.2} s",
                    self.clients, self.topic, self.connect_s
                ),
            ),
            Row::new(
                "published",
                format!(
                    "{} of {} ({} errors; {} warm-up), {:.1}/s kept",
                    self.published,
                    self.messages,
                    self.publish_errors,
                    self.warmup_messages,
                    self.publish_rate_per_s
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
            Row::new("lost", self.lost),
            Row::new("duplicated", self.duplicated),
            Row::new("unexpected frames", self.unexpected),
            Row::new("disconnected clients", self.disconnected),
            Row::new(
                "latency p50/p90/p99/p99.9/max",
                format!(
                    "{} / {} / {} / {} / {} ms over {} pairs",
                    crate::latency::ms(l.p50_us),
                    crate::latency::ms(l.p90_us),
                    crate::latency::ms(l.p99_us),
                    crate::latency::ms(l.p999_us),
                    crate::latency::ms(l.max_us),
                    l.count
                ),
            ),
            Row::new("last client median/p99/worst", self.last_client.brief()),
            Row::new("per-message p99, median", {
                format!("{} ms", crate::latency::ms(self.round_p99.p50_us))
            }),
        ];
        for g in &self.by_gateway {
            rows.push(Row::new(
                format!("  via {}", g.gateway),
                format!("{} clients: {}", g.clients, g.latency.brief()),
            ));
        }
        rows.push(Row::new("CPU", self.cpu.brief()));
        rows
    }

    fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.publish_errors > 0 {
            failures.push(format!(
                "{} publishes failed; first: {}",
                self.publish_errors,
                self.first_publish_error.as_deref().unwrap_or("?")
            ));
        }
        if self.lost > 0 {
            failures.push(format!("{} deliveries lost", self.lost));
        }
        if self.duplicated > 0 {
            failures.push(format!("{} deliveries duplicated", self.duplicated));
        }
        if self.unexpected > 0 {
            failures.push(format!("{} unexpected frames", self.unexpected));
        }
        if self.disconnected > 0 {
            failures.push(format!(
                "{} clients disconnected: {}",
                self.disconnected,
                self.disconnects.join("; ")
            ));
        }
        failures
    }
}
