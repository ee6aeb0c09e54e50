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
//! unchanged. A stream request that reaches hyper anyway (the second
//! request of a kept-alive connection) is redirected to itself (`307`,
//! `Connection: close`), so the client comes back on a fresh connection.
//!
//! Refusals come before the response begins, as HTTP statuses with a JSON
//! body `{"error":{"code":…,"message":…}}`, each counted
//! (`herald_streams_refused_total{transport,reason}`) and logged at debug.

mod request;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderValue, LOCATION, ORIGIN};
use hyper::{Response, StatusCode};
use proto::Command;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::admission::Refusal;
use crate::frame::Format;
use crate::http::{self, Body};
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
            let metrics = &node.metrics.streams;
            metrics.opened.with_label_values(&[label]).inc();
            let open = metrics.open.with_label_values(&[label]);
            open.inc();
            session::serve_stream(stream, node.pod.clone(), admission, opening).await;
            open.dec();
            return;
        }
        Err(refused) => refused,
    };
    node.metrics
        .streams
        .refused
        .with_label_values(&[label, refused.reason])
        .inc();
    tracing::debug!(%peer, transport = label, reason = refused.reason, message = %refused.message, "stream refused");
    let body = serde_json::json!({"error": {"code": refused.code, "message": refused.message}});
    let body = body.to_string();
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

/// Reads and checks the request, takes its connection slot, and writes the
/// response's head: what is left is the session's.
async fn open(
    stream: &mut TcpStream,
    peer: SocketAddr,
    node: &Arc<Node>,
    format: Format,
) -> Result<(crate::admission::Admission, Opening), Refused> {
    let config = &node.config;
    let ws = &config.websocket;
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
    if !origin_allowed(&ws.allowed_origins, head.headers.get(ORIGIN)) {
        return Err(Refused::new(
            403,
            "forbidden",
            "origin",
            "origin not allowed",
        ));
    }
    let ip = listener::client_ip(peer, &head.headers, &config.http.trusted_proxies);
    let (token, mut opening) = match format {
        Format::Sse => sse_opening(&head, node)?,
        _ => ndjson_opening(&head)?,
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
    let content_type = match format {
        Format::Sse => "text/event-stream; charset=utf-8",
        _ => "application/x-ndjson",
    };
    let cors = cors(head.headers.get(ORIGIN));
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nCache-Control: no-cache, no-transform\r\nX-Accel-Buffering: no\r\n{cors}Connection: close\r\n\r\n"
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
/// cross-origin `EventSource` or `fetch` only with them. Credentials too:
/// the token may travel in a cookie (`withCredentials`).
fn cors(origin: Option<&HeaderValue>) -> String {
    match origin.and_then(|o| o.to_str().ok()) {
        Some(origin) if !origin.contains(['\r', '\n']) => format!(
            "Access-Control-Allow-Origin: {origin}\r\nAccess-Control-Allow-Credentials: true\r\nVary: Origin\r\n"
        ),
        _ => String::new(),
    }
}

/// A browser's preflight of `POST /stream` (its JSON body and its
/// `Authorization` make it one) or of `GET /sse` with a header: allowed
/// from the origins `/ws` allows.
pub fn preflight(node: &Node, origin: Option<&HeaderValue>) -> Response<Body> {
    if !origin_allowed(&node.config.websocket.allowed_origins, origin) {
        return http::text(StatusCode::FORBIDDEN, "origin not allowed\n");
    }
    let mut response = http::text(StatusCode::NO_CONTENT, "");
    let headers = response.headers_mut();
    if let Some(origin) = origin {
        headers.insert("access-control-allow-origin", origin.clone());
        headers.insert(
            "access-control-allow-credentials",
            HeaderValue::from_static("true"),
        );
        headers.insert("vary", HeaderValue::from_static("Origin"));
    }
    headers.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("GET, POST"),
    );
    headers.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("authorization, content-type, last-event-id"),
    );
    headers.insert("access-control-max-age", HeaderValue::from_static("600"));
    response
}

fn origin_allowed(allowed: &[String], origin: Option<&HeaderValue>) -> bool {
    if allowed.is_empty() {
        return true;
    }
    origin
        .and_then(|o| o.to_str().ok())
        .is_some_and(|o| allowed.iter().any(|a| a.eq_ignore_ascii_case(o)))
}

/// A stream request hyper got (not the first of its connection): sent back
/// to itself on a fresh connection.
pub fn redirect(uri: &hyper::Uri) -> Response<Body> {
    let mut response = http::text(
        StatusCode::TEMPORARY_REDIRECT,
        "open streams on a new connection\n",
    );
    let target = uri.path_and_query().map_or("/", |pq| pq.as_str());
    if let Ok(location) = HeaderValue::from_str(target) {
        response.headers_mut().insert(LOCATION, location);
    }
    response
        .headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    response
}
