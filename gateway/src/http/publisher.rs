//! The HTTP publish routes: `POST /v1/publish`, whose body is a JSON
//! request or, as `application/octet-stream`, the data itself (binary
//! data, with the topic in the query), and `POST /v1/publish/batch` (JSON
//! only: binary items go one at a time, or through gRPC).

use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use proto::ErrorCode;
use proto::json::{
    PublishBatchRequest, PublishBatchResponse, PublishError, PublishRequest, PublishResponse,
    PublishResult,
};
use serde::Serialize;
use tracing::Instrument;

use super::{Body, authorize, body, json, param, query, refused, required};
use crate::node::Node;
use crate::publish::{self, ApiError, Data, JsonData, MAX_BATCH_ITEMS, Refusal};
use crate::telemetry::{self, Api, Headers};

/// The request header that carries an idempotency key (the body's
/// `idempotency_key`, or the query's for binary data, may carry it instead).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// `POST /v1/publish` with `{"topic":"news","data":<any JSON>}` (and an
/// optional `Idempotency-Key` header or `idempotency_key` field), or with
/// `Content-Type: application/octet-stream`, the bytes to publish as the
/// body and `?topic=news[&idempotency_key=..]` (see `Kind`):
/// `{"seq":42,"epoch":"9f3c"}`, or 400, 401, 413, 415, 503 with an error
/// body. Traced as a `herald.publish` span, the child of the request's
/// `traceparent` when it has one.
pub async fn publish(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let span = telemetry::publish_span(Api::Http, Headers(req.headers()));
    let answer = publish_inner(req, node).instrument(span.clone()).await;
    publish_answer(node, &span, answer)
}

/// The answer to a publish request, counted by status.
fn publish_answer(
    node: &Node,
    span: &tracing::Span,
    answer: Result<impl Serialize, ApiError>,
) -> Response<Body> {
    let response = match answer {
        Ok(answer) => json(StatusCode::OK, &answer),
        Err(e) => {
            telemetry::failed(span, &e);
            refused(&e)
        }
    };
    node.metrics
        .publish_requests
        .with_label_values(&[response.status().as_str()])
        .inc();
    response
}

/// What a publish's body is, by its `Content-Type` (parameters after `;`
/// ignored, the type in any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A JSON request: `application/json` or any `+json` type, and, as the
    /// body has always been read as JSON whatever its label, no type or the
    /// ones `curl -d` (`application/x-www-form-urlencoded`) and a browser's
    /// `fetch` with a string body (`text/plain`) send unasked.
    Json,
    /// `application/octet-stream`: the body is the data, as bytes.
    Binary,
}

impl Kind {
    /// The kind of a request with `headers`; 415 for a type that is
    /// neither.
    fn of(headers: &HeaderMap) -> Result<Self, ApiError> {
        let Some(value) = headers.get(CONTENT_TYPE) else {
            return Ok(Kind::Json);
        };
        // Not visible ASCII: no type this route knows.
        let value = value.to_str().unwrap_or("?");
        let essence = value.split(';').next().unwrap_or("").trim();
        match essence.to_ascii_lowercase().as_str() {
            "application/octet-stream" => Ok(Kind::Binary),
            "" | "application/json" | "application/x-www-form-urlencoded" | "text/plain" => {
                Ok(Kind::Json)
            }
            json if json.starts_with("application/") && json.ends_with("+json") => Ok(Kind::Json),
            _ => Err(ApiError::new(
                Refusal::UnsupportedType,
                ErrorCode::Malformed,
                format!(
                    "`Content-Type: {value}` is not published: send `application/json` (a publish request) or `application/octet-stream` (the data, with `?topic=`)"
                ),
            )),
        }
    }
}

async fn publish_inner(req: Request<Incoming>, node: &Node) -> Result<PublishResponse, ApiError> {
    authorize(&req, node)?;
    let kind = Kind::of(req.headers())?;
    let header_key = req.headers().get(IDEMPOTENCY_KEY).cloned();
    let limit = node.config.http.max_body_bytes;
    let position = match kind {
        Kind::Json => {
            let body = body(req, limit).await?;
            let request =
                PublishRequest::decode(&body).map_err(|e| ApiError::invalid(e.code, e.message))?;
            let key = idempotency_key(header_key.as_ref(), request.idempotency_key.as_deref())?;
            let data = JsonData::within(&body, request.data);
            let broker = &*node.broker;
            publish::publish_data(broker, &node.metrics, &request.topic, data.into(), key).await?
        }
        Kind::Binary => {
            // The query is read before the body: a publish without a topic
            // is refused without reading what it carries.
            let pairs = query(&req)?;
            let topic = required(&pairs, "topic")?;
            let key = idempotency_key(header_key.as_ref(), param(&pairs, "idempotency_key"))?;
            let body = body(req, limit).await?;
            let data = Data::binary(&body, limit)?;
            publish::publish_data(&*node.broker, &node.metrics, topic, data, key).await?
        }
    };
    Ok(PublishResponse {
        seq: position.seq,
        epoch: position.epoch.to_string(),
    })
}

/// A publish's idempotency key: the `Idempotency-Key` header or the
/// request's own field (the JSON body's, the query's for binary data);
/// both may be given if they agree.
fn idempotency_key<'a>(
    header: Option<&'a HeaderValue>,
    field: Option<&'a str>,
) -> Result<Option<&'a str>, ApiError> {
    let header = header.map(|v| v.to_str()).transpose().map_err(|_| {
        ApiError::invalid(
            ErrorCode::Malformed,
            "`Idempotency-Key` is not visible ASCII",
        )
    })?;
    match (header, field) {
        (Some(header), Some(field)) if header != field => Err(ApiError::invalid(
            ErrorCode::Malformed,
            "the `Idempotency-Key` header and `idempotency_key` differ",
        )),
        (header, field) => Ok(header.or(field)),
    }
}

/// `POST /v1/publish/batch` with `{"items":[<a publish body>, ...]}` (at
/// most [`MAX_BATCH_ITEMS`]): `{"results":[...]}`, one per item in order,
/// each a publish answer (`{"seq":42,"epoch":"9f3c"}`) or `{"error":{"code",
/// "message"}}` with what `/v1/publish` would have refused it with; or 400,
/// 401, 413, 503 for the whole batch. Traced as one `herald.publish` span.
pub async fn publish_batch(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let span = telemetry::publish_span(Api::HttpBatch, Headers(req.headers()));
    let answer = publish_batch_inner(req, node)
        .instrument(span.clone())
        .await;
    publish_answer(node, &span, answer)
}

async fn publish_batch_inner(
    req: Request<Incoming>,
    node: &Node,
) -> Result<PublishBatchResponse, ApiError> {
    authorize(&req, node)?;
    // As large as gRPC takes a batch; each item's data within the limit of
    // one publish.
    let limit = node.config.http.max_body_bytes;
    let body = body(req, publish::MAX_BATCH_BYTES.max(limit)).await?;
    let request =
        PublishBatchRequest::decode(&body).map_err(|e| ApiError::invalid(e.code, e.message))?;
    if request.items.len() > MAX_BATCH_ITEMS {
        return Err(ApiError::new(
            Refusal::TooLarge,
            ErrorCode::Malformed,
            format!("a batch is limited to {MAX_BATCH_ITEMS} items"),
        ));
    }
    let items = request
        .items
        .into_iter()
        .map(|item| {
            let item = item.map_err(|e| ApiError::invalid(e.code, e.message))?;
            if item.data.get().len() > limit {
                return Err(ApiError::new(
                    Refusal::TooLarge,
                    ErrorCode::Malformed,
                    format!("`data` is limited to {limit} bytes"),
                ));
            }
            Ok(publish::BatchItem {
                data: JsonData::within(&body, item.data).into(),
                topic: item.topic.into_owned(),
                idempotency_key: item.idempotency_key.map(|k| k.into_owned()),
            })
        })
        .collect();
    let answers = publish::publish_batch(&*node.broker, &node.metrics, items).await;
    let results = answers
        .into_iter()
        .map(|answer| match answer {
            Ok(position) => PublishResult::Published(PublishResponse {
                seq: position.seq,
                epoch: position.epoch.to_string(),
            }),
            Err(e) => PublishResult::Error {
                error: PublishError {
                    code: e.code.as_str().to_owned(),
                    message: e.message,
                },
            },
        })
        .collect();
    Ok(PublishBatchResponse { results })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(content_type: Option<&str>) -> Result<Kind, Refusal> {
        let mut headers = HeaderMap::new();
        if let Some(value) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
        }
        Kind::of(&headers).map_err(|e| e.refusal)
    }

    #[test]
    fn a_publish_body_is_json_unless_it_says_octet_stream() {
        for json in [
            None,
            Some("application/json"),
            Some("Application/JSON; charset=utf-8"),
            Some("application/cloudevents+json"),
            Some("application/x-www-form-urlencoded"),
            Some("text/plain;charset=UTF-8"),
        ] {
            assert_eq!(kind(json), Ok(Kind::Json), "{json:?}");
        }
        for binary in [
            "application/octet-stream",
            "APPLICATION/Octet-Stream ; foo=bar",
        ] {
            assert_eq!(kind(Some(binary)), Ok(Kind::Binary), "{binary}");
        }
        for other in [
            "image/png",
            "multipart/form-data; boundary=x",
            "text/json+",
            "application/xml",
        ] {
            assert_eq!(kind(Some(other)), Err(Refusal::UnsupportedType), "{other}");
        }
    }
}
