//! The pod's one webhook sender: batches, signs, POSTs and retries.
//!
//! One task per pod takes events off the [queue](super::queue) into a batch
//! (up to `batch_size` events, or what came within `batch_interval` of the
//! first), and POSTs it. A batch the backend did not acknowledge with a 2xx
//! (or that timed out) is sent again, the same body with the same ids,
//! after 100 ms, doubling up to 5 s, for `retry_for`; then it is dropped
//! and counted. Batches leave one at a time, in order: events of one topic
//! reach the backend in the order they happened on this pod. While a batch
//! is retried the queue fills, and past its bound new events are dropped.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, USER_AGENT};
use hyper::{Request, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::Sha256;
use tokio::time::Instant;

use super::event::{Stamped, encode_batch};
use super::queue::Drain;
use crate::config::WebhooksConfig;
use crate::metrics::Metrics;

/// The first wait before a batch is sent again.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two tries of a batch.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Most bytes of a backend's answer read (and dropped): only its status
/// counts, and an endless one must cost neither memory nor the POST's whole
/// timeout. Past it the connection is not kept.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The signature header: `sha256=<lower-case hex of HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "x-herald-signature";

/// Where batches go: plain HTTP, or HTTPS with rustls.
enum Http {
    Plain(Client<HttpConnector, Full<Bytes>>),
    Tls(Client<HttpsConnector<HttpConnector>, Full<Bytes>>),
}

/// What the sender needs, from the configuration.
pub struct Sender {
    url: Uri,
    http: Http,
    secret: Vec<u8>,
    instance: Arc<str>,
    batch_size: usize,
    batch_interval: Duration,
    timeout: Duration,
    retry_for: Duration,
    metrics: Arc<Metrics>,
}

/// Why a POST was not acknowledged (for the log).
#[derive(Debug, thiserror::Error)]
enum PostError {
    #[error("HTTP status {0}")]
    Status(u16),
    #[error("timed out")]
    Timeout,
    #[error(transparent)]
    Request(#[from] hyper_util::client::legacy::Error),
    #[error(transparent)]
    Build(#[from] hyper::http::Error),
}

/// `sha256=<hex>` of `body` under `secret`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    use std::fmt::Write;
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for byte in digest {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

impl Sender {
    /// `None` with the reason when the URL or the TLS roots are unusable
    /// (validation checked the URL already).
    pub fn new(
        config: &WebhooksConfig,
        instance: Arc<str>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        let url: Uri = config
            .url
            .parse()
            .map_err(|e| format!("webhooks.url: {e}"))?;
        let secret = config.secret()?;
        let builder = Client::builder(TokioExecutor::new());
        let http = if url.scheme_str() == Some("https") {
            let https = HttpsConnectorBuilder::new()
                .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
                .map_err(|e| format!("webhooks: no TLS roots: {e}"))?
                .https_only()
                .enable_http1()
                .build();
            Http::Tls(builder.build(https))
        } else {
            Http::Plain(builder.build_http())
        };
        Ok(Self {
            url,
            http,
            secret,
            instance,
            batch_size: config.batch_size.max(1),
            batch_interval: config.batch_interval,
            timeout: config.timeout,
            retry_for: config.retry_for,
            metrics,
        })
    }

    /// Sends batches until every queue end is gone.
    pub async fn run(self, mut drain: Drain, pending: Arc<super::Pending>) {
        let mut batch: Vec<Stamped> = Vec::with_capacity(self.batch_size);
        while let Some(first) = drain.next().await {
            batch.push(first);
            let deadline = Instant::now() + self.batch_interval;
            while batch.len() < self.batch_size {
                match drain.next_by(deadline).await {
                    Some(event) => batch.push(event),
                    None => break,
                }
            }
            self.deliver(&batch).await;
            pending.done(batch.len());
            batch.clear();
        }
    }

    /// Sends one batch until acknowledged or `retry_for` is over.
    async fn deliver(&self, batch: &[Stamped]) {
        let body = Bytes::from(encode_batch(&self.instance, batch));
        let signature = sign(&self.secret, &body);
        let give_up = Instant::now() + self.retry_for;
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let started = Instant::now();
            let posted = self.post(body.clone(), &signature).await;
            self.metrics
                .webhook_post_seconds
                .observe(started.elapsed().as_secs_f64());
            match posted {
                Ok(()) => {
                    self.count(batch, "sent");
                    self.metrics
                        .webhook_batches
                        .with_label_values(&["sent"])
                        .inc();
                    return;
                }
                Err(e) => {
                    self.metrics
                        .webhook_batches
                        .with_label_values(&["failed"])
                        .inc();
                    if Instant::now() + backoff > give_up {
                        self.count(batch, "dropped_retries");
                        self.metrics
                            .webhook_batches
                            .with_label_values(&["dropped"])
                            .inc();
                        tracing::warn!(events = batch.len(), tries, error = %e, "webhooks: a batch was not acknowledged within retry_for: dropped");
                        return;
                    }
                    if tries == 1 {
                        tracing::warn!(events = batch.len(), error = %e, "webhooks: the backend did not acknowledge a batch: retrying");
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    fn count(&self, batch: &[Stamped], result: &str) {
        for stamped in batch {
            self.metrics
                .webhook_events
                .with_label_values(&[stamped.event.kind().as_str(), result])
                .inc();
        }
    }

    /// One POST, its answer read whole, within `timeout`.
    async fn post(&self, body: Bytes, signature: &str) -> Result<(), PostError> {
        let request = Request::post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, concat!("herald/", env!("CARGO_PKG_VERSION")))
            .header(SIGNATURE_HEADER, signature)
            .body(Full::new(body))?;
        let call = async {
            let response = match &self.http {
                Http::Plain(client) => client.request(request).await?,
                Http::Tls(client) => client.request(request).await?,
            };
            let status = response.status();
            // Read (and drop) the answer, so the connection is kept alive.
            let _ = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await;
            if status.is_success() {
                Ok(())
            } else {
                Err(PostError::Status(status.as_u16()))
            }
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or(Err(PostError::Timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_endless_answer_is_read_no_further_than_its_bound() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/events", listener.local_addr().expect("addr"));
        // A 200 whose chunked body never ends.
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = vec![0; 64 * 1024];
            let _ = socket.read(&mut request).await;
            let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
            socket.write_all(head.as_bytes()).await.expect("head");
            let chunk = format!("{:x}\r\n{}\r\n", 4096, "x".repeat(4096));
            while socket.write_all(chunk.as_bytes()).await.is_ok() {}
        });
        let config = WebhooksConfig {
            url,
            secret: "s".repeat(32),
            timeout: Duration::from_secs(60),
            ..WebhooksConfig::default()
        };
        let sender =
            Sender::new(&config, Arc::from("pod"), Arc::new(Metrics::new())).expect("a sender");
        // Without the bound, the read would go on to the 60 s timeout.
        let posted = tokio::time::timeout(
            Duration::from_secs(30),
            sender.post(Bytes::from_static(b"{}"), "sha256=00"),
        )
        .await
        .expect("the answer's read stopped at its bound");
        assert!(posted.is_ok(), "{posted:?}");
        server.abort();
    }

    #[test]
    fn the_signature_is_rfc_4231s_hmac_sha256_in_lower_case_hex() {
        // RFC 4231, test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
