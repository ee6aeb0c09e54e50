//! Clients of the HTTP stream transports (issue #25), on bare TCP sockets
//! like [`raw`]'s WebSocket client and for the same reasons: thousands in
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

use std::io;
use std::net::SocketAddr;

use memchr::memchr;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::Target;
use crate::raw;

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

/// One event-stream item: an event with data, or a block without any (a
/// comment: the heartbeat, or an `id:`/`retry:` alone).
#[derive(Debug, PartialEq)]
pub enum Sse<'a> {
    /// `wire`: the event's bytes on the wire, its `id:` line and all.
    Event {
        data: &'a [u8],
        wire: usize,
    },
    Comment,
}

/// A server-sent events client.
pub struct SseClient {
    body: Body,
    /// The last event id seen (`EventSource`'s "last event ID string").
    pub last_id: Option<String>,
    /// The reconnection time the server asked for (`retry:`), in ms.
    pub retry_ms: Option<u64>,
    /// Several `data:` lines of one event, joined with LF.
    joined: Vec<u8>,
}

/// The request line's target for an SSE stream of `topics`, and a token
/// in the query (as `EventSource`, which sends no headers, must).
pub fn sse_path(topics: &[&str], token: Option<&str>) -> String {
    let mut path = "/sse".to_owned();
    for (i, topic) in topics.iter().enumerate() {
        path.push(if i == 0 { '?' } else { '&' });
        path.push_str("topic=");
        path.push_str(&query_escape(topic));
    }
    if let Some(token) = token {
        path.push(if topics.is_empty() { '?' } else { '&' });
        path.push_str("token=");
        path.push_str(&query_escape(token));
    }
    path
}

impl SseClient {
    /// Opens `GET /sse` for `topics` on `target`; with `last_id`, as a
    /// reconnecting `EventSource` does (`Last-Event-ID`). The answer must
    /// be `200` `text/event-stream`.
    pub async fn connect(
        source: Option<SocketAddr>,
        target: &Target,
        topics: &[&str],
        last_id: Option<&str>,
        buffer_bytes: usize,
    ) -> io::Result<Self> {
        let mut request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n",
            sse_path(topics, None),
            target.addr
        );
        if let Some(id) = last_id {
            request.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        request.push_str("\r\n");
        let (body, head) =
            Body::open(source, target.addr, request.as_bytes(), buffer_bytes).await?;
        let kind = head.content_type.as_deref().unwrap_or_default();
        if !kind.starts_with("text/event-stream") {
            return Err(io::Error::other(format!(
                "content-type {kind:?}, not text/event-stream"
            )));
        }
        Ok(Self {
            body,
            last_id: last_id.map(str::to_owned),
            retry_ms: None,
            joined: Vec::new(),
        })
    }

    /// Whether a whole event or comment is buffered (the next
    /// [`Self::next`] will not wait).
    pub fn has_event(&self) -> bool {
        let unread = self.body.unread();
        block_end(unread).is_some()
            || (unread.first() == Some(&b':') && memchr(b'\n', unread).is_some())
    }

    /// The next event, or comment; `None` when the stream ended.
    /// Cancel-safe.
    ///
    /// A comment line that starts a block is handed out on its own, at
    /// once: the gateway's heartbeat is a lone comment line (`:` LF), which
    /// would otherwise wait for the next event's empty line. Comments are
    /// no part of an event's fields, so `EventSource`'s reading is
    /// unchanged; an empty block (the empty line after such a comment) is
    /// no item.
    pub async fn next(&mut self) -> io::Result<Option<Sse<'_>>> {
        loop {
            let unread = self.body.unread();
            if unread.first() == Some(&b':')
                && let Some(nl) = memchr(b'\n', unread)
            {
                self.body.start += nl + 1;
                return Ok(Some(Sse::Comment));
            }
            match block_end(unread) {
                Some(end)
                    if end <= 2 && unread[..end].iter().all(|&b| b == b'\r' || b == b'\n') =>
                {
                    self.body.start += end;
                    continue;
                }
                Some(end) => {
                    let from = self.body.start;
                    self.body.start += end;
                    return Ok(Some(self.dispatch(from, from + end)));
                }
                None => {}
            }
            if !self.body.fill().await? {
                return Ok(None);
            }
        }
    }

    /// The fields of the block `buf[from..to]` (its lines and the empty one).
    fn dispatch(&mut self, from: usize, to: usize) -> Sse<'_> {
        let block = &self.body.buf[from..to];
        let mut data: Option<(usize, usize)> = None;
        let mut lines_of_data = 0;
        self.joined.clear();
        let mut at = 0;
        while at < block.len() {
            let nl = memchr(b'\n', &block[at..]).map_or(block.len(), |p| at + p);
            let mut line = &block[at..nl];
            let line_at = at;
            at = nl + 1;
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            if line.is_empty() || line[0] == b':' {
                continue;
            }
            let (name, value, value_at) = match line.iter().position(|&b| b == b':') {
                Some(colon) => {
                    let skip = usize::from(line.get(colon + 1) == Some(&b' '));
                    (&line[..colon], &line[colon + 1 + skip..], colon + 1 + skip)
                }
                None => (line, &line[line.len()..], line.len()),
            };
            match name {
                b"data" => {
                    lines_of_data += 1;
                    if lines_of_data == 1 {
                        data = Some((from + line_at + value_at, from + line_at + line.len()));
                    } else {
                        if lines_of_data == 2
                            && let Some((f, t)) = data
                        {
                            self.joined.extend_from_slice(&self.body.buf[f..t]);
                        }
                        self.joined.push(b'\n');
                        self.joined.extend_from_slice(value);
                    }
                }
                // Into the id kept, not a new string per event: a load
                // generator's own cost per event shifts the gateway's.
                b"id" if !value.contains(&0) => {
                    let id = self.last_id.get_or_insert_with(String::new);
                    id.clear();
                    id.push_str(&String::from_utf8_lossy(value));
                }
                b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                    self.retry_ms = std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .or(self.retry_ms);
                }
                _ => {}
            }
        }
        match (lines_of_data, data) {
            (0, _) | (_, None) => Sse::Comment,
            (1, Some((f, t))) => Sse::Event {
                data: &self.body.buf[f..t],
                wire: to - from,
            },
            _ => Sse::Event {
                data: &self.joined,
                wire: to - from,
            },
        }
    }
}

/// Where the first event-stream block of `bytes` ends (just past its empty
/// line), if it is all there. A block of only an empty line is a block
/// (nothing in it).
fn block_end(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let nl = at + memchr(b'\n', &bytes[at..])?;
        let line = &bytes[at..nl];
        if line.is_empty() || line == b"\r" {
            return Some(nl + 1);
        }
        at = nl + 1;
    }
}

/// One NDJSON stream item.
#[derive(Debug, PartialEq)]
pub enum Line<'a> {
    Frame(&'a [u8]),
    /// An empty line: the heartbeat.
    Heartbeat,
}

/// An HTTP-streaming client: the NDJSON response of `POST /stream`.
pub struct NdjsonClient {
    body: Body,
    /// From `welcome` (see [`Self::welcome`]).
    pub session: Option<String>,
}

impl NdjsonClient {
    /// `POST /stream` with `hello` (a JSON object, `{"op":"hello"}` at the
    /// least); the answer must be `200` `application/x-ndjson`.
    pub async fn connect(
        source: Option<SocketAddr>,
        target: &Target,
        hello: &str,
        buffer_bytes: usize,
    ) -> io::Result<Self> {
        let request = format!(
            "POST /stream HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{hello}",
            target.addr,
            hello.len()
        );
        let (body, head) =
            Body::open(source, target.addr, request.as_bytes(), buffer_bytes).await?;
        let kind = head.content_type.as_deref().unwrap_or_default();
        if !kind.starts_with("application/x-ndjson") {
            return Err(io::Error::other(format!(
                "content-type {kind:?}, not application/x-ndjson"
            )));
        }
        Ok(Self {
            body,
            session: None,
        })
    }

    /// Whether a whole line is buffered.
    pub fn has_line(&self) -> bool {
        memchr(b'\n', self.body.unread()).is_some()
    }

    /// The next line; `None` when the stream ended. Cancel-safe.
    pub async fn next(&mut self) -> io::Result<Option<Line<'_>>> {
        loop {
            if let Some((from, to)) = self.body.take_line() {
                return Ok(Some(if from == to {
                    Line::Heartbeat
                } else {
                    Line::Frame(&self.body.buf[from..to])
                }));
            }
            if !self.body.fill().await? {
                return Ok(None);
            }
        }
    }

    /// Reads up to `welcome` and keeps its session.
    pub async fn welcome(&mut self) -> Result<String, String> {
        loop {
            let line = match self.next().await {
                Ok(Some(Line::Frame(line))) => line,
                Ok(Some(Line::Heartbeat)) => continue,
                Ok(None) => return Err("the stream ended before welcome".to_owned()),
                Err(e) => return Err(format!("reading: {e}")),
            };
            let reply: Reply = serde_json::from_slice(line).map_err(|e| not_a_frame(e, line))?;
            match (reply.op.as_str(), reply.session) {
                ("welcome", Some(session)) => {
                    self.session = Some(session.clone());
                    return Ok(session);
                }
                _ => return Err(format!("before welcome: {}", String::from_utf8_lossy(line))),
            }
        }
    }
}

/// Sends `commands` (JSON lines) for `session` with `POST
/// /stream/<session>` on a connection of its own; the answer must be `202`.
pub async fn post_commands(
    source: Option<SocketAddr>,
    target: &Target,
    session: &str,
    commands: &[String],
) -> io::Result<()> {
    let body = commands.join("\n");
    let request = format!(
        "POST /stream/{} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-ndjson\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        query_escape(session),
        target.addr,
        body.len()
    );
    let socket = if target.addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(source) = source {
        socket.bind(source)?;
    }
    let mut stream = socket.connect(target.addr).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    while find(&answer, b"\r\n").is_none() && answer.len() < MAX_HEAD_BYTES {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    let line_end = find(&answer, b"\r\n").unwrap_or(answer.len());
    let head = parse_head(&answer[..line_end])?;
    if head.status != 202 {
        return Err(io::Error::other(format!(
            "commands answered {}: {}",
            head.status,
            String::from_utf8_lossy(&answer)
                .chars()
                .take(ERROR_BODY_QUOTED)
                .collect::<String>()
        )));
    }
    Ok(())
}

/// What a scenario reads from a client of any transport.
#[derive(Debug, PartialEq)]
pub enum Incoming<'a> {
    /// A server frame's JSON (a WebSocket text frame, inflated where it was
    /// compressed; an SSE event's data; an NDJSON line), and about what it
    /// took on the wire (a WebSocket frame's exactly, a stream's data).
    Frame(&'a [u8], usize),
    /// A WebSocket ping: answer with [`Conn::pong`].
    Ping(Vec<u8>),
    /// A heartbeat of a stream (an SSE comment, an empty NDJSON line).
    Heartbeat,
    /// A WebSocket close frame (code and reason).
    Closed(String),
    /// A WebSocket frame of another kind.
    Other,
}

/// A client of any transport.
pub enum Conn {
    Ws(raw::Client),
    Sse(SseClient),
    Stream(NdjsonClient),
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

impl Conn {
    /// Whether the connection negotiated permessage-deflate (a WebSocket's).
    pub fn compressed(&self) -> bool {
        match self {
            Self::Ws(c) => c.compressed(),
            _ => false,
        }
    }

    /// Opens a client of `transport` on `target` and subscribes it to
    /// `topics`: the `seq` of each topic's `ok`, in `topics` order.
    /// WebSocket: `sub` per topic after the upgrade; SSE: the topics in the
    /// request; HTTP-streaming: `hello`, then the `sub`s by `POST
    /// /stream/<session>` (64 per request, the most one takes).
    pub async fn subscribed(
        transport: Transport,
        source: Option<SocketAddr>,
        target: &Target,
        topics: &[&str],
        buffer_bytes: usize,
        seed: u64,
        compression: bool,
    ) -> Result<(Self, Vec<u64>), String> {
        match transport {
            Transport::Ws => {
                // A WebSocket may offer permessage-deflate, as a browser does.
                let offer = [("Sec-WebSocket-Extensions", raw::DEFLATE_OFFER)];
                let headers: &[(&str, &str)] = if compression { &offer } else { &[] };
                let mut c =
                    raw::Client::connect_with_headers(source, target, buffer_bytes, seed, headers)
                        .await
                        .map_err(|e| e.to_string())?;
                let seqs = c.subscribe(topics).await?;
                Ok((Self::Ws(c), seqs))
            }
            Transport::Sse => {
                let c = SseClient::connect(source, target, topics, None, buffer_bytes)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut conn = Self::Sse(c);
                let seqs = conn.confirmed(topics, false).await?;
                Ok((conn, seqs))
            }
            Transport::Stream => {
                let mut c =
                    NdjsonClient::connect(source, target, r#"{"op":"hello"}"#, buffer_bytes)
                        .await
                        .map_err(|e| e.to_string())?;
                let session = c.welcome().await?;
                let subs: Vec<String> = topics
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        serde_json::json!({"op": "sub", "id": i + 1, "topic": t}).to_string()
                    })
                    .collect();
                for batch in subs.chunks(64) {
                    post_commands(source, target, &session, batch)
                        .await
                        .map_err(|e| format!("subscribing: {e}"))?;
                }
                let mut conn = Self::Stream(c);
                let seqs = conn.confirmed(topics, true).await?;
                Ok((conn, seqs))
            }
        }
    }

    /// Reads one `ok` per topic (by `id` from 1 when `by_id`, else by
    /// topic), answering nothing (streams have no pings); the seqs.
    async fn confirmed(&mut self, topics: &[&str], by_id: bool) -> Result<Vec<u64>, String> {
        let mut seqs = vec![0; topics.len()];
        let mut seen = vec![false; topics.len()];
        let mut confirmed = 0;
        while confirmed < topics.len() {
            let frame = match self.next().await {
                Ok(Some(Incoming::Frame(frame, _))) => frame,
                Ok(Some(_)) => continue,
                Ok(None) => {
                    return Err("the stream ended before the subs were confirmed".to_owned());
                }
                Err(e) => return Err(format!("reading: {e}")),
            };
            let reply: Reply = serde_json::from_slice(frame).map_err(|e| not_a_frame(e, frame))?;
            let at = match (reply.op.as_str(), by_id) {
                ("ok", true) => reply
                    .id
                    .and_then(|id| usize::try_from(id).ok())
                    .filter(|id| (1..=topics.len()).contains(id))
                    .map(|id| id - 1),
                ("ok", false) => reply
                    .topic
                    .as_deref()
                    .and_then(|t| topics.iter().position(|mine| *mine == t)),
                _ => None,
            };
            match at {
                Some(at) if !seen[at] => {
                    seen[at] = true;
                    seqs[at] = reply.seq.unwrap_or(0);
                    confirmed += 1;
                }
                _ => {
                    return Err(format!("sub refused: {}", String::from_utf8_lossy(frame)));
                }
            }
        }
        Ok(seqs)
    }

    /// The next thing the server sent; `None` at the end of the connection.
    /// Cancel-safe.
    pub async fn next(&mut self) -> io::Result<Option<Incoming<'_>>> {
        Ok(Some(match self {
            Self::Ws(c) => match c.next().await? {
                None => return Ok(None),
                Some(frame) => match frame.opcode {
                    raw::OP_TEXT => Incoming::Frame(frame.payload, frame.wire_bytes),
                    raw::OP_PING => Incoming::Ping(frame.payload.to_vec()),
                    raw::OP_CLOSE => Incoming::Closed(raw::describe_close(frame.payload)),
                    _ => Incoming::Other,
                },
            },
            Self::Sse(c) => match c.next().await? {
                None => return Ok(None),
                Some(Sse::Event { data, wire }) => Incoming::Frame(data, wire),
                Some(Sse::Comment) => Incoming::Heartbeat,
            },
            Self::Stream(c) => match c.next().await? {
                None => return Ok(None),
                Some(Line::Frame(line)) => Incoming::Frame(line, line.len() + 1),
                Some(Line::Heartbeat) => Incoming::Heartbeat,
            },
        }))
    }

    /// Answers a WebSocket ping (nothing to do on a stream).
    pub async fn pong(&mut self, ping: &[u8]) -> io::Result<()> {
        match self {
            Self::Ws(c) => c.send(raw::OP_PONG, ping).await,
            Self::Sse(_) | Self::Stream(_) => Ok(()),
        }
    }

    /// Whether the next [`Self::next`] will not wait.
    pub fn has_frame(&self) -> bool {
        match self {
            Self::Ws(c) => c.has_frame(),
            Self::Sse(c) => c.has_event(),
            Self::Stream(c) => c.has_line(),
        }
    }
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
    fn blocks_end_at_an_empty_line() {
        assert_eq!(block_end(b"data: x\n"), None);
        assert_eq!(block_end(b"data: x\n\nrest"), Some(9));
        assert_eq!(block_end(b"data: x\r\n\r\n"), Some(11));
        assert_eq!(block_end(b"\n"), Some(1));
        assert_eq!(block_end(b""), None);
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
