//! `formats`: bytes on the wire and gateway CPU per delivery for each way a
//! subscriber may take its messages (issue #26): JSON, JSON+deflate,
//! protobuf, protobuf+deflate, and each of those with deltas
//! ([`Format`]), for two payloads ([`Kind`]: chat messages of ~200 B, a 2-4
//! KiB scoreboard that changes a little per update).
//!
//! One phase per (payload, format), against the same gateway, one after the
//! other: `clients` clients ([`raw`](crate::raw) ones, which count each frame's bytes
//! as read off the socket, inflate, and speak protobuf through [`codec`](crate::codec))
//! connect and subscribe to a fresh topic of their own; one publisher posts
//! the payload series, `updates` of them `interval` apart; the gateway's
//! CPU is read from the first publish to the last delivery. Everything
//! else (connecting, subscribing, closing) is outside the window.
//!
//! Every client checks every payload: seqs one after the other from 1
//! (nothing lost, nothing twice), each delta applied to the payload before
//! it, and what it puts together byte for byte the payload published. A
//! client that finds a difference fails the run: a wrong delta is a bug,
//! never a figure.
//!
//! Layout: the options, the phases and the result here; [`payload`] (the
//! payload series), [`subscribers`] (the clients, each payload checked).

pub mod payload;
mod subscribers;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use self::subscribers::{connect, read};
use crate::clients::{FD_MARGIN, raise_fd_limit};
use crate::codec::Format;
use crate::cpu::{Meter, Usage};
use crate::publish::{Connection, body};
use crate::report::{Outcome, Row};
use crate::{Error, Target};
pub use payload::Kind;

/// Subscribers per phase.
pub const DEFAULT_CLIENTS: usize = 500;
/// Publications per phase.
pub const DEFAULT_UPDATES: usize = 200;
/// Between two publications.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(10);
/// After the last publish, how long to wait for the deliveries still missing.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);
/// Most clients.
pub const MAX_CLIENTS: usize = 20_000;
/// Most updates per phase.
pub const MAX_UPDATES: usize = 100_000;
/// Each client's read buffer: a few frames of the largest payload.
const BUFFER_BYTES: usize = 16 * 1024;
/// Between two looks at the delivery count while draining.
const DRAIN_POLL: Duration = Duration::from_millis(5);
/// Client errors quoted per phase.
const ERRORS_LISTED: usize = 3;

#[derive(Debug, Clone)]
pub struct Options {
    /// Where the clients connect.
    pub gateway: Target,
    /// Where the publisher posts (the same gateway by default).
    pub publish_to: Target,
    /// The gateway's process, for its CPU time.
    pub gateway_pid: Option<u32>,
    pub clients: usize,
    pub updates: usize,
    pub interval: Duration,
    pub payloads: Vec<Kind>,
    pub formats: Vec<Format>,
    pub drain: Duration,
}

impl Options {
    pub fn new(gateway: Target) -> Self {
        Self {
            publish_to: gateway.clone(),
            gateway,
            gateway_pid: None,
            clients: DEFAULT_CLIENTS,
            updates: DEFAULT_UPDATES,
            interval: DEFAULT_INTERVAL,
            payloads: Kind::ALL.to_vec(),
            formats: Format::ALL.to_vec(),
            drain: DEFAULT_DRAIN,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Options(m));
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return bad(format!("--clients must be 1 to {MAX_CLIENTS}"));
        }
        if self.updates < 2 || self.updates > MAX_UPDATES {
            return bad(format!("--updates must be 2 to {MAX_UPDATES}"));
        }
        let phase = self.interval.saturating_mul(self.updates as u32);
        if phase > super::MAX_DURATION || self.drain > super::MAX_DURATION {
            return bad(format!(
                "--updates x --interval and --drain must each be at most {}s",
                super::MAX_DURATION.as_secs()
            ));
        }
        if self.payloads.is_empty() || self.formats.is_empty() {
            return bad("give at least one payload and one format".to_owned());
        }
        Ok(())
    }
}

/// The result of a `formats` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Formats {
    pub gateway: String,
    pub gateway_pid: Option<u32>,
    pub clients: usize,
    pub updates: usize,
    pub interval_s: f64,
    /// One per (payload, format), in the order run.
    pub phases: Vec<Phase>,
}

/// One payload in one format.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phase {
    pub payload: Kind,
    pub format: Format,
    /// The topic (its length is in every `msg`'s envelope).
    pub topic: String,
    /// The payloads' mean size as published.
    pub payload_bytes: f64,
    /// Clients that negotiated permessage-deflate, and that were granted deltas.
    pub compressed_clients: usize,
    pub delta_clients: usize,
    pub publishes: u64,
    pub deliveries_expected: u64,
    /// Payloads received and checked, each once.
    pub deliveries: u64,
    /// Of those, how many came as deltas.
    pub delta_deliveries: u64,
    /// Bytes of the `msg` frames as read off the sockets (headers included).
    pub wire_bytes: u64,
    pub wire_bytes_per_delivery: f64,
    /// The gateway's CPU from the first publish to the last delivery, all,
    /// user space and kernel.
    pub gateway_cpu_s: Option<f64>,
    pub gateway_user_s: Option<f64>,
    pub gateway_system_s: Option<f64>,
    /// `gateway_cpu_s` over the deliveries, in nanoseconds.
    pub gateway_ns_per_delivery: Option<f64>,
    pub window_s: f64,
    pub cpu: Usage,
    /// Clients that failed a check or lost their connection, and the
    /// first few reasons.
    pub failed_clients: usize,
    pub errors: Vec<String>,
    /// The publisher's first error, if any publish failed.
    pub publish_error: Option<String>,
}

impl Phase {
    /// A phase whose clients or publisher could not start, for `error`.
    fn not_started(payload: Kind, format: Format, topic: String, error: Error) -> Self {
        Self {
            payload,
            format,
            topic,
            payload_bytes: 0.0,
            compressed_clients: 0,
            delta_clients: 0,
            publishes: 0,
            deliveries_expected: 0,
            deliveries: 0,
            delta_deliveries: 0,
            wire_bytes: 0,
            wire_bytes_per_delivery: 0.0,
            gateway_cpu_s: None,
            gateway_user_s: None,
            gateway_system_s: None,
            gateway_ns_per_delivery: None,
            window_s: 0.0,
            cpu: Usage::default(),
            failed_clients: 0,
            errors: vec![format!("did not start: {error}")],
            publish_error: None,
        }
    }

    /// What went wrong in this phase (nothing, when it passed).
    pub fn failures(&self) -> Vec<String> {
        let name = format!("{} {}", self.payload, self.format);
        let mut failures = Vec::new();
        if let Some(e) = &self.publish_error {
            failures.push(format!("{name}: publish: {e}"));
        }
        if self.failed_clients > 0 {
            failures.push(format!(
                "{name}: {} clients failed: {}",
                self.failed_clients,
                self.errors.join("; ")
            ));
        } else if !self.errors.is_empty() {
            failures.push(format!("{name}: {}", self.errors.join("; ")));
        }
        if self.deliveries < self.deliveries_expected {
            failures.push(format!(
                "{name}: {} of {} deliveries",
                self.deliveries, self.deliveries_expected
            ));
        }
        failures
    }
}

pub async fn run(options: Options) -> Result<Formats, Error> {
    options.validate()?;
    raise_fd_limit(options.clients as u64 + FD_MARGIN)?;
    // Short topics, as an application's would be: the topic is in every
    // `msg`. A run's own suffix keeps runs against one Redis apart.
    let run = crate::latency::now_micros() % 1_000_000;
    let mut phases = Vec::new();
    for &kind in &options.payloads {
        let series: Arc<[String]> = kind.series(options.updates).into();
        for (k, &format) in options.formats.iter().enumerate() {
            let topic = format!("{kind}{k}.{run}");
            // A phase that cannot start (deltas not granted, say) fails
            // the run; the other phases still run.
            let outcome = phase(&options, kind, format, topic.clone(), series.clone()).await;
            phases.push(outcome.unwrap_or_else(|e| Phase::not_started(kind, format, topic, e)));
        }
    }
    Ok(Formats {
        gateway: options.gateway.ws_url(),
        gateway_pid: options.gateway_pid,
        clients: options.clients,
        updates: options.updates,
        interval_s: options.interval.as_secs_f64(),
        phases,
    })
}

/// What one client saw.
#[derive(Debug, Default)]
struct Seen {
    deliveries: u64,
    deltas: u64,
    wire_bytes: u64,
    /// Why it stopped before it was told to.
    error: Option<String>,
}

/// Connects the clients in `format`, publishes the series to `topic`,
/// and counts.
async fn phase(
    options: &Options,
    kind: Kind,
    format: Format,
    topic: String,
    series: Arc<[String]>,
) -> Result<Phase, Error> {
    let topic: Arc<str> = topic.into();
    let clients = connect(options, format, &topic).await?;
    let delta_clients = clients.iter().filter(|(_, delta)| *delta).count();
    let compressed_clients = clients.iter().filter(|(c, _)| c.compressed()).count();
    let mut publisher = Connection::open(options.publish_to.addr).await?;

    let progress = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = watch::channel(false);
    let readers: Vec<_> = clients
        .into_iter()
        .map(|(c, _)| {
            tokio::spawn(read(
                c,
                format.protocol,
                topic.clone(),
                series.clone(),
                progress.clone(),
                stopped.clone(),
            ))
        })
        .collect();

    let watch = Vec::from_iter(options.gateway_pid);
    let meter = Meter::start(&watch);
    let started = Instant::now();
    let mut ticks = tokio::time::interval(options.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut publishes = 0u64;
    let mut publish_error = None;
    for (i, data) in series.iter().enumerate() {
        ticks.tick().await;
        match publisher.publish(body(&topic, data)).await {
            Ok(published) if published.seq == i as u64 + 1 => publishes += 1,
            Ok(published) => {
                publish_error = Some(format!(
                    "publish {} answered seq {}: the topic is not fresh",
                    i + 1,
                    published.seq
                ));
                break;
            }
            Err(e) => {
                publish_error = Some(e.to_string());
                break;
            }
        }
    }
    let expected = publishes * options.clients as u64;
    let draining = Instant::now();
    while progress.load(Ordering::Relaxed) < expected
        && draining.elapsed() < options.drain
        && !readers.iter().all(|r| r.is_finished())
    {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let window = started.elapsed();
    let cpu = meter.stop();
    let _ = stop.send(true);

    let mut result = Phase {
        payload: kind,
        format,
        topic: topic.to_string(),
        payload_bytes: series.iter().map(|s| s.len() as f64).sum::<f64>() / series.len() as f64,
        compressed_clients,
        delta_clients,
        publishes,
        deliveries_expected: expected,
        deliveries: 0,
        delta_deliveries: 0,
        wire_bytes: 0,
        wire_bytes_per_delivery: 0.0,
        gateway_cpu_s: None,
        gateway_user_s: None,
        gateway_system_s: None,
        gateway_ns_per_delivery: None,
        window_s: window.as_secs_f64(),
        cpu,
        failed_clients: 0,
        errors: Vec::new(),
        publish_error,
    };
    for reader in readers {
        let seen = match reader.await {
            Ok(s) => s,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        result.deliveries += seen.deliveries;
        result.delta_deliveries += seen.deltas;
        result.wire_bytes += seen.wire_bytes;
        if let Some(e) = seen.error {
            result.failed_clients += 1;
            if result.errors.len() < ERRORS_LISTED {
                result.errors.push(e);
            }
        }
    }
    result.wire_bytes_per_delivery = result.wire_bytes as f64 / result.deliveries.max(1) as f64;
    if let Some(w) = result.cpu.watched.first() {
        result.gateway_cpu_s = w.cpu_s;
        result.gateway_user_s = w.user_s;
        result.gateway_system_s = w.system_s;
        result.gateway_ns_per_delivery = w
            .cpu_s
            .filter(|_| result.deliveries > 0)
            .map(|s| s * 1e9 / result.deliveries as f64);
    }
    Ok(result)
}

impl Formats {
    /// The phase of `payload` in `format`, if run.
    pub fn phase(&self, payload: Kind, format: Format) -> Option<&Phase> {
        self.phases
            .iter()
            .find(|p| p.payload == payload && p.format == format)
    }
}

/// `x` times the plain JSON phase's figure of the same payload.
fn versus_json(run: &Formats, phase: &Phase, figure: impl Fn(&Phase) -> Option<f64>) -> String {
    let json = run.phase(phase.payload, Format::ALL[0]).and_then(&figure);
    match (figure(phase), json) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".to_owned(),
    }
}

impl Outcome for Formats {
    const SCENARIO: &'static str = "formats";

    fn rows(&self) -> Vec<Row> {
        let mut rows = vec![Row::new(
            "run",
            format!(
                "{} clients per phase on {}, {} updates {} ms apart",
                self.clients,
                self.gateway,
                self.updates,
                self.interval_s * 1000.0
            ),
        )];
        for p in &self.phases {
            if p.publishes == 0 && !p.errors.is_empty() {
                rows.push(Row::new(
                    format!("{} {}", p.payload, p.format),
                    "did not start (below)",
                ));
                continue;
            }
            rows.push(Row::new(
                format!("{} {}", p.payload, p.format),
                format!(
                    "{:.1} B per delivery ({} JSON's; payload {:.0} B); gateway {} ns per \
                     delivery ({}; user {} / kernel {} s); deltas {} of {}; {} of {} delivered",
                    p.wire_bytes_per_delivery,
                    versus_json(self, p, |p| Some(p.wire_bytes_per_delivery)),
                    p.payload_bytes,
                    p.gateway_ns_per_delivery
                        .map_or("?".to_owned(), |n| format!("{n:.0}")),
                    versus_json(self, p, |p| p.gateway_ns_per_delivery),
                    p.gateway_user_s
                        .map_or("?".to_owned(), |s| format!("{s:.2}")),
                    p.gateway_system_s
                        .map_or("?".to_owned(), |s| format!("{s:.2}")),
                    p.delta_deliveries,
                    p.deliveries,
                    p.deliveries,
                    p.deliveries_expected,
                ),
            ));
        }
        rows
    }

    fn failures(&self) -> Vec<String> {
        self.phases.iter().flat_map(Phase::failures).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_bounded() {
        let mut options = Options::new(Target::at(([127, 0, 0, 1], 1).into()).expect("t"));
        assert!(options.validate().is_ok());
        options.updates = 1;
        assert!(options.validate().is_err(), "a delta needs two updates");
        options.updates = 10;
        options.formats.clear();
        assert!(options.validate().is_err());
    }
}
