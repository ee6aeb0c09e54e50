//! A client's commands: [`Command`], decoded from a JSON text frame, and
//! the [`CommandError`] (with its [`ErrorCode`] or an application's
//! [`AppCode`]) a client gets back as an `err` when one cannot be acted on.
//! Its own module because it is the one way in from a client: what it may
//! say, and what it is told when it says it wrong.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{from_object, json_bytes, present};
use crate::v1;

/// A command from a client.
#[derive(Debug, Clone)]
pub enum Command<'a> {
    Hello {
        token: Option<Cow<'a, str>>,
        resume: Option<Cow<'a, str>>,
        /// For the connect proxy (a `hello` without a token), verbatim.
        data: Option<&'a RawValue>,
    },
    Sub {
        id: u64,
        topic: Cow<'a, str>,
        since: Option<u64>,
        epoch: Option<Cow<'a, str>>,
        /// For the subscribe proxy, verbatim.
        data: Option<&'a RawValue>,
        /// Deltas asked for: granted on a namespace with `delta = true`
        /// (the `ok` says so), ignored elsewhere.
        delta: bool,
    },
    Unsub {
        id: u64,
        topic: Cow<'a, str>,
    },
    Pub {
        id: u64,
        topic: Cow<'a, str>,
        data: &'a RawValue,
    },
    Ack {
        topic: Cow<'a, str>,
        seq: u64,
        epoch: Option<Cow<'a, str>>,
    },
    Refresh {
        id: u64,
        token: Cow<'a, str>,
    },
    /// Answered with `ok`: for clients that cannot see the server's pings.
    Ping {
        id: u64,
    },
    /// A page of a topic's history: forward after `since` (or from the
    /// oldest kept), or `reverse` below it (or from the newest).
    History {
        id: u64,
        topic: Cow<'a, str>,
        since: Option<u64>,
        epoch: Option<Cow<'a, str>>,
        limit: Option<u64>,
        reverse: bool,
    },

    /// A page of a topic's presence, answered with `ok` and its members.
    Presence {
        id: u64,
        topic: Cow<'a, str>,
        cursor: Option<Cow<'a, str>>,
        /// Members per page; `None`: `presence.page_size`.
        limit: Option<u64>,
    },
    /// A call of the application's backend (the rpc proxy), answered with
    /// `ok` and its `data`, or `err`.
    Rpc {
        id: u64,
        /// 1 to [`MAX_METHOD_BYTES`] bytes of `[A-Za-z0-9_.:/-]`.
        method: Cow<'a, str>,
        data: Option<&'a RawValue>,
    },
}

/// Longest `rpc` method name, in bytes.
pub const MAX_METHOD_BYTES: usize = 128;

/// Whether `method` is an `rpc` method name: 1 to [`MAX_METHOD_BYTES`]
/// bytes of `[A-Za-z0-9_.:/-]` (safe in a URL path, a log line and a
/// metric-free label).
pub fn valid_method(method: &str) -> bool {
    (1..=MAX_METHOD_BYTES).contains(&method.len())
        && method
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'/' | b'-'))
}

/// Every key any command may carry. Unknown keys are ignored, so that newer
/// clients can talk to older pods.
#[derive(Deserialize)]
struct RawCommand<'a> {
    #[serde(borrow)]
    op: Option<Cow<'a, str>>,
    id: Option<u64>,
    #[serde(borrow)]
    topic: Option<Cow<'a, str>>,
    since: Option<u64>,
    #[serde(borrow)]
    epoch: Option<Cow<'a, str>>,
    seq: Option<u64>,
    #[serde(borrow)]
    token: Option<Cow<'a, str>>,
    #[serde(borrow)]
    resume: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    limit: Option<u64>,
    reverse: Option<bool>,
    #[serde(borrow)]
    cursor: Option<Cow<'a, str>>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    delta: Option<bool>,
}

impl<'a> Command<'a> {
    /// Decodes one text frame.
    pub fn decode(text: &'a str) -> Result<Self, CommandError> {
        let raw: RawCommand<'a> = from_object(text.as_bytes())?;
        let id = raw.id;
        let missing = |field: &str| {
            CommandError::new(
                id,
                ErrorCode::MissingField,
                format!("`{field}` is required"),
            )
        };
        let op = raw.op.ok_or_else(|| missing("op"))?;
        Ok(match op.as_ref() {
            "hello" => Command::Hello {
                token: raw.token,
                resume: raw.resume,
                data: raw.data,
            },
            "sub" => Command::Sub {
                id: id.ok_or_else(|| missing("id"))?,
                topic: raw.topic.ok_or_else(|| missing("topic"))?,
                since: raw.since,
                epoch: raw.epoch,
                data: raw.data,
                delta: raw.delta.unwrap_or(false),
            },
            "unsub" => Command::Unsub {
                id: id.ok_or_else(|| missing("id"))?,
                topic: raw.topic.ok_or_else(|| missing("topic"))?,
            },
            "pub" => Command::Pub {
                id: id.ok_or_else(|| missing("id"))?,
                topic: raw.topic.ok_or_else(|| missing("topic"))?,
                data: raw.data.ok_or_else(|| missing("data"))?,
            },
            "ack" => Command::Ack {
                topic: raw.topic.ok_or_else(|| missing("topic"))?,
                seq: raw.seq.ok_or_else(|| missing("seq"))?,
                epoch: raw.epoch,
            },
            "refresh" => Command::Refresh {
                id: id.ok_or_else(|| missing("id"))?,
                token: raw.token.ok_or_else(|| missing("token"))?,
            },
            "ping" => Command::Ping {
                id: id.ok_or_else(|| missing("id"))?,
            },
            "history" => Command::History {
                id: id.ok_or_else(|| missing("id"))?,
                topic: raw.topic.ok_or_else(|| missing("topic"))?,
                since: raw.since,
                epoch: raw.epoch,
                limit: raw.limit,
                reverse: raw.reverse.unwrap_or(false),
            },

            "presence" => Command::Presence {
                id: id.ok_or_else(|| missing("id"))?,
                topic: raw.topic.ok_or_else(|| missing("topic"))?,
                cursor: raw.cursor,
                limit: raw.limit,
            },
            "rpc" => {
                let id = id.ok_or_else(|| missing("id"))?;
                let method = raw.method.ok_or_else(|| missing("method"))?;
                if !valid_method(&method) {
                    return Err(CommandError::new(
                        Some(id),
                        ErrorCode::Malformed,
                        format!(
                            "`method` must be 1 to {MAX_METHOD_BYTES} bytes of A-Z, a-z, 0-9, `_.:/-`"
                        ),
                    ));
                }
                Command::Rpc {
                    id,
                    method,
                    data: raw.data,
                }
            }
            other => {
                return Err(CommandError::new(
                    id,
                    ErrorCode::UnknownOp,
                    format!("unknown op `{other}`"),
                ));
            }
        })
    }

    /// The protobuf form of this command.
    pub fn to_proto(&self) -> v1::ClientCommand {
        use v1::client_command::Op;
        let op = match self {
            Command::Hello {
                token,
                resume,
                data,
            } => Op::Hello(v1::Hello {
                token: token.as_deref().map(str::to_owned),
                resume: resume.as_deref().map(str::to_owned),
                data: data.map(json_bytes),
            }),
            Command::Sub {
                id,
                topic,
                since,
                epoch,
                data,
                delta,
            } => Op::Sub(v1::Sub {
                id: *id,
                topic: topic.to_string(),
                since: *since,
                epoch: epoch.as_deref().map(str::to_owned),
                data: data.map(json_bytes),
                delta: delta.then_some(true),
            }),
            Command::Unsub { id, topic } => Op::Unsub(v1::Unsub {
                id: *id,
                topic: topic.to_string(),
            }),
            Command::Pub { id, topic, data } => Op::Pub(v1::Pub {
                id: *id,
                topic: topic.to_string(),
                data: data.get().as_bytes().to_vec(),
            }),
            Command::Ack { topic, seq, epoch } => Op::Ack(v1::Ack {
                topic: topic.to_string(),
                seq: *seq,
                epoch: epoch.as_deref().map(str::to_owned),
            }),
            Command::Refresh { id, token } => Op::Refresh(v1::Refresh {
                id: *id,
                token: token.to_string(),
            }),
            Command::Ping { id } => Op::Ping(v1::Ping { id: *id }),
            Command::History {
                id,
                topic,
                since,
                epoch,
                limit,
                reverse,
            } => Op::History(v1::History {
                id: *id,
                topic: topic.to_string(),
                since: *since,
                epoch: epoch.as_deref().map(str::to_owned),
                limit: *limit,
                reverse: Some(*reverse),
            }),

            Command::Presence {
                id,
                topic,
                cursor,
                limit,
            } => Op::Presence(v1::Presence {
                id: *id,
                topic: topic.to_string(),
                cursor: cursor.as_deref().map(str::to_owned),
                limit: limit.map(|l| u32::try_from(l).unwrap_or(u32::MAX)),
            }),
            Command::Rpc { id, method, data } => Op::Rpc(v1::Rpc {
                id: *id,
                method: method.to_string(),
                data: data.map(json_bytes),
            }),
        };
        v1::ClientCommand { op: Some(op) }
    }
}

/// A command the server could not act on: the client gets it as an `err`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CommandError {
    /// The command's `id`, when it had one.
    pub id: Option<u64>,
    pub code: ErrorCode,
    pub message: String,
    /// The topic the error is about, when it is about one: a client learns
    /// which subscription an `err` without an `id` ended from it.
    pub topic: Option<String>,
    /// The application's own code for it (a backend's refusal of an `rpc`,
    /// `sub` or `pub`): the client's `err` carries it instead of `code`,
    /// which stays the kind of error it is (`forbidden`) for the pod's
    /// metrics and logs.
    pub app: Option<AppCode>,
}

impl CommandError {
    pub fn new(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            id,
            code,
            message: message.into(),
            topic: None,
            app: None,
        }
    }

    /// An error the application's backend named: the client sees its
    /// `code`, the pod counts it as `forbidden`.
    pub fn app(id: Option<u64>, code: AppCode, message: impl Into<String>) -> Self {
        Self {
            app: Some(code),
            ..Self::new(id, ErrorCode::Forbidden, message)
        }
    }

    /// The `code` the client's `err` carries.
    pub fn wire_code(&self) -> &str {
        self.app
            .as_ref()
            .map_or(self.code.as_str(), AppCode::as_str)
    }

    /// The same error, about `topic`.
    #[must_use]
    pub fn about(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }
}

/// An application's error code, as a backend named it: `[a-z][a-z0-9_]{0,31}`,
/// so that a client can switch on it as on Herald's own codes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AppCode(Box<str>);

impl AppCode {
    /// `code` when it is `[a-z][a-z0-9_]{0,31}`; `None` otherwise (the
    /// caller falls back to `forbidden`).
    pub fn parse(code: &str) -> Option<Self> {
        let bytes = code.as_bytes();
        let valid = (1..=32).contains(&bytes.len())
            && bytes[0].is_ascii_lowercase()
            && bytes[1..]
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_');
        valid.then(|| Self(code.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The `code` of an `err` reply; `docs/protocol.md` has the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Not a JSON object, or a field of the wrong type.
    Malformed,
    UnknownOp,
    MissingField,
    BadTopic,
    UnknownNamespace,
    /// The namespace does not let clients do this.
    Forbidden,
    NotSubscribed,
    AlreadySubscribed,
    TooManySubscriptions,
    /// The broker cannot take the request now; retry later.
    Unavailable,
    /// No valid token: missing, malformed, badly signed, or not for this
    /// pod (issuer, audience); a `refresh` of another user.
    Unauthorized,
    /// The token expired: get a new one.
    TokenExpired,
    /// Commands come faster than `websocket.commands_per_second` allows.
    RateLimited,
    /// The namespace does not keep what was asked for (presence).
    Disabled,
    Internal,
    /// A history read's `since` is out of the window (trimmed away, of
    /// another epoch, beyond the topic's seq): nothing of it is answered.
    HistoryLost,
}

impl ErrorCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::MissingField => "missing_field",
            ErrorCode::BadTopic => "bad_topic",
            ErrorCode::UnknownNamespace => "unknown_namespace",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotSubscribed => "not_subscribed",
            ErrorCode::AlreadySubscribed => "already_subscribed",
            ErrorCode::TooManySubscriptions => "too_many_subscriptions",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::TokenExpired => "token_expired",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::Disabled => "disabled",
            ErrorCode::Internal => "internal",
            ErrorCode::HistoryLost => "history_lost",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_and_hook_data_decode() {
        let text = r#"{"op":"rpc","id":9,"method":"rooms/create:v1.x-y_z","data":{"n":1}}"#;
        let Ok(Command::Rpc { id, method, data }) = Command::decode(text) else {
            panic!("rpc decodes")
        };
        assert_eq!((id, &*method), (9, "rooms/create:v1.x-y_z"));
        assert_eq!(data.map(RawValue::get), Some(r#"{"n":1}"#));
        assert!(matches!(
            Command::decode(r#"{"op":"rpc","id":1,"method":"m"}"#),
            Ok(Command::Rpc { data: None, .. })
        ));
        for bad in ["", "a b", "é", &"m".repeat(MAX_METHOD_BYTES + 1)] {
            let text = format!(r#"{{"op":"rpc","id":4,"method":"{bad}"}}"#);
            let err = Command::decode(&text).unwrap_err();
            assert_eq!(
                (err.code, err.id),
                (ErrorCode::Malformed, Some(4)),
                "{bad:?}"
            );
        }
        let err = Command::decode(r#"{"op":"rpc","id":4}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::MissingField);
        let Ok(Command::Hello { data, .. }) = Command::decode(r#"{"op":"hello","data":[1]}"#)
        else {
            panic!("hello decodes")
        };
        assert_eq!(data.map(RawValue::get), Some("[1]"));
        let Ok(Command::Sub { data, .. }) =
            Command::decode(r#"{"op":"sub","id":1,"topic":"a","data":"x"}"#)
        else {
            panic!("sub decodes")
        };
        assert_eq!(data.map(RawValue::get), Some(r#""x""#));
    }

    #[test]
    fn app_codes_are_lower_case_words() {
        for good in ["a", "not_found", "e2e", &"x".repeat(32)] {
            assert_eq!(
                AppCode::parse(good)
                    .map(|c| c.as_str().to_owned())
                    .as_deref(),
                Some(good)
            );
        }
        for bad in ["", "Upper", "1abc", "_a", "a-b", "a b", &"x".repeat(33)] {
            assert!(AppCode::parse(bad).is_none(), "{bad:?}");
        }
        let code = AppCode::parse("room_full").unwrap_or_else(|| panic!());
        let e = CommandError::app(Some(3), code, "full");
        assert_eq!((e.code, e.wire_code()), (ErrorCode::Forbidden, "room_full"));
        assert_eq!(
            CommandError::new(None, ErrorCode::Disabled, "").wire_code(),
            "disabled"
        );
    }

    #[test]
    fn data_is_kept_verbatim() {
        let text = r#"{"op":"pub","id":3,"topic":"news","data":{ "b" : 1.50, "a":"\u00e9" }}"#;
        let Ok(Command::Pub { data, .. }) = Command::decode(text) else {
            panic!("pub decodes")
        };
        assert_eq!(data.get(), r#"{ "b" : 1.50, "a":"\u00e9" }"#);
    }
}
