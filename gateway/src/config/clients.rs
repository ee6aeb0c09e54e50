//! What the pod gives each client: `[websocket]` (the connection's limits
//! and timers), `[queue]` (its outgoing queue and what happens when that is
//! full), `[replay]` (history, a page at a time) and `[session]` (resume and
//! the budgets across a principal's connections).

use std::time::Duration;

use serde::Deserialize;

use super::defaults::*;

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
    /// permessage-deflate (`[websocket.compression]`).
    pub compression: super::CompressionConfig,
    /// Bytes a client connection's kernel socket takes that the network has
    /// not yet carried (`TCP_NOTSENT_LOWAT`); 0: no bound. With the kernel's
    /// send buffer autotuned (up to `net.ipv4.tcp_wmem`'s 4 MiB) a client
    /// that stops reading would otherwise soak megabytes into the kernel,
    /// copied at the healthy clients' expense, before its outgoing queue
    /// notices; bounded, its queue takes over at once (its namespace's
    /// `on_lag`). Unlike a fixed `SO_SNDBUF` it leaves the bytes in flight
    /// unbounded, so a fast client far away keeps its window.
    pub unsent_bytes: u32,
}

impl WebSocketConfig {
    /// Whether a page of `origin` (the request's `Origin` header; `None`
    /// without one) may open a connection or a stream: any, where
    /// `allowed_origins` is empty; otherwise one listed.
    pub fn allows_origin(&self, origin: Option<&[u8]>) -> bool {
        self.allowed_origins.is_empty() || self.names_origin(origin)
    }

    /// Whether `origin` is listed in `allowed_origins` by name: only such a
    /// page is let read a stream's answer with its credentials (cookies).
    /// Were any origin allowed them, any site could read a signed-in user's
    /// stream from its own page, with the cookie a token or the connect
    /// proxy reads.
    pub fn names_origin(&self, origin: Option<&[u8]>) -> bool {
        let Some(origin) = origin.and_then(|o| std::str::from_utf8(o).ok()) else {
            return false;
        };
        self.allowed_origins
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(origin))
    }
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
    /// History reads per second for lagging subscribers' catch-ups, shared
    /// by the pod's connections: what lagging clients cost the broker is
    /// capped, however many lag at once.
    pub catch_up_reads_per_second: u32,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            max_concurrent: DEFAULT_REPLAY_MAX_CONCURRENT,
            wait: DEFAULT_REPLAY_WAIT,
            page_messages: DEFAULT_REPLAY_PAGE_MESSAGES,
            page_bytes: DEFAULT_REPLAY_PAGE_BYTES,
            catch_up_reads_per_second: DEFAULT_REPLAY_CATCH_UP_READS_PER_SECOND,
        }
    }
}

/// `[history]`: the history API's reads (client `history`, `GET
/// /v1/history`, gRPC `History`). A page is also bounded in bytes, as a
/// replay's is (`replay.page_bytes`, at least one message).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Most messages one read may ask for.
    pub max_limit: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            max_limit: DEFAULT_HISTORY_MAX_LIMIT,
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
            compression: super::CompressionConfig::default(),
            unsent_bytes: 16 * 1024,
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
