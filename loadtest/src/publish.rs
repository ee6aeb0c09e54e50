//! Publishing over HTTP (`POST /v1/publish`), as a backend does: each
//! [`Connection`] is one keep-alive HTTP/1.1 connection (hyper's client
//! `conn`, no pool of hyper's own), and a [`Pool`] shares a few of them
//! between concurrent publishes.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::Error;

/// Longest one publish may take, from sending the request to the whole answer.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The body of a publish: `{"topic":…,"data":…}` with `data` as given (JSON text).
pub fn body(topic: &str, data: &str) -> Bytes {
    let topic = serde_json::to_string(topic).unwrap_or_default();
    Bytes::from(format!(r#"{{"topic":{topic},"data":{data}}}"#))
}

/// One keep-alive HTTP/1.1 connection to a gateway.
pub struct Connection {
    target: SocketAddr,
    host: String,
    sender: SendRequest<Full<Bytes>>,
}

/// The gateway's answer to a publish.
#[derive(Debug, Clone, Deserialize)]
pub struct Published {
    /// The message's seq in its topic.
    pub seq: u64,
    /// The topic's epoch the seq belongs to.
    #[serde(default)]
    pub epoch: String,
}

impl Connection {
    pub async fn open(target: SocketAddr) -> Result<Self, Error> {
        let fail = |reason: String| Error::Publish { target, reason };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target))
            .await
            .map_err(|_| fail("connect timed out".to_owned()))?
            .map_err(|e| {
                let hint = match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => " (is the gateway running?)",
                    _ => "",
                };
                fail(format!("connect: {e}{hint}"))
            })?;
        stream
            .set_nodelay(true)
            .map_err(|e| fail(format!("TCP_NODELAY: {e}")))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| fail(format!("HTTP handshake: {e}")))?;
        // The connection's I/O runs beside; it ends when `sender` is dropped.
        tokio::spawn(conn);
        Ok(Self {
            target,
            host: target.to_string(),
            sender,
        })
    }

    /// A JSON `POST` of `body` to `path`.
    fn post(&self, path: &str, body: Bytes) -> Result<Request<Full<Bytes>>, Error> {
        Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(HOST, &self.host)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| Error::Publish {
                target: self.target,
                reason: format!("request: {e}"),
            })
    }

    /// Posts `body` (see [`body`]) and waits for the answer, at most [`PUBLISH_TIMEOUT`].
    pub async fn publish(&mut self, body: Bytes) -> Result<Published, Error> {
        // The gateway closes a keep-alive connection left idle longer than
        // its header read timeout (a pause between a scenario's phases):
        // nothing was sent on it, so a fresh one serves the same request.
        if self.sender.is_closed() {
            *self = Self::open(self.target).await?;
        }
        let target = self.target;
        let fail = |reason: String| Error::Publish { target, reason };
        let request = self.post("/v1/publish", body)?;
        let exchange = async {
            let (status, body) = round_trip(&mut self.sender, request).await.map_err(fail)?;
            if status != StatusCode::OK {
                return Err(fail(format!(
                    "{status}: {}",
                    String::from_utf8_lossy(&body)
                )));
            }
            serde_json::from_slice::<Published>(&body).map_err(|e| {
                fail(format!(
                    "answer not understood ({e}): {}",
                    String::from_utf8_lossy(&body)
                ))
            })
        };
        tokio::time::timeout(PUBLISH_TIMEOUT, exchange)
            .await
            .map_err(|_| fail(format!("no answer within {PUBLISH_TIMEOUT:?}")))?
    }
}

/// The body of a batch publish, `{"items":[<body>, ...]}` of [`body`]s.
pub fn batch_body(items: impl IntoIterator<Item = Bytes>) -> Bytes {
    let mut out = b"{\"items\":[".to_vec();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&item);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

#[derive(Deserialize)]
struct BatchAnswer {
    results: Vec<serde_json::Value>,
}

impl Connection {
    /// Posts a [`batch_body`] of `items` publishes to `/v1/publish/batch`
    /// and waits for the answer, at most [`PUBLISH_TIMEOUT`]: an error
    /// unless every item was published.
    pub async fn publish_batch(&mut self, body: Bytes, items: usize) -> Result<(), Error> {
        if self.sender.is_closed() {
            *self = Self::open(self.target).await?;
        }
        let target = self.target;
        let fail = |reason: String| Error::Publish { target, reason };
        let request = self.post("/v1/publish/batch", body)?;
        let exchange = async {
            let (status, body) = round_trip(&mut self.sender, request).await.map_err(fail)?;
            let text = || String::from_utf8_lossy(&body).into_owned();
            if status != StatusCode::OK {
                return Err(fail(format!("{status}: {}", text())));
            }
            let answer: BatchAnswer = serde_json::from_slice(&body)
                .map_err(|e| fail(format!("answer not understood ({e}): {}", text())))?;
            let published = answer
                .results
                .iter()
                .filter(|r| r.get("seq").is_some())
                .count();
            if published != items {
                return Err(fail(format!(
                    "{published} of {items} published: {}",
                    text()
                )));
            }
            Ok(())
        };
        tokio::time::timeout(PUBLISH_TIMEOUT, exchange)
            .await
            .map_err(|_| fail(format!("no answer within {PUBLISH_TIMEOUT:?}")))?
    }
}

/// Pause before a publisher reconnects after a failed publish.
pub const RECONNECT_PAUSE: Duration = Duration::from_millis(50);

/// What [`back_to_back`]'s publishers did: each one's tally, and the
/// publishes that failed over all of them.
pub struct BackToBack<T> {
    pub tallies: Vec<T>,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// Publishes back to back on every connection until `deadline`, a task each:
/// of `n` connections, connection `w` sends publishes number `w`, `w + n`,
/// `w + 2n`, ... with the body `make(number)`, and each answer goes to
/// `answered(tally, number, answer, time to the answer)` on its own copy of
/// `tally`. A failed publish drops its connection; a fresh one is opened
/// after [`RECONNECT_PAUSE`].
pub async fn back_to_back<T, M, A>(
    connections: Vec<Connection>,
    deadline: tokio::time::Instant,
    tally: T,
    make: M,
    answered: A,
) -> BackToBack<T>
where
    T: Clone + Send + 'static,
    M: Fn(usize) -> Bytes + Clone + Send + 'static,
    A: Fn(&mut T, usize, Published, Duration) + Clone + Send + 'static,
{
    let step = connections.len();
    let publishers: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(w, connection)| {
            let (mut tally, make, answered) = (tally.clone(), make.clone(), answered.clone());
            tokio::spawn(async move {
                let target = connection.target;
                let (mut errors, mut first_error) = (0, None);
                let mut connection = Some(connection);
                let mut number = w;
                while tokio::time::Instant::now() < deadline {
                    let Some(conn) = connection.as_mut() else {
                        tokio::time::sleep(RECONNECT_PAUSE).await;
                        connection = Connection::open(target).await.ok();
                        continue;
                    };
                    let body = make(number);
                    let sent = tokio::time::Instant::now();
                    match conn.publish(body).await {
                        Ok(answer) => answered(&mut tally, number, answer, sent.elapsed()),
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert(e.to_string());
                            connection = None;
                        }
                    }
                    number += step;
                }
                (tally, errors, first_error)
            })
        })
        .collect();
    let mut done = BackToBack {
        tallies: Vec::with_capacity(step),
        errors: 0,
        first_error: None,
    };
    for publisher in publishers {
        let (tally, errors, first_error) = match publisher.await {
            Ok(finished) => finished,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        done.tallies.push(tally);
        done.errors += errors;
        if done.first_error.is_none() {
            done.first_error = first_error;
        }
    }
    done
}

/// One request on a keep-alive HTTP/1.1 connection: waits until the
/// connection is ready, sends, and reads the whole answer. The error names
/// the step that failed.
pub(crate) async fn round_trip<B>(
    sender: &mut SendRequest<B>,
    request: Request<B>,
) -> Result<(StatusCode, Bytes), String>
where
    B: hyper::body::Body + 'static,
{
    sender
        .ready()
        .await
        .map_err(|e| format!("connection: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("answer: {e}"))?
        .to_bytes();
    Ok((status, body))
}

/// A few keep-alive connections shared by concurrent publishes: a publish
/// waits for a free one. A connection that failed is dropped and replaced by
/// a fresh one on its next use.
pub struct Pool {
    target: SocketAddr,
    idle: Mutex<Vec<Option<Connection>>>,
    free: Semaphore,
}

impl Pool {
    /// Opens `size` connections to `target` (at least one).
    pub async fn open(target: SocketAddr, size: usize) -> Result<Self, Error> {
        let size = size.max(1);
        let mut idle = Vec::with_capacity(size);
        for _ in 0..size {
            idle.push(Some(Connection::open(target).await?));
        }
        Ok(Self {
            target,
            idle: Mutex::new(idle),
            free: Semaphore::new(size),
        })
    }

    /// Waits for a free connection, then builds the body with `make_body`
    /// (so that a send time taken there is not spent waiting) and publishes it.
    pub async fn publish_with(
        &self,
        make_body: impl FnOnce() -> Bytes,
    ) -> Result<Published, Error> {
        let _permit = self.free.acquire().await.map_err(|_| Error::Publish {
            target: self.target,
            reason: "pool closed".to_owned(),
        })?;
        // One permit per slot: a slot is always there to pop.
        let slot = self.lock().pop().flatten();
        let mut connection = match slot {
            Some(c) => c,
            None => match Connection::open(self.target).await {
                Ok(c) => c,
                Err(e) => {
                    self.lock().push(None);
                    return Err(e);
                }
            },
        };
        let result = connection.publish(make_body()).await;
        let keep = result.is_ok().then_some(connection);
        self.lock().push(keep);
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<Connection>>> {
        // Nothing panics while holding it; a poisoned lock still holds good slots.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_carries_data_as_given() {
        assert_eq!(
            body("news", r#"{"t":1,"i":2}"#),
            Bytes::from_static(br#"{"topic":"news","data":{"t":1,"i":2}}"#)
        );
    }
}
