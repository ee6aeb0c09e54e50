//! `hooks`: issue #24's backend hooks under load, against pods of the
//! binary under test that this scenario runs itself ([`pods`]), with the
//! application's backend inside the load tool ([`backend`]: a hyper server
//! on 127.0.0.1:0 answering each proxy call after `delay`, timing itself,
//! and counting webhooks).
//!
//! 1. handshakes ([`handshake`]) on the proxy pod: `handshakes` clients say
//!    `hello` without a token (the connect proxy authenticates them by
//!    cookie), then as many with an HS256 token (no proxy), `concurrency` at
//!    once; each batch after a warm-up of its kind. Handshakes per second
//!    and latency, the proxy's own time, the pod's CPU;
//! 2. publishes ([`publish`]) on the same pod: clients alternate `pub`s to a
//!    namespace with the publish proxy and to one without; `pub`→`ok` of
//!    each, the proxied ones less the backend's own time for them;
//! 3. webhooks ([`webhooks`]) on a second pod (the first stopped):
//!    clients connect, subscribe to a topic of their own, publish and
//!    close, each step an event; events per second delivered, batch sizes,
//!    every event accounted for.
//!
//! Loopback only; each phase bounded in count and time; the pods and the
//! backend stop with the run.

pub mod backend;
mod handshake;
pub mod outcome;
pub mod pods;
mod publish;
mod webhooks;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use self::backend::Backend;
use self::handshake::{Auth, Batch};
use self::pods::Pod;
use crate::cpu::Meter;
use crate::latency::Summary;
use crate::{Error, Target};

pub use self::outcome::{Handshakes, Hooks, Publishes, Webhooks};

/// Handshakes of each kind.
pub const DEFAULT_HANDSHAKES: usize = 5_000;
/// Clients handshaking at once.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// The backend's delay before each proxy answer (the issue's "a local
/// backend that answers in 1 ms").
pub const DEFAULT_DELAY: Duration = Duration::from_millis(1);
/// Clients publishing, and their publishes per second in all.
pub const DEFAULT_PUBLISH_CLIENTS: usize = 100;
pub const DEFAULT_PUBLISH_RATE: f64 = 2_000.0;
/// How long they publish.
pub const DEFAULT_PUBLISH_DURATION: Duration = Duration::from_secs(10);
/// Clients making webhook events, and the publishes of each.
pub const DEFAULT_WEBHOOK_CLIENTS: usize = 100;
pub const DEFAULT_WEBHOOK_PUBLISHES: u64 = 200;
/// Longest to wait for the last webhook after the clients are done.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(30);
/// Most handshakes of one kind, and most clients of a phase.
pub const MAX_HANDSHAKES: usize = 100_000;
pub const MAX_CLIENTS: usize = 5_000;
/// Between two looks at the webhooks received.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
pub struct Options {
    /// The herald binary the pods run.
    pub herald: PathBuf,
    /// Where the pods' logs go (kept); `None`: scratch files.
    pub dir: Option<PathBuf>,
    pub handshakes: usize,
    pub concurrency: usize,
    pub delay: Duration,
    pub publish_clients: usize,
    pub publish_rate: f64,
    pub publish_duration: Duration,
    pub webhook_clients: usize,
    pub webhook_publishes: u64,
    /// The event types the webhooks pod sends ([`pods::WEBHOOK_EVENTS`]
    /// by default); only these are expected.
    pub webhook_events: Vec<String>,
    pub settle: Duration,
    /// More `HERALD_*` settings for both pods.
    pub env: Vec<(String, String)>,
}

impl Options {
    pub fn new(herald: PathBuf) -> Self {
        Self {
            herald,
            dir: None,
            handshakes: DEFAULT_HANDSHAKES,
            concurrency: DEFAULT_CONCURRENCY,
            delay: DEFAULT_DELAY,
            publish_clients: DEFAULT_PUBLISH_CLIENTS,
            publish_rate: DEFAULT_PUBLISH_RATE,
            publish_duration: DEFAULT_PUBLISH_DURATION,
            webhook_clients: DEFAULT_WEBHOOK_CLIENTS,
            webhook_publishes: DEFAULT_WEBHOOK_PUBLISHES,
            webhook_events: pods::WEBHOOK_EVENTS.map(str::to_owned).to_vec(),
            settle: DEFAULT_SETTLE,
            env: Vec::new(),
        }
    }

    /// A run of well under a minute: the plumbing and rough figures.
    pub fn quick(mut self) -> Self {
        self.handshakes = 1_000;
        self.publish_clients = 20;
        self.publish_rate = 500.0;
        self.publish_duration = Duration::from_secs(3);
        self.webhook_clients = 20;
        self.webhook_publishes = 50;
        self.settle = Duration::from_secs(10);
        self
    }

    fn check(&self) -> Result<(), Error> {
        let bad = |what: &str| Err(Error::Options(what.to_owned()));
        if self.handshakes == 0 || self.handshakes > MAX_HANDSHAKES {
            return bad("--handshakes must be over 0 and at most 100,000");
        }
        if self.concurrency == 0 || self.concurrency > MAX_CLIENTS {
            return bad("--concurrency must be over 0 and at most 5,000");
        }
        if self.delay > Duration::from_millis(500) {
            return bad("--delay must be at most 500ms (the proxies' timeout is 1 s)");
        }
        for (name, n) in [
            ("--publish-clients", self.publish_clients),
            ("--webhook-clients", self.webhook_clients),
        ] {
            if n == 0 || n > MAX_CLIENTS {
                return Err(Error::Options(format!(
                    "{name} must be over 0 and at most 5,000"
                )));
            }
        }
        if !(self.publish_rate > 0.0 && self.publish_rate <= 100_000.0) {
            return bad("--publish-rate must be over 0 and at most 100,000");
        }
        if let Some(e) = self
            .webhook_events
            .iter()
            .find(|e| !pods::WEBHOOK_EVENTS.contains(&e.as_str()))
        {
            return Err(Error::Options(format!(
                "--webhook-events: `{e}` is none of {}",
                pods::WEBHOOK_EVENTS.join(", ")
            )));
        }
        if self.webhook_events.is_empty() {
            return bad("--webhook-events must name at least one");
        }
        if self.webhook_publishes == 0 || self.webhook_publishes > 100_000 {
            return bad("--webhook-publishes must be over 0 and at most 100,000");
        }
        for (name, d) in [
            ("--publish-duration", self.publish_duration),
            ("--settle", self.settle),
        ] {
            if d.is_zero() || d > super::MAX_DURATION {
                return Err(Error::Options(format!(
                    "{name} must be over 0s and at most {}s",
                    super::MAX_DURATION.as_secs()
                )));
            }
        }
        Ok(())
    }
}

pub async fn run(options: Options) -> Result<Hooks, Error> {
    options.check()?;
    crate::clients::raise_fd_limit(
        (options.concurrency + options.publish_clients + options.webhook_clients) as u64
            + crate::clients::FD_MARGIN,
    )?;
    let backend = Backend::start(options.delay).await?;
    println!("hooks: backend on {}", backend.addr);
    let mut result = Hooks {
        backend_delay_ms: options.delay.as_secs_f64() * 1000.0,
        ..Hooks::default()
    };
    // A pod that does not start (a build without a hook's settings) is a
    // problem of the run; the other pod's phase still runs.
    if let Err(e) = proxy_phases(&options, &backend, &mut result).await {
        result.problems.push(format!("proxy pod: {e}"));
    }
    match webhooks_phase(&options, &backend).await {
        Ok(w) => result.webhooks = Some(w),
        Err(e) => result.problems.push(format!("webhooks pod: {e}")),
    }
    let (bad, last) = backend.tally.bad();
    result.backend_bad_requests = bad;
    result.backend_last_bad = last;
    Ok(result)
}

/// Phases 1 and 2, on the proxy pod.
async fn proxy_phases(
    options: &Options,
    backend: &Backend,
    result: &mut Hooks,
) -> Result<(), Error> {
    let secret = crate::token::secret();
    let pod = Pod::proxies(options, backend, &secret).await?;
    let target = Target::at(pod.herald.addr)?;
    let pid: Vec<u32> = pod.herald.pid().into_iter().collect();
    // 1. handshakes: tokens minted before any clock runs.
    let tokens: Arc<[String]> = (0..options.handshakes)
        .map(|n| crate::token::mint(&secret, &format!("u{n}"), None))
        .collect::<Result<Vec<_>, _>>()?
        .into();
    let warmup = (options.handshakes / 10).clamp(1, 500);
    for auth in [Auth::Proxy, Auth::Token(Arc::clone(&tokens))] {
        let batch = |first, count| Batch {
            first,
            count,
            concurrency: options.concurrency,
            auth: auth.clone(),
        };
        let _ = handshake::run(&target, batch(0, warmup)).await;
        let _ = backend.tally.take_connect();
        let _ = backend.tally.take_cookies();
        let meter = Meter::start(&pid);
        let done = handshake::run(&target, batch(warmup, options.handshakes)).await;
        let cpu = meter.stop();
        let wall_s = done.wall.as_secs_f64();
        let mut latency = done.latency_us;
        let phase = Handshakes {
            auth: match auth {
                Auth::Proxy => "proxy",
                Auth::Token(_) => "token",
            }
            .to_owned(),
            handshakes: latency.len() as u64,
            failed: done.failed,
            first_failure: done.first_failure,
            concurrency: options.concurrency,
            wall_s,
            per_s: latency.len() as f64 / wall_s.max(1e-9),
            latency: Summary::of(&mut latency),
            backend: Summary::of(&mut backend.tally.take_connect()),
            backend_cookies: backend.tally.take_cookies(),
            cpu,
        };
        println!(
            "hooks: {} handshakes {:.0}/s, latency {}",
            phase.auth,
            phase.per_s,
            phase.latency.brief()
        );
        result.handshakes.push(phase);
    }

    // 2. publishes, through the publish proxy and not.
    let publishers: Vec<String> = (0..options.publish_clients)
        .map(|n| crate::token::mint(&secret, &format!("p{n}"), None))
        .collect::<Result<_, _>>()?;
    let _ = backend.tally.take_publish();
    let meter = Meter::start(&pid);
    let done = publish::run(
        &target,
        &publishers,
        options.publish_rate,
        options.publish_duration,
    )
    .await?;
    let cpu = meter.stop();
    let own = backend.tally.take_publish();
    let (mut net, unmatched) = publish::net_of_backend(&done.samples, &own);
    let mut own: Vec<u32> = own.into_values().collect();
    let plain = Summary::of(&mut publish::latencies(&done.samples, false));
    let proxied = Summary::of(&mut publish::latencies(&done.samples, true));
    let proxied_net = Summary::of(&mut net);
    let p = Publishes {
        clients: options.publish_clients,
        rate_per_s: options.publish_rate,
        duration_s: options.publish_duration.as_secs_f64(),
        added_p50_us: f64::from(proxied_net.p50_us) - f64::from(plain.p50_us),
        added_p99_us: f64::from(proxied_net.p99_us) - f64::from(plain.p99_us),
        plain,
        proxied,
        proxied_net,
        backend: Summary::of(&mut own),
        unmatched,
        errors: done.errors,
        first_error: done.first_error,
        cpu,
    };
    println!(
        "hooks: publish plain {}, proxied less backend {}",
        p.plain.brief(),
        p.proxied_net.brief()
    );
    result.publish = Some(p);
    Ok(())
}

/// Phase 3, on a pod of its own (the proxy pod is gone by now).
async fn webhooks_phase(options: &Options, backend: &Backend) -> Result<Webhooks, Error> {
    let most = options.webhook_clients as u64 * (options.webhook_publishes + 4);
    let pod = Pod::webhooks(options, backend, most + 10_000).await?;
    let target = Target::at(pod.herald.addr)?;
    let pid: Vec<u32> = pod.herald.pid().into_iter().collect();
    let _ = backend.tally.take_events();
    let meter = Meter::start(&pid);
    let started = Instant::now();
    let done = webhooks::run(
        &target,
        0,
        options.webhook_clients,
        options.webhook_publishes,
    )
    .await;
    let expected_by_type: BTreeMap<String, u64> = [
        ("connection.open", done.connected),
        ("connection.close", done.connected),
        ("client.publish", done.published),
        ("topic.occupied", done.subscribed),
        ("topic.vacated", done.subscribed),
    ]
    .into_iter()
    .filter(|(kind, _)| options.webhook_events.iter().any(|e| e == kind))
    .map(|(kind, n)| (kind.to_owned(), n))
    .collect();
    let expected: u64 = expected_by_type.values().sum();
    let settle = Instant::now() + options.settle;
    while (backend.tally.distinct_events() as u64) < expected && Instant::now() < settle {
        tokio::time::sleep(POLL).await;
    }
    let cpu = meter.stop();
    let events = backend.tally.take_events();
    let delivered_s = events.last.map_or(0.0, |t| (t - started).as_secs_f64());
    let batches = events.batch_sizes.len() as u64;
    let w = Webhooks {
        clients: options.webhook_clients,
        publishes_per_client: options.webhook_publishes,
        expected,
        expected_by_type,
        received: events.received,
        distinct: events.ids.len() as u64,
        by_type: events.by_type,
        batches,
        batch_mean: events.received as f64 / batches.max(1) as f64,
        batch_max: events
            .batch_sizes
            .iter()
            .copied()
            .max()
            .map_or(0, u64::from),
        generated_s: done.wall.as_secs_f64(),
        delivered_s,
        per_s: events.ids.len() as f64 / delivered_s.max(1e-9),
        lag_s: (delivered_s - done.wall.as_secs_f64()).max(0.0),
        errors: done.errors,
        first_error: done.first_error,
        cpu,
    };
    println!(
        "hooks: webhooks {} of {} events, {:.0}/s, {:.1} per batch",
        w.distinct, w.expected, w.per_s, w.batch_mean
    );
    Ok(w)
}
