//! The HTTP API: publish, health, metrics.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use proto::ErrorCode;
use proto::json::{PublishRequest, PublishResponse};
use router::{BrokerError, Topic};
use serde::Serialize;

use crate::node::Node;
use crate::server::Body;

/// An API error: its status, and a JSON body with a code from the protocol's
/// error table.
struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: ErrorCode,
    message: &'a str,
}

/// `POST /v1/publish` with `{"topic":"news","data":<any JSON>}`:
/// `{"seq":42,"epoch":"9f3c"}`, or 400, 401, 413, 503 with an error body.
pub async fn publish(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let response = match publish_inner(req, node).await {
        Ok(answer) => json(StatusCode::OK, &answer),
        Err(e) => {
            let mut response = json(
                e.status,
                &ErrorBody {
                    code: e.code,
                    message: &e.message,
                },
            );
            if e.status == StatusCode::UNAUTHORIZED {
                response
                    .headers_mut()
                    .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            response
        }
    };
    node.metrics
        .publish_requests
        .with_label_values(&[response.status().as_str()])
        .inc();
    response
}

async fn publish_inner(req: Request<Incoming>, node: &Node) -> Result<PublishResponse, ApiError> {
    let http = &node.config.http;
    if !http.api_keys.is_empty() && !authorized(&http.api_keys, req.headers().get(AUTHORIZATION)) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden,
            "a valid `Authorization: Bearer <api key>` is required",
        ));
    }
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::Malformed,
            format!("the body is limited to {} bytes", http.max_body_bytes),
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > http.max_body_bytes) {
        return Err(too_large());
    }
    let body: Bytes = match Limited::new(req.into_body(), http.max_body_bytes)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(e) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::Malformed,
                e.to_string(),
            ));
        }
    };
    let request = PublishRequest::decode(&body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.code, e.message))?;
    let topic = Topic::parse(&request.topic)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadTopic, e.to_string()))?;
    let data = body.slice_ref(request.data.get().as_bytes());
    let position = node
        .broker
        .publish(&topic, data, None)
        .await
        .map_err(|e| match e {
            BrokerError::UnknownNamespace(_) => ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::UnknownNamespace,
                e.to_string(),
            ),
            BrokerError::Unavailable(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                e.to_string(),
            ),
        })?;
    node.metrics.published.inc();
    Ok(PublishResponse {
        seq: position.seq,
        epoch: position.epoch.to_string(),
    })
}

/// Whether `header` is `Bearer <one of keys>` (the scheme in any case, RFC
/// 9110 11.1), the key compared in constant time.
fn authorized(keys: &[String], header: Option<&HeaderValue>) -> bool {
    let Some((scheme, given)) = header
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.split_once(' '))
    else {
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
