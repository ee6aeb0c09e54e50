//! The application's backend, inside the load tool: one hyper HTTP/1.1
//! server on 127.0.0.1:0 (keep-alive, as the pods' pooled clients use it)
//! answering the connect proxy (`POST /connect`) and the publish proxy
//! (`POST /publish`) after a fixed delay, and receiving webhooks (`POST
//! /events`), which it counts and does not verify.
//!
//! It times itself: each proxy call from the handler's start to its answer
//! (the delay is a tokio sleep, whose timer has 1 ms ticks, so "1 ms" is
//! 1 to 2 ms), so that the scenario can take the backend's own time out of
//! what the client measured. A publish's time is kept under the key the
//! client put in its data (`{"k": <key>}`), to be subtracted per publish.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Error;
use crate::latency::micros;

/// The connect proxy's path.
pub const CONNECT_PATH: &str = "/connect";
/// The publish proxy's path.
pub const PUBLISH_PATH: &str = "/publish";
/// The webhooks' path.
pub const EVENTS_PATH: &str = "/events";
/// The cookie a client names its user by: `Cookie: session=<user>`.
pub const SESSION_COOKIE: &str = "session";
/// Largest request body read (a webhook batch of 100 publishes is well under it).
const MAX_BODY_BYTES: usize = 4 << 20;

/// The backend's server; it stops when dropped.
pub struct Backend {
    pub addr: SocketAddr,
    pub tally: Arc<Tally>,
    accept: JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// What the backend saw and how long it took.
#[derive(Debug, Default)]
pub struct Tally {
    delay: Duration,
    /// The connect proxy's own time per call, µs.
    connect_us: Mutex<Vec<u32>>,
    /// Connect calls whose user came from the forwarded cookie.
    cookies: AtomicU64,
    /// The publish proxy's own time per call, µs, by the publish's key.
    publish_us: Mutex<HashMap<u64, u32>>,
    /// Requests it could not read (a body that is not the contract's).
    bad: Mutex<(u64, Option<String>)>,
    events: Mutex<Events>,
}

/// The webhooks received.
#[derive(Debug, Default)]
pub struct Events {
    /// Events received, duplicates (a retried batch) included.
    pub received: u64,
    /// Distinct event ids.
    pub ids: HashSet<String>,
    pub by_type: BTreeMap<String, u64>,
    /// Events per POST.
    pub batch_sizes: Vec<u32>,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tally {
    /// The connect proxy's times since the last call.
    pub fn take_connect(&self) -> Vec<u32> {
        std::mem::take(&mut *lock(&self.connect_us))
    }

    /// Connect calls named by their cookie since the last call.
    pub fn take_cookies(&self) -> u64 {
        self.cookies.swap(0, Ordering::Relaxed)
    }

    /// The publish proxy's times since the last call, by key.
    pub fn take_publish(&self) -> HashMap<u64, u32> {
        std::mem::take(&mut *lock(&self.publish_us))
    }

    /// Requests it could not read, and the last one's reason.
    pub fn bad(&self) -> (u64, Option<String>) {
        lock(&self.bad).clone()
    }

    /// The webhooks received since the last call.
    pub fn take_events(&self) -> Events {
        std::mem::take(&mut *lock(&self.events))
    }

    /// Distinct webhook events received so far.
    pub fn distinct_events(&self) -> usize {
        lock(&self.events).ids.len()
    }

    fn bad_request(&self, reason: String) {
        let mut bad = lock(&self.bad);
        bad.0 += 1;
        bad.1 = Some(reason);
    }
}

impl Backend {
    /// Listens on 127.0.0.1:0; each proxy call answers `delay` after it came.
    pub async fn start(delay: Duration) -> Result<Self, Error> {
        let io = |e: std::io::Error| Error::Options(format!("the backend's listener: {e}"));
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let tally = Arc::new(Tally {
            delay,
            ..Tally::default()
        });
        let shared = Arc::clone(&tally);
        let accept = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // Out of descriptors for a moment: try again shortly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let tally = Arc::clone(&shared);
                connections.spawn(async move {
                    let service = service_fn(move |request| {
                        let tally = Arc::clone(&tally);
                        async move { Ok::<_, Infallible>(answer(&tally, request).await) }
                    });
                    // A pod that goes away mid-request is no error of the run.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                // Reap the finished ones so the set stays small.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            tally,
            accept,
        })
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// The connect proxy's request, as far as the backend reads it.
#[derive(Deserialize)]
struct Connect {
    /// A string by the contract; read leniently (a number would do).
    #[serde(default)]
    client: serde_json::Value,
    #[serde(default)]
    headers: HashMap<String, String>,
}

/// The publish proxy's request: the data's key.
#[derive(Deserialize)]
struct Publish<'a> {
    #[serde(borrow)]
    data: &'a RawValue,
}

#[derive(Deserialize)]
struct Keyed {
    k: u64,
}

#[derive(Deserialize)]
struct Batch {
    events: Vec<Event>,
}

#[derive(Deserialize)]
struct Event {
    /// A string by the contract; kept as its JSON text.
    id: Box<RawValue>,
    #[serde(rename = "type")]
    kind: String,
}

async fn answer(tally: &Tally, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let path = request.uri().path().to_owned();
    if request.method() != Method::POST {
        return status(StatusCode::METHOD_NOT_ALLOWED);
    }
    let body = match Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            tally.bad_request(format!("{path}: reading the body: {e}"));
            return status(StatusCode::BAD_REQUEST);
        }
    };
    match path.as_str() {
        CONNECT_PATH => match serde_json::from_slice::<Connect>(&body) {
            Ok(connect) => {
                let (user, by_cookie) = user_of(&connect);
                if by_cookie {
                    tally.cookies.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(tally.delay).await;
                let reply = json(serde_json::json!({ "user": user }).to_string());
                lock(&tally.connect_us).push(micros(started.elapsed()));
                reply
            }
            Err(e) => {
                tally.bad_request(format!("{path}: {e}"));
                status(StatusCode::BAD_REQUEST)
            }
        },
        PUBLISH_PATH => {
            let key = serde_json::from_slice::<Publish<'_>>(&body)
                .and_then(|p| serde_json::from_str::<Keyed>(p.data.get()));
            match key {
                Ok(Keyed { k }) => {
                    tokio::time::sleep(tally.delay).await;
                    let reply = json("{}".to_owned());
                    lock(&tally.publish_us).insert(k, micros(started.elapsed()));
                    reply
                }
                Err(e) => {
                    tally.bad_request(format!("{path}: {e}"));
                    status(StatusCode::BAD_REQUEST)
                }
            }
        }
        EVENTS_PATH => match serde_json::from_slice::<Batch>(&body) {
            Ok(batch) => {
                let now = Instant::now();
                let mut events = lock(&tally.events);
                events.first.get_or_insert(now);
                events.last = Some(now);
                events.received += batch.events.len() as u64;
                events
                    .batch_sizes
                    .push(u32::try_from(batch.events.len()).unwrap_or(u32::MAX));
                for event in batch.events {
                    *events.by_type.entry(event.kind).or_default() += 1;
                    events.ids.insert(event.id.get().to_owned());
                }
                status(StatusCode::NO_CONTENT)
            }
            Err(e) => {
                tally.bad_request(format!("{path}: {e}"));
                status(StatusCode::BAD_REQUEST)
            }
        },
        _ => status(StatusCode::NOT_FOUND),
    }
}

/// The user a connect names by its cookie (`session=<user>`), else the
/// connection's id; whether it was the cookie.
fn user_of(connect: &Connect) -> (String, bool) {
    let cookie = connect.headers.get("cookie").and_then(|cookie| {
        cookie.split(';').find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == SESSION_COOKIE && !value.is_empty()).then(|| value.to_owned())
        })
    });
    match cookie {
        Some(user) => (user, true),
        None => match &connect.client {
            serde_json::Value::String(id) => (format!("c{id}"), false),
            other => (format!("c{other}"), false),
        },
    }
}

fn json(body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = code;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_is_the_session_cookie_or_the_connection() {
        let connect = |cookie: Option<&str>| Connect {
            client: serde_json::json!("17"),
            headers: cookie
                .map(|c| ("cookie".to_owned(), c.to_owned()))
                .into_iter()
                .collect(),
        };
        assert_eq!(
            user_of(&connect(Some("a=1; session=u42"))),
            ("u42".to_owned(), true)
        );
        assert_eq!(
            user_of(&connect(Some("session="))),
            ("c17".to_owned(), false)
        );
        assert_eq!(user_of(&connect(None)), ("c17".to_owned(), false));
    }
}
