//! Clients that keep a session, as a mobile app does: the project's own
//! client ([`herald_client`]), which says `hello`, subscribes, acks what it
//! processed and, when the connection goes, comes back with `resume` after a
//! jittered backoff (or after the server's `reconnect.after_ms`), at a
//! gateway picked at random among those not seen refusing connections. So
//! the tool measures what users run. Each [`Keeper`] records, per seq, what
//! came over the wire (the messages the client handed out, and those it
//! dropped by the protocol's rule, [`Event::Dropped`]) and what the
//! application processed, so the scenario can count lost and duplicated
//! messages both ways.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

pub use herald_client::Backoff;
use herald_client::{Acks, Client, Endpoints, Event, Events, State};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clients::{self, CONNECT_TIMEOUT, READ_BUFFER_BYTES, client_failure, source_addr};
use crate::{Error, Target};

/// Longest one reconnect attempt may take (TCP, handshake, `welcome`)
/// before the client gives it up and backs off. A SYN the gateway's full
/// accept queue dropped is sent again after 1 s and 3 s: this allows both.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a gateway that refused a connection is left out of the random
/// pick (a Service drops a dead pod's endpoint about as fast).
pub const DOWN_FOR: Duration = Duration::from_secs(2);

/// How a client cuts its connection when told to ([`Phase::Cut`]); on the
/// command line `storm --cut reset|half-open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Cut {
    /// SO_LINGER 0, then close: the gateway gets a reset at once, as when
    /// a network path dies and a middlebox answers for it.
    Reset,
    /// Leave the old connection open and silent, and come back on a new one:
    /// the gateway learns of the loss only from the resume (a takeover, the
    /// old connection closed with 4501), as when a path dies without a word.
    HalfOpen,
}

impl From<Cut> for herald_client::Cut {
    fn from(cut: Cut) -> Self {
        match cut {
            Cut::Reset => herald_client::Cut::Reset,
            Cut::HalfOpen => herald_client::Cut::HalfOpen,
        }
    }
}

/// What every client of a run shares: where to connect and how to behave.
pub struct Plan {
    pub gateways: Vec<Target>,
    pub backoff: Backoff,
    pub cut: Cut,
    /// Acks are cumulative: sent at most this often (zero: after every message).
    pub ack_interval: Duration,
    /// Sent as `hello.token` on every connect and resume.
    pub token: Option<String>,
    /// Per gateway, until when it is left out of the pick (µs since `epoch`).
    down_until: Vec<AtomicU64>,
    epoch: Instant,
    /// Clients coming back after a lost connection right now: a drain waits
    /// for them, so that a cut just before the end is not taken for a
    /// client that could not resume.
    pub resuming: AtomicUsize,
}

impl Plan {
    pub fn new(gateways: Vec<Target>, backoff: Backoff, cut: Cut, ack_interval: Duration) -> Self {
        let down_until = gateways.iter().map(|_| AtomicU64::new(0)).collect();
        Self {
            gateways,
            backoff,
            cut,
            ack_interval,
            token: None,
            down_until,
            epoch: Instant::now(),
            resuming: AtomicUsize::new(0),
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// A gateway at random among those not refusing lately; any when all are.
    pub(crate) fn pick(&self) -> usize {
        let now = self.now_us();
        let up: Vec<usize> = (0..self.gateways.len())
            .filter(|&g| self.down_until[g].load(Ordering::Relaxed) <= now)
            .collect();
        let from = if up.is_empty() {
            (0..self.gateways.len()).collect()
        } else {
            up
        };
        from[(rand::random::<f64>() * from.len() as f64) as usize % from.len()]
    }

    /// Nothing listens at `gateway` (the pod is gone): leave it out for [`DOWN_FOR`].
    pub(crate) fn refused(&self, gateway: usize) {
        let until = self.now_us() + DOWN_FOR.as_micros() as u64;
        self.down_until[gateway].store(until, Ordering::Relaxed);
    }

    /// The index of the gateway at `url`.
    fn gateway_at(&self, url: &str) -> Option<usize> {
        self.gateways.iter().position(|g| g.ws_url() == url)
    }
}

/// One client's way to the gateways: its own first, then the plan's pick.
struct Route {
    plan: Arc<Plan>,
    first: usize,
    started: AtomicBool,
}

impl Endpoints for Route {
    fn pick(&self, _previous: Option<&str>) -> Option<String> {
        let g = if self.started.swap(true, Ordering::Relaxed) {
            self.plan.pick()
        } else {
            self.first
        };
        Some(self.plan.gateways[g].ws_url())
    }

    fn refused(&self, url: &str) {
        if let Some(g) = self.plan.gateway_at(url) {
            self.plan.refused(g);
        }
    }
}

/// What the scenario tells every client, through a `watch` channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    /// Cut your connection now, abortively (the scenario's own cut).
    Cut,
    /// The run is over: report.
    Stop,
}

/// Seqs as a bit set, from one past the seq a client subscribed at.
#[derive(Debug, Default, Clone)]
pub struct Seqs {
    words: Vec<u64>,
}

impl Seqs {
    /// Sets bit `i`; whether it was clear.
    pub fn insert(&mut self, i: usize) -> bool {
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let fresh = self.words[word] & bit == 0;
        self.words[word] |= bit;
        fresh
    }

    pub fn contains(&self, i: usize) -> bool {
        self.words
            .get(i / 64)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }
}

/// A subscribed client with a session, and the checker around it.
pub struct Keeper {
    pub client: usize,
    /// The index of its topic among the run's.
    pub topic: usize,
    /// The topic's seq when it subscribed: everything after is its stream.
    base: u64,
    gateway: usize,
    handle: Client,
    events: Events,
    /// The newest seq processed (the client hands out nothing at or below it
    /// within an epoch; checked, not assumed).
    last: u64,
    /// Seqs that came over the wire (bit `seq - base - 1`).
    seen: Seqs,
}

/// What one client saw, for the scenario to merge.
#[derive(Debug)]
pub struct Record {
    pub client: usize,
    pub topic: usize,
    /// The gateway it was connected to last (an index into the plan's).
    pub gateway: usize,
    /// The topic's seq when the client subscribed.
    pub base: u64,
    /// Seqs the application processed (bit `seq - base - 1`).
    pub processed: Seqs,
    /// `msg`s whose seq came over the wire before (a replay of what was
    /// delivered but not acked yet): the client drops them.
    pub wire_duplicates: u64,
    /// Seqs processed twice by the application (possible only when a
    /// `reset` moved the client's position back).
    pub app_duplicates: u64,
    /// `msg`s below the last processed seq never seen before: the client
    /// drops them, so they count as lost too.
    pub out_of_order: u64,
    pub resets: u64,
    /// Events that are neither a message, a drop nor a connection's news
    /// (an `err`, say).
    pub unexpected: u64,
    /// When each connection was lost (the cut's included).
    pub lost_at: Vec<Instant>,
    /// When each resumed `welcome` came.
    pub resumed_at: Vec<Instant>,
    /// Reconnect attempts, successful or not.
    pub attempts: u32,
    /// Why each failed reconnect attempt failed (without the gateway's address).
    pub attempt_errors: Vec<String>,
    /// Why the client gave up its session, if it did (`resumed: false`, a
    /// close code that says "do not reconnect", still away at the end).
    pub failure: Option<String>,
}

/// Opens `count` clients with sessions, client `i` to `plan.gateways[i %
/// len]` and subscribed to `topics[i % topics.len()]`, at most
/// [`CONNECT_CONCURRENCY`](clients::CONNECT_CONCURRENCY) connecting at
/// once. The first failure stops the others and is returned.
pub async fn open_all(
    plan: &Arc<Plan>,
    count: usize,
    topics: &[String],
) -> Result<Vec<Keeper>, Error> {
    if plan.gateways.is_empty() || topics.is_empty() {
        return Err(Error::Options("no gateway or no topic".to_owned()));
    }
    let topics: Arc<[Arc<str>]> = topics.iter().map(|t| Arc::from(t.as_str())).collect();
    let plan = plan.clone();
    clients::open_all(count, move |client| {
        let (plan, topics) = (plan.clone(), topics.clone());
        async move {
            let topic = client % topics.len();
            let gateway = client % plan.gateways.len();
            Keeper::open(client, gateway, plan, topic, &topics[topic]).await
        }
    })
    .await
}

impl Keeper {
    /// Starts a client at gateway `gateway`, subscribed to the topic; ready
    /// once the subscription is confirmed. A failure before that is the
    /// run's (the gateway is not there, or refuses).
    async fn open(
        client: usize,
        gateway: usize,
        plan: Arc<Plan>,
        topic: usize,
        topic_name: &str,
    ) -> Result<Self, Error> {
        let target = &plan.gateways[gateway];
        let source = source_addr(target.addr.ip(), client);
        let fail = client_failure(client, source, target.addr);
        let mut builder = Client::with_endpoints(Route {
            plan: plan.clone(),
            first: gateway,
            started: AtomicBool::new(false),
        })
        .backoff(plan.backoff)
        .acks(Acks::Auto {
            interval: plan.ack_interval,
        })
        .connect_timeout(ATTEMPT_TIMEOUT)
        .read_buffer(READ_BUFFER_BYTES)
        .report_dropped(true);
        if let Some(source) = source {
            builder = builder.local_ip(source.ip());
        }
        if let Some(token) = plan.token.clone() {
            builder = builder.token(move || {
                let token = token.clone();
                async move { Ok::<_, String>(token) }
            });
        }
        let (handle, mut events) = builder.build().map_err(|e| fail(e.to_string()))?;
        handle
            .subscribe(topic_name, None)
            .map_err(|e| fail(e.to_string()))?;
        let subscribed = async {
            loop {
                match events.next().await {
                    Some(Event::Subscribed { seq, .. }) => return Ok(seq),
                    Some(Event::Error(e)) => return Err(e.to_string()),
                    Some(Event::State(State::Disconnected { cause, close, .. })) => {
                        return Err(format!("disconnected ({cause:?}, close {close:?})"));
                    }
                    Some(_) => {}
                    None => return Err("the client stopped".to_owned()),
                }
            }
        };
        let base = tokio::time::timeout(CONNECT_TIMEOUT, subscribed)
            .await
            .map_err(|_| fail(format!("not subscribed within {CONNECT_TIMEOUT:?}")))?
            .map_err(fail)?;
        Ok(Self {
            client,
            topic,
            base,
            gateway,
            handle,
            events,
            last: base,
            seen: Seqs::default(),
        })
    }

    /// Reads and processes (the client acks) until the phase turns
    /// [`Phase::Stop`]; cuts the connection when it turns [`Phase::Cut`];
    /// the client resumes whenever the connection is lost. `progress`
    /// counts seqs processed, so that the scenario knows when all are in.
    pub async fn run(
        mut self,
        plan: Arc<Plan>,
        mut phase: watch::Receiver<Phase>,
        progress: Arc<AtomicU64>,
    ) -> Record {
        let mut record = Record {
            client: self.client,
            topic: self.topic,
            gateway: self.gateway,
            base: self.base,
            processed: Seqs::default(),
            wire_duplicates: 0,
            app_duplicates: 0,
            out_of_order: 0,
            resets: 0,
            unexpected: 0,
            lost_at: Vec::new(),
            resumed_at: Vec::new(),
            attempts: 0,
            attempt_errors: Vec::new(),
            failure: None,
        };
        phase.borrow_and_update();
        // Lost and not back yet.
        let mut away = false;
        loop {
            // Both branches are cancel-safe (`changed`, `Events::next`).
            let event = tokio::select! {
                biased;
                changed = phase.changed() => {
                    let now = if changed.is_err() { Phase::Stop } else { *phase.borrow_and_update() };
                    match now {
                        Phase::Stop => break,
                        Phase::Cut => {
                            let _ = self.handle.cut(plan.cut.into());
                        }
                        Phase::Running => {}
                    }
                    continue;
                }
                event = self.events.next() => event,
            };
            let Some(event) = event else {
                record
                    .failure
                    .get_or_insert_with(|| "the client stopped".to_owned());
                break;
            };
            match event {
                Event::Message(m) if m.seq > self.base => {
                    let i = (m.seq - self.base - 1) as usize;
                    if !self.seen.insert(i) {
                        record.wire_duplicates += 1;
                    }
                    if m.seq > self.last {
                        self.last = m.seq;
                        if record.processed.insert(i) {
                            progress.fetch_add(1, Ordering::Relaxed);
                        } else {
                            record.app_duplicates += 1;
                        }
                    } else {
                        // The client handed out a seq at or below one it
                        // handed out before: its rule broken.
                        record.app_duplicates += 1;
                    }
                }
                Event::Dropped { seq, .. } if seq > self.base => {
                    if self.seen.insert((seq - self.base - 1) as usize) {
                        record.out_of_order += 1;
                    } else {
                        record.wire_duplicates += 1;
                    }
                }
                Event::Reset { seq, .. } => {
                    // Continuity is gone: carry on live after `seq`.
                    record.resets += 1;
                    self.last = seq;
                }
                // The first connect was `open`'s: these are reconnects.
                Event::State(State::Connecting { .. }) => record.attempts += 1,
                Event::State(State::Disconnected { .. }) => {
                    away = true;
                    record.lost_at.push(Instant::now());
                }
                Event::State(State::Resumed { url, .. }) => {
                    away = false;
                    record.resumed_at.push(Instant::now());
                    if let Some(g) = plan.gateway_at(&url) {
                        self.gateway = g;
                        record.gateway = g;
                    }
                }
                Event::State(State::Connected {
                    url,
                    resume_refused,
                    ..
                }) => {
                    // The session's position is gone (the client carries on
                    // with `since`, but the scenario proves resumes).
                    record.failure = Some(format!(
                        "resume refused at {url}: a fresh session ({})",
                        resume_refused.unwrap_or_default()
                    ));
                    break;
                }
                Event::Error(herald_client::Error::Connect { reason, .. }) => {
                    record.attempt_errors.push(reason);
                }
                Event::Error(e) if e.is_terminal() => {
                    record.failure = Some(e.to_string());
                    break;
                }
                _ => record.unexpected += 1,
            }
        }
        if away && record.failure.is_none() {
            record.failure = Some(format!(
                "not resumed by the end of the run after {} attempts; last error: {}",
                record.attempts,
                record.attempt_errors.last().map_or("none", String::as_str)
            ));
        }
        self.handle.close();
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seqs_say_whether_they_were_new() {
        let mut s = Seqs::default();
        assert!(s.insert(0));
        assert!(s.insert(130));
        assert!(!s.insert(130));
        assert!(s.contains(0) && s.contains(130) && !s.contains(1) && !s.contains(10_000));
    }

    #[test]
    fn a_plan_avoids_a_gateway_that_refused() {
        let gateways = vec![
            Target::websocket("ws://127.0.0.1:1").expect("target"),
            Target::websocket("ws://127.0.0.1:2").expect("target"),
        ];
        let backoff = Backoff {
            first: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        let plan = Plan::new(gateways, backoff, Cut::Reset, Duration::ZERO);
        plan.refused(0);
        assert!((0..100).all(|_| plan.pick() == 1));
        plan.refused(1);
        // Both down: any will do.
        assert!((0..100).all(|_| plan.pick() < 2));
        assert_eq!(plan.gateway_at("ws://127.0.0.1:2/ws"), Some(1));
    }
}
