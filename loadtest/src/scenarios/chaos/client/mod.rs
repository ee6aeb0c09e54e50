//! `chaos`'s clients: each keeps a session with a few subscriptions, acks
//! what it processed with the epoch, cuts its own connection now and then
//! (as a phone does) and comes back with `resume` at a pod picked at random.
//! It logs its stream per topic as it came over the wire (`ok`, every `msg`
//! with its data's publish id, every `reset`), for [`super::check`] to judge
//! after the run; it keeps the protocol's rule only to know what to ack.
//!
//! It is the one client in the project that is not `herald_client`, on
//! purpose: the checker judges the server by the raw stream, duplicates
//! and all, which a client that applies the seq rule would hide.
//!
//! Layout: the client, its connection and its reading here; [`record`]
//! (what it logs and hands back), [`resume`] (coming back after a loss).

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use super::Clock;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::clients::{
    CONNECT_TIMEOUT, READ_BUFFER_BYTES, Socket, client_failure, connect, describe, source_addr,
};
use crate::sessions::Plan;
use crate::{Error, Target};

mod record;
mod resume;

pub use self::record::{Event, Log, Record};

/// Unexpected frames kept (as text) per client.
const UNEXPECTED_KEPT: usize = 3;

/// What the run tells every client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Cut your connection now and then.
    Churn,
    /// Stay connected: the run is draining.
    Calm,
    /// Report.
    Stop,
}

/// Where a client is in a topic, for the drain: the epoch and the newest
/// seq processed.
pub type Positions = Arc<Mutex<Vec<(Arc<str>, u64)>>>;

/// A subscription's state.
struct Sub {
    topic: usize,
    name: Arc<str>,
    epoch: Arc<str>,
    /// The newest seq processed (the protocol's rule drops a `msg` not above it).
    last: u64,
    /// The newest fresh seq this connection delivered: what may be acked on it.
    ackable: Option<u64>,
    acked: u64,
    /// A `reset` came: ack in its epoch even if nothing is newer, so that
    /// the session stops telling it again.
    confirm: bool,
}

/// A server frame, as far as this client cares.
#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    #[serde(borrow)]
    topic: Option<Cow<'a, str>>,
    seq: Option<u64>,
    #[serde(borrow)]
    epoch: Option<Cow<'a, str>>,
    recovered: Option<bool>,
    data: Option<Payload>,
    after_ms: Option<u64>,
}

/// The publishers' data: `{"i": <publish id>, ...}`.
#[derive(Deserialize)]
struct Payload {
    i: Option<u64>,
}

/// How a connection ended.
enum Lost {
    Reconnect,
    GiveUp(String),
    Stop,
}

pub struct Client {
    pub client: usize,
    session: String,
    /// Taken by [`Client::run`], which owns each connection in turn.
    ws: Option<Socket>,
    gateway: usize,
    subs: Vec<Sub>,
    logs: Vec<Log>,
    positions: Positions,
    /// Mean time between its own cuts.
    churn: Duration,
    advised: Option<Duration>,
    /// The connection last lost was cut by this client.
    cut_last: bool,
    record: Record,
}

impl Client {
    /// Connects to `plan.gateways[gateway]`, starts a session and subscribes
    /// to `topics` (indexes into `names`), waiting for every `ok`.
    pub async fn open(
        client: usize,
        gateway: usize,
        plan: &Plan,
        topics: &[usize],
        names: &[Arc<str>],
        churn: Duration,
        clock: &Clock,
    ) -> Result<Self, Error> {
        let target: &Target = &plan.gateways[gateway];
        let fail = client_failure(client, source_addr(target.addr.ip(), client), target.addr);
        let opening = async {
            let (mut ws, welcome) = handshake(client, target, None, None)
                .await
                .map_err(|e| e.reason)?;
            for (id, &t) in topics.iter().enumerate() {
                let sub = serde_json::json!({"op": "sub", "id": id, "topic": &*names[t]});
                ws.send(Message::text(sub.to_string()))
                    .await
                    .map_err(|e| format!("sending sub: {e}"))?;
            }
            let mut subs = Vec::with_capacity(topics.len());
            while subs.len() < topics.len() {
                let text = next_text(&mut ws).await?;
                let ok: Frame<'_> = serde_json::from_str(&text)
                    .map_err(|e| format!("not a server frame ({e}): {text}"))?;
                match (ok.op.as_ref(), ok.topic, ok.seq, ok.epoch) {
                    ("ok", Some(topic), Some(seq), Some(epoch)) => {
                        let Some(&t) = topics.iter().find(|&&t| *names[t] == *topic) else {
                            return Err(format!("ok for a topic not asked for: {text}"));
                        };
                        subs.push(Sub {
                            topic: t,
                            name: names[t].clone(),
                            epoch: Arc::from(epoch.as_ref()),
                            last: seq,
                            ackable: None,
                            acked: seq,
                            confirm: false,
                        });
                    }
                    _ => return Err(format!("sub refused: {text}")),
                }
            }
            Ok((ws, welcome.session, subs))
        };
        let (ws, session, subs) = tokio::time::timeout(CONNECT_TIMEOUT, opening)
            .await
            .map_err(|_| fail(format!("not subscribed within {CONNECT_TIMEOUT:?}")))?
            .map_err(fail)?;
        let at = clock.ms32();
        let logs = subs
            .iter()
            .map(|s| Log {
                topic: s.topic,
                events: vec![Event::Start {
                    epoch: s.epoch.clone(),
                    seq: s.last,
                    recovered: false,
                    at,
                }],
            })
            .collect();
        let positions = Arc::new(Mutex::new(
            subs.iter().map(|s| (s.epoch.clone(), s.last)).collect(),
        ));
        Ok(Self {
            client,
            session,
            ws: Some(ws),
            gateway,
            subs,
            logs,
            positions,
            churn,
            advised: None,
            cut_last: false,
            record: Record {
                client,
                session: String::new(),
                logs: Vec::new(),
                lost: 0,
                cuts: 0,
                resumes: 0,
                attempts: 0,
                attempt_errors: Vec::new(),
                sessions_lost: Vec::new(),
                unexpected: 0,
                unexpected_kept: Vec::new(),
                failure: None,
            },
        })
    }

    /// The topics this client subscribed to, in order.
    pub fn topics(&self) -> Vec<usize> {
        self.subs.iter().map(|s| s.topic).collect()
    }

    pub fn positions(&self) -> Positions {
        self.positions.clone()
    }

    /// Reads, logs and acks until the phase turns [`Phase::Stop`]; cuts its
    /// connection at random while [`Phase::Churn`]; resumes whenever the
    /// connection is lost.
    pub async fn run(
        mut self,
        plan: Arc<Plan>,
        mut phase: watch::Receiver<Phase>,
        clock: Clock,
    ) -> Record {
        phase.borrow_and_update();
        let Some(mut ws) = self.ws.take() else {
            self.record.failure = Some("no connection to start with".to_owned());
            return self.finish();
        };
        loop {
            match self.connected(&mut ws, &plan, &mut phase, &clock).await {
                Lost::Stop => return self.finish(),
                Lost::GiveUp(why) => {
                    self.record.failure = Some(why);
                    return self.finish();
                }
                Lost::Reconnect => drop(ws),
            }
            self.record.lost += 1;
            self.note(Event::Gone {
                cut: self.cut_last,
                at: clock.ms32(),
            });
            self.cut_last = false;
            let advised = self.advised.take();
            ws = match self.resume(&plan, &mut phase, advised, &clock).await {
                Ok(ws) => ws,
                Err(why) => {
                    self.record.failure = Some(why);
                    return self.finish();
                }
            };
        }
    }

    /// An event of the connection, in every topic's log.
    fn note(&mut self, event: Event) {
        for log in &mut self.logs {
            log.events.push(event.clone());
        }
    }

    fn finish(mut self) -> Record {
        self.record.logs = std::mem::take(&mut self.logs);
        self.record.session = self.session.clone();
        self.record
    }

    /// A random lifetime for a connection: exponential, mean `churn`.
    fn lifetime(&self) -> Duration {
        let unit: f64 = rand::random::<f64>().max(1e-9);
        self.churn.mul_f64(-unit.ln()).min(self.churn * 10)
    }

    /// One connection's life: until it is lost or the run stops.
    async fn connected(
        &mut self,
        ws: &mut Socket,
        plan: &Plan,
        phase: &mut watch::Receiver<Phase>,
        clock: &Clock,
    ) -> Lost {
        for sub in &mut self.subs {
            sub.ackable = None;
        }
        let mut ack_due: Option<Instant> = None;
        let mut cut_at = (*phase.borrow() == Phase::Churn && !self.churn.is_zero())
            .then(|| Instant::now() + self.lifetime());
        loop {
            let far = Instant::now() + Duration::from_secs(3600);
            // Every branch is cancel-safe: `changed`, sleeps, the stream's `next`.
            let next = tokio::select! {
                biased;
                changed = phase.changed() => {
                    let now = if changed.is_err() { Phase::Stop } else { *phase.borrow_and_update() };
                    match now {
                        Phase::Stop => return Lost::Stop,
                        Phase::Calm => cut_at = None,
                        Phase::Churn => {}
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(cut_at.unwrap_or(far)), if cut_at.is_some() => {
                    // Abortive, as a phone losing its network.
                    let _ = ws.get_ref().set_zero_linger();
                    self.record.cuts += 1;
                    self.cut_last = true;
                    return Lost::Reconnect;
                }
                _ = tokio::time::sleep_until(ack_due.unwrap_or(far)), if ack_due.is_some() => {
                    ack_due = None;
                    if self.ack(ws).await.is_err() {
                        return Lost::Reconnect;
                    }
                    continue;
                }
                next = ws.next() => next,
            };
            let text = match read(next) {
                Next::Text(text) => text,
                Next::Skip => continue,
                Next::Reconnect => return Lost::Reconnect,
                Next::GiveUp(why) => return Lost::GiveUp(why),
            };
            if self.frame(text.as_str(), clock) && ack_due.is_none() {
                ack_due = Some(Instant::now() + plan.ack_interval);
            }
        }
    }

    /// Logs a frame; whether it brought something to ack.
    fn frame(&mut self, text: &str, clock: &Clock) -> bool {
        let Ok(frame) = serde_json::from_str::<Frame<'_>>(text) else {
            self.unexpected(text);
            return false;
        };
        let at = clock.ms32();
        let sub = frame
            .topic
            .as_deref()
            .and_then(|t| self.subs.iter().position(|s| *s.name == *t));
        match (frame.op.as_ref(), sub, frame.seq) {
            ("msg", Some(i), Some(seq)) => {
                let id = frame.data.and_then(|d| d.i);
                self.logs[i].events.push(Event::Msg { seq, id, at });
                let sub = &mut self.subs[i];
                if seq > sub.last {
                    sub.last = seq;
                    sub.ackable = Some(seq);
                    self.moved(i);
                    return true;
                }
                false
            }
            ("reset", Some(i), Some(seq)) => {
                let epoch: Arc<str> = Arc::from(frame.epoch.as_deref().unwrap_or(""));
                self.logs[i].events.push(Event::Reset {
                    epoch: epoch.clone(),
                    seq,
                    at,
                });
                let sub = &mut self.subs[i];
                if *sub.epoch == *epoch && seq <= sub.last {
                    // Told again of the epoch it is in: carry on, and say
                    // so with an ack that names the epoch.
                    sub.ackable = Some(sub.ackable.map_or(seq, |a| a.max(seq)));
                    sub.confirm = true;
                    return true;
                }
                sub.epoch = epoch;
                sub.last = seq;
                sub.acked = seq;
                sub.ackable = Some(seq);
                sub.confirm = true;
                self.moved(i);
                true
            }
            ("ok", Some(i), Some(seq)) => {
                // The answer to a `sub` sent after a session was lost.
                let epoch: Arc<str> = Arc::from(frame.epoch.as_deref().unwrap_or(""));
                let recovered = frame.recovered == Some(true);
                self.logs[i].events.push(Event::Start {
                    epoch: epoch.clone(),
                    seq,
                    recovered,
                    at,
                });
                let sub = &mut self.subs[i];
                if !recovered {
                    sub.epoch = epoch;
                    sub.last = seq;
                    sub.acked = seq;
                    sub.ackable = None;
                    self.moved(i);
                }
                false
            }
            ("reconnect", _, _) => {
                self.advised = frame.after_ms.map(Duration::from_millis);
                false
            }
            _ => {
                self.unexpected(text);
                false
            }
        }
    }

    fn unexpected(&mut self, text: &str) {
        self.record.unexpected += 1;
        if self.record.unexpected_kept.len() < UNEXPECTED_KEPT {
            self.record
                .unexpected_kept
                .push(text.chars().take(200).collect());
        }
    }

    fn moved(&self, i: usize) {
        let sub = &self.subs[i];
        if let Ok(mut positions) = self.positions.lock() {
            positions[i] = (sub.epoch.clone(), sub.last);
        }
    }

    /// Acks, with its epoch, every topic this connection delivered fresh seqs of.
    async fn ack(&mut self, ws: &mut Socket) -> Result<(), ()> {
        for sub in &mut self.subs {
            let Some(seq) = sub.ackable.filter(|&s| s > sub.acked || sub.confirm) else {
                continue;
            };
            sub.confirm = false;
            let ack = serde_json::json!({"op": "ack", "topic": &*sub.name, "seq": seq, "epoch": &*sub.epoch});
            ws.send(Message::text(ack.to_string()))
                .await
                .map_err(|_| ())?;
            sub.acked = seq;
            sub.ackable = None;
        }
        Ok(())
    }
}

/// Close codes after which a client comes back: 1012 (draining) and
/// Herald's 4000-4499. 4500-4999 mean "do not reconnect".
fn reconnects_after(code: u16) -> bool {
    code == 1012 || (4000..4500).contains(&code)
}

/// What the client makes of the next thing its connection gives.
enum Next {
    /// A text frame: a message of Herald's.
    Text(tokio_tungstenite::tungstenite::Utf8Bytes),
    /// Nothing to act on (pings are answered by the library).
    Skip,
    /// Gone, or closed with a code that says come back: resume.
    Reconnect,
    /// Closed for good, with this code.
    GiveUp(String),
}

fn read(item: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>) -> Next {
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

/// `welcome`, as far as this client cares.
#[derive(Deserialize)]
struct WelcomeFrame<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    #[serde(borrow)]
    session: Option<Cow<'a, str>>,
    resumed: Option<bool>,
    #[serde(borrow)]
    reason: Option<Cow<'a, str>>,
}

/// The parts of `welcome` a client keeps.
struct Welcome {
    session: String,
    resumed: bool,
    /// Why a `resume` was not honoured (`not_found`, `other_user`).
    reason: Option<String>,
}

/// Why a connection attempt failed.
struct Failed {
    /// Nothing listens there: the pod is gone.
    refused: bool,
    reason: String,
}

impl From<String> for Failed {
    fn from(reason: String) -> Self {
        Self {
            refused: false,
            reason,
        }
    }
}

/// TCP from the client's source address, the WebSocket handshake, `hello`
/// (resuming `resume` if given) and its `welcome`.
async fn handshake(
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
    let frame: WelcomeFrame<'_> =
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
async fn next_text(ws: &mut Socket) -> Result<String, String> {
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
    fn close_codes_say_whether_to_come_back() {
        for code in [1012, 4000, 4001, 4002, 4499] {
            assert!(reconnects_after(code), "{code}");
        }
        for code in [1000, 1002, 1009, 4500, 4501] {
            assert!(!reconnects_after(code), "{code}");
        }
    }
}
