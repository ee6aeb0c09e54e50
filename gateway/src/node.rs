//! The pod's shared state: configuration, hub, broker, live sessions, metrics,
//! and the drain signal. One per running gateway; every connection holds it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use proto::ServerMessage;
use rand::Rng;
use router::{
    Broker, BrokerError, MemoryBroker, Namespaces, RedisBroker, SessionSave, SessionSnapshot,
    SessionStore,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{BrokerKind, Config};
use crate::disconnect::CloseReason;
use crate::frame;
use crate::hub::{ConnId, Hub};
use crate::metrics::Metrics;
use crate::outbound::Outbound;
use crate::rebalance;
use crate::session::Subscriptions;

/// How long a resume waits for the connection it takes over to let go.
const TAKEOVER_WAIT: Duration = Duration::from_secs(2);

pub struct Node {
    pub config: Config,
    pub hub: Arc<Hub>,
    pub broker: Arc<dyn Broker>,
    pub sessions: Arc<dyn SessionStore>,
    pub namespaces: Arc<Namespaces>,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the pod starts draining.
    pub drain: CancellationToken,
    /// Every connection task, upgraded or not: shutdown waits for them.
    pub tasks: TaskTracker,
    /// The zero of ping timestamps.
    pub clock: Instant,
    live: Mutex<HashMap<Arc<str>, LiveSession>>,
    connections: AtomicUsize,
    next_conn: AtomicU64,
}

/// A session a connection on this pod serves.
#[derive(Clone)]
pub struct LiveSession {
    pub conn: ConnId,
    /// The connection's token as the session's owner in the store.
    pub owner: Arc<str>,
    pub out: Outbound,
    pub subscriptions: Subscriptions,
    /// Cancelled when a newer connection resumes the session.
    pub takeover: CancellationToken,
    /// Cancelled by the connection once it has saved the session.
    pub ended: CancellationToken,
}

impl Node {
    /// Builds the pod's state and connects its broker (for Redis: failing
    /// when Redis cannot be reached now).
    pub async fn start(config: Config) -> Result<Arc<Self>, BrokerError> {
        let metrics = Arc::new(Metrics::new());
        metrics
            .connections_max
            .set(i64::try_from(config.websocket.max_connections).unwrap_or(i64::MAX));
        let hub = Arc::new(Hub::new(metrics.clone(), config.queue.frames));
        let namespaces = Arc::new(config.namespaces());
        let (broker, sessions): (Arc<dyn Broker>, Arc<dyn SessionStore>) = match config.broker {
            BrokerKind::Memory => {
                let memory = MemoryBroker::new(namespaces.clone(), hub.clone());
                (Arc::new(memory.clone()), Arc::new(memory))
            }
            BrokerKind::Redis => {
                let redis = RedisBroker::connect(
                    config.redis.settings(),
                    namespaces.clone(),
                    hub.clone(),
                    metrics.clone(),
                )
                .await?;
                (Arc::new(redis.clone()), Arc::new(redis))
            }
        };
        let shared_sessions = config.broker != BrokerKind::Memory;
        let node = Arc::new(Self {
            config,
            hub,
            broker,
            sessions,
            namespaces,
            metrics,
            drain: CancellationToken::new(),
            tasks: TaskTracker::new(),
            clock: Instant::now(),
            live: Mutex::new(HashMap::new()),
            connections: AtomicUsize::new(0),
            next_conn: AtomicU64::new(1),
        });
        // A pod-local store loses sessions with the pod anyway; a shared one
        // gets what changed, in batches, so that a pod killed without warning
        // loses at most one interval of acks.
        if shared_sessions {
            tokio::spawn(flush_forever(Arc::downgrade(&node)));
        }
        if node.config.rebalance.enabled {
            // Random, not the host name: two pods may share a host.
            let pod: Arc<str> = Arc::from(format!("{:016x}", rand::random::<u64>()));
            tracing::info!(%pod, "rebalancing with the other pods");
            tokio::spawn(rebalance::run(Arc::downgrade(&node), pod));
        }
        Ok(node)
    }

    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// Takes one of the pod's connection slots, unless all are taken.
    pub fn admit(self: &Arc<Self>) -> Option<Admission> {
        let max = self.config.websocket.max_connections;
        self.connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        self.metrics.connections.inc();
        self.metrics.connections_opened.inc();
        Some(Admission {
            node: self.clone(),
            conn: self.next_conn.fetch_add(1, Ordering::Relaxed),
        })
    }

    fn live(&self) -> MutexGuard<'_, HashMap<Arc<str>, LiveSession>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that a connection now serves session `id`.
    pub fn register(&self, id: Arc<str>, session: LiveSession) {
        self.live().insert(id, session);
    }

    /// Open WebSocket connections.
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// Asks up to `count` sessions to reconnect elsewhere, each after a random
    /// delay within `spread`; returns how many were asked.
    pub fn ask_to_move(&self, count: usize, spread: Duration) -> usize {
        let spread_ms = spread.as_millis().max(1) as u64;
        let mut asked = 0;
        for live in self.live().values() {
            if asked == count {
                break;
            }
            if live.out.is_closing() {
                continue;
            }
            let after_ms = rand::thread_rng().gen_range(0..spread_ms);
            let advice = frame::message(&ServerMessage::Reconnect {
                after_ms,
                reason: "rebalance",
            });
            live.out.close_after(advice, CloseReason::Rebalance);
            asked += 1;
        }
        asked
    }

    /// Saves every live session that changed since its last save, in one
    /// batch.
    pub async fn flush_sessions(&self) {
        let changed: Vec<SessionSave> = self
            .live()
            .iter()
            .filter_map(|(id, live)| {
                Some(SessionSave {
                    id: id.clone(),
                    owner: live.owner.clone(),
                    snapshot: live.subscriptions.changed()?,
                })
            })
            .collect();
        if changed.is_empty() {
            return;
        }
        let window = self.config.session.resume_window;
        if let Err(e) = self.sessions.save_many(changed, window).await {
            tracing::warn!(error = %e, "sessions not saved");
        }
    }

    pub fn deregister(&self, id: &str, conn: ConnId) {
        let mut live = self.live();
        if live.get(id).is_some_and(|l| l.conn == conn) {
            live.remove(id);
        }
    }

    /// Ends the connection that serves session `id` on this pod, if any, and
    /// returns its owner token and the session as that connection left it:
    /// a resume must see its latest acks, and must not depend on the store
    /// having them yet (with the memory broker a session is stored only when
    /// its connection ends, which a half-open connection may take long to do).
    pub async fn take_over(&self, id: &str) -> Option<(Arc<str>, SessionSnapshot)> {
        let current = self.live().get(id).cloned()?;
        current.takeover.cancel();
        // Its reader stops between commands: wait for that, briefly.
        let _ = tokio::time::timeout(TAKEOVER_WAIT, current.ended.cancelled()).await;
        Some((current.owner, current.subscriptions.snapshot()))
    }
}

async fn flush_forever(node: Weak<Node>) {
    let Some(every) = node.upgrade().map(|n| n.config.session.flush_interval) else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match node.upgrade() {
            Some(node) => node.flush_sessions().await,
            None => return,
        }
    }
}

/// A connection slot, given back on drop.
pub struct Admission {
    node: Arc<Node>,
    pub conn: ConnId,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.node.connections.fetch_sub(1, Ordering::AcqRel);
        self.node.metrics.connections.dec();
    }
}
