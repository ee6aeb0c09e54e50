//! The pod's outgoing events: a bounded queue the sender drains.
//!
//! Whoever has an event (a session, the broker's sink while it may hold a
//! lock of its own) pushes without waiting: when the queue holds `queue`
//! events already (the backend is down longer than the queue lasts), the
//! event is dropped ([`Overflow::DropNewest`]), counted and logged at most
//! once a second. Delivery to clients never waits for the backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::event::Stamped;
use crate::metrics::Metrics;

/// What happens to an event pushed onto a full queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// The new event is dropped: the backend sees a gap in the ids.
    DropNewest,
}

/// The sending end, shared by everyone with an event.
pub struct Queue {
    tx: mpsc::Sender<Stamped>,
    metrics: Arc<Metrics>,
    /// When the last drop was logged (ms since `start`, +1; 0: never).
    logged: AtomicU64,
    start: Instant,
}

/// The receiving end, the sender's.
pub struct Drain {
    rx: mpsc::Receiver<Stamped>,
    metrics: Arc<Metrics>,
}

/// A queue of at most `capacity` events.
pub fn bounded(capacity: usize, metrics: Arc<Metrics>) -> (Queue, Drain) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (
        Queue {
            tx,
            metrics: metrics.clone(),
            logged: AtomicU64::new(0),
            start: Instant::now(),
        },
        Drain { rx, metrics },
    )
}

impl Queue {
    /// Queues `event` unless the queue is full (then [`Overflow::DropNewest`]).
    /// Never waits.
    pub fn push(&self, event: Stamped) -> Result<(), Overflow> {
        let kind = event.event.kind().as_str();
        match self.tx.try_send(event) {
            Ok(()) => {
                self.metrics.webhook_queue.inc();
                self.metrics
                    .webhook_events
                    .with_label_values(&[kind, "queued"])
                    .inc();
                Ok(())
            }
            Err(_) => {
                self.metrics
                    .webhook_events
                    .with_label_values(&[kind, "dropped_full"])
                    .inc();
                self.log_drop();
                Err(Overflow::DropNewest)
            }
        }
    }

    /// At most one warning a second, however many are dropped.
    fn log_drop(&self) {
        let now = self.start.elapsed().as_millis() as u64 + 1;
        let last = self.logged.load(Ordering::Relaxed);
        if last != 0 && now < last + Duration::from_secs(1).as_millis() as u64 {
            return;
        }
        if self
            .logged
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                "webhooks: the outgoing queue is full (the backend is slow or down): events dropped"
            );
        }
    }
}

impl Drain {
    /// The next event; `None` once every [`Queue`] is gone.
    pub async fn next(&mut self) -> Option<Stamped> {
        let event = self.rx.recv().await;
        if event.is_some() {
            self.metrics.webhook_queue.dec();
        }
        event
    }

    /// The next event if it comes by `deadline`.
    pub async fn next_by(&mut self, deadline: tokio::time::Instant) -> Option<Stamped> {
        match tokio::time::timeout_at(deadline, self.rx.recv()).await {
            Ok(Some(event)) => {
                self.metrics.webhook_queue.dec();
                Some(event)
            }
            _ => None,
        }
    }
}
