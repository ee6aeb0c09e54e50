//! `stall`: does Redis being slow for one thing stop fan-out for everything?
//!
//! A Redis-backed pod watches many topics (`connections` raw clients,
//! `topics_per_connection` fresh topics each, nothing published on them)
//! and one more, the canary, which the tool publishes to every
//! `canary_interval` over keep-alive HTTP and reads on a connection of its
//! own. Each canary message's latency is its receive time minus its
//! scheduled send time, both on this machine's clock. Redis is reached
//! through `herald-loadtest proxy`: the setup runs with no delay (tens of
//! thousands of subscriptions at 200 ms each would take hours on a pod that
//! makes them one by one), then the proxy's control port sets
//! `redis_delay`, and the phases run:
//!
//! 1. **steady**: nothing but the canary;
//! 2. **burst**: `burst_topics` subscriptions to fresh topics, on new
//!    connections (each new topic costs the pod Redis round trips);
//! 3. **resync**: the pod's pub/sub connection is killed (`CLIENT KILL TYPE
//!    pubsub`, sent to Redis directly, not through the delay): the pod
//!    reconnects and catches up on every watched topic.
//!
//! Per phase (a canary message belongs to the phase it was sent in; those
//! sent in the second before a phase's event, in flight when it comes,
//! belong to none): the
//! canary's latency (p50, p99, max over those delivered), those not
//! delivered by the end of the run, and the longest time without any canary
//! delivery. Over the run: every answered canary seq delivered once and in
//! order, or the run fails. Every phase has a fixed length, so the run ends
//! by itself however long the pod stalls; the delay is set back to zero at
//! the end.
//!
//! Layout: the options, the run and the result here; [`watching`] (the
//! connections that watch the many topics), [`canary`] (the topic measured).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use self::canary::{count, phase, publish_canary, read_canary};
use self::watching::{keep, open};
use super::{MAX_DURATION, unique_topic};
use crate::clients::{FD_MARGIN, open_all, raise_fd_limit};
use crate::latency::{Summary, now_micros};
use crate::proxy;
use crate::publish::Pool;
use crate::report::{Outcome, Row};
use crate::{Error, Target};

mod canary;
mod watching;

/// Connections holding the watched topics.
pub const DEFAULT_CONNECTIONS: usize = 200;
/// Fresh topics each of them subscribes to.
pub const DEFAULT_TOPICS_PER_CONNECTION: usize = 100;
/// Fresh topics subscribed to in the burst phase.
pub const DEFAULT_BURST_TOPICS: usize = 100;
/// Between two canary messages.
pub const DEFAULT_CANARY_INTERVAL: Duration = Duration::from_millis(10);
/// The delay the proxy adds to each Redis round trip during the phases.
pub const DEFAULT_REDIS_DELAY: Duration = Duration::from_millis(200);
/// The steady phase's length.
pub const DEFAULT_STEADY: Duration = Duration::from_secs(5);
/// The burst and resync phases' length each: a stall longer than this shows
/// as a gap to the phase's end and canary messages not delivered.
pub const DEFAULT_PHASE: Duration = Duration::from_secs(20);
/// After the last canary, how long its deliveries may take.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);
/// Keep-alive connections publishing the canary: each publish waits a
/// Redis round trip, so many are in flight at once.
pub const DEFAULT_PUBLISHERS: usize = 64;
/// Canary messages sent before the steady phase starts counting, so that
/// its figures do not include the first round trips.
const WARMUP: Duration = Duration::from_secs(1);
/// Between the end of one phase and the next one's event: the canary
/// messages sent then are in flight when it comes, so they are counted in
/// no phase (but checked for loss like all others).
const GUARD: Duration = Duration::from_secs(1);
/// Longest one connection of the setup may take to have all its topics
/// confirmed.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// A raw client's starting buffer: `ok`s, pings and the canary's messages.
const BUFFER_BYTES: usize = 4096;
/// Payload bytes of a canary message (the stamp fits).
const CANARY_SIZE: usize = 64;
/// Most failures listed in the result.
const LISTED: usize = 5;

#[derive(Debug, Clone)]
pub struct Options {
    pub gateway: Target,
    /// Redis itself, for `CLIENT KILL TYPE pubsub` (loopback).
    pub redis: SocketAddr,
    /// The control port of the proxy between the pod and Redis; without
    /// it, whatever delay the path has applies throughout, setup included.
    pub proxy_control: Option<SocketAddr>,
    pub redis_delay: Duration,
    pub connections: usize,
    pub topics_per_connection: usize,
    pub burst_topics: usize,
    pub canary_interval: Duration,
    pub steady: Duration,
    pub phase: Duration,
    pub drain: Duration,
    pub publishers: usize,
}

impl Options {
    pub fn new(gateway: Target, redis: SocketAddr) -> Self {
        Self {
            gateway,
            redis,
            proxy_control: None,
            redis_delay: DEFAULT_REDIS_DELAY,
            connections: DEFAULT_CONNECTIONS,
            topics_per_connection: DEFAULT_TOPICS_PER_CONNECTION,
            burst_topics: DEFAULT_BURST_TOPICS,
            canary_interval: DEFAULT_CANARY_INTERVAL,
            steady: DEFAULT_STEADY,
            phase: DEFAULT_PHASE,
            drain: DEFAULT_DRAIN,
            publishers: DEFAULT_PUBLISHERS,
        }
    }

    fn burst_connections(&self) -> usize {
        self.burst_topics.div_ceil(self.topics_per_connection)
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::Options(m.to_owned()));
        if self.connections == 0 || self.topics_per_connection == 0 {
            return bad("--connections and --topics-per-connection must be over 0");
        }
        if self.connections * self.topics_per_connection > 1_000_000 {
            return bad("at most 1,000,000 watched topics");
        }
        if self.canary_interval < Duration::from_millis(1) || self.publishers == 0 {
            return bad("--canary-interval must be at least 1ms, --publishers over 0");
        }
        let run = WARMUP + self.steady + GUARD * 2 + self.phase * 2 + self.drain;
        if self.steady.is_zero() || self.phase.is_zero() || run > MAX_DURATION {
            return bad("the phases must be over 0s, and all of them at most the longest run");
        }
        if self.redis_delay > Duration::from_secs(5) {
            return bad("--redis-delay is at most 5s");
        }
        Ok(())
    }
}

/// One phase's canary figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub seconds: f64,
    /// Canary messages sent in the phase (answered or not).
    pub sent: u64,
    /// Of those, delivered by the end of the run, and their latency.
    pub delivered: u64,
    pub latency: Summary,
    /// Sent in the phase, answered with a seq, never delivered.
    pub undelivered: u64,
    /// The longest time within the phase with no canary delivery at all
    /// (to the phase's end, if deliveries stopped).
    pub longest_gap_ms: f64,
}

/// The result of a `stall` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stall {
    pub gateway: String,
    /// Topics watched besides the canary's, and on how many connections.
    pub topics: usize,
    pub connections: usize,
    /// The delay set through the proxy for the phases; `None`: none was set.
    pub redis_delay_ms: Option<u64>,
    pub canary_interval_ms: f64,
    /// How long the setup's subscriptions took.
    pub setup_s: f64,
    pub burst_topics: usize,
    /// How long the burst's subscriptions took to be confirmed; `None`: not
    /// within the burst phase.
    pub burst_confirmed_s: Option<f64>,
    /// Pub/sub connections `CLIENT KILL` closed (1 for one pod).
    pub pubsub_killed: u64,
    /// From the kill to the first delivery of a canary sent after it;
    /// `None`: none came.
    pub first_delivery_after_kill_s: Option<f64>,
    pub phases: Vec<Phase>,
    pub sent: u64,
    pub publish_errors: u64,
    pub first_publish_error: Option<String>,
    /// Answered seqs never delivered, delivered twice, out of order.
    pub lost: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// `reset`s of the canary: the pod lost track of it for longer than its
    /// history reaches (`history_size` messages).
    pub resets: u64,
    /// Canary frames other than `msg` and `reset` (an `err`), or its end.
    pub unexpected: Vec<String>,
    /// Connections of the setup or the burst the pod closed.
    pub closed: Vec<String>,
}

/// A canary delivery: (seq, message index, send time, receive time), in µs.
type Delivery = (u64, u64, u64, u64);

/// What the canary's reader keeps.
#[derive(Default)]
struct Canary {
    deliveries: Vec<Delivery>,
    /// `reset`s: the pod could not bridge a gap (history too short).
    resets: u64,
    unexpected: Vec<String>,
}

/// One canary publish: its index, scheduled send time (µs) and the seq it
/// got, or why not.
type Sent = (u64, u64, Result<u64, String>);

pub async fn run(options: Options) -> Result<Stall, Error> {
    options.validate()?;
    let sockets = options.connections + options.burst_connections() + 1 + options.publishers;
    raise_fd_limit(sockets as u64 + FD_MARGIN)?;
    let prefix = unique_topic("stall");
    let target = Arc::new(options.gateway.clone());
    if let Some(control) = options.proxy_control {
        told(control, "delay 0ms").await?;
    }

    // Setup: every watched topic, then the canary.
    let started = Instant::now();
    let per = options.topics_per_connection;
    let holding = {
        let (target, prefix) = (target.clone(), prefix.clone());
        open_all(options.connections, move |c| {
            let (target, prefix) = (target.clone(), prefix.clone());
            async move {
                let topics: Vec<String> = (0..per).map(|k| format!("{prefix}.{c}.{k}")).collect();
                open(c, &target, &topics, SETUP_TIMEOUT).await
            }
        })
        .await?
    };
    let canary_topic = format!("{prefix}.canary");
    let canary_client = open(
        options.connections,
        &target,
        std::slice::from_ref(&canary_topic),
        SETUP_TIMEOUT,
    )
    .await?;
    let setup_s = started.elapsed().as_secs_f64();
    let closed = Arc::new(Mutex::new(Vec::new()));
    let (stop, stopped) = watch::channel(false);
    let mut held = JoinSet::new();
    for (c, client) in holding.into_iter().enumerate() {
        held.spawn(keep(client, c, closed.clone(), stopped.clone()));
    }

    let redis_delay_ms = match options.proxy_control {
        Some(control) => {
            let delay = humantime::format_duration(options.redis_delay);
            told(control, &format!("delay {delay}")).await?;
            Some(options.redis_delay.as_millis() as u64)
        }
        None => None,
    };

    // The canary: its reader, and its publisher until the end of the phases.
    let canary = Arc::new(Mutex::new(Canary::default()));
    let reader = tokio::spawn(read_canary(canary_client, canary.clone(), stopped.clone()));
    let pool = Arc::new(Pool::open(options.gateway.addr, options.publishers).await?);
    let sent = Arc::new(Mutex::new(Vec::<Sent>::new()));
    let (publishing, until) = watch::channel(false);
    let publisher = tokio::spawn(publish_canary(
        pool,
        canary_topic,
        options.canary_interval,
        sent.clone(),
        until,
    ));

    tokio::time::sleep(WARMUP).await;
    let steady_at = now_micros();
    tokio::time::sleep(options.steady).await;
    let steady_end = now_micros();
    tokio::time::sleep(GUARD).await;

    // The burst: fresh topics on new connections, while the phase runs.
    let burst_at = now_micros();
    let burst_started = Instant::now();
    let burst = {
        let (target, prefix) = (target.clone(), prefix.clone());
        let (count, first) = (options.burst_topics, options.connections + 1);
        let within = options.phase;
        tokio::spawn(async move {
            let mut opening = JoinSet::new();
            for b in 0..count.div_ceil(per) {
                let topics: Vec<String> = (b * per..((b + 1) * per).min(count))
                    .map(|k| format!("{prefix}.burst.{k}"))
                    .collect();
                let target = target.clone();
                opening.spawn(async move { open(first + b, &target, &topics, within).await });
            }
            let mut clients = Vec::new();
            while let Some(opened) = opening.join_next().await {
                match opened {
                    Ok(Ok(client)) => clients.push(client),
                    _ => return (clients, None),
                }
            }
            (clients, Some(burst_started.elapsed().as_secs_f64()))
        })
    };
    tokio::time::sleep(options.phase).await;
    let burst_end = now_micros();
    tokio::time::sleep(GUARD).await;

    // The resync: the pod's pub/sub connection killed.
    let resync_at = now_micros();
    let pubsub_killed = kill_pubsub(options.redis).await?;
    tokio::time::sleep(options.phase).await;
    let end_at = now_micros();
    publishing.send_replace(true);
    let _ = publisher.await;

    // Deliveries still due: until every answered seq is in, or the drain ends.
    let answered: HashSet<u64> = lock(&sent)
        .iter()
        .filter_map(|(_, _, seq)| seq.as_ref().ok().copied())
        .collect();
    let drain_until = Instant::now() + options.drain;
    while Instant::now() < drain_until {
        let delivered: HashSet<u64> = lock(&canary).deliveries.iter().map(|d| d.0).collect();
        if answered.iter().all(|seq| delivered.contains(seq)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(control) = options.proxy_control {
        // The pod may catch up once the run is over; a failure says so.
        told(control, "delay 0ms").await?;
    }

    let (burst_clients, burst_confirmed_s) = match burst.await {
        Ok(done) => done,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    stop.send_replace(true);
    drop(burst_clients);
    let _ = reader.await;
    held.abort_all();

    let canary = std::mem::take(&mut *lock(&canary));
    let sent = std::mem::take(&mut *lock(&sent));
    let bounds = [
        ("steady", steady_at, steady_end),
        ("burst", burst_at, burst_end),
        ("resync", resync_at, end_at),
    ];
    let phases = bounds
        .iter()
        .map(|&(name, from, to)| phase(name, from, to, &sent, &canary.deliveries))
        .collect();
    let first_delivery_after_kill_s = canary
        .deliveries
        .iter()
        .filter(|d| d.2 >= resync_at)
        .map(|d| d.3)
        .min()
        .map(|at| (at - resync_at) as f64 / 1e6);
    let (lost, duplicated, out_of_order) = count(&answered, &canary.deliveries);
    let errors: Vec<&String> = sent.iter().filter_map(|s| s.2.as_ref().err()).collect();
    let closed = std::mem::take(&mut *lock(&closed));
    Ok(Stall {
        gateway: options.gateway.to_string(),
        topics: options.connections * per,
        connections: options.connections,
        redis_delay_ms,
        canary_interval_ms: options.canary_interval.as_secs_f64() * 1e3,
        setup_s,
        burst_topics: options.burst_topics,
        burst_confirmed_s,
        pubsub_killed,
        first_delivery_after_kill_s,
        phases,
        sent: sent.len() as u64,
        publish_errors: errors.len() as u64,
        first_publish_error: errors.first().map(|e| e.to_string()),
        lost,
        duplicated,
        out_of_order,
        resets: canary.resets,
        unexpected: canary.unexpected.into_iter().take(LISTED).collect(),
        closed,
    })
}

/// Tells the proxy's control port `command`.
async fn told(control: SocketAddr, command: &str) -> Result<String, Error> {
    proxy::tell(control, command)
        .await
        .map_err(|e| Error::Options(format!("--proxy-control {control}: {e}")))
}

/// `CLIENT KILL TYPE pubsub` on Redis at `redis`: the connections closed.
async fn kill_pubsub(redis: SocketAddr) -> Result<u64, Error> {
    let fail = |reason: String| Error::Options(format!("--redis {redis}: {reason}"));
    let exchange = async {
        let mut socket = TcpStream::connect(redis).await?;
        socket
            .write_all(b"*4\r\n$6\r\nCLIENT\r\n$4\r\nKILL\r\n$4\r\nTYPE\r\n$6\r\npubsub\r\n")
            .await?;
        let mut answer = String::new();
        tokio::io::BufReader::new(socket)
            .read_line(&mut answer)
            .await?;
        std::io::Result::Ok(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| fail("no answer within 5s".to_owned()))?
        .map_err(|e| fail(e.to_string()))?;
    // An integer reply, `:1`.
    answer
        .trim()
        .strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| fail(format!("CLIENT KILL answered `{}`", answer.trim())))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing panics while holding these; what a poisoned one holds is still good.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Outcome for Stall {
    const SCENARIO: &'static str = "stall";

    fn rows(&self) -> Vec<Row> {
        let delay = self
            .redis_delay_ms
            .map_or("as the path has it".to_owned(), |d| format!("{d} ms"));
        let mut rows = vec![
            Row::new("gateway", &self.gateway),
            Row::new(
                "watched",
                format!(
                    "{} topics on {} connections, + the canary",
                    self.topics, self.connections
                ),
            ),
            Row::new("setup (no delay)", format!("{:.1} s", self.setup_s)),
            Row::new("Redis delay in the phases", delay),
            Row::new(
                "canary",
                format!(
                    "every {} ms, {} sent, {} publishes failed",
                    self.canary_interval_ms, self.sent, self.publish_errors
                ),
            ),
        ];
        for p in &self.phases {
            rows.push(Row::new(
                format!("{} ({:.0} s): canary p50 / p99 / max", p.name, p.seconds),
                format!("{} ({} delivered)", p.latency.brief(), p.delivered),
            ));
            rows.push(Row::new(
                format!("{}: longest gap, undelivered", p.name),
                format!(
                    "{:.0} ms, {} of {}",
                    p.longest_gap_ms, p.undelivered, p.sent
                ),
            ));
        }
        let confirmed = self
            .burst_confirmed_s
            .map_or("not within the phase".to_owned(), |s| format!("{s:.1} s"));
        rows.push(Row::new(
            format!("burst: {} new topics confirmed", self.burst_topics),
            confirmed,
        ));
        let after = self
            .first_delivery_after_kill_s
            .map_or("none".to_owned(), |s| format!("{s:.2} s"));
        rows.push(Row::new(
            format!(
                "resync: pub/sub killed ({}), first new canary after",
                self.pubsub_killed
            ),
            after,
        ));
        rows.push(Row::new(
            "canary lost / duplicated / out of order",
            format!(
                "{} / {} / {}",
                self.lost, self.duplicated, self.out_of_order
            ),
        ));
        rows
    }

    fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.lost + self.duplicated + self.out_of_order + self.resets > 0 {
            failures.push(format!(
                "canary: {} lost, {} duplicated, {} out of order, {} resets",
                self.lost, self.duplicated, self.out_of_order, self.resets
            ));
        }
        if self.publish_errors > 0 {
            failures.push(format!(
                "{} canary publishes failed; first: {}",
                self.publish_errors,
                self.first_publish_error.as_deref().unwrap_or("?")
            ));
        }
        if !self.unexpected.is_empty() {
            failures.push(format!("canary: unexpected {}", self.unexpected.join("; ")));
        }
        if !self.closed.is_empty() {
            failures.push(format!("closed by the pod: {}", self.closed.join("; ")));
        }
        if self.pubsub_killed == 0 {
            failures
                .push("CLIENT KILL closed no pub/sub connection: is --redis the pod's?".to_owned());
        }
        failures
    }
}
