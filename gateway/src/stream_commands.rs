//! HTTP-streaming's commands (issue #25): `POST /stream/<session>` with one
//! command, or several newline-delimited, JSON as over the WebSocket. Any
//! pod takes them: this one checks who posts them (the stream's own
//! authentication: a token's user must be the session's, an anonymous
//! session's poster has none, the connect proxy is asked again where it is
//! configured) and whose the session is (this pod's [`session::Registry`]
//! when it holds the session, else the [`router::SessionStore`]), then
//! queues them on the live session ([`session::Registry::post`]) or hands
//! them to the broker for the pod that holds it ([`router::Broker::forward`]).
//! The replies come on the session's stream, in order: the answer here says
//! only that the commands were accepted for the session.
//!
//! A session that does not exist and one of another user's get the same
//! answer (`404 unknown_session`): nothing tells them apart.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, HeaderValue, ORIGIN, RETRY_AFTER, WWW_AUTHENTICATE,
};
use hyper::{Request, Response, StatusCode};
use proto::Command;
use router::{Causes, Forward, Whose};

use crate::hooks::HookError;
use crate::http::{self, Body, BodyError};
use crate::listener;
use crate::node::Node;
use crate::session::{self, Post};

/// Commands in one POST, at most.
pub const MAX_COMMANDS_PER_POST: usize = 64;

/// How many times the store is asked for a session no pod has saved yet:
/// a session started on another pod is stored by that pod's next flush
/// (`session.flush_interval`), so a POST that follows its `welcome` at once
/// may come before it. Asked again one interval later, twice at most.
const STORE_READS: u32 = 3;

/// Why a POST was refused: its status and its `error` body.
#[derive(Debug)]
struct Refused {
    status: StatusCode,
    /// `error.code`, and the `result` it is counted as.
    code: &'static str,
    message: String,
}

impl Refused {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// One answer for a session that does not exist and one that is
    /// another user's.
    fn unknown_session() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            "no such session, or not yours",
        )
    }

    fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed", message)
    }

    fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }
}

/// `POST /stream/<session>`: `202 {"accepted":<commands>}`, or 400, 401,
/// 403, 404, 408, 413, 429, 503 with `{"error":{"code","message"}}`;
/// counted (`herald_stream_commands_total{result}`) and logged at debug.
pub async fn post(req: Request<Incoming>, node: &Node, peer: SocketAddr) -> Response<Body> {
    let origin = req.headers().get(ORIGIN).cloned();
    let timeout = node.config.http.request_timeout;
    let answer = match tokio::time::timeout(timeout, accept(req, node, peer)).await {
        Ok(answer) => answer,
        Err(_) => Err(Refused::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!("the request took longer than {timeout:?} (http.request_timeout)"),
        )),
    };
    let result = match &answer {
        Ok(_) => "accepted",
        Err(refused) => refused.code,
    };
    node.metrics
        .stream_commands
        .posts
        .with_label_values(&[result])
        .inc();
    let mut response = match answer {
        Ok(accepted) => {
            tracing::debug!(commands = accepted, "commands posted for a session");
            json(
                StatusCode::ACCEPTED,
                &serde_json::json!({ "accepted": accepted }),
            )
        }
        Err(refused) => {
            // (No session id in the log: it is what resumes the session.)
            tracing::debug!(code = refused.code, message = %refused.message, "a command POST refused");
            error(&refused)
        }
    };
    http::allow_origin(
        &node.config.websocket,
        origin.as_ref(),
        response.headers_mut(),
    );
    response
}

/// Checks a POST and hands its commands on; how many.
async fn accept(req: Request<Incoming>, node: &Node, peer: SocketAddr) -> Result<usize, Refused> {
    if node.is_draining() {
        return Err(Refused::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "this pod is draining: post to another",
        ));
    }
    if let Some(why) = node.not_ready() {
        return Err(Refused::unavailable(format!("not ready: {why}")));
    }
    if let Some(origin) = req.headers().get(ORIGIN)
        && !node.config.websocket.allows_origin(Some(origin.as_bytes()))
    {
        return Err(Refused::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "origin not allowed",
        ));
    }
    let id = session_of(req.uri().path()).ok_or_else(Refused::unknown_session)?;
    let id: Arc<str> = Arc::from(id);
    let user = who(&req, node, peer).await?;
    let limit = node.config.websocket.max_message_bytes;
    let body = body(req, limit).await?;
    let commands = commands(&body)?;
    let whose = whose(node, &id).await?;
    if !whose.belongs(user.as_deref()) {
        return Err(Refused::unknown_session());
    }
    let count = commands.len();
    let max_bytes = session::max_posted_bytes(limit);
    match node.live.post(&id, user.as_deref(), &commands, max_bytes) {
        Post::Queued => return Ok(count),
        Post::Full => {
            return Err(Refused::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "the session has too many commands waiting (at most {})",
                    session::MAX_POSTED_COMMANDS
                ),
            ));
        }
        Post::OtherUser => return Err(Refused::unknown_session()),
        // Another pod's, or it left this one since: the broker finds it.
        Post::NotHere => {}
    }
    let forward = Forward {
        session: format!("{:032x}", session::session_key(&id)),
        user: user.map(|u| u.to_string()),
        commands,
    };
    let forwarded = node.broker.forward(forward).await;
    let result = if forwarded.is_ok() { "sent" } else { "failed" };
    node.metrics
        .stream_commands
        .forwarded
        .with_label_values(&[result])
        .inc();
    match forwarded {
        Ok(()) => Ok(count),
        Err(e) => {
            tracing::warn!(error = %Causes(&e), "commands not forwarded: the broker is unavailable");
            Err(Refused::unavailable("the broker is unavailable"))
        }
    }
}

/// The session id of a `/stream/<session>` path, if it looks like one (a
/// session id is 32 hex digits; a longer one, or other characters, cannot
/// be one).
fn session_of(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/stream/")?;
    let fits = !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric());
    fits.then_some(id)
}

/// Who posts: a verified token's user, the connect proxy's, or `None`
/// (anonymous) where that is allowed, as a `hello` would be let in.
async fn who(
    req: &Request<Incoming>,
    node: &Node,
    peer: SocketAddr,
) -> Result<Option<Arc<str>>, Refused> {
    let pod = &node.pod;
    let Some(verifier) = &pod.verifier else {
        // Open mode: every session is anonymous.
        return Ok(None);
    };
    let token = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .map(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
                .ok_or_else(|| Refused::unauthorized("Authorization must be `Bearer <token>`"))
        })
        .transpose()?;
    if let Some(token) = token {
        return match verifier.verify(token.trim()).await {
            Ok(claims) => Ok(Some(claims.user)),
            Err(refused) => {
                node.metrics.auth_failed(refused.reason());
                Err(Refused::unauthorized(refused.to_string()))
            }
        };
    }
    if pod.hooks.connects() {
        let ip = listener::client_ip(peer, req.headers(), &node.config.http.trusted_proxies);
        let Some(handshake) = session::Handshake::capture(&pod.hooks, req.headers(), ip) else {
            return Err(Refused::unavailable("the connect proxy is not configured"));
        };
        // Not a connection: the backend is told client 0.
        return match pod.hooks.connect(&handshake.connect_request(0)).await {
            Ok(claims) if !claims.user.is_empty() => Ok(Some(claims.user)),
            Ok(_) if node.config.auth.allow_anonymous => Ok(None),
            Ok(_) => Err(Refused::unauthorized(
                "the backend named no user, and anonymous clients are not let in",
            )),
            Err(HookError::Unauthorized(m)) => Err(Refused::unauthorized(m)),
            Err(HookError::Forbidden(m) | HookError::Refused { message: m, .. }) => {
                Err(Refused::new(StatusCode::FORBIDDEN, "forbidden", m))
            }
            Err(HookError::Unavailable(failure)) => Err(Refused::unavailable(format!(
                "the backend is unavailable ({failure})"
            ))),
        };
    }
    if node.config.auth.allow_anonymous {
        return Ok(None);
    }
    node.metrics.auth_failed("missing");
    Err(Refused::unauthorized("a token is required"))
}

/// The body, at most `limit` bytes.
async fn body(req: Request<Incoming>, limit: usize) -> Result<Bytes, Refused> {
    let (parts, body) = req.into_parts();
    http::read_body(&parts.headers, body, limit)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge => Refused::too_large(format!(
                "the body is limited to {limit} bytes (websocket.max_message_bytes)"
            )),
            BodyError::Broken(why) => {
                Refused::malformed(format!("the body could not be read: {why}"))
            }
        })
}

/// The body's commands, a line each (blank lines skipped), each one a
/// command the session may be sent: checked here, so that a POST is
/// refused whole rather than run in part.
fn commands(body: &Bytes) -> Result<Vec<Bytes>, Refused> {
    let text =
        std::str::from_utf8(body).map_err(|_| Refused::malformed("the body is not UTF-8"))?;
    let mut commands = Vec::new();
    for (n, line) in text.split('\n').enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if commands.len() == MAX_COMMANDS_PER_POST {
            return Err(Refused::too_large(format!(
                "at most {MAX_COMMANDS_PER_POST} commands per POST"
            )));
        }
        match Command::decode(line) {
            Ok(Command::Hello { .. }) => {
                return Err(Refused::malformed(format!(
                    "line {}: `hello` is not posted: it opens the stream (POST /stream)",
                    n + 1
                )));
            }
            Ok(_) => {}
            Err(e) => {
                return Err(Refused::malformed(format!("line {}: {}", n + 1, e.message)));
            }
        }
        // Its own bytes: the body's buffer is not kept whole for the
        // smallest command.
        commands.push(Bytes::copy_from_slice(line.as_bytes()));
    }
    if commands.is_empty() {
        return Err(Refused::malformed("no command in the body"));
    }
    Ok(commands)
}

/// Whose the session is: this pod's, if it holds it, or the store's.
async fn whose(node: &Node, id: &str) -> Result<Whose, Refused> {
    if let Some(whose) = node.live.whose(id) {
        return Ok(whose);
    }
    // Only a shared store has sessions of other pods, and saves them a
    // flush later than their `welcome`.
    let reads = if node.pod.flush_soon.is_some() {
        STORE_READS
    } else {
        1
    };
    for read in 1..=reads {
        match node.sessions.whose(id).await {
            Ok(Whose::Nobody) if read < reads => {
                tokio::time::sleep(node.config.session.flush_interval).await;
                if let Some(whose) = node.live.whose(id) {
                    return Ok(whose);
                }
            }
            Ok(whose) => return Ok(whose),
            Err(e) => {
                tracing::warn!(error = %Causes(&e), "a command POST's session not read: the store is unavailable");
                return Err(Refused::unavailable("the session store is unavailable"));
            }
        }
    }
    Ok(Whose::Nobody)
}

/// The answer to a refused POST.
fn error(refused: &Refused) -> Response<Body> {
    let mut response = json(
        refused.status,
        &serde_json::json!({ "error": { "code": refused.code, "message": refused.message } }),
    );
    let headers = response.headers_mut();
    match refused.status {
        StatusCode::UNAUTHORIZED => {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        _ => {}
    }
    response
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_is_read_from_its_path_and_nothing_else_is_one() {
        let id = "4f1c0a9e8d7b6c5a4f1c0a9e8d7b6c5a";
        assert_eq!(session_of(&format!("/stream/{id}")), Some(id));
        for path in [
            "/stream/",
            "/stream",
            "/stream/a/b",
            "/stream/a%20b",
            "/streams/x",
        ] {
            assert_eq!(session_of(path), None, "{path}");
        }
        assert_eq!(session_of(&format!("/stream/{}", "a".repeat(65))), None);
    }

    #[test]
    fn a_body_is_its_lines_commands_and_is_refused_whole() {
        let body = Bytes::from_static(
            b"{\"op\":\"sub\",\"id\":1,\"topic\":\"a\"}\r\n\n  {\"op\":\"ack\",\"topic\":\"a\",\"seq\":3}\n",
        );
        let parsed = commands(&body).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(parsed.len(), 2);
        assert_eq!(&parsed[1][..], br#"{"op":"ack","topic":"a","seq":3}"#);
        let refused = |body: &'static [u8]| {
            commands(&Bytes::from_static(body))
                .map_or_else(|e| (e.status, e.code, e.message), |_| panic!("accepted"))
        };
        let (status, code, message) = refused(b"{\"op\":\"ping\",\"id\":1}\n{\"op\":");
        assert_eq!((status, code), (StatusCode::BAD_REQUEST, "malformed"));
        assert!(message.starts_with("line 2:"), "{message}");
        let (_, code, message) = refused(b"{\"op\":\"hello\"}");
        assert_eq!(code, "malformed");
        assert!(message.contains("hello"), "{message}");
        assert_eq!(refused(b"\n \n").1, "malformed");
        assert_eq!(refused(b"\xff").1, "malformed");
        let many = "{\"op\":\"ping\",\"id\":1}\n".repeat(MAX_COMMANDS_PER_POST + 1);
        let many: &'static str = Box::leak(many.into_boxed_str());
        assert_eq!(refused(many.as_bytes()).0, StatusCode::PAYLOAD_TOO_LARGE);
    }
}
