//! Clients of the HTTP stream transports (issue #25), on bare TCP sockets
//! like [`raw`](crate::raw)'s WebSocket client and for the same reasons: thousands in
//! one process, each a socket, a small buffer and a task, reading `msg`
//! frames without parsing their JSON.
//!
//! - [`SseClient`]: `GET /sse?topic=…`, the event stream parsed as
//!   `EventSource` parses it (`id:`, `data:`, `retry:` fields, comments,
//!   events ended by an empty line; the last id kept), so that a client
//!   reconnects with `Last-Event-ID` as a browser does.
//! - [`NdjsonClient`]: `POST /stream` with a `hello`, one JSON frame a line
//!   (an empty line is a heartbeat); its commands go by `POST
//!   /stream/<session>` ([`post_commands`]).
//! - [`Conn`]: any of the three transports behind one reading interface
//!   ([`Incoming`]), for the scenarios that run each (`throughput`, `idle`).
//!
//! The responses are read as HTTP/1.1: a body delimited by the connection's
//! close (what the gateway sends), or chunked (decoded in place, should a
//! proxy or another server frame it so). Lines end with LF or CRLF; a lone
//! CR, which the event-stream format also allows, is not taken as a line
//! end (no server in this project sends one).
//!
//! Layout: this module reads the responses (the head, the body, chunked or
//! not) for every client; [`sse`], [`ndjson`] and [`conn`] hold the
//! clients, one a module.

use std::io;
use std::net::SocketAddr;

use memchr::memchr;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

mod conn;
mod ndjson;
mod sse;

pub use self::conn::{Conn, Incoming};
pub use self::ndjson::{Line, NdjsonClient, post_commands};
pub use self::sse::{Sse, SseClient, sse_path};

/// Longest response head read.
const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Largest line or event accepted (a `msg` of the `wire` scenario's 1 MiB
/// and its envelope).
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;
/// Most bytes of an error answer's body quoted.
const ERROR_BODY_QUOTED: usize = 512;

/// The transport a scenario's clients use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// WebSocket, `/ws`.
    #[default]
    Ws,
    /// Server-sent events, `GET /sse`.
    Sse,
    /// HTTP-streaming, `POST /stream` (NDJSON).
    Stream,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Self::Ws => "ws",
            Self::Sse => "sse",
            Self::Stream => "stream",
        }
    }
}

/// What a response head said.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub status: u16,
    pub content_type: Option<String>,
    pub chunked: bool,
}

/// Where the chunked decoder is in the body.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Chunk {
    /// Reading a chunk's size (hex), then maybe an extension, up to CRLF.
    Size {
        size: u64,
        extension: bool,
    },
    SizeLf {
        size: u64,
    },
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk: trailer lines up to an empty one.
    Trailer {
        line_start: bool,
    },
    Done,
}

/// A response body being read: `buf[start..end]` is what has come and was
/// not handed out yet (decoded, when chunked).
pub struct Body {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    chunk: Option<Chunk>,
}

impl Body {
    /// Connects to `addr` (from `source`), sends `request`, reads the head.
    /// Anything but `200` is an error quoting the status line and the start
    /// of the body.
    pub async fn open(
        source: Option<SocketAddr>,
        addr: SocketAddr,
        request: &[u8],
        buffer_bytes: usize,
    ) -> io::Result<(Self, Head)> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if let Some(source) = source {
            socket.bind(source)?;
        }
        let mut stream = socket.connect(addr).await?;
        stream.set_nodelay(true)?;
        stream.write_all(request).await?;
        let mut body = Self {
            stream,
            buf: vec![0; buffer_bytes.max(256)],
            start: 0,
            end: 0,
            chunk: None,
        };
        let head = body.head().await?;
        if head.status != 200 {
            // The error's body, what of it comes before the close or a moment.
            let quote = async {
                while body.end < ERROR_BODY_QUOTED && body.fill().await.unwrap_or(false) {}
            };
            let _ = tokio::time::timeout(std::time::Duration::from_millis(500), quote).await;
            let text = String::from_utf8_lossy(&body.buf[body.start..body.end]);
            return Err(io::Error::other(format!(
                "answered {}: {}",
                head.status,
                text.chars().take(ERROR_BODY_QUOTED).collect::<String>()
            )));
        }
        Ok((body, head))
    }

    /// Reads and parses the head; what follows it stays buffered as body.
    async fn head(&mut self) -> io::Result<Head> {
        loop {
            if let Some(at) = find(&self.buf[..self.end], b"\r\n\r\n") {
                let head = parse_head(&self.buf[..at])?;
                let rest = at + 4;
                if head.chunked {
                    self.chunk = Some(Chunk::Size {
                        size: 0,
                        extension: false,
                    });
                    let end = self.end;
                    self.end = rest;
                    self.decode(rest, end)?;
                }
                self.start = rest;
                return Ok(head);
            }
            if self.end >= MAX_HEAD_BYTES {
                return Err(io::Error::other("a response head over 8 KiB"));
            }
            if self.end == self.buf.len() {
                self.buf.resize((self.buf.len() * 2).min(MAX_HEAD_BYTES), 0);
            }
            let n = self.stream.read(&mut self.buf[self.end..]).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.end += n;
        }
    }

    /// Reads more of the body; `false` at its end (the close, or the last
    /// chunk). Makes room first: moves what is unread to the front and
    /// grows the buffer (up to [`MAX_EVENT_BYTES`]) when it is full.
    /// Cancel-safe: what was read stays buffered.
    pub async fn fill(&mut self) -> io::Result<bool> {
        if self.chunk == Some(Chunk::Done) {
            return Ok(false);
        }
        if self.start > 0 && (self.start == self.end || self.end == self.buf.len()) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            if self.buf.len() >= MAX_EVENT_BYTES {
                return Err(io::Error::other(format!(
                    "a line or event over {MAX_EVENT_BYTES} bytes"
                )));
            }
            let grown = (self.buf.len() * 2).min(MAX_EVENT_BYTES);
            self.buf.resize(grown, 0);
        }
        let n = self.stream.read(&mut self.buf[self.end..]).await?;
        if n == 0 {
            return Ok(false);
        }
        let (from, to) = (self.end, self.end + n);
        self.end = from;
        self.decode(from, to)?;
        Ok(self.end > from || self.chunk != Some(Chunk::Done))
    }

    /// Takes the raw bytes `buf[from..to]` into the body: as they are, or
    /// with the chunked framing taken out (in place: the decoded bytes are
    /// never more than the raw ones).
    fn decode(&mut self, from: usize, to: usize) -> io::Result<()> {
        let Some(mut state) = self.chunk else {
            self.end = to;
            return Ok(());
        };
        let bad = |what: &str| io::Error::other(format!("bad chunked body: {what}"));
        let (mut r, mut w) = (from, from);
        while r < to {
            let b = self.buf[r];
            state = match state {
                Chunk::Data(left) => {
                    let take = left.min((to - r) as u64) as usize;
                    self.buf.copy_within(r..r + take, w);
                    r += take;
                    w += take;
                    let left = left - take as u64;
                    if left == 0 {
                        Chunk::DataCr
                    } else {
                        Chunk::Data(left)
                    }
                }
                Chunk::Size { size, extension } => {
                    r += 1;
                    match (b, extension) {
                        (b'\r', _) => Chunk::SizeLf { size },
                        (b';', _) => Chunk::Size {
                            size,
                            extension: true,
                        },
                        (_, true) => Chunk::Size { size, extension },
                        _ => {
                            let digit = char::from(b).to_digit(16).ok_or_else(|| bad("size"))?;
                            let size = size
                                .checked_mul(16)
                                .and_then(|s| s.checked_add(u64::from(digit)))
                                .ok_or_else(|| bad("size too large"))?;
                            Chunk::Size {
                                size,
                                extension: false,
                            }
                        }
                    }
                }
                Chunk::SizeLf { size } => {
                    r += 1;
                    match (b, size) {
                        (b'\n', 0) => Chunk::Trailer { line_start: true },
                        (b'\n', size) => Chunk::Data(size),
                        _ => return Err(bad("no LF after the size")),
                    }
                }
                Chunk::DataCr => {
                    r += 1;
                    if b != b'\r' {
                        return Err(bad("no CR after a chunk"));
                    }
                    Chunk::DataLf
                }
                Chunk::DataLf => {
                    r += 1;
                    if b != b'\n' {
                        return Err(bad("no LF after a chunk"));
                    }
                    Chunk::Size {
                        size: 0,
                        extension: false,
                    }
                }
                Chunk::Trailer { line_start } => {
                    r += 1;
                    match b {
                        b'\r' => Chunk::Trailer { line_start },
                        b'\n' if line_start => Chunk::Done,
                        b'\n' => Chunk::Trailer { line_start: true },
                        _ => Chunk::Trailer { line_start: false },
                    }
                }
                Chunk::Done => {
                    r = to;
                    Chunk::Done
                }
            };
        }
        self.chunk = Some(state);
        self.end = w;
        Ok(())
    }

    /// What is buffered and unread.
    fn unread(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// The next whole line (without its LF or CRLF) if one is buffered.
    fn take_line(&mut self) -> Option<(usize, usize)> {
        let nl = memchr(b'\n', self.unread())?;
        let (from, mut to) = (self.start, self.start + nl);
        if to > from && self.buf[to - 1] == b'\r' {
            to -= 1;
        }
        self.start += nl + 1;
        Some((from, to))
    }

    /// Writes bytes to the socket (a WebSocket-less peer sends nothing
    /// after its request; tests use it to send more than one request).
    pub async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }
}

/// Parses a response head (status line and headers, no final CRLF CRLF).
pub fn parse_head(head: &[u8]) -> io::Result<Head> {
    let text = std::str::from_utf8(head).map_err(|_| io::Error::other("a head not in UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP status line: {status_line:?}")))?;
    let mut parsed = Head {
        status,
        content_type: None,
        chunked: false,
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-type") {
            parsed.content_type = Some(value.to_owned());
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            parsed.chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        }
    }
    Ok(parsed)
}

/// The `ok` and `welcome` frames' fields the clients read.
#[derive(Deserialize)]
struct Reply {
    op: String,
    id: Option<u64>,
    topic: Option<String>,
    seq: Option<u64>,
    session: Option<String>,
}

fn not_a_frame(e: serde_json::Error, line: &[u8]) -> String {
    format!(
        "not a server frame ({e}): {}",
        String::from_utf8_lossy(line)
    )
}

/// `s` with every byte outside RFC 3986's unreserved set percent-encoded.
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;
    use crate::Target;

    /// A server on loopback that answers one connection with `response`
    /// (sent in pieces of `piece` bytes) and closes; the client's target.
    async fn serve(response: Vec<u8>, piece: usize) -> Target {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut request = vec![0u8; 4096];
            let _ = s.read(&mut request).await;
            for part in response.chunks(piece.max(1)) {
                if s.write_all(part).await.is_err() {
                    return;
                }
                let _ = s.flush().await;
                tokio::task::yield_now().await;
            }
        });
        Target::at(addr).expect("target")
    }

    /// Every item of an SSE stream served as `body` in pieces of `piece`
    /// bytes: data as text, `:` for a comment; and the last id and retry.
    async fn sse_items(
        body: &[u8],
        chunked: bool,
        piece: usize,
    ) -> (Vec<String>, Option<String>, Option<u64>) {
        let mut response =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n".to_vec();
        if chunked {
            response.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            response.extend(chunk(body));
        } else {
            response.extend_from_slice(b"Connection: close\r\n\r\n");
            response.extend_from_slice(body);
        }
        let target = serve(response, piece).await;
        let mut c = SseClient::connect(None, &target, &["a", "b"], None, 16)
            .await
            .expect("connected");
        let mut items = Vec::new();
        while let Some(item) = c.next().await.expect("read") {
            items.push(match item {
                Sse::Event { data, .. } => String::from_utf8_lossy(data).into_owned(),
                Sse::Comment => ":".to_owned(),
            });
        }
        (items, c.last_id.clone(), c.retry_ms)
    }

    /// `body` chunked in pieces of 7 bytes, with an extension on one.
    fn chunk(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, part) in body.chunks(7).enumerate() {
            let ext = if i == 1 { ";x=y" } else { "" };
            out.extend_from_slice(format!("{:x}{ext}\r\n", part.len()).as_bytes());
            out.extend_from_slice(part);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\nX-Trailer: 1\r\n\r\n");
        out
    }

    const STREAM: &[u8] = b"retry: 1500\n\nid: 1f:3.:0\ndata: {\"op\":\"ok\"}\n\n:\n\n\
        id:2f:4.:0\r\ndata:{\"op\":\"msg\"}\r\n\r\ndata: one\ndata: two\nevent: x\n\n\
        : a comment\nid\n\nid: bad\0id\ndata\n\n";

    #[tokio::test]
    async fn an_event_stream_reads_as_event_source_reads_it() {
        for (chunked, piece) in [
            (false, 1),
            (false, 4096),
            (true, 1),
            (true, 5),
            (true, 4096),
        ] {
            let (items, last_id, retry) = sse_items(STREAM, chunked, piece).await;
            assert_eq!(
                items,
                [
                    ":",
                    "{\"op\":\"ok\"}",
                    ":",
                    "{\"op\":\"msg\"}",
                    "one\ntwo",
                    ":",
                    ":",
                    ""
                ],
                "chunked {chunked}, pieces of {piece}"
            );
            // `id` alone sets the empty id; one with a NUL is ignored.
            assert_eq!(last_id.as_deref(), Some(""), "chunked {chunked}");
            assert_eq!(retry, Some(1500));
        }
    }

    #[tokio::test]
    async fn the_last_id_is_the_last_event_s() {
        let (items, last_id, _) = sse_items(
            b"id: 1:1.:0\ndata: x\n\n:\nid: 1:2.:0\ndata: y\n\n:\n",
            false,
            3,
        )
        .await;
        // A lone comment line (the gateway's heartbeat) comes at once.
        assert_eq!(items, ["x", ":", "y", ":"]);
        assert_eq!(last_id.as_deref(), Some("1:2.:0"));
    }

    #[tokio::test]
    async fn a_refused_stream_says_why() {
        let target = serve(
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n\
              {\"error\":{\"code\":\"malformed\"}}"
                .to_vec(),
            4096,
        )
        .await;
        let e = SseClient::connect(None, &target, &["a"], Some("x"), 64)
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("400") && e.contains("malformed"), "{e}");
        let target = serve(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n".to_vec(),
            4096,
        )
        .await;
        let e = SseClient::connect(None, &target, &["a"], None, 64)
            .await
            .err()
            .expect("not an event stream")
            .to_string();
        assert!(e.contains("text/plain"), "{e}");
    }

    #[tokio::test]
    async fn an_ndjson_stream_reads_line_by_line() {
        let body = b"{\"op\":\"welcome\",\"session\":\"s1\"}\n\n{\"op\":\"msg\",\"n\":1}\r\n{\"op\":\"msg\",\"n\":2}\n";
        for chunked in [false, true] {
            let mut response =
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n".to_vec();
            if chunked {
                response.extend_from_slice(b"Transfer-Encoding: gzip, chunked\r\n\r\n");
                response.extend(chunk(body));
            } else {
                response.extend_from_slice(b"\r\n");
                response.extend_from_slice(body);
            }
            let target = serve(response, 3).await;
            let mut c = NdjsonClient::connect(None, &target, r#"{"op":"hello"}"#, 8)
                .await
                .expect("connected");
            assert_eq!(c.welcome().await.as_deref(), Ok("s1"));
            assert_eq!(c.next().await.expect("read"), Some(Line::Heartbeat));
            assert_eq!(
                c.next().await.expect("read"),
                Some(Line::Frame(b"{\"op\":\"msg\",\"n\":1}".as_slice()))
            );
            assert_eq!(
                c.next().await.expect("read"),
                Some(Line::Frame(b"{\"op\":\"msg\",\"n\":2}".as_slice()))
            );
            assert_eq!(c.next().await.expect("read"), None, "chunked {chunked}");
        }
    }

    #[tokio::test]
    async fn a_bad_chunked_body_is_an_error_not_a_guess() {
        for body in [
            &b"zz\r\ndata: x\n\n"[..],
            b"3\r\nabcX",
            b"3\nabc\r\n",
            b"ffffffffffffffffff\r\n",
        ] {
            let mut response = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                Transfer-Encoding: chunked\r\n\r\n"
                .to_vec();
            response.extend_from_slice(body);
            let target = serve(response, 4096).await;
            let outcome = match SseClient::connect(None, &target, &["a"], None, 64).await {
                Err(e) => Err(e),
                Ok(mut c) => c.next().await.map(|_| ()),
            };
            let e = outcome.expect_err("refused").to_string();
            assert!(e.contains("bad chunked body"), "{body:?}: {e}");
        }
    }

    #[test]
    fn heads_and_paths() {
        let head = parse_head(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked",
        )
        .expect("parsed");
        assert_eq!(
            head,
            Head {
                status: 200,
                content_type: Some("text/event-stream".to_owned()),
                chunked: true
            }
        );
        assert!(parse_head(b"SSH-2.0").is_err());
        assert_eq!(
            sse_path(&["a.b", "c d/é"], Some("t+k=")),
            "/sse?topic=a.b&topic=c%20d%2F%C3%A9&token=t%2Bk%3D"
        );
        assert_eq!(Transport::Sse.name(), "sse");
    }
}
