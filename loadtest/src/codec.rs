//! The client's side of Herald's wire formats (issue #26), for the clients
//! that measure them (`formats`): the `sub` a client sends in each protocol,
//! the server frames it reads back ([`Frame`]), and the deltas it applies
//! ([`Reassembler`]), so that every payload a client reconstructs can be
//! checked against what was published.
//!
//! - JSON (`herald.v1.json`, or no subprotocol): text frames. A `msg` carries
//!   its payload as `data` (the JSON text as published); in a delta
//!   subscription, as `full` (the payload's text as a JSON string) or as
//!   `delta` (a Fossil delta, one char per byte).
//! - Protobuf (`herald.v1.protobuf`): binary frames, each one
//!   `ServerMessage` of the `proto` crate; a client's command one
//!   `ClientCommand`. `Msg.data` is the payload, or with `Msg.delta` the delta.
//!
//! permessage-deflate is below both ([`raw`](crate::raw) inflates).

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use prost::Message as _;
use proto::v1;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::raw;

/// The subprotocol a client offers for the binary protocol.
pub const PROTOBUF: &str = "herald.v1.protobuf";

/// A subscriber's wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// JSON text frames (no subprotocol offered, as today's clients).
    Json,
    /// `herald.v1.protobuf`: one protobuf message per binary frame.
    Protobuf,
}

/// What a subscriber speaks: the protocol, permessage-deflate, deltas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Format {
    pub protocol: Protocol,
    /// Offers permessage-deflate (as Chromium does).
    pub deflate: bool,
    /// Subscribes with `delta: true`.
    pub delta: bool,
}

impl Format {
    /// Every combination, in the order the table shows them: JSON, then
    /// protobuf, each without and with deflate; then the same with deltas.
    pub const ALL: [Self; 8] = [
        Self::new(Protocol::Json, false, false),
        Self::new(Protocol::Json, true, false),
        Self::new(Protocol::Protobuf, false, false),
        Self::new(Protocol::Protobuf, true, false),
        Self::new(Protocol::Json, false, true),
        Self::new(Protocol::Json, true, true),
        Self::new(Protocol::Protobuf, false, true),
        Self::new(Protocol::Protobuf, true, true),
    ];

    pub const fn new(protocol: Protocol, deflate: bool, delta: bool) -> Self {
        Self {
            protocol,
            deflate,
            delta,
        }
    }

    /// The headers of the upgrade: the subprotocol, the extension offer.
    pub fn headers(&self) -> Vec<(&'static str, &'static str)> {
        let mut headers = Vec::new();
        if self.protocol == Protocol::Protobuf {
            headers.push(("Sec-WebSocket-Protocol", PROTOBUF));
        }
        if self.deflate {
            headers.push(("Sec-WebSocket-Extensions", raw::DEFLATE_OFFER));
        }
        headers
    }
}

/// `json`, `protobuf+deflate`, `delta-json`, `delta-protobuf+deflate`, ...
impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let delta = if self.delta { "delta-" } else { "" };
        let protocol = match self.protocol {
            Protocol::Json => "json",
            Protocol::Protobuf => "protobuf",
        };
        let deflate = if self.deflate { "+deflate" } else { "" };
        write!(f, "{delta}{protocol}{deflate}")
    }
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.to_string() == s)
            .ok_or_else(|| {
                let all: Vec<String> = Self::ALL.iter().map(ToString::to_string).collect();
                format!("`{s}`: one of {}", all.join(", "))
            })
    }
}

/// A `sub` of `topic` (id `id`) as `protocol` sends it: (opcode, payload).
pub fn sub(protocol: Protocol, id: u64, topic: &str, delta: bool) -> (u8, Vec<u8>) {
    match protocol {
        Protocol::Json => {
            let mut sub = serde_json::json!({"op": "sub", "id": id, "topic": topic});
            if delta {
                sub["delta"] = true.into();
            }
            (raw::OP_TEXT, sub.to_string().into_bytes())
        }
        Protocol::Protobuf => {
            let command = v1::ClientCommand {
                op: Some(v1::client_command::Op::Sub(v1::Sub {
                    id,
                    topic: topic.to_owned(),
                    delta: delta.then_some(true),
                    ..Default::default()
                })),
            };
            (raw::OP_BINARY, command.encode_to_vec())
        }
    }
}

/// A server frame, as far as the measuring clients care.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Welcome,
    /// A command's `ok`: its id, the topic's seq, whether deltas were granted.
    Ok {
        id: u64,
        seq: u64,
        delta: bool,
    },
    Msg(Msg),
    /// Anything else (an `err`, a `reset`, ...), described.
    Other(String),
}

/// A `msg`.
#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    pub topic: String,
    pub seq: u64,
    pub body: Body,
}

/// What a `msg` carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// The payload, outside the live deltas (JSON's `data`: a replay, or a
    /// subscription without deltas): a client drops its base.
    Data(Vec<u8>),
    /// The whole payload, a base for the next delta (JSON's `full`; every
    /// protobuf `msg` that is not a delta).
    Full(Vec<u8>),
    /// A Fossil delta against the previous seq's payload.
    Delta(Vec<u8>),
    /// Binary data (`binary`): never a base, never a delta.
    Binary(Vec<u8>),
}

/// A server frame's opcode and payload read as `protocol`'s.
pub fn decode(protocol: Protocol, opcode: u8, payload: &[u8]) -> Result<Frame, String> {
    match (protocol, opcode) {
        (Protocol::Json, raw::OP_TEXT) => decode_json(payload),
        (Protocol::Protobuf, raw::OP_BINARY) => decode_protobuf(payload),
        (_, op) => Err(format!("a {protocol:?} client got a frame of opcode {op}")),
    }
}

/// A JSON frame's fields the clients read.
#[derive(Deserialize)]
struct JsonFrame<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    id: Option<u64>,
    topic: Option<String>,
    seq: Option<u64>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    full: Option<String>,
    delta: Option<DeltaField>,
    binary: Option<bool>,
}

/// `delta`: in an `ok`, whether deltas were granted; in a `msg`, the delta.
#[derive(Deserialize)]
#[serde(untagged)]
enum DeltaField {
    Granted(bool),
    Bytes(String),
}

fn decode_json(payload: &[u8]) -> Result<Frame, String> {
    let text = || String::from_utf8_lossy(&payload[..payload.len().min(200)]).into_owned();
    let frame: JsonFrame<'_> =
        serde_json::from_slice(payload).map_err(|e| format!("not a frame ({e}): {}", text()))?;
    match frame.op.as_ref() {
        "welcome" => Ok(Frame::Welcome),
        "ok" => Ok(Frame::Ok {
            id: frame.id.unwrap_or(0),
            seq: frame.seq.unwrap_or(0),
            delta: matches!(frame.delta, Some(DeltaField::Granted(true))),
        }),
        "msg" => {
            let (Some(topic), Some(seq)) = (frame.topic, frame.seq) else {
                return Err(format!("a msg without topic or seq: {}", text()));
            };
            let body = match (frame.data, frame.full, frame.delta, frame.binary) {
                (Some(_), _, _, Some(true)) => {
                    return Err("binary data: no payload of `formats` is binary".to_owned());
                }
                (Some(data), None, None, _) => Body::Data(data.get().as_bytes().to_vec()),
                (None, Some(full), None, _) => Body::Full(full.into_bytes()),
                (None, None, Some(DeltaField::Bytes(delta)), _) => {
                    Body::Delta(delta_bytes(&delta)?)
                }
                _ => return Err(format!("a msg with none or several bodies: {}", text())),
            };
            Ok(Frame::Msg(Msg { topic, seq, body }))
        }
        _ => Ok(Frame::Other(text())),
    }
}

/// A JSON delta string's bytes: each char is one byte (U+0000 to U+00FF).
fn delta_bytes(delta: &str) -> Result<Vec<u8>, String> {
    delta
        .chars()
        .map(|c| u8::try_from(u32::from(c)).map_err(|_| format!("a delta char {c:?} over U+00FF")))
        .collect()
}

fn decode_protobuf(payload: &[u8]) -> Result<Frame, String> {
    use v1::server_message::Op;
    let message = v1::ServerMessage::decode(payload)
        .map_err(|e| format!("not a ServerMessage ({e}), {} bytes", payload.len()))?;
    Ok(match message.op {
        Some(Op::Welcome(_)) => Frame::Welcome,
        Some(Op::Ok(ok)) => Frame::Ok {
            id: ok.id,
            seq: ok.seq.unwrap_or(0),
            delta: ok.delta.unwrap_or(false),
        },
        Some(Op::Msg(msg)) => Frame::Msg(Msg {
            topic: msg.topic,
            seq: msg.seq,
            body: match (msg.binary, msg.delta) {
                (true, _) => Body::Binary(msg.data),
                (false, true) => Body::Delta(msg.data),
                (false, false) => Body::Full(msg.data),
            },
        }),
        other => Frame::Other(format!("{other:?}")),
    })
}

/// One topic's payloads put back together from what came: each delta
/// applied to the payload of the seq before it.
#[derive(Debug, Default)]
pub struct Reassembler {
    /// The last payload that can be a base, and its seq.
    base: Option<(u64, Vec<u8>)>,
}

impl Reassembler {
    /// The whole payload of `seq`, from its `body`: a delta must come right
    /// after its base (seq - 1) and apply to it (Fossil's checksum included).
    pub fn payload(&mut self, seq: u64, body: Body) -> Result<Vec<u8>, String> {
        match body {
            Body::Data(data) | Body::Binary(data) => {
                self.base = None;
                Ok(data)
            }
            Body::Full(data) => {
                self.base = Some((seq, data.clone()));
                Ok(data)
            }
            Body::Delta(delta) => {
                let base = match &self.base {
                    Some((at, base)) if at + 1 == seq => base,
                    Some((at, _)) => {
                        return Err(format!("a delta for seq {seq} on the base of seq {at}"));
                    }
                    None => return Err(format!("a delta for seq {seq} without a base")),
                };
                let data = apply(base, &delta)
                    .map_err(|e| format!("the delta for seq {seq} does not apply: {e}"))?;
                self.base = Some((seq, data.clone()));
                Ok(data)
            }
        }
    }
}

/// Fossil's `apply`, which panics on some malformed deltas (an index past
/// the end): caught, so that a bad delta fails the run with a message. It
/// also takes a delta cut short as whole, unchecked: a delta must end with
/// its checksum command (`<checksum>;`), which `apply` verifies.
fn apply(base: &[u8], delta: &[u8]) -> Result<Vec<u8>, String> {
    if delta.last() != Some(&b';') {
        return Err("a delta that does not end with its checksum".to_owned());
    }
    match std::panic::catch_unwind(|| fossil_delta::apply(base, delta)) {
        Ok(Ok(data)) => Ok(data),
        Ok(Err(e)) => Err(format!("{e:?}")),
        Err(_) => Err("a malformed delta".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_read_as_they_print() {
        for f in Format::ALL {
            assert_eq!(f.to_string().parse::<Format>(), Ok(f));
        }
        assert_eq!(Format::ALL[7].to_string(), "delta-protobuf+deflate");
        assert!("xml".parse::<Format>().is_err());
        let headers = Format::ALL[3].headers();
        assert_eq!(headers[0], ("Sec-WebSocket-Protocol", PROTOBUF));
        assert_eq!(headers[1].0, "Sec-WebSocket-Extensions");
        assert!(Format::ALL[0].headers().is_empty());
    }

    #[test]
    fn a_json_sub_asks_for_deltas_only_when_told() {
        let (op, sub) = sub(Protocol::Json, 3, "t", true);
        assert_eq!(op, raw::OP_TEXT);
        let sub: serde_json::Value = serde_json::from_slice(&sub).expect("json");
        assert_eq!(sub["delta"], true);
        assert_eq!(sub["id"], 3);
        let (_, plain) = super::sub(Protocol::Json, 1, "t", false);
        assert!(!String::from_utf8_lossy(&plain).contains("delta"));
    }

    #[test]
    fn json_msgs_in_all_three_forms() {
        let data = decode_json(br#"{"op":"msg","topic":"t","seq":5,"data":{"a": [1, 2]}}"#);
        assert_eq!(
            data,
            Ok(Frame::Msg(Msg {
                topic: "t".to_owned(),
                seq: 5,
                body: Body::Data(br#"{"a": [1, 2]}"#.to_vec()),
            }))
        );
        let full = decode_json(br#"{"op":"msg","topic":"t","seq":5,"full":"{\"a\":\"\u00e9\"}"}"#);
        let Ok(Frame::Msg(Msg {
            body: Body::Full(full),
            ..
        })) = full
        else {
            panic!("a full msg: {full:?}");
        };
        assert_eq!(full, "{\"a\":\"é\"}".as_bytes());
        // Bytes 0x80 and over are chars U+0080 and over.
        let delta = decode_json(
            "{\"op\":\"msg\",\"topic\":\"t\",\"seq\":6,\"delta\":\"9\\n\u{e9}\u{ff}\"}".as_bytes(),
        );
        let Ok(Frame::Msg(Msg {
            body: Body::Delta(delta),
            ..
        })) = delta
        else {
            panic!("a delta msg: {delta:?}");
        };
        assert_eq!(delta, [b'9', b'\n', 0xe9, 0xff]);
        assert!(
            decode_json(
                "{\"op\":\"msg\",\"topic\":\"t\",\"seq\":6,\"delta\":\"\u{100}\"}".as_bytes()
            )
            .is_err()
        );
        assert!(decode_json(br#"{"op":"msg","topic":"t","seq":6}"#).is_err());
    }

    #[test]
    fn json_ok_says_whether_deltas_were_granted() {
        let ok = |text: &[u8]| decode_json(text).expect("an ok");
        assert_eq!(
            ok(br#"{"op":"ok","id":1,"topic":"t","seq":4,"delta":true}"#),
            Frame::Ok {
                id: 1,
                seq: 4,
                delta: true
            }
        );
        assert_eq!(
            ok(br#"{"op":"ok","id":1,"topic":"t","seq":4}"#),
            Frame::Ok {
                id: 1,
                seq: 4,
                delta: false
            }
        );
        assert_eq!(ok(br#"{"op":"welcome","session":"s"}"#), Frame::Welcome);
        assert!(matches!(
            ok(br#"{"op":"err","code":"forbidden"}"#),
            Frame::Other(_)
        ));
    }

    #[test]
    fn protobuf_frames_decode_from_the_proto_crates_types() {
        use v1::server_message::Op;
        let frame = |op| v1::ServerMessage { op: Some(op) }.encode_to_vec();
        let msg = |data: &[u8], delta| {
            frame(Op::Msg(v1::Msg {
                topic: "t".to_owned(),
                seq: 9,
                data: data.to_vec(),
                delta,
                binary: false,
            }))
        };
        let decoded = decode(Protocol::Protobuf, raw::OP_BINARY, &msg(b"{}", true));
        assert_eq!(
            decoded,
            Ok(Frame::Msg(Msg {
                topic: "t".to_owned(),
                seq: 9,
                body: Body::Delta(b"{}".to_vec()),
            }))
        );
        let full = decode(Protocol::Protobuf, raw::OP_BINARY, &msg(b"{}", false));
        assert!(matches!(
            full,
            Ok(Frame::Msg(Msg {
                body: Body::Full(_),
                ..
            }))
        ));
        let ok = frame(Op::Ok(v1::Ok {
            id: 2,
            seq: Some(7),
            delta: Some(true),
            ..Default::default()
        }));
        assert_eq!(
            decode(Protocol::Protobuf, raw::OP_BINARY, &ok),
            Ok(Frame::Ok {
                id: 2,
                seq: 7,
                delta: true
            })
        );
        assert!(
            decode(Protocol::Protobuf, raw::OP_TEXT, b"{}").is_err(),
            "text on protobuf"
        );
        assert!(
            decode(Protocol::Json, raw::OP_BINARY, &ok).is_err(),
            "binary on JSON"
        );
        assert!(decode(Protocol::Protobuf, raw::OP_BINARY, &[0xff, 0xff]).is_err());
        let (op, sub) = sub(Protocol::Protobuf, 4, "t", true);
        assert_eq!(op, raw::OP_BINARY);
        let command = v1::ClientCommand::decode(sub.as_slice()).expect("a command");
        let Some(v1::client_command::Op::Sub(sub)) = command.op else {
            panic!("a sub: {command:?}");
        };
        assert_eq!(
            (sub.id, sub.topic.as_str(), sub.delta),
            (4, "t", Some(true))
        );
    }

    #[test]
    fn deltas_apply_in_order_and_a_wrong_one_fails() {
        let (a, b, c) = (
            br#"{"score":[1,0],"clock":"12:00","players":["ann","bob","cy"]}"#.to_vec(),
            br#"{"score":[1,1],"clock":"12:31","players":["ann","bob","cy"]}"#.to_vec(),
            br#"{"score":[2,1],"clock":"13:02","players":["ann","bob","cy"]}"#.to_vec(),
        );
        let mut r = Reassembler::default();
        assert_eq!(r.payload(1, Body::Full(a.clone())), Ok(a.clone()));
        // The crate's `delta(target, source)`: from `a` to `b` is `delta(b, a)`.
        let ab = fossil_delta::delta(&b, &a);
        assert!(ab.len() < b.len());
        assert_eq!(r.payload(2, Body::Delta(ab.clone())), Ok(b.clone()));
        let bc = fossil_delta::delta(&c, &b);
        assert_eq!(r.payload(3, Body::Delta(bc.clone())), Ok(c.clone()));

        // Out of order: the base is seq 3, not 1.
        let e = r.payload(5, Body::Delta(ab.clone())).expect_err("no base");
        assert!(e.contains("base of seq 3"), "{e}");
        // A delta made against another base fails Fossil's checksum (or
        // applies to the wrong bytes, which the scenario's check catches).
        let mut r = Reassembler::default();
        r.payload(1, Body::Full(b"[\"another\",\"base\"]".to_vec()))
            .expect("full");
        assert_ne!(r.payload(2, Body::Delta(ab.clone())), Ok(b.clone()));
        // Garbage does not panic.
        let mut r = Reassembler::default();
        r.payload(1, Body::Full(a.clone())).expect("full");
        assert!(r.payload(2, Body::Delta(b"zz@".to_vec())).is_err());
        assert!(r.payload(2, Body::Delta(Vec::new())).is_err());
        // A plain `data` drops the base.
        let mut r = Reassembler::default();
        r.payload(1, Body::Full(a.clone())).expect("full");
        r.payload(2, Body::Data(b.clone())).expect("data");
        assert!(r.payload(3, Body::Delta(bc)).is_err());
    }
}
