//! Configuration: typed, defaulted, validated once, before any port is bound.
//!
//! Sources, later wins: the defaults below, a TOML file (`--config`), then
//! environment variables `HERALD_<KEY>` with `__` between nested keys
//! (`HERALD_LISTEN=127.0.0.1:9000`, `HERALD_WEBSOCKET__PING_INTERVAL=10s`,
//! `HERALD_HTTP__API_KEYS=key1,key2`). `docs/herald.sample.toml` lists every key.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use router::{
    NamespaceSettings, Namespaces, Publish, RedisSettings, SentinelSettings, Subscribe, TlsFiles,
};
use serde::Deserialize;

use crate::auth::AuthConfig;

pub const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
/// Address the gRPC publish API listens on.
pub const DEFAULT_GRPC_LISTEN: &str = "0.0.0.0:9090";
/// Largest client message, in bytes, whole or reassembled from fragments.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Interval between server pings.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(25);
/// Grace after a ping interval in which some frame must arrive.
pub const DEFAULT_PONG_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a write to one client may take before the client counts as stuck.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the HTTP request head (the WebSocket handshake) may take.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server waits for the client's close frame after its own.
pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a client message may take to arrive, from its first byte to its
/// last (all its fragments); pings and pongs between them do not extend it.
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// WebSocket connections per pod; more get HTTP 503 before the upgrade.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Bad commands in a row after which a client is closed with 4500.
pub const DEFAULT_MAX_BAD_COMMANDS: u32 = 10;
/// Longest the first command (`hello`, or one that implies it) may take to
/// arrive after the upgrade.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Commands per second one connection may send, on average.
pub const DEFAULT_COMMANDS_PER_SECOND: u32 = 50;
/// Commands one connection may send in a burst above the average.
pub const DEFAULT_COMMANDS_BURST: u32 = 100;
/// WebSocket connections one client address may hold on one pod; 0: no cap.
/// Behind a proxy, the address is the proxy's unless it is listed in
/// `http.trusted_proxies`.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1000;
/// Leading bits of an IPv4 client address that key the per-address caps and
/// budgets: 32, each address apart (one NAT's users share theirs).
pub const DEFAULT_IPV4_PREFIX: u8 = 32;
/// Leading bits of an IPv6 client address that key them: 64, as one host or
/// home is commonly given a whole /64 (2^64 addresses to rotate through).
pub const DEFAULT_IPV6_PREFIX: u8 = 64;
/// Longest an HTTP API request's body may take (else 408), and on the API
/// listener (`http.api_listen`) its head too (else the connection is closed);
/// on the shared listener a head is bounded by `websocket.handshake_timeout`.
pub const DEFAULT_HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP API requests a pod serves at once; more get 503 (health probes are
/// not counted, so that they are never starved).
pub const DEFAULT_HTTP_MAX_CONCURRENT_REQUESTS: usize = 1024;
/// Frames a client's outgoing queue holds.
pub const DEFAULT_QUEUE_FRAMES: usize = 1024;
/// Bytes a client's outgoing queue holds, frames being written included.
pub const DEFAULT_QUEUE_BYTES: usize = 1024 * 1024;
/// Replays (a `sub` with `since`, a resumed subscription) a pod runs at
/// once: each holds a page of history and reads Redis while it runs.
pub const DEFAULT_REPLAY_MAX_CONCURRENT: usize = 64;
/// Longest a replay waits for its turn before its `sub` is refused with
/// `unavailable` (a resume: closed with 4003), for the client to retry.
pub const DEFAULT_REPLAY_WAIT: Duration = Duration::from_secs(2);
/// Messages one read of history returns at most.
pub const DEFAULT_REPLAY_PAGE_MESSAGES: usize = 64;
/// Bytes of message data one read of history returns at most (a larger
/// message is read alone).
pub const DEFAULT_REPLAY_PAGE_BYTES: usize = 256 * 1024;
/// How long a disconnected session can be resumed.
pub const DEFAULT_RESUME_WINDOW: Duration = Duration::from_secs(120);
/// How often changed sessions are saved to a shared (Redis) store.
pub const DEFAULT_SESSION_FLUSH_INTERVAL: Duration = Duration::from_millis(250);
/// Where the Redis broker connects unless told otherwise.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Longest a Redis command may take.
pub const DEFAULT_REDIS_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a pod stays subscribed to an abandoned topic.
pub const DEFAULT_REDIS_LINGER: Duration = Duration::from_secs(2);
/// How often pods compare loads.
pub const DEFAULT_REBALANCE_INTERVAL: Duration = Duration::from_secs(5);
/// How far above the average a pod may be before it moves clients.
pub const DEFAULT_REBALANCE_TOLERANCE: f64 = 0.2;
/// The most of its connections a pod moves per interval.
pub const DEFAULT_REBALANCE_MAX_MOVE_FRACTION: f64 = 0.05;
/// Subscriptions one connection may hold.
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 1000;
/// Subscriptions the anonymous clients of one address (prefix) may hold on
/// one pod, across their connections; 0: no cap. About 1.1 KiB of pod memory
/// each: 10,000 is ~11 MiB per address.
pub const DEFAULT_MAX_SUBSCRIPTIONS_PER_IP: usize = 10_000;
/// Subscriptions one user (token `sub`) may hold on one pod, across its
/// connections; 0: no cap.
pub const DEFAULT_MAX_SUBSCRIPTIONS_PER_USER: usize = 10_000;
/// Distinct topics one user or anonymous address may subscribe or publish
/// to per minute on one pod (each may create Redis keys that live the
/// history age); 0: no cap.
pub const DEFAULT_TOPICS_PER_MINUTE: usize = 1000;
/// Distinct topics the anonymous clients of one address may hold
/// subscriptions to at once on one pod; 0: no cap.
pub const DEFAULT_ANONYMOUS_MAX_TOPICS: usize = 1000;
/// Largest HTTP publish body, and largest `data` of a gRPC publish.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024;
/// How long a draining pod waits for its clients to leave.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest any duration setting may be: far beyond any sensible one, and
/// short enough to add to the clock anywhere.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// The `service.name` of exported traces.
pub const DEFAULT_TELEMETRY_SERVICE_NAME: &str = "herald";
/// Fraction of publishes traced when the publisher sent no sampling decision.
pub const DEFAULT_TELEMETRY_SAMPLE_RATIO: f64 = 1.0;
/// HTTP/2 streams (calls) one gRPC connection may have open at once; a
/// stream past it is refused by HTTP/2 (`REFUSED_STREAM`), not queued.
pub const DEFAULT_GRPC_MAX_CONCURRENT_STREAMS: u32 = 64;
/// gRPC connections per pod; more are closed as they are accepted.
pub const DEFAULT_GRPC_MAX_CONNECTIONS: usize = 1024;
/// gRPC connections one client address may hold on one pod; 0: no cap.
pub const DEFAULT_GRPC_MAX_CONNECTIONS_PER_IP: usize = 128;
/// How long a gRPC connection may be silent before the pod pings it.
pub const DEFAULT_GRPC_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long the pod waits for a ping's answer; a connection silent for the
/// interval and this (one that never spoke HTTP/2 too) is closed.
pub const DEFAULT_GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Exit code for a configuration error (EX_USAGE).
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
    pub session: SessionConfig,
    pub http: HttpConfig,
    pub grpc: GrpcConfig,
    pub shutdown: ShutdownConfig,
    pub rebalance: RebalanceConfig,
    pub log: LogConfig,
    pub telemetry: TelemetryConfig,
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

#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user[:password]@]host:port/db`; `rediss://` for TLS. With
    /// Sentinel, only its scheme, user, password and db are used.
    pub url: String,
    /// The password, if not in the URL (so that it can come from a Secret,
    /// as `HERALD_REDIS__PASSWORD`); it wins over the URL's. Empty: the URL's.
    pub password: String,
    /// PEM file of the CA that signs the server's certificate (`rediss://`);
    /// empty: the system's roots.
    pub tls_ca: String,
    /// PEM files of a client certificate and its key, for a server that
    /// requires one (mTLS); empty: none.
    pub tls_cert: String,
    pub tls_key: String,
    /// Longest a Redis command may take; a publish fails with 503 after it.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// How long a pod stays subscribed to a topic after its last local subscriber left.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
    /// Redis under Sentinel: the master is asked for on every (re)connect.
    pub sentinel: SentinelConfig,
    /// Redis Cluster: `redis://host:port` of some of its nodes (the others
    /// are found from them); empty: not a cluster. The user, password and
    /// TLS settings above apply to every node.
    pub cluster: Vec<String>,
    /// What every key and channel starts with: deployments sharing a Redis
    /// need one each (pub/sub ignores the database number). Letters,
    /// digits, `-`, `_`, `.`, `:`.
    pub prefix: String,
}

/// Off while `master_name` is empty.
#[derive(Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SentinelConfig {
    /// The name the sentinels monitor the master under.
    pub master_name: String,
    /// `host:port` of each sentinel.
    pub addresses: Vec<String>,
    /// The sentinels' own password, if they have one; empty: none.
    pub password: String,
    /// Whether the sentinels speak TLS (with `redis.tls_ca` and the client
    /// certificate).
    pub tls: bool,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_REDIS_URL.to_owned(),
            password: String::new(),
            tls_ca: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            command_timeout: DEFAULT_REDIS_COMMAND_TIMEOUT,
            linger: DEFAULT_REDIS_LINGER,
            sentinel: SentinelConfig::default(),
            cluster: Vec::new(),
            prefix: router::redis::DEFAULT_PREFIX.to_owned(),
        }
    }
}

impl RedisConfig {
    pub fn settings(&self) -> RedisSettings {
        let path = |p: &str| Some(p).filter(|p| !p.is_empty()).map(PathBuf::from);
        let text = |t: &str| Some(t).filter(|t| !t.is_empty()).map(str::to_owned);
        let sentinel = &self.sentinel;
        let sentinel_on = !sentinel.master_name.is_empty() || !sentinel.addresses.is_empty();
        RedisSettings {
            url: self.url.clone(),
            password: text(&self.password),
            tls: TlsFiles {
                ca: path(&self.tls_ca),
                cert: path(&self.tls_cert),
                key: path(&self.tls_key),
            },
            sentinel: sentinel_on.then(|| SentinelSettings {
                master_name: sentinel.master_name.clone(),
                addresses: sentinel.addresses.clone(),
                password: text(&sentinel.password),
                tls: sentinel.tls,
            }),
            cluster: self.cluster.clone(),
            command_timeout: self.command_timeout,
            linger: self.linger,
            prefix: self.prefix.clone(),
        }
    }
}

/// Without the passwords (the URL's included).
impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &router::redis::redact_url(&self.url))
            .field("password", &redacted(&self.password))
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("command_timeout", &self.command_timeout)
            .field("linger", &self.linger)
            .field("sentinel", &self.sentinel)
            .field("cluster", &router::redis::redact_urls(&self.cluster))
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("master_name", &self.master_name)
            .field("addresses", &self.addresses)
            .field("password", &redacted(&self.password))
            .field("tls", &self.tls)
            .finish()
    }
}

fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() { "" } else { "<redacted>" }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebSocketConfig {
    pub max_message_bytes: usize,
    #[serde(with = "humantime_serde")]
    pub ping_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub pong_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub close_timeout: Duration,
    /// Longest a message may take to arrive, first byte to last; over it the
    /// connection is closed with 1008.
    #[serde(with = "humantime_serde")]
    pub message_timeout: Duration,
    pub max_connections: usize,
    pub max_bad_commands: u32,
    /// Origins allowed to open a WebSocket; empty allows any (and requests
    /// without `Origin`, as non-browser clients send).
    pub allowed_origins: Vec<String>,
    #[serde(with = "humantime_serde")]
    pub hello_timeout: Duration,
    /// A token bucket per connection: refills at this rate...
    pub commands_per_second: u32,
    /// ...and holds this many.
    pub commands_burst: u32,
    pub max_connections_per_ip: usize,
    /// The prefix lengths an address is cut to before it keys the
    /// per-address caps (`max_connections_per_ip`, the session's per-address
    /// budgets): 0 to 32 and 0 to 128.
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueConfig {
    pub frames: usize,
    pub bytes: usize,
    pub overflow: Overflow,
}

/// Replays stream history a page at a time, as the client's queue takes it:
/// a replaying connection holds its queue and one page, whatever it missed.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayConfig {
    pub max_concurrent: usize,
    #[serde(with = "humantime_serde")]
    pub wait: Duration,
    pub page_messages: usize,
    pub page_bytes: usize,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            max_concurrent: DEFAULT_REPLAY_MAX_CONCURRENT,
            wait: DEFAULT_REPLAY_WAIT,
            page_messages: DEFAULT_REPLAY_PAGE_MESSAGES,
            page_bytes: DEFAULT_REPLAY_PAGE_BYTES,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionConfig {
    #[serde(with = "humantime_serde")]
    pub resume_window: Duration,
    pub max_subscriptions: usize,
    /// Budgets across a principal's connections on the pod: a user's (by
    /// token), or an anonymous address prefix's. See [`crate::budget`].
    pub max_subscriptions_per_ip: usize,
    pub max_subscriptions_per_user: usize,
    pub topics_per_minute: usize,
    pub anonymous_max_topics: usize,
    /// How often sessions that changed (acks, subscriptions) are saved to the
    /// shared store, so that a pod that dies loses at most this much.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
}

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

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
}

/// Moving clients off a pod that holds more than its share, so that pods
/// added by a scale-out get some of the long-lived connections.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RebalanceConfig {
    /// Needs a shared broker (Redis): pods compare their loads through it.
    pub enabled: bool,
    /// How often a pod reports its load and, if it is over, moves clients.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A pod moves clients while it holds more than the average by this
    /// fraction (0.2: more than 120% of the average).
    pub tolerance: f64,
    /// At most this fraction of the pod's connections is asked to move per
    /// interval, so that a rebalance never becomes a reconnect storm.
    pub max_move_fraction: f64,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            interval: DEFAULT_REBALANCE_INTERVAL,
            tolerance: DEFAULT_REBALANCE_TOLERANCE,
            max_move_fraction: DEFAULT_REBALANCE_MAX_MOVE_FRACTION,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A `tracing` filter: `info`, `herald=debug,hyper=warn`, ...
    pub level: String,
    pub format: LogFormat,
}

/// OpenTelemetry traces of the publish path (docs/tracing.md); off unless
/// `otlp_endpoint` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// An OTLP/gRPC collector, `http://host:4317`; empty exports nothing.
    pub otlp_endpoint: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Parent-based: a publisher's sampled flag is followed; a publish
    /// without one is traced with this probability (0 to 1).
    pub sample_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            service_name: DEFAULT_TELEMETRY_SERVICE_NAME.to_owned(),
            sample_ratio: DEFAULT_TELEMETRY_SAMPLE_RATIO,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
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
            session: SessionConfig::default(),
            http: HttpConfig::default(),
            grpc: GrpcConfig::default(),
            shutdown: ShutdownConfig::default(),
            rebalance: RebalanceConfig::default(),
            log: LogConfig::default(),
            telemetry: TelemetryConfig::default(),
            auth: AuthConfig::default(),
            namespaces: BTreeMap::new(),
        }
    }
}

impl Default for WebSocketConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            ping_interval: DEFAULT_PING_INTERVAL,
            pong_timeout: DEFAULT_PONG_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            close_timeout: DEFAULT_CLOSE_TIMEOUT,
            message_timeout: DEFAULT_MESSAGE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_bad_commands: DEFAULT_MAX_BAD_COMMANDS,
            allowed_origins: Vec::new(),
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            commands_per_second: DEFAULT_COMMANDS_PER_SECOND,
            commands_burst: DEFAULT_COMMANDS_BURST,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            ipv4_prefix: DEFAULT_IPV4_PREFIX,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            frames: DEFAULT_QUEUE_FRAMES,
            bytes: DEFAULT_QUEUE_BYTES,
            overflow: Overflow::Disconnect,
        }
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            resume_window: DEFAULT_RESUME_WINDOW,
            max_subscriptions: DEFAULT_MAX_SUBSCRIPTIONS,
            max_subscriptions_per_ip: DEFAULT_MAX_SUBSCRIPTIONS_PER_IP,
            max_subscriptions_per_user: DEFAULT_MAX_SUBSCRIPTIONS_PER_USER,
            topics_per_minute: DEFAULT_TOPICS_PER_MINUTE,
            anonymous_max_topics: DEFAULT_ANONYMOUS_MAX_TOPICS,
            flush_interval: DEFAULT_SESSION_FLUSH_INTERVAL,
        }
    }
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

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".to_owned(),
            format: LogFormat::Text,
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

/// The levels a `log.level` directive may be alone.
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Whether `level` is a filter as `log.level` takes it: comma-separated
/// directives, each a level or `target=level` (`target[span]=level` too).
/// `EnvFilter` alone would take any word for a target, so that a typo
/// (`debgu`) left the pod logging next to nothing.
fn check_log_level(level: &str) -> Result<(), String> {
    let hint = "(try `info`, or `gateway=debug,info`)";
    if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(level) {
        return Err(format!("not a tracing filter: {e} {hint}"));
    }
    for directive in level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = !directive.contains('=') && !directive.contains('[');
        if bare && !LOG_LEVELS.contains(&directive.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "`{directive}` is neither a level ({}) nor target=level {hint}",
                LOG_LEVELS.join(", ")
            ));
        }
    }
    Ok(())
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
const TOP_LEVEL_KEYS: [&str; 15] = [
    "listen",
    "broker",
    "redis",
    "websocket",
    "queue",
    "replay",
    "session",
    "http",
    "grpc",
    "shutdown",
    "rebalance",
    "log",
    "telemetry",
    "auth",
    "namespaces",
];

/// The variable that names the configuration file when `--config` is not given.
pub const CONFIG_FILE_VAR: &str = "HERALD_CONFIG";

/// Variables that hold comma-separated lists, and their keys.
const LIST_VARS: [(&str, &str); 5] = [
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

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        let ws = &self.websocket;
        if ws.max_message_bytes == 0 {
            return invalid("websocket.max_message_bytes", "must be at least 1");
        }
        for (key, d) in [
            ("websocket.ping_interval", ws.ping_interval),
            ("websocket.pong_timeout", ws.pong_timeout),
            ("websocket.write_timeout", ws.write_timeout),
            ("websocket.handshake_timeout", ws.handshake_timeout),
            ("websocket.hello_timeout", ws.hello_timeout),
            ("websocket.message_timeout", ws.message_timeout),
            ("http.request_timeout", self.http.request_timeout),
            ("grpc.keepalive_interval", self.grpc.keepalive_interval),
            ("grpc.keepalive_timeout", self.grpc.keepalive_timeout),
        ] {
            if d.is_zero() {
                return invalid(key, "must be longer than 0s");
            }
        }
        // Every duration is added to the clock somewhere (a deadline, a
        // timer): one too long for it would panic there, in a connection's
        // task, instead of being refused here.
        for (key, d) in [
            ("websocket.ping_interval", ws.ping_interval),
            ("websocket.pong_timeout", ws.pong_timeout),
            ("websocket.write_timeout", ws.write_timeout),
            ("websocket.handshake_timeout", ws.handshake_timeout),
            ("websocket.close_timeout", ws.close_timeout),
            ("websocket.hello_timeout", ws.hello_timeout),
            ("websocket.message_timeout", ws.message_timeout),
            ("http.request_timeout", self.http.request_timeout),
            ("session.resume_window", self.session.resume_window),
            ("session.flush_interval", self.session.flush_interval),
            ("redis.command_timeout", self.redis.command_timeout),
            ("redis.linger", self.redis.linger),
            ("shutdown.drain_timeout", self.shutdown.drain_timeout),
            ("rebalance.interval", self.rebalance.interval),
            (
                "auth.jwks_refresh_interval",
                self.auth.jwks_refresh_interval,
            ),
            ("auth.jwks_min_refetch", self.auth.jwks_min_refetch),
        ] {
            if d > MAX_DURATION {
                return invalid(key, "must be at most 365 days");
            }
        }
        if ws.max_connections == 0 {
            return invalid("websocket.max_connections", "must be at least 1");
        }
        if ws.commands_per_second == 0 {
            return invalid("websocket.commands_per_second", "must be at least 1");
        }
        if ws.commands_burst == 0 {
            return invalid("websocket.commands_burst", "must be at least 1");
        }
        if ws.ipv4_prefix > 32 {
            return invalid("websocket.ipv4_prefix", "must be 0 to 32");
        }
        if ws.ipv6_prefix > 128 {
            return invalid("websocket.ipv6_prefix", "must be 0 to 128");
        }
        if self.http.max_concurrent_requests == 0 {
            return invalid("http.max_concurrent_requests", "must be at least 1");
        }
        if self.grpc.max_concurrent_streams == 0 {
            return invalid("grpc.max_concurrent_streams", "must be at least 1");
        }
        if self.grpc.max_connections == 0 {
            return invalid("grpc.max_connections", "must be at least 1");
        }
        if let Some(api) = self.http.api_listen
            && api.port() != 0
            && (api == self.listen || api == self.grpc.listen)
        {
            return invalid(
                "http.api_listen",
                "must differ from `listen` and `grpc.listen`",
            );
        }
        if let Err((key, reason)) = self.auth.validate() {
            return invalid(key, &reason);
        }
        if self.queue.frames < 2 {
            return invalid("queue.frames", "must be at least 2");
        }
        if self.queue.bytes < 2 * ws.max_message_bytes {
            return invalid(
                "queue.bytes",
                "must hold at least two of the largest messages (2 x websocket.max_message_bytes)",
            );
        }
        let replay = &self.replay;
        for (key, n) in [
            ("replay.max_concurrent", replay.max_concurrent),
            ("replay.page_messages", replay.page_messages),
            ("replay.page_bytes", replay.page_bytes),
        ] {
            if n == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        if replay.wait.is_zero() {
            return invalid("replay.wait", "must be longer than 0s");
        }
        if self.http.max_body_bytes == 0 {
            return invalid("http.max_body_bytes", "must be at least 1");
        }
        if self.http.api_keys.iter().any(|k| k.trim().is_empty()) {
            return invalid("http.api_keys", "keys must not be empty");
        }
        if let Err(reason) = self.http.keys() {
            return invalid("http.api_keys_file", &reason);
        }
        // Port 0 (any free port, as tests bind) may appear twice.
        if self.grpc.listen == self.listen && self.listen.port() != 0 {
            return invalid("grpc.listen", "must differ from `listen`");
        }
        if let Err(reason) = check_log_level(&self.log.level) {
            return invalid("log.level", &reason);
        }
        let telemetry = &self.telemetry;
        if !telemetry.otlp_endpoint.is_empty() {
            let endpoint = telemetry.otlp_endpoint.parse::<hyper::Uri>();
            let plain_http = endpoint
                .as_ref()
                .is_ok_and(|uri| uri.scheme_str() == Some("http") && uri.host().is_some());
            if !plain_http {
                return invalid(
                    "telemetry.otlp_endpoint",
                    "must be an OTLP/gRPC collector as http://host:port (no TLS), or empty",
                );
            }
        }
        if telemetry.service_name.trim().is_empty() {
            return invalid("telemetry.service_name", "must not be empty");
        }
        if !(0.0..=1.0).contains(&telemetry.sample_ratio) {
            return invalid("telemetry.sample_ratio", "must be in [0, 1]");
        }
        let rebalance = &self.rebalance;
        if rebalance.enabled {
            if self.broker == BrokerKind::Memory {
                return invalid(
                    "rebalance.enabled",
                    "needs broker = \"redis\": pods compare loads through it",
                );
            }
            if rebalance.interval.is_zero() {
                return invalid("rebalance.interval", "must be longer than 0s");
            }
            if !(rebalance.tolerance > 0.0 && rebalance.tolerance.is_finite()) {
                return invalid("rebalance.tolerance", "must be above 0 (0.2 is 20%)");
            }
            if !(rebalance.max_move_fraction > 0.0 && rebalance.max_move_fraction <= 1.0) {
                return invalid("rebalance.max_move_fraction", "must be in (0, 1]");
            }
        }
        if self.session.flush_interval.is_zero() {
            return invalid("session.flush_interval", "must be longer than 0s");
        }
        if self.broker == BrokerKind::Redis {
            if let Err(e) = self.redis.settings().validate() {
                return invalid(e.key, &e.reason);
            }
            if self.redis.command_timeout.is_zero() {
                return invalid("redis.command_timeout", "must be longer than 0s");
            }
        }
        if let Err(e) = Namespaces::new(&self.namespaces) {
            return Err(ConfigError::Invalid {
                key: "namespaces",
                reason: e.to_string(),
            });
        }
        // Without a key nobody holds a token: nobody could ever be granted a
        // topic or own a personal one.
        if !self.auth.enabled() {
            for (name, ns) in &self.namespaces {
                let needs_tokens = ns.personal
                    || ns.subscribe == Subscribe::Granted
                    || ns.publish == Publish::Granted;
                if needs_tokens {
                    return Err(ConfigError::Invalid {
                        key: "namespaces",
                        reason: format!(
                            "namespace `{name}` grants by token (`granted` or `personal`), but no \
                             [auth] key is configured"
                        ),
                    });
                }
            }
        }
        Ok(())
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

/// What happens when a frame does not fit in a connection's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Close the connection with 4000 (slow consumer): the client reconnects
    /// and resumes, and so misses nothing.
    Disconnect,
    /// Drop the new frame: the client sees a gap in `seq`.
    DropNewest,
}

/// A queue's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub frames: usize,
    pub bytes: usize,
    pub overflow: Overflow,
}
