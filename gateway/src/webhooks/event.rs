//! The events a backend is told of, and their JSON.
//!
//! An event is built where it happens (cheap: the topic and data are shared
//! buffers) and encoded by the sender, off the path of the client that
//! caused it. Each gets its id and time when it is queued: ids are
//! `<instance>-<n>`, the pod's instance (its name and a random suffix, new
//! with every process) and a counter, so a backend de-duplicates a retried
//! batch by id.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use router::{Epoch, Topic};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::admission::ConnId;

/// An event type: its `type` in the JSON, and a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Occupied,
    Vacated,
    Join,
    Leave,
    Publish,
    Open,
    Close,
}

impl Type {
    pub const ALL: [Type; 7] = [
        Type::Occupied,
        Type::Vacated,
        Type::Join,
        Type::Leave,
        Type::Publish,
        Type::Open,
        Type::Close,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Type::Occupied => "topic.occupied",
            Type::Vacated => "topic.vacated",
            Type::Join => "presence.join",
            Type::Leave => "presence.leave",
            Type::Publish => "client.publish",
            Type::Open => "connection.open",
            Type::Close => "connection.close",
        }
    }

    /// Its bit in a set of wanted types.
    pub(super) const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Something that happened on this pod (or, for `vacated`, to a dead pod it
/// cleaned up after).
#[derive(Debug, Clone)]
pub enum Event {
    /// The topic's first subscriber on any pod.
    Occupied { topic: Topic },
    /// The topic's last subscriber anywhere is gone.
    Vacated { topic: Topic },
    /// A user is present in the topic (on no pod before).
    Join {
        topic: Topic,
        user: Arc<str>,
        /// Compact JSON object text.
        info: Option<Bytes>,
    },
    /// A user is present in the topic on no pod any more.
    Leave { topic: Topic, user: Arc<str> },
    /// A client's `pub`, published.
    Publish {
        topic: Topic,
        user: Option<Arc<str>>,
        seq: u64,
        epoch: Epoch,
        /// JSON text, as published.
        data: Bytes,
    },
    /// A connection's `hello` succeeded.
    Open {
        client: ConnId,
        user: Option<Arc<str>>,
        remote_addr: IpAddr,
    },
    /// A connection that had said `hello` ended.
    Close {
        client: ConnId,
        user: Option<Arc<str>>,
        code: u16,
        reason: &'static str,
    },
}

impl Event {
    pub fn kind(&self) -> Type {
        match self {
            Event::Occupied { .. } => Type::Occupied,
            Event::Vacated { .. } => Type::Vacated,
            Event::Join { .. } => Type::Join,
            Event::Leave { .. } => Type::Leave,
            Event::Publish { .. } => Type::Publish,
            Event::Open { .. } => Type::Open,
            Event::Close { .. } => Type::Close,
        }
    }
}

/// An event with its id and time, as queued.
#[derive(Debug, Clone)]
pub struct Stamped {
    pub id: u64,
    /// Unix milliseconds.
    pub time: u64,
    pub event: Event,
}

/// One event's JSON object.
#[derive(Serialize)]
struct Wire<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    time: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    topic: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    info: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remote_addr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

/// JSON text the pod checked already (published data, presence info); a
/// piece that is not JSON (never expected) is left out rather than sent
/// broken.
fn raw(bytes: &Bytes) -> Option<&RawValue> {
    serde_json::from_slice::<&RawValue>(bytes).ok()
}

/// The body of one POST: `{"events":[…]}`.
pub fn encode_batch(instance: &str, events: &[Stamped]) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + events.len() * 128);
    body.extend_from_slice(b"{\"events\":[");
    for (i, stamped) in events.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        let wire = wire(instance, stamped);
        // Serializing strings, numbers and checked JSON text into a Vec
        // cannot fail.
        let _ = serde_json::to_writer(&mut body, &wire);
    }
    body.extend_from_slice(b"]}");
    body
}

fn wire<'a>(instance: &str, stamped: &'a Stamped) -> Wire<'a> {
    let mut wire = Wire {
        id: format!("{instance}-{}", stamped.id),
        kind: stamped.event.kind().as_str(),
        time: stamped.time,
        topic: None,
        client: None,
        user: None,
        info: None,
        seq: None,
        epoch: None,
        data: None,
        remote_addr: None,
        code: None,
        reason: None,
    };
    match &stamped.event {
        Event::Occupied { topic } | Event::Vacated { topic } => wire.topic = Some(topic.as_str()),
        Event::Join { topic, user, info } => {
            wire.topic = Some(topic.as_str());
            wire.user = Some(user);
            wire.info = info.as_ref().and_then(raw);
        }
        Event::Leave { topic, user } => {
            wire.topic = Some(topic.as_str());
            wire.user = Some(user);
        }
        Event::Publish {
            topic,
            user,
            seq,
            epoch,
            data,
        } => {
            wire.topic = Some(topic.as_str());
            wire.user = user.as_deref();
            wire.seq = Some(*seq);
            wire.epoch = Some(epoch);
            wire.data = raw(data);
        }
        Event::Open {
            client,
            user,
            remote_addr,
        } => {
            wire.client = Some(client.to_string());
            wire.user = user.as_deref();
            wire.remote_addr = Some(remote_addr.to_string());
        }
        Event::Close {
            client,
            user,
            code,
            reason,
        } => {
            wire.client = Some(client.to_string());
            wire.user = user.as_deref();
            wire.code = Some(*code);
            wire.reason = Some(reason);
        }
    }
    wire
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_the_events_json_with_ids_of_the_instance() {
        let topic = Topic::parse("chat:1").unwrap_or_else(|e| panic!("{e}"));
        let events = [
            Stamped {
                id: 1,
                time: 7,
                event: Event::Occupied {
                    topic: topic.clone(),
                },
            },
            Stamped {
                id: 2,
                time: 8,
                event: Event::Publish {
                    topic,
                    user: Some(Arc::from("ann")),
                    seq: 3,
                    epoch: Epoch::from("e"),
                    data: Bytes::from_static(br#"{"a":[1,2]}"#),
                },
            },
        ];
        let body = encode_batch("pod-ab", &events);
        let value: serde_json::Value =
            serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            value,
            serde_json::json!({"events": [
                {"id": "pod-ab-1", "type": "topic.occupied", "time": 7, "topic": "chat:1"},
                {"id": "pod-ab-2", "type": "client.publish", "time": 8, "topic": "chat:1",
                 "user": "ann", "seq": 3, "epoch": "e", "data": {"a": [1, 2]}},
            ]})
        );
    }
}
