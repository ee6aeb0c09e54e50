//! Keys from a JWKS URL: fetched at start, again every refresh interval, and
//! again when a token names a key we do not have (the issuer may have
//! rotated; OpenID Connect Core 10.1.1), at most once per
//! `jwks_min_refetch`. A fetch that fails, or brings no usable key, keeps
//! the last good keys.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{ACCEPT, USER_AGENT};
use hyper::{Request, Response, StatusCode, Uri, body::Incoming};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::Jwk;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::key::{Key, Rules};
use super::{AuthError, Refused};

/// Longest a JWKS fetch may take, connecting and reading the body included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest JWKS document read, in bytes.
const MAX_JWKS_BYTES: usize = 256 * 1024;

/// Why a fetch brought no keys; the last good keys stay.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("timed out after {FETCH_TIMEOUT:?}")]
    Timeout,
    #[error("building the request: {0}")]
    Build(#[from] hyper::http::Error),
    #[error("request failed: {0}")]
    Request(#[from] hyper_util::client::legacy::Error),
    #[error("HTTP status {0}")]
    Status(StatusCode),
    #[error("reading the body: {0}")]
    Body(Box<dyn std::error::Error + Send + Sync>),
    #[error("not a JWKS document: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no usable key in the document")]
    NoUsableKeys,
}

/// Where a JWKS URL is fetched from: plain HTTP, or HTTPS with rustls.
enum Fetcher {
    Http(Client<HttpConnector, Empty<Bytes>>),
    Https(Client<HttpsConnector<HttpConnector>, Empty<Bytes>>),
}

impl Fetcher {
    fn new(url: &Uri) -> Result<Self, AuthError> {
        let builder = Client::builder(TokioExecutor::new());
        if url.scheme_str() != Some("https") {
            return Ok(Fetcher::Http(builder.build_http()));
        }
        // ring, named rather than left to rustls' process default: no other
        // crate in the gateway brings a rustls provider, and naming one keeps
        // a second provider added later from making rustls panic.
        let https = HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
            .map_err(AuthError::Roots)?
            .https_only()
            .enable_http1()
            .build();
        Ok(Fetcher::Https(builder.build(https)))
    }

    async fn get(&self, url: &Uri) -> Result<Response<Incoming>, FetchError> {
        let request = Request::get(url.clone())
            .header(ACCEPT, "application/jwk-set+json, application/json")
            .header(USER_AGENT, concat!("herald/", env!("CARGO_PKG_VERSION")))
            .body(Empty::new())?;
        Ok(match self {
            Fetcher::Http(client) => client.request(request).await?,
            Fetcher::Https(client) => client.request(request).await?,
        })
    }
}

/// The keys of one JWKS document, by `kid`.
#[derive(Debug, Default)]
struct KeySet {
    by_kid: HashMap<Box<str>, Arc<Key>>,
    /// Keys without a `kid`.
    unnamed: Vec<Arc<Key>>,
}

impl KeySet {
    /// The key a token names; a token without `kid` gets the document's
    /// only key, if it has just one.
    fn find(&self, kid: Option<&str>) -> Option<Arc<Key>> {
        match kid {
            Some(kid) => self.by_kid.get(kid).cloned(),
            None if self.len() == 1 => self.by_kid.values().chain(&self.unnamed).next().cloned(),
            None => None,
        }
    }

    fn len(&self) -> usize {
        self.by_kid.len() + self.unnamed.len()
    }

    /// The usable keys of a document; the others are logged and skipped.
    fn parse(document: &[u8], rules: &Rules) -> Result<Self, FetchError> {
        // Each key on its own: one key of a type we do not know must not
        // cost us the others.
        #[derive(Deserialize)]
        struct Document {
            keys: Vec<Box<RawValue>>,
        }
        let document: Document = serde_json::from_slice(document)?;
        let mut set = KeySet::default();
        for raw in document.keys {
            let jwk = match serde_json::from_str::<Jwk>(raw.get()) {
                Ok(jwk) => jwk,
                Err(error) => {
                    tracing::warn!(%error, "JWKS: skipped a key that is not a JWK");
                    continue;
                }
            };
            let kid = jwk.common.key_id.as_deref();
            let key = match Key::from_jwk(&jwk, rules) {
                Ok(key) => Arc::new(key),
                Err(error) => {
                    tracing::warn!(kid, %error, "JWKS: skipped a key");
                    continue;
                }
            };
            match kid {
                None => set.unnamed.push(key),
                Some(kid) if set.by_kid.contains_key(kid) => {
                    tracing::warn!(kid, "JWKS: skipped a second key with the same kid");
                }
                Some(kid) => {
                    set.by_kid.insert(kid.into(), key);
                }
            }
        }
        if set.len() == 0 {
            return Err(FetchError::NoUsableKeys);
        }
        Ok(set)
    }
}

/// The keys of a JWKS URL, kept fresh.
pub(super) struct Jwks {
    url: Uri,
    fetcher: Fetcher,
    rules: Rules,
    min_refetch: Duration,
    /// Replaced whole by a good fetch; a verification clones the `Arc`.
    keys: RwLock<Arc<KeySet>>,
    /// Held through every fetch, so that fetches never overlap and callers
    /// waiting on an unknown `kid` share one; holds when the last refetch
    /// for an unknown `kid` started.
    fetching: tokio::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Jwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwks")
            .field("url", &self.url)
            .field("keys", &self.current().len())
            .finish_non_exhaustive()
    }
}

impl Jwks {
    /// No keys until the first [`refresh`](Jwks::refresh).
    pub fn new(url: Uri, rules: Rules, min_refetch: Duration) -> Result<Self, AuthError> {
        Ok(Jwks {
            fetcher: Fetcher::new(&url)?,
            url,
            rules,
            min_refetch,
            keys: RwLock::new(Arc::default()),
            fetching: tokio::sync::Mutex::new(None),
        })
    }

    fn current(&self) -> Arc<KeySet> {
        // A panic cannot leave the set half-written: it is only ever swapped.
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The key for a token's `kid`, fetching the JWKS again if it is not
    /// known and the last such refetch is at least `min_refetch` old.
    pub async fn key(&self, kid: Option<&str>) -> Result<Arc<Key>, Refused> {
        if let Some(key) = self.current().find(kid) {
            return Ok(key);
        }
        let mut last_refetch = self.fetching.lock().await;
        // A fetch we waited for may have brought it.
        if let Some(key) = self.current().find(kid) {
            return Ok(key);
        }
        if last_refetch.is_none_or(|at| at.elapsed() >= self.min_refetch) {
            *last_refetch = Some(Instant::now());
            self.fetch_logged().await;
        }
        drop(last_refetch);
        let keys = self.current();
        keys.find(kid).ok_or(if keys.len() == 0 {
            Refused::NoKeys
        } else {
            Refused::UnknownKey
        })
    }

    /// Fetches the JWKS now (waiting for a fetch under way to end first).
    pub async fn refresh(&self) {
        let _fetching = self.fetching.lock().await;
        self.fetch_logged().await;
    }

    /// Refreshes every `every` until `stop` is cancelled.
    pub fn spawn_refresh(self: &Arc<Self>, every: Duration, stop: CancellationToken) {
        let jwks = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + every, every);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            // Dropping an unfinished refresh only drops its connection: the
            // key set is swapped whole or not at all.
            let refreshes = async {
                loop {
                    tick.tick().await;
                    jwks.refresh().await;
                }
            };
            stop.run_until_cancelled(refreshes).await;
        });
    }

    /// Fetches and swaps in the keys; on failure, logs and keeps the old ones.
    async fn fetch_logged(&self) {
        match tokio::time::timeout(FETCH_TIMEOUT, self.fetch()).await {
            Ok(Ok(set)) => {
                tracing::debug!(url = %self.url, keys = set.len(), "JWKS fetched");
                *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(set);
            }
            Ok(Err(error)) => self.failed(&error),
            Err(_) => self.failed(&FetchError::Timeout),
        }
    }

    fn failed(&self, error: &FetchError) {
        let keys = self.current().len();
        tracing::warn!(url = %self.url, %error, keys, "JWKS fetch failed; keeping the keys we have");
    }

    async fn fetch(&self) -> Result<KeySet, FetchError> {
        let response = self.fetcher.get(&self.url).await?;
        if response.status() != StatusCode::OK {
            return Err(FetchError::Status(response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_JWKS_BYTES)
            .collect()
            .await
            .map_err(FetchError::Body)?
            .to_bytes();
        KeySet::parse(&body, &self.rules)
    }
}

/// A JWKS URL: `http://` or `https://` with a host.
pub(super) fn parse_url(url: &str) -> Result<Uri, &'static str> {
    let uri: Uri = url.parse().map_err(|_| "not a URL")?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some_and(|h| !h.is_empty()) => Ok(uri),
        _ => Err("must be an http:// or https:// URL with a host"),
    }
}
