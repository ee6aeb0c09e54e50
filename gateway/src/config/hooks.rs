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

/// `[webhooks]`: events to the backend; off unless `url` is set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhooksConfig {
    pub url: String,
}
