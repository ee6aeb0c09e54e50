//! The gate every gRPC call passes on its head, before its body is read: the
//! API key (from the `authorization` metadata), then one of the pod's API
//! request slots (`http.max_concurrent_requests`, shared with HTTP), then a
//! bound on what its messages may declare, by method.
//!
//! tonic decodes a unary request whole before the method runs, and reserves
//! a message's declared length as soon as its 5-byte prefix arrives: a check
//! in the method comes after the memory is spent. Here a call without a
//! valid key is answered `UNAUTHENTICATED` from its headers, and its body is
//! dropped unread (HTTP/2 resets the stream and gives its window back); a
//! busy pod answers `RESOURCE_EXHAUSTED` at once instead of queueing; and a
//! message that declares more than its method takes ends the call with
//! `RESOURCE_EXHAUSTED` before any of it is buffered.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper::header::AUTHORIZATION;
use hyper::{Request, Response};
use proto::ErrorCode;
use proto::v1::publisher_server::SERVICE_NAME;
use tonic::body::Body;
use tonic::{Code, Status};
use tower_service::Service;

use super::{code_name, status};
use crate::metrics::Metrics;
use crate::node::Node;
use crate::publish::{self, ApiError, Refusal};

/// The largest `TopicInfo`, `Disconnect`, `Presence` or `PresenceStats`
/// request, in bytes: a topic (at most 128 bytes past its namespace), a
/// user id (256) or a cursor (one, encoded), with room to spare.
pub const MAX_SMALL_REQUEST_BYTES: usize = 4 * 1024;
/// Room in a `Publish` request for its topic, key and framing, besides `data`.
pub const REQUEST_OVERHEAD_BYTES: usize = 1024;
/// The gRPC message prefix: a compression flag and a 4-byte length.
const PREFIX_BYTES: usize = 5;

/// A method of `herald.v1.Publisher`, as a call's path names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Publish,
    PublishBatch,
    TopicInfo,
    Disconnect,
    Presence,
    PresenceStats,
    /// Any other path: tonic answers `UNIMPLEMENTED`.
    Unknown,
}

impl Method {
    pub fn of(path: &str) -> Self {
        let name = path
            .strip_prefix('/')
            .and_then(|p| p.strip_prefix(SERVICE_NAME))
            .and_then(|p| p.strip_prefix('/'));
        match name {
            Some("Publish") => Self::Publish,
            Some("PublishBatch") => Self::PublishBatch,
            Some("TopicInfo") => Self::TopicInfo,
            Some("Disconnect") => Self::Disconnect,
            Some("Presence") => Self::Presence,
            Some("PresenceStats") => Self::PresenceStats,
            _ => Self::Unknown,
        }
    }

    /// The `method` label of `herald_grpc_requests_total`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Publish => "Publish",
            Self::PublishBatch => "PublishBatch",
            Self::TopicInfo => "TopicInfo",
            Self::Disconnect => "Disconnect",
            Self::Presence => "Presence",
            Self::PresenceStats => "PresenceStats",
            Self::Unknown => "unknown",
        }
    }
}

/// The largest message each method takes, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// One `data` of `http.max_body_bytes`, its topic and key.
    pub publish: usize,
    /// [`publish::MAX_BATCH_BYTES`], or one publish where that is larger.
    pub batch: usize,
}

impl Limits {
    pub fn new(max_body_bytes: usize) -> Self {
        let publish = max_body_bytes.saturating_add(REQUEST_OVERHEAD_BYTES);
        Self {
            publish,
            batch: publish::MAX_BATCH_BYTES.max(publish),
        }
    }

    fn of(self, method: Method) -> usize {
        match method {
            Method::Publish => self.publish,
            Method::PublishBatch => self.batch,
            Method::TopicInfo
            | Method::Disconnect
            | Method::Presence
            | Method::PresenceStats
            | Method::Unknown => MAX_SMALL_REQUEST_BYTES,
        }
    }
}

/// The gate in front of the `Publisher` service `S`.
#[derive(Clone)]
pub struct Gate<S> {
    inner: S,
    node: Arc<Node>,
    limits: Limits,
}

impl<S> Gate<S> {
    pub fn new(inner: S, node: Arc<Node>, limits: Limits) -> Self {
        Self {
            inner,
            node,
            limits,
        }
    }
}

impl<S> Service<Request<Body>> for Gate<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let method = Method::of(request.uri().path());
        let metrics = self.node.metrics.clone();
        let authorization = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if let Err(e) = publish::authorize(&self.node.api_keys.current(), authorization) {
            // `request`, its body unread, goes with this answer.
            let answer = refuse(&metrics, method, "unauthenticated", status(e));
            return Box::pin(std::future::ready(Ok(answer)));
        }
        // The service that was made ready is the one called; a clone waits
        // for the next call.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let node = self.node.clone();
        let limit = self.limits.of(method);
        Box::pin(async move {
            // Held until the method has answered.
            let Some(_slot) = node.api_slot() else {
                let busy = Status::resource_exhausted("busy: too many API requests in flight");
                return Ok(refuse(&metrics, method, "busy", busy));
            };
            let request =
                request.map(|body| Body::new(Declared::new(body, limit, method, metrics)));
            inner.call(request).await
        })
    }
}

/// Counts a refusal and answers it (trailers-only: the status in the
/// response's headers).
fn refuse(
    metrics: &Metrics,
    method: Method,
    reason: &'static str,
    refusal: Status,
) -> Response<Body> {
    count(metrics, method, reason, refusal.code());
    tracing::debug!(method = method.name(), reason, "gRPC call refused");
    refusal.into_http()
}

fn count(metrics: &Metrics, method: Method, reason: &'static str, code: Code) {
    metrics.grpc_refused.with_label_values(&[reason]).inc();
    metrics
        .grpc_requests
        .with_label_values(&[method.name(), code_name(code)])
        .inc();
}

/// A request body whose gRPC messages may each declare at most `limit`
/// bytes. Each message's prefix is read as it passes; one that declares more
/// ends the body with `RESOURCE_EXHAUSTED`, which tonic answers the call with
/// (it finds the [`Status`] in the error), before it reserves the length.
struct Declared {
    inner: Body,
    limit: usize,
    method: Method,
    metrics: Arc<Metrics>,
    /// The prefix being read, and how much of it has arrived.
    prefix: [u8; PREFIX_BYTES],
    have: usize,
    /// Bytes of the current message still to pass.
    remaining: usize,
    /// A message was refused: the body ends.
    refused: bool,
}

impl Declared {
    fn new(inner: Body, limit: usize, method: Method, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            limit,
            method,
            metrics,
            prefix: [0; PREFIX_BYTES],
            have: 0,
            remaining: 0,
            refused: false,
        }
    }

    /// Follows the message framing through `data`; the length a message
    /// declares, if it is over the limit.
    fn check(&mut self, mut data: &[u8]) -> Result<(), usize> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
                continue;
            }
            let n = (PREFIX_BYTES - self.have).min(data.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == PREFIX_BYTES {
                self.have = 0;
                let [_, a, b, c, d] = self.prefix;
                let declared = u32::from_be_bytes([a, b, c, d]) as usize;
                if declared > self.limit {
                    return Err(declared);
                }
                self.remaining = declared;
            }
        }
        Ok(())
    }
}

impl HttpBody for Declared {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.refused {
            return Poll::Ready(None);
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let data = match &frame {
            Some(Ok(frame)) => frame.data_ref(),
            _ => None,
        };
        if let Some(data) = data
            && let Err(declared) = this.check(data)
        {
            this.refused = true;
            let limit = this.limit;
            let e = ApiError::new(
                Refusal::TooLarge,
                ErrorCode::Malformed,
                format!(
                    "a {} message is limited to {limit} bytes; this one declares {declared}",
                    this.method.name()
                ),
            );
            let refusal = status(e);
            count(&this.metrics, this.method, "too_large", refusal.code());
            tracing::debug!(
                method = this.method.name(),
                declared,
                limit,
                "gRPC message over its method's limit"
            );
            return Poll::Ready(Some(Err(refusal)));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.refused || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(limit: usize) -> Declared {
        Declared::new(
            Body::empty(),
            limit,
            Method::Publish,
            Arc::new(Metrics::new()),
        )
    }

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend(std::iter::repeat_n(b'x', len as usize));
        m
    }

    #[test]
    fn the_framing_is_followed_across_chunks_and_a_large_declaration_is_caught() {
        // Two messages at the limit, cut at every possible point.
        let mut stream = message(10);
        stream.extend(message(0));
        stream.extend(message(10));
        for cut in 0..stream.len() {
            let mut body = declared(10);
            let (a, b) = stream.split_at(cut);
            assert_eq!(body.check(a), Ok(()), "cut at {cut}");
            assert_eq!(body.check(b), Ok(()), "cut at {cut}");
        }
        // The third message declares 11: caught on its prefix, wherever it
        // is cut, before any of its bytes.
        let mut stream = message(10);
        stream.extend(&message(11)[..PREFIX_BYTES]);
        for cut in 0..stream.len() {
            let mut body = declared(10);
            let (a, b) = stream.split_at(cut);
            let result = body.check(a).and_then(|()| body.check(b));
            assert_eq!(result, Err(11), "cut at {cut}");
        }
        let mut body = declared(10);
        assert_eq!(
            body.check(&[0, 0xff, 0xff, 0xff, 0xff]),
            Err(u32::MAX as usize)
        );
    }

    #[test]
    fn a_method_is_named_by_its_path() {
        assert_eq!(Method::of("/herald.v1.Publisher/Publish"), Method::Publish);
        assert_eq!(
            Method::of("/herald.v1.Publisher/PublishBatch"),
            Method::PublishBatch
        );
        assert_eq!(Method::of("/herald.v1.Publisher/Nope"), Method::Unknown);
        assert_eq!(Method::of("/other.Service/Publish"), Method::Unknown);
        let limits = Limits::new(64 * 1024);
        assert_eq!(
            limits.of(Method::Publish),
            64 * 1024 + REQUEST_OVERHEAD_BYTES
        );
        assert_eq!(limits.of(Method::PublishBatch), publish::MAX_BATCH_BYTES);
        assert_eq!(limits.of(Method::TopicInfo), MAX_SMALL_REQUEST_BYTES);
    }
}
