//! One Redis call as the engine makes it: timed and reported to the
//! [`Observer`], its failure a [`BrokerError`].

use std::time::Instant;

use redis::Value;

use crate::observe::Observer;
use crate::{BrokerError, Unavailable};

/// A Redis call (`call`, as the metrics name it) failed with `e`.
pub(super) fn failed(call: &'static str, e: redis::RedisError) -> BrokerError {
    BrokerError::Unavailable(Unavailable::Redis { call, source: e })
}

/// Redis answered `reply` in a shape the engine does not read.
pub(super) fn unreadable(reply: &'static str) -> BrokerError {
    BrokerError::Unavailable(Unavailable::Protocol { reply })
}

/// Runs one Redis call, reporting its time and outcome.
pub(super) async fn timed<T>(
    observer: &dyn Observer,
    op: &'static str,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, BrokerError> {
    timed_raw(observer, op, call)
        .await
        .map_err(|e| failed(op, e))
}

/// [`timed`], keeping Redis's error: for a caller that decides by its kind.
pub(super) async fn timed_raw<T>(
    observer: &dyn Observer,
    op: &'static str,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    let start = Instant::now();
    let result = call.await;
    observer.redis_call(op, start.elapsed().as_secs_f64(), result.is_ok());
    result
}

/// Runs many calls at once ([`super::shards::Shards::scripts`]), reporting their time, and
/// an error if any of them failed.
pub(super) async fn timed_each(
    observer: &dyn Observer,
    op: &'static str,
    calls: impl Future<Output = Vec<redis::RedisResult<Value>>>,
) -> Vec<redis::RedisResult<Value>> {
    let start = Instant::now();
    let replies = calls.await;
    observer.redis_call(op, start.elapsed().as_secs_f64(), all_ok(&replies));
    replies
}

/// Whether every call succeeded: no error, and no error reply.
pub(super) fn all_ok(replies: &[redis::RedisResult<Value>]) -> bool {
    replies
        .iter()
        .all(|r| matches!(r, Ok(value) if !matches!(value, Value::ServerError(_))))
}
