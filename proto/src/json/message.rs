//! What the server sends a client: [`ServerMessage`], and the hand-written
//! head of a `msg` ([`encode_msg_prefix`], [`encode_msg_head`]) that the hot
//! path writes once per publication. Its own module because it is the one
//! way out to a client, in JSON and in protobuf.

use serde::Serialize;
use serde_json::value::RawValue;

use super::{HistoryItem, PresenceMember, PresencePage, json_bytes};
use crate::v1;

/// A message to a client. `msg` is normally encoded by [`encode_msg_prefix`]
/// once per publication; this enum serves every other message.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ServerMessage<'a> {
    Welcome {
        session: &'a str,
        ping_ms: u64,
        resumed: bool,
        /// When the token expires, in Unix seconds.
        #[serde(skip_serializing_if = "Option::is_none")]
        expires: Option<u64>,
        /// Why a `resume` was not honoured.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'a str>,
    },
    Ok {
        id: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        topic: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        epoch: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        recovered: Option<bool>,
        /// The reply to `refresh`: when the new token expires.
        #[serde(skip_serializing_if = "Option::is_none")]
        expires: Option<u64>,
        /// The backend's answer: to an `rpc`, and to a `sub` its subscribe
        /// proxy approved.
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a RawValue>,
        /// In the reply to a `sub` that asked for deltas: `Some(true)` when
        /// granted (its namespace has them); absent otherwise.
        #[serde(skip_serializing_if = "Option::is_none")]
        delta: Option<bool>,
    },
    Msg {
        topic: &'a str,
        seq: u64,
        data: &'a RawValue,
    },
    Err {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        /// An [`ErrorCode`](super::ErrorCode)'s text, or an application's
        /// ([`AppCode`](super::AppCode)).
        code: &'a str,
        message: &'a str,
        /// The topic the error is about, when it is about one.
        #[serde(skip_serializing_if = "Option::is_none")]
        topic: Option<&'a str>,
    },
    Reset {
        topic: &'a str,
        epoch: &'a str,
        seq: u64,
    },
    Reconnect {
        after_ms: u64,
        reason: &'a str,
    },
    /// An `ok` the client did not ask for (no `id`): a subscription made
    /// by a backend (`reason: "server"`) or by the token's `topics`
    /// (`"token"`).
    #[serde(rename = "ok")]
    Subscribed {
        topic: &'a str,
        seq: u64,
        epoch: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        recovered: Option<bool>,
        reason: &'a str,
    },
    /// The reply to `history`.
    #[serde(rename = "ok")]
    History {
        id: u64,
        topic: &'a str,
        epoch: &'a str,
        seq: u64,
        publications: &'a [HistoryItem<'a>],
    },
    /// A backend unsubscribed the connection (`reason: "server"`).
    Unsubscribed {
        topic: &'a str,
        reason: &'a str,
    },
    /// The reply to `presence`: an `ok` with a page of members.
    #[serde(rename = "ok")]
    PresencePage {
        id: u64,
        #[serde(flatten)]
        page: PresencePage<'a>,
    },
    /// What changed in a topic's presence (`join_leave` namespaces).
    #[serde(rename = "presence_diff")]
    PresenceDiff {
        topic: &'a str,
        from: u64,
        to: u64,
        /// `None` above the namespace's `presence_counts_only_above`.
        #[serde(skip_serializing_if = "Option::is_none")]
        joins: Option<&'a [PresenceMember<'a>]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        leaves: Option<&'a [&'a str]>,
        users: u64,
        connections: u64,
    },
}

impl ServerMessage<'_> {
    /// The JSON text of this message.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising these types cannot fail: every key is a string and
        // `data` is already valid JSON.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The protobuf form of this message.
    pub fn to_proto(&self) -> v1::ServerMessage {
        use v1::server_message::Op;
        let op = match *self {
            ServerMessage::Welcome {
                session,
                ping_ms,
                resumed,
                expires,
                reason,
            } => Op::Welcome(v1::Welcome {
                session: session.to_owned(),
                ping_ms,
                resumed,
                expires,
                reason: reason.map(str::to_owned),
            }),
            ServerMessage::Ok {
                id,
                topic,
                seq,
                epoch,
                recovered,
                expires,
                data,
                delta,
            } => Op::Ok(v1::Ok {
                id,
                topic: topic.map(str::to_owned),
                seq,
                epoch: epoch.map(str::to_owned),
                recovered,
                expires,
                data: data.map(json_bytes),
                delta,
                ..v1::Ok::default()
            }),
            ServerMessage::Subscribed {
                topic,
                seq,
                epoch,
                recovered,
                reason,
            } => Op::Ok(v1::Ok {
                id: 0,
                topic: Some(topic.to_owned()),
                seq: Some(seq),
                epoch: Some(epoch.to_owned()),
                recovered,
                reason: Some(reason.to_owned()),
                ..v1::Ok::default()
            }),
            ServerMessage::History {
                id,
                topic,
                epoch,
                seq,
                publications,
            } => Op::Ok(v1::Ok {
                id,
                topic: Some(topic.to_owned()),
                seq: Some(seq),
                epoch: Some(epoch.to_owned()),
                publications: publications.iter().map(HistoryItem::to_proto).collect(),
                ..v1::Ok::default()
            }),
            ServerMessage::Unsubscribed { topic, reason } => Op::Unsubscribed(v1::Unsubscribed {
                topic: topic.to_owned(),
                reason: reason.to_owned(),
            }),
            ServerMessage::Msg { topic, seq, data } => Op::Msg(v1::Msg {
                topic: topic.to_owned(),
                seq,
                data: data.get().as_bytes().to_vec(),
                ..v1::Msg::default()
            }),
            ServerMessage::Err {
                id,
                code,
                message,
                topic,
            } => Op::Err(v1::Err {
                id,
                code: code.to_owned(),
                message: message.to_owned(),
                topic: topic.map(str::to_owned),
            }),
            ServerMessage::Reset { topic, epoch, seq } => Op::Reset(v1::Reset {
                topic: topic.to_owned(),
                epoch: epoch.to_owned(),
                seq,
            }),
            ServerMessage::Reconnect { after_ms, reason } => Op::Reconnect(v1::Reconnect {
                after_ms,
                reason: reason.to_owned(),
            }),
            ServerMessage::PresencePage { id, page } => {
                let page = page.to_proto();
                Op::Ok(v1::Ok {
                    id,
                    topic: Some(page.topic),
                    position: Some(page.position),
                    users: Some(page.users),
                    connections: Some(page.connections),
                    members: page.members,
                    cursor: page.cursor,
                    ..v1::Ok::default()
                })
            }
            ServerMessage::PresenceDiff {
                topic,
                from,
                to,
                joins,
                leaves,
                users,
                connections,
            } => Op::PresenceDiff(v1::PresenceDiff {
                topic: topic.to_owned(),
                from,
                to,
                joins: joins
                    .unwrap_or_default()
                    .iter()
                    .map(PresenceMember::to_proto)
                    .collect(),
                leaves: leaves
                    .unwrap_or_default()
                    .iter()
                    .map(|user| (*user).to_owned())
                    .collect(),
                users,
                connections,
            }),
        };
        v1::ServerMessage { op: Some(op) }
    }
}

/// Writes `{"op":"msg","topic":<topic>,"seq":<seq>,"data":` into `out`: a
/// `msg` is this prefix, the publication's JSON text and `}`. The same bytes
/// as [`ServerMessage::Msg`] (tested), without a serializer on the hot path.
pub fn encode_msg_prefix(out: &mut Vec<u8>, topic: &str, seq: u64) {
    encode_msg_head(out, topic, seq, "data");
}

/// [`encode_msg_prefix`] with another key for the data: `full` and `delta`
/// in a delta subscription (docs/protocol.md).
pub fn encode_msg_head(out: &mut Vec<u8>, topic: &str, seq: u64, key: &str) {
    out.extend_from_slice(br#"{"op":"msg","topic":"#);
    // A topic is plain ASCII by the time it gets here, but escape it properly
    // rather than rely on that.
    let _ = serde_json::to_writer(&mut *out, topic);
    out.extend_from_slice(br#","seq":"#);
    out.extend_from_slice(seq.to_string().as_bytes());
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msg_prefix_matches_the_serializer() {
        let data = RawValue::from_string(r#"{"a":[1,2,"x"]}"#.into()).unwrap_or_else(|_| panic!());
        let mut fast = Vec::new();
        encode_msg_prefix(&mut fast, "chat:room-1", 42);
        fast.extend_from_slice(data.get().as_bytes());
        fast.push(b'}');
        let slow = ServerMessage::Msg {
            topic: "chat:room-1",
            seq: 42,
            data: &data,
        }
        .to_json();
        assert_eq!(
            String::from_utf8_lossy(&fast),
            String::from_utf8_lossy(&slow)
        );
    }
}
