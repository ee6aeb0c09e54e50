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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use redis::Value;
use tokio::sync::{mpsc, oneshot};

use super::call::all_ok;
use super::lineage::{self, Lineage};
use super::replies::publish_call;
use super::scripts::{self, Keys};
use super::shards::{Call, Shards};
use super::{META_TTL, millis, new_epoch};
use crate::observe::Observer;
use crate::{BrokerError, IDEMPOTENCY_WINDOW, Unavailable};

/// Publishes waiting for the writer, at most: a caller waits for room past it.
pub const QUEUE: usize = 8192;
/// Publishes in one pipeline, at most.
const BATCH: usize = 1024;
/// Pipelines in flight at once: while Redis runs one, the pod reads the
/// answers of the one before, so Redis does not wait for the pod. (What a
/// cluster redirects is sent again in the pipelines' order: see
/// [`Publisher::finish`].)
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

/// A batch on its way: its calls, and what Redis answered so far.
struct Sent {
    batch: Vec<Pending>,
    /// Each call's publishes, as indices into the batch.
    plan: Vec<Vec<usize>>,
    calls: Vec<Call<'static>>,
    replies: Vec<redis::RedisResult<Value>>,
    started: Instant,
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
                Some(sent) = in_flight.next(), if !in_flight.is_empty() => {
                    self.finish(sent).await;
                }
                n = queue.recv_many(&mut gathered, BATCH), if in_flight.len() < IN_FLIGHT => {
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
                    in_flight.push_back(self.send(batch));
                }
            }
        }
        while let Some(sent) = in_flight.next().await {
            self.finish(sent).await;
        }
    }

    /// Sends the batch in calls of up to [`PER_CALL`] publishes of one slot,
    /// in one pipeline per master.
    async fn send(&self, batch: Vec<Pending>) -> Sent {
        let started = Instant::now();
        // Each call's publishes, as indices into the batch, in order.
        let mut plan: Vec<Vec<usize>> = Vec::new();
        // Each slot's call still taking publishes: a batch of a cluster's
        // may hold as many slots as publishes.
        let mut open: HashMap<u16, usize> = HashMap::new();
        for (i, pending) in batch.iter().enumerate() {
            let call = open.entry(pending.item.slot).or_insert(plan.len());
            match plan.get_mut(*call) {
                Some(publishes) if publishes.len() < PER_CALL => publishes.push(i),
                _ => {
                    *call = plan.len();
                    plan.push(vec![i]);
                }
            }
        }
        let calls: Vec<Call<'static>> = plan
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
        let replies = self.shards.send(&calls).await;
        Sent {
            batch,
            plan,
            calls,
            replies,
            started,
        }
    }

    /// Follows the cluster for what came back redirected, and hands each
    /// publish its reply. Run in the pipelines' order, one at a time: a
    /// publish sent again reaches Redis before any later pipeline built
    /// after it, so the publishes of a topic keep their order.
    async fn finish(&self, sent: Sent) {
        let Sent {
            batch,
            plan,
            calls,
            replies,
            started,
        } = sent;
        let replies = self.shards.follow(&calls, replies).await;
        self.observer
            .redis_call("publish", started.elapsed().as_secs_f64(), all_ok(&replies));
        let mut answers: Vec<Option<Result<Value, BrokerError>>> =
            (0..batch.len()).map(|_| None).collect();
        for (call, reply) in plan.iter().zip(replies) {
            let replies = publish_call(reply, call.len());
            for (&i, reply) in call.iter().zip(replies) {
                answers[i] = Some(reply);
            }
        }
        for (pending, answer) in batch.into_iter().zip(answers) {
            let answer = answer.unwrap_or_else(|| {
                Err(BrokerError::Unavailable(Unavailable::Unanswered("publish")))
            });
            let _ = pending.done.send(answer);
        }
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
