//! The listeners: accepts TCP connections, serves HTTP/1.1 on each, routes
//! requests, upgrades `/ws`, runs the gRPC server ([`grpc`]) beside, and
//! drains on shutdown.
//!
//! With `http.api_listen` the backend API (`/v1/*`) and `/metrics` are served
//! on a listener of their own and the client-facing one serves only `/ws`,
//! `/healthz` and `/readyz`. Each API request runs under
//! `http.request_timeout` (its body; on the API listener its head too, while
//! on the shared listener a head is bounded by `websocket.handshake_timeout`)
//! and takes one of
//! `http.max_concurrent_requests` slots; health probes take none, so that a
//! flood of slow requests never starves them.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Either;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderValue, ORIGIN, RETRY_AFTER, SEC_WEBSOCKET_VERSION};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::admission::Refusal;
use crate::config::Config;
use crate::deflate::negotiation;
use crate::frame::Format;
use crate::http::{self, Body};
use crate::listener::{self, ACCEPT_BACKOFF};
use crate::node::{Node, StartError};
use crate::{grpc, session, stream_commands, streams, subprotocol};

/// The sockets a gateway serves, bound by the caller.
pub struct Listeners {
    /// HTTP: the WebSocket endpoint, health, and the HTTP API unless it has
    /// its own listener (`listen`).
    pub http: TcpListener,
    /// The HTTP API and metrics alone (`http.api_listen`); `None`: on `http`.
    pub api: Option<TcpListener>,
    /// The gRPC publish API (`grpc.listen`); `None` serves none.
    pub grpc: Option<TcpListener>,
}

/// HTTP alone.
impl From<TcpListener> for Listeners {
    fn from(http: TcpListener) -> Self {
        Self {
            http,
            api: None,
            grpc: None,
        }
    }
}

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    /// `/ws` and health, and the API when it has no listener of its own.
    Clients { with_api: bool },
    /// The API and metrics, and health.
    Api,
}

/// Serves `listeners` with `config` until `shutdown` resolves, then drains:
/// `/readyz` turns 503 and upgrades are refused with 503 (the HTTP listener
/// stays open, so that probes see it), the gRPC listener closes and its calls
/// in flight finish, every client gets `reconnect` and a 1012 close, and this
/// returns once they are gone or `shutdown.drain_timeout` has passed.
pub async fn run(
    config: Config,
    listeners: impl Into<Listeners>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let node = Node::start(config).await?;
    serve(node, listeners, shutdown).await;
    Ok(())
}

/// [`run`] with a node built by the caller (tests read its metrics).
pub async fn serve(
    node: Arc<Node>,
    listeners: impl Into<Listeners>,
    shutdown: impl Future<Output = ()>,
) {
    let Listeners {
        http: listener,
        api,
        grpc,
    } = listeners.into();
    let clients = Port::Clients {
        with_api: api.is_none(),
    };
    // Tracked like a connection: the drain waits for it.
    let grpc = grpc.map(|grpc| node.tasks.spawn(grpc::serve(node.clone(), grpc)));
    tokio::pin!(shutdown);
    let drain_deadline = tokio::time::sleep(Duration::MAX);
    tokio::pin!(drain_deadline);
    loop {
        tokio::select! {
            _ = &mut shutdown, if !node.is_draining() => {
                let timeout = node.config.shutdown.drain_timeout;
                tracing::info!(connections = node.metrics.connections.get(), ?timeout, "draining");
                node.drain.cancel();
                let advised = node.live.drain(timeout);
                tracing::debug!(advised, "reconnect advice queued");
                node.tasks.close();
                drain_deadline.as_mut().reset(tokio::time::Instant::now() + timeout);
            }
            _ = node.tasks.wait(), if node.is_draining() => break,
            _ = &mut drain_deadline => {
                tracing::warn!(
                    remaining = node.metrics.connections.get(),
                    "drain timeout passed; dropping the connections left"
                );
                break;
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    node.tasks.spawn(connection(stream, peer, node.clone(), clients));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            accepted = accept(api.as_ref()) => match accepted {
                Ok((stream, peer)) => {
                    node.tasks.spawn(connection(stream, peer, node.clone(), Port::Api));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed on the API listener");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    // Past the drain timeout, stop waiting for the gRPC server too (its
    // connections, tasks of tonic's own, end with the runtime).
    if let Some(grpc) = grpc {
        grpc.abort();
    }
    // Only once the clients are gone (or the drain timed out): their users
    // are lingering members now.
    node.presence.depart().await;
    // Its last events (closes, vacated) to the backend, bounded.
    node.pod.webhooks.flush().await;
}

/// The next connection on `listener`; never, without one.
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

async fn connection(stream: TcpStream, peer: SocketAddr, node: Arc<Node>, port: Port) {
    let unsent = match port {
        Port::Clients { .. } => node.config.websocket.unsent_bytes,
        _ => 0,
    };
    if let Err(e) = listener::tune(&stream, unsent) {
        tracing::debug!(%peer, error = %e, "socket options not set");
    }
    // `GET /sse` and `POST /stream` keep the raw socket (see
    // `crate::streams`), in a task of their own, as an upgraded WebSocket
    // is: this one's future is sized for hyper's connection, which an idle
    // stream should not carry for its whole life (issue #16's budget).
    if matches!(port, Port::Clients { .. }) && node.config.streams.enabled {
        let timeout = node.config.websocket.handshake_timeout;
        if let Some(format) = streams::sniff(&stream, timeout).await {
            let tasks = node.tasks.clone();
            tasks.spawn(streams::serve(stream, peer, node, format));
            return;
        }
    }
    // Told of each request as it starts (a permit is kept until the drain
    // asks), so that the drain knows whether this connection has one yet.
    let requested = Arc::new(Notify::new());
    let service = {
        let node = node.clone();
        let requested = requested.clone();
        service_fn(move |req| {
            requested.notify_one();
            respond(req, node.clone(), peer, port)
        })
    };
    // A connection that arrives while the pod drains gets one answer (a
    // probe's 503, say) and is closed.
    let draining = node.is_draining();
    // A request's head must arrive before its route is known: on the API
    // listener every head is an API request's, so `http.request_timeout`
    // bounds it as it bounds the body; on the client listener it is the
    // WebSocket handshake's.
    let head_timeout = match port {
        Port::Api => node.config.http.request_timeout,
        Port::Clients { .. } => node.config.websocket.handshake_timeout,
    };
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .keep_alive(!draining)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = if draining {
        conn.await
    } else {
        tokio::select! {
            result = conn.as_mut() => result,
            _ = node.drain.cancelled() => {
                // hyper's graceful shutdown closes a connection with no
                // request in progress at once, unanswered: right for one idle
                // between requests, wrong for one accepted before the signal
                // whose first request (a probe's, say) is still on its way.
                // That one gets its answer first; its head timeout bounds the
                // wait.
                tokio::select! {
                    result = conn.as_mut() => result,
                    _ = requested.notified() => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                }
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "http connection ended");
    }
}

/// A stream request that came after another on its connection (the first
/// of a connection was sniffed before hyper: [`streams::sniff`]), through
/// hyper's body; anything else, [`route`]d.
async fn respond(
    req: Request<Incoming>,
    node: Arc<Node>,
    peer: SocketAddr,
    port: Port,
) -> Result<Response<streams::Reply>, Infallible> {
    let stream = match (req.method(), req.uri().path()) {
        (&Method::GET, "/sse") => Some(Format::Sse),
        (&Method::POST, "/stream") => Some(Format::Ndjson),
        _ => None,
    };
    if let Some(format) = stream
        && matches!(port, Port::Clients { .. })
        && node.config.streams.enabled
    {
        return Ok(streams::serve_hyper(req, &node, peer, format).await);
    }
    let response = route(req, node, peer, port).await;
    response.map(|r| r.map(Either::Left))
}

async fn route(
    req: Request<Incoming>,
    node: Arc<Node>,
    peer: SocketAddr,
    port: Port,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    let api_here = matches!(port, Port::Api | Port::Clients { with_api: true });
    let ws_here = matches!(port, Port::Clients { .. });
    let response = match (req.method(), path) {
        (&Method::GET, "/healthz") => http::text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") if node.is_draining() => {
            http::text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
        }
        (&Method::GET, "/readyz") => match node.not_ready() {
            Some(why) => http::text(StatusCode::SERVICE_UNAVAILABLE, &format!("{why}\n")),
            None => http::text(StatusCode::OK, "ready\n"),
        },
        (_, "/healthz" | "/readyz") => {
            http::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
        }
        (&Method::GET, "/ws") if ws_here => upgrade(req, node, peer),
        (&Method::OPTIONS, path)
            if ws_here
                && node.config.streams.enabled
                && (path == "/sse" || path == "/stream" || path.starts_with("/stream/")) =>
        {
            // A stream's own preflight closes its connection: the stream comes next.
            let stream = !path.starts_with("/stream/");
            streams::preflight(&node, req.headers().get(ORIGIN), stream)
        }
        (_, "/ws") if ws_here => http::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
        // HTTP-streaming's commands, for a session held here or elsewhere
        // (their preflight is the streams' above).
        (&Method::POST, p)
            if ws_here && node.config.streams.enabled && p.starts_with("/stream/") =>
        {
            stream_commands::post(req, &node, peer).await
        }
        (
            _,
            "/v1/publish" | "/v1/publish/batch" | "/v1/disconnect" | "/v1/admin/status"
            | "/v1/history" | "/v1/subscribe" | "/v1/unsubscribe" | "/v1/presence"
            | "/v1/presence/stats" | "/metrics",
        ) if api_here => limited(req, &node).await,
        _ => http::text(StatusCode::NOT_FOUND, "not found\n"),
    };
    Ok(response)
}

/// An API request, within the pod's request slots and deadline.
async fn limited(req: Request<Incoming>, node: &Node) -> Response<Body> {
    // Refused at a limit: the connection closes, so that its slot (and file
    // descriptor) goes with the answer.
    let refused = |status, body| {
        let mut response = http::text(status, body);
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        response
    };
    let Some(_slot) = node.api_slot() else {
        let mut response = refused(StatusCode::SERVICE_UNAVAILABLE, "busy\n");
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    };
    let timeout = node.config.http.request_timeout;
    let handled = async {
        match (req.method(), req.uri().path()) {
            (&Method::POST, "/v1/publish") => http::publish(req, node).await,
            (&Method::POST, "/v1/publish/batch") => http::publish_batch(req, node).await,
            (&Method::POST, "/v1/disconnect") => http::disconnect(req, node).await,
            (&Method::GET, "/v1/history") => http::history(&req, node).await,
            (&Method::POST, "/v1/subscribe") => http::subscription(req, node, true).await,
            (&Method::POST, "/v1/unsubscribe") => http::subscription(req, node, false).await,
            (&Method::GET, "/v1/presence") => http::presence(req, node).await,
            (&Method::GET, "/v1/presence/stats") => http::presence_stats(req, node).await,
            (&Method::GET, "/metrics") => http::metrics(node),
            (&Method::GET, "/v1/admin/status") => http::admin_status(&req, node),
            _ => http::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
        }
    };
    match tokio::time::timeout(timeout, handled).await {
        Ok(response) => response,
        Err(_) => {
            node.metrics
                .http_rejected
                .with_label_values(&["timeout"])
                .inc();
            refused(StatusCode::REQUEST_TIMEOUT, "request timeout\n")
        }
    }
}

/// Checks the handshake, takes a connection slot and hands the upgraded
/// connection to a session task. The 101 must go out before the upgrade
/// completes, so the session runs in its own task.
fn upgrade(mut req: Request<Incoming>, node: Arc<Node>, peer: SocketAddr) -> Response<Body> {
    let reject = |reason: &str, status, message| {
        node.metrics
            .upgrades_rejected
            .with_label_values(&[reason])
            .inc();
        http::text(status, message)
    };
    if !fastwebsockets::upgrade::is_upgrade_request(&req) {
        return reject(
            "bad_handshake",
            StatusCode::BAD_REQUEST,
            "expected a WebSocket upgrade\n",
        );
    }
    if node.is_draining() {
        return reject("draining", StatusCode::SERVICE_UNAVAILABLE, "draining\n");
    }
    // Refused before the upgrade, as a draining pod refuses: a client that
    // got a session here could not be served (4003 is for a resume that
    // cannot be restored now, on a pod that otherwise works).
    if let Some(why) = node.not_ready() {
        let mut response = reject(
            "not_ready",
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("not ready: {why}\n"),
        );
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    }
    let origin = req.headers().get(ORIGIN).map(HeaderValue::as_bytes);
    if !node.config.websocket.allows_origin(origin) {
        return reject("origin", StatusCode::FORBIDDEN, "origin not allowed\n");
    }
    // RFC 6455 4.4: refuse other versions and name the one spoken here.
    if req
        .headers()
        .get(SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(b"13")
    {
        let mut response = reject(
            "bad_handshake",
            StatusCode::BAD_REQUEST,
            "unsupported WebSocket version; this server speaks 13\n",
        );
        response
            .headers_mut()
            .insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        return response;
    }
    let ip = listener::client_ip(peer, req.headers(), &node.config.http.trusted_proxies);
    let admission = match node.slots.admit(ip) {
        Ok(admission) => admission,
        Err(refusal) => {
            let (reason, message) = match refusal {
                Refusal::AtCapacity => ("at_capacity", "at capacity\n"),
                Refusal::PerIp => ("per_ip", "too many connections from your address\n"),
            };
            let mut response = reject(reason, StatusCode::SERVICE_UNAVAILABLE, message);
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
    };
    let (mut response, upgrading) = match fastwebsockets::upgrade::upgrade(&mut req) {
        Ok(upgrade) => upgrade,
        Err(e) => {
            drop(admission);
            return reject("bad_handshake", StatusCode::BAD_REQUEST, &format!("{e}\n"));
        }
    };
    // permessage-deflate, where the client offers it and the pod allows it;
    // the JSON protocol, or `herald.v1.protobuf` where the client offers it.
    let deflate = negotiation::answer(
        req.headers(),
        response.headers_mut(),
        node.config.websocket.compression.settings(),
    );
    let protocol = subprotocol::answer(req.headers(), response.headers_mut());
    node.metrics
        .connections_protocol
        .with_label_values(&[protocol.label()])
        .inc();
    let format = protocol.format(deflate);
    // Only where a connect proxy is configured: what it is told of this
    // request, until the client's `hello`.
    let handshake = session::Handshake::capture(&node.pod.hooks, req.headers(), ip);
    let tasks = node.tasks.clone();
    tasks.spawn(async move {
        // The socket alone, out of its `WebSocket` (and this `match`) before
        // the connection's long await: what is kept across it stays in the
        // task's state for the connection's whole life.
        let upgraded = match upgrading.await {
            Ok(ws) => ws.into_inner().into_inner(),
            Err(e) => {
                tracing::debug!(error = %e, "upgrade did not complete");
                return;
            }
        };
        session::serve_upgraded(upgraded, node.pod.clone(), admission, handshake, format).await;
    });
    response.map(|_| Body::default())
}
