//! The listeners: accepts TCP connections, serves HTTP/1.1 on each, routes
//! requests, upgrades `/ws`, runs the gRPC server ([`grpc`]) beside, and
//! drains on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ORIGIN, RETRY_AFTER, SEC_WEBSOCKET_VERSION};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpListener, TcpStream};

use crate::config::Config;
use crate::node::Node;
use crate::{api, grpc, session};

/// Keepalive probes start after this much TCP silence.
const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(60);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Pause after a failed `accept` (out of file descriptors, say), so that the
/// loop does not spin while the condition lasts.
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

pub type Body = Full<Bytes>;

/// The sockets a gateway serves, bound by the caller.
pub struct Listeners {
    /// HTTP: the WebSocket endpoint and the HTTP API (`listen`).
    pub http: TcpListener,
    /// The gRPC publish API (`grpc.listen`); `None` serves none.
    pub grpc: Option<TcpListener>,
}

/// HTTP alone.
impl From<TcpListener> for Listeners {
    fn from(http: TcpListener) -> Self {
        Self { http, grpc: None }
    }
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
) -> Result<(), router::BrokerError> {
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
        grpc,
    } = listeners.into();
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
                    node.tasks.spawn(connection(stream, peer, node.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
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
}

async fn connection(stream: TcpStream, peer: SocketAddr, node: Arc<Node>) {
    if let Err(e) = tune(&stream) {
        tracing::debug!(%peer, error = %e, "socket options not set");
    }
    let service = {
        let node = node.clone();
        service_fn(move |req| route(req, node.clone()))
    };
    // A connection that arrives while the pod drains gets one answer (a
    // probe's 503, say) and is closed.
    let draining = node.is_draining();
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(node.config.websocket.handshake_timeout)
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
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "http connection ended");
    }
}

/// TCP_NODELAY (frames go out as soon as they are written) and keepalive
/// (half-open connections are found even where no ping gets through).
pub(crate) fn tune(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let keepalive = TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_TIME)
        .with_interval(TCP_KEEPALIVE_INTERVAL);
    SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

async fn route(req: Request<Incoming>, node: Arc<Node>) -> Result<Response<Body>, Infallible> {
    let response = match (req.method(), req.uri().path()) {
        (&Method::GET, "/ws") => upgrade(req, node),
        (&Method::POST, "/v1/publish") => api::publish(req, &node).await,
        (&Method::GET, "/healthz") => api::text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") if node.is_draining() => {
            api::text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
        }
        (&Method::GET, "/readyz") => api::text(StatusCode::OK, "ready\n"),
        (&Method::GET, "/metrics") => api::metrics(&node),
        (_, "/ws" | "/v1/publish" | "/healthz" | "/readyz" | "/metrics") => {
            api::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
        }
        _ => api::text(StatusCode::NOT_FOUND, "not found\n"),
    };
    Ok(response)
}

/// Checks the handshake, takes a connection slot and hands the upgraded
/// connection to a session task. The 101 must go out before the upgrade
/// completes, so the session runs in its own task.
fn upgrade(mut req: Request<Incoming>, node: Arc<Node>) -> Response<Body> {
    let reject = |reason: &str, status, message| {
        node.metrics
            .upgrades_rejected
            .with_label_values(&[reason])
            .inc();
        api::text(status, message)
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
    if !origin_allowed(
        &node.config.websocket.allowed_origins,
        req.headers().get(ORIGIN),
    ) {
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
    let Some(admission) = node.admit() else {
        let mut response = reject(
            "at_capacity",
            StatusCode::SERVICE_UNAVAILABLE,
            "at capacity\n",
        );
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    };
    let (response, upgrading) = match fastwebsockets::upgrade::upgrade(&mut req) {
        Ok(upgrade) => upgrade,
        Err(e) => {
            drop(admission);
            return reject("bad_handshake", StatusCode::BAD_REQUEST, &format!("{e}\n"));
        }
    };
    let tasks = node.tasks.clone();
    tasks.spawn(async move {
        match upgrading.await {
            Ok(ws) => session::serve_upgraded(ws, node, admission).await,
            Err(e) => tracing::debug!(error = %e, "upgrade did not complete"),
        }
    });
    response.map(|_| Body::default())
}

fn origin_allowed(allowed: &[String], origin: Option<&HeaderValue>) -> bool {
    if allowed.is_empty() {
        return true;
    }
    origin
        .and_then(|o| o.to_str().ok())
        .is_some_and(|o| allowed.iter().any(|a| a.eq_ignore_ascii_case(o)))
}
