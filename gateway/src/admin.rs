//! `GET /v1/admin/status`: what a pod holds and how its broker stands, read
//! only, on the API listener with the API keys; its plain-text form, which
//! `herald status` prints; and the client that asks for it
//! ([`Status::fetch`]).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::{StatusCode, Uri, header};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

use crate::node::Node;

/// Longest [`Status::fetch`] waits for a pod, from connecting to the last
/// byte of its answer.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer [`Status::fetch`] reads, in bytes: a status is well under
/// a KiB, so anything near this is not one.
pub const FETCH_MAX_BYTES: usize = 1024 * 1024;
/// How much of an unexpected answer's body an error quotes, in characters.
const QUOTED_CHARS: usize = 200;

/// The status of one pod, as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The binary's version.
    pub version: String,
    /// The pod's name (`HERALD_POD_NAME`, `POD_NAME`, or host and suffix).
    pub pod: String,
    /// Whether `/readyz` answers 200.
    pub ready: bool,
    /// Why not, when it is not (draining, or Redis not reached yet).
    pub not_ready: Option<String>,
    pub draining: bool,
    /// Open WebSocket connections.
    pub connections: i64,
    /// Sessions served by those connections.
    pub sessions: usize,
    /// Topics with a subscriber on this pod.
    pub topics: i64,
    /// Subscriptions of this pod's connections.
    pub subscriptions: i64,
    pub broker: BrokerState,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerState {
    /// `memory` or `redis`.
    pub kind: String,
    /// Whether the pub/sub connection is up now (always, in memory).
    pub connected: bool,
    /// Announcements held aside while topics' history is read.
    pub pubsub_backlog: i64,
    /// The highest lineage clock this pod has seen (Redis).
    pub lineage_clock: Option<u64>,
}

impl Status {
    pub fn of(node: &Node) -> Self {
        let broker = node.broker.status();
        let draining = node.is_draining();
        let not_ready = if draining {
            Some("draining".to_owned())
        } else {
            broker.not_ready
        };
        let metrics = &node.metrics;
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pod: node.pod_name.to_string(),
            ready: not_ready.is_none(),
            not_ready,
            draining,
            connections: metrics.connections.get(),
            sessions: node.live.len(),
            topics: metrics.topics.get(),
            subscriptions: metrics.subscriptions.get(),
            broker: BrokerState {
                kind: broker.kind.to_owned(),
                connected: broker.connected,
                pubsub_backlog: metrics.pubsub_backlog(),
                lineage_clock: broker.lineage_clock,
            },
        }
    }

    /// For a person: a few aligned lines.
    pub fn render(&self) -> String {
        let state = match &self.not_ready {
            None => "ready".to_owned(),
            Some(why) => format!("not ready: {why}"),
        };
        let broker = &self.broker;
        let mut link = if broker.connected {
            "connected".to_owned()
        } else {
            "disconnected".to_owned()
        };
        if broker.kind == "redis" {
            link.push_str(&format!(", pub/sub backlog {}", broker.pubsub_backlog));
        }
        if let Some(clock) = broker.lineage_clock {
            link.push_str(&format!(", lineage clock {clock}"));
        }
        format!(
            "pod            {pod} (herald {version})\n\
             state          {state}\n\
             connections    {connections}\n\
             sessions       {sessions}\n\
             topics         {topics}\n\
             subscriptions  {subscriptions}\n\
             broker         {kind}: {link}\n",
            pod = self.pod,
            version = self.version,
            connections = self.connections,
            sessions = self.sessions,
            topics = self.topics,
            subscriptions = self.subscriptions,
            kind = broker.kind,
        )
    }
}

/// Why [`Status::fetch`] read no status.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("not a URL")]
    Url(#[source] hyper::http::uri::InvalidUri),
    #[error("only http:// URLs with a host (the API listener speaks plain HTTP)")]
    NotHttp,
    /// The key cannot be sent as a header (a control character, say).
    #[error("the request cannot be made (is the API key one line of text?)")]
    Request(#[source] hyper::http::Error),
    #[error("asking the pod")]
    Send(#[source] hyper_util::client::legacy::Error),
    #[error("reading the answer")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the answer is over {FETCH_MAX_BYTES} bytes: not a status")]
    TooLarge,
    /// The pod answered, but not with a status (a wrong key: 401).
    #[error("HTTP {status}: {body}")]
    Refused { status: StatusCode, body: String },
    #[error("not a status: {body}")]
    NotStatus {
        body: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl Status {
    /// `GET /v1/admin/status` from the pod whose API is at `url`
    /// (`http://host:port`; any path is ignored), with `key` as its bearer:
    /// any answer is read (chunked or not) up to [`FETCH_MAX_BYTES`], all
    /// within [`FETCH_TIMEOUT`].
    pub async fn fetch(url: &str, key: Option<&str>) -> Result<Self, FetchError> {
        tokio::time::timeout(FETCH_TIMEOUT, Self::fetch_now(url, key))
            .await
            .unwrap_or(Err(FetchError::Timeout(FETCH_TIMEOUT)))
    }

    async fn fetch_now(url: &str, key: Option<&str>) -> Result<Self, FetchError> {
        let base: Uri = url.parse().map_err(FetchError::Url)?;
        let authority = match (base.scheme_str(), base.authority()) {
            (Some("http"), Some(authority)) if !authority.host().is_empty() => authority.clone(),
            _ => return Err(FetchError::NotHttp),
        };
        let uri = Uri::builder()
            .scheme("http")
            .authority(authority)
            .path_and_query("/v1/admin/status")
            .build()
            .map_err(FetchError::Request)?;
        let mut request = hyper::Request::get(uri);
        if let Some(key) = key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(FetchError::Request)?;
        // One request: the pool's client for its connector (names resolved,
        // `Host` set), not for reuse.
        let client = Client::builder(TokioExecutor::new()).build_http();
        let response = client.request(request).await.map_err(FetchError::Send)?;
        let status = response.status();
        let body = Limited::new(response.into_body(), FETCH_MAX_BYTES)
            .collect()
            .await
            .map(|body| body.to_bytes())
            .map_err(|e| {
                if e.is::<LengthLimitError>() {
                    FetchError::TooLarge
                } else {
                    FetchError::Body(e)
                }
            });
        // A refusal is named by its code, whatever its body.
        if status != StatusCode::OK {
            let body = match &body {
                Ok(body) => quote(body),
                Err(e) => format!("({e})"),
            };
            return Err(FetchError::Refused { status, body });
        }
        let body = body?;
        serde_json::from_slice(&body).map_err(|source| FetchError::NotStatus {
            body: quote(&body),
            source,
        })
    }
}

/// The start of an unexpected body, for an error message: one line, cut at
/// [`QUOTED_CHARS`].
fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match text.char_indices().nth(QUOTED_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None if text.is_empty() => "(empty)".to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_body_is_one_line_cut_at_its_bound() {
        assert_eq!(
            quote(b"  draining,\r\n  come back\tlater \n"),
            "draining, come back later"
        );
        assert_eq!(quote(b""), "(empty)");
        assert_eq!(quote(b"\xff\xfeok"), "\u{fffd}\u{fffd}ok");
        let long = "é".repeat(QUOTED_CHARS + 1);
        let quoted = quote(long.as_bytes());
        assert_eq!(quoted, format!("{}...", "é".repeat(QUOTED_CHARS)));
        assert_eq!(
            quote("é".repeat(QUOTED_CHARS).as_bytes()),
            "é".repeat(QUOTED_CHARS)
        );
    }
}
