//! A follower: the project's Rust client ([`herald_client`]) following one
//! topic across pods for as long as a test needs, with what the scale-out
//! tests judge recorded rather than panicked on (a test runs thousands of
//! them, and one precise summary beats a thousand panicking tasks).
//!
//! The client does the work: it resumes its session at a pod picked at
//! random from a [`Service`] (as a Kubernetes Service would), waits as
//! `reconnect` advice says or a jittered backoff, falls back to `sub` with
//! `since`, applies the seq rule and acks with the epoch. This adapter only
//! adds the test's side: the changing pod list, a gate on first connects,
//! when to stop, and the counts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use herald_client::{Acks, Backoff, Cause, Client, Endpoints, Error, ErrorCode, Event, State};
use rand::seq::SliceRandom;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_util::sync::CancellationToken;

/// Longest a follower told to give up may take to say where it stood.
const GIVING_UP: Duration = Duration::from_secs(10);
/// Acks are cumulative: one at most this often.
const ACK_INTERVAL: Duration = Duration::from_millis(20);
/// Backoff after a failed connect: up to 100 ms, doubling to 2 s.
const BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(100),
    cap: Duration::from_secs(2),
};
/// Frames are tiny and there are thousands of clients.
const READ_BUFFER: usize = 4096;

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

impl Endpoints for Service {
    fn pick(&self, _previous: Option<&str>) -> Option<String> {
        Service::pick(self).map(|pod| format!("ws://{pod}/ws"))
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
    /// Seqs processed, in order (after the client's seq rule).
    pub processed: Vec<u64>,
    /// The seq the first subscription started after (its `ok`).
    pub started_after: u64,
    /// Messages the client dropped by the seq rule: delivered a second time.
    pub wire_duplicates: u64,
    /// Connections after the first one that reached `welcome`.
    pub resumes: u32,
    /// Resumes answered `resumed: false`.
    pub failed_resumes: u32,
    /// `err` while following that the client retries (`unavailable`: a
    /// subscription the pod could not take right then).
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

impl Follow {
    pub async fn run(mut self) -> Followed {
        let mut seen = Followed::default();
        let mut permit = match &self.gate {
            Some(gate) => gate.clone().acquire_owned().await.ok(),
            None => None,
        };
        let built = Client::with_endpoints(self.service.clone())
            .resume(self.resume)
            .acks(Acks::Auto {
                interval: ACK_INTERVAL,
            })
            .backoff(BACKOFF)
            .read_buffer(READ_BUFFER)
            .report_dropped(true)
            .build();
        let (client, mut events) = match built {
            Ok(built) => built,
            Err(e) => {
                seen.incomplete = Some(format!("no client: {e}"));
                return seen;
            }
        };
        if let Err(e) = client.subscribe(self.topic.as_str(), None) {
            seen.incomplete = Some(format!("not subscribed: {e}"));
            return seen;
        }
        let mut last: Option<u64> = None;
        let mut welcomed = 0u32;
        let mut watching = true;
        loop {
            if last.is_some_and(|l| self.last.borrow().is_some_and(|end| l >= end)) {
                client.close();
                return seen;
            }
            // Every branch is cancel-safe (`Events::next` is).
            let event = tokio::select! {
                biased;
                _ = self.give_up.cancelled() => {
                    seen.incomplete = Some(format!(
                        "gave up at seq {} ({} processed)",
                        last.unwrap_or(0),
                        seen.processed.len()
                    ));
                    client.close();
                    return seen;
                }
                // The last seq became known: look again.
                changed = self.last.changed(), if watching => {
                    if changed.is_err() {
                        // The sender is gone: the last seq is what it is.
                        watching = false;
                        if self.last.borrow().is_none() {
                            seen.incomplete = Some("the test stopped without a last seq".into());
                            client.close();
                            return seen;
                        }
                    }
                    continue;
                }
                event = events.next() => event,
            };
            let Some(event) = event else {
                seen.incomplete = Some(format!(
                    "the client stopped at seq {} ({} processed)",
                    last.unwrap_or(0),
                    seen.processed.len()
                ));
                return seen;
            };
            match event {
                Event::Message(m) => {
                    if let Some(l) = last
                        && m.seq != l + 1
                    {
                        seen.problems
                            .push(format!("a gap: seq {} after {l}", m.seq));
                    }
                    last = Some(m.seq);
                    seen.processed.push(m.seq);
                }
                Event::Dropped { .. } => seen.wire_duplicates += 1,
                Event::Subscribed { seq, recovered, .. } => match last {
                    None => {
                        last = Some(seq);
                        seen.started_after = seq;
                        permit.take();
                        if let Some(subscribed) = self.subscribed.take() {
                            let _ = subscribed.send(seq);
                        }
                    }
                    Some(at) if recovered != Some(true) => seen
                        .problems
                        .push(format!("`sub` with since {at} not recovered")),
                    Some(_) => {}
                },
                Event::Reset { epoch, seq, .. } => seen
                    .problems
                    .push(format!("reset to seq {seq} of epoch {epoch}")),
                Event::State(State::Connected { resume_refused, .. }) => {
                    welcomed += 1;
                    if welcomed > 1 {
                        seen.resumes += 1;
                    }
                    if resume_refused.is_some() && last.is_some() {
                        // The client repairs it with `since`; counted, so
                        // that one failure does not hide what follows.
                        seen.failed_resumes += 1;
                    }
                }
                Event::State(State::Resumed { .. }) => {
                    welcomed += 1;
                    if welcomed > 1 {
                        seen.resumes += 1;
                    }
                }
                Event::State(State::Disconnected {
                    close,
                    advice,
                    cause,
                    ..
                }) => {
                    seen.closes.push(close);
                    match advice.as_ref().map(|a| a.reason.as_str()) {
                        Some("draining") => seen.advised_draining += 1,
                        Some("rebalance") => seen.advised_rebalance += 1,
                        Some(other) => seen.problems.push(format!("reconnect for {other:?}")),
                        None => {}
                    }
                    if cause == Cause::Silent {
                        seen.problems.push("a silent connection".to_owned());
                    }
                }
                Event::Error(Error::Connect { reason, .. }) => {
                    *seen.refused.entry(reason).or_default() += 1;
                }
                Event::Error(
                    e @ Error::Server {
                        code: ErrorCode::Unavailable,
                        ..
                    },
                ) => seen.resubscribed.push(e.to_string()),
                Event::Error(e) => seen.problems.push(e.to_string()),
                _ => {}
            }
        }
    }
}
