//! `[proxy]` and `[webhooks]`: the application's backend, asked and told
//! ([`crate::hooks`]; docs/hooks.md).

use std::collections::BTreeMap;
use std::time::Duration;

use router::NamespaceSettings;
use serde::Deserialize;

use super::defaults::MAX_DURATION;

/// `[proxy]`: one endpoint per proxy, each off unless its `url` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Calls in flight per proxy per pod: one more is refused at once
    /// (`unavailable`) rather than queued behind a backend that is slow,
    /// so that a slow backend costs memory and sockets within a bound.
    pub max_in_flight: usize,
    /// The largest answer read from a backend, in bytes; a bigger one is a
    /// failure (the connection's claims, a subscription's `info` and an
    /// RPC's reply are held per connection).
    pub max_response_bytes: usize,
    pub connect: Option<Endpoint>,
    pub refresh: Option<Endpoint>,
    pub subscribe: Option<Endpoint>,
    pub publish: Option<Endpoint>,
    pub rpc: Option<Endpoint>,
}

/// `proxy.max_in_flight`'s default.
pub const DEFAULT_PROXY_MAX_IN_FLIGHT: usize = 256;
/// `proxy.max_response_bytes`'s default: 64 KiB.
pub const DEFAULT_PROXY_MAX_RESPONSE_BYTES: usize = 64 * 1024;

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_PROXY_MAX_IN_FLIGHT,
            max_response_bytes: DEFAULT_PROXY_MAX_RESPONSE_BYTES,
            connect: None,
            refresh: None,
            subscribe: None,
            publish: None,
            rpc: None,
        }
    }
}

/// How a proxy's backend is reached, by its URL's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
    /// `grpc://host:port`: the `herald.v1.ProxyBackend` service over
    /// HTTP/2 without TLS.
    Grpc,
}

/// Why a proxy's URL cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("is not a URL")]
    Unparsable,
    #[error("must be http://, https:// or grpc://")]
    Scheme,
    #[error("must name a host")]
    NoHost,
    #[error("must not carry credentials (user@host): send them in headers the backend checks")]
    Credentials,
    #[error("a grpc:// URL is host:port only (no path, no query)")]
    GrpcPath,
}

impl Endpoint {
    /// The URL, parsed and checked: its scheme, and the URI hyper and
    /// tonic are given (`grpc://` becomes `http://`).
    pub fn target(&self) -> Result<(Scheme, hyper::Uri), UrlError> {
        let uri: hyper::Uri = self.url.trim().parse().map_err(|_| UrlError::Unparsable)?;
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            Some("grpc") => Scheme::Grpc,
            _ => return Err(UrlError::Scheme),
        };
        let authority = uri.authority().ok_or(UrlError::NoHost)?;
        if authority.as_str().contains('@') {
            return Err(UrlError::Credentials);
        }
        if authority.host().is_empty() {
            return Err(UrlError::NoHost);
        }
        if scheme != Scheme::Grpc {
            return Ok((scheme, uri));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(UrlError::GrpcPath);
        }
        let http = format!("http://{authority}")
            .parse()
            .map_err(|_| UrlError::Unparsable)?;
        Ok((scheme, http))
    }
}

/// The keys of one `[proxy.*]` table, as a refusal names them.
struct Keys {
    url: &'static str,
    timeout: &'static str,
    headers: &'static str,
}

macro_rules! keys {
    ($table:literal) => {
        Keys {
            url: concat!("proxy.", $table, ".url"),
            timeout: concat!("proxy.", $table, ".timeout"),
            headers: concat!("proxy.", $table, ".headers"),
        }
    };
}

impl ProxyConfig {
    /// The refusal of a bad `[proxy]` setting: its key and why. Checked at
    /// start, so that a pod never runs with a proxy it cannot call.
    pub(super) fn check(
        &self,
        namespaces: &BTreeMap<String, NamespaceSettings>,
    ) -> Result<(), (&'static str, String)> {
        if self.max_in_flight == 0 {
            return Err(("proxy.max_in_flight", "must be at least 1".into()));
        }
        if self.max_response_bytes < 2 {
            return Err((
                "proxy.max_response_bytes",
                "must be at least 2 (the empty reply `{}`)".into(),
            ));
        }
        for (keys, endpoint) in [
            (keys!("connect"), &self.connect),
            (keys!("refresh"), &self.refresh),
            (keys!("subscribe"), &self.subscribe),
            (keys!("publish"), &self.publish),
            (keys!("rpc"), &self.rpc),
        ] {
            let Some(endpoint) = endpoint else { continue };
            if let Err(error) = endpoint.target() {
                return Err((keys.url, format!("`{}` {error}", endpoint.url)));
            }
            if endpoint.timeout.is_zero() {
                return Err((keys.timeout, "must be longer than 0s".into()));
            }
            if endpoint.timeout > MAX_DURATION {
                return Err((keys.timeout, "must be at most 365 days".into()));
            }
            if keys.url != "proxy.connect.url" && !endpoint.headers.is_empty() {
                return Err((
                    keys.headers,
                    "only [proxy.connect] forwards request headers".into(),
                ));
            }
            if let Some(bad) = endpoint
                .headers
                .iter()
                .find(|h| hyper::header::HeaderName::from_bytes(h.as_bytes()).is_err())
            {
                return Err((keys.headers, format!("`{bad}` is not a header name")));
            }
        }
        for (name, namespace) in namespaces {
            if namespace.subscribe_proxy && self.subscribe.is_none() {
                return Err((
                    "proxy.subscribe.url",
                    format!(
                        "namespace `{name}` has subscribe_proxy = true: [proxy.subscribe] needs a url"
                    ),
                ));
            }
            if namespace.publish_proxy && self.publish.is_none() {
                return Err((
                    "proxy.publish.url",
                    format!(
                        "namespace `{name}` has publish_proxy = true: [proxy.publish] needs a url"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// One proxy's backend.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// `http://` or `https://` (HTTP JSON), or `grpc://` (the
    /// `herald.v1.ProxyBackend` service, HTTP/2 without TLS).
    pub url: String,
    /// Longest a call may take.
    #[serde(with = "humantime_serde", default = "default_timeout")]
    pub timeout: Duration,
    /// `[proxy.connect]` only: the request headers forwarded (case does not
    /// matter), e.g. `["Cookie", "Authorization", "Origin"]`.
    #[serde(default)]
    pub headers: Vec<String>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(1)
}

/// The event types a `[webhooks]` backend can be sent.
pub const WEBHOOK_EVENT_TYPES: [&str; 7] = [
    "topic.occupied",
    "topic.vacated",
    "presence.join",
    "presence.leave",
    "client.publish",
    "connection.open",
    "connection.close",
];

/// `webhooks.events` when not set: what a backend needs to follow its rooms,
/// without one event per message or connection.
pub const DEFAULT_WEBHOOK_EVENTS: [&str; 4] = [
    "topic.occupied",
    "topic.vacated",
    "presence.join",
    "presence.leave",
];
/// Events per POST at most.
pub const DEFAULT_WEBHOOK_BATCH_SIZE: usize = 100;
/// Longest an event waits for company before its batch leaves.
pub const DEFAULT_WEBHOOK_BATCH_INTERVAL: Duration = Duration::from_millis(100);
/// Events held per pod at most; beyond, dropped and counted.
pub const DEFAULT_WEBHOOK_QUEUE: usize = 10_000;
/// Longest one POST may take.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a batch is retried before it is dropped and counted.
pub const DEFAULT_WEBHOOK_RETRY_FOR: Duration = Duration::from_secs(60);

/// `[webhooks]`: events to the backend; off unless `url` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhooksConfig {
    /// `http://` or `https://`; `""`: no webhooks.
    pub url: String,
    /// The HMAC-SHA256 key of `X-Herald-Signature` (or `secret_file`).
    pub secret: String,
    /// A file holding the secret (a mounted Secret); its trailing newline is
    /// not part of it.
    pub secret_file: String,
    /// Which event types are sent ([`WEBHOOK_EVENT_TYPES`]).
    pub events: Vec<String>,
    pub batch_size: usize,
    #[serde(with = "humantime_serde")]
    pub batch_interval: Duration,
    /// Events held per pod at most.
    pub queue: usize,
    /// Per POST.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_for: Duration,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            secret: String::new(),
            secret_file: String::new(),
            events: DEFAULT_WEBHOOK_EVENTS.map(str::to_owned).to_vec(),
            batch_size: DEFAULT_WEBHOOK_BATCH_SIZE,
            batch_interval: DEFAULT_WEBHOOK_BATCH_INTERVAL,
            queue: DEFAULT_WEBHOOK_QUEUE,
            timeout: DEFAULT_WEBHOOK_TIMEOUT,
            retry_for: DEFAULT_WEBHOOK_RETRY_FOR,
        }
    }
}

impl WebhooksConfig {
    /// Whether webhooks are on.
    pub fn enabled(&self) -> bool {
        !self.url.is_empty()
    }

    /// Whether events of type `name` are sent.
    pub fn wants(&self, name: &str) -> bool {
        self.enabled() && self.events.iter().any(|e| e == name)
    }

    /// Whether the pods must track which topics have subscribers anywhere
    /// (Redis writes per topic's first and last local subscriber).
    pub fn tracks_occupancy(&self) -> bool {
        self.wants("topic.occupied") || self.wants("topic.vacated")
    }

    /// The signing key: `secret`, or `secret_file`'s content without its
    /// trailing newline.
    pub fn secret(&self) -> Result<Vec<u8>, String> {
        if !self.secret_file.is_empty() {
            let text = std::fs::read(&self.secret_file)
                .map_err(|e| format!("cannot read {}: {e}", self.secret_file))?;
            let end = text
                .iter()
                .rposition(|b| !matches!(b, b'\n' | b'\r'))
                .map_or(0, |i| i + 1);
            return Ok(text[..end].to_vec());
        }
        Ok(self.secret.as_bytes().to_vec())
    }

    /// The start-up checks: `(key, reason)` of the first refusal.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.enabled() {
            return Ok(());
        }
        let scheme = self.url.split_once("://").map(|(s, _)| s);
        if !matches!(scheme, Some("http" | "https")) || self.url.parse::<hyper::Uri>().is_err() {
            return Err(("webhooks.url", "must be an http:// or https:// URL".into()));
        }
        if !self.secret.is_empty() && !self.secret_file.is_empty() {
            return Err((
                "webhooks.secret",
                "set secret or secret_file, not both".into(),
            ));
        }
        match self.secret() {
            Err(e) => return Err(("webhooks.secret_file", e)),
            Ok(secret) if secret.is_empty() => {
                return Err((
                    "webhooks.secret",
                    "webhooks need a secret (secret or secret_file) to sign with".into(),
                ));
            }
            Ok(_) => {}
        }
        if let Some(unknown) = self
            .events
            .iter()
            .find(|e| !WEBHOOK_EVENT_TYPES.contains(&e.as_str()))
        {
            return Err((
                "webhooks.events",
                format!(
                    "unknown event type `{unknown}` (known: {})",
                    WEBHOOK_EVENT_TYPES.join(", ")
                ),
            ));
        }
        if self.batch_size == 0 {
            return Err(("webhooks.batch_size", "must be at least 1".into()));
        }
        if self.queue == 0 {
            return Err(("webhooks.queue", "must be at least 1".into()));
        }
        for (key, d) in [
            ("webhooks.batch_interval", self.batch_interval),
            ("webhooks.timeout", self.timeout),
        ] {
            if d.is_zero() {
                return Err((key, "must be longer than 0s".into()));
            }
        }
        for (key, d) in [
            ("webhooks.batch_interval", self.batch_interval),
            ("webhooks.timeout", self.timeout),
            ("webhooks.retry_for", self.retry_for),
        ] {
            if d > super::defaults::MAX_DURATION {
                return Err((key, "must be at most 365 days".into()));
            }
        }
        Ok(())
    }
}
