//! Configuration: typed, defaulted, validated once, before any port is bound.
//!
//! Sources, later wins: the defaults ([`defaults`]), a TOML file (`--config`), then
//! environment variables `HERALD_<KEY>` with `__` between nested keys
//! (`HERALD_LISTEN=127.0.0.1:9000`, `HERALD_WEBSOCKET__PING_INTERVAL=10s`,
//! `HERALD_HTTP__API_KEYS=key1,key2`). `docs/herald.sample.toml` lists every key.
//!
//! Its parts, each item re-exported here (`gateway::config::RedisConfig`):
//!
//! - [`defaults`]: every default, a named constant with its unit;
//! - [`clients`]: `[websocket]`, `[queue]`, `[replay]`, `[history]`,
//!   `[session]`: what each client gets; [`compression`]:
//!   `[websocket.compression]`, permessage-deflate;
//! - [`api`]: `[http]` and `[grpc]`, the backend API;
//! - [`redis`]: `[redis]`, the shared broker;
//! - [`drain`]: `[shutdown]` and `[rebalance]`, moving clients off a pod;
//! - [`observability`]: `[log]` and `[telemetry]`;
//! - [`presence`]: `[presence]`, who is subscribed to a topic;
//! - [`hooks`]: `[proxy]` and `[webhooks]`, the application's backend;
//! - [`streams`]: `[streams]`, SSE and HTTP-streaming beside `/ws`;
//! - [`validation`]: the checks before anything starts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use router::{NamespaceSettings, Namespaces};
use serde::Deserialize;

use crate::auth::AuthConfig;

mod api;
mod clients;
mod compression;
mod defaults;
mod drain;
mod hooks;
mod observability;
mod presence;
mod redis;
mod streams;
mod validation;

pub use api::{GrpcConfig, HttpConfig};
pub use clients::{
    HistoryConfig, Limits, Overflow, QueueConfig, ReplayConfig, SessionConfig, WebSocketConfig,
};
pub use compression::CompressionConfig;
pub use defaults::*;
pub use drain::{RebalanceConfig, ShutdownConfig};
pub use hooks::{
    DEFAULT_PROXY_MAX_IN_FLIGHT, DEFAULT_PROXY_MAX_RESPONSE_BYTES, Endpoint, ProxyConfig, Scheme,
    UrlError, WebhooksConfig,
};
pub use observability::{LogConfig, LogFormat, TelemetryConfig};
pub use presence::{MIN_PRESENCE_POD_TTL, PresenceConfig};
pub use redis::{RedisConfig, SentinelConfig};
pub use streams::{DEFAULT_STREAMS_MAX_TOPICS, DEFAULT_STREAMS_TOKEN_COOKIE, StreamsConfig};

/// Exit code for a configuration error, or a bad command line (EX_USAGE).
pub const EXIT_BAD_CONFIG: i32 = 64;

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Address the HTTP and WebSocket server listens on.
    pub listen: SocketAddr,
    /// `memory`: the embedded single-pod broker.
    pub broker: BrokerKind,
    pub redis: RedisConfig,
    pub websocket: WebSocketConfig,
    pub queue: QueueConfig,
    pub replay: ReplayConfig,
    pub history: HistoryConfig,
    pub session: SessionConfig,
    pub http: HttpConfig,
    pub grpc: GrpcConfig,
    pub shutdown: ShutdownConfig,
    pub rebalance: RebalanceConfig,
    pub log: LogConfig,
    pub telemetry: TelemetryConfig,
    pub presence: PresenceConfig,
    /// The application's backend, asked (proxies) and told (webhooks).
    pub proxy: ProxyConfig,
    pub webhooks: WebhooksConfig,
    /// `GET /sse` and `POST /stream`: the WebSocket's fallbacks.
    pub streams: StreamsConfig,
    /// Client tokens; without a key every client is anonymous (open mode).
    pub auth: AuthConfig,
    /// Per-namespace settings; `default` is for topics without a `:`.
    pub namespaces: BTreeMap<String, NamespaceSettings>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrokerKind {
    /// The embedded broker: one pod, everything in memory.
    Memory,
    /// Topics, history and sessions in Redis, shared by every pod.
    Redis,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().unwrap_or_else(|_| unreachable!()),
            broker: BrokerKind::Memory,
            redis: RedisConfig::default(),
            websocket: WebSocketConfig::default(),
            queue: QueueConfig::default(),
            replay: ReplayConfig::default(),
            history: HistoryConfig::default(),
            session: SessionConfig::default(),
            http: HttpConfig::default(),
            grpc: GrpcConfig::default(),
            shutdown: ShutdownConfig::default(),
            rebalance: RebalanceConfig::default(),
            log: LogConfig::default(),
            telemetry: TelemetryConfig::default(),
            presence: PresenceConfig::default(),
            proxy: ProxyConfig::default(),
            webhooks: WebhooksConfig::default(),
            streams: StreamsConfig::default(),
            auth: AuthConfig::default(),
            namespaces: BTreeMap::new(),
        }
    }
}

/// A configuration that cannot be used; the message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Source(#[from] config::ConfigError),
    #[error("unknown key `{key}` in {file}")]
    UnknownKey { key: String, file: String },
    #[error("invalid value for `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

/// Top-level keys; anything else in a file is a typo. (Unknown `HERALD_*`
/// variables are ignored: Kubernetes sets `HERALD_PORT` and friends for a
/// Service named herald.)
const TOP_LEVEL_KEYS: [&str; 20] = [
    "listen",
    "broker",
    "redis",
    "websocket",
    "queue",
    "replay",
    "history",
    "session",
    "http",
    "grpc",
    "shutdown",
    "rebalance",
    "log",
    "telemetry",
    "presence",
    "proxy",
    "webhooks",
    "streams",
    "auth",
    "namespaces",
];

/// The variable that names the configuration file when `--config` is not given.
pub const CONFIG_FILE_VAR: &str = "HERALD_CONFIG";

/// Variables that hold comma-separated lists, and their keys.
const LIST_VARS: [(&str, &str); 7] = [
    ("HERALD_HTTP__API_KEYS", "http.api_keys"),
    (
        "HERALD_REDIS__SENTINEL__ADDRESSES",
        "redis.sentinel.addresses",
    ),
    ("HERALD_REDIS__CLUSTER", "redis.cluster"),
    ("HERALD_HTTP__TRUSTED_PROXIES", "http.trusted_proxies"),
    (
        "HERALD_WEBSOCKET__ALLOWED_ORIGINS",
        "websocket.allowed_origins",
    ),
    ("HERALD_WEBHOOKS__EVENTS", "webhooks.events"),
    ("HERALD_PROXY__CONNECT__HEADERS", "proxy.connect.headers"),
];

impl Config {
    /// Reads the file (if any), then the `HERALD_*` variables of `env`, and
    /// validates the result.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = file {
            let source = config::File::from(path).format(config::FileFormat::Toml);
            let keys = config::Config::builder()
                .add_source(source.clone())
                .build()?
                .try_deserialize::<config::Map<String, config::Value>>()?;
            if let Some(key) = keys.keys().find(|k| !TOP_LEVEL_KEYS.contains(&k.as_str())) {
                return Err(ConfigError::UnknownKey {
                    key: key.clone(),
                    file: path.display().to_string(),
                });
            }
            builder = builder.add_source(source);
        }
        let mut env: config::Map<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("HERALD_") && k != CONFIG_FILE_VAR)
            .collect();
        // Lists of text are split here: the source below would read a lone
        // `123` or `true` as a number or a boolean, not as a list of one.
        let mut lists = Vec::new();
        for (var, key) in LIST_VARS {
            if let Some(value) = env.remove(var) {
                // An empty variable is an empty list; an empty item is an
                // error that validation names.
                let items: Vec<String> = match value.trim() {
                    "" => Vec::new(),
                    value => value
                        .split(',')
                        .map(|item| item.trim().to_owned())
                        .collect(),
                };
                lists.push((key, items));
            }
        }
        let env_source = config::Environment::with_prefix("HERALD")
            .prefix_separator("_")
            .separator("__")
            .try_parsing(true)
            .source(Some(env));
        builder = builder.add_source(env_source);
        for (key, items) in lists {
            builder = builder.set_override(key, items)?;
        }
        let config: Config = builder.build()?.try_deserialize()?;
        config.validate()?;
        Ok(config)
    }

    /// The validated namespace table.
    pub fn namespaces(&self) -> Namespaces {
        Namespaces::new(&self.namespaces).unwrap_or_default()
    }

    /// The outgoing queue bounds of each connection.
    pub fn queue_limits(&self) -> Limits {
        Limits {
            frames: self.queue.frames,
            bytes: self.queue.bytes,
            overflow: self.queue.overflow,
        }
    }
}
