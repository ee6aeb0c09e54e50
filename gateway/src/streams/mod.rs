//! The WebSocket's fallbacks on the clients' listener (issue #25): Server-Sent
//! Events (`GET /sse`) and HTTP-streaming (`POST /stream`), each a session
//! over a plain HTTP response ([`crate::session::serve_stream`]).
//!
//! Why not hyper: a stream is long-lived and written mostly by the fan-out.
//! Served by hyper, its frames would go through a body channel and a task
//! wake-up each; here the connection keeps its raw `TcpStream`, shared with
//! the fan-out exactly as a WebSocket's is, so a delivery to an idle stream
//! is one `send` from the publishing task, as for `/ws` (the spec's target:
//! deliveries per CPU-second at least 0.8x the WebSocket's). So the first
//! bytes of each connection on the clients' listener are peeked at
//! ([`sniff`]): a stream request's head is read here, bounded (8 KiB, by
//! `websocket.handshake_timeout`), answered with a close-delimited HTTP/1.1
//! response (`Connection: close`); any other request goes to hyper
//! unchanged. A stream request that reaches hyper anyway (one after another
//! on a kept-alive connection, as reverse proxies and browsers send them)
//! is served through hyper's body instead ([`serve_hyper`]): the same
//! checks and session, a pipe's wake-up per write.
//!
//! Refusals come before the response begins, as HTTP statuses with a JSON
//! body `{"error":{"code":…,"message":…}}`, each counted
//! (`herald_streams_refused_total{transport,reason}`) and logged at debug.

mod request;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::io;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::Map;
use http_body_util::{Either, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{
    CACHE_CONTROL, CONTENT_TYPE, HeaderValue, ORIGIN, RETRY_AFTER, WWW_AUTHENTICATE,
};
use hyper::{Request, Response, StatusCode};
use proto::Command;
use tokio::io::AsyncWriteExt;
use tokio::io::DuplexStream;
use tokio::net::TcpStream;
use tokio_util::io::ReaderStream;

use crate::admission::Refusal;
use crate::config::WebSocketConfig;
use crate::frame::Format;
use crate::http::{self, Body, BodyError};
use crate::listener;
use crate::node::Node;
use crate::session::{self, Handshake, Opening};
use request::{Head, SseQuery};
pub use request::{Refused, event_id};

/// How long to wait between two peeks at a request line that came in
/// parts (rare: a request line is one segment).
const PEEK_AGAIN: Duration = Duration::from_millis(5);

/// Whether the connection's first request is a stream's: `GET /sse` or
/// `POST /stream` (not `POST /stream/<session>`, a command, which hyper
/// serves). Peeked, not read: anything else goes to hyper untouched.
pub async fn sniff(stream: &TcpStream, timeout: Duration) -> Option<Format> {
    const CANDIDATES: [(&[u8], Format); 2] = [
        (b"GET /sse", Format::Sse),
        (b"POST /stream", Format::Ndjson),
    ];
    let deadline = tokio::time::Instant::now() + timeout;
    let mut buf = [0u8; 16];
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        let seen = &buf[..n];
        let mut undecided = false;
        for (prefix, format) in CANDIDATES {
            let whole = prefix.len() + 1;
            if seen.len() >= whole {
                if seen.starts_with(prefix) && matches!(seen[prefix.len()], b' ' | b'?') {
                    return Some(format);
                }
            } else if prefix[..seen.len().min(prefix.len())] == seen[..seen.len().min(prefix.len())]
            {
                undecided = true;
            }
        }
        if !undecided {
            return None;
        }
        // Part of a request line that may be a stream's: the rest follows.
        tokio::time::sleep(PEEK_AGAIN).await;
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
    }
}

/// Whether a refusal may be logged at warn: once a second at most, so
/// that a flood of bad requests cannot flood the log.
fn warn_now() -> bool {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    LAST.swap(now, Ordering::Relaxed) != now
}

/// The transport label of `format`.
fn transport(format: Format) -> &'static str {
    match format {
        Format::Sse => "sse",
        _ => "ndjson",
    }
}

/// Serves a stream request on `stream` (sniffed as `format`) to its end.
pub async fn serve(mut stream: TcpStream, peer: SocketAddr, node: Arc<Node>, format: Format) {
    let label = transport(format);
    let refused = match open(&mut stream, peer, &node, format).await {
        Ok((admission, opening)) => {
            let open = opened(&node, label);
            session::serve_stream(stream, node.pod.clone(), admission, opening).await;
            open.dec();
            return;
        }
        Err(refused) => refused,
    };
    count_refusal(&node, label, peer, &refused);
    let body = error_body(&refused);
    let status = StatusCode::from_u16(refused.status).unwrap_or(StatusCode::BAD_REQUEST);
    let retry = match refused.status {
        503 => "Retry-After: 1\r\n",
        _ => "",
    };
    let auth = match refused.status {
        401 => "WWW-Authenticate: Bearer\r\n",
        _ => "",
    };
    let response = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{retry}{auth}Connection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
    );
    let write_timeout = node.config.websocket.write_timeout;
    let _ = tokio::time::timeout(write_timeout, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

/// A stream opened: counted, and its gauge (to decrease when it ends).
fn opened(node: &Node, label: &str) -> prometheus::IntGauge {
    let metrics = &node.metrics.streams;
    metrics.opened.with_label_values(&[label]).inc();
    let open = metrics.open.with_label_values(&[label]);
    open.inc();
    open
}

fn count_refusal(node: &Node, label: &str, peer: SocketAddr, refused: &Refused) {
    node.metrics
        .streams
        .refused
        .with_label_values(&[label, refused.reason])
        .inc();
    tracing::debug!(%peer, transport = label, reason = refused.reason, message = %refused.message, "stream refused");
    if warn_now() {
        tracing::warn!(
            transport = label,
            reason = refused.reason,
            "stream requests refused (one line a second at most; herald_streams_refused_total counts them all)"
        );
    }
}

fn error_body(refused: &Refused) -> String {
    serde_json::json!({"error": {"code": refused.code, "message": refused.message}}).to_string()
}

/// Reads and checks the request, takes its connection slot, and writes the
/// response's head: what is left is the session's.
async fn open(
    stream: &mut TcpStream,
    peer: SocketAddr,
    node: &Arc<Node>,
    format: Format,
) -> Result<(crate::admission::Admission, Opening), Refused> {
    let ws = &node.config.websocket;
    let mut head = request::read_head(stream, ws.handshake_timeout).await?;
    if format == Format::Ndjson {
        request::read_body(
            stream,
            &mut head,
            ws.max_message_bytes,
            ws.handshake_timeout,
        )
        .await?;
    }
    let (admission, opening) = check(&head, peer, node, format).await?;
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nCache-Control: no-cache, no-transform\r\nX-Accel-Buffering: no\r\n{}Connection: close\r\n\r\n",
        content_type(format),
        cors(ws, head.headers.get(ORIGIN)),
    );
    let written =
        tokio::time::timeout(ws.write_timeout, stream.write_all(response.as_bytes())).await;
    if !matches!(written, Ok(Ok(()))) {
        // Nobody to answer: the slot goes with the connection.
        return Err(Refused::new(
            400,
            "malformed",
            "timeout",
            "the response could not be written",
        ));
    }
    Ok((admission, opening))
}

fn content_type(format: Format) -> &'static str {
    match format {
        Format::Sse => "text/event-stream; charset=utf-8",
        _ => "application/x-ndjson",
    }
}

/// Checks a stream request read whole (auth, origin, limits) and takes its
/// connection slot.
async fn check(
    head: &Head,
    peer: SocketAddr,
    node: &Arc<Node>,
    format: Format,
) -> Result<(crate::admission::Admission, Opening), Refused> {
    let config = &node.config;
    let ws = &config.websocket;
    if node.is_draining() {
        return Err(Refused::new(503, "unavailable", "draining", "draining"));
    }
    if let Some(why) = node.not_ready() {
        return Err(Refused::new(
            503,
            "unavailable",
            "not_ready",
            format!("not ready: {why}"),
        ));
    }
    if !ws.allows_origin(head.headers.get(ORIGIN).map(HeaderValue::as_bytes)) {
        return Err(Refused::new(
            403,
            "forbidden",
            "origin",
            "origin not allowed",
        ));
    }
    let ip = listener::client_ip(peer, &head.headers, &config.http.trusted_proxies);
    let (token, mut opening) = match format {
        Format::Sse => sse_opening(head, node)?,
        _ => ndjson_opening(head)?,
    };
    // Verified before the response begins, so that a bad token is a 401
    // (an `EventSource` stops on it rather than retrying forever).
    let pod = &node.pod;
    match (&pod.verifier, token) {
        (None, _) => {}
        (Some(verifier), Some(token)) => {
            let verified = verifier
                .verify(&token)
                .await
                .and_then(|c| c.check_info(config.presence.max_info_bytes).map(|()| c));
            match verified {
                Ok(claims) => opening.claims = Some(claims),
                Err(refused) => {
                    pod.metrics.auth_failed(refused.reason());
                    let code = if refused.is_expired() {
                        "token_expired"
                    } else {
                        "unauthorized"
                    };
                    return Err(Refused::new(401, code, "unauthorized", refused.to_string()));
                }
            }
        }
        (Some(_), None) if pod.hooks.connects() => opening.by_proxy = true,
        (Some(_), None) if config.auth.allow_anonymous => {}
        (Some(_), None) => {
            pod.metrics.auth_failed("missing");
            return Err(Refused::new(
                401,
                "unauthorized",
                "unauthorized",
                "a token is required",
            ));
        }
    }
    if opening.by_proxy {
        opening.handshake = Handshake::capture(&pod.hooks, &head.headers, ip);
    }
    let admission = node.slots.admit(ip).map_err(|refusal| match refusal {
        Refusal::AtCapacity => Refused::new(503, "unavailable", "at_capacity", "at capacity"),
        Refusal::PerIp => Refused::new(
            503,
            "unavailable",
            "per_ip",
            "too many connections from your address",
        ),
    })?;
    Ok((admission, opening))
}

/// An SSE request's topics and token.
fn sse_opening(head: &Head, node: &Node) -> Result<(Option<String>, Opening), Refused> {
    if head.method != "GET" {
        return Err(Refused::new(405, "malformed", "malformed", "GET /sse"));
    }
    let last_event_id = match head.headers.get("last-event-id") {
        Some(v) => Some(v.to_str().map_err(|_| {
            Refused::new(400, "malformed", "malformed", "Last-Event-ID is not text")
        })?),
        None => None,
    };
    let streams = &node.config.streams;
    let SseQuery { topics, token } = request::sse_query(
        &head.query,
        last_event_id,
        &node.pod.namespaces,
        streams.max_topics,
    )?;
    let token = request::sse_token(&head.headers, token, &streams.token_cookie);
    Ok((
        token,
        Opening {
            format: Format::Sse,
            claims: None,
            by_proxy: false,
            data: None,
            resume: None,
            topics,
            handshake: None,
        },
    ))
}

/// A `POST /stream`'s `hello`.
fn ndjson_opening(head: &Head) -> Result<(Option<String>, Opening), Refused> {
    let malformed = |m: &str| Refused::new(400, "malformed", "malformed", m.to_owned());
    let body = std::str::from_utf8(&head.body).map_err(|_| malformed("the body is not UTF-8"))?;
    let (token, resume, data) = match Command::decode(body) {
        Ok(Command::Hello {
            token,
            resume,
            data,
        }) => (
            token.map(|t| t.into_owned()),
            resume.map(|r| r.into_owned()),
            data.map(|d| d.to_owned()),
        ),
        Ok(_) => return Err(malformed("the body must be a `hello`")),
        Err(e) => return Err(malformed(&e.message)),
    };
    let token = request::bearer(&head.headers).or(token);
    Ok((
        token,
        Opening {
            format: Format::Ndjson,
            claims: None,
            by_proxy: false,
            data,
            resume,
            topics: Vec::new(),
            handshake: None,
        },
    ))
}

/// The CORS headers of a stream's response to a page of `origin` (checked
/// against `websocket.allowed_origins` already): a browser reads a
/// cross-origin `EventSource` or `fetch` only with them. Credentials (the
/// token in a cookie, `withCredentials`) only for an origin the list names:
/// with any origin allowed, any site could otherwise read a signed-in
/// user's stream ([`crate::config::WebSocketConfig::names_origin`]).
fn cors(ws: &WebSocketConfig, origin: Option<&HeaderValue>) -> String {
    let Some(value) = origin.and_then(|o| o.to_str().ok()) else {
        return String::new();
    };
    if value.contains(['\r', '\n']) {
        return String::new();
    }
    let credentials = if ws.names_origin(origin.map(HeaderValue::as_bytes)) {
        "Access-Control-Allow-Credentials: true\r\n"
    } else {
        ""
    };
    format!("Access-Control-Allow-Origin: {value}\r\n{credentials}Vary: Origin\r\n")
}

/// A browser's preflight of `POST /stream` (its JSON body and its
/// `Authorization` make it one) or of `GET /sse` with a header: allowed
/// from the origins `/ws` allows.
pub fn preflight(node: &Node, origin: Option<&HeaderValue>, stream: bool) -> Response<Body> {
    let ws = &node.config.websocket;
    if !ws.allows_origin(origin.map(HeaderValue::as_bytes)) {
        return http::text(StatusCode::FORBIDDEN, "origin not allowed\n");
    }
    let mut response = http::text(StatusCode::NO_CONTENT, "");
    let headers = response.headers_mut();
    http::allow_origin(ws, origin, headers);
    headers.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("GET, POST"),
    );
    headers.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("authorization, content-type, last-event-id"),
    );
    headers.insert("access-control-max-age", HeaderValue::from_static("600"));
    // A stream's (`stream`; not a command post's): the request it clears
    // comes next, on this connection if it stays open, and hyper would
    // serve it through its body ([`serve_hyper`]). Closed, the stream gets a
    // new connection at once, and the raw socket's direct writes.
    if stream {
        headers.insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A stream's answer on a connection hyper serves: an error's whole body,
/// or the stream's, read from the pipe its session writes.
pub type Reply = Either<Body, Piped>;

/// A stream's body through hyper: what its session writes into the pipe.
pub type Piped = StreamBody<Map<ReaderStream<DuplexStream>, fn(io::Result<Bytes>) -> Chunk>>;

type Chunk = io::Result<Frame<Bytes>>;

/// The pipe between a session and hyper: room for a few events; a slow
/// client fills the stream's bounded queue behind it, as a socket would.
const PIPE_BYTES: usize = 64 * 1024;

/// Serves a stream request that hyper read (one that came on a kept-alive
/// connection after another request: reverse proxies and browsers reuse
/// connections, so this is common behind an ingress). The same checks and
/// session as [`serve`]'s; its frames go through hyper's body rather than
/// straight to the socket, which costs a wake-up per write but keeps the
/// connection's other requests working.
pub async fn serve_hyper(
    req: Request<Incoming>,
    node: &Arc<Node>,
    peer: SocketAddr,
    format: Format,
) -> Response<Reply> {
    let label = transport(format);
    let ws = &node.config.websocket;
    let origin = req.headers().get(ORIGIN).cloned();
    let checked = match hyper_head(req, format, ws).await {
        Ok(head) => check(&head, peer, node, format).await,
        Err(refused) => Err(refused),
    };
    let (admission, opening) = match checked {
        Ok(opened) => opened,
        Err(refused) => {
            count_refusal(node, label, peer, &refused);
            let status = StatusCode::from_u16(refused.status).unwrap_or(StatusCode::BAD_REQUEST);
            let mut response =
                Response::new(Either::Left(Body::new(Bytes::from(error_body(&refused)))));
            *response.status_mut() = status;
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            match refused.status {
                503 => drop(headers.insert(RETRY_AFTER, HeaderValue::from_static("1"))),
                401 => drop(headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))),
                _ => {}
            }
            return response;
        }
    };
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    let gauge = opened(node, label);
    let session = session::serve_piped(ours, node.pod.clone(), admission, opening);
    node.tasks.spawn(async move {
        session.await;
        gauge.dec();
    });
    let chunks = ReaderStream::new(theirs).map(frame as fn(io::Result<Bytes>) -> Chunk);
    let mut response = Response::new(Either::Right(StreamBody::new(chunks)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type(format)));
    headers.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    http::allow_origin(ws, origin.as_ref(), headers);
    response
}

fn frame(chunk: io::Result<Bytes>) -> Chunk {
    chunk.map(Frame::data)
}

/// A hyper request as [`check`] reads it: its head, and an HTTP-streaming
/// request's body (bounded, within the handshake's time).
async fn hyper_head(
    req: Request<Incoming>,
    format: Format,
    ws: &WebSocketConfig,
) -> Result<Head, Refused> {
    let (parts, body) = req.into_parts();
    let mut head = Head {
        method: parts.method.as_str().to_owned(),
        query: parts.uri.query().unwrap_or("").to_owned(),
        headers: parts.headers,
        body: BytesMut::new(),
    };
    if format == Format::Ndjson {
        let limit = ws.max_message_bytes;
        let read = http::read_body(&head.headers, body, limit);
        match tokio::time::timeout(ws.handshake_timeout, read).await {
            Ok(Ok(body)) => head.body = BytesMut::from(&body[..]),
            Ok(Err(BodyError::TooLarge)) => {
                return Err(Refused::new(
                    413,
                    "too_large",
                    "too_large",
                    format!("the body is over {limit} bytes"),
                ));
            }
            Ok(Err(BodyError::Broken(_))) => {
                return Err(Refused::new(
                    400,
                    "malformed",
                    "malformed",
                    "the body ended early",
                ));
            }
            Err(_) => {
                return Err(Refused::new(
                    408,
                    "timeout",
                    "timeout",
                    "the body took too long",
                ));
            }
        }
    }
    Ok(head)
}
