//! The HTTP-streaming client ([`NdjsonClient`]): the NDJSON response of
//! `POST /stream`, one JSON frame a line, and [`post_commands`], its
//! commands by `POST /stream/<session>`. Its own module: one transport's
//! client, on the shared response reading of [`super::Body`].

use std::io;
use std::net::SocketAddr;

use memchr::memchr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use super::{
    Body, ERROR_BODY_QUOTED, MAX_HEAD_BYTES, Reply, find, not_a_frame, parse_head, query_escape,
};
use crate::Target;

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
