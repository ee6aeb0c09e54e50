//! A stream's request, read off the raw socket: its head (at most
//! [`MAX_HEAD`], parsed with `httparse`), a `POST /stream`'s body, and what
//! an SSE request names: its topics, where it stands in each
//! (`Last-Event-ID`, or `since.<topic>` and `epoch.<topic>`), its token.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use hyper::HeaderMap;
use hyper::header::{HeaderName, HeaderValue};
use router::{Namespaces, Since, Topic};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The most a stream request's head may take.
pub const MAX_HEAD: usize = 8 * 1024;
/// Headers a stream request may carry.
const MAX_HEADERS: usize = 64;
/// The longest epoch an event id may carry (both engines' are hex, 32 at
/// most).
const MAX_EPOCH: usize = 32;

/// Why a request is refused before its response begins: the status, the
/// `code` of its error body, the `reason` it is counted under, a message.
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    pub code: &'static str,
    pub reason: &'static str,
    pub message: String,
}

impl Refused {
    pub fn new(
        status: u16,
        code: &'static str,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            code,
            reason,
            message: message.into(),
        }
    }

    fn malformed(message: impl Into<String>) -> Self {
        Self::new(400, "malformed", "malformed", message)
    }
}

/// A request head, and what of its body came with it.
pub struct Head {
    pub method: String,
    pub query: String,
    pub headers: HeaderMap,
    pub body: BytesMut,
}

/// Reads the head within `timeout`, at most [`MAX_HEAD`] bytes of it.
pub async fn read_head(stream: &mut TcpStream, timeout: Duration) -> Result<Head, Refused> {
    match tokio::time::timeout(timeout, read_head_inner(stream)).await {
        Ok(head) => head,
        Err(_) => Err(Refused::new(
            408,
            "timeout",
            "timeout",
            "the request head took too long",
        )),
    }
}

async fn read_head_inner(stream: &mut TcpStream) -> Result<Head, Refused> {
    let mut buf = BytesMut::with_capacity(1024);
    loop {
        let read = stream
            .read_buf(&mut buf)
            .await
            .map_err(|e| Refused::malformed(format!("the request could not be read: {e}")))?;
        if read == 0 {
            return Err(Refused::malformed("the request ended in its head"));
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = req
            .parse(&buf)
            .map_err(|e| Refused::malformed(format!("not an HTTP/1.1 request: {e}")))?;
        match parsed {
            httparse::Status::Complete(len) => {
                let target = req.path.unwrap_or("/");
                let query = target.split_once('?').map_or("", |(_, q)| q);
                let mut map = HeaderMap::with_capacity(req.headers.len());
                for h in req.headers.iter() {
                    let (Ok(name), Ok(value)) = (
                        HeaderName::from_bytes(h.name.as_bytes()),
                        HeaderValue::from_bytes(h.value),
                    ) else {
                        return Err(Refused::malformed("a header is not valid"));
                    };
                    map.append(name, value);
                }
                let head = Head {
                    method: req.method.unwrap_or("").to_owned(),
                    query: query.to_owned(),
                    headers: map,
                    body: BytesMut::new(),
                };
                buf.advance(len);
                return Ok(Head { body: buf, ..head });
            }
            httparse::Status::Partial if buf.len() >= MAX_HEAD => {
                return Err(Refused::new(
                    431,
                    "too_large",
                    "too_large",
                    "the request head is over 8 KiB",
                ));
            }
            httparse::Status::Partial => {}
        }
    }
}

/// Reads the rest of a body of `Content-Length` bytes, at most `max`.
pub async fn read_body(
    stream: &mut TcpStream,
    head: &mut Head,
    max: usize,
    timeout: Duration,
) -> Result<(), Refused> {
    let length = match head.headers.get(hyper::header::CONTENT_LENGTH) {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .ok_or_else(|| Refused::malformed("Content-Length is not a number"))?,
        None => {
            return Err(Refused::new(
                411,
                "malformed",
                "malformed",
                "Content-Length is required",
            ));
        }
    };
    if length > max {
        return Err(Refused::new(
            413,
            "too_large",
            "too_large",
            format!("the body is over {max} bytes"),
        ));
    }
    let read = async {
        while head.body.len() < length {
            let n = stream.read_buf(&mut head.body).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(())) => {
            head.body.truncate(length);
            Ok(())
        }
        Ok(Err(_)) => Err(Refused::malformed("the body ended early")),
        Err(_) => Err(Refused::new(
            408,
            "timeout",
            "timeout",
            "the body took too long",
        )),
    }
}

/// What a `GET /sse` names.
#[derive(Debug, Default)]
pub struct SseQuery {
    pub topics: Vec<(Topic, Option<Since>)>,
    pub token: Option<String>,
}

/// Parses an SSE request's query (and its `Last-Event-ID`, which wins over
/// `since`): topics valid, of configured namespaces, at most `max_topics`,
/// none twice.
pub fn sse_query(
    query: &str,
    last_event_id: Option<&str>,
    namespaces: &Namespaces,
    max_topics: usize,
) -> Result<SseQuery, Refused> {
    let mut names: Vec<String> = Vec::new();
    let mut since: Vec<(String, u64)> = Vec::new();
    let mut epochs: Vec<(String, String)> = Vec::new();
    let mut token = None;
    let mut query_id = None;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "topic" => names.push(value.into_owned()),
            "token" => token = Some(value.into_owned()),
            "lastEventId" => query_id = Some(value.into_owned()),
            key => {
                if let Some(topic) = key.strip_prefix("since.") {
                    let seq = value
                        .parse()
                        .map_err(|_| Refused::malformed(format!("`{key}` is not a seq")))?;
                    since.push((topic.to_owned(), seq));
                } else if let Some(topic) = key.strip_prefix("epoch.") {
                    epochs.push((topic.to_owned(), value.into_owned()));
                }
                // Anything else (a cache-buster) is ignored.
            }
        }
    }
    if names.is_empty() {
        return Err(Refused::malformed("name at least one `topic`"));
    }
    if names.len() > max_topics {
        return Err(Refused::new(
            400,
            "too_many_topics",
            "too_many_topics",
            format!("at most {max_topics} topics per stream"),
        ));
    }
    let mut topics: Vec<(Topic, Option<Since>)> = Vec::with_capacity(names.len());
    for name in &names {
        let topic = Topic::parse(name)
            .map_err(|e| Refused::new(400, "bad_topic", "bad_topic", format!("`{name}`: {e}")))?;
        if namespaces.get(&topic).is_none() {
            return Err(Refused::new(
                400,
                "unknown_namespace",
                "unknown_namespace",
                format!("namespace `{}` is not configured", topic.namespace()),
            ));
        }
        if topics.iter().any(|(t, _)| *t == topic) {
            return Err(Refused::malformed(format!("`{name}` is named twice")));
        }
        let seq = since.iter().find(|(t, _)| t == name).map(|(_, s)| *s);
        let epoch = epochs
            .iter()
            .find(|(t, _)| t == name)
            .map(|(_, e)| e.clone());
        topics.push((topic, seq.map(|seq| Since::claimed(seq, epoch))));
    }
    if let Some(id) = last_event_id.or(query_id.as_deref()) {
        let places = event_id(id, topics.len())?;
        for ((_, since), place) in topics.iter_mut().zip(places) {
            *since = place;
        }
    }
    Ok(SseQuery { topics, token })
}

/// An event id's places, one per topic: `<epoch>:<seq>` joined by `.`, a
/// topic not positioned as `:0` (no `since`).
pub fn event_id(id: &str, topics: usize) -> Result<Vec<Option<Since>>, Refused> {
    let bad = || Refused::malformed("Last-Event-ID does not match this stream's topics");
    if id.len() > topics * (MAX_EPOCH + 22) {
        return Err(bad());
    }
    let places: Vec<&str> = id.split('.').collect();
    if places.len() != topics {
        return Err(bad());
    }
    places
        .into_iter()
        .map(|place| {
            let (epoch, seq) = place.split_once(':').ok_or_else(bad)?;
            let seq: u64 = seq.parse().map_err(|_| bad())?;
            if epoch.len() > MAX_EPOCH || !epoch.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            if epoch.is_empty() {
                return if seq == 0 { Ok(None) } else { Err(bad()) };
            }
            Ok(Some(Since::claimed(seq, Some(epoch.to_owned()))))
        })
        .collect()
}

/// The token an SSE request carries: `Authorization: Bearer`, else
/// `?token=`, else the cookie named `cookie`.
pub fn sse_token(headers: &HeaderMap, query: Option<String>, cookie: &str) -> Option<String> {
    if let Some(token) = bearer(headers) {
        return Some(token);
    }
    if query.is_some() {
        return query;
    }
    headers
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == cookie)
        .map(|(_, value)| value.trim_matches('"').to_owned())
}

/// `Authorization: Bearer <token>`.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(hyper::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_id_parses_against_its_topics_only() {
        let places = event_id("ab:3.:0", 2).unwrap();
        assert_eq!(places[0].as_ref().map(|s| s.seq), Some(3));
        assert_eq!(
            places[0].as_ref().and_then(|s| s.epoch.as_deref()),
            Some("ab")
        );
        assert!(places[1].is_none());
        for bad in [
            "ab:3",
            "ab:3.cd:x",
            "zz:1.:0",
            "ab3.:0",
            ":5.:0",
            "ab:3.:0.:0",
        ] {
            assert!(event_id(bad, 2).is_err(), "{bad}");
        }
    }
}
