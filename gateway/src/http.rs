//! The HTTP edge of the backend API: `POST /v1/publish` and `POST
//! /v1/publish/batch` (the `publisher` module: JSON or, for one publish,
//! `application/octet-stream`), `POST /v1/disconnect`, `GET /v1/history`,
//! `POST /v1/subscribe`, `POST /v1/unsubscribe`, `GET /v1/presence`, `GET
//! /v1/presence/stats`, `GET /v1/admin/status`, `GET /metrics`, and the
//! plain answers every route shares.
//! The checks and errors are [`crate::publish`]'s and [`crate::history`]'s.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_ORIGIN, AUTHORIZATION, CONTENT_LENGTH,
    CONTENT_TYPE, HeaderMap, HeaderValue, VARY, WWW_AUTHENTICATE,
};
use hyper::{Request, Response, StatusCode};
use proto::ErrorCode;
use proto::json::{DisconnectRequest, HistoryResponse, PresencePage, SubscriptionRequest};
use serde::Serialize;

use crate::admin::Status;
use crate::config::WebSocketConfig;
use crate::history::{self, HistoryError};
use crate::node::Node;
use crate::publish::{self, ApiError, Refusal};

mod publisher;

pub use publisher::{IDEMPOTENCY_KEY, publish, publish_batch};

pub type Body = Full<Bytes>;

/// The HTTP status a refusal is answered with.
pub fn status(e: &ApiError) -> StatusCode {
    match e.refusal {
        Refusal::Invalid => StatusCode::BAD_REQUEST,
        Refusal::Unauthenticated => StatusCode::UNAUTHORIZED,
        Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Refusal::UnsupportedType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Refusal::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Refusal::Gone => StatusCode::GONE,
        Refusal::Precondition => StatusCode::BAD_REQUEST,
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: ErrorCode,
    message: &'a str,
}

/// `POST /v1/disconnect` with `{"user":"alice"}`: `{}`, or 400, 401, 503
/// with an error body.
pub async fn disconnect(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let answer = async {
        authorize(&req, node)?;
        let body = body(req, node.config.http.max_body_bytes).await?;
        let request =
            DisconnectRequest::decode(&body).map_err(|e| ApiError::invalid(e.code, e.message))?;
        publish::disconnect_user(
            &*node.sessions,
            node.config.session.resume_window,
            &request.user,
        )
        .await
    };
    match answer.await {
        Ok(()) => json(StatusCode::OK, &serde_json::json!({})),
        Err(e) => refused(&e),
    }
}

/// `GET /v1/history?topic=news&since=40&epoch=9f3c&limit=50&reverse=true`
/// (all but `topic` optional): `{"topic","epoch","seq","publications"}`, a
/// page of the topic's history ([`crate::history`]); 410 with `{"code":
/// "history_lost","message","epoch","seq"}` (the topic's position) when
/// `since` is out of the window; or 400, 401, 503 with an error body.
pub async fn history(req: &Request<Incoming>, node: &Node) -> Response<Body> {
    if let Err(e) = authorize(req, node) {
        return refused(&e);
    }
    let asked = query(req).and_then(|pairs| {
        let (topic, query) = history_query(&pairs)?;
        Ok((publish::topic(topic)?, query))
    });
    let (topic, query) = match asked {
        Ok(asked) => asked,
        Err(e) => {
            history::refused(&node.metrics);
            return refused(&e);
        }
    };
    let read = history::read(&*node.broker, &node.config, &node.metrics, &topic, query).await;
    let page = match read {
        Ok(page) => page,
        Err(HistoryError::Lost { position, .. }) => {
            let e = HistoryError::Lost {
                topic: topic.clone(),
                position: position.clone(),
            };
            let body = serde_json::json!({
                "code": e.code(),
                "message": e.to_string(),
                "epoch": &*position.epoch,
                "seq": position.seq,
            });
            return json(StatusCode::GONE, &body);
        }
        Err(e) => return refused(&e.to_api()),
    };
    match page.items() {
        Ok(items) => json(
            StatusCode::OK,
            &HistoryResponse {
                topic: topic.as_str(),
                epoch: &page.position.epoch,
                seq: page.position.seq,
                publications: &items,
            },
        ),
        Err(e) => refused(&e.to_api()),
    }
}

/// The parameters of `GET /v1/history`: the topic's name, and the query.
fn history_query(pairs: &[(String, String)]) -> Result<(&str, history::Query), ApiError> {
    fn number(pairs: &[(String, String)], key: &str) -> Result<Option<u64>, ApiError> {
        param(pairs, key)
            .map(|value| {
                value.parse().map_err(|_| {
                    ApiError::invalid(
                        ErrorCode::Malformed,
                        format!("`{key}` is not valid: `{value}`"),
                    )
                })
            })
            .transpose()
    }
    let reverse = match param(pairs, "reverse") {
        None | Some("false" | "0") => false,
        Some("true" | "1") => true,
        Some(value) => {
            return Err(ApiError::invalid(
                ErrorCode::Malformed,
                format!("`reverse` is not valid: `{value}`"),
            ));
        }
    };
    let asked = history::Query {
        since: number(pairs, "since")?,
        epoch: param(pairs, "epoch").map(str::to_owned),
        limit: number(pairs, "limit")?,
        reverse,
    };
    Ok((required(pairs, "topic")?, asked))
}

/// `POST /v1/subscribe` with `{"user":"alice","topic":"news","since":40?,
/// "epoch":"9f3c"?}`, or `POST /v1/unsubscribe` with `{"user":"alice",
/// "topic":"news"}`: `{}` once every pod was told (also when the user has
/// no connection), or 400, 401, 503 with an error body.
pub async fn subscription(req: Request<Incoming>, node: &Node, subscribe: bool) -> Response<Body> {
    let answer = async {
        authorize(&req, node)?;
        let body = body(req, node.config.http.max_body_bytes).await?;
        let request = SubscriptionRequest::decode(&body);
        let request = request.map_err(|e| ApiError::invalid(e.code, e.message));
        let request = match request {
            Ok(request) => request,
            Err(e) => {
                let name = if subscribe {
                    "subscribe"
                } else {
                    "unsubscribe"
                };
                node.metrics
                    .server_subscriptions
                    .with_label_values(&[name, "refused"])
                    .inc();
                return Err(e);
            }
        };
        let asked = publish::Subscription {
            user: request.user,
            topic: request.topic,
            subscribe,
            since: request.since,
            epoch: request.epoch,
        };
        publish::subscription(&*node.broker, &node.metrics, asked).await
    };
    match answer.await {
        Ok(()) => json(StatusCode::OK, &serde_json::json!({})),
        Err(e) => refused(&e),
    }
}

/// The query parameters of a GET: each once at most (a repeated one is
/// refused, not guessed at); unknown ones are ignored, as a JSON body's
/// unknown keys are.
fn query(req: &Request<Incoming>) -> Result<Vec<(String, String)>, ApiError> {
    let pairs: Vec<(String, String)> =
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    for (i, (key, _)) in pairs.iter().enumerate() {
        if pairs[..i].iter().any(|(k, _)| k == key) {
            return Err(ApiError::invalid(
                ErrorCode::Malformed,
                format!("`{key}` is given more than once"),
            ));
        }
    }
    Ok(pairs)
}

fn param<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn required<'a>(pairs: &'a [(String, String)], key: &str) -> Result<&'a str, ApiError> {
    param(pairs, key)
        .ok_or_else(|| ApiError::invalid(ErrorCode::MissingField, format!("`{key}` is required")))
}

/// `GET /v1/presence?topic=&cursor=&limit=`: a page of the topic's
/// presence, as the client's `ok` has it without `op` and `id`; or 400
/// (`disabled` where the namespace keeps no presence), 401, 503.
pub async fn presence(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let answer = async {
        authorize(&req, node)?;
        let pairs = query(&req)?;
        let limit = param(&pairs, "limit")
            .map(|l| {
                l.parse::<u64>().map_err(|_| {
                    ApiError::invalid(ErrorCode::Malformed, "`limit` must be a whole number")
                })
            })
            .transpose()?;
        let (topic, page) = publish::presence_page(
            &node.presence,
            &node.pod.namespaces,
            required(&pairs, "topic")?,
            param(&pairs, "cursor"),
            limit,
        )
        .await?;
        let members = page.json_members();
        let body = PresencePage {
            topic: topic.as_str(),
            position: page.counts.position,
            users: page.counts.users,
            connections: page.counts.connections,
            members: &members,
            cursor: page.cursor.as_deref(),
        };
        Ok(json(StatusCode::OK, &body))
    };
    answer.await.unwrap_or_else(|e| refused(&e))
}

/// `GET /v1/presence/stats?topic=`: `{"topic","position","users",
/// "connections"}`, without reading the members; or 400, 401, 503.
pub async fn presence_stats(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let answer = async {
        authorize(&req, node)?;
        let pairs = query(&req)?;
        let topic = required(&pairs, "topic")?;
        publish::presence_stats(&node.presence, &node.pod.namespaces, topic).await
    };
    match answer.await {
        Ok(stats) => json(StatusCode::OK, &stats),
        Err(e) => refused(&e),
    }
}

/// Checks the request's API key (`http.api_keys`).
fn authorize(req: &Request<Incoming>, node: &Node) -> Result<(), ApiError> {
    let authorization = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|h| h.to_str().ok());
    publish::authorize(&node.api_keys.current(), authorization)
}

/// The answer to a refused request.
fn refused(e: &ApiError) -> Response<Body> {
    let mut response = json(
        status(e),
        &ErrorBody {
            code: e.code,
            message: &e.message,
        },
    );
    if e.refusal == Refusal::Unauthenticated {
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// A request's body, at most `limit` bytes.
async fn body(req: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    let (parts, body) = req.into_parts();
    read_body(&parts.headers, body, limit)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge => ApiError::new(
                Refusal::TooLarge,
                ErrorCode::Malformed,
                format!("the body is limited to {limit} bytes"),
            ),
            BodyError::Broken(why) => ApiError::invalid(ErrorCode::Malformed, why),
        })
}

/// Why a request's body was not read whole.
pub enum BodyError {
    /// It declared, or brought, more than the limit.
    TooLarge,
    /// The connection failed under it (the error, for the answer).
    Broken(String),
}

/// A request's body (`headers` are its request's), at most `limit` bytes:
/// one whose `Content-Length` says more is refused before a byte of it is
/// read, any other as it passes the limit. Every body the gateway reads
/// comes through here: the API's, the command posts', a stream's `hello`.
pub async fn read_body(
    headers: &HeaderMap,
    body: Incoming,
    limit: usize,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(BodyError::TooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge),
        Err(e) => Err(BodyError::Broken(e.to_string())),
    }
}

/// Lets a page of `origin` read an answer where `/ws` would let it connect
/// (`websocket.allowed_origins`; empty: any), and with credentials (the
/// cookies a token or the connect proxy may be read from) only where that
/// list names it: with any origin allowed them, any site could read a
/// signed-in user's stream. The streams' answers, their preflights and the
/// command posts' all carry these.
pub fn allow_origin(ws: &WebSocketConfig, origin: Option<&HeaderValue>, headers: &mut HeaderMap) {
    let Some(origin) = origin else { return };
    if !ws.allows_origin(Some(origin.as_bytes())) {
        return;
    }
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    if ws.names_origin(Some(origin.as_bytes())) {
        headers.insert(
            ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
    headers.append(VARY, HeaderValue::from_static("Origin"));
}

/// `GET /v1/admin/status`: the pod's [`Status`], with an API key like
/// every `/v1` route; 401 without one.
pub fn admin_status(req: &Request<Incoming>, node: &Node) -> Response<Body> {
    match authorize(req, node) {
        Ok(()) => json(StatusCode::OK, &Status::of(node)),
        Err(e) => refused(&e),
    }
}

/// `GET /metrics`.
pub fn metrics(node: &Node) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(node.metrics.render())));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

pub fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
