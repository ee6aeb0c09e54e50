//! `throughput`: many topics, small messages, published as fast as the
//! gateway takes them; how many deliveries it makes per second and per
//! CPU-second of its own.
//!
//! `clients` clients each subscribe to `subscriptions` of the `topics`
//! topics (client `i` to topics `i·s, i·s+1, …` modulo `topics`, so every
//! topic gets about `clients·s/topics` subscribers), and `concurrency`
//! keep-alive HTTP connections publish back to back, round-robin over the
//! topics. Each client thus receives a share of every publish, many frames
//! at once, which lets the gateway write them with one syscall: the
//! coalescing this scenario is about. Clients are [`crate::raw::Client`]s (or
//! their stream twins, [`crate::streams`]) that
//! count `msg` frames from their fixed prefix without parsing JSON, so they
//! cost little of the machine's CPU.
//!
//! Nothing may be lost: each client checks that each topic's seqs come one
//! after the other, and at the end that it has every seq the publisher was
//! answered with. The gateway's CPU comes from `/proc/<pid>/stat` of
//! `--gateway-pid`, over the window from the first publish to the last
//! delivery.
//!
//! `--transport` picks the clients' transport ([`Transport`]): WebSocket
//! (`sub` per topic), server-sent events (the topics in `GET /sse`'s query)
//! or HTTP-streaming (`POST /stream`, the `sub`s by `POST
//! /stream/<session>`); the same counting on each, so the three runs'
//! deliveries per gateway CPU-second compare (`scripts/bench.sh streams`).
//!
//! Why HTTP and not gRPC `PublishBatch`: with a fan-out of tens of
//! subscribers per topic, a publish's HTTP cost is shared by all its
//! deliveries; a batch would publish more per CPU-second, not deliver more
//! per publish, and needs a gRPC client in this tool.
//!
//! Layout: the options, the run (publishing, counting) and the result
//! here; the clients in [`subscribers`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use self::subscribers::{connect_all, read};
use super::{check_bounds, unique_topic};
use crate::clients::{FD_MARGIN, raise_fd_limit};
use crate::cpu::{Meter, Usage};
use crate::publish::{Connection, back_to_back, body};
use crate::report::{Outcome, Row, delivery_failures};
use crate::streams::Transport;
use crate::{Error, Target};

mod subscribers;

/// Subscribing clients.
pub const DEFAULT_CLIENTS: usize = 200;
/// Topics published to, round-robin.
pub const DEFAULT_TOPICS: usize = 100;
/// Topics each client subscribes to: with the defaults, 100 subscribers
/// per topic, and each client receives half of all publishes.
pub const DEFAULT_SUBSCRIPTIONS: usize = 50;
/// Keep-alive HTTP connections publishing back to back.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// How long to publish.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// Payload bytes: the 64-byte messages.
pub const DEFAULT_SIZE: usize = 64;
/// After the last publish, how long to wait for the deliveries still missing.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);
/// Most clients.
pub const MAX_CLIENTS: usize = 10_000;
/// Most topics.
pub const MAX_TOPICS: usize = 100_000;
/// Most subscriptions per client (the gateway's default `session.max_subscriptions`).
pub const MAX_SUBSCRIPTIONS: usize = 1000;
/// Most publisher connections.
pub const MAX_CONCURRENCY: usize = 1024;
/// Each client's read buffer: many coalesced frames per read.
const BUFFER_BYTES: usize = 64 * 1024;
/// Deliveries a client counts before adding them to the shared progress.
const PROGRESS_BATCH: u64 = 256;
/// Between two looks at the delivery count while draining.
const DRAIN_POLL: Duration = Duration::from_millis(5);
/// Clients' ends listed in the result.
const DISCONNECTS_LISTED: usize = 5;

#[derive(Debug, Clone)]
pub struct Options {
    /// Where the clients connect.
    pub gateway: Target,
    /// Where the publisher posts (the same gateway by default).
    pub publish_to: Target,
    /// The gateway's process id, for its CPU time.
    pub gateway_pid: Option<u32>,
    pub clients: usize,
    pub topics: usize,
    /// Topics per client.
    pub subscriptions: usize,
    pub concurrency: usize,
    pub duration: Duration,
    /// Payload bytes: a JSON string of exactly this size.
    pub size: usize,
    pub drain: Duration,
    /// Other local processes whose CPU time to report.
    pub watch: Vec<u32>,
    /// The clients' transport.
    pub transport: Transport,
    /// Offer permessage-deflate, as a browser does (and inflate what comes).
    pub compression: bool,
}

impl Options {
    pub fn new(gateway: Target) -> Self {
        Self {
            publish_to: gateway.clone(),
            gateway,
            gateway_pid: None,
            clients: DEFAULT_CLIENTS,
            topics: DEFAULT_TOPICS,
            subscriptions: DEFAULT_SUBSCRIPTIONS,
            concurrency: DEFAULT_CONCURRENCY,
            duration: DEFAULT_DURATION,
            size: DEFAULT_SIZE,
            drain: DEFAULT_DRAIN,
            watch: Vec::new(),
            transport: Transport::Ws,
            compression: false,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        check_bounds(self.duration, self.size)?;
        let bad = |m: String| Err(Error::Options(m));
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return bad(format!("--clients must be 1 to {MAX_CLIENTS}"));
        }
        if self.topics == 0 || self.topics > MAX_TOPICS {
            return bad(format!("--topics must be 1 to {MAX_TOPICS}"));
        }
        if self.subscriptions == 0
            || self.subscriptions > self.topics
            || self.subscriptions > MAX_SUBSCRIPTIONS
        {
            return bad(format!(
                "--subscriptions must be 1 to --topics and at most {MAX_SUBSCRIPTIONS}"
            ));
        }
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            return bad(format!("--concurrency must be 1 to {MAX_CONCURRENCY}"));
        }
        if self.size < 2 {
            return bad("--size must be at least 2 (a JSON string)".to_owned());
        }
        if self.drain > super::MAX_DURATION {
            return bad("--drain is too long".to_owned());
        }
        Ok(())
    }

    /// The topics client `client` subscribes to, by index.
    fn topics_of(&self, client: usize) -> impl Iterator<Item = usize> + use<> {
        let (first, topics) = (client * self.subscriptions, self.topics);
        (0..self.subscriptions).map(move |j| (first + j) % topics)
    }
}

/// A JSON string of exactly `size` bytes (at least 2).
pub fn payload(size: usize) -> String {
    format!("\"{}\"", "x".repeat(size.saturating_sub(2)))
}

/// The result of a `throughput` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Throughput {
    /// The clients' transport (results from before it was a choice: `ws`).
    #[serde(default)]
    pub transport: Transport,
    pub gateway: String,
    pub publish_to: String,
    pub gateway_pid: Option<u32>,
    pub clients: usize,
    pub topics: usize,
    pub subscriptions_per_client: usize,
    /// Subscribers per topic, on average.
    pub fanout: f64,
    pub concurrency: usize,
    pub size_bytes: usize,
    pub duration_s: f64,
    pub connect_s: f64,
    /// Publishes the gateway accepted.
    pub publishes: u64,
    pub publish_errors: u64,
    pub first_publish_error: Option<String>,
    pub publishes_per_s: f64,
    pub deliveries_expected: u64,
    pub deliveries: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Frames that were no `msg` of a subscribed topic.
    pub unexpected: u64,
    pub disconnected: u64,
    pub disconnects: Vec<String>,
    /// From the first publish to the last delivery (or the drain's end).
    pub window_s: f64,
    pub drain_wait_s: f64,
    pub deliveries_per_s: f64,
    /// The gateway's CPU seconds in the window.
    pub gateway_cpu_s: Option<f64>,
    pub deliveries_per_gateway_cpu_s: Option<f64>,
    pub cpu: Usage,
    /// permessage-deflate offered (`--compression`), and by how many
    /// clients it was negotiated (results from before: none).
    #[serde(default)]
    pub compression: bool,
    #[serde(default)]
    pub compressed_clients: usize,
    /// Bytes of `msg` frames on the wire (headers included), per delivery.
    #[serde(default)]
    pub wire_bytes_per_delivery: f64,
}

/// What one client saw.
struct Seen {
    client: usize,
    /// Per subscribed topic (in `topics_of` order): the seq of its `ok`,
    /// and the newest seq received.
    initial: Vec<u64>,
    last: Vec<u64>,
    received: u64,
    /// Wire bytes of the `msg` frames received.
    wire_bytes: u64,
    duplicated: u64,
    unexpected: u64,
    end: Option<String>,
}

/// What one publisher connection did.
#[derive(Clone)]
struct Published {
    accepted: u64,
    /// Per topic, the highest seq the gateway answered with.
    top_seq: Vec<u64>,
}

pub async fn run(options: Options) -> Result<Throughput, Error> {
    options.validate()?;
    raise_fd_limit(options.clients as u64 + options.concurrency as u64 + FD_MARGIN)?;
    let prefix = unique_topic("throughput");
    let topics: Arc<[String]> = (0..options.topics)
        .map(|t| format!("{prefix}.{t}"))
        .collect();

    let connecting = Instant::now();
    let clients = connect_all(&options, &topics).await?;
    let connect = connecting.elapsed();
    let compressed_clients = clients.iter().filter(|(_, _, c)| c.compressed()).count();
    let mut connections = Vec::with_capacity(options.concurrency);
    for _ in 0..options.concurrency {
        connections.push(Connection::open(options.publish_to.addr).await?);
    }

    let progress = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = watch::channel(false);
    let readers: Vec<_> = clients
        .into_iter()
        .map(|(client, initial, c)| {
            tokio::spawn(read(
                client,
                c,
                initial,
                options.clone(),
                progress.clone(),
                stopped.clone(),
            ))
        })
        .collect();

    let mut watch = Vec::from_iter(options.gateway_pid);
    watch.extend(
        options
            .watch
            .iter()
            .filter(|p| Some(**p) != options.gateway_pid),
    );
    let meter = Meter::start(&watch);
    let started = Instant::now();
    let deadline = started + options.duration;
    let data: Arc<str> = payload(options.size).into();
    let mut published = Published {
        accepted: 0,
        top_seq: vec![0; options.topics],
    };
    let topic_count = topics.len();
    let sent = back_to_back(
        connections,
        deadline,
        published.clone(),
        move |n| body(&topics[n % topic_count], &data),
        move |done: &mut Published, n, answer, _| {
            let t = n % topic_count;
            done.accepted += 1;
            done.top_seq[t] = done.top_seq[t].max(answer.seq);
        },
    )
    .await;
    for p in sent.tallies {
        published.accepted += p.accepted;
        for (top, theirs) in published.top_seq.iter_mut().zip(p.top_seq) {
            *top = (*top).max(theirs);
        }
    }
    let publishing = started.elapsed();

    // Every subscriber of a topic is owed each of its accepted seqs.
    let mut subscribers = vec![0u64; options.topics];
    for client in 0..options.clients {
        options.topics_of(client).for_each(|t| subscribers[t] += 1);
    }
    let expected: u64 = published
        .top_seq
        .iter()
        .zip(&subscribers)
        .map(|(seq, n)| seq * n)
        .sum();
    let draining = Instant::now();
    while progress.load(Ordering::Relaxed) < expected
        && draining.elapsed() < options.drain
        && !readers.iter().all(|r| r.is_finished())
    {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let drain_wait = draining.elapsed();
    let window = started.elapsed();
    let cpu = meter.stop();
    let _ = stop.send(true);

    let mut result = Throughput {
        transport: options.transport,
        gateway: options.gateway.ws_url(),
        publish_to: options.publish_to.http_url(),
        gateway_pid: options.gateway_pid,
        clients: options.clients,
        topics: options.topics,
        subscriptions_per_client: options.subscriptions,
        fanout: (options.clients * options.subscriptions) as f64 / options.topics as f64,
        concurrency: options.concurrency,
        size_bytes: options.size,
        duration_s: options.duration.as_secs_f64(),
        connect_s: connect.as_secs_f64(),
        publishes: published.accepted,
        publish_errors: sent.errors,
        first_publish_error: sent.first_error,
        publishes_per_s: published.accepted as f64 / publishing.as_secs_f64(),
        deliveries_expected: 0,
        deliveries: 0,
        lost: 0,
        duplicated: 0,
        unexpected: 0,
        disconnected: 0,
        disconnects: Vec::new(),
        window_s: window.as_secs_f64(),
        drain_wait_s: drain_wait.as_secs_f64(),
        deliveries_per_s: 0.0,
        gateway_cpu_s: options.gateway_pid.and_then(|pid| {
            cpu.watched
                .iter()
                .find(|w| w.pid == pid)
                .and_then(|w| w.cpu_s)
        }),
        deliveries_per_gateway_cpu_s: None,
        cpu,
        compression: options.compression,
        compressed_clients,
        wire_bytes_per_delivery: 0.0,
    };
    let mut wire_bytes = 0u64;
    for reader in readers {
        let seen = match reader.await {
            Ok(s) => s,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        for (j, t) in options.topics_of(seen.client).enumerate() {
            let owed = published.top_seq[t].saturating_sub(seen.initial[j]);
            result.deliveries_expected += owed;
            result.lost += published.top_seq[t].saturating_sub(seen.last[j]);
        }
        result.deliveries += seen.received;
        wire_bytes += seen.wire_bytes;
        result.duplicated += seen.duplicated;
        result.unexpected += seen.unexpected;
        if let Some(end) = seen.end {
            result.disconnected += 1;
            if result.disconnects.len() < DISCONNECTS_LISTED {
                result
                    .disconnects
                    .push(format!("client {}: {end}", seen.client));
            }
        }
    }
    result.deliveries_per_s = result.deliveries as f64 / window.as_secs_f64();
    result.wire_bytes_per_delivery = wire_bytes as f64 / result.deliveries.max(1) as f64;
    result.deliveries_per_gateway_cpu_s = result
        .gateway_cpu_s
        .filter(|&s| s > 0.0)
        .map(|s| result.deliveries as f64 / s);
    Ok(result)
}

impl Outcome for Throughput {
    const SCENARIO: &'static str = "throughput";

    fn rows(&self) -> Vec<Row> {
        vec![
            Row::new(
                "clients",
                format!(
                    "{} ({}) on {}, {} topics each of {} ({:.1} subscribers per topic), \
                     connected in {:.2} s",
                    self.clients,
                    self.transport.name(),
                    self.gateway,
                    self.subscriptions_per_client,
                    self.topics,
                    self.fanout,
                    self.connect_s
                ),
            ),
            Row::new(
                "publisher",
                format!(
                    "{} over {} keep-alive connections, {} B payload, {:.0} s",
                    self.publish_to, self.concurrency, self.size_bytes, self.duration_s
                ),
            ),
            Row::new(
                "publishes",
                format!(
                    "{} ({} errors), {:.0}/s",
                    self.publishes, self.publish_errors, self.publishes_per_s
                ),
            ),
            Row::new(
                "deliveries",
                format!(
                    "{} of {} in {:.2} s (drained in {:.3} s)",
                    self.deliveries, self.deliveries_expected, self.window_s, self.drain_wait_s
                ),
            ),
            Row::new("deliveries/s", format!("{:.0}", self.deliveries_per_s)),
            Row::new(
                "wire bytes per delivery",
                format!(
                    "{:.1}{}",
                    self.wire_bytes_per_delivery,
                    if self.compression {
                        format!(
                            " (permessage-deflate offered; negotiated by {} of {} clients)",
                            self.compressed_clients, self.clients
                        )
                    } else {
                        String::new()
                    }
                ),
            ),
            Row::new(
                "gateway CPU",
                self.gateway_cpu_s
                    .map_or("no --gateway-pid given".to_owned(), |s| format!("{s:.2} s")),
            ),
            Row::new(
                "deliveries per gateway CPU-s",
                self.deliveries_per_gateway_cpu_s
                    .map_or("?".to_owned(), |d| format!("{d:.0}")),
            ),
            Row::new("lost", self.lost),
            Row::new("duplicated", self.duplicated),
            Row::new("unexpected frames", self.unexpected),
            Row::new("disconnected clients", self.disconnected),
            Row::new("CPU", self.cpu.brief()),
        ]
    }

    fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.publishes == 0 {
            failures.push("nothing was published".to_owned());
        }
        failures.extend(delivery_failures(
            self.publish_errors,
            self.first_publish_error.as_deref(),
            self.lost,
            self.duplicated,
            self.unexpected,
            self.disconnected,
            &self.disconnects,
        ));
        failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_cover_the_topics_evenly() {
        let mut options = Options::new(Target::at(([127, 0, 0, 1], 1).into()).expect("t"));
        (options.clients, options.topics, options.subscriptions) = (10, 20, 4);
        let mut count = vec![0; 20];
        for c in 0..10 {
            options.topics_of(c).for_each(|t| count[t] += 1);
        }
        assert!(count.iter().all(|&n| n == 2), "{count:?}");
        assert_eq!(payload(64).len(), 64);
    }
}
