//! One member of the room: a user with a session, on a raw socket
//! ([`crate::raw`]: thousands of them cost little next to the pods).
//!
//! It says `hello` with its token, subscribes to the room, acks now and
//! then what it received, and counts the `presence_diff` frames it is sent
//! (and the joins and leaves in them) for the scenario's current phase.
//! When its connection goes (a pod drains it with `reconnect`, or dies) it
//! comes back with `resume` at another pod that is up, as a client SDK
//! does, unless it was told to stay away (the members of a pod killed to
//! see their leaves).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde::de::IgnoredAny;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;

use crate::Target;
use crate::clients::source_addr;
use crate::latency::{Stamp, now_micros};
use crate::raw::{self, Client, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT};

/// Longest one connection attempt may take: TCP, upgrade, `welcome` and,
/// on a fresh session, the `ok` of its `sub`.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);
/// Each member's read buffer to start with; a larger frame (a diff with
/// thousands of joins) grows it for that frame only.
const BUFFER_BYTES: usize = 2 * 1024;
/// A buffer grown past this is given back once the frame is read: ten
/// thousand members each keeping a 100 KB diff's buffer would be a gigabyte.
const KEEP_BUFFER_BYTES: usize = 16 * 1024;
/// A member whose connection failed without `reconnect` advice comes back
/// after a jittered wait up to this.
const BACKOFF: Duration = Duration::from_secs(1);
/// The id of the member's `sub` (and its later `unsub`s and `sub`s).
const SUB_ID: u64 = 1;

/// What every member shares with the scenario.
pub struct Room {
    pub topic: String,
    pub pods: Vec<Target>,
    /// Whether each pod takes clients: the scenario clears it before it
    /// stops a pod and sets it once the pod is back.
    pub up: Vec<AtomicBool>,
    /// Cumulative acks at most this often (only when a message came).
    pub ack_interval: Duration,
    /// The leaves a subscriber must see in the kill phase (0: not counting).
    pub leave_target: AtomicU32,
    /// Whether members record the latency of the messages they read.
    pub measuring: AtomicBool,
    /// Connection attempts in flight at once (a pod's accept queue is finite).
    pub connecting: Semaphore,
    /// While set, each user listed in a leave and when (µs since the
    /// epoch) a subscriber first saw it: in a rolling restart, where nobody
    /// leaves, each is a stray to account for.
    pub recording: AtomicBool,
    pub leaves_seen: Mutex<std::collections::HashMap<String, u64>>,
}

impl Room {
    /// A pod that is up, at random, other than `avoid` when another is up.
    fn pick(&self, avoid: Option<usize>) -> usize {
        let up: Vec<usize> = (0..self.pods.len())
            .filter(|&p| self.up[p].load(Ordering::Relaxed))
            .collect();
        let others: Vec<usize> = up.iter().copied().filter(|&p| Some(p) != avoid).collect();
        let from = match (others.is_empty(), up.is_empty()) {
            (false, _) => others,
            (true, false) => up,
            (true, true) => (0..self.pods.len()).collect(),
        };
        from[rand::random::<usize>() % from.len()]
    }
}

/// One member's figures, read and reset by the scenario between phases.
#[derive(Default)]
pub struct Tally {
    /// The pod its live connection is on (`usize::MAX`: none).
    pub pod: AtomicUsize,
    /// Subscribed (fresh) or resumed, and reading.
    pub connected: AtomicBool,
    /// Told not to come back after its connection goes.
    pub stay_away: AtomicBool,
    /// `presence_diff` frames this phase.
    pub frames: AtomicU32,
    /// Joins and leaves listed in them this phase.
    pub joins: AtomicU32,
    pub leaves: AtomicU32,
    /// Diffs with counts only (no `joins`/`leaves` keys) this phase.
    pub counts_only: AtomicU32,
    /// The fewest users a diff said the room had this phase (`u64::MAX`:
    /// no diff).
    pub least_users: AtomicU64,
    /// When (µs since the epoch) this phase's leaves reached the room's
    /// `leave_target`; 0: not yet.
    pub leaves_done_us: AtomicU64,
    pub messages: AtomicU64,
    /// When (µs since the epoch) its last connection ended, and when the
    /// one after it was welcomed.
    pub lost_us: AtomicU64,
    pub back_us: AtomicU64,
    /// The last `reconnect` advice's delay, and the pod it came from.
    pub advised_ms: AtomicU64,
    pub advised_by: AtomicUsize,
    /// Comebacks that resumed the session, and that got a fresh one.
    pub resumed: AtomicU32,
    pub fresh: AtomicU32,
    /// `err` frames, failed connection attempts.
    pub errors: AtomicU32,
    pub last_error: Mutex<Option<String>>,
    /// Message latency (µs) while the room is measuring.
    pub latency: Mutex<Vec<u32>>,
}

impl Tally {
    pub fn new() -> Self {
        Self {
            pod: AtomicUsize::new(usize::MAX),
            least_users: AtomicU64::new(u64::MAX),
            ..Self::default()
        }
    }

    /// Zeroes the per-phase counts.
    pub fn reset_phase(&self) {
        for counter in [&self.frames, &self.joins, &self.leaves, &self.counts_only] {
            counter.store(0, Ordering::Relaxed);
        }
        self.leaves_done_us.store(0, Ordering::Relaxed);
        self.least_users.store(u64::MAX, Ordering::Relaxed);
    }

    fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(what);
    }
}

/// What the scenario asks of a member besides stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Leave the room (`unsub`), staying connected.
    Unsub,
    /// Join it again (`sub`).
    Sub,
}

/// One member: who it is and how it is reached.
pub struct Member {
    pub index: usize,
    pub token: String,
    pub room: Arc<Room>,
    pub tally: Arc<Tally>,
    pub commands: mpsc::Receiver<Command>,
    pub stop: watch::Receiver<bool>,
}

/// How a live connection ended.
enum End {
    /// The run is over.
    Stopped,
    /// The pod closed it or it failed; come back after this.
    Lost(Duration),
}

#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    id: Option<u64>,
    #[serde(borrow)]
    session: Option<Cow<'a, str>>,
    resumed: Option<bool>,
    #[serde(borrow)]
    epoch: Option<Cow<'a, str>>,
    after_ms: Option<u64>,
    joins: Option<Vec<IgnoredAny>>,
    #[serde(borrow)]
    leaves: Option<Vec<Cow<'a, str>>>,
    users: Option<u64>,
    #[serde(borrow)]
    code: Option<Cow<'a, str>>,
    #[serde(borrow)]
    message: Option<Cow<'a, str>>,
}

/// A `msg`'s stamp, read only while measuring.
#[derive(Deserialize)]
struct Stamped {
    data: Option<Stamp>,
}

/// One live connection: its socket, and what the member keeps about it
/// (apart, so that a frame borrowed from the socket's buffer can update it).
struct Live {
    client: Client,
    state: State,
}

struct State {
    /// The topic's epoch, from the `ok` of the `sub` (acks carry it).
    epoch: Option<String>,
    /// The newest seq this connection delivered, and the newest acked.
    ackable: u64,
    acked: u64,
    last_ack: Instant,
    /// The `reconnect` advice, if the pod gave one.
    after: Option<Duration>,
    /// Not after an `unsub`: a message still on its way then is not acked
    /// (the pod would answer `not_subscribed`).
    subscribed: bool,
}

impl Member {
    /// Runs until told to stop: connects, resumes, counts.
    pub async fn run(mut self) {
        let mut session: Option<String> = None;
        let mut pod = self.index % self.room.pods.len();
        loop {
            if *self.stop.borrow() {
                return;
            }
            let attempt = {
                let _permit = self.room.connecting.acquire().await;
                tokio::time::timeout(ATTEMPT_TIMEOUT, self.connect(pod, &mut session)).await
            };
            let wait = match attempt {
                Ok(Ok(live)) => match self.live(live).await {
                    End::Stopped => return,
                    End::Lost(wait) => wait,
                },
                Ok(Err(e)) => {
                    self.tally
                        .error(format!("{}: {e}", self.room.pods[pod].ws_url()));
                    jitter(BACKOFF)
                }
                Err(_) => {
                    self.tally.error(format!(
                        "{}: no welcome within {ATTEMPT_TIMEOUT:?}",
                        self.room.pods[pod].ws_url()
                    ));
                    jitter(BACKOFF)
                }
            };
            self.tally.connected.store(false, Ordering::Relaxed);
            self.tally.pod.store(usize::MAX, Ordering::Relaxed);
            self.tally.lost_us.store(now_micros(), Ordering::Relaxed);
            if self.tally.stay_away.load(Ordering::Relaxed) {
                let _ = self.stop.wait_for(|stop| *stop).await;
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.stop.wait_for(|stop| *stop) => return,
            }
            pod = self.room.pick(Some(pod));
        }
    }

    /// Connects to `pod`, says `hello` (resuming `session` if there is
    /// one), and subscribes on a fresh session.
    async fn connect(&self, pod: usize, session: &mut Option<String>) -> Result<Live, String> {
        let target = &self.room.pods[pod];
        let source = source_addr(target.addr.ip(), self.index);
        let client = Client::connect(source, target, BUFFER_BYTES, self.index as u64)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut live = Live {
            client,
            state: State {
                epoch: None,
                ackable: 0,
                acked: 0,
                last_ack: Instant::now(),
                after: None,
                subscribed: true,
            },
        };
        let mut hello = serde_json::json!({"op": "hello", "token": self.token});
        if let Some(s) = session.as_deref() {
            hello["resume"] = s.into();
        }
        send_json(&mut live.client, &hello).await?;
        let resumed = loop {
            let frame = next_text(&mut live.client).await?;
            let frame: Frame<'_> = parse(&frame)?;
            match frame.op.as_ref() {
                "welcome" => {
                    let first = session.is_none();
                    *session = frame.session.map(Cow::into_owned);
                    let resumed = frame.resumed == Some(true);
                    self.tally.back_us.store(now_micros(), Ordering::Relaxed);
                    if resumed {
                        self.tally.resumed.fetch_add(1, Ordering::Relaxed);
                    } else if !first {
                        self.tally.fresh.fetch_add(1, Ordering::Relaxed);
                    }
                    break resumed;
                }
                "err" => return Err(refusal(&frame)),
                _ => {}
            }
        };
        if !resumed {
            self.send_sub(&mut live.client, "sub").await?;
            loop {
                let frame = next_text(&mut live.client).await?;
                let frame: Frame<'_> = parse(&frame)?;
                match (frame.op.as_ref(), frame.id) {
                    ("ok", Some(SUB_ID)) => {
                        live.state.epoch = frame.epoch.map(Cow::into_owned);
                        break;
                    }
                    ("err", _) => return Err(refusal(&frame)),
                    _ => {}
                }
            }
        }
        self.tally.pod.store(pod, Ordering::Relaxed);
        self.tally.connected.store(true, Ordering::Relaxed);
        Ok(live)
    }

    async fn send_sub(&self, client: &mut Client, op: &str) -> Result<(), String> {
        let sub = serde_json::json!({"op": op, "id": SUB_ID, "topic": self.room.topic});
        send_json(client, &sub).await
    }

    /// Reads, counts, acks and obeys until the connection goes or the run
    /// stops.
    async fn live(&mut self, mut live: Live) -> End {
        loop {
            // Each branch is cancel-safe: `next` keeps a half-read frame
            // buffered, `recv` and `changed` lose nothing.
            let action = tokio::select! {
                frame = live.client.next() => match frame {
                    Ok(Some(frame)) => self.on_frame(frame.opcode, frame.payload, &mut live.state),
                    Ok(None) | Err(_) => Action::Gone,
                },
                command = self.commands.recv() => match command {
                    Some(Command::Unsub) => Action::Send("unsub"),
                    Some(Command::Sub) => Action::Send("sub"),
                    // The scenario is gone: so is the run.
                    None => Action::Stop,
                },
                _ = self.stop.changed() => Action::Stop,
            };
            live.client.shrink(BUFFER_BYTES, KEEP_BUFFER_BYTES);
            let sent = match action {
                Action::Nothing => Ok(()),
                Action::Pong(payload) => live.client.send(OP_PONG, &payload).await,
                Action::Ack(ack) => live.client.send(OP_TEXT, ack.as_bytes()).await,
                Action::Send(op) => {
                    live.state.subscribed = op == "sub";
                    self.send_sub(&mut live.client, op)
                        .await
                        .map_err(std::io::Error::other)
                }
                Action::Closed(payload) => {
                    // Answer the close as the protocol asks, then go.
                    let _ = live.client.send(OP_CLOSE, &payload).await;
                    return End::Lost(live.state.after.unwrap_or_else(|| jitter(BACKOFF)));
                }
                Action::Gone => {
                    return End::Lost(live.state.after.unwrap_or_else(|| jitter(BACKOFF)));
                }
                Action::Stop => {
                    let _ = live.client.send(OP_CLOSE, &1000u16.to_be_bytes()).await;
                    return End::Stopped;
                }
            };
            if sent.is_err() {
                return End::Lost(live.state.after.unwrap_or_else(|| jitter(BACKOFF)));
            }
        }
    }

    /// What one server frame asks of the member.
    fn on_frame(&self, opcode: u8, payload: &[u8], live: &mut State) -> Action {
        match opcode {
            OP_TEXT => {}
            OP_PING => return Action::Pong(payload.to_vec()),
            OP_CLOSE => return Action::Closed(payload.get(..2).unwrap_or_default().to_vec()),
            _ => return Action::Nothing,
        }
        if let Some((_, seq)) = raw::msg_topic_seq(payload) {
            return self.on_msg(seq, payload, live);
        }
        let Ok(frame) = serde_json::from_slice::<Frame<'_>>(payload) else {
            self.tally.error(format!(
                "not a server frame: {}",
                String::from_utf8_lossy(payload)
            ));
            return Action::Nothing;
        };
        match frame.op.as_ref() {
            "presence_diff" => self.on_diff(&frame),
            "reconnect" => {
                let after_ms = frame.after_ms.unwrap_or(0);
                self.tally.advised_ms.store(after_ms, Ordering::Relaxed);
                self.tally
                    .advised_by
                    .store(self.tally.pod.load(Ordering::Relaxed), Ordering::Relaxed);
                live.after = Some(Duration::from_millis(after_ms));
            }
            "ok" | "reset" => {
                if let Some(epoch) = frame.epoch {
                    live.epoch = Some(epoch.into_owned());
                }
            }
            "err" => self.tally.error(refusal(&frame)),
            _ => {}
        }
        Action::Nothing
    }

    fn on_msg(&self, seq: u64, payload: &[u8], live: &mut State) -> Action {
        self.tally.messages.fetch_add(1, Ordering::Relaxed);
        if self.room.measuring.load(Ordering::Relaxed)
            && let Ok(Stamped { data: Some(stamp) }) = serde_json::from_slice(payload)
        {
            let latency = stamp.latency_to(now_micros());
            self.tally
                .latency
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(latency);
        }
        live.ackable = live.ackable.max(seq);
        if live.subscribed
            && live.ackable > live.acked
            && live.last_ack.elapsed() >= self.room.ack_interval
        {
            live.acked = live.ackable;
            live.last_ack = Instant::now();
            let mut ack =
                serde_json::json!({"op": "ack", "topic": self.room.topic, "seq": live.acked});
            if let Some(epoch) = &live.epoch {
                ack["epoch"] = epoch.as_str().into();
            }
            return Action::Ack(ack.to_string());
        }
        Action::Nothing
    }

    fn on_diff(&self, frame: &Frame<'_>) {
        let tally = &self.tally;
        tally.frames.fetch_add(1, Ordering::Relaxed);
        if let Some(users) = frame.users {
            tally.least_users.fetch_min(users, Ordering::Relaxed);
        }
        let joins = frame.joins.as_ref().map_or(0, Vec::len) as u32;
        let leaves = frame.leaves.as_ref().map_or(0, Vec::len) as u32;
        if frame.joins.is_none() && frame.leaves.is_none() {
            tally.counts_only.fetch_add(1, Ordering::Relaxed);
        }
        tally.joins.fetch_add(joins, Ordering::Relaxed);
        if leaves > 0 && self.room.recording.load(Ordering::Relaxed) {
            let now = now_micros();
            let mut seen = self
                .room
                .leaves_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for user in frame.leaves.iter().flatten() {
                seen.entry(user.to_string()).or_insert(now);
            }
        }
        let seen = tally.leaves.fetch_add(leaves, Ordering::Relaxed) + leaves;
        let target = self.room.leave_target.load(Ordering::Relaxed);
        if target > 0 && seen >= target {
            let _ = tally.leaves_done_us.compare_exchange(
                0,
                now_micros(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
}

/// What a member does after reading a frame or a command (owned, so the
/// frame's borrow of the buffer has ended when it acts).
enum Action {
    Nothing,
    Pong(Vec<u8>),
    Ack(String),
    Send(&'static str),
    /// The pod sent a close frame (its code, to echo).
    Closed(Vec<u8>),
    Gone,
    Stop,
}

fn parse<'a>(text: &'a [u8]) -> Result<Frame<'a>, String> {
    serde_json::from_slice(text).map_err(|e| {
        format!(
            "not a server frame ({e}): {}",
            String::from_utf8_lossy(text)
        )
    })
}

fn refusal(frame: &Frame<'_>) -> String {
    format!(
        "{}: {}",
        frame.code.as_deref().unwrap_or("?"),
        frame.message.as_deref().unwrap_or("")
    )
}

async fn send_json(client: &mut Client, value: &serde_json::Value) -> Result<(), String> {
    client
        .send(OP_TEXT, value.to_string().as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))
}

/// The next text frame's payload, answering pings meanwhile.
async fn next_text(client: &mut Client) -> Result<Vec<u8>, String> {
    loop {
        let (opcode, payload) = match client.next().await {
            Ok(Some(frame)) => (frame.opcode, frame.payload.to_vec()),
            Ok(None) => return Err("closed".to_owned()),
            Err(e) => return Err(format!("reading: {e}")),
        };
        match opcode {
            OP_TEXT => return Ok(payload),
            OP_PING => client
                .send(OP_PONG, &payload)
                .await
                .map_err(|e| format!("pong: {e}"))?,
            OP_CLOSE => return Err(format!("closed: {}", raw::describe_close(&payload))),
            _ => {}
        }
    }
}

/// A wait from 0 up to `max`, so that members do not come back in step.
fn jitter(max: Duration) -> Duration {
    max.mul_f64(rand::random::<f64>())
}
