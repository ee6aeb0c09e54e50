//! The binary form of the protocol (`herald.v1.protobuf`): one
//! [`v1::ClientCommand`] per WebSocket binary message, read into the same
//! [`Command`] the JSON form decodes to, so that a session has one command
//! type and one set of error codes whatever its subprotocol.
//!
//! The command borrows from the decoded message (its strings and its `data`
//! bytes), as a JSON command borrows from its frame. `data` fields hold JSON
//! text in both forms: it is validated here (`malformed` otherwise), and
//! handed on as the same [`RawValue`] a JSON command carries.
//!
//! proto3 cannot tell a field that is absent from one that holds its default:
//! a required string or `data` that is empty is treated as missing
//! (`missing_field`, as the JSON form answers a missing key); a required
//! number (`id`, an `ack`'s `seq`) is always present, 0 by default.

use std::borrow::Cow;

use serde_json::value::RawValue;

use crate::json::{Command, CommandError, ErrorCode, MAX_METHOD_BYTES, valid_method};
use crate::v1;
use crate::v1::client_command::Op;

impl<'a> Command<'a> {
    /// Reads a decoded `ClientCommand`, with the errors the JSON form gives
    /// the same command. A message with no `op` the server knows (none at
    /// all, or only a newer client's) is `unknown_op`.
    pub fn from_proto(command: &'a v1::ClientCommand) -> Result<Self, CommandError> {
        let Some(op) = &command.op else {
            return Err(CommandError::new(
                None,
                ErrorCode::UnknownOp,
                "no op this server knows",
            ));
        };
        Ok(match op {
            Op::Hello(hello) => Command::Hello {
                token: hello.token.as_deref().map(Cow::Borrowed),
                resume: hello.resume.as_deref().map(Cow::Borrowed),
                data: optional_json(None, hello.data.as_deref())?,
            },
            Op::Sub(sub) => Command::Sub {
                id: sub.id,
                topic: required(Some(sub.id), "topic", &sub.topic)?,
                since: sub.since,
                epoch: sub.epoch.as_deref().map(Cow::Borrowed),
                data: optional_json(Some(sub.id), sub.data.as_deref())?,
                delta: sub.delta.unwrap_or(false),
            },
            Op::Unsub(unsub) => Command::Unsub {
                id: unsub.id,
                topic: required(Some(unsub.id), "topic", &unsub.topic)?,
            },
            Op::Pub(publish) => {
                let id = Some(publish.id);
                let topic = required(id, "topic", &publish.topic)?;
                if publish.data.is_empty() {
                    return Err(missing(id, "data"));
                }
                Command::Pub {
                    id: publish.id,
                    topic,
                    data: json(id, &publish.data)?,
                }
            }
            Op::Ack(ack) => Command::Ack {
                topic: required(None, "topic", &ack.topic)?,
                seq: ack.seq,
                epoch: ack.epoch.as_deref().map(Cow::Borrowed),
            },
            Op::Refresh(refresh) => Command::Refresh {
                id: refresh.id,
                token: required(Some(refresh.id), "token", &refresh.token)?,
            },
            Op::Ping(ping) => Command::Ping { id: ping.id },
            Op::History(history) => Command::History {
                id: history.id,
                topic: required(Some(history.id), "topic", &history.topic)?,
                since: history.since,
                epoch: history.epoch.as_deref().map(Cow::Borrowed),
                limit: history.limit,
                reverse: history.reverse.unwrap_or(false),
            },
            Op::Presence(presence) => Command::Presence {
                id: presence.id,
                topic: required(Some(presence.id), "topic", &presence.topic)?,
                cursor: presence.cursor.as_deref().map(Cow::Borrowed),
                limit: presence.limit.map(u64::from),
            },
            Op::Rpc(rpc) => {
                let id = Some(rpc.id);
                let method = required(id, "method", &rpc.method)?;
                if !valid_method(&method) {
                    return Err(CommandError::new(
                        id,
                        ErrorCode::Malformed,
                        format!(
                            "`method` must be 1 to {MAX_METHOD_BYTES} bytes of A-Z, a-z, 0-9, `_.:/-`"
                        ),
                    ));
                }
                Command::Rpc {
                    id: rpc.id,
                    method,
                    data: optional_json(id, rpc.data.as_deref())?,
                }
            }
        })
    }
}

/// The error a `ClientCommand` that does not decode gets: `malformed`, as
/// a JSON frame that does not parse.
pub fn undecodable(e: &prost::DecodeError) -> CommandError {
    CommandError::new(
        None,
        ErrorCode::Malformed,
        format!("not a herald.v1.ClientCommand: {e}"),
    )
}

fn missing(id: Option<u64>, field: &str) -> CommandError {
    CommandError::new(
        id,
        ErrorCode::MissingField,
        format!("`{field}` is required"),
    )
}

/// A string field the command needs: empty is missing.
fn required<'a>(
    id: Option<u64>,
    field: &str,
    value: &'a str,
) -> Result<Cow<'a, str>, CommandError> {
    if value.is_empty() {
        return Err(missing(id, field));
    }
    Ok(Cow::Borrowed(value))
}

/// `data`, which must be one JSON value (whitespace around it is dropped,
/// as the JSON form's parser drops it).
fn json(id: Option<u64>, data: &[u8]) -> Result<&RawValue, CommandError> {
    serde_json::from_slice(data).map_err(|e| {
        CommandError::new(
            id,
            ErrorCode::Malformed,
            format!("`data` is not JSON text: {e}"),
        )
    })
}

fn optional_json(id: Option<u64>, data: Option<&[u8]>) -> Result<Option<&RawValue>, CommandError> {
    data.map(|data| json(id, data)).transpose()
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// Every command of the JSON form, each field set.
    const COMMANDS: [&str; 14] = [
        r#"{"op":"hello"}"#,
        r#"{"op":"hello","token":"t","resume":"s","data":{"device":"phone"}}"#,
        r#"{"op":"sub","id":1,"topic":"news"}"#,
        r#"{"op":"sub","id":1,"topic":"news","since":4,"epoch":"e","data":[1,"x"]}"#,
        r#"{"op":"unsub","id":2,"topic":"news"}"#,
        r#"{"op":"pub","id":3,"topic":"news","data":{"a":1.50}}"#,
        r#"{"op":"pub","id":3,"topic":"news","data":null}"#,
        r#"{"op":"ack","topic":"news","seq":5,"epoch":"e"}"#,
        r#"{"op":"refresh","id":6,"token":"t2"}"#,
        r#"{"op":"ping","id":7}"#,
        r#"{"op":"history","id":8,"topic":"news","since":1,"epoch":"e","limit":10,"reverse":true}"#,
        r#"{"op":"presence","id":9,"topic":"room","cursor":"c","limit":5}"#,
        r#"{"op":"rpc","id":10,"method":"rooms/create","data":{"n":1}}"#,
        r#"{"op":"rpc","id":11,"method":"m"}"#,
    ];

    /// Through the wire and back: `ClientCommand` bytes, decoded, read.
    fn read(message: &v1::ClientCommand) -> Result<v1::ClientCommand, CommandError> {
        let bytes = message.encode_to_vec();
        let decoded = v1::ClientCommand::decode(bytes.as_slice()).map_err(|e| undecodable(&e))?;
        Command::from_proto(&decoded).map(|command| command.to_proto())
    }

    fn command(op: Op) -> v1::ClientCommand {
        v1::ClientCommand { op: Some(op) }
    }

    #[test]
    fn every_command_reads_as_its_json_form_does() {
        for text in COMMANDS {
            let json = Command::decode(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let proto = json.to_proto();
            assert_eq!(read(&proto).as_ref(), Ok(&proto), "{text}");
        }
    }

    #[test]
    fn the_command_borrows_from_the_message() {
        let message = Command::decode(COMMANDS[3])
            .unwrap_or_else(|e| panic!("{e}"))
            .to_proto();
        let Ok(Command::Sub {
            topic, epoch, data, ..
        }) = Command::from_proto(&message)
        else {
            panic!("a sub")
        };
        assert!(matches!(topic, Cow::Borrowed("news")));
        assert!(matches!(epoch, Some(Cow::Borrowed("e"))));
        assert_eq!(data.map(RawValue::get), Some(r#"[1,"x"]"#));
    }

    #[test]
    fn data_must_be_json_text() {
        let bad: &[u8] = b"{\"a\":";
        let cases = [
            command(Op::Pub(v1::Pub {
                id: 3,
                topic: "news".into(),
                data: bad.to_vec(),
            })),
            command(Op::Sub(v1::Sub {
                id: 3,
                topic: "news".into(),
                data: Some(b"\xff".to_vec()),
                ..Default::default()
            })),
            command(Op::Rpc(v1::Rpc {
                id: 3,
                method: "m".into(),
                data: Some(b"1 2".to_vec()),
            })),
        ];
        for case in cases {
            let err = read(&case).unwrap_err();
            assert_eq!(
                (err.code, err.id),
                (ErrorCode::Malformed, Some(3)),
                "{case:?}"
            );
        }
        let hello = command(Op::Hello(v1::Hello {
            data: Some(b"nope".to_vec()),
            ..Default::default()
        }));
        assert_eq!(read(&hello).unwrap_err().code, ErrorCode::Malformed);
        // Whitespace around the value is not part of it.
        let padded = command(Op::Pub(v1::Pub {
            id: 1,
            topic: "news".into(),
            data: b" {\"a\": 1}\n".to_vec(),
        }));
        let Ok(Command::Pub { data, .. }) = Command::from_proto(&padded) else {
            panic!("a pub")
        };
        assert_eq!(data.get(), r#"{"a": 1}"#);
    }

    #[test]
    fn missing_fields_get_the_json_forms_errors() {
        let cases = [
            (
                command(Op::Sub(v1::Sub {
                    id: 1,
                    ..Default::default()
                })),
                Some(1),
            ),
            (command(Op::Unsub(v1::Unsub::default())), Some(0)),
            (
                command(Op::Pub(v1::Pub {
                    id: 2,
                    topic: "news".into(),
                    data: Vec::new(),
                })),
                Some(2),
            ),
            (
                command(Op::Pub(v1::Pub {
                    id: 2,
                    data: b"1".to_vec(),
                    ..Default::default()
                })),
                Some(2),
            ),
            (command(Op::Ack(v1::Ack::default())), None),
            (
                command(Op::Refresh(v1::Refresh {
                    id: 4,
                    token: String::new(),
                })),
                Some(4),
            ),
            (
                command(Op::History(v1::History {
                    id: 5,
                    ..Default::default()
                })),
                Some(5),
            ),
            (
                command(Op::Presence(v1::Presence {
                    id: 6,
                    ..Default::default()
                })),
                Some(6),
            ),
            (
                command(Op::Rpc(v1::Rpc {
                    id: 7,
                    ..Default::default()
                })),
                Some(7),
            ),
        ];
        for (case, id) in cases {
            let err = read(&case).unwrap_err();
            assert_eq!(
                (err.code, err.id),
                (ErrorCode::MissingField, id),
                "{case:?}"
            );
        }
        // The JSON form says the same of the same commands.
        for text in [
            r#"{"op":"sub","id":1}"#,
            r#"{"op":"pub","id":2,"topic":"news"}"#,
            r#"{"op":"ack","seq":1}"#,
            r#"{"op":"rpc","id":7}"#,
        ] {
            let err = Command::decode(text).unwrap_err();
            assert_eq!(err.code, ErrorCode::MissingField, "{text}");
        }
    }

    #[test]
    fn a_bad_method_is_malformed() {
        for method in ["a b", "é", &"m".repeat(MAX_METHOD_BYTES + 1)] {
            let case = command(Op::Rpc(v1::Rpc {
                id: 4,
                method: method.to_owned(),
                data: None,
            }));
            let err = read(&case).unwrap_err();
            assert_eq!(
                (err.code, err.id),
                (ErrorCode::Malformed, Some(4)),
                "{method:?}"
            );
        }
    }

    #[test]
    fn what_is_not_a_command_is_malformed_or_unknown() {
        // An empty message, and one with only a field this server does not
        // know (a newer client's op 99): decodable, no op.
        let mut newer = Vec::new();
        prost::encoding::string::encode(99, &"future".to_owned(), &mut newer);
        for bytes in [Vec::new(), newer] {
            let decoded =
                v1::ClientCommand::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{e}"));
            let err = Command::from_proto(&decoded).unwrap_err();
            assert_eq!(err.code, ErrorCode::UnknownOp);
        }
        // Bytes that are no protobuf message at all: a truncated varint, a
        // length past the end, a wire type that does not exist.
        for bytes in [&[0x08, 0xff][..], &[0x12, 0x40, 0x01], &[0x0f]] {
            let err = v1::ClientCommand::decode(bytes)
                .map(|_| ())
                .map_err(|e| undecodable(&e));
            assert_eq!(err.unwrap_err().code, ErrorCode::Malformed, "{bytes:?}");
        }
    }
}
