//! [`Conn`]: a client of any of the three transports (WebSocket, SSE,
//! HTTP-streaming) behind one reading interface ([`Incoming`]), for the
//! scenarios that run each. Its own module: it is built on the two stream
//! clients and [`crate::raw`]'s WebSocket one, and none of them on it.

use std::io;
use std::net::SocketAddr;

use super::{Line, NdjsonClient, Reply, Sse, SseClient, Transport, not_a_frame, post_commands};
use crate::Target;
use crate::raw;

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
