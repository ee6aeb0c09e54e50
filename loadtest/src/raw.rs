//! A raw WebSocket client over TCP (RFC 6455, client side), for jobs a
//! general library does not do: counting the exact bytes of each server frame
//! (`wire`); holding tens of thousands of connections cheaply, each a socket,
//! a small buffer and a task, answering every ping as it comes (`idle`); and
//! counting a stream of `msg` frames from their fixed prefix without parsing
//! their JSON, so that the clients cost little CPU next to the gateway
//! (`throughput`); and thousands of short handshakes a second, each with the
//! headers it is told (`hooks`), costing the load tool little.
//!
//! With `compression` it offers permessage-deflate (RFC 7692) as a browser
//! does, and inflates the compressed server frames it gets (`Frame::payload`
//! is then the inflated message; `wire_bytes` stays what came on the wire),
//! with one inflater per thread, reset per message, as the server asks
//! (`client_no_context_takeover` both ways): 10,000 clients keep no inflater
//! each. Its own frames go uncompressed (RFC 7692 allows it).
//!
//! Client frames are masked, as the protocol requires; server frames are
//! never masked nor fragmented in Herald, and are refused if they are. The
//! handshake checks for `101` and does not verify `Sec-WebSocket-Accept`
//! (the peer is a gateway on this machine).

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::handshake::client::generate_key;

use crate::Target;

pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;
const RSV1: u8 = 0x40;
/// Longest HTTP answer head to the upgrade.
const MAX_HANDSHAKE_BYTES: usize = 8 * 1024;
/// Largest server frame accepted (the `wire` scenario's 1 MiB and more).
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// The prefix of every `msg` frame (`proto::json::encode_msg_prefix`).
const MSG_PREFIX: &[u8] = br#"{"op":"msg","topic":""#;

/// One server frame, borrowed from the client's buffer.
#[derive(Debug)]
pub struct Frame<'a> {
    pub opcode: u8,
    pub payload: &'a [u8],
    /// Bytes the frame took on the wire: header and payload.
    pub wire_bytes: usize,
}

/// The offer a browser makes (Chromium's), for `compression`.
pub const DEFLATE_OFFER: &str = "permessage-deflate; client_max_window_bits";

thread_local! {
    /// The thread's inflater, for every compressed frame of its clients.
    static INFLATER: std::cell::RefCell<flate2::Decompress> =
        std::cell::RefCell::new(flate2::Decompress::new(false));
}

/// A connected WebSocket client.
pub struct Client {
    stream: TcpStream,
    /// permessage-deflate was negotiated.
    deflate: bool,
    /// The subprotocol the server selected (`Sec-WebSocket-Protocol`).
    protocol: Option<String>,
    /// The last compressed frame's message, inflated (empty otherwise).
    inflated: Vec<u8>,
    /// Bytes read and not yet handed out are `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// xorshift state for the masking keys.
    mask: u32,
}

impl Client {
    /// Connects to `target` (from `source`, when given) and upgrades; the
    /// buffer starts at `buffer_bytes` and grows only for a larger frame.
    pub async fn connect(
        source: Option<SocketAddr>,
        target: &Target,
        buffer_bytes: usize,
        seed: u64,
    ) -> io::Result<Self> {
        Self::connect_with_headers(source, target, buffer_bytes, seed, &[]).await
    }

    /// As [`Self::connect`], with more request headers on the upgrade
    /// (`hooks`: the `Cookie` a connect proxy authenticates by).
    pub async fn connect_with_headers(
        source: Option<SocketAddr>,
        target: &Target,
        buffer_bytes: usize,
        seed: u64,
        headers: &[(&str, &str)],
    ) -> io::Result<Self> {
        let socket = if target.addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if let Some(source) = source {
            socket.bind(source)?;
        }
        let stream = socket.connect(target.addr).await?;
        stream.set_nodelay(true)?;
        let mut client = Self {
            stream,
            deflate: false,
            protocol: None,
            inflated: Vec::new(),
            buf: vec![0; buffer_bytes.max(256)],
            start: 0,
            end: 0,
            mask: (seed as u32 ^ (seed >> 32) as u32) | 1,
        };
        client.handshake(target, headers).await?;
        Ok(client)
    }

    async fn handshake(&mut self, target: &Target, headers: &[(&str, &str)]) -> io::Result<()> {
        let mut request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {}\r\nSec-WebSocket-Version: 13\r\n",
            target.ws_path,
            target.addr,
            generate_key()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        self.stream.write_all(request.as_bytes()).await?;
        loop {
            if let Some(at) = find(&self.buf[..self.end], b"\r\n\r\n") {
                let head = &self.buf[..at];
                if !head.starts_with(b"HTTP/1.1 101") {
                    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
                    return Err(io::Error::other(format!(
                        "upgrade refused: {}",
                        String::from_utf8_lossy(line)
                    )));
                }
                let head = String::from_utf8_lossy(head);
                let headers = || head.lines().filter_map(|l| l.split_once(':'));
                self.deflate = headers().any(|(name, value)| {
                    name.eq_ignore_ascii_case("sec-websocket-extensions")
                        && value.trim().starts_with("permessage-deflate")
                });
                self.protocol = headers()
                    .find(|(name, _)| name.eq_ignore_ascii_case("sec-websocket-protocol"))
                    .map(|(_, value)| value.trim().to_owned());
                self.start = at + 4;
                return Ok(());
            }
            if self.end >= MAX_HANDSHAKE_BYTES.min(self.buf.len()) {
                self.grow(MAX_HANDSHAKE_BYTES + 1)?;
            }
            let n = self.stream.read(&mut self.buf[self.end..]).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.end += n;
        }
    }

    /// Whether permessage-deflate was negotiated.
    pub fn compressed(&self) -> bool {
        self.deflate
    }

    /// The subprotocol the server selected, if any.
    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    /// Sends one masked frame.
    pub async fn send(&mut self, opcode: u8, payload: &[u8]) -> io::Result<()> {
        // xorshift32: masking keys need not be secret here, only present.
        self.mask ^= self.mask << 13;
        self.mask ^= self.mask >> 17;
        self.mask ^= self.mask << 5;
        let frame = encode(FIN | opcode, payload, Some(self.mask.to_be_bytes()));
        self.stream.write_all(&frame).await
    }

    /// Whether a whole frame is already buffered (the next [`Self::next`]
    /// will not wait).
    pub fn has_frame(&self) -> bool {
        matches!(parse_header(&self.buf[self.start..self.end]), Ok(Some((h, len))) if self.end - self.start >= h + len)
    }

    /// The next server frame; `None` when the server closed the TCP
    /// connection. Cancel-safe: a frame half read stays buffered.
    pub async fn next(&mut self) -> io::Result<Option<Frame<'_>>> {
        loop {
            let available = &self.buf[self.start..self.end];
            match parse_header(available)? {
                Some((header, len)) if available.len() >= header + len => {
                    let opcode = available[0] & 0x0f;
                    let compressed = available[0] & RSV1 != 0;
                    let payload_at = self.start + header;
                    self.start = payload_at + len;
                    if compressed {
                        if !self.deflate {
                            return Err(io::Error::other("RSV1 without permessage-deflate"));
                        }
                        inflate(&self.buf[payload_at..payload_at + len], &mut self.inflated)?;
                        return Ok(Some(Frame {
                            opcode,
                            payload: &self.inflated,
                            wire_bytes: header + len,
                        }));
                    }
                    return Ok(Some(Frame {
                        opcode,
                        payload: &self.buf[payload_at..payload_at + len],
                        wire_bytes: header + len,
                    }));
                }
                Some((header, len)) => self.grow(header + len)?,
                None => self.grow(0)?,
            }
            let n = self.stream.read(&mut self.buf[self.end..]).await?;
            if n == 0 {
                return Ok(None);
            }
            self.end += n;
        }
    }

    /// Gives back a buffer grown past `keep` bytes (for one large frame)
    /// once what is unread fits in `to`: many clients each keeping their
    /// largest frame's buffer would hold that frame many times over.
    pub fn shrink(&mut self, to: usize, keep: usize) {
        let unread = self.end - self.start;
        if self.buf.len() > keep && unread <= to {
            let mut buf = vec![0; to.max(256)];
            buf[..unread].copy_from_slice(&self.buf[self.start..self.end]);
            self.buf = buf;
            self.start = 0;
            self.end = unread;
        }
    }

    /// Makes room to read: moves the unread bytes to the front, and grows
    /// the buffer to hold `frame` bytes if it cannot.
    fn grow(&mut self, frame: usize) -> io::Result<()> {
        if frame > MAX_FRAME_BYTES {
            return Err(io::Error::other(format!(
                "a {frame}-byte frame, over {MAX_FRAME_BYTES}"
            )));
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < frame.max(self.end + 1) {
            self.buf.resize(frame.max(self.end + 1), 0);
        }
        Ok(())
    }

    /// Sends `sub` for each topic (ids from 1), then reads `welcome` and one
    /// `ok` per topic, answering pings meanwhile; the `seq` of each `ok`.
    pub async fn subscribe(&mut self, topics: &[&str]) -> Result<Vec<u64>, String> {
        for (i, topic) in topics.iter().enumerate() {
            let sub = serde_json::json!({"op": "sub", "id": i + 1, "topic": topic}).to_string();
            self.send(OP_TEXT, sub.as_bytes())
                .await
                .map_err(|e| format!("sending sub: {e}"))?;
        }
        let mut seqs = vec![0; topics.len()];
        let mut confirmed = 0;
        let mut welcomed = false;
        while confirmed < topics.len() {
            let frame = match self.next().await {
                Ok(Some(frame)) => frame,
                Ok(None) => return Err("closed before the subs were confirmed".to_owned()),
                Err(e) => return Err(format!("reading: {e}")),
            };
            match frame.opcode {
                OP_TEXT => {}
                OP_PING => {
                    let ping = frame.payload.to_vec();
                    self.send(OP_PONG, &ping)
                        .await
                        .map_err(|e| format!("pong: {e}"))?;
                    continue;
                }
                OP_CLOSE => return Err(format!("closed: {}", describe_close(frame.payload))),
                op => return Err(format!("unexpected opcode {op}")),
            }
            let reply: Reply = serde_json::from_slice(frame.payload).map_err(|e| {
                format!(
                    "not a server frame ({e}): {}",
                    String::from_utf8_lossy(frame.payload)
                )
            })?;
            match (reply.op.as_str(), reply.id) {
                ("welcome", _) if !welcomed => welcomed = true,
                // A namespace with join/leave diffs sends them as members come.
                ("presence_diff", _) => {}
                ("ok", Some(id)) if (1..=topics.len() as u64).contains(&id) => {
                    seqs[id as usize - 1] = reply.seq.unwrap_or(0);
                    confirmed += 1;
                }
                _ => {
                    return Err(format!(
                        "sub refused: {}",
                        String::from_utf8_lossy(frame.payload)
                    ));
                }
            }
        }
        Ok(seqs)
    }
}

#[derive(serde::Deserialize)]
struct Reply {
    op: String,
    id: Option<u64>,
    seq: Option<u64>,
}

/// (header bytes, payload bytes) of the frame at the start of `bytes`, if
/// its header is all there.
fn parse_header(bytes: &[u8]) -> io::Result<Option<(usize, usize)>> {
    let [first, second, ..] = *bytes else {
        return Ok(None);
    };
    // RSV1 marks a compressed message (checked against the negotiation by
    // `Client::next`); RSV2 and RSV3 mean nothing here.
    if first & 0x80 == 0 || first & 0x30 != 0 {
        return Err(io::Error::other(format!(
            "a fragmented or extended server frame (first byte {first:#04x})"
        )));
    }
    if second & 0x80 != 0 {
        return Err(io::Error::other("a masked server frame"));
    }
    let (header, len) = match second & 0x7f {
        126 => match bytes.get(2..4) {
            Some(b) => (4, usize::from(u16::from_be_bytes([b[0], b[1]]))),
            None => return Ok(None),
        },
        127 => match bytes.get(2..10).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
            Some(b) => (
                10,
                usize::try_from(u64::from_be_bytes(b)).unwrap_or(usize::MAX),
            ),
            None => return Ok(None),
        },
        n => (2, usize::from(n)),
    };
    Ok(Some((header, len)))
}

/// A `msg` frame's topic and seq, read from its fixed prefix
/// `{"op":"msg","topic":"<topic>","seq":<n>,"data":`; `None` for any other frame.
pub fn msg_topic_seq(payload: &[u8]) -> Option<(&[u8], u64)> {
    let rest = payload.strip_prefix(MSG_PREFIX)?;
    let quote = rest.iter().position(|&b| b == b'"')?;
    let (topic, rest) = rest.split_at(quote);
    let digits = rest.strip_prefix(br#"","seq":"#)?;
    let mut seq: u64 = 0;
    let mut any = false;
    for &b in digits.iter().take_while(|b| b.is_ascii_digit()) {
        seq = seq.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        any = true;
    }
    any.then_some((topic, seq))
}

/// A close frame's payload as `code reason`.
pub fn describe_close(payload: &[u8]) -> String {
    match payload {
        [a, b, reason @ ..] => format!(
            "{} {}",
            u16::from_be_bytes([*a, *b]),
            String::from_utf8_lossy(reason)
        ),
        _ => "no code".to_owned(),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The FIN bit of a frame's first byte: the frame ends its message.
pub const FIN: u8 = 0x80;
/// The mask bit of a frame's second byte: set on every client frame.
const MASKED: u8 = 0x80;

/// One frame's bytes (RFC 6455 5.2): `first` is the FIN, RSV and opcode
/// byte; the length takes its shortest form; with a `mask` key, the payload
/// is masked with it (5.3), as every client frame must be. The one frame
/// encoder of the load generator and of the tests (`testkit::raw`), which
/// also write frames a client must never send.
pub fn encode(first: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut frame = Vec::with_capacity(payload.len() + 14);
    frame.push(first);
    let mask_bit = if mask.is_some() { MASKED } else { 0 };
    match payload.len() {
        n if n < 126 => frame.push(mask_bit | n as u8),
        n if n <= usize::from(u16::MAX) => {
            frame.push(mask_bit | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(mask_bit | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(key) => {
            frame.extend_from_slice(&key);
            frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
        None => frame.extend_from_slice(payload),
    }
    frame
}

/// A compressed server message inflated into `out` (RFC 7692 7.2.2: the
/// flush's tail appended), with this thread's inflater.
fn inflate(compressed: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    INFLATER.with(|cell| {
        let mut d = cell.borrow_mut();
        d.reset(false);
        for input in [compressed, &[0, 0, 0xff, 0xff][..]] {
            let mut input = input;
            loop {
                if out.capacity() - out.len() < 1024 {
                    out.reserve(out.capacity().max(4096));
                }
                let (before, written) = (d.total_in(), out.len());
                d.decompress_vec(input, out, flate2::FlushDecompress::Sync)
                    .map_err(io::Error::other)?;
                let used = (d.total_in() - before) as usize;
                if used == 0 && out.len() == written && !input.is_empty() {
                    return Err(io::Error::other("a compressed frame that does not inflate"));
                }
                input = &input[used..];
                if out.len() > MAX_FRAME_BYTES {
                    return Err(io::Error::other("a message inflating past 16 MiB"));
                }
                if input.is_empty() && out.capacity() - out.len() >= 1024 {
                    break;
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_in_all_three_length_forms() {
        assert_eq!(parse_header(&[0x81, 5]).expect("ok"), Some((2, 5)));
        assert_eq!(parse_header(&[0x81, 126, 1]).expect("ok"), None);
        assert_eq!(
            parse_header(&[0x81, 126, 0, 200]).expect("ok"),
            Some((4, 200))
        );
        assert_eq!(
            parse_header(&[0x81, 127, 0, 0, 0, 0, 0, 0x10, 0, 0]).expect("ok"),
            Some((10, 1 << 20))
        );
        assert!(parse_header(&[0x01, 5]).is_err(), "fragment");
        assert!(parse_header(&[0x81, 0x85]).is_err(), "masked");
    }

    #[test]
    fn a_masked_frame_carries_its_key_then_the_masked_payload() {
        let frame = encode(FIN | OP_TEXT, b"abcde", Some([1, 2, 3, 4]));
        assert_eq!(&frame[..6], &[0x81, MASKED | 5, 1, 2, 3, 4]);
        assert_eq!(
            &frame[6..],
            &[b'a' ^ 1, b'b' ^ 2, b'c' ^ 3, b'd' ^ 4, b'e' ^ 1]
        );
        let long = encode(OP_TEXT, &[0; 70_000], Some([0; 4]));
        assert_eq!(
            &long[..2],
            &[OP_TEXT, MASKED | 127],
            "not final, 64-bit length"
        );
    }

    #[test]
    fn a_msg_is_read_from_its_prefix() {
        let msg = br#"{"op":"msg","topic":"t.17","seq":42,"data":{"x":1}}"#;
        assert_eq!(msg_topic_seq(msg), Some((&b"t.17"[..], 42)));
        assert_eq!(msg_topic_seq(br#"{"op":"ok","id":1}"#), None);
    }
}
