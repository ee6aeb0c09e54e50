//! Webhooks (issue #24): events batched, signed, and POSTed to the
//! application's backend by one sender per pod (`[webhooks]`,
//! docs/hooks.md).
//!
//! - [`event`]: the event types and their JSON.
//! - [`queue`]: the bounded queue between whoever has an event and the
//!   sender; a full queue drops, never waits.
//! - [`sender`]: batching, the HMAC-SHA256 signature, retries in order.
//!
//! The pod calls [`Webhooks::emit`]; [`Webhooks::wants`] first, where an
//! event costs something to build. `topic.occupied`/`vacated` come from the
//! broker (its occupancy across pods: exactly one pod reports each
//! transition); `presence.join`/`leave` from the presence changes this pod
//! applies, under the rule in [`crate::node`].

pub mod event;
pub mod queue;
pub mod sender;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};

use event::Stamped;
pub use event::{Event, Type};
use queue::Queue;

use bytes::Bytes;
use router::{Position, Topic};
use tokio::sync::Notify;

use crate::admission::ConnId;
use crate::config::WebhooksConfig;
use crate::disconnect::CloseReason;
use crate::metrics::Metrics;

/// The pod's webhooks: off (nothing wanted) unless `[webhooks] url` is set.
pub struct Webhooks {
    queue: Option<Queue>,
    /// Events queued and not yet acknowledged or dropped: what a departing
    /// pod waits for ([`Webhooks::flush`]).
    pending: Arc<Pending>,
    /// How long [`Webhooks::flush`] waits: one POST's timeout.
    flush_for: Duration,
    /// The [`Type::bit`]s of the types configured.
    wanted: u8,
    next: AtomicU64,
}

impl Webhooks {
    /// Starts the sender (a task until the pod's last [`Webhooks`] is
    /// dropped) when webhooks are on. `pod`: the pod's name, made an
    /// instance of its own with a random suffix, so that event ids stay
    /// unique across restarts.
    pub fn start(config: &WebhooksConfig, pod: &str, metrics: Arc<Metrics>) -> Arc<Self> {
        if !config.enabled() {
            return Arc::new(Self::off());
        }
        let instance: Arc<str> = Arc::from(format!("{pod}-{:08x}", rand::random::<u32>()));
        let sender = match sender::Sender::new(config, instance, metrics.clone()) {
            Ok(sender) => sender,
            Err(e) => {
                tracing::error!(error = %e, "webhooks: cannot send: off");
                return Arc::new(Self::off());
            }
        };
        let (queue, drain) = queue::bounded(config.queue, metrics);
        let pending = Arc::new(Pending::default());
        tokio::spawn(sender.run(drain, pending.clone()));
        let wanted = Type::ALL
            .iter()
            .filter(|t| config.wants(t.as_str()))
            .fold(0, |bits, t| bits | t.bit());
        Arc::new(Self {
            queue: Some(queue),
            pending,
            flush_for: config.timeout,
            wanted,
            next: AtomicU64::new(1),
        })
    }

    /// No webhooks.
    pub fn off() -> Self {
        Self {
            queue: None,
            pending: Arc::default(),
            flush_for: Duration::ZERO,
            wanted: 0,
            next: AtomicU64::new(1),
        }
    }

    /// Whether events of `kind` are sent.
    pub fn wants(&self, kind: Type) -> bool {
        self.wanted & kind.bit() != 0
    }

    /// Queues `event` if its type is wanted, without waiting (a full queue
    /// drops it: [`queue::Overflow`]).
    pub fn emit(&self, event: Event) {
        let Some(queue) = &self.queue else {
            return;
        };
        if !self.wants(event.kind()) {
            return;
        }
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.pending.count.fetch_add(1, Ordering::AcqRel);
        if queue.push(Stamped { id, time, event }).is_err() {
            self.pending.done(1);
        }
    }

    /// Waits (one POST's timeout at most) until every event queued so far
    /// was acknowledged or dropped: a departing pod's last events (its
    /// connections' closes, its topics' vacated) leave before it exits.
    pub async fn flush(&self) {
        let deadline = tokio::time::Instant::now() + self.flush_for;
        loop {
            let idle = self.pending.idle.notified();
            let left = self.pending.count.load(Ordering::Acquire);
            if left == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                tracing::warn!(
                    events = left,
                    "webhooks: the pod leaves with events not yet acknowledged"
                );
                return;
            }
        }
    }
}

/// Events between [`Webhooks::emit`] and their batch's end.
#[derive(Default)]
pub struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

impl Pending {
    /// `n` events were acknowledged or dropped.
    pub fn done(&self, n: usize) {
        if self.count.fetch_sub(n, Ordering::AcqRel) == n {
            self.idle.notify_waiters();
        }
    }
}

/// What the session tells, each a line at its call site: the event is
/// built only when its type is wanted.
impl Webhooks {
    /// A connection's `hello` succeeded (`connection.open`).
    pub fn opened(&self, client: ConnId, user: Option<&Arc<str>>, remote_addr: IpAddr) {
        if self.wants(Type::Open) {
            self.emit(Event::Open {
                client,
                user: user.cloned(),
                remote_addr,
            });
        }
    }

    /// A connection that had said `hello` ended (`connection.close`): its
    /// close code (where the server sent none: 1000 when the client closed,
    /// 1006 when the connection was lost) and reason.
    pub fn closed(&self, client: ConnId, user: Option<&Arc<str>>, reason: CloseReason) {
        if self.wants(Type::Close) {
            self.emit(Event::Close {
                client,
                user: user.cloned(),
                code: reason.code().unwrap_or(match reason {
                    CloseReason::ClientClosed => 1000,
                    _ => 1006,
                }),
                reason: reason.as_str(),
            });
        }
    }

    /// What [`Webhooks::published`] needs of a client's `pub`'s data,
    /// kept only when `client.publish` is wanted.
    pub fn keep_data(&self, data: &Bytes) -> Option<Bytes> {
        self.wants(Type::Publish).then(|| data.clone())
    }

    /// A client's `pub` was published (`client.publish`); `data` from
    /// [`Webhooks::keep_data`].
    pub fn published(
        &self,
        topic: &Topic,
        user: Option<&Arc<str>>,
        position: &Position,
        data: Option<Bytes>,
    ) {
        if let Some(data) = data {
            self.emit(Event::Publish {
                topic: topic.clone(),
                user: user.cloned(),
                seq: position.seq,
                epoch: position.epoch.clone(),
                data,
            });
        }
    }
}
