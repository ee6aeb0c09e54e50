//! `[proxy]` and `[webhooks]`: the application's backend, asked and told
//! ([`crate::hooks`]; docs/hooks.md).

use std::time::Duration;

use serde::Deserialize;

/// `[proxy]`: one endpoint per proxy, each off unless its `url` is set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    pub connect: Option<Endpoint>,
    pub refresh: Option<Endpoint>,
    pub subscribe: Option<Endpoint>,
    pub publish: Option<Endpoint>,
    pub rpc: Option<Endpoint>,
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
