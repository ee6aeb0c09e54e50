//! The commands the client writes, in either encoding: JSON text (serde's
//! form of [`Command`]) or `herald.v1.protobuf` messages. Its own module:
//! the other half of the wire from the frames the client reads, sharing
//! nothing with them but the encoding it is asked for.

use prost::Message as _;
use proto::v1;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::Protocol;

/// A command, as the client writes it.
#[derive(Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub(crate) enum Command<'a> {
    Hello {
        #[serde(skip_serializing_if = "Option::is_none")]
        token: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        resume: Option<&'a str>,
        /// For the connect proxy (a `hello` without a token).
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a RawValue>,
    },
    Sub {
        id: u64,
        topic: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        since: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        epoch: Option<&'a str>,
        /// Deltas asked for (where the namespace has them).
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        delta: bool,
    },
    Unsub {
        id: u64,
        topic: &'a str,
    },
    Pub {
        id: u64,
        topic: &'a str,
        data: &'a RawValue,
    },
    Ack {
        topic: &'a str,
        seq: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        epoch: Option<&'a str>,
    },
    Refresh {
        id: u64,
        token: &'a str,
    },
    Presence {
        id: u64,
        topic: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        cursor: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    History {
        id: u64,
        topic: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        since: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        epoch: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        reverse: bool,
    },
    /// A call to the backend's rpc proxy.
    Rpc {
        id: u64,
        method: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a RawValue>,
    },
}

impl Command<'_> {
    pub fn to_json(&self) -> String {
        // Every key is a string and `data` is JSON already: cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The WebSocket message for this command in `protocol`.
    pub fn encode(&self, protocol: Protocol) -> WsMessage {
        match protocol {
            Protocol::Json => WsMessage::text(self.to_json()),
            Protocol::Protobuf => WsMessage::binary(self.to_proto().encode_to_vec()),
        }
    }

    /// The `herald.v1.protobuf` form: the same fields; `data` as JSON text.
    pub fn to_proto(&self) -> v1::ClientCommand {
        use v1::client_command::Op;
        let text = |data: &RawValue| data.get().as_bytes().to_vec();
        let op = match *self {
            Command::Hello {
                token,
                resume,
                data,
            } => Op::Hello(v1::Hello {
                token: token.map(str::to_owned),
                resume: resume.map(str::to_owned),
                data: data.map(text),
            }),
            Command::Sub {
                id,
                topic,
                since,
                epoch,
                delta,
            } => Op::Sub(v1::Sub {
                id,
                topic: topic.to_owned(),
                since,
                epoch: epoch.map(str::to_owned),
                data: None,
                delta: delta.then_some(true),
            }),
            Command::Unsub { id, topic } => Op::Unsub(v1::Unsub {
                id,
                topic: topic.to_owned(),
            }),
            Command::Pub { id, topic, data } => Op::Pub(v1::Pub {
                id,
                topic: topic.to_owned(),
                data: text(data),
            }),
            Command::Ack { topic, seq, epoch } => Op::Ack(v1::Ack {
                topic: topic.to_owned(),
                seq,
                epoch: epoch.map(str::to_owned),
            }),
            Command::Refresh { id, token } => Op::Refresh(v1::Refresh {
                id,
                token: token.to_owned(),
            }),
            Command::Presence {
                id,
                topic,
                cursor,
                limit,
            } => Op::Presence(v1::Presence {
                id,
                topic: topic.to_owned(),
                cursor: cursor.map(str::to_owned),
                limit,
            }),
            Command::History {
                id,
                topic,
                since,
                epoch,
                limit,
                reverse,
            } => Op::History(v1::History {
                id,
                topic: topic.to_owned(),
                since,
                epoch: epoch.map(str::to_owned),
                limit: limit.map(u64::from),
                reverse: reverse.then_some(true),
            }),
            Command::Rpc { id, method, data } => Op::Rpc(v1::Rpc {
                id,
                method: method.to_owned(),
                data: data.map(text),
            }),
        };
        v1::ClientCommand { op: Some(op) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_written_as_the_protocol_spells_them() {
        let sub = Command::Sub {
            id: 1,
            topic: "news",
            since: Some(41),
            epoch: Some("e"),
            delta: false,
        };
        assert_eq!(
            sub.to_json(),
            r#"{"op":"sub","id":1,"topic":"news","since":41,"epoch":"e"}"#
        );
        let sub = Command::Sub {
            id: 2,
            topic: "game",
            since: None,
            epoch: None,
            delta: true,
        };
        assert_eq!(
            sub.to_json(),
            r#"{"op":"sub","id":2,"topic":"game","delta":true}"#
        );
        let hello = Command::Hello {
            token: None,
            resume: None,
            data: None,
        };
        assert_eq!(hello.to_json(), r#"{"op":"hello"}"#);
        let data =
            RawValue::from_string(r#"{"csrf":"x"}"#.to_owned()).unwrap_or_else(|e| panic!("{e}"));
        let hello = Command::Hello {
            token: None,
            resume: Some("s1"),
            data: Some(&data),
        };
        assert_eq!(
            hello.to_json(),
            r#"{"op":"hello","resume":"s1","data":{"csrf":"x"}}"#
        );
        let rpc = Command::Rpc {
            id: 4,
            method: "cart.add",
            data: Some(&data),
        };
        assert_eq!(
            rpc.to_json(),
            r#"{"op":"rpc","id":4,"method":"cart.add","data":{"csrf":"x"}}"#
        );
        let rpc = Command::Rpc {
            id: 5,
            method: "ping",
            data: None,
        };
        assert_eq!(rpc.to_json(), r#"{"op":"rpc","id":5,"method":"ping"}"#);
        let history = Command::History {
            id: 2,
            topic: "news",
            since: Some(40),
            epoch: None,
            limit: Some(50),
            reverse: false,
        };
        assert_eq!(
            history.to_json(),
            r#"{"op":"history","id":2,"topic":"news","since":40,"limit":50}"#
        );
        let presence = Command::Presence {
            id: 3,
            topic: "room:1",
            cursor: Some("c"),
            limit: None,
        };
        assert_eq!(
            presence.to_json(),
            r#"{"op":"presence","id":3,"topic":"room:1","cursor":"c"}"#
        );
    }

    #[test]
    fn commands_in_protobuf_carry_the_same_fields() {
        use v1::client_command::Op;
        let data = RawValue::from_string(r#"{"a":1}"#.to_owned()).unwrap_or_else(|e| panic!("{e}"));
        let decoded = |c: Command<'_>| {
            let WsMessage::Binary(bytes) = c.encode(Protocol::Protobuf) else {
                panic!("a binary message");
            };
            v1::ClientCommand::decode(bytes)
                .unwrap_or_else(|e| panic!("{e}"))
                .op
                .unwrap_or_else(|| panic!("an op"))
        };
        let sub = Command::Sub {
            id: 3,
            topic: "game",
            since: Some(9),
            epoch: Some("e"),
            delta: true,
        };
        assert_eq!(
            decoded(sub),
            Op::Sub(v1::Sub {
                id: 3,
                topic: "game".into(),
                since: Some(9),
                epoch: Some("e".into()),
                data: None,
                delta: Some(true),
            })
        );
        let publish = Command::Pub {
            id: 4,
            topic: "t",
            data: &data,
        };
        assert_eq!(
            decoded(publish),
            Op::Pub(v1::Pub {
                id: 4,
                topic: "t".into(),
                data: br#"{"a":1}"#.to_vec(),
            })
        );
        let hello = Command::Hello {
            token: Some("jwt"),
            resume: Some("s1"),
            data: None,
        };
        assert_eq!(
            decoded(hello),
            Op::Hello(v1::Hello {
                token: Some("jwt".into()),
                resume: Some("s1".into()),
                data: None,
            })
        );
        let history = Command::History {
            id: 5,
            topic: "t",
            since: None,
            epoch: None,
            limit: Some(10),
            reverse: true,
        };
        assert_eq!(
            decoded(history),
            Op::History(v1::History {
                id: 5,
                topic: "t".into(),
                since: None,
                epoch: None,
                limit: Some(10),
                reverse: Some(true),
            })
        );
        assert!(matches!(
            Command::Ack {
                topic: "t",
                seq: 1,
                epoch: None
            }
            .encode(Protocol::Json),
            WsMessage::Text(_)
        ));
    }
}
