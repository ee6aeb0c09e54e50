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
use redis::{ServerErrorKind, Value};
use tokio::sync::{mpsc, oneshot};

use super::connection::Commands;
use super::lineage::{self, Lineage};
use super::scripts::{self, Keys};
use super::{META_TTL, millis, new_epoch, timed};
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
    pub conn: Commands,
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
                n = queue.recv_many(&mut gathered, BATCH), if in_flight.len() < IN_FLIGHT => {
                    if n == 0 {
                        break;
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

    /// One pipeline of calls of up to [`PER_CALL`] publishes: a reply per
    /// publish, in order.
    async fn send(&self, batch: &[Pending]) -> Result<Vec<Value>, BrokerError> {
        let mut pipe = redis::pipe();
        for call in batch.chunks(PER_CALL) {
            pipe.invoke_script(&self.invocation(call));
        }
        let mut conn = self.conn.clone();
        // Each call's error is its own.
        pipe.ignore_errors();
        let sending = async {
            let replies: Vec<Value> = pipe.query_async(&mut conn).await?;
            // Redis forgot its scripts (it restarted): a pipeline does not
            // load them, so load it and send the batch again (none of it
            // ran: every call failed the same way).
            if replies.iter().any(no_script) {
                scripts::PUBLISH.load_async(&mut conn).await?;
                return pipe.query_async(&mut conn).await;
            }
            Ok(replies)
        };
        let calls: Vec<Value> = timed(&*self.observer, "publish", sending).await?;
        let mut replies = Vec::with_capacity(batch.len());
        for (call, reply) in batch.chunks(PER_CALL).zip(calls) {
            match reply {
                Value::Array(items) if items.len() == call.len() => replies.extend(items),
                // An error for the whole call (it did not run).
                Value::ServerError(e) => {
                    replies.extend(std::iter::repeat_n(Value::ServerError(e), call.len()))
                }
                other => {
                    return Err(BrokerError::Unavailable(format!(
                        "redis: an unexpected publish reply {other:?}"
                    )));
                }
            }
        }
        Ok(replies)
    }

    fn invocation(&self, call: &[Pending]) -> redis::ScriptInvocation<'static> {
        let mut invocation = scripts::PUBLISH.prepare_invoke();
        invocation
            .key(self.keys.lineage())
            .arg(self.lineage.known())
            .arg(lineage::fresh())
            .arg(millis(META_TTL))
            .arg(millis(IDEMPOTENCY_WINDOW))
            .arg(new_epoch());
        for Pending { item, .. } in call {
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

fn no_script(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}
