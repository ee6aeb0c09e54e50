//! Clients that keep a session, as a mobile app does: `hello`, `sub`, ack what
//! they processed, and when the connection goes, come back with
//! `{"op":"hello","resume":…}` after a jittered backoff (or after the
//! server's `reconnect.after_ms`), at a gateway picked at random among those
//! not seen refusing connections. Each [`Keeper`] records, per seq, what came
//! over the wire and what the application processed under the protocol's
//! rule (drop a `msg` whose `seq` is not above the last one processed), so
//! the scenario can count lost and duplicated messages both ways.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::clients::{
    self, CONNECT_TIMEOUT, READ_BUFFER_BYTES, Socket, client_failure, connect, describe,
    source_addr,
};
use crate::{Error, Target};

/// Longest one reconnect attempt may take (TCP, handshake, `welcome`)
/// before the client gives it up and backs off. A SYN the gateway's full
/// accept queue dropped is sent again after 1 s and 3 s: this allows both.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a gateway that refused a connection is left out of the random
/// pick (a Service drops a dead pod's endpoint about as fast).
pub const DOWN_FOR: Duration = Duration::from_secs(2);
/// Close codes after which a client comes back: 1012 (draining) and
/// Herald's 4000-4499. 4500-4999 mean "do not reconnect".
pub(crate) fn reconnects_after(code: u16) -> bool {
    code == 1012 || (4000..4500).contains(&code)
}

/// What a resuming client makes of the next thing its connection gives.
pub(crate) enum Next {
    /// A text frame: a message of Herald's.
    Text(tokio_tungstenite::tungstenite::Utf8Bytes),
    /// Nothing to act on (pings are answered by the library).
    Skip,
    /// Gone, or closed with a code that says come back: resume.
    Reconnect,
    /// Closed for good, with this code.
    GiveUp(String),
}

pub(crate) fn next(item: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>) -> Next {
    match item {
        Some(Ok(Message::Text(text))) => Next::Text(text),
        Some(Ok(Message::Close(frame))) => match frame.map(|f| u16::from(f.code)) {
            None => Next::Reconnect,
            Some(code) if reconnects_after(code) => Next::Reconnect,
            Some(code) => Next::GiveUp(format!("closed with {code}")),
        },
        Some(Ok(_)) => Next::Skip,
        Some(Err(_)) | None => Next::Reconnect,
    }
}

/// Jittered exponential backoff ("full jitter"): attempt `n` (from 0) waits
/// a random time up to `first × 2^n`, at most `cap`. Starting small and
/// random spreads a crowd that lost its connections at the same instant.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub first: Duration,
    pub cap: Duration,
}

impl Backoff {
    /// The wait before attempt `attempt`, for a random `unit` in [0, 1).
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let ceiling = self
            .first
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.cap);
        ceiling.mul_f64(unit.clamp(0.0, 1.0))
    }
}

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

/// A server frame, as far as a session-keeping client cares: no `data`.
#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    seq: Option<u64>,
    #[serde(borrow)]
    session: Option<Cow<'a, str>>,
    resumed: Option<bool>,
    after_ms: Option<u64>,
    #[serde(borrow)]
    reason: Option<Cow<'a, str>>,
}

/// A connected client with a session and one subscription.
pub struct Keeper {
    pub client: usize,
    /// The index of its topic among the run's.
    pub topic: usize,
    topic_name: Arc<str>,
    session: String,
    /// The topic's seq when it subscribed: everything after is its stream.
    base: u64,
    gateway: usize,
    /// Taken by [`Keeper::run`], which owns each connection in turn.
    ws: Option<Socket>,
    /// The newest seq processed: the protocol's rule drops a `msg` not above it.
    last: u64,
    /// Seqs that came over the wire (bit `seq - base - 1`).
    seen: Seqs,
    /// Advice from a `reconnect` frame, for the next reconnect only.
    advised: Option<Duration>,
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
    /// delivered but not acked yet): the rule drops them.
    pub wire_duplicates: u64,
    /// Seqs processed twice by the application despite the rule (possible
    /// only when a `reset` moved the client's position back).
    pub app_duplicates: u64,
    /// `msg`s below the last processed seq never seen before: the rule drops
    /// them, so they count as lost too.
    pub out_of_order: u64,
    pub resets: u64,
    /// Frames that are neither `msg` nor `reconnect` (an `err`, say).
    pub unexpected: u64,
    /// When each connection was lost (the cut's included).
    pub lost_at: Vec<Instant>,
    /// When each `welcome` with `resumed: true` came.
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
            Keeper::open(client, gateway, &plan, topic, topics[topic].clone()).await
        }
    })
    .await
}

/// How a connection ended, as the client decides what to do next.
enum Lost {
    /// Come back and resume (a reset, an EOF, 1012, 4000-4499, our own cut).
    Reconnect,
    /// Come back, but leave the old connection open and unread ([`Cut::HalfOpen`]).
    Abandon,
    /// The server said not to (4500-4999, or a code outside the protocol).
    GiveUp(String),
    /// The run is over.
    Stop,
}

impl Keeper {
    /// Connects, starts a session (`hello`) and subscribes to the topic.
    async fn open(
        client: usize,
        gateway: usize,
        plan: &Plan,
        topic: usize,
        topic_name: Arc<str>,
    ) -> Result<Self, Error> {
        let target = &plan.gateways[gateway];
        let fail = client_failure(client, source_addr(target.addr.ip(), client), target.addr);
        let opening = async {
            let (mut ws, welcome) = handshake(client, target, None, plan.token.as_deref())
                .await
                .map_err(|e| e.reason)?;
            let sub = serde_json::json!({"op": "sub", "id": 1, "topic": &*topic_name}).to_string();
            ws.send(Message::text(sub))
                .await
                .map_err(|e| format!("sending sub: {e}"))?;
            let text = next_text(&mut ws).await?;
            let ok: Frame<'_> = serde_json::from_str(&text)
                .map_err(|e| format!("not a server frame ({e}): {text}"))?;
            match (ok.op.as_ref(), ok.seq) {
                ("ok", Some(seq)) => Ok((ws, welcome, seq)),
                _ => Err(format!("sub refused: {text}")),
            }
        };
        let (ws, session, base) = tokio::time::timeout(CONNECT_TIMEOUT, opening)
            .await
            .map_err(|_| fail(format!("not subscribed within {CONNECT_TIMEOUT:?}")))?
            .map_err(fail)?;
        Ok(Self {
            client,
            topic,
            topic_name,
            session: session.session,
            base,
            gateway,
            ws: Some(ws),
            last: base,
            seen: Seqs::default(),
            advised: None,
        })
    }

    /// Reads, processes and acks until the phase turns [`Phase::Stop`];
    /// cuts its connection when it turns [`Phase::Cut`]; reconnects and
    /// resumes whenever the connection is lost. `progress` counts seqs
    /// processed, so that the scenario knows when all are in.
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
        // Half-open connections, kept open until the end.
        let mut abandoned = Vec::new();
        let Some(mut ws) = self.ws.take() else {
            record.failure = Some("no connection to start with".to_owned());
            return record;
        };
        loop {
            let lost = self
                .connected(&mut ws, &plan, &mut phase, &mut record, &progress)
                .await;
            match lost {
                Lost::Stop => {
                    record.gateway = self.gateway;
                    return record;
                }
                Lost::GiveUp(why) => {
                    record.failure = Some(why);
                    return record;
                }
                // Closed here, before coming back (abortively after a cut).
                Lost::Reconnect => drop(ws),
                Lost::Abandon => abandoned.push(ws),
            }
            record.lost_at.push(Instant::now());
            let advised = self.advised.take();
            ws = match self.resume(&plan, &mut phase, &mut record, advised).await {
                Ok(ws) => ws,
                Err(why) => {
                    record.failure = Some(why);
                    return record;
                }
            };
        }
    }

    /// One connection's life: until it is lost or the run stops.
    async fn connected(
        &mut self,
        ws: &mut Socket,
        plan: &Plan,
        phase: &mut watch::Receiver<Phase>,
        record: &mut Record,
        progress: &AtomicU64,
    ) -> Lost {
        let mut ack_due: Option<Instant> = None;
        loop {
            let far = Instant::now() + Duration::from_secs(3600);
            // Every branch is cancel-safe: `changed`, a sleep, and the
            // stream's `next` (a frame half read stays in the stream).
            let next = tokio::select! {
                biased;
                changed = phase.changed() => {
                    let now = if changed.is_err() { Phase::Stop } else { *phase.borrow_and_update() };
                    match now {
                        Phase::Stop => return Lost::Stop,
                        Phase::Cut if plan.cut == Cut::HalfOpen => return Lost::Abandon,
                        Phase::Cut => {
                            let _ = ws.get_ref().set_zero_linger();
                            return Lost::Reconnect;
                        }
                        Phase::Running => continue,
                    }
                }
                _ = tokio::time::sleep_until(ack_due.unwrap_or(far)), if ack_due.is_some() => {
                    ack_due = None;
                    if self.ack(ws, self.last).await.is_err() {
                        return Lost::Reconnect;
                    }
                    continue;
                }
                next = ws.next() => next,
            };
            let text = match self::next(next) {
                Next::Text(text) => text,
                Next::Skip => continue,
                Next::Reconnect => return Lost::Reconnect,
                Next::GiveUp(why) => return Lost::GiveUp(why),
            };
            let Ok(frame) = serde_json::from_str::<Frame<'_>>(text.as_str()) else {
                record.unexpected += 1;
                continue;
            };
            match (frame.op.as_ref(), frame.seq) {
                ("msg", Some(seq)) if seq > self.base => {
                    let i = (seq - self.base - 1) as usize;
                    let fresh = self.seen.insert(i);
                    if !fresh {
                        record.wire_duplicates += 1;
                    }
                    if seq > self.last {
                        self.last = seq;
                        if record.processed.insert(i) {
                            progress.fetch_add(1, Ordering::Relaxed);
                        } else {
                            record.app_duplicates += 1;
                        }
                        if plan.ack_interval.is_zero() {
                            if self.ack(ws, seq).await.is_err() {
                                return Lost::Reconnect;
                            }
                        } else if ack_due.is_none() {
                            ack_due = Some(Instant::now() + plan.ack_interval);
                        }
                    } else if fresh {
                        record.out_of_order += 1;
                    }
                }
                ("reconnect", _) => self.advised = frame.after_ms.map(Duration::from_millis),
                ("reset", Some(seq)) => {
                    // Continuity is gone: carry on live after `seq`.
                    record.resets += 1;
                    self.last = seq;
                }
                _ => record.unexpected += 1,
            }
        }
    }

    async fn ack(&self, ws: &mut Socket, seq: u64) -> Result<(), ()> {
        let ack = format!(
            r#"{{"op":"ack","topic":{},"seq":{seq}}}"#,
            serde_json::to_string(&*self.topic_name).unwrap_or_default()
        );
        ws.send(Message::text(ack)).await.map_err(|_| ())
    }

    /// Comes back after a lost connection: backs off, connects to a gateway
    /// picked at random, and resumes the session. Retries until resumed or
    /// the run stops; a `welcome` with `resumed: false` ends it (the
    /// session's position is gone, so would be the messages after it).
    async fn resume(
        &mut self,
        plan: &Plan,
        phase: &mut watch::Receiver<Phase>,
        record: &mut Record,
        advised: Option<Duration>,
    ) -> Result<Socket, String> {
        let mut attempt = 0u32;
        loop {
            let wait = match (attempt, advised) {
                (0, Some(after)) => after,
                _ => plan.backoff.delay(attempt, rand::random()),
            };
            attempt += 1;
            record.attempts += 1;
            let gateway = plan.pick();
            let target = &plan.gateways[gateway];
            let try_once = async {
                tokio::time::sleep(wait).await;
                tokio::time::timeout(
                    ATTEMPT_TIMEOUT,
                    handshake(
                        self.client,
                        target,
                        Some(&self.session),
                        plan.token.as_deref(),
                    ),
                )
                .await
                .map_err(|_| Failed::other(format!("no welcome within {ATTEMPT_TIMEOUT:?}")))?
            };
            let outcome = tokio::select! {
                biased;
                changed = phase.changed() => {
                    if changed.is_err() || *phase.borrow_and_update() == Phase::Stop {
                        return Err(format!(
                            "not resumed by the end of the run after {attempt} attempts; last error: {}",
                            record.attempt_errors.last().map_or("none", String::as_str)
                        ));
                    }
                    // A cut while away changes nothing: try again.
                    continue;
                }
                outcome = try_once => outcome,
            };
            match outcome {
                Ok((ws, welcome)) => {
                    if !welcome.resumed || welcome.session != self.session {
                        return Err(format!(
                            "resume refused at {target}: a fresh session (resumed: {})",
                            welcome.resumed
                        ));
                    }
                    record.resumed_at.push(Instant::now());
                    self.gateway = gateway;
                    record.gateway = gateway;
                    return Ok(ws);
                }
                Err(e) => {
                    if e.refused {
                        plan.refused(gateway);
                    }
                    record.attempt_errors.push(e.reason);
                }
            }
        }
    }
}

/// The parts of `welcome` a client keeps.
pub(crate) struct Welcome {
    pub(crate) session: String,
    pub(crate) resumed: bool,
    /// Why a `resume` was not honoured (`not_found`, `other_user`).
    pub(crate) reason: Option<String>,
}

/// Why a connection attempt failed.
pub(crate) struct Failed {
    /// Nothing listens there: the pod is gone.
    pub(crate) refused: bool,
    pub(crate) reason: String,
}

impl Failed {
    pub(crate) fn other(reason: String) -> Self {
        Self {
            refused: false,
            reason,
        }
    }
}

impl From<String> for Failed {
    fn from(reason: String) -> Self {
        Self::other(reason)
    }
}

/// TCP from the client's source address, the WebSocket handshake, `hello`
/// (resuming `resume` if given) and its `welcome`.
pub(crate) async fn handshake(
    client: usize,
    target: &Target,
    resume: Option<&str>,
    token: Option<&str>,
) -> Result<(Socket, Welcome), Failed> {
    let stream = connect(source_addr(target.addr.ip(), client), target.addr)
        .await
        .map_err(|e| Failed {
            refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
            reason: describe(&e),
        })?;
    let config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(0);
    let (mut ws, _) =
        tokio_tungstenite::client_async_with_config(target.ws_url(), stream, Some(config))
            .await
            .map_err(|e| format!("WebSocket handshake: {e}"))?;
    let mut hello = serde_json::json!({"op": "hello"});
    if let Some(session) = resume {
        hello["resume"] = session.into();
    }
    if let Some(token) = token {
        hello["token"] = token.into();
    }
    ws.send(Message::text(hello.to_string()))
        .await
        .map_err(|e| format!("sending hello: {e}"))?;
    let text = next_text(&mut ws).await?;
    let frame: Frame<'_> =
        serde_json::from_str(&text).map_err(|e| format!("not a server frame ({e}): {text}"))?;
    match (frame.op.as_ref(), frame.session) {
        ("welcome", Some(session)) => {
            let welcome = Welcome {
                session: session.into_owned(),
                resumed: frame.resumed.unwrap_or(false),
                reason: frame.reason.map(Cow::into_owned),
            };
            Ok((ws, welcome))
        }
        _ => Err(format!("expected welcome, got {text}").into()),
    }
}

/// The next text frame (pings and pongs skipped).
pub(crate) async fn next_text(ws: &mut Socket) -> Result<String, String> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(text))) => return Ok(text.as_str().to_owned()),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(other)) => return Err(format!("unexpected {other:?}")),
            Some(Err(e)) => return Err(format!("reading: {e}")),
            None => return Err("closed".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_and_is_random_below_it() {
        let b = Backoff {
            first: Duration::from_millis(100),
            cap: Duration::from_secs(2),
        };
        assert_eq!(b.delay(0, 0.999_999).as_millis(), 99);
        assert_eq!(b.delay(0, 0.5), Duration::from_millis(50));
        assert_eq!(b.delay(3, 1.0), Duration::from_millis(800));
        assert_eq!(b.delay(10, 1.0), Duration::from_secs(2));
        assert_eq!(b.delay(u32::MAX, 1.0), Duration::from_secs(2));
        assert_eq!(b.delay(5, 0.0), Duration::ZERO);
    }

    #[test]
    fn seqs_say_whether_they_were_new() {
        let mut s = Seqs::default();
        assert!(s.insert(0));
        assert!(s.insert(130));
        assert!(!s.insert(130));
        assert!(s.contains(0) && s.contains(130) && !s.contains(1) && !s.contains(10_000));
    }

    #[test]
    fn close_codes_say_whether_to_come_back() {
        for code in [1012, 4000, 4001, 4002, 4499] {
            assert!(reconnects_after(code), "{code}");
        }
        for code in [1000, 1002, 1009, 4500, 4501] {
            assert!(!reconnects_after(code), "{code}");
        }
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
    }
}
