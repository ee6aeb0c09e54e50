//! The server-sent events client ([`SseClient`]): `GET /sse`, the event
//! stream parsed as `EventSource` parses it, the last id kept for a
//! reconnect with `Last-Event-ID`. Its own module: one transport's client,
//! on the shared response reading of [`super::Body`].

use std::io;
use std::net::SocketAddr;

use memchr::memchr;

use super::{Body, query_escape};
use crate::Target;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_end_at_an_empty_line() {
        assert_eq!(block_end(b"data: x\n"), None);
        assert_eq!(block_end(b"data: x\n\nrest"), Some(9));
        assert_eq!(block_end(b"data: x\r\n\r\n"), Some(11));
        assert_eq!(block_end(b"\n"), Some(1));
        assert_eq!(block_end(b""), None);
    }
}
