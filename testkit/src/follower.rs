//! A client that follows one topic's stream across pods for as long as a test
//! needs: it says `hello`, subscribes, acks every message it processes and,
//! whenever its connection ends (`reconnect` advice then 1012 or 4002, a
//! dropped connection, a long silence), waits as advised (or a jittered
//! backoff) and resumes its session at a pod picked at random from a
//! [`Service`], as a Kubernetes Service would. An `err` while following (a
//! subscription the pod could not restore) is answered with `sub` and
//! `since`. It applies the protocol's client rule (drop a `msg` whose
//! seq is not above the last one processed) and records, rather than panics
//! on, everything a test may want to judge: a test runs thousands of them, and
//! one precise summary beats a thousand panicking tasks.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rand::Rng;
use rand::seq::SliceRandom;
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Longest one step may take: a TCP connect and upgrade, a `welcome`, an
/// `ok`, the server's end of a closed connection.
const STEP: Duration = Duration::from_secs(10);
/// A connection that brings nothing (no message, no ping) for this long is
/// taken for dead and replaced; the stream keeps coming while a test runs.
const SILENCE: Duration = Duration::from_secs(15);
/// Backoff after a failed connect, doubled per failure up to [`BACKOFF_MAX`],
/// each wait a random fraction of it.
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Wait after an end that came with no advice (a pod that died).
const UNADVISED: Duration = Duration::from_millis(250);
/// Longest a follower told to give up may take to say where it stood.
const GIVING_UP: Duration = Duration::from_secs(10);

/// The live pods a client may land on: shared, and changed by the test as
/// pods come and go (an endpoint leaves when its pod terminates and joins
/// when it is ready).
#[derive(Clone, Default)]
pub struct Service {
    pods: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Service {
    pub fn new(pods: impl IntoIterator<Item = SocketAddr>) -> Self {
        Self {
            pods: Arc::new(Mutex::new(pods.into_iter().collect())),
        }
    }

    pub fn add(&self, pod: SocketAddr) {
        self.lock().push(pod);
    }

    pub fn remove(&self, pod: SocketAddr) {
        self.lock().retain(|p| *p != pod);
    }

    /// A live pod at random (`None` while there is none).
    pub fn pick(&self) -> Option<SocketAddr> {
        self.lock().choose(&mut rand::thread_rng()).copied()
    }

    pub fn pods(&self) -> Vec<SocketAddr> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SocketAddr>> {
        // A test thread that panicked holding it leaves a usable list.
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one follower should do.
pub struct Follow {
    pub service: Service,
    pub topic: String,
    /// The topic's last seq, once known (the publisher has stopped): the
    /// follower ends once it has processed it.
    pub last: watch::Receiver<Option<u64>>,
    /// Told the seq the subscription started after, once subscribed.
    pub subscribed: Option<mpsc::UnboundedSender<u64>>,
    /// Bounds concurrent first connects (thousands at once would only queue
    /// in the listen backlog).
    pub gate: Option<Arc<Semaphore>>,
    /// Cancelled when the test stops waiting: the follower gives up and
    /// says where it stood.
    pub give_up: CancellationToken,
    /// Comes back by resuming its session; otherwise with a fresh session
    /// and `sub` with `since` (the other way the protocol offers).
    pub resume: bool,
}

impl Follow {
    /// A follower of `topic` that resumes its session, with no gate; a
    /// [`Crowd`] wires `subscribed` and `give_up`.
    pub fn new(service: &Service, topic: &str, last: &watch::Receiver<Option<u64>>) -> Self {
        Self {
            service: service.clone(),
            topic: topic.to_owned(),
            last: last.clone(),
            subscribed: None,
            gate: None,
            give_up: CancellationToken::new(),
            resume: true,
        }
    }
}

/// Followers started together: every one subscribed before the test
/// publishes, and every one waited for at the end.
pub struct Crowd {
    clients: Vec<JoinHandle<Followed>>,
    give_up: CancellationToken,
}

impl Crowd {
    /// Spawns `follows` and waits, up to `within`, until each has
    /// subscribed; each must start at seq 0, before the first publish.
    pub async fn subscribed(follows: impl IntoIterator<Item = Follow>, within: Duration) -> Self {
        let (subscribed, mut subscriptions) = mpsc::unbounded_channel();
        let give_up = CancellationToken::new();
        let clients: Vec<_> = follows
            .into_iter()
            .map(|follow| {
                let follow = Follow {
                    subscribed: Some(subscribed.clone()),
                    give_up: give_up.clone(),
                    ..follow
                };
                tokio::spawn(follow.run())
            })
            .collect();
        drop(subscribed);
        let deadline = Instant::now() + within;
        let total = clients.len();
        for n in 0..total {
            let after = timeout_at(deadline, subscriptions.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!("only {n} of {total} clients subscribed within {within:?}")
                })
                .unwrap_or_else(|| panic!("only {n} of {total} clients subscribed"));
            assert_eq!(after, 0, "subscribed before the first publish");
        }
        Self { clients, give_up }
    }

    /// What each follower saw, in the order they were given: once its stream
    /// is complete or, for those not done within `within`, where it stood
    /// when told to give up.
    pub async fn finish(self, within: Duration) -> Vec<Followed> {
        let deadline = Instant::now() + within;
        let mut all = Vec::with_capacity(self.clients.len());
        for (i, mut client) in self.clients.into_iter().enumerate() {
            let seen = match timeout_at(deadline, &mut client).await {
                Ok(seen) => seen,
                Err(_) => {
                    // The others say where they stood.
                    self.give_up.cancel();
                    timeout(GIVING_UP, client)
                        .await
                        .unwrap_or_else(|_| panic!("client {i} did not give up"))
                }
            };
            all.push(seen.expect("a client task"));
        }
        all
    }
}

/// What one follower saw.
#[derive(Debug, Default)]
pub struct Followed {
    /// Seqs processed, in order (after the client rule).
    pub processed: Vec<u64>,
    /// The seq the first subscription started after (its `ok`).
    pub started_after: u64,
    /// Messages dropped by the client rule: delivered a second time.
    pub wire_duplicates: u64,
    /// Connections after the first one that reached `welcome`.
    pub resumes: u32,
    /// Resumes answered `resumed: false`.
    pub failed_resumes: u32,
    /// `err` while following (a subscription the pod could not restore on a
    /// resume, say, with Redis slow): the follower subscribes again with
    /// `since`, as the `unavailable` code asks.
    pub resubscribed: Vec<String>,
    /// Connect attempts that failed (refused, 503, no `welcome`), by why.
    pub refused: BTreeMap<String, u32>,
    /// `reconnect` advice by reason.
    pub advised_draining: u32,
    pub advised_rebalance: u32,
    /// Connection ends by close code (`None`: no close frame).
    pub closes: Vec<Option<u16>>,
    /// What breaks the story: a `reset`, an `ok` with `recovered: false`, a
    /// gap, a silent connection, anything unexpected.
    pub problems: Vec<String>,
    /// Set when the follower gave up before the stream was complete.
    pub incomplete: Option<String>,
}

/// The fields of a server message the follower reads.
#[derive(Deserialize)]
struct Frame<'a> {
    op: &'a str,
    #[serde(borrow)]
    code: Option<&'a str>,
    seq: Option<u64>,
    session: Option<String>,
    resumed: Option<bool>,
    recovered: Option<bool>,
    epoch: Option<String>,
    after_ms: Option<u64>,
    #[serde(borrow)]
    reason: Option<&'a str>,
}

/// The session as the follower keeps it between connections.
struct State {
    session: Option<String>,
    epoch: Option<String>,
    /// The newest seq processed (the subscription's start before any).
    last: u64,
    subscribed: bool,
    /// The session is known to hold the subscription (a resume restores it).
    holds_sub: bool,
}

/// How a connection ended.
struct Ended {
    /// `after_ms` of the `reconnect` advice, if there was one.
    advised: Option<u64>,
}

impl Follow {
    pub async fn run(mut self) -> Followed {
        let mut seen = Followed::default();
        let mut state = State {
            session: None,
            epoch: None,
            last: 0,
            subscribed: false,
            holds_sub: false,
        };
        let mut wait = Duration::ZERO;
        loop {
            if self.done(&state) {
                return seen;
            }
            let give_up = self.give_up.clone();
            let connected = tokio::select! {
                _ = give_up.cancelled() => None,
                ws = async {
                    tokio::time::sleep(wait).await;
                    self.connect(&mut state, &mut seen).await
                } => Some(ws),
            };
            let Some(mut ws) = connected else {
                seen.incomplete = Some(format!(
                    "gave up while away, at seq {} ({} processed)",
                    state.last,
                    seen.processed.len()
                ));
                return seen;
            };
            let ended = self.read(&mut ws, &mut state, &mut seen).await;
            wait = match ended {
                None => return seen,
                Some(Ended {
                    advised: Some(after_ms),
                }) => Duration::from_millis(after_ms),
                Some(Ended { advised: None }) => jitter(UNADVISED),
            };
        }
    }

    fn done(&self, state: &State) -> bool {
        state.subscribed && self.last.borrow().is_some_and(|last| state.last >= last)
    }

    /// Connects (resuming the session once there is one) until a pod says
    /// `welcome` and the subscription is in place.
    async fn connect(&mut self, state: &mut State, seen: &mut Followed) -> Ws {
        let mut backoff = BACKOFF_START;
        loop {
            let permit = match &self.gate {
                Some(gate) if !state.subscribed => gate.clone().acquire_owned().await.ok(),
                _ => None,
            };
            let attempt = match self.service.pick() {
                Some(pod) => self.attempt(pod, state, seen).await,
                None => Err("no live pod".to_owned()),
            };
            drop(permit);
            if attempt.is_err() && !state.subscribed {
                // The session may or may not hold the subscription (the
                // connection ended before its `ok`): start afresh.
                state.session = None;
            }
            match attempt {
                Ok(ws) => return ws,
                Err(e) => {
                    *seen.refused.entry(e).or_default() += 1;
                    tokio::time::sleep(jitter(backoff)).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    async fn attempt(
        &mut self,
        pod: SocketAddr,
        state: &mut State,
        seen: &mut Followed,
    ) -> Result<Ws, String> {
        // tungstenite reserves 128 KiB per connection for reading by
        // default; our frames are tiny and there are thousands of us.
        let config = WebSocketConfig::default().read_buffer_size(4096);
        let url = format!("ws://{pod}/ws");
        let connecting = tokio_tungstenite::connect_async_with_config(url, Some(config), true);
        let (mut ws, _) = timeout(STEP, connecting)
            .await
            .map_err(|_| "connect timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        let hello = match (&state.session, self.resume) {
            (Some(session), true) => format!(r#"{{"op":"hello","resume":"{session}"}}"#),
            _ => r#"{"op":"hello"}"#.to_owned(),
        };
        send(&mut ws, hello).await?;
        let welcome = next_text(&mut ws).await?;
        let welcome: Frame = serde_json::from_str(&welcome).map_err(|e| e.to_string())?;
        if welcome.op != "welcome" {
            return Err(format!(
                "expected welcome, got {} {}",
                welcome.op,
                welcome.reason.unwrap_or_default()
            ));
        }
        let resumed = welcome.resumed == Some(true);
        if state.session.is_some() {
            seen.resumes += 1;
            if self.resume && state.subscribed && !resumed {
                // Counted, then repaired with `since` so that one failure
                // does not hide what follows.
                seen.failed_resumes += 1;
            }
        }
        if resumed && state.holds_sub {
            return Ok(ws);
        }
        if !resumed {
            state.session = welcome.session;
            state.holds_sub = false;
        }
        let sub = match (&state.epoch, state.subscribed) {
            (Some(epoch), true) => format!(
                r#"{{"op":"sub","id":1,"topic":"{}","since":{},"epoch":"{epoch}"}}"#,
                self.topic, state.last
            ),
            _ => format!(r#"{{"op":"sub","id":1,"topic":"{}"}}"#, self.topic),
        };
        send(&mut ws, sub).await?;
        let ok = next_text(&mut ws).await?;
        let ok: Frame = serde_json::from_str(&ok).map_err(|e| e.to_string())?;
        if (ok.op, ok.code) == ("err", Some("already_subscribed")) && state.subscribed {
            // The session got the subscription but its `ok` was lost with
            // the connection: the resume restored it.
            state.holds_sub = true;
            return Ok(ws);
        }
        if ok.op != "ok" {
            return Err(format!(
                "expected ok, got {} {}",
                ok.op,
                ok.reason.or(ok.code).unwrap_or_default()
            ));
        }
        state.holds_sub = true;
        if state.subscribed {
            if ok.recovered != Some(true) {
                seen.problems
                    .push(format!("`sub` with since {} not recovered", state.last));
            }
        } else {
            state.subscribed = true;
            state.epoch = ok.epoch;
            state.last = ok.seq.unwrap_or(0);
            seen.started_after = state.last;
            if let Some(subscribed) = self.subscribed.take() {
                let _ = subscribed.send(state.last);
            }
        }
        Ok(ws)
    }

    /// Reads and acks until the connection ends (`Some`) or the stream is
    /// complete or the follower gave up (`None`).
    async fn read(&mut self, ws: &mut Ws, state: &mut State, seen: &mut Followed) -> Option<Ended> {
        let mut advised = None;
        let mut watching = true;
        loop {
            if self.done(state) {
                let _ = timeout(STEP, ws.close(None)).await;
                return None;
            }
            let next = tokio::select! {
                // The last seq became known: look again.
                changed = self.last.changed(), if watching => {
                    if changed.is_err() {
                        // The sender is gone: the last seq is what it is.
                        watching = false;
                        if self.last.borrow().is_none() {
                            seen.incomplete = Some("the test stopped without a last seq".into());
                            return None;
                        }
                    }
                    continue;
                }
                _ = self.give_up.cancelled() => {
                    seen.incomplete = Some(format!(
                        "gave up at seq {} ({} processed)",
                        state.last,
                        seen.processed.len()
                    ));
                    return None;
                }
                next = timeout(SILENCE, ws.next()) => next,
            };
            let text = match next {
                Err(_) => {
                    seen.problems.push(format!("silent for {SILENCE:?}"));
                    seen.closes.push(None);
                    return Some(Ended { advised });
                }
                Ok(Some(Ok(Message::Text(text)))) => text,
                Ok(Some(Ok(Message::Close(frame)))) => {
                    seen.closes
                        .push(Some(frame.map_or(1005, |f| u16::from(f.code))));
                    // Read on so that our answer to the close goes out, until
                    // the server ends the connection.
                    let _ = timeout(STEP, async { while ws.next().await.is_some() {} }).await;
                    return Some(Ended { advised });
                }
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(_)) | None) => {
                    seen.closes.push(None);
                    return Some(Ended { advised });
                }
            };
            let frame: Frame = match serde_json::from_str(&text) {
                Ok(frame) => frame,
                Err(e) => {
                    seen.problems.push(format!("not a message ({e}): {text}"));
                    continue;
                }
            };
            match (frame.op, frame.seq) {
                ("msg", Some(seq)) => {
                    // The protocol's rule: a seq not above the last processed
                    // one was processed already.
                    if seq <= state.last {
                        seen.wire_duplicates += 1;
                        continue;
                    }
                    if seq != state.last + 1 {
                        seen.problems
                            .push(format!("a gap: seq {seq} after {}", state.last));
                    }
                    state.last = seq;
                    seen.processed.push(seq);
                    let ack = format!(r#"{{"op":"ack","topic":"{}","seq":{seq}}}"#, self.topic);
                    if send(ws, ack).await.is_err() {
                        seen.closes.push(None);
                        return Some(Ended { advised });
                    }
                }
                ("reconnect", _) => {
                    match frame.reason {
                        Some("draining") => seen.advised_draining += 1,
                        Some("rebalance") => seen.advised_rebalance += 1,
                        other => seen.problems.push(format!("reconnect for {other:?}")),
                    }
                    advised = frame.after_ms;
                }
                ("ok", _) if frame.recovered == Some(true) => {}
                ("err", _) if frame.code != Some("already_subscribed") => {
                    seen.resubscribed.push(text.as_str().to_owned());
                    let epoch = state.epoch.as_deref().unwrap_or_default();
                    let sub = format!(
                        r#"{{"op":"sub","id":2,"topic":"{}","since":{},"epoch":"{epoch}"}}"#,
                        self.topic, state.last
                    );
                    if send(ws, sub).await.is_err() {
                        seen.closes.push(None);
                        return Some(Ended { advised });
                    }
                }
                _ => seen.problems.push(format!("unexpected: {text}")),
            }
        }
    }
}

async fn send(ws: &mut Ws, text: String) -> Result<(), String> {
    timeout(STEP, ws.send(Message::text(text)))
        .await
        .map_err(|_| "send timed out".to_owned())?
        .map_err(|e| e.to_string())
}

/// The next text message (pings are answered by the library).
async fn next_text(ws: &mut Ws) -> Result<String, String> {
    loop {
        match timeout(STEP, ws.next()).await {
            Err(_) => return Err("no answer in time".to_owned()),
            Ok(Some(Ok(Message::Text(text)))) => return Ok(text.as_str().to_owned()),
            Ok(Some(Ok(Message::Close(frame)))) => return Err(format!("closed: {frame:?}")),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => return Err(e.to_string()),
            Ok(None) => return Err("connection ended".to_owned()),
        }
    }
}

/// A random wait up to `max`, so that clients do not move in step.
fn jitter(max: Duration) -> Duration {
    let max_ms = max.as_millis().max(1) as u64;
    Duration::from_millis(rand::thread_rng().gen_range(0..max_ms))
}
