//! The backend API's core, whatever protocol a request came by (HTTP in
//! [`crate::http`], gRPC in [`crate::grpc`]): who may call it, the checks of
//! a publish, disconnecting a user, subscribing or unsubscribing a user's
//! connections (server-side subscriptions), and the one mapping of their
//! refusals. (History reads are [`crate::history`]'s.)

use std::time::Duration;

use bytes::Bytes;
use proto::ErrorCode;
use proto::json::PresenceStats;
use router::{
    Broker, BrokerError, Causes, Namespaces, Outgoing, Position, ServerSubscription, SessionStore,
    Since, Topic,
};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};
use tracing::Instrument;

use crate::metrics::Metrics;
use crate::payload::Payload;
use crate::presence::{Page, Presence, PresenceError};
use crate::telemetry;

/// How a refused API request is answered, whichever protocol it came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// HTTP 400, gRPC `INVALID_ARGUMENT`.
    Invalid,
    /// HTTP 401, gRPC `UNAUTHENTICATED`.
    Unauthenticated,
    /// HTTP 413, gRPC `RESOURCE_EXHAUSTED`.
    TooLarge,
    /// HTTP 415: a body of a type the route does not read. (gRPC's
    /// messages have one type: `INVALID_ARGUMENT` if it ever met one.)
    UnsupportedType,
    /// HTTP 503, gRPC `UNAVAILABLE`: retry later.
    Unavailable,
    /// HTTP 410, gRPC `OUT_OF_RANGE`: what was asked for is gone (a
    /// history `since` out of the window).
    Gone,
    /// HTTP 400, gRPC `FAILED_PRECONDITION`: the request is well formed,
    /// but the topic's namespace does not do it (`disabled`).
    Precondition,
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

    pub(crate) fn invalid(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(Refusal::Invalid, code, message)
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        // With its causes, as the message said when it was one string.
        let message = Causes(&e).to_string();
        match e {
            BrokerError::UnknownNamespace(_) => Self::invalid(ErrorCode::UnknownNamespace, message),
            BrokerError::Unavailable(_) => {
                Self::new(Refusal::Unavailable, ErrorCode::Unavailable, message)
            }
        }
    }
}

impl From<PresenceError> for ApiError {
    fn from(e: PresenceError) -> Self {
        match e {
            PresenceError::Disabled(_) => {
                Self::new(Refusal::Precondition, ErrorCode::Disabled, e.to_string())
            }
            PresenceError::Malformed(message) => Self::invalid(ErrorCode::Malformed, message),
            PresenceError::Broker(e) => e.into(),
        }
    }
}

/// A topic named by a presence query, in a configured namespace.
fn presence_topic(namespaces: &Namespaces, name: &str) -> Result<Topic, ApiError> {
    let topic = topic(name)?;
    namespaces.require(&topic)?;
    Ok(topic)
}

/// A page of a topic's presence (HTTP `GET /v1/presence`, gRPC `Presence`).
pub async fn presence_page(
    presence: &Presence,
    namespaces: &Namespaces,
    topic: &str,
    cursor: Option<&str>,
    limit: Option<u64>,
) -> Result<(Topic, Page), ApiError> {
    let topic = presence_topic(namespaces, topic)?;
    let page = presence.page(&topic, cursor, limit).await?;
    Ok((topic, page))
}

/// A topic's presence counts (HTTP `GET /v1/presence/stats`, gRPC
/// `PresenceStats`).
pub async fn presence_stats(
    presence: &Presence,
    namespaces: &Namespaces,
    topic: &str,
) -> Result<PresenceStats, ApiError> {
    let topic = presence_topic(namespaces, topic)?;
    let counts = presence.counts(&topic).await?;
    Ok(PresenceStats {
        topic: topic.as_str().to_owned(),
        position: counts.position,
        users: counts.users,
        connections: counts.connections,
    })
}

/// The longest idempotency key, in bytes: a key names one publish, it is not
/// a payload, and the broker keeps it for [`router::IDEMPOTENCY_WINDOW`].
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 256;

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
    pub(crate) fn within(body: &Bytes, value: &RawValue) -> Self {
        Self(body.slice_ref(value.get().as_bytes()))
    }
}

/// A publish's data as the broker keeps it ([`Payload`]'s stored form):
/// checked JSON text, or bytes.
#[derive(Debug, Clone)]
pub struct Data(Bytes);

impl Data {
    /// Binary data (HTTP `application/octet-stream`, gRPC `binary`), if it
    /// is 1 to `limit` bytes: taken as it is, never read as JSON. Empty
    /// data is refused: it is more likely a publisher's mistake (a body
    /// lost on the way) than a message, and JSON has no empty text either.
    pub fn binary(bytes: &[u8], limit: usize) -> Result<Self, ApiError> {
        if bytes.len() > limit {
            return Err(ApiError::new(
                Refusal::TooLarge,
                ErrorCode::Malformed,
                format!("`data` is limited to {limit} bytes"),
            ));
        }
        if bytes.is_empty() {
            return Err(ApiError::invalid(
                ErrorCode::Malformed,
                "binary `data` is empty: it is 1 byte at least",
            ));
        }
        Ok(Self(Payload::binary(bytes)))
    }
}

impl From<JsonData> for Data {
    fn from(json: JsonData) -> Self {
        Self(Payload::json(json.0))
    }
}

/// Checks an `Authorization` header (or `authorization` gRPC metadata)
/// against `keys` (`http.api_keys`): with keys configured, it must be
/// `Bearer <key>`.
pub fn authorize(keys: &[String], authorization: Option<&str>) -> Result<(), ApiError> {
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
    broker: &dyn Broker,
    metrics: &Metrics,
    topic_name: &str,
    data: Data,
    idempotency_key: Option<&str>,
) -> Result<Position, ApiError> {
    let topic = topic(topic_name)?;
    check_idempotency_key(idempotency_key)?;
    let span = telemetry::router_span(topic.as_str());
    // Only a sampled trace travels with the publication (through Redis).
    let traceparent = telemetry::traceparent(&span);
    let published = broker
        .publish(&topic, data.0, idempotency_key, traceparent.as_deref())
        .instrument(span.clone())
        .await;
    record(&span, &published);
    let position = published?;
    metrics.published.inc();
    Ok(position)
}

/// The most items one batch may carry (HTTP and gRPC); more is refused as
/// too large.
pub const MAX_BATCH_ITEMS: usize = 1000;

/// The largest batch request, in bytes (gRPC's default, which HTTP
/// follows), unless one `data` of `http.max_body_bytes` is larger.
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// One item of a batch, as the API read it.
pub struct BatchItem {
    pub topic: String,
    pub data: Data,
    pub idempotency_key: Option<String>,
}

/// A batch of publishes, as both APIs do it: each item checked as
/// [`publish_data`] checks one (a bad item, or one the API refused already,
/// fails alone), the others handed to the broker together, in order, so
/// that Redis gets them in one pipeline and items for one topic get their
/// seqs in the batch's order. Each item has its `herald.router.publish` span.
pub async fn publish_batch(
    broker: &dyn Broker,
    metrics: &Metrics,
    items: Vec<Result<BatchItem, ApiError>>,
) -> Vec<Result<Position, ApiError>> {
    let mut answers: Vec<Option<Result<Position, ApiError>>> = Vec::with_capacity(items.len());
    let mut outgoing = Vec::new();
    let mut spans = Vec::new();
    for item in items {
        let checked = item.and_then(|item| {
            check_idempotency_key(item.idempotency_key.as_deref())?;
            Ok((topic(&item.topic)?, item))
        });
        match checked {
            Ok((topic, item)) => {
                let span = telemetry::router_span(topic.as_str());
                outgoing.push(Outgoing {
                    traceparent: telemetry::traceparent(&span),
                    topic,
                    data: item.data.0,
                    idempotency_key: item.idempotency_key,
                    span: span.clone(),
                });
                spans.push(span);
                answers.push(None);
            }
            Err(e) => answers.push(Some(Err(e))),
        }
    }
    let mut published = broker.publish_many(outgoing).await.into_iter().zip(spans);
    for answer in answers.iter_mut().filter(|a| a.is_none()) {
        *answer = published.next().map(|(result, span)| {
            record(&span, &result);
            if result.is_ok() {
                metrics.published.inc();
            }
            result.map_err(ApiError::from)
        });
    }
    answers
        .into_iter()
        .map(|answer| {
            answer.unwrap_or_else(|| {
                Err(ApiError::from(BrokerError::unavailable(
                    "the broker left an item of the batch unanswered",
                )))
            })
        })
        .collect()
}

fn check_idempotency_key(key: Option<&str>) -> Result<(), ApiError> {
    match key {
        Some(key) if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES => {
            Err(ApiError::invalid(
                ErrorCode::Malformed,
                format!("an idempotency key is 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes"),
            ))
        }
        _ => Ok(()),
    }
}

/// Records a publish's outcome on its span.
fn record(span: &tracing::Span, published: &Result<Position, BrokerError>) {
    match published {
        Ok(position) => {
            span.record("herald.seq", telemetry::int(position.seq));
            span.record("herald.epoch", &*position.epoch);
        }
        Err(e) => telemetry::failed(span, e),
    }
}

/// Longest user id a disconnect names, in bytes (a token's `sub` is no longer).
pub const MAX_USER_BYTES: usize = 256;

/// Ends `user`'s access on every pod, as both APIs do it once the caller is
/// authorized: their connections close with 4503 and their sessions can no
/// longer be resumed. The store keeps the revocation for `resume_window`
/// (`session.resume_window`), as long as any session could be resumed.
pub async fn disconnect_user(
    sessions: &dyn SessionStore,
    resume_window: Duration,
    user: &str,
) -> Result<(), ApiError> {
    check_user(user)?;
    sessions.revoke(user, resume_window).await?;
    tracing::info!("a backend ended a user's access");
    Ok(())
}

/// A backend's server-side subscription, as both APIs ask for it.
#[derive(Debug, Clone)]
pub struct Subscription {
    pub user: String,
    pub topic: String,
    /// Subscribe (replaying after `since` where given), or unsubscribe.
    pub subscribe: bool,
    pub since: Option<u64>,
    pub epoch: Option<String>,
}

/// Subscribes or unsubscribes every live connection of a user, on every
/// pod, as both APIs do it once the caller is authorized. The namespace
/// must exist; its `subscribe` rule and the user's grants are not checked:
/// it is the backend's call. Answered once every pod was told (whether the
/// user has a connection or not). Counted by outcome
/// (`herald_server_subscriptions_total`).
pub async fn subscription(
    broker: &dyn Broker,
    metrics: &Metrics,
    request: Subscription,
) -> Result<(), ApiError> {
    let name = if request.subscribe {
        "subscribe"
    } else {
        "unsubscribe"
    };
    let sent = subscription_inner(broker, request).await;
    let outcome = match &sent {
        Ok(()) => "sent",
        Err(e) if e.refusal == Refusal::Unavailable => "unavailable",
        Err(_) => "refused",
    };
    metrics
        .server_subscriptions
        .with_label_values(&[name, outcome])
        .inc();
    sent
}

async fn subscription_inner(broker: &dyn Broker, request: Subscription) -> Result<(), ApiError> {
    check_user(&request.user)?;
    let topic = topic(&request.topic)?;
    let command = match request.subscribe {
        true => ServerSubscription::Subscribe {
            topic,
            since: request
                .since
                .map(|seq| Since::claimed(seq, request.epoch.clone())),
        },
        false => ServerSubscription::Unsubscribe { topic },
    };
    broker.subscription(&request.user, command).await?;
    tracing::info!(
        subscribe = request.subscribe,
        "a backend's server-side subscription"
    );
    Ok(())
}

fn check_user(user: &str) -> Result<(), ApiError> {
    if user.is_empty() || user.len() > MAX_USER_BYTES {
        return Err(ApiError::invalid(
            ErrorCode::Malformed,
            format!("`user` is 1 to {MAX_USER_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Whether `header` is `Bearer <one of keys>` (the scheme in any case, RFC
/// 9110 11.1). The SHA-256 digests of the presented key and of every
/// configured one are compared in constant time, and every key is compared:
/// neither the time taken nor an early return tells a caller how long a key
/// is, how much of one they guessed, or which key matched.
fn authorized(keys: &[String], header: Option<&str>) -> bool {
    let Some((scheme, given)) = header.and_then(|h| h.split_once(' ')) else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return false;
    }
    let given = Sha256::digest(given.trim().as_bytes());
    let found = keys.iter().fold(Choice::from(0), |found, key| {
        found
            | Sha256::digest(key.as_bytes())
                .as_slice()
                .ct_eq(given.as_slice())
    });
    found.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<String> {
        vec!["secret".to_owned(), "other-key".to_owned()]
    }

    #[test]
    fn the_key_compare_accepts_each_key_and_nothing_near_one() {
        for header in ["Bearer secret", "bearer other-key", "BEARER  secret "] {
            assert!(authorized(&keys(), Some(header)), "{header}");
        }
        for header in [
            "Bearer secre",
            "Bearer secrets",
            "Bearer secretsecret",
            "Bearer other",
            "Bearer other-key2",
            "Bearer ",
            "Bearer",
            "Basic secret",
            "secret",
            "",
        ] {
            assert!(!authorized(&keys(), Some(header)), "{header:?}");
        }
        assert!(!authorized(&keys(), None));
        assert!(!authorized(&[], Some("Bearer ")), "no key matches nothing");
        assert!(authorize(&[], None).is_ok(), "no keys: open");
    }
}
