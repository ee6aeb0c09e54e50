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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub use event::{Event, Type};
use event::Stamped;
use queue::Queue;

use crate::config::WebhooksConfig;
use crate::metrics::Metrics;

/// The pod's webhooks: off (nothing wanted) unless `[webhooks] url` is set.
pub struct Webhooks {
    queue: Option<Queue>,
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
        tokio::spawn(sender.run(drain));
        let wanted = Type::ALL
            .iter()
            .filter(|t| config.wants(t.as_str()))
            .fold(0, |bits, t| bits | t.bit());
        Arc::new(Self {
            queue: Some(queue),
            wanted,
            next: AtomicU64::new(1),
        })
    }

    /// No webhooks.
    pub fn off() -> Self {
        Self {
            queue: None,
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
        let _ = queue.push(Stamped { id, time, event });
    }
}
