//! Server frames, encoded once.
//!
//! A server frame is never masked and never fragmented, so its header is a
//! pure function of opcode and length. Encoding header and payload into one
//! [`Bytes`] lets a publication be written to every subscriber without a copy:
//! the fan-out clones a reference, the writer hands it to `writev`.
//!
//! A connection says once, when it opens, how its frames are written: its
//! [`Format`]. The fan-out encodes a publication once per format among its
//! subscribers ([`Frames`]), never once per subscriber. A connection that
//! negotiated permessage-deflate has a format of its own per set of
//! parameters ([`Format::WebSocketDeflate`]): a publication is compressed
//! once for all the subscribers that share it. The `msg` of a publication
//! has encoders of its own, for every format and every form a subscription
//! takes ([`msg`]).

use bytes::Bytes;
use prost::Message;
use proto::ServerMessage;

use crate::deflate::{Deflate, RSV1};

mod msg;

pub use msg::{Body, Variant, publication};

const FIN: u8 = 0x80;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Longest header of an unmasked frame.
const MAX_HEADER: usize = 10;

/// The header of a final frame whose first byte is `first` (FIN, RSV and
/// opcode), and its length.
fn header(first: u8, len: usize) -> ([u8; MAX_HEADER], usize) {
    let mut head = [0; MAX_HEADER];
    head[0] = first;
    if len < 126 {
        head[1] = len as u8;
        (head, 2)
    } else if let Ok(len) = u16::try_from(len) {
        head[1] = 126;
        head[2..4].copy_from_slice(&len.to_be_bytes());
        (head, 4)
    } else {
        head[1] = 127;
        head[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        (head, 10)
    }
}

/// One frame of `opcode` carrying the concatenation of `parts`.
pub fn encode(opcode: u8, parts: &[&[u8]]) -> Bytes {
    let len = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(MAX_HEADER + len);
    let (head, head_len) = header(FIN | opcode, len);
    out.extend_from_slice(&head[..head_len]);
    for part in parts {
        out.extend_from_slice(part);
    }
    Bytes::from(out)
}

/// One data frame of `opcode` carrying the concatenation of `parts`, as
/// `format` writes it: compressed, with RSV1, where the format deflates and
/// the message is worth it; as [`encode`] makes it otherwise.
pub fn encode_as(format: Format, opcode: u8, parts: &[&[u8]]) -> Bytes {
    let Some(deflate) = format.deflate() else {
        return encode(opcode, parts);
    };
    // Compressed after room for the longest header, which goes in front of
    // it: one buffer, no copy.
    let Some((mut out, len)) = deflate.compress(parts, MAX_HEADER) else {
        return encode(opcode, parts);
    };
    let (head, head_len) = header(FIN | RSV1 | opcode, len);
    let start = MAX_HEADER - head_len;
    out[start..MAX_HEADER].copy_from_slice(&head[..head_len]);
    // A publication's frame may sit in many queues: no spare room with it.
    if out.capacity() - out.len() > 64 {
        out.shrink_to_fit();
    }
    Bytes::from(out).slice(start..)
}

/// How a connection's server frames are written: fixed when it opens, read
/// by everything that encodes for it (its session's replies and replays, the
/// fan-out, the drain's advice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// RFC 6455 text frames holding the JSON protocol.
    #[default]
    WebSocket,
    /// The same, with permessage-deflate (RFC 7692) as negotiated on the
    /// upgrade: one variant per set of parameters that changes the bytes.
    WebSocketDeflate(Deflate),
    /// A WebSocket that negotiated the `herald.v1.protobuf` subprotocol:
    /// binary frames, each one `ServerMessage`, compressed as a deflate
    /// format's are where permessage-deflate was negotiated too.
    Protobuf(Option<Deflate>),
    /// Server-Sent Events (`GET /sse`): `data: <the JSON frame>` and a blank
    /// line. The `id:` line before it is the connection's own (its place
    /// in each topic), written beside the shared part by its queue.
    Sse,
    /// HTTP-streaming (`POST /stream`): one JSON frame per line.
    Ndjson,
}

impl Format {
    /// A stream over plain HTTP: no WebSocket frames, no close handshake;
    /// the connection ends the response.
    pub fn is_stream(self) -> bool {
        matches!(self, Format::Sse | Format::Ndjson)
    }

    /// The permessage-deflate parameters it writes with, where negotiated.
    pub fn deflate(self) -> Option<Deflate> {
        match self {
            Format::WebSocketDeflate(deflate) | Format::Protobuf(Some(deflate)) => Some(deflate),
            _ => None,
        }
    }

    /// Whether it speaks the protocol's protobuf form rather than JSON.
    pub fn is_protobuf(self) -> bool {
        matches!(self, Format::Protobuf(_))
    }

    /// What keeps an idle connection's path open: a WebSocket ping is built
    /// by the session (it is stamped); a stream's is a comment line (SSE)
    /// or an empty line (NDJSON). A whole line either way, harmless
    /// wherever it lands between two of an event's lines.
    pub fn heartbeat(self) -> Option<Bytes> {
        match self {
            Format::WebSocket | Format::WebSocketDeflate(_) | Format::Protobuf(_) => None,
            Format::Sse => Some(Bytes::from_static(b":\n")),
            Format::Ndjson => Some(Bytes::from_static(b"\n")),
        }
    }
}

/// A message of the protocol, as `format` writes it.
pub fn message(format: Format, message: &ServerMessage<'_>) -> Bytes {
    match format {
        Format::WebSocket | Format::WebSocketDeflate(_) => {
            encode_as(format, OP_TEXT, &[&message.to_json()])
        }
        Format::Protobuf(_) => encode_as(format, OP_BINARY, &[&message.to_proto().encode_to_vec()]),
        Format::Sse => {
            // The drain's advice tells an `EventSource` when to come back.
            let retry = match message {
                ServerMessage::Reconnect { after_ms, .. } => format!("retry: {after_ms}\n"),
                _ => String::new(),
            };
            line(
                &[retry.as_bytes(), b"data: "],
                &[&message.to_json()],
                b"\n\n",
            )
        }
        Format::Ndjson => line(&[], &[&message.to_json()], b"\n"),
    }
}

/// `head`, then `json` on one line (a raw newline in it, whitespace that
/// a publisher's or a backend's JSON may hold between tokens, made a
/// space: inside a JSON string it would be escaped), then `tail`.
pub(crate) fn line(head: &[&[u8]], json: &[&[u8]], tail: &[u8]) -> Bytes {
    let len = head.iter().chain(json).map(|p| p.len()).sum::<usize>() + tail.len();
    let mut out = Vec::with_capacity(len);
    for part in head {
        out.extend_from_slice(part);
    }
    for part in json {
        let start = out.len();
        out.extend_from_slice(part);
        if part.iter().any(|&b| b == b'\n' || b == b'\r') {
            for b in &mut out[start..] {
                if *b == b'\n' || *b == b'\r' {
                    *b = b' ';
                }
            }
        }
    }
    out.extend_from_slice(tail);
    Bytes::from(out)
}

/// One server message in each form its receivers use (a [`Format`], or a
/// format and a [`Variant`]), each encoded at most once, on first use. A
/// fan-out usually meets one form, two at most: the first is kept inline,
/// without an allocation.
pub struct Frames<F, K = Format> {
    encode: F,
    first: Option<(K, Bytes)>,
    rest: Vec<(K, Bytes)>,
}

impl<K: Copy + PartialEq, F: Fn(K) -> Bytes> Frames<F, K> {
    /// Encodes with `encode`, once per form asked for.
    pub fn new(encode: F) -> Self {
        Self {
            encode,
            first: None,
            rest: Vec::new(),
        }
    }

    /// The message in `format` (a reference-counted clone).
    pub fn get(&mut self, format: K) -> Bytes {
        match &self.first {
            None => {
                let frame = (self.encode)(format);
                self.first = Some((format, frame.clone()));
                frame
            }
            Some((made, frame)) if *made == format => frame.clone(),
            Some(_) => {
                if let Some((_, frame)) = self.rest.iter().find(|(made, _)| *made == format) {
                    return frame.clone();
                }
                let frame = (self.encode)(format);
                self.rest.push((format, frame.clone()));
                frame
            }
        }
    }
}

/// A close frame with `code` and `reason`.
pub fn close(code: u16, reason: &str) -> Bytes {
    encode(OP_CLOSE, &[&code.to_be_bytes(), reason.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use router::Publication;

    #[test]
    fn frames_encode_each_format_once() {
        let calls = std::cell::Cell::new(0);
        let mut frames = Frames::new(|format| {
            calls.set(calls.get() + 1);
            message(
                format,
                &ServerMessage::Reconnect {
                    after_ms: 1,
                    reason: "test",
                },
            )
        });
        let one = frames.get(Format::WebSocket);
        let two = frames.get(Format::WebSocket);
        assert_eq!(one, two);
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn stream_formats_keep_one_frame_on_one_line() {
        let p = Publication {
            topic: router::Topic::parse("chat:a").unwrap(),
            seq: 7,
            epoch: std::sync::Arc::from("e1"),
            data: Bytes::from_static(b"{\"a\":\n1}"),
        };
        let sse = publication(Format::Sse, &p, Body::Data);
        assert!(sse.starts_with(b"data: {"), "{sse:?}");
        assert!(sse.ends_with(b"}\n\n"));
        assert_eq!(sse.iter().filter(|&&b| b == b'\n').count(), 2);
        let nd = publication(Format::Ndjson, &p, Body::Data);
        assert_eq!(nd.iter().filter(|&&b| b == b'\n').count(), 1);
        let advice = message(
            Format::Sse,
            &ServerMessage::Reconnect {
                after_ms: 250,
                reason: "shutdown",
            },
        );
        assert!(advice.starts_with(b"retry: 250\ndata: {"), "{advice:?}");
    }

    #[test]
    fn headers_use_the_shortest_length_form() {
        for (len, head) in [
            (0usize, vec![0x81, 0]),
            (125, vec![0x81, 125]),
            (126, vec![0x81, 126, 0, 126]),
            (65535, vec![0x81, 126, 0xff, 0xff]),
            (65536, vec![0x81, 127, 0, 0, 0, 0, 0, 1, 0, 0]),
        ] {
            let frame = encode(OP_TEXT, &[&vec![b'x'; len]]);
            assert_eq!(&frame[..head.len()], &head[..], "len {len}");
            assert_eq!(frame.len(), head.len() + len);
        }
    }

    fn deflate() -> Format {
        Format::WebSocketDeflate(Deflate {
            window_bits: 15,
            level: 1,
            min_bytes: 256,
        })
    }

    #[test]
    fn a_deflate_format_compresses_data_frames_over_its_threshold() {
        let data = br#"{"score":[1,2,3],"team":"blue"}"#.repeat(40);
        let plain = encode(OP_TEXT, &[&data]);
        let frame = encode_as(deflate(), OP_TEXT, &[&data[..100], &data[100..]]);
        // FIN, RSV1, text; a shorter payload that inflates back.
        assert_eq!(frame[0], FIN | RSV1 | OP_TEXT);
        assert!(
            frame.len() < plain.len() / 4,
            "{} of {}",
            frame.len(),
            plain.len()
        );
        let (len, head) = match frame[1] {
            126 => (usize::from(u16::from_be_bytes([frame[2], frame[3]])), 4),
            n => (usize::from(n), 2),
        };
        assert_eq!(frame.len(), head + len);
        let inflated = crate::deflate::inflate::inflate(&frame[head..], 1 << 20);
        assert_eq!(inflated.as_deref(), Ok(&data[..]));
        // Binary keeps its opcode.
        assert_eq!(
            encode_as(deflate(), OP_BINARY, &[&data])[0],
            FIN | RSV1 | OP_BINARY
        );
        // Under the threshold: exactly the plain frame, RSV1 clear.
        assert_eq!(
            encode_as(deflate(), OP_TEXT, &[&data[..255]]),
            encode(OP_TEXT, &[&data[..255]])
        );
        // The plain format never compresses.
        assert_eq!(encode_as(Format::WebSocket, OP_TEXT, &[&data]), plain);
    }

    #[test]
    fn control_frames_are_never_compressed() {
        // Pings, pongs and closes are built with `encode` whatever the
        // connection's format: only data frames go through `encode_as`.
        for frame in [
            close(1000, &"x".repeat(120)),
            encode(OP_PING, &[&[b'p'; 125]]),
            encode(OP_PONG, &[&[b'p'; 125]]),
        ] {
            assert_eq!(frame[0] & RSV1, 0);
        }
    }

    #[test]
    fn frames_compress_once_per_deflate_format() {
        let calls = std::cell::Cell::new(0);
        let data = "x".repeat(1000);
        let message = ServerMessage::Reconnect {
            after_ms: 1,
            reason: &data,
        };
        let mut frames = Frames::new(|format| {
            calls.set(calls.get() + 1);
            super::message(format, &message)
        });
        let small_window = Format::WebSocketDeflate(Deflate {
            window_bits: 10,
            level: 1,
            min_bytes: 256,
        });
        let a = frames.get(deflate());
        let plain = frames.get(Format::WebSocket);
        let b = frames.get(deflate());
        let c = frames.get(small_window);
        let d = frames.get(small_window);
        assert_eq!((a == b, c == d, calls.get()), (true, true, 3));
        assert!(a.len() < plain.len() && a[0] & RSV1 != 0 && plain[0] & RSV1 == 0);
    }
}
