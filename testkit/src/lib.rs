//! What the tests of every Herald crate share, in one place instead of
//! copies (a `dev-dependency` of each crate; never published).
//!
//! The processes a test starts (Redis, Sentinel, a Redis Cluster, the
//! `herald` binary, a bad network) are the rig's ([`rig`], which the load
//! tool starts its own with): here they are wrapped so that an error is the
//! test failing, their logs shown when it fails.
//!
//! - [`self::gateway`]: a gateway in the test's own process, on port 0
//!   ([`Gateway`]).
//! - [`herald`]: the real `herald` binary as a child process ([`Herald`]);
//!   the caller names the binary (`env!("CARGO_BIN_EXE_herald")` exists only
//!   in the gateway package's own tests).
//! - [`redis`]: a `redis-server` of the test's own ([`Redis`]), over TCP or
//!   TLS (with certificates from [`pki`]); [`sentinel`]: a master, a replica
//!   and three sentinels that fail over quickly; [`redis_cluster`]: a Redis
//!   Cluster of three masters and three replicas ([`RedisCluster`]) that
//!   fails over quickly and moves slots on demand.
//! - [`faults`]: a `redis-server` behind a network path whose latency,
//!   loss and partitions the test controls ([`FaultyRedis`]).
//! - [`client`]: a WebSocket client the project did not write
//!   (tokio-tungstenite) that speaks Herald's JSON protocol ([`Client`]).
//! - [`raw`]: a hand-written WebSocket client that can break the rules on
//!   purpose, and the one client frame encoder the tests use
//!   ([`raw::encode`]).
//! - [`follower`]: the project's client (`herald_client`) following a topic
//!   across pods, resuming its session wherever it lands; [`cluster`]: what
//!   the scale-out tests share about a group of pods (connection counts,
//!   evening out).
//! - [`mod@http`]: one HTTP request, metrics, the gRPC client.
//! - [`process`]: a helper program run to completion, bounded in time.
//! - [`webhooks`]: a webhook receiver recording every POST, made to fail
//!   on demand ([`webhooks::Receiver`]).
//! - [`backend`]: a programmable application backend for the proxies: an
//!   HTTP JSON server ([`HttpBackend`]) and a gRPC `ProxyBackend` server
//!   ([`GrpcBackend`]) answering what the test says.
//! - [`mod@eventually`]: the bounded poll that replaces hand-written "until the
//!   deadline" loops, for state that has no event to await.
//!
//! Every wait is bounded ([`WAIT`], or a bound the caller gives).

// Test support: a failed expectation here is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod backend;
pub mod client;
pub mod cluster;
pub mod eventually;
pub mod faults;
pub mod follower;
pub mod gateway;
pub mod herald;
pub mod http;
pub mod pki;
pub mod process;
pub mod raw;
pub mod redis;
pub mod redis_cluster;
pub mod sentinel;
pub mod webhooks;

use std::time::Duration;

pub use self::gateway::Gateway;
pub use backend::{Answer, GrpcBackend, HttpBackend};
pub use client::Client;
pub use eventually::eventually;
pub use faults::FaultyRedis;
pub use herald::Herald;
pub use http::{await_metric, grpc_client, http, http_with_headers, metric, metric_sum};
pub use redis::Redis;
pub use redis_cluster::RedisCluster;

/// Longest any single expected event may take before a test fails.
pub const WAIT: Duration = Duration::from_secs(10);
