//! `idle`: N connections held for a while with heartbeats running, spread
//! over one or more gateways. What it measures: what a held connection costs
//! a gateway in resident memory (RSS growth over the connections it took,
//! read from `/proc/<pid>/status` of each `--gateway-pid`), and that no
//! connection is lost meanwhile: any close or EOF before the end counts as
//! an unexpected close, and there must be none.
//!
//! `--transport sse` holds server-sent event streams instead (`GET /sse`
//! on the topic; the gateway's heartbeat is a comment, nothing to answer),
//! `--transport stream` HTTP-streaming ones (`POST /stream`, the `sub` by
//! `POST /stream/<session>`): the same figure, bytes per held stream.
//!
//! Every client is a [`crate::raw::Client`] (or a [`crate::streams`] one): a
//! socket, a 512-byte buffer and a
//! task that answers each ping with a pong at once, so tens of thousands fit
//! in one process and none is closed for a missed pong while the others are
//! still connecting. A process may hold only as many clients as it may open
//! file descriptors; past that, the clients are split over several worker
//! processes (this program, re-run with the hidden `__idle-worker`
//! command), each holding a contiguous range of client numbers and
//! reporting to this one over its stdin and stdout, one JSON line each way.
//!
//! Layout: [`holding`] (the clients a process holds), [`workers`] (the
//! worker processes, both ends); the options, the run and its result here.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::unique_topic;
use crate::clients::FD_MARGIN;
use crate::cpu::{Meter, Usage};
use crate::memory::rss_bytes;
use crate::report::{Outcome, Row};
use crate::streams::Transport;
use crate::{Error, Target};

mod holding;
mod workers;

pub use self::holding::{Holding, Tally, hold};
use self::workers::{Part, Report};
pub use self::workers::{Worker, work};

/// Connections held, over all gateways.
pub const DEFAULT_CLIENTS: usize = 1000;
/// How long they are held once all are connected.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(60);
/// Most connections one run holds (over all its processes).
pub const MAX_CLIENTS: usize = 200_000;
/// Most worker processes.
pub const MAX_PROCESSES: usize = 64;
/// Each client's read buffer: an idle client reads pings, `welcome` and `ok`.
const BUFFER_BYTES: usize = 512;
/// Unexpected closes whose reason the result lists.
const CLOSES_LISTED: usize = 5;
/// Longest a worker process may take to connect its share.
const WORKER_CONNECT_BUDGET: Duration = Duration::from_secs(600);
/// How long past the hold a worker waits to be told to stop before it
/// stops by itself (the parent is gone or stuck).
const WORKER_GRACE: Duration = Duration::from_secs(60);
/// The hidden command a worker process runs.
pub const WORKER_COMMAND: &str = "__idle-worker";

#[derive(Debug, Clone)]
pub struct Options {
    /// Client `i` connects to `gateways[i % len]`.
    pub gateways: Vec<Target>,
    /// The gateways' process ids, in the order of `gateways`; empty: no
    /// memory figures.
    pub gateway_pids: Vec<u32>,
    pub clients: usize,
    pub duration: Duration,
    /// Worker processes holding the clients; 0: as few as this process's
    /// file-descriptor limit allows (1: all in this process).
    pub processes: usize,
    /// The topic every client subscribes to; a fresh one when `None`.
    pub topic: Option<String>,
    /// Other local processes (redis) whose CPU time to report.
    pub watch: Vec<u32>,
    /// The program a worker runs (default: this one). Tests name the
    /// `herald-loadtest` binary, as their own program is the test harness.
    pub worker_program: Option<PathBuf>,
    /// The clients' transport.
    pub transport: Transport,
    /// Offer permessage-deflate, as a browser does: what an idle connection
    /// costs with compression negotiated.
    pub compression: bool,
}

/// Whether this process's clients offer permessage-deflate: set once by
/// `run` (from `Options::compression`) or a worker (from its command line),
/// before any client connects.
static COMPRESSION: AtomicBool = AtomicBool::new(false);

impl Options {
    pub fn new(gateway: Target) -> Self {
        Self {
            gateways: vec![gateway],
            gateway_pids: Vec::new(),
            clients: DEFAULT_CLIENTS,
            duration: DEFAULT_DURATION,
            processes: 0,
            compression: false,
            topic: None,
            watch: Vec::new(),
            worker_program: None,
            transport: Transport::Ws,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        super::check_bounds(self.duration, 0)?;
        let bad = |m: String| Err(Error::Options(m));
        if self.gateways.is_empty() {
            return bad("give at least one --gateway".to_owned());
        }
        if !self.gateway_pids.is_empty() && self.gateway_pids.len() != self.gateways.len() {
            return bad(format!(
                "{} --gateway-pid for {} --gateway: give one per gateway, in the same order",
                self.gateway_pids.len(),
                self.gateways.len()
            ));
        }
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return bad(format!("--clients must be 1 to {MAX_CLIENTS}"));
        }
        if self.processes > MAX_PROCESSES {
            return bad(format!("--processes must be 0 (auto) to {MAX_PROCESSES}"));
        }
        Ok(())
    }

    /// How many processes hold the clients: as asked, or as few as the
    /// hard file-descriptor limit allows.
    fn process_count(&self) -> usize {
        if self.processes > 0 {
            return self.processes.min(self.clients);
        }
        let hard = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(_, hard)| hard);
        let each = hard.saturating_sub(FD_MARGIN).max(1) as usize;
        self.clients.div_ceil(each)
    }
}

/// Where the clients are held: here, or in worker processes.
enum Holders {
    Here(Holding),
    Workers(Vec<Part>),
}

/// The result of an `idle` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Idle {
    /// The clients' transport (results from before it was a choice: `ws`).
    #[serde(default)]
    pub transport: Transport,
    pub topic: String,
    pub clients: usize,
    pub processes: usize,
    pub duration_s: f64,
    /// Time to connect and subscribe every client.
    pub connect_s: f64,
    /// Pings the clients answered while connected (heartbeats ran).
    pub pings_answered: u64,
    /// Closes and EOFs before the end; must be 0.
    pub unexpected_closes: u64,
    pub closes: Vec<String>,
    pub pods: Vec<Pod>,
    /// This tool's resident memory holding the clients (its worker
    /// processes' when there are some), at the end of the hold.
    pub loadtest_rss_bytes: u64,
    /// Over the pods with a pid: RSS growth from before connecting to the
    /// end of the hold, divided by their connections.
    pub rss_per_connection_bytes: Option<f64>,
    /// CPU during the hold.
    pub cpu: Usage,
}

/// One gateway's share.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pod {
    pub gateway: String,
    pub pid: Option<u32>,
    pub connections: u64,
    pub unexpected_closes: u64,
    /// Resident memory before any client connected, once all were
    /// subscribed, and at the end of the hold.
    pub rss_before_bytes: Option<u64>,
    pub rss_connected_bytes: Option<u64>,
    pub rss_end_bytes: Option<u64>,
    /// `(connected − before) / connections`.
    pub rss_per_connection_connected_bytes: Option<f64>,
    /// `(end − before) / connections`.
    pub rss_per_connection_end_bytes: Option<f64>,
}

pub async fn run(options: Options) -> Result<Idle, Error> {
    options.validate()?;
    COMPRESSION.store(options.compression, Ordering::Relaxed);
    let topic = options
        .topic
        .clone()
        .unwrap_or_else(|| unique_topic("idle"));
    let processes = options.process_count();
    let rss = |pids: &[u32]| -> Vec<Option<u64>> { pids.iter().map(|&p| rss_bytes(p)).collect() };
    let before = rss(&options.gateway_pids);

    let connecting = Instant::now();
    let holders = if processes <= 1 {
        Holders::Here(
            hold(
                &options.gateways,
                0,
                options.clients,
                &topic,
                options.transport,
            )
            .await?,
        )
    } else {
        let program = match &options.worker_program {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .map_err(|e| Error::Options(format!("finding this program: {e}")))?,
        };
        let max_hold = options.duration + WORKER_GRACE;
        let mut parts = Vec::with_capacity(processes);
        let each = options.clients.div_ceil(processes);
        for first in (0..options.clients).step_by(each) {
            let worker = Worker {
                gateways: options.gateways.clone(),
                first,
                clients: each.min(options.clients - first),
                topic: topic.clone(),
                max_hold,
                transport: options.transport,
                compression: options.compression,
            };
            parts.push(Part::start(&program, &worker)?);
        }
        for part in &mut parts {
            match part.report(WORKER_CONNECT_BUDGET).await? {
                Report::Connected => {}
                Report::Failed { error } => return Err(Error::Worker(error)),
                other => {
                    return Err(Error::Worker(format!("said {other:?} while connecting")));
                }
            }
        }
        Holders::Workers(parts)
    };
    let connect = connecting.elapsed();
    let connected = rss(&options.gateway_pids);

    // The gateways, the other processes named, and the workers (whose CPU
    // is this tool's, spent in other processes).
    let mut watch = options.gateway_pids.clone();
    watch.extend(
        options
            .watch
            .iter()
            .filter(|p| !watch.contains(p))
            .collect::<Vec<_>>(),
    );
    if let Holders::Workers(parts) = &holders {
        watch.extend(parts.iter().filter_map(|p| p.child.id()));
    }
    let meter = Meter::start(&watch);
    tokio::time::sleep(options.duration).await;
    let end = rss(&options.gateway_pids);
    let cpu = meter.stop();

    let mut tally = Tally::default();
    match holders {
        Holders::Here(holding) => tally.add(holding.finish()),
        Holders::Workers(parts) => {
            // Stop them all at once; then gather.
            let finishing: Vec<_> = parts
                .into_iter()
                .map(|p| tokio::spawn(p.finish()))
                .collect();
            for f in finishing {
                match f.await {
                    Ok(t) => tally.add(t?),
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                }
            }
        }
    }

    let per = |later: Option<u64>, earlier: Option<u64>, n: u64| match (later, earlier) {
        (Some(l), Some(e)) if n > 0 => Some((l as f64 - e as f64) / n as f64),
        _ => None,
    };
    let pods: Vec<Pod> = options
        .gateways
        .iter()
        .enumerate()
        .map(|(g, target)| {
            let n = tally.connected.get(g).copied().unwrap_or(0);
            let at = |v: &[Option<u64>]| v.get(g).copied().flatten();
            Pod {
                gateway: target.ws_url(),
                pid: options.gateway_pids.get(g).copied(),
                connections: n,
                unexpected_closes: tally.closed.get(g).copied().unwrap_or(0),
                rss_before_bytes: at(&before),
                rss_connected_bytes: at(&connected),
                rss_end_bytes: at(&end),
                rss_per_connection_connected_bytes: per(at(&connected), at(&before), n),
                rss_per_connection_end_bytes: per(at(&end), at(&before), n),
            }
        })
        .collect();
    let measured: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.rss_end_bytes.is_some() && p.rss_before_bytes.is_some())
        .collect();
    let rss_per_connection_bytes = per(
        Some(measured.iter().filter_map(|p| p.rss_end_bytes).sum()),
        Some(measured.iter().filter_map(|p| p.rss_before_bytes).sum()),
        measured.iter().map(|p| p.connections).sum(),
    )
    .filter(|_| !measured.is_empty());

    Ok(Idle {
        transport: options.transport,
        topic,
        clients: options.clients,
        processes: processes.max(1),
        duration_s: options.duration.as_secs_f64(),
        connect_s: connect.as_secs_f64(),
        pings_answered: tally.pings,
        unexpected_closes: tally.closed.iter().sum(),
        closes: tally.closes,
        loadtest_rss_bytes: tally.holders_rss_bytes,
        pods,
        rss_per_connection_bytes,
        cpu,
    })
}

/// Bytes as KiB with one decimal.
fn kib(bytes: f64) -> String {
    format!("{:.1} KiB", bytes / 1024.0)
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("?".to_owned(), |b| format!("{:.1}", b as f64 / 1_048_576.0))
}

impl Outcome for Idle {
    const SCENARIO: &'static str = "idle";

    fn rows(&self) -> Vec<Row> {
        let mut rows = vec![
            Row::new(
                "clients",
                format!(
                    "{} ({}) in {} process(es) on topic {}, connected and subscribed in {:.2} s",
                    self.clients,
                    self.transport.name(),
                    self.processes,
                    self.topic,
                    self.connect_s
                ),
            ),
            Row::new("held", format!("{:.0} s", self.duration_s)),
            Row::new("pings answered (heartbeats read)", self.pings_answered),
            Row::new("unexpected closes", self.unexpected_closes),
            Row::new(
                "gateway RSS per connection",
                self.rss_per_connection_bytes
                    .map_or("no --gateway-pid given".to_owned(), kib),
            ),
        ];
        for p in &self.pods {
            let memory = match (p.pid, p.rss_per_connection_end_bytes) {
                (Some(pid), Some(per)) => format!(
                    "; pid {pid} RSS {} -> {} -> {} MiB (before, connected, end): {} per connection \
                     ({} once connected)",
                    mib(p.rss_before_bytes),
                    mib(p.rss_connected_bytes),
                    mib(p.rss_end_bytes),
                    kib(per),
                    p.rss_per_connection_connected_bytes
                        .map_or("?".to_owned(), kib)
                ),
                (Some(pid), None) => format!("; pid {pid}: no RSS read"),
                _ => String::new(),
            };
            rows.push(Row::new(
                format!("  {}", p.gateway),
                format!(
                    "{} connections, {} closed{memory}",
                    p.connections, p.unexpected_closes
                ),
            ));
        }
        rows.push(Row::new(
            "loadtest RSS",
            format!(
                "{} MiB holding the clients ({:.1} KiB per client)",
                mib(Some(self.loadtest_rss_bytes)),
                self.loadtest_rss_bytes as f64 / 1024.0 / self.clients as f64
            ),
        ));
        rows.push(Row::new("CPU during the hold", self.cpu.brief()));
        rows
    }

    fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.unexpected_closes > 0 {
            failures.push(format!(
                "{} unexpected closes: {}",
                self.unexpected_closes,
                self.closes.join("; ")
            ));
        }
        failures
    }
}
