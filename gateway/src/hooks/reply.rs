//! The backend's replies, JSON (HTTP) or protobuf (gRPC), as what the
//! session takes: [`Claims`] (held to a token's bounds: the checks of
//! [`Vouched`]), [`SubscribeReply`], [`PublishReply`], [`RpcReply`]. An app
//! error (`"error": {"code", "message"}`) is a refusal; a reply that is not
//! its proxy's (not a JSON object, a field of the wrong type, a claim out of
//! bounds, an `info` over `presence.max_info_bytes`) is
//! [`Failure::Malformed`]: the backend is broken, not the client refused.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::{RawValue, to_raw_value};

use super::call::Denied;
use super::{Failure, HookError, Kind, PublishReply, RpcReply, SubscribeReply};
use crate::auth::{Claims, Vouched};

/// Longest app error code the client is given; one that is longer, or not
/// `[a-z][a-z0-9_]*`, is `forbidden`.
const MAX_CODE_BYTES: usize = 32;
/// Longest refusal message kept for the client (an app error's, a 401's or
/// 403's body, a gRPC status's), in bytes.
const MAX_MESSAGE_BYTES: usize = 512;

/// `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Default, Deserialize)]
struct AppError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// The refusal an app error is: `Forbidden` for connect and refresh (a
/// `hello` is let in or not), `Refused` with its code for the others.
fn refusal(kind: Kind, error: AppError) -> Denied {
    let message = bounded(error.message);
    if matches!(kind, Kind::Connect | Kind::Refresh) {
        return Denied::Refusal(HookError::Forbidden(message));
    }
    let code = if is_app_code(&error.code) {
        error.code
    } else {
        "forbidden".to_owned()
    };
    Denied::Refusal(HookError::Refused { code, message })
}

/// Whether `code` is `[a-z][a-z0-9_]{0,31}`.
fn is_app_code(code: &str) -> bool {
    let mut bytes = code.bytes();
    code.len() <= MAX_CODE_BYTES
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A refusal's message for the client, at most [`MAX_MESSAGE_BYTES`].
pub(super) fn bounded(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

fn malformed(detail: impl std::fmt::Display) -> Denied {
    Denied::failed(Failure::Malformed, detail)
}

/// `body` as `T`, which must be a JSON object (serde would take an array
/// for a struct).
fn object<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Denied> {
    let starts = body.iter().find(|b| !b.is_ascii_whitespace());
    if starts != Some(&b'{') {
        return Err(malformed("the reply is not a JSON object"));
    }
    serde_json::from_slice(body).map_err(|e| malformed(format_args!("the reply: {e}")))
}

/// An `error` that is there: an object, or `null` (none).
fn app_error(raw: Option<&RawValue>) -> Result<Option<AppError>, Denied> {
    match raw {
        None => Ok(None),
        Some(raw) => serde_json::from_str::<Option<AppError>>(raw.get())
            .map_err(|_| malformed("`error` must be an object of strings `code` and `message`")),
    }
}

/// JSON text in proto `bytes`, checked.
fn json_text(bytes: Vec<u8>, field: &str) -> Result<Box<RawValue>, Denied> {
    let text =
        String::from_utf8(bytes).map_err(|_| malformed(format_args!("`{field}` is not UTF-8")))?;
    RawValue::from_string(text).map_err(|_| malformed(format_args!("`{field}` is not JSON text")))
}

/// A JSON value as raw JSON.
fn raw(value: &impl serde::Serialize) -> Result<Box<RawValue>, Denied> {
    to_raw_value(value).map_err(malformed)
}

/// A JSON object's text, compact, bounded: a member's presence `info`.
fn info(raw: &RawValue, max_info_bytes: usize) -> Result<Bytes, Denied> {
    let object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(raw.get()).map_err(|_| malformed("`info` must be a JSON object"))?;
    let text = serde_json::Value::Object(object).to_string();
    if text.len() > max_info_bytes {
        return Err(malformed(format_args!(
            "`info` is over presence.max_info_bytes ({max_info_bytes})"
        )));
    }
    Ok(Bytes::from(text))
}

/// `data`, where JSON `null` is none.
fn data(raw: Option<Box<RawValue>>) -> Option<Box<RawValue>> {
    raw.filter(|raw| raw.get() != "null")
}

/// The connect or refresh proxy's reply (JSON).
pub(super) fn claims(kind: Kind, body: &[u8], max_info_bytes: usize) -> Result<Claims, Denied> {
    #[derive(Deserialize)]
    struct Reply {
        #[serde(default)]
        user: Option<Box<RawValue>>,
        #[serde(default)]
        expires: Option<Box<RawValue>>,
        #[serde(default)]
        subscribe: Option<Box<RawValue>>,
        #[serde(default)]
        publish: Option<Box<RawValue>>,
        #[serde(default)]
        topics: Option<Box<RawValue>>,
        #[serde(default)]
        info: Option<Box<RawValue>>,
        #[serde(default)]
        error: Option<Box<RawValue>>,
    }
    let reply: Reply = object(body)?;
    if let Some(error) = app_error(reply.error.as_deref())? {
        return Err(refusal(kind, error));
    }
    checked(
        Vouched {
            user: reply.user,
            expires: reply.expires,
            subscribe: reply.subscribe,
            publish: reply.publish,
            topics: reply.topics,
            info: reply.info,
        },
        max_info_bytes,
    )
}

/// The connect or refresh proxy's reply (gRPC).
pub(super) fn claims_proto(
    kind: Kind,
    reply: proto::v1::ConnectProxyReply,
    max_info_bytes: usize,
) -> Result<Claims, Denied> {
    if let Some(error) = reply.error {
        return Err(refusal(
            kind,
            AppError {
                code: error.code,
                message: error.message,
            },
        ));
    }
    let info = reply.info.map(|i| json_text(i, "info")).transpose()?;
    checked(
        Vouched {
            user: Some(raw(&reply.user)?),
            expires: reply.expires.map(|e| raw(&e)).transpose()?,
            subscribe: Some(raw(&reply.subscribe)?),
            publish: Some(raw(&reply.publish)?),
            topics: Some(raw(&reply.topics)?),
            info,
        },
        max_info_bytes,
    )
}

fn checked(vouched: Vouched, max_info_bytes: usize) -> Result<Claims, Denied> {
    let claims = vouched.into_claims().map_err(malformed)?;
    claims.check_info(max_info_bytes).map_err(malformed)?;
    Ok(claims)
}

/// The subscribe proxy's reply (JSON).
pub(super) fn subscribe(body: &[u8], max_info_bytes: usize) -> Result<SubscribeReply, Denied> {
    #[derive(Deserialize)]
    struct Reply {
        #[serde(default)]
        info: Option<Box<RawValue>>,
        #[serde(default)]
        data: Option<Box<RawValue>>,
        #[serde(default)]
        error: Option<Box<RawValue>>,
    }
    let reply: Reply = object(body)?;
    if let Some(error) = app_error(reply.error.as_deref())? {
        return Err(refusal(Kind::Subscribe, error));
    }
    Ok(SubscribeReply {
        info: data(reply.info)
            .map(|i| info(&i, max_info_bytes))
            .transpose()?,
        data: data(reply.data),
    })
}

/// The subscribe proxy's reply (gRPC).
pub(super) fn subscribe_proto(
    reply: proto::v1::SubscribeProxyReply,
    max_info_bytes: usize,
) -> Result<SubscribeReply, Denied> {
    if let Some(error) = reply.error {
        return Err(refusal(
            Kind::Subscribe,
            AppError {
                code: error.code,
                message: error.message,
            },
        ));
    }
    let info_raw = reply.info.map(|i| json_text(i, "info")).transpose()?;
    let data_raw = reply.data.map(|d| json_text(d, "data")).transpose()?;
    Ok(SubscribeReply {
        info: data(info_raw)
            .map(|i| info(&i, max_info_bytes))
            .transpose()?,
        data: data(data_raw),
    })
}

/// The publish proxy's reply (JSON): `{}`, `{"data": ...}` or
/// `{"skip": true}` (which wins over `data`).
pub(super) fn publish(body: &[u8]) -> Result<PublishReply, Denied> {
    #[derive(Deserialize)]
    struct Reply {
        #[serde(default)]
        data: Option<Box<RawValue>>,
        #[serde(default)]
        skip: Option<bool>,
        #[serde(default)]
        error: Option<Box<RawValue>>,
    }
    let reply: Reply = object(body)?;
    if let Some(error) = app_error(reply.error.as_deref())? {
        return Err(refusal(Kind::Publish, error));
    }
    Ok(publish_reply(reply.skip.unwrap_or(false), data(reply.data)))
}

/// The publish proxy's reply (gRPC).
pub(super) fn publish_proto(reply: proto::v1::PublishProxyReply) -> Result<PublishReply, Denied> {
    if let Some(error) = reply.error {
        return Err(refusal(
            Kind::Publish,
            AppError {
                code: error.code,
                message: error.message,
            },
        ));
    }
    let data_raw = reply.data.map(|d| json_text(d, "data")).transpose()?;
    Ok(publish_reply(reply.skip, data(data_raw)))
}

fn publish_reply(skip: bool, data: Option<Box<RawValue>>) -> PublishReply {
    match (skip, data) {
        (true, _) => PublishReply::Skip,
        (false, Some(data)) => PublishReply::Replace(data),
        (false, None) => PublishReply::AsIs,
    }
}

/// The rpc proxy's reply (JSON).
pub(super) fn rpc(body: &[u8]) -> Result<RpcReply, Denied> {
    #[derive(Deserialize)]
    struct Reply {
        #[serde(default)]
        data: Option<Box<RawValue>>,
        #[serde(default)]
        error: Option<Box<RawValue>>,
    }
    let reply: Reply = object(body)?;
    if let Some(error) = app_error(reply.error.as_deref())? {
        return Err(refusal(Kind::Rpc, error));
    }
    Ok(RpcReply {
        data: data(reply.data),
    })
}

/// The rpc proxy's reply (gRPC).
pub(super) fn rpc_proto(reply: proto::v1::RpcProxyReply) -> Result<RpcReply, Denied> {
    if let Some(error) = reply.error {
        return Err(refusal(
            Kind::Rpc,
            AppError {
                code: error.code,
                message: error.message,
            },
        ));
    }
    let data_raw = reply.data.map(|d| json_text(d, "data")).transpose()?;
    Ok(RpcReply {
        data: data(data_raw),
    })
}
