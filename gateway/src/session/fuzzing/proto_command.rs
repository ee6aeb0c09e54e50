//! The `proto_command` fuzz target: a client's binary message on a
//! `herald.v1.protobuf` connection, as the session reads it.

use prost::Message as _;
use proto::{Command, CommandError, ServerMessage, v1};
use serde_json::{Map, Value};

use super::{check_command, check_error};

/// Checks `data` as one binary message of the protobuf subprotocol: it
/// decodes to a `ClientCommand` or is `malformed`; a `ClientCommand` reads
/// into a command or an error, without a panic. A command borrows its
/// `data` from the message (no copy), passes the checks a JSON command
/// passes, reads back the same from its own protobuf form, and is the
/// command the JSON form gives for the same fields (one set of semantics
/// for both forms). An error makes an `err` valid in both forms.
pub fn proto_command(data: &[u8]) {
    let message = match v1::ClientCommand::decode(data) {
        Ok(message) => message,
        Err(e) => {
            let error = proto::binary::undecodable(&e);
            assert_eq!(error.code, proto::ErrorCode::Malformed);
            check_error_forms(&error);
            return;
        }
    };
    match Command::from_proto(&message) {
        Ok(command) => {
            check_borrowed(&command, &message);
            check_command(&command);
            let pb = command.to_proto();
            let again = Command::from_proto(&pb)
                .unwrap_or_else(|e| panic!("{command:?} does not read back: {e}"));
            assert_eq!(
                again.to_proto(),
                pb,
                "the protobuf form reads back the same"
            );
            let text = json_text(&command);
            let json = Command::decode(&text)
                .unwrap_or_else(|e| panic!("the JSON form of {command:?} ({text}) fails: {e}"));
            assert_eq!(
                json.to_proto(),
                pb,
                "the JSON form ({text}) reads otherwise"
            );
        }
        Err(error) => check_error_forms(&error),
    }
}

/// The `err` a client gets, in JSON and in protobuf.
fn check_error_forms(error: &CommandError) {
    check_error(error);
    let reply = ServerMessage::Err {
        id: error.id,
        code: error.wire_code(),
        message: &error.message,
        topic: error.topic.as_deref(),
    }
    .to_proto();
    let back = v1::ServerMessage::decode(reply.encode_to_vec().as_slice()).ok();
    assert_eq!(back.as_ref(), Some(&reply), "the `err` round-trips");
}

/// A command's `data` lies within the message it was read from.
fn check_borrowed(command: &Command<'_>, message: &v1::ClientCommand) {
    let data = match command {
        Command::Pub { data, .. } => Some(*data),
        Command::Hello { data, .. } | Command::Sub { data, .. } | Command::Rpc { data, .. } => {
            *data
        }
        _ => None,
    };
    let Some(data) = data else {
        return;
    };
    use v1::client_command::Op;
    let held: &[u8] = match &message.op {
        Some(Op::Pub(p)) => &p.data,
        Some(Op::Hello(h)) => h.data.as_deref().unwrap_or_default(),
        Some(Op::Sub(s)) => s.data.as_deref().unwrap_or_default(),
        Some(Op::Rpc(r)) => r.data.as_deref().unwrap_or_default(),
        _ => &[],
    };
    let range = held.as_ptr_range();
    let text = data.get().as_bytes().as_ptr_range();
    assert!(
        range.start <= text.start && text.end <= range.end,
        "`data` copied out of the message"
    );
}

/// The JSON text of `command`: the same fields, its `data` as it is.
fn json_text(command: &Command<'_>) -> String {
    let mut map = Map::new();
    let mut put = |key: &str, value: Value| {
        map.insert(key.to_owned(), value);
    };
    let text = |s: &str| Value::String(s.to_owned());
    let data = match command {
        Command::Hello {
            token,
            resume,
            data,
        } => {
            put("op", text("hello"));
            if let Some(token) = token {
                put("token", text(token));
            }
            if let Some(resume) = resume {
                put("resume", text(resume));
            }
            *data
        }
        Command::Sub {
            id,
            topic,
            since,
            epoch,
            data,
            delta,
        } => {
            put("op", text("sub"));
            put("id", Value::from(*id));
            put("topic", text(topic));
            if let Some(since) = since {
                put("since", Value::from(*since));
            }
            if let Some(epoch) = epoch {
                put("epoch", text(epoch));
            }
            if *delta {
                put("delta", Value::Bool(true));
            }
            *data
        }
        Command::Unsub { id, topic } => {
            put("op", text("unsub"));
            put("id", Value::from(*id));
            put("topic", text(topic));
            None
        }
        Command::Pub { id, topic, data } => {
            put("op", text("pub"));
            put("id", Value::from(*id));
            put("topic", text(topic));
            Some(*data)
        }
        Command::Ack { topic, seq, epoch } => {
            put("op", text("ack"));
            put("topic", text(topic));
            put("seq", Value::from(*seq));
            if let Some(epoch) = epoch {
                put("epoch", text(epoch));
            }
            None
        }
        Command::Refresh { id, token } => {
            put("op", text("refresh"));
            put("id", Value::from(*id));
            put("token", text(token));
            None
        }
        Command::Ping { id } => {
            put("op", text("ping"));
            put("id", Value::from(*id));
            None
        }
        Command::History {
            id,
            topic,
            since,
            epoch,
            limit,
            reverse,
        } => {
            put("op", text("history"));
            put("id", Value::from(*id));
            put("topic", text(topic));
            if let Some(since) = since {
                put("since", Value::from(*since));
            }
            if let Some(epoch) = epoch {
                put("epoch", text(epoch));
            }
            if let Some(limit) = limit {
                put("limit", Value::from(*limit));
            }
            put("reverse", Value::Bool(*reverse));
            None
        }
        Command::Presence {
            id,
            topic,
            cursor,
            limit,
        } => {
            put("op", text("presence"));
            put("id", Value::from(*id));
            put("topic", text(topic));
            if let Some(cursor) = cursor {
                put("cursor", text(cursor));
            }
            if let Some(limit) = limit {
                put("limit", Value::from(*limit));
            }
            None
        }
        Command::Rpc { id, method, data } => {
            put("op", text("rpc"));
            put("id", Value::from(*id));
            put("method", text(method));
            *data
        }
    };
    let mut out = Value::Object(map).to_string();
    if let Some(data) = data {
        // The client's JSON text as it is, as the JSON form would carry it.
        out.pop();
        out.push_str(",\"data\":");
        out.push_str(data.get());
        out.push('}');
    }
    out
}
