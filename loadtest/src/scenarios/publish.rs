//! `publish`: how fast one gateway takes publishes. `concurrency` workers,
//! each with its own keep-alive HTTP connection, publish back to back for
//! `duration`, round-robin over `topics` topics; nobody subscribes, so this
//! is the publish path alone (API, broker, history).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{DEFAULT_SIZE, check_bounds, unique_topic};
use crate::clients::{self, FD_MARGIN};
use crate::cpu::{Meter, Usage};
use crate::latency::{Stamp, Summary, micros};
use crate::publish::{Connection, back_to_back, batch_body, body};
use crate::report::{Outcome, Row};
use crate::{Error, Target};

/// Keep-alive connections, each with one publish in flight.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// Topics published to, round-robin.
pub const DEFAULT_TOPICS: usize = 100;
/// How long to publish.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// Most connections.
pub const MAX_CONCURRENCY: usize = 1024;
/// Most publishes per request (the gateway's batch limit).
pub const MAX_BATCH: usize = 1000;
/// Most topics.
pub const MAX_TOPICS: usize = 100_000;
/// Latency samples kept over all workers (4 bytes each); publishes past
/// them are counted, not timed.
pub const MAX_SAMPLES: usize = 20_000_000;

#[derive(Debug, Clone)]
pub struct Options {
    pub publish_to: Target,
    pub concurrency: usize,
    pub topics: usize,
    pub duration: Duration,
    pub size: usize,
    /// Publishes per request: above 1, each goes to `/v1/publish/batch`.
    pub batch: usize,
    /// Local processes (gateways, redis) whose CPU time to report.
    pub watch: Vec<u32>,
}

impl Options {
    pub fn new(publish_to: Target) -> Self {
        Self {
            publish_to,
            concurrency: DEFAULT_CONCURRENCY,
            topics: DEFAULT_TOPICS,
            duration: DEFAULT_DURATION,
            size: DEFAULT_SIZE,
            batch: 1,
            watch: Vec::new(),
        }
    }

    fn validate(&self) -> Result<(), Error> {
        check_bounds(self.duration, self.size)?;
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            return Err(Error::Options(format!(
                "--concurrency must be 1 to {MAX_CONCURRENCY}"
            )));
        }
        if self.batch == 0 || self.batch > MAX_BATCH {
            return Err(Error::Options(format!("--batch must be 1 to {MAX_BATCH}")));
        }
        if self.topics == 0 || self.topics > MAX_TOPICS {
            return Err(Error::Options(format!(
                "--topics must be 1 to {MAX_TOPICS}"
            )));
        }
        Ok(())
    }
}

/// The result of a `publish` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Publish {
    pub publish_to: String,
    pub concurrency: usize,
    pub topics: usize,
    /// Publishes per request.
    #[serde(default = "one")]
    pub batch: usize,
    pub duration_s: f64,
    pub size_bytes: usize,
    /// Publishes the gateway accepted.
    pub publishes: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// From the first request to the last answer.
    pub elapsed_s: f64,
    /// Accepted publishes per second.
    pub per_second: f64,
    /// From sending a request to its whole answer.
    pub latency: Summary,
    pub cpu: Usage,
}

/// What one worker did.
#[derive(Default, Clone)]
struct Tally {
    publishes: u64,
    latency_us: Vec<u32>,
}

pub async fn run(options: Options) -> Result<Publish, Error> {
    options.validate()?;
    clients::raise_fd_limit(options.concurrency as u64 + FD_MARGIN)?;
    let prefix = unique_topic("publish");
    let topics: Arc<[String]> = (0..options.topics)
        .map(|t| format!("{prefix}.{t}"))
        .collect();
    // Every connection first, so that the clock starts with all of them ready.
    let mut connections = Vec::with_capacity(options.concurrency);
    for _ in 0..options.concurrency {
        connections.push(Connection::open(options.publish_to.addr).await?);
    }
    let meter = Meter::start(&options.watch);
    let started = Instant::now();
    let deadline = started + options.duration;
    let samples_each = MAX_SAMPLES / options.concurrency;
    let size = options.size;
    let make = move |n: usize| {
        body(
            &topics[n % topics.len()],
            &Stamp::now(n as u64).encode(size),
        )
    };
    let total = if options.batch > 1 {
        batches(connections, deadline, options.batch, make, samples_each).await
    } else {
        let sent = back_to_back(
            connections,
            deadline,
            Tally::default(),
            make,
            move |tally: &mut Tally, _, _, took| {
                tally.publishes += 1;
                if tally.latency_us.len() < samples_each {
                    tally.latency_us.push(micros(took));
                }
            },
        )
        .await;
        let mut total = Sent {
            errors: sent.errors,
            first_error: sent.first_error,
            ..Sent::default()
        };
        for tally in sent.tallies {
            total.tally.publishes += tally.publishes;
            total.tally.latency_us.extend(tally.latency_us);
        }
        total
    };
    let Sent {
        tally: mut total,
        errors,
        first_error,
    } = total;
    let elapsed = started.elapsed();
    let cpu = meter.stop();
    Ok(Publish {
        publish_to: options.publish_to.http_url(),
        concurrency: options.concurrency,
        topics: options.topics,
        duration_s: options.duration.as_secs_f64(),
        size_bytes: Stamp::now(0).encode(options.size).len(),
        batch: options.batch,
        publishes: total.publishes,
        errors,
        first_error,
        elapsed_s: elapsed.as_secs_f64(),
        per_second: total.publishes as f64 / elapsed.as_secs_f64(),
        latency: Summary::of(&mut total.latency_us),
        cpu,
    })
}

fn one() -> usize {
    1
}

/// What all workers did.
#[derive(Default)]
struct Sent {
    tally: Tally,
    errors: u64,
    first_error: Option<String>,
}

/// Each connection posts batches of `batch` publishes back to back until
/// `deadline`; the latency is a batch's. A failed batch counts its
/// publishes as errors, and the connection is opened again.
async fn batches(
    connections: Vec<Connection>,
    deadline: Instant,
    batch: usize,
    make: impl Fn(usize) -> bytes::Bytes + Clone + Send + 'static,
    samples_each: usize,
) -> Sent {
    let step = connections.len() * batch;
    let workers: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(w, mut connection)| {
            let make = make.clone();
            tokio::spawn(async move {
                let mut sent = Sent::default();
                let mut number = w * batch;
                while Instant::now() < deadline {
                    let body = batch_body((number..number + batch).map(&make));
                    let started = Instant::now();
                    match connection.publish_batch(body, batch).await {
                        Ok(()) => {
                            sent.tally.publishes += batch as u64;
                            if sent.tally.latency_us.len() < samples_each {
                                sent.tally.latency_us.push(micros(started.elapsed()));
                            }
                        }
                        Err(e) => {
                            sent.errors += batch as u64;
                            sent.first_error.get_or_insert(e.to_string());
                            tokio::time::sleep(crate::publish::RECONNECT_PAUSE).await;
                        }
                    }
                    number += step;
                }
                sent
            })
        })
        .collect();
    let mut total = Sent::default();
    for worker in workers {
        let sent = match worker.await {
            Ok(sent) => sent,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        total.tally.publishes += sent.tally.publishes;
        total.tally.latency_us.extend(sent.tally.latency_us);
        total.errors += sent.errors;
        if total.first_error.is_none() {
            total.first_error = sent.first_error;
        }
    }
    total
}

impl Outcome for Publish {
    const SCENARIO: &'static str = "publish";

    fn rows(&self) -> Vec<Row> {
        let l = &self.latency;
        vec![
            Row::new(
                "target",
                format!(
                    "{} over {} keep-alive connections, {} topics, {} B payload, {} per request",
                    self.publish_to, self.concurrency, self.topics, self.size_bytes, self.batch
                ),
            ),
            Row::new(
                "publishes",
                format!(
                    "{} in {:.2} s ({} errors)",
                    self.publishes, self.elapsed_s, self.errors
                ),
            ),
            Row::new("publishes/s", format!("{:.0}", self.per_second)),
            Row::new(
                "latency p50/p99/max",
                format!(
                    "{} / {} / {} ms",
                    crate::latency::ms(l.p50_us),
                    crate::latency::ms(l.p99_us),
                    crate::latency::ms(l.max_us)
                ),
            ),
            Row::new("CPU", self.cpu.brief()),
        ]
    }

    fn failures(&self) -> Vec<String> {
        match (self.errors, self.publishes) {
            (0, 0) => vec!["nothing was published".to_owned()],
            (0, _) => Vec::new(),
            (n, _) => vec![format!(
                "{n} publishes failed; first: {}",
                self.first_error.as_deref().unwrap_or("?")
            )],
        }
    }
}
