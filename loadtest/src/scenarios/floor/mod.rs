//! `floor`: the same S-byte frames as a gateway's `msg`, written to N plain
//! loopback TCP sockets by one thread, with no framework at all: blocking
//! `write` calls, one socket after another, each round's frame encoded
//! once. What that costs is the kernel's part of a fan-out on this machine,
//! the yardstick for [`fanout`].
//!
//! N writing sockets and N reading ends would not fit in one process's
//! file descriptors at N = 10,000, so the readers run in a second process:
//! this tool again (`herald-loadtest __floor-readers`, not in `--help`). They
//! are the clients `fanout` uses (tokio-tungstenite, the same reading and
//! the same stamp), on connections that speak WebSocket from the first byte:
//! each notes the time from the round's stamp to having read the whole
//! frame; a round's maximum is its last client. The writer thread counts its
//! own CPU time per round (`/proc/thread-self/schedstat`).
//!
//! The exchange with the readers' process: it connects to the writer's
//! listener, prints `ready` once every reader runs, and, after the writer
//! has closed every socket (or at its deadline), one line of JSON
//! ([`ReadersReport`]).
//!
//! Layout: the options, the writer and the result here; [`mod@readers`]
//! (the readers' process, both ends).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::time::Instant;

use self::readers::ReadersProcess;
use super::fanout::{self, Round, Stats};
use super::{MAX_DURATION, check_bounds, unique_topic};
use crate::Error;
use crate::clients::{self, FD_MARGIN};
use crate::cpu::thread_seconds;
use crate::latency::{Stamp, Summary, micros, ms};
use crate::report::{Outcome, Row};

mod readers;

pub use self::readers::{Readers, ReadersReport, readers};

/// The hidden sub-command that runs the readers.
pub const READERS_COMMAND: &str = "__floor-readers";

/// The writer's first frame on each connection, which its reader waits for
/// before it connects the next: readers that ran ahead of the accepts would
/// overflow the listener's backlog, and the kernel would then drop
/// connections their readers believe open.
const GREETING: &str = r#"{"op":"welcome"}"#;

/// Longest one blocking write to one socket may take: a reader that stopped
/// reading fails the run instead of hanging it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the readers' process may take to connect every reader.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest the readers' process may take to exit after its report.
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// Beyond the rounds and the drain: the readers' process starting and
/// reporting.
const REPORT_MARGIN: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct Options {
    pub clients: usize,
    /// Measured rounds, after the warm-up.
    pub rounds: usize,
    pub interval: Duration,
    /// Payload bytes, as `fanout` sends them.
    pub size: usize,
    pub warmup: usize,
    /// After the last round, how long the readers may take to finish.
    pub drain: Duration,
    /// The `herald-loadtest` executable that runs the readers.
    pub readers_exe: PathBuf,
}

impl Options {
    /// `fanout`'s defaults, the readers run by `readers_exe`.
    pub fn new(readers_exe: PathBuf) -> Self {
        Self {
            clients: fanout::DEFAULT_CLIENTS,
            rounds: fanout::DEFAULT_ROUNDS,
            interval: fanout::DEFAULT_INTERVAL,
            size: super::DEFAULT_SIZE,
            warmup: fanout::DEFAULT_WARMUP,
            drain: fanout::DEFAULT_DRAIN,
            readers_exe,
        }
    }

    /// The floor of a `fanout` run: its clients, rounds, interval and size.
    pub fn like(run: &fanout::Options, readers_exe: PathBuf) -> Self {
        Self {
            clients: run.clients,
            rounds: run.rounds,
            interval: run.interval,
            size: run.size,
            warmup: run.warmup,
            drain: run.drain,
            readers_exe,
        }
    }

    fn total(&self) -> usize {
        self.warmup + self.rounds
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Options(m));
        if self.clients == 0 || self.clients > fanout::MAX_CLIENTS {
            return bad(format!("--clients must be 1 to {}", fanout::MAX_CLIENTS));
        }
        if self.rounds == 0 {
            return bad("--rounds must be at least 1".to_owned());
        }
        if self.interval < fanout::MIN_INTERVAL {
            return bad(format!(
                "--interval must be at least {:?}",
                fanout::MIN_INTERVAL
            ));
        }
        if self.drain > MAX_DURATION {
            return bad("--drain is too long".to_owned());
        }
        if self.total() as u64 * self.clients as u64 > fanout::MAX_PAIRS {
            return bad("clients x rounds is too large".to_owned());
        }
        check_bounds(self.interval.saturating_mul(self.total() as u32), self.size)
    }

    /// How long the readers wait at most, from their start.
    fn readers_deadline(&self) -> Duration {
        READY_TIMEOUT + self.interval.saturating_mul(self.total() as u32) + self.drain
    }
}

/// The result of a `floor` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Floor {
    pub clients: usize,
    pub rounds: usize,
    pub warmup_rounds: usize,
    pub interval_s: f64,
    /// Bytes of one frame on the wire, WebSocket header included.
    pub frame_bytes: usize,
    /// Time for the readers' process to start and connect every reader.
    pub connect_s: f64,
    pub deliveries_expected: u64,
    pub deliveries: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub unexpected: u64,
    /// Readers whose connection failed (not closed by the writer at the end).
    pub failed_readers: u64,
    /// Over the measured rounds, at the readers.
    #[serde(flatten)]
    pub stats: Stats,
    /// Time for the writer thread to write one round to every socket.
    pub write_time: Summary,
    /// The writer thread's CPU seconds per measured round.
    pub writer_cpu_per_round_s: f64,
    /// Every round, warm-up included.
    pub per_round: Vec<FloorRound>,
    /// Why the writer stopped early, if it did.
    pub write_error: Option<String>,
}

/// One round: the readers' figures and the writer's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FloorRound {
    #[serde(flatten)]
    pub readers: Round,
    /// Time to write the frame to every socket.
    pub write_us: u32,
    /// The writer thread's CPU time in that.
    pub write_cpu_us: u32,
}

/// Runs the floor: starts the readers' process, accepts its connections,
/// writes the rounds from one thread, and merges the readers' report.
pub async fn run(options: Options) -> Result<Floor, Error> {
    options.validate()?;
    clients::raise_fd_limit(options.clients as u64 + FD_MARGIN)?;
    let fail =
        |what: &str, e: &dyn std::fmt::Display| Error::Options(format!("floor: {what}: {e}"));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| fail("listening on loopback", &e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| fail("listener address", &e))?;
    let total = options.total();
    let started = Instant::now();
    let mut readers = ReadersProcess::spawn(&options, addr)?;

    // Every reader's connection. The readers' process may say `ready` before
    // the last are accepted (a connection is complete in the backlog).
    let mut sockets = Vec::with_capacity(options.clients);
    let mut ready = false;
    let deadline = Instant::now() + READY_TIMEOUT;
    while sockets.len() < options.clients || !ready {
        tokio::select! {
            accepted = tokio::time::timeout_at(deadline, listener.accept()),
                if sockets.len() < options.clients =>
            {
                let (stream, _) = accepted
                    .map_err(|_| fail("readers", &"not all connected in time"))?
                    .map_err(|e| fail("accept", &e))?;
                let mut socket = blocking(stream).map_err(|e| fail("a reader's socket", &e))?;
                // A few bytes into an empty socket: this never blocks.
                socket
                    .write_all(&text_frame(GREETING.as_bytes()))
                    .map_err(|e| fail("greeting a reader", &e))?;
                sockets.push(socket);
            }
            line = tokio::time::timeout_at(deadline, readers.line()), if !ready => {
                match line {
                    Ok(Some(line)) if line == "ready" => ready = true,
                    Ok(line) => {
                        return Err(fail("readers' process", &format!("said {line:?}, not ready")));
                    }
                    Err(_) => return Err(fail("readers' process", &"not ready in time")),
                }
            }
        }
    }
    drop(listener);
    let connect_s = started.elapsed().as_secs_f64();

    let plan = Plan {
        total,
        interval: options.interval,
        size: options.size,
        topic: unique_topic("floor"),
    };
    let frame_bytes = plan.frame(&Stamp::now(0), 0).len();
    let (written, write_error) = tokio::task::spawn_blocking(move || plan.write(sockets))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));

    let report = match tokio::time::timeout(options.drain + REPORT_MARGIN, readers.line()).await {
        Ok(Some(line)) => serde_json::from_str::<ReadersReport>(&line)
            .map_err(|e| fail("readers' report", &format!("{e}: {line}")))?,
        Ok(None) => return Err(fail("readers' process", &"ended without a report")),
        Err(_) => return Err(fail("readers' process", &"no report in time")),
    };
    readers.finish().await;

    let measured: Vec<&Written> = written.iter().skip(options.warmup).collect();
    let mut write_us: Vec<u32> = measured.iter().map(|w| w.wall_us).collect();
    let cpu_s: f64 = measured.iter().map(|w| f64::from(w.cpu_us) / 1e6).sum();
    let per_round = report
        .per_round
        .into_iter()
        .enumerate()
        .map(|(i, readers)| FloorRound {
            readers,
            write_us: written.get(i).map_or(0, |w| w.wall_us),
            write_cpu_us: written.get(i).map_or(0, |w| w.cpu_us),
        })
        .collect();
    Ok(Floor {
        clients: options.clients,
        rounds: options.rounds,
        warmup_rounds: options.warmup,
        interval_s: options.interval.as_secs_f64(),
        frame_bytes,
        connect_s,
        deliveries_expected: report.tally.expected,
        deliveries: report.tally.delivered,
        lost: report.tally.lost,
        duplicated: report.tally.duplicated,
        unexpected: report.tally.unexpected,
        failed_readers: report.failed,
        stats: report.stats,
        write_time: Summary::of(&mut write_us),
        writer_cpu_per_round_s: if measured.is_empty() {
            0.0
        } else {
            cpu_s / measured.len() as f64
        },
        per_round,
        write_error: write_error.or(report.first_failure.map(|f| format!("a reader: {f}"))),
    })
}

/// A reader's connection as the writer thread uses it: blocking, no Nagle,
/// each write bounded by [`WRITE_TIMEOUT`].
fn blocking(stream: tokio::net::TcpStream) -> std::io::Result<std::net::TcpStream> {
    stream.set_nodelay(true)?;
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    Ok(stream)
}

/// What the writer thread writes.
struct Plan {
    total: usize,
    interval: Duration,
    size: usize,
    topic: String,
}

/// One round, as the writer saw it.
#[derive(Debug, Clone, Copy)]
struct Written {
    wall_us: u32,
    cpu_us: u32,
}

impl Plan {
    /// The `msg` frame of round `round`: a gateway's, byte for byte in form
    /// (`proto::json::encode_msg_prefix`), in an unmasked WebSocket text frame.
    fn frame(&self, stamp: &Stamp, round: usize) -> Vec<u8> {
        let topic = serde_json::to_string(&self.topic).unwrap_or_default();
        let json = format!(
            r#"{{"op":"msg","topic":{topic},"seq":{},"data":{}}}"#,
            round + 1,
            stamp.encode(self.size)
        );
        text_frame(json.as_bytes())
    }

    /// Writes every round to every socket from this thread, on schedule,
    /// then a close frame to each. A failed write ends the run.
    fn write(self, mut sockets: Vec<std::net::TcpStream>) -> (Vec<Written>, Option<String>) {
        let start = std::time::Instant::now();
        let mut written = Vec::with_capacity(self.total);
        for round in 0..self.total {
            let at = start + self.interval.saturating_mul(round as u32);
            if let Some(wait) = at.checked_duration_since(std::time::Instant::now()) {
                // The schedule, not a synchronisation: rounds are `interval` apart.
                std::thread::sleep(wait);
            }
            let stamp = Stamp::now(round as u64);
            let cpu_before = thread_seconds();
            let wall = std::time::Instant::now();
            let frame = self.frame(&stamp, round);
            for (i, socket) in sockets.iter_mut().enumerate() {
                if let Err(e) = socket.write_all(&frame) {
                    return (written, Some(format!("round {round}, socket {i}: {e}")));
                }
            }
            let cpu = match (cpu_before, thread_seconds()) {
                (Some(a), Some(b)) => Duration::from_secs_f64((b - a).max(0.0)),
                _ => Duration::ZERO,
            };
            written.push(Written {
                wall_us: micros(wall.elapsed()),
                cpu_us: micros(cpu),
            });
        }
        // A close frame (1000) ends each reader as a gateway's close would;
        // after it, dropping the sockets closes them.
        let close = [0x88, 0x02, 0x03, 0xE8];
        for (i, socket) in sockets.iter_mut().enumerate() {
            if let Err(e) = socket.write_all(&close) {
                return (written, Some(format!("close frame, socket {i}: {e}")));
            }
        }
        (written, None)
    }
}

/// An unmasked, unfragmented WebSocket text frame (RFC 6455 §5.2).
fn text_frame(payload: &[u8]) -> Vec<u8> {
    crate::raw::encode(crate::raw::FIN | crate::raw::OP_TEXT, payload, None)
}

impl Floor {
    /// What must be zero.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if let Some(e) = &self.write_error {
            failures.push(format!("writing stopped: {e}"));
        }
        if self.lost > 0 {
            failures.push(format!("{} frames not read", self.lost));
        }
        if self.duplicated + self.unexpected > 0 {
            failures.push(format!(
                "{} duplicated, {} unexpected frames",
                self.duplicated, self.unexpected
            ));
        }
        if self.failed_readers > 0 {
            failures.push(format!("{} readers failed", self.failed_readers));
        }
        failures
    }
}

impl Outcome for Floor {
    const SCENARIO: &'static str = "floor";

    fn rows(&self) -> Vec<Row> {
        let l = &self.stats.latency;
        vec![
            Row::new(
                "writer",
                format!(
                    "one thread, blocking writes to {} loopback sockets: {} rounds ({} warm-up) {} ms apart, {} B frames",
                    self.clients,
                    self.rounds + self.warmup_rounds,
                    self.warmup_rounds,
                    self.interval_s * 1000.0,
                    self.frame_bytes
                ),
            ),
            Row::new("readers connected in", format!("{:.2} s", self.connect_s)),
            Row::new(
                "deliveries",
                format!("{} of {}", self.deliveries, self.deliveries_expected),
            ),
            Row::new(
                "latency p50/p90/p99/max",
                format!(
                    "{} / {} / {} / {} ms over {} pairs",
                    ms(l.p50_us),
                    ms(l.p90_us),
                    ms(l.p99_us),
                    ms(l.max_us),
                    l.count
                ),
            ),
            Row::new(
                "last client median/p99/worst",
                fanout::last_client_row(&self.stats),
            ),
            Row::new("time per round p50/p99/max", self.write_time.brief()),
            Row::new(
                "writer CPU per round",
                format!("{:.1} ms", self.writer_cpu_per_round_s * 1000.0),
            ),
        ]
    }

    fn failures(&self) -> Vec<String> {
        Floor::failures(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_their_length_as_rfc_6455_says() {
        assert_eq!(text_frame(b"hi"), vec![0x81, 2, b'h', b'i']);
        let mid = text_frame(&[b'x'; 1024]);
        assert_eq!(&mid[..4], &[0x81, 126, 4, 0]);
        assert_eq!(mid.len(), 1028);
        let big = text_frame(&vec![b'x'; 70_000]);
        assert_eq!(&big[..2], &[0x81, 127]);
        assert_eq!(
            u64::from_be_bytes(big[2..10].try_into().expect("8")),
            70_000
        );
    }

    #[test]
    fn a_round_is_a_gateway_msg_with_the_stamp() {
        let plan = Plan {
            total: 1,
            interval: Duration::from_millis(1),
            size: 1024,
            topic: "t".to_owned(),
        };
        let stamp = Stamp { t: 5, i: 3 };
        let frame = plan.frame(&stamp, 3);
        let json: serde_json::Value = serde_json::from_slice(&frame[4..]).expect("JSON");
        assert_eq!(json["op"], "msg");
        assert_eq!(json["seq"], 4);
        let back: Stamp = serde_json::from_value(json["data"].clone()).expect("stamp");
        assert_eq!(back, stamp);
    }
}
