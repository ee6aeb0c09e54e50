//! Publishes, batched and pipelined: every publish waiting when the writer
//! gets to it goes out together, up to [`PER_CALL`] in one
//! [`scripts::PUBLISH`] call and the calls in one pipeline. So concurrent
//! publishes (and the items of a batch) share round trips, and in Redis they
//! share what each call costs besides the publishes themselves.
//!
//! Up to [`IN_FLIGHT`] pipelines are in flight; while they are, the next one
//! gathers. Publishes leave in the order they were queued, on one
//! connection, so the items of a batch for one topic get their seqs in the
//! batch's order.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use redis::Value;
use tokio::sync::{mpsc, oneshot};

use super::lineage::{self, Lineage};
use super::scripts::{self, Keys};
use super::shards::{Call, Shards};
use super::{META_TTL, millis, new_epoch, timed_each};
use crate::observe::Observer;
use crate::{BrokerError, IDEMPOTENCY_WINDOW};

/// Publishes waiting for the writer, at most: a caller waits for room past it.
pub const QUEUE: usize = 8192;
/// Publishes in one pipeline, at most.
const BATCH: usize = 1024;
/// Pipelines in flight at once: while Redis runs one, the pod reads the
/// answers of the one before, so Redis does not wait for the pod.
const IN_FLIGHT: usize = 2;
/// Publishes in one script call, at most: a call holds Redis for its
/// duration (about 10 µs a publish).
const PER_CALL: usize = 64;

/// One publish: its keys and arguments, as [`scripts::PUBLISH`] takes an item.
pub struct Item {
    /// The slot of the topic's keys in a cluster (0 otherwise): which
    /// items may share a call, and which lineage is theirs.
    pub slot: u16,
    pub meta: String,
    pub history: String,
    pub idempotency: Option<String>,
    pub data: Bytes,
    pub history_size: usize,
    pub history_ttl_ms: u64,
    pub channel: String,
    pub traceparent: Option<String>,
}

/// A publish, and who waits for its reply.
pub struct Pending {
    pub item: Item,
    pub done: oneshot::Sender<Result<Value, BrokerError>>,
}

pub struct Publisher {
    pub shards: Shards,
    pub keys: Keys,
    pub lineage: Arc<Lineage>,
    pub observer: Arc<dyn Observer>,
}

impl Publisher {
    pub async fn run(self, mut queue: mpsc::Receiver<Pending>) {
        let mut in_flight = FuturesOrdered::new();
        let mut gathered = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                // First: a pipeline just pushed is polled, and so sent,
                // before the next one is.
                biased;
                Some((batch, replies)) = in_flight.next(), if !in_flight.is_empty() => {
                    answer(batch, replies);
                }
                n = queue.recv_many(&mut gathered, BATCH), if in_flight.len() < self.in_flight() => {
                    if n == 0 {
                        break;
                    }
                    // What nobody waits for any more (its caller timed out)
                    // is not sent.
                    gathered.retain(|pending| !pending.done.is_closed());
                    if gathered.is_empty() {
                        continue;
                    }
                    let batch = std::mem::replace(&mut gathered, Vec::with_capacity(BATCH));
                    let this = &self;
                    in_flight.push_back(async move {
                        let replies = this.send(&batch).await;
                        (batch, replies)
                    });
                }
            }
        }
        while let Some((batch, replies)) = in_flight.next().await {
            answer(batch, replies);
        }
    }

    /// Pipelines at once: one in a cluster, where a publish redirected is
    /// sent again after its pipeline came back, and must not be overtaken
    /// by the next pipeline's publishes of its topic.
    fn in_flight(&self) -> usize {
        if self.shards.is_cluster() {
            1
        } else {
            IN_FLIGHT
        }
    }

    /// The batch in calls of up to [`PER_CALL`] publishes of one slot, in
    /// one pipeline per master: a reply per publish, in order.
    async fn send(&self, batch: &[Pending]) -> Result<Vec<Value>, BrokerError> {
        // Each call's publishes, as indices into the batch, in order.
        let mut calls: Vec<Vec<usize>> = Vec::new();
        let mut open: Vec<(u16, usize)> = Vec::new();
        for (i, pending) in batch.iter().enumerate() {
            let slot = pending.item.slot;
            match open.iter().position(|(s, _)| *s == slot) {
                Some(at) if calls[open[at].1].len() < PER_CALL => calls[open[at].1].push(i),
                Some(at) => {
                    open[at].1 = calls.len();
                    calls.push(vec![i]);
                }
                None => {
                    open.push((slot, calls.len()));
                    calls.push(vec![i]);
                }
            }
        }
        let invocations: Vec<_> = calls
            .iter()
            .map(|call| {
                let items: Vec<&Item> = call.iter().map(|&i| &batch[i].item).collect();
                Call {
                    slot: items[0].slot,
                    script: &scripts::PUBLISH,
                    invocation: self.invocation(&items),
                }
            })
            .collect();
        let sending = self.shards.scripts(&invocations);
        let replies = timed_each(&*self.observer, "publish", sending).await;
        let mut answers: Vec<Option<Value>> = (0..batch.len()).map(|_| None).collect();
        for (call, reply) in calls.iter().zip(replies) {
            let replies: Vec<Value> = match reply {
                Ok(Value::Array(items)) if items.len() == call.len() => items,
                // An error for the whole call (it did not run).
                Ok(Value::ServerError(e)) => vec![Value::ServerError(e); call.len()],
                Ok(other) => {
                    return Err(BrokerError::Unavailable(format!(
                        "redis: an unexpected publish reply {other:?}"
                    )));
                }
                Err(e) => return Err(super::unavailable(e)),
            };
            for (&i, reply) in call.iter().zip(replies) {
                answers[i] = Some(reply);
            }
        }
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or(Value::Nil))
            .collect())
    }

    fn invocation(&self, call: &[&Item]) -> redis::ScriptInvocation<'static> {
        let slot = call.first().map_or(0, |item| item.slot);
        let mut invocation = scripts::PUBLISH.prepare_invoke();
        invocation
            .key(self.keys.lineage(slot))
            .arg(self.lineage.known(slot))
            .arg(lineage::fresh())
            .arg(millis(META_TTL))
            .arg(millis(IDEMPOTENCY_WINDOW))
            .arg(new_epoch())
            .arg(if self.shards.is_cluster() {
                "SPUBLISH"
            } else {
                "PUBLISH"
            });
        for item in call {
            invocation.key(&item.meta).key(&item.history);
            if let Some(key) = &item.idempotency {
                invocation.key(key);
            }
            invocation
                .arg(item.data.as_ref())
                .arg(item.history_size)
                .arg(item.history_ttl_ms)
                .arg(&item.channel)
                .arg(if item.idempotency.is_some() { "1" } else { "0" })
                .arg(item.traceparent.as_deref().unwrap_or(""));
        }
        invocation
    }
}

/// Hands each publish of a batch its reply.
fn answer(batch: Vec<Pending>, replies: Result<Vec<Value>, BrokerError>) {
    match replies {
        Ok(replies) => {
            let mut replies = replies.into_iter();
            for pending in batch {
                let reply = replies.next().ok_or_else(|| {
                    BrokerError::Unavailable("redis: a publish went unanswered".into())
                });
                let _ = pending.done.send(reply);
            }
        }
        Err(e) => {
            for pending in batch {
                let _ = pending.done.send(Err(e.clone()));
            }
        }
    }
}
