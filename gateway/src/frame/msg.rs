//! A publication's `msg`, in every format and every form.
//!
//! This is the fan-out's hot path: each encoder writes the frame in one
//! buffer, without a serializer, and is called once per format and form
//! among a publication's subscribers ([`Frames`](super::Frames)).
//!
//! The forms ([`Body`]): the plain `msg`, whose `data` is the publisher's
//! JSON text (or, for binary data, base64 with `"binary":true`); and, in a
//! delta subscription, the full data as a string (`full`) or a Fossil delta
//! (`delta`), so that a JSON client holds the exact bytes a delta applies to
//! (docs/protocol.md). The protobuf form is one `ServerMessage` whose `msg`
//! carries the bytes as they are, with its `delta` and `binary` flags.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use router::Publication;

use super::{Format, OP_BINARY, OP_TEXT, encode_as, line};
use crate::payload::Payload;

/// What a subscriber's `msg` of a publication carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    /// The plain `msg`: what every subscription without deltas gets.
    Data,
    /// The full data, in a delta subscription: the base of the next delta.
    Full,
    /// A Fossil delta from the previous publication's data to this one's.
    Delta(&'a [u8]),
}

/// A [`Body`] without its bytes: with a [`Format`], the key of a frame in
/// a fan-out's [`Frames`](super::Frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    Data,
    Full,
    Delta,
}

impl Body<'_> {
    pub fn variant(self) -> Variant {
        match self {
            Body::Data => Variant::Data,
            Body::Full => Variant::Full,
            Body::Delta(_) => Variant::Delta,
        }
    }
}

impl Variant {
    /// The variant whose frame `format` writes for this one: in protobuf
    /// the full data is the plain `msg`, so the two share a frame.
    pub fn in_format(self, format: Format) -> Self {
        match (self, format) {
            (Variant::Full, Format::Protobuf(_)) => Variant::Data,
            (variant, _) => variant,
        }
    }
}

/// The `msg` of `p` carrying `body`, as `format` writes it. A delta of
/// binary data is sent to protobuf clients only: a JSON client is given the
/// plain `msg` (and drops its base).
pub fn publication(format: Format, p: &Publication, body: Body<'_>) -> Bytes {
    let payload = Payload::of(&p.data);
    let topic = p.topic.as_str();
    if let Format::Protobuf(_) = format {
        return protobuf(format, topic, p.seq, payload, body);
    }
    let body = match (body, payload) {
        (Body::Full | Body::Delta(_), Payload::Binary(_)) => Body::Data,
        (body, _) => body,
    };
    let mut head = Vec::with_capacity(48 + topic.len());
    let mut value = Vec::new();
    let data: &[u8] = match (body, payload) {
        (Body::Data, Payload::Json(text)) => {
            proto::json::encode_msg_prefix(&mut head, topic, p.seq);
            text
        }
        (_, Payload::Binary(bytes)) => {
            proto::json::encode_msg_prefix(&mut head, topic, p.seq);
            value.reserve(bytes.len().div_ceil(3) * 4 + 16);
            value.push(b'"');
            let start = value.len();
            value.resize(start + bytes.len().div_ceil(3) * 4, 0);
            let written = STANDARD
                .encode_slice(bytes, &mut value[start..])
                .unwrap_or_default();
            value.truncate(start + written);
            value.extend_from_slice(br#"","binary":true"#);
            &value
        }
        (Body::Full, Payload::Json(text)) => {
            proto::json::encode_msg_head(&mut head, topic, p.seq, "full");
            // Validated JSON is UTF-8; the lossy form is never taken.
            let _ = serde_json::to_writer(&mut value, &String::from_utf8_lossy(text));
            &value
        }
        (Body::Delta(delta), Payload::Json(_)) => {
            proto::json::encode_msg_head(&mut head, topic, p.seq, "delta");
            // One char per byte (U+0000 to U+00FF): any delta is a string,
            // and an ASCII one is written as it is.
            let chars: String = delta.iter().map(|&b| char::from(b)).collect();
            let _ = serde_json::to_writer(&mut value, &chars);
            &value
        }
    };
    match format {
        Format::Sse => line(&[b"data: "], &[&head, data, b"}"], b"\n\n"),
        Format::Ndjson => line(&[], &[&head, data, b"}"], b"\n"),
        _ => encode_as(format, OP_TEXT, &[&head, data, b"}"]),
    }
}

/// `ServerMessage { msg: Msg { topic, seq, data, delta, binary } }`, written
/// by hand: the envelope is 12 bytes and the topic for a seq below 2^21 and
/// data below 16 KiB, and the data is copied once, into the frame.
fn protobuf(format: Format, topic: &str, seq: u64, payload: Payload<'_>, body: Body<'_>) -> Bytes {
    let (data, delta) = match body {
        Body::Delta(delta) => (delta, true),
        Body::Data | Body::Full => (payload.bytes(), false),
    };
    let field = |tag: u32, len: usize| key_len(tag) + len;
    let mut inner = field(1, encoded_len_varint(topic.len() as u64) + topic.len());
    if seq != 0 {
        inner += field(2, encoded_len_varint(seq));
    }
    if !data.is_empty() {
        inner += field(3, encoded_len_varint(data.len() as u64) + data.len());
    }
    inner += 2 * usize::from(delta) + 2 * usize::from(payload.is_binary());
    let mut head = Vec::with_capacity(16 + topic.len());
    encode_key(3, WireType::LengthDelimited, &mut head);
    encode_varint(inner as u64, &mut head);
    encode_key(1, WireType::LengthDelimited, &mut head);
    encode_varint(topic.len() as u64, &mut head);
    head.extend_from_slice(topic.as_bytes());
    if seq != 0 {
        encode_key(2, WireType::Varint, &mut head);
        encode_varint(seq, &mut head);
    }
    if !data.is_empty() {
        encode_key(3, WireType::LengthDelimited, &mut head);
        encode_varint(data.len() as u64, &mut head);
    }
    let mut tail = Vec::with_capacity(4);
    for (tag, set) in [(4, delta), (5, payload.is_binary())] {
        if set {
            encode_key(tag, WireType::Varint, &mut tail);
            encode_varint(1, &mut tail);
        }
    }
    encode_as(format, OP_BINARY, &[&head, data, &tail])
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use proto::v1;

    fn publication_of(data: Bytes, seq: u64) -> Publication {
        Publication {
            topic: router::Topic::parse("game:42").unwrap(),
            seq,
            epoch: std::sync::Arc::from("e1"),
            data,
        }
    }

    /// The payload of an unmasked, uncompressed frame.
    fn payload(frame: &[u8]) -> &[u8] {
        match frame[1] {
            126 => &frame[4..],
            127 => &frame[10..],
            _ => &frame[2..],
        }
    }

    fn decode(frame: &[u8]) -> v1::Msg {
        match v1::ServerMessage::decode(payload(frame)).unwrap().op {
            Some(v1::server_message::Op::Msg(msg)) => msg,
            other => panic!("not a msg: {other:?}"),
        }
    }

    #[test]
    fn the_protobuf_msg_is_what_prost_reads_and_its_envelope_is_twelve_bytes_and_the_topic() {
        let text = Bytes::from(format!("{{\"s\":\"{}\"}}", "x".repeat(1000)));
        let p = publication_of(Payload::json(text.clone()), (1 << 21) - 1);
        let frame = publication(Format::Protobuf(None), &p, Body::Data);
        assert_eq!(frame[0] & 0x0f, OP_BINARY);
        let msg = decode(&frame);
        assert_eq!((msg.topic.as_str(), msg.seq), ("game:42", (1 << 21) - 1));
        assert_eq!(
            (msg.data, msg.delta, msg.binary),
            (text.to_vec(), false, false)
        );
        let envelope = payload(&frame).len() - text.len() - "game:42".len();
        assert!(envelope <= 12, "{envelope} bytes");
        // The full form is the plain one in protobuf; a delta is flagged.
        assert_eq!(publication(Format::Protobuf(None), &p, Body::Full), frame);
        let msg = decode(&publication(
            Format::Protobuf(None),
            &p,
            Body::Delta(b"3\n1:x0;"),
        ));
        assert_eq!((msg.data.as_slice(), msg.delta), (&b"3\n1:x0;"[..], true));
        // Binary data keeps every byte; seq 0 and empty data are left out,
        // as prost leaves them.
        let bytes = [0u8, 0xff, 0xfe, b'{'];
        let p = publication_of(Payload::binary(&bytes), 0);
        let frame = publication(Format::Protobuf(None), &p, Body::Data);
        let msg = decode(&frame);
        assert_eq!(
            (msg.data.as_slice(), msg.binary, msg.seq),
            (&bytes[..], true, 0)
        );
        let expected = v1::ServerMessage {
            op: Some(v1::server_message::Op::Msg(msg)),
        };
        assert_eq!(payload(&frame), expected.encode_to_vec());
    }

    fn json(frame: &[u8]) -> serde_json::Value {
        serde_json::from_slice(payload(frame)).unwrap()
    }

    #[test]
    fn json_clients_get_binary_data_in_base64_and_deltas_as_strings() {
        let bytes = [0u8, 0xff, 0x80, b'"'];
        let p = publication_of(Payload::binary(&bytes), 3);
        let msg = json(&publication(Format::WebSocket, &p, Body::Data));
        assert_eq!(msg["data"], STANDARD.encode(bytes));
        assert_eq!(msg["binary"], true);
        // No delta of binary data for JSON: the plain form.
        let delta = publication(Format::WebSocket, &p, Body::Delta(b"x"));
        assert_eq!(delta, publication(Format::WebSocket, &p, Body::Data));

        let text = "{\"score\":\"é\\\"\\n\"}";
        let p = publication_of(Payload::json(Bytes::from(text)), 4);
        let full = json(&publication(Format::WebSocket, &p, Body::Full));
        assert_eq!(
            (full["full"].as_str(), full.get("data")),
            (Some(text), None)
        );
        let delta_bytes = [b'1', b'0', b'\n', 0x00, 0x1f, 0x80, 0xff, b'"', b'\\'];
        let delta = json(&publication(
            Format::WebSocket,
            &p,
            Body::Delta(&delta_bytes),
        ));
        let chars = delta["delta"].as_str().unwrap();
        let back: Vec<u8> = chars.chars().map(|c| u8::try_from(c).unwrap()).collect();
        assert_eq!(back, delta_bytes);
        assert_eq!(delta["seq"], 4);
        // The same forms on a stream, on one line.
        let sse = publication(Format::Sse, &p, Body::Delta(&delta_bytes));
        assert_eq!(sse.iter().filter(|&&b| b == b'\n').count(), 2);
    }
}
