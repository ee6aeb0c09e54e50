//! The protocol on the wire, in both encodings: the server frames the client
//! reads (only the keys it uses; unknown keys are ignored), as JSON text or
//! as `herald.v1.protobuf` messages read into the same [`Frame`], and the
//! commands it writes, in either ([`Command`], in `command.rs`).

mod command;

use std::borrow::Cow;
use std::sync::Arc;

use prost::Message as _;
use proto::v1;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::delta::{self, Body, Data};
use crate::presence::{Member, PresenceDiff, PresencePage};
use crate::{Error, Protocol};

pub(crate) use command::Command;

/// The subprotocol a [`Protocol::Protobuf`] client offers on the upgrade.
pub(crate) const PROTOBUF: &str = "herald.v1.protobuf";

/// Any server message: `op` says which keys matter.
#[derive(Deserialize, Default)]
pub(crate) struct Frame<'a> {
    #[serde(borrow)]
    pub op: Cow<'a, str>,
    pub id: Option<u64>,
    #[serde(borrow)]
    pub topic: Option<Cow<'a, str>>,
    pub seq: Option<u64>,
    #[serde(borrow)]
    pub epoch: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub data: Option<&'a RawValue>,
    #[serde(borrow)]
    pub session: Option<Cow<'a, str>>,
    pub ping_ms: Option<u64>,
    pub resumed: Option<bool>,
    pub expires: Option<u64>,
    pub recovered: Option<bool>,
    #[serde(borrow)]
    pub reason: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub code: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub message: Option<Cow<'a, str>>,
    pub after_ms: Option<u64>,
    /// `presence` answers and `presence_diff`.
    pub position: Option<u64>,
    pub users: Option<u64>,
    pub connections: Option<u64>,
    #[serde(borrow)]
    pub members: Option<Vec<WireMember<'a>>>,
    #[serde(borrow)]
    pub cursor: Option<Cow<'a, str>>,
    pub from: Option<u64>,
    pub to: Option<u64>,
    #[serde(borrow)]
    pub joins: Option<Vec<WireMember<'a>>>,
    #[serde(borrow)]
    pub leaves: Option<Vec<Cow<'a, str>>>,
    /// `history` answers.
    #[serde(borrow)]
    pub publications: Option<Vec<WirePublication<'a>>>,
    /// A `msg`'s `data` is binary, base64-encoded.
    pub binary: Option<bool>,
    /// A `msg` in a delta subscription: the payload's JSON text, as a string.
    #[serde(borrow)]
    full: Option<Cow<'a, str>>,
    /// A `msg`'s delta (a string, one char per byte); in a `sub`'s `ok`,
    /// `true` where deltas were granted.
    #[serde(borrow, default, deserialize_with = "present")]
    delta: Option<&'a RawValue>,
    /// A `sub`'s `ok` granted deltas (read from `delta`, or protobuf's
    /// `Ok.delta`).
    #[serde(skip)]
    pub granted: bool,
    /// A protobuf `msg`'s data and flags.
    #[serde(skip)]
    proto_msg: Option<&'a v1::Msg>,
}

/// A presence member as the server writes it.
#[derive(Deserialize)]
pub(crate) struct WireMember<'a> {
    #[serde(borrow)]
    pub user: Cow<'a, str>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub info: Option<&'a RawValue>,
}

/// A kept message in a `history` answer.
#[derive(Deserialize)]
pub(crate) struct WirePublication<'a> {
    pub seq: u64,
    #[serde(borrow, default, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    /// `data` is binary (base64 in JSON).
    #[serde(default)]
    binary: bool,
    /// Protobuf: the data's bytes.
    #[serde(skip)]
    bytes: Option<&'a [u8]>,
}

impl WirePublication<'_> {
    /// The publication's data, whole.
    pub fn data(&self) -> Result<Data, String> {
        match (self.bytes, self.binary) {
            (Some(bytes), true) => Ok(Data::Binary(bytes::Bytes::copy_from_slice(bytes))),
            (Some(bytes), false) => json_text(bytes).map(|raw| Data::Json(raw.to_owned())),
            (None, true) => {
                let text: String = serde_json::from_str(self.data.map_or("null", RawValue::get))
                    .map_err(|e| format!("binary data that is not a string: {e}"))?;
                delta::base64_decode(&text).map(|b| Data::Binary(b.into()))
            }
            (None, false) => Ok(Data::Json(self.data.unwrap_or(RawValue::NULL).to_owned())),
        }
    }
}

/// JSON text in a protobuf `bytes` field, checked.
fn json_text(bytes: &[u8]) -> Result<&RawValue, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("data that is not UTF-8: {e}"))?;
    serde_json::from_str(text).map_err(|e| format!("data that is not JSON: {e}"))
}

impl<'a> Frame<'a> {
    pub fn parse(text: &'a str) -> Result<Self, Error> {
        let mut frame: Frame<'a> = serde_json::from_str(text).map_err(|e| Error::Protocol {
            reason: e.to_string(),
            frame: text.chars().take(200).collect(),
        })?;
        frame.granted = frame.op == "ok" && frame.delta.is_some_and(|d| d.get() == "true");
        Ok(frame)
    }

    /// A `herald.v1.protobuf` message read as the frame its JSON form
    /// would be (borrowing its strings and data).
    pub fn from_proto(message: &'a v1::ServerMessage) -> Result<Self, Error> {
        use v1::server_message::Op;
        let unreadable = |reason: String| Error::Protocol {
            reason,
            frame: format!("{message:?}").chars().take(200).collect(),
        };
        let json = |bytes: &'a Option<Vec<u8>>| -> Result<Option<&'a RawValue>, Error> {
            bytes
                .as_deref()
                .map(json_text)
                .transpose()
                .map_err(unreadable)
        };
        let members = |members: &'a [v1::PresenceMember]| -> Result<Vec<WireMember<'a>>, Error> {
            members
                .iter()
                .map(|m| {
                    Ok(WireMember {
                        user: Cow::Borrowed(&m.user),
                        info: json(&m.info)?,
                    })
                })
                .collect()
        };
        let text = |s: &'a Option<String>| s.as_deref().map(Cow::Borrowed);
        let frame = match &message.op {
            None => return Err(unreadable("a server message without an op".to_owned())),
            Some(Op::Welcome(w)) => Frame {
                op: Cow::Borrowed("welcome"),
                session: Some(Cow::Borrowed(&w.session)),
                ping_ms: Some(w.ping_ms),
                resumed: Some(w.resumed),
                expires: w.expires,
                reason: text(&w.reason),
                ..Frame::default()
            },
            Some(Op::Ok(ok)) => Frame {
                op: Cow::Borrowed("ok"),
                // 0: an `ok` the client did not ask for (absent in JSON).
                id: (ok.id != 0).then_some(ok.id),
                topic: text(&ok.topic),
                seq: ok.seq,
                epoch: text(&ok.epoch),
                recovered: ok.recovered,
                expires: ok.expires,
                position: ok.position,
                users: ok.users,
                connections: ok.connections,
                members: Some(members(&ok.members)?),
                cursor: text(&ok.cursor),
                reason: text(&ok.reason),
                publications: Some(
                    ok.publications
                        .iter()
                        .map(|p| WirePublication {
                            seq: p.seq,
                            data: None,
                            binary: p.binary,
                            bytes: Some(&p.data),
                        })
                        .collect(),
                ),
                data: json(&ok.data)?,
                granted: ok.delta == Some(true),
                ..Frame::default()
            },
            Some(Op::Msg(m)) => Frame {
                op: Cow::Borrowed("msg"),
                topic: Some(Cow::Borrowed(&m.topic)),
                seq: Some(m.seq),
                proto_msg: Some(m),
                ..Frame::default()
            },
            Some(Op::Err(e)) => Frame {
                op: Cow::Borrowed("err"),
                id: e.id,
                code: Some(Cow::Borrowed(&e.code)),
                message: Some(Cow::Borrowed(&e.message)),
                topic: text(&e.topic),
                ..Frame::default()
            },
            Some(Op::Reset(r)) => Frame {
                op: Cow::Borrowed("reset"),
                topic: Some(Cow::Borrowed(&r.topic)),
                epoch: Some(Cow::Borrowed(&r.epoch)),
                seq: Some(r.seq),
                ..Frame::default()
            },
            Some(Op::Reconnect(r)) => Frame {
                op: Cow::Borrowed("reconnect"),
                after_ms: Some(r.after_ms),
                reason: Some(Cow::Borrowed(&r.reason)),
                ..Frame::default()
            },
            Some(Op::PresenceDiff(d)) => {
                // Protobuf cannot leave a list out: both empty is the
                // counts-only diff JSON writes without them.
                let counts_only = d.joins.is_empty() && d.leaves.is_empty();
                Frame {
                    op: Cow::Borrowed("presence_diff"),
                    topic: Some(Cow::Borrowed(&d.topic)),
                    from: Some(d.from),
                    to: Some(d.to),
                    joins: (!counts_only).then(|| members(&d.joins)).transpose()?,
                    leaves: (!counts_only)
                        .then(|| d.leaves.iter().map(|l| Cow::Borrowed(l.as_str())).collect()),
                    users: Some(d.users),
                    connections: Some(d.connections),
                    ..Frame::default()
                }
            }
            Some(Op::Unsubscribed(u)) => Frame {
                op: Cow::Borrowed("unsubscribed"),
                topic: Some(Cow::Borrowed(&u.topic)),
                reason: Some(Cow::Borrowed(&u.reason)),
                ..Frame::default()
            },
        };
        Ok(frame)
    }
}

impl Frame<'_> {
    /// What a `msg` carries, in either encoding.
    pub fn body(&self) -> Result<Body<'_>, String> {
        if let Some(m) = self.proto_msg {
            let bytes = Cow::Borrowed(&m.data[..]);
            return Ok(if m.delta {
                Body::Delta {
                    bytes,
                    binary: m.binary,
                }
            } else {
                Body::Full {
                    bytes,
                    binary: m.binary,
                    base: true,
                }
            });
        }
        if let Some(full) = &self.full {
            return Ok(Body::Full {
                bytes: Cow::Borrowed(full.as_bytes()),
                binary: false,
                base: true,
            });
        }
        if let Some(d) = self.delta {
            let text: String = serde_json::from_str(d.get())
                .map_err(|e| format!("a delta that is not a string: {e}"))?;
            return Ok(Body::Delta {
                bytes: Cow::Owned(delta::delta_bytes(&text)?),
                binary: false,
            });
        }
        let data = self.data.unwrap_or(RawValue::NULL);
        if self.binary == Some(true) {
            let text: String = serde_json::from_str(data.get())
                .map_err(|e| format!("binary data that is not a string: {e}"))?;
            return Ok(Body::Full {
                bytes: Cow::Owned(delta::base64_decode(&text)?),
                binary: true,
                base: false,
            });
        }
        Ok(Body::Json(data))
    }

    /// A `presence` answer as a page.
    pub fn presence_page(&self) -> PresencePage {
        PresencePage {
            topic: self.topic.as_deref().unwrap_or_default().to_owned(),
            position: self.position.unwrap_or(0),
            users: self.users.unwrap_or(0),
            connections: self.connections.unwrap_or(0),
            members: members(self.members.as_deref()),
            cursor: self.cursor.as_deref().map(str::to_owned),
        }
    }

    /// A `presence_diff`, if it has its topic and positions; without
    /// `joins` and `leaves` it is counts only.
    pub fn presence_diff(&self) -> Option<PresenceDiff> {
        let (Some(topic), Some(from), Some(to)) = (self.topic.as_deref(), self.from, self.to)
        else {
            return None;
        };
        Some(PresenceDiff {
            topic: Arc::from(topic),
            from,
            to,
            joins: members(self.joins.as_deref()),
            leaves: self
                .leaves
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(|u| Arc::from(&**u))
                .collect(),
            counts_only: self.joins.is_none() && self.leaves.is_none(),
            users: self.users.unwrap_or(0),
            connections: self.connections.unwrap_or(0),
        })
    }
}

fn members(wire: Option<&[WireMember<'_>]>) -> Vec<Member> {
    wire.unwrap_or_default()
        .iter()
        .map(|m| Member::new(&m.user, m.info))
        .collect()
}

/// `Some` for a value that is present, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A server message as it came, before it is read as a [`Frame`] (which
/// borrows from it).
// One at a time, on the reader's stack: boxing the larger one would cost an
// allocation per message for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Incoming {
    Text(tokio_tungstenite::tungstenite::Utf8Bytes),
    Proto(v1::ServerMessage),
}

impl Incoming {
    /// A data message of `protocol`; the other kind is an error (the
    /// server answers each connection in the encoding it negotiated).
    pub fn decode(protocol: Protocol, message: WsMessage) -> Result<Self, Error> {
        match (protocol, message) {
            (Protocol::Json, WsMessage::Text(text)) => Ok(Incoming::Text(text)),
            (Protocol::Protobuf, WsMessage::Binary(bytes)) => v1::ServerMessage::decode(bytes)
                .map(Incoming::Proto)
                .map_err(|e| Error::Protocol {
                    reason: format!("a binary message that is not a ServerMessage: {e}"),
                    frame: String::new(),
                }),
            (_, other) => Err(Error::Protocol {
                reason: format!("a {} message on a {protocol:?} connection", kind(&other)),
                frame: other
                    .to_text()
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect(),
            }),
        }
    }

    pub fn frame(&self) -> Result<Frame<'_>, Error> {
        match self {
            Incoming::Text(text) => Frame::parse(text.as_str()),
            Incoming::Proto(message) => Frame::from_proto(message),
        }
    }

    /// The message as the error for an unreadable one shows it.
    pub fn show(&self) -> String {
        match self {
            Incoming::Text(text) => text.as_str().chars().take(200).collect(),
            Incoming::Proto(message) => format!("{message:?}").chars().take(200).collect(),
        }
    }
}

fn kind(message: &WsMessage) -> &'static str {
    match message {
        WsMessage::Text(_) => "text",
        WsMessage::Binary(_) => "binary",
        _ => "control",
    }
}

/// The `host:port` of a `ws://` URL (port 80 when absent).
pub(crate) fn host_port(url: &str) -> Result<String, Error> {
    let bad = |reason: &str| Error::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let rest = url
        .strip_prefix("ws://")
        .ok_or_else(|| bad("only ws:// URLs are supported"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(bad("no host (or user info, which is not supported)"));
    }
    // `[::1]:8080`, `host:8080`, `host`.
    let has_port = match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    };
    Ok(if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_what_the_server_sends() {
        let f = Frame::parse(r#"{"op":"msg","topic":"news","seq":42,"data":{"a":[1, 2]}}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((f.op.as_ref(), f.seq), ("msg", Some(42)));
        assert_eq!(f.data.map(RawValue::get), Some(r#"{"a":[1, 2]}"#));
        let f = Frame::parse(r#"{"op":"msg","topic":"news","seq":1,"data":null,"new":1}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.data.map(RawValue::get), Some("null"));
        let f = Frame::parse(
            r#"{"op":"presence_diff","topic":"room:1","from":17,"to":19,"joins":[{"user":"carol","info":{"name":"C"}}],"leaves":["bob"],"users":2,"connections":2}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((f.from, f.to, f.users), (Some(17), Some(19), Some(2)));
        let joins = f.joins.unwrap_or_default();
        assert_eq!(joins[0].user, "carol");
        assert_eq!(joins[0].info.map(RawValue::get), Some(r#"{"name":"C"}"#));
        assert_eq!(f.leaves.unwrap_or_default(), vec!["bob"]);
        let f = Frame::parse(
            r#"{"op":"ok","id":3,"topic":"news","epoch":"e","seq":42,"publications":[{"seq":41,"data":[1]},{"seq":42,"data":null}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let publications = f.publications.unwrap_or_default();
        assert_eq!(publications[0].data.map(RawValue::get), Some("[1]"));
        assert_eq!(publications[1].data.map(RawValue::get), Some("null"));
        let f = Frame::parse(r#"{"op":"ok","topic":"news","seq":4,"epoch":"e","reason":"server"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((f.id, f.reason.as_deref()), (None, Some("server")));
        assert!(Frame::parse("[1]").is_err());
        assert!(Frame::parse(r#"{"seq":1}"#).is_err());
    }

    /// A `msg` frame's body, read into owned parts for comparing.
    fn body_of(frame: &Frame<'_>) -> (&'static str, Vec<u8>, bool) {
        match frame.body().unwrap_or_else(|e| panic!("{e}")) {
            Body::Json(raw) => ("json", raw.get().as_bytes().to_vec(), false),
            Body::Full {
                bytes,
                binary,
                base: true,
            } => ("full", bytes.into_owned(), binary),
            Body::Full { bytes, binary, .. } => ("data", bytes.into_owned(), binary),
            Body::Delta { bytes, binary } => ("delta", bytes.into_owned(), binary),
        }
    }

    #[test]
    fn json_msgs_read_in_every_form_the_spec_gives() {
        let f = Frame::parse(r#"{"op":"msg","topic":"t","seq":5,"data":{"a":1}}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(body_of(&f), ("json", br#"{"a":1}"#.to_vec(), false));
        // Binary data: base64, standard alphabet, padded.
        let f = Frame::parse(r#"{"op":"msg","topic":"t","seq":5,"data":"AP+AgQ==","binary":true}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(body_of(&f), ("data", vec![0, 0xff, 0x80, 0x81], true));
        // `full`: the payload's JSON text as a string, its exact bytes.
        let f = Frame::parse(
            r#"{"op":"msg","topic":"t","seq":5,"full":"{\"name\":\"Zoë\", \"n\":1}"}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            body_of(&f),
            (
                "full",
                r#"{"name":"Zoë", "n":1}"#.as_bytes().to_vec(),
                false
            )
        );
        // `delta`: one char per byte; U+00C3 U+00AB are the bytes of "ë".
        let f =
            Frame::parse(r#"{"op":"msg","topic":"t","seq":6,"delta":"3\n2:\u00c3\u00ab1@0,0;"}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            body_of(&f),
            ("delta", b"3\n2:\xc3\xab1@0,0;".to_vec(), false)
        );
        let f = Frame::parse(r#"{"op":"msg","topic":"t","seq":6,"delta":"\u0100"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(f.body().is_err());
        let f = Frame::parse(r#"{"op":"msg","topic":"t","seq":6,"data":"!!","binary":true}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(f.body().is_err());
        // The `ok` of a `sub` says whether deltas were granted.
        let f = Frame::parse(r#"{"op":"ok","id":1,"topic":"t","seq":4,"epoch":"e","delta":true}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(f.granted);
        let f = Frame::parse(r#"{"op":"ok","id":1,"topic":"t","seq":4,"epoch":"e"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!f.granted);
        // History items: JSON, or base64 with `binary`.
        let f = Frame::parse(
            r#"{"op":"ok","id":2,"topic":"t","seq":2,"epoch":"e","publications":[{"seq":1,"data":"AP8=","binary":true},{"seq":2,"data":[1]}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let items: Vec<Data> = f
            .publications
            .unwrap_or_default()
            .iter()
            .map(|p| p.data().unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(
            items[0],
            Data::Binary(bytes::Bytes::from_static(&[0, 0xff]))
        );
        assert_eq!(items[1].json().map(RawValue::get), Some("[1]"));
    }

    #[test]
    fn protobuf_messages_read_as_their_json_form_would() {
        use v1::server_message::Op;
        let message = |op: Op| {
            let bytes = v1::ServerMessage { op: Some(op) }.encode_to_vec();
            let incoming = Incoming::decode(Protocol::Protobuf, WsMessage::binary(bytes))
                .unwrap_or_else(|e| panic!("{e}"));
            match incoming {
                Incoming::Proto(m) => m,
                Incoming::Text(_) => panic!("text"),
            }
        };
        let m = message(Op::Welcome(v1::Welcome {
            session: "s1".into(),
            ping_ms: 25_000,
            resumed: true,
            expires: Some(9),
            reason: None,
        }));
        let f = Frame::from_proto(&m).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                f.op.as_ref(),
                f.session.as_deref(),
                f.ping_ms,
                f.resumed,
                f.expires
            ),
            ("welcome", Some("s1"), Some(25_000), Some(true), Some(9))
        );
        let m = message(Op::Msg(v1::Msg {
            topic: "t".into(),
            seq: 5,
            data: br#"{"a":1}"#.to_vec(),
            delta: false,
            binary: false,
        }));
        let f = Frame::from_proto(&m).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((f.topic.as_deref(), f.seq), (Some("t"), Some(5)));
        assert_eq!(body_of(&f), ("full", br#"{"a":1}"#.to_vec(), false));
        let m = message(Op::Msg(v1::Msg {
            topic: "t".into(),
            seq: 6,
            data: b"1\n1:x0;".to_vec(),
            delta: true,
            binary: true,
        }));
        let f = Frame::from_proto(&m).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(body_of(&f), ("delta", b"1\n1:x0;".to_vec(), true));
        // An `ok` the client did not ask for has id 0; `delta` granted.
        let m = message(Op::Ok(v1::Ok {
            id: 0,
            topic: Some("t".into()),
            seq: Some(4),
            epoch: Some("e".into()),
            reason: Some("token".into()),
            delta: Some(true),
            data: Some(br#"{"x":[1, 2]}"#.to_vec()),
            publications: vec![
                v1::Publication {
                    seq: 1,
                    data: vec![0, 0xff, 0xfe],
                    binary: true,
                },
                v1::Publication {
                    seq: 2,
                    data: b"null".to_vec(),
                    binary: false,
                },
            ],
            ..v1::Ok::default()
        }));
        let f = Frame::from_proto(&m).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (f.id, f.reason.as_deref(), f.granted),
            (None, Some("token"), true)
        );
        assert_eq!(f.data.map(RawValue::get), Some(r#"{"x":[1, 2]}"#));
        let items: Vec<Data> = f
            .publications
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|p| p.data().unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(
            items,
            [
                Data::Binary(bytes::Bytes::from_static(&[0, 0xff, 0xfe])),
                Data::Json(RawValue::NULL.to_owned())
            ]
        );
        // Data that is not JSON where JSON is due: refused, no panic.
        let m = message(Op::Ok(v1::Ok {
            id: 3,
            data: Some(b"{not json".to_vec()),
            ..v1::Ok::default()
        }));
        assert!(Frame::from_proto(&m).is_err());
        // A counts-only diff: no lists.
        let m = message(Op::PresenceDiff(v1::PresenceDiff {
            topic: "room".into(),
            from: 1,
            to: 2,
            users: 300,
            connections: 310,
            ..v1::PresenceDiff::default()
        }));
        let f = Frame::from_proto(&m).unwrap_or_else(|e| panic!("{e}"));
        let diff = f.presence_diff().unwrap_or_else(|| panic!("a diff"));
        assert!(diff.counts_only);
        let m = message(Op::Err(v1::Err {
            id: Some(7),
            code: "forbidden".into(),
            message: "no".into(),
            topic: Some("t".into()),
        }));
        let f = Frame::from_proto(&m).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (f.op.as_ref(), f.id, f.code.as_deref()),
            ("err", Some(7), Some("forbidden"))
        );
        // A message without an op, a text frame on a protobuf connection,
        // bytes that are not a ServerMessage: errors, never a panic.
        assert!(Frame::from_proto(&v1::ServerMessage { op: None }).is_err());
        assert!(Incoming::decode(Protocol::Protobuf, WsMessage::text("{}")).is_err());
        assert!(Incoming::decode(Protocol::Json, WsMessage::binary(vec![1u8])).is_err());
        assert!(
            Incoming::decode(Protocol::Protobuf, WsMessage::binary(vec![0xffu8, 0xff])).is_err()
        );
    }

    #[test]
    fn urls_name_host_and_port() {
        assert_eq!(
            host_port("ws://127.0.0.1:8080/ws").ok().as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            host_port("ws://example.com/ws").ok().as_deref(),
            Some("example.com:80")
        );
        assert_eq!(
            host_port("ws://[::1]:9/ws").ok().as_deref(),
            Some("[::1]:9")
        );
        assert_eq!(host_port("ws://[::1]/ws").ok().as_deref(), Some("[::1]:80"));
        assert!(host_port("wss://example.com/ws").is_err());
        assert!(host_port("ws:///ws").is_err());
    }
}
