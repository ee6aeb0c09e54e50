//! Every default, a named constant with its unit (and the bound on every
//! duration): what a key is when neither the file nor the environment sets
//! it. `docs/herald.sample.toml` shows each one, as a test checks.

use std::time::Duration;

/// Address the HTTP and WebSocket server listens on.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
/// Address the gRPC publish API listens on.
pub const DEFAULT_GRPC_LISTEN: &str = "0.0.0.0:9090";
/// Largest client message, in bytes, whole or reassembled from fragments.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Interval between server pings.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(25);
/// Grace after a ping interval in which some frame must arrive.
pub const DEFAULT_PONG_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a client's socket may take no byte of a write before the client
/// counts as stuck: above a pause a client may make (a tab in the
/// background, a phone between cells) and stay connected, its lag caught up
/// from history (issue #25); the heartbeat's bound (ping interval and pong
/// timeout, 35 s) is the dead peer's.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
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
/// Reads of history per second for lagging subscribers' catch-ups, the
/// pod's whole (a burst of as many).
pub const DEFAULT_REPLAY_CATCH_UP_READS_PER_SECOND: u32 = 1000;
/// Messages a history read (`history`, `GET /v1/history`) returns when it
/// names no `limit`.
pub const DEFAULT_HISTORY_LIMIT: usize = 100;
/// Most messages a history read may ask for (`history.max_limit`); a
/// larger `limit` is refused as `malformed`.
pub const DEFAULT_HISTORY_MAX_LIMIT: usize = 1000;
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
/// How long presence changes are gathered before this pod writes them to the
/// broker, and before a topic's subscribers get a `presence_diff`.
pub const DEFAULT_PRESENCE_DIFF_INTERVAL: Duration = Duration::from_millis(500);
/// Members per page of a presence query, at most and by default.
pub const DEFAULT_PRESENCE_PAGE_SIZE: usize = 1000;
/// Largest token `info` claim, in bytes of compact JSON text.
pub const DEFAULT_PRESENCE_MAX_INFO_BYTES: usize = 256;
/// How long a pod's presence outlives its last renewal (every `pod_ttl / 5`).
pub const DEFAULT_PRESENCE_POD_TTL: Duration = Duration::from_secs(10);
