//! A webhook receiver: an HTTP server on 127.0.0.1:0 that records every
//! POST (headers and raw body) and answers 200, or 500 while told to fail.
//! The test reads what was acknowledged as events, de-duplicated by id or
//! not, and waits (bounded) for what it expects.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// One POST as it arrived.
#[derive(Debug, Clone)]
pub struct Post {
    /// Header names lower-case.
    pub headers: HashMap<String, String>,
    pub body: Bytes,
    /// Whether it was answered 200 (else 500).
    pub acknowledged: bool,
}

impl Post {
    /// Its events (none when the body is not the batch JSON).
    pub fn events(&self) -> Vec<Value> {
        serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|v| v["events"].as_array().cloned())
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct Shared {
    posts: Mutex<Vec<Post>>,
    failing: AtomicBool,
    arrived: Notify,
}

/// The receiver; its server stops when it is dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Receiver {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared::default());
        let serving = shared.clone();
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| record(shared.clone(), request));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            shared,
            server,
        }
    }

    /// The URL to configure as `webhooks.url`.
    pub fn url(&self) -> String {
        format!("http://{}/herald/events", self.addr)
    }

    /// Answer 500 to every POST while `on`.
    pub fn fail(&self, on: bool) {
        self.shared.failing.store(on, Ordering::SeqCst);
    }

    /// Every POST so far, in arrival order.
    pub fn posts(&self) -> Vec<Post> {
        self.shared.posts.lock().unwrap().clone()
    }

    /// The events of the acknowledged POSTs, in arrival order (a batch
    /// acknowledged twice would be here twice).
    pub fn events(&self) -> Vec<Value> {
        self.posts()
            .iter()
            .filter(|p| p.acknowledged)
            .flat_map(Post::events)
            .collect()
    }

    /// Waits (at most `within`) until the acknowledged events satisfy
    /// `done`; they are returned either way, for the test's assertion.
    pub async fn wait_for(&self, within: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let arrived = self.shared.arrived.notified();
            let events = self.events();
            if done(&events) {
                return events;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return self.events();
            }
        }
    }
}

async fn record(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let headers = request
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let acknowledged = !shared.failing.load(Ordering::SeqCst);
    shared.posts.lock().unwrap().push(Post {
        headers,
        body,
        acknowledged,
    });
    shared.arrived.notify_waiters();
    let status = if acknowledged {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    Ok(response)
}
