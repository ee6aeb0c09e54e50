//! `slow`: [`fanout`] in two phases on the same clients: R rounds as they
//! are, then K more clients join that never read (a small `SO_RCVBUF`, set
//! before connecting, and no read after the `ok` of their `sub`), and R
//! rounds more. It reports the healthy clients' figures without and with
//! them, when the gateway closed each slow client, and the watched
//! processes' memory round by round.
//!
//! When was a slow client closed? It cannot see the close frame it does not
//! read, and the TCP close waits behind the bytes it has not read either. So
//! the gateways' `/metrics` are read every [`POLL`] while the slow clients
//! are connected: each rise of `herald_connections_closed_total` with reason
//! `write_timeout` or `slow_consumer` is a slow client closed between two
//! reads ([`CloseEvent`], `seen_after_s` late by at most [`POLL`]). After
//! the run each slow client reads what it was sent: if the stream ends
//! (EOF, reset) the gateway closed it, and the last whole frame it got says
//! which round's write was stuck: the next one. `blocked_for_s`, from that
//! round's start to the close seen, is then an upper bound of how long the
//! gateway let the write hang before closing. Closes are matched to slow
//! clients per gateway in order (the one that got fewest rounds first).
//!
//! Layout: the options, the run and the result here; [`closes`] (the
//! close counters watched, and closes matched to slow clients).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use self::closes::{Watcher, match_closes};
use super::catch_up::{self, CatchUp, RssBeforeAfter};
use super::fanout::engine::Engine;
use super::fanout::{self, Fanout, Stats};
use crate::Error;
use crate::clients::{Received, Subscriber};
use crate::latency::ms;
use crate::report::{Outcome, Row};

mod closes;

/// Clients that never read.
pub const DEFAULT_SLOW: usize = 1;
/// Their receive buffer (`SO_RCVBUF`; Linux doubles it).
pub const DEFAULT_RECV_BUFFER: u32 = 4096;
/// After the last round, how long to wait for slow clients' closes: a
/// `websocket.write_timeout` of 5 s (bench.sh's `slow` part sets it; the
/// default is 30 s), 1 s, and a poll.
pub const DEFAULT_CLOSE_WAIT: Duration = Duration::from_secs(7);
/// Most slow clients.
pub const MAX_SLOW: usize = 1000;
/// Between two reads of the gateways' metrics.
pub const POLL: Duration = Duration::from_millis(100);
/// The close reasons of a client that does not keep up (docs/metrics.md).
pub const SLOW_REASONS: [&str; 2] = ["write_timeout", "slow_consumer"];
/// After the run, longest a slow client may take to read what it was sent.
const SLOW_DRAIN: Duration = Duration::from_secs(10);
/// Between two looks at the slow clients' reading after the run.
const DRAIN_POLL: Duration = Duration::from_millis(5);
/// With `--catch-up`: longest the slow clients may take to catch up once
/// they read again.
pub const DEFAULT_CATCH_UP_WAIT: Duration = Duration::from_secs(120);
/// The round of the slow phase from which memory should stay flat.
pub const RSS_FROM_ROUND: usize = 5;

#[derive(Debug, Clone)]
pub struct Options {
    /// The healthy clients and the rounds of each phase.
    pub fanout: fanout::Options,
    /// Clients that never read.
    pub slow: usize,
    pub recv_buffer: u32,
    pub close_wait: Duration,
    /// The slow clients read again after the slow phase, while this many
    /// rounds more go out ([`catch_up`]); `None`: they never read.
    pub catch_up: Option<usize>,
    /// ... and may take this long to have every round.
    pub catch_up_wait: Duration,
}

impl Options {
    /// The defaults, with the healthy clients and rounds of `fanout`.
    pub fn new(fanout: fanout::Options) -> Self {
        Self {
            fanout,
            slow: DEFAULT_SLOW,
            recv_buffer: DEFAULT_RECV_BUFFER,
            close_wait: DEFAULT_CLOSE_WAIT,
            catch_up: None,
            catch_up_wait: DEFAULT_CATCH_UP_WAIT,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        self.fanout.validate(self.fanout.rounds)?;
        // No slow client at all only as the baseline of a catch-up run:
        // the same rounds, for the healthy clients' latency without them.
        let least = usize::from(self.catch_up.is_none());
        if self.slow < least || self.slow > MAX_SLOW {
            return Err(Error::Options(format!(
                "--slow must be {least} to {MAX_SLOW}"
            )));
        }
        if self.recv_buffer == 0 {
            return Err(Error::Options("--recv-buffer must be over 0".to_owned()));
        }
        if self.close_wait > super::MAX_DURATION || self.catch_up_wait > super::MAX_DURATION {
            return Err(Error::Options(
                "--close-wait or --catch-up-wait is too long".to_owned(),
            ));
        }
        if self
            .catch_up
            .is_some_and(|after| after == 0 || after > self.fanout.rounds.max(1000))
        {
            return Err(Error::Options(
                "--catch-up needs 1 to max(--rounds, 1000) rounds after the pause".to_owned(),
            ));
        }
        Ok(())
    }
}

/// The result of a `slow` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Slow {
    /// Both phases, healthy clients only (its `latency`, `last_client` and
    /// `round_p99` span both).
    pub run: Fanout,
    /// Rounds of each phase.
    pub without_rounds: Range<usize>,
    pub with_rounds: Range<usize>,
    /// The healthy clients before the slow ones joined.
    pub without: Stats,
    /// The healthy clients with the slow ones.
    pub with: Stats,
    /// p99 over all (round, healthy client) pairs, with over without.
    pub p99_with_over_without: f64,
    /// Last client p99 over rounds, with over without.
    pub last_client_p99_with_over_without: f64,
    pub slow_clients: Vec<SlowClient>,
    /// Every close the gateways counted while the slow clients were there.
    pub closes: Vec<CloseEvent>,
    /// The first failure to read a gateway's metrics, if any.
    pub scrape_error: Option<String>,
    /// Each watched process's memory from the slow phase's round
    /// [`RSS_FROM_ROUND`] on.
    pub rss: Vec<RssGrowth>,
    /// With `--catch-up`: what the slow clients came to once they read again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<CatchUp>,
}

/// One client that never read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlowClient {
    pub client: usize,
    pub gateway: String,
    /// Rounds published while it was subscribed.
    pub rounds_sent: u64,
    /// Of those, the frames it could read after the run.
    pub rounds_received: u64,
    /// The last round it got whole.
    pub last_round: Option<usize>,
    /// The gateway ended its connection.
    pub closed: bool,
    /// How its reading ended after the run.
    pub end: String,
    /// The close's reason, as counted by the gateway.
    pub reason: Option<String>,
    /// From the slow phase's first round to the close seen in the metrics.
    pub closed_after_s: Option<f64>,
    /// From the start of the round whose write to it was stuck to the close
    /// seen: an upper bound of how long the gateway let the write hang.
    pub blocked_for_s: Option<f64>,
}

/// A rise of `herald_connections_closed_total` seen on a gateway.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CloseEvent {
    pub gateway: String,
    pub reason: String,
    /// From the slow phase's first round to the read that showed it.
    pub seen_after_s: f64,
    /// ... and to the read before, which did not.
    pub not_before_s: f64,
    #[serde(skip)]
    seen_us: u64,
    #[serde(skip)]
    gateway_index: usize,
}

/// A watched process's resident memory over the slow phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RssGrowth {
    pub pid: u32,
    pub name: String,
    /// At the start of the slow phase's round [`RSS_FROM_ROUND`].
    pub from_bytes: Option<u64>,
    /// The most after it, to the end of the run.
    pub max_after_bytes: Option<u64>,
    /// `max_after / from - 1`.
    pub growth: Option<f64>,
}

/// Runs both phases, watches the gateways' closes while the slow clients
/// are there, then lets each slow client read what it was sent.
pub async fn run(options: Options) -> Result<Slow, Error> {
    options.validate()?;
    let f = &options.fanout;
    let without = f.warmup..f.warmup + f.rounds;
    let with = without.end..without.end + f.rounds;
    let after = with.end..with.end + options.catch_up.unwrap_or(0);
    let total = after.end;
    let extra_fds = (options.slow + f.gateways.len()) as u64;
    let mut engine = Engine::connect(f, total, "slow", extra_fds).await?;
    engine.rounds(0..without.end).await;

    let rss_before: Vec<(u32, Option<u64>)> = f
        .watch
        .iter()
        .map(|&pid| (pid, crate::memory::rss_bytes(pid)))
        .collect();
    let mut watcher = Watcher::start(&f.gateways).await;
    let mut slow = Vec::with_capacity(options.slow);
    for k in 0..options.slow {
        let client = f.clients + k;
        let gateway = client % f.gateways.len();
        slow.push(
            Subscriber::open_with(
                client,
                gateway,
                &f.gateways[gateway],
                engine.topic_of(client),
                Some(options.recv_buffer),
            )
            .await?,
        );
    }

    engine.rounds(with.clone()).await;
    // With `--catch-up`: they read again now, while the last rounds go out.
    let reading_from = Instant::now();
    let (reading, slow) = match options.catch_up {
        Some(_) => (Some(Reading::start(slow, total, with.start)), Vec::new()),
        None => (None, slow),
    };
    engine.rounds(after.clone()).await;
    engine.drain().await;
    let (reading, caught_up_s) = match reading {
        Some(reading) => {
            let done = reading.wait(options.catch_up_wait).await;
            (
                Some(reading),
                done.then(|| reading_from.elapsed().as_secs_f64()),
            )
        }
        None => {
            watcher
                .wait_for_slow_closes(options.slow as u64, options.close_wait)
                .await;
            (None, None)
        }
    };
    // Before the slow clients go: their own closes are not the gateway's.
    let (events, scrape_error) = watcher.stop().await;
    let received = match reading {
        Some(reading) => Some(reading.finish().await),
        None => None,
    };
    let round_starts = engine.round_starts.clone();
    let finished = engine.finish().await;
    let lag_metrics = match &received {
        Some(_) => catch_up::lag_metrics(&f.gateways).await,
        None => Default::default(),
    };
    let catch_up = received.as_ref().map(|received| {
        let rss = rss_before
            .iter()
            .map(|&(pid, before)| RssBeforeAfter {
                pid,
                name: finished
                    .result
                    .processes
                    .iter()
                    .find(|p| p.pid == pid)
                    .map_or_else(String::new, |p| p.name.clone()),
                before_bytes: before,
                after_bytes: crate::memory::rss_bytes(pid),
            })
            .collect();
        catch_up::summarise(
            received,
            with.clone(),
            after.clone(),
            caught_up_s,
            rss,
            lag_metrics,
        )
    });
    let received = match received {
        Some(received) => received,
        None => read_what_was_sent(slow, total, with.start).await,
    };

    let phase_start = round_starts.get(with.start).copied().flatten().unwrap_or(0);
    let at = |us: u64| us.saturating_sub(phase_start) as f64 / 1e6;
    let closes: Vec<CloseEvent> = events
        .into_iter()
        .map(|(gateway_index, reason, seen_us, before_us)| CloseEvent {
            gateway: f.gateways[gateway_index].ws_url(),
            reason,
            seen_after_s: at(seen_us),
            not_before_s: at(before_us),
            seen_us,
            gateway_index,
        })
        .collect();
    let slow_clients = match_closes(
        &received,
        &closes,
        &round_starts,
        with.start,
        f,
        phase_start,
    );

    let without_stats = finished.stats(without.clone());
    let with_stats = finished.stats(with.clone());
    let x = |a: u32, b: u32| f64::from(a) / f64::from(b.max(1));
    let run = finished.result;
    let rss = run
        .processes
        .iter()
        .map(|p| {
            let from = p
                .rss_bytes
                .get(with.start + RSS_FROM_ROUND)
                .copied()
                .flatten();
            let max_after = p
                .rss_bytes
                .iter()
                .skip(with.start + RSS_FROM_ROUND)
                .flatten()
                .max()
                .copied();
            RssGrowth {
                pid: p.pid,
                name: p.name.clone(),
                from_bytes: from,
                max_after_bytes: max_after,
                growth: match (from, max_after) {
                    (Some(a), Some(b)) if a > 0 => Some(b as f64 / a as f64 - 1.0),
                    _ => None,
                },
            }
        })
        .collect();
    Ok(Slow {
        p99_with_over_without: x(with_stats.latency.p99_us, without_stats.latency.p99_us),
        last_client_p99_with_over_without: x(
            with_stats.last_client.p99_us,
            without_stats.last_client.p99_us,
        ),
        run,
        without_rounds: without,
        with_rounds: with,
        without: without_stats,
        with: with_stats,
        slow_clients,
        closes,
        scrape_error,
        rss,
        catch_up,
    })
}

/// After the run: each slow client reads until its stream ends (the gateway
/// closed it), or it has every round sent to it (still open), or
/// [`SLOW_DRAIN`].
async fn read_what_was_sent(slow: Vec<Subscriber>, total: usize, joined: usize) -> Vec<Received> {
    let reading = Reading::start(slow, total, joined);
    reading.wait(SLOW_DRAIN).await;
    reading.finish().await
}

/// The slow clients reading, each in a task of its own.
struct Reading {
    readers: Vec<tokio::task::JoinHandle<Received>>,
    progress: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
    /// Rounds sent to them from `joined` on, all of them together.
    expected: u64,
}

impl Reading {
    /// The slow clients, subscribed from round `joined` of `total`, start
    /// reading.
    fn start(slow: Vec<Subscriber>, total: usize, joined: usize) -> Self {
        let expected = (slow.len() * (total - joined)) as u64;
        let progress = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = watch::channel(false);
        let readers = slow
            .into_iter()
            .map(|s| tokio::spawn(s.read_from(joined, total, progress.clone(), stopped.clone())))
            .collect();
        Self {
            readers,
            progress,
            stop,
            expected,
        }
    }

    /// Until every round sent was read, every reader ended, or `limit`;
    /// whether every round was read.
    async fn wait(&self, limit: Duration) -> bool {
        let reading = Instant::now();
        while self.progress.load(Ordering::Relaxed) < self.expected
            && reading.elapsed() < limit
            && !self.readers.iter().all(|r| r.is_finished())
        {
            tokio::time::sleep(DRAIN_POLL).await;
        }
        self.progress.load(Ordering::Relaxed) >= self.expected
    }

    async fn finish(self) -> Vec<Received> {
        let _ = self.stop.send(true);
        let mut received = Vec::with_capacity(self.readers.len());
        for reader in self.readers {
            match reader.await {
                Ok(r) => received.push(r),
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
        received
    }
}

impl Outcome for Slow {
    const SCENARIO: &'static str = "slow";

    fn rows(&self) -> Vec<Row> {
        let mut rows = self.run.rows();
        let p = |s: &Stats| {
            format!(
                "p99 {} ms; last client {}",
                ms(s.latency.p99_us),
                fanout::last_client_row(s)
            )
        };
        rows.push(Row::new(
            format!("healthy, without slow (rounds {:?})", self.without_rounds),
            p(&self.without),
        ));
        rows.push(Row::new(
            format!("healthy, with slow (rounds {:?})", self.with_rounds),
            p(&self.with),
        ));
        rows.push(Row::new(
            "with / without: p99, last client p99",
            format!(
                "{:.2}x, {:.2}x",
                self.p99_with_over_without, self.last_client_p99_with_over_without
            ),
        ));
        for c in &self.slow_clients {
            let s = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{v:.2} s"));
            rows.push(Row::new(
                format!("slow client {} ({})", c.client, c.gateway),
                if c.closed {
                    format!(
                        "closed ({}) {} into the slow phase, write stuck at most {}; read {} of {} rounds; {}",
                        c.reason.as_deref().unwrap_or("reason not seen"),
                        s(c.closed_after_s),
                        s(c.blocked_for_s),
                        c.rounds_received,
                        c.rounds_sent,
                        c.end
                    )
                } else {
                    format!(
                        "not closed: still open after the run, then read {} of {} rounds",
                        c.rounds_received, c.rounds_sent
                    )
                },
            ));
        }
        let others = self
            .closes
            .iter()
            .filter(|c| !SLOW_REASONS.contains(&c.reason.as_str()))
            .count();
        rows.push(Row::new("other closes seen", others));
        if let Some(c) = &self.catch_up {
            rows.extend(c.rows());
        }
        if let Some(e) = &self.scrape_error {
            rows.push(Row::new("metrics", format!("not all read: {e}")));
        }
        for r in &self.rss {
            let mib = |b: Option<u64>| {
                b.map_or("?".to_owned(), |b| format!("{:.1}", b as f64 / 1048576.0))
            };
            rows.push(Row::new(
                format!(
                    "{} ({}) RSS from slow round {RSS_FROM_ROUND}",
                    r.name, r.pid
                ),
                format!(
                    "{} MiB, then at most {} MiB ({})",
                    mib(r.from_bytes),
                    mib(r.max_after_bytes),
                    r.growth
                        .map_or("?".to_owned(), |g| format!("{:+.1}%", g * 100.0))
                ),
            ));
        }
        rows
    }

    fn failures(&self) -> Vec<String> {
        let mut failures = self.run.failures();
        if let Some(c) = &self.catch_up {
            failures.extend(c.failures());
        }
        failures
    }
}
