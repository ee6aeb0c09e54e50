//! A programmable application backend for the proxies' tests (issue #24,
//! docs/hooks.md): an HTTP JSON server ([`HttpBackend`]) and a gRPC
//! `herald.v1.ProxyBackend` server ([`GrpcBackend`]), each on 127.0.0.1:0,
//! answering every request with what the test's handler says ([`Answer`])
//! and recording every request ([`Request`]).
//!
//! One handler serves both: the gRPC backend hands it the call as the HTTP
//! backend would see it (path `/connect`, `/refresh`, `/subscribe`,
//! `/publish` or `/rpc`, the request's fields as the HTTP contract's JSON
//! object) and turns its [`Answer`] into the proto reply (a 401 is
//! `UNAUTHENTICATED`, a 403 `PERMISSION_DENIED`, [`Answer::grpc`] any code).
//!
//! Both die with the test: dropping the backend stops its listener and
//! every connection it accepted.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use proto::v1::proxy_backend_server::{ProxyBackend, ProxyBackendServer};
use proto::v1::{
    ConnectProxyReply, ConnectProxyRequest, ProxyError, PublishProxyReply, PublishProxyRequest,
    RefreshProxyRequest, RpcProxyReply, RpcProxyRequest, SubscribeProxyReply,
    SubscribeProxyRequest,
};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::{AbortHandle, JoinSet};

/// How long [`Answer::hang`] waits: longer than any test (the backend's
/// tasks end with it).
const HANG: Duration = Duration::from_secs(3600);

/// One request the backend received.
#[derive(Debug, Clone)]
pub struct Request {
    /// The HTTP request's path (`/connect`); for gRPC, the method's name as
    /// that path (`/connect`, `/refresh`, `/subscribe`, `/publish`, `/rpc`).
    pub path: String,
    /// Request headers (gRPC: metadata), names lower-case.
    pub headers: BTreeMap<String, String>,
    /// The body as JSON (`Value::Null` if it was not JSON; see `raw`).
    pub body: Value,
    /// The body's bytes (gRPC: the JSON of `body`).
    pub raw: Bytes,
}

impl Request {
    /// A header's value (name case does not matter).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// What the backend answers.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// `None`: no `Content-Type` header.
    pub content_type: Option<String>,
    pub body: Bytes,
    /// Waits this long before answering.
    pub delay: Option<Duration>,
    /// More response headers (e.g. a redirect's `location`).
    pub headers: Vec<(String, String)>,
    /// gRPC only: answer with this status instead.
    pub grpc: Option<tonic::Code>,
}

impl Answer {
    /// 200, `application/json`, `value`.
    pub fn json(value: Value) -> Self {
        Answer {
            status: 200,
            content_type: Some("application/json".into()),
            body: Bytes::from(value.to_string()),
            delay: None,
            headers: Vec::new(),
            grpc: None,
        }
    }

    /// `status`, an empty JSON object as body (gRPC: 401
    /// `UNAUTHENTICATED`, 403 `PERMISSION_DENIED`, any other non-200
    /// `INTERNAL`).
    pub fn status(status: u16) -> Self {
        Answer {
            status,
            ..Answer::json(json!({}))
        }
    }

    /// A body of any bytes, with any content type (`None`: no header).
    pub fn raw(status: u16, content_type: Option<&str>, body: impl Into<Bytes>) -> Self {
        Answer {
            status,
            content_type: content_type.map(str::to_owned),
            body: body.into(),
            ..Answer::json(json!({}))
        }
    }

    /// Never answers (within any test's time).
    pub fn hang() -> Self {
        Answer::json(json!({})).delayed(HANG)
    }

    /// A gRPC status (the HTTP backend answers 500).
    pub fn grpc(code: tonic::Code) -> Self {
        Answer {
            grpc: Some(code),
            ..Answer::status(500)
        }
    }

    /// The same answer after `delay`.
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// The same answer with one more header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

type Handler = Arc<dyn Fn(&Request) -> Answer + Send + Sync>;

/// What both backends share: the handler and the record.
struct State {
    handler: Handler,
    requests: Mutex<Vec<Request>>,
    connections: AtomicUsize,
}

impl State {
    fn new(handler: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(State {
            handler: Arc::new(handler),
            requests: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
        })
    }

    /// Records `request` and returns the handler's answer, after its delay.
    async fn answer(&self, request: Request) -> Answer {
        let answer = (self.handler)(&request);
        self.requests.lock().unwrap().push(request);
        if let Some(delay) = answer.delay {
            tokio::time::sleep(delay).await;
        }
        answer
    }
}

/// An HTTP/1.1 JSON backend on 127.0.0.1:0 (keep-alive).
pub struct HttpBackend {
    addr: SocketAddr,
    state: Arc<State>,
    server: AbortHandle,
}

impl HttpBackend {
    /// Starts serving: every request is answered with `handler`'s answer.
    pub async fn start(handler: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = State::new(handler);
        let server = tokio::spawn(serve_http(listener, state.clone())).abort_handle();
        HttpBackend {
            addr,
            state,
            server,
        }
    }

    /// `http://127.0.0.1:port{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request so far, in order of arrival.
    pub fn requests(&self) -> Vec<Request> {
        self.state.requests.lock().unwrap().clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Stops listening and drops every connection: the port refuses from
    /// now on (the backend is down).
    pub fn stop(&self) {
        self.server.abort();
    }
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Accepts until aborted; the connections are tasks of a set it owns, so
/// they end with it.
async fn serve_http(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                state.connections.fetch_add(1, Ordering::SeqCst);
                let state = state.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(http_answer(&state, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn http_answer(
    state: &State,
    request: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let raw = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let headers = parts
        .headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        })
        .collect();
    let request = Request {
        path: parts.uri.path().to_owned(),
        headers,
        body: serde_json::from_slice(&raw).unwrap_or(Value::Null),
        raw,
    };
    let answer = state.answer(request).await;
    let mut response = hyper::Response::builder().status(answer.status);
    if let Some(content_type) = &answer.content_type {
        response = response.header("content-type", content_type);
    }
    for (name, value) in &answer.headers {
        response = response.header(name, value);
    }
    response.body(Full::new(answer.body)).unwrap()
}

/// A gRPC `herald.v1.ProxyBackend` server on 127.0.0.1:0.
pub struct GrpcBackend {
    addr: SocketAddr,
    state: Arc<State>,
    server: AbortHandle,
}

impl GrpcBackend {
    /// Starts serving: every call is answered with `handler`'s answer (see
    /// the module's documentation for how a call maps to a [`Request`]).
    pub async fn start(handler: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = State::new(handler);
        let counted = state.clone();
        let incoming = futures_util::stream::unfold(listener, move |listener| {
            let counted = counted.clone();
            async move {
                let accepted = listener.accept().await.map(|(stream, _)| stream);
                if accepted.is_ok() {
                    counted.connections.fetch_add(1, Ordering::SeqCst);
                }
                Some((accepted, listener))
            }
        });
        let service = ProxyBackendServer::new(Grpc {
            state: state.clone(),
        });
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming(service, incoming)
                .await;
        })
        .abort_handle();
        GrpcBackend {
            addr,
            state,
            server,
        }
    }

    /// `grpc://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("grpc://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every call so far, in order of arrival.
    pub fn requests(&self) -> Vec<Request> {
        self.state.requests.lock().unwrap().clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Stops the server (the port refuses from now on).
    pub fn stop(&self) {
        self.server.abort();
    }
}

impl Drop for GrpcBackend {
    fn drop(&mut self) {
        self.server.abort();
    }
}

struct Grpc {
    state: Arc<State>,
}

impl Grpc {
    /// The handler's JSON reply to `body` at `path`, or the status it says.
    async fn call(
        &self,
        path: &str,
        metadata: &tonic::metadata::MetadataMap,
        body: Value,
    ) -> Result<Value, tonic::Status> {
        let headers = metadata
            .clone()
            .into_headers()
            .iter()
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_owned(), value)
            })
            .collect();
        let request = Request {
            path: path.to_owned(),
            headers,
            raw: Bytes::from(body.to_string()),
            body,
        };
        let answer = self.state.answer(request).await;
        let code = answer.grpc.or(match answer.status {
            200 => None,
            401 => Some(tonic::Code::Unauthenticated),
            403 => Some(tonic::Code::PermissionDenied),
            _ => Some(tonic::Code::Internal),
        });
        if let Some(code) = code {
            return Err(tonic::Status::new(code, "the test backend says so"));
        }
        serde_json::from_slice(&answer.body)
            .map_err(|_| tonic::Status::internal("the test handler's body is not JSON"))
    }
}

/// A JSON value as the JSON text proto `bytes` carry.
fn text(value: Option<&Value>) -> Option<Vec<u8>> {
    value.map(|v| v.to_string().into_bytes())
}

/// JSON text from proto `bytes` as a JSON value (a string if it is not JSON).
fn value(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn strings(value: &Value, key: &str) -> Vec<String> {
    value[key]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn error(reply: &Value) -> Option<ProxyError> {
    let error = reply.get("error")?;
    Some(ProxyError {
        code: error["code"].as_str().unwrap_or_default().to_owned(),
        message: error["message"].as_str().unwrap_or_default().to_owned(),
    })
}

/// Adds `key: value(bytes)` to `object` when `bytes` is there.
fn put(object: &mut Value, key: &str, bytes: Option<&[u8]>) {
    if let Some(bytes) = bytes {
        object[key] = value(bytes);
    }
}

fn connect_reply(reply: Value) -> ConnectProxyReply {
    ConnectProxyReply {
        user: reply["user"].as_str().unwrap_or_default().to_owned(),
        info: text(reply.get("info")),
        subscribe: strings(&reply, "subscribe"),
        publish: strings(&reply, "publish"),
        topics: strings(&reply, "topics"),
        expires: reply["expires"].as_u64(),
        error: error(&reply),
    }
}

#[tonic::async_trait]
impl ProxyBackend for Grpc {
    async fn connect(
        &self,
        request: tonic::Request<ConnectProxyRequest>,
    ) -> Result<tonic::Response<ConnectProxyReply>, tonic::Status> {
        let r = request.get_ref();
        let mut body = json!({
            "client": r.client, "pod": r.pod, "transport": r.transport,
            "remote_addr": r.remote_addr, "headers": r.headers,
        });
        put(&mut body, "data", r.data.as_deref());
        let reply = self.call("/connect", request.metadata(), body).await?;
        Ok(tonic::Response::new(connect_reply(reply)))
    }

    async fn refresh(
        &self,
        request: tonic::Request<RefreshProxyRequest>,
    ) -> Result<tonic::Response<ConnectProxyReply>, tonic::Status> {
        let r = request.get_ref();
        let body = json!({"client": r.client, "pod": r.pod, "user": r.user});
        let reply = self.call("/refresh", request.metadata(), body).await?;
        Ok(tonic::Response::new(connect_reply(reply)))
    }

    async fn subscribe(
        &self,
        request: tonic::Request<SubscribeProxyRequest>,
    ) -> Result<tonic::Response<SubscribeProxyReply>, tonic::Status> {
        let r = request.get_ref();
        let mut body = json!({"client": r.client, "pod": r.pod, "topic": r.topic});
        if let Some(user) = &r.user {
            body["user"] = json!(user);
        }
        put(&mut body, "data", r.data.as_deref());
        let reply = self.call("/subscribe", request.metadata(), body).await?;
        Ok(tonic::Response::new(SubscribeProxyReply {
            info: text(reply.get("info")),
            data: text(reply.get("data")),
            error: error(&reply),
        }))
    }

    async fn publish(
        &self,
        request: tonic::Request<PublishProxyRequest>,
    ) -> Result<tonic::Response<PublishProxyReply>, tonic::Status> {
        let r = request.get_ref();
        let mut body = json!({"client": r.client, "pod": r.pod, "topic": r.topic});
        if let Some(user) = &r.user {
            body["user"] = json!(user);
        }
        put(&mut body, "data", Some(&r.data));
        let reply = self.call("/publish", request.metadata(), body).await?;
        Ok(tonic::Response::new(PublishProxyReply {
            data: text(reply.get("data")),
            skip: reply["skip"].as_bool().unwrap_or(false),
            error: error(&reply),
        }))
    }

    async fn rpc(
        &self,
        request: tonic::Request<RpcProxyRequest>,
    ) -> Result<tonic::Response<RpcProxyReply>, tonic::Status> {
        let r = request.get_ref();
        let mut body = json!({"client": r.client, "pod": r.pod, "method": r.method});
        if let Some(user) = &r.user {
            body["user"] = json!(user);
        }
        put(&mut body, "data", r.data.as_deref());
        let reply = self.call("/rpc", request.metadata(), body).await?;
        Ok(tonic::Response::new(RpcProxyReply {
            data: text(reply.get("data")),
            error: error(&reply),
        }))
    }
}
