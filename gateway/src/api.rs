//! The HTTP API: publish, disconnect, health, metrics; and what the backend
//! APIs, HTTP and gRPC ([`crate::grpc`]), share: authorization, the checks of
//! a publish, and their errors.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{
    AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, WWW_AUTHENTICATE,
};
use hyper::{Request, Response, StatusCode};
use proto::ErrorCode;
use proto::json::{DisconnectRequest, PublishRequest, PublishResponse};
use router::{BrokerError, Position, Topic};
use serde::Serialize;
use serde_json::value::RawValue;
use tracing::Instrument;

use crate::node::Node;
use crate::server::Body;
use crate::telemetry::{self, Api, Headers};

/// How a refused API request is answered, whichever protocol it came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// HTTP 400, gRPC `INVALID_ARGUMENT`.
    Invalid,
    /// HTTP 401, gRPC `UNAUTHENTICATED`.
    Unauthenticated,
    /// HTTP 413, gRPC `RESOURCE_EXHAUSTED`.
    TooLarge,
    /// HTTP 503, gRPC `UNAVAILABLE`: retry later.
    Unavailable,
}

/// A refused API request: how to answer it, and a code from the protocol's
/// error table with a message, for the HTTP error body or the gRPC status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub refusal: Refusal,
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(refusal: Refusal, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            refusal,
            code,
            message: message.into(),
        }
    }

    fn invalid(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(Refusal::Invalid, code, message)
    }

    /// The HTTP status this error is answered with.
    pub fn http_status(&self) -> StatusCode {
        match self.refusal {
            Refusal::Invalid => StatusCode::BAD_REQUEST,
            Refusal::Unauthenticated => StatusCode::UNAUTHORIZED,
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::UnknownNamespace(_) => {
                Self::invalid(ErrorCode::UnknownNamespace, e.to_string())
            }
            BrokerError::Unavailable(_) => {
                Self::new(Refusal::Unavailable, ErrorCode::Unavailable, e.to_string())
            }
        }
    }
}

/// The longest idempotency key, in bytes: a key names one publish, it is not
/// a payload, and the broker keeps it for [`router::IDEMPOTENCY_WINDOW`].
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 256;

/// The request header that carries an idempotency key (the body's
/// `idempotency_key` may carry it instead).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// A publication's data: JSON text, checked, so that it can be spliced into
/// `msg` frames verbatim.
#[derive(Debug, Clone)]
pub struct JsonData(Bytes);

impl JsonData {
    /// `data`, if it is JSON text of at most `limit` bytes.
    pub fn parse(data: Bytes, limit: usize) -> Result<Self, ApiError> {
        if data.len() > limit {
            return Err(ApiError::new(
                Refusal::TooLarge,
                ErrorCode::Malformed,
                format!("`data` is limited to {limit} bytes"),
            ));
        }
        if let Err(e) = serde_json::from_slice::<&RawValue>(&data) {
            return Err(ApiError::invalid(
                ErrorCode::Malformed,
                format!("`data` is not JSON text: {e}"),
            ));
        }
        Ok(Self(data))
    }

    /// The text of `value`, which serde_json has read from `body`.
    fn within(body: &Bytes, value: &RawValue) -> Self {
        Self(body.slice_ref(value.get().as_bytes()))
    }
}

/// Checks an `Authorization` header (or `authorization` gRPC metadata)
/// against `http.api_keys`: with keys configured, it must be `Bearer <key>`.
pub fn authorize(node: &Node, authorization: Option<&str>) -> Result<(), ApiError> {
    let keys = &node.config.http.api_keys;
    if keys.is_empty() || authorized(keys, authorization) {
        return Ok(());
    }
    Err(ApiError::new(
        Refusal::Unauthenticated,
        ErrorCode::Forbidden,
        "a valid `Authorization: Bearer <api key>` is required",
    ))
}

/// A topic named by an API request.
pub fn topic(name: &str) -> Result<Topic, ApiError> {
    Topic::parse(name).map_err(|e| ApiError::invalid(ErrorCode::BadTopic, e.to_string()))
}

/// One publish, as both APIs do it once the caller is authorized: checks the
/// topic and the idempotency key, and hands `data` to the broker, within a
/// `herald.router.publish` span (a child of the caller's publish span).
pub async fn publish_data(
    node: &Node,
    topic_name: &str,
    data: JsonData,
    idempotency_key: Option<&str>,
) -> Result<Position, ApiError> {
    let topic = topic(topic_name)?;
    if let Some(key) = idempotency_key
        && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES)
    {
        return Err(ApiError::invalid(
            ErrorCode::Malformed,
            format!("an idempotency key is 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes"),
        ));
    }
    let span = telemetry::router_span(topic.as_str());
    // Only a sampled trace travels with the publication (through Redis).
    let traceparent = telemetry::traceparent(&span);
    let published = node
        .broker
        .publish(&topic, data.0, idempotency_key, traceparent.as_deref())
        .instrument(span.clone())
        .await;
    match &published {
        Ok(position) => {
            span.record("herald.seq", telemetry::int(position.seq));
            span.record("herald.epoch", &*position.epoch);
        }
        Err(e) => telemetry::failed(&span, e),
    }
    let position = published?;
    node.metrics.published.inc();
    Ok(position)
}

/// Longest user id a disconnect names, in bytes (a token's `sub` is no longer).
pub const MAX_USER_BYTES: usize = 256;

/// Ends `user`'s access on every pod, as both APIs do it once the caller is
/// authorized: their connections close with 4503 and their sessions can no
/// longer be resumed.
pub async fn disconnect_user(node: &Node, user: &str) -> Result<(), ApiError> {
    if user.is_empty() || user.len() > MAX_USER_BYTES {
        return Err(ApiError::invalid(
            ErrorCode::Malformed,
            format!("`user` is 1 to {MAX_USER_BYTES} bytes"),
        ));
    }
    node.sessions
        .revoke(user, node.config.session.resume_window)
        .await?;
    tracing::info!("a backend ended a user's access");
    Ok(())
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: ErrorCode,
    message: &'a str,
}

/// `POST /v1/publish` with `{"topic":"news","data":<any JSON>}` (and an
/// optional `Idempotency-Key` header or `idempotency_key` field):
/// `{"seq":42,"epoch":"9f3c"}`, or 400, 401, 413, 503 with an error body.
/// Traced as a `herald.publish` span, the child of the request's
/// `traceparent` when it has one.
pub async fn publish(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let span = telemetry::publish_span(Api::Http, Headers(req.headers()));
    let answer = publish_inner(req, node).instrument(span.clone()).await;
    let response = match answer {
        Ok(answer) => json(StatusCode::OK, &answer),
        Err(e) => {
            telemetry::failed(&span, &e);
            refused(&e)
        }
    };
    node.metrics
        .publish_requests
        .with_label_values(&[response.status().as_str()])
        .inc();
    response
}

/// `POST /v1/disconnect` with `{"user":"alice"}`: `{}`, or 400, 401, 503
/// with an error body.
pub async fn disconnect(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let answer = async {
        authorize(
            node,
            req.headers()
                .get(AUTHORIZATION)
                .and_then(|h| h.to_str().ok()),
        )?;
        let body = body(req, node.config.http.max_body_bytes).await?;
        let request =
            DisconnectRequest::decode(&body).map_err(|e| ApiError::invalid(e.code, e.message))?;
        disconnect_user(node, &request.user).await
    };
    match answer.await {
        Ok(()) => json(StatusCode::OK, &serde_json::json!({})),
        Err(e) => refused(&e),
    }
}

/// The answer to a refused request.
fn refused(e: &ApiError) -> Response<Body> {
    let mut response = json(
        e.http_status(),
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
    let too_large = || {
        ApiError::new(
            Refusal::TooLarge,
            ErrorCode::Malformed,
            format!("the body is limited to {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large());
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(ApiError::invalid(ErrorCode::Malformed, e.to_string())),
    }
}

async fn publish_inner(req: Request<Incoming>, node: &Node) -> Result<PublishResponse, ApiError> {
    let headers = req.headers();
    authorize(
        node,
        headers.get(AUTHORIZATION).and_then(|h| h.to_str().ok()),
    )?;
    let header_key = headers.get(IDEMPOTENCY_KEY).cloned();
    let limit = node.config.http.max_body_bytes;
    let body = body(req, limit).await?;
    let request =
        PublishRequest::decode(&body).map_err(|e| ApiError::invalid(e.code, e.message))?;
    let header_key = header_key
        .as_ref()
        .map(|v| v.to_str())
        .transpose()
        .map_err(|_| {
            ApiError::invalid(
                ErrorCode::Malformed,
                "`Idempotency-Key` is not visible ASCII",
            )
        })?;
    let idempotency_key = match (header_key, request.idempotency_key.as_deref()) {
        (Some(header), Some(field)) if header != field => {
            return Err(ApiError::invalid(
                ErrorCode::Malformed,
                "the `Idempotency-Key` header and `idempotency_key` differ",
            ));
        }
        (header, field) => header.or(field),
    };
    let data = JsonData::within(&body, request.data);
    let position = publish_data(node, &request.topic, data, idempotency_key).await?;
    Ok(PublishResponse {
        seq: position.seq,
        epoch: position.epoch.to_string(),
    })
}

/// Whether `header` is `Bearer <one of keys>` (the scheme in any case, RFC
/// 9110 11.1), the key compared in constant time.
fn authorized(keys: &[String], header: Option<&str>) -> bool {
    let Some((scheme, given)) = header.and_then(|h| h.split_once(' ')) else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return false;
    }
    keys.iter().fold(false, |found, key| {
        found | constant_time_eq(key.as_bytes(), given.trim().as_bytes())
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
