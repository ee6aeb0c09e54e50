//! What the engine reads out of Redis's replies: pure functions over
//! [`redis::Value`], each `None` (or an error) for a reply of another shape.

use std::sync::Arc;

use bytes::Bytes;
use redis::Value;

use super::recover::Recovered;
use crate::{Epoch, Position, Publication, Topic};

pub(super) fn parse_recovered(topic: &Topic, value: Value) -> Option<(Recovered, String)> {
    let Value::Array(items) = value else {
        return None;
    };
    let mut items = items.into_iter();
    let seq = as_u64(&items.next()?)?;
    let epoch: Epoch = Arc::from(as_string(&items.next()?)?);
    let now_ms = as_u64(&items.next()?)?;
    let clock = as_u64(&items.next()?)?;
    let line = as_string(&items.next()?)?;
    let entries = match items.next() {
        Some(entries) => Some(parse_entries(topic, &epoch, entries)?),
        None => None,
    };
    let base = match items.next() {
        Some(base) => Some(as_u64(&base)?),
        None => None,
    };
    Some((
        Recovered {
            position: Position { epoch, seq },
            now_ms,
            clock,
            entries,
            base,
        },
        line,
    ))
}

/// Parses an `XRANGE` reply into publications, with each one's publish time.
pub(super) fn parse_entries(
    topic: &Topic,
    epoch: &Epoch,
    value: Value,
) -> Option<Vec<(Publication, u64)>> {
    let Value::Array(entries) = value else {
        return None;
    };
    entries
        .into_iter()
        .map(|entry| {
            let Value::Array(parts) = entry else {
                return None;
            };
            let mut parts = parts.into_iter();
            let id = as_string(&parts.next()?)?;
            let seq = id.split_once('-')?.0.parse().ok()?;
            let Value::Array(fields) = parts.next()? else {
                return None;
            };
            let mut data = None;
            let mut at = 0;
            for pair in fields.chunks(2) {
                match (pair.first().and_then(as_string).as_deref(), pair.get(1)) {
                    (Some("d"), Some(Value::BulkString(d))) => {
                        data = Some(Bytes::copy_from_slice(d))
                    }
                    (Some("t"), Some(t)) => at = as_u64(t)?,
                    _ => {}
                }
            }
            Some((
                Publication {
                    topic: topic.clone(),
                    epoch: epoch.clone(),
                    seq,
                    data: data?,
                },
                at,
            ))
        })
        .collect()
}

pub(super) fn as_u64(value: &Value) -> Option<u64> {
    match value {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(super) fn as_string(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}
