//! Server frames, encoded once.
//!
//! A server frame is never masked and never fragmented, so its header is a
//! pure function of opcode and length. Encoding header and payload into one
//! [`Bytes`] lets a publication be written to every subscriber without a copy:
//! the fan-out clones a reference, the writer hands it to `writev`.
//!
//! A connection says once, when it opens, how its frames are written: its
//! [`Format`]. The fan-out encodes a publication once per format among its
//! subscribers ([`Frames`]), never once per subscriber.

use bytes::Bytes;
use proto::ServerMessage;
use router::Publication;

const FIN: u8 = 0x80;
pub const OP_TEXT: u8 = 0x1;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Longest header of an unmasked frame.
const MAX_HEADER: usize = 10;

fn header(out: &mut Vec<u8>, opcode: u8, len: usize) {
    out.push(FIN | opcode);
    if len < 126 {
        out.push(len as u8);
    } else if let Ok(len) = u16::try_from(len) {
        out.push(126);
        out.extend_from_slice(&len.to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// One frame of `opcode` carrying the concatenation of `parts`.
pub fn encode(opcode: u8, parts: &[&[u8]]) -> Bytes {
    let len = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(MAX_HEADER + len);
    header(&mut out, opcode, len);
    for part in parts {
        out.extend_from_slice(part);
    }
    Bytes::from(out)
}

/// How a connection's server frames are written: fixed when it opens, read
/// by everything that encodes for it (its session's replies and replays, the
/// fan-out, the drain's advice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// RFC 6455 text frames holding the JSON protocol.
    #[default]
    WebSocket,
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

    /// What keeps an idle connection's path open: a WebSocket ping is built
    /// by the session (it is stamped); a stream's is a comment line (SSE)
    /// or an empty line (NDJSON). A whole line either way, harmless
    /// wherever it lands between two of an event's lines.
    pub fn heartbeat(self) -> Option<Bytes> {
        match self {
            Format::WebSocket => None,
            Format::Sse => Some(Bytes::from_static(b":\n")),
            Format::Ndjson => Some(Bytes::from_static(b"\n")),
        }
    }
}

/// A message of the protocol, as `format` writes it.
pub fn message(format: Format, message: &ServerMessage<'_>) -> Bytes {
    match format {
        Format::WebSocket => encode(OP_TEXT, &[&message.to_json()]),
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
fn line(head: &[&[u8]], json: &[&[u8]], tail: &[u8]) -> Bytes {
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

/// The `msg` of a publication, as `format` writes it: what every subscriber
/// in that format receives.
pub fn publication(format: Format, p: &Publication) -> Bytes {
    let mut prefix = Vec::with_capacity(48 + p.topic.as_str().len());
    proto::json::encode_msg_prefix(&mut prefix, p.topic.as_str(), p.seq);
    match format {
        Format::WebSocket => encode(OP_TEXT, &[&prefix, &p.data, b"}"]),
        Format::Sse => line(&[b"data: "], &[&prefix, &p.data, b"}"], b"\n\n"),
        Format::Ndjson => line(&[], &[&prefix, &p.data, b"}"], b"\n"),
    }
}

/// One server message in each format its receivers use, each encoded at
/// most once, on first use. A fan-out usually meets one format, two at
/// most: the first is kept inline, without an allocation.
pub struct Frames<F> {
    encode: F,
    first: Option<(Format, Bytes)>,
    rest: Vec<(Format, Bytes)>,
}

impl<F: Fn(Format) -> Bytes> Frames<F> {
    /// Encodes with `encode`, once per format asked for.
    pub fn new(encode: F) -> Self {
        Self {
            encode,
            first: None,
            rest: Vec::new(),
        }
    }

    /// The message in `format` (a reference-counted clone).
    pub fn get(&mut self, format: Format) -> Bytes {
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
        let sse = publication(Format::Sse, &p);
        assert!(sse.starts_with(b"data: {"), "{sse:?}");
        assert!(sse.ends_with(b"}\n\n"));
        assert_eq!(sse.iter().filter(|&&b| b == b'\n').count(), 2);
        let nd = publication(Format::Ndjson, &p);
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
}
