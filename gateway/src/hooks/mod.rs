//! Backend hooks (issue #24): the application's own backend decides who a
//! client is and what it may do, through the proxies (`[proxy.connect]`,
//! `[proxy.refresh]`, `[proxy.subscribe]`, `[proxy.publish]`,
//! `[proxy.rpc]`): each an HTTP JSON endpoint or a gRPC
//! `herald.v1.ProxyBackend` service, called with a bound on calls in flight
//! and a timeout; a refusal is the client's `err`, a failure is
//! `unavailable` and a metric. docs/hooks.md is the contract. (What the
//! backend is told, the webhooks, is [`crate::webhooks`].)
//!
//! The session asks [`Hooks`]; nothing here knows a session.
//!
//! - [`call`]: one proxy, and what every call goes through (its slots, its
//!   timeout, its metrics and warnings).
//! - [`http`]: the HTTP JSON transport (one pooled client per pod);
//!   [`grpc`]: the gRPC one (one lazily connected channel per proxy).
//! - [`reply`]: the backend's replies as the session's types.
//! - [`setup`]: the hooks built from `[proxy]`.

mod call;
mod grpc;
mod http;
mod reply;
mod setup;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use router::Topic;
use serde_json::value::RawValue;

pub use self::setup::HooksError;

use self::call::{Denied, Proxy, Transport};
use crate::admission::ConnId;
use crate::auth::Claims;
use crate::config::ProxyConfig;

/// The pod's hooks: one per pod, shared by its sessions.
pub struct Hooks {
    config: ProxyConfig,
    /// The pod's name, in every request.
    pod: Arc<str>,
    /// `presence.max_info_bytes`: the bound of an `info` in a reply.
    max_info_bytes: usize,
    connect: Option<Proxy>,
    refresh: Option<Proxy>,
    subscribe: Option<Proxy>,
    publish: Option<Proxy>,
    rpc: Option<Proxy>,
}

/// The request headers a connect proxy is given: the allow-list's, as the
/// client sent them (names lower-case). Kept from the upgrade to the
/// `hello`, bounded ([`MAX_FORWARDED_HEADER_BYTES`]).
pub type Forwarded = Box<[(Box<str>, Box<str>)]>;

/// Most bytes of forwarded headers kept per connection until its `hello`.
pub const MAX_FORWARDED_HEADER_BYTES: usize = 8 * 1024;

/// A client's `hello` without a token, for the connect proxy.
pub struct ConnectRequest<'a> {
    pub client: ConnId,
    pub remote_addr: IpAddr,
    pub headers: &'a [(Box<str>, Box<str>)],
    /// `hello.data`, verbatim.
    pub data: Option<&'a RawValue>,
}

/// A proxy-authenticated connection nearing its `expires`.
pub struct RefreshRequest<'a> {
    pub client: ConnId,
    pub user: &'a str,
}

/// A client's `sub` in a namespace with `subscribe_proxy = true`.
pub struct SubscribeRequest<'a> {
    pub client: ConnId,
    /// `None`: anonymous.
    pub user: Option<&'a str>,
    pub topic: &'a Topic,
    /// `sub.data`, verbatim.
    pub data: Option<&'a RawValue>,
}

/// The backend approved a subscription.
#[derive(Debug, Default)]
pub struct SubscribeReply {
    /// The member's `info` in this topic's presence (compact JSON object
    /// text), instead of the token's.
    pub info: Option<Bytes>,
    /// Sent to the client in the `sub`'s `ok`.
    pub data: Option<Box<RawValue>>,
}

/// A client's `pub` in a namespace with `publish_proxy = true`.
pub struct PublishRequest<'a> {
    pub client: ConnId,
    pub user: Option<&'a str>,
    pub topic: &'a Topic,
    pub data: &'a RawValue,
}

/// What the backend made of a client's `pub`.
#[derive(Debug)]
pub enum PublishReply {
    /// Publish the client's data.
    AsIs,
    /// Publish this instead.
    Replace(Box<RawValue>),
    /// Accepted, not published (the client's `ok` has no `seq`).
    Skip,
}

/// A client's `rpc`.
pub struct RpcRequest<'a> {
    pub client: ConnId,
    pub user: Option<&'a str>,
    pub method: &'a str,
    pub data: Option<&'a RawValue>,
}

/// The backend's answer to an `rpc`: the client's `ok.data`.
#[derive(Debug, Default)]
pub struct RpcReply {
    pub data: Option<Box<RawValue>>,
}

/// Which proxy: a metric label, and the path's last part in docs/hooks.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Connect,
    Refresh,
    Subscribe,
    Publish,
    Rpc,
}

impl Kind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Connect => "connect",
            Kind::Refresh => "refresh",
            Kind::Subscribe => "subscribe",
            Kind::Publish => "publish",
            Kind::Rpc => "rpc",
        }
    }
}

/// Why a proxy call did not approve.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// HTTP 401, gRPC `UNAUTHENTICATED`: the client's `unauthorized`.
    #[error("{0}")]
    Unauthorized(String),
    /// HTTP 403, gRPC `PERMISSION_DENIED`: the client's `forbidden`.
    #[error("{0}")]
    Forbidden(String),
    /// An error the backend named (`{"error": {"code", "message"}}`), for
    /// `rpc`, `sub` and `pub`: the client's `err` carries its code, which
    /// is `[a-z][a-z0-9_]{0,31}` (anything else is taken as `forbidden`).
    #[error("{message}")]
    Refused { code: String, message: String },
    /// No answer the pod can use: the client's `unavailable`.
    #[error("the backend is unavailable ({0})")]
    Unavailable(Failure),
}

/// Why a proxy gave no usable answer: a metric label each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The proxy is not configured.
    #[error("not configured")]
    NotConfigured,
    /// `max_in_flight` calls were waiting already.
    #[error("saturated")]
    Saturated,
    #[error("timeout")]
    Timeout,
    /// No connection to the backend.
    #[error("connect")]
    Connect,
    /// An HTTP status or gRPC code other than the ones with a meaning.
    #[error("status")]
    Status,
    /// A redirect (never followed).
    #[error("redirect")]
    Redirect,
    /// Not `application/json`.
    #[error("content_type")]
    ContentType,
    /// Over `proxy.max_response_bytes`.
    #[error("too_large")]
    TooLarge,
    /// Not the reply its proxy answers with.
    #[error("malformed")]
    Malformed,
}

impl Failure {
    /// The label of `herald_proxy_failures_total{reason}`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Failure::NotConfigured => "not_configured",
            Failure::Saturated => "saturated",
            Failure::Timeout => "timeout",
            Failure::Connect => "connect",
            Failure::Status => "status",
            Failure::Redirect => "redirect",
            Failure::ContentType => "content_type",
            Failure::TooLarge => "too_large",
            Failure::Malformed => "malformed",
        }
    }
}

impl Hooks {
    /// Whether `hello` without a token goes to the connect proxy.
    pub fn connects(&self) -> bool {
        self.config.connect.is_some()
    }

    /// The request headers the connect proxy is given (lower-case names):
    /// the upgrade keeps these, and only these, until `hello`.
    pub fn forwarded_headers(&self) -> &[String] {
        self.config
            .connect
            .as_ref()
            .map_or(&[], |endpoint| &endpoint.headers[..])
    }

    /// A configured proxy, or `unavailable` (not configured: no metric,
    /// as no backend was asked).
    fn proxy(proxy: &Option<Proxy>) -> Result<&Proxy, HookError> {
        proxy
            .as_ref()
            .ok_or(HookError::Unavailable(Failure::NotConfigured))
    }

    /// One call to `proxy`, whichever its transport: over HTTP, `body` is
    /// POSTed and the answer read by `read`; over gRPC, `over_grpc` makes
    /// the call. Its slot, timeout and metrics are [`Proxy::call`]'s.
    async fn ask<R>(
        &self,
        proxy: &Proxy,
        body: impl FnOnce() -> Result<Bytes, Denied>,
        read: impl FnOnce(&[u8]) -> Result<R, Denied>,
        over_grpc: impl AsyncFnOnce(&grpc::Client) -> Result<R, Denied>,
    ) -> Result<R, HookError> {
        let max_bytes = self.config.max_response_bytes;
        proxy
            .call(async {
                match &proxy.transport {
                    Transport::Http(client, uri) => {
                        let reply = client.post(uri, body()?, max_bytes).await?;
                        read(&reply)
                    }
                    Transport::Grpc(client) => over_grpc(client).await,
                    Transport::Broken => Err(broken()),
                }
            })
            .await
    }

    /// Who the client is, by the connect proxy: the claims a token would
    /// carry (`expires` from the reply's, if any). An empty `user`: the
    /// backend named nobody (anonymous, where the pod lets such clients in).
    pub async fn connect(&self, request: &ConnectRequest<'_>) -> Result<Claims, HookError> {
        let proxy = Self::proxy(&self.connect)?;
        let max_info = self.max_info_bytes;
        let body = || {
            http::json(&http::ConnectBody {
                client: request.client.to_string(),
                pod: &self.pod,
                transport: "websocket",
                remote_addr: request.remote_addr,
                headers: http::Headers(request.headers),
                data: request.data,
            })
        };
        let read = |reply: &[u8]| reply::claims(Kind::Connect, reply, max_info);
        let over_grpc = async |client: &grpc::Client| {
            let message = proto::v1::ConnectProxyRequest {
                client: request.client.to_string(),
                pod: self.pod.to_string(),
                transport: "websocket".to_owned(),
                remote_addr: request.remote_addr.to_string(),
                headers: request
                    .headers
                    .iter()
                    .map(|(name, value)| (name.to_string(), value.to_string()))
                    .collect(),
                data: request.data.map(|d| d.get().as_bytes().to_vec()),
            };
            let reply = client.handle().connect(client.request(message)).await;
            reply::claims_proto(
                Kind::Connect,
                reply.map_err(grpc::denied)?.into_inner(),
                max_info,
            )
        };
        self.ask(proxy, body, read, over_grpc).await
    }

    /// The connection's user again, by the refresh proxy: its new claims
    /// (the same user; another is `Forbidden`).
    pub async fn refresh(&self, request: &RefreshRequest<'_>) -> Result<Claims, HookError> {
        let proxy = Self::proxy(&self.refresh)?;
        let max_info = self.max_info_bytes;
        let same_user = |claims: Claims| {
            if *claims.user != *request.user {
                return Err(Denied::Refusal(HookError::Forbidden(
                    "the backend named another user".to_owned(),
                )));
            }
            Ok(claims)
        };
        let body = || {
            http::json(&http::RefreshBody {
                client: request.client.to_string(),
                pod: &self.pod,
                user: request.user,
            })
        };
        let read = |reply: &[u8]| same_user(reply::claims(Kind::Refresh, reply, max_info)?);
        let over_grpc = async |client: &grpc::Client| {
            let message = proto::v1::RefreshProxyRequest {
                client: request.client.to_string(),
                pod: self.pod.to_string(),
                user: request.user.to_owned(),
            };
            let reply = client.handle().refresh(client.request(message)).await;
            let reply = reply.map_err(grpc::denied)?.into_inner();
            same_user(reply::claims_proto(Kind::Refresh, reply, max_info)?)
        };
        self.ask(proxy, body, read, over_grpc).await
    }

    /// Whether the client may subscribe, by the subscribe proxy: its
    /// presence `info` in the topic and data for its `ok`.
    pub async fn subscribe(
        &self,
        request: &SubscribeRequest<'_>,
    ) -> Result<SubscribeReply, HookError> {
        let proxy = Self::proxy(&self.subscribe)?;
        let max_info = self.max_info_bytes;
        let body = || {
            http::json(&http::SubscribeBody {
                client: request.client.to_string(),
                pod: &self.pod,
                user: request.user,
                topic: request.topic.as_str(),
                data: request.data,
            })
        };
        let read = |reply: &[u8]| reply::subscribe(reply, max_info);
        let over_grpc = async |client: &grpc::Client| {
            let message = proto::v1::SubscribeProxyRequest {
                client: request.client.to_string(),
                pod: self.pod.to_string(),
                user: request.user.map(str::to_owned),
                topic: request.topic.as_str().to_owned(),
                data: request.data.map(|d| d.get().as_bytes().to_vec()),
            };
            let reply = client.handle().subscribe(client.request(message)).await;
            reply::subscribe_proto(reply.map_err(grpc::denied)?.into_inner(), max_info)
        };
        self.ask(proxy, body, read, over_grpc).await
    }

    /// What to publish of a client's `pub`, by the publish proxy.
    pub async fn publish(&self, request: &PublishRequest<'_>) -> Result<PublishReply, HookError> {
        let proxy = Self::proxy(&self.publish)?;
        let body = || {
            http::json(&http::PublishBody {
                client: request.client.to_string(),
                pod: &self.pod,
                user: request.user,
                topic: request.topic.as_str(),
                data: request.data,
            })
        };
        let over_grpc = async |client: &grpc::Client| {
            let message = proto::v1::PublishProxyRequest {
                client: request.client.to_string(),
                pod: self.pod.to_string(),
                user: request.user.map(str::to_owned),
                topic: request.topic.as_str().to_owned(),
                data: request.data.get().as_bytes().to_vec(),
            };
            let reply = client.handle().publish(client.request(message)).await;
            reply::publish_proto(reply.map_err(grpc::denied)?.into_inner())
        };
        self.ask(proxy, body, reply::publish, over_grpc).await
    }

    /// A client's `rpc`, answered by the rpc proxy.
    pub async fn rpc(&self, request: &RpcRequest<'_>) -> Result<RpcReply, HookError> {
        let proxy = Self::proxy(&self.rpc)?;
        let body = || {
            http::json(&http::RpcBody {
                client: request.client.to_string(),
                pod: &self.pod,
                user: request.user,
                method: request.method,
                data: request.data,
            })
        };
        let over_grpc = async |client: &grpc::Client| {
            let message = proto::v1::RpcProxyRequest {
                client: request.client.to_string(),
                pod: self.pod.to_string(),
                user: request.user.map(str::to_owned),
                method: request.method.to_owned(),
                data: request.data.map(|d| d.get().as_bytes().to_vec()),
            };
            let reply = client.handle().rpc(client.request(message)).await;
            reply::rpc_proto(reply.map_err(grpc::denied)?.into_inner())
        };
        self.ask(proxy, body, reply::rpc, over_grpc).await
    }
}

/// A call to a proxy whose client could not be built.
fn broken() -> Denied {
    Denied::failed(
        Failure::Connect,
        "the proxy's client could not be built (see the error at start)",
    )
}
