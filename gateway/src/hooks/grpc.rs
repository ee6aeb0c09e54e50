//! The gRPC transport of the proxies: Herald a client of the backend's
//! `herald.v1.ProxyBackend` (`proto/herald/v1/hooks.proto`), over one
//! channel per proxy that connects when first used (and again after a
//! failure), so that a backend down when the pod starts costs only the
//! calls that need it. `UNAUTHENTICATED` and `PERMISSION_DENIED` are the
//! backend's refusals; any other status is a failure.

use std::time::Duration;

use proto::v1::proxy_backend_client::ProxyBackendClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::call::Denied;
use super::{Failure, HookError, reply};
use crate::telemetry;

/// How tonic words a reply over the decoding limit (an `OUT_OF_RANGE`).
const TOO_LARGE: &str = "Error, decoded message length too large";

/// One proxy's client.
#[derive(Clone)]
pub(super) struct Client {
    inner: ProxyBackendClient<Channel>,
    timeout: Duration,
}

impl Client {
    /// A client of the backend at `uri` (`http://host:port`). Needs a tokio
    /// runtime (the channel's worker is a task).
    pub(super) fn new(uri: hyper::Uri, timeout: Duration, max_bytes: usize) -> Self {
        let channel = Endpoint::from(uri)
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        let inner = ProxyBackendClient::new(channel).max_decoding_message_size(max_bytes);
        Self { inner, timeout }
    }

    /// A copy to call with (tonic's calls take `&mut`; the channel is
    /// shared).
    pub(super) fn handle(&self) -> ProxyBackendClient<Channel> {
        self.inner.clone()
    }

    /// `message` as a request with the proxy's deadline (`grpc-timeout`:
    /// the backend may give up when Herald will), and the caller's trace.
    pub(super) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        if let Some(traceparent) = telemetry::traceparent(&tracing::Span::current())
            && let Ok(value) = traceparent.parse()
        {
            request.metadata_mut().insert("traceparent", value);
        }
        request
    }
}

/// A call's status, as the session sees it.
pub(super) fn denied(status: Status) -> Denied {
    let message = reply::bounded(status.message().to_owned());
    match status.code() {
        Code::Unauthenticated => Denied::Refusal(HookError::Unauthorized(message)),
        Code::PermissionDenied => Denied::Refusal(HookError::Forbidden(message)),
        // The deadline Herald sent (`grpc-timeout`) passed: servers answer
        // either (tonic's: `CANCELLED`), maybe a moment before Herald's own
        // timer fires.
        Code::DeadlineExceeded | Code::Cancelled => Denied::failed(Failure::Timeout, status),
        Code::OutOfRange if message.starts_with(TOO_LARGE) => {
            Denied::failed(Failure::TooLarge, status)
        }
        // No connection: tonic's own status, with the transport's error.
        Code::Unavailable if std::error::Error::source(&status).is_some() => {
            Denied::failed(Failure::Connect, status)
        }
        _ => Denied::failed(Failure::Status, status),
    }
}
