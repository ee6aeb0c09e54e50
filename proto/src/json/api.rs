//! The HTTP API's request and answer bodies: publish (one or a batch),
//! disconnect, server-side subscribe and unsubscribe. Its own module because
//! these are what an application's backend says to Herald, not what a client
//! does; they decode with a command's error codes (and its helpers, in
//! [`super`]).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{CommandError, ErrorCode, from_object, present};
use crate::v1;

/// The HTTP publish body: `{"topic":"news","data":<any JSON>}`, optionally
/// with `"idempotency_key":"<text>"`.
#[derive(Debug)]
pub struct PublishRequest<'a> {
    pub topic: Cow<'a, str>,
    pub data: &'a RawValue,
    pub idempotency_key: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawPublishRequest<'a> {
    #[serde(borrow)]
    topic: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    #[serde(borrow)]
    idempotency_key: Option<Cow<'a, str>>,
}

impl<'a> PublishRequest<'a> {
    /// Decodes a request body, with the same error codes as a command.
    pub fn decode(body: &'a [u8]) -> Result<Self, CommandError> {
        let raw: RawPublishRequest<'a> = from_object(body)?;
        let missing = |field: &str| {
            CommandError::new(
                None,
                ErrorCode::MissingField,
                format!("`{field}` is required"),
            )
        };
        Ok(Self {
            topic: raw.topic.ok_or_else(|| missing("topic"))?,
            data: raw.data.ok_or_else(|| missing("data"))?,
            idempotency_key: raw.idempotency_key,
        })
    }

    /// The protobuf form of this request (the gRPC `Publish` request).
    pub fn to_proto(&self) -> v1::PublishRequest {
        v1::PublishRequest {
            topic: self.topic.to_string(),
            data: self.data.get().as_bytes().to_vec(),
            idempotency_key: self.idempotency_key.as_deref().map(str::to_owned),
            binary: false,
        }
    }
}

/// The HTTP batch publish body: `{"items":[<publish body>, ...]}`. Each item
/// is decoded alone, so that a bad one fails alone.
#[derive(Debug)]
pub struct PublishBatchRequest<'a> {
    pub items: Vec<Result<PublishRequest<'a>, CommandError>>,
}

#[derive(Deserialize)]
struct RawPublishBatchRequest<'a> {
    #[serde(borrow)]
    items: Option<Vec<&'a RawValue>>,
}

impl<'a> PublishBatchRequest<'a> {
    /// Decodes a request body: only a body that is no object with an
    /// `items` array fails as a whole.
    pub fn decode(body: &'a [u8]) -> Result<Self, CommandError> {
        let raw: RawPublishBatchRequest<'a> = from_object(body)?;
        let items = raw.items.ok_or_else(|| {
            CommandError::new(None, ErrorCode::MissingField, "`items` is required")
        })?;
        Ok(Self {
            items: items
                .into_iter()
                .map(|item| PublishRequest::decode(item.get().as_bytes()))
                .collect(),
        })
    }
}

/// One item of the HTTP batch publish answer: the position, or why the item
/// was refused.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PublishResult {
    Published(PublishResponse),
    Error { error: PublishError },
}

/// Why a batch item was refused: what `POST /v1/publish` would have
/// answered it with.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PublishError {
    pub code: String,
    pub message: String,
}

/// The HTTP batch publish answer, one result per item, in order.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PublishBatchResponse {
    pub results: Vec<PublishResult>,
}

/// The HTTP disconnect body: `{"user":"alice"}`.
#[derive(Debug)]
pub struct DisconnectRequest {
    pub user: String,
}

#[derive(Deserialize)]
struct RawDisconnectRequest {
    user: Option<String>,
}

impl DisconnectRequest {
    /// Decodes a request body, with the same error codes as a command (and,
    /// as they do, ignoring keys it does not know).
    pub fn decode(body: &[u8]) -> Result<Self, CommandError> {
        let raw: RawDisconnectRequest = from_object(body)?;
        let user = raw.user.ok_or_else(|| {
            CommandError::new(None, ErrorCode::MissingField, "`user` is required")
        })?;
        Ok(Self { user })
    }
}

/// The HTTP server-side subscription bodies: `POST /v1/subscribe`
/// `{"user":"alice","topic":"news","since":40?,"epoch":"…"?}` and `POST
/// /v1/unsubscribe` `{"user":"alice","topic":"news"}` (which ignores
/// `since` and `epoch`).
#[derive(Debug)]
pub struct SubscriptionRequest {
    pub user: String,
    pub topic: String,
    pub since: Option<u64>,
    pub epoch: Option<String>,
}

#[derive(Deserialize)]
struct RawSubscriptionRequest {
    user: Option<String>,
    topic: Option<String>,
    since: Option<u64>,
    epoch: Option<String>,
}

impl SubscriptionRequest {
    /// Decodes a request body, with the same error codes as a command.
    pub fn decode(body: &[u8]) -> Result<Self, CommandError> {
        let raw: RawSubscriptionRequest = from_object(body)?;
        let missing = |field: &str| {
            CommandError::new(
                None,
                ErrorCode::MissingField,
                format!("`{field}` is required"),
            )
        };
        Ok(Self {
            user: raw.user.ok_or_else(|| missing("user"))?,
            topic: raw.topic.ok_or_else(|| missing("topic"))?,
            since: raw.since,
            epoch: raw.epoch,
        })
    }
}

/// The HTTP publish answer.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PublishResponse {
    pub seq: u64,
    pub epoch: String,
}
