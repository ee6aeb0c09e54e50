//! The JSON form of the protocol: one object per WebSocket text frame.
//!
//! Commands are decoded borrowing from the frame, and `data` stays the client's
//! JSON text ([`RawValue`]): it is validated once and never re-serialised.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

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

/// A JSON value as protobuf carries it: its text, as bytes.
fn json_bytes(value: &RawValue) -> Vec<u8> {
    value.get().as_bytes().to_vec()
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
        /// An [`ErrorCode`]'s text, or an application's ([`AppCode`]).
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

/// One message of a history page, as the `history` reply and the HTTP
/// answer carry it: `{"seq":5,"data":<the JSON text>}`, or for binary data
/// `{"seq":5,"data":"<base64>","binary":true}`.
#[derive(Debug, Clone, Copy)]
pub struct HistoryItem<'a> {
    pub seq: u64,
    pub data: ItemData<'a>,
}

/// A kept message's data, of the kind it was published as.
#[derive(Debug, Clone, Copy)]
pub enum ItemData<'a> {
    /// JSON text, spliced verbatim.
    Json(&'a RawValue),
    /// Bytes (an `application/octet-stream` or gRPC `binary` publish): in
    /// JSON a base64 string (standard alphabet, padded), as the JSON
    /// protocol's `msg` has them; in protobuf the bytes themselves.
    Binary(&'a [u8]),
}

impl Serialize for HistoryItem<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let binary = matches!(self.data, ItemData::Binary(_));
        let mut item = s.serialize_struct("HistoryItem", 2 + usize::from(binary))?;
        item.serialize_field("seq", &self.seq)?;
        match self.data {
            ItemData::Json(data) => item.serialize_field("data", data)?,
            ItemData::Binary(bytes) => {
                item.serialize_field("data", &Base64(bytes))?;
                item.serialize_field("binary", &true)?;
            }
        }
        item.end()
    }
}

/// Bytes serialized as a base64 string, written straight into the output
/// (no `String` of it first).
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::display::Base64Display;
        use base64::engine::general_purpose::STANDARD;
        s.collect_str(&Base64Display::new(self.0, &STANDARD))
    }
}

/// The HTTP history answer (`GET /v1/history`): the `history` reply's
/// keys without `op` and `id`.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryResponse<'a> {
    pub topic: &'a str,
    pub epoch: &'a str,
    pub seq: u64,
    pub publications: &'a [HistoryItem<'a>],
}

impl HistoryResponse<'_> {
    /// The protobuf form (the gRPC `History` answer).
    pub fn to_proto(&self) -> v1::HistoryResponse {
        v1::HistoryResponse {
            topic: self.topic.to_owned(),
            epoch: self.epoch.to_owned(),
            seq: self.seq,
            publications: self
                .publications
                .iter()
                .map(HistoryItem::to_proto)
                .collect(),
        }
    }
}

/// One user in a topic's presence: its `sub`, and its token's `info` claim
/// (JSON text, an object) where it has one.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PresenceMember<'a> {
    pub user: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<&'a RawValue>,
}

impl PresenceMember<'_> {
    pub fn to_proto(&self) -> v1::PresenceMember {
        v1::PresenceMember {
            user: self.user.to_owned(),
            info: self.info.map(|info| info.get().as_bytes().to_vec()),
        }
    }
}

/// A page of a topic's presence: the client's `ok` (with its `id`), and the
/// answer to HTTP `GET /v1/presence` (as it is).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PresencePage<'a> {
    pub topic: &'a str,
    /// The topic's presence position the page answers at.
    pub position: u64,
    pub users: u64,
    pub connections: u64,
    pub members: &'a [PresenceMember<'a>],
    /// Absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<&'a str>,
}

impl PresencePage<'_> {
    /// The gRPC `Presence` answer.
    pub fn to_proto(&self) -> v1::PresenceResponse {
        v1::PresenceResponse {
            topic: self.topic.to_owned(),
            position: self.position,
            users: self.users,
            connections: self.connections,
            members: self.members.iter().map(PresenceMember::to_proto).collect(),
            cursor: self.cursor.map(str::to_owned),
        }
    }
}

impl HistoryItem<'_> {
    /// The protobuf form.
    pub fn to_proto(&self) -> v1::Publication {
        let (data, binary) = match self.data {
            ItemData::Json(data) => (data.get().as_bytes(), false),
            ItemData::Binary(bytes) => (bytes, true),
        };
        v1::Publication {
            seq: self.seq,
            data: data.to_vec(),
            binary,
        }
    }
}

/// HTTP `GET /v1/presence/stats`: a topic's presence counts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PresenceStats {
    pub topic: String,
    pub position: u64,
    pub users: u64,
    pub connections: u64,
}

impl PresenceStats {
    /// The gRPC `PresenceStats` answer.
    pub fn to_proto(&self) -> v1::PresenceStatsResponse {
        v1::PresenceStatsResponse {
            topic: self.topic.clone(),
            position: self.position,
            users: self.users,
            connections: self.connections,
        }
    }
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

/// The HTTP publish body: `{"topic":"news","data":<any JSON>}`, optionally
/// with `"idempotency_key":"<text>"`.
#[derive(Debug)]
pub struct PublishRequest<'a> {
    pub topic: Cow<'a, str>,
    pub data: &'a RawValue,
    pub idempotency_key: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawPublishRequest<'a> {
    #[serde(borrow)]
    topic: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    #[serde(borrow)]
    idempotency_key: Option<Cow<'a, str>>,
}

impl<'a> PublishRequest<'a> {
    /// Decodes a request body, with the same error codes as a command.
    pub fn decode(body: &'a [u8]) -> Result<Self, CommandError> {
        let raw: RawPublishRequest<'a> = from_object(body)?;
        let missing = |field: &str| {
            CommandError::new(
                None,
                ErrorCode::MissingField,
                format!("`{field}` is required"),
            )
        };
        Ok(Self {
            topic: raw.topic.ok_or_else(|| missing("topic"))?,
            data: raw.data.ok_or_else(|| missing("data"))?,
            idempotency_key: raw.idempotency_key,
        })
    }

    /// The protobuf form of this request (the gRPC `Publish` request).
    pub fn to_proto(&self) -> v1::PublishRequest {
        v1::PublishRequest {
            topic: self.topic.to_string(),
            data: self.data.get().as_bytes().to_vec(),
            idempotency_key: self.idempotency_key.as_deref().map(str::to_owned),
            binary: false,
        }
    }
}

/// The HTTP batch publish body: `{"items":[<publish body>, ...]}`. Each item
/// is decoded alone, so that a bad one fails alone.
#[derive(Debug)]
pub struct PublishBatchRequest<'a> {
    pub items: Vec<Result<PublishRequest<'a>, CommandError>>,
}

#[derive(Deserialize)]
struct RawPublishBatchRequest<'a> {
    #[serde(borrow)]
    items: Option<Vec<&'a RawValue>>,
}

impl<'a> PublishBatchRequest<'a> {
    /// Decodes a request body: only a body that is no object with an
    /// `items` array fails as a whole.
    pub fn decode(body: &'a [u8]) -> Result<Self, CommandError> {
        let raw: RawPublishBatchRequest<'a> = from_object(body)?;
        let items = raw.items.ok_or_else(|| {
            CommandError::new(None, ErrorCode::MissingField, "`items` is required")
        })?;
        Ok(Self {
            items: items
                .into_iter()
                .map(|item| PublishRequest::decode(item.get().as_bytes()))
                .collect(),
        })
    }
}

/// One item of the HTTP batch publish answer: the position, or why the item
/// was refused.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PublishResult {
    Published(PublishResponse),
    Error { error: PublishError },
}

/// Why a batch item was refused: what `POST /v1/publish` would have
/// answered it with.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PublishError {
    pub code: String,
    pub message: String,
}

/// The HTTP batch publish answer, one result per item, in order.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PublishBatchResponse {
    pub results: Vec<PublishResult>,
}

/// `Some` for any value that is present, `null` included (a plain
/// `Option<&RawValue>` reads `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Deserializes a JSON object. serde would also fill a struct from an array
/// of its fields in order (`["sub",1,"news"]`); the protocol speaks objects.
fn from_object<'a, T: Deserialize<'a>>(json: &'a [u8]) -> Result<T, CommandError> {
    let malformed = |message: String| CommandError::new(None, ErrorCode::Malformed, message);
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(malformed("expected a JSON object".to_owned()));
    }
    serde_json::from_slice(json).map_err(|e| malformed(e.to_string()))
}

/// The HTTP disconnect body: `{"user":"alice"}`.
#[derive(Debug)]
pub struct DisconnectRequest {
    pub user: String,
}

#[derive(Deserialize)]
struct RawDisconnectRequest {
    user: Option<String>,
}

impl DisconnectRequest {
    /// Decodes a request body, with the same error codes as a command (and,
    /// as they do, ignoring keys it does not know).
    pub fn decode(body: &[u8]) -> Result<Self, CommandError> {
        let raw: RawDisconnectRequest = from_object(body)?;
        let user = raw.user.ok_or_else(|| {
            CommandError::new(None, ErrorCode::MissingField, "`user` is required")
        })?;
        Ok(Self { user })
    }
}

/// The HTTP server-side subscription bodies: `POST /v1/subscribe`
/// `{"user":"alice","topic":"news","since":40?,"epoch":"…"?}` and `POST
/// /v1/unsubscribe` `{"user":"alice","topic":"news"}` (which ignores
/// `since` and `epoch`).
#[derive(Debug)]
pub struct SubscriptionRequest {
    pub user: String,
    pub topic: String,
    pub since: Option<u64>,
    pub epoch: Option<String>,
}

#[derive(Deserialize)]
struct RawSubscriptionRequest {
    user: Option<String>,
    topic: Option<String>,
    since: Option<u64>,
    epoch: Option<String>,
}

impl SubscriptionRequest {
    /// Decodes a request body, with the same error codes as a command.
    pub fn decode(body: &[u8]) -> Result<Self, CommandError> {
        let raw: RawSubscriptionRequest = from_object(body)?;
        let missing = |field: &str| {
            CommandError::new(
                None,
                ErrorCode::MissingField,
                format!("`{field}` is required"),
            )
        };
        Ok(Self {
            user: raw.user.ok_or_else(|| missing("user"))?,
            topic: raw.topic.ok_or_else(|| missing("topic"))?,
            since: raw.since,
            epoch: raw.epoch,
        })
    }
}

/// The HTTP publish answer.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PublishResponse {
    pub seq: u64,
    pub epoch: String,
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

    #[test]
    fn decode_reports_what_is_wrong() {
        let err = Command::decode(r#"{"op":"sub","topic":"a"}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::MissingField);
        let err = Command::decode(r#"{"op":"nope","id":7}"#).unwrap_err();
        assert_eq!((err.code, err.id), (ErrorCode::UnknownOp, Some(7)));
        let err = Command::decode("[1,2]").unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
        let err = Command::decode(r#"{"op":"pub","id":1,"topic":"a"}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::MissingField);
        // A struct would also deserialize from an array of its fields.
        let err = Command::decode(r#"["sub",1,"news"]"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
        let err = PublishRequest::decode(br#" ["news",1]"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
        let err = PublishRequest::decode(br#"{"topic":"news"}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::MissingField);
        // null is a value like any other.
        let err = PublishRequest::decode(br#"{"topic":"news","data":1,"idempotency_key":7}"#)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
        let ok = PublishRequest::decode(br#"{"topic":"news","data":null}"#);
        assert_eq!(
            ok.map(|r| r.data.get().to_owned()).ok().as_deref(),
            Some("null")
        );
        assert!(Command::decode(r#"{"op":"pub","id":1,"topic":"a","data":null}"#).is_ok());
    }

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
    fn a_binary_history_item_is_base64_in_json_and_bytes_in_protobuf() {
        let json = RawValue::from_string(r#"{"a": 1}"#.to_owned()).unwrap();
        let bytes = b"\x00\xff\xfeA";
        let items = [
            HistoryItem {
                seq: 4,
                data: ItemData::Json(&json),
            },
            HistoryItem {
                seq: 5,
                data: ItemData::Binary(bytes),
            },
        ];
        assert_eq!(
            serde_json::to_string(&items).unwrap(),
            r#"[{"seq":4,"data":{"a": 1}},{"seq":5,"data":"AP/+QQ==","binary":true}]"#
        );
        let pb = items[1].to_proto();
        assert_eq!((pb.seq, &pb.data[..]), (5, &bytes[..]));
        assert!(pb.binary && !items[0].to_proto().binary);
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
