//! The HTTP JSON transport of the proxies (docs/hooks.md): each request a
//! JSON object POSTed to the proxy's URL through the pod's one pooled
//! keep-alive client; the answer read into the bytes [`super::reply`]
//! parses, or classified: 401, 403, a redirect (never followed: the backend
//! is configured, not discovered, and a redirect of a POST would send the
//! client's cookies to wherever it points), another status, a wrong content
//! type, a body over `proxy.max_response_bytes`.

use std::net::IpAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, USER_AGENT};
use hyper::{Request, Response, StatusCode, Uri, body::Incoming};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{self, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::value::RawValue;

use super::call::Denied;
use super::{Failure, HookError, reply};
use crate::telemetry;

/// How long an idle connection to a backend is kept for the next call.
const POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(4);

/// The pod's HTTP client for every HTTP proxy: plain, or with rustls for
/// `https://` (and `http://`) where some proxy's URL is `https://` (so a pod
/// without root certificates needs none unless it calls HTTPS).
pub(super) enum Client {
    Http(legacy::Client<HttpConnector, Full<Bytes>>),
    Https(legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>),
}

impl Client {
    pub(super) fn new(https: bool) -> Result<Self, std::io::Error> {
        let mut builder = legacy::Client::builder(TokioExecutor::new());
        // An idle connection is let go before common backends close theirs
        // (Node's 5 s): a request sent just as the server closes it would
        // fail, and is not retried (a publish or rpc is not idempotent).
        // Calls more often than this keep one connection.
        builder
            .pool_idle_timeout(POOL_IDLE)
            .pool_timer(TokioTimer::new());
        let mut connector = HttpConnector::new();
        // Small requests and answers, waited on by a client: no Nagle delay.
        connector.set_nodelay(true);
        if !https {
            return Ok(Client::Http(builder.build(connector)));
        }
        connector.enforce_http(false);
        // ring, named as `auth::jwks` names it: one rustls provider.
        let https = HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::ring::default_provider())?
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        Ok(Client::Https(builder.build(https)))
    }

    /// POSTs `body` to `uri`; the answer's body when it is the reply (a 200
    /// of JSON within `max_bytes`).
    pub(super) async fn post(
        &self,
        uri: &Uri,
        body: Bytes,
        max_bytes: usize,
    ) -> Result<Bytes, Denied> {
        let mut request = Request::post(uri.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, concat!("herald/", env!("CARGO_PKG_VERSION")));
        if let Some(traceparent) = telemetry::traceparent(&tracing::Span::current()) {
            request = request.header("traceparent", traceparent);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| Denied::failed(Failure::Connect, e))?;
        let sent = match self {
            Client::Http(client) => client.request(request).await,
            Client::Https(client) => client.request(request).await,
        };
        let response = sent.map_err(|e| Denied::failed(Failure::Connect, Causes(&e)))?;
        answer(response, max_bytes).await
    }
}

/// The reply's body, or what the status says.
async fn answer(response: Response<Incoming>, max_bytes: usize) -> Result<Bytes, Denied> {
    let status = response.status();
    match status {
        StatusCode::OK => {}
        StatusCode::UNAUTHORIZED => {
            let message = message(response, max_bytes).await;
            return Err(Denied::Refusal(HookError::Unauthorized(message)));
        }
        StatusCode::FORBIDDEN => {
            let message = message(response, max_bytes).await;
            return Err(Denied::Refusal(HookError::Forbidden(message)));
        }
        status if status.is_redirection() => {
            let to = response
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .unwrap_or("");
            return Err(Denied::failed(
                Failure::Redirect,
                format_args!("{status} to `{to}` (redirects are not followed)"),
            ));
        }
        status => return Err(Denied::failed(Failure::Status, status)),
    }
    let json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .is_some_and(is_json);
    if !json {
        let found = response.headers().get(CONTENT_TYPE);
        return Err(Denied::failed(
            Failure::ContentType,
            format_args!("content type {found:?}, not application/json"),
        ));
    }
    read(response, max_bytes).await
}

/// Whether a `Content-Type` is JSON's: `application/json`, with any
/// parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// The whole body, refused beyond `max_bytes` (by its declared length
/// before reading any, or as it comes).
async fn read(response: Response<Incoming>, max_bytes: usize) -> Result<Bytes, Denied> {
    let declared = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|l| l.to_str().ok())
        .and_then(|l| l.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max_bytes as u64) {
        return Err(too_large(max_bytes));
    }
    match Limited::new(response.into_body(), max_bytes)
        .collect()
        .await
    {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(max_bytes)),
        Err(e) => Err(Denied::failed(
            Failure::Connect,
            format_args!("reading the answer: {e}"),
        )),
    }
}

fn too_large(max_bytes: usize) -> Denied {
    Denied::failed(
        Failure::TooLarge,
        format_args!("the answer is over proxy.max_response_bytes ({max_bytes})"),
    )
}

/// A refusal's `{"message": "..."}`, if its body has one (within bounds).
async fn message(response: Response<Incoming>, max_bytes: usize) -> String {
    #[derive(serde::Deserialize)]
    struct Body {
        message: String,
    }
    let Ok(body) = read(response, max_bytes).await else {
        return String::new();
    };
    match serde_json::from_slice::<Body>(&body) {
        Ok(Body { message }) => reply::bounded(message),
        Err(_) => String::new(),
    }
}

/// An error with its causes, for the log (hyper's say little alone:
/// "client error (Connect)").
struct Causes<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// The body of a connect proxy's request.
#[derive(Serialize)]
pub(super) struct ConnectBody<'a> {
    pub client: String,
    pub pod: &'a str,
    pub transport: &'static str,
    pub remote_addr: IpAddr,
    pub headers: Headers<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<&'a RawValue>,
}

/// Forwarded headers as a JSON object (names lower-case already).
pub(super) struct Headers<'a>(pub &'a [(Box<str>, Box<str>)]);

impl Serialize for Headers<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

#[derive(Serialize)]
pub(super) struct RefreshBody<'a> {
    pub client: String,
    pub pod: &'a str,
    pub user: &'a str,
}

#[derive(Serialize)]
pub(super) struct SubscribeBody<'a> {
    pub client: String,
    pub pod: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
    pub topic: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<&'a RawValue>,
}

#[derive(Serialize)]
pub(super) struct PublishBody<'a> {
    pub client: String,
    pub pod: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
    pub topic: &'a str,
    pub data: &'a RawValue,
}

#[derive(Serialize)]
pub(super) struct RpcBody<'a> {
    pub client: String,
    pub pod: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
    pub method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<&'a RawValue>,
}

/// A request body as JSON text.
pub(super) fn json(body: &impl Serialize) -> Result<Bytes, Denied> {
    serde_json::to_vec(body).map(Bytes::from).map_err(|e| {
        Denied::failed(
            Failure::Malformed,
            format_args!("encoding the request: {e}"),
        )
    })
}
