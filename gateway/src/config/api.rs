//! The backend API: `[http]` (its keys, bounds and listener, the trusted
//! proxies) and `[grpc]` (the same API over gRPC, on its own listener).

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

use super::defaults::*;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Bearer keys for the publish API, HTTP and gRPC; empty (and no
    /// `api_keys_file`) leaves it open.
    pub api_keys: Vec<String>,
    /// A file of more keys, one per line (`#` comments and blank lines
    /// ignored), read again when it changes and on SIGHUP: keys rotate
    /// without a restart. Empty: none. Once set, it must hold a key.
    pub api_keys_file: String,
    /// Largest HTTP publish body; over gRPC, the largest `data`.
    pub max_body_bytes: usize,
    /// A listener of its own for the backend API (`/v1/*`) and `/metrics`;
    /// then `listen` serves only `/ws`, `/healthz` and `/readyz`.
    pub api_listen: Option<SocketAddr>,
    /// Peers (addresses or CIDR blocks) whose `X-Forwarded-For` names the
    /// client; from any other peer the header is ignored.
    #[serde(deserialize_with = "networks")]
    pub trusted_proxies: Vec<IpNet>,
    /// Longest an API request (HTTP or gRPC) may take once its head has
    /// arrived, and on the API listener its head too (see
    /// [`DEFAULT_HTTP_REQUEST_TIMEOUT`]).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    pub max_concurrent_requests: usize,
    /// Whether the API may be open to anyone, with no key. Without a key
    /// it is open from the start either way (a warning says so when it
    /// listens beyond loopback); what this changes is a reload: one that
    /// would remove every key is refused unless it says `open_api = true`,
    /// so that a half-written file never opens the API by accident.
    pub open_api: bool,
}

impl HttpConfig {
    /// Every API key: `api_keys`, and those of `api_keys_file` as it reads
    /// now. Fails when the file cannot be read or holds no key (an emptied
    /// file must not open the API to anyone).
    pub fn keys(&self) -> Result<Vec<String>, String> {
        let mut keys = self.api_keys.clone();
        if self.api_keys_file.is_empty() {
            return Ok(keys);
        }
        let text = std::fs::read_to_string(&self.api_keys_file)
            .map_err(|e| format!("{}: {e}", self.api_keys_file))?;
        let before = keys.len();
        // One per line, or comma-separated as `HERALD_HTTP__API_KEYS` takes
        // them (a key holds no comma either way).
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|line| !line.starts_with('#'))
                .flat_map(|line| line.split(','))
                .map(str::trim)
                .filter(|key| !key.is_empty())
                .map(str::to_owned),
        );
        if keys.len() == before {
            return Err(format!("{}: holds no key", self.api_keys_file));
        }
        Ok(keys)
    }
}

/// The gRPC publish API: the same API keys and size limit as `http`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcConfig {
    /// Address the gRPC server listens on.
    pub listen: SocketAddr,
    /// Calls (HTTP/2 streams) per connection; in total they share
    /// `http.max_concurrent_requests`.
    pub max_concurrent_streams: u32,
    /// Connections per pod, and per client address (0: no cap).
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            api_keys: Vec::new(),
            api_keys_file: String::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            api_listen: None,
            trusted_proxies: Vec::new(),
            request_timeout: DEFAULT_HTTP_REQUEST_TIMEOUT,
            max_concurrent_requests: DEFAULT_HTTP_MAX_CONCURRENT_REQUESTS,
            open_api: false,
        }
    }
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_GRPC_LISTEN
                .parse()
                .unwrap_or_else(|_| unreachable!()),
            max_concurrent_streams: DEFAULT_GRPC_MAX_CONCURRENT_STREAMS,
            max_connections: DEFAULT_GRPC_MAX_CONNECTIONS,
            max_connections_per_ip: DEFAULT_GRPC_MAX_CONNECTIONS_PER_IP,
            keepalive_interval: DEFAULT_GRPC_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_GRPC_KEEPALIVE_TIMEOUT,
        }
    }
}

/// Addresses (`10.0.0.7`) or blocks (`10.0.0.0/8`).
fn networks<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|item| {
            let item = item.trim();
            item.parse::<IpNet>()
                .or_else(|_| item.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    serde::de::Error::custom(format!("`{item}` is not an IP address or CIDR block"))
                })
        })
        .collect()
}
